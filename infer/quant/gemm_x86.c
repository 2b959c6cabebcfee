/*
 * gemm_x86.c: the tiled integer kernels over R16 groups (repack.h) for x86: AVX-512 VNNI
 * (one 512-bit register = the 16 rows of a group, vpdpbusd with four activation bytes broadcast)
 * and AVX2 (two 256-bit halves of 8 rows, maddubs + madd). Chosen at run time like
 * quant_x86.c's tables; each function carries its target attribute.
 *
 * Register blocking: a call keeps one float accumulator per (vector, 16 rows) and one int32
 * accumulator per (vector, 16 rows) for the current block; every weight register loaded is used
 * by all nt vectors. The per-block float work (scale product, convert, FMA) is one operation per
 * vector per 32 elements. The int32 accumulator starts at -offset x block sum, which removes
 * the +128 (Q8_0) or +8 (Q4_0) carried by the unsigned weight bytes.
 * Invariant: equal to repack.c's reference up to float rounding order.
 */
#include "infer/quant/repack.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <cpuid.h>
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define TGT512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define TGT2   __attribute__((target("avx2,fma,f16c")))
#define INL    inline __attribute__((always_inline))
/* Software prefetch this many bytes ahead in the weight stream. With 4-bit weights (more work
 * per byte) or several vectors sharing each weight register, one core issues too few loads for
 * the L2 streamer alone to keep it at the streaming bandwidth: measured with one thread, Q4_0
 * decode 71 -> 78 tok/s, Q8_0 prefill 280 -> 326; 6-8 KiB ahead was best (2, 4 and 12 KiB
 * lost). VNNI Q8_0 decode keeps up without it and its extra instructions cost it ~5 %; the
 * AVX2 kernels (more work per byte everywhere) gain on every type: decode Q4_0 44 -> 64, Q8_0
 * 29 -> 36. Past the end of the weights it is only a hint. */
#define PF_AHEAD 7168
/* And a second stream into L2 only, further ahead, for every type and batch. One core's L1 fill
 * buffers cap the misses it has in flight; L2 prefetches queue beyond them. On a 2-core Xeon
 * (Emerald Rapids) VM, the 256 MiB matrix of eng_kernel_rate with 2 threads, alternating runs:
 * Q8_0 decode 25.1-25.5 -> 29.0-33.1 GB/s (16, 32 and 64 KiB ahead alike; 8 KiB a little
 * less), Q4_0 24.4-24.8 -> 29.8-30.9, MXFP4 22.3-24.5 -> 26.5-28.4. The same prefetch in
 * bench --membw's summing loop left it at 34-39 GB/s, so the bound it measures was already
 * the memory's and the kernels were short of it. */
#define PF_L2_AHEAD 32768

static inline int ld32(const int8_t *p)
{
	int v;
	memcpy(&v, p, 4);
	return v;
}

/* ---- AVX-512 VNNI ------------------------------------------------------------------------ */

/* MXFP4's values plus 12 (0..24, unsigned for vpdpbusd / maddubs; the 12 comes off through the
 * activation's block sum), in every 128-bit lane. */
static const int8_t mx12[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

/* One call: groups [0, ngroups) x vectors [0, NT). Q4: 0 Q8_0, 1 Q4_0, 2 MXFP4 (Q4_0's nibbles
 * looked up in mx12, an exponent byte per row instead of an f16 scale). */
TGT512 static INL void vnni_gemm(float *out, int ldo, const uint8_t *w, int ngroups,
				 const quant_act_t *x, const int NT, int n, const int Q4)
{
	const int nb = n / QK8_0;
	const size_t gb = Q4 == 2 ? 272 : Q4 ? 288 : 544; /* bytes per block index of a group */
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	const __m512i tbl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)mx12));
	for (int g = 0; g < ngroups; g++) {
		const uint8_t *gp = w + (size_t)g * nb * gb;
		__m512 acc[QR_NT];
		_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++) acc[v] = _mm512_setzero_ps();
		for (int i = 0; i < nb; i++) {
			const uint8_t *d = gp + (size_t)i * gb, *q = d + (Q4 == 2 ? 16 : 32);
			if (Q4 || NT > 1)
				for (size_t o = 0; o < gb; o += 64)
					_mm_prefetch((const char *)d + PF_AHEAD + o, _MM_HINT_T0);
			for (size_t o = 0; o < gb; o += 64)
				_mm_prefetch((const char *)d + PF_L2_AHEAD + o, _MM_HINT_T1);
			__m512 sw =
			    Q4 == 2 /* 2^(e - 128), exact (subnormals too) */
				? _mm512_scalef_ps(
				      _mm512_set1_ps(1.0f),
				      _mm512_cvtepi32_ps(_mm512_sub_epi32(
					  _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)d)),
					  _mm512_set1_epi32(128))))
				: _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d));
			/* two int32 chains per vector (even / odd k-steps, or low / high
			 * nibbles): with one vector a single chain of 8 dependent vpdpbusd
			 * would make decode latency-bound */
			__m512i ia[QR_NT], ib[QR_NT];
			_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
			{
				ia[v] = _mm512_set1_epi32((Q4 == 2 ? -12
							   : Q4    ? -8
								   : -128) *
							  x[v].bsums[i]);
				ib[v] = _mm512_setzero_si512();
			}
			if (Q4) {
				_Pragma("GCC unroll 8") for (int s = 0; s < 4; s++)
				{
					__m512i b = _mm512_loadu_si512((const void *)(q + 64 * s));
					__m512i lo = _mm512_and_si512(b, m4);
					__m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
					if (Q4 == 2) {
						lo = _mm512_shuffle_epi8(tbl, lo);
						hi = _mm512_shuffle_epi8(tbl, hi);
					}
					_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
					{
						const int8_t *xq = x[v].q + 32 * i + 4 * s;
						ia[v] = _mm512_dpbusd_epi32(
						    ia[v], lo, _mm512_set1_epi32(ld32(xq)));
						ib[v] = _mm512_dpbusd_epi32(
						    ib[v], hi, _mm512_set1_epi32(ld32(xq + 16)));
					}
				}
			} else {
				_Pragma("GCC unroll 8") for (int s = 0; s < 8; s++)
				{
					__m512i b = _mm512_loadu_si512((const void *)(q + 64 * s));
					_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
					{
						__m512i xb = _mm512_set1_epi32(
						    ld32(x[v].q + 32 * i + 4 * s));
						if (s & 1)
							ib[v] = _mm512_dpbusd_epi32(ib[v], b, xb);
						else
							ia[v] = _mm512_dpbusd_epi32(ia[v], b, xb);
					}
				}
			}
			_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++) acc[v] =
			    _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(ia[v], ib[v])),
					    _mm512_mul_ps(sw, _mm512_set1_ps(x[v].d[i])), acc[v]);
		}
		_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
		    _mm512_storeu_ps(out + (size_t)v * ldo + g * QR_ROWS, acc[v]);
	}
}

#define VNNI_NT(name, Q4)                                                                          \
	TGT512 static void name(float *out, int ldo, const uint8_t *w, int ngroups,                \
				const quant_act_t *x, int nt, int n)                               \
	{                                                                                          \
		switch (nt) {                                                                      \
		case 1: vnni_gemm(out, ldo, w, ngroups, x, 1, n, Q4); break;                       \
		case 2: vnni_gemm(out, ldo, w, ngroups, x, 2, n, Q4); break;                       \
		case 3: vnni_gemm(out, ldo, w, ngroups, x, 3, n, Q4); break;                       \
		case 4: vnni_gemm(out, ldo, w, ngroups, x, 4, n, Q4); break;                       \
		case 5: vnni_gemm(out, ldo, w, ngroups, x, 5, n, Q4); break;                       \
		case 6: vnni_gemm(out, ldo, w, ngroups, x, 6, n, Q4); break;                       \
		case 7: vnni_gemm(out, ldo, w, ngroups, x, 7, n, Q4); break;                       \
		default: vnni_gemm(out, ldo, w, ngroups, x, 8, n, Q4); break;                      \
		}                                                                                  \
	}
VNNI_NT(vnni_gemm_q8_0, 0)
VNNI_NT(vnni_gemm_q4_0, 1)
VNNI_NT(vnni_gemm_mxfp4, 2)

/* Q4_K (Q8_K activations), up to 4 vectors. Per 256-element block: the 16 rows' 6-bit scales
 * and mins unpacked once with word-wide masks (lane r = row r, byte k = sub-block k or 4 + k);
 * per chunk of 64 elements two int32 sub-block dots per vector, scaled by vpmulld into the
 * block's sum; the mins times the activation's 32-element sums by vpdpwssd on int16 pairs
 * (mins m_k, m_k+2 against the sums of sub-blocks k, k+2), prepared once per call. */
#define K4_MAX_BLOCKS 128 /* rows up to 32768 elements */

TGT512 static INL void vnni_gemm_k4(float *out, int ldo, const uint8_t *w, int ngroups,
				    const quant_act_t *x, const int NT, int n)
{
	const int nb = n / QK_K;
	const __m512i m4 = _mm512_set1_epi8(0x0f), m6 = _mm512_set1_epi32(0x3f3f3f3f),
		      m2 = _mm512_set1_epi32(0x03030303), m0f = _mm512_set1_epi32(0x0f0f0f0f),
		      ff = _mm512_set1_epi32(0xff), ff16 = _mm512_set1_epi32(0x00ff00ff);
	int32_t mp[4][K4_MAX_BLOCKS * 4]; /* activation sum pairs per vector and block */
	for (int v = 0; v < NT; v++)
		for (int i = 0; i < nb; i++) {
			const int16_t *bs = x[v].bsums + 16 * i;
			int b32[8];
			for (int k = 0; k < 8; k++)
				b32[k] = bs[2 * k] + bs[2 * k + 1];
			for (int k = 0; k < 2; k++) {
				mp[v][4 * i + k] =
				    (int32_t)((uint16_t)b32[k] | (uint32_t)b32[k + 2] << 16);
				mp[v][4 * i + 2 + k] =
				    (int32_t)((uint16_t)b32[4 + k] | (uint32_t)b32[6 + k] << 16);
			}
		}
	for (int g = 0; g < ngroups; g++) {
		const uint8_t *gp = w + (size_t)g * nb * 2304;
		__m512 acc[4];
		_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++) acc[v] = _mm512_setzero_ps();
		for (int i = 0; i < nb; i++) {
			const uint8_t *d = gp + (size_t)i * 2304;
			__m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d));
			__m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + 32)));
			__m512i u0 = _mm512_loadu_si512((const void *)(d + 64));
			__m512i u1 = _mm512_loadu_si512((const void *)(d + 128));
			__m512i u2 = _mm512_loadu_si512((const void *)(d + 192));
			__m512i sc[2], mn[2];
			sc[0] = _mm512_and_si512(u0, m6);
			sc[1] = _mm512_or_si512(
			    _mm512_and_si512(u2, m0f),
			    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), m2), 4));
			mn[0] = _mm512_and_si512(u1, m6);
			mn[1] = _mm512_or_si512(
			    _mm512_and_si512(_mm512_srli_epi32(u2, 4), m0f),
			    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), m2), 4));
			__m512i isum[4];
			_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++) isum[v] =
			    _mm512_setzero_si512();
			_Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
			{
				__m512i s = sc[c / 2];
				__m512i sa =
				    _mm512_and_si512(_mm512_srli_epi32(s, 16 * (c % 2)), ff);
				__m512i sb =
				    _mm512_and_si512(_mm512_srli_epi32(s, 16 * (c % 2) + 8), ff);
				/* with 1-2 vectors, odd k-steps go to a second pair of chains
				 * (slots 4..7): 8 dependent vpdpbusd would bind on latency */
				const int spl = NT <= 2 ? 4 : 0;
				__m512i il[8], ih[8];
				_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
				{
					il[v] = ih[v] = _mm512_setzero_si512();
					il[v + spl] = ih[v + spl] = _mm512_setzero_si512();
				}
				const uint8_t *q = d + 256 + 512 * c;
				/* whole blocks ahead (3): without it decode was at half the
				 * streaming bandwidth. A quarter of the block per chunk: all 36
				 * lines at the block's start left one core at 38 GB/s where
				 * this reads 40 (2048-element rows, alternating runs) */
				for (int o = 576 * c; o < 576 * (c + 1); o += 64) {
					_mm_prefetch((const char *)d + PF_AHEAD / 2304 * 2304 + o,
						     _MM_HINT_T0);
					_mm_prefetch((const char *)d + PF_L2_AHEAD + o, _MM_HINT_T1);
				}
				_Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
				{
					__m512i b = _mm512_loadu_si512((const void *)(q + 64 * k));
					__m512i lo = _mm512_and_si512(b, m4);
					__m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
					_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
					{
						const int8_t *xq =
						    x[v].q + QK_K * i + 64 * c + 4 * k;
						int u = v + (k & 1) * spl;
						il[u] = _mm512_dpbusd_epi32(
						    il[u], lo, _mm512_set1_epi32(ld32(xq)));
						ih[u] = _mm512_dpbusd_epi32(
						    ih[u], hi, _mm512_set1_epi32(ld32(xq + 32)));
					}
				}
				_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
				{
					if (spl) {
						il[v] = _mm512_add_epi32(il[v], il[v + spl]);
						ih[v] = _mm512_add_epi32(ih[v], ih[v + spl]);
					}
					isum[v] = _mm512_add_epi32(
					    isum[v],
					    _mm512_add_epi32(_mm512_mullo_epi32(il[v], sa),
							     _mm512_mullo_epi32(ih[v], sb)));
				}
			}
			__m512i pa = _mm512_and_si512(mn[0], ff16);
			__m512i pb = _mm512_and_si512(_mm512_srli_epi32(mn[0], 8), ff16);
			__m512i pc = _mm512_and_si512(mn[1], ff16);
			__m512i pd = _mm512_and_si512(_mm512_srli_epi32(mn[1], 8), ff16);
			_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
			{
				const int32_t *p = mp[v] + 4 * i;
				__m512i ms = _mm512_dpwssd_epi32(_mm512_setzero_si512(), pa,
								 _mm512_set1_epi32(p[0]));
				ms = _mm512_dpwssd_epi32(ms, pb, _mm512_set1_epi32(p[1]));
				ms = _mm512_dpwssd_epi32(ms, pc, _mm512_set1_epi32(p[2]));
				ms = _mm512_dpwssd_epi32(ms, pd, _mm512_set1_epi32(p[3]));
				__m512 dx = _mm512_set1_ps(x[v].d[i]);
				acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[v]),
							 _mm512_mul_ps(dw, dx), acc[v]);
				acc[v] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms),
							  _mm512_mul_ps(dm, dx), acc[v]);
			}
		}
		_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
		    _mm512_storeu_ps(out + (size_t)v * ldo + g * QR_ROWS, acc[v]);
	}
}

TGT512 static void vnni_gemm_q4_k(float *out, int ldo, const uint8_t *w, int ngroups,
				  const quant_act_t *x, int nt, int n)
{
	for (int v0 = 0; v0 < nt; v0 += 4) {
		float *o = out + (size_t)v0 * ldo;
		switch (nt - v0) {
		case 1: vnni_gemm_k4(o, ldo, w, ngroups, x + v0, 1, n); break;
		case 2: vnni_gemm_k4(o, ldo, w, ngroups, x + v0, 2, n); break;
		case 3: vnni_gemm_k4(o, ldo, w, ngroups, x + v0, 3, n); break;
		default: vnni_gemm_k4(o, ldo, w, ngroups, x + v0, 4, n); break;
		}
	}
}

/* Q6_K (Q8_K activations), up to 4 vectors. The 6-bit values (0..63) are assembled per k-step
 * from a low-nibble byte and the high-bit byte (masks and 16-bit shifts whose spill into the
 * neighbouring byte the 0x30 mask removes) and are the unsigned vpdpbusd operand; each int32
 * accumulator covers one 16-element sub-block and starts at -32 x its activation sum (the
 * format's offset), then takes its signed 8-bit scale by vpmulld. */
TGT512 static INL void vnni_gemm_k6(float *out, int ldo, const uint8_t *w, int ngroups,
				    const quant_act_t *x, const int NT, int n)
{
	const int nb = n / QK_K;
	const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
	for (int g = 0; g < ngroups; g++) {
		const uint8_t *gp = w + (size_t)g * nb * 3360;
		__m512 acc[4];
		_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++) acc[v] = _mm512_setzero_ps();
		for (int i = 0; i < nb; i++) {
			const uint8_t *d = gp + (size_t)i * 3360;
			__m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d));
			__m512i isum[4];
			_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++) isum[v] =
			    _mm512_setzero_si512();
			for (int h = 0; h < 2; h++)
				for (int sh = 0; sh < 2; sh++) {
					__m512i ia[4][4];
					/* as in vnni_gemm_k4: 2 blocks ahead, a quarter per
					 * pass (one core 40 -> 43 GB/s against all at once) */
					int o0 = 840 * (2 * h + sh);
					for (int o = o0; o < o0 + 840; o += 64) {
						_mm_prefetch((const char *)d +
								 PF_AHEAD / 3360 * 3360 + o,
							     _MM_HINT_T0);
						_mm_prefetch((const char *)d + PF_L2_AHEAD + o,
							     _MM_HINT_T1);
					}
					_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
					    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
						ia[v][k] = _mm512_set1_epi32(
						    -32 * x[v].bsums[16 * i + 8 * h + 2 * k + sh]);
					_Pragma("GCC unroll 4") for (int s = 4 * sh; s < 4 * sh + 4;
								     s++)
					{
						__m512i hb = _mm512_loadu_si512(
						    (const void *)(d + 2336 + (h * 8 + s) * 64));
						__m512i l0 = _mm512_loadu_si512(
						    (const void *)(d + 288 +
								   ((h * 2) * 8 + s) * 64));
						__m512i l1 = _mm512_loadu_si512(
						    (const void *)(d + 288 +
								   ((h * 2 + 1) * 8 + s) * 64));
						__m512i q[4];
						q[0] = _mm512_or_si512(
						    _mm512_and_si512(l0, m4),
						    _mm512_and_si512(_mm512_slli_epi16(hb, 4),
								     m30));
						q[1] = _mm512_or_si512(
						    _mm512_and_si512(l1, m4),
						    _mm512_and_si512(_mm512_slli_epi16(hb, 2),
								     m30));
						q[2] = _mm512_or_si512(
						    _mm512_and_si512(_mm512_srli_epi16(l0, 4), m4),
						    _mm512_and_si512(hb, m30));
						q[3] = _mm512_or_si512(
						    _mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
						    _mm512_and_si512(_mm512_srli_epi16(hb, 2),
								     m30));
						_Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
						    _Pragma("GCC unroll 8") for (int v = 0; v < NT;
										 v++) ia[v][k] =
							_mm512_dpbusd_epi32(
							    ia[v][k], q[k],
							    _mm512_set1_epi32(
								ld32(x[v].q + QK_K * i + 128 * h +
								     32 * k + 4 * s)));
					}
					_Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
					{
						__m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(
						    (const __m128i *)(d + 32 +
								      16 * (8 * h + 2 * k + sh))));
						_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
						    isum[v] = _mm512_add_epi32(
							isum[v], _mm512_mullo_epi32(ia[v][k], sc));
					}
				}
			_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++) acc[v] =
			    _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[v]),
					    _mm512_mul_ps(dw, _mm512_set1_ps(x[v].d[i])), acc[v]);
		}
		_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
		    _mm512_storeu_ps(out + (size_t)v * ldo + g * QR_ROWS, acc[v]);
	}
}

TGT512 static void vnni_gemm_q6_k(float *out, int ldo, const uint8_t *w, int ngroups,
				  const quant_act_t *x, int nt, int n)
{
	for (int v0 = 0; v0 < nt; v0 += 4) {
		float *o = out + (size_t)v0 * ldo;
		switch (nt - v0) {
		case 1: vnni_gemm_k6(o, ldo, w, ngroups, x + v0, 1, n); break;
		case 2: vnni_gemm_k6(o, ldo, w, ngroups, x + v0, 2, n); break;
		case 3: vnni_gemm_k6(o, ldo, w, ngroups, x + v0, 3, n); break;
		default: vnni_gemm_k6(o, ldo, w, ngroups, x + v0, 4, n); break;
		}
	}
}

/* ---- AVX2 -------------------------------------------------------------------------------- */

/* Half h (rows 8h..8h+7) of each group, up to 4 vectors (16 ymm registers). Q8_0's bytes are
 * turned back to signed weights for the sign trick (maddubs would saturate on 255 x 127 x 2). */
TGT2 static INL void avx2_gemm(float *out, int ldo, const uint8_t *w, int ngroups,
			       const quant_act_t *x, const int NT, int n, const int Q4)
{
	const int nb = n / QK8_0;
	const size_t gb = Q4 == 2 ? 272 : Q4 ? 288 : 544;
	const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1),
		      flip = _mm256_set1_epi8((char)0x80);
	const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)mx12));
	for (int g = 0; g < ngroups; g++)
		for (int h = 0; h < 2; h++) {
			const uint8_t *gp = w + (size_t)g * nb * gb;
			__m256 acc[4];
			_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++) acc[v] =
			    _mm256_setzero_ps();
			for (int i = 0; i < nb; i++) {
				const uint8_t *d = gp + (size_t)i * gb,
					      *q = d + (Q4 == 2 ? 16 : 32) + 32 * h;
				if (h == 0) /* the second half finds it cached */
					for (size_t o = 0; o < gb; o += 64) {
						_mm_prefetch((const char *)d + PF_AHEAD + o,
							     _MM_HINT_T0);
						_mm_prefetch((const char *)d + PF_L2_AHEAD + o,
							     _MM_HINT_T1);
					}
				__m256 sw;
				if (Q4 ==
				    2) { /* 2^(e - 128): e < 2 are the subnormals 2^-128, 2^-127 */
					__m256i e = _mm256_cvtepu8_epi32(
					    _mm_loadl_epi64((const __m128i *)(d + 8 * h)));
					__m256i nrm = _mm256_slli_epi32(
					    _mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
					__m256i sub =
					    _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
					sw = _mm256_castsi256_ps(_mm256_blendv_epi8(
					    nrm, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
				} else {
					sw = _mm256_cvtph_ps(
					    _mm_loadu_si128((const __m128i *)(d + 16 * h)));
				}
				__m256i ia[4];
				_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++) ia[v] =
				    _mm256_set1_epi32(Q4 ? (Q4 == 2 ? -12 : -8) * x[v].bsums[i]
							 : 0);
				for (int s = 0; s < (Q4 ? 4 : 8); s++) {
					__m256i b =
					    _mm256_loadu_si256((const __m256i *)(q + 64 * s));
					if (Q4) {
						__m256i lo = _mm256_and_si256(b, m4);
						__m256i hi =
						    _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
						if (Q4 == 2) {
							lo = _mm256_shuffle_epi8(tbl, lo);
							hi = _mm256_shuffle_epi8(tbl, hi);
						}
						_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
						{
							const int8_t *xq = x[v].q + 32 * i + 4 * s;
							__m256i p = _mm256_add_epi16(
							    _mm256_maddubs_epi16(
								lo, _mm256_set1_epi32(ld32(xq))),
							    _mm256_maddubs_epi16(
								hi,
								_mm256_set1_epi32(ld32(xq + 16))));
							ia[v] = _mm256_add_epi32(
							    ia[v], _mm256_madd_epi16(p, ones));
						}
					} else {
						__m256i sb = _mm256_xor_si256(b, flip);
						__m256i ab = _mm256_abs_epi8(sb);
						_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
						{
							__m256i xb = _mm256_set1_epi32(
							    ld32(x[v].q + 32 * i + 4 * s));
							__m256i p = _mm256_maddubs_epi16(
							    ab, _mm256_sign_epi8(xb, sb));
							ia[v] = _mm256_add_epi32(
							    ia[v], _mm256_madd_epi16(p, ones));
						}
					}
				}
				_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++) acc[v] =
				    _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[v]),
						    _mm256_mul_ps(sw, _mm256_set1_ps(x[v].d[i])),
						    acc[v]);
			}
			_Pragma("GCC unroll 8") for (int v = 0; v < NT; v++)
			    _mm256_storeu_ps(out + (size_t)v * ldo + g * QR_ROWS + 8 * h, acc[v]);
		}
}

#define AVX2_NT(name, Q4)                                                                          \
	TGT2 static void name(float *out, int ldo, const uint8_t *w, int ngroups,                  \
			      const quant_act_t *x, int nt, int n)                                 \
	{                                                                                          \
		for (int v0 = 0; v0 < nt; v0 += 4) {                                               \
			float *o = out + (size_t)v0 * ldo;                                         \
			switch (nt - v0) {                                                         \
			case 1: avx2_gemm(o, ldo, w, ngroups, x + v0, 1, n, Q4); break;            \
			case 2: avx2_gemm(o, ldo, w, ngroups, x + v0, 2, n, Q4); break;            \
			case 3: avx2_gemm(o, ldo, w, ngroups, x + v0, 3, n, Q4); break;            \
			default: avx2_gemm(o, ldo, w, ngroups, x + v0, 4, n, Q4); break;           \
			}                                                                          \
		}                                                                                  \
	}
AVX2_NT(avx2_gemm_q8_0, 0)
AVX2_NT(avx2_gemm_q4_0, 1)
AVX2_NT(avx2_gemm_mxfp4, 2)

quant_gemm_fn quant_x86_gemm(int t, const char **impl)
{
	static int have = -1, vnni = 0; /* benign race: every thread computes the same values */
	if (have < 0) {
		__builtin_cpu_init();
		vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
		/* F16C through CPUID leaf 1 (ECX bit 29): clang 14 does not know "f16c" here */
		unsigned a, b, c, d;
		int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
		have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
	}
	if (!have)
		return NULL;
	if (t == QT_Q4_K || t == QT_Q6_K) { /* no AVX2 version: those CPUs keep the rows */
		if (!vnni || getenv("SHOAL_NO_VNNI"))
			return NULL;
		*impl = "avx512vnni";
		return t == QT_Q4_K ? vnni_gemm_q4_k : vnni_gemm_q6_k;
	}
	if (t != QT_Q8_0 && t != QT_Q4_0 && t != QT_MXFP4)
		return NULL;
	if (vnni && !getenv("SHOAL_NO_VNNI")) {
		*impl = "avx512vnni";
		return t == QT_Q8_0   ? vnni_gemm_q8_0
		       : t == QT_Q4_0 ? vnni_gemm_q4_0
				      : vnni_gemm_mxfp4;
	}
	*impl = "avx2";
	return t == QT_Q8_0 ? avx2_gemm_q8_0 : t == QT_Q4_0 ? avx2_gemm_q4_0 : avx2_gemm_mxfp4;
}

#else

quant_gemm_fn quant_x86_gemm(int t, const char **impl)
{
	(void)t;
	(void)impl;
	return NULL;
}

#endif
