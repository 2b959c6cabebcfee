// dashboard_mem.mjs: does the dashboard's memory stay flat while it updates? Opens the page with
// its events feed at INTERVAL_MS (/?interval_ms=), keeps a light load on the server (so requests,
// events and chart points keep coming), and after a warm-up reads the page's JavaScript heap after
// a garbage collection and its DOM node count every SECONDS/10. Prints the figures; with
// MAX_GROWTH_KB also checks the heap grew less than that and the DOM by at most 60 nodes
// (tests/t_dashboard.sh; scripts/bench_dashboard.sh runs it for 10 minutes at 1 s, printing only).
// Usage: node dashboard_mem.mjs URL KEY SECONDS INTERVAL_MS [MAX_GROWTH_KB]
import { checker, heap, launch, load, sleep } from "./dash_util.mjs";

const [url, key, secs, iv, maxKb] = process.argv.slice(2);
const base = url.replace(/\/$/, ""), seconds = +secs || 20, t = checker();
const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 1000 } });
  await page.addInitScript(() => { // counts the snapshots the page receives
    const ES = window.EventSource;
    window.__updates = 0;
    window.EventSource = class extends ES {
      set onmessage(f) { super.onmessage = (e) => { window.__updates++; f(e); }; }
      get onmessage() { return super.onmessage; }
    };
  });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  const cdp = await page.context().newCDPSession(page);
  const ld = load(base, { streams: 1, maxTokens: 24, key });
  await page.goto(base + "/?interval_ms=" + (+iv || 1000), { waitUntil: "load" });
  await sleep(Math.min(10000, seconds * 250)); // warm-up: history loaded, table filling
  const first = await heap(page, cdp), u0 = await page.evaluate(() => window.__updates);
  const t0 = Date.now();
  let last = first, peak = first.used;
  console.error(`heap at start: ${(first.used / 1024).toFixed(0)} KB, ${first.nodes} DOM nodes`);
  for (let k = 1; k <= 10; k++) {
    await sleep(seconds * 100);
    last = await heap(page, cdp);
    peak = Math.max(peak, last.used);
    console.error(`  +${Math.round((Date.now() - t0) / 1000)} s: ${(last.used / 1024).toFixed(0)} KB, ${last.nodes} DOM nodes`);
  }
  const upd = (await page.evaluate(() => window.__updates)) - u0, el = (Date.now() - t0) / 1000;
  const grew = (last.used - first.used) / 1024;
  console.log(`dashboard memory: ${upd} updates in ${el.toFixed(0)} s (${(upd / el).toFixed(1)}/s); heap ` +
              `${(first.used / 1024).toFixed(0)} -> ${(last.used / 1024).toFixed(0)} KB (${grew >= 0 ? "+" : ""}${grew.toFixed(0)} KB, ` +
              `peak ${(peak / 1024).toFixed(0)} KB); DOM ${first.nodes} -> ${last.nodes} nodes`);
  await ld.stop();
  if (maxKb) {
    t.check("updates at least once a second (" + upd + " in " + el.toFixed(0) + " s)", upd >= el * 0.9);
    t.check("heap grew less than " + maxKb + " KB (" + grew.toFixed(0) + " KB)", grew < +maxKb);
    t.check("DOM nodes stay bounded (" + first.nodes + " -> " + last.nodes + ")", last.nodes - first.nodes <= 60);
    t.check("no script errors (" + errors.join("; ") + ")", errors.length === 0);
  }
} finally {
  await browser.close();
}
if (maxKb) t.done();
