/*
 * meta_gptoss.c: gpt-oss's hyperparameters and tensors (GGUF architecture "gpt-oss", llama.cpp's
 * LLM_ARCH_OPENAI_MOE), as llama.cpp reads them: src/models/openai-moe.cpp
 * (llama_model_openai_moe::load_arch_hparams, load_arch_tensors, the graph) and the
 * converter's conversion/gpt_oss.py.
 *
 * A gpt-oss block: RMS norm -> Q, K, V (with biases) -> NeoX RoPE with YaRN -> attention with a
 * learned sink logit per head, sliding-window (attention.sliding_window, every other layer,
 * starting with layer 0) or full -> output projection with bias -> residual ->
 * post_attention_norm -> a router with bias choosing the top k experts by logit, weighted by the
 * softmax over those k -> each expert gate/up with biases, clamped SwiGLU (alpha 1.702, limit 7:
 * build_moe_ffn's LLM_FFN_SWIGLU_OAI_MOE), down with bias -> residual. Invariant: when
 * meta_load returns 0 for such a file, every tensor below exists with its shape.
 */
#include "common/common.h"
#include "infer/model/meta.h"

#include <stdio.h>

int meta_gptoss_keys(model_meta_t *m, const gguf_t *g, char *err, size_t errlen)
{
	static const char *const req[] = {"expert_feed_forward_length", "attention.sliding_window"};
	char key[128];
	int rc;
	for (size_t i = 0; i < ARRAY_LEN(req); i++) { /* get_key without a default in llama.cpp */
		snprintf(key, sizeof key, "gpt-oss.%s", req[i]);
		if (gguf_find_key(g, key) < 0)
			return sh_fail(err, errlen, SH_EFORMAT, "missing key %s", key);
	}
	if (!m->ffn) /* feed_forward_length is optional: size the dense scratch by the experts */
		m->ffn = m->ffn_exp;
	/* the SWA layers rotate with the same base (rope_freq_base_train_swa = the base) unless
	 * rope.freq_base_swa says otherwise; period 2: layers 0, 2, 4, ... slide */
	if ((rc = meta_swa_keys(m, g, 2, m->rope_base, err, errlen)) ||
	    (rc = meta_rope_scaling_keys(m, g, err, errlen)))
		return rc;
	if (m->rope_scaling == META_SCALING_LINEAR && m->rope_factor > 0)
		m->rope_scale = m->rope_scale_swa = 1.0f / m->rope_factor;
	/* routing: LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT, no renormalisation, and
	 * expert_weights_scale is not read (0: not applied) */
	m->gating = META_GATE_SOFTMAX_WEIGHT;
	m->exp_norm = 0;
	m->exp_scale = 1.0f;
	m->exp_act = META_ACT_SWIGLU_OAI;
	m->act_alpha = 1.702f;
	m->act_limit = 7.0f;
	m->ffn_norm_post = m->has_sinks = m->has_out_bias = m->has_moe_bias = 1;
	/* create_tensor_qkv: the biases are optional (the converter writes them) */
	m->has_qkv_bias = gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
	return 0;
}

int meta_gptoss_tensors(model_meta_t *m, const gguf_t *g, int l, char *err, size_t errlen)
{
	int64_t D = m->dim, E = m->n_experts, F = m->ffn_exp, H = m->n_heads;
	static const struct {
		const char *name;
		int a, b; /* 0 D, 1 E, 2 F, 3 H; b -1: a vector */
	} need[] = {
	    {"attn_sinks.weight", 3, -1}, {"attn_output.bias", 0, -1}, {"ffn_gate_inp.bias", 1, -1},
	    {"ffn_gate_exps.bias", 2, 1}, {"ffn_up_exps.bias", 2, 1},  {"ffn_down_exps.bias", 0, 1},
	};
	int64_t sz[4] = {D, E, F, H};
	for (size_t i = 0; i < ARRAY_LEN(need); i++) {
		char tn[96];
		snprintf(tn, sizeof tn, "blk.%d.%s", l, need[i].name);
		int rc = meta_check_tensor(m, g, tn, sz[need[i].a],
					   need[i].b < 0 ? 0 : sz[need[i].b], 0, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}
