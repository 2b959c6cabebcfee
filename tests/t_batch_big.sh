#!/bin/sh
# t_batch_big.sh: continuous batching on the ~0.85B Q8_0 model of `make bench` (issue 16): every
# request of a batch yields exactly the ids it yields alone, 64 steps each, on one node and on 2
# tensor ranks (test_batch --model). The model is generated once into $BUILD/bench/ (bench_serve.sh
# reuses it). Skipped under the sanitizers: there a 0.85B model takes far too long, and
# test_batch's small models already run there.
. tests/lib.sh
BUILD=${BUILD:-build}
case "$BUILD" in *san*)
	skip "t_batch_big: the 0.85B model is not run under the sanitizers"
	done_tests
	exit $?
	;;
esac
DIR=$BUILD/bench
m=$DIR/llama-0.85b-q8_0-seed7.gguf
mkdir -p "$DIR"
if [ ! -s "$m" ]; then
	$SHOAL mkmodel --arch llama --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 \
		--vocab 32000 --type q8_0 --seed 7 -o "$m.tmp" >/dev/null && mv "$m.tmp" "$m"
fi
if [ ! -s "$m" ]; then
	fail "t_batch_big: mkmodel could not write $m"
	done_tests
	exit $?
fi
out=$("$BUILD/tests/test_batch" --model "$m" 2>&1)
echo "$out" | grep -v '^[0-9]* passed' | sed 's/^/  /' >&2
line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
failed=$(echo "$line" | sed -n 's/^[0-9]* passed, \([0-9]*\) failed.*/\1/p')
if [ "$failed" = 0 ]; then
	pass "0.85B Q8_0: batched = alone, one node and 2 tensor ranks ($line)"
else
	fail "0.85B Q8_0: batched != alone or test_batch failed: ${line:-no result}"
fi
done_tests
