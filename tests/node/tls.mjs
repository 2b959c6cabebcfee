// tls.mjs: the official `openai` npm package against shoal's API over HTTPS (tests/t_tls.sh):
// models list, a chat completion and a streamed one. The server's certificate is signed by a test
// CA the shell made with openssl and handed to node through NODE_EXTRA_CA_CERTS, so this also
// checks the chain and the name (127.0.0.1 in subjectAltName). Prints "N passed, N failed".
// Usage: SHOAL_API_KEY=... node tls.mjs https://127.0.0.1:PORT
import OpenAI from "openai";

const url = process.argv[2];
let passed = 0, failed = 0;
const check = (what, ok, detail) => {
  if (ok) passed++;
  else { failed++; console.error("FAIL: " + what + (detail !== undefined ? ": " + JSON.stringify(detail) : "")); }
};
const client = new OpenAI({ baseURL: url + "/v1", apiKey: process.env.SHOAL_API_KEY || "none", maxRetries: 0 });
try {
  const models = await client.models.list();
  check("models over HTTPS", models.data.length === 1, models.data);
  const model = models.data[0].id;
  const r = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Once upon a time" }], max_tokens: 16, temperature: 0 });
  check("chat over HTTPS", r.choices[0].message.content.length > 0, r);
  const stream = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Once upon a time" }], max_tokens: 16, stream: true });
  let text = "", chunks = 0;
  for await (const ch of stream) { chunks++; text += ch.choices[0]?.delta?.content || ""; }
  check("streamed chat over HTTPS", chunks > 2 && text.length > 0, { chunks, text });
  const bad = new OpenAI({ baseURL: url + "/v1", apiKey: "wrong-key", maxRetries: 0 });
  let status = 0;
  try { await bad.models.list(); } catch (e) { status = e.status; }
  check("a wrong key gets 401", status === 401, status);
} catch (e) {
  check("no exception", false, String(e));
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
