/*
 * quant_lowbit_x86.c: AVX2 matvec kernels for the low-bit types of quant_lowbit.c (Q5_0, Q5_1,
 * Q2_K, Q3_K, Q5_K), chosen at run time like quant_x86.c's (target attributes, so the file
 * builds without -mavx2 and the tables are handed out only on CPUs that have AVX2 and FMA).
 *
 * One pattern for all five: a block's bit planes are unpacked into 32 unsigned bytes at a time
 * (the value, or the value plus a fixed offset that is taken back through the activation block
 * sums), maddubs with the 8-bit activations, madd to int32 lanes, the sub-block scale folded in
 * as an int32 multiply, one float FMA per block. Invariant: the results equal the reference
 * kernels (quant_lowbit.c) up to float summation order.
 */
#include "infer/quant/quant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include "infer/quant/simd_x86.h"

#include <immintrin.h>
#include <string.h>

#define LB_TGT __attribute__((target("avx2,fma")))

/* 32 unsigned weight bytes (< 128) times 32 signed activations: 8 int32 sums, lane k holding
 * bytes 4k..4k+3 (lanes 0-3 the first 16 elements, 4-7 the next 16). */
LB_TGT static inline __m256i lb_dot(__m256i u, const int8_t *q)
{
	__m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)q));
	return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Bit k of each byte of v, as 0 or `val` per byte (k < 8; srli on 16-bit lanes moves no bit of
 * one byte into bit 0 of its neighbour). */
LB_TGT static inline __m256i lb_bit(__m256i v, int k, int val)
{
	__m256i b = _mm256_and_si256(_mm256_srli_epi16(v, k), _mm256_set1_epi8(1));
	return _mm256_mullo_epi16(b, _mm256_set1_epi16((short)val));
}

/* Q5_0 / Q5_1: the 32 five-bit values of a block as unsigned bytes, element order. */
LB_TGT static inline __m256i lb_q5_unpack(const uint8_t *qs, const uint8_t *qh4)
{
	__m128i b = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0f);
	__m256i lo =
	    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
	uint32_t qh;
	memcpy(&qh, qh4, 4);
	/* byte j gets byte j/8 of qh, then keeps bit j%8 */
	__m256i spread = _mm256_shuffle_epi8(
	    _mm256_set1_epi32((int)qh),
	    _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll, 0x0101010101010101ll, 0));
	__m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
	__m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
	return _mm256_or_si256(lo, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}

/* Q5_0 (values stored + 16: minus 16 x d x the activation block's sum) and Q5_1 (plus m x that
 * sum): the same dot, a different offset. */
LB_TGT static inline __attribute__((always_inline)) void lb_rows_q5(float *out, const uint8_t *w,
								    size_t stride, int nrows,
								    const quant_act_t *x, int n,
								    const int Q51)
{
	const size_t bb = Q51 ? sizeof(blk_q5_1) : sizeof(blk_q5_0);
	for (int r = 0; r < nrows; r++) {
		__m256 acc = _mm256_setzero_ps();
		float off = 0;
		for (int i = 0; i < n / 32; i++) {
			const uint8_t *blk = w + (size_t)r * stride + (size_t)i * bb;
			const blk_q5_0 *b0 = (const blk_q5_0 *)blk;
			const blk_q5_1 *b1 = (const blk_q5_1 *)blk;
			float d = quant_f16_to_f32(Q51 ? b1->d : b0->d) * x->d[i];
			__m256i p = lb_dot(Q51 ? lb_q5_unpack(b1->qs, b1->qh)
					       : lb_q5_unpack(b0->qs, b0->qh),
					   x->q + 32 * i);
			acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
			off += Q51 ? quant_f16_to_f32(b1->m) * x->d[i] * (float)x->bsums[i]
				   : -(d * 16.f * (float)x->bsums[i]);
		}
		out[r] = qx_hsum8(acc) + off;
	}
}

LB_TGT static void lb_rows_q5_0(float *out, const uint8_t *w, size_t stride, int nrows,
				const quant_act_t *x, int n)
{
	lb_rows_q5(out, w, stride, nrows, x, n, 0);
}

LB_TGT static void lb_rows_q5_1(float *out, const uint8_t *w, size_t stride, int nrows,
				const quant_act_t *x, int n)
{
	lb_rows_q5(out, w, stride, nrows, x, n, 1);
}

/* Per-lane scales for a 32-element run covering groups g (lanes 0-3) and g + 1 (lanes 4-7). */
LB_TGT static inline __m256i lb_scales2(int s0, int s1)
{
	return _mm256_set_epi32(s1, s1, s1, s1, s0, s0, s0, s0);
}

/* Q2_K and Q3_K share the 2-bit plane: element 128h + 32j + l sits in byte 32h + l at bit 2j. */
LB_TGT static void lb_rows_q2_k(float *out, const uint8_t *w, size_t stride, int nrows,
				const quant_act_t *x, int n)
{
	const __m256i three = _mm256_set1_epi8(3);
	for (int r = 0; r < nrows; r++) {
		const blk_q2_k *b = (const blk_q2_k *)(w + (size_t)r * stride);
		__m256 acc = _mm256_setzero_ps();
		float off = 0;
		for (int i = 0; i < n / QK_K; i++) {
			const int8_t *q = x->q + QK_K * i;
			const int16_t *bs = x->bsums + 16 * i;
			__m256i sum = _mm256_setzero_si256();
			for (int h = 0; h < 2; h++) {
				__m256i qv =
				    _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * h));
				for (int j = 0; j < 4; j++) {
					int g = 8 * h + 2 * j;
					__m256i v =
					    _mm256_and_si256(_mm256_srli_epi16(qv, 2 * j), three);
					__m256i sc = lb_scales2(b[i].scales[g] & 0xf,
								b[i].scales[g + 1] & 0xf);
					sum = _mm256_add_epi32(
					    sum, _mm256_mullo_epi32(lb_dot(v, q + 128 * h + 32 * j),
								    sc));
				}
			}
			int mins = 0;
			for (int g = 0; g < 16; g++)
				mins += (b[i].scales[g] >> 4) * bs[g];
			float dx = x->d[i];
			acc = _mm256_fmadd_ps(_mm256_set1_ps(quant_f16_to_f32(b[i].d) * dx),
					      _mm256_cvtepi32_ps(sum), acc);
			off += quant_f16_to_f32(b[i].dmin) * dx * (float)mins;
		}
		out[r] = qx_hsum8(acc) - off;
	}
}

LB_TGT static void lb_rows_q3_k(float *out, const uint8_t *w, size_t stride, int nrows,
				const quant_act_t *x, int n)
{
	const __m256i three = _mm256_set1_epi8(3);
	for (int r = 0; r < nrows; r++) {
		const blk_q3_k *b = (const blk_q3_k *)(w + (size_t)r * stride);
		__m256 acc = _mm256_setzero_ps();
		for (int i = 0; i < n / QK_K; i++) {
			const int8_t *q = x->q + QK_K * i;
			const int16_t *bs = x->bsums + 16 * i;
			int sc[16], corr = 0;
			for (int g = 0; g < 16; g++) {
				sc[g] = quant_q3k_scale(b[i].scales, g);
				corr += sc[g] * bs[g];
			}
			__m256i hm = _mm256_loadu_si256((const __m256i *)b[i].hmask);
			__m256i sum = _mm256_setzero_si256();
			for (int h = 0; h < 2; h++) {
				__m256i qv =
				    _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * h));
				for (int j = 0; j < 4; j++) {
					int g = 8 * h + 2 * j;
					/* value + 4 = low bits | (high bit << 2), 0..7 */
					__m256i v = _mm256_or_si256(
					    _mm256_and_si256(_mm256_srli_epi16(qv, 2 * j), three),
					    lb_bit(hm, 4 * h + j, 4));
					sum = _mm256_add_epi32(
					    sum, _mm256_mullo_epi32(lb_dot(v, q + 128 * h + 32 * j),
								    lb_scales2(sc[g], sc[g + 1])));
				}
			}
			/* take the +4 back: sum_g sc_g * 4 * sum(x in g) */
			sum =
			    _mm256_sub_epi32(sum, _mm256_setr_epi32(4 * corr, 0, 0, 0, 0, 0, 0, 0));
			acc = _mm256_fmadd_ps(_mm256_set1_ps(quant_f16_to_f32(b[i].d) * x->d[i]),
					      _mm256_cvtepi32_ps(sum), acc);
		}
		out[r] = qx_hsum8(acc);
	}
}

LB_TGT static void lb_rows_q5_k(float *out, const uint8_t *w, size_t stride, int nrows,
				const quant_act_t *x, int n)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	for (int r = 0; r < nrows; r++) {
		const blk_q5_k *b = (const blk_q5_k *)(w + (size_t)r * stride);
		__m256 acc = _mm256_setzero_ps();
		float off = 0;
		for (int i = 0; i < n / QK_K; i++) {
			const int8_t *q = x->q + QK_K * i;
			const int16_t *bs = x->bsums + 16 * i;
			__m256i qh = _mm256_loadu_si256((const __m256i *)b[i].qh);
			__m256i sum = _mm256_setzero_si256();
			int mins = 0;
			for (int c = 0; c < 4; c++) {
				__m256i ql =
				    _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * c));
				int sc0, m0, sc1, m1;
				quant_k4_scale_min(2 * c, b[i].scales, &sc0, &m0);
				quant_k4_scale_min(2 * c + 1, b[i].scales, &sc1, &m1);
				__m256i v0 = _mm256_or_si256(_mm256_and_si256(ql, m4),
							     lb_bit(qh, 2 * c, 16));
				__m256i v1 =
				    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql, 4), m4),
						    lb_bit(qh, 2 * c + 1, 16));
				sum = _mm256_add_epi32(sum,
						       _mm256_mullo_epi32(lb_dot(v0, q + 64 * c),
									  _mm256_set1_epi32(sc0)));
				sum = _mm256_add_epi32(
				    sum, _mm256_mullo_epi32(lb_dot(v1, q + 64 * c + 32),
							    _mm256_set1_epi32(sc1)));
				mins += m0 * (bs[4 * c] + bs[4 * c + 1]) +
					m1 * (bs[4 * c + 2] + bs[4 * c + 3]);
			}
			float dx = x->d[i];
			acc = _mm256_fmadd_ps(_mm256_set1_ps(quant_f16_to_f32(b[i].d) * dx),
					      _mm256_cvtepi32_ps(sum), acc);
			off += quant_f16_to_f32(b[i].dmin) * dx * (float)mins;
		}
		out[r] = qx_hsum8(acc) - off;
	}
}

static const quant_ops_t lb_q5_0 = {"avx2", QT_Q8_0, lb_rows_q5_0, NULL, NULL};
static const quant_ops_t lb_q5_1 = {"avx2", QT_Q8_0, lb_rows_q5_1, NULL, NULL};
static const quant_ops_t lb_q2_k = {"avx2", QT_Q8_K, lb_rows_q2_k, NULL, NULL};
static const quant_ops_t lb_q3_k = {"avx2", QT_Q8_K, lb_rows_q3_k, NULL, NULL};
static const quant_ops_t lb_q5_k = {"avx2", QT_Q8_K, lb_rows_q5_k, NULL, NULL};

const quant_ops_t *quant_lowbit_x86_ops(int t)
{
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
		return NULL;
	switch (t) {
	case QT_Q5_0: return &lb_q5_0;
	case QT_Q5_1: return &lb_q5_1;
	case QT_Q2_K: return &lb_q2_k;
	case QT_Q3_K: return &lb_q3_k;
	case QT_Q5_K: return &lb_q5_k;
	default: return NULL;
	}
}

#else

const quant_ops_t *quant_lowbit_x86_ops(int t)
{
	(void)t;
	return NULL;
}

#endif
