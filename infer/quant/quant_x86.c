/*
 * quant_x86.c: AVX2/FMA/F16C matvec kernels, chosen at run time (__builtin_cpu_supports). Each
 * function carries a target attribute so the file builds without -mavx2 and the binary still
 * runs on CPUs without AVX2 (the tables are then not handed out).
 *
 * The integer kernels follow one pattern: weights as bytes (signed with the sign trick for
 * Q8_0/Q4_0, unsigned for the K-quants) times 8-bit activations through maddubs (int16 pairs),
 * madd to int32 (folding a sub-block scale in where there is one), one float FMA per block.
 * Invariant: the results equal the reference kernels up to float summation order.
 */
#include "infer/quant/quant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include "infer/quant/simd_x86.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
/* F16 rows (the KV cache's tiles) are converted at ~14 GB/s when one core waits for each line
 * in turn; a prefetch 4 KiB ahead in the same stream made it ~21 GB/s in a standalone test, and
 * decode at 384-448 positions 2-3.5 % faster (Q4_0, one thread, alternating runs: 73.4 -> 74.8,
 * 76.5 -> 79.1 tok/s). Consecutive tiles of a head are contiguous, so the prefetch of one tile
 * covers the next. */
#define DQ_F16_AHEAD 4096

/* Signed bytes a . b, as 8 int32 lane sums (|a| <= 127 keeps maddubs from saturating). */
TGT static inline __m256i dot_i8(__m256i a, __m256i b)
{
	__m256i ua = _mm256_sign_epi8(a, a), sb = _mm256_sign_epi8(b, a);
	return _mm256_madd_epi16(_mm256_maddubs_epi16(ua, sb), _mm256_set1_epi16(1));
}

/* Software prefetch this many bytes ahead in an F16 row (decode's one input). gpt-oss as its
 * converter writes it reads F16 matrices beside the MXFP4 experts (attention, output head):
 * decode of scripts/bench_wide.sh's gpt-oss-20b-width file, 2 threads, went 60.8 -> 64.5 and
 * 62.0 -> 66.0 tok/s (two rounds of 3 alternating runs; 2048 and 8192 bytes: 64.4 and 65.9). */
#define ROWS_F16_AHEAD 4096
/* And every float row type into L2 only, further ahead (gemm_x86.c's PF_L2_AHEAD: L1's fill
 * buffers cap one core's misses in flight). eng_kernel_rate's 256 MiB matrix, 2 threads, on a
 * 2-core Xeon (Emerald Rapids) VM, alternating runs: BF16 17.1-18.1 -> 26.6-30.0 GB/s; F16
 * 22.9-27.4 -> 26.6-29.4; F32 22.8-26.3 -> 22.5-28.1. */
#define ROWS_L2_AHEAD 32768

TGT static inline __m256 f32x8_at(const float *p)
{
	return _mm256_loadu_ps(p);
}
TGT static inline __m256 f16x8_at(const uint16_t *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
TGT static inline __m256 bf16x8(const uint16_t *p)
{
	__m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
	return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
#define F32_SCALAR(v) (v)

/* F32 / F16 / BF16 rows. Every dot, for one input or in a batch, is summed in one order: four
 * accumulators of 8 lanes over 32-wide steps, one 16-wide step into the first two, then
 * qx_hsum8((a0 + a2) + (a1 + a3)), then the scalar tail. So a token gets the same bits alone or
 * in any batch (issue 28; matmul.c uses no BLAS for that reason). Four chains, not two: an FMA
 * waits 4 cycles for its accumulator, and two chains held one core to ~8 bytes of F16 per
 * cycle, below its share of the memory bandwidth (gpt-oss's F16 attention and head).
 *   avx2_rows_T   one input per row (decode), prefetching AHEAD bytes ahead in the row (0: none)
 *   avx2_rows8_T  up to 8 inputs: each row is read from L1 once per pair of inputs (8
 *                 accumulators and 4 converted weights fit AVX2's 16 registers) */
#define AVX2_ROWS_FLOAT(T, ELEM, LOAD8, SCALAR, AHEAD)                                             \
	TGT static inline float dot1_##T(const ELEM *row, const float *x, int n)                   \
	{                                                                                          \
		__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                        \
		int i = 0;                                                                         \
		for (; i + 32 <= n; i += 32) {                                                     \
			if (AHEAD)                                                                 \
				_mm_prefetch((const char *)(row + i) + AHEAD, _MM_HINT_T0);        \
			for (size_t o = 0; o < 32 * sizeof(ELEM); o += 64)                         \
				_mm_prefetch((const char *)(row + i) + ROWS_L2_AHEAD + o,          \
					     _MM_HINT_T1);                                         \
			a0 = _mm256_fmadd_ps(LOAD8(row + i), _mm256_loadu_ps(x + i), a0);          \
			a1 = _mm256_fmadd_ps(LOAD8(row + i + 8), _mm256_loadu_ps(x + i + 8), a1);  \
			a2 =                                                                       \
			    _mm256_fmadd_ps(LOAD8(row + i + 16), _mm256_loadu_ps(x + i + 16), a2); \
			a3 =                                                                       \
			    _mm256_fmadd_ps(LOAD8(row + i + 24), _mm256_loadu_ps(x + i + 24), a3); \
		}                                                                                  \
		if (i + 16 <= n) {                                                                 \
			a0 = _mm256_fmadd_ps(LOAD8(row + i), _mm256_loadu_ps(x + i), a0);          \
			a1 = _mm256_fmadd_ps(LOAD8(row + i + 8), _mm256_loadu_ps(x + i + 8), a1);  \
			i += 16;                                                                   \
		}                                                                                  \
		float s = qx_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)));   \
		for (; i < n; i++)                                                                 \
			s += SCALAR(row[i]) * x[i];                                                \
		return s;                                                                          \
	}                                                                                          \
	/* two inputs' dots over one row, each in dot1's order */                                  \
	TGT static inline void dot2_##T(const ELEM *row, const float *x, const float *y, int n,    \
					float *sx, float *sy)                                      \
	{                                                                                          \
		__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                        \
		__m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;                                         \
		int i = 0;                                                                         \
		for (; i + 32 <= n; i += 32) {                                                     \
			__m256 w0 = LOAD8(row + i), w1 = LOAD8(row + i + 8);                       \
			__m256 w2 = LOAD8(row + i + 16), w3 = LOAD8(row + i + 24);                 \
			a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);                      \
			b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(y + i), b0);                      \
			a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), a1);                  \
			b1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(y + i + 8), b1);                  \
			a2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + i + 16), a2);                 \
			b2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(y + i + 16), b2);                 \
			a3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + i + 24), a3);                 \
			b3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(y + i + 24), b3);                 \
		}                                                                                  \
		if (i + 16 <= n) {                                                                 \
			__m256 w0 = LOAD8(row + i), w1 = LOAD8(row + i + 8);                       \
			a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);                      \
			b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(y + i), b0);                      \
			a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), a1);                  \
			b1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(y + i + 8), b1);                  \
			i += 16;                                                                   \
		}                                                                                  \
		float s = qx_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)));   \
		float t = qx_hsum8(_mm256_add_ps(_mm256_add_ps(b0, b2), _mm256_add_ps(b1, b3)));   \
		for (; i < n; i++) {                                                               \
			float v = SCALAR(row[i]);                                                  \
			s += v * x[i];                                                             \
			t += v * y[i];                                                             \
		}                                                                                  \
		*sx = s;                                                                           \
		*sy = t;                                                                           \
	}                                                                                          \
	TGT static void avx2_rows_##T(float *out, const uint8_t *w, size_t stride, int nrows,      \
				      const quant_act_t *x, int n)                                 \
	{                                                                                          \
		for (int r = 0; r < nrows; r++)                                                    \
			out[r] = dot1_##T((const ELEM *)(w + r * stride), x->f, n);                \
	}                                                                                          \
	TGT static void avx2_rows8_##T(float *out, int ldo, const uint8_t *w, size_t stride,       \
				       int nrows, const quant_act_t *x, int nt, int n)             \
	{                                                                                          \
		for (int r = 0; r < nrows; r++) {                                                  \
			const ELEM *row = (const ELEM *)(w + r * stride);                          \
			int t = 0;                                                                 \
			for (; t + 2 <= nt; t += 2)                                                \
				dot2_##T(row, x[t].f, x[t + 1].f, n, &out[(size_t)t * ldo + r],    \
					 &out[(size_t)(t + 1) * ldo + r]);                         \
			if (t < nt)                                                                \
				out[(size_t)t * ldo + r] = dot1_##T(row, x[t].f, n);               \
		}                                                                                  \
	}

AVX2_ROWS_FLOAT(f32, float, f32x8_at, F32_SCALAR, 0)
AVX2_ROWS_FLOAT(f16, uint16_t, f16x8_at, _cvtsh_ss, ROWS_F16_AHEAD)
AVX2_ROWS_FLOAT(bf16, uint16_t, bf16x8, quant_bf16_to_f32, 0)

TGT static void avx2_rows_q8_0(float *out, const uint8_t *w, size_t stride, int nrows,
			       const quant_act_t *x, int n)
{
	const int nb = n / QK8_0;
	for (int r = 0; r < nrows; r++) {
		const blk_q8_0 *b = (const blk_q8_0 *)(w + r * stride);
		__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
		int i = 0;
		for (; i + 2 <= nb; i += 2) {
			__m256i p0 = dot_i8(_mm256_loadu_si256((const __m256i *)b[i].q),
					    _mm256_loadu_si256((const __m256i *)(x->q + i * 32)));
			__m256i p1 =
			    dot_i8(_mm256_loadu_si256((const __m256i *)b[i + 1].q),
				   _mm256_loadu_si256((const __m256i *)(x->q + i * 32 + 32)));
			a0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d) * x->d[i]),
					     _mm256_cvtepi32_ps(p0), a0);
			a1 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i + 1].d) * x->d[i + 1]),
					     _mm256_cvtepi32_ps(p1), a1);
		}
		for (; i < nb; i++) {
			__m256i p0 = dot_i8(_mm256_loadu_si256((const __m256i *)b[i].q),
					    _mm256_loadu_si256((const __m256i *)(x->q + i * 32)));
			a0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d) * x->d[i]),
					     _mm256_cvtepi32_ps(p0), a0);
		}
		out[r] = qx_hsum8(_mm256_add_ps(a0, a1));
	}
}

/* 32 nibbles of a Q4_0 block as signed bytes in element order (low nibbles, then high). */
TGT static inline __m256i q4_0_bytes(const blk_q4_0 *b)
{
	__m128i v = _mm_loadu_si128((const __m128i *)b->qs);
	__m256i u = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
	u = _mm256_and_si256(u, _mm256_set1_epi8(0x0f));
	return _mm256_sub_epi8(u, _mm256_set1_epi8(8));
}

TGT static void avx2_rows_q4_0(float *out, const uint8_t *w, size_t stride, int nrows,
			       const quant_act_t *x, int n)
{
	const int nb = n / QK4_0;
	for (int r = 0; r < nrows; r++) {
		const blk_q4_0 *b = (const blk_q4_0 *)(w + r * stride);
		__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
		int i = 0;
		for (; i + 2 <= nb; i += 2) {
			__m256i p0 = dot_i8(q4_0_bytes(&b[i]),
					    _mm256_loadu_si256((const __m256i *)(x->q + i * 32)));
			__m256i p1 =
			    dot_i8(q4_0_bytes(&b[i + 1]),
				   _mm256_loadu_si256((const __m256i *)(x->q + i * 32 + 32)));
			a0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d) * x->d[i]),
					     _mm256_cvtepi32_ps(p0), a0);
			a1 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i + 1].d) * x->d[i + 1]),
					     _mm256_cvtepi32_ps(p1), a1);
		}
		for (; i < nb; i++) {
			__m256i p0 = dot_i8(q4_0_bytes(&b[i]),
					    _mm256_loadu_si256((const __m256i *)(x->q + i * 32)));
			a0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d) * x->d[i]),
					     _mm256_cvtepi32_ps(p0), a0);
		}
		out[r] = qx_hsum8(_mm256_add_ps(a0, a1));
	}
}

static inline void q4k_unpack_scales(const uint8_t *s, int16_t *sc, int16_t *m)
{
	for (int j = 0; j < 4; j++) {
		sc[j] = s[j] & 63;
		m[j] = s[j + 4] & 63;
		sc[j + 4] = (int16_t)((s[j + 8] & 0xf) | ((s[j] >> 6) << 4));
		m[j + 4] = (int16_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
	}
}

/* Q4_K scales and mins of one super-block as 8 bytes each (see quant.c for the packing):
 * four 32-bit word operations instead of sixteen byte ones. */
static inline void q4k_scales_words(const uint8_t *s, uint32_t *sc, uint32_t *mn)
{
	uint32_t u[3];
	memcpy(u, s, 12);
	sc[0] = u[0] & 0x3f3f3f3f;
	sc[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
	mn[0] = u[1] & 0x3f3f3f3f;
	mn[1] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
}

TGT static void avx2_rows_q4_k(float *out, const uint8_t *w, size_t stride, int nrows,
			       const quant_act_t *x, int n)
{
	const int nb = n / QK_K;
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	for (int r = 0; r < nrows; r++) {
		const blk_q4_k *b = (const blk_q4_k *)(w + r * stride);
		__m256 acc = _mm256_setzero_ps();
		__m128 macc = _mm_setzero_ps();
		for (int i = 0; i < nb; i++) {
			uint32_t scw[2], mnw[2];
			q4k_scales_words(b[i].scales, scw, mnw);
			uint8_t sc[8];
			memcpy(sc, scw, 8);
			const int8_t *q = x->q + i * QK_K;
			/* mins . (sums of x per 32): the 16 bsums pairwise added, one madd */
			__m128i bs = _mm_hadd_epi16(
			    _mm_loadu_si128((const __m128i *)(x->bsums + i * 16)),
			    _mm_loadu_si128((const __m128i *)(x->bsums + i * 16 + 8)));
			__m128i mn = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mnw));
			__m128i ms = _mm_madd_epi16(mn, bs);
			__m256i sumi = _mm256_setzero_si256();
			for (int c = 0; c < 4; c++) {
				__m256i v = _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * c));
				__m256i lo = _mm256_and_si256(v, m4);
				__m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
				__m256i p0 = _mm256_maddubs_epi16(
				    lo, _mm256_loadu_si256((const __m256i *)(q + 64 * c)));
				__m256i p1 = _mm256_maddubs_epi16(
				    hi, _mm256_loadu_si256((const __m256i *)(q + 64 * c + 32)));
				p0 = _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * c]));
				p1 = _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * c + 1]));
				sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
			}
			float dx = x->d[i];
			acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d) * dx),
					      _mm256_cvtepi32_ps(sumi), acc);
			macc = _mm_fmadd_ps(_mm_set1_ps(_cvtsh_ss(b[i].dmin) * dx),
					    _mm_cvtepi32_ps(ms), macc);
		}
		macc = _mm_add_ps(macc, _mm_movehl_ps(macc, macc));
		macc = _mm_add_ss(macc, _mm_movehdup_ps(macc));
		out[r] = qx_hsum8(acc) - _mm_cvtss_f32(macc);
	}
}

TGT static void avx2_rows_q6_k(float *out, const uint8_t *w, size_t stride, int nrows,
			       const quant_act_t *x, int n)
{
	const int nb = n / QK_K;
	const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
	for (int r = 0; r < nrows; r++) {
		const blk_q6_k *b = (const blk_q6_k *)(w + r * stride);
		float acc = 0;
		for (int i = 0; i < nb; i++) {
			const int8_t *q = x->q + i * QK_K;
			const int16_t *bs = x->bsums + i * 16;
			const int8_t *sc = b[i].scales;
			__m256i sumi = _mm256_setzero_si256();
			/* sum of scale x block sum over the 16 groups: one madd, then a reduction
			 */
			__m256i so = _mm256_madd_epi16(
			    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)),
			    _mm256_loadu_si256((const __m256i *)bs));
			for (int h = 0; h < 2; h++) {
				__m256i la =
				    _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h));
				__m256i lb =
				    _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h + 32));
				__m256i hb =
				    _mm256_loadu_si256((const __m256i *)(b[i].qh + 32 * h));
				for (int k = 0; k < 4; k++) {
					__m256i l = (k & 1) ? lb : la;
					l = (k & 2) ? _mm256_and_si256(_mm256_srli_epi16(l, 4), m4)
						    : _mm256_and_si256(l, m4);
					__m256i hh =
					    _mm256_and_si256(_mm256_srli_epi16(hb, 2 * k), m3);
					__m256i v = _mm256_or_si256(l, _mm256_slli_epi16(hh, 4));
					const int8_t *qq = q + 128 * h + 32 * k;
					__m256i p = _mm256_maddubs_epi16(
					    v, _mm256_loadu_si256((const __m256i *)qq));
					int g = 8 * h + 2 * k;
					__m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]),
								     _mm_set1_epi16(sc[g]));
					sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
				}
			}
			int tot = qx_hsum8i(_mm256_sub_epi32(sumi, _mm256_slli_epi32(so, 5)));
			acc += _cvtsh_ss(b[i].d) * x->d[i] * (float)tot;
		}
		out[r] = acc;
	}
}

TGT static void avx2_dq_q8_0(const void *src, float *dst, int n)
{
	const blk_q8_0 *b = src;
	for (int i = 0; i < n / QK8_0; i++, dst += QK8_0) {
		__m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
		for (int k = 0; k < 4; k++) {
			__m128i q = _mm_loadl_epi64((const __m128i *)(b[i].q + 8 * k));
			__m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
			_mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(d, f));
		}
	}
}

TGT static void avx2_dq_q4_0(const void *src, float *dst, int n)
{
	const blk_q4_0 *b = src;
	for (int i = 0; i < n / QK4_0; i++, dst += QK4_0) {
		__m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
		__m256i v = q4_0_bytes(&b[i]);
		__m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
		__m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
		for (int k = 0; k < 4; k++) {
			__m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k]));
			_mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(d, f));
		}
	}
}

TGT static void avx2_dq_f16(const void *src, float *dst, int n)
{
	const uint16_t *s = src;
	int i = 0;
	for (; i + 32 <= n; i += 32) {
		_mm_prefetch((const char *)(s + i) + DQ_F16_AHEAD, _MM_HINT_T0);
		for (int k = 0; k < 32; k += 8)
			_mm256_storeu_ps(dst + i + k, _mm256_cvtph_ps(_mm_loadu_si128(
							  (const __m128i *)(s + i + k))));
	}
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i,
				 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
	for (; i < n; i++)
		dst[i] = _cvtsh_ss(s[i]);
}

/* The outputs stay in registers across all T rows, 64 columns at a time. */
TGT static void avx2_wsum(float *o, const float *a, const float *v, size_t stride, int T, int n)
{
	int i = 0;
	for (; i + 64 <= n; i += 64) {
		__m256 c[8];
		for (int k = 0; k < 8; k++)
			c[k] = _mm256_setzero_ps();
		for (int t = 0; t < T; t++) {
			const float *row = v + (size_t)t * stride + i;
			__m256 at = _mm256_set1_ps(a[t]);
			for (int k = 0; k < 8; k++)
				c[k] = _mm256_fmadd_ps(at, _mm256_loadu_ps(row + 8 * k), c[k]);
		}
		for (int k = 0; k < 8; k++)
			_mm256_storeu_ps(o + i + 8 * k, c[k]);
	}
	for (; i + 8 <= n; i += 8) {
		__m256 c = _mm256_setzero_ps();
		for (int t = 0; t < T; t++)
			c = _mm256_fmadd_ps(_mm256_set1_ps(a[t]),
					    _mm256_loadu_ps(v + (size_t)t * stride + i), c);
		_mm256_storeu_ps(o + i, c);
	}
	for (; i < n; i++) {
		float c = 0;
		for (int t = 0; t < T; t++)
			c += a[t] * v[(size_t)t * stride + i];
		o[i] = c;
	}
}

/* vsum over a KV cache: o[i] += sum_t a[t] * row_t[i]; the outputs of 32 columns stay in four
 * registers across all T rows (a head is 64..256 columns: a few passes over the rows). */
TGT static inline __m256 f16x8(const uint8_t *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

TGT static void avx2_vsum_f32(float *o, const float *a, const uint8_t *v, size_t stride, int T,
			      int n)
{
	int i = 0;
	/* 64 columns: eight independent FMA chains (four would wait on the FMA latency) */
	for (; i + 64 <= n; i += 64) {
		__m256 c[8];
		for (int k = 0; k < 8; k++)
			c[k] = _mm256_loadu_ps(o + i + 8 * k);
		for (int t = 0; t < T; t++) {
			const float *row = (const float *)(v + (size_t)t * stride) + i;
			__m256 at = _mm256_set1_ps(a[t]);
			for (int k = 0; k < 8; k++)
				c[k] = _mm256_fmadd_ps(at, _mm256_loadu_ps(row + 8 * k), c[k]);
		}
		for (int k = 0; k < 8; k++)
			_mm256_storeu_ps(o + i + 8 * k, c[k]);
	}
	for (; i + 32 <= n; i += 32) {
		__m256 c[4];
		for (int k = 0; k < 4; k++)
			c[k] = _mm256_loadu_ps(o + i + 8 * k);
		for (int t = 0; t < T; t++) {
			const float *row = (const float *)(v + (size_t)t * stride) + i;
			__m256 at = _mm256_set1_ps(a[t]);
			for (int k = 0; k < 4; k++)
				c[k] = _mm256_fmadd_ps(at, _mm256_loadu_ps(row + 8 * k), c[k]);
		}
		for (int k = 0; k < 4; k++)
			_mm256_storeu_ps(o + i + 8 * k, c[k]);
	}
	for (; i < n; i++)
		for (int t = 0; t < T; t++)
			o[i] += a[t] * ((const float *)(v + (size_t)t * stride))[i];
}

TGT static void avx2_vsum_f16(float *o, const float *a, const uint8_t *v, size_t stride, int T,
			      int n)
{
	int i = 0;
	for (; i + 32 <= n; i += 32) {
		__m256 c[4];
		for (int k = 0; k < 4; k++)
			c[k] = _mm256_loadu_ps(o + i + 8 * k);
		for (int t = 0; t < T; t++) {
			const uint8_t *row = v + (size_t)t * stride + 2 * (size_t)i;
			__m256 at = _mm256_set1_ps(a[t]);
			for (int k = 0; k < 4; k++)
				c[k] = _mm256_fmadd_ps(at, f16x8(row + 16 * k), c[k]);
		}
		for (int k = 0; k < 4; k++)
			_mm256_storeu_ps(o + i + 8 * k, c[k]);
	}
	for (; i < n; i++)
		for (int t = 0; t < T; t++)
			o[i] += a[t] * _cvtsh_ss(((const uint16_t *)(v + (size_t)t * stride))[i]);
}

TGT static void avx2_vsum_q8_0(float *o, const float *a, const uint8_t *v, size_t stride, int T,
			       int n)
{
	for (int i = 0; i < n / QK8_0; i++) {
		__m256 c[4];
		for (int k = 0; k < 4; k++)
			c[k] = _mm256_loadu_ps(o + 32 * i + 8 * k);
		for (int t = 0; t < T; t++) {
			const blk_q8_0 *b = (const blk_q8_0 *)(v + (size_t)t * stride) + i;
			__m256 s = _mm256_set1_ps(a[t] * _cvtsh_ss(b->d));
			for (int k = 0; k < 4; k++) {
				__m128i q = _mm_loadl_epi64((const __m128i *)(b->q + 8 * k));
				__m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
				c[k] = _mm256_fmadd_ps(s, f, c[k]);
			}
		}
		for (int k = 0; k < 4; k++)
			_mm256_storeu_ps(o + 32 * i + 8 * k, c[k]);
	}
}

/* 32 unsigned bytes -> 32 floats a * b - m, stored at dst. */
TGT static inline void u8x32_affine(__m256i v, float a, float m, float *dst)
{
	__m256 va = _mm256_set1_ps(a), vm = _mm256_set1_ps(m);
	__m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
	__m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
	for (int k = 0; k < 4; k++) {
		__m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k]));
		_mm256_storeu_ps(dst + 8 * k, _mm256_fmsub_ps(va, f, vm));
	}
}

TGT static void avx2_dq_q4_k(const void *src, float *dst, int n)
{
	const blk_q4_k *b = src;
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	for (int i = 0; i < n / QK_K; i++, dst += QK_K) {
		int16_t sc[8], m[8];
		q4k_unpack_scales(b[i].scales, sc, m);
		float d = _cvtsh_ss(b[i].d), dmin = _cvtsh_ss(b[i].dmin);
		for (int c = 0; c < 4; c++) {
			__m256i v = _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * c));
			u8x32_affine(_mm256_and_si256(v, m4), d * sc[2 * c], dmin * m[2 * c],
				     dst + 64 * c);
			u8x32_affine(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
				     d * sc[2 * c + 1], dmin * m[2 * c + 1], dst + 64 * c + 32);
		}
	}
}

/* Q6_K: 32 values (0..63, offset 32) per (half, k) as in avx2_rows_q6_k; two scales per 32. */
TGT static void avx2_dq_q6_k(const void *src, float *dst, int n)
{
	const blk_q6_k *b = src;
	const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
	for (int i = 0; i < n / QK_K; i++, dst += QK_K) {
		float d = _cvtsh_ss(b[i].d);
		for (int h = 0; h < 2; h++) {
			__m256i la = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h));
			__m256i lb = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h + 32));
			__m256i hb = _mm256_loadu_si256((const __m256i *)(b[i].qh + 32 * h));
			for (int k = 0; k < 4; k++) {
				__m256i l = (k & 1) ? lb : la;
				l = (k & 2) ? _mm256_and_si256(_mm256_srli_epi16(l, 4), m4)
					    : _mm256_and_si256(l, m4);
				__m256i hh = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * k), m3);
				__m256i v = _mm256_or_si256(l, _mm256_slli_epi16(hh, 4));
				int g = 8 * h + 2 * k;
				float *o = dst + 128 * h + 32 * k;
				/* the two halves of these 32 values have their own scales */
				float a0 = d * b[i].scales[g], a1 = d * b[i].scales[g + 1];
				float tmp[32];
				u8x32_affine(v, 1.0f, 32.0f, tmp);
				for (int e = 0; e < 16; e++) {
					o[e] = a0 * tmp[e];
					o[e + 16] = a1 * tmp[e + 16];
				}
			}
		}
	}
}

/* exp(v) for v <= 0: v = k ln2 + r with |r| <= ln2/2, exp(r) by a degree-6 Taylor polynomial
 * (relative error ~1e-7), times 2^k through the exponent bits. Below -87 the result is 0. */
TGT static inline __m256 exp_le0(__m256 v)
{
	const __m256 lo = _mm256_set1_ps(-87.0f);
	__m256 under = _mm256_cmp_ps(v, lo, _CMP_LT_OQ);
	v = _mm256_max_ps(v, lo);
	__m256 k = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504f)),
				   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145752f), v); /* ln2 high part */
	r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.42860677e-6f), r);      /* ln2 low part */
	__m256 p = _mm256_set1_ps(1.0f / 720);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	__m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(k), 23);
	__m256 res = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
	return _mm256_andnot_ps(under, res);
}

TGT static float avx2_expsum(float *x, int n, float mx)
{
	__m256 vm = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
	int i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 e = exp_le0(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
		_mm256_storeu_ps(x + i, e);
		acc = _mm256_add_ps(acc, e);
	}
	float sum = qx_hsum8(acc);
	for (; i < n; i++) {
		x[i] = expf(x[i] - mx);
		sum += x[i];
	}
	return sum;
}

TGT static void avx2_f16_row(const float *x, uint16_t *y, int64_t n)
{
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i),
								     _MM_FROUND_TO_NEAREST_INT));
	for (; i < n; i++)
		y[i] = quant_f32_to_f16(x[i]);
}

static const quant_ops_t avx2_f32 = {"avx2", QT_F32, avx2_rows_f32, NULL, avx2_rows8_f32};
static const quant_ops_t avx2_f16 = {"avx2", QT_F32, avx2_rows_f16, avx2_dq_f16, avx2_rows8_f16};
static const quant_ops_t avx2_bf16 = {"avx2", QT_F32, avx2_rows_bf16, NULL, avx2_rows8_bf16};
static const quant_ops_t avx2_q8_0 = {"avx2", QT_Q8_0, avx2_rows_q8_0, avx2_dq_q8_0, NULL};
static const quant_ops_t avx2_q4_0 = {"avx2", QT_Q8_0, avx2_rows_q4_0, avx2_dq_q4_0, NULL};
static const quant_ops_t avx2_q4_k = {"avx2", QT_Q8_K, avx2_rows_q4_k, avx2_dq_q4_k, NULL};
static const quant_ops_t avx2_q6_k = {"avx2", QT_Q8_K, avx2_rows_q6_k, avx2_dq_q6_k, NULL};

/* ---- AVX512-VNNI (256-bit, EVEX) variants: vpdpbusd does maddubs + madd in one step ---- */

#define TGTV __attribute__((target("avx2,fma,f16c,avx512vl,avx512vnni")))

static inline int ld16(const uint8_t *p) /* blocks are not 2-byte aligned in general */
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

/* Eight f16 block scales (blocks i..i+7, `bytes` apart) as floats. */
TGTV static inline __m256 scales8(const uint8_t *p, size_t bytes)
{
	__m128i h = _mm_setzero_si128();
	h = _mm_insert_epi16(h, ld16(p + 0 * bytes), 0);
	h = _mm_insert_epi16(h, ld16(p + 1 * bytes), 1);
	h = _mm_insert_epi16(h, ld16(p + 2 * bytes), 2);
	h = _mm_insert_epi16(h, ld16(p + 3 * bytes), 3);
	h = _mm_insert_epi16(h, ld16(p + 4 * bytes), 4);
	h = _mm_insert_epi16(h, ld16(p + 5 * bytes), 5);
	h = _mm_insert_epi16(h, ld16(p + 6 * bytes), 6);
	h = _mm_insert_epi16(h, ld16(p + 7 * bytes), 7);
	return _mm256_cvtph_ps(h);
}

#define LANE(v, k) _mm256_permutevar8x32_ps((v), _mm256_set1_epi32(k))

/* The 256-bit VNNI kernels work in groups of 8 blocks: the 8 weight scales are gathered and
 * multiplied by the 8 activation scales in one go, and each block then costs its unpack, one
 * dot instruction, a convert, a lane broadcast and an FMA. */
TGTV static void vnni_rows_q8_0(float *out, const uint8_t *w, size_t stride, int nrows,
				const quant_act_t *x, int n)
{
	const int nb = n / QK8_0, ng = nb / 8;
	const __m256i z = _mm256_setzero_si256();
	for (int r = 0; r < nrows; r++) {
		const blk_q8_0 *b = (const blk_q8_0 *)(w + r * stride);
		__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
		for (int g = 0; g < ng; g++) {
			const blk_q8_0 *bg = b + 8 * g;
			__m256 sc = _mm256_mul_ps(scales8((const uint8_t *)bg, sizeof *bg),
						  _mm256_loadu_ps(x->d + 8 * g));
			const int8_t *xq = x->q + 256 * g;
#define Q8STEP(k, acc)                                                                             \
	do {                                                                                       \
		__m256i wv = _mm256_loadu_si256((const __m256i *)bg[k].q);                         \
		__m256i xv = _mm256_loadu_si256((const __m256i *)(xq + 32 * (k)));                 \
		__m256i p = _mm256_dpbusd_epi32(z, _mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv)); \
		acc = _mm256_fmadd_ps(LANE(sc, k), _mm256_cvtepi32_ps(p), acc);                    \
	} while (0)
			Q8STEP(0, a0);
			Q8STEP(1, a1);
			Q8STEP(2, a0);
			Q8STEP(3, a1);
			Q8STEP(4, a0);
			Q8STEP(5, a1);
			Q8STEP(6, a0);
			Q8STEP(7, a1);
#undef Q8STEP
		}
		for (int i = 8 * ng; i < nb; i++) {
			__m256i w0 = _mm256_loadu_si256((const __m256i *)b[i].q);
			__m256i x0 = _mm256_loadu_si256((const __m256i *)(x->q + i * 32));
			__m256i p0 =
			    _mm256_dpbusd_epi32(z, _mm256_abs_epi8(w0), _mm256_sign_epi8(x0, w0));
			a0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d) * x->d[i]),
					     _mm256_cvtepi32_ps(p0), a0);
		}
		out[r] = qx_hsum8(_mm256_add_ps(a0, a1));
	}
}

/* Unsigned nibbles (0..15) of a Q4_0 block in element order; the -8 offset is applied once per
 * block through the activation's block sum. */
TGTV static inline __m256i q4_0_nibbles(const blk_q4_0 *b)
{
	__m128i v = _mm_loadu_si128((const __m128i *)b->qs);
	__m256i u = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
	return _mm256_and_si256(u, _mm256_set1_epi8(0x0f));
}

TGTV static void vnni_rows_q4_0(float *out, const uint8_t *w, size_t stride, int nrows,
				const quant_act_t *x, int n)
{
	const int nb = n / QK4_0, ng = nb / 8;
	const __m256i z = _mm256_setzero_si256();
	for (int r = 0; r < nrows; r++) {
		const blk_q4_0 *b = (const blk_q4_0 *)(w + r * stride);
		__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(),
		       off = _mm256_setzero_ps();
		for (int g = 0; g < ng; g++) {
			const blk_q4_0 *bg = b + 8 * g;
			__m256 sc = _mm256_mul_ps(scales8((const uint8_t *)bg, sizeof *bg),
						  _mm256_loadu_ps(x->d + 8 * g));
			__m256 bs = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(
			    _mm_loadu_si128((const __m128i *)(x->bsums + 8 * g))));
			off = _mm256_fmadd_ps(sc, bs, off);
			const int8_t *xq = x->q + 256 * g;
#define Q4STEP(k, acc)                                                                             \
	do {                                                                                       \
		__m256i p =                                                                        \
		    _mm256_dpbusd_epi32(z, q4_0_nibbles(&bg[k]),                                   \
					_mm256_loadu_si256((const __m256i *)(xq + 32 * (k))));     \
		acc = _mm256_fmadd_ps(LANE(sc, k), _mm256_cvtepi32_ps(p), acc);                    \
	} while (0)
			Q4STEP(0, a0);
			Q4STEP(1, a1);
			Q4STEP(2, a0);
			Q4STEP(3, a1);
			Q4STEP(4, a0);
			Q4STEP(5, a1);
			Q4STEP(6, a0);
			Q4STEP(7, a1);
#undef Q4STEP
		}
		float tail = 0;
		for (int i = 8 * ng; i < nb; i++) {
			__m256i p0 = _mm256_dpbusd_epi32(
			    z, q4_0_nibbles(&b[i]),
			    _mm256_loadu_si256((const __m256i *)(x->q + i * 32)));
			float s0 = _cvtsh_ss(b[i].d) * x->d[i];
			a0 = _mm256_fmadd_ps(_mm256_set1_ps(s0), _mm256_cvtepi32_ps(p0), a0);
			tail += s0 * (float)x->bsums[i];
		}
		/* rows are walked one at a time, in address order: interleaving two rows measured
		 * 3x slower out of cache here (the hardware prefetcher loses the stream) */
		out[r] = qx_hsum8(_mm256_add_ps(a0, a1)) - 8.0f * (qx_hsum8(off) + tail);
	}
}

/* Batched kernels: the row kernels' arithmetic, step for step, for up to 4 activation vectors
 * per pass over a row (a batch of 8 takes two passes; the row is still in L1 for the second):
 * each weight block is loaded and unpacked once per pass, and every vector keeps the row
 * kernel's two accumulators, the same scale products and FMAs in the same order, so a token's
 * row has the same bits alone (rows, decode), in a batch or in a verify step (issue 28). A
 * block costs one dot, convert, lane broadcast and FMA per vector. */
#define R4_MAX 4

#define R4_INLINE TGTV static inline __attribute__((always_inline))

R4_INLINE void vnni_rows4_q8_0(float *out, int ldo, const uint8_t *w, size_t stride, int nrows,
			       const quant_act_t *x, const int nt, int n)
{
	const int nb = n / QK8_0, ng = nb / 8;
	const __m256i z = _mm256_setzero_si256();
	for (int r = 0; r < nrows; r++) {
		const blk_q8_0 *b = (const blk_q8_0 *)(w + r * stride);
		__m256 a0[R4_MAX], a1[R4_MAX];
#pragma GCC unroll 4
		for (int t = 0; t < nt; t++)
			a0[t] = a1[t] = _mm256_setzero_ps();
/* block i of a row into accumulator ACC with scale SC(t) (rows' lane of scales8 x d) */
#define R4_Q8_BLOCK(i, ACC, SC)                                                                    \
	do {                                                                                       \
		__m256i wv = _mm256_loadu_si256((const __m256i *)b[i].q);                          \
		__m256i aw = _mm256_abs_epi8(wv);                                                  \
		_Pragma("GCC unroll 4") for (int t = 0; t < nt; t++)                               \
		{                                                                                  \
			__m256i xv = _mm256_loadu_si256((const __m256i *)(x[t].q + (i)*32));       \
			__m256 p = _mm256_cvtepi32_ps(                                             \
			    _mm256_dpbusd_epi32(z, aw, _mm256_sign_epi8(xv, wv)));                 \
			ACC[t] = _mm256_fmadd_ps(SC, p, ACC[t]);                                   \
		}                                                                                  \
	} while (0)
		for (int g = 0; g < ng; g++) {
			/* the group's scale products as rows forms them, broadcast from memory */
			__m256 ws = scales8((const uint8_t *)(b + 8 * g), sizeof *b);
			float sb[R4_MAX][8] __attribute__((aligned(32)));
#pragma GCC unroll 4
			for (int t = 0; t < nt; t++)
				_mm256_store_ps(sb[t],
						_mm256_mul_ps(ws, _mm256_loadu_ps(x[t].d + 8 * g)));
#define R4_SC(k) _mm256_broadcast_ss(&sb[t][k])
			for (int k = 0; k < 8; k += 2) { /* rows: even blocks in a0, odd in a1 */
				R4_Q8_BLOCK(8 * g + k, a0, R4_SC(k));
				R4_Q8_BLOCK(8 * g + k + 1, a1, R4_SC(k + 1));
			}
#undef R4_SC
		}
		for (int i = 8 * ng; i < nb; i++) /* past the last group: a0 */
			R4_Q8_BLOCK(i, a0, _mm256_set1_ps(_cvtsh_ss(b[i].d) * x[t].d[i]));
#undef R4_Q8_BLOCK
#pragma GCC unroll 4
		for (int t = 0; t < nt; t++)
			out[(size_t)t * ldo + r] = qx_hsum8(_mm256_add_ps(a0[t], a1[t]));
	}
}

R4_INLINE void vnni_rows4_q4_0(float *out, int ldo, const uint8_t *w, size_t stride, int nrows,
			       const quant_act_t *x, const int nt, int n)
{
	const int nb = n / QK4_0, ng = nb / 8;
	const __m256i z = _mm256_setzero_si256();
	for (int r = 0; r < nrows; r++) {
		const blk_q4_0 *b = (const blk_q4_0 *)(w + r * stride);
		__m256 a0[R4_MAX], a1[R4_MAX], off[R4_MAX];
		float tail[R4_MAX];
#pragma GCC unroll 4
		for (int t = 0; t < nt; t++)
			a0[t] = a1[t] = off[t] = _mm256_setzero_ps(), tail[t] = 0;
		for (int g = 0; g < ng; g++) { /* rows' offset term: a vector FMA per group */
			__m256 ws = scales8((const uint8_t *)(b + 8 * g), sizeof *b);
#pragma GCC unroll 4
			for (int t = 0; t < nt; t++) {
				__m256 sc = _mm256_mul_ps(ws, _mm256_loadu_ps(x[t].d + 8 * g));
				__m256 bs = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(
				    _mm_loadu_si128((const __m128i *)(x[t].bsums + 8 * g))));
				off[t] = _mm256_fmadd_ps(sc, bs, off[t]);
			}
		}
#define R4_Q4_BLOCK(i, ACC)                                                                        \
	do {                                                                                       \
		__m256i wu = q4_0_nibbles(&b[i]);                                                  \
		float ws = _cvtsh_ss(b[i].d);                                                      \
		_Pragma("GCC unroll 4") for (int t = 0; t < nt; t++)                               \
		{                                                                                  \
			__m256 p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(                         \
			    z, wu, _mm256_loadu_si256((const __m256i *)(x[t].q + (i)*32))));       \
			ACC[t] = _mm256_fmadd_ps(_mm256_set1_ps(ws * x[t].d[i]), p, ACC[t]);       \
		}                                                                                  \
	} while (0)
		for (int i = 0; i < 8 * ng; i += 2) {
			R4_Q4_BLOCK(i, a0);
			R4_Q4_BLOCK(i + 1, a1);
		}
		for (int i = 8 * ng; i < nb; i++) {
			R4_Q4_BLOCK(i, a0);
#pragma GCC unroll 4
			for (int t = 0; t < nt; t++)
				tail[t] += _cvtsh_ss(b[i].d) * x[t].d[i] * (float)x[t].bsums[i];
		}
#undef R4_Q4_BLOCK
#pragma GCC unroll 4
		for (int t = 0; t < nt; t++)
			out[(size_t)t * ldo + r] = qx_hsum8(_mm256_add_ps(a0[t], a1[t])) -
						   8.0f * (qx_hsum8(off[t]) + tail[t]);
	}
}

/* nt is a constant in each case, so the vectors' accumulators stay in registers. */
#define R4_CASES(KERNEL)                                                                           \
	for (int t = 0; t < nt; t += R4_MAX) {                                                     \
		float *o = out + (size_t)t * ldo;                                                  \
		switch (nt - t) {                                                                  \
		case 1: KERNEL(o, ldo, w, stride, nrows, x + t, 1, n); break;                      \
		case 2: KERNEL(o, ldo, w, stride, nrows, x + t, 2, n); break;                      \
		case 3: KERNEL(o, ldo, w, stride, nrows, x + t, 3, n); break;                      \
		default: KERNEL(o, ldo, w, stride, nrows, x + t, 4, n); break;                     \
		}                                                                                  \
	}

TGTV static void vnni_rows8_q8_0(float *out, int ldo, const uint8_t *w, size_t stride, int nrows,
				 const quant_act_t *x, int nt, int n)
{
	R4_CASES(vnni_rows4_q8_0);
}

TGTV static void vnni_rows8_q4_0(float *out, int ldo, const uint8_t *w, size_t stride, int nrows,
				 const quant_act_t *x, int nt, int n)
{
	R4_CASES(vnni_rows4_q4_0);
}

static const quant_ops_t vnni_q8_0 = {"avx512vnni", QT_Q8_0, vnni_rows_q8_0, avx2_dq_q8_0,
				      vnni_rows8_q8_0};
static const quant_ops_t vnni_q4_0 = {"avx512vnni", QT_Q8_0, vnni_rows_q4_0, avx2_dq_q4_0,
				      vnni_rows8_q4_0};

const quant_ops_t *quant_x86_ops(int wtype)
{
	static int have = -1, vnni = 0; /* benign race: every thread computes the same values */
	if (have < 0) {
		__builtin_cpu_init();
		vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
		have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	}
	if (!have)
		return NULL;
	/* the environment only for the types it concerns: activations are prepared through
	 * quant_x86_ops(QT_F32) hundreds of times a token, and getenv walks the environment */
	if (vnni && (wtype == QT_Q8_0 || wtype == QT_Q4_0) && !getenv("SHOAL_NO_VNNI"))
		return wtype == QT_Q8_0 ? &vnni_q8_0 : &vnni_q4_0;
	switch (wtype) {
	case QT_F32: return &avx2_f32;
	case QT_F16: return &avx2_f16;
	case QT_BF16: return &avx2_bf16;
	case QT_Q8_0: return &avx2_q8_0;
	case QT_Q4_0: return &avx2_q4_0;
	case QT_Q4_K: return &avx2_q4_k;
	case QT_Q6_K: return &avx2_q6_k;
	default: return NULL;
	}
}

/* The largest of m's 8 lanes. */
TGT static inline float hmax8(__m256 m)
{
	__m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
	h = _mm_max_ps(h, _mm_movehl_ps(h, h));
	h = _mm_max_ss(h, _mm_movehdup_ps(h));
	return _mm_cvtss_f32(h);
}

/* 32 int32 lanes (already in int8 range, or saturated) stored as 32 bytes in order: packs work
 * per 128-bit lane, the permute puts the bytes back in order. */
TGT static inline void store_q32(int8_t *q, const __m256i r[4])
{
	__m256i p =
	    _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
	p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
	_mm256_storeu_si256((__m256i *)q, p);
}

/* Per block of 32 as ggml's x86 quantize_row_q8_0 (ggml-cpu/arch/x86/quants.c): |x| max by
 * masking the sign, the scale d = amax / 127 kept as F16 (block_q8_0.d), the values multiplied by
 * 127 / amax in F32 and rounded to nearest even (vroundps with the rounding in the immediate, so
 * MXCSR does not matter), packed to bytes; the block sum from the int32 lanes. F32 scales and
 * x / d had moved Q8_0 log-probabilities by up to 0.03 from llama.cpp's. */
TGT static void avx2_act_q8_0(const float *x, int n, int8_t *q, float *d, int16_t *bsums)
{
	const __m256 sign = _mm256_set1_ps(-0.0f);
	for (int i = 0; i < n / QK8_0; i++, x += QK8_0, q += QK8_0) {
		__m256 v[4], m;
		for (int k = 0; k < 4; k++)
			v[k] = _mm256_loadu_ps(x + 8 * k);
		m = _mm256_max_ps(
		    _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
		    _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
		float amax = hmax8(m), is = amax != 0.f ? 127.f / amax : 0.f;
		d[i] = quant_f16_to_f32(quant_f32_to_f16(amax / 127.f));
		__m256 vi = _mm256_set1_ps(is);
		__m256i r[4];
		for (int k = 0; k < 4; k++)
			r[k] = _mm256_cvtps_epi32(
			    _mm256_round_ps(_mm256_mul_ps(v[k], vi),
					    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
		bsums[i] = (int16_t)qx_hsum8i(
		    _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3])));
		store_q32(q, r);
	}
}

/* Q8_K (the K-quants' activations) per block of 256: the same operations as quant.c's
 * quantize_q8_k, ggml's quantize_row_q8_K_ref (the signed value of largest magnitude, the first
 * of equal ones, sets iscale = -127 / max; d = 1 / iscale; round to nearest even, capped at
 * 127 before the sums); one int16 sum per 16 values. */
TGT static void avx2_act_q8_k(const float *x, int n, int8_t *q, float *d, int16_t *bsums)
{
	const __m256 sign = _mm256_set1_ps(-0.0f);
	const __m256i cap = _mm256_set1_epi32(127);
	for (int i = 0; i < n / QK_K; i++, x += QK_K, q += QK_K, bsums += 16) {
		__m256 m = _mm256_setzero_ps();
		for (int k = 0; k < QK_K / 8; k++)
			m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k)));
		float amax = hmax8(m), max = 0;
		for (int j = 0; amax && j < QK_K && !max; j++)
			max = fabsf(x[j]) == amax ? x[j] : 0.f;
		float is = max ? -127.f / max : 0.f;
		d[i] = max ? 1.f / is : 0.f;
		__m256 vi = _mm256_set1_ps(is);
		for (int c = 0; c < QK_K / 32; c++) {
			__m256i r[4];
			for (int k = 0; k < 4; k++)
				r[k] = _mm256_min_epi32(
				    cap, _mm256_cvtps_epi32(_mm256_mul_ps(
					     _mm256_loadu_ps(x + 32 * c + 8 * k), vi)));
			bsums[2 * c] = (int16_t)qx_hsum8i(_mm256_add_epi32(r[0], r[1]));
			bsums[2 * c + 1] = (int16_t)qx_hsum8i(_mm256_add_epi32(r[2], r[3]));
			store_q32(q + 32 * c, r);
		}
	}
}

/* Attention tiles. AVX2: one query at a time, 64 scores in eight registers (eight independent
 * FMA chains, no horizontal sums). AVX-512: up to four queries at once, each key-tile load (four
 * registers of 16 keys) used by all of them, so the loop is bound by FMAs, not loads. */
TGT static void avx2_qkt(float *s, const float *const *q, int nq, const float *kt, int hd)
{
	for (int j = 0; j < nq; j++) {
		__m256 c[8];
		for (int k = 0; k < 8; k++)
			c[k] = _mm256_setzero_ps();
		for (int i = 0; i < hd; i++) {
			__m256 qi = _mm256_set1_ps(q[j][i]);
			for (int k = 0; k < 8; k++)
				c[k] =
				    _mm256_fmadd_ps(qi, _mm256_loadu_ps(kt + 64 * i + 8 * k), c[k]);
		}
		for (int k = 0; k < 8; k++)
			_mm256_storeu_ps(s + 64 * j + 8 * k, c[k]);
	}
}

TGT static void avx2_av(float *const *o, const float *a, int nq, const float *v, size_t stride,
			int T, int n)
{
	for (int j = 0; j < nq; j++)
		avx2_vsum_f32(o[j], a + 64 * j, (const uint8_t *)v, stride * sizeof(float), T, n);
}

#define TGT512A __attribute__((target("avx512f,avx2,fma")))

TGT512A static inline __attribute__((always_inline)) void
qkt512(float *s, const float *const *q, const int NQ, const float *kt, int hd)
{
	__m512 c[4][4];
	_Pragma("GCC unroll 4") for (int j = 0; j < NQ; j++)
	    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) c[j][k] = _mm512_setzero_ps();
	for (int i = 0; i < hd; i++) {
		__m512 kv[4];
		_Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) kv[k] =
		    _mm512_loadu_ps(kt + 64 * i + 16 * k);
		_Pragma("GCC unroll 4") for (int j = 0; j < NQ; j++)
		{
			__m512 qi = _mm512_set1_ps(q[j][i]);
			_Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) c[j][k] =
			    _mm512_fmadd_ps(qi, kv[k], c[j][k]);
		}
	}
	_Pragma("GCC unroll 4") for (int j = 0; j < NQ; j++)
	    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
		_mm512_storeu_ps(s + 64 * j + 16 * k, c[j][k]);
}

TGT512A static void avx512_qkt(float *s, const float *const *q, int nq, const float *kt, int hd)
{
	for (int j = 0; j < nq; j += 4) {
		switch (nq - j) {
		case 1: qkt512(s + 64 * j, q + j, 1, kt, hd); break;
		case 2: qkt512(s + 64 * j, q + j, 2, kt, hd); break;
		case 3: qkt512(s + 64 * j, q + j, 3, kt, hd); break;
		default: qkt512(s + 64 * j, q + j, 4, kt, hd); break;
		}
	}
}

/* o[j][64 columns] in four registers per query; every value row load serves all queries. */
TGT512A static inline __attribute__((always_inline)) void
av512(float *const *o, const float *a, const int NQ, const float *v, size_t stride, int T, int i0)
{
	__m512 c[4][4];
	_Pragma("GCC unroll 4") for (int j = 0; j < NQ; j++)
	    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) c[j][k] =
		_mm512_loadu_ps(o[j] + i0 + 16 * k);
	for (int t = 0; t < T; t++) {
		__m512 vv[4];
		_Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) vv[k] =
		    _mm512_loadu_ps(v + (size_t)t * stride + i0 + 16 * k);
		_Pragma("GCC unroll 4") for (int j = 0; j < NQ; j++)
		{
			__m512 at = _mm512_set1_ps(a[64 * j + t]);
			_Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) c[j][k] =
			    _mm512_fmadd_ps(at, vv[k], c[j][k]);
		}
	}
	_Pragma("GCC unroll 4") for (int j = 0; j < NQ; j++)
	    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
		_mm512_storeu_ps(o[j] + i0 + 16 * k, c[j][k]);
}

TGT512A static void avx512_av(float *const *o, const float *a, int nq, const float *v,
			      size_t stride, int T, int n)
{
	int i0 = 0;
	for (; i0 + 64 <= n; i0 += 64)
		for (int j = 0; j < nq; j += 4) {
			switch (nq - j) {
			case 1: av512(o + j, a + 64 * j, 1, v, stride, T, i0); break;
			case 2: av512(o + j, a + 64 * j, 2, v, stride, T, i0); break;
			case 3: av512(o + j, a + 64 * j, 3, v, stride, T, i0); break;
			default: av512(o + j, a + 64 * j, 4, v, stride, T, i0); break;
			}
		}
	if (i0 < n) { /* a head narrower than 64 columns, or the rest of one */
		float *oj[64];
		for (int j = 0; j < nq; j++)
			oj[j] = o[j] + i0;
		avx2_av(oj, a, nq, v + i0, stride, T, n - i0);
	}
}

static int have_avx512f(void)
{
	static int have = -1; /* benign race: every thread computes the same value */
	if (have < 0) {
		__builtin_cpu_init();
		have = __builtin_cpu_supports("avx512f") != 0;
	}
	return have;
}

quant_qkt_fn quant_x86_qkt(void)
{
	if (!quant_x86_ops(QT_F32))
		return NULL;
	return have_avx512f() ? avx512_qkt : avx2_qkt;
}

quant_av_fn quant_x86_av(void)
{
	if (!quant_x86_ops(QT_F32))
		return NULL;
	return have_avx512f() ? avx512_av : avx2_av;
}

quant_act_q8_0_fn quant_x86_act_q8_0(void)
{
	return quant_x86_ops(QT_F32) ? avx2_act_q8_0 : NULL;
}

quant_act_q8_0_fn quant_x86_act_q8_k(void)
{
	return quant_x86_ops(QT_F32) ? avx2_act_q8_k : NULL;
}

quant_wsum_fn quant_x86_wsum(void)
{
	return quant_x86_ops(QT_F32) ? avx2_wsum : NULL;
}

quant_expsum_fn quant_x86_expsum(void)
{
	return quant_x86_ops(QT_F32) ? avx2_expsum : NULL;
}

quant_f16_row_fn quant_x86_f16_row(void)
{
	return quant_x86_ops(QT_F32) ? avx2_f16_row : NULL;
}

quant_vsum_fn quant_x86_vsum(int type)
{
	if (!quant_x86_ops(QT_F32))
		return NULL;
	switch (type) {
	case QT_F32: return avx2_vsum_f32;
	case QT_F16: return avx2_vsum_f16;
	case QT_Q8_0: return avx2_vsum_q8_0;
	default: return NULL;
	}
}

#else

quant_qkt_fn quant_x86_qkt(void)
{
	return NULL;
}

quant_av_fn quant_x86_av(void)
{
	return NULL;
}

quant_act_q8_0_fn quant_x86_act_q8_0(void)
{
	return NULL;
}

quant_act_q8_0_fn quant_x86_act_q8_k(void)
{
	return NULL;
}

quant_vsum_fn quant_x86_vsum(int type)
{
	(void)type;
	return NULL;
}

quant_expsum_fn quant_x86_expsum(void)
{
	return NULL;
}

quant_f16_row_fn quant_x86_f16_row(void)
{
	return NULL;
}

quant_wsum_fn quant_x86_wsum(void)
{
	return NULL;
}

const quant_ops_t *quant_x86_ops(int wtype)
{
	(void)wtype;
	return NULL;
}

#endif
