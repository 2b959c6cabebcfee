/*
 * quant_mxfp4.c: MXFP4, the OCP microscaling 4-bit float format gpt-oss ships its expert weights
 * in, in plain C: dequantize, quantize and the reference dot product against Q8_0 activations.
 *
 * Layout and values are ggml's (ggml/src/ggml-common.h block_mxfp4 and kvalues_mxfp4;
 * ggml/src/ggml-quants.c dequantize_row_mxfp4 and quantize_row_mxfp4_ref; ggml-impl.h
 * ggml_e8m0_to_fp32_half): a block of 32 holds one E8M0 exponent byte and 16 bytes of E2M1
 * codes, element j in the low nibble of qs[j] and element j + 16 in its high nibble. ggml keeps
 * the E2M1 values doubled, so they are small integers (0, ±1, ±2, ±3, ±4, ±6, ±8, ±12), and the
 * scale halved: value = kvalue * 2^(e - 128). The integer values make the dot product with 8-bit
 * activations exact in int32 (as ggml_vec_dot_mxfp4_q8_0 does): per block
 * 2^(e-128) * d_x * sum(kvalue * q_x).
 *
 * Invariant: pure functions; the optimized kernels (quant_mxfp4_x86.c, quant_neon.c) equal
 * ref_rows_mxfp4 up to float summation order.
 */
#include "infer/quant/quant.h"

#include <math.h>

const int8_t quant_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void quant_mxfp4_dequant(const void *src, float *dst, int64_t n)
{
	const blk_mxfp4 *b = src;
	for (int64_t i = 0; i < n / 32; i++, dst += 32) {
		float d = quant_e8m0_half(b[i].e);
		for (int j = 0; j < 16; j++) {
			dst[j] = (float)quant_mxfp4_values[b[i].qs[j] & 0xf] * d;
			dst[j + 16] = (float)quant_mxfp4_values[b[i].qs[j] >> 4] * d;
		}
	}
}

/* The code whose value times d is nearest x, the lowest on a tie (ggml's best_index_mxfp4). */
static int nearest_code(float x, float d)
{
	int best = 0;
	float err = fabsf((float)quant_mxfp4_values[0] * d - x);
	for (int i = 1; i < 16; i++) {
		float e = fabsf((float)quant_mxfp4_values[i] * d - x);
		if (e < err) {
			best = i;
			err = e;
		}
	}
	return best;
}

void quant_mxfp4_quantize(const float *x, void *dst, int64_t n)
{
	blk_mxfp4 *b = dst;
	for (int64_t i = 0; i < n / 32; i++, x += 32) {
		float amax = 0;
		for (int j = 0; j < 32; j++)
			amax = fmaxf(amax, fabsf(x[j]));
		/* the largest value (12 doubled = 6) lands near amax: e = floor(log2 amax) - 2 +
		 * 127, kept in 0..254 (ggml leaves values below 2^-125 undefined; 255 is NaN) */
		int e = amax > 0 ? (int)floorf(log2f(amax)) - 2 + 127 : 0;
		e = e < 0 ? 0 : e > 254 ? 254 : e;
		b[i].e = (uint8_t)e;
		float d = quant_e8m0_half(b[i].e);
		for (int j = 0; j < 16; j++)
			b[i].qs[j] =
			    (uint8_t)(nearest_code(x[j], d) | nearest_code(x[j + 16], d) << 4);
	}
}

static void ref_rows_mxfp4(float *out, const uint8_t *w, size_t stride, int nrows,
			   const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const blk_mxfp4 *b = (const blk_mxfp4 *)(w + (size_t)r * stride);
		float s = 0;
		for (int i = 0; i < n / 32; i++) {
			const int8_t *q = x->q + 32 * i;
			int sum = 0;
			for (int j = 0; j < 16; j++)
				sum += quant_mxfp4_values[b[i].qs[j] & 0xf] * q[j] +
				       quant_mxfp4_values[b[i].qs[j] >> 4] * q[j + 16];
			s += quant_e8m0_half(b[i].e) * x->d[i] * (float)sum;
		}
		out[r] = s;
	}
}

static void ref_dq_mxfp4(const void *src, float *dst, int n)
{
	quant_mxfp4_dequant(src, dst, n);
}

static const quant_ops_t ref_mxfp4 = {"ref", QT_Q8_0, ref_rows_mxfp4, ref_dq_mxfp4, NULL};

const quant_ops_t *quant_mxfp4_ops_ref(void)
{
	return &ref_mxfp4;
}
