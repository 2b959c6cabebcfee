#!/bin/sh
# t_lab_links.sh: the agents' measured links and compute steer the plan (issue 26), in the
# latency lab (tests/lab.sh; ../shared/docs/latency-lab.md). A generated model of two wide
# layers (most of a token's time in their FFN, 4 syncs per token) on 2 agents of 1 thread each:
#  - at a small delay (40 us one way) the measured links make tensor parallel the plan;
#  - at a large one (4 ms one way) the agents, restarted, measure it and the plan is no longer
#    tensor (pipeline or one node);
#  - --strategy pipeline forces a pipeline at the small delay;
#  - a 4th node far slower (SHOAL_REF_KERNELS: the plain C kernels, a real difference its own
#    measurement sees) with 3 agents: standby, not a rank.
# /v1/cluster (the leader's) is read for the plan, its links (rtt_ms, mbit_s) and standby
# members; `shoal status` for the link matrix. No timing is asserted, only the choices. Needs
# root; skips otherwise.
. tests/lib.sh
. tests/lab.sh
export SHOAL_COMPUTE=on # the cost model is what this test tests (lib.sh turns it off)
SHOAL=${SHOAL:-$BUILD/shoal}
case "$SHOAL" in /*) ;; *) SHOAL=$PWD/$SHOAL ;; esac
if ! lab_ok; then
	skip "$LAB_WHY"
	done_tests
	exit $?
fi
command -v python3 >/dev/null || { skip "no python3"; done_tests; exit $?; }
T=$(mktemp -d /tmp/shoal-lablinks.XXXXXX)
M=$T/wide.gguf
"$SHOAL" mkmodel --arch llama --dim 2048 --layers 2 --heads 16 --kv-heads 4 --ffn 16384 \
	--vocab 4096 --type q4_0 --seed 3 -o "$M" >/dev/null 2>&1 || {
	fail "mkmodel"
	done_tests
	exit 1
}
if ! lab_up 4 40 10000; then
	skip "$LAB_WHY"
	rm -rf "$T"
	done_tests
	exit $?
fi
PIDS=""
stop_all() {
	lab_kill $PIDS
	PIDS=""
}
trap 'stop_all; lab_down; rm -rf "$T"' EXIT
# node IDs in order (the smallest plans and is rank 0); the slow 4th is the largest
for i in 1 2 3 4; do
	mkdir -p "$T/s$i"
	printf '%s\n' "$(printf "$i%.0s" $(seq 32))" | sed 's/4/f/g' >"$T/s$i/node_id"
done

# start N [agent flags...]: agents on lat1..latN (the 4th with the reference kernels)
start() {
	n=$1
	shift
	for i in $(seq "$n"); do
		peers=""
		for k in $(seq "$n"); do [ "$k" = "$i" ] || peers="$peers --peer $(lab_ip "$k"):7411"; done
		env=""
		[ "$i" = 4 ] && env="SHOAL_REF_KERNELS=1"
		PIDS="$PIDS $(lab_bg "$i" "$T/a$i.log" env $env "$SHOAL" agent --token labtest \
			--no-mdns $peers --state-dir "$T/s$i" --port 7411 --http-port 8080 \
			--model "$M" --threads 1 --expect "$n" "$@")"
	done
}

# the leader's (lat1's) cluster document, summarised by python code on j
doc() {
	lab_run 1 curl -s -m 5 "http://$(lab_ip 1):8080/v1/cluster" | python3 -c "import json,sys
try: j = json.load(sys.stdin)
except Exception: j = {}
$1"
}

# Waits (up to 120 s) until lat1's plan comes from measurements of all N*(N-1)/2 pairs and
# holds for 11 polls (the links are measured again 4 and 8 s after a join); prints
# "STRATEGY RANKS".
settled() {
	pairs=$(($1 * ($1 - 1) / 2)) last="" same=0 t=0
	while [ $t -lt 120 ]; do
		s=$(doc '
p = j.get("plan") or {}
n = len([l for l in j.get("links", []) if "rtt_ms" in l])
print(p.get("hash", "-"), n, p.get("predicted_decode_tok_s", 0), p.get("strategy", "-"),
      p.get("ranks", 0))')
		set -- $s
		if [ "$2" -ge "$pairs" ] && [ "$3" != 0 ] && [ "$1" = "$last" ]; then
			same=$((same + 1))
		else
			same=0
		fi
		last=$1
		if [ $same -ge 10 ]; then
			echo "$4 $5"
			return 0
		fi
		sleep 1
		t=$((t + 1))
	done
	echo "none 0"
	for i in 1 2; do tail -n 8 "$T/a$i.log" | sed "s/^/    lat$i: /" >&2; done
	return 1
}

# small delay: tensor over 2
start 2
r=$(settled 2)
echo "  40 us: $r; $(doc 'print((j.get("plan") or {}).get("reason"))')" >&2
check "40 us one way: the measured plan is tensor parallel" test "${r% *}" = tensor
check "links carry rtt_ms, rtt_p90_ms and mbit_s" test "$(doc '
ls = [l for l in j.get("links", []) if "rtt_ms" in l]
print(len(ls) == 1 and all(l["rtt_ms"] > 0 and l["rtt_p90_ms"] >= l["rtt_ms"] and l["mbit_s"] > 0
      for l in ls))')" = True
lab_run 1 "$SHOAL" status --state-dir "$T/s1" >"$T/status" 2>&1
check "shoal status prints the link matrix" grep -q "round trip median/p90 ms" "$T/status"
stop_all

# forced: pipeline at the same delay
start 2 --strategy pipeline
r=$(settled 2)
echo "  forced pipeline: $r; $(doc 'print((j.get("plan") or {}).get("reason"))')" >&2
check "--strategy pipeline forces a pipeline" test "$r" = "pipeline 2"
stop_all

# large delay: the agents measure it and leave tensor
lab_set 4000 1000
start 2
r=$(settled 2)
echo "  4 ms: $r; $(doc 'print((j.get("plan") or {}).get("reason"))')" >&2
# one node is "tensor" over 1 rank
check "4 ms one way: the plan is no longer tensor" test "${r% *}" != none -a \( "${r% *}" != tensor \
	-o "${r#* }" = 1 \)
stop_all

# a far slower 4th node: standby
lab_set 40 10000
start 4
r=$(settled 4)
sb=$(doc '
m = [x for x in j.get("members", []) if x["id"].startswith("ffff")]
print(m[0].get("role"), m[0].get("rank"), m[0].get("standby_reason", "")[:60] if m else "-")')
echo "  4 nodes: $r; the slow node: $sb" >&2
check "the slow 4th node is standby, not a rank" test "${sb%% *}" = standby
stop_all
rm -rf "$T"
done_tests
