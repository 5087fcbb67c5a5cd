// Drives the web chat in headless Chromium against a gateway whose busy mode
// (channels.ws.busy.mode) is MODE, sending a message while a turn runs, as a
// person would, and checking what the page shows:
//
//   interrupt  the running turn stops with "stopped: replaced by your newer
//              message" (stop reason superseded) and a Retry button; the new
//              message runs and is answered.
//   collect    two messages sent while busy are both marked queued to be
//              answered together, then run as one follow-up turn.
//   steer      the message is handed to the running turn ("Added to the
//              running request"; the demo runner notes it in its reply);
//              after a reload, Retry of that turn resends its own message.
//   queue      two messages wait behind the running turn, each with a
//              Cancel button; Cancel on the first shows it "cancelled — not
//              sent", the second runs after the turn, the first never does
//              (issue 23).
//   overflow   busy.maxQueued 1, busy.overflow drop-old: a second message
//              while busy drops the first, which reads "dropped — not
//              sent"; the second runs (issue 23).
//   resumed    (not a busy mode) after a SIGKILL and a restart with resume
//              on, the "resuming it" notice has no Retry (issue 23).
//
// Usage: node webchat-busy.mjs URL ARTIFACTS_DIR MODE
// Env:   E2E_CHROMIUM, E2E_NODE_MODULES (as webchat.mjs)
// Prints one "ok: …" line per check; on failure "FAIL: …" and exit status 1.
import { createRequire } from "node:module";
import path from "node:path";

const [url, artifacts, mode] = process.argv.slice(2);
if (!url || !artifacts || !mode) {
  console.error("usage: node webchat-busy.mjs URL ARTIFACTS_DIR MODE");
  process.exit(2);
}
const require = createRequire(path.join(process.env.E2E_NODE_MODULES || ".", "_.js"));
const { chromium } = require("playwright-core");

const ok = (msg) => console.log(`ok: ${mode}: ${msg}`);
const T = { connect: 20000, turn: 20000 };
// Steps of 1.5s, each under the e2e gateway's 2s step timeout.
const LONG = "/steps web_search:1500ms web_search:1500ms web_search:1500ms say:First_done";

async function send(page, text) {
  await page.getByRole("textbox", { name: "Message", exact: true }).fill(text);
  await page.getByRole("button", { name: "Send", exact: true }).click();
}

// VERY_LONG (~7.5s) outlasts a reload with time to spare: the page must
// still see its queue after one.
const VERY_LONG = "/steps web_search:1500ms web_search:1500ms web_search:1500ms web_search:1500ms web_search:1500ms say:First_done";

async function startLong(page, text) {
  await send(page, text || LONG);
  await page.waitForSelector('.run:last-child .step[data-status="running"] >> text=web_search', { timeout: T.turn });
}

const bubble = (page, text) => page.locator(".msg.user", { hasText: text });

async function interrupt(page) {
  await startLong(page);
  await send(page, "/steps say:Newer_wins");
  const n = await page.waitForSelector('.notice.warning[data-stop-reason="superseded"]', { timeout: T.turn });
  const words = await n.$eval(".stop-reason", (e) => e.textContent);
  if (words !== "stopped: replaced by your newer message") throw new Error(`superseded in words: "${words}"`);
  if (!(await n.$("button.retry"))) throw new Error("no Retry on the superseded turn's notice");
  ok(`the running turn was superseded: "${await n.textContent()}"`);
  await page.waitForSelector(".msg.assistant:not(.streaming) >> text=Newer wins", { timeout: T.turn });
  if ((await bubble(page, "Newer_wins").getAttribute("data-status")) !== null) throw new Error("the new message is still marked");
  if (await page.$("text=First done")) throw new Error("the superseded turn finished anyway");
  ok("the newer message ran and was answered");
  // From the history too: the superseded notice (not a reply), its Retry.
  await page.reload();
  await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
  const h = await page.waitForSelector('.notice.warning[data-stop-reason="superseded"]', { timeout: T.turn });
  if (!(await h.$("button.retry"))) throw new Error("no Retry on the superseded notice from the history");
  const asReply = await page.$$eval(".msg.assistant", (ms) => ms.filter((m) => m.textContent.includes("replaced it")).length);
  if (asReply) throw new Error("the superseded notice is drawn as a reply after a reload");
  ok(`after a reload the history shows the superseded notice with Retry: "${await h.textContent()}"`);
}

async function collect(page) {
  await startLong(page, VERY_LONG);
  await send(page, "first extra");
  await send(page, "second extra");
  for (const t of ["first extra", "second extra"]) {
    const b = bubble(page, t);
    await page.waitForFunction((el) => el && el.dataset.status === "queued", await b.elementHandle(), { timeout: T.turn });
  }
  const ids = await page.$$eval('.msg.user[data-status="queued"]', (ms) => ms.map((m) => m.dataset.runId));
  if (ids.length !== 2 || ids[0] !== ids[1]) throw new Error(`collected messages wait as ${JSON.stringify(ids)}, want one run`);
  const label = await bubble(page, "second extra").locator(".msg-status").textContent();
  ok(`two messages sent while busy wait for one follow-up turn: "${label}"`);
  await page.screenshot({ path: path.join(artifacts, "webchat-collect.png") });
  // After a reload both still show as queued (turnguard.queue), and when
  // their turn starts neither is taken for dropped.
  await page.reload();
  await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
  // The running turn outlasts the reload: both must be shown queued, for
  // the one follow-up turn they were acked with (turnguard.queue's
  // turnRunId), with the collect words — never as dropped.
  await page.waitForFunction(() => document.querySelectorAll('.msg.user[data-status="queued"]').length === 2, null, { timeout: T.turn });
  const reloaded = await page.$$eval('.msg.user[data-status="queued"]', (ms) => ms.map((m) =>
    [m.firstChild.textContent, m.dataset.runId, m.querySelector(".msg-status").textContent]));
  const want = ["first extra", "second extra"].map((t) => [t, ids[0], label]);
  if (JSON.stringify(reloaded) !== JSON.stringify(want)) {
    throw new Error(`after a reload the queue shows ${JSON.stringify(reloaded)}, want ${JSON.stringify(want)}`);
  }
  ok(`reloaded: both shown queued for the follow-up turn ${ids[0]}: "${label}"`);
  await page.waitForSelector(".msg.assistant:not(.streaming) >> text=First done", { timeout: T.turn });
  await page.waitForFunction(() => !document.querySelector('.msg.user[data-status="queued"]'), null, { timeout: T.turn });
  const dropped = await page.$$eval('.msg.user[data-status="dropped"]', (ms) => ms.map((m) => m.firstChild.textContent));
  if (dropped.length) throw new Error(`after a reload, collected messages were marked dropped: ${JSON.stringify(dropped)}`);
  await page.waitForSelector(`.run[data-run-id="${ids[0]}"] .msg.assistant:not(.streaming)`, { timeout: 30000 });
  const runs = await page.$$eval(`.run[data-run-id="${ids[0]}"]`, (r) => r.length);
  if (runs !== 1) throw new Error(`${runs} run blocks for the follow-up`);
  const marked = await page.$$eval(".msg.user[data-status]", (ms) => ms.map((m) => m.dataset.status));
  if (marked.length) throw new Error(`messages still marked after their answer: ${JSON.stringify(marked)}`);
  ok("the follow-up turn ran once for both and was answered; neither is marked");
}

async function steer(page) {
  await startLong(page);
  await send(page, "also check the weather");
  const b = bubble(page, "also check the weather");
  await page.waitForFunction((el) => el && (el.dataset.status === "steered" || el.dataset.status === "queued"),
    await b.elementHandle(), { timeout: T.turn });
  const status = await b.getAttribute("data-status");
  const label = await b.locator(".msg-status").textContent();
  // The e2e gateway runs the demo runner, which takes messages between its
  // steps: it must be handed over, not queued.
  if (status !== "steered" || label !== "Added to the running request") {
    throw new Error(`a message for the demo runner was ${status}: "${label}"`);
  }
  ok(`handed to the running turn: "${label}"`);
  const noted = await page.waitForSelector(".run .msg.assistant >> text=also check the weather", { timeout: T.turn });
  ok(`the running turn noted it: "${await noted.textContent()}"`);
  await page.screenshot({ path: path.join(artifacts, "webchat-steered.png") });
  await page.waitForSelector(".msg.assistant:not(.streaming) >> text=First done", { timeout: T.turn });

  // Retry after a reload resends the turn's OWN message, not the one
  // steered into it (the history's last user message): activeRun.userText.
  const own = "/steps web_search:1500ms shell:hang";
  await send(page, own);
  await page.waitForSelector('.run:last-child .step[data-status="running"] >> text=web_search', { timeout: T.turn });
  await send(page, "steered in later");
  await page.waitForFunction((el) => el && el.dataset.status === "steered",
    await bubble(page, "steered in later").elementHandle(), { timeout: T.turn });
  await page.reload();
  await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
  const timedOut = page.locator('.notice.warning[data-stop-reason="step_timeout"]');
  await timedOut.waitFor({ timeout: T.turn });
  const users = () => page.$$eval(".msg.user", (ms) => ms.map((m) => m.firstChild.textContent));
  const before = (await users()).length;
  await timedOut.locator("button.retry").click();
  await page.waitForFunction((n) => document.querySelectorAll(".msg.user").length > n, before, { timeout: T.turn });
  const resent = (await users()).at(-1);
  if (resent !== own) throw new Error(`Retry after a reload resent "${resent}", want the turn's own "${own}"`);
  ok(`Retry after a reload resent the turn's own message "${own}", not the steered one`);
  await page.waitForFunction(() => document.querySelectorAll('.notice.warning[data-stop-reason="step_timeout"]').length === 2,
    null, { timeout: T.turn }); // the retried turn timed out too
}

async function queue(page) {
  await startLong(page, VERY_LONG);
  await send(page, "/steps say:Never_run");
  await send(page, "/steps say:Kept_run");
  for (const t of ["Never_run", "Kept_run"]) {
    await page.waitForFunction((el) => el && el.dataset.status === "queued" && el.querySelector("button.msg-cancel"),
      await bubble(page, t).elementHandle(), { timeout: T.turn });
  }
  ok("both messages sent while busy wait, each with a Cancel button");
  const b = bubble(page, "Never_run");
  await b.locator("button.msg-cancel").click();
  await page.waitForFunction((el) => el && el.dataset.status === "dropped", await b.elementHandle(), { timeout: T.turn });
  const label = await b.locator(".msg-status").textContent();
  if (label !== "cancelled — not sent") throw new Error(`the cancelled message reads "${label}"`);
  if (await b.locator("button.msg-cancel").count()) throw new Error("the cancelled message still has its Cancel button");
  const kept = bubble(page, "Kept_run");
  if ((await kept.getAttribute("data-status")) !== "queued") throw new Error("the other message is no longer queued");
  const next = await kept.locator(".msg-status").textContent();
  if (next !== "Queued — next") throw new Error(`the other message reads "${next}" after the cancel, want "Queued — next"`);
  ok(`Cancel: "${label}"; the other message still waits`);
  await page.screenshot({ path: path.join(artifacts, "webchat-cancel.png") });
  await page.waitForSelector(".msg.assistant:not(.streaming) >> text=First done", { timeout: T.turn });
  await page.waitForSelector(".msg.assistant:not(.streaming) >> text=Kept run", { timeout: T.turn });
  if (await page.$(".msg.assistant >> text=Never run")) throw new Error("the cancelled message ran");
  if (await page.$("button.msg-cancel")) throw new Error("a Cancel button is left after the queue emptied");
  ok("the other message ran after the turn; the cancelled one never did");
  await page.reload();
  await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
  await page.waitForSelector(".msg.assistant >> text=Kept run", { timeout: T.turn });
  if (await page.$(".msg.user >> text=Never_run")) throw new Error("after a reload the cancelled message is in the history");
  ok("after a reload the history has no trace of the cancelled message");
  // /queue answers in words, like /status; /queue collect sets this session's mode.
  await send(page, "/queue");
  const view = await page.waitForSelector(".msg.assistant >> text=Busy mode: queue", { timeout: T.turn });
  ok(`/queue: "${(await view.textContent()).split("\n")[0]}"`);
  await send(page, "/queue collect");
  await page.waitForSelector(".msg.assistant >> text=Busy mode for this chat: collect", { timeout: T.turn });
  ok("/queue collect set this session's busy mode");
}

// overflow: busy.maxQueued 1 and busy.overflow drop-old (issue 23).
async function overflow(page) {
  await startLong(page, VERY_LONG);
  await send(page, "/steps say:Old_one");
  const old = bubble(page, "Old_one");
  await page.waitForFunction((el) => el && el.dataset.status === "queued", await old.elementHandle(), { timeout: T.turn });
  await send(page, "/steps say:New_one");
  await page.waitForFunction((el) => el && el.dataset.status === "dropped", await old.elementHandle(), { timeout: T.turn });
  const words = await old.locator(".msg-status").textContent();
  if (words !== "dropped — not sent") throw new Error(`the dropped message reads "${words}"`);
  const nw = bubble(page, "New_one");
  const label = await nw.locator(".msg-status").textContent();
  const detail = await nw.locator(".msg-status").getAttribute("title");
  if ((await nw.getAttribute("data-status")) !== "queued" || label !== "Queued — next" || !/dropped the oldest waiting message: “\/steps say:Old_one”/.test(detail || "")) {
    throw new Error(`the new message reads "${label}" (${detail})`);
  }
  ok(`drop-old: the older message reads "${words}"; the new one "${label}": "${detail}"`);
  await page.waitForSelector(".msg.assistant:not(.streaming) >> text=New one", { timeout: 30000 });
  if (await page.$(".msg.assistant >> text=Old one")) throw new Error("the dropped message ran");
  ok("the new message ran after the turn; the dropped one never did");
}

// resumed: the gateway was killed during a turn of session main and
// restarted with agents.defaults.resume on (the Go test did both): the
// history's "resuming it" notice offers no Retry (the next attempt runs the
// request already), and the resumed attempt's reply follows (issue 23).
async function resumed(page) {
  const n = await page.waitForSelector('.notice.warning[data-stop-reason="interrupted"]', { timeout: T.turn });
  const text = await n.textContent();
  if (!/resuming it \(attempt 2 of 3\)/.test(text)) throw new Error(`the interrupted notice reads "${text}"`);
  if (await n.$("button.retry")) throw new Error("Retry on the resuming notice: a tap would run the request twice");
  ok(`the resuming notice, without Retry: "${text}"`);
  await page.waitForSelector(".msg.assistant:not(.streaming) >> text=Resumed fine", { timeout: 30000 });
  await page.screenshot({ path: path.join(artifacts, "webchat-resumed.png") });
  ok("the resumed attempt was answered");
}

const scenarios = { interrupt, collect, steer, queue, overflow, resumed };

async function main() {
  if (!scenarios[mode]) throw new Error(`unknown mode ${mode}`);
  const browser = await chromium.launch({
    executablePath: process.env.E2E_CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage({ viewport: { width: 1100, height: 760 } });
  const consoleErrors = [];
  page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  try {
    await page.goto(url);
    await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    await scenarios[mode](page);
    if (consoleErrors.length) throw new Error(`console errors: ${consoleErrors.join(" | ")}`);
  } catch (err) {
    try { await page.screenshot({ path: path.join(artifacts, `webchat-${mode}-failure.png`) }); } catch (_) { /* ignore */ }
    console.log(`FAIL: ${mode}: ${err.message}`);
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
}

await main();
