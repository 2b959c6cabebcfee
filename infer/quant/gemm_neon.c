/*
 * gemm_neon.c: the tiled integer kernels over R16 groups (repack.h) for Arm with the 8-bit dot
 * product (sdot, __ARM_FEATURE_DOTPROD): a group's 64-byte k-step is four 16-byte registers of
 * 4 rows x 4 bytes, and vdotq_s32 with four activation bytes duplicated to every lane adds each
 * row's 4 products into its own lane, so no horizontal sums are needed. Q8_0 bytes go back to
 * signed weights with one XOR; Q4_0 nibbles (0..15) are used as they are and the -8 comes off
 * through the activation's block sum. Two vectors per pass (8 float + 8 int accumulators).
 * Without sdot (a baseline armv8-a build) there is no kernel here: the model then keeps the
 * original layout and quant_neon.c's matvec kernels.
 * Invariant: equal to repack.c's reference up to float rounding order.
 */
#include "infer/quant/repack.h"

#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)

#include <arm_neon.h>
#include <string.h>

static inline int32x4_t bcast4(const int8_t *p)
{
	int32_t v;
	memcpy(&v, p, 4);
	return vdupq_n_s32(v);
}

static inline float32x4_t f16x4(const uint8_t *p)
{
	return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p)));
}

static inline __attribute__((always_inline)) void neon_gemm(float *out, int ldo, const uint8_t *w,
							    int ngroups, const quant_act_t *x,
							    const int NT, int n, const int Q4)
{
	const int nb = n / QK8_0;
	const size_t gb = Q4 ? 288 : 544;
	const uint8x16_t m4 = vdupq_n_u8(0x0f), flip = vdupq_n_u8(0x80);
	for (int g = 0; g < ngroups; g++) {
		const uint8_t *gp = w + (size_t)g * nb * gb;
		float32x4_t acc[2][4];
		_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
		    _Pragma("GCC unroll 8") for (int k = 0; k < 4; k++) acc[v][k] = vdupq_n_f32(0);
		for (int i = 0; i < nb; i++) {
			const uint8_t *d = gp + (size_t)i * gb, *q = d + 32;
			int32x4_t ia[2][4];
			_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
			    _Pragma("GCC unroll 8") for (int k = 0; k < 4; k++) ia[v][k] =
				vdupq_n_s32(Q4 ? -8 * x[v].bsums[i] : 0);
			for (int s = 0; s < (Q4 ? 4 : 8); s++)
				_Pragma("GCC unroll 8") for (int k = 0; k < 4; k++)
				{
					uint8x16_t b = vld1q_u8(q + 64 * s + 16 * k);
					_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
					{
						const int8_t *xq = x[v].q + 32 * i + 4 * s;
						if (Q4) {
							int8x16_t lo =
							    vreinterpretq_s8_u8(vandq_u8(b, m4));
							int8x16_t hi =
							    vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
							ia[v][k] = vdotq_s32(
							    ia[v][k], lo,
							    vreinterpretq_s8_s32(bcast4(xq)));
							ia[v][k] = vdotq_s32(
							    ia[v][k], hi,
							    vreinterpretq_s8_s32(bcast4(xq + 16)));
						} else {
							int8x16_t sb =
							    vreinterpretq_s8_u8(veorq_u8(b, flip));
							ia[v][k] = vdotq_s32(
							    ia[v][k], sb,
							    vreinterpretq_s8_s32(bcast4(xq)));
						}
					}
				}
			_Pragma("GCC unroll 8") for (int k = 0; k < 4; k++)
			{
				float32x4_t sw = f16x4(d + 8 * k);
				_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++) acc[v][k] =
				    vfmaq_f32(acc[v][k], vcvtq_f32_s32(ia[v][k]),
					      vmulq_n_f32(sw, x[v].d[i]));
			}
		}
		_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
		    _Pragma("GCC unroll 8") for (int k = 0; k < 4; k++)
			vst1q_f32(out + (size_t)v * ldo + g * QR_ROWS + 4 * k, acc[v][k]);
	}
}

static void neon_gemm_q8_0(float *out, int ldo, const uint8_t *w, int ngroups, const quant_act_t *x,
			   int nt, int n)
{
	for (int v = 0; v < nt; v += 2) {
		if (nt - v >= 2)
			neon_gemm(out + (size_t)v * ldo, ldo, w, ngroups, x + v, 2, n, 0);
		else
			neon_gemm(out + (size_t)v * ldo, ldo, w, ngroups, x + v, 1, n, 0);
	}
}

static void neon_gemm_q4_0(float *out, int ldo, const uint8_t *w, int ngroups, const quant_act_t *x,
			   int nt, int n)
{
	for (int v = 0; v < nt; v += 2) {
		if (nt - v >= 2)
			neon_gemm(out + (size_t)v * ldo, ldo, w, ngroups, x + v, 2, n, 1);
		else
			neon_gemm(out + (size_t)v * ldo, ldo, w, ngroups, x + v, 1, n, 1);
	}
}

quant_gemm_fn quant_neon_gemm(int t, const char **impl)
{
	*impl = "neon";
	switch (t) {
	case QT_Q8_0: return neon_gemm_q8_0;
	case QT_Q4_0: return neon_gemm_q4_0;
	default: *impl = NULL; return NULL;
	}
}

#else

quant_gemm_fn quant_neon_gemm(int t, const char **impl)
{
	(void)t;
	(void)impl;
	return NULL;
}

#endif
