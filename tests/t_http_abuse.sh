#!/bin/sh
# t_http_abuse.sh: hostile HTTP clients against `shoal serve` and against a lone `shoal agent`
# (loopback only, no root):
# - 600 slow sockets (one header byte per 5 s, from 10 loopback addresses) against each at once:
#   /health every second and a completion every 4 s from 127.0.0.1 (every other one streamed)
#   succeed throughout, and the
#   server closes every slow socket by its header deadline (15 s), bytes trickling in or not;
# - 100 connections from one address: at most the per-address cap (64) stay open;
# - 100 concurrent 1 MiB bodies {"x":[{},{},...]}, 100 just under the 512 KiB limit and 100
#   chunked 1 MiB ones: RSS peaks < 300 MB over the idle baseline and is back within 50 MB of it;
# - a chunked body over the limit gets its 413 (JSON) before 1 MiB has been sent;
# - every error shoal itself answers has a JSON body; libmicrohttpd's own (bad request line, 505,
#   414, 431) keep their status and are listed in docs/security.md as the part still not JSON.
# The python helpers are tests/slow_clients.py and tests/body_flood.py.
. tests/lib.sh
. tests/web_serve.sh

MODEL=$SHARED/models/stories260K.gguf
[ -f "$MODEL" ] || { skip "t_http_abuse: $MODEL missing"; done_tests; exit; }
command -v python3 >/dev/null || { skip "t_http_abuse: no python3"; done_tests; exit; }
ulimit -n 8192 2>/dev/null || ulimit -n 4096 2>/dev/null
[ "$(ulimit -n)" -ge 2000 ] 2>/dev/null || { skip "t_http_abuse: fd limit $(ulimit -n) < 2000"; done_tests; exit; }
TMP=$(mktemp -d)
APID=
cleanup() {
	serve_stop
	[ -n "$APID" ] && kill "$APID" 2>/dev/null && wait "$APID" 2>/dev/null
	rm -rf "$TMP"
}
trap cleanup EXIT
serve_or_skip t_http_abuse --model "$MODEL" || { done_tests; exit; }

BASE=$((20000 + ($$ % 120) * 100 + 37))
AP=$BASE AH=$((BASE + 5))
"$SHOAL" agent --token abuse-test --model "$MODEL" --state-dir "$TMP/agent" --port "$AP" \
	--http-port "$AH" --no-mdns --expect 1 --threads 1 >"$TMP/agent.log" 2>&1 &
APID=$!
i=0
until curl -sf "http://127.0.0.1:$AH/health" >/dev/null; do
	i=$((i + 1))
	[ $i -gt 200 ] && break
	sleep 0.1
done
check "the agent serves" curl -sf "http://127.0.0.1:$AH/health" -o /dev/null

# slow clients against both at once (the agent listens on all addresses, 127.0.0.x included)
python3 tests/slow_clients.py "$PORT" 600 10 19 >"$TMP/slow_serve" 2>"$TMP/slow_serve.err" &
S1=$!
python3 tests/slow_clients.py "$AH" 600 10 19 >"$TMP/slow_agent" 2>"$TMP/slow_agent.err" &
S2=$!
wait $S1
wait $S2
val() { sed -n "s/^$2 //p" "$1"; }
for who in serve agent; do
	f=$TMP/slow_$who
	sed "s/^/  $who: /" "$f" >&2
	check "$who: 600 slow sockets opened" [ "$(val "$f" slow_opened)" = 600 ]
	check "$who: /health never failed" [ "$(val "$f" health_bad)" = 0 ]
	check "$who: /health answered throughout" [ "$(val "$f" health_ok)" -ge 12 ]
	check "$who: completions never failed" [ "$(val "$f" comp_bad)" = 0 ]
	check "$who: completions answered" [ "$(val "$f" comp_ok)" -ge 3 ]
	check "$who: streamed ones ended with [DONE]" [ "$(val "$f" stream_ok)" -ge 1 ]
	check "$who: no stream failed" [ "$(val "$f" stream_bad)" = 0 ]
	check "$who: every slow socket closed by the server" [ "$(val "$f" slow_closed_by_server)" = 600 ]
	check "$who: by the header deadline (15 s)" [ "$(val "$f" slow_longest_s)" -le 17 ]
	check "$who: one address keeps at most 64 connections" [ "$(val "$f" one_address_kept)" -le 64 ]
	check "$who: one address still gets connections" [ "$(val "$f" one_address_kept)" -ge 32 ]
done

python3 tests/body_flood.py "$PORT" "$SERVE_PID" >"$TMP/flood" 2>"$TMP/flood.err"
sed 's/^/  flood: /' "$TMP/flood" "$TMP/flood.err" >&2
f=$TMP/flood
base=$(val "$f" rss_base_mb) peak=$(val "$f" rss_peak_mb) after=$(val "$f" rss_after_mb)
check "flood ran" [ -n "$base" ] && [ -n "$peak" ] && [ -n "$after" ]
case "$SHOAL" in
*-san/*) # ASan's shadow memory and free quarantine say nothing about ours: figures only
	echo "  (sanitizer build: RSS $base -> $peak -> $after MB, not asserted)" >&2 ;;
*)
	check "peak RSS < 300 MB over idle ($base -> $peak MB)" [ $((peak - base)) -lt 300 ]
	check "RSS back within 50 MB ($base -> $after MB)" [ $((after - base)) -lt 50 ] ;;
esac
for k in big under chunked; do
	check "flood $k: all 413" [ "$(val "$f" "flood_$k")" = 413 ]
done
check "chunked over the limit: 413" sh -c "grep -q '^chunked_reply HTTP/1.1 413' '$f'"
check "chunked over the limit: JSON body" [ "$(val "$f" chunked_reply_json)" = 1 ]
check "chunked over the limit: answered before 1 MiB was sent" \
	[ "$(val "$f" chunked_sent_kib_at_reply)" -lt 1024 ]
for e in not_found:404 method:405 bad_json:400 too_large:413 too_deep:413; do
	n=${e%%:*} code=${e##*:}
	check "error $n: $code with a JSON body" sh -c "grep -q '^err $n $code application/json 1' '$f'"
done
# libmicrohttpd answers these itself (HTML, no Content-Type; docs/security.md): the status only
for e in http_version:505 uri_too_long:414 header_too_large:431; do
	n=${e%%:*} code=${e##*:}
	check "error $n: $code" sh -c "grep -q '^err $n $code ' '$f'"
done
check "serve still healthy" curl -sf "$URL/health" -o /dev/null
serve_stop
check "serve exits 0" [ "$SERVE_RC" = 0 ]
done_tests
