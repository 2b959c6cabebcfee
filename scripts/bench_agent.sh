#!/bin/sh
# bench_agent.sh (a `make bench` section): the agent end to end on 3 simulated hosts (network
# namespaces, tests/netns.sh; needs root) with the demo model. Prints, never fails:
#   - time from the last agent start to the leader's first 200 on /health (target < 3 s)
#   - time from kill -9 of the leader to the new leader's first 200 (target < 5 s)
#   - each rank's resident memory against its share in plan.json (weights + KV cache + activations)
# Agents run with their defaults (settle 1 s), as `make demo` starts them.
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
if [ "$(id -u)" -ne 0 ]; then
	echo "skipped: needs root (network namespaces)"
	exit 0
fi
for tool in ip avahi-daemon dbus-daemon curl jq unshare; do
	command -v $tool >/dev/null 2>&1 || { echo "skipped: $tool not installed"; exit 0; }
done
SHOAL=$(cd "$(dirname "$SHOAL")" && pwd)/$(basename "$SHOAL")
. tests/netns.sh
ns_setup 3 || { echo "skipped: network namespace setup failed"; exit 0; }
MODEL=$NS_ROOT/demo.gguf
"$SHOAL" mkmodel --arch llama --dim 512 --layers 4 --heads 8 --kv-heads 4 --ffn 1536 \
	--vocab 2048 --type q8_0 -o "$MODEL" >/dev/null 2>&1 || { echo "mkmodel failed"; exit 0; }
MB=$(($(wc -c <"$MODEL") / 1000000))

state() { echo "$(ns_dir "$1")/state"; }
leader_host() {
	_l=$(ns_exec "$1" "$SHOAL" status --json --state-dir "$(state "$1")" 2>/dev/null | jq -r .leader 2>/dev/null)
	for _h in 1 2 3; do [ "$(cat "$(state $_h)/node_id" 2>/dev/null)" = "$_l" ] && { echo $_h; return 0; }; done
	return 1
}
# leader_ok VIA [NOT [RANKS]]: the leader host VIA sees (other than NOT) answers 200 on /health
# (with a plan of RANKS ranks when given)
leader_ok() {
	LH=$(leader_host "$1") || return 1
	[ "$LH" != "$2" ] || return 1
	[ "$(ns_exec "$1" curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://$(ns_ip "$LH"):8080/health")" = 200 ] || return 1
	[ -z "$3" ] || [ "$(ns_exec "$1" curl -s --max-time 1 "http://$(ns_ip "$LH"):8080/v1/cluster" | jq -r '.plan.ranks' 2>/dev/null)" = "$3" ]
}

for h in 1 2 3; do ns_start $h agent "$SHOAL" agent --token bench --state-dir "$(state $h)" --model "$MODEL"; done
t0=$(ns_now_ms)
if ns_wait 60 leader_ok 1 0 3; then
	echo "cluster start: the leader's first 200 on /health with a 3-rank plan $(($(ns_now_ms) - t0)) ms after the last agent started (3 nodes, $MB MB demo model; target <= 2000; load average $(cut -d' ' -f1 /proc/loadavg))"
	grep -h "keys derived" "$(ns_dir 1)/agent.log" "$(ns_dir 2)/agent.log" "$(ns_dir 3)/agent.log" 2>/dev/null | sed 's/^/  /'
else
	echo "cluster start: no leader served within 60 s"
	exit 0
fi
L=$LH

# one completion first, so the resident figures include a request's working set
ns_exec 1 curl -s -L --max-time 30 -H 'Content-Type: application/json' \
	-d '{"prompt":"Once upon a time","max_tokens":64,"temperature":0}' \
	"http://$(ns_ip "$L"):8080/v1/completions" >/dev/null
echo "resident memory per rank (3 ranks; share = weights + KV cache + activations in plan.json):"
PLAN=$(state "$L")/plan.json
jq -r '.strategy as $s | .ranks[] | "\(.rank) \(.node_id) \(.fit.weights) \(.fit.kv_cache) \(.fit.activations) \($s)"' "$PLAN" 2>/dev/null |
while read -r r id w kv act strat; do
	for h in 1 2 3; do
		[ "$(cat "$(state $h)/node_id")" = "$id" ] || continue
		rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$(ns_pid $h agent)/status" 2>/dev/null)
		awk -v r="$r" -v h="$h" -v s="$strat" -v rss="${rss:-0}" -v w="$w" -v kv="$kv" \
			-v act="$act" -v mb="$MB" 'BEGIN { m = 1048576
			printf "  rank %s (host %s, %s): RSS %.1f MB; share %.1f MB (weights %.1f, KV %.1f, act %.1f); model file %s MB\n",
				r, h, s, rss / 1024, (w + kv + act) / m, w / m, kv / m, act / m, mb }'
	done
done

A=$((L % 3 + 1))
ns_kill "$L" agent KILL
t0=$(ns_now_ms)
if ns_wait 60 leader_ok "$A" "$L"; then
	echo "failover: kill -9 of the leader (host $L) to the new leader's (host $LH) first 200: $(($(ns_now_ms) - t0)) ms (target < 5000)"
else
	echo "failover: no new leader served within 60 s of kill -9 of the leader"
fi

# the baseline: an agent alone without a model (libraries, threads, buffers)
for h in 1 2 3; do ns_kill $h agent KILL 2>/dev/null; done
rm -rf "$(state 3)"
ns_start 3 agent "$SHOAL" agent --token alone --state-dir "$(state 3)"
sleep 2
rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$(ns_pid 3 agent)/status" 2>/dev/null)
awk -v rss="${rss:-0}" 'BEGIN { printf "memory baseline: an agent without a model: RSS %.1f MB\n", rss / 1024 }'
ns_kill 3 agent KILL

# model transfer: a 2-node cluster where only host 1 has a ~120 MB model; host 2 fetches it
for h in 1 2 3; do ns_kill $h agent KILL 2>/dev/null; done
BIG=$NS_ROOT/big.gguf
"$SHOAL" mkmodel --arch llama --dim 1024 --layers 4 --heads 16 --kv-heads 4 --ffn 2816 \
	--vocab 32000 --type q8_0 -o "$BIG" >/dev/null 2>&1 || { echo "mkmodel (big) failed"; exit 0; }
BMB=$(($(wc -c <"$BIG") / 1000000))
rm -rf "$(state 1)" "$(state 2)"
ns_start 1 agent "$SHOAL" agent --token bench2 --state-dir "$(state 1)" --model "$BIG"
ns_start 2 agent "$SHOAL" agent --token bench2 --state-dir "$(state 2)"
t0=$(ns_now_ms)
# a whole copy (models/HEX.gguf), or the slice file that holds the header and, once planned,
# this node's shares (models/HEX.slice: agent/modelstore)
fetched() { ls "$(state 2)"/models/*.gguf "$(state 2)"/models/*.slice >/dev/null 2>&1; }
if ns_wait 120 fetched; then
	ms=$(($(ns_now_ms) - t0))
	if ls "$(state 2)"/models/*.gguf >/dev/null 2>&1; then
		awk -v mb="$BMB" -v ms="$ms" 'BEGIN { printf "model transfer: a node without --model had the %d MB model %d ms after its start (%.0f MB/s including discovery and hashing)\n", mb, ms, (ms > 0 ? mb * 1000 / ms : 0) }'
	else
		echo "model transfer: a node without --model had the model's header (a slice file; its shares come when a plan uses it) $ms ms after its start"
	fi
	grep -h 'MB/s' "$(ns_dir 2)/agent.log" | tail -n 1 | sed 's/^/  last progress line: /'
else
	echo "model transfer: host 2 did not receive the model within 120 s"
fi
exit 0
