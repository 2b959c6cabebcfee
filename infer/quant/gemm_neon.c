/*
 * gemm_neon.c: the tiled integer kernels over R16 groups (repack.h) for Arm with the 8-bit dot
 * product (sdot, __ARM_FEATURE_DOTPROD): a group's 64-byte k-step is four 16-byte registers of
 * 4 rows x 4 bytes, and vdotq_s32 with four activation bytes duplicated to every lane adds each
 * row's 4 products into its own lane, so no horizontal sums are needed. Q8_0 bytes go back to
 * signed weights with one XOR; Q4_0 nibbles (0..15) are used as they are and the -8 comes off
 * through the activation's block sum. Two vectors per pass (8 float + 8 int accumulators).
 * Q4_K and Q6_K: one vector at a time (the 32 registers hold one vector's accumulators).
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
	const size_t gb = Q4 == 2 ? 272 : Q4 ? 288 : 544;
	const uint8x16_t m4 = vdupq_n_u8(0x0f), flip = vdupq_n_u8(0x80);
	const int8x16_t tbl = vld1q_s8(quant_mxfp4_values);
	for (int g = 0; g < ngroups; g++) {
		const uint8_t *gp = w + (size_t)g * nb * gb;
		float32x4_t acc[2][4];
		_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
		    _Pragma("GCC unroll 8") for (int k = 0; k < 4; k++) acc[v][k] = vdupq_n_f32(0);
		for (int i = 0; i < nb; i++) {
			const uint8_t *d = gp + (size_t)i * gb, *q = d + (Q4 == 2 ? 16 : 32);
			int32x4_t ia[2][4];
			_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
			    _Pragma("GCC unroll 8") for (int k = 0; k < 4; k++) ia[v][k] =
				vdupq_n_s32(Q4 == 1 ? -8 * x[v].bsums[i] : 0);
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
							if (Q4 ==
							    2) { /* signed values: no offset */
								lo = vqtbl1q_s8(
								    tbl, vreinterpretq_u8_s8(lo));
								hi = vqtbl1q_s8(
								    tbl, vreinterpretq_u8_s8(hi));
							}
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
				float32x4_t sw;
				if (Q4 == 2) {
					float e4[4];
					for (int r = 0; r < 4; r++)
						e4[r] = quant_e8m0_half(d[4 * k + r]);
					sw = vld1q_f32(e4);
				} else {
					sw = f16x4(d + 8 * k);
				}
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

static void neon_gemm_mxfp4(float *out, int ldo, const uint8_t *w, int ngroups,
			    const quant_act_t *x, int nt, int n)
{
	for (int v = 0; v < nt; v += 2) {
		if (nt - v >= 2)
			neon_gemm(out + (size_t)v * ldo, ldo, w, ngroups, x + v, 2, n, 2);
		else
			neon_gemm(out + (size_t)v * ldo, ldo, w, ngroups, x + v, 1, n, 2);
	}
}

/* Q4_K, one vector at a time (4 x 4 int32 accumulators per sub-block pair, 16 float ones):
 * per 256-element block the 16 rows' 6-bit scales and mins unpacked with word masks as in
 * gemm_x86.c, sub-block dots by sdot, scales by vmlaq_s32, mins x the activation's 32-element
 * sums by vmlaq_n_s32. */
static void neon_gemm_q4_k(float *out, int ldo, const uint8_t *w, int ngroups, const quant_act_t *x,
			   int nt, int n)
{
	const int nb = n / QK_K;
	const uint8x16_t m4 = vdupq_n_u8(0x0f);
	const uint32x4_t m6 = vdupq_n_u32(0x3f3f3f3f), m2 = vdupq_n_u32(0x03030303),
			 m0f = vdupq_n_u32(0x0f0f0f0f), ff = vdupq_n_u32(0xff);
	for (int v = 0; v < nt; v++)
		for (int g = 0; g < ngroups; g++) {
			const uint8_t *gp = w + (size_t)g * nb * 2304;
			float32x4_t acc[4];
			for (int k = 0; k < 4; k++)
				acc[k] = vdupq_n_f32(0);
			for (int i = 0; i < nb; i++) {
				const uint8_t *d = gp + (size_t)i * 2304;
				const int8_t *xq = x[v].q + QK_K * i;
				const int16_t *bs = x[v].bsums + 16 * i;
				for (int k = 0; k < 4; k++) { /* rows 4k..4k+3 */
					uint32x4_t u0 =
					    vld1q_u32((const uint32_t *)(d + 64) + 4 * k);
					uint32x4_t u1 =
					    vld1q_u32((const uint32_t *)(d + 128) + 4 * k);
					uint32x4_t u2 =
					    vld1q_u32((const uint32_t *)(d + 192) + 4 * k);
					uint32x4_t sc[2], mn[2];
					sc[0] = vandq_u32(u0, m6);
					sc[1] = vorrq_u32(
					    vandq_u32(u2, m0f),
					    vshlq_n_u32(vandq_u32(vshrq_n_u32(u0, 6), m2), 4));
					mn[0] = vandq_u32(u1, m6);
					mn[1] = vorrq_u32(
					    vandq_u32(vshrq_n_u32(u2, 4), m0f),
					    vshlq_n_u32(vandq_u32(vshrq_n_u32(u1, 6), m2), 4));
					int32x4_t isum = vdupq_n_s32(0), msum = vdupq_n_s32(0);
					for (int c = 0; c < 4; c++) {
						int32x4_t il = vdupq_n_s32(0), ih = vdupq_n_s32(0);
						const uint8_t *q = d + 256 + 512 * c + 16 * k;
						for (int s = 0; s < 8; s++) {
							uint8x16_t b = vld1q_u8(q + 64 * s);
							int8x16_t lo =
							    vreinterpretq_s8_u8(vandq_u8(b, m4));
							int8x16_t hi =
							    vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
							il = vdotq_s32(il, lo,
								       vreinterpretq_s8_s32(bcast4(
									   xq + 64 * c + 4 * s)));
							ih = vdotq_s32(
							    ih, hi,
							    vreinterpretq_s8_s32(
								bcast4(xq + 64 * c + 32 + 4 * s)));
						}
						for (int hh = 0; hh < 2; hh++) {
							int j = 2 * c + hh; /* sub-block */
							int32x4_t s = vreinterpretq_s32_u32(
							    vandq_u32(vshlq_u32(sc[j / 4],
										vdupq_n_s32(
										    -8 * (j % 4))),
								      ff));
							int32x4_t m = vreinterpretq_s32_u32(
							    vandq_u32(vshlq_u32(mn[j / 4],
										vdupq_n_s32(
										    -8 * (j % 4))),
								      ff));
							isum = vmlaq_s32(isum, hh ? ih : il, s);
							msum = vmlaq_n_s32(
							    msum, m, bs[2 * j] + bs[2 * j + 1]);
						}
					}
					float32x4_t dx = vdupq_n_f32(x[v].d[i]);
					float32x4_t dw = vmulq_f32(f16x4(d + 8 * k), dx);
					float32x4_t dm = vmulq_f32(f16x4(d + 32 + 8 * k), dx);
					acc[k] = vfmaq_f32(acc[k], vcvtq_f32_s32(isum), dw);
					acc[k] = vfmsq_f32(acc[k], vcvtq_f32_s32(msum), dm);
				}
			}
			for (int k = 0; k < 4; k++)
				vst1q_f32(out + (size_t)v * ldo + g * QR_ROWS + 4 * k, acc[k]);
		}
}

/* Q6_K, one vector at a time: 6-bit values from a low-nibble byte and the high-bit byte (as
 * gemm_x86.c), one accumulator per 16-element sub-block starting at -32 x its activation sum,
 * signed scales by vmlaq_s32. */
static void neon_gemm_q6_k(float *out, int ldo, const uint8_t *w, int ngroups, const quant_act_t *x,
			   int nt, int n)
{
	const int nb = n / QK_K;
	const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(0x03);
	for (int v = 0; v < nt; v++)
		for (int g = 0; g < ngroups; g++) {
			const uint8_t *gp = w + (size_t)g * nb * 3360;
			float32x4_t acc[4];
			for (int k = 0; k < 4; k++)
				acc[k] = vdupq_n_f32(0);
			for (int i = 0; i < nb; i++) {
				const uint8_t *d = gp + (size_t)i * 3360;
				const int8_t *xq = x[v].q + QK_K * i;
				const int16_t *bs = x[v].bsums + 16 * i;
				for (int r4 = 0; r4 < 4; r4++) { /* rows 4 r4 .. 4 r4 + 3 */
					int32x4_t isum = vdupq_n_s32(0);
					for (int h = 0; h < 2; h++)
						for (int sh = 0; sh < 2; sh++) {
							int32x4_t ia[4];
							for (int k = 0; k < 4; k++)
								ia[k] = vdupq_n_s32(
								    -32 * bs[8 * h + 2 * k + sh]);
							for (int s = 4 * sh; s < 4 * sh + 4; s++) {
								uint8x16_t hb = vld1q_u8(
								    d + 2336 + (h * 8 + s) * 64 +
								    16 * r4);
								for (int k = 0; k < 4; k++) {
									uint8x16_t l = vld1q_u8(
									    d + 288 +
									    ((h * 2 + k % 2) * 8 +
									     s) *
										64 +
									    16 * r4);
									l = k >= 2
										? vshrq_n_u8(l, 4)
										: vandq_u8(l, m4);
									uint8x16_t hi = vandq_u8(
									    vshlq_u8(
										hb,
										vdupq_n_s8(
										    (int8_t)(-2 *
											     k))),
									    m3);
									uint8x16_t q6 = vorrq_u8(
									    l, vshlq_n_u8(hi, 4));
									ia[k] = vdotq_s32(
									    ia[k],
									    vreinterpretq_s8_u8(q6),
									    vreinterpretq_s8_s32(
										bcast4(xq +
										       128 * h +
										       32 * k +
										       4 * s)));
								}
							}
							for (int k = 0; k < 4; k++) {
								int gi = 8 * h + 2 * k + sh;
								int8_t sc4[8] = {0};
								memcpy(sc4,
								       d + 32 + 16 * gi + 4 * r4,
								       4);
								int8x8_t s8 = vld1_s8(sc4);
								int32x4_t sc = vmovl_s16(
								    vget_low_s16(vmovl_s8(s8)));
								isum = vmlaq_s32(isum, ia[k], sc);
							}
						}
					float32x4_t dw =
					    vmulq_f32(f16x4(d + 8 * r4), vdupq_n_f32(x[v].d[i]));
					acc[r4] = vfmaq_f32(acc[r4], vcvtq_f32_s32(isum), dw);
				}
			}
			for (int k = 0; k < 4; k++)
				vst1q_f32(out + (size_t)v * ldo + g * QR_ROWS + 4 * k, acc[k]);
		}
}

quant_gemm_fn quant_neon_gemm(int t, const char **impl)
{
	*impl = "neon";
	switch (t) {
	case QT_Q8_0: return neon_gemm_q8_0;
	case QT_Q4_0: return neon_gemm_q4_0;
	case QT_MXFP4: return neon_gemm_mxfp4;
	case QT_Q4_K: return neon_gemm_q4_k;
	case QT_Q6_K: return neon_gemm_q6_k;
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
