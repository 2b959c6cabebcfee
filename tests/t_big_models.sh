#!/bin/sh
# t_big_models.sh: the ~0.85B models of `make bench` (bench_infer.sh's files, generated once into
# $BUILD/bench/ and reused by the benchmark):
#   - issue 15: greedy top-1 with the F16 KV cache equals the F32 cache's over 64 steps on each of
#     the Q8_0, Q4_0, Q4_K and Q6_K models (test_kvcache --model; near ties aside, see there);
#   - issue 16: every request of a batch yields exactly the ids it yields alone, 64 steps each,
#     on one node and on 2 tensor ranks, on the Q8_0 model (test_batch --model).
# Skipped under the sanitizers: there 0.85B models take far too long, and both programs' small
# models already run there.
. tests/lib.sh
BUILD=${BUILD:-build}
case "$BUILD" in *san*)
	skip "t_big_models: the 0.85B models are not run under the sanitizers"
	done_tests
	exit $?
	;;
esac
DIR=$BUILD/bench
mkdir -p "$DIR"
models=
for ty in q8_0 q4_0 q4_k q6_k; do
	m=$DIR/llama-0.85b-$ty-s7.gguf
	if [ ! -s "$m" ]; then # the same flags as scripts/bench_infer.sh
		$SHOAL mkmodel --arch llama --dim 2048 --layers 16 --heads 32 --kv-heads 8 \
			--ffn 5632 --vocab 32000 --type "$ty" --seed 7 --name "bench-0.85b-$ty" \
			-o "$m.tmp" >/dev/null && mv "$m.tmp" "$m"
	fi
	if [ -s "$m" ]; then
		models="$models $m"
	else
		fail "mkmodel could not write $m"
	fi
done

# run NAME PROGRAM ARGS...: one check from a test program's closing line
run() {
	what=$1
	shift
	out=$("$@" 2>&1)
	echo "$out" | grep -v '^[0-9]* passed' | sed 's/^/  /' >&2
	failed=$(echo "$out" | sed -n 's/^[0-9]* passed, \([0-9]*\) failed.*/\1/p' | tail -n 1)
	if [ "$failed" = 0 ]; then pass; else fail "$what (${failed:-no result})"; fi
}
# shellcheck disable=SC2086
run "F16 cache top-1 = F32 cache's on the 0.85B models" "$BUILD/tests/test_kvcache" --model $models
run "0.85B Q8_0: batched = alone, one node and 2 tensor ranks" \
	"$BUILD/tests/test_batch" --model "$DIR/llama-0.85b-q8_0-s7.gguf"
done_tests
