// dash_util.mjs: what the dashboard tests share (dashboard.mjs, dashboard_cluster.mjs,
// dashboard_mem.mjs): Debian's Chromium through playwright-core with the flags this machine needs,
// a check counter, a load generator that remembers the ids of the replies, and the page's heap
// after a garbage collection (Chrome DevTools Protocol).
import { chromium } from "playwright-core";

export function checker() {
  const c = { passed: 0, failed: 0 };
  c.check = (what, ok) => { if (ok) c.passed++; else { c.failed++; console.error("FAIL: " + what); } };
  c.done = () => { console.log(`${c.passed} passed, ${c.failed} failed`); process.exit(c.failed ? 1 : 0); };
  return c;
}

// Without the background-networking flags Chromium's connections to Google's hosts are refused
// by the closed network here, many at a time (/work/.library/env/machines/c.md).
export function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--enable-precise-memory-info"],
  });
}

// Streams chat completions to base (e.g. "http://10.77.0.1:8080") from `streams` concurrent
// loops until stop() is called; ids holds every reply's id, errors every failure's message.
export function load(base, { streams = 2, maxTokens = 48, key = "" } = {}) {
  const st = { ids: [], errors: [], running: true, done: null };
  const one = async () => {
    const headers = { "Content-Type": "application/json" };
    if (key) headers.Authorization = "Bearer " + key;
    const res = await fetch(base + "/v1/chat/completions", { method: "POST", headers, redirect: "follow",
      body: JSON.stringify({ messages: [{ role: "user", content: "Tell me a story" }], stream: true,
                             max_tokens: maxTokens, temperature: 0.8 }) });
    const text = await res.text(); // a stream: every chunk carries the reply's id
    const m = /"id":"([^"]+)"/.exec(text);
    if (m) st.ids.push(m[1]);
    if (!res.ok || /"error"/.test(text)) st.errors.push(res.status + " " + text.slice(0, 120));
  };
  const loop = async () => { while (st.running) { try { await one(); } catch (e) { st.errors.push(String(e)); await sleep(200); } } };
  st.done = Promise.all(Array.from({ length: streams }, loop));
  st.stop = async () => { st.running = false; await st.done; };
  return st;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The page's JavaScript heap in bytes after a full garbage collection, and its DOM node count.
export async function heap(page, cdp) {
  await cdp.send("HeapProfiler.collectGarbage");
  const h = await cdp.send("Runtime.getHeapUsage");
  const nodes = await page.evaluate(() => document.getElementsByTagName("*").length);
  return { used: h.usedSize, nodes };
}
