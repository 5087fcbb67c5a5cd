// Drives turnguard's web chat in headless Chromium (Debian's, through
// playwright-core) as a person would: connect with the token from the URL
// fragment, start a new session, watch a streamed reply with tool lines,
// watch a step time out (the "still working" note on the step's line, then
// the warning with its stop reason — screenshot), stop a turn with the Stop
// button and by typing /stop, Retry a timed-out turn from its notice, reload
// during a running turn (the page re-attaches: steps, the "still working"
// notice, a Stop that works), switch sessions, and stop a turn after the
// page's socket dropped and reconnected (the page signs each challenge with
// the same device key, so the run is still its own), then on a 390 px phone
// screen by role and accessible name: a Markdown reply with an HTML tag in it
// (rendered, the tag as text), a queued message that runs after a step
// timeout, a message refused as busy (kept), the stop
// reason in words, no horizontal scroll (screenshot webchat-390.png). Also:
// the welcome of an empty conversation (webchat-welcome.png, and at 390 px
// webchat-welcome-390.png), the "+ New session" button, a second tab that
// shows the message that started a turn it did not send (with a Retry named
// by it), the stop notice below a typed /stop, /new clearing the screen, and
// "#token=…" added to an open page.
//
// Usage: node webchat.mjs URL ARTIFACTS_DIR
// Env:   E2E_CHROMIUM (executable), E2E_NODE_MODULES (where playwright-core is)
// Prints one "ok: …" line per check; on failure "FAIL: …" and exit status 1.
import { createRequire } from "node:module";
import path from "node:path";

const [url, artifacts] = process.argv.slice(2);
if (!url || !artifacts) {
  console.error("usage: node webchat.mjs URL ARTIFACTS_DIR");
  process.exit(2);
}
const require = createRequire(path.join(process.env.E2E_NODE_MODULES || ".", "_.js"));
const { chromium } = require("playwright-core");

const ok = (msg) => console.log(`ok: ${msg}`);
const T = { connect: 20000, turn: 20000 };

async function send(page, text) {
  await page.fill("#input", text);
  await page.click("#send");
}

// newSession clicks the "+ New session" button and waits for its empty
// conversation, which shows the welcome.
async function newSession(page) {
  const was = await page.$eval("#session", (s) => s.value);
  await page.getByRole("button", { name: "+ New session", exact: true }).click();
  await page.waitForFunction((a) => {
    const v = document.querySelector("#session").value;
    return v !== a && v.startsWith("agent:main:web-");
  }, was);
  await page.waitForFunction(() => document.querySelectorAll("#messages .msg").length === 0);
  await page.getByRole("heading", { name: "Welcome to turnguard" }).waitFor({ timeout: T.turn });
}

// welcomeChecks: an empty conversation is not a blank page: a welcome
// (by role and name) says what to type — /help and the demo's examples,
// each a button that fills the textbox — and the first message replaces it.
// Screenshot name: the welcome as shown.
async function welcomeChecks(page, shot) {
  const welcome = page.getByRole("region", { name: "Welcome to turnguard" });
  await welcome.waitFor({ timeout: T.turn });
  for (const ex of ["/help", "/steps ask:deploy say:Finished"]) {
    if ((await welcome.getByRole("button", { name: ex, exact: true }).count()) !== 1) throw new Error(`the welcome has no button ${ex}`);
  }
  await page.screenshot({ path: shot });
  await welcome.getByRole("button", { name: "/help", exact: true }).click();
  const box = page.getByRole("textbox", { name: "Message", exact: true });
  if ((await box.inputValue()) !== "/help") throw new Error(`the /help example put "${await box.inputValue()}" in the textbox`);
  await page.getByRole("button", { name: "Send", exact: true }).click();
  await page.waitForSelector(".msg.assistant:not(.streaming)", { timeout: T.turn });
  if (await welcome.count()) throw new Error("the welcome stayed after the first message");
  ok(`welcome in an empty conversation: heading, /help and /steps ask:deploy say:Finished as buttons; /help sent from it, welcome gone; screenshot ${shot}`);
}

// secondTabChecks: a second tab watching the same conversation shows the
// user's message that started a turn it did not send (not only its steps
// and reply), and the notice of that turn offers Retry for that message,
// named by it.
async function secondTabChecks(page) {
  await newSession(page);
  const key = await page.$eval("#session", (s) => s.value);
  const other = await page.context().newPage();
  try {
    const u = new URL(url);
    u.searchParams.set("session", key);
    await other.goto(u.toString());
    await other.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    const hung = "/steps web_search:300ms shell:hang";
    await send(page, hung);
    const bubble = other.locator(".msg.user", { hasText: hung });
    await bubble.waitFor({ timeout: T.turn });
    const order = await other.evaluate((t) => {
      const b = [...document.querySelectorAll(".msg.user")].find((m) => m.textContent === t);
      const step = document.querySelector(".run .step");
      return !!(b && step && (b.compareDocumentPosition(step) & Node.DOCUMENT_POSITION_FOLLOWING));
    }, hung);
    if (!order) throw new Error("the other tab's user bubble is not above the turn's steps");
    ok(`another tab watching the conversation shows the message that started the turn: "${hung}", above its steps`);
    await other.waitForSelector('.notice.warning[data-stop-reason="step_timeout"]', { timeout: T.turn });
    const retry = other.getByRole("button", { name: `Retry \u201c${hung}\u201d`, exact: true });
    if ((await retry.count()) !== 1) throw new Error("the other tab's timeout notice has no Retry named by the message");
    ok(`the other tab's notice offers Retry for it, named "Retry \u201c${hung}\u201d"`);
  } finally {
    await other.close();
  }
}

// tokenHashChecks: a page opened without a token asks for one; adding
// "#token=…" to its address connects it at once, without a reload.
async function tokenHashChecks(browser) {
  const tok = new URLSearchParams(new URL(url).hash.slice(1)).get("token");
  const bare = new URL(url);
  bare.hash = "";
  const page = await browser.newPage({ viewport: { width: 1100, height: 760 } });
  try {
    await page.goto(bare.toString());
    await page.waitForSelector('#status[data-state="auth"]', { timeout: T.connect });
    await page.getByRole("textbox", { name: "Gateway token", exact: true }).waitFor({ timeout: T.connect });
    await page.evaluate((t) => { location.hash = `token=${encodeURIComponent(t)}`; }, tok);
    await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    if ((await page.evaluate(() => location.href)).includes("token=")) throw new Error("the token stayed in the address bar");
    if (!(await page.$("#token-form[hidden]"))) throw new Error("the token form stayed open");
    ok("#token=… added to an open page that asked for a token: connected without a reload, token out of the address bar");
  } finally {
    await page.close();
  }
}

// connectsOf collects the params of every connect the page sends.
function connectsOf(page) {
  const connects = [];
  page.on("websocket", (ws) => ws.on("framesent", (f) => {
    try {
      const m = JSON.parse(String(f.payload));
      if (m.method === "connect") connects.push(m.params);
    } catch (_) { /* not JSON */ }
  }));
  return connects;
}

// queueChecks: messages sent while a turn runs are queued (the gateway's
// default busy mode): the bubble keeps its text and says "Queued — next",
// survives a reload (chat.history's turnguard.queue), turns into the running
// turn when its run starts and gets its answer; typed /stop drops the queue
// and says how many were dropped.
async function queueChecks(page, artifacts) {
  await newSession(page);
  // Steps of 1.5s, each under the 2s step timeout: a turn of ~7.5s, which
  // outlasts the reload below with time to spare.
  await send(page, "/steps web_search:1500ms web_search:1500ms web_search:1500ms web_search:1500ms web_search:1500ms");
  await page.waitForSelector('.run:last-child .step[data-status="running"] >> text=web_search', { timeout: T.turn });
  await send(page, "/steps say:Queued_answer");
  const queued = page.locator('.msg.user[data-status="queued"]', { hasText: "/steps say:Queued_answer" });
  await queued.waitFor({ timeout: T.turn });
  const label = await queued.locator(".msg-status").textContent();
  if (label !== "Queued — next") throw new Error(`queued label "${label}", want "Queued — next"`);
  if (!(await page.isEnabled("#stop"))) throw new Error("Stop went off when a message was queued behind the running turn");
  ok(`a message sent while busy: kept, "${label}", Stop still on`);
  await page.screenshot({ path: path.join(artifacts, "webchat-queued.png") });
  await page.reload();
  await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
  const again = page.locator('.msg.user[data-status="queued"]', { hasText: "/steps say:Queued_answer" });
  await again.waitFor({ timeout: T.turn }); // the running turn outlasts the reload: it must still wait
  const againLabel = await again.locator(".msg-status").textContent();
  if (againLabel !== "Queued — next") throw new Error(`queued label after a reload "${againLabel}", want "Queued — next"`);
  ok(`reloaded: the queued message is shown as queued (turnguard.queue): "${againLabel}"`);
  await page.waitForSelector(".msg.assistant:not(.streaming) >> text=Queued answer", { timeout: T.turn });
  const still = await page.$$eval('.msg.user[data-status="queued"]', (ms) => ms.length);
  if (still) throw new Error(`${still} message(s) still marked queued after their answer`);
  ok("the queued message ran after the turn before it: answer shown, no longer marked queued");

  // /stop with a queue: the queued message is dropped, and the words say so.
  await send(page, "/steps web_search:1500ms web_search:1500ms web_search:1500ms");
  await page.waitForSelector('.run:last-child .step[data-status="running"] >> text=web_search', { timeout: T.turn });
  await send(page, "/steps say:Never_runs");
  await page.locator('.msg.user[data-status="queued"]', { hasText: "Never_runs" }).waitFor({ timeout: T.turn });
  await send(page, "/stop");
  await page.locator('.msg.user[data-status="dropped"]', { hasText: "Never_runs" }).waitFor({ timeout: T.turn });
  await page.waitForSelector(".msg.assistant >> text=1 queued message was dropped", { timeout: T.turn });
  await page.waitForSelector("#stop[disabled]", { timeout: T.turn });
  // The stop's confirmation is at the bottom, below the typed /stop — not
  // up in the stopped turn's block.
  const below = await page.evaluate(() => {
    const stops = [...document.querySelectorAll(".msg.user")].filter((m) => m.textContent === "/stop");
    const note = [...document.querySelectorAll('.notice.warning[data-stop-reason="user"]')].pop();
    return !!(stops.length && note && (stops[stops.length - 1].compareDocumentPosition(note) & Node.DOCUMENT_POSITION_FOLLOWING));
  });
  if (!below) throw new Error("the stop confirmation is above the typed /stop");
  await page.waitForTimeout(1000); // real time: a dropped message must not start (it would within this second)
  if (await page.$("text=Never runs")) throw new Error("a dropped message ran");
  ok("typed /stop with a message queued: the turn stopped, the queued message marked dropped, \"1 queued message was dropped\", the stop notice below the /stop");

  // The Stop button with a queue: the same as typed /stop — the queued
  // message is dropped, not run after the stop.
  await send(page, "/steps web_search:1500ms web_search:1500ms web_search:1500ms");
  await page.waitForSelector('.run:last-child .step[data-status="running"] >> text=web_search', { timeout: T.turn });
  await send(page, "/steps say:Button_never_runs");
  await page.locator('.msg.user[data-status="queued"]', { hasText: "Button_never_runs" }).waitFor({ timeout: T.turn });
  await page.click("#stop");
  await page.locator('.msg.user[data-status="dropped"]', { hasText: "Button_never_runs" }).waitFor({ timeout: T.turn });
  await page.waitForSelector("#stop[disabled]", { timeout: T.turn });
  await page.waitForTimeout(1000); // real time: a dropped message must not start (it would within this second)
  if (await page.$("text=Button never runs")) throw new Error("a message queued before the Stop button ran");
  ok("the Stop button with a message queued: the turn stopped, the queued message marked dropped (as typed /stop)");

  // /stop typed in another tab of this browser: this tab learns that its
  // queued message was dropped too.
  await send(page, "/steps web_search:1500ms web_search:1500ms web_search:1500ms");
  await page.waitForSelector('.run:last-child .step[data-status="running"] >> text=web_search', { timeout: T.turn });
  await send(page, "/steps say:Dropped_elsewhere");
  await page.locator('.msg.user[data-status="queued"]', { hasText: "Dropped_elsewhere" }).waitFor({ timeout: T.turn });
  const key = await page.$eval("#session", (s) => s.value);
  const other = await page.context().newPage();
  try {
    const u = new URL(url);
    u.searchParams.set("session", key);
    await other.goto(u.toString());
    await other.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    await other.locator('.msg.user[data-status="queued"]', { hasText: "Dropped_elsewhere" }).waitFor({ timeout: T.turn });
    await send(other, "/stop");
    await other.waitForSelector(".msg.assistant >> text=1 queued message was dropped", { timeout: T.turn });
  } finally {
    await other.close();
  }
  await page.locator('.msg.user[data-status="dropped"]', { hasText: "Dropped_elsewhere" }).waitFor({ timeout: T.turn });
  ok("/stop from another tab: its queued message shown there too, and here marked dropped");
}

// phoneChecks drives the page at 390 px width by roles and accessible names.
async function phoneChecks(browser, artifacts, consoleErrors) {
  const page = await browser.newPage({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
  page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(`(390 px) ${m.text()}`); });
  page.on("pageerror", (e) => consoleErrors.push(`(390 px) ${e}`));
  const dialogs = [];
  page.on("dialog", (d) => { dialogs.push(d.message()); d.dismiss().catch(() => {}); });
  try {
    await page.goto(url);
    await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    const box = page.getByRole("textbox", { name: "Message", exact: true });
    const sendBtn = page.getByRole("button", { name: "Send", exact: true });
    const stopBtn = page.getByRole("button", { name: "Stop", exact: true });
    const session = page.getByRole("combobox", { name: "Session", exact: true });
    for (const [what, loc] of [["textbox Message", box], ["button Send", sendBtn], ["button Stop", stopBtn], ["combobox Session", session]]) {
      if ((await loc.count()) !== 1) throw new Error(`no single ${what} by role and name`);
    }
    ok("controls found by role and accessible name: textbox Message, buttons Send and Stop, combobox Session");
    await newSession(page);
    const welcomeShot = path.join(artifacts, "webchat-welcome-390.png");
    await page.screenshot({ path: welcomeShot });
    const ww = await page.evaluate(() => document.documentElement.scrollWidth);
    if (ww > 390) throw new Error(`the welcome scrolls sideways at 390 px: scrollWidth ${ww}`);
    ok(`390 px: the welcome fits (scrollWidth ${ww}); screenshot ${welcomeShot}`);
    const say = async (text) => { await box.fill(text); await sendBtn.click(); };

    // A Markdown reply with an HTML tag in it: formatted, the tag as text.
    const img = "<img src=x onerror=alert(1)>";
    await say(`/steps say:**Bold**_*it*_and_\`code\`_${img.replaceAll(" ", "_")}_[site](https://example.com/)_[bad](javascript:alert(1))`);
    const reply = page.locator(".run:last-child .msg.assistant:not(.streaming)");
    await reply.locator("strong", { hasText: "Bold" }).waitFor({ timeout: T.turn });
    const got = await reply.evaluate((m) => ({
      text: m.textContent,
      em: (m.querySelector("em") || {}).textContent,
      code: (m.querySelector("code") || {}).textContent,
      links: [...m.querySelectorAll("a")].map((a) => [a.getAttribute("href"), a.rel, a.target, a.textContent]),
      imgs: document.querySelectorAll("img").length,
    }));
    if (got.em !== "it" || got.code !== "code") throw new Error(`Markdown not rendered: ${JSON.stringify(got)}`);
    if (!got.text.includes(img)) throw new Error(`the tag is not shown as text: ${got.text}`);
    if (got.imgs !== 0) throw new Error(`an <img> element was created from a reply`);
    if (JSON.stringify(got.links) !== JSON.stringify([["https://example.com/", "noopener noreferrer", "_blank", "site"]])) {
      throw new Error(`links: ${JSON.stringify(got.links)}`);
    }
    ok(`Markdown reply: bold, italic, code, one https link (noopener noreferrer, new tab), "${img}" as text, no <img>, javascript: not linked`);

    // Blocks (a demo reply is one line): paragraphs, lists, fenced code.
    const blocks = await page.evaluate(() => {
      const d = document.createElement("div");
      d.appendChild(window.turnguard.renderMarkdown(
        "First **para**\nsame para\n\n- one\n- `two`\n\n1. a\n2. b\n\n```js\nif (a < b) { x(); }\n<b>raw</b>\n```\nafter <script>alert(1)</script>"));
      return {
        tags: [...d.children].map((e) => e.tagName.toLowerCase()).join(","),
        ul: [...d.querySelectorAll("ul li")].map((e) => e.textContent).join("|"),
        ol: d.querySelectorAll("ol li").length,
        pre: d.querySelector("pre code").textContent,
        bad: d.querySelectorAll("script, b").length,
        last: d.lastElementChild.textContent,
      };
    });
    if (blocks.tags !== "p,ul,ol,pre,p" || blocks.ul !== "one|two" || blocks.ol !== 2 ||
      blocks.pre !== "if (a < b) { x(); }\n<b>raw</b>" || blocks.bad !== 0 || blocks.last !== "after <script>alert(1)</script>") {
      throw new Error(`Markdown blocks: ${JSON.stringify(blocks)}`);
    }
    ok("Markdown blocks: paragraphs, bullet and numbered lists, fenced code (HTML in it as text)");

    // A message refused while the session is busy (one already waits:
    // busy.maxQueued 1) keeps its text; Stop still stops the running turn;
    // then the step timeout, in words.
    await say("/steps web_search:300ms shell:hang");
    await page.waitForSelector(".run:last-child .step >> text=shell", { timeout: T.turn });
    await say("/steps say:Waited_my_turn");
    await page.waitForSelector('.msg.user[data-status="queued"] >> text=Waited_my_turn', { timeout: T.turn });
    await say("please keep this text");
    await page.waitForSelector('.msg.user[data-status="not-sent"] >> text=please keep this text', { timeout: T.turn });
    if ((await box.inputValue()) !== "please keep this text") throw new Error(`refused text lost: "${await box.inputValue()}"`);
    if (!(await stopBtn.isEnabled())) throw new Error("Stop went off after a refused message while the turn still runs");
    ok("a message refused while one already waits: marked not sent, its text back in the textbox, Stop still on");
    const warn = page.locator('.run .notice.warning[data-stop-reason="step_timeout"]');
    await warn.waitFor({ timeout: T.turn });
    const words = await warn.locator(".stop-reason").textContent();
    if (words !== "stopped: no progress" || (await warn.textContent()).includes("step_timeout")) {
      throw new Error(`stop reason not in words: "${await warn.textContent()}"`);
    }
    ok(`step timeout shown in words: "${await warn.textContent()}"`);
    await page.waitForSelector(".msg.assistant:not(.streaming) >> text=Waited my turn", { timeout: T.turn });
    ok("the message queued behind the timed-out turn ran after it");

    // A step with a long unbroken tool name and its "still working" note
    // wrap inside the chat: #messages scrolls only vertically.
    await say("/steps mcp_server_github_list_pull_request_review_comments_for_repo:1500ms say:Long_step_done");
    await page.waitForSelector(".msg.assistant:not(.streaming) >> text=Long step done", { timeout: T.turn });

    // No horizontal scroll at 390 px; the controls are on the screen.
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    if (width > 390) throw new Error(`horizontal scroll at 390 px: scrollWidth ${width}`);
    const msgs = await page.evaluate(() => { const m = document.querySelector("#messages"); return { scroll: m.scrollWidth, client: m.clientWidth }; });
    if (msgs.scroll > msgs.client) throw new Error(`#messages scrolls sideways at 390 px: scrollWidth ${msgs.scroll} > clientWidth ${msgs.client}`);
    for (const loc of [box, sendBtn, stopBtn, session, page.getByRole("button", { name: "+ New session", exact: true })]) {
      const b = await loc.boundingBox();
      if (!b || b.x < 0 || b.x + b.width > 390 || b.width < 24 || b.height < 24) throw new Error(`control off screen or tiny: ${JSON.stringify(b)}`);
    }
    const shot = path.join(artifacts, "webchat-390.png");
    await page.screenshot({ path: shot });
    ok(`390 px: scrollWidth ${width}, #messages ${msgs.scroll} <= ${msgs.client} after a long-named step, controls on screen; screenshot ${shot}`);
    if (dialogs.length) throw new Error(`a reply ran script: dialog ${dialogs.join(", ")}`);
  } catch (err) {
    try { await page.screenshot({ path: path.join(artifacts, "webchat-390-failure.png") }); } catch (_) { /* ignore */ }
    throw err;
  } finally {
    await page.close();
  }
}

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.E2E_CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  // A context of its own (not browser.newPage's): a second tab of the same
  // browser profile is opened in it (queueChecks).
  const context = await browser.newContext({ viewport: { width: 1100, height: 760 } });
  const page = await context.newPage();
  const consoleErrors = [];
  page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  // The page's sockets (to drop one as a network blip would) and its connect
  // params (to check the device block).
  await page.addInitScript(() => {
    const Native = window.WebSocket;
    window.__e2eSockets = [];
    window.WebSocket = class extends Native {
      constructor(...args) { super(...args); window.__e2eSockets.push(this); }
    };
  });
  const connects = connectsOf(page);
  try {
    await page.goto(url);
    await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    ok("connected with the token from the URL fragment");
    if ((await page.evaluate(() => location.href)).includes("token=")) throw new Error("the token stayed in the address bar");
    ok("token removed from the address bar");

    // A fresh session, so earlier runs do not interfere: its welcome.
    await newSession(page);
    await welcomeChecks(page, path.join(artifacts, "webchat-welcome.png"));
    await newSession(page);
    const sessionA = await page.$eval("#session", (s) => s.value);
    ok(`new session ${sessionA}`);

    // 1. A streamed reply with tool lines.
    await send(page, "/steps web_search:300ms llm:1500ms say:Web_reply_done");
    await page.waitForSelector('.step[data-status="completed"] >> text=web_search', { timeout: T.turn });
    ok("tool line web_search completed");
    const partial = await page.waitForFunction(() => {
      const m = document.querySelector(".run:last-child .msg.assistant.streaming");
      return m && m.textContent.length > 0 && !m.textContent.includes("Web reply done") ? m.textContent : false;
    }, null, { timeout: T.turn, polling: 50 });
    ok(`streaming: partial text "${await partial.jsonValue()}"`);
    await page.waitForSelector(".run:last-child .msg.assistant:not(.streaming) >> text=Web reply done", { timeout: T.turn });
    ok("final reply shown");

    // 2. A step that hangs: the "still working" note updates the step's
    //    line in place, then the step timeout stops the turn.
    await send(page, "/steps web_search:300ms shell:hang");
    await page.waitForSelector("#stop:not([disabled])", { timeout: T.turn });
    ok("Stop button enabled while the turn runs");
    const note = await page.waitForFunction(() => {
      const s = [...document.querySelectorAll(".run:last-child .step")].find((e) => e.textContent.includes("shell"));
      const n = s && s.querySelector(".step-note");
      return n && n.textContent.includes("Still working") ? n.textContent : false;
    }, null, { timeout: T.turn, polling: 50 });
    ok(`progress note on the shell line: "${await note.jsonValue()}"`);
    const warn = await page.waitForSelector('.run:last-child .notice.warning[data-stop-reason="step_timeout"]', { timeout: T.turn });
    const warnText = await warn.textContent();
    if (!warnText.includes("No progress for 2 s")) throw new Error(`warning text: ${warnText}`);
    ok(`step timeout warning: "${warnText}"`);
    const shot = path.join(artifacts, "webchat-step-timeout.png");
    await page.screenshot({ path: shot });
    ok(`screenshot ${shot}`);
    if (!(await page.$("#stop[disabled]"))) throw new Error("Stop button still enabled after the turn ended");
    await page.waitForSelector('.run:last-child .step[data-status="stopped"] >> text=shell', { timeout: 1000 });
    ok("the hung shell step is marked stopped");

    // 2b. Retry on the step timeout's notice sends the same text again as a
    //     new turn, which runs (its steps appear) and times out again.
    const hung = "/steps web_search:300ms shell:hang";
    const userCount = () => page.$$eval(".msg.user", (ms, t) => ms.filter((m) => m.firstChild && m.firstChild.textContent === t).length, hung);
    const sentBefore = await userCount();
    const retry = await page.$('.run:last-child .notice.warning[data-stop-reason="step_timeout"] button.retry');
    if (!retry || (await retry.textContent()) !== "Retry") throw new Error("no Retry button on the step timeout's notice");
    const retries = await page.getByRole("button", { name: "Retry" }).count();
    if ((await page.getByRole("button", { name: `Retry \u201c${hung}\u201d`, exact: true }).count()) < 1) {
      throw new Error(`no Retry button named by its message: ${JSON.stringify(await page.$$eval("button.retry", (bs) => bs.map((b) => b.getAttribute("aria-label"))))}`);
    }
    await retry.click();
    await page.waitForFunction(([t, n]) => [...document.querySelectorAll(".msg.user")].filter((m) => m.firstChild && m.firstChild.textContent === t).length > n, [hung, sentBefore], { timeout: T.turn });
    if (!(await retry.isDisabled())) throw new Error("Retry stayed enabled after one tap");
    await page.waitForSelector('.run:last-child .step[data-status="completed"] >> text=web_search', { timeout: T.turn });
    await page.waitForSelector('.run:last-child .notice.warning[data-stop-reason="step_timeout"] button.retry:not([disabled])', { timeout: T.turn });
    ok(`Retry after the step timeout: "${hung}" sent again as a new turn (${(await userCount()) - sentBefore} more), which ran and timed out again (Retry buttons ${retries} → ${await page.getByRole("button", { name: "Retry" }).count()})`);

    // 2c. Reload during a running turn: the page re-attaches to it (the
    //     step completed before, the running step with its "still working"
    //     notice, Stop on) and its Stop ends it. The step sends heartbeats,
    //     so only Stop ends it.
    await send(page, "/steps web_search:300ms say:Looking_first shell:hang:hb=500ms");
    await page.waitForSelector('.run:last-child .step[data-status="running"] >> text=shell', { timeout: T.turn });
    await page.waitForSelector('.run:last-child .step.has-note >> text=Still working', { timeout: T.turn });
    await page.reload();
    await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    const reattached = page.locator(".run:last-child");
    await reattached.locator('.step[data-status="completed"]', { hasText: "web_search" }).waitFor({ timeout: T.turn });
    await reattached.locator('.step[data-status="running"]', { hasText: "shell" }).waitFor({ timeout: T.turn });
    await reattached.locator(".step.has-note .step-note", { hasText: "Still working" }).waitFor({ timeout: T.turn });
    await reattached.locator(".msg.assistant.streaming", { hasText: "Looking first" }).waitFor({ timeout: T.turn });
    await page.waitForSelector("#stop:not([disabled])", { timeout: T.turn });
    const lines = await reattached.locator(".step").allTextContents();
    ok(`reloaded during a turn: re-attached, steps ${JSON.stringify(lines)}, the reply so far, Stop on`);
    await page.screenshot({ path: path.join(artifacts, "webchat-reattached.png") });
    // Away to another session (nothing runs there: Stop off) and back: the
    // page re-attaches again.
    await newSession(page);
    await page.waitForSelector("#stop[disabled]", { timeout: T.turn });
    await page.selectOption("#session", sessionA);
    await reattached.locator('.step[data-status="running"]', { hasText: "shell" }).waitFor({ timeout: T.turn });
    await page.waitForSelector("#stop:not([disabled])", { timeout: T.turn });
    ok("switched away and back during the turn: re-attached again, Stop on");
    await page.getByRole("button", { name: "Stop", exact: true }).click();
    await page.waitForSelector('.run:last-child .notice.warning[data-stop-reason="user"]', { timeout: T.turn });
    await page.waitForSelector("#stop[disabled]", { timeout: T.turn });
    ok("Stop after the reload ended the turn: stop notice shown, Stop off");

    // 3. The Stop button (sends /stop, as typed).
    await send(page, "/steps shell:hang");
    await page.waitForSelector("#stop:not([disabled])", { timeout: T.turn });
    await page.waitForSelector(".run:last-child .step >> text=shell", { timeout: T.turn });
    await page.click("#stop");
    const stopped = await page.waitForSelector('.run:last-child .notice.warning[data-stop-reason="user"]', { timeout: T.turn });
    if ((await stopped.$eval(".stop-reason", (e) => e.textContent)) !== "stopped by you") {
      throw new Error(`stop reason not in words: ${await stopped.textContent()}`);
    }
    ok(`stopped by the user: "${await stopped.textContent()}"`);

    // 3b. Typing /stop (chat.send of a command, carried out by the gateway):
    //     the running turn stops with its notice and the Stop button goes
    //     off; typed again when idle it says that nothing is running.
    const userStops = () => page.$$eval('.notice.warning[data-stop-reason="user"]', (n) => n.length);
    const stopsBefore = await userStops();
    await send(page, "/steps web_search:1500ms web_search:1500ms web_search:1500ms");
    await page.waitForSelector("#stop:not([disabled])", { timeout: T.turn });
    await page.waitForSelector(".run:last-child .step >> text=web_search", { timeout: T.turn });
    await send(page, "/stop");
    await page.waitForFunction((n) => document.querySelectorAll('.notice.warning[data-stop-reason="user"]').length > n, stopsBefore, { timeout: T.turn });
    await page.waitForSelector("#stop[disabled]", { timeout: T.turn });
    ok("typed /stop stopped the running turn: stop notice shown, Stop button off");
    await send(page, "/stop");
    await page.waitForSelector(".msg.assistant >> text=Nothing is running", { timeout: T.turn });
    ok("typed /stop when idle: \"Nothing is running\" shown, no turn started");

    // 4. Session selector: a second session, then back to the first, whose
    //    history (messages and notices) is loaded again.
    await newSession(page);
    await send(page, "/steps say:Second_session_reply");
    await page.waitForSelector(".msg.assistant:not(.streaming) >> text=Second session reply", { timeout: T.turn });
    ok("second session has its own conversation");
    await page.selectOption("#session", sessionA);
    await page.waitForSelector('.notice.warning[data-stop-reason="step_timeout"] button.retry', { timeout: T.turn });
    await page.waitForSelector(".msg.user >> text=/steps web_search:300ms shell:hang", { timeout: T.turn });
    if (await page.$("text=Second session reply")) throw new Error("switching back still shows the other session");
    ok("switched back: history with the step timeout notice (and its Retry) reloaded");
    // The timed-out turn's step lines come back with it, as they ended live
    // (issue 22): web_search completed, shell stopped, the notice below them.
    const timedOut = '.run:has(.notice[data-stop-reason="step_timeout"])';
    const reloadedLines = await page.$$eval(`${timedOut} .step`, (ls) => ls.map((l) => `${l.textContent} ${l.dataset.status}`));
    if (!reloadedLines.includes("🛠️ web_search✓ completed") || !reloadedLines.includes("🛠️ shell■ stopped stopped")) {
      throw new Error(`reloaded step lines of the timed-out turn: ${JSON.stringify(reloadedLines)}`);
    }
    ok(`switched back: the timed-out turn's step lines reloaded with its notice: ${JSON.stringify(reloadedLines)}`);
    await page.screenshot({ path: path.join(artifacts, "webchat-history.png") });

    // 5. A dropped socket: the page reconnects, signing the new challenge with
    //    the same device key, and its Stop still stops the turn it started.
    await newSession(page);
    // Steps of 1.5s, each under the 2s step timeout: a turn of ~20s.
    await send(page, `/steps ${Array(13).fill("web_search:1500ms").join(" ")}`);
    await page.waitForSelector('.run:last-child .step[data-status="running"] >> text=web_search', { timeout: T.turn });
    const before = connects.length;
    await page.evaluate(() => window.__e2eSockets[window.__e2eSockets.length - 1].close());
    await page.waitForSelector('#status[data-state="disconnected"]', { timeout: T.connect });
    await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    ok("socket dropped; the page reconnected");
    // The turn's events reach the reconnected page (a step line after the
    // history reload), and Stop is enabled for it.
    await page.waitForSelector('.run .step[data-status="running"] >> text=web_search', { timeout: T.turn });
    await page.waitForSelector("#stop:not([disabled])", { timeout: T.turn });
    await page.click("#stop");
    const after = await page.waitForSelector('.notice.warning[data-stop-reason="user"], .notice.error', { timeout: T.turn });
    const afterText = await after.textContent();
    if (!(await after.evaluate((n) => n.classList.contains("warning")))) {
      throw new Error(`Stop after the reconnect: ${afterText}`);
    }
    if (!afterText.includes("Stopped")) throw new Error(`stop notice text: ${afterText}`);
    ok(`stopped by the user after the reconnect: "${afterText}"`);
    await page.waitForSelector("#stop[disabled]", { timeout: T.turn });
    await page.screenshot({ path: path.join(artifacts, "webchat-stop-after-reconnect.png") });
    if (connects.length <= before) throw new Error("no second connect was sent");
    const devs = connects.map((c) => c.device);
    if (devs.some((d) => !d || !/^[0-9a-f]{64}$/.test(d.id) || !d.signature || !d.publicKey)) {
      throw new Error(`a connect without a device block: ${JSON.stringify(devs)}`);
    }
    if (new Set(devs.map((d) => d.id)).size !== 1) throw new Error(`the device changed: ${devs.map((d) => d.id).join(", ")}`);
    if (new Set(devs.map((d) => d.nonce)).size !== devs.length) throw new Error("a challenge nonce was signed twice");
    ok(`${connects.length} connects, each signed by device ${devs[0].id.slice(0, 12)}…`);

    // 6. A browser without WebCrypto Ed25519: the page connects unsigned,
    //    says nothing alarming, and Stop works, after a reload too.
    const plain = await browser.newPage({ viewport: { width: 1100, height: 760 } });
    plain.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") consoleErrors.push(`(no Ed25519) ${m.text()}`); });
    plain.on("pageerror", (e) => consoleErrors.push(`(no Ed25519) ${e}`));
    await plain.addInitScript(() => {
      const subtle = crypto.subtle;
      const generateKey = subtle.generateKey.bind(subtle);
      subtle.generateKey = (alg, ...rest) => (alg && alg.name === "Ed25519"
        ? Promise.reject(new DOMException("Algorithm: Unrecognized name", "NotSupportedError"))
        : generateKey(alg, ...rest));
    });
    const plainConnects = connectsOf(plain);
    await plain.goto(url);
    await plain.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    if (plainConnects.length !== 1 || plainConnects[0].device !== undefined) {
      throw new Error(`without Ed25519 the connect was ${JSON.stringify(plainConnects)}`);
    }
    await newSession(plain);
    await send(plain, "/steps web_search:1500ms web_search:1500ms web_search:1500ms web_search:1500ms web_search:1500ms");
    await plain.waitForSelector('.run:last-child .step[data-status="running"] >> text=web_search', { timeout: T.turn });
    // Reloaded (a new connection, still unsigned), its Stop still stops the
    // turn: unsigned holders of the token share one owner.
    await plain.reload();
    await plain.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    await plain.waitForSelector("#stop:not([disabled])", { timeout: T.turn });
    await plain.click("#stop");
    const plainStop = await plain.waitForSelector('.notice.warning[data-stop-reason="user"], .notice.error', { timeout: T.turn });
    if (!(await plainStop.evaluate((n) => n.classList.contains("warning")))) {
      throw new Error(`Stop without Ed25519: ${await plainStop.textContent()}`);
    }
    if ((await plain.textContent("#messages")).match(/Ed25519|device|signature/i)) throw new Error("the page talks about keys");
    ok("without WebCrypto Ed25519: connected unsigned, Stop works after a reload, nothing alarming shown");
    await plain.close();

    // 6b. Busy sessions: queued messages.
    await queueChecks(page, artifacts);

    // 6c. /new: the earlier messages leave the screen; the /new and its
    //     answer stay; the selector's entry says the conversation is new.
    const label = () => page.$eval("#session", (s) => s.selectedOptions[0].textContent);
    const labelBefore = await label();
    await send(page, "/new");
    await page.waitForSelector(".msg.assistant >> text=New conversation", { timeout: T.turn });
    const left = await page.$$eval("#messages .msg", (ms) => ms.map((m) => m.textContent));
    if (left.length !== 2 || left[0] !== "/new") throw new Error(`after /new the screen shows ${JSON.stringify(left)}`);
    await page.waitForFunction((b) => document.querySelector("#session").selectedOptions[0].textContent !== b, labelBefore, { timeout: T.turn });
    ok(`/new cleared the earlier messages (left: ${JSON.stringify(left)}); the selector went from "${labelBefore}" to "${await label()}"`);

    // 6d. Another tab watching the conversation; a token added to an open page.
    await secondTabChecks(page);
    await tokenHashChecks(browser);

    // 7. The page as a product, on a 390 px phone screen: controls found by
    //    role and accessible name, Markdown replies rendered safely, a
    //    refused message kept, the stop reason in words, no horizontal scroll.
    await phoneChecks(browser, artifacts, consoleErrors);

    if (consoleErrors.length) throw new Error(`console errors: ${consoleErrors.join(" | ")}`);
    ok("no console errors");
  } catch (err) {
    try { await page.screenshot({ path: path.join(artifacts, "webchat-failure.png") }); } catch (_) { /* ignore */ }
    console.log(`FAIL: ${err.message}`);
    if (consoleErrors.length) console.log(`console: ${consoleErrors.join(" | ")}`);
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
}

await main();
