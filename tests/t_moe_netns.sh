#!/bin/sh
# Mixture-of-experts models across simulated hosts (network namespaces of tests/netns.sh):
# `shoal worker` with the routed experts split whole over 2 and 3 hosts (2:1 and 2:1:1 shares)
# and in pipeline mode prints the same greedy ids as one rank, for each architecture
# `shoal mkmodel` generates with experts. Needs root.
. tests/lib.sh

if [ "$(id -u)" != 0 ]; then
	skip "network namespaces need root"
	done_tests
	exit $?
fi
. tests/netns.sh
if ! ns_setup 3; then
	skip "could not set up network namespaces"
	done_tests
	exit $?
fi
T=$NS_ROOT/work
mkdir -p "$T"
TOKEN="moe-netns-$$-secret"
PROMPT="Once upon a time"
PORT=7300

# run_hosts MODEL N NAME [flags...]: rank 0 on host 1, ranks 1..N-1 on hosts 2..N.
run_hosts() {
	m=$1 n=$2 name=$3
	shift 3
	PORT=$((PORT + 1))
	P="" r=1
	while [ $r -le "$n" ]; do P="$P${P:+,}$(ns_ip $r):$PORT"; r=$((r + 1)); done
	r=1
	while [ $r -lt "$n" ]; do
		ns_start $((r + 1)) "$name" $SHOAL worker --rank $r --world "$n" --peers "$P" \
			--token "$TOKEN" --model "$m" --threads 1 --join-timeout 20000 "$@"
		r=$((r + 1))
	done
	ns_exec 1 timeout 60 $SHOAL worker --rank 0 --world "$n" --peers "$P" --token "$TOKEN" \
		--model "$m" --threads 1 --join-timeout 20000 "$@" --prompt "$PROMPT" \
		--max-tokens 24 --ids >"$T/$name.out" 2>"$T/$name.err"
}

same_ids() {
	m=$1 d=$2 n=$3 name=$4
	shift 4
	want=$($SHOAL generate --model "$m" --prompt "$PROMPT" --max-tokens 24 --ids --threads 1)
	if run_hosts "$m" "$n" "$name" "$@"; then
		check "$d: same greedy ids as one rank" [ "$(cat "$T/$name.out")" = "$want" ]
	else
		fail "$d: rank 0 failed: $(tail -1 "$T/$name.err")"
	fi
}

for arch in mixtral qwen2moe qwen3moe deepseek2; do
	M=$T/$arch.gguf
	$SHOAL mkmodel --arch $arch --dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 128 \
		--expert-ffn 64 --experts 8 --experts-used 2 --vocab 512 --seed 3 -o "$M" >/dev/null
	same_ids "$M" "netns $arch 2 hosts 2:1" 2 "${arch}2" --shares 2:1
	same_ids "$M" "netns $arch 3 hosts 2:1:1" 3 "${arch}3" --shares 2:1:1
	same_ids "$M" "netns $arch pipeline 2 hosts" 2 "${arch}p" --strategy pipeline
done

done_tests
