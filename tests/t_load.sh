#!/bin/sh
# t_load.sh: 50 concurrent streaming chat clients against `shoal serve` (stories260K) on loopback
# for LOAD_SECONDS (30 s; 8 s under the sanitizers, whose build is several times slower): no
# error other than 429, the server answers /health afterwards and exits cleanly (no leak under
# ASan). Prints requests/s and tokens/s (figures, not assertions).
. tests/lib.sh
. tests/web_serve.sh

MODEL=$SHARED/models/stories260K.gguf
[ -f "$MODEL" ] || { skip "t_load: $MODEL missing"; done_tests; exit; }
command -v node >/dev/null 2>&1 || { skip "t_load: node not installed"; done_tests; exit; }
case "$SHOAL" in *-san/*) secs=${LOAD_SECONDS:-8} ;; *) secs=${LOAD_SECONDS:-30} ;; esac
clients=${LOAD_CLIENTS:-50}
TMP=$(mktemp -d)
trap 'serve_stop; rm -rf "$TMP"' EXIT
serve_or_skip t_load --model "$MODEL" --queue-max 16 || { done_tests; exit; }

out=$(node tests/node/load.mjs "$URL" "$clients" "$secs" 2>"$TMP/err")
rc=$?
echo "$out" | grep '^load:'
echo "$out" | grep '^load:' | sed 's/^/  /' >&2
sed 's/^/  /' "$TMP/err" >&2
check "load: only 429 as errors, some requests served" [ "$rc" -eq 0 ]
check "health after the load" sh -c "curl -sf '$URL/health' | grep -q '\"status\":\"ok\"'"
check "queue empty after the load" sh -c "curl -s '$URL/metrics' | grep -q '^shoal_queue_depth 0'"
serve_stop
check "serve exits 0 after the load (no leak under ASan)" [ "$SERVE_RC" = 0 ]
done_tests
