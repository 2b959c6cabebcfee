#!/bin/sh
# t_dashboard.sh: a real headless Chromium (Debian's chromium, driven by playwright-core) opens the
# dashboard of `shoal serve` on stories260K: the node table and a live tok/s value appear, a chat
# message sent through the page streams a reply; the screenshot is saved as $BUILD/dashboard.png.
. tests/lib.sh
. tests/web_serve.sh

MODEL=$SHARED/models/stories260K.gguf
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
[ -x "$CHROMIUM" ] || { skip "t_dashboard: $CHROMIUM not installed"; done_tests; exit; }
[ -f "$MODEL" ] || { skip "t_dashboard: $MODEL missing"; done_tests; exit; }
node_setup || { skip "t_dashboard: $NODE_WHY"; done_tests; exit; }
TMP=$(mktemp -d)
trap 'serve_stop; rm -rf "$TMP"' EXIT
serve_or_skip t_dashboard --model "$MODEL" || { done_tests; exit; }

# The page's own counters: lines "N passed, N failed" are summed into ours.
out=$(CHROMIUM=$CHROMIUM HOME=$TMP node tests/node/dashboard.mjs "$URL/" "$BUILD/dashboard.png" 2>"$TMP/err")
rc=$?
sed 's/^/  /' "$TMP/err" >&2
p=$(echo "$out" | sed -n 's/^\([0-9]*\) passed.*/\1/p')
f=$(echo "$out" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
T_PASS=$((T_PASS + ${p:-0})) T_FAIL=$((T_FAIL + ${f:-0}))
[ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ] && fail "dashboard.mjs exited $rc"
check "screenshot saved" [ -s "$BUILD/dashboard.png" ]
serve_stop
check "serve exits 0" [ "$SERVE_RC" = 0 ]
done_tests
