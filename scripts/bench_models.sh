#!/bin/sh
# bench_models.sh: decode of the newer families against the machine's bandwidth bound, on
# generated files cached under $BUILD/bench/ (Q8_0, vocab 32000):
#   gemma3   ~0.4B Gemma-3-1B-shaped: dim 1152, 13 layers (sliding window 512 on 5 of every 6),
#            4 heads of 256, 1 KV head, FFN 6912, tied head
#   glm4moe  ~0.5B GLM-4.5-Air-shaped: dim 1024, 8 layers (the first dense, FFN 2816), 8 heads
#            of 128, 2 KV heads, 32 experts of 512 (4 used) + 1 shared, one NextN layer
# Each line: `shoal bench --bound` (2 threads, 128-token prompt, 64 decoded): decode tok/s, the
# bytes a token reads (weights: every matrix once, k/E of the experts; the KV cache up to the
# position, an SWA layer at most its window), GB/s from them, the streaming bandwidth measured
# between the decode steps and decode's fraction of it (of_bound; target >= 0.8). Printed, never
# asserted.
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
DIR=$BUILD/bench
mkdir -p "$DIR"
g=$DIR/gemma3-0.4b-q8_0.gguf
z=$DIR/glm4moe-0.5b-q8_0.gguf
if [ ! -s "$g" ]; then
	echo "(generating $g once)" >&2
	$SHOAL mkmodel --arch gemma3 --dim 1152 --layers 13 --heads 4 --kv-heads 1 --head-dim 256 \
		--ffn 6912 --vocab 32000 --sliding-window 512 --type q8_0 --seed 1 \
		--name bench-gemma3-0.4b-q8_0 -o "$g" || exit 1
fi
if [ ! -s "$z" ]; then
	echo "(generating $z once)" >&2
	$SHOAL mkmodel --arch glm4moe --dim 1024 --layers 8 --heads 8 --kv-heads 2 --head-dim 128 \
		--ffn 2816 --experts 32 --experts-used 4 --expert-ffn 512 --nextn 1 --vocab 32000 \
		--type q8_0 --seed 1 --name bench-glm4moe-0.5b-q8_0 -o "$z" || exit 1
fi
get() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
printf '%-8s %9s %9s %13s %9s %9s %9s %8s\n' family prefill decode bytes/token GB/s bound \
	of_bound rss_MB
for m in "$g" "$z"; do
	l=$($SHOAL bench --model "$m" --threads 2 --prompt 128 --gen 64 --bound) ||
		{ echo "$(basename "$m"): bench failed"; continue; }
	printf '%-8s %9s %9s %13s %9s %9s %9s %8s\n' "$(basename "$m" | cut -d- -f1)" \
		"$(get "$l" prefill_tok_s)" "$(get "$l" decode_tok_s)" "$(get "$l" bytes_per_token)" \
		"$(get "$l" decode_gb_s)" "$(get "$l" bound_gb_s)" "$(get "$l" of_bound)" \
		"$(get "$l" peak_rss_mb)"
done
