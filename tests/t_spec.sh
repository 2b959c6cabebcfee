#!/bin/sh
# speculative decoding from the command line (docs/speculative.md): shoal mkmodel --from makes a
# copy with converted weights and the same vocabulary (llama.cpp's reader is not needed: the
# engine opens it and writes stories260K's text with it), shoal generate's --spec modes give
# llama.cpp's greedy ids of stories260K (stories260K.expected.txt) and --stats says what was
# drafted, and the error cases are one line with a non-zero exit (generate's, and the agent's at
# start: its cluster path is tests/t_spec_agent.sh).
. tests/lib.sh

T=$(mktemp -d /tmp/shoal-tspec.XXXXXX)
trap 'rm -rf "$T"' EXIT
S=$SHARED/models/stories260K.gguf
if [ ! -r "$S" ]; then
	skip "stories260K: $S not found"
	done_tests
	exit $?
fi
want=$(sed -n 's/^generated_ids_64: //p' "$SHARED/models/stories260K.expected.txt")

$SHOAL mkmodel --from "$S" --type f16 -o "$T/s16.gguf"
check "mkmodel --from exits 0" [ $? -eq 0 ]
check "the F16 copy is about half the size" [ "$(wc -c <"$T/s16.gguf")" -lt "$(($(wc -c <"$S") * 6 / 10))" ]
$SHOAL info --model "$T/s16.gguf" >"$T/info" 2>&1
check "the copy's matrices are F16, its vocabulary the model's" sh -c \
	'grep -q "tensor types:  F32 F16" "$1" && grep -q "tokenizer:     spm, pre-tokenizer default, 512 tokens, bos 1, eos 2" "$1"' _ "$T/info"
got=$($SHOAL generate --model "$T/s16.gguf" --prompt "Once upon a time" --max-tokens 64 --ids)
check "the F16 copy writes llama.cpp's greedy ids too" [ "$got" = "$want" ]
$SHOAL mkmodel --from "$S" -o "$T/x.gguf" 2>"$T/err"
check "--from without --type is a usage error" [ $? -eq 2 ]

for mode in off auto ngram model; do
	got=$($SHOAL generate --model "$S" --prompt "Once upon a time" --max-tokens 64 --ids \
		--spec $mode --draft-model "$T/s16.gguf" --stats 2>"$T/stats")
	check "--spec $mode: llama.cpp's greedy ids" [ "$got" = "$want" ]
done
check "--stats names the draft and its acceptance" grep -q "speculative decoding model, draft .*drafted tokens accepted" "$T/stats"
got=$($SHOAL generate --model "$S" --prompt "Once upon a time" --max-tokens 64 --ids --spec ngram --draft-max 3)
check "--draft-max 3: the same ids" [ "$got" = "$want" ]

$SHOAL generate --model "$S" --prompt "x" --spec fast >/dev/null 2>"$T/err"
check "an unknown mode is a usage error" [ $? -eq 2 ]
$SHOAL generate --model "$S" --prompt "x" --draft-max 17 >/dev/null 2>"$T/err"
check "--draft-max 17 is a usage error" [ $? -eq 2 ]
$SHOAL generate --model "$S" --prompt "x" --spec model >/dev/null 2>"$T/err"
check "--spec model without a draft fails" [ $? -eq 1 ]
check "... saying what is missing" grep -q -- "--draft-model" "$T/err"
$SHOAL mkmodel --dim 64 --layers 1 --heads 2 --kv-heads 1 --ffn 128 --vocab 300 -o "$T/other.gguf"
$SHOAL generate --model "$S" --prompt "x" --draft-model "$T/other.gguf" >/dev/null 2>"$T/err"
check "a draft with another vocabulary fails" [ $? -eq 1 ]
check "... in one line naming the vocabulary" sh -c '[ "$(wc -l <"$1")" -eq 1 ] && grep -q "vocabulary" "$1"' _ "$T/err"
$SHOAL generate --model "$S" --prompt "x" --draft-model "$T/missing.gguf" >/dev/null 2>"$T/err"
check "a missing draft file fails in one line" sh -c '[ "$(wc -l <"$1")" -eq 1 ]' _ "$T/err"

# the agent checks its flags at start (a draft file it cannot read would fail every plan later);
# none of these reaches the network
$SHOAL agent --token t --state-dir "$T/st" --draft-model "$T/missing.gguf" >/dev/null 2>"$T/err"
check "agent: a missing draft file fails at start" [ $? -eq 1 ]
check "... in one line naming it" sh -c '[ "$(wc -l <"$1")" -eq 1 ] && grep -q "missing.gguf" "$1"' _ "$T/err"
$SHOAL agent --token t --state-dir "$T/st" --draft-model "$T" >/dev/null 2>"$T/err"
check "agent: a directory as the draft fails at start" [ $? -eq 1 ]
$SHOAL agent --token t --state-dir "$T/st" --spec model >/dev/null 2>"$T/err"
check "agent: --spec model without a draft is a usage error" [ $? -eq 2 ]
check "... saying what is missing" grep -q -- "--draft-model" "$T/err"
$SHOAL agent --token t --state-dir "$T/st" --spec fast >/dev/null 2>"$T/err"
check "agent: an unknown mode is a usage error" [ $? -eq 2 ]
$SHOAL agent --token t --state-dir "$T/st" --draft-max 0 >/dev/null 2>"$T/err"
check "agent: --draft-max 0 is a usage error" [ $? -eq 2 ]
check "agent --help lists the speculative flags" sh -c '"$1" agent --help | grep -q -- "--draft-model FILE"' _ "$SHOAL"

done_tests
