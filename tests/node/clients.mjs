// clients.mjs: the official clients people point at local models, against `shoal serve` on a
// generated random-weight model (tests/t_clients.sh): @anthropic-ai/sdk (Messages), openai 7.x
// (Responses and embeddings; imported as openai7), and ollama (Ollama's API). Random weights say
// nothing useful, so the checks are about form: what each SDK parses and accumulates (Anthropic:
// lib/MessageStream.ts #accumulateMessage; openai: internal/responses/response-accumulator.ts,
// lib/responses/ResponseStream.ts, lib/embeddings.ts's base64 decoding; ollama: src/utils.ts
// parseJSON and AbortableAsyncIterator, which wants a last "done" line), the exact event
// sequences, ids, usage and stop reasons, constrained output (ajv validates it), tool calls and
// their round trips, embeddings' shape, determinism and difference, error shapes and bad input.
// The server runs with --api-key KEY: Anthropic's client sends it as its header, Ollama's as a
// bearer header given to it.
// Usage: node clients.mjs URL KEY
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai7";
import { Ollama } from "ollama";
import Ajv from "ajv";

const [url, key] = process.argv.slice(2);
let passed = 0, failed = 0;
const check = (what, ok, detail) => {
  if (ok) passed++;
  else { failed++; console.error("FAIL: " + what + (detail !== undefined ? ": " + JSON.stringify(detail).slice(0, 600) : "")); }
};
const guard = async (what, fn) => {
  try { await fn(); } catch (e) { check(what + " (threw)", false, String(e && e.stack || e)); }
};
const anthropic = new Anthropic({ baseURL: url, apiKey: key, maxRetries: 0 });
const openai = new OpenAI({ baseURL: url + "/v1", apiKey: key, maxRetries: 0 });
const ollama = new Ollama({ host: url, headers: { Authorization: "Bearer " + key } });
const ajv = new Ajv({ strict: true });
const model = (await openai.models.list()).data[0].id;

const weather = {
  type: "object",
  properties: { city: { type: "string", maxLength: 20 }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
  required: ["city", "unit"],
  additionalProperties: false,
};
const validWeather = ajv.compile(weather);
const dot = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0);
const norm = (a) => Math.sqrt(dot(a, a));

// ---- Anthropic Messages ---------------------------------------------------------------------
const ask = [{ role: "user", content: "Tell me about the sea." }];

await guard("messages plain", async () => {
  const m = await anthropic.messages.create({ model, max_tokens: 16, messages: ask, temperature: 0 });
  check("messages plain: a message", m.type === "message" && m.role === "assistant" && /^msg_/.test(m.id), m);
  check("messages plain: one text block", m.content.length === 1 && m.content[0].type === "text" && typeof m.content[0].text === "string", m.content);
  check("messages plain: stop_reason", ["end_turn", "max_tokens"].includes(m.stop_reason) && m.stop_sequence === null, m);
  check("messages plain: usage", m.usage.input_tokens > 0 && m.usage.output_tokens > 0 && m.usage.output_tokens <= 16, m.usage);
  check("messages plain: model", m.model === model, m.model);
  const c = await anthropic.messages.countTokens({ model, messages: ask });
  check("count_tokens: the prompt's tokens", c.input_tokens === m.usage.input_tokens, [c, m.usage]);
});

let greedy = "";
await guard("messages streamed", async () => {
  const types = [], deltas = [];
  const stream = anthropic.messages.stream({ model, max_tokens: 16, messages: ask, temperature: 0 });
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "content_block_delta" && ev.delta.type === "text_delta") deltas.push(ev.delta.text);
  }
  const m = await stream.finalMessage();
  check("messages streamed: starts message_start, content_block_start", types[0] === "message_start" && types[1] === "content_block_start", types);
  check("messages streamed: ends content_block_stop, message_delta, message_stop", types.slice(-3).join() === "content_block_stop,message_delta,message_stop", types);
  check("messages streamed: deltas between", types.slice(2, -3).every((t) => t === "content_block_delta"), types);
  check("messages streamed: the text is the deltas", m.content[0].text === deltas.join(""), [m.content, deltas]);
  check("messages streamed: stop_reason and usage", m.stop_reason && m.usage.output_tokens > 0 && m.usage.input_tokens > 0, m);
  greedy = m.content[0].text;
  // the same greedy reply as the whole one
  const whole = await anthropic.messages.create({ model, max_tokens: 16, messages: ask, temperature: 0 });
  check("messages streamed: equals the whole reply at temperature 0", whole.content[0].text === greedy, [whole.content[0].text, greedy]);
  // raw events, ping included, through create({stream: true})
  const raw = await anthropic.messages.create({ model, max_tokens: 4, messages: ask, stream: true });
  const rawTypes = [];
  for await (const ev of raw) rawTypes.push(ev.type);
  check("messages streamed: raw events", rawTypes[0] === "message_start" && rawTypes.at(-1) === "message_stop", rawTypes);
});

await guard("messages stop_sequences", async () => {
  const at = greedy.indexOf(" ", 2);
  if (at < 1) return check("messages stop_sequences: a greedy reply with a space", false, greedy);
  const stop = greedy.slice(at, at + 3);
  const m = await anthropic.messages.create({ model, max_tokens: 16, messages: ask, temperature: 0, stop_sequences: [stop] });
  check("messages stop_sequences: stop_reason stop_sequence", m.stop_reason === "stop_sequence" && m.stop_sequence === stop, m);
  check("messages stop_sequences: the text before it", m.content[0].text === greedy.slice(0, greedy.indexOf(stop)), [m.content[0].text, greedy, stop]);
});

const aTools = [
  { name: "get_weather", description: "Current weather of a city", input_schema: weather },
  { name: "get_time", description: "Local time", input_schema: { type: "object", properties: { city: { type: "string", maxLength: 20 } }, required: ["city"] } },
];
let toolUse = null;
await guard("messages forced tool_use", async () => {
  const m = await anthropic.messages.create({ model, max_tokens: 80, messages: [{ role: "user", content: "Weather in Paris?" }], tools: aTools, tool_choice: { type: "tool", name: "get_weather" } });
  check("messages tool_use: stop_reason tool_use", m.stop_reason === "tool_use", m);
  toolUse = m.content.find((b) => b.type === "tool_use");
  check("messages tool_use: a tool_use block", toolUse && /^toolu_/.test(toolUse.id) && toolUse.name === "get_weather", m.content);
  check("messages tool_use: input validates", toolUse && validWeather(toolUse.input), toolUse);
  // streamed: input_json_delta accumulated by the SDK into input
  const stream = anthropic.messages.stream({ model, max_tokens: 80, messages: [{ role: "user", content: "Time?" }], tools: aTools, tool_choice: { type: "any" } });
  const f = await stream.finalMessage();
  const tu = f.content.find((b) => b.type === "tool_use");
  check("messages tool_use streamed: input parsed", f.stop_reason === "tool_use" && tu && typeof tu.input === "object" && tu.input !== null, f.content);
});

await guard("messages tool_result round trip", async () => {
  if (!toolUse) return check("messages tool_result: a call to answer", false);
  const messages = [
    { role: "user", content: "Weather in Paris?" },
    { role: "assistant", content: [{ type: "text", text: "Let me look." }, toolUse] },
    { role: "user", content: [{ type: "tool_result", tool_use_id: toolUse.id, content: "18 degrees, sunny" }, { type: "text", text: "Thanks" }] },
  ];
  const m = await anthropic.messages.create({ model, max_tokens: 12, messages, tools: aTools, tool_choice: { type: "none" } });
  check("messages tool_result: a text answer", m.content[0].type === "text" && m.stop_reason !== "tool_use", m);
  const c = await anthropic.messages.countTokens({ model, messages, tools: aTools });
  check("messages tool_result: the history counts", c.input_tokens > 20, c);
  // a thinking block in the history is dropped; a prefill is continued
  const p = await anthropic.messages.create({ model, max_tokens: 4, messages: [...ask, { role: "assistant", content: "Once" }] });
  check("messages prefill: a reply", p.content[0].type === "text", p);
});

await guard("messages error shape", async () => {
  let err = null;
  try { await anthropic.messages.create({ model, messages: ask }); } catch (e) { err = e; }
  check("messages error: 400 invalid_request_error without max_tokens", err && err.status === 400 && err.type === "invalid_request_error" && err.error && err.error.type === "error", err && err.error);
  err = null;
  try { await anthropic.messages.create({ model, max_tokens: 4, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "AA==" } }] }] }); } catch (e) { err = e; }
  check("messages error: an image is refused with 400", err && err.status === 400 && /image/.test(err.error.error.message), err && err.error);
  const bad = new Anthropic({ baseURL: url, apiKey: "wrong", maxRetries: 0 });
  err = null;
  try { await bad.messages.create({ model, max_tokens: 4, messages: ask }); } catch (e) { err = e; }
  check("messages error: 401 authentication_error with a wrong key", err && err.status === 401 && err.type === "authentication_error", err && err.error);
  // x-api-key alone (what Anthropic's own clients send) is enough
  const r = await fetch(url + "/v1/messages", { method: "POST", headers: { "x-api-key": key, "anthropic-version": "2023-06-01", "content-type": "application/json" }, body: JSON.stringify({ model, max_tokens: 2, messages: ask }) });
  check("messages: x-api-key and anthropic-version accepted", r.status === 200, r.status);
});

// ---- OpenAI Responses -------------------------------------------------------------------------
await guard("responses plain", async () => {
  const r = await openai.responses.create({ model, input: "Tell me a story.", instructions: "Be brief.", max_output_tokens: 12, temperature: 0 });
  check("responses plain: a response", r.object === "response" && /^resp_/.test(r.id) && r.status === "completed", r);
  check("responses plain: output_text", typeof r.output_text === "string" && r.output_text.length > 0, r.output_text);
  check("responses plain: a message item", r.output.length === 1 && r.output[0].type === "message" && r.output[0].content[0].type === "output_text", r.output);
  check("responses plain: usage", r.usage.input_tokens > 0 && r.usage.output_tokens > 0 && r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens, r.usage);
  check("responses plain: echoes instructions and the limit", r.instructions === "Be brief." && r.max_output_tokens === 12, r);
});

await guard("responses streamed", async () => {
  const events = [];
  const stream = openai.responses.stream({ model, input: "Tell me a story.", max_output_tokens: 12, temperature: 0 });
  for await (const ev of stream) events.push(ev);
  const r = await stream.finalResponse();
  const types = events.map((e) => e.type);
  const head = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added", "response.output_text.delta"];
  check("responses streamed: the opening events", head.every((t, i) => types[i] === t), types);
  const tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"];
  check("responses streamed: the closing events", tail.every((t, i) => types[types.length - 4 + i] === t), types);
  check("responses streamed: sequence numbers 0, 1, ...", events.every((e, i) => e.sequence_number === i), events.map((e) => e.sequence_number));
  const text = events.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta).join("");
  check("responses streamed: output_text is the deltas", r.output_text === text && text.length > 0, [r.output_text, text]);
  const whole = await openai.responses.create({ model, input: "Tell me a story.", max_output_tokens: 12, temperature: 0 });
  check("responses streamed: equals the whole reply at temperature 0", whole.output_text === text, [whole.output_text, text]);
  check("responses streamed: usage in response.completed", r.usage && r.usage.output_tokens > 0, r.usage);
});

await guard("responses json_schema", async () => {
  for (let seed = 1; seed <= 3; seed++) {
    const r = await openai.responses.create({ model, input: "The weather?", max_output_tokens: 60, temperature: 1, text: { format: { type: "json_schema", name: "weather", schema: weather, strict: true } } });
    let v = null;
    try { v = JSON.parse(r.output_text); } catch { }
    check("responses json_schema: parses and validates (" + seed + ")", v !== null && validWeather(v), r.output_text);
  }
  const s = openai.responses.stream({ model, input: "The weather?", max_output_tokens: 60, text: { format: { type: "json_object" } } });
  const f = await s.finalResponse();
  let v = null;
  try { v = JSON.parse(f.output_text); } catch { }
  check("responses json_object streamed: an object", v !== null && typeof v === "object" && !Array.isArray(v), f.output_text);
});

const rTools = [{ type: "function", name: "get_weather", description: "Current weather", parameters: weather, strict: true }];
await guard("responses function call", async () => {
  const input = [{ role: "user", content: "Weather in Paris?" }];
  const r = await openai.responses.create({ model, input, tools: rTools, tool_choice: { type: "function", name: "get_weather" }, max_output_tokens: 80 });
  const fc = r.output.find((o) => o.type === "function_call");
  check("responses function call: an item", fc && fc.name === "get_weather" && /^call_/.test(fc.call_id) && fc.status === "completed", r.output);
  let args = null;
  try { args = JSON.parse(fc.arguments); } catch { }
  check("responses function call: arguments validate", args && validWeather(args), fc);
  // round trip with the items, then with previous_response_id
  const back = await openai.responses.create({ model, input: [...input, fc, { type: "function_call_output", call_id: fc.call_id, output: "18 degrees" }], tools: rTools, tool_choice: "none", max_output_tokens: 8 });
  check("responses function_call_output: a message", back.output.some((o) => o.type === "message"), back.output);
  const next = await openai.responses.create({ model, previous_response_id: r.id, input: [{ type: "function_call_output", call_id: fc.call_id, output: "18 degrees" }], tools: rTools, max_output_tokens: 8 });
  check("responses previous_response_id: continues", next.previous_response_id === r.id && next.output.length > 0, next);
  check("responses previous_response_id: the history counts", next.usage.input_tokens > back.usage.input_tokens - 30 && next.usage.input_tokens > r.usage.input_tokens, [next.usage, back.usage, r.usage]);
  // streamed call: the SDK accumulates the arguments
  const st = openai.responses.stream({ model, input, tools: rTools, tool_choice: "required", max_output_tokens: 80 });
  const types = [];
  for await (const ev of st) types.push(ev.type);
  const f = await st.finalResponse();
  const sfc = f.output.find((o) => o.type === "function_call");
  check("responses function call streamed", sfc && JSON.parse(sfc.arguments) && types.includes("response.function_call_arguments.done") && types.at(-1) === "response.completed", [types, f.output]);
  let err = null;
  try { await openai.responses.create({ model, previous_response_id: "resp_nope", input: "x" }); } catch (e) { err = e; }
  check("responses: an unknown previous_response_id is a 400", err && err.status === 400 && err.param === "previous_response_id", err && err.error);
  err = null;
  try { await openai.responses.create({ model, input: [{ type: "input_image", image_url: "x" }] }); } catch (e) { err = e; }
  check("responses: an unsupported item is a 400", err && err.status === 400, err && err.error);
});

// ---- Ollama -----------------------------------------------------------------------------------
let dim = 0;
await guard("ollama list", async () => {
  const l = await ollama.list();
  check("ollama list: one model", l.models.length === 1 && l.models[0].name === model + ":latest" && /^[0-9a-f]{64}$/.test(l.models[0].digest), l);
  check("ollama list: details", l.models[0].details.format === "gguf" && typeof l.models[0].details.family === "string" && l.models[0].size > 0, l.models[0]);
  const ps = await ollama.ps();
  check("ollama ps: the loaded model", ps.models.length === 1 && ps.models[0].context_length > 0, ps);
  const v = await ollama.version();
  check("ollama version", /^\d+\.\d+\.\d+$/.test(v.version), v);
});

await guard("ollama show", async () => {
  const s = await ollama.show({ model });
  const arch = s.model_info["general.architecture"];
  dim = s.model_info[arch + ".embedding_length"];
  check("ollama show: model_info", typeof arch === "string" && dim > 0 && s.model_info[arch + ".context_length"] > 0, s.model_info);
  check("ollama show: details and capabilities", s.details.family === arch && s.capabilities.includes("completion"), s);
  let err = null;
  try { await ollama.show({}); } catch (e) { err = e; }
  check("ollama show: no model is a 400 {error}", err && err.status_code === 400 && /model/.test(err.error), err && String(err));
});

await guard("ollama chat", async () => {
  const r = await ollama.chat({ model, messages: [{ role: "user", content: "hi" }], options: { num_predict: 8, temperature: 0 } });
  check("ollama chat: a message", r.message.role === "assistant" && typeof r.message.content === "string" && r.message.content.length > 0, r);
  check("ollama chat: done and counts", r.done === true && ["stop", "length"].includes(r.done_reason) && r.eval_count > 0 && r.eval_count <= 8 && r.prompt_eval_count > 0, r);
  const parts = [];
  for await (const p of await ollama.chat({ model, messages: [{ role: "user", content: "hi" }], stream: true, options: { num_predict: 8, temperature: 0 } })) parts.push(p);
  check("ollama chat streamed: chunks then done", parts.length >= 2 && parts.at(-1).done === true && parts.slice(0, -1).every((p) => !p.done), parts);
  check("ollama chat streamed: the same text", parts.map((p) => p.message.content).join("") === r.message.content, [parts.map((p) => p.message.content).join(""), r.message.content]);
  const j = await ollama.chat({ model, messages: [{ role: "user", content: "json" }], format: weather, options: { num_predict: 60 } });
  let v = null;
  try { v = JSON.parse(j.message.content); } catch { }
  check("ollama chat format schema: validates", v && validWeather(v), j.message.content);
  const t = await ollama.chat({ model, messages: [{ role: "user", content: "Weather in Paris?" }], tools: [{ type: "function", function: { name: "get_weather", description: "weather", parameters: weather } }], options: { num_predict: 60 } });
  check("ollama chat tools: a message", t.done === true, t);
  let err = null;
  try { await ollama.chat({ model, messages: [{ role: "user", content: "x" }], format: "yaml" }); } catch (e) { err = e; }
  check("ollama chat: a bad format is a 400 {error}", err && err.status_code === 400 && /format/.test(err.error), err && String(err));
});

await guard("ollama streamed generate", async () => {
  const parts = [];
  for await (const p of await ollama.generate({ model, prompt: "Once upon a time", stream: true, options: { num_predict: 8, temperature: 0, seed: 3 } })) parts.push(p);
  const last = parts.at(-1);
  check("ollama generate streamed: chunks then done", parts.length >= 2 && last.done === true && parts.slice(0, -1).every((p) => p.done === false && typeof p.response === "string"), parts);
  check("ollama generate streamed: done_reason, counts, context", ["stop", "length"].includes(last.done_reason) && last.eval_count > 0 && Array.isArray(last.context) && last.context.length > last.prompt_eval_count - 1, last);
  const whole = await ollama.generate({ model, prompt: "Once upon a time", options: { num_predict: 8, temperature: 0 } });
  check("ollama generate: the same text", whole.response === parts.map((p) => p.response).join(""), [whole.response, parts.map((p) => p.response).join("")]);
  // the context carries the conversation on
  const more = await ollama.generate({ model, prompt: " and then", context: whole.context, options: { num_predict: 4 } });
  check("ollama generate: context continues", more.prompt_eval_count > whole.context.length - 1, [more.prompt_eval_count, whole.context.length]);
  const raw = await ollama.generate({ model, prompt: "abc", raw: true, options: { num_predict: 4 } });
  check("ollama generate raw", raw.done === true && typeof raw.response === "string", raw);
  const load = await ollama.generate({ model, prompt: "" });
  check("ollama generate: an empty prompt loads", load.done === true && load.done_reason === "load", load);
});

// ---- embeddings ------------------------------------------------------------------------------
await guard("embeddings", async () => {
  const inputs = ["The sea is wide.", "A fish swims.", "hello world"];
  const r = await openai.embeddings.create({ model, input: inputs }); // base64 on the wire, decoded by the SDK
  check("embeddings shape: one per input, in order", r.object === "list" && r.data.length === 3 && r.data.every((d, i) => d.object === "embedding" && d.index === i), r.data.map((d) => d.index));
  check("embeddings shape: the model's width", r.data.every((d) => Array.isArray(d.embedding) && d.embedding.length === dim), [dim, r.data.map((d) => d.embedding.length)]);
  check("embeddings shape: unit length", r.data.every((d) => Math.abs(norm(d.embedding) - 1) < 1e-4), r.data.map((d) => norm(d.embedding)));
  check("embeddings shape: usage", r.usage.prompt_tokens > 0 && r.usage.total_tokens === r.usage.prompt_tokens, r.usage);
  const f = await openai.embeddings.create({ model, input: inputs, encoding_format: "float" });
  check("embeddings: float equals base64", f.data.every((d, i) => d.embedding.every((x, k) => Math.abs(x - r.data[i].embedding[k]) < 1e-6)), null);
  const again = await openai.embeddings.create({ model, input: inputs, encoding_format: "float" });
  check("embeddings determinism: the same vectors", again.data.every((d, i) => d.embedding.every((x, k) => x === f.data[i].embedding[k])), null);
  const one = await openai.embeddings.create({ model, input: inputs[1], encoding_format: "float" });
  check("embeddings determinism: one input alone as in a batch", one.data[0].embedding.every((x, k) => Math.abs(x - f.data[1].embedding[k]) < 1e-4), null);
  check("embeddings inputs differ", dot(f.data[0].embedding, f.data[1].embedding) < 0.9999 && dot(f.data[1].embedding, f.data[2].embedding) < 0.9999, [dot(f.data[0].embedding, f.data[1].embedding), dot(f.data[1].embedding, f.data[2].embedding)]);
  const d = await openai.embeddings.create({ model, input: inputs[0], dimensions: 16, encoding_format: "float" });
  check("embeddings dimensions: cut and unit", d.data[0].embedding.length === 16 && Math.abs(norm(d.data[0].embedding) - 1) < 1e-4, d.data[0].embedding.length);
  const o = await ollama.embed({ model, input: inputs });
  check("ollama embed: the same vectors", o.embeddings.length === 3 && o.embeddings.every((e, i) => e.every((x, k) => Math.abs(x - f.data[i].embedding[k]) < 1e-6)) && o.prompt_eval_count === r.usage.prompt_tokens, o.prompt_eval_count);
  const legacy = await ollama.embeddings({ model, prompt: inputs[2] });
  check("ollama embeddings (older): one vector", legacy.embedding.length === dim, legacy.embedding.length);
  let err = null;
  try { await openai.embeddings.create({ model, input: [] }); } catch (e) { err = e; }
  check("embeddings: an empty input list is a 400", err && err.status === 400, err && err.error);
  err = null;
  try { await openai.embeddings.create({ model, input: "x", dimensions: 1 << 20 }); } catch (e) { err = e; }
  check("embeddings: dimensions wider than the model is a 400", err && err.status === 400 && err.param === "dimensions", err && err.error);
});

// ---- which API each request used (metrics.c: shoal_api_requests_total; the dashboard's request
// table: /v1/history's requests[].api, history.c) ------------------------------------------------
await guard("metrics by API", async () => {
  const text = await (await fetch(url + "/metrics")).text();
  const hist = await (await fetch(url + "/v1/history")).json();
  const apis = new Set(hist.requests.map((r) => r.api));
  for (const api of ["messages", "responses", "ollama.chat", "ollama.generate", "embeddings", "ollama.embed"]) {
    const m = text.match(new RegExp('shoal_api_requests_total\\{api="' + api.replace(".", "\\.") + '"\\} (\\d+)'));
    check("metrics: requests of " + api + " counted", m && Number(m[1]) > 0, m && m[0]);
    check("request table: rows of " + api, apis.has(api), [...apis]);
  }
  const refused = hist.requests.find((r) => r.api === "messages" && r.status === 400);
  check("request table: a refused Messages request has its row", refused && refused.error.length > 0, refused);
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
