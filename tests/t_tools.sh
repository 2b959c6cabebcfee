#!/bin/sh
# t_tools.sh: tool calling and structured output through the official `openai` npm package
# against `shoal serve` on a generated random-weight model (tests/node/tools.mjs): a tool round
# trip streamed and not, 20 seeded json_schema replies validated with ajv, and 400s that name
# unsupported schema keywords.
. tests/lib.sh
. tests/web_serve.sh

node_setup || { skip "t_tools: $NODE_WHY"; done_tests; exit; }
[ -d tests/node/node_modules/ajv ] || { skip "t_tools: ajv missing (cd tests/node && npm ci)"; done_tests; exit; }
TMP=$(mktemp -d)
trap 'serve_stop; rm -rf "$TMP"' EXIT
"$SHOAL" mkmodel --seed 7 --layers 2 --dim 128 --ffn 256 -o "$TMP/rand.gguf" >/dev/null 2>&1 ||
	{ fail "shoal mkmodel"; done_tests; exit; }
serve_or_skip t_tools --model "$TMP/rand.gguf" || { done_tests; exit; }

out=$(node tests/node/tools.mjs "$URL" 2>"$TMP/err")
rc=$?
sed 's/^/  /' "$TMP/err" >&2
p=$(echo "$out" | sed -n 's/^\([0-9]*\) passed.*/\1/p')
f=$(echo "$out" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
T_PASS=$((T_PASS + ${p:-0})) T_FAIL=$((T_FAIL + ${f:-0}))
[ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ] && fail "tools.mjs exited $rc"
serve_stop
check "serve exits 0" [ "$SERVE_RC" = 0 ]
done_tests
