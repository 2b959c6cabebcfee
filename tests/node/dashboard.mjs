// dashboard.mjs: opens shoal's dashboard in a real headless Chromium (Debian's), checks that the
// node table and a live tok/s value appear, sends a chat message through the page, waits for the
// streamed reply, and saves a screenshot. Prints "N passed, N failed".
// Usage: node dashboard.mjs URL SCREENSHOT.png
import { chromium } from "playwright-core";

const [url, shot] = process.argv.slice(2);
let passed = 0, failed = 0;
const check = (what, ok) => { if (ok) passed++; else { failed++; console.error("FAIL: " + what); } };

const exe = process.env.CHROMIUM || "/usr/bin/chromium";
const browser = await chromium.launch({
  executablePath: exe,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(url, { waitUntil: "load" });
  check("title", (await page.title()) === "shoal");

  // The events stream fills the state badge and the node table.
  await page.waitForFunction(() => document.getElementById("state").textContent === "serving",
                             null, { timeout: 15000 }).catch(() => {});
  check("state badge says serving", (await page.textContent("#state")) === "serving");
  const rows = await page.$$eval("#nodes tbody tr td", (tds) => tds.map((t) => t.textContent));
  check("node table has a leader row", rows.includes("leader"));

  // Chat through the page: the reply streams into the log.
  await page.fill("#input", "Once upon a time");
  await page.click("#send");
  await page.waitForSelector(".msg.assistant.done, .msg.error.done", { timeout: 60000 });
  const reply = await page.textContent(".msg.assistant.done").catch(() => "");
  const err = await page.textContent(".msg.error").catch(() => null);
  check("chat reply streamed (" + (err || "no error") + ")", !err && reply.length > 0);
  check("reply shows its token count", /tokens in/.test(reply));

  // After a generation the live rate or the last request's rate shows a positive number.
  await page.waitForFunction(() => parseFloat(document.getElementById("lasttoks").textContent) > 0,
                             null, { timeout: 10000 }).catch(() => {});
  const last = parseFloat(await page.textContent("#lasttoks"));
  const live = parseFloat(await page.textContent("#toks"));
  check("tok/s value appears (" + last + ", live " + live + ")", last > 0 && Number.isFinite(live));
  check("no script errors (" + errors.join("; ") + ")", errors.length === 0);
  await page.screenshot({ path: shot, fullPage: false });
  console.error("screenshot: " + shot);
} finally {
  await browser.close();
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
