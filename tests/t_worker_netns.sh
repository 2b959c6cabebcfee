#!/bin/sh
# shoal worker across simulated hosts (network namespaces of tests/netns.sh, 10.77.0.x on one
# bridge): 2- and 3-rank tensor-parallel and a pipeline run print `shoal generate`'s greedy ids;
# the bridge capture of a run never carries the token; kill -9 of a rank on another host makes
# rank 0 fail with an error naming it. Needs root.
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
S=$SHARED/models/stories260K.gguf
Q=$T/qwen2.gguf
TOKEN="netns-$$-secret"
PROMPT="Once upon a time"
PORT=7100
$SHOAL mkmodel --arch qwen2 --dim 128 --layers 3 --heads 4 --kv-heads 2 --ffn 256 --vocab 512 \
	--seed 5 -o "$Q" >/dev/null
DS=$T/deepseek2.gguf
$SHOAL mkmodel --arch deepseek2 --dim 128 --layers 3 --heads 4 --ffn 256 --vocab 512 \
	--kv-lora 64 --q-lora 64 --qk-nope 32 --qk-rope 16 --v-head 32 --seed 5 -o "$DS" >/dev/null

if [ -r "$S" ]; then
	ns_same_ids "$S" "netns stories 2 hosts" 2 s2
	ns_same_ids "$S" "netns stories 3 hosts 2:1:1" 3 s3 --shares 2:1:1
else
	skip "stories260K: $S not found"
fi
ns_same_ids "$Q" "netns qwen2 3 hosts" 3 q3
ns_same_ids "$Q" "netns qwen2 pipeline 2 hosts" 2 qp --strategy pipeline
# deepseek2: query heads split, every host computes the latent itself
ns_same_ids "$DS" "netns deepseek2 3 hosts 2:1:1" 3 d3 --shares 2:1:1

# the bridge sees every byte between hosts: the token is never among them
ns_capture_start "$T/cap.pcap"
ns_same_ids "$Q" "netns captured run" 2 cap
ns_capture_stop
check "the capture saw the run" [ "$(stat -c %s "$T/cap.pcap")" -gt 2000 ]
check "no token bytes on the wire between hosts" sh -c '! grep -a -q "$1" "$2"' _ "$TOKEN" \
	"$T/cap.pcap"

done_tests
