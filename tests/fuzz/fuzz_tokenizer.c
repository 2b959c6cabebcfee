/* fuzz_tokenizer.c: encoding any bytes with the shared vocabularies (SentencePiece and three
 * byte-level BPE pre-tokenizers) never crashes, and decoding gives the input back wherever the
 * vocabulary can represent every byte (llama-spm through byte fallback, gpt-2). The vocabularies
 * come from ../shared (SHOAL_SHARED overrides); without them the target does nothing. */
#define _GNU_SOURCE /* memmem */
#include "common/common.h"
#include "infer/gguf.h"
#include "infer/tok/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[] = {"llama-spm", "gpt-2", "deepseek-llm", "falcon"};
static gguf_t *g[4];
static tok_t *t[4];
static int loaded;

static void load(void)
{
	const char *sh = getenv("SHOAL_SHARED") ? getenv("SHOAL_SHARED") : "../shared";
	char path[512], err[256];
	for (int i = 0; i < 4; i++) {
		snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", sh, names[i]);
		if (gguf_open(&g[i], path, err, sizeof err) == 0 &&
		    tok_load(&t[i], g[i], err, sizeof err) != 0)
			t[i] = NULL;
	}
	loaded = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!loaded)
		load();
	for (int i = 0; i < 4; i++) {
		if (!t[i])
			continue;
		int *ids, n;
		if (tok_encode(t[i], (const char *)data, size, 0, i >= 2 && (size & 1), &ids, &n))
			continue;
		char *text;
		size_t len;
		if (tok_decode(t[i], ids, n, TOK_DECODE_STRIP | TOK_DECODE_SPECIAL, &text, &len) ==
		    0) {
			/* byte-exact round trip where every byte has a token (SentencePiece
			 * reads a literal U+2581 as a space, so such inputs cannot) */
			int rt = i == 1 || (i == 0 && !memmem(data, size, "\xe2\x96\x81", 3));
			if (rt && (len != size || memcmp(text, data, size)))
				__builtin_trap();
			free(text);
		}
		free(ids);
	}
	return 0;
}
