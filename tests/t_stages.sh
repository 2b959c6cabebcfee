#!/bin/sh
# Hybrid plans run by `shoal worker` ranks (processes on loopback): a plan from `shoal plan
# --strategy hybrid` (3 nodes with measured compute and links: a tensor group of 2 ranks and a
# stage of 1) prints exactly `shoal generate`'s greedy ids (a generated qwen2-shaped model,
# stories260K), and every rank logs its hybrid share; a pipeline plan too. --strategy
# hybrid without a plan is a usage error. A rank of the tensor group or the last stage killed
# (-9) during generation makes rank 0 exit with an error naming a rank (bounded by
# --step-timeout, never a hang).
. tests/lib.sh

T=$(mktemp -d /tmp/shoal-tstages.XXXXXX)
PIDS=""
cleanup() {
	for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
	rm -rf "$T"
}
trap cleanup EXIT
S=$SHARED/models/stories260K.gguf
Q=$T/qwen2.gguf
BIG=$T/big.gguf
PROMPT="Once upon a time"
# below the ephemeral range (32768-, where an outgoing connection may hold the port)
BASE=$((20000 + ($$ % 400) * 25 + 2000))
ROUND=0
TOKEN="tstages-$$-secret"

$SHOAL mkmodel --arch qwen2 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ffn 256 --vocab 512 \
	--seed 5 -o "$Q" >/dev/null

# a view of N nodes on loopback with measured compute and links (docs/view.md), so that the
# planner can make hybrid plans
A=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa B=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb C=cccccccccccccccccccccccccccccccc
node() {
	id=$1 h=$2
	shift 2
	l=""
	for p in "$@"; do l="$l${l:+,}{\"node_id\":\"$p\",\"rtt_us\":100,\"mbps\":1000}"; done
	printf '{"node_id":"%s","host":"%s","mem_avail":8589934592,"bw":10,"threads":1,' "$id" "$h"
	printf '"addresses":[{"ip":"127.0.0.1","ifname":"lo"}],"links":[%s]}' "$l"
}
printf '{"epoch":5,"nodes":[%s,%s,%s]}\n' "$(node $A h1 $B $C)" "$(node $B h2 $A $C)" \
	"$(node $C h3 $A $B)" >"$T/view.json"

# plan MODEL STRATEGY: writes $T/plan-STRATEGY/plan.json on this round's ports
plan() {
	ROUND=$((ROUND + 1))
	$SHOAL plan --view "$T/view.json" --model "$1" --strategy "$2" \
		--base-port $((BASE + ROUND * 4)) --out "$T/plan-$2" >"$T/plan-$2.txt"
}

# ranks MODEL PLAN [rank 0 flags]: ranks 1..N-1 in the background, rank 0 in the foreground
# (stdout to $T/out, each rank's stderr to $T/eR)
ranks() {
	m=$1 p=$2
	shift 2
	n=$(grep -c '"rank":' "$p")
	r=1
	while [ $r -lt "$n" ]; do
		$SHOAL worker --rank $r --token "$TOKEN" --model "$m" --plan "$p" --threads 1 \
			--join-timeout 20000 2>"$T/e$r" &
		PIDS="$PIDS $!"
		r=$((r + 1))
	done
	timeout 60 $SHOAL worker --rank 0 --token "$TOKEN" --model "$m" --plan "$p" --threads 1 \
		--join-timeout 20000 "$@" >"$T/out" 2>"$T/e0"
	rc=$?
	for w in $PIDS; do wait "$w"; done
	PIDS=""
	return $rc
}

# same_ids MODEL STRATEGY DESCRIPTION
same_ids() {
	m=$1 st=$2 d=$3
	want=$($SHOAL generate --model "$m" --prompt "$PROMPT" --max-tokens 40 --ids --threads 1)
	if ! plan "$m" "$st"; then
		fail "$d: no plan"
		return
	fi
	if ranks "$m" "$T/plan-$st/plan.json" --prompt "$PROMPT" --max-tokens 40 --ids; then
		check "$d: same greedy ids as one rank" [ "$(cat "$T/out")" = "$want" ]
	else
		fail "$d: exit code ($(tail -1 "$T/e0"))"
	fi
}

same_ids "$Q" hybrid "qwen2, hybrid plan"
check "the plan is a hybrid of 2 stages" grep -q "strategy hybrid" "$T/plan-hybrid.txt"
check "rank 0 runs a hybrid share of 2 stages" grep -q "rank 0/3: hybrid share.*2 stages" "$T/e0"
check "rank 1 runs a hybrid share" grep -q "rank 1/3: hybrid share" "$T/e1"
check "rank 2 runs a hybrid share" grep -q "rank 2/3: hybrid share" "$T/e2"
same_ids "$Q" pipeline "qwen2, pipeline plan"
check "rank 0 runs a pipeline share, a stage per rank" \
	grep -q "rank 0/\([0-9]\): pipeline share.* \1 stages" "$T/e0"
if [ -r "$S" ]; then
	same_ids "$S" hybrid "stories260K, hybrid plan"
	PROMPT=$(printf 'Once upon a time, there was a little girl named Lily. %.0s' 1 2 3 4 5 6)
	same_ids "$S" hybrid "stories260K, hybrid plan, prompt of several 64-row batches"
	PROMPT="Once upon a time"
else
	skip "stories260K: $S not found"
fi

$SHOAL worker --rank 0 --world 3 --peers 127.0.0.1:1,127.0.0.1:2,127.0.0.1:3 --token x \
	--model "$Q" --strategy hybrid 2>"$T/err"
check "--strategy hybrid without a plan is a usage error" [ $? -eq 2 ]
check "--strategy hybrid without a plan says to give one" grep -q -- "--plan" "$T/err"

# a rank killed during generation: rank 0 fails the step with an error
$SHOAL mkmodel --dim 512 --layers 8 --heads 8 --kv-heads 4 --ffn 1536 --vocab 2000 --ctx 4096 \
	-o "$BIG" >/dev/null
plan "$BIG" hybrid
grep "^stage" "$T/plan-hybrid.txt" | sed 's/^/  /'
for victim in 1 2; do
	p=$T/plan-hybrid/plan.json
	rm -f "$T/out"
	W=""
	for r in 1 2; do
		$SHOAL worker --rank $r --token "$TOKEN" --model "$BIG" --plan "$p" --threads 1 \
			--step-timeout 1500 --join-timeout 20000 2>"$T/e$r" &
		W="$W $!"
		[ $r -eq $victim ] && V=$!
	done
	PIDS=$W
	timeout 60 $SHOAL worker --rank 0 --token "$TOKEN" --model "$BIG" --plan "$p" --threads 1 \
		--step-timeout 1500 --join-timeout 20000 --ctx 4096 --prompt "$PROMPT" \
		--max-tokens 4000 --ignore-eos --ids >"$T/out" 2>"$T/e0" &
	R=$!
	i=0
	while [ ! -s "$T/out" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
	sleep 0.3
	kill -9 "$V"
	t0=$(date +%s%N)
	wait $R
	rc=$?
	t1=$(date +%s%N)
	echo "  rank $victim killed: rank 0 exited $rc after $(((t1 - t0) / 1000000)) ms" \
		"(step timeout 1500 ms): $(grep -v ' info ' "$T/e0" | tail -1)"
	check "rank $victim killed in a hybrid group: rank 0 exits with an error" [ $rc -eq 1 ]
	check "rank $victim killed: the error names a rank" grep -q "rank [0-9]" "$T/e0"
	for w in $W; do
		kill -9 "$w" 2>/dev/null
		wait "$w" 2>/dev/null
	done
	PIDS=""
done

done_tests
