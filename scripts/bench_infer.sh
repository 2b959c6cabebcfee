#!/bin/sh
# bench_infer.sh: single-node inference figures on a ~0.85B Llama-shaped model (dim 2048, 16
# layers, 32 heads, 8 KV heads, FFN 5632, vocab 32000, seed 7) in each of BENCH_TYPES (default
# q8_0 q4_0 q4_k q6_k), generated once and cached under $BUILD/bench/.
# Per type and thread count: decode tok/s, 64 tokens from an empty cache as llama-bench's tg64
# is (examples/llama-bench/llama-bench.cpp, test_gen: the cache cleared, then n_gen one-token
# decodes from position 0), best of DEC_REPS runs (default 3) alternating with llama.cpp's
# when it runs; its bound: decode reads every weight byte once per token and the KV cache up to
# its position, so the streaming read bandwidth / those bytes bounds it. The bandwidth is taken
# twice: `shoal bench --bound` streams 256 MiB between every two decode steps of the run itself
# (bound, of_bound: the bandwidth of those very seconds), and `shoal bench --membw` right
# after it (peak_bw: best of 40 passes; of_peak). On this shared host the two-thread bandwidth
# moves between ~45 and ~80 GB/s within minutes, so only a bound taken in the same seconds
# as the decode says how close to memory-bound decode is. Decode after a 128-token prompt is
# printed too (tg64@128, not compared: llama-bench has no such test). Prefill tok/s for 128-,
# 512- and 1024-token prompts (BENCH_PROMPTS), with the 1024-token per-token cost relative to
# 128's.
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
DIR=$BUILD/bench
mkdir -p "$DIR"
TYPES=${BENCH_TYPES:-"q8_0 q4_0 q4_k q6_k"}
THREADS=${BENCH_THREADS:-"1 2"}
PROMPTS=${BENCH_PROMPTS:-"128 512 1024"}
GEN=${BENCH_GEN:-64}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
# The bound is measured again right after each decode run: on a shared host the bandwidth one
# gets moves by 2x within minutes (measured here: 2 threads 45 GB/s, then 83, then 45), so a
# figure taken once at the start says little about a decode run ten minutes later.
membw() { $SHOAL bench --membw --threads "$1" | sed -n 's/.*read_gb_s=\([0-9.]*\).*/\1/p'; }
for t in $THREADS; do
	echo "streaming read bandwidth, $t thread(s): $(membw "$t") GB/s (at the start)"
done

get() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
pct() { awk -v c="$1" -v w="$2" -v t="$3" 'BEGIN { printf "%.0f", 100 * c / (w * t) }'; }

# llama.cpp's figures for one file: "threads n_prompt n_gen tok/s" lines (its CSV output).
llama_run() {
	"$LLAMA_BENCH" -m "$1" -t "$(echo "$THREADS" | tr ' ' ',')" \
		-p "$(echo "$PROMPTS" | tr ' ' ',')" -n "$GEN" -r "${LLAMA_REPS:-2}" -o csv 2>/dev/null |
		awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); c[$i] = i } next }
			{ gsub(/"/, ""); print $c["n_threads"], $c["n_prompt"], $c["n_gen"], $c["avg_ts"] }'
}
# One more llama.cpp decode figure for MODEL THREADS (llama_run's output format).
llama_tg() {
	"$LLAMA_BENCH" -m "$1" -t "$2" -p 0 -n "$GEN" -r 1 -o csv 2>/dev/null |
		awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); c[$i] = i } next }
			{ gsub(/"/, ""); print $c["n_threads"], 0, $c["n_gen"], $c["avg_ts"] }'
}
max() { awk -v a="$1" -v b="$2" 'BEGIN { print (b != "" && b + 0 > a + 0) ? b : a }'; }
llama_fig() { # LINES THREADS N_PROMPT N_GEN
	echo "$1" | awk -v t="$2" -v p="$3" -v g="$4" '$1 == t && $2 == p && $3 == g { printf "%.1f", $4 }'
}

printf '\n%-5s %3s %-9s %8s %9s %8s %7s %8s %8s %8s %7s %7s\n' type thr what tok/s llama.cpp ratio \
	bound of_bound peak_bw of_peak rss_MB cpu%
row() { # TYPE THR WHAT TOK/S LLAMA RATIO BOUND OF_BOUND PEAK OF_PEAK RSS CPU [NOTE]
	printf '%-5s %3s %-9s %8s %9s %8s %7s %8s %8s %8s %7s %7s %s\n' "$1" "$2" "$3" "$4" \
		"${5:--}" "${6:--}" "${7:--}" "${8:--}" "${9:--}" "${10:--}" "${11}" "${12}" "${13}"
}
# tokens/s a bandwidth allows at BYTES per token
tps_at() { awk -v b="$1" -v n="$2" 'BEGIN { if (b > 0) printf "%.1f", b * 1e9 / n }'; }
ofp() { awk -v d="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * d / b }'; }
for ty in $TYPES; do
	m=$DIR/llama-0.85b-$ty-s7.gguf
	if [ ! -s "$m" ]; then
		echo "(generating $m once)" >&2
		$SHOAL mkmodel --arch llama --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 \
			--vocab 32000 --type "$ty" --seed 7 --name "bench-0.85b-$ty" -o "$m" >&2 || exit 1
	fi
	ll=
	[ -n "$LLAMA_BENCH" ] && [ -x "$LLAMA_BENCH" ] && ll=$(llama_run "$m")
	for t in $THREADS; do
		p128= at128=
		for p in $PROMPTS; do
			g=1
			[ "$p" = 128 ] && g=$GEN
			line=$($SHOAL bench --model "$m" --threads "$t" --prompt "$p" --gen "$g" \
				--bound) || continue
			tps=$(get "$line" prefill_tok_s)
			[ "$p" = 128 ] && p128=$tps
			lf=$([ -n "$ll" ] && llama_fig "$ll" "$t" "$p" 0)
			ratio=$([ -n "$lf" ] && awk -v a="$tps" -v b="$lf" 'BEGIN { printf "%.2fx", a / b }')
			rel=
			[ "$p" != 128 ] && [ -n "$p128" ] &&
				rel=$(awk -v a="$p128" -v b="$tps" 'BEGIN { printf "cost/tok %.2fx of 128", a / b }')
			row "$ty" "$t" "pp$p" "$tps" "$lf" "$ratio" - - - - "$(get "$line" peak_rss_mb)" \
				"$(pct "$(get "$line" prefill_cpu_s)" "$(get "$line" prefill_wall_s)" "$t")" "$rel"
			[ "$p" = 128 ] && at128=$line
		done
		# decode from an empty cache (a 1-token prompt), best of DEC_REPS runs, each run's
		# own bound; llama.cpp's in between
		lf=$([ -n "$ll" ] && llama_fig "$ll" "$t" 0 "$GEN")
		best= r=0
		while [ "$r" -lt "${DEC_REPS:-3}" ]; do
			r=$((r + 1))
			l2=$($SHOAL bench --model "$m" --threads "$t" --prompt 1 --gen "$GEN" --bound) ||
				continue
			pk=$(membw "$t")
			if [ -z "$best" ] || [ "$(max "$(get "$best" decode_tok_s)" \
				"$(get "$l2" decode_tok_s)")" != "$(get "$best" decode_tok_s)" ]; then
				best=$l2 bestpk=$pk
			fi
			[ -n "$lf" ] && [ "$r" -gt 1 ] &&
				lf=$(max "$lf" "$(llama_fig "$(llama_tg "$m" "$t")" "$t" 0 "$GEN")")
		done
		[ -n "$best" ] || continue
		dec=$(get "$best" decode_tok_s) bpt=$(get "$best" bytes_per_token)
		bound=$(tps_at "$(get "$best" bound_gb_s)" "$bpt") peak=$(tps_at "$bestpk" "$bpt")
		ratio=$([ -n "$lf" ] && awk -v a="$dec" -v b="$lf" 'BEGIN { printf "%.2fx", a / b }')
		row "$ty" "$t" "tg$GEN" "$dec" "$lf" "$ratio" "$bound" "$(ofp "$dec" "$bound")" \
			"$peak" "$(ofp "$dec" "$peak")" "$(get "$best" peak_rss_mb)" \
			"$(pct "$(get "$best" decode_cpu_s)" "$(get "$best" decode_wall_s)" "$t")"
		# after the 128-token prompt (positions 128-191): the KV cache's share
		if [ -n "$at128" ]; then
			d=$(get "$at128" decode_tok_s) b=$(get "$at128" bytes_per_token)
			bound=$(tps_at "$(get "$at128" bound_gb_s)" "$b")
			row "$ty" "$t" "tg$GEN@128" "$d" - - "$bound" "$(ofp "$d" "$bound")" - - \
				"$(get "$at128" peak_rss_mb)" \
				"$(pct "$(get "$at128" decode_cpu_s)" "$(get "$at128" decode_wall_s)" "$t")"
		fi
	done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
[ -z "$LLAMA_BENCH" ] && echo "(llama.cpp not run: set LLAMA_BENCH=/path/to/llama-bench to compare)"
exit 0
