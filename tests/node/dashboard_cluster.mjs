// dashboard_cluster.mjs: the dashboard of a 3-node agent cluster (tests/t_dashboard_netns.sh) in a
// real headless Chromium, under load: the charts have points for the last minute, the topology
// shows 3 nodes and 3 links with RTT labels, the request table lists the requests sent, and a
// follower killed with SIGKILL appears in the event log and as a marker on the charts. Screenshots
// go to OUTDIR (dashboard-cluster.png under load, -killed.png after the kill, -phone.png).
//
// The links' RTTs are the agents' own (agent/links.h: /v1/cluster's rtt_ms).
// Usage: node dashboard_cluster.mjs URL OUTDIR FOLLOWER_PID FOLLOWER_ID
import { checker, launch, load, sleep } from "./dash_util.mjs";

const [url, outdir, fpid, fid] = process.argv.slice(2);
const base = url.replace(/\/$/, ""), t = checker();
const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 1000 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(base + "/", { waitUntil: "load" });
  await page.waitForFunction(() => document.getElementById("state").textContent === "serving",
                             null, { timeout: 30000 }).catch(() => {});
  t.check("the leader's page says serving", (await page.textContent("#state")) === "serving");

  // a minute of load; the page keeps the last minute on screen
  const ld = load(base, { streams: 3, maxTokens: 64 });
  await page.click("#range button[data-s='60']");
  const ids = ["tok", "ttft", "itl", "queue", "step", "comm"];
  const charts = () => Promise.all(ids.map((id) => page.$eval("#c-" + id + " svg", (s) => ({ n: +s.dataset.n, span: +s.dataset.t1 - +s.dataset.t0 }))));
  // the latency, step and communication series have a point for each second something ran, so
  // the load runs a whole minute (longer while the machine is too busy to fill every second)
  await sleep(62000);
  let d = await charts();
  for (let k = 0; k < 60 && !d.every((x) => x.n >= 55 && x.span >= 55000); k++) { await sleep(1000); d = await charts(); }
  ids.forEach((id, i) => t.check(`chart ${id} has points for the last minute (${d[i].n} over ${(d[i].span / 1000).toFixed(0)} s)`,
                                 d[i].n >= 55 && d[i].span >= 55000));
  const ymax = await page.$eval("#c-tok .ymax", (e) => e.textContent);
  t.check("the tok/s chart shows generation (" + ymax + ")", ymax !== "max 1.00");
  const nodes = await page.$$eval("#topo g.node", (gs) => gs.map((g) => g.dataset.id));
  t.check("the topology shows 3 nodes (" + nodes.length + ")", nodes.length === 3);
  const links = await page.$$eval("#topo g.link text", (ts) => ts.map((x) => x.textContent));
  t.check("the topology shows 3 links with RTT labels (" + links.join(" | ") + ")", links.length === 3 && links.every((s) => /\d ms/.test(s)));
  t.check("each node says what it holds", (await page.$$eval("#topo g.node", (gs) => gs.filter((g) => /heads \d+\u2013\d+|layers \d+\u2013\d+/.test(g.textContent)).length)) === 3);
  t.check("the plan's strategy shows", (await page.textContent("#plan")).length > 0);

  await ld.stop();
  t.check("the load's requests succeeded (" + ld.errors.slice(0, 2).join("; ") + ")", ld.ids.length > 0 && ld.errors.length === 0);
  await sleep(2500);
  const rows = await page.$$eval("#reqrows tr", (trs) => trs.map((r) => r.dataset.id));
  // the table keeps the server's last 100 in the order they ended there; the load records a reply
  // when its client has read it all, and with 3 streams in flight the two orders can differ by
  // 2 places, so the client's 98 newest are the ones certain to be in the table
  const want = ld.ids.slice(-98), missing = want.filter((id) => !rows.includes(id));
  t.check(`the request table lists the requests sent (${want.length} of ${ld.ids.length}, missing ${missing.length})`, want.length > 0 && missing.length === 0);

  await page.screenshot({ path: outdir + "/dashboard-cluster.png", fullPage: true });

  // kill -9 of a follower: its leaving is logged and marked on the charts
  process.kill(+fpid, "SIGKILL");
  const short = fid.slice(0, 8);
  await page.waitForFunction((s) => [...document.querySelectorAll("#events li[data-kind=leave]")].some((l) => l.textContent.includes(s)),
                             short, { timeout: 30000 }).catch(() => {});
  const left = await page.$$eval("#events li[data-kind=leave]", (ls) => ls.map((l) => l.textContent));
  t.check("the killed follower appears in the event log (" + left.join(" | ") + ")", left.some((s) => s.includes(short)));
  await sleep(2500); // a sample after the event, so the marker sits inside the drawn range
  const marks = await page.$$eval("#charts path[data-kind=leave]", (ps) => ps.filter((p) => (p.getAttribute("d") || "").length > 0).length);
  t.check("the leave is marked on the charts (" + marks + " of 6)", marks === 6);
  await page.waitForFunction(() => document.querySelectorAll("#topo g.node").length === 2, null, { timeout: 30000 }).catch(() => {});
  t.check("the topology follows: 2 nodes left", (await page.$$("#topo g.node")).length === 2);
  t.check("no script errors (" + errors.join("; ") + ")", errors.length === 0);
  await page.screenshot({ path: outdir + "/dashboard-cluster-killed.png", fullPage: true });
  await page.setViewportSize({ width: 390, height: 844 });
  await sleep(600);
  await page.screenshot({ path: outdir + "/dashboard-cluster-phone.png", fullPage: true });
  console.error("screenshots: " + outdir + "/dashboard-cluster{,-killed,-phone}.png");
} finally {
  await browser.close();
}
t.done();
