// Drives the web chat's command suggestions in headless Chromium against
// the e2e gateway on the acp runner (runner/acp's test agent, whose
// commands are /echo and /mode):
//
//   1. "/" typed in a fresh conversation lists the gateway's commands
//      (/stop first, /help) and /mode, from commands.list;
//   2. after a turn ("/echo hi" — the agent's command, answered "echo: hi"),
//      "/" lists the agent's /echo with its description after the
//      gateway's; "/e" leaves only /echo; Tab fills "/echo "
//      (webchat-commands.png); Escape closes a list; "/zz" shows none.
//
// Usage: node webchat-commands.mjs URL ARTIFACTS_DIR   (URL with #token=…)
// Env:   E2E_CHROMIUM, E2E_NODE_MODULES (as webchat.mjs)
// Prints one "ok: …" line per check; on failure "FAIL: …" and exit status 1.
import { createRequire } from "node:module";
import path from "node:path";

const [url, artifacts] = process.argv.slice(2);
if (!url || !artifacts) {
  console.error("usage: node webchat-commands.mjs URL ARTIFACTS_DIR");
  process.exit(2);
}
const require = createRequire(path.join(process.env.E2E_NODE_MODULES || ".", "_.js"));
const { chromium } = require("playwright-core");

const ok = (msg) => console.log(`ok: ${msg}`);
const T = { connect: 20000, turn: 30000 };

const textbox = (page) => page.getByRole("textbox", { name: "Message", exact: true });

// suggested types text into the empty textbox key by key (as a person
// does: each key an input event) and returns the names listed.
async function suggested(page, text, want) {
  await textbox(page).fill("");
  await textbox(page).pressSequentially(text);
  if (want === 0) {
    await page.waitForSelector("#suggest", { state: "hidden", timeout: T.connect });
    return [];
  }
  await page.waitForFunction((n) => document.querySelectorAll("#suggest:not([hidden]) li").length === n, want, { timeout: T.connect });
  return page.$$eval("#suggest li .name", (els) => els.map((e) => e.textContent));
}

function expect(what, got, want) {
  if (JSON.stringify(got) !== JSON.stringify(want)) throw new Error(`${what}: ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
  ok(`${what}: ${got.join(" ")}`);
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
    await page.goto(url.replace("/#", `/?session=e2e-commands-${Date.now()}#`));
    await page.waitForSelector('#status[data-state="connected"]', { timeout: T.connect });
    const gateway = ["/stop", "/status", "/new", "/queue", "/help", "/mode"];
    expect("a fresh conversation suggests the gateway's commands", await suggested(page, "/", gateway.length), gateway);
    await page.keyboard.press("Escape");
    await page.waitForSelector("#suggest", { state: "hidden" });
    ok("Escape closes the list");

    await textbox(page).fill("/echo hi");
    await page.getByRole("button", { name: "Send", exact: true }).click();
    await page.waitForSelector('.msg.assistant >> text="echo: hi"', { timeout: T.turn });
    ok("the agent's /echo ran");

    expect("after a turn the agent's commands follow the gateway's", await suggested(page, "/", gateway.length + 1), [...gateway, "/echo"]);
    const desc = await page.$eval('#suggest li[data-name="echo"] .desc', (e) => e.textContent);
    if (desc !== "Say the input back") throw new Error(`/echo's description ${JSON.stringify(desc)}`);
    expect("typing filters", await suggested(page, "/e", 1), ["/echo"]);
    await page.screenshot({ path: path.join(artifacts, "webchat-commands.png") });
    await page.keyboard.press("Tab");
    const value = await textbox(page).inputValue();
    if (value !== "/echo ") throw new Error(`Tab filled ${JSON.stringify(value)}, want "/echo "`);
    await page.waitForSelector("#suggest", { state: "hidden" });
    ok("Tab fills the command");
    await suggested(page, "/zz", 0);
    ok("no command matches /zz: no list");
    if (consoleErrors.length) throw new Error(`console errors: ${consoleErrors.join(" | ")}`);
  } catch (err) {
    try { await page.screenshot({ path: path.join(artifacts, "webchat-commands-failure.png") }); } catch (_) { /* ignore */ }
    console.log(`FAIL: ${err.message}`);
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
}

await main();
