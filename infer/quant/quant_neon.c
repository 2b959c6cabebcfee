/*
 * quant_neon.c: Arm NEON matvec kernels (Apple silicon, Graviton, Raspberry Pi 4/5). NEON is part
 * of every AArch64 CPU, so unlike the x86 tables there is no run-time check: an aarch64 build
 * always hands these tables out. The 8-bit dot product (sdot, vdotq_s32) is optional in Armv8.2
 * and chosen at compile time: with __ARM_FEATURE_DOTPROD (clang's default for arm64 macOS, or
 * -march=armv8.2-a+dotprod) dot_i8() is one sdot; without it, the baseline build multiplies byte
 * pairs into int16 (vmull_s8) and folds pairs into int32 (vpadalq_s16), and contains no sdot.
 * On other targets this file is empty (quant_neon_ops() returns NULL).
 *
 * Float types: four vfmaq_f32 accumulators (F16 widened with vcvt_f32_f16, BF16 by a 16-bit
 * shift). Q8_0/Q4_0: per block one int32x4 dot, scaled into float accumulators; MXFP4 likewise,
 * its codes looked up in the value table (vqtbl1q), its exponent as the scale. Q4_K/Q6_K: an
 * exact integer sum per 256-element block (sub-block scales folded in as int32 multiplies, Q4_K's
 * mins through the activation's bsums), then the reference's float expression.
 * Q8_0 activations (quant_neon_act_q8_0) are quantized as ggml's NEON code does, which rounds
 * halves to even where quant.c's plain C (ggml's reference) rounds them away from zero.
 * Invariant: the results equal the reference kernels (quant.c) up to float summation order; the
 * dequantize entries given here are bit-exact with the reference.
 */
#include "infer/quant/quant.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>
#include <string.h>

/* Exact fp16 -> fp32 (fcvt); the same value as quant_f16_to_f32(), subnormals included. */
static inline float f16(uint16_t h)
{
	__fp16 v;
	memcpy(&v, &h, sizeof v);
	return (float)v;
}

/* acc + the 16 products a[i] * b[i] of signed bytes, summed into 4 int32 lanes (which lane gets
 * which product differs between the two paths; callers only use lane sums or whole-vector
 * scales). |a|, |b| <= 128 keeps every int16 product exact. */
static inline int32x4_t dot_i8(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if defined(__ARM_FEATURE_DOTPROD)
	return vdotq_s32(acc, a, b);
#else
	acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
	return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

static void neon_rows_f32(float *out, const uint8_t *w, size_t stride, int nrows,
			  const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const float *row = (const float *)(w + r * stride);
		float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
		int i = 0;
		for (; i + 16 <= n; i += 16) {
			a0 = vfmaq_f32(a0, vld1q_f32(row + i), vld1q_f32(x->f + i));
			a1 = vfmaq_f32(a1, vld1q_f32(row + i + 4), vld1q_f32(x->f + i + 4));
			a2 = vfmaq_f32(a2, vld1q_f32(row + i + 8), vld1q_f32(x->f + i + 8));
			a3 = vfmaq_f32(a3, vld1q_f32(row + i + 12), vld1q_f32(x->f + i + 12));
		}
		float s = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
		for (; i < n; i++)
			s += row[i] * x->f[i];
		out[r] = s;
	}
}

/* Eight fp16 values widened to two float32x4. */
static inline void f16x8(const uint16_t *p, float32x4_t *lo, float32x4_t *hi)
{
	float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(p));
	*lo = vcvt_f32_f16(vget_low_f16(h));
	*hi = vcvt_f32_f16(vget_high_f16(h));
}

static void neon_rows_f16(float *out, const uint8_t *w, size_t stride, int nrows,
			  const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const uint16_t *row = (const uint16_t *)(w + r * stride);
		float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0, w0, w1, w2, w3;
		int i = 0;
		for (; i + 16 <= n; i += 16) {
			f16x8(row + i, &w0, &w1);
			f16x8(row + i + 8, &w2, &w3);
			a0 = vfmaq_f32(a0, w0, vld1q_f32(x->f + i));
			a1 = vfmaq_f32(a1, w1, vld1q_f32(x->f + i + 4));
			a2 = vfmaq_f32(a2, w2, vld1q_f32(x->f + i + 8));
			a3 = vfmaq_f32(a3, w3, vld1q_f32(x->f + i + 12));
		}
		float s = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
		for (; i < n; i++)
			s += f16(row[i]) * x->f[i];
		out[r] = s;
	}
}

/* Eight bf16 values widened (bf16 is the top half of an fp32) to two float32x4. */
static inline void bf16x8(const uint16_t *p, float32x4_t *lo, float32x4_t *hi)
{
	uint16x8_t h = vld1q_u16(p);
	*lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
	*hi = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
}

static void neon_rows_bf16(float *out, const uint8_t *w, size_t stride, int nrows,
			   const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const uint16_t *row = (const uint16_t *)(w + r * stride);
		float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0, w0, w1, w2, w3;
		int i = 0;
		for (; i + 16 <= n; i += 16) {
			bf16x8(row + i, &w0, &w1);
			bf16x8(row + i + 8, &w2, &w3);
			a0 = vfmaq_f32(a0, w0, vld1q_f32(x->f + i));
			a1 = vfmaq_f32(a1, w1, vld1q_f32(x->f + i + 4));
			a2 = vfmaq_f32(a2, w2, vld1q_f32(x->f + i + 8));
			a3 = vfmaq_f32(a3, w3, vld1q_f32(x->f + i + 12));
		}
		float s = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
		for (; i < n; i++)
			s += quant_bf16_to_f32(row[i]) * x->f[i];
		out[r] = s;
	}
}

/* One 32-element block: weights w0|w1 (elements 0-15 | 16-31) against activations q. */
static inline int32x4_t dot_blk32(int8x16_t w0, int8x16_t w1, const int8_t *q)
{
	int32x4_t p = dot_i8(vdupq_n_s32(0), w0, vld1q_s8(q));
	return dot_i8(p, w1, vld1q_s8(q + 16));
}

static void neon_rows_q8_0(float *out, const uint8_t *w, size_t stride, int nrows,
			   const quant_act_t *x, int n)
{
	const int nb = n / QK8_0;
	for (int r = 0; r < nrows; r++) {
		const blk_q8_0 *b = (const blk_q8_0 *)(w + r * stride);
		float32x4_t a0 = vdupq_n_f32(0), a1 = a0;
		int i = 0;
		for (; i + 2 <= nb; i += 2) {
			int32x4_t p0 =
			    dot_blk32(vld1q_s8(b[i].q), vld1q_s8(b[i].q + 16), x->q + i * 32);
			int32x4_t p1 = dot_blk32(vld1q_s8(b[i + 1].q), vld1q_s8(b[i + 1].q + 16),
						 x->q + i * 32 + 32);
			a0 = vfmaq_n_f32(a0, vcvtq_f32_s32(p0), f16(b[i].d) * x->d[i]);
			a1 = vfmaq_n_f32(a1, vcvtq_f32_s32(p1), f16(b[i + 1].d) * x->d[i + 1]);
		}
		for (; i < nb; i++) {
			int32x4_t p0 =
			    dot_blk32(vld1q_s8(b[i].q), vld1q_s8(b[i].q + 16), x->q + i * 32);
			a0 = vfmaq_n_f32(a0, vcvtq_f32_s32(p0), f16(b[i].d) * x->d[i]);
		}
		out[r] = vaddvq_f32(vaddq_f32(a0, a1));
	}
}

/* A Q4_0 block's 32 weights as signed bytes: *lo = elements 0-15 (low nibbles), *hi = 16-31. */
static inline void q4_0_bytes(const blk_q4_0 *b, int8x16_t *lo, int8x16_t *hi)
{
	uint8x16_t v = vld1q_u8(b->qs);
	const int8x16_t eight = vdupq_n_s8(8);
	*lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), eight);
	*hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight);
}

static void neon_rows_q4_0(float *out, const uint8_t *w, size_t stride, int nrows,
			   const quant_act_t *x, int n)
{
	const int nb = n / QK4_0;
	for (int r = 0; r < nrows; r++) {
		const blk_q4_0 *b = (const blk_q4_0 *)(w + r * stride);
		float32x4_t a0 = vdupq_n_f32(0), a1 = a0;
		int8x16_t l0, h0, l1, h1;
		int i = 0;
		for (; i + 2 <= nb; i += 2) {
			q4_0_bytes(&b[i], &l0, &h0);
			q4_0_bytes(&b[i + 1], &l1, &h1);
			int32x4_t p0 = dot_blk32(l0, h0, x->q + i * 32);
			int32x4_t p1 = dot_blk32(l1, h1, x->q + i * 32 + 32);
			a0 = vfmaq_n_f32(a0, vcvtq_f32_s32(p0), f16(b[i].d) * x->d[i]);
			a1 = vfmaq_n_f32(a1, vcvtq_f32_s32(p1), f16(b[i + 1].d) * x->d[i + 1]);
		}
		for (; i < nb; i++) {
			q4_0_bytes(&b[i], &l0, &h0);
			int32x4_t p0 = dot_blk32(l0, h0, x->q + i * 32);
			a0 = vfmaq_n_f32(a0, vcvtq_f32_s32(p0), f16(b[i].d) * x->d[i]);
		}
		out[r] = vaddvq_f32(vaddq_f32(a0, a1));
	}
}

/* Q4_K's eight 6-bit scales and mins, unpacked as quant.c's quant_k4_scale_min() reads them: bytes
 * 0-3 / 4-7 hold scales / mins 0-3 (low 6 bits) and the top 2 bits of scales / mins 4-7; bytes
 * 8-11 the low 4 bits of scale 4+j (low nibble) and min 4+j (high nibble). */
static inline void q4k_unpack(const uint8_t *s, int32_t *sc, int16_t *m)
{
	for (int j = 0; j < 4; j++) {
		sc[j] = s[j] & 63;
		m[j] = (int16_t)(s[j + 4] & 63);
		sc[j + 4] = (s[j + 8] & 0xf) | ((s[j] >> 6) << 4);
		m[j + 4] = (int16_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
	}
}

static void neon_rows_q4_k(float *out, const uint8_t *w, size_t stride, int nrows,
			   const quant_act_t *x, int n)
{
	const int nb = n / QK_K;
	const uint8x16_t m4 = vdupq_n_u8(0x0f);
	for (int r = 0; r < nrows; r++) {
		const blk_q4_k *b = (const blk_q4_k *)(w + r * stride);
		float s = 0;
		for (int i = 0; i < nb; i++) {
			int32_t sc[8];
			int16_t m[8];
			q4k_unpack(b[i].scales, sc, m);
			const int8_t *q = x->q + i * QK_K;
			const int16_t *bs = x->bsums + i * 16;
			/* Sub-block j's activation sum is bsums[2j] + bsums[2j+1] (|.| <= 4064). */
			int16x8_t pair = vpaddq_s16(vld1q_s16(bs), vld1q_s16(bs + 8));
			int16x8_t mv = vld1q_s16(m);
			int32x4_t mp = vmull_s16(vget_low_s16(mv), vget_low_s16(pair));
			mp = vmlal_high_s16(mp, mv, pair);
			int32x4_t acc = vdupq_n_s32(0);
			/* 64 elements per step: sub-blocks 2c (low nibbles), 2c+1 (high) */
			for (int c = 0; c < 4; c++) {
				uint8x16_t v0 = vld1q_u8(b[i].qs + 32 * c);
				uint8x16_t v1 = vld1q_u8(b[i].qs + 32 * c + 16);
				int8x16_t l0 = vreinterpretq_s8_u8(vandq_u8(v0, m4));
				int8x16_t l1 = vreinterpretq_s8_u8(vandq_u8(v1, m4));
				int8x16_t h0 = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4));
				int8x16_t h1 = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));
				acc = vmlaq_n_s32(acc, dot_blk32(l0, l1, q + 64 * c), sc[2 * c]);
				acc = vmlaq_n_s32(acc, dot_blk32(h0, h1, q + 64 * c + 32),
						  sc[2 * c + 1]);
			}
			int isum = vaddvq_s32(acc), msum = vaddvq_s32(mp);
			s += x->d[i] * (f16(b[i].d) * (float)isum - f16(b[i].dmin) * (float)msum);
		}
		out[r] = s;
	}
}

/* Q6_K: group g (16 elements, 16g..16g+15) lies in half h = g/8, quarter k = (g%8)/2, part t =
 * g%2. Element 128h+32k+l (l < 32) takes the nibble (k&2 ? high : low) of ql[64h + 32(k&1) + l]
 * and bits 2k..2k+1 of qh[32h + l] on top, minus 32 (quant.c: q6k_get). Returns the block's
 * exact sum over g of scale[g] * (group g . q). */
static inline int q6k_block_dot(const blk_q6_k *b, const int8_t *q)
{
	const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(0x30);
	const int8x16_t k32 = vdupq_n_s8(32);
	int32x4_t acc = vdupq_n_s32(0);
	for (int g = 0; g < 16; g++) {
		int h = g / 8, k = (g % 8) / 2, t = g % 2;
		uint8x16_t lo = vld1q_u8(b->ql + 64 * h + 32 * (k & 1) + 16 * t);
		lo = (k & 2) ? vshrq_n_u8(lo, 4) : vandq_u8(lo, m4);
		/* bits 2k..2k+1 to bits 4..5: shift by 4-2k (a negative count shifts right) */
		uint8x16_t hb = vld1q_u8(b->qh + 32 * h + 16 * t);
		uint8x16_t hi = vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(4 - 2 * k))), m3);
		int8x16_t v = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, hi)), k32);
		int32x4_t p = dot_i8(vdupq_n_s32(0), v, vld1q_s8(q + 16 * g));
		acc = vmlaq_n_s32(acc, p, b->scales[g]);
	}
	return vaddvq_s32(acc);
}

static void neon_rows_q6_k(float *out, const uint8_t *w, size_t stride, int nrows,
			   const quant_act_t *x, int n)
{
	const int nb = n / QK_K;
	for (int r = 0; r < nrows; r++) {
		const blk_q6_k *b = (const blk_q6_k *)(w + r * stride);
		float s = 0;
		for (int i = 0; i < nb; i++) {
			int acc = q6k_block_dot(&b[i], x->q + i * QK_K);
			s += x->d[i] * f16(b[i].d) * (float)acc;
		}
		out[r] = s;
	}
}

static void neon_dq_f16(const void *src, float *dst, int n)
{
	const uint16_t *p = src;
	float32x4_t lo, hi;
	int i = 0;
	for (; i + 8 <= n; i += 8) {
		f16x8(p + i, &lo, &hi);
		vst1q_f32(dst + i, lo);
		vst1q_f32(dst + i + 4, hi);
	}
	for (; i < n; i++)
		dst[i] = f16(p[i]);
}

/* 16 signed bytes to float, times d, stored at dst[0..15]. */
static inline void store_scaled(float *dst, int8x16_t v, float d)
{
	int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
	vst1q_f32(dst, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
	vst1q_f32(dst + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), d));
	vst1q_f32(dst + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
	vst1q_f32(dst + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), d));
}

static void neon_dq_q8_0(const void *src, float *dst, int n)
{
	const blk_q8_0 *b = src;
	for (int i = 0; i < n / QK8_0; i++, dst += QK8_0) {
		float d = f16(b[i].d);
		store_scaled(dst, vld1q_s8(b[i].q), d);
		store_scaled(dst + 16, vld1q_s8(b[i].q + 16), d);
	}
}

static void neon_dq_q4_0(const void *src, float *dst, int n)
{
	const blk_q4_0 *b = src;
	int8x16_t lo, hi;
	for (int i = 0; i < n / QK4_0; i++, dst += QK4_0) {
		float d = f16(b[i].d);
		q4_0_bytes(&b[i], &lo, &hi);
		store_scaled(dst, lo, d);
		store_scaled(dst + 16, hi, d);
	}
}

/* ---- MXFP4 (quant_mxfp4.c): the codes through the value table (vqtbl1q), then as Q8_0 ---- */

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
	return dot_blk32(lo, hi, q);
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

static void neon_dq_mxfp4(const void *src, float *dst, int n)
{
	const blk_mxfp4 *b = src;
	const int8x16_t tbl = vld1q_s8(quant_mxfp4_values);
	for (int i = 0; i < n / 32; i++, dst += 32) {
		int8x16_t lo, hi;
		mx_bytes(tbl, &b[i], &lo, &hi);
		float d = quant_e8m0_half(b[i].e);
		store_scaled(dst, lo, d);
		store_scaled(dst + 16, hi, d);
	}
}

/* Q8_0 activations per block of 32 as ggml's NEON quantize_row_q8_0 (ggml-cpu/arch/arm/quants.c):
 * |x| max, the scale d = amax / 127 kept as F16 (block_q8_0.d), the values multiplied by 1 / d in
 * F32 and rounded to nearest even (fcvtns, vcvtnq_s32_f32; |x / d| <= 127 after rounding, so the
 * narrowing is exact), one int sum per block. */
static void neon_act_q8_0(const float *x, int n, int8_t *q, float *d, int16_t *bsums)
{
	for (int i = 0; i < n / QK8_0; i++, x += QK8_0, q += QK8_0) {
		float32x4_t v[8], m = vabsq_f32(vld1q_f32(x));
		for (int k = 0; k < 8; k++) {
			v[k] = vld1q_f32(x + 4 * k);
			m = vmaxq_f32(m, vabsq_f32(v[k]));
		}
		float amax = vmaxvq_f32(m), s = amax / 127.f, is = s != 0.f ? 1.f / s : 0.f;
		d[i] = f16(quant_f32_to_f16(s));
		int32x4_t sum = vdupq_n_s32(0);
		for (int k = 0; k < 8; k += 2) {
			int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(v[k], is));
			int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(v[k + 1], is));
			sum = vaddq_s32(sum, vaddq_s32(a, b));
			int16x8_t h = vcombine_s16(vmovn_s32(a), vmovn_s32(b));
			vst1_s8(q + 4 * k, vmovn_s16(h));
		}
		bsums[i] = (int16_t)vaddvq_s32(sum);
	}
}

quant_act_q8_0_fn quant_neon_act_q8_0(void)
{
	return neon_act_q8_0;
}

#if defined(__ARM_FEATURE_DOTPROD)
#define IMPL "neon-dotprod"
#else
#define IMPL "neon"
#endif

/* Q4_K / Q6_K / F32 / BF16 dequantize: NULL, the reference is used (their float expressions are
 * left to the compiler's contraction, which an exact copy here could not promise to match).
 * rows8 (batched integer kernel): NULL, on purpose: with it model.c would never use sgemm for
 * these types, and on a Mac sgemm is Accelerate's, which nothing measured here says to give up. */
static const quant_ops_t neon_f32 = {IMPL, QT_F32, neon_rows_f32, NULL, NULL};
static const quant_ops_t neon_f16 = {IMPL, QT_F32, neon_rows_f16, neon_dq_f16, NULL};
static const quant_ops_t neon_bf16 = {IMPL, QT_F32, neon_rows_bf16, NULL, NULL};
static const quant_ops_t neon_q8_0 = {IMPL, QT_Q8_0, neon_rows_q8_0, neon_dq_q8_0, NULL};
static const quant_ops_t neon_q4_0 = {IMPL, QT_Q8_0, neon_rows_q4_0, neon_dq_q4_0, NULL};
static const quant_ops_t neon_q4_k = {IMPL, QT_Q8_K, neon_rows_q4_k, NULL, NULL};
static const quant_ops_t neon_q6_k = {IMPL, QT_Q8_K, neon_rows_q6_k, NULL, NULL};
static const quant_ops_t neon_mxfp4 = {IMPL, QT_Q8_0, neon_rows_mxfp4, neon_dq_mxfp4, NULL};

const quant_ops_t *quant_neon_ops(int wtype)
{
	switch (wtype) {
	case QT_F32: return &neon_f32;
	case QT_F16: return &neon_f16;
	case QT_BF16: return &neon_bf16;
	case QT_Q8_0: return &neon_q8_0;
	case QT_Q4_0: return &neon_q4_0;
	case QT_Q4_K: return &neon_q4_k;
	case QT_Q6_K: return &neon_q6_k;
	case QT_MXFP4: return &neon_mxfp4;
	default: return NULL;
	}
}

#else

const quant_ops_t *quant_neon_ops(int wtype)
{
	(void)wtype;
	return NULL;
}

quant_act_q8_0_fn quant_neon_act_q8_0(void)
{
	return NULL;
}

#endif
