/*
 * gemma3.c: the piece of Gemma 3's forward pass that is not a flag on the llama layer: the
 * GELU-gated FFN as llama.cpp computes it. (Its other differences are flags read by meta.c's
 * gemma3_keys and applied in model.c's one forward(): embeddings times sqrt(dim), per-head q/k
 * RMS norms, sliding-window layers with their own RoPE base (swa.c), post-attention and
 * post-FFN norms, the query scale, the optional final logit softcapping.)
 *
 * llama.cpp's graph (src/models/gemma3.cpp build_ffn with LLM_FFN_GELU, LLM_FFN_PAR) becomes
 * ggml_geglu_split, which ggml's CPU backend computes with ggml_vec_geglu_f32 (ggml-cpu/vec.h,
 * GGML_GELU_FP16): below -10 it is 0, from 10 on the input itself, in between a table indexed
 * by the input rounded to F16 that holds the tanh-form GELU rounded to F16. The same table is
 * used here, so the FFN's output agrees with llama.cpp's bit for bit up to the products.
 *
 * Invariant: the table is built once (pthread_once) and read-only afterwards.
 */
#include "infer/model/model_int.h"

#include <math.h>
#include <pthread.h>

static uint16_t gelu_tab[1 << 16];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

static void gelu_init(void)
{
	for (int i = 0; i < (1 << 16); i++) {
		float x = quant_f16_to_f32((uint16_t)i);
		float y = 0.5f * x *
			  (1.0f + tanhf(0.79788456080286535587989211986876f * x *
					(1.0f + 0.044715f * x * x)));
		gelu_tab[i] = quant_f32_to_f16(y);
	}
}

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
/* Eight at a time: F16C's conversions round to nearest even as quant_f32_to_f16 does and widen
 * exactly, so the bits are the scalar loop's; the table lookups stay scalar. The scalar loop's
 * two software conversions per element made this ~9 % of a gemma3 decode step on the main
 * thread while the pool waited. */
__attribute__((target("avx2,f16c"))) static int gelu_gate_x86(float *h, const float *up, int n)
{
	const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
	int i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 x = _mm256_loadu_ps(h + i);
		uint16_t idx[8], g16[8];
		_mm_storeu_si128((__m128i *)idx, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
		for (int k = 0; k < 8; k++)
			g16[k] = gelu_tab[idx[k]];
		__m256 g = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g16));
		g = _mm256_blendv_ps(g, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LE_OQ));
		g = _mm256_blendv_ps(g, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ));
		_mm256_storeu_ps(h + i, _mm256_mul_ps(g, _mm256_loadu_ps(up + i)));
	}
	return i;
}

static int gelu_x86(void)
{
	static int ok = -1;
	if (ok < 0) { /* F16C through CPUID leaf 1 (ECX bit 29), as attn.c */
		unsigned a, b, c, d;
		ok = __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) &&
		     (c & (1u << 29));
	}
	return ok;
}
#else
static int gelu_gate_x86(float *h, const float *up, int n)
{
	(void)h, (void)up, (void)n;
	return 0;
}
static int gelu_x86(void)
{
	return 0;
}
#endif

void gelu_gate(float *h, const float *up, int n)
{
	pthread_once(&gelu_once, gelu_init);
	int i0 = gelu_x86() && !quant_ref_forced() ? gelu_gate_x86(h, up, n) : 0;
	for (int i = i0; i < n; i++) {
		float x = h[i], g;
		if (x <= -10.0f)
			g = 0.0f;
		else if (x >= 10.0f)
			g = x;
		else
			g = quant_f16_to_f32(gelu_tab[quant_f32_to_f16(x)]);
		h[i] = g * up[i];
	}
}
