#!/bin/sh
# bench_tp.sh: tensor parallel on loopback for the ~0.85B Q8_0 model of bench_infer.sh (reused from
# $BUILD/bench/, generated when missing): decode tok/s for 1 rank x 2 threads (shoal generate) and
# 2 ranks x 1 thread (shoal worker), the communication time per step and its share of the step,
# bytes sent per token per rank, peak RSS per rank. Targets (issue 7): sync <= 5% of the step;
# 2x1 >= 0.9 x 1x2; bytes/token/rank <= 2 x layers x dim x 4 (= 262144 here). Ranks are pinned
# to cores 0 and 1 (taskset) when possible.
# BENCH_TP_GEN overrides the number of generated tokens (default 48).
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
DIR=$BUILD/bench
GEN=${BENCH_TP_GEN:-48}
mkdir -p "$DIR"
m=$DIR/llama-0.85b-q8_0.gguf
if [ ! -s "$m" ]; then
	echo "(generating $m once)" >&2
	$SHOAL mkmodel --arch llama --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 \
		--vocab 32000 --type q8_0 --seed 1 --name "bench-0.85b-q8_0" -o "$m" || exit 1
fi
T=$(mktemp -d /tmp/shoal-benchtp.XXXXXX)
trap 'rm -rf "$T"' EXIT
TIME=""
[ -x /usr/bin/time ] && TIME="/usr/bin/time -f rss_kb=%M"
PROMPT="Once"
# One core per rank, as one machine per rank would give: unpinned, two ranks on a busy 2-core
# machine often share a core and every sync then waits for a scheduler time slice.
PIN0="" PIN1=""
if command -v taskset >/dev/null && [ "$(getconf _NPROCESSORS_ONLN)" -ge 2 ]; then
	PIN0="taskset -c 0" PIN1="taskset -c 1"
fi

tok_s() { sed -n 's/.*generation: [0-9]* tokens in [0-9.]* ms (\([0-9.]*\) tok\/s).*/\1/p' "$1"; }
rss() { sed -n 's/^rss_kb=//p' "$1" | awk '{printf "%.0f", $1 / 1024}'; }

$TIME $SHOAL generate --model "$m" --prompt "$PROMPT" --max-tokens "$GEN" --threads 2 --stats \
	>/dev/null 2>"$T/one" || { echo "1x2 run failed: $(tail -1 "$T/one")"; exit 1; }
one=$(tok_s "$T/one")

B=$((30000 + ($$ % 1000) * 4))
P=127.0.0.1:$B,127.0.0.1:$((B + 1))
export SHOAL_TP_TRACE=$T/trace
$TIME $PIN1 $SHOAL worker --rank 1 --world 2 --peers "$P" --token bench --model "$m" --threads 1 \
	--stats --log-level warn 2>"$T/r1" &
W=$!
$TIME $PIN0 $SHOAL worker --rank 0 --world 2 --peers "$P" --token bench --model "$m" --threads 1 \
	--prompt "$PROMPT" --max-tokens "$GEN" --stats --log-level warn >/dev/null 2>"$T/r0" ||
	{ echo "2x1 run failed: $(grep -v rss_kb "$T/r0" | tail -1)"; kill $W 2>/dev/null; exit 1; }
wait $W
unset SHOAL_TP_TRACE
two=$(tok_s "$T/r0")

printf '%-22s %10s\n' "config" "decode tok/s"
printf '%-22s %10s   peak RSS %s MB\n' "1 rank x 2 threads" "$one" "$(rss "$T/one")"
printf '%-22s %10s   ratio to 1x2: %s (target >= 0.9)\n' "2 ranks x 1 thread" "$two" \
	"$(awk -v a="$two" -v b="$one" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "?" }')"
for r in 0 1; do
	line=$(grep "^rank $r/2:" "$T/r$r")
	echo "  $line; peak RSS $(rss "$T/r$r") MB"
done
# The ranks do the same syncs in the same order: the rank that arrives last at a sync waits only
# for the transfer, the other one also for it (skew). Summing min(rank 0, rank 1) per sync over
# the decode steps estimates the pure sync time per token.
paste -d' ' "$T/trace.0" "$T/trace.1" | awk '{ print ($1 < $2 ? $1 : $2) }' | sort -n |
	awk -v steps="$GEN" -v tps="$two" '
	{ v[NR] = $1; s += $1 }
	END { if (NR && tps > 0) {
		per = NR / steps; step = 1000 / tps
		printf "  sync without skew (the later rank'"'"'s wait, %d syncs per token): mean %.0f us, " \
			"p10 %.0f us, median %.0f us, p90 %.0f us\n", per, s / NR, v[int(NR * 0.1) + 1],
			v[int(NR * 0.5) + 1], v[int(NR * 0.9) + 1]
		printf "  per token: %.2f ms at the mean (%.1f%% of the %.1f ms step), %.2f ms at p10 " \
			"(%.1f%%)\n", s / steps / 1000, 100 * s / steps / 1000 / step, step,
			per * v[int(NR * 0.1) + 1] / 1000, 100 * per * v[int(NR * 0.1) + 1] / 1000 / step } }'
# pipeline: the same two ranks, contiguous layers each (decode is sequential through the stages)
B=$((B + 2))
P=127.0.0.1:$B,127.0.0.1:$((B + 1))
$PIN1 $SHOAL worker --rank 1 --world 2 --peers "$P" --token bench --model "$m" --threads 1 \
	--strategy pipeline --log-level warn 2>/dev/null &
W=$!
if $PIN0 $SHOAL worker --rank 0 --world 2 --peers "$P" --token bench --model "$m" --threads 1 \
	--strategy pipeline --prompt "$PROMPT" --max-tokens "$GEN" --stats --log-level warn \
	>/dev/null 2>"$T/p0"; then
	printf '%-22s %10s   %s\n' "2 ranks pipeline x 1" "$(tok_s "$T/p0")" \
		"$(grep "^rank 0/2:" "$T/p0" | sed 's/.*); \(.*\)/\1/')"
fi
wait $W
echo "  target: sync <= 5% of the step; bytes/token/rank <= 262144 (2 x 16 x 2048 x 4)"
