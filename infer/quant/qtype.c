/*
 * qtype.c: the one table of ggml tensor type facts (name, block size, block bytes, whether the
 * engine computes with the type), indexed by the type number GGUF stores. The GGUF reader sizes
 * every tensor from it, the loader and the writer ask it what is supported, the kernels and the
 * command line name types through it: nothing else lists types.
 *
 * Invariant: a row with block != 0 has bytes != 0; a type the engine computes with (QTF_WEIGHT)
 * has reference dequantize, quantize and matvec kernels in quant.c / quant_lowbit.c.
 */
#include "infer/quant/quant.h"

#include <strings.h>

enum { QTF_WEIGHT = 1 }; /* the engine has kernels for weights of this type */

static const struct qtype_row {
	const char *ggml; /* ggml's spelling (ggml.c type_traits .type_name, upper case) */
	const char *name; /* ours: lower case, as --type and --kv-type take it */
	int block;        /* elements per block (1 for element types) */
	int bytes;        /* bytes per block */
	int flags;
} rows[QT_NTYPES] = {
    /* the block sizes are ggml's (ggml/src/ggml-common.h); the kernel types' match the
     * block structs (static asserts in quant.h) */
    [QT_F32] = {"F32", "f32", 1, 4, QTF_WEIGHT},
    [QT_F16] = {"F16", "f16", 1, 2, QTF_WEIGHT},
    [QT_Q4_0] = {"Q4_0", "q4_0", QK4_0, sizeof(blk_q4_0), QTF_WEIGHT},
    [3] = {"Q4_1", "q4_1", 32, 20, 0},
    [QT_Q5_0] = {"Q5_0", "q5_0", 32, sizeof(blk_q5_0), QTF_WEIGHT},
    [QT_Q5_1] = {"Q5_1", "q5_1", 32, sizeof(blk_q5_1), QTF_WEIGHT},
    [QT_Q8_0] = {"Q8_0", "q8_0", QK8_0, sizeof(blk_q8_0), QTF_WEIGHT},
    [9] = {"Q8_1", "q8_1", 32, 36, 0},
    [QT_Q2_K] = {"Q2_K", "q2_k", QK_K, sizeof(blk_q2_k), QTF_WEIGHT},
    [QT_Q3_K] = {"Q3_K", "q3_k", QK_K, sizeof(blk_q3_k), QTF_WEIGHT},
    [QT_Q4_K] = {"Q4_K", "q4_k", QK_K, sizeof(blk_q4_k), QTF_WEIGHT},
    [QT_Q5_K] = {"Q5_K", "q5_k", QK_K, sizeof(blk_q5_k), QTF_WEIGHT},
    [QT_Q6_K] = {"Q6_K", "q6_k", QK_K, sizeof(blk_q6_k), QTF_WEIGHT},
    [QT_Q8_K] = {"Q8_K", "q8_k", QK_K, 292, 0}, /* activations only */
    [16] = {"IQ2_XXS", "iq2_xxs", 256, 66, 0},
    [17] = {"IQ2_XS", "iq2_xs", 256, 74, 0},
    [18] = {"IQ3_XXS", "iq3_xxs", 256, 98, 0},
    [19] = {"IQ1_S", "iq1_s", 256, 50, 0},
    [20] = {"IQ4_NL", "iq4_nl", 32, 18, 0},
    [21] = {"IQ3_S", "iq3_s", 256, 110, 0},
    [22] = {"IQ2_S", "iq2_s", 256, 82, 0},
    [23] = {"IQ4_XS", "iq4_xs", 256, 136, 0},
    [24] = {"I8", "i8", 1, 1, 0},
    [25] = {"I16", "i16", 1, 2, 0},
    [26] = {"I32", "i32", 1, 4, 0},
    [27] = {"I64", "i64", 1, 8, 0},
    [28] = {"F64", "f64", 1, 8, 0},
    [29] = {"IQ1_M", "iq1_m", 256, 56, 0},
    [QT_BF16] = {"BF16", "bf16", 1, 2, QTF_WEIGHT},
    [34] = {"TQ1_0", "tq1_0", 256, 54, 0},
    [35] = {"TQ2_0", "tq2_0", 256, 66, 0},
    [QT_MXFP4] = {"MXFP4", "mxfp4", 32, sizeof(blk_mxfp4), QTF_WEIGHT},
};

static const struct qtype_row *row_of(int t)
{
	return t >= 0 && t < QT_NTYPES && rows[t].block ? &rows[t] : NULL;
}

int quant_type_known(int t)
{
	return row_of(t) != NULL;
}

int quant_type_supported(int t)
{
	const struct qtype_row *r = row_of(t);
	return r && (r->flags & QTF_WEIGHT);
}

const char *quant_type_name(int t)
{
	const struct qtype_row *r = row_of(t);
	return r ? r->name : "?";
}

const char *quant_type_ggml_name(int t)
{
	const struct qtype_row *r = row_of(t);
	return r ? r->ggml : "?";
}

int quant_type_parse(const char *s)
{
	for (int t = 0; t < QT_NTYPES; t++)
		if (quant_type_supported(t) && !strcasecmp(s, rows[t].name))
			return t;
	return -1;
}

int quant_block_elems(int t)
{
	const struct qtype_row *r = row_of(t);
	return r ? r->block : 0;
}

size_t quant_block_bytes(int t)
{
	const struct qtype_row *r = row_of(t);
	return r ? (size_t)r->bytes : 0;
}

size_t quant_row_bytes(int t, int64_t n)
{
	const struct qtype_row *r = row_of(t);
	if (!r || n < 0 || n % r->block)
		return 0;
	return (size_t)(n / r->block) * (size_t)r->bytes;
}
