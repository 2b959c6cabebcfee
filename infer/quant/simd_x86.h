/*
 * simd_x86.h: the small AVX helpers the x86 kernel files share (quant_x86.c, quant_lowbit_x86.c,
 * the MXFP4 kernels). Internal to infer/quant/; include only inside an
 * `#if defined(__x86_64__)` block. Each helper carries the smallest target it needs, so it
 * inlines into any kernel whose target includes it (avx2,fma,...).
 */
#ifndef SHOAL_SIMD_X86_H
#define SHOAL_SIMD_X86_H

#include <immintrin.h>

/* The sum of the 8 floats of v. */
__attribute__((target("avx"))) static inline float qx_hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* The sum of the 8 int32 lanes of v. */
__attribute__((target("avx2"))) static inline int qx_hsum8i(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
	return _mm_cvtsi128_si32(s);
}

#endif
