#!/bin/sh
# bench_resume.sh (a `make bench` section): the pause a stream sees when a follower dies under it
# (issue 28). 3 agents on simulated hosts (network namespaces, tests/netns.sh; needs root) with
# the demo-sized model; 10 times: 4 concurrent greedy streams (tests/resume_streams.py) to the
# leader, a follower killed with -9 once each stream has 8 chunks, the streams resume on the
# 2-rank plan; the node is started again and the 3-rank plan awaited before the next round.
# Prints the client-side pause (the longest gap between two chunks of a stream, the worst of the
# 4 streams) as median and worst over the kills, the leader's own "paused" figure (suspension
# to resume, sched.c's log) likewise, and how many streams ended normally. Never fails.
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
ROUNDS=${BENCH_RESUME_ROUNDS:-10}
if [ "$(id -u)" -ne 0 ]; then
	echo "skipped: needs root (network namespaces)"
	exit 0
fi
for tool in ip avahi-daemon dbus-daemon curl jq unshare python3; do
	command -v $tool >/dev/null 2>&1 || { echo "skipped: $tool not installed"; exit 0; }
done
SHOAL=$(cd "$(dirname "$SHOAL")" && pwd)/$(basename "$SHOAL")
. tests/netns.sh
ns_setup 4 || { echo "skipped: network namespace setup failed"; exit 0; }
MODEL=$NS_ROOT/demo.gguf
"$SHOAL" mkmodel --arch llama --dim 512 --layers 4 --heads 8 --kv-heads 4 --ffn 1536 \
	--vocab 2048 --type q8_0 -o "$MODEL" >/dev/null 2>&1 || { echo "mkmodel failed"; exit 0; }

state() { echo "$(ns_dir "$1")/state"; }
start() {
	ns_start "$1" agent "$SHOAL" agent --token bench-resume --state-dir "$(state "$1")" \
		--model "$MODEL" --threads 1 --parallel 4 --peer "$(ns_ip 1):7411" \
		--peer "$(ns_ip 2):7411" --peer "$(ns_ip 3):7411"
}
leader_host() {
	_l=$(ns_exec "$1" "$SHOAL" status --json --state-dir "$(state "$1")" 2>/dev/null | jq -r .leader 2>/dev/null)
	for _h in 1 2 3; do [ "$(cat "$(state $_h)/node_id" 2>/dev/null)" = "$_l" ] && { echo $_h; return 0; }; done
	return 1
}
serving_with() { # ALIVE RANKS
	LH=$(leader_host "$1") || return 1
	[ "$(ns_exec 4 curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://$(ns_ip "$LH"):8080/health")" = 200 ] || return 1
	[ "$(ns_exec 4 curl -s --max-time 1 "http://$(ns_ip "$LH"):8080/v1/cluster" | jq -r '.plan.ranks' 2>/dev/null)" = "$2" ]
}
# median and worst of the numbers in FILE (one per line)
stats() { sort -n "$1" | awk '{v[NR]=$1} END {if (NR) printf "median %d ms, worst %d ms (%d kills)", v[int((NR+1)/2)], v[NR], NR; else printf "none"}'; }

for h in 1 2 3; do start $h; done
ns_wait 60 serving_with 1 3 || { echo "3 agents did not serve within 60 s"; exit 0; }
L=$(leader_host 1)
: >"$NS_ROOT/gaps"
ok=0 total=0 r=0
while [ $r -lt "$ROUNDS" ]; do
	r=$((r + 1))
	F=$(( (L + r) % 3 + 1 ))
	[ "$F" = "$L" ] && F=$((F % 3 + 1))
	rm -f "$NS_ROOT/ready"
	ns_exec 4 python3 tests/resume_streams.py "http://$(ns_ip "$L"):8080" 4 400 "$NS_ROOT/ready" 8 \
		>"$NS_ROOT/out" 2>/dev/null &
	SP=$!
	ns_wait 60 test -e "$NS_ROOT/ready" || { echo "round $r: the streams did not start"; kill $SP; break; }
	ns_kill "$F" agent KILL
	wait $SP
	sed -n 's/.* gap_ms=\([0-9]*\).*/\1/p' "$NS_ROOT/out" | sort -n | tail -n 1 >>"$NS_ROOT/gaps"
	ok=$((ok + $(sed -n 's/^ok //p' "$NS_ROOT/out")))
	total=$((total + 4))
	start "$F"
	ns_wait 60 serving_with "$L" 3 || { echo "round $r: 3 ranks did not serve again"; break; }
done
grep -h 'goes on after' "$(ns_dir "$L")/agent.log" | sed -n 's/.*(paused \([0-9]*\) ms).*/\1/p' |
	awk 'NR % 4 == 1' >"$NS_ROOT/paused"
echo "model $(($(wc -c <"$MODEL") / 1000000)) MB, 3 ranks -> 2 (a follower killed with -9), 4 streams, 1 thread per rank"
echo "streams ended normally: $ok of $total"
echo "client-side pause (longest gap between chunks): $(stats "$NS_ROOT/gaps")"
echo "leader's pause (suspended -> going on):         $(stats "$NS_ROOT/paused")"
for h in 1 2 3; do ns_kill $h agent TERM 2>/dev/null; done
exit 0
