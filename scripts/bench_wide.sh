#!/bin/sh
# bench_wide.sh: the newer families at the layer widths of their released checkpoints, against
# the machine's bandwidth bound. bench_models.sh, bench_qwen35.sh and bench_gptoss.sh use ~0.5B
# files of width 1024-1152, whose layers are so small that the fixed cost of each layer (its
# dispatches to the threads, the norms, the router) is a large part of a token; a released model
# reads 10-50x more bytes per layer for the same fixed cost. Each file here has a released
# model's widths (hidden size, heads, expert and FFN sizes, experts used per token) but only 4
# layers and fewer experts in the file (the bytes a token reads count the experts it uses, so
# the fraction of the bound does not depend on how many it does not), generated once under
# $BUILD/bench/ (Q8_0, gpt-oss also MXFP4 as its converter writes it; vocab 32000):
#   qwen35moe  Qwen3.5-35B-A3B's: dim 2048, 16 query / 2 KV heads of 256, DeltaNet 16 key and
#              32 value heads of 128, 8 of 64 experts of 512 + a gated shared expert of 512
#   qwen35     the same backbone with a dense FFN of 6144
#   glm4moe    GLM-4.5-Air's: dim 4096, 96 query / 8 KV heads of 128, 8 of 16 experts of 1408
#              + a shared one, the first layer dense (FFN 10944)
#   gpt-oss    gpt-oss-20b's: dim 2880, 64 query / 8 KV heads of 64, 4 of 8 experts of 2880,
#              sliding window 128 on every other layer
# Each line: `shoal bench --bound` (2 threads, 64-token prompt, 96 decoded): decode tok/s, the
# bytes a token reads, GB/s, the streaming bandwidth measured between the decode steps and
# decode's fraction of it (of_bound; target >= 0.8). Printed, never asserted.
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
DIR=$BUILD/bench
mkdir -p "$DIR"
gen() { # file, mkmodel arguments
	[ -s "$1" ] && return 0
	echo "(generating $1 once)" >&2
	f=$1
	shift
	$SHOAL mkmodel "$@" --layers 4 --vocab 32000 --seed 1 -o "$f" >/dev/null || rm -f "$f"
}
Q35="--dim 2048 --heads 16 --kv-heads 2 --head-dim 256 --ssm-state 128 --ssm-k-heads 16 --ssm-v-heads 32"
gen "$DIR/wide-qwen35moe-q8_0.gguf" --arch qwen35moe $Q35 --experts 64 --experts-used 8 \
	--expert-ffn 512 --shared-experts 1 --ffn 512 --type q8_0 --name bench-wide-qwen35moe
gen "$DIR/wide-qwen35-q8_0.gguf" --arch qwen35 $Q35 --ffn 6144 --type q8_0 --name bench-wide-qwen35
gen "$DIR/wide-glm4moe-q8_0.gguf" --arch glm4moe --dim 4096 --heads 96 --kv-heads 8 --head-dim 128 \
	--ffn 10944 --experts 16 --experts-used 8 --expert-ffn 1408 --type q8_0 \
	--name bench-wide-glm4moe
for t in mxfp4 q8_0; do
	gen "$DIR/wide-gptoss-$t.gguf" --arch gpt-oss --dim 2880 --heads 64 --kv-heads 8 \
		--head-dim 64 --ffn 2880 --experts 8 --experts-used 4 --type "$t" \
		--name "bench-wide-gptoss-$t"
done
get() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
printf '%-22s %9s %9s %13s %9s %9s %9s\n' model prefill decode bytes/token GB/s bound of_bound
for f in "$DIR"/wide-qwen35moe-q8_0.gguf "$DIR"/wide-qwen35-q8_0.gguf \
	"$DIR"/wide-glm4moe-q8_0.gguf "$DIR"/wide-gptoss-mxfp4.gguf "$DIR"/wide-gptoss-q8_0.gguf; do
	[ -s "$f" ] || { echo "$(basename "$f"): not generated"; continue; }
	l=$($SHOAL bench --model "$f" --threads 2 --prompt 64 --gen 96 --bound) ||
		{ echo "$(basename "$f"): bench failed"; continue; }
	printf '%-22s %9s %9s %13s %9s %9s %9s\n' "$(basename "$f" .gguf | sed 's/^wide-//')" \
		"$(get "$l" prefill_tok_s)" "$(get "$l" decode_tok_s)" "$(get "$l" bytes_per_token)" \
		"$(get "$l" decode_gb_s)" "$(get "$l" bound_gb_s)" "$(get "$l" of_bound)"
done
echo "load while measuring: $(cut -d' ' -f1-3 /proc/loadavg)"
