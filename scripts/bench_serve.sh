#!/bin/sh
# bench_serve.sh (a `make bench` section): serving through the HTTP API with continuous batching
# (issue 16), on the ~0.85B Q8_0 model (`mkmodel ... --seed 7`, reused from $BUILD/bench/):
#   - `shoal serve --threads 2 --parallel 8`: aggregate tok/s of 64-token streamed completions at
#     1, 2, 4 and 8 concurrent streams (each stream runs BENCH_SERVE_REQS requests, default 2),
#     and the time to the first token of a request arriving while 3 others stream vs idle;
#     each streams figure is the median of BENCH_SERVE_ROUNDS runs (default 3)
#   - the same through a 2-rank agent cluster in network namespaces (1 thread per rank; needs root)
# Targets (issue 16): 4 streams >= 2.5x one stream's aggregate; TTFT under load <= 2x idle.
# Prints figures only; never fails.
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
DIR=$BUILD/bench
REQS=${BENCH_SERVE_REQS:-2}
ROUNDS=${BENCH_SERVE_ROUNDS:-3}
command -v node >/dev/null 2>&1 || { echo "skipped: node not installed"; exit 0; }
mkdir -p "$DIR"
m=$DIR/llama-0.85b-q8_0-s7.gguf # bench_infer.sh's file (and tests/t_big_models.sh's)
if [ ! -s "$m" ]; then
	echo "(generating $m once)" >&2
	$SHOAL mkmodel --arch llama --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 \
		--vocab 32000 --type q8_0 --seed 7 --name bench-0.85b-q8_0 -o "$m" >/dev/null || exit 0
fi
SHOAL=$(cd "$(dirname "$SHOAL")" && pwd)/$(basename "$SHOAL")
m=$(cd "$(dirname "$m")" && pwd)/$(basename "$m")
JS=$(pwd)/scripts/serve_bench.mjs
T=$(mktemp -d /tmp/shoal-benchserve.XXXXXX)
SRV=""
trap '[ -n "$SRV" ] && kill $SRV 2>/dev/null; rm -rf "$T"' EXIT

# figures RUN URL: the table for one server; RUN is a command prefix (empty, or ns_exec N)
figures() {
	_run=$1 _url=$2
	printf '  %-8s %10s %8s %8s %12s\n' streams "tok/s" tokens "wall s" "mean lat s"
	one=""
	for n in 1 2 4 8; do
		# the median of ROUNDS runs by tok/s: one run's figure moved by a third with
		# the shared host's memory bandwidth of the moment
		: >"$T/rounds"
		k=0
		while [ "$k" -lt "$ROUNDS" ]; do
			k=$((k + 1))
			$_run node "$JS" "$_url" streams $n "$REQS" >>"$T/rounds" 2>"$T/err" ||
				{ echo "  $n streams failed: $(head -c 200 "$T/err")"; continue 2; }
		done
		r=$(sort -n -k2 "$T/rounds" | sed -n "$(((ROUNDS + 1) / 2))p")
		set -- $r
		[ -z "$one" ] && one=$2
		printf '  %-8s %10s %8s %8s %12s   %sx one stream\n' "$1" "$2" "$3" "$4" "$5" \
			"$(awk -v a="$2" -v b="$one" 'BEGIN { if (b > 0) printf "%.2f", a / b }')"
	done
	idle=$($_run node "$JS" "$_url" ttft 3 0 2>"$T/err") || idle="? ?"
	busy=$($_run node "$JS" "$_url" ttft 3 3 2>"$T/err") || busy="? ?"
	set -- $idle $busy
	echo "  time to first token: idle median $1 ms (max $2); while 3 others stream median $3 ms" \
		"(max $4): $(awk -v a="$3" -v b="$1" 'BEGIN { if (b > 0) printf "%.2f", a / b }')x idle (target <= 2)"
}

echo "one node: shoal serve --threads 2 --parallel 8, $(basename "$m"), load $(cut -d' ' -f1-3 /proc/loadavg)"
P=$((18000 + $$ % 1000))
$SHOAL serve --model "$m" --threads 2 --parallel 8 --queue-max 64 --port $P --log-level warn \
	2>"$T/serve.log" &
SRV=$!
up() { curl -sf "http://127.0.0.1:$P/health" >/dev/null 2>&1; }
i=0
while ! up && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
if up; then
	figures "" "http://127.0.0.1:$P"
else
	echo "  serve did not start: $(tail -1 "$T/serve.log")"
fi
kill $SRV 2>/dev/null
wait $SRV 2>/dev/null
SRV=""

if [ "$(id -u)" -ne 0 ]; then
	echo "2-rank cluster: skipped (needs root for network namespaces)"
	exit 0
fi
for tool in ip avahi-daemon dbus-daemon jq; do
	command -v $tool >/dev/null 2>&1 || { echo "2-rank cluster: skipped ($tool missing)"; exit 0; }
done
. tests/netns.sh
ns_setup 3 || { echo "2-rank cluster: skipped (namespace setup failed)"; exit 0; }
state() { echo "$(ns_dir "$1")/state"; }
for h in 1 2; do
	ns_start $h agent "$SHOAL" agent --token bench-serve --state-dir "$(state $h)" --model "$m" \
		--threads 1 --parallel 8 --settle 0.5 --log-level warn
done
leader_url() {
	_l=$(ns_exec 1 "$SHOAL" status --json --state-dir "$(state 1)" 2>/dev/null | jq -r .leader)
	for _h in 1 2; do
		[ "$(cat "$(state $_h)/node_id" 2>/dev/null)" = "$_l" ] || continue
		[ "$(jq '.ranks | length' "$(state $_h)/plan.json" 2>/dev/null)" = 2 ] || return 1
		LURL="http://$(ns_ip $_h):8080"
		[ "$(ns_exec 3 curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$LURL/health")" = 200 ]
		return
	done
	return 1
}
if ns_wait 180 leader_url; then
	echo "2-rank agent cluster (network namespaces, 1 thread per rank, --parallel 8), $(jq -r .strategy "$(state 1)/plan.json") plan"
	figures "ns_exec 3" "$LURL"
else
	echo "2-rank cluster: did not serve within 180 s"
fi
for h in 1 2; do ns_kill $h agent TERM; done
exit 0
