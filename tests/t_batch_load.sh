#!/bin/sh
# t_batch_load.sh: issue 16's load test. A 3-node cluster of `shoal agent` in network namespaces
# (tests/netns.sh; needs root) serves stories260K with 4 KV slots (continuous batching across the
# ranks: every step's batch goes to the followers as a BATCH message). 50 streaming chat clients
# (tests/node/load.mjs, run in a 4th host) load the leader for LOAD_SECONDS (60; 10 under the
# sanitizers' build, where LeakSanitizer replaces the RSS bound): only 200s and 429s, every
# stream ends with [DONE], no hang; afterwards the queue is empty, every slot free, the leader still answers and its memory is flat (RSS after
# the load within a bound of its RSS after a warm-up). Then a follower is killed while 4 requests
# stream (a re-plan): every stream ends with an error event or [DONE], none hangs, and the other
# two nodes serve again. The agents then stop cleanly (exit 0; no sanitizer report in their
# logs). Prints the load's figures (not assertions).
. tests/lib.sh

if [ "$(id -u)" -ne 0 ]; then
	skip "t_batch_load: needs root for network namespaces"
	done_tests
	exit $?
fi
for tool in ip avahi-daemon dbus-daemon dbus-send curl jq node; do
	if ! command -v $tool >/dev/null 2>&1; then
		skip "t_batch_load: $tool not installed"
		done_tests
		exit $?
	fi
done
STORIES=$SHARED/models/stories260K.gguf
[ -f "$STORIES" ] || { skip "t_batch_load: $STORIES missing"; done_tests; exit $?; }

case "$SHOAL" in
*-san/*) secs=${LOAD_SECONDS:-10} grow_kb="" ;; # ASan's quarantine holds freed memory
*) secs=${LOAD_SECONDS:-60} grow_kb=32768 ;;
esac
clients=${LOAD_CLIENTS:-50}

. tests/netns.sh
SHOAL=$(cd "$(dirname "$SHOAL")" && pwd)/$(basename "$SHOAL")
STORIES=$(cd "$(dirname "$STORIES")" && pwd)/$(basename "$STORIES")
LOADJS=$(pwd)/tests/node/load.mjs
TOKEN="shoal-batch-load-$$-71c3"

if ! ns_setup 4; then
	fail "netns setup (4 hosts)"
	done_tests
	exit 1
fi

state() { echo "$(ns_dir "$1")/state"; }
node_id() { cat "$(state "$1")/node_id" 2>/dev/null; }
status_json() { ns_exec "$1" "$SHOAL" status --json --state-dir "$(state "$1")" 2>/dev/null; }
leader_host() {
	_l=$(status_json "$1" | jq -r .leader 2>/dev/null)
	for _h in 1 2 3; do [ "$(node_id $_h)" = "$_l" ] && { echo $_h; return 0; }; done
	return 1
}
url() { echo "http://$(ns_ip "$1"):8080$2"; }
plan_ranks() { jq '.ranks | length' "$(state "$1")/plan.json" 2>/dev/null; }
serving3() {
	[ "$(status_json 1 | jq '.members | length' 2>/dev/null)" = 3 ] || return 1
	_lh=$(leader_host 1) || return 1
	[ "$(ns_exec 4 curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$(url "$_lh" /health)")" = 200 ] &&
		[ "$(plan_ranks "$_lh")" = 3 ]
}
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$(ns_pid "$1" agent)/status" 2>/dev/null; }
metrics() { ns_exec 4 curl -s --max-time 5 "$(url "$1" /metrics)"; }
# idle HOST: nothing queued, running or in a slot
idle() {
	_m=$(metrics "$1")
	echo "$_m" | grep -q '^shoal_queue_depth 0' && echo "$_m" | grep -q '^shoal_requests_running 0' &&
		! echo "$_m" | grep -q 'state="prefill"} 1\|state="decode"} 1'
}
answers() {
	ns_exec 4 curl -sf --max-time 30 -H 'Content-Type: application/json' \
		-d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0}' \
		"$(url "$1" /v1/completions)" | grep -q finish_reason
}
has_hists() {
	echo "$1" | grep -q '^shoal_batch_size_count [1-9]' &&
		echo "$1" | grep -q '^shoal_time_to_first_token_seconds_count [1-9]' &&
		echo "$1" | grep -q '^shoal_inter_token_seconds_count [1-9]'
}
load() { # load HOST SECONDS OUT: exit status of load.mjs
	ns_exec 4 timeout $(($2 + 120)) node "$LOADJS" "$(url "$1" "")" "$clients" "$2" >"$3" 2>"$3.err"
}

for h in 1 2 3; do
	ns_start $h agent env SHOAL_TOKEN="$TOKEN" "$SHOAL" agent --state-dir "$(state $h)" \
		--settle 0.5 --model "$STORIES" --parallel 4 --threads 1
done
if ! ns_wait 60 serving3; then
	fail "3 agents serve stories260K within 60 s"
	tail -n 5 "$(ns_dir 1)/agent.log" >&2
	for h in 1 2 3; do ns_kill $h agent TERM; done
	done_tests
	exit 1
fi
pass
L=$(leader_host 1)

# warm-up: every slot, the allocator's arenas and the tokenizer caches reach their working size
load "$L" 3 "$NS_ROOT/warm.txt"
ns_wait 30 idle "$L"
rss0=$(rss_kb "$L")

load "$L" "$secs" "$NS_ROOT/load.txt"
rc=$?
grep '^load:' "$NS_ROOT/load.txt"
sed 's/^/  /' "$NS_ROOT/load.txt" "$NS_ROOT/load.txt.err" >&2
check "load: $clients streaming clients for $secs s on 3 ranks: only 200 and 429, streams end with [DONE]" [ "$rc" -eq 0 ]
check "after the load the leader is idle (queue empty, every slot free) within 30 s" ns_wait 30 idle "$L"
check "the leader still answers" answers "$L"
m=$(metrics "$L")
check "/metrics has the batching histograms" has_hists "$m"
batch_mean=$(echo "$m" | awk '/^shoal_batch_size_sum/ {s=$2} /^shoal_batch_size_count/ {c=$2} END {if (c) printf "%.2f", s/c}')
echo "load: mean sequences per step $batch_mean" >&2
check "steps really batched several sequences (mean $batch_mean)" awk "BEGIN {exit !($batch_mean > 1.5)}"
rss1=$(rss_kb "$L")
echo "load: leader RSS $rss0 kB after warm-up, $rss1 kB after the load" >&2
if [ -n "$grow_kb" ]; then
	check "memory flat: RSS grew by less than $grow_kb kB ($rss0 -> $rss1)" \
		[ "$((${rss1:-999999999} - ${rss0:-0}))" -lt "$grow_kb" ]
else
	skip "memory flat: RSS under ASan includes its quarantine (LeakSanitizer checks at exit)"
fi

# a follower lost while 4 requests stream (a re-plan): every stream ends (an error event or
# [DONE]), none hangs, and the remaining two nodes serve again
F=$((L % 3 + 1))
for i in 1 2 3 4; do
	ns_exec 4 curl -s -N --max-time 90 -H 'Content-Type: application/json' \
		-d '{"prompt":"Once upon a time","max_tokens":3000,"temperature":0,"stream":true}' \
		"$(url "$L" /v1/completions)" >"$NS_ROOT/replan$i.txt" 2>&1 &
	eval "CURL$i=\$!"
done
all_streaming() { for i in 1 2 3 4; do grep -qs '^data: {' "$NS_ROOT/replan$i.txt" || return 1; done; }
ns_wait 30 all_streaming
ns_kill "$F" agent KILL
curls_done() { for i in 1 2 3 4; do eval "kill -0 \$CURL$i" 2>/dev/null && return 1; done; return 0; }
check "re-plan: the 4 streams end within 60 s of losing a follower (no hang)" ns_wait 60 curls_done
ended=0
for i in 1 2 3 4; do
	grep -q '^data: {"error"\|^data: \[DONE\]' "$NS_ROOT/replan$i.txt" && ended=$((ended + 1))
done
check "re-plan: every stream ends with an error event or [DONE] ($ended of 4)" [ "$ended" = 4 ]
serving2() {
	_lh=$(leader_host "$L") || return 1
	[ "$(plan_ranks "$_lh")" = 2 ] && answers "$_lh"
}
check "re-plan: the remaining 2 nodes serve again within 60 s" ns_wait 60 serving2

for h in 1 2 3; do
	[ "$h" = "$F" ] && continue
	p=$(ns_pid $h agent)
	kill -TERM "$p" 2>/dev/null
	wait "$p"
	code=$?
	check "agent $h exits 0 after the load" [ "$code" = 0 ]
	check "agent $h: no sanitizer report" sh -c "! grep -q 'Sanitizer' '$(ns_dir $h)/agent.log'"
done
done_tests
