#!/bin/sh
# Files written by llama.cpp's own gguf-py the way convert_hf_to_gguf.py writes them
# (scripts/gguf_py_gen.py: qwen35, qwen35moe, gpt-oss, glm4moe, gemma3 in F32, Q8_0 and gpt-oss
# MXFP4) against llama.cpp's outputs on the same bytes (tests/gguf_py_vectors.txt): F32 8 greedy
# ids, top-5 ids, |delta logprob| <= 0.03; quantized the first id. Skipped without /usr/bin/python3
# with numpy or without gguf-py (GGUF_PY, default /work/llama.cpp/src/gguf-py when present).
#
# How the vectors were made: the 2026 llama.cpp tree at /work/llama.cpp/src (unslothai/llama.cpp
# snapshot, ggml 0.18.1, no git metadata; libllama built with its CMake defaults, CPU only), a
# small C++ program against libllama.so (not committed): llama_tokenize(prompt, add_special=true,
# parse_special=true) as llama-completion and llama-simple do, llama_batch_get_one over the prompt
# then one token per step, default context parameters (F16 KV cache, flash attention auto),
# n_ctx 512, 2 threads, greedy, log-softmax of llama_get_logits_ith(-1), top 5 by logit. The
# "ids" line of each case is llama.cpp's prompt, checked against `shoal tokenize` here too.
. tests/lib.sh

GGUF_PY=${GGUF_PY:-/work/llama.cpp/src/gguf-py}
PY=/usr/bin/python3
if [ ! -x $PY ] || ! $PY -c 'import numpy' 2>/dev/null || [ ! -d "$GGUF_PY/gguf" ]; then
	skip "needs /usr/bin/python3 with numpy and llama.cpp's gguf-py (GGUF_PY=$GGUF_PY)"
	done_tests
	exit $?
fi
export GGUF_PY
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# the prompt ids of a few cases: shoal's tokenizer on the generator's vocabularies
GEN=scripts/gguf_py_gen.py
for fam in qwen35 gpt-oss glm4moe gemma3; do
	$PY $GEN --family $fam --seed 2 -o "$TMP/tok.gguf" || { fail "$fam: generator"; continue; }
	want=$(awk -v f="$fam" '$1 == "case" { on = ($2 == f && !seen[f]++) } on && $1 == "ids" { sub(/^ids /, ""); print; on = 0 }' tests/gguf_py_vectors.txt)
	bos=; [ $fam = gemma3 ] && bos=--bos
	got=$(printf 'The quick brown fox jumps over the lazy dog' | $SHOAL tokenize --model "$TMP/tok.gguf" $bos)
	check "$fam: prompt ids as llama.cpp's ($got)" [ "$got" = "$want" ]
done

$PY tests/gguf_py_check.py "$SHOAL" $GEN tests/gguf_py_vectors.txt "$TMP" >"$TMP/out"
while IFS= read -r line; do
	case $line in
	ok*) pass ;;
	*) fail "$line" ;;
	esac
done <"$TMP/out"
[ -s "$TMP/out" ] || fail "gguf_py_check.py printed nothing"
done_tests
