// openai.mjs: the official `openai` npm package against a running `shoal serve` (stories260K):
// models list, completions, chat, streaming chat with stream_options.include_usage, streaming
// completions, and an error. Greedy texts must equal what `shoal generate` printed for the same
// request (passed in by tests/t_openai.sh); usage counts must equal the token counts.
// Usage: EXPECT_TEXT=... EXPECT_PROMPT_TOKENS=5 EXPECT_COMPLETION_TOKENS=64 node openai.mjs URL
import OpenAI from "openai";

const url = process.argv[2];
const env = process.env;
let passed = 0, failed = 0;
const check = (what, ok, detail) => {
  if (ok) passed++;
  else { failed++; console.error("FAIL: " + what + (detail !== undefined ? ": " + JSON.stringify(detail) : "")); }
};
const client = new OpenAI({ baseURL: url + "/v1", apiKey: env.SHOAL_API_KEY || "none", maxRetries: 0 });
const PROMPT = env.PROMPT || "Once upon a time";
const N = Number(env.MAX_TOKENS || 64);

// models
const models = await client.models.list();
const m = models.data[0];
check("models list has the model", models.data.length === 1 && !!m.id, models.data);
check("model has its context length", m.context_length > 0, m);
const model = m.id;

// completions, greedy: the text of `shoal generate`
const c = await client.completions.create({ model, prompt: PROMPT, max_tokens: N, temperature: 0 });
const text = c.choices[0].text;
check("completion object", c.object === "text_completion", c.object);
if (env.EXPECT_TEXT !== undefined) check("completion text equals shoal generate's", text === env.EXPECT_TEXT, { got: text, want: env.EXPECT_TEXT });
if (env.EXPECT_PROMPT_TOKENS) check("usage.prompt_tokens equals the prompt's token count", c.usage.prompt_tokens === Number(env.EXPECT_PROMPT_TOKENS), c.usage);
if (env.EXPECT_COMPLETION_TOKENS) check("usage.completion_tokens equals the generated token count", c.usage.completion_tokens === Number(env.EXPECT_COMPLETION_TOKENS), c.usage);
check("usage.total_tokens is the sum", c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens, c.usage);
check("finish_reason length or stop", ["length", "stop"].includes(c.choices[0].finish_reason), c.choices[0]);
if (c.choices[0].finish_reason === "length") check("length means max_tokens tokens", c.usage.completion_tokens === N, c.usage);

// the same, streamed: identical text, usage in the last chunk
let st = "", sUsage = null, sFinish = null;
for await (const ch of await client.completions.create({ model, prompt: PROMPT, max_tokens: N, temperature: 0, stream: true, stream_options: { include_usage: true } })) {
  if (ch.usage) sUsage = ch.usage;
  for (const x of ch.choices) { st += x.text || ""; if (x.finish_reason) sFinish = x.finish_reason; }
}
check("streamed completion equals the plain one", st === text, { st, text });
check("streamed completion usage equals the plain one", sUsage && sUsage.completion_tokens === c.usage.completion_tokens && sUsage.prompt_tokens === c.usage.prompt_tokens, sUsage);
check("streamed completion finish_reason", sFinish === c.choices[0].finish_reason, sFinish);

// chat, greedy
const messages = [{ role: "user", content: PROMPT }];
const r = await client.chat.completions.create({ model, messages, max_tokens: N, temperature: 0 });
const reply = r.choices[0].message.content;
check("chat object", r.object === "chat.completion", r.object);
check("chat role assistant", r.choices[0].message.role === "assistant", r.choices[0].message);
check("chat reply non-empty", typeof reply === "string" && reply.length > 0, reply);
if (env.EXPECT_CHAT !== undefined) check("chat text equals shoal generate's", reply === env.EXPECT_CHAT, { got: reply, want: env.EXPECT_CHAT });
if (env.EXPECT_CHAT_PROMPT_TOKENS) check("chat usage.prompt_tokens equals the templated prompt's tokens", r.usage.prompt_tokens === Number(env.EXPECT_CHAT_PROMPT_TOKENS), r.usage);
check("chat usage sum", r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, r.usage);

// streaming chat with include_usage: role first, same text, usage chunk with empty choices last
let first = null, sc = "", usageChunk = null, chunks = 0, finish = null, afterUsage = 0;
const stream = await client.chat.completions.create({ model, messages, max_tokens: N, temperature: 0, stream: true, stream_options: { include_usage: true } });
for await (const ch of stream) {
  chunks++;
  if (usageChunk) afterUsage++;
  check("chunk object", ch.object === "chat.completion.chunk", ch.object);
  if (ch.choices.length === 0 && ch.usage) { usageChunk = ch; continue; }
  const d = ch.choices[0].delta;
  if (first === null) first = d;
  if (d.content) sc += d.content;
  if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
}
check("first delta carries role assistant", first && first.role === "assistant", first);
check("streamed chat equals the plain reply", sc === reply, { sc, reply });
check("finish_reason in the stream", finish === r.choices[0].finish_reason, finish);
check("usage chunk arrives last", usageChunk && afterUsage === 0, { afterUsage });
check("stream usage equals the plain usage", usageChunk && usageChunk.usage.completion_tokens === r.usage.completion_tokens && usageChunk.usage.prompt_tokens === r.usage.prompt_tokens, usageChunk && usageChunk.usage);

// stop strings end the text before them (finish_reason stop)
if (text.length > 20) {
  const stopAt = text.slice(10, 16);
  const s = await client.completions.create({ model, prompt: PROMPT, max_tokens: N, temperature: 0, stop: [stopAt] });
  check("stop string cuts the text", s.choices[0].text === text.slice(0, text.indexOf(stopAt)) && s.choices[0].finish_reason === "stop", { got: s.choices[0].text, stopAt });
}

// log-probabilities: one entry per generated token, with the requested alternatives
const lp = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 2 });
const entries = lp.choices[0].logprobs && lp.choices[0].logprobs.content;
check("chat logprobs: one entry per token", Array.isArray(entries) && entries.length === lp.usage.completion_tokens, lp.choices[0].logprobs);
check("chat logprobs: entries joined give the text", entries && entries.map((e) => e.token).join("") === lp.choices[0].message.content, entries);
check("chat logprobs: 2 alternatives, best first, chosen token first when greedy", entries && entries.every((e) =>
  e.top_logprobs.length === 2 && e.logprob <= 0 && e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob && e.top_logprobs[0].token === e.token), entries);

// seeded sampling repeats itself
const a = await client.completions.create({ model, prompt: PROMPT, max_tokens: 24, temperature: 0.9, seed: 42 });
const b = await client.completions.create({ model, prompt: PROMPT, max_tokens: 24, temperature: 0.9, seed: 42 });
check("same seed, same text", a.choices[0].text === b.choices[0].text, [a.choices[0].text, b.choices[0].text]);

// errors surface as the SDK's typed errors
try {
  await client.chat.completions.create({ model, messages, n: 2 });
  check("n=2 rejected", false);
} catch (e) {
  check("n=2 is a 400 BadRequestError", e instanceof OpenAI.BadRequestError && e.status === 400 && /must be 1/.test(e.message), e.message);
}
try {
  await client.chat.completions.create({ model, messages: [] });
  check("empty messages rejected", false);
} catch (e) {
  check("empty messages is a 400", e.status === 400 && e.error && e.error.type === "invalid_request_error", e.message);
}

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
