#!/bin/sh
# bench_links.sh: the planner's choice against every forced strategy (issue 26), through the
# API of 3 agents in the latency lab (tests/lab.sh), 1 thread each, the 0.85B Q4_0 model of
# issue 26 on every node. Per profile (one-way delay / rate: 40 us / 10 Gbit, 250 us / 1 Gbit,
# 1.5 ms / 300 Mbit), for auto, tensor, pipeline and hybrid: the plan (strategy, ranks), its
# predicted single-stream decode, the measured one (the median of 5 requests' decode rates, as
# /v1/cluster's plan.measured_decode_tok_s reports them; ignore_eos, so each decodes GEN tokens) and 4 streams' aggregate (generated
# tokens / wall time of 4 concurrent requests). With LLAMA_BIN=dir (ggml-rpc-server or
# rpc-server, and llama-bench), llama.cpp RPC's decode on the same hosts (llama-bench on lat1,
# the model's layers on RPC servers in lat2 and lat3). Printed, never asserted. Skips (one line)
# when not root.
# The agents run SCHED_FIFO below the lab's switch (LAB_RT=0: normal scheduling), as
# bench_tp_lab.sh's ranks (a rank asleep in poll() otherwise waits for a time slice).
# BENCH_LINKS_GEN: tokens per request (default 64); BENCH_LINKS_PROFILES: "DELAY:RATE ..."
# (default "40:10000 250:1000 1500:300"); BENCH_LINKS_STRATEGIES (default
# "auto tensor pipeline hybrid").
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
GEN=${BENCH_LINKS_GEN:-64}
PROFILES=${BENCH_LINKS_PROFILES:-40:10000 250:1000 1500:300}
STRATS=${BENCH_LINKS_STRATEGIES:-auto tensor pipeline hybrid}
. tests/lab.sh
if ! lab_ok; then
	echo "skip: $LAB_WHY"
	exit 0
fi
command -v python3 >/dev/null || { echo "skip: no python3"; exit 0; }
m=$(lab_model_085b) && [ -n "$m" ] || { echo "skip: mkmodel failed"; exit 0; }
case "$SHOAL" in /*) ;; *) SHOAL=$PWD/$SHOAL ;; esac
RT=""
[ "${LAB_RT:-1}" = 1 ] && command -v chrt >/dev/null && RT="chrt -f 5"
T=$(mktemp -d /tmp/shoal-links.XXXXXX)
PIDS=""
stop_all() {
	lab_kill $PIDS
	PIDS=""
}
trap 'stop_all; lab_down; rm -rf "$T"' EXIT
lab_up 3 40 10000 || { echo "skip: $LAB_WHY"; exit 0; }
trap 'stop_all; lab_down; rm -rf "$T"' EXIT

# the cluster document of host I (python reads it: j = the JSON)
cluster() { lab_run "$1" curl -s -m 5 "http://$(lab_ip "$1"):8080/v1/cluster"; }
jq_py() { python3 -c "import json,sys
try: j = json.load(sys.stdin)
except Exception: j = {}
$1"; }

start() { # strategy
	for i in 1 2 3; do
		peers=""
		for k in 1 2 3; do [ $k = $i ] || peers="$peers --peer $(lab_ip $k):7411"; done
		PIDS="$PIDS $(lab_bg $i "$T/a$i.log" $RT "$SHOAL" agent --token bench --no-mdns \
			$peers --state-dir "$T/s$i" --port 7411 --http-port 8080 --model "$m" \
			--threads 1 --expect 3 --strategy "$1" --log-level info)"
	done
}

# The host number of the node that plans (and serves the API as rank 0), as host 1 sees it
# (its own entry may carry the address it listens on, 0.0.0.0: then it is host 1).
leader_host() {
	cluster 1 | jq_py '
a = [m["addr"].split(":")[0] for m in j.get("members", []) if m.get("id") == j.get("leader")]
print("-" if not a else "1" if a[0] == "0.0.0.0" else a[0].split(".")[-1])'
}

# Waits until the planner has a plan made from measurements (every pair measured) that serves
# and holds for 11 polls (links are measured again 4 and 8 s after a join); sets LEADER (its
# host number) and PLAN ("strategy ranks predicted").
ready() {
	last="" same=0 t=0
	while [ $t -lt 240 ]; do
		L=$(leader_host)
		st="- 0 0"
		[ "$L" != "-" ] && st=$(cluster "$L" | jq_py '
p = j.get("plan") or {}
ls = [l for l in j.get("links", []) if "rtt_ms" in l]
print(p.get("hash", "-"), len(ls), p.get("predicted_decode_tok_s", 0), p.get("strategy", "-"),
      p.get("ranks", 0), j.get("state", "-"))')
		set -- $st
		if [ "$2" = 3 ] && [ "$3" != 0 ]; then
			h=$(lab_run "$L" curl -s -m 5 -o /dev/null -w '%{http_code}' \
				"http://$(lab_ip "$L"):8080/health")
			if [ "$h" = 200 ] && [ "$1" = "$last" ]; then
				same=$((same + 1))
			else
				same=0
			fi
			last=$1
			if [ $same -ge 10 ]; then
				LEADER=$L
				PLAN="$4 $5 $3"
				return 0
			fi
		fi
		sleep 1
		t=$((t + 1))
	done
	return 1
}

# one request on the leader; prints its decode tok/s (the server's figure) and tokens
request() {
	lab_run "$LEADER" curl -s -m 120 "http://$(lab_ip "$LEADER"):8080/v1/completions" \
		-H 'content-type: application/json' \
		-d "{\"prompt\": \"Once upon a time\", \"max_tokens\": $GEN, \"temperature\": 0, \"ignore_eos\": true}" \
		>/dev/null
	sleep 0.5 # the cluster document is published every 250 ms
	cluster "$LEADER" | jq_py 'print((j.get("plan") or {}).get("measured_decode_tok_s", 0))'
}

# 4 requests at once: generated tokens / wall time
streams4() {
	lab_run "$LEADER" sh -c '
t0=$(date +%s.%N)
for k in 1 2 3 4; do
	curl -s -m 300 "http://$1:8080/v1/completions" -H "content-type: application/json" \
		-d "{\"prompt\": \"Story $k:\", \"max_tokens\": $2, \"temperature\": 0, \"ignore_eos\": true}" >"$3/r$k" &
done
wait
t1=$(date +%s.%N)
echo "$t0 $t1"' sh "$(lab_ip "$LEADER")" "$GEN" "$T" | {
		read -r t0 t1
		python3 -c "import json,sys
n = 0
for k in range(1, 5):
    try: n += json.load(open('$T/r%d' % k))['usage']['completion_tokens']
    except Exception: pass
print('%.1f' % (n / max(float('$t1') - float('$t0'), 1e-3)))"
	}
}

median5() { printf '%s\n' "$@" | sort -n | sed -n 3p; }

llama_rpc() {
	[ -n "$LLAMA_BIN" ] || return 0
	srv=$LLAMA_BIN/ggml-rpc-server
	[ -x "$srv" ] || srv=$LLAMA_BIN/rpc-server
	[ -x "$srv" ] && [ -x "$LLAMA_BIN/llama-bench" ] || { echo "  llama.cpp RPC: no binaries in $LLAMA_BIN"; return 0; }
	rp=""
	for i in 2 3; do
		rp="$rp $(lab_bg $i "$T/rpc$i.log" env LD_LIBRARY_PATH="$LLAMA_BIN" "$srv" -H 0.0.0.0 -p 50052 -t 1)"
	done
	sleep 1
	out=$(lab_run 1 env LD_LIBRARY_PATH="$LLAMA_BIN" "$LLAMA_BIN/llama-bench" -m "$m" \
		--rpc "$(lab_ip 2):50052,$(lab_ip 3):50052" -p 0 -n "$GEN" -t 1 -r 2 -o csv 2>/dev/null |
		tail -n 1)
	lab_kill $rp
	tps=$(echo "$out" | python3 -c "import csv,sys
r = list(csv.reader(sys.stdin))
print('%.1f' % float(r[0][-2]) if r and len(r[0]) > 2 else '?')" 2>/dev/null)
	echo "  llama.cpp RPC (llama-bench on lat1, its layers on rpc servers in lat2 and lat3, 1" \
		"thread each): decode ${tps:-?} tok/s"
}

echo "3 agents, 1 thread each, $(basename "$m"), $GEN tokens per request" \
	"(RT: $([ -n "$RT" ] && echo yes || echo no))"
for prof in $PROFILES; do
	d=${prof%%:*} r=${prof##*:}
	lab_set "$d" "$r"
	echo "profile ${d} us one way, ${r} Mbit/s: ping RTT median $(lab_rtt 1 2 100) ms"
	for s in $STRATS; do
		start "$s"
		if ! ready; then
			echo "  $s: no plan served within 240 s ($(tail -n 2 "$T/a1.log" | tr '\n' ' '))"
			stop_all
			continue
		fi
		set -- $PLAN
		r1=$(request) r2=$(request) r3=$(request) r4=$(request) r5=$(request)
		agg=$(streams4)
		links=$(cluster "$LEADER" | jq_py '
print(" ".join("%.3f/%.3f ms %d Mbit" % (l["rtt_ms"], l["rtt_p90_ms"], l["mbit_s"])
      for l in j.get("links", []) if "rtt_ms" in l))')
		what=$1
		[ "$2" = 1 ] && what=single
		printf '  %-8s -> %-8s over %d: predicted %5.1f tok/s, measured %5.1f (%s %s %s %s %s); 4 streams %s tok/s\n' \
			"$s" "$what" "$2" "$3" "$(median5 "$r1" "$r2" "$r3" "$r4" "$r5")" "$r1" "$r2" "$r3" "$r4" "$r5" "$agg"
		[ "$s" = auto ] && echo "    links: $links"
		stop_all
	done
	llama_rpc
done
