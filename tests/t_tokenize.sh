#!/bin/sh
# `shoal info` and `shoal tokenize` on the shared model and vocabularies: the reported sizes, a
# round trip, exact ids, and the exit codes for a missing, corrupt or unusable input.
. tests/lib.sh

M=$SHARED/models/stories260K.gguf
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

if [ ! -r "$M" ]; then
	skip "stories260K.gguf not found"
	done_tests
	exit $?
fi

$SHOAL info --model "$M" >"$TMP/info" 2>&1; rc=$?
check "info exits 0" [ $rc -eq 0 ]
check "info: llama" grep -Eq '^architecture: +llama$' "$TMP/info"
check "info: 5 layers" grep -Eq '^layers: +5$' "$TMP/info"
check "info: dim 64" grep -Eq '^dim: +64$' "$TMP/info"
check "info: 8 heads" grep -Eq '^heads: +8$' "$TMP/info"
check "info: 4 KV heads" grep -Eq '^kv heads: +4$' "$TMP/info"
check "info: vocab 512" grep -Eq '^vocab: +512$' "$TMP/info"
check "info: tensor types" grep -Eq '^tensor types: +F32$' "$TMP/info"
check "info: tokenizer" grep -Eq '^tokenizer: +spm' "$TMP/info"

text="Once upon a time, there was a little girl named Lily."
ids=$(printf '%s' "$text" | $SHOAL tokenize --model "$M"); rc=$?
check "tokenize exits 0" [ $rc -eq 0 ]
check "tokenize prints ids" sh -c "echo '$ids' | grep -Eq '^[0-9]+( [0-9]+)+$'"
back=$(echo "$ids" | $SHOAL tokenize --model "$M" --decode)
check "decode(encode(text)) == text" [ "$back" = "$text" ]
bos=$(printf 'Once' | $SHOAL tokenize --model "$M" --bos | cut -d' ' -f1)
check "--bos prepends BOS (1)" [ "$bos" = "1" ]

V=$SHARED/vocab/ggml-vocab-gpt-2.gguf
if [ -r "$V" ]; then
	got=$(printf 'Hello world' | $SHOAL tokenize --model "$V")
	check "gpt-2 ids for 'Hello world'" [ "$got" = "15496 995" ]
	got=$(printf '<|endoftext|>' | $SHOAL tokenize --model "$V" --special)
	check "--special parses <|endoftext|>" [ "$got" = "50256" ]
	got=$(printf '<|endoftext|>' | $SHOAL tokenize --model "$V" | wc -w)
	check "special tokens not parsed by default" [ "$got" -gt 1 ]
else
	skip "gpt-2 vocabulary not found"
fi

$SHOAL info --model "$TMP/missing.gguf" >/dev/null 2>"$TMP/err"; rc=$?
check "info on a missing file exits 1" [ $rc -eq 1 ]
check "missing file: one-line error" [ "$(wc -l <"$TMP/err")" -eq 1 ]
head -c 5000 "$M" >"$TMP/trunc.gguf"
$SHOAL info --model "$TMP/trunc.gguf" >/dev/null 2>"$TMP/err"; rc=$?
check "info on a truncated file exits 1" [ $rc -eq 1 ]
check "truncated file: error names it" grep -q 'trunc.gguf' "$TMP/err"
printf 'hi' | $SHOAL tokenize --model "$TMP/trunc.gguf" >/dev/null 2>&1; rc=$?
check "tokenize on a truncated file exits 1" [ $rc -eq 1 ]
echo "1 2 99999" | $SHOAL tokenize --model "$M" --decode >/dev/null 2>&1; rc=$?
check "decode of an out-of-range id exits 1" [ $rc -eq 1 ]
$SHOAL tokenize </dev/null >/dev/null 2>&1; rc=$?
check "tokenize without --model exits 2" [ $rc -eq 2 ]
$SHOAL info --help >/dev/null; rc=$?
check "info --help exits 0" [ $rc -eq 0 ]
done_tests
