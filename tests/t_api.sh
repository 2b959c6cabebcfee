#!/bin/sh
# t_api.sh: `shoal serve` on stories260K, driven with curl: the happy paths once, then every error
# case of the API (status, error type, Retry-After), auth, the queue limit, the deadline, and a
# client that hangs up mid-stream. Generation equality with `shoal generate` is in t_openai.sh.
. tests/lib.sh
. tests/web_serve.sh

MODEL=$SHARED/models/stories260K.gguf
command -v curl >/dev/null || { skip "t_api: curl not installed"; done_tests; exit; }
[ -f "$MODEL" ] || { skip "t_api: $MODEL missing"; done_tests; exit; }

TMP=$(mktemp -d)
trap 'serve_stop; rm -rf "$TMP"' EXIT

# req METHOD PATH [BODY [curl args...]]: sets STATUS, the body in $TMP/body, headers in $TMP/hdr.
req() {
	m=$1 p=$2; shift 2
	if [ $# -gt 0 ]; then
		printf '%s' "$1" >"$TMP/req"; shift
		STATUS=$(curl -s -o "$TMP/body" -D "$TMP/hdr" -w '%{http_code}' -X "$m" \
			-H 'Content-Type: application/json' --data-binary @"$TMP/req" "$@" "$URL$p")
	else
		STATUS=$(curl -s -o "$TMP/body" -D "$TMP/hdr" -w '%{http_code}' -X "$m" "$URL$p")
	fi
}
body_has() { grep -q -- "$1" "$TMP/body"; }
hdr_has() { grep -qi -- "$1" "$TMP/hdr"; }
# expect_error DESC STATUS TYPE: the last reply is an OpenAI error with that status and type.
expect_error() {
	if [ "$STATUS" = "$2" ] && body_has "\"error\":{" && body_has "\"type\":\"$3\"" &&
		body_has '"message":"'; then pass; else
		fail "$1: want $2 $3, got $STATUS $(head -c 300 "$TMP/body")"; fi
}

if ! serve_start --model "$MODEL"; then
	if grep -q "no inference engine" "$SERVE_LOG"; then
		skip "t_api: this build has no inference engine yet"
		done_tests; exit
	fi
	fail "shoal serve did not start: $(cat "$SERVE_LOG")"
	done_tests; exit
fi

# ---- happy paths ----
req GET /health
check "health 200" [ "$STATUS" = 200 ]
check "health ok" body_has '"status":"ok"'
req GET /v1/models
check "models 200" [ "$STATUS" = 200 ]
check "models list with context length" body_has '"context_length":'
check "models object list" body_has '"object":"list"'
CHAT='{"model":"stories","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":8,"temperature":0}'
req POST /v1/chat/completions "$CHAT"
check "chat 200" [ "$STATUS" = 200 ]
check "chat object" body_has '"object":"chat.completion"'
check "chat role" body_has '"role":"assistant"'
check "chat finish_reason" body_has '"finish_reason":"\(length\|stop\)"'
check "chat usage" body_has '"completion_tokens":'
req POST /v1/completions '{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"logprobs":2}'
check "completion 200" [ "$STATUS" = 200 ]
check "completion object" body_has '"object":"text_completion"'
check "completion logprobs" body_has '"token_logprobs":\['
req POST /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}'
check "stream 200" [ "$STATUS" = 200 ]
check "stream content type" hdr_has 'content-type: text/event-stream'
check "stream ends with DONE" [ "$(tail -c 14 "$TMP/body")" = "$(printf 'data: [DONE]\n\n')" ]
check "stream usage chunk" body_has '"choices":\[\],"usage":{'
req GET /v1/cluster
check "cluster 200" [ "$STATUS" = 200 ]
check "cluster members" body_has '"members":\[{'
req GET /
check "dashboard 200" [ "$STATUS" = 200 ]
check "dashboard html" body_has '<title>shoal</title>'
req GET /metrics
check "metrics 200" [ "$STATUS" = 200 ]
check "metrics requests by status" body_has 'shoal_requests_total{status="200"}'
check "metrics generated tokens" body_has '^shoal_generated_tokens_total [1-9]'

# ---- bad input: each an OpenAI error with the right status ----
req POST /v1/chat/completions '{"messages": [}'
expect_error "invalid JSON" 400 invalid_request_error
req POST /v1/chat/completions ''
expect_error "empty body" 400 invalid_request_error
req POST /v1/chat/completions '[1,2,3]'
expect_error "not an object" 400 invalid_request_error
req POST /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"max_tokens":"ten"}'
expect_error "wrong type max_tokens" 400 invalid_request_error
check "wrong type names the param" body_has '"param":"max_tokens"'
req POST /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}'
expect_error "wrong type temperature" 400 invalid_request_error
req POST /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"stop":7}'
expect_error "wrong type stop" 400 invalid_request_error
req POST /v1/chat/completions '{"model":"m"}'
expect_error "missing messages" 400 invalid_request_error
check "missing messages named" body_has '"param":"messages"'
req POST /v1/chat/completions '{"messages":[]}'
expect_error "empty messages" 400 invalid_request_error
req POST /v1/chat/completions '{"messages":[{"role":"wizard","content":"x"}]}'
expect_error "unknown role" 400 invalid_request_error
check "unknown role named" body_has '"param":"messages\[0\].role"'
req POST /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"n":2}'
expect_error "n=2" 400 invalid_request_error
check "n=2 says only 1" body_has "'n' must be 1"
req POST /v1/completions '{"max_tokens":3}'
expect_error "missing prompt" 400 invalid_request_error
long=$(awk 'BEGIN { for (i = 0; i < 1500; i++) printf "Once upon a time there was "; }')
req POST /v1/completions "{\"prompt\":\"$long\",\"max_tokens\":3}"
expect_error "prompt longer than the context" 400 invalid_request_error
check "context_length_exceeded" body_has '"code":"context_length_exceeded"'
head -c 1100000 /dev/zero | tr '\0' 'a' >"$TMP/big"
STATUS=$(curl -s -o "$TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' \
	--data-binary @"$TMP/big" "$URL/v1/chat/completions")
expect_error "body over 1 MiB" 413 invalid_request_error
# the same, sent chunked (no Content-Length to refuse up front)
STATUS=$(curl -s -o "$TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' \
	-H 'Transfer-Encoding: chunked' --data-binary @"$TMP/big" "$URL/v1/chat/completions")
expect_error "chunked body over 1 MiB" 413 invalid_request_error
req GET /v1/nothing
expect_error "unknown path" 404 not_found_error
req GET /v1/chat/completions
expect_error "wrong method" 405 invalid_request_error
check "405 names the allowed method" hdr_has '^allow: POST'
req DELETE /v1/models
expect_error "wrong method on models" 405 invalid_request_error
req GET /health
check "still healthy after bad input" [ "$STATUS" = 200 ]
serve_stop

# ---- auth: --api-key and SHOAL_API_KEY ----
serve_start --model "$MODEL" --api-key s3cret || fail "serve with --api-key"
req POST /v1/chat/completions "$CHAT"
expect_error "no key" 401 authentication_error
req POST /v1/chat/completions "$CHAT" -H 'Authorization: Bearer nope'
expect_error "wrong key" 401 authentication_error
req POST /v1/chat/completions "$CHAT" -H 'Authorization: Bearer s3cret'
check "right key 200" [ "$STATUS" = 200 ]
req GET /health
check "health needs no key" [ "$STATUS" = 200 ]
serve_stop
SHOAL_API_KEY=envkey serve_start --model "$MODEL" || fail "serve with SHOAL_API_KEY"
req GET /v1/models
expect_error "env key required" 401 authentication_error
req GET /v1/models "" -H 'Authorization: Bearer envkey' -X GET
check "env key accepted" [ "$STATUS" = 200 ]
serve_stop

# ---- a full queue answers 429 with Retry-After; every accepted request ends in a reply ----
serve_start --model "$MODEL" --queue-max 1 || fail "serve with --queue-max 1"
LONG='{"prompt":"Once upon a time","max_tokens":400,"temperature":1.5,"seed":1}'
printf '%s' "$LONG" >"$TMP/long"
i=0 pids=
while [ $i -lt 12 ]; do
	curl -s -o "$TMP/q$i.body" -D "$TMP/q$i.hdr" -w '%{http_code}\n' -H 'Content-Type: application/json' \
		--data-binary @"$TMP/long" "$URL/v1/completions" >"$TMP/q$i.code" &
	pids="$pids $!"
	i=$((i + 1))
done
# shellcheck disable=SC2086
wait $pids
n429=$(cat "$TMP"/q*.code | grep -c '^429$')
n200=$(cat "$TMP"/q*.code | grep -c '^200$')
nother=$((12 - n429 - n200))
check "some requests got 429 ($n200 ok, $n429 rejected)" [ "$n429" -ge 1 ]
check "no other status than 200/429 ($nother others)" [ "$nother" -eq 0 ]
check "429 carries Retry-After" sh -c "grep -li '^retry-after:' $TMP/q*.hdr | head -n 1 | grep -q ."
check "429 is a rate_limit_error" sh -c "grep -l 'rate_limit_error' $TMP/q*.body | head -n 1 | grep -q ."

# a client that hangs up mid-stream: its generation is canceled and the server carries on
curl -s -N -m 0.3 -H 'Content-Type: application/json' --data-binary \
	'{"prompt":"Once upon a time","max_tokens":500,"stream":true,"temperature":1.5}' \
	"$URL/v1/completions" >/dev/null 2>&1
req POST /v1/chat/completions "$CHAT"
check "served after a client hung up" [ "$STATUS" = 200 ]
serve_stop
check "serve exits 0 on SIGTERM (clean under ASan)" [ "$SERVE_RC" = 0 ]

# ---- the per-request deadline ----
serve_start --model "$MODEL" --timeout-ms 1 || fail "serve with --timeout-ms 1"
req POST /v1/completions '{"prompt":"Once upon a time","max_tokens":500,"temperature":1.5}'
expect_error "deadline passed" 504 server_error
check "timeout code" body_has '"code":"timeout"'
req POST /v1/completions '{"prompt":"Once upon a time","max_tokens":500,"stream":true,"temperature":1.5}'
check "stream deadline ends with an error event" body_has '^data: {"error":{'
serve_stop

# ---- a client that disconnects cancels its generation: stories260K greedy from "hello" runs to
# max_tokens without EOS; the client reads the first bytes and hangs up; the server must stop
# long before 2000 tokens.
serve_start --model "$MODEL" || fail "serve for the disconnect test"
curl -s -N -H 'Content-Type: application/json' --data-binary \
	'{"prompt":"hello","max_tokens":2000,"stream":true,"temperature":0}' \
	"$URL/v1/completions" 2>/dev/null | head -c 400 >"$TMP/partial"
idle=0 n=0
while [ $n -lt 50 ]; do
	curl -s "$URL/metrics" >"$TMP/m"
	if grep -q '^shoal_requests_running 0' "$TMP/m"; then idle=1; break; fi
	sleep 0.1
	n=$((n + 1))
done
live=$(sed -n 's/^shoal_tokens_generated_live_total //p' "$TMP/m")
check "the client got part of the stream" grep -q '^data: {' "$TMP/partial"
echo "disconnect: stopped after $live of 2000 tokens" >&2
check "disconnect canceled the generation (stopped after $live of 2000 tokens)" \
	[ "$idle" = 1 ] && [ "${live:-2000}" -lt 2000 ]
check "no finished request counted for it" grep -q '^shoal_generated_tokens_total 0' "$TMP/m"
req GET /health
check "healthy after the cancel" [ "$STATUS" = 200 ]
serve_stop
check "serve exits 0 after a cancel" [ "$SERVE_RC" = 0 ]

check "serve --help" sh -c "'$SHOAL' serve --help | grep -q -- --queue-max"
"$SHOAL" serve --port 1 >/dev/null 2>&1
check "serve without --model is a usage error" [ $? -eq 2 ]

done_tests
