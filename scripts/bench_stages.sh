#!/bin/sh
# bench_stages.sh: pipelines on loopback ranks (threads of one process, one core each where there
# are: tests/test_stages --bench): aggregate decode tok/s of 1 and 4 streams on 2 and 3 stages,
# lock-step (every step's batch goes through all stages before the next) and with passes in
# flight (the streams split into a pass per stage, the stages working on different ones at
# once: docs/parallel.md, "Stages"). Two models: a tiny one, whose passes cost mostly the hops
# and wake-ups (what passes in flight hide), and a 113 MB Q8_0 llama (dim 1024, 8 layers,
# generated into $BUILD/bench once), whose passes cost mostly weight reads. Best of
# BENCH_STAGES_REPS runs (default 2) of BENCH_STAGES_GEN tokens per stream (default 16).
# Printed, not asserted.
BUILD=${BUILD:-build}
SHOAL=${SHOAL:-$BUILD/shoal}
DIR=$BUILD/bench
GEN=${BENCH_STAGES_GEN:-16}
REPS=${BENCH_STAGES_REPS:-2}
mkdir -p "$DIR"
m=$DIR/llama-0.1b-q8_0.gguf
tiny=$DIR/llama-tiny-f32.gguf
if [ ! -s "$m" ]; then
	echo "(generating $m once)" >&2
	$SHOAL mkmodel --arch llama --dim 1024 --layers 8 --heads 16 --kv-heads 4 --ffn 2816 \
		--vocab 8000 --type q8_0 --seed 1 --name "bench-0.1b-q8_0" -o "$m" >/dev/null || exit 1
fi
[ -s "$tiny" ] || $SHOAL mkmodel --arch llama --dim 128 --layers 4 --heads 4 --kv-heads 2 \
	--ffn 256 --vocab 512 --type f32 --seed 3 -o "$tiny" >/dev/null || exit 1
echo "$(getconf _NPROCESSORS_ONLN) cores, load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
for f in "$tiny" "$m"; do
	n=$GEN
	[ "$f" = "$tiny" ] && n=$((4 * GEN)) # the tiny model's tokens take ~1 ms
	echo "model $(basename "$f"), $n tokens per stream:"
	"$BUILD/tests/test_stages" --bench "$f" "$n" "$REPS" 2>/dev/null | sed 's/^/  /'
done
echo "  passes in flight hide a pass's hops and waits behind the other passes' compute, but each"
echo "  pass reads the stage's weights again: ranks that share cores (3 stages on 2 here) lose"
