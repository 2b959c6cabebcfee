/*
 * gguf_convert.c: a GGUF file rewritten with its weight matrices in another type (gguf_write.h),
 * e.g. an F16 copy of an F32 model to draft for it (docs/speculative.md). The tokenizer, the
 * hyperparameters and every other key/value are copied as they are, so the copy has the same
 * vocabulary; each converted row is dequantized to F32 and quantized again, one row in memory
 * at a time.
 */
#include "common/common.h"
#include "infer/gguf.h"
#include "infer/gguf_write.h"
#include "infer/quant/quant.h"

#include <stdlib.h>
#include <string.h>

/* llama.cpp's llama_ftype for a file whose matrices are of type t (include/llama.h), or -1. */
static int file_type_of(int t)
{
	switch (t) {
	case QT_F32: return 0;
	case QT_F16: return 1;
	case QT_Q4_0: return 2;
	case QT_Q8_0: return 7;
	case QT_Q5_0: return 8;
	case QT_Q5_1: return 9;
	case QT_Q2_K: return 10;
	case QT_Q3_K: return 12;
	case QT_Q4_K: return 15;
	case QT_Q5_K: return 17;
	case QT_Q6_K: return 18;
	case QT_BF16: return 32;
	case QT_MXFP4: return 38; /* LLAMA_FTYPE_MOSTLY_MXFP4_MOE */
	}
	return -1;
}

/* Tensors kept in their type whatever the target: routers stay F32 (as mkmodel and llama.cpp's
 * quantizer keep them), DeltaNet's convolution, decay and time step are read as F32. */
static int keep_type(const gguf_tensor_t *t)
{
	static const char *const keep[] = {"ffn_gate_inp", "ssm_conv1d", "ssm_a", "ssm_dt",
					   "exp_probs_b"};
	if (t->n_dims < 2)
		return 1;
	for (size_t i = 0; i < ARRAY_LEN(keep); i++)
		if (strstr(t->name, keep[i]))
			return 1;
	return 0;
}

int gguf_convert(const char *src, const char *dst, int type, char *err, size_t errlen)
{
	gguf_t *g = NULL;
	gguf_writer_t *w = NULL;
	float *row = NULL;
	uint8_t *q = NULL;
	char why[256];
	int rc, *to = NULL;
	if (!quant_type_supported(type) || file_type_of(type) < 0)
		return sh_fail(err, errlen, SH_EINVAL, "cannot convert to type %s",
			       quant_type_name(type));
	if ((rc = gguf_open(&g, src, why, sizeof why)))
		return sh_fail(err, errlen, rc, "%s", why);
	int nt = gguf_n_tensors(g);
	int64_t cols = 1;
	if (!(w = gw_new()) || !(to = malloc((size_t)MAX(nt, 1) * sizeof *to))) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto out;
	}
	for (int i = 0; i < gguf_n_kv(g); i++) {
		const char *k = gguf_key(g, i);
		if (!strcmp(k, "general.alignment") || !strcmp(k, "general.file_type"))
			continue; /* the writer's alignment; the new type below */
		if ((rc = gw_kv_copy(w, g, i))) {
			rc = sh_fail(err, errlen, rc, "%s: cannot copy key %s", src, k);
			goto out;
		}
	}
	if ((rc = gw_kv_u32(w, "general.file_type", (uint32_t)file_type_of(type)))) {
		rc = sh_fail(err, errlen, rc, "out of memory");
		goto out;
	}
	for (int i = 0; i < nt; i++) {
		const gguf_tensor_t *t = gguf_tensor(g, i);
		to[i] = keep_type(t) || t->ne[0] % quant_block_elems(type) ? t->type : type;
		if (to[i] != t->type && !quant_type_supported(t->type)) {
			rc = sh_fail(err, errlen, SH_EUNSUPP, "%s: tensor %s has type %s", src,
				     t->name, quant_type_name(t->type));
			goto out;
		}
		if ((rc = gw_tensor(w, t->name, t->n_dims, t->ne, to[i]))) {
			rc = sh_fail(err, errlen, rc, "%s: tensor %s cannot be written as %s", src,
				     t->name, quant_type_name(to[i]));
			goto out;
		}
		cols = MAX(cols, t->ne[0]);
	}
	row = malloc((size_t)cols * sizeof *row);
	q = malloc(quant_row_bytes(QT_F32, cols)); /* F32 is the widest row of any type */
	if (!row || !q) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = gw_begin(w, dst, err, errlen)))
		goto out;
	for (int i = 0; i < nt; i++) {
		const gguf_tensor_t *t = gguf_tensor(g, i);
		if (to[i] == t->type) {
			if ((rc = gw_data(w, t->data, (size_t)t->nbytes, err, errlen)))
				goto out;
			continue;
		}
		uint64_t in = quant_row_bytes(t->type, t->ne[0]), n_rows = t->nbytes / in;
		size_t outb = quant_row_bytes(to[i], t->ne[0]);
		for (uint64_t r = 0; r < n_rows; r++) {
			quant_dequant_row(t->type, (const uint8_t *)t->data + r * in, row,
					  t->ne[0]);
			quant_quantize_row(to[i], row, q, t->ne[0]);
			if ((rc = gw_data(w, q, outb, err, errlen)))
				goto out;
		}
	}
	rc = gw_finish(w, err, errlen);
out:
	free(row);
	free(q);
	free(to);
	gw_free(w);
	gguf_free(g);
	return rc;
}
