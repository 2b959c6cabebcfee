// tools.mjs: tool calling and structured output with the official `openai` npm package against
// `shoal serve` on a generated random-weight model (tests/t_tools.sh). Random weights say nothing
// useful, so every check is about form: the constrained outputs must parse and validate (ajv, a
// real JSON Schema validator), tool calls must come back as the SDK expects them, streamed and
// not (the SDK's ChatCompletionStream accumulates the deltas: lib/ChatCompletionStream.js,
// #accumulateChatCompletion), and unsupported schema keywords must be refused with a 400 that
// names them.
// Usage: node tools.mjs URL
import OpenAI from "openai";
import Ajv from "ajv";

const url = process.argv[2];
let passed = 0, failed = 0;
const check = (what, ok, detail) => {
  if (ok) passed++;
  else { failed++; console.error("FAIL: " + what + (detail !== undefined ? ": " + JSON.stringify(detail) : "")); }
};
const client = new OpenAI({ baseURL: url + "/v1", apiKey: "none", maxRetries: 0 });
const ajv = new Ajv({ strict: true });
const model = (await client.models.list()).data[0].id;

const weatherParams = {
  type: "object",
  properties: {
    city: { type: "string", maxLength: 24 },
    unit: { type: "string", enum: ["celsius", "fahrenheit"] },
    days: { type: "integer" },
  },
  required: ["city", "unit"],
  additionalProperties: false,
};
const tools = [
  { type: "function", function: { name: "get_weather", description: "Current weather of a city", parameters: weatherParams } },
  { type: "function", function: { name: "get_time", description: "Local time of a city", parameters: { type: "object", properties: { city: { type: "string", maxLength: 24 } }, required: ["city"] } } },
];
const validWeather = ajv.compile(weatherParams);
const validTime = ajv.compile(tools[1].function.parameters);
const question = [{ role: "user", content: "What is the weather in Paris?" }];

function checkCall(what, msg, finish, names) {
  check(what + ": finish_reason tool_calls", finish === "tool_calls", finish);
  const calls = msg.tool_calls || [];
  check(what + ": one tool call", calls.length === 1, msg);
  const c = calls[0];
  if (!c) return null;
  check(what + ": id and type", typeof c.id === "string" && c.id.length > 0 && c.type === "function", c);
  check(what + ": a known function", names.includes(c.function.name), c.function);
  let args = null;
  try { args = JSON.parse(c.function.arguments); } catch (e) { check(what + ": arguments parse", false, c.function.arguments); }
  if (args) {
    const v = c.function.name === "get_weather" ? validWeather : validTime;
    check(what + ": arguments validate against the function's parameters", v(args), { args, errors: v.errors });
  }
  return c;
}

// 1. A full round trip, not streamed: the call, then the tool's result, then an answer.
{
  const r = await client.chat.completions.create({ model, messages: question, tools, tool_choice: { type: "function", function: { name: "get_weather" } }, max_tokens: 120, seed: 1 });
  const msg = r.choices[0].message;
  const c = checkCall("named call", msg, r.choices[0].finish_reason, ["get_weather"]);
  check("named call: the named function", c && c.function.name === "get_weather", c);
  if (c) {
    const history = [...question, msg, { role: "tool", tool_call_id: c.id, content: JSON.stringify({ temperature: 21, unit: "celsius" }) }];
    const a = await client.chat.completions.create({ model, messages: history, tools, max_tokens: 16, seed: 2, tool_choice: "none" });
    check("answer after the tool result: content", typeof a.choices[0].message.content === "string" && !a.choices[0].message.tool_calls, a.choices[0].message);
    check("answer: finish_reason stop or length", ["stop", "length"].includes(a.choices[0].finish_reason), a.choices[0].finish_reason);
    const q = await client.chat.completions.create({ model, messages: question, max_tokens: 1 });
    check("answer: the call and its result are in the prompt", a.usage.prompt_tokens > q.usage.prompt_tokens + 10, { a: a.usage, q: q.usage });
  }
}

// 2. The same round trip streamed, accumulated by the SDK's own stream helper.
{
  const stream = client.beta.chat.completions.stream({ model, messages: question, tools, tool_choice: "required", max_tokens: 120, seed: 3 });
  let argDeltas = 0;
  stream.on("tool_calls.function.arguments.delta", () => argDeltas++);
  const done = await stream.finalChatCompletion();
  const msg = done.choices[0].message;
  const c = checkCall("streamed required call", msg, done.choices[0].finish_reason, ["get_weather", "get_time"]);
  check("streamed call: argument deltas arrived", argDeltas >= 1, argDeltas);
  if (c) {
    const history = [...question, { role: "assistant", content: null, tool_calls: msg.tool_calls }, { role: "tool", tool_call_id: c.id, content: "21 degrees" }];
    let text = "", finish = null, chunks = 0;
    for await (const ch of await client.chat.completions.create({ model, messages: history, tools, max_tokens: 16, seed: 4, stream: true, tool_choice: "none" })) {
      chunks++;
      for (const x of ch.choices) { text += x.delta.content || ""; if (x.finish_reason) finish = x.finish_reason; }
    }
    check("streamed answer: chunks with content and a finish", chunks > 2 && typeof text === "string" && ["stop", "length"].includes(finish), { chunks, finish });
  }
}

// 3. Raw streamed deltas have OpenAI's shape: first the id, type and name, then the arguments.
{
  const deltas = [];
  let finish = null;
  for await (const ch of await client.chat.completions.create({ model, messages: question, tools, tool_choice: "required", max_tokens: 120, seed: 5, stream: true })) {
    for (const x of ch.choices) { for (const d of x.delta.tool_calls || []) deltas.push(d); if (x.finish_reason) finish = x.finish_reason; }
  }
  check("raw stream: finish_reason tool_calls", finish === "tool_calls", finish);
  check("raw stream: first delta names the call", deltas.length >= 2 && deltas[0].index === 0 && deltas[0].id && deltas[0].type === "function" && deltas[0].function.name && deltas[0].function.arguments === "", deltas[0]);
  check("raw stream: later deltas carry only arguments", deltas.slice(1).every((d) => d.index === 0 && !d.id && typeof d.function.arguments === "string"), deltas.slice(1));
}

// 4. response_format json_schema: 20 seeded requests, each must parse and validate.
const schema = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 30 },
    age: { type: "integer" },
    score: { type: "number" },
    member: { type: "boolean" },
    nickname: { anyOf: [{ type: "string", maxLength: 12 }, { type: "null" }] },
    kind: { enum: ["cat", "dog", 7, null] },
    version: { const: "v1" },
    tags: { type: "array", items: { type: "string", maxLength: 10 }, maxItems: 3 },
    address: { type: "object", properties: { city: { type: "string", maxLength: 20 }, zip: { type: "integer" } }, required: ["city"], additionalProperties: false },
    note: { type: "null" },
  },
  required: ["name", "age", "member", "kind", "version", "address"],
  additionalProperties: false,
};
const validate = ajv.compile(schema);
let good = 0;
for (let seed = 1; seed <= 20; seed++) {
  const r = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Describe a person." }], max_tokens: 120, seed, temperature: 1,
    response_format: { type: "json_schema", json_schema: { name: "person", schema, strict: true } },
  });
  const text = r.choices[0].message.content;
  let v = null;
  try { v = JSON.parse(text); } catch (e) { check(`json_schema seed ${seed}: parses`, false, text); continue; }
  if (validate(v)) good++;
  else check(`json_schema seed ${seed}: validates`, false, { text, errors: validate.errors });
}
check("json_schema: 20 of 20 seeded replies validate", good === 20, good);

// json_object: any JSON object, streamed too.
{
  const r = await client.chat.completions.create({ model, messages: [{ role: "user", content: "JSON please" }], max_tokens: 60, seed: 9, response_format: { type: "json_object" } });
  let v = null;
  try { v = JSON.parse(r.choices[0].message.content); } catch (e) { /* checked below */ }
  check("json_object: an object", v !== null && typeof v === "object" && !Array.isArray(v), r.choices[0].message.content);
  let text = "";
  for await (const ch of await client.chat.completions.create({ model, messages: [{ role: "user", content: "JSON please" }], max_tokens: 60, seed: 9, stream: true, response_format: { type: "json_object" } }))
    for (const x of ch.choices) text += x.delta.content || "";
  check("json_object streamed: the same text", text === r.choices[0].message.content, { text, plain: r.choices[0].message.content });
}

// A tight max_tokens: the value still closes (the budget rule), and ends as "stop", streamed too.
{
  const tight = { type: "object", properties: { a: { type: "string" } }, required: ["a"], additionalProperties: false };
  const rf = { type: "json_schema", json_schema: { name: "t", schema: tight } };
  const r = await client.chat.completions.create({ model, messages: question, max_tokens: 12, seed: 11, response_format: rf });
  let v = null;
  try { v = JSON.parse(r.choices[0].message.content); } catch (e) { /* checked below */ }
  check("tight budget: the value closes and validates", v !== null && ajv.validate(tight, v), r.choices[0].message.content);
  check("tight budget: finish_reason stop", r.choices[0].finish_reason === "stop" && r.usage.completion_tokens <= 12, { f: r.choices[0].finish_reason, u: r.usage });
  let text = "", finish = null;
  for await (const ch of await client.chat.completions.create({ model, messages: question, max_tokens: 12, seed: 11, response_format: rf, stream: true }))
    for (const x of ch.choices) { text += x.delta.content || ""; if (x.finish_reason) finish = x.finish_reason; }
  check("tight budget streamed: same text, finish stop", text === r.choices[0].message.content && finish === "stop", { text, finish });
}

// 5. Unsupported keywords: a 400 that names the keyword.
for (const [kw, sch] of [["pattern", { type: "string", pattern: "^a" }], ["minimum", { type: "object", properties: { n: { type: "integer", minimum: 3 } } }], ["$ref", { $ref: "#/$defs/x" }], ["oneOf", { oneOf: [{ type: "string" }] }]]) {
  try {
    await client.chat.completions.create({ model, messages: question, max_tokens: 5, response_format: { type: "json_schema", json_schema: { name: "x", schema: sch } } });
    check(`unsupported '${kw}': refused`, false, "accepted");
  } catch (e) {
    check(`unsupported '${kw}': 400 naming the keyword`, e.status === 400 && String(e.message).includes(`'${kw}'`), { status: e.status, message: e.message });
  }
}
// a required call whose parameters cannot be enforced is refused the same way
try {
  await client.chat.completions.create({ model, messages: question, max_tokens: 5, tool_choice: "required", tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { s: { type: "string", format: "email" } } } } }] });
  check("unsupported 'format' in a required tool: refused", false, "accepted");
} catch (e) {
  check("unsupported 'format' in a required tool: 400 naming it", e.status === 400 && String(e.message).includes("'format'"), { status: e.status, message: e.message });
}

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
