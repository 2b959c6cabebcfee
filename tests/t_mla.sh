#!/bin/sh
# deepseek2 from the command line: `shoal mkmodel --arch deepseek2` with its latent-attention
# flags, `shoal info` naming the MLA shape and the latent KV bytes per token, `shoal generate`
# running it deterministically, and bad flags / shapes refused with one line.
. tests/lib.sh

D=$(mktemp -d /tmp/shoal-t-mla.XXXXXX)
M="$D/ds2.gguf"
$SHOAL mkmodel --arch deepseek2 --dim 128 --layers 2 --heads 4 --ffn 256 --vocab 512 \
	--kv-lora 64 --q-lora 64 --qk-nope 32 --qk-rope 16 --v-head 32 --rope-factor 40 \
	--yarn-log-mul 0.0707 --rope-orig-ctx 64 --type q8_0 -o "$M" >/dev/null 2>&1; rc=$?
check "mkmodel deepseek2 exits 0" [ $rc -eq 0 ]
info=$($SHOAL info --model "$M" 2>&1); rc=$?
check "info exits 0" [ $rc -eq 0 ]
check "info names the architecture" sh -c 'echo "$1" | grep -q "^architecture:  deepseek2"' _ "$info"
check "info shows the MLA shape" sh -c \
	'echo "$1" | grep -q "^mla:           kv_lora 64, q_lora 64, qk_nope 32, qk_rope 16, v_head 32, attn_k_b + attn_v_b"' _ "$info"
check "info shows YaRN" sh -c 'echo "$1" | grep -q "^rope scaling:  yarn, factor 40"' _ "$info"
# 2 layers x (64 + 16) floats x 4 bytes
check "info shows the latent KV bytes" sh -c 'echo "$1" | grep -q "^kv cache:      640 bytes per token"' _ "$info"

L="$D/lite.gguf"
$SHOAL mkmodel --arch deepseek2 --dim 128 --layers 2 --heads 4 --ffn 256 --vocab 512 \
	--kv-lora 64 --qk-nope 32 --qk-rope 16 --v-head 32 --mla-legacy -o "$L" >/dev/null 2>&1
check "info says Lite and attn_kv_b" sh -c \
	'$0 info --model "$1" | grep -q "q_lora 0 (Lite).*attn_kv_b"' "$SHOAL" "$L"

a=$($SHOAL generate --model "$M" --prompt "the story" --max-tokens 12 2>/dev/null)
b=$($SHOAL generate --model "$M" --prompt "the story" --max-tokens 12 --threads 1 2>/dev/null)
check "generate produces text" [ -n "$a" ]
check "greedy output is the same with 1 thread and all" [ "$a" = "$b" ]

$SHOAL mkmodel --arch deepseek2 --dim 128 --heads 4 --kv-lora 4096 -o "$D/bad.gguf" \
	>/dev/null 2>"$D/err"; rc=$?
check "kv_lora larger than the heads' data is refused" [ $rc -eq 1 ]
check "... with one line" [ "$(wc -l <"$D/err")" -eq 1 ]
$SHOAL mkmodel --arch deepseek2 --rope-factor x -o "$D/bad.gguf" >/dev/null 2>&1; rc=$?
check "a bad --rope-factor exits 2" [ $rc -eq 2 ]
rm -rf "$D"
done_tests
