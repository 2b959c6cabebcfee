// dashboard.mjs: shoal's dashboard in a real headless Chromium (Debian's) against `shoal serve
// --api-key KEY` (tests/t_dashboard.sh): the live figures and the charts fill, the one-node
// topology shows, a chat message sent through the page gets 401, the page asks for the key,
// sends again and streams the reply (the key stays out of the page's storage), the refusal shows
// in the event log, and the request table lists the ids of the requests a load sent. Screenshots
// (dark and light at 1440 px, a phone at 390 px) go to OUTDIR. Prints "N passed, N failed".
// Usage: node dashboard.mjs URL KEY OUTDIR
import { checker, launch, load, sleep } from "./dash_util.mjs";

const [url, key, outdir] = process.argv.slice(2);
const base = url.replace(/\/$/, "");
const t = checker();
const browser = await launch();
try {
  const ctx = await browser.newContext({ viewport: { width: 1440, height: 1000 }, colorScheme: "dark" });
  const page = await ctx.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(base + "/?interval_ms=250", { waitUntil: "load" });
  t.check("title", (await page.title()) === "shoal");
  await page.waitForFunction(() => document.getElementById("state").textContent === "serving",
                             null, { timeout: 15000 }).catch(() => {});
  t.check("state badge says serving", (await page.textContent("#state")) === "serving");
  t.check("six charts", (await page.$$("#charts .chart")).length === 6);

  const ld = load(base, { streams: 2, key });
  // chat through the page: 401 first, then the key asked for and the message sent again
  await page.fill("#input", "Once upon a time");
  await page.click("#send");
  await page.waitForSelector("#keyrow.on", { timeout: 20000 }).catch(() => {});
  t.check("a 401 makes the page ask for the key", (await page.$("#keyrow.on")) !== null);
  await page.fill("#key", key);
  await page.press("#key", "Enter");
  await page.waitForSelector(".msg.assistant.done", { timeout: 60000 }).catch(() => {});
  const reply = await page.$$eval(".msg.assistant.done", (els) => els.map((e) => e.textContent).join(""));
  t.check("the chat reply streamed after the key was given (" + reply.slice(0, 60) + ")", /tokens in/.test(reply));
  const stored = await page.evaluate((k) => Object.keys(localStorage).some((n) => localStorage.getItem(n).includes(k)) ||
    document.cookie.includes(k), key);
  t.check("the key is kept in the page only (not in localStorage or cookies)", !stored);

  await sleep(6000);
  await ld.stop();
  t.check("the load's requests succeeded (" + ld.errors.slice(0, 2).join("; ") + ")", ld.ids.length > 0 && ld.errors.length === 0);
  await sleep(1500); // one more snapshot after the last request ended
  const rows = await page.$$eval("#reqrows tr", (trs) => trs.map((r) => r.dataset.id));
  // the table keeps the server's last 100 in the order they ended there; with 2 streams the
  // client's order of replies can differ from it by one place (dashboard_cluster.mjs)
  const want = ld.ids.slice(-99);
  const missing = want.filter((id) => !rows.includes(id));
  t.check("the request table lists every request sent (" + want.length + " sent, missing " + missing.length + ")", want.length > 0 && missing.length === 0);
  const apis = await page.$$eval("#reqrows tr td:nth-child(2)", (tds) => tds.map((x) => x.textContent));
  t.check("the request table says which API each used", apis.length > 0 && apis.every((a) => a === "chat"));
  const text = await page.textContent("#reqtab");
  t.check("no prompt text in the table without --dashboard-show-text", !text.includes("Tell me a story"));
  t.check("the 401 shows in the event log as a refusal",
          (await page.$$eval("#events li[data-kind=rejected]", (l) => l.map((x) => x.textContent).join(" "))).includes("401"));
  const n = await page.$eval("#c-tok svg", (s) => +s.dataset.n);
  t.check("the tok/s chart has points (" + n + ")", n > 0);
  const live = await page.textContent("#lasttoks");
  t.check("the last request's tok/s shows (" + live + ")", parseFloat(live) > 0);
  t.check("the topology shows this one node", (await page.$$("#topo g.node")).length === 1);
  t.check("the node says what it holds", /layers 0\u2013\d+/.test(await page.textContent("#topo g.node")));
  t.check("no script errors (" + errors.join("; ") + ")", errors.length === 0);
  await page.screenshot({ path: outdir + "/dashboard.png", fullPage: true });
  await page.emulateMedia({ colorScheme: "light" });
  await sleep(300);
  await page.screenshot({ path: outdir + "/dashboard-light.png", fullPage: true });
  await page.setViewportSize({ width: 390, height: 844 });
  await sleep(600);
  const wide = await page.evaluate(() => document.documentElement.scrollWidth);
  t.check("the phone layout fits 390 px (" + wide + ")", wide <= 390);
  await page.screenshot({ path: outdir + "/dashboard-phone.png", fullPage: true });
  console.error("screenshots: " + outdir + "/dashboard{,-light,-phone}.png");
} finally {
  await browser.close();
}
t.done();
