#!/bin/sh
# shoal generate / mkmodel from the command line: stories260K's exact greedy ids, generated
# models (deterministic files, thread-count independence, seeds, stop strings, logprobs, chat)
# and the error cases (one line, non-zero exit, never a crash).
. tests/lib.sh

T=$(mktemp -d /tmp/shoal-tgen.XXXXXX)
trap 'rm -rf "$T"' EXIT
S=$SHARED/models/stories260K.gguf

if [ -r "$S" ]; then
	want=$(sed -n 's/^generated_ids_64: //p' "$SHARED/models/stories260K.expected.txt")
	got=$($SHOAL generate --model "$S" --prompt "Once upon a time" --max-tokens 64 --ids)
	check "stories260K greedy ids match llama.cpp" [ "$got" = "$want" ]
	got=$($SHOAL generate --model "$S" --prompt "Once upon a time" --max-tokens 64 --ids --threads 2)
	check "stories260K greedy ids with 2 threads" [ "$got" = "$want" ]
	txt=$($SHOAL generate --model "$S" --prompt "Once upon a time" --max-tokens 64)
	check "stories260K text" sh -c 'echo "$1" | head -n 1 | grep -q "^, there was a little girl named Lily. She loved"' _ "$txt"
	got=$($SHOAL generate --model "$S" --prompt "Once upon a time" --max-tokens 64 --stop "red ball")
	check "stop string ends the text before it" [ "$got" = ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, " ]
	$SHOAL generate --model "$S" --prompt "Once upon a time" --max-tokens 4 --stats >/dev/null 2>"$T/stats"
	check "--stats prints speeds" grep -q "tok/s" "$T/stats"
else
	skip "stories260K: $S not found"
fi

# generated models: deterministic bytes, every arch runs
$SHOAL mkmodel --dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 256 --vocab 600 --seed 9 -o "$T/a.gguf"
check "mkmodel exits 0" [ $? -eq 0 ]
$SHOAL mkmodel --dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 256 --vocab 600 --seed 9 -o "$T/b.gguf"
check "mkmodel is deterministic" cmp -s "$T/a.gguf" "$T/b.gguf"
$SHOAL mkmodel --dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 256 --vocab 600 --seed 10 -o "$T/c.gguf"
check "another seed, other weights" sh -c '! cmp -s "$1" "$2"' _ "$T/a.gguf" "$T/c.gguf"
for spec in "qwen2 q4_0" "qwen3 q8_0" "llama f16" "llama q6_k" "qwen2 q4_k" "llama bf16" \
	"llama q5_k" "qwen3 q3_k" "llama q2_k" "qwen2 q5_0" "llama q5_1"; do
	set -- $spec
	$SHOAL mkmodel --arch $1 --type $2 --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 \
		--vocab 600 -o "$T/$1-$2.gguf"
	out=$($SHOAL generate --model "$T/$1-$2.gguf" --prompt "hello world" --max-tokens 8 --ids)
	check "$1 $2 generates 8 ids" [ "$(echo "$out" | wc -w)" -eq 8 ]
done

M=$T/a.gguf
a=$($SHOAL generate --model "$M" --prompt "the little fish" --max-tokens 24 --ids --threads 1)
b=$($SHOAL generate --model "$M" --prompt "the little fish" --max-tokens 24 --ids --threads 2)
check "same greedy ids on 1 and 2 threads" [ "$a" = "$b" ]
a=$($SHOAL generate --model "$M" --prompt "one day" --max-tokens 24 --ids --temperature 1 --seed 4)
b=$($SHOAL generate --model "$M" --prompt "one day" --max-tokens 24 --ids --temperature 1 --seed 4)
c=$($SHOAL generate --model "$M" --prompt "one day" --max-tokens 24 --ids --temperature 1 --seed 5)
check "same seed, same ids" [ "$a" = "$b" ]
check "another seed, other ids" [ "$a" != "$c" ]
$SHOAL generate --model "$M" --prompt "one day" --max-tokens 5 --top-logprobs 3 >"$T/lp"
check "--top-logprobs: one line per token" [ "$(wc -l <"$T/lp")" -eq 5 ]
check "--top-logprobs: JSON with 3 alternatives" \
	grep -Eq '^\{"id":[0-9]+,"text":".*","logprob":-?[0-9.]+,"top":\[(\{"id":[0-9]+,"logprob":-?[0-9.]+\},?){3}\]\}$' "$T/lp"
$SHOAL generate --model "$M" --chat "Hello" --system "Be brief." --max-tokens 8 >/dev/null
check "--chat runs" [ $? -eq 0 ]

# bad input: one line on stderr, exit 1; usage errors exit 2
$SHOAL generate --model "$T/missing.gguf" --prompt hi >/dev/null 2>"$T/e"; rc=$?
check "missing file: exit 1" [ $rc -eq 1 ]
check "missing file: one line" [ "$(wc -l <"$T/e")" -eq 1 ]
head -c 100000 "$M" >"$T/trunc.gguf"
$SHOAL generate --model "$T/trunc.gguf" --prompt hi >/dev/null 2>"$T/e"; rc=$?
check "truncated file: exit 1, one line" [ $rc -eq 1 ] && [ "$(wc -l <"$T/e")" -eq 1 ]
head -c 4096 /dev/urandom >"$T/junk.gguf"
$SHOAL generate --model "$T/junk.gguf" --prompt hi >/dev/null 2>"$T/e"; rc=$?
check "junk file: exit 1" [ $rc -eq 1 ]
perl -pe 's/llama/lxama/g' "$M" >"$T/arch.gguf"
$SHOAL generate --model "$T/arch.gguf" --prompt hi >/dev/null 2>"$T/e"; rc=$?
check "unsupported architecture: exit 1" [ $rc -eq 1 ]
check "unsupported architecture: says so" grep -q "unsupported architecture" "$T/e"
long=$(printf 'the %.0s' $(seq 1 200))
$SHOAL generate --model "$M" --prompt "$long" --ctx 64 >/dev/null 2>"$T/e"; rc=$?
check "prompt longer than the context: exit 1" [ $rc -eq 1 ]
check "prompt longer than the context: says so" grep -q "does not fit the context" "$T/e"
$SHOAL generate --model "$M" >/dev/null 2>&1; rc=$?
check "no prompt: usage error" [ $rc -eq 2 ]
$SHOAL generate --model "$M" --prompt hi --temperature abc >/dev/null 2>&1; rc=$?
check "bad number: usage error" [ $rc -eq 2 ]
$SHOAL mkmodel --arch gpt9 -o "$T/x.gguf" 2>/dev/null; rc=$?
check "mkmodel: unknown arch fails" [ $rc -eq 1 ]
$SHOAL mkmodel --type q4_k --dim 100 -o "$T/x.gguf" 2>/dev/null; rc=$?
check "mkmodel: dims not whole blocks fail" [ $rc -eq 1 ]
check "generate --help" $SHOAL generate --help >/dev/null
done_tests
