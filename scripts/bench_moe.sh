#!/bin/sh
# bench_moe.sh: a Mixtral-shaped mixture of experts of about 1B parameters (dim 1024, 10 layers,
# 16 heads, 4 KV heads, 8 experts of FFN 3584, 2 used per token, vocab 32000, Q8_0), generated
# once under $BUILD/bench/. Prints: prefill and decode tok/s, the weight bytes a decoded token
# reads (`shoal bench`, model_bytes_per_token) next to the formula non-expert + 2/8 x expert
# bytes, GB/s from that and as a fraction of the dense bench model's GB/s in the same run (the
# machine's matvec bandwidth as shoal reaches it), 2 ranks x 1 thread vs 1 rank x 2 threads on
# loopback, and the peak RSS of each rank (a rank maps only its experts).
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
DIR=$BUILD/bench
GEN=${BENCH_MOE_GEN:-48}
mkdir -p "$DIR"
m=$DIR/mixtral-1b-q8_0.gguf
if [ ! -s "$m" ]; then
	echo "(generating $m once)" >&2
	$SHOAL mkmodel --arch mixtral --dim 1024 --layers 10 --heads 16 --kv-heads 4 --ffn 3584 \
		--experts 8 --experts-used 2 --vocab 32000 --type q8_0 --seed 1 \
		--name "bench-mixtral-1b-q8_0" -o "$m" || exit 1
fi
T=$(mktemp -d /tmp/shoal-benchmoe.XXXXXX)
trap 'rm -rf "$T"' EXIT
TIME=""
[ -x /usr/bin/time ] && TIME="/usr/bin/time -f rss_kb=%M"
PIN0="" PIN1=""
if command -v taskset >/dev/null && [ "$(getconf _NPROCESSORS_ONLN)" -ge 2 ]; then
	PIN0="taskset -c 0" PIN1="taskset -c 1"
fi
tok_s() { sed -n 's/.*generation: [0-9]* tokens in [0-9.]* ms (\([0-9.]*\) tok\/s).*/\1/p' "$1"; }
rss() { sed -n 's/^rss_kb=//p' "$1" | awk '{printf "%.0f", $1 / 1024}'; }

$SHOAL info --model "$m" >"$T/info"
weights=$(sed -n 's/^weights: .*(\([0-9]*\) bytes)/\1/p' "$T/info")
experts=$(sed -n 's/^expert weights: \([0-9]*\) bytes.*/\1/p' "$T/info")
params=$(awk -v w="$weights" 'BEGIN { printf "%.2f", w / 34 * 32 / 1e9 }')
# non-expert + 2/8 x experts; the embedding table is read one row per token (Q8_0: 34 B / 32)
formula=$(awk -v w="$weights" -v e="$experts" 'BEGIN {
	emb = 32000 * 1024 / 32 * 34; printf "%.0f", w - e - emb + 1024 / 32 * 34 + e * 2 / 8 }')
echo "model: $(basename "$m"), ~${params}B parameters, $weights weight bytes, $experts in routed experts"

line=$($SHOAL bench --model "$m" --threads 2 --prompt 128 --gen 64) || { echo "bench failed"; exit 1; }
get() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
bpt=$(($(get bytes_per_token) - $(get kv_bytes_per_token))) # the weights' share
dense=$DIR/llama-0.85b-q8_0.gguf
ref=""
if [ -s "$dense" ]; then
	dl=$($SHOAL bench --model "$dense" --threads 2 --prompt 16 --gen 32 2>/dev/null)
	ref=$(echo "$dl" | tr ' ' '\n' | sed -n 's/^decode_gb_s=//p')
fi
printf 'prefill %s tok/s, decode %s tok/s (2 threads), peak RSS %s MB\n' "$(get prefill_tok_s)" \
	"$(get decode_tok_s)" "$(get peak_rss_mb)"
printf 'weight bytes/token %s; formula non-expert + 2/8 x expert = %s (%s%%)\n' "$bpt" "$formula" \
	"$(awk -v a="$bpt" -v b="$formula" 'BEGIN { printf "%+.1f", 100 * (a - b) / b }')"
printf 'decode GB/s %s' "$(get decode_gb_s)"
if [ -n "$ref" ]; then
	printf '; the dense Q8_0 bench model reaches %s GB/s here: %s of it (target >= 0.8)\n' "$ref" \
		"$(awk -v a="$(get decode_gb_s)" -v b="$ref" 'BEGIN { if (b > 0) printf "%.2f", a / b }')"
else
	printf ' (no dense reference: run bench_infer.sh first)\n'
fi

$TIME $SHOAL generate --model "$m" --prompt "Once" --max-tokens "$GEN" --threads 2 --stats \
	>/dev/null 2>"$T/one" || { echo "1x2 run failed: $(tail -1 "$T/one")"; exit 1; }
one=$(tok_s "$T/one")
B=$((31000 + ($$ % 1000) * 4))
P=127.0.0.1:$B,127.0.0.1:$((B + 1))
$TIME $PIN1 $SHOAL worker --rank 1 --world 2 --peers "$P" --token bench --model "$m" --threads 1 \
	--stats --log-level info 2>"$T/r1" &
W=$!
$TIME $PIN0 $SHOAL worker --rank 0 --world 2 --peers "$P" --token bench --model "$m" --threads 1 \
	--prompt "Once" --max-tokens "$GEN" --stats --log-level info >/dev/null 2>"$T/r0" ||
	{ echo "2x1 run failed: $(grep -v rss_kb "$T/r0" | tail -1)"; kill $W 2>/dev/null; exit 1; }
wait $W
two=$(tok_s "$T/r0")
printf '%-22s %10s   peak RSS %s MB\n' "1 rank x 2 threads" "$one" "$(rss "$T/one")"
printf '%-22s %10s   ratio to 1x2: %s (target >= 0.9)\n' "2 ranks x 1 thread" "$two" \
	"$(awk -v a="$two" -v b="$one" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "?" }')"
for r in 0 1; do
	echo "  rank $r: peak RSS $(rss "$T/r$r") MB ($(grep -o 'experts \[[0-9]*,[0-9]*)' "$T/r$r" | head -1))"
done
echo "load while measuring: $(cut -d' ' -f1-3 /proc/loadavg)"
