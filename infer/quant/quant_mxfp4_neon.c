/*
 * quant_mxfp4_neon.c: the MXFP4 matvec kernel and dequantize for Arm NEON (every AArch64 CPU;
 * the table is always handed out there). A block's codes become signed weight bytes by one
 * table lookup (vqtbl1q_s8 through ggml's kvalues_mxfp4, quant_mxfp4.c), then an int32 dot
 * product with the 8-bit activations: sdot when built with __ARM_FEATURE_DOTPROD, else byte
 * products widened to int16 and pairwise added (vmull_s8 + vpadalq_s16), as quant_neon.c's
 * kernels. One float FMA per block with the scale 2^(e - 128) times the activation's.
 *
 * Invariant: the results equal quant_mxfp4.c's ref_rows_mxfp4 up to float summation order; the
 * dequantize is bit-exact with the reference.
 */
#include "infer/quant/quant.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

static inline int32x4_t mx_dot_i8(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if defined(__ARM_FEATURE_DOTPROD)
	return vdotq_s32(acc, a, b);
#else
	acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
	return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

/* A block's 32 weights as signed bytes: *lo elements 0-15, *hi elements 16-31. */
static inline void mx_bytes(int8x16_t tbl, const blk_mxfp4 *b, int8x16_t *lo, int8x16_t *hi)
{
	uint8x16_t v = vld1q_u8(b->qs);
	*lo = vqtbl1q_s8(tbl, vandq_u8(v, vdupq_n_u8(0x0f)));
	*hi = vqtbl1q_s8(tbl, vshrq_n_u8(v, 4));
}

static inline int32x4_t mx_block_dot(int8x16_t tbl, const blk_mxfp4 *b, const int8_t *q)
{
	int8x16_t lo, hi;
	mx_bytes(tbl, b, &lo, &hi);
	int32x4_t p = mx_dot_i8(vdupq_n_s32(0), lo, vld1q_s8(q));
	return mx_dot_i8(p, hi, vld1q_s8(q + 16));
}

static void neon_rows_mxfp4(float *out, const uint8_t *w, size_t stride, int nrows,
			    const quant_act_t *x, int n)
{
	const int nb = n / 32;
	const int8x16_t tbl = vld1q_s8(quant_mxfp4_values);
	for (int r = 0; r < nrows; r++) {
		const blk_mxfp4 *b = (const blk_mxfp4 *)(w + (size_t)r * stride);
		float32x4_t a0 = vdupq_n_f32(0), a1 = a0;
		int i = 0;
		for (; i + 2 <= nb; i += 2) {
			int32x4_t p0 = mx_block_dot(tbl, &b[i], x->q + 32 * i);
			int32x4_t p1 = mx_block_dot(tbl, &b[i + 1], x->q + 32 * i + 32);
			a0 = vfmaq_n_f32(a0, vcvtq_f32_s32(p0), quant_e8m0_half(b[i].e) * x->d[i]);
			a1 = vfmaq_n_f32(a1, vcvtq_f32_s32(p1),
					 quant_e8m0_half(b[i + 1].e) * x->d[i + 1]);
		}
		for (; i < nb; i++) {
			int32x4_t p0 = mx_block_dot(tbl, &b[i], x->q + 32 * i);
			a0 = vfmaq_n_f32(a0, vcvtq_f32_s32(p0), quant_e8m0_half(b[i].e) * x->d[i]);
		}
		out[r] = vaddvq_f32(vaddq_f32(a0, a1));
	}
}

/* 16 signed bytes to float times d at dst[0..15] (exact products: the reference's). */
static inline void mx_store(float *dst, int8x16_t v, float d)
{
	int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
	vst1q_f32(dst, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
	vst1q_f32(dst + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), d));
	vst1q_f32(dst + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
	vst1q_f32(dst + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), d));
}

static void neon_dq_mxfp4(const void *src, float *dst, int n)
{
	const blk_mxfp4 *b = src;
	const int8x16_t tbl = vld1q_s8(quant_mxfp4_values);
	for (int i = 0; i < n / 32; i++, dst += 32) {
		int8x16_t lo, hi;
		mx_bytes(tbl, &b[i], &lo, &hi);
		float d = quant_e8m0_half(b[i].e);
		mx_store(dst, lo, d);
		mx_store(dst + 16, hi, d);
	}
}

#if defined(__ARM_FEATURE_DOTPROD)
#define MX_IMPL "neon-dotprod"
#else
#define MX_IMPL "neon"
#endif

static const quant_ops_t neon_mxfp4 = {MX_IMPL, QT_Q8_0, neon_rows_mxfp4, neon_dq_mxfp4, NULL};

const quant_ops_t *quant_mxfp4_neon_ops(void)
{
	return &neon_mxfp4;
}

#else

const quant_ops_t *quant_mxfp4_neon_ops(void)
{
	return NULL;
}

#endif
