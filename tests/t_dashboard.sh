#!/bin/sh
# t_dashboard.sh: a real headless Chromium (Debian's chromium, driven by playwright-core) opens the
# dashboard of `shoal serve --api-key` on stories260K (tests/node/dashboard.mjs: figures, charts,
# topology, the chat asking for the key, the request table and the event log), then watches its
# memory while its feed runs at 10 updates a second under load (tests/node/dashboard_mem.mjs:
# DASH_MEM_SECONDS, default 30; the heap after GC may grow < 512 KB, the DOM <= 60 nodes; the
# 10-minute figure at 1 update a second is scripts/bench_dashboard.sh's). Screenshots (dark,
# light, phone) are kept in $BUILD/test-logs/. The 3-node cluster is tests/t_dashboard_netns.sh.
. tests/lib.sh
. tests/web_serve.sh

MODEL=$SHARED/models/stories260K.gguf
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
[ -x "$CHROMIUM" ] || { skip "t_dashboard: $CHROMIUM not installed"; done_tests; exit; }
[ -f "$MODEL" ] || { skip "t_dashboard: $MODEL missing"; done_tests; exit; }
node_setup || { skip "t_dashboard: $NODE_WHY"; done_tests; exit; }
TMP=$(mktemp -d)
LOGS=$BUILD/test-logs
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)
trap 'serve_stop; rm -rf "$TMP"' EXIT
KEY="dash-key-$$"
serve_or_skip t_dashboard --model "$MODEL" --api-key "$KEY" --parallel 2 || { done_tests; exit; }

# node_run NAME SCRIPT ARGS...: runs a node script; its "N passed, N failed" line is summed into ours
node_run() {
	_n=$1; shift
	out=$(CHROMIUM=$CHROMIUM HOME=$TMP node "$@" 2>"$TMP/err")
	rc=$?
	sed 's/^/  /' "$TMP/err" >&2
	echo "$out" | grep -v 'passed.*failed' | sed 's/^/  /' >&2
	p=$(echo "$out" | sed -n 's/^\([0-9]*\) passed.*/\1/p')
	f=$(echo "$out" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
	T_PASS=$((T_PASS + ${p:-0})) T_FAIL=$((T_FAIL + ${f:-0}))
	[ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ] && fail "$_n exited $rc"
	return 0
}

node_run dashboard.mjs tests/node/dashboard.mjs "$URL/" "$KEY" "$LOGS"
check "screenshot saved" [ -s "$LOGS/dashboard.png" ]
check "phone screenshot saved" [ -s "$LOGS/dashboard-phone.png" ]
node_run dashboard_mem.mjs tests/node/dashboard_mem.mjs "$URL/" "$KEY" "${DASH_MEM_SECONDS:-30}" 100 512
# the page's size (the bound; test_web checks the compiled string too)
size=$(curl -s "$URL/" | wc -c)
echo "  page: $size bytes" >&2
check "the page is under 100 KB ($size bytes)" [ "$size" -gt 1000 -a "$size" -lt 102400 ]
check "/v1/history answers JSON with samples" sh -c "curl -s '$URL/v1/history' | jq -e '.t | length > 0' >/dev/null"
serve_stop
check "serve exits 0" [ "$SERVE_RC" = 0 ]
done_tests
