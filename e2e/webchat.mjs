// Drives turnguard's web chat in headless Chromium (Debian's, through
// playwright-core) as a person would: connect with the token from the URL
// fragment, start a new session, watch a streamed reply with tool lines,
// watch a step time out (the "still working" note on the step's line, then
// the warning with its stop reason — screenshot), stop a turn with the Stop
// button, and switch sessions.
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

async function main() {
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
    ok("connected with the token from the URL fragment");
    if ((await page.evaluate(() => location.href)).includes("token=")) throw new Error("the token stayed in the address bar");
    ok("token removed from the address bar");

    // A fresh session, so earlier runs do not interfere.
    await page.selectOption("#session", "__new__");
    await page.waitForFunction(() => document.querySelector("#session").value.startsWith("agent:main:web-"));
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
    if (!warnText.includes("No progress for 2s")) throw new Error(`warning text: ${warnText}`);
    ok(`step timeout warning: "${warnText}"`);
    const shot = path.join(artifacts, "webchat-step-timeout.png");
    await page.screenshot({ path: shot });
    ok(`screenshot ${shot}`);
    if (!(await page.$("#stop[disabled]"))) throw new Error("Stop button still enabled after the turn ended");
    await page.waitForSelector('.run:last-child .step[data-status="stopped"] >> text=shell', { timeout: 1000 });
    ok("the hung shell step is marked stopped");

    // 3. The Stop button (chat.abort).
    await send(page, "/steps shell:hang");
    await page.waitForSelector("#stop:not([disabled])", { timeout: T.turn });
    await page.waitForSelector(".run:last-child .step >> text=shell", { timeout: T.turn });
    await page.click("#stop");
    const stopped = await page.waitForSelector('.run:last-child .notice.warning[data-stop-reason="user"]', { timeout: T.turn });
    ok(`stopped by the user: "${await stopped.textContent()}"`);

    // 4. Session selector: a second session, then back to the first, whose
    //    history (messages and notices) is loaded again.
    await page.selectOption("#session", "__new__");
    await page.waitForFunction((a) => {
      const v = document.querySelector("#session").value;
      return v !== a && v.startsWith("agent:main:web-");
    }, sessionA);
    await page.waitForFunction(() => document.querySelectorAll("#messages .msg").length === 0);
    await send(page, "/steps say:Second_session_reply");
    await page.waitForSelector(".msg.assistant:not(.streaming) >> text=Second session reply", { timeout: T.turn });
    ok("second session has its own conversation");
    await page.selectOption("#session", sessionA);
    await page.waitForSelector('.notice.warning[data-stop-reason="step_timeout"]', { timeout: T.turn });
    await page.waitForSelector(".msg.user >> text=/steps web_search:300ms shell:hang", { timeout: T.turn });
    if (await page.$("text=Second session reply")) throw new Error("switching back still shows the other session");
    ok("switched back: history with the step timeout notice reloaded");
    await page.screenshot({ path: path.join(artifacts, "webchat-history.png") });

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
