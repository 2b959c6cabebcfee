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

void gelu_gate(float *h, const float *up, int n)
{
	pthread_once(&gelu_once, gelu_init);
	for (int i = 0; i < n; i++) {
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
