#!/bin/sh
# bench_gptoss.sh: a gpt-oss-shaped model of about 0.6B parameters (dim 1024, 8 layers, 16 heads
# of 64, 4 KV heads, 32 experts of FFN 1024 with 4 used, sliding window 128 on every other layer,
# vocab 32000), generated once under $BUILD/bench/ in two forms: MXFP4 experts with F16
# elsewhere (as the converter writes gpt-oss) and Q8_0 throughout. Prints prefill and decode
# tok/s, the weight bytes a decoded token reads, and decode's fraction of the streaming
# bandwidth measured between its own steps (`shoal bench --bound`: of_bound; target >= 0.8 on a
# quiet machine) and the CPU seconds decode got in its wall-clock seconds (on a shared host the
# difference is time lost to other processes).
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
DIR=$BUILD/bench
GEN=${BENCH_GPTOSS_GEN:-64}
mkdir -p "$DIR"
for t in mxfp4 q8_0; do
	m=$DIR/gptoss-0.6b-$t.gguf
	if [ ! -s "$m" ]; then
		echo "(generating $m once)" >&2
		$SHOAL mkmodel --arch gpt-oss --dim 1024 --layers 8 --heads 16 --kv-heads 4 \
			--head-dim 64 --ffn 1024 --experts 32 --experts-used 4 --vocab 32000 \
			--type "$t" --seed 1 --name "bench-gptoss-0.6b-$t" -o "$m" || exit 1
	fi
	line=$($SHOAL bench --model "$m" --threads 2 --prompt 128 --gen "$GEN" --bound) ||
		{ echo "bench failed"; exit 1; }
	get() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
	printf '%s: prefill %s tok/s, decode %s tok/s (2 threads), %s weight bytes/token, ' \
		"$(basename "$m")" "$(get prefill_tok_s)" "$(get decode_tok_s)" \
		"$(($(get bytes_per_token) - $(get kv_bytes_per_token)))"
	printf 'decode %s GB/s = %s of the %s GB/s streamed between its steps; cpu %s s of %s s\n' \
		"$(get decode_gb_s)" "$(get of_bound)" "$(get bound_gb_s)" "$(get decode_cpu_s)" \
		"$(get decode_wall_s)"
done
