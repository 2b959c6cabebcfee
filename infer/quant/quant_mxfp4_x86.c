/*
 * quant_mxfp4_x86.c: MXFP4 matvec kernels for x86 (AVX-512 VNNI and AVX2), chosen at run time
 * like quant_x86.c's (each function carries its target attribute; the tables are handed out
 * only on CPUs that have the features).
 *
 * A block's 32 four-bit codes are unpacked in element order (low nibbles, then high nibbles)
 * and turned into weights by one byte shuffle through the 16-entry value table (ggml's
 * kvalues_mxfp4, E2M1 doubled: small integers), then multiplied with the 8-bit activations in
 * int32: exact, as the reference. AVX2 uses the signed table and the sign trick (maddubs of
 * |w| and sign(x, w)); AVX-512 (VNNI, VBMI) does two blocks per 512-bit register: two 16-byte
 * loads and one byte permute (vpermb) unpack the pair, |value| comes from the table and the
 * sign (code bit 3) is moved onto the activation bytes, then one vpdpbusd. One float FMA per block,
 * with the block's scale 2^(e - 128) (quant_e8m0_half) times the activation's.
 *
 * Invariant: the results equal quant_mxfp4.c's ref_rows_mxfp4 up to float summation order.
 */
#include "infer/quant/quant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include "infer/quant/simd_x86.h"

#include <immintrin.h>
#include <stdlib.h>

#define MX_AVX2 __attribute__((target("avx2,fma")))
#define MX_512  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma")))

/* The 32 codes of a block in element order, one per byte (0..15). */
MX_AVX2 static inline __m256i mx_codes(const blk_mxfp4 *b)
{
	__m128i v = _mm_loadu_si128((const __m128i *)b->qs);
	__m256i u = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
	return _mm256_and_si256(u, _mm256_set1_epi8(0x0f));
}

MX_AVX2 static inline __m256i mx_table(void)
{
	return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)quant_mxfp4_values));
}

/* Signed bytes w . q as 8 int32 lane sums (|w| <= 12: maddubs cannot saturate). */
MX_AVX2 static inline __m256i mx_dot(__m256i w, const int8_t *q)
{
	__m256i x = _mm256_loadu_si256((const __m256i *)q);
	__m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
	return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

MX_AVX2 static void avx2_rows_mxfp4(float *out, const uint8_t *w, size_t stride, int nrows,
				    const quant_act_t *x, int n)
{
	const int nb = n / 32;
	const __m256i tbl = mx_table();
	for (int r = 0; r < nrows; r++) {
		const blk_mxfp4 *b = (const blk_mxfp4 *)(w + (size_t)r * stride);
		__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
		int i = 0;
		for (; i + 2 <= nb; i += 2) {
			__m256i p0 =
			    mx_dot(_mm256_shuffle_epi8(tbl, mx_codes(&b[i])), x->q + 32 * i);
			__m256i p1 = mx_dot(_mm256_shuffle_epi8(tbl, mx_codes(&b[i + 1])),
					    x->q + 32 * i + 32);
			a0 = _mm256_fmadd_ps(_mm256_set1_ps(quant_e8m0_half(b[i].e) * x->d[i]),
					     _mm256_cvtepi32_ps(p0), a0);
			a1 = _mm256_fmadd_ps(
			    _mm256_set1_ps(quant_e8m0_half(b[i + 1].e) * x->d[i + 1]),
			    _mm256_cvtepi32_ps(p1), a1);
		}
		for (; i < nb; i++) {
			__m256i p0 =
			    mx_dot(_mm256_shuffle_epi8(tbl, mx_codes(&b[i])), x->q + 32 * i);
			a0 = _mm256_fmadd_ps(_mm256_set1_ps(quant_e8m0_half(b[i].e) * x->d[i]),
					     _mm256_cvtepi32_ps(p0), a0);
		}
		out[r] = qx_hsum8(_mm256_add_ps(a0, a1));
	}
}

/* Dequantize (prefill's sgemm tiles): the same float products as the reference. */
MX_AVX2 static void avx2_dq_mxfp4(const void *src, float *dst, int n)
{
	const blk_mxfp4 *b = src;
	const __m256i tbl = mx_table();
	for (int i = 0; i < n / 32; i++, dst += 32) {
		__m256i v = _mm256_shuffle_epi8(tbl, mx_codes(&b[i]));
		__m256 d = _mm256_set1_ps(quant_e8m0_half(b[i].e));
		__m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
		_mm256_storeu_ps(dst,
				 _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d));
		_mm256_storeu_ps(
		    dst + 8,
		    _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))),
				  d));
		_mm256_storeu_ps(dst + 16,
				 _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d));
		_mm256_storeu_ps(
		    dst + 24,
		    _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))),
				  d));
	}
}

/* ---- AVX-512 VNNI: two blocks per register -------------------------------------------------- */

/* The codes of blocks b[0] and b[1] in element order (bytes 0-31 block 0, 32-63 block 1): one
 * masked load of the pair's 34 bytes (bytes past them are never touched), one byte permute
 * putting each block's 16 code bytes in two 128-bit lanes, low nibbles kept in the first lane
 * of each block and high nibbles in the second. */
MX_512 static inline __m512i mx_codes2(const blk_mxfp4 *b, __m512i idx)
{
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	__m512i raw = _mm512_maskz_loadu_epi8(0x3ffffffffull, b);
	__m512i v = _mm512_permutexvar_epi8(idx, raw);
	return _mm512_mask_blend_epi64(0xcc, _mm512_and_si512(v, m4),
				       _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
}

/* Software prefetch this far ahead in a row's blocks: decode reads the experts' rows once per
 * token from memory, and one core issues too few loads for the hardware prefetcher alone (as
 * gemm_x86.c measured for the 4-bit types). */
#define MX_AHEAD 4096

MX_512 static void vnni_rows_mxfp4(float *out, const uint8_t *w, size_t stride, int nrows,
				   const quant_act_t *x, int n)
{
	const int nb = n / 32;
	/* |value| by code, in each 128-bit lane; the sign is code bit 3, moved onto x */
	static const int8_t absv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12};
	const __m512i tbl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)absv));
	/* A pair's 32 code bytes (two 16-byte loads: no load reaches past the pair, where a
	 * masked one crossing into a cold page costs a microcode assist) to codes in element order
	 * (bytes 0-31 block 0, 32-63 block 1) by one byte permute: lanes 0, 1 get block 0's bytes,
	 * lanes 2, 3 block 1's; lanes 1 and 3 then keep the high nibbles. */
	uint8_t ix[64];
	for (int k = 0; k < 64; k++)
		ix[k] = (uint8_t)(k < 32 ? k % 16 : 16 + k % 16);
	const __m512i idx = _mm512_loadu_si512((const void *)ix);
	const __m512i z = _mm512_setzero_si512(), m4 = _mm512_set1_epi8(0x0f);
	const __m512i eight = _mm512_set1_epi8(8), e128 = _mm512_set1_epi32(128);
	const __m512i dsel = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
	for (int r = 0; r < nrows; r++) {
		const blk_mxfp4 *b = (const blk_mxfp4 *)(w + (size_t)r * stride);
		__m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
		int i = 0;
		/* per pair: sum(|w| * sign(x, w)) exact in int32, times 2^(e - 128) by vscalefps
		 * (exact, subnormal scales included), times the activation's scale by the FMA */
#define MXSTEP(i, acc)                                                                             \
	do {                                                                                       \
		__m256i q2 =                                                                       \
		    _mm256_loadu2_m128i((const __m128i *)b[(i) + 1].qs, (const __m128i *)b[i].qs); \
		__m512i v = _mm512_permutexvar_epi8(idx, _mm512_castsi256_si512(q2));              \
		__m512i c = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xff00ff00u, v, 4), m4);    \
		__m512i xv = _mm512_loadu_si512((const void *)(x->q + 32 * (i)));                  \
		xv = _mm512_mask_sub_epi8(xv, _mm512_test_epi8_mask(c, eight), z, xv);             \
		__m512i p = _mm512_dpbusd_epi32(z, _mm512_shuffle_epi8(tbl, c), xv);               \
		__m512i ev = _mm512_mask_blend_epi32(0xff00, _mm512_set1_epi32(b[i].e),            \
						     _mm512_set1_epi32(b[(i) + 1].e));             \
		__m512 ps = _mm512_scalef_ps(_mm512_cvtepi32_ps(p),                                \
					     _mm512_cvtepi32_ps(_mm512_sub_epi32(ev, e128)));      \
		__m512 dx =                                                                        \
		    _mm512_permutexvar_ps(dsel, _mm512_castpd_ps(_mm512_castpd128_pd512(           \
						    _mm_load_sd((const double *)(x->d + (i))))));  \
		acc = _mm512_fmadd_ps(ps, dx, acc);                                                \
	} while (0)
		for (; i + 4 <= nb; i += 4) {
			_mm_prefetch((const char *)(b + i) + MX_AHEAD, _MM_HINT_T0);
			_mm_prefetch((const char *)(b + i) + MX_AHEAD + 64, _MM_HINT_T0);
			MXSTEP(i, a0);
			MXSTEP(i + 2, a1);
		}
		if (i + 2 <= nb) {
			MXSTEP(i, a0);
			i += 2;
		}
#undef MXSTEP
		float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
		if (i < nb) { /* an odd last block: the exact way */
			int sum = 0;
			for (int j = 0; j < 16; j++)
				sum += quant_mxfp4_values[b[i].qs[j] & 0xf] * x->q[32 * i + j] +
				       quant_mxfp4_values[b[i].qs[j] >> 4] * x->q[32 * i + j + 16];
			s += quant_e8m0_half(b[i].e) * x->d[i] * (float)sum;
		}
		out[r] = s;
	}
}

static const quant_ops_t avx2_mxfp4 = {"avx2", QT_Q8_0, avx2_rows_mxfp4, avx2_dq_mxfp4, NULL};
static const quant_ops_t vnni_mxfp4 = {"avx512vnni", QT_Q8_0, vnni_rows_mxfp4, avx2_dq_mxfp4, NULL};

const quant_ops_t *quant_mxfp4_x86_ops(void)
{
	static int have = -1, vnni = 0; /* benign race: every thread computes the same values */
	if (have < 0) {
		__builtin_cpu_init();
		vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi");
		have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	}
	if (!have)
		return NULL;
	return vnni && !getenv("SHOAL_NO_VNNI") ? &vnni_mxfp4 : &avx2_mxfp4;
}

#else

const quant_ops_t *quant_mxfp4_x86_ops(void)
{
	return NULL;
}

#endif
