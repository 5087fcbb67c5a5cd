// Drives turnguard's admin dashboard in headless Chromium (Debian's, through
// playwright-core) as an operator would, while a user waits in the web chat:
// the user starts a turn that hangs in its shell step; the dashboard shows
// it as stalled with a warning naming the step and how long it has run
// (screenshot), updating without a reload; the operator aborts it with the
// two-click abort button; the turn leaves the live list and appears under
// recent aborts with stop reason "user" (screenshot); the user's chat shows
// the stop notice. Then the user's next turn asks a question; the
// dashboard lists it; the operator allows it; the user's card says so and
// the turn finishes.
//
// Usage: node admin.mjs BASE_URL ARTIFACTS_DIR
// Env:   E2E_CHROMIUM (executable), E2E_NODE_MODULES (where playwright-core is),
//        ADMIN_GATEWAY_TOKEN (web chat), ADMIN_OPERATOR_TOKEN (dashboard)
// Prints one "ok: …" line per check; on failure "FAIL: …", a screenshot
// admin-failure.png, and exit status 1.
import { createRequire } from "node:module";
import path from "node:path";

const [base, artifacts] = process.argv.slice(2);
const gatewayToken = process.env.ADMIN_GATEWAY_TOKEN;
const operatorToken = process.env.ADMIN_OPERATOR_TOKEN;
if (!base || !artifacts || !gatewayToken || !operatorToken) {
  console.error("usage: ADMIN_GATEWAY_TOKEN=… ADMIN_OPERATOR_TOKEN=… node admin.mjs BASE_URL ARTIFACTS_DIR");
  process.exit(2);
}
const require = createRequire(path.join(process.env.E2E_NODE_MODULES || ".", "_.js"));
const { chromium } = require("playwright-core");

const ok = (msg) => console.log(`ok: ${msg}`);
const T = { connect: 20000, stall: 20000, update: 15000 };

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.E2E_CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const chat = await ctx.newPage();
  const admin = await ctx.newPage();
  const consoleErrors = [];
  for (const [name, page] of [["chat", chat], ["admin", admin]]) {
    page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(`${name}: ${m.text()}`); });
    page.on("pageerror", (e) => consoleErrors.push(`${name}: ${e}`));
  }
  try {
    // The user: a fresh web chat session, a turn that hangs in shell.
    await chat.goto(`${base}/#token=${encodeURIComponent(gatewayToken)}`);
    await chat.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    await chat.getByRole("button", { name: "+ New session", exact: true }).click();
    await chat.waitForFunction(() => document.querySelector("#session").value.startsWith("agent:main:web-"));
    const session = await chat.$eval("#session", (s) => s.value);
    await chat.fill("#input", "/steps web_search:200ms shell:hang");
    await chat.click("#send");
    ok(`user started a turn in ${session}`);

    // The operator: the dashboard, token from the fragment.
    await admin.goto(`${base}/admin#token=${encodeURIComponent(operatorToken)}`);
    await admin.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    if ((await admin.evaluate(() => location.href)).includes("token")) throw new Error("the operator token stayed in the address bar");
    ok("dashboard connected; token removed from the address bar");

    // The live turn appears, then turns stalled — without a reload.
    const row = admin.locator("tr.turn", { hasText: session });
    await row.waitFor({ timeout: T.update });
    ok("the live turn is listed");
    await admin.waitForSelector('tr.turn[data-stalled="true"] .stall-warning', { timeout: T.stall });
    const warning = await row.locator(".stall-warning").textContent();
    if (!/shell has been running for \d/.test(warning)) throw new Error(`stall warning ${JSON.stringify(warning)} does not name shell and its duration`);
    ok(`stall warning: ${warning}`);
    const first = await row.locator(".stall-warning").textContent();
    await admin.waitForFunction((prev) => {
      const w = document.querySelector('tr.turn[data-stalled="true"] .stall-warning');
      return w && w.textContent !== prev;
    }, first, { timeout: T.update });
    ok("the stall duration updates in place");
    await admin.waitForSelector("#stalled-count:not([hidden])");
    const shot = path.join(artifacts, "admin-stalled.png");
    await admin.screenshot({ path: shot, fullPage: true });
    ok(`screenshot ${shot}`);

    // Abort: the first click arms the button, the second aborts.
    const button = admin.getByRole("button", { name: `Abort of the turn in ${session}`, exact: true });
    const runId = await button.getAttribute("data-run-id");
    await button.click();
    await admin.waitForSelector(`button.abort[data-run-id="${runId}"][data-armed="true"]`, { timeout: 2000 });
    ok("abort button armed (asks for a confirming click)");
    await admin.locator(`button.abort[data-run-id="${runId}"]`).click();
    await admin.waitForSelector(`tr.turn[data-run-id="${runId}"]`, { state: "detached", timeout: T.update });
    ok("the aborted turn left the live list");
    await admin.waitForSelector(`#aborts tr.abort-row[data-run-id="${runId}"][data-stop-reason="user"]`, { timeout: T.update });
    ok("the abort is listed under recent aborts with stop reason user");
    await admin.waitForSelector(`#stalls tr.episode[data-run-id="${runId}"][data-outcome="aborted"]`, { timeout: T.update });
    ok("the stall history shows the episode ended by the abort");
    const after = path.join(artifacts, "admin-aborted.png");
    await admin.screenshot({ path: after, fullPage: true });
    ok(`screenshot ${after}`);

    // The user is told.
    await chat.waitForSelector('.run:last-child .notice.warning[data-stop-reason="user"]', { timeout: T.update });
    ok("the user's chat shows the stop notice");

    // A question: the user's turn asks whether deploy may run; the
    // dashboard lists it under open questions; the operator allows it; the
    // user's card shows who answered and the turn finishes.
    await chat.fill("#input", "/steps ask:deploy say:Finished");
    await chat.click("#send");
    const card = await chat.waitForSelector('.run:last-child .approval[data-state="open"]', { timeout: T.update });
    const q = admin.locator("#approvals tr.approval", { hasText: "Run deploy" });
    await q.waitFor({ timeout: T.update });
    ok("the open question is listed on the dashboard");
    const qshot = path.join(artifacts, "admin-approval.png");
    await admin.screenshot({ path: qshot, fullPage: true });
    ok(`screenshot ${qshot}`);
    // By role and name: the button names the question and its session.
    await admin.getByRole("button", { name: `Allow deploy in ${session}`, exact: true }).click();
    await q.waitFor({ state: "detached", timeout: T.update });
    ok("the answered question left the dashboard");
    await chat.waitForFunction((c) => c.dataset.state === "settled", card, { timeout: T.update });
    const settled = await card.$eval(".approval-text", (e) => e.textContent);
    if (!settled.includes("✅ Allowed by the operator: Run deploy")) throw new Error(`the user's card says ${JSON.stringify(settled)}`);
    await chat.waitForSelector(".run:last-child .msg.assistant:not(.streaming) >> text=deploy ran (allowed). Finished", { timeout: T.update });
    ok(`the user's card: "${settled}", and the turn finished`);

    // An operator on a phone, opening the dashboard without a token: it
    // asks for one; "#token=…" added to the open page connects it without a
    // reload; at 390 px the tables (recent aborts, stall history) scroll
    // inside their sections and the page is never wider than the screen.
    const phone = await browser.newPage({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
    phone.on("console", (m) => { if (m.type() === "error" && !/401|403/.test(m.text())) consoleErrors.push(`admin 390 px: ${m.text()}`); });
    phone.on("pageerror", (e) => consoleErrors.push(`admin 390 px: ${e}`));
    await phone.goto(`${base}/admin`);
    await phone.waitForSelector('#status[data-state="auth"]', { timeout: T.connect });
    await phone.getByRole("textbox", { name: "Operator token", exact: true }).waitFor({ timeout: T.connect });
    await phone.evaluate((t) => { location.hash = `token=${encodeURIComponent(t)}`; }, operatorToken);
    await phone.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    if ((await phone.evaluate(() => location.href)).includes("token")) throw new Error("the operator token stayed in the address bar");
    ok("dashboard without a token asked for one; #token=… added to the open page connected it without a reload");
    await phone.waitForSelector(`#aborts tr.abort-row[data-run-id="${runId}"]`, { timeout: T.update });
    await phone.waitForSelector(`#stalls tr.episode[data-run-id="${runId}"]`, { timeout: T.update });
    const widths = await phone.evaluate(() => ({
      page: document.documentElement.scrollWidth,
      tables: [...document.querySelectorAll("table")].map((t) => t.scrollWidth),
    }));
    const phoneShot = path.join(artifacts, "admin-390.png");
    await phone.screenshot({ path: phoneShot, fullPage: true });
    if (widths.page > 390) throw new Error(`the dashboard is ${widths.page} px wide at 390 px (tables ${widths.tables.join(", ")})`);
    ok(`390 px: page scrollWidth ${widths.page} ≤ 390 (tables ${widths.tables.join(", ")} px scroll inside their sections); screenshot ${phoneShot}`);
    await phone.close();

    if (consoleErrors.length) throw new Error(`console errors: ${consoleErrors.join("; ")}`);
    ok("no console errors");
  } catch (err) {
    console.log(`FAIL: ${err.message}`);
    await admin.screenshot({ path: path.join(artifacts, "admin-failure.png"), fullPage: true }).catch(() => {});
    await browser.close();
    process.exit(1);
  }
  await browser.close();
}

main().catch((err) => {
  console.log(`FAIL: ${err.stack || err}`);
  process.exit(1);
});
