#!/bin/sh
# bench_infer.sh: single-node inference figures on a ~0.85B Llama-shaped model (dim 2048, 16
# layers, 32 heads, 8 KV heads, FFN 5632, vocab 32000, seed 7) in each of BENCH_TYPES (default
# q8_0 q4_0 q4_k q6_k), generated once and cached under $BUILD/bench/.
# Per type and thread count: decode tok/s (64 tokens after a 128-token prompt; best of DEC_REPS
# runs, default 3, alternating with llama.cpp's when it runs) as a fraction of the decode bound
# (decode reads every weight byte once per token, and the KV cache up to its position, so the
# streaming read bandwidth of `shoal bench --membw`, measured right after each run, best of
# those, / those bytes per token bounds it), and prefill tok/s for 128-, 512- and 1024-token
# prompts (BENCH_PROMPTS), with the 1024-token per-token cost relative to 128's.
# With LLAMA_BENCH=/path/to/llama-bench, llama.cpp is run on the same files in the same run and
# its figures printed beside ours (never stored numbers; LLAMA_REPS repetitions, default 2).
# cpu% = CPU time the run got / (wall time x threads): below ~95% the machine was shared and
# the figures are low by about that factor (llama.cpp's runs get no such figure: compare them
# only when the load printed before and after is low).
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

printf '\n%-5s %3s %-9s %8s %9s %8s %7s %10s %8s %7s\n' type thr what tok/s llama.cpp ratio \
	"bound" "of_bound" rss_MB cpu%
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
		p128=
		for p in $PROMPTS; do
			g=1
			[ "$p" = 128 ] && g=$GEN
			line=$($SHOAL bench --model "$m" --threads "$t" --prompt "$p" --gen "$g") || continue
			tps=$(get "$line" prefill_tok_s)
			[ "$p" = 128 ] && p128=$tps
			lf=$([ -n "$ll" ] && llama_fig "$ll" "$t" "$p" 0)
			ratio=$([ -n "$lf" ] && awk -v a="$tps" -v b="$lf" 'BEGIN { printf "%.2fx", a / b }')
			rel=
			[ "$p" != 128 ] && [ -n "$p128" ] &&
				rel=$(awk -v a="$p128" -v b="$tps" 'BEGIN { printf "cost/tok %.2fx of 128", a / b }')
			printf '%-5s %3s %-9s %8s %9s %8s %7s %10s %8s %7s %s\n' "$ty" "$t" "pp$p" "$tps" \
				"${lf:--}" "${ratio:--}" - - "$(get "$line" peak_rss_mb)" \
				"$(pct "$(get "$line" prefill_cpu_s)" "$(get "$line" prefill_wall_s)" "$t")" "$rel"
			if [ "$p" = 128 ]; then
				bw=$(membw "$t")
				dec=$(get "$line" decode_tok_s)
				bpt=$(get "$line" bytes_per_token)
				lf=$([ -n "$ll" ] && llama_fig "$ll" "$t" 0 "$GEN")
				# decode again, alternating with llama.cpp's, best of DEC_REPS
				# each: the shared host's bandwidth moves within a minute
				r=1
				while [ "$r" -lt "${DEC_REPS:-3}" ]; do
					r=$((r + 1))
					l2=$($SHOAL bench --model "$m" --threads "$t" --prompt 128 \
						--gen "$GEN") && dec=$(max "$dec" "$(get "$l2" decode_tok_s)")
					bw=$(max "$bw" "$(membw "$t")")
					[ -n "$lf" ] && lf=$(max "$lf" "$(llama_fig "$(llama_tg "$m" "$t")" \
						"$t" 0 "$GEN")")
				done
				bound=$(awk -v b="$bw" -v n="$bpt" 'BEGIN { if (b > 0) printf "%.1f", b * 1e9 / n }')
				of=$(awk -v d="$dec" -v b="$bound" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * d / b }')
				ratio=$([ -n "$lf" ] && awk -v a="$dec" -v b="$lf" 'BEGIN { printf "%.2fx", a / b }')
				printf '%-5s %3s %-9s %8s %9s %8s %7s %10s %8s %7s\n' "$ty" "$t" "tg$GEN" "$dec" \
					"${lf:--}" "${ratio:--}" "${bound:--}" "${of:--}" \
					"$(get "$line" peak_rss_mb)" \
					"$(pct "$(get "$line" decode_cpu_s)" "$(get "$line" decode_wall_s)" "$t")"
			fi
		done
	done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
[ -z "$LLAMA_BENCH" ] && echo "(llama.cpp not run: set LLAMA_BENCH=/path/to/llama-bench to compare)"
exit 0
