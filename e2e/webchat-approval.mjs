// Drives the web chat's approval card in headless Chromium (docs/approvals.md):
//
//   1. "/steps ask:deploy say:Finished" shows a card "Run deploy" with the
//      buttons Allow and Deny; a click on Allow disables the buttons, the
//      card says who chose what ("✅ Allowed in the web chat: Run deploy") and the
//      turn finishes with "deploy ran (allowed). Finished"
//      (webchat-approval.png).
//   2. A reload after a turn that asked finished: its step lines and its
//      settled card ("✅ Allowed in the web chat: Run deploy") are drawn again,
//      as they were live (chat.history's turnguard on the turn's reply).
//   3. A reload while a question is open draws its card again (from
//      chat.history's turnguard.approvals); Deny answers it.
//   4. A question settled elsewhere (approval.resolve from another client,
//      here a second WebSocket in the page) updates the open card.
//   5. Stop while a question is open: the card says the request stopped.
//
// MODE acp: the gateway runs the acp runner with runner/acp's test agent
// (a real ACP agent on the official SDK), whose "ask permission" asks
// (session/request_permission) to run "Delete build/":
//
//   1. the card "Delete build/" with Allow once and Reject; a click on Allow
//      once finishes the agent's turn with "Tool output: deleted 3 files"
//      (webchat-approval-acp.png);
//   2. Reject: the agent says "Permission denied (no).";
//   3. Stop while asking: the card says the request stopped and the agent
//      is cancelled (the next question is answered again).
//
// Usage: node webchat-approval.mjs URL ARTIFACTS_DIR [MODE]   (URL with #token=…; MODE demo (default) or acp)
// Env:   E2E_CHROMIUM, E2E_NODE_MODULES (as webchat.mjs)
// Prints one "ok: …" line per check; on failure "FAIL: …" and exit status 1.
import { createRequire } from "node:module";
import path from "node:path";

const [url, artifacts, mode = "demo"] = process.argv.slice(2);
if (!url || !artifacts || !["demo", "acp"].includes(mode)) {
  console.error("usage: node webchat-approval.mjs URL ARTIFACTS_DIR [demo|acp]");
  process.exit(2);
}
const require = createRequire(path.join(process.env.E2E_NODE_MODULES || ".", "_.js"));
const { chromium } = require("playwright-core");

const ok = (msg) => console.log(`ok: ${msg}`);
const T = { connect: 20000, turn: 20000 };
const ASK = "/steps ask:deploy say:Finished";
const STEPS_ASK = "/steps web_search:200ms ask:deploy say:Finished";

async function send(page, text) {
  await page.getByRole("textbox", { name: "Message", exact: true }).fill(text);
  await page.getByRole("button", { name: "Send", exact: true }).click();
}

const openCard = (page) => page.waitForSelector('.run:last-child .approval[data-state="open"]', { timeout: T.turn });
// openButton is a button of the open card: the settled cards of earlier
// turns (drawn again after a reload) have the same, disabled, buttons.
const openButton = (page, name) => page.locator('.approval[data-state="open"]').getByRole("button", { name, exact: true });

async function allow(page) {
  await send(page, ASK);
  const card = await openCard(page);
  const text = await card.$eval(".approval-text", (e) => e.textContent);
  if (!text.includes("Run deploy")) throw new Error(`card text "${text}"`);
  const labels = await card.$$eval("button", (bs) => bs.map((b) => b.textContent));
  if (JSON.stringify(labels) !== '["Allow","Deny"]') throw new Error(`buttons ${JSON.stringify(labels)}`);
  ok(`the question is a card with Allow and Deny: "${text.split("\n")[0]}"`);
  // Named by what it answers: several cards may be open at once.
  await openButton(page, "Allow deploy").click();
  await page.waitForFunction((c) => c.dataset.state === "settled", card, { timeout: T.turn });
  const disabled = await card.$$eval("button", (bs) => bs.every((b) => b.disabled));
  if (!disabled) throw new Error("buttons still enabled after the click");
  const settled = await card.$eval(".approval-text", (e) => e.textContent);
  if (settled !== "✅ Allowed in the web chat: Run deploy") throw new Error(`settled card "${settled}"`);
  await page.waitForSelector(".msg.assistant:not(.streaming) >> text=deploy ran (allowed). Finished", { timeout: T.turn });
  ok(`Allow: buttons off, the card says "${settled}", the turn finished`);
  await page.screenshot({ path: path.join(artifacts, "webchat-approval.png") });
}

// reloadKeepsFinishedTurn (issue 22): a finished turn's step lines and its
// settled card come back on reload (chat.history's turnguard on the turn's
// reply), drawn as they were live.
async function reloadKeepsFinishedTurn(page) {
  await send(page, STEPS_ASK);
  await openCard(page);
  await openButton(page, "Allow deploy").click();
  await page.waitForSelector(".run:last-child .msg.assistant:not(.streaming) >> text=deploy ran (allowed). Finished", { timeout: T.turn });
  await page.waitForSelector("#stop[disabled]", { timeout: T.turn });
  const block = (p) => p.$eval(".run:last-child", (b) => b.textContent);
  const live = await block(page);
  await page.reload();
  await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
  const card = page.getByRole("group").filter({ hasText: "✅ Allowed in the web chat: Run deploy" }).last();
  await card.waitFor({ timeout: T.turn });
  if (!(await card.getByRole("button", { name: "Allow deploy", exact: true }).isDisabled())) throw new Error("the reloaded card's buttons are on");
  for (const name of ["web_search", "deploy"]) {
    const line = page.locator(".run:last-child .step", { hasText: `🛠️ ${name}` });
    if ((await line.getAttribute("data-status")) !== "completed") throw new Error(`reloaded step ${name}: ${await line.textContent()}`);
  }
  const reloaded = await block(page);
  if (reloaded !== live) throw new Error(`reloaded turn "${reloaded}", live "${live}"`);
  ok(`after a reload the finished turn shows its steps and "✅ Allowed in the web chat: Run deploy" as live: "${reloaded}"`);
}

async function reloadThenDeny(page) {
  await send(page, ASK);
  await openCard(page);
  await page.reload();
  await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
  const card = await openCard(page);
  ok("after a reload the open question is drawn again");
  await openButton(page, "Deny deploy").click();
  await page.waitForFunction((c) => c.dataset.state === "settled", card, { timeout: T.turn });
  await page.waitForSelector(".msg.assistant:not(.streaming) >> text=deploy was not run: denied. Finished", { timeout: T.turn });
  ok(`Deny after the reload: "${await card.$eval(".approval-text", (e) => e.textContent)}"`);
}

// settledElsewhere answers the open question from a second connection (as
// another tab would) and waits for the card to follow.
async function settledElsewhere(page, token) {
  await send(page, ASK);
  const card = await openCard(page);
  const id = await card.getAttribute("data-approval-id");
  const session = "e2e-approval";
  const answered = await page.evaluate(async ({ id, token, session }) => {
    const ws = new WebSocket(`ws://${location.host}/`);
    const next = () => new Promise((res) => { ws.onmessage = (e) => res(JSON.parse(e.data)); });
    await next(); // connect.challenge
    const call = async (i, method, params) => {
      ws.send(JSON.stringify({ type: "req", id: String(i), method, params }));
      for (;;) { const f = await next(); if (f.type === "res" && f.id === String(i)) return f; }
    };
    await call(1, "connect", { minProtocol: 4, maxProtocol: 4, client: { id: "e2e-tab", mode: "webchat" }, auth: { token } });
    await call(2, "chat.history", { sessionKey: session });
    const r = await call(3, "approval.resolve", { id, optionId: "allow" });
    ws.close();
    return r;
  }, { id, token, session });
  if (!answered.ok) throw new Error(`the other client's answer: ${JSON.stringify(answered)}`);
  await page.waitForFunction((c) => c.dataset.state === "settled", card, { timeout: T.turn });
  const text = await card.$eval(".approval-text", (e) => e.textContent);
  if (!text.startsWith("✅ Allowed")) throw new Error(`card settled elsewhere says "${text}"`);
  await page.waitForSelector(".run:last-child .msg.assistant:not(.streaming) >> text=deploy ran (allowed). Finished", { timeout: T.turn });
  ok(`settled by another client, the card follows: "${text}"`);
}

async function stopWhileAsking(page) {
  await send(page, ASK);
  const card = await openCard(page);
  await page.getByRole("button", { name: "Stop", exact: true }).click();
  await page.waitForFunction((c) => c.dataset.state === "settled", card, { timeout: T.turn });
  const text = await card.$eval(".approval-text", (e) => e.textContent);
  if (!text.startsWith("⏹️")) throw new Error(`stopped card says "${text}"`);
  ok(`Stop while asking: "${text}"`);
}

// --- MODE acp: the ACP test agent's permission request -------------------------

const ACP_ASK = "ask permission";
const ACP_TITLE = "Delete build/";

// acpAnswer asks the agent's question, checks its card and clicks label;
// the card must settle as settled and the turn end with reply.
async function acpAnswer(page, label, settled, reply, shot) {
  await send(page, ACP_ASK);
  const card = await openCard(page);
  const text = await card.$eval(".approval-text", (e) => e.textContent);
  if (!text.startsWith(`🔐 Approval needed: ${ACP_TITLE}`)) throw new Error(`card text "${text}"`);
  const labels = await card.$$eval("button", (bs) => bs.map((b) => b.textContent));
  if (JSON.stringify(labels) !== '["Allow once","Reject"]') throw new Error(`buttons ${JSON.stringify(labels)}`);
  const button = (await card.$$("button"))[labels.indexOf(label)];
  await button.click();
  await page.waitForFunction((c) => c.dataset.state === "settled", card, { timeout: T.turn });
  const disabled = await card.$$eval("button", (bs) => bs.every((b) => b.disabled));
  if (!disabled) throw new Error("buttons still enabled after the click");
  const now = await card.$eval(".approval-text", (e) => e.textContent);
  if (now !== settled) throw new Error(`settled card "${now}", want "${settled}"`);
  await page.waitForSelector(`.run:last-child .msg.assistant:not(.streaming) >> text=${reply}`, { timeout: T.turn });
  ok(`ACP agent: "${text.split("\n")[0]}" with Allow once and Reject; ${label}: the card says "${now}", the agent answered "${reply}"`);
  if (shot) await page.screenshot({ path: path.join(artifacts, shot) });
}

async function acpStopWhileAsking(page) {
  await send(page, ACP_ASK);
  const card = await openCard(page);
  await page.getByRole("button", { name: "Stop", exact: true }).click();
  await page.waitForFunction((c) => c.dataset.state === "settled", card, { timeout: T.turn });
  const text = await card.$eval(".approval-text", (e) => e.textContent);
  if (text !== `⏹️ The request stopped before anyone answered: ${ACP_TITLE}`) throw new Error(`stopped card says "${text}"`);
  await page.waitForSelector('.run:last-child .notice.warning[data-stop-reason="user"]', { timeout: T.turn });
  await page.waitForSelector("#stop[disabled]", { timeout: T.turn });
  ok(`ACP agent: Stop while asking: "${text}", the turn stopped`);
}

async function main() {
  const token = new URLSearchParams(new URL(url).hash.slice(1)).get("token") || "";
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
    await page.goto(url.replace("/#", `/?session=e2e-approval${mode === "acp" ? "-acp" : ""}#`));
    await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    if (mode === "acp") {
      await acpAnswer(page, "Allow once", `✅ Allowed in the web chat: ${ACP_TITLE}`, "Tool output: deleted 3 files", "webchat-approval-acp.png");
      await acpAnswer(page, "Reject", `🚫 Denied in the web chat: ${ACP_TITLE}`, "Permission denied (no).");
      await acpStopWhileAsking(page);
      // The agent was cancelled, not left asking: its next question comes.
      await acpAnswer(page, "Allow once", `✅ Allowed in the web chat: ${ACP_TITLE}`, "Tool output: deleted 3 files");
    } else {
      await allow(page);
      await reloadKeepsFinishedTurn(page);
      await reloadThenDeny(page);
      await settledElsewhere(page, token);
      await stopWhileAsking(page);
    }
    if (consoleErrors.length) throw new Error(`console errors: ${consoleErrors.join(" | ")}`);
  } catch (err) {
    try { await page.screenshot({ path: path.join(artifacts, `webchat-approval${mode === "acp" ? "-acp" : ""}-failure.png`) }); } catch (_) { /* ignore */ }
    console.log(`FAIL: ${err.message}`);
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
}

await main();
