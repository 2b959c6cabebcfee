#!/bin/sh
# t_embed.sh: shoal's embeddings equal llama.cpp's `llama-embedding` on the same file (cosine of
# each pair >= 0.9999): generated qwen3 models with last-token pooling (the generated default, as
# Qwen3-Embedding; `shoal mkmodel --arch qwen3` as it is, and smaller F32 and Q8_0 ones), mean
# and CLS pooling, one that appends EOS (add_eos_token), and a llama file without a pooling key
# (shoal's default, last token, against llama-embedding --pooling last). F32 files agree to
# 1e-7; Q8_0 ones to ~5e-5, because shoal keeps the activations' block scale in F32 where ggml
# rounds it to F16 (block_q8_0.d), a difference that random weights carry through the layers.
# llama-embedding (llama.cpp's examples/embedding/embedding.cpp) tokenizes with add_special (BOS
# and EOS as the tokenizer says), pools as the file's pooling_type says (or --pooling) and scales
# each embedding to unit length (common_embd_normalize, 2); its `--embd-output-format array`
# prints [[...], ...]. Skipped when llama-embedding is not found ($LLAMA_BIN, PATH, or a built
# llama.cpp beside the checkout).
. tests/lib.sh
. tests/web_serve.sh

command -v curl >/dev/null || { skip "t_embed: curl not installed"; done_tests; exit; }
command -v python3 >/dev/null || { skip "t_embed: python3 not installed"; done_tests; exit; }
LE=
for d in "$LLAMA_BIN" ../llama.cpp/src/build/bin ../../llama.cpp/src/build/bin \
	../llama.cpp/build/bin; do
	[ -n "$d" ] && [ -x "$d/llama-embedding" ] && { LE=$d/llama-embedding; break; }
done
[ -z "$LE" ] && command -v llama-embedding >/dev/null && LE=$(command -v llama-embedding)
[ -n "$LE" ] || { skip "t_embed: llama-embedding not found (set LLAMA_BIN)"; done_tests; exit; }

TMP=$(mktemp -d)
trap 'serve_stop; rm -rf "$TMP"' EXIT
TEXTS='The sea is wide and the fish swim in it.
hello world
Once upon a time there was a little girl'

# compare NAME FILE [llama-embedding args...]: shoal's /v1/embeddings of TEXTS vs llama.cpp's.
compare() {
	name=$1 file=$2; shift 2
	printf '%s' "$TEXTS" >"$TMP/texts"
	# llama.cpp's logger (common/log.cpp) writes from its own thread and may lose the tail of
	# stdout at exit: run it again until the array is whole
	for try in 1 2 3 4 5; do
		"$LE" -m "$file" -f "$TMP/texts" --embd-output-format array -t 2 "$@" \
			>"$TMP/le.out" 2>"$TMP/le.err" ||
			{ fail "$name: llama-embedding: $(tail -3 "$TMP/le.err")"; return; }
		python3 -c "import json,re,sys;json.loads(re.search(r'\[\s*\[.*\]\s*\]',open(sys.argv[1]).read(),re.S).group(0))" \
			"$TMP/le.out" 2>/dev/null && break
	done
	serve_or_skip t_embed --model "$file" || return
	python3 -c "import json,sys;print(json.dumps({'input':open(sys.argv[1]).read().split('\n'),'encoding_format':'float'}))" \
		"$TMP/texts" >"$TMP/req"
	curl -s -H 'Content-Type: application/json' --data-binary @"$TMP/req" "$URL/v1/embeddings" >"$TMP/shoal.json"
	serve_stop
	res=$(python3 - "$TMP/le.out" "$TMP/shoal.json" <<'PY'
import json, math, re, sys
text = open(sys.argv[1]).read()
m = re.search(r'\[\s*\[.*\]\s*\]', text, re.S)
want = json.loads(m.group(0)) if m else []
got = [d['embedding'] for d in json.load(open(sys.argv[2]))['data']]
if len(want) != len(got):
    print('count', len(want), len(got)); sys.exit()
cos = []
for a, b in zip(want, got):
    ab = sum(x * y for x, y in zip(a, b))
    cos.append(ab / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b)))
print(' '.join('%.7f' % c for c in cos))
PY
)
	echo "  $name: cosine $res" >&2
	ok=$(echo "$res" | awk '{ok = NF == 3; for (i = 1; i <= NF; i++) if ($i + 0 < 0.9999) ok = 0; print ok}')
	check "$name: cosine >= 0.9999 for each input ($res)" [ "$ok" = 1 ]
}

"$SHOAL" mkmodel --arch qwen3 -o "$TMP/q3default.gguf" >/dev/null 2>&1 || fail "mkmodel"
compare "qwen3 as mkmodel makes it (q8_0, last token)" "$TMP/q3default.gguf"
"$SHOAL" mkmodel --arch qwen3 --seed 3 --dim 256 --layers 3 --heads 8 --kv-heads 2 --head-dim 64 \
	--ffn 512 --type f32 -o "$TMP/q3last.gguf" >/dev/null 2>&1 || fail "mkmodel"
compare "qwen3 f32, last token (the file's)" "$TMP/q3last.gguf"
"$SHOAL" mkmodel --arch qwen3 --seed 3 --dim 256 --layers 3 --heads 8 --kv-heads 2 --head-dim 64 \
	--ffn 512 --type q8_0 -o "$TMP/q3q8.gguf" >/dev/null 2>&1 || fail "mkmodel"
compare "qwen3 q8_0, last token" "$TMP/q3q8.gguf"
"$SHOAL" mkmodel --arch qwen3 --seed 4 --dim 256 --layers 3 --heads 8 --kv-heads 2 --head-dim 64 \
	--ffn 512 --type f32 --pooling mean -o "$TMP/q3mean.gguf" >/dev/null 2>&1 || fail "mkmodel"
compare "qwen3 f32, mean" "$TMP/q3mean.gguf"
"$SHOAL" mkmodel --arch qwen3 --seed 5 --dim 256 --layers 3 --heads 8 --kv-heads 2 --head-dim 64 \
	--ffn 512 --type f32 --pooling cls -o "$TMP/q3cls.gguf" >/dev/null 2>&1 || fail "mkmodel"
compare "qwen3 f32, cls" "$TMP/q3cls.gguf"
"$SHOAL" mkmodel --arch qwen3 --seed 6 --dim 256 --layers 3 --heads 8 --kv-heads 2 --head-dim 64 \
	--ffn 512 --type f32 --add-eos -o "$TMP/q3eos.gguf" >/dev/null 2>&1 || fail "mkmodel"
compare "qwen3 f32, last token after EOS" "$TMP/q3eos.gguf"
"$SHOAL" mkmodel --arch llama --seed 7 --dim 256 --layers 3 --type f32 -o "$TMP/llama.gguf" \
	>/dev/null 2>&1 || fail "mkmodel"
compare "llama without a pooling key, last token" "$TMP/llama.gguf" --pooling last
done_tests
