/* fuzz_gguf.c: the GGUF reader on any bytes, then everything that reads what parses: model
 * metadata, binding a small model's weights (the MoE expert views included) and one forward step,
 * the tokenizer (loading, encoding and decoding part of the input as text) and chat
 * template recognition. Nothing may crash, leak or read out of bounds. */
#include "common/common.h"
#include "infer/chat.h"
#include "infer/gguf.h"
#include "infer/model/meta.h"
#include "infer/model/model.h"
#include "infer/pool.h"
#include "infer/tok/tokenizer.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	gguf_t *g;
	char err[256];
	if (gguf_open_mem(&g, data, size, err, sizeof err))
		return 0;
	model_meta_t m;
	if (meta_load(&m, g, err, sizeof err) == 0 && size < (1 << 16)) {
		pool_t *pool = pool_new(1);
		model_t *mod = NULL;
		float *logits = malloc((size_t)m.n_vocab * sizeof *logits);
		int tok = 0;
		if (pool && logits && model_new(&mod, g, &m, NULL, 8, pool, err, sizeof err) == 0)
			(void)model_forward(mod, &tok, 1, 0, logits);
		model_free(mod);
		free(logits);
		pool_free(pool);
	}
	for (int i = 0; i < gguf_n_kv(g); i++) {
		int64_t iv;
		double dv;
		const char *s;
		size_t n;
		(void)gguf_kv_i64(g, i, &iv);
		(void)gguf_kv_f64(g, i, &dv);
		(void)gguf_kv_str(g, i, &s, &n);
		if (gguf_arr_n(g, i)) {
			float f;
			(void)gguf_arr_i64(g, i, 0, &iv);
			(void)gguf_arr_f32(g, i, gguf_arr_n(g, i) - 1, &f);
			(void)gguf_arr_str(g, i, 0, &s, &n);
		}
	}
	tok_t *t;
	if (tok_load(&t, g, err, sizeof err) == 0) {
		/* the last bytes of the input double as text to encode */
		size_t tl = size < 64 ? size : 64;
		int *ids, n;
		if (tok_encode(t, (const char *)data + size - tl, tl, 1, 1, &ids, &n) == 0) {
			char *text;
			size_t len;
			if (tok_decode(t, ids, n, TOK_DECODE_SPECIAL, &text, &len) == 0)
				free(text);
			tok_stream_t st;
			if (tok_stream_init(&st, t, 0) == 0) {
				for (int i = 0; i < n; i++)
					(void)tok_stream_push(&st, ids[i], &len);
				(void)tok_stream_flush(&st, &len);
				tok_stream_free(&st);
			}
			free(ids);
		}
		tok_free(t);
	}
	const char *tmpl, *fam;
	size_t tl;
	if (gguf_get_str(g, "tokenizer.chat_template", &tmpl, &tl) == 0)
		(void)chat_pick(NULL, tmpl, tl, &fam, err, sizeof err);
	gguf_free(g);
	return 0;
}
