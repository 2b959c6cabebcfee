#!/bin/sh
# t_openai.sh: the official `openai` npm package against `shoal serve` on stories260K: models
# list, completions, chat, streaming chat with stream_options.include_usage (tests/node/openai.mjs).
# Greedy text must equal `shoal generate`'s for the same request; usage counts must equal the
# token counts (`shoal tokenize`).
. tests/lib.sh
. tests/web_serve.sh

MODEL=$SHARED/models/stories260K.gguf
PROMPT="Once upon a time"
N=64
[ -f "$MODEL" ] || { skip "t_openai: $MODEL missing"; done_tests; exit; }
node_setup || { skip "t_openai: $NODE_WHY"; done_tests; exit; }
TMP=$(mktemp -d)
trap 'serve_stop; rm -rf "$TMP"' EXIT
serve_or_skip t_openai --model "$MODEL" || { done_tests; exit; }

# The reference: `shoal generate` greedy, same prompt and length (it ends its text with one
# newline, removed here), as text and as ids (their count = completion_tokens).
# expected VAR ARGS...: runs shoal generate ARGS and exports its text as VAR.
expected() {
	var=$1; shift
	if "$SHOAL" generate --model "$MODEL" --max-tokens $N --temperature 0 "$@" \
		>"$TMP/gen.txt" 2>"$TMP/gen.err"; then
		v=$(cat "$TMP/gen.txt"; printf x)
		v=${v%x}
		v=${v%?}
		export "$var=$v"
	else
		fail "shoal generate $*: $(cat "$TMP/gen.err")"
	fi
}
expected EXPECT_TEXT --prompt "$PROMPT"
expected EXPECT_CHAT --chat "$PROMPT"
expected GEN_IDS --prompt "$PROMPT" --ids
EXPECT_COMPLETION_TOKENS=$(echo "$GEN_IDS" | wc -w | tr -d ' ')
EXPECT_PROMPT_TOKENS=$(printf '%s' "$PROMPT" | "$SHOAL" tokenize --model "$MODEL" --bos | wc -w | tr -d ' ')
export EXPECT_COMPLETION_TOKENS EXPECT_PROMPT_TOKENS
check "reference ids counted" [ "$EXPECT_COMPLETION_TOKENS" -gt 0 ]
check "reference prompt tokenized" [ "$EXPECT_PROMPT_TOKENS" -gt 0 ]

out=$(PROMPT=$PROMPT MAX_TOKENS=$N node tests/node/openai.mjs "$URL" 2>"$TMP/err")
rc=$?
sed 's/^/  /' "$TMP/err" >&2
p=$(echo "$out" | sed -n 's/^\([0-9]*\) passed.*/\1/p')
f=$(echo "$out" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
T_PASS=$((T_PASS + ${p:-0})) T_FAIL=$((T_FAIL + ${f:-0}))
[ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ] && fail "openai.mjs exited $rc"
serve_stop
check "serve exits 0" [ "$SERVE_RC" = 0 ]
done_tests
