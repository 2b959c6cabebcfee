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
NS_TOKENS=24 # ids per run (ns_workers, tests/netns.sh)

for arch in mixtral qwen2moe qwen3moe deepseek2; do
	M=$T/$arch.gguf
	$SHOAL mkmodel --arch $arch --dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 128 \
		--expert-ffn 64 --experts 8 --experts-used 2 --vocab 512 --seed 3 -o "$M" >/dev/null
	ns_same_ids "$M" "netns $arch 2 hosts 2:1" 2 "${arch}2" --shares 2:1
	ns_same_ids "$M" "netns $arch 3 hosts 2:1:1" 3 "${arch}3" --shares 2:1:1
	ns_same_ids "$M" "netns $arch pipeline 2 hosts" 2 "${arch}p" --strategy pipeline
done

done_tests
