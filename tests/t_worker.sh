#!/bin/sh
# shoal worker on loopback, ranks as processes: 2- and 3-rank tensor-parallel and pipeline runs
# (even and unequal shares, short, long and multi-batch prompts, from `shoal plan`'s plan.json)
# print exactly `shoal generate`'s greedy ids and text (stories260K and a generated qwen2-shaped
# model); --stats and --q8-wire; mismatched shares or another model file fail the setup on both
# sides; a rank with another token cannot join (error on both sides); kill -9 and SIGSTOP of a
# rank during generation make rank 0 fail the step (bounded by --step-timeout, never a hang), and
# a killed rank 0 makes the worker fail; the RDMA device matrix falls back to TCP with a logged
# reason; a captured 2-rank run never carries the token's bytes.
. tests/lib.sh

T=$(mktemp -d /tmp/shoal-tworker.XXXXXX)
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
# a port range of our own on loopback (other tests may run in parallel)
# (below 32768: Linux hands out ephemeral client ports above it, which would collide)
BASE=$((20000 + ($$ % 400) * 25))
ROUND=0
TOKEN="tworker-$$-secret"

# peers N: "127.0.0.1:P0,..." for this round's ports
peers() {
	p="" r=0
	while [ $r -lt "$1" ]; do
		p="$p${p:+,}127.0.0.1:$((BASE + ROUND * 4 + r))"
		r=$((r + 1))
	done
	echo "$p"
}

# group MODEL N [worker flags...] -- [rank 0 flags...]: runs ranks 1..N-1 in the background and
# rank 0 in the foreground; rank 0's stdout goes to $T/out, each rank's stderr to $T/eR.
group() {
	m=$1 n=$2
	shift 2
	ROUND=$((ROUND + 1))
	P=$(peers "$n")
	wf=""
	while [ $# -gt 0 ] && [ "$1" != "--" ]; do wf="$wf $1"; shift; done
	[ "$1" = "--" ] && shift
	r=1
	while [ $r -lt "$n" ]; do
		$SHOAL worker --rank $r --world "$n" --peers "$P" --token "$TOKEN" --model "$m" \
			--threads 1 --join-timeout 20000 $wf 2>"$T/e$r" &
		PIDS="$PIDS $!"
		r=$((r + 1))
	done
	timeout 60 $SHOAL worker --rank 0 --world "$n" --peers "$P" --token "$TOKEN" --model "$m" \
		--threads 1 --join-timeout 20000 $wf "$@" >"$T/out" 2>"$T/e0"
	rc=$?
	for p in $PIDS; do wait "$p"; done
	PIDS=""
	return $rc
}

# same_ids MODEL DESCRIPTION N [worker flags...]
same_ids() {
	m=$1 d=$2 n=$3
	shift 3
	want=$($SHOAL generate --model "$m" --prompt "$PROMPT" --max-tokens 40 --ids --threads 1)
	if group "$m" "$n" "$@" -- --prompt "$PROMPT" --max-tokens 40 --ids; then
		check "$d: same greedy ids as one rank" [ "$(cat "$T/out")" = "$want" ]
	else
		fail "$d: exit code $(cat "$T/e0")"
	fi
}

$SHOAL mkmodel --arch qwen2 --dim 128 --layers 3 --heads 4 --kv-heads 2 --ffn 256 --vocab 512 \
	--seed 5 -o "$Q" >/dev/null

if [ -r "$S" ]; then
	same_ids "$S" "stories 2 ranks" 2
	same_ids "$S" "stories 3 ranks" 3
	same_ids "$S" "stories 3:1" 2 --shares 3:1
	same_ids "$S" "stories 2:1:1" 3 --shares 2:1:1
	same_ids "$S" "stories pipeline 2" 2 --strategy pipeline
	same_ids "$S" "stories pipeline 2:1:1" 3 --strategy pipeline --shares 2:1:1
	# a prompt longer than a STEP carries inline (its ids follow in a second message)
	PROMPT="Once upon a time, there was a little girl named Lily who loved to play"
	same_ids "$S" "stories 2 ranks, long prompt" 2
	same_ids "$S" "stories pipeline 3, long prompt" 3 --strategy pipeline
	# longer than one forward batch (64 tokens): several batches per step
	PROMPT=$(printf 'Once upon a time, there was a little girl named Lily. %.0s' 1 2 3 4 5 6)
	same_ids "$S" "stories 2 ranks, prompt of several batches" 2
	same_ids "$S" "stories pipeline 2:1:1, prompt of several batches" 3 --strategy pipeline \
		--shares 2:1:1
	PROMPT="Once upon a time"
	# rank 0 prints exactly what shoal generate prints
	want=$($SHOAL generate --model "$S" --prompt "$PROMPT" --max-tokens 40 --threads 1)
	group "$S" 2 -- --prompt "$PROMPT" --max-tokens 40
	check "stories 2 ranks: same text as shoal generate" [ "$(cat "$T/out")" = "$want" ]
	group "$S" 2 --stats -- --prompt "$PROMPT" --max-tokens 8 --stats
	check "--stats on rank 0 prints communication figures" grep -q "bytes sent per token" "$T/e0"
	check "--stats on rank 1 prints communication figures" grep -q "bytes sent per token" "$T/e1"
else
	skip "stories260K: $S not found"
fi
same_ids "$Q" "qwen2 2 ranks" 2
same_ids "$Q" "qwen2 3 ranks (KV heads replicated)" 3
same_ids "$Q" "qwen2 3:1" 2 --shares 3:1
same_ids "$Q" "qwen2 2:1:1" 3 --shares 2:1:1
same_ids "$Q" "qwen2 pipeline 3" 3 --strategy pipeline

# with a plan from `shoal plan` (tensor and pipeline): shares, strategy and addresses from it
A=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa B=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
nd() { printf '{"node_id":"%s","host":"%s","mem_avail":8589934592,"addresses":[{"ip":"127.0.0.1","ifname":"lo"}]}' "$1" "$2"; }
printf '{"epoch":3,"nodes":[%s,%s]}\n' "$(nd $A h1)" "$(nd $B h2)" >"$T/view.json"
want=$($SHOAL generate --model "$Q" --prompt "$PROMPT" --max-tokens 40 --ids --threads 1)
for st in tensor pipeline; do
	ROUND=$((ROUND + 1))
	$SHOAL plan --view "$T/view.json" --model "$Q" --strategy $st --base-port $((BASE + ROUND * 4)) \
		--out "$T/plan-$st" >/dev/null
	check "plan ($st) written" [ -s "$T/plan-$st/plan.json" ]
	$SHOAL worker --rank 1 --token "$TOKEN" --model "$Q" --plan "$T/plan-$st/plan.json" \
		--threads 1 2>"$T/e1" &
	W=$!
	got=$($SHOAL worker --rank 0 --token "$TOKEN" --model "$Q" --plan "$T/plan-$st/plan.json" \
		--threads 1 --prompt "$PROMPT" --max-tokens 40 --ids 2>"$T/e0")
	wait $W
	check "--plan ($st): same greedy ids as one rank" [ "$got" = "$want" ]
	check "--plan ($st): the rank uses the plan's strategy" grep -q "rank 0/2: $st share" "$T/e0"
done

# RDMA: a device matrix naming a device this machine does not have -> TCP, with the reason
printf '[[null, "rxe_nope"], ["rxe_nope", null]]\n' >"$T/rdma.json"
same_ids "$Q" "qwen2 2 ranks with an RDMA matrix (TCP fallback)" 2 --rdma-devices "$T/rdma.json"
check "the RDMA fallback is logged with a reason" grep -q "rank 1 uses TCP: ." "$T/e0"

# 8-bit activations on the wire: runs to the end (ids may differ slightly from one rank's)
if group "$Q" 2 --q8-wire --stats -- --prompt "$PROMPT" --max-tokens 40 --ids --stats; then
	check "--q8-wire: 40 ids" [ "$(wc -w <"$T/out")" -eq 40 ]
	b=$(sed -n 's/.* \([0-9]*\) bytes sent per token/\1/p' "$T/e1")
	check "--q8-wire: fewer bytes than f32 (2 x 3 x 128 x 4 = 3072 per token)" [ "${b:-99999}" -lt 1500 ]
else
	fail "--q8-wire run: $(tail -1 "$T/e0")"
fi

# the token from SHOAL_TOKEN (rank 1) and from a file (rank 0)
ROUND=$((ROUND + 1))
P=$(peers 2)
printf '%s\n' "$TOKEN" >"$T/token"
want=$($SHOAL generate --model "$Q" --prompt "$PROMPT" --max-tokens 20 --ids --threads 1)
SHOAL_TOKEN="$TOKEN" $SHOAL worker --rank 1 --world 2 --peers "$P" --model "$Q" --threads 1 \
	2>"$T/e1" &
W=$!
got=$($SHOAL worker --rank 0 --world 2 --peers "$P" --token-file "$T/token" --model "$Q" \
	--threads 1 --prompt "$PROMPT" --max-tokens 20 --ids 2>"$T/e0")
wait $W
check "SHOAL_TOKEN and --token-file: same ids" [ "$got" = "$want" ]

# usage errors
$SHOAL worker --rank 2 --world 2 --peers 127.0.0.1:1,127.0.0.1:2 --token x --model "$Q" \
	2>/dev/null
check "rank >= world is a usage error" [ $? -eq 2 ]
$SHOAL worker --rank 0 --world 2 --peers 127.0.0.1:1 --token x --model "$Q" 2>/dev/null
check "too few peers is a usage error" [ $? -eq 2 ]
$SHOAL worker --rank 0 --world 2 --peers 127.0.0.1:1,127.0.0.1:2 --model "$Q" 2>/dev/null \
	</dev/null
check "no token is a usage error" [ $? -eq 2 ]
$SHOAL worker --help | grep -q "usage: shoal worker"
check "--help prints usage" [ $? -eq 0 ]

# mismatched shares between ranks: both sides refuse at setup
ROUND=$((ROUND + 1))
P=$(peers 2)
$SHOAL worker --rank 1 --world 2 --peers "$P" --token "$TOKEN" --model "$Q" --shares 3:1 \
	--join-timeout 20000 2>"$T/e1" &
W=$!
$SHOAL worker --rank 0 --world 2 --peers "$P" --token "$TOKEN" --model "$Q" --shares 1:1 \
	--join-timeout 20000 --prompt hi --max-tokens 2 >/dev/null 2>"$T/e0"
check "mismatched shares: rank 0 fails" [ $? -eq 1 ]
wait $W
check "mismatched shares: rank 1 fails" [ $? -eq 1 ]
check "mismatched shares: rank 0 says why" grep -q "share" "$T/e0"

# another model file of the same shape (other weights): both sides refuse at setup
$SHOAL mkmodel --arch qwen2 --dim 128 --layers 3 --heads 4 --kv-heads 2 --ffn 256 --vocab 512 \
	--seed 6 -o "$T/qwen2-other.gguf" >/dev/null
ROUND=$((ROUND + 1))
P=$(peers 2)
$SHOAL worker --rank 1 --world 2 --peers "$P" --token "$TOKEN" --model "$T/qwen2-other.gguf" \
	--join-timeout 20000 2>"$T/e1" &
W=$!
$SHOAL worker --rank 0 --world 2 --peers "$P" --token "$TOKEN" --model "$Q" \
	--join-timeout 20000 --prompt hi --max-tokens 2 >/dev/null 2>"$T/e0"
check "another model file: rank 0 fails" [ $? -eq 1 ]
wait $W
check "another model file: rank 1 fails" [ $? -eq 1 ]
check "another model file: rank 1 says the file differs" grep -q "model file differs" "$T/e1"
check "another model file: rank 0 names rank 1" grep -q "rank 1 rejected" "$T/e0"

# a rank with another token cannot join; both sides say so
ROUND=$((ROUND + 1))
P=$(peers 2)
$SHOAL worker --rank 1 --world 2 --peers "$P" --token "other-$TOKEN" --model "$Q" \
	--join-timeout 4000 2>"$T/e1" &
W=$!
$SHOAL worker --rank 0 --world 2 --peers "$P" --token "$TOKEN" --model "$Q" \
	--join-timeout 4000 --prompt hi --max-tokens 2 >/dev/null 2>"$T/e0"
check "wrong token: rank 0 fails" [ $? -eq 1 ]
wait $W
check "wrong token: rank 1 fails" [ $? -eq 1 ]
check "wrong token: rank 0 names the token" grep -q "token" "$T/e0"
check "wrong token: rank 1 names the token" grep -q "token" "$T/e1"

# a rank killed (-9) or stopped during generation: rank 0 fails the step with an error
$SHOAL mkmodel --dim 512 --layers 8 --heads 8 --kv-heads 4 --ffn 1536 --vocab 2000 --ctx 4096 \
	-o "$BIG" >/dev/null
for sig in KILL STOP; do
	ROUND=$((ROUND + 1))
	P=$(peers 2)
	rm -f "$T/out"
	$SHOAL worker --rank 1 --world 2 --peers "$P" --token "$TOKEN" --model "$BIG" --threads 1 \
		--step-timeout 1500 --join-timeout 20000 2>"$T/e1" &
	W=$!
	PIDS=$W
	timeout 60 $SHOAL worker --rank 0 --world 2 --peers "$P" --token "$TOKEN" --model "$BIG" \
		--threads 1 --step-timeout 1500 --join-timeout 20000 --ctx 4096 --prompt "$PROMPT" \
		--max-tokens 4000 --ignore-eos --ids >"$T/out" 2>"$T/e0" &
	R=$!
	# wait until tokens flow, then hit rank 1
	i=0
	while [ ! -s "$T/out" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
	sleep 0.3
	kill -$sig $W
	t0=$(date +%s%N)
	wait $R
	rc=$?
	t1=$(date +%s%N)
	echo "  SIG$sig: rank 0 exited $rc after $(((t1 - t0) / 1000000)) ms (step timeout 1500 ms)"
	check "SIG$sig of rank 1: rank 0 exits with an error (not a hang, not a crash)" [ $rc -eq 1 ]
	check "SIG$sig of rank 1: the error names rank 1" grep -q "rank 1" "$T/e0"
	kill -9 $W 2>/dev/null
	wait $W 2>/dev/null
	PIDS=""
done

# rank 0 killed during generation: the worker leaves with an error naming rank 0
ROUND=$((ROUND + 1))
P=$(peers 2)
rm -f "$T/out"
$SHOAL worker --rank 1 --world 2 --peers "$P" --token "$TOKEN" --model "$BIG" --threads 1 \
	--step-timeout 1500 --join-timeout 20000 2>"$T/e1" &
W=$!
$SHOAL worker --rank 0 --world 2 --peers "$P" --token "$TOKEN" --model "$BIG" --threads 1 \
	--step-timeout 1500 --join-timeout 20000 --ctx 4096 --prompt "$PROMPT" --max-tokens 4000 \
	--ignore-eos --ids >"$T/out" 2>"$T/e0" &
R=$!
PIDS="$W $R"
i=0
while [ ! -s "$T/out" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
kill -9 $R
wait $R 2>/dev/null
wait $W
rc=$?
PIDS=""
check "rank 0 killed: the worker exits with an error" [ $rc -eq 1 ]
check "rank 0 killed: the worker names rank 0" grep -q "rank 0" "$T/e1"

# no token bytes on the wire (root: tcpdump on lo)
if [ "$(id -u)" != 0 ] || ! command -v tcpdump >/dev/null; then
	skip "capture: needs root and tcpdump"
else
	ROUND=$((ROUND + 1))
	lo=$((BASE + ROUND * 4))
	tcpdump -i lo -U -w "$T/cap.pcap" "tcp portrange $lo-$((lo + 1))" 2>/dev/null &
	TD=$!
	sleep 1
	ROUND=$((ROUND - 1))
	same_ids "$Q" "captured 2-rank run" 2
	sleep 0.5
	kill $TD
	wait $TD 2>/dev/null
	check "the capture saw the run" [ "$(stat -c %s "$T/cap.pcap")" -gt 2000 ]
	check "no token bytes on the wire" sh -c '! grep -a -q "$1" "$2"' _ "$TOKEN" "$T/cap.pcap"
fi

done_tests
