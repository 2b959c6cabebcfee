// serve_bench.mjs: the serving figures of `make bench` (scripts/bench_serve.sh) through the HTTP API.
//   node serve_bench.mjs URL streams N R   N concurrent clients, R streamed 64-token completions
//                                          each: aggregate tok/s, mean request latency
//   node serve_bench.mjs URL ttft K BG     K sequential requests, each with BG long streams running
//                                          (0 = idle): time to the first token (its chunk), median
//                                          and max
// Prints one line of figures; exits non-zero only when a request fails.
import http from "node:http";

const [url, mode, a = "1", b = "1"] = process.argv.slice(2);
const u = new URL("/v1/completions", url);
const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });

// One streamed completion: resolves {tokens, ms, ttft} or rejects. ttft: the first chunk (with
// perToken, logprobs on: every token sends a chunk, even one whose text is still held back, so
// this is the first token; else the first chunk with text). onFirst is called then; ctl.abort()
// ends a background stream early.
function complete(maxTokens, prompt, onFirst, ctl, perToken) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true,
      stream_options: { include_usage: true }, ...(perToken ? { logprobs: true } : {}) });
    const t0 = process.hrtime.bigint();
    let ttft = -1, buf = "";
    const req = http.request(u, { method: "POST", agent, headers: { "Content-Type": "application/json",
      "Content-Length": Buffer.byteLength(body) } }, (res) => {
      res.setEncoding("utf8");
      res.on("data", (d) => {
        buf += d;
        if (ttft < 0 && (perToken ? buf.includes("data: {") : /"text":"[^"]/.test(buf))) {
          ttft = Number(process.hrtime.bigint() - t0) / 1e6;
          if (onFirst) onFirst();
        }
      });
      res.on("end", () => {
        const ms = Number(process.hrtime.bigint() - t0) / 1e6;
        if (res.statusCode !== 200) return reject(new Error("HTTP " + res.statusCode + " " + buf.slice(0, 200)));
        const m = buf.match(/"completion_tokens":(\d+)/g);
        const tokens = m ? Number(m[m.length - 1].split(":")[1]) : 0;
        resolve({ tokens, ms, ttft });
      });
      res.on("error", reject);
    });
    req.on("error", (e) => (ctl && ctl.aborted ? resolve({ tokens: 0, ms: 0, ttft }) : reject(e)));
    if (ctl) ctl.abort = () => { ctl.aborted = true; req.destroy(); };
    req.end(body);
  });
}

const names = ["Anna", "Ben", "Carl", "Dora", "Eve", "Fred", "Gus", "Hana", "Ivan", "Jill", "Kai",
  "Lena", "Max", "Nora", "Otto", "Pia"];
const prompts = ["Once upon a time", "The little dog", "Lily wanted to", "Tom and his friend",
  "One day", "The sun was", "In a small town", "A big red ball"];

if (mode === "streams") {
  const n = Number(a), r = Number(b);
  const t0 = Date.now();
  let tokens = 0, lat = 0;
  await Promise.all(Array.from({ length: n }, async (_, c) => {
    for (let i = 0; i < r; i++) {
      const x = await complete(64, prompts[(c + i) % prompts.length]);
      tokens += x.tokens;
      lat += x.ms;
    }
  }));
  const s = (Date.now() - t0) / 1000;
  console.log(`${n} ${(tokens / s).toFixed(1)} ${tokens} ${s.toFixed(1)} ${(lat / n / r / 1000).toFixed(2)}`);
} else if (mode === "ttft") {
  const k = Number(a), bg = Number(b);
  const ctls = [], started = [];
  for (let i = 0; i < bg; i++) {
    const ctl = {};
    ctls.push(ctl);
    started.push(new Promise((go) => { complete(100000, prompts[i + 1], go, ctl).catch(() => go()); }));
  }
  await Promise.all(started); // every background stream is generating
  const t = [];
  for (let i = 0; i < k; i++) {
    await new Promise((z) => setTimeout(z, 150));
    // a prompt no slot holds yet (a returning prompt would reuse its slot's prefix and answer
    // sooner): the idle and the loaded run measure the same work
    t.push((await complete(8, `${names[(i + 8 * bg) % names.length]} ${prompts[0]}`, null, null,
      true)).ttft);
  }
  for (const c of ctls) c.abort();
  t.sort((x, y) => x - y);
  console.log(`${t[Math.floor(t.length / 2)].toFixed(0)} ${t[t.length - 1].toFixed(0)}`);
} else {
  console.error("usage: node serve_bench.mjs URL streams N R | ttft K BG");
  process.exit(2);
}
agent.destroy();
