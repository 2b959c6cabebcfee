#!/bin/sh
# t_clients.sh: the clients people point at local models, each through its official npm package
# (tests/node/clients.mjs: @anthropic-ai/sdk 1.14.0, openai 7.57.0's Responses API and
# embeddings, ollama 0.6.4) against `shoal serve --api-key` on a generated random-weight qwen3
# model; then stories260K through curl: Ollama's raw generate and Anthropic's Messages give the
# same greedy text as /v1/completions and /v1/chat/completions, its embeddings work, and the
# error shapes of each API (Ollama's {"error"}, Anthropic's {"type": "error", ...}).
. tests/lib.sh
. tests/web_serve.sh

command -v curl >/dev/null || { skip "t_clients: curl not installed"; done_tests; exit; }
TMP=$(mktemp -d)
trap 'serve_stop; rm -rf "$TMP"' EXIT

# ---- the official clients on a random qwen3 model (tools, thinking-free, embeddings) ----
if node_setup; then
	"$SHOAL" mkmodel --arch qwen3 --seed 5 --layers 2 --dim 128 --heads 4 --kv-heads 2 \
		--head-dim 32 --ffn 256 -o "$TMP/q3.gguf" >/dev/null 2>&1 || fail "shoal mkmodel qwen3"
	if serve_or_skip t_clients --model "$TMP/q3.gguf" --api-key KEY; then
		out=$(node tests/node/clients.mjs "$URL" KEY 2>"$TMP/err")
		rc=$?
		sed 's/^/  /' "$TMP/err" >&2
		p=$(echo "$out" | sed -n 's/^\([0-9]*\) passed.*/\1/p')
		f=$(echo "$out" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
		T_PASS=$((T_PASS + ${p:-0})) T_FAIL=$((T_FAIL + ${f:-0}))
		[ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ] && fail "clients.mjs exited $rc"
		serve_stop
		check "serve exits 0" [ "$SERVE_RC" = 0 ]
	fi
else
	skip "t_clients: $NODE_WHY"
fi

# ---- stories260K with curl ----
MODEL=$SHARED/models/stories260K.gguf
[ -f "$MODEL" ] || { skip "t_clients: $MODEL missing"; done_tests; exit; }
serve_or_skip t_clients --model "$MODEL" || { done_tests; exit; }

# post PATH BODY: the reply in $TMP/body, the status in STATUS.
post() {
	printf '%s' "$2" >"$TMP/req"
	STATUS=$(curl -s -o "$TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' \
		--data-binary @"$TMP/req" "$URL$1")
}
# field EXPR: a value of the JSON reply (node, or python3).
field() {
	if command -v node >/dev/null; then
		node -e "const r=JSON.parse(require('fs').readFileSync('$TMP/body','utf8'));console.log($1)"
	else
		python3 -c "import json;r=json.load(open('$TMP/body'));print($1)"
	fi
}

post /v1/completions '{"prompt":"Once upon a time","max_tokens":24,"temperature":0}'
want=$(field 'r.choices[0].text')
check "completion has a story" [ -n "$want" ]
post /api/generate '{"model":"stories","prompt":"Once upon a time","raw":true,"stream":false,"options":{"num_predict":24,"temperature":0}}'
check "ollama raw generate 200" [ "$STATUS" = 200 ]
check "ollama raw generate = completion" [ "$(field 'r.response')" = "$want" ]
check "ollama generate: done, length" [ "$(field 'r.done + " " + r.done_reason + " " + r.eval_count')" = "true length 24" ]
# streamed: NDJSON lines, the last one done; together the same text
printf '%s' '{"model":"stories","prompt":"Once upon a time","raw":true,"options":{"num_predict":24,"temperature":0}}' >"$TMP/req"
curl -s -H 'Content-Type: application/json' --data-binary @"$TMP/req" "$URL/api/generate" >"$TMP/nd"
if command -v node >/dev/null; then
	got=$(node -e "const l=require('fs').readFileSync('$TMP/nd','utf8').trim().split('\n').map(JSON.parse);if(!l.at(-1).done||l.slice(0,-1).some(x=>x.done))process.exit(1);process.stdout.write(l.map(x=>x.response).join(''))")
	check "ollama streamed generate = completion" [ "$got" = "$want" ]
fi

post /v1/chat/completions '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":16,"temperature":0}'
chat=$(field 'r.choices[0].message.content')
post /v1/messages '{"model":"stories","max_tokens":16,"temperature":0,"messages":[{"role":"user","content":"Once upon a time"}]}'
check "messages 200" [ "$STATUS" = 200 ]
check "messages = chat completion" [ "$(field 'r.content[0].text')" = "$chat" ]
check "messages stop_reason" [ "$(field 'r.stop_reason')" = max_tokens ]
post /v1/responses '{"model":"stories","max_output_tokens":16,"temperature":0,"input":"Once upon a time"}'
check "responses = chat completion" [ "$(field 'r.output[0].content[0].text')" = "$chat" ]

post /v1/embeddings '{"input":["Once upon a time","Lily"],"encoding_format":"float"}'
check "stories embeddings 200" [ "$STATUS" = 200 ]
check "stories embeddings: two of 64" [ "$(field 'r.data.map(d=>d.embedding.length).join()')" = "64,64" ]

# error shapes
post /api/chat '{"model":"x","messages":"nope"}'
check "ollama bad body: 400 {error}" [ "$STATUS" = 400 ]
check "ollama error shape" grep -q '^{"error":"' "$TMP/body"
STATUS=$(curl -s -o "$TMP/body" -w '%{http_code}' "$URL/api/nope")
check "ollama unknown path: 404 {error}" [ "$STATUS" = 404 ]
check "ollama 404 shape" grep -q '^{"error":"' "$TMP/body"
post /v1/messages '{"model":"x","max_tokens":4,"messages":[{"role":"system","content":"x"}]}'
check "messages bad role: 400" [ "$STATUS" = 400 ]
check "anthropic error shape" grep -q '^{"type":"error","error":{"type":"invalid_request_error","message":"' "$TMP/body"
post /v1/messages 'not json'
check "messages bad json: anthropic shape" grep -q '"type":"error"' "$TMP/body"
post /v1/responses '{"input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}'
check "responses image: 400 openai shape" grep -q '"error":{"message":' "$TMP/body"
post /v1/embeddings '{"input":[[1,2,999999]]}'
check "embeddings bad id: 400" [ "$STATUS" = 400 ]
post /api/embed '{"model":"x","input":""}'
check "ollama embed empty: no embeddings" [ "$(field 'r.embeddings.length')" = 0 ]
serve_stop
check "serve exits 0" [ "$SERVE_RC" = 0 ]
done_tests
