#!/bin/sh
# bench_dashboard.sh (a `make bench` section): the dashboard's memory over time (issue 32: it
# updates at least once a second without growing the browser's memory over 10 minutes).
# `shoal serve` on stories260K with a light load; tests/node/dashboard_mem.mjs opens the page in
# headless Chromium at its default feed (one update a second) for BENCH_DASH_SECONDS (default 600)
# and prints the JavaScript heap after GC and the DOM node count every tenth of that time.
# The page's own history grows until it holds 15 minutes (900 samples) and Chromium buffers
# performance entries (long tasks, long animation frames, layout shifts) up to its own caps, so
# the heap grows over the first minutes and then stays flat (20 minutes here: 1.0 -> 2.2 MB, flat
# from the 8th minute; DOM nodes constant). BENCH_DASH_SECONDS=1200 shows the plateau.
# Prints figures only; never fails.
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
SECS=${BENCH_DASH_SECONDS:-600}
MODEL=${SHOAL_SHARED:-../shared}/models/stories260K.gguf
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || { echo "skipped: chromium not installed"; exit 0; }
[ -f "$MODEL" ] || { echo "skipped: $MODEL missing"; exit 0; }
. tests/lib.sh
. tests/web_serve.sh
node_setup || { echo "skipped: $NODE_WHY"; exit 0; }
TMP=$(mktemp -d /tmp/shoal-benchdash.XXXXXX)
trap 'serve_stop; rm -rf "$TMP"' EXIT
serve_start --model "$MODEL" --parallel 2 || { echo "skipped: shoal serve did not start"; exit 0; }
echo "page: $(curl -s "$URL/" | wc -c) bytes; feed: 1 update/s; $SECS s"
HOME=$TMP node tests/node/dashboard_mem.mjs "$URL/" "" "$SECS" 1000 2>&1 | sed 's/^ */  /'
