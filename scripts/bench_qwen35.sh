#!/bin/sh
# bench_qwen35.sh: Qwen3.5-shaped hybrids generated once under $BUILD/bench/ (Q8_0, vocab 32000,
# dim 1024, 8 layers: 6 Gated DeltaNet + 2 gated full attention, 8 query / 2 KV heads of 128,
# DeltaNet 8 key and 16 value heads of 128): a dense one (FFN 4096) and a MoE one (32 experts of
# 512, 4 used, a gated shared expert of 512). Prints prefill and decode tok/s, the bytes a
# decoded token reads (weights, one sequence's recurrent state read and written, the KV cache)
# and decode GB/s as a fraction of the bound `shoal bench --bound` measures in the same run
# (target >= 0.8), then a dense llama of the same width for comparison.
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
DIR=$BUILD/bench
mkdir -p "$DIR"
COMMON="--dim 1024 --layers 8 --heads 8 --kv-heads 2 --head-dim 128 --vocab 32000 --type q8_0 --seed 1"
DN="--ssm-state 128 --ssm-k-heads 8 --ssm-v-heads 16"
gen() { # file, mkmodel arguments
	[ -s "$1" ] && return 0
	echo "(generating $1 once)" >&2
	f=$1
	shift
	$SHOAL mkmodel "$@" -o "$f" >/dev/null || exit 1
}
d=$DIR/qwen35-dense-q8_0.gguf
m=$DIR/qwen35moe-q8_0.gguf
l=$DIR/llama-qwen35width-q8_0.gguf
gen "$d" --arch qwen35 $COMMON $DN --ffn 4096 --name bench-qwen35
gen "$m" --arch qwen35moe $COMMON $DN --experts 32 --experts-used 4 --expert-ffn 512 \
	--shared-experts 1 --ffn 2048 --name bench-qwen35moe
gen "$l" --arch llama --dim 1024 --layers 8 --heads 8 --kv-heads 2 --ffn 4096 --vocab 32000 \
	--type q8_0 --seed 1 --name bench-llama-1024
for f in "$d" "$m" "$l"; do
	line=$($SHOAL bench --model "$f" --threads 2 --prompt 64 --gen 48 --bound) ||
		{ echo "$(basename "$f"): bench failed"; continue; }
	get() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
	printf '%-28s prefill %6s tok/s  decode %6s tok/s  %s B/token (kv %s)  %s GB/s = %s of bound %s GB/s\n' \
		"$(basename "$f" .gguf)" "$(get prefill_tok_s)" "$(get decode_tok_s)" \
		"$(get bytes_per_token)" "$(get kv_bytes_per_token)" "$(get decode_gb_s)" \
		"$(get of_bound)" "$(get bound_gb_s)"
done
$SHOAL info --model "$m" | sed -n 's/^deltanet: */  deltanet: /p'
echo "load while measuring: $(cut -d' ' -f1-3 /proc/loadavg)"
