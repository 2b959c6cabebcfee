#!/bin/sh
# bench_infer.sh: single-node inference figures on a ~0.85B Llama-shaped model (dim 2048, 16
# layers, 32 heads, 8 KV heads, FFN 5632, vocab 32000) in Q8_0 and Q4_0, generated once and
# cached under $BUILD/bench/. For 1 and 2 threads: prefill tok/s (128-token prompt), decode tok/s
# (64 tokens), weight bytes read per decoded token, the resulting GB/s, peak RSS.
# cpu% = CPU time the run got / (wall time x threads): below ~95% the machine was shared and the
# figures are low by about that factor. BENCH_THREADS / BENCH_TYPES override the lists.
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
DIR=$BUILD/bench
mkdir -p "$DIR"
TYPES=${BENCH_TYPES:-"q8_0 q4_0"}
THREADS=${BENCH_THREADS:-"1 2"}
printf '%-5s %7s %13s %12s %14s %6s %7s %8s %10s %9s\n' type threads prefill_tok/s \
	decode_tok/s bytes/token GB/s rss_MB file_MB prefill_cpu% decode_cpu%
for ty in $TYPES; do
	m=$DIR/llama-0.85b-$ty.gguf
	if [ ! -s "$m" ]; then
		echo "(generating $m once)" >&2
		$SHOAL mkmodel --arch llama --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 \
			--vocab 32000 --type "$ty" --seed 1 --name "bench-0.85b-$ty" -o "$m" || exit 1
	fi
	for t in $THREADS; do
		line=$($SHOAL bench --model "$m" --threads "$t" --prompt 128 --gen 64) || continue
		get() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
		pc=$(awk -v c="$(get prefill_cpu_s)" -v w="$(get prefill_wall_s)" -v t="$t" \
			'BEGIN { printf "%.0f", 100 * c / (w * t) }')
		dc=$(awk -v c="$(get decode_cpu_s)" -v w="$(get decode_wall_s)" -v t="$t" \
			'BEGIN { printf "%.0f", 100 * c / (w * t) }')
		printf '%-5s %7s %13s %12s %14s %6s %7s %8s %10s %9s\n' "$ty" "$t" \
			"$(get prefill_tok_s)" "$(get decode_tok_s)" "$(get bytes_per_token)" \
			"$(get decode_gb_s)" "$(get peak_rss_mb)" "$(get file_mb)" "$pc" "$dc"
	done
done
echo "llama.cpp on this machine class: decode 28/37 (q8_0, 1/2 threads), 40/59 (q4_0);" \
	"prefill 85/164 (q8_0), 132/197 (q4_0)"
