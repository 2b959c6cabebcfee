// load.mjs: N concurrent streaming chat clients against shoal for D seconds on loopback.
// Each client loops: POST /v1/chat/completions with stream + include_usage, reads the SSE stream to
// [DONE]; a 429 (queue full) waits a little and retries; anything else is an error.
// Prints requests/s and tokens/s and "N passed, N failed".
// Usage: node load.mjs URL CLIENTS SECONDS
import http from "node:http";

const [url, nClients = "50", secs = "30"] = process.argv.slice(2);
const u = new URL("/v1/chat/completions", url);
const deadline = Date.now() + Number(secs) * 1000;
const agent = new http.Agent({ keepAlive: true, maxSockets: Number(nClients) });
const st = { ok: 0, tokens: 0, rejected: 0, errors: 0, firstErrors: [] };
const prompts = ["Once upon a time", "The little dog", "Lily wanted to", "Tom and his friend", "One day"];

function oneRequest(i) {
  return new Promise((resolve) => {
    const body = JSON.stringify({
      model: "any", stream: true, stream_options: { include_usage: true }, max_tokens: 24 + (i % 16),
      temperature: 0.8, seed: i, messages: [{ role: "user", content: prompts[i % prompts.length] }],
    });
    const req = http.request(u, { method: "POST", agent, headers: { "Content-Type": "application/json",
      "Content-Length": Buffer.byteLength(body) } }, (res) => {
      let buf = "";
      res.setEncoding("utf8");
      res.on("data", (d) => { buf += d; });
      res.on("end", () => {
        if (res.statusCode === 429) return resolve("429");
        if (res.statusCode !== 200) return resolve("HTTP " + res.statusCode + " " + buf.slice(0, 200));
        if (!buf.endsWith("data: [DONE]\n\n")) return resolve("stream did not end with [DONE]: " + buf.slice(-200));
        const ev = buf.split("\n\n").filter((e) => e.startsWith("data: {"));
        const last = JSON.parse(ev[ev.length - 1].slice(6));
        if (!last.usage) return resolve("no usage chunk");
        st.tokens += last.usage.completion_tokens;
        resolve("ok");
      });
      res.on("error", (e) => resolve("response error " + e.message));
    });
    req.on("error", (e) => resolve("request error " + e.message));
    req.end(body);
  });
}

async function client(c) {
  let i = c;
  while (Date.now() < deadline) {
    const r = await oneRequest(i);
    i += Number(nClients);
    if (r === "ok") st.ok++;
    else if (r === "429") { st.rejected++; await new Promise((z) => setTimeout(z, 100 + Math.random() * 200)); }
    else { st.errors++; if (st.firstErrors.length < 5) st.firstErrors.push(r); }
  }
}

const t0 = Date.now();
await Promise.all(Array.from({ length: Number(nClients) }, (_, c) => client(c)));
const dt = (Date.now() - t0) / 1000;
agent.destroy();
console.log(`load: ${nClients} clients, ${dt.toFixed(1)} s: ${st.ok} requests (${(st.ok / dt).toFixed(1)} req/s), ` +
  `${st.tokens} tokens (${(st.tokens / dt).toFixed(1)} tok/s), ${st.rejected} rejected with 429, ${st.errors} errors`);
for (const e of st.firstErrors) console.error("error: " + e);
const failed = (st.errors ? 1 : 0) + (st.ok ? 0 : 1);
console.log(`${2 - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
