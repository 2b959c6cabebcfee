/*
 * meta.c: hyperparameters from [arch].* keys and a shape check of every tensor the forward pass
 * reads. Invariant: when meta_load() returns 0, every size is positive, n_heads is a multiple of
 * n_kv_heads, and each required tensor exists with exactly the shape below and a type the engine
 * has kernels for, so the engine can index weights without further checks (deepseek2: every
 * latent-attention tensor agrees with meta.mla, and the cache width is kv_lora + qk_rope).
 */
#include "infer/model/meta.h"

#include "common/common.h"
#include "infer/quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int get_req(const gguf_t *g, const char *arch, const char *suffix, uint32_t *out, char *err,
		   size_t errlen)
{
	char key[128];
	snprintf(key, sizeof key, "%s.%s", arch, suffix);
	int rc = gguf_get_u32(g, key, out);
	if (rc == SH_ENOENT)
		return sh_fail(err, errlen, SH_EFORMAT, "missing key %s", key);
	if (rc || *out == 0 || *out > (1u << 24))
		return sh_fail(err, errlen, SH_EFORMAT, "key %s has a bad value", key);
	return 0;
}

static int get_opt_f32(const gguf_t *g, const char *arch, const char *suffix, float *out, char *err,
		       size_t errlen)
{
	char key[128];
	snprintf(key, sizeof key, "%s.%s", arch, suffix);
	int rc = gguf_get_f32(g, key, out);
	if (rc && rc != SH_ENOENT)
		return sh_fail(err, errlen, SH_EFORMAT, "key %s has a bad value", key);
	return 0;
}

int meta_swa_keys(model_meta_t *m, const gguf_t *g, int period, float base_swa, char *err,
		  size_t errlen)
{
	const char *a = m->arch_name;
	char key[128];
	uint32_t v = 0;
	int rc;
	snprintf(key, sizeof key, "%s.attention.sliding_window", a);
	if (gguf_find_key(g, key) >= 0 && (gguf_get_u32(g, key, &v) || v > (1u << 24)))
		return sh_fail(err, errlen, SH_EFORMAT, "key %s has a bad value", key);
	m->swa_window = (int)v;
	if (!v) /* llama.cpp: no window, no SWA layer */
		return 0;
	m->swa_period = period;
	snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
	int ki = gguf_find_key(g, key);
	if (ki >= 0 && gguf_kv_type(g, ki) != GGUF_ARR) { /* an array leaves the default */
		if (gguf_get_u32(g, key, &v) || v > (1u << 20))
			return sh_fail(err, errlen, SH_EFORMAT, "key %s has a bad value", key);
		m->swa_period = (int)v;
	}
	m->rope_base_swa = base_swa;
	if ((rc = get_opt_f32(g, a, "rope.freq_base_swa", &m->rope_base_swa, err, errlen)))
		return rc;
	if (!(m->rope_base_swa > 0 && m->rope_base_swa < 1e12f))
		return sh_fail(err, errlen, SH_EFORMAT, "bad rope base %g for the SWA layers",
			       (double)m->rope_base_swa);
	return 0;
}

/* Checks tensor name exists with shape (ne0, ne1) (ne1 = 0: a vector) and a supported type. */
static int check_tensor(model_meta_t *m, const gguf_t *g, const char *name, int64_t ne0,
			int64_t ne1, char *err, size_t errlen)
{
	const gguf_tensor_t *t = gguf_find_tensor(g, name);
	if (!t)
		return sh_fail(err, errlen, SH_EFORMAT, "missing tensor %s (expected [%lld, %lld])",
			       name, (long long)ne0, (long long)(ne1 ? ne1 : 1));
	/* a vector may be stored as [n, 1] (qwen2moe's ffn_gate_inp_shexp) */
	int64_t n1 = t->n_dims >= 2 ? t->ne[1] : 1;
	if (t->n_dims > 2 || t->ne[0] != ne0 || n1 != (ne1 ? ne1 : 1) || t->ne[2] != 1 ||
	    t->ne[3] != 1)
		return sh_fail(err, errlen, SH_EFORMAT,
			       "tensor %s has shape [%lld, %lld], expected [%lld, %lld]", name,
			       (long long)t->ne[0], (long long)n1, (long long)ne0,
			       (long long)(ne1 ? ne1 : 1));
	if (!quant_type_supported(t->type))
		return sh_fail(err, errlen, SH_EUNSUPP, "unsupported tensor type %s for %s",
			       quant_type_ggml_name(t->type), name);
	/* norms and biases are used as float vectors */
	if (!ne1 && t->type != QT_F32 && t->type != QT_F16 && t->type != QT_BF16)
		return sh_fail(err, errlen, SH_EUNSUPP, "unsupported tensor type %s for %s",
			       quant_type_ggml_name(t->type), name);
	m->types_used |= 1ull << t->type;
	return 0;
}

/* An optional integer key in [0, maxv] (absent: *out unchanged). */
static int get_opt_int(const gguf_t *g, const char *arch, const char *suffix, uint32_t maxv,
		       int *out, char *err, size_t errlen)
{
	char key[128];
	uint32_t v;
	snprintf(key, sizeof key, "%s.%s", arch, suffix);
	int rc = gguf_get_u32(g, key, &v);
	if (rc == SH_ENOENT)
		return 0;
	if (rc || v > maxv)
		return sh_fail(err, errlen, SH_EFORMAT, "key %s has a bad value", key);
	*out = (int)v;
	return 0;
}

/* The mixture-of-experts keys, read the way llama.cpp's llama_model::load_hparams and
 * load_tensors do: Mixtral (arch llama) is a llama file with expert_count > 0 whose experts
 * have feed_forward_length units; qwen2moe/qwen3moe take expert_feed_forward_length (default
 * feed_forward_length / expert_used_count), qwen2moe's shared expert
 * expert_shared_feed_forward_length (default feed_forward_length); deepseek2 requires
 * leading_dense_block_count, expert_feed_forward_length, expert_shared_count (its shared block
 * is that many experts wide) and expert_weights_scale, and defaults expert_weights_norm to
 * false and expert_gating_func to softmax. Renormalisation of the top-k weights: Mixtral and
 * qwen3moe yes, qwen2moe no (build_moe_ffn's norm_w). */
static int moe_keys(model_meta_t *m, const gguf_t *g, char *err, size_t errlen)
{
	const char *a = m->arch_name;
	int ds2 = !strcmp(a, "deepseek2"), glm = m->arch == META_GLM4MOE, rc;
	if (ds2 && (rc = get_opt_int(g, a, "leading_dense_block_count", 1u << 20, &m->n_dense_lead,
				     err, errlen)))
		return rc;
	/* deepseek2 with every layer dense (leading_dense_block_count = block_count) has none */
	int need = m->arch == META_QWEN2MOE || m->arch == META_QWEN3MOE ||
		   m->arch == META_QWEN35MOE || m->arch == META_GPTOSS || glm ||
		   (ds2 && m->n_dense_lead < m->n_layers);
	char key[128];
	m->gating = META_GATE_SOFTMAX;
	m->exp_scale = 1.0f;
	if ((rc = get_opt_int(g, a, "expert_count", 1u << 20, &m->n_experts, err, errlen)) ||
	    (rc =
		 get_opt_int(g, a, "expert_used_count", 1u << 20, &m->n_experts_used, err, errlen)))
		return rc;
	if (!need && (m->n_experts == 0 || ds2)) { /* a dense llama or deepseek2 */
		m->n_experts = m->n_experts_used = 0;
		return 0;
	}
	if (m->n_experts == 0)
		return sh_fail(err, errlen, SH_EFORMAT,
			       "%s model with zero experts (key %s.expert_count)", a, a);
	if (m->n_experts > META_MAX_EXPERTS)
		return sh_fail(err, errlen, SH_EFORMAT, "%d experts (at most %d)", m->n_experts,
			       META_MAX_EXPERTS);
	if (m->n_experts_used <= 0 || m->n_experts_used > m->n_experts)
		return sh_fail(err, errlen, SH_EFORMAT,
			       "expert_used_count %d is not in 1..expert_count %d",
			       m->n_experts_used, m->n_experts);
	m->ffn_exp = m->arch == META_LLAMA ? m->ffn : m->ffn / m->n_experts_used;
	if (m->arch != META_LLAMA && (rc = get_opt_int(g, a, "expert_feed_forward_length", 1u << 24,
						       &m->ffn_exp, err, errlen)))
		return rc;
	if (m->arch == META_QWEN2MOE || m->arch == META_QWEN35MOE) {
		m->ffn_shexp = m->ffn, m->shexp_gated = 1;
		if ((rc = get_opt_int(g, a, "expert_shared_feed_forward_length", 1u << 24,
				      &m->ffn_shexp, err, errlen)))
			return rc;
	}
	if (m->arch == META_LLAMA || m->arch == META_QWEN3MOE || m->arch == META_QWEN35MOE)
		m->exp_norm = 1;
	if (m->arch == META_QWEN35MOE && m->ffn_shexp <= 0) /* its shared block is required */
		return sh_fail(err, errlen, SH_EFORMAT,
			       "qwen35moe.expert_shared_feed_forward_length is missing or zero");
	if (ds2 || glm) {
		/* deepseek2 as llama_model_deepseek2 reads them; glm4moe as
		 * llama_model_glm4_moe::load_arch_hparams: the same keys, these required, the
		 * scale optional (0 or absent: none) and sigmoid gating by default */
		static const char *const req_ds2[] = {
		    "leading_dense_block_count", "expert_feed_forward_length",
		    "expert_shared_count", "expert_weights_scale"};
		static const char *const req_glm[] = {"expert_feed_forward_length", "expert_count",
						      "expert_used_count", "expert_shared_count"};
		for (size_t i = 0; i < 4; i++) {
			snprintf(key, sizeof key, "%s.%s", a, glm ? req_glm[i] : req_ds2[i]);
			if (gguf_find_key(g, key) < 0)
				return sh_fail(err, errlen, SH_EFORMAT, "missing key %s", key);
		}
		if (glm)
			m->gating = META_GATE_SIGMOID, m->exp_scale = 0;
		int n_shared = 0, gating = 0;
		if ((rc = get_opt_int(g, a, "leading_dense_block_count", 1u << 20, &m->n_dense_lead,
				      err, errlen)) ||
		    (rc = get_opt_int(g, a, "expert_shared_count", 64, &n_shared, err, errlen)) ||
		    (rc = get_opt_int(g, a, "expert_gating_func", 2, &gating, err, errlen)) ||
		    (rc = get_opt_f32(g, a, "expert_weights_scale", &m->exp_scale, err, errlen)))
			return rc;
		if (gating)
			m->gating = gating;
		/* DeepSeek-V3's group-limited routing (llama.cpp: expert_group_count / _used_count)
		 */
		if ((rc = get_opt_int(g, a, "expert_group_count", 1u << 10, &m->n_groups, err,
				      errlen)) ||
		    (rc = get_opt_int(g, a, "expert_group_used_count", 1u << 10, &m->groups_used,
				      err, errlen)))
			return rc;
		if (m->n_groups > 1 &&
		    (m->n_experts % m->n_groups || m->n_experts / m->n_groups < 2 ||
		     m->groups_used < 1 || m->groups_used > m->n_groups ||
		     m->n_experts_used > m->groups_used * (m->n_experts / m->n_groups)))
			return sh_fail(err, errlen, SH_EFORMAT,
				       "expert groups %d (used %d) do not fit %d experts, %d used",
				       m->n_groups, m->groups_used, m->n_experts,
				       m->n_experts_used);
		if (m->n_groups <= 1)
			m->n_groups = m->groups_used = 0;
		snprintf(key, sizeof key, "%s.expert_weights_norm", a);
		rc = gguf_get_bool(g, key, &m->exp_norm);
		if (rc && rc != SH_ENOENT)
			return sh_fail(err, errlen, SH_EFORMAT, "key %s has a bad value", key);
		if (rc == SH_ENOENT)
			m->exp_norm = 0;
		if (glm && m->exp_scale == 0) /* build_moe_ffn scales only by a nonzero value */
			m->exp_scale = 1.0f;
		if (!(m->exp_scale > 0 && m->exp_scale < 1e6f))
			return sh_fail(err, errlen, SH_EFORMAT, "bad expert_weights_scale");
		m->ffn_shexp = n_shared * m->ffn_exp;
		if (m->n_dense_lead > m->n_layers)
			return sh_fail(err, errlen, SH_EFORMAT,
				       "leading_dense_block_count %d exceeds %d layers",
				       m->n_dense_lead, m->n_layers);
	}
	if (m->ffn_exp <= 0)
		return sh_fail(err, errlen, SH_EFORMAT, "expert feed-forward length is zero");
	return 0;
}

/* Checks a 3-D tensor of shape (ne0, ne1, ne2) with a supported type and adds its bytes. */
static int check_experts(model_meta_t *m, const gguf_t *g, const char *name, int64_t ne0,
			 int64_t ne1, int64_t ne2, char *err, size_t errlen)
{
	const gguf_tensor_t *t = gguf_find_tensor(g, name);
	if (!t)
		return sh_fail(err, errlen, SH_EFORMAT,
			       "missing tensor %s (expected [%lld, %lld, %lld])", name,
			       (long long)ne0, (long long)ne1, (long long)ne2);
	if (t->n_dims > 3 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1)
		return sh_fail(
		    err, errlen, SH_EFORMAT,
		    "tensor %s has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]", name,
		    (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)ne0,
		    (long long)ne1, (long long)ne2);
	if (!quant_type_supported(t->type))
		return sh_fail(err, errlen, SH_EUNSUPP, "unsupported tensor type %s for %s",
			       quant_type_ggml_name(t->type), name);
	m->types_used |= 1ull << t->type;
	m->expert_bytes += t->nbytes;
	return 0;
}

/* The tensors of MoE layer l: router [D, E] (F32 in llama.cpp's files; any float type here),
 * the three 3-D expert tensors in ggml order (gate/up {D, F, E}, down {F, D, E}), the shared
 * block when there is one, and deepseek2's optional selection bias exp_probs_b [E]. */
static int moe_tensors(model_meta_t *m, const gguf_t *g, int l, char *err, size_t errlen)
{
	int64_t D = m->dim, E = m->n_experts, F = m->ffn_exp, S = m->ffn_shexp;
	char tn[96];
	int rc;
#define TN(s) (snprintf(tn, sizeof tn, "blk.%d.%s", l, s), tn)
	if ((rc = check_tensor(m, g, TN("ffn_gate_inp.weight"), D, E, err, errlen)) ||
	    (rc = check_experts(m, g, TN("ffn_gate_exps.weight"), D, F, E, err, errlen)) ||
	    (rc = check_experts(m, g, TN("ffn_up_exps.weight"), D, F, E, err, errlen)) ||
	    (rc = check_experts(m, g, TN("ffn_down_exps.weight"), F, D, E, err, errlen)))
		return rc;
	const gguf_tensor_t *r = gguf_find_tensor(g, TN("ffn_gate_inp.weight"));
	if (r->type != QT_F32 && r->type != QT_F16 && r->type != QT_BF16)
		return sh_fail(err, errlen, SH_EUNSUPP, "router %s is %s, expected F32", tn,
			       quant_type_ggml_name(r->type));
	if (S && ((rc = check_tensor(m, g, TN("ffn_gate_shexp.weight"), D, S, err, errlen)) ||
		  (rc = check_tensor(m, g, TN("ffn_up_shexp.weight"), D, S, err, errlen)) ||
		  (rc = check_tensor(m, g, TN("ffn_down_shexp.weight"), S, D, err, errlen))))
		return rc;
	/* stored {n_embd} or {n_embd, 1}: both are one vector */
	if (m->shexp_gated &&
	    (rc = check_tensor(m, g, TN("ffn_gate_inp_shexp.weight"), D, 0, err, errlen)))
		return rc;
	if (gguf_find_tensor(g, TN("exp_probs_b.bias"))) {
		if ((rc = check_tensor(m, g, tn, E, 0, err, errlen)))
			return rc;
		m->has_exp_bias = 1;
	}
#undef TN
	return 0;
}

/* Checks a 3-D tensor name (ne0, ne1, ne2): deepseek2's per-head attn_k_b / attn_v_b. */
static int check_tensor3(model_meta_t *m, const gguf_t *g, const char *name, int64_t ne0,
			 int64_t ne1, int64_t ne2, char *err, size_t errlen)
{
	const gguf_tensor_t *t = gguf_find_tensor(g, name);
	if (!t)
		return sh_fail(err, errlen, SH_EFORMAT, "missing tensor %s", name);
	if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1)
		return sh_fail(
		    err, errlen, SH_EFORMAT,
		    "tensor %s has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]", name,
		    (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)ne0,
		    (long long)ne1, (long long)ne2);
	if (!quant_type_supported(t->type))
		return sh_fail(err, errlen, SH_EUNSUPP, "unsupported tensor type %s for %s",
			       quant_type_ggml_name(t->type), name);
	m->types_used |= 1ull << t->type;
	return 0;
}

int meta_check_tensor(model_meta_t *m, const gguf_t *g, const char *name, int64_t ne0, int64_t ne1,
		      int64_t ne2, char *err, size_t errlen)
{
	if (ne2) {
		int rc = check_tensor3(m, g, name, ne0, ne1, ne2, err, errlen);
		return rc ? rc : 0;
	}
	return check_tensor(m, g, name, ne0, ne1, err, errlen);
}

/* An optional u32 key (0 allowed): 1 when present, 0 when absent, or an error. */
static int get_opt_u32(const gguf_t *g, const char *arch, const char *suffix, uint32_t *out,
		       char *err, size_t errlen)
{
	char key[128];
	snprintf(key, sizeof key, "%s.%s", arch, suffix);
	int rc = gguf_get_u32(g, key, out);
	if (rc == SH_ENOENT)
		return 0;
	if (rc || *out > (1u << 24))
		return sh_fail(err, errlen, SH_EFORMAT, "key %s has a bad value", key);
	return 1;
}

int meta_rope_scaling_keys(model_meta_t *m, const gguf_t *g, char *err, size_t errlen)
{
	const char *a = m->arch_name;
	char key[128];
	uint32_t v = 0;
	int rc;
	/* rope.scaling.*: llama.cpp's default type is linear, a missing factor means 1 */
	m->rope_scaling = META_SCALING_LINEAR;
	snprintf(key, sizeof key, "%s.rope.scaling.type", a);
	const char *s;
	size_t n;
	if (!gguf_get_str(g, key, &s, &n)) {
		if (n == 4 && !memcmp(s, "none", 4))
			m->rope_scaling = META_SCALING_NONE;
		else if (n == 4 && !memcmp(s, "yarn", 4))
			m->rope_scaling = META_SCALING_YARN;
		else if (!(n == 6 && !memcmp(s, "linear", 6)))
			return sh_fail(
			    err, errlen, SH_EUNSUPP,
			    "%s: unsupported rope scaling (supported: none, linear, yarn)", key);
	}
	m->rope_factor = 0;
	m->yarn_log_mul = 0;
	if ((rc = get_opt_f32(g, a, "rope.scaling.factor", &m->rope_factor, err, errlen)) ||
	    (rc = get_opt_f32(g, a, "rope.scaling.yarn_log_multiplier", &m->yarn_log_mul, err,
			      errlen)))
		return rc;
	if (m->rope_factor == 0 && /* llama.cpp's fallback: the old key name */
	    (rc = get_opt_f32(g, a, "rope.scale_linear", &m->rope_factor, err, errlen)))
		return rc;
	if (!(m->rope_factor == 0 || (m->rope_factor >= 1e-3f && m->rope_factor <= 1e6f)) ||
	    !(m->yarn_log_mul >= -100 && m->yarn_log_mul <= 100))
		return sh_fail(err, errlen, SH_EFORMAT,
			       "bad rope scaling factor or yarn multiplier");
	if ((rc = get_opt_u32(g, a, "rope.scaling.original_context_length", &v, err, errlen)) < 0)
		return rc;
	m->rope_orig_ctx = rc && v ? (int)v : m->n_ctx;
	return 0;
}

/* deepseek2's MLA keys (llama_model_deepseek2::load_arch_hparams): called after head_dim (the
 * file's key_length, or dim / n_heads) and rope_dim are read. Sets head_dim to the per-head
 * query/key length the attention uses and n_kv_heads to 1 (one shared latent per token). */
static int mla_keys(model_meta_t *m, const gguf_t *g, char *err, size_t errlen)
{
	const char *a = m->arch_name;
	meta_mla_t *x = &m->mla;
	uint32_t v = 0, kl = 0, vl = 0;
	char key[128];
	int rc, has_kl, has_vl;
	m->is_mla = 1;
	if ((rc = get_req(g, a, "attention.kv_lora_rank", &v, err, errlen)))
		return rc;
	x->kv_lora = (int)v;
	if ((rc = get_opt_u32(g, a, "attention.q_lora_rank", &v, err, errlen)) < 0)
		return rc;
	x->q_lora = rc ? (int)v : 0; /* absent or 0: Lite, a plain attn_q */
	snprintf(key, sizeof key, "%s.rope.dimension_count", a);
	if (gguf_find_key(g, key) < 0)
		return sh_fail(err, errlen, SH_EFORMAT, "missing key %s", key);
	if ((has_kl = get_opt_u32(g, a, "attention.key_length_mla", &kl, err, errlen)) < 0 ||
	    (has_vl = get_opt_u32(g, a, "attention.value_length_mla", &vl, err, errlen)) < 0)
		return has_kl < 0 ? has_kl : has_vl;
	/* llama.cpp's hparams.is_mla(): both _mla lengths nonzero = the split attn_k_b/attn_v_b
	 * form, where key_length/value_length describe the latent (kv_lora + rope, kv_lora) */
	x->split_kvb = has_kl && has_vl && kl && vl;
	int dk = m->head_dim, dv;
	if (x->split_kvb) {
		if (dk != x->kv_lora + m->rope_dim)
			return sh_fail(err, errlen, SH_EFORMAT,
				       "%s.attention.key_length %d is not kv_lora_rank %d + rope "
				       "dimensions %d",
				       a, dk, x->kv_lora, m->rope_dim);
		dk = (int)kl, dv = (int)vl;
	} else if ((rc = get_opt_u32(g, a, "attention.value_length", &v, err, errlen)) < 0) {
		return rc;
	} else if (rc) {
		dv = (int)v;
	} else {
		dv = m->dim / m->n_heads;
	}
	if (dv <= 0)
		return sh_fail(err, errlen, SH_EFORMAT, "deepseek2: bad value length %d", dv);
	if (m->rope_dim <= 0 || m->rope_dim % 2 || m->rope_dim >= dk)
		return sh_fail(err, errlen, SH_EFORMAT,
			       "rope dimension %d does not fit key length %d (MLA needs both a "
			       "rotated and a plain part)",
			       m->rope_dim, dk);
	x->qk_rope = m->rope_dim;
	x->qk_nope = dk - m->rope_dim;
	x->v_head = dv;
	/* the latent compresses every head's key and value; a wider one is a broken file */
	if ((int64_t)x->kv_lora > (int64_t)m->n_heads * (x->qk_nope + dv))
		return sh_fail(
		    err, errlen, SH_EFORMAT,
		    "kv_lora_rank %d is larger than the head data it compresses (%d heads "
		    "x (%d + %d))",
		    x->kv_lora, m->n_heads, x->qk_nope, dv);
	m->head_dim = dk;
	m->n_kv_heads = 1;
	if ((rc = get_opt_u32(g, a, "leading_dense_block_count", &v, err, errlen)) < 0)
		return rc;
	x->dense_lead = rc ? (int)v : 0;
	/* layers from dense_lead on route through experts (moe_keys, moe.c) */

	return meta_rope_scaling_keys(m, g, err, errlen);
}

/* Layer l's MLA tensors, shapes as llama_model_deepseek2::load_arch_tensors creates them. */
static int mla_tensors(model_meta_t *m, const gguf_t *g, int l, char *err, size_t errlen)
{
	const meta_mla_t *x = &m->mla;
	int64_t D = m->dim, H = m->n_heads, dk = m->head_dim;
	char tn[96];
	int rc;
#define CHECK(nm, a, b)                                                                            \
	(snprintf(tn, sizeof tn, "blk.%d.%s", l, nm), check_tensor(m, g, tn, a, b, err, errlen))
	if (x->q_lora) {
		if ((rc = CHECK("attn_q_a.weight", D, x->q_lora)) ||
		    (rc = CHECK("attn_q_a_norm.weight", x->q_lora, 0)) ||
		    (rc = CHECK("attn_q_b.weight", x->q_lora, H * dk)))
			return rc;
	} else if ((rc = CHECK("attn_q.weight", D, H * dk))) {
		return rc;
	}
	if ((rc = CHECK("attn_kv_a_mqa.weight", D, x->kv_lora + x->qk_rope)) ||
	    (rc = CHECK("attn_kv_a_norm.weight", x->kv_lora, 0)) ||
	    (rc = CHECK("attn_output.weight", H * x->v_head, D)))
		return rc;
	if (!x->split_kvb)
		return CHECK("attn_kv_b.weight", x->kv_lora, H * (x->qk_nope + x->v_head));
#undef CHECK
	snprintf(tn, sizeof tn, "blk.%d.attn_k_b.weight", l);
	if ((rc = check_tensor3(m, g, tn, x->qk_nope, x->kv_lora, H, err, errlen)))
		return rc;
	snprintf(tn, sizeof tn, "blk.%d.attn_v_b.weight", l);
	return check_tensor3(m, g, tn, x->kv_lora, x->v_head, H, err, errlen);
}

/* ---- qwen35: Gated DeltaNet layers ---------------------------------------------------------- */

/* The layer count and kinds (llama_model_qwen35::load_arch_hparams): block_count includes the
 * nextn_predict_layers MTP blocks appended after the main stack (loaded by llama.cpp only for
 * speculative drafting; not read here), so the model has block_count - nextn layers. A layer is
 * recurrent per attention.recurrent_layers when the file has that array, else unless
 * (l + 1) % full_attention_interval == 0 (default 4). */
static int dn_layers(model_meta_t *m, const gguf_t *g, char *err, size_t errlen)
{
	const char *a = m->arch_name;
	meta_dn_t *d = &m->dn;
	int all = m->n_layers, rc, interval = 4;
	char key[128];
	if ((rc = get_opt_int(g, a, "nextn_predict_layers", 1u << 20, &d->n_nextn, err, errlen)) ||
	    (rc = get_opt_int(g, a, "full_attention_interval", 1u << 20, &interval, err, errlen)))
		return rc;
	if (all > META_MAX_LAYERS || d->n_nextn >= all || interval < 1)
		return sh_fail(err, errlen, SH_EFORMAT,
			       "%s: %d blocks with %d MTP layers and a full-attention interval of "
			       "%d do not make a model (at most %d layers)",
			       a, all, d->n_nextn, interval, META_MAX_LAYERS);
	m->n_layers = all - d->n_nextn;
	snprintf(key, sizeof key, "%s.attention.recurrent_layers", a);
	int k = gguf_find_key(g, key);
	if (k >= 0) {
		int t = gguf_arr_type(g, k);
		if (t < 0 || t == GGUF_STR || t == GGUF_ARR || gguf_arr_n(g, k) != (uint64_t)all)
			return sh_fail(err, errlen, SH_EFORMAT,
				       "key %s is not an array of %d flags", key, all);
	}
	d->n_recurrent = 0;
	for (int l = 0; l < m->n_layers; l++) {
		int64_t f = (l + 1) % interval != 0;
		if (k >= 0 && gguf_arr_i64(g, k, (uint64_t)l, &f))
			return sh_fail(err, errlen, SH_EFORMAT, "key %s has a bad value", key);
		d->recurrent[l] = f != 0;
		d->n_recurrent += f != 0;
	}
	return 0;
}

/* The DeltaNet sizes and the M-RoPE sections (after head_dim and rope_dim are read). */
static int dn_keys(model_meta_t *m, const gguf_t *g, char *err, size_t errlen)
{
	const char *a = m->arch_name;
	meta_dn_t *d = &m->dn;
	uint32_t v[5];
	static const char *const req[] = {"ssm.conv_kernel", "ssm.state_size", "ssm.group_count",
					  "ssm.time_step_rank", "ssm.inner_size"};
	for (int i = 0; i < 5; i++) {
		int rc = get_req(g, a, req[i], &v[i], err, errlen);
		if (rc)
			return rc;
	}
	d->d_conv = (int)v[0], d->d_state = (int)v[1], d->n_k_heads = (int)v[2];
	d->n_v_heads = (int)v[3];
	/* llama.cpp sizes the tensors by state_size and the graph's value heads by inner_size /
	 * time_step_rank: a file where they differ cannot be computed either way */
	if (d->d_conv > 64 || d->d_state > 1024 || d->n_v_heads % d->n_k_heads ||
	    (uint64_t)v[4] != (uint64_t)d->n_v_heads * (uint64_t)d->d_state)
		return sh_fail(
		    err, errlen, SH_EFORMAT,
		    "%s.ssm: conv kernel %d, state %d, %d key heads, %d value heads and "
		    "inner size %u do not fit (value heads a multiple of key heads, inner "
		    "size = value heads x state)",
		    a, d->d_conv, d->d_state, d->n_k_heads, d->n_v_heads, v[4]);
	char key[128];
	snprintf(key, sizeof key, "%s.attention.value_length", a);
	uint32_t vl;
	if (!gguf_get_u32(g, key, &vl) && vl != (uint32_t)m->head_dim)
		return sh_fail(err, errlen, SH_EFORMAT, "%s %u differs from key_length %d", key, vl,
			       m->head_dim);
	snprintf(key, sizeof key, "%s.rope.dimension_sections", a);
	int k = gguf_find_key(g, key), sum = 0;
	if (k < 0)
		return sh_fail(err, errlen, SH_EFORMAT, "missing key %s", key);
	int t = gguf_arr_type(g, k);
	if (t < 0 || t == GGUF_STR || t == GGUF_ARR || gguf_arr_n(g, k) < 1 || gguf_arr_n(g, k) > 4)
		return sh_fail(err, errlen, SH_EFORMAT, "key %s is not an array of 1 to 4 integers",
			       key);
	for (uint64_t i = 0; i < gguf_arr_n(g, k); i++) {
		int64_t x;
		if (gguf_arr_i64(g, k, i, &x) || x < 0 || x > 4096)
			return sh_fail(err, errlen, SH_EFORMAT, "key %s has a bad value", key);
		d->sections[i] = (int)x;
		sum += (int)x;
	}
	/* ggml's rope: at least one of the first three sections, all of them within a head */
	if (d->sections[0] + d->sections[1] + d->sections[2] == 0 || sum > m->head_dim)
		return sh_fail(err, errlen, SH_EFORMAT, "key %s: sections sum to %d (head size %d)",
			       key, sum, m->head_dim);
	return 0;
}

uint64_t meta_dn_state_bytes(const model_meta_t *m, int n_k)
{
	const meta_dn_t *d = &m->dn;
	if (!m->is_hybrid || !d->n_k_heads)
		return 0;
	uint64_t nv = (uint64_t)n_k * (uint64_t)(d->n_v_heads / d->n_k_heads),
		 ds = (uint64_t)d->d_state;
	uint64_t ch = 2 * (uint64_t)n_k * ds + nv * ds;
	return 4 * ((uint64_t)(d->d_conv - 1) * ch + nv * ds * ds);
}

/* Layer l's token mixer and norms, shapes as llama_model_qwen35::load_arch_tensors creates them
 * (ggml order {ne0, ne1}): a DeltaNet layer's fused q|k|v projection, its output gate z, the
 * depthwise conv kernel, per value head dt bias, A (-exp(A_log), the converter's transform),
 * beta and alpha rows, the gated norm and the output projection; a full-attention layer's
 * query rows carry [query | gate] per head. */
static int dn_tensors(model_meta_t *m, const gguf_t *g, int l, char *err, size_t errlen)
{
	const meta_dn_t *d = &m->dn;
	int64_t D = m->dim, QD = (int64_t)m->n_heads * m->head_dim;
	int64_t KD = (int64_t)m->n_kv_heads * m->head_dim, hd = m->head_dim;
	int64_t kd = (int64_t)d->n_k_heads * d->d_state, vd = (int64_t)d->n_v_heads * d->d_state;
	int64_t nv = d->n_v_heads;
	char tn[96];
	int rc;
#define CHECK(nm, a, b)                                                                            \
	(snprintf(tn, sizeof tn, "blk.%d.%s", l, nm), check_tensor(m, g, tn, a, b, err, errlen))
	if ((rc = CHECK("attn_norm.weight", D, 0)) ||
	    (rc = CHECK("post_attention_norm.weight", D, 0)))
		return rc;
	if (!d->recurrent[l]) {
		if ((rc = CHECK("attn_q.weight", D, 2 * QD)) ||
		    (rc = CHECK("attn_k.weight", D, KD)) || (rc = CHECK("attn_v.weight", D, KD)) ||
		    (rc = CHECK("attn_output.weight", QD, D)) ||
		    (rc = CHECK("attn_q_norm.weight", hd, 0)) ||
		    (rc = CHECK("attn_k_norm.weight", hd, 0)))
			return rc;
		return 0;
	}
	if ((rc = CHECK("attn_qkv.weight", D, 2 * kd + vd)) ||
	    (rc = CHECK("attn_gate.weight", D, vd)) ||
	    (rc = CHECK("ssm_conv1d.weight", d->d_conv, 2 * kd + vd)) ||
	    (rc = CHECK("ssm_dt.bias", nv, 0)) || (rc = CHECK("ssm_a", nv, 0)) ||
	    (rc = CHECK("ssm_beta.weight", D, nv)) || (rc = CHECK("ssm_alpha.weight", D, nv)) ||
	    (rc = CHECK("ssm_norm.weight", d->d_state, 0)) || (rc = CHECK("ssm_out.weight", vd, D)))
		return rc;
#undef CHECK
	return 0;
}

/* value_length, when present, must equal the head size: V rows are head_dim long here. */
static int check_value_length(const model_meta_t *m, const gguf_t *g, char *err, size_t errlen)
{
	uint32_t v;
	int rc = get_opt_u32(g, m->arch_name, "attention.value_length", &v, err, errlen);
	if (rc < 0)
		return rc;
	if (rc && (int)v != m->head_dim)
		return sh_fail(err, errlen, SH_EUNSUPP,
			       "%s.attention.value_length %u differs from key_length %d",
			       m->arch_name, v, m->head_dim);
	return 0;
}

/* Gemma 3, as llama_model_gemma3::load_arch_hparams reads it (src/models/gemma3.cpp): the
 * sliding window (default period 6; the local layers rope with rope.freq_base_swa, default
 * 10000, unscaled), the global layers' RoPE scaling (meta_rope_scaling_keys; llama.cpp's default
 * linear: a factor f multiplies every angle by 1/f; none: unscaled; YaRN refused),
 * final_logit_softcapping, and the query scale 1/sqrt(dim / heads) for the 62-layer 27B, else
 * 1/sqrt(head_dim). The norms are stored with Gemma's + 1 already added (convert_hf_to_gguf.py
 * Gemma3Model.norm_shift), so they are plain RMS norms here. */
static int gemma3_keys(model_meta_t *m, const gguf_t *g, char *err, size_t errlen)
{
	int rc;
	if ((rc = meta_swa_keys(m, g, 6, 10000.0f, err, errlen)) ||
	    (rc = check_value_length(m, g, err, errlen)) ||
	    (rc = meta_rope_scaling_keys(m, g, err, errlen)) ||
	    (rc = get_opt_f32(g, m->arch_name, "final_logit_softcapping", &m->logit_softcap, err,
			      errlen)))
		return rc;
	if (m->rope_scaling == META_SCALING_YARN)
		return sh_fail(err, errlen, SH_EUNSUPP,
			       "%s.rope.scaling.type: unsupported rope scaling for gemma3 (none, "
			       "linear)",
			       m->arch_name);
	if (!(m->logit_softcap >= 0 && m->logit_softcap < 1e6f))
		return sh_fail(err, errlen, SH_EFORMAT, "bad final logit softcapping");
	if (m->rope_scaling == META_SCALING_LINEAR && m->rope_factor > 0)
		m->rope_scale = 1.0f / m->rope_factor;
	m->attn_scale =
	    1.0f / sqrtf((float)(m->n_layers == 62 ? m->dim / m->n_heads : m->head_dim));
	m->attn_q_prescaled = 1; /* ggml_scale(Qcur, f_attention_scale), then kq_scale 1 */
	m->embd_scale = sqrtf((float)m->dim);
	m->has_post_norm = 1;
	m->ffn_gelu = 1;
	return 0;
}

/* GLM-4.x MoE, as llama_model_glm4_moe::load_arch_hparams / load_arch_tensors read it
 * (src/models/glm4-moe.cpp): block_count includes nextn_predict_layers NextN/MTP layers at the
 * end, which are skipped; q/k/v biases and q/k norms are used when the file has them (GLM-4.5
 * has biases, the 355B also the norms); the FFN's input norm is post_attention_norm; rotary on
 * rope.dimension_count dims (partial). The MoE keys: moe_keys. Multimodal RoPE sections (the
 * vision variants) are refused. */
static int glm4moe_keys(model_meta_t *m, const gguf_t *g, char *err, size_t errlen)
{
	const char *a = m->arch_name;
	char key[128];
	int rc;
	if ((rc = get_opt_int(g, a, "nextn_predict_layers", 1u << 20, &m->n_nextn, err, errlen)) ||
	    (rc = check_value_length(m, g, err, errlen)))
		return rc;
	if (m->n_nextn >= m->n_layers)
		return sh_fail(err, errlen, SH_EFORMAT,
			       "%s.nextn_predict_layers %d leaves none of %d layers", a, m->n_nextn,
			       m->n_layers);
	m->n_layers -= m->n_nextn;
	snprintf(key, sizeof key, "%s.rope.dimension_sections", a);
	int ki = gguf_find_key(g, key);
	int64_t s0 = 0, s1 = 0;
	if (ki >= 0 && gguf_arr_n(g, ki) >= 2 && !gguf_arr_i64(g, ki, 0, &s0) &&
	    !gguf_arr_i64(g, ki, 1, &s1) && s0 > 0 && s1 > 0)
		return sh_fail(err, errlen, SH_EUNSUPP,
			       "%s: multimodal RoPE sections are not supported (text models only)",
			       key);
	m->has_qkv_bias = gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
	m->has_qk_norm = gguf_find_tensor(g, "blk.0.attn_q_norm.weight") != NULL;
	m->ffn_norm_post = 1;
	return 0;
}

int meta_load(model_meta_t *m, const gguf_t *g, char *err, size_t errlen)
{
	memset(m, 0, sizeof *m);
	const char *s;
	size_t n;
	if (gguf_get_str(g, "general.architecture", &s, &n))
		return sh_fail(err, errlen, SH_EFORMAT, "missing key general.architecture");
	if (n == 5 && !memcmp(s, "llama", 5))
		m->arch = META_LLAMA, m->rope_style = META_ROPE_ADJACENT;
	else if (n == 5 && !memcmp(s, "qwen2", 5))
		m->arch = META_QWEN2, m->rope_style = META_ROPE_NEOX, m->has_qkv_bias = 1;
	else if (n == 5 && !memcmp(s, "qwen3", 5))
		m->arch = META_QWEN3, m->rope_style = META_ROPE_NEOX, m->has_qk_norm = 1;
	else if (n == 8 && !memcmp(s, "qwen2moe", 8))
		m->arch = META_QWEN2MOE, m->rope_style = META_ROPE_NEOX, m->has_qkv_bias = 1;
	else if (n == 8 && !memcmp(s, "qwen3moe", 8))
		m->arch = META_QWEN3MOE, m->rope_style = META_ROPE_NEOX, m->has_qk_norm = 1;
	else if (n == 9 && !memcmp(s, "deepseek2", 9))
		m->arch = META_DEEPSEEK2, m->rope_style = META_ROPE_ADJACENT;
	else if ((n == 6 && !memcmp(s, "qwen35", 6)) || (n == 9 && !memcmp(s, "qwen35moe", 9)))
		m->arch = n == 6 ? META_QWEN35 : META_QWEN35MOE, m->rope_style = META_ROPE_NEOX,
		m->has_qk_norm = 1, m->is_hybrid = 1;
	else if (n == 6 && !memcmp(s, "gemma3", 6))
		m->arch = META_GEMMA3, m->rope_style = META_ROPE_NEOX, m->has_qk_norm = 1;
	else if (n == 7 && !memcmp(s, "glm4moe", 7))
		m->arch = META_GLM4MOE, m->rope_style = META_ROPE_NEOX;
	else if (n == 7 && !memcmp(s, "gpt-oss", 7))
		m->arch = META_GPTOSS, m->rope_style = META_ROPE_NEOX;
	else {
		/* print the name safely: it comes from the file */
		char a[40];
		size_t k = 0;
		for (size_t i = 0; i < n && k + 1 < sizeof a; i++)
			a[k++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
		a[k] = 0;
		return sh_fail(err, errlen, SH_EUNSUPP,
			       "unsupported architecture '%s' (supported: %s)", a, META_ARCHS);
	}
	memcpy(m->arch_name, s, n);
	m->arch_name[n] = 0;
	if (!gguf_get_str(g, "general.name", &s, &n)) {
		n = MIN(n, sizeof m->name - 1);
		memcpy(m->name, s, n);
		m->name[n] = 0;
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)m->name[i] < 0x20)
				m->name[i] = ' ';
	}

	const char *a = m->arch_name;
	uint32_t v;
	int rc;
	if ((rc = get_req(g, a, "block_count", &v, err, errlen)))
		return rc;
	m->n_layers = (int)v;
	if (m->is_hybrid && (rc = dn_layers(m, g, err, errlen)))
		return rc;
	if ((rc = get_req(g, a, "embedding_length", &v, err, errlen)))
		return rc;
	m->dim = (int)v;
	v = 0; /* qwen35moe, gpt-oss: optional (llama.cpp only derives defaults from it) */
	char ffkey[64];
	snprintf(ffkey, sizeof ffkey, "%s.feed_forward_length", a);
	if (((m->arch != META_QWEN35MOE && m->arch != META_GPTOSS) ||
	     gguf_find_key(g, ffkey) >= 0) &&
	    (rc = get_req(g, a, "feed_forward_length", &v, err, errlen)))
		return rc;
	/* no tensor bounds it in a model whose every layer routes to experts, and the scratch is
	 * sized by it: a hostile value must not become gigabytes (real models stay under 60k) */
	if (v > (1u << 18))
		return sh_fail(err, errlen, SH_EFORMAT,
			       "%s.feed_forward_length %u is beyond any model (at most %u)", a, v,
			       1u << 18);
	m->ffn = (int)v;
	if ((rc = get_req(g, a, "attention.head_count", &v, err, errlen)))
		return rc;
	m->n_heads = (int)v;
	char key[128];
	snprintf(key, sizeof key, "%s.attention.head_count_kv", a);
	if (gguf_find_key(g, key) >= 0) {
		if ((rc = get_req(g, a, "attention.head_count_kv", &v, err, errlen)))
			return rc;
		m->n_kv_heads = (int)v;
	} else {
		m->n_kv_heads = m->n_heads;
	}
	if (m->n_heads % m->n_kv_heads)
		return sh_fail(err, errlen, SH_EFORMAT, "%d heads is not a multiple of %d KV heads",
			       m->n_heads, m->n_kv_heads);
	snprintf(key, sizeof key, "%s.attention.key_length", a);
	if (gguf_find_key(g, key) >= 0) {
		if ((rc = get_req(g, a, "attention.key_length", &v, err, errlen)))
			return rc;
		m->head_dim = (int)v;
	} else if (m->has_qk_norm && !m->is_hybrid) { /* qwen3's head size is its own key */
		return sh_fail(err, errlen, SH_EFORMAT, "missing key %s", key);
	} else {
		if (m->dim % m->n_heads)
			return sh_fail(err, errlen, SH_EFORMAT,
				       "dim %d is not a multiple of %d heads", m->dim, m->n_heads);
		m->head_dim = m->dim / m->n_heads;
	}
	m->n_ctx = 2048;
	snprintf(key, sizeof key, "%s.context_length", a);
	if (gguf_find_key(g, key) >= 0) {
		if ((rc = get_req(g, a, "context_length", &v, err, errlen)))
			return rc;
		m->n_ctx = (int)v;
	}
	m->rms_eps = 1e-5f;
	m->rope_base = 10000.0f;
	if ((rc =
		 get_opt_f32(g, a, "attention.layer_norm_rms_epsilon", &m->rms_eps, err, errlen)) ||
	    (rc = get_opt_f32(g, a, "rope.freq_base", &m->rope_base, err, errlen)))
		return rc;
	if (!(m->rms_eps > 0 && m->rms_eps < 1) || !(m->rope_base > 0 && m->rope_base < 1e12f))
		return sh_fail(err, errlen, SH_EFORMAT, "bad rms epsilon or rope base");
	m->rope_scale = m->rope_scale_swa = 1.0f;
	m->rope_base_swa = 10000.0f; /* llama_hparams' rope_freq_base_train_swa */
	m->rope_dim = m->head_dim;
	snprintf(key, sizeof key, "%s.rope.dimension_count", a);
	if (gguf_find_key(g, key) >= 0) {
		if ((rc = get_req(g, a, "rope.dimension_count", &v, err, errlen)))
			return rc;
		m->rope_dim = (int)v;
	}
	if (m->arch == META_DEEPSEEK2 && (rc = mla_keys(m, g, err, errlen)))
		return rc;
	if ((m->is_hybrid && (rc = dn_keys(m, g, err, errlen))) ||
	    (m->arch == META_GEMMA3 && (rc = gemma3_keys(m, g, err, errlen))) ||
	    (m->arch == META_GLM4MOE && (rc = glm4moe_keys(m, g, err, errlen))))
		return rc;
	if (m->rope_dim > m->head_dim || m->rope_dim % 2 || m->head_dim % 2)
		return sh_fail(err, errlen, SH_EFORMAT,
			       "rope dimension %d does not fit head size %d", m->rope_dim,
			       m->head_dim);

	if ((rc = moe_keys(m, g, err, errlen)))
		return rc;
	/* without the key (llama.cpp only derives defaults from it): no layer is dense, and only
	 * the shard's FFN units read it; the relation llama.cpp's default assumes */
	if (m->arch == META_QWEN35MOE && m->ffn == 0)
		m->ffn = (int)MIN((int64_t)m->ffn_exp * m->n_experts_used, 1 << 18);
	if (m->arch == META_GPTOSS && (rc = meta_gptoss_keys(m, g, err, errlen)))
		return rc;

	/* tensors */
	const gguf_tensor_t *emb = gguf_find_tensor(g, "token_embd.weight");
	if (!emb)
		return sh_fail(err, errlen, SH_EFORMAT, "missing tensor token_embd.weight");
	if (emb->n_dims != 2 || emb->ne[1] <= 0 || emb->ne[1] > (1 << 24))
		return sh_fail(err, errlen, SH_EFORMAT, "tensor token_embd.weight has a bad shape");
	m->n_vocab = (int)emb->ne[1];
	int64_t D = m->dim, V = m->n_vocab, F = m->ffn;
	int64_t QD = (int64_t)m->n_heads * m->head_dim, KD = (int64_t)m->n_kv_heads * m->head_dim;
	if ((rc = check_tensor(m, g, "token_embd.weight", D, V, err, errlen)) ||
	    (rc = check_tensor(m, g, "output_norm.weight", D, 0, err, errlen)))
		return rc;
	m->tied_output = gguf_find_tensor(g, "output.weight") == NULL;
	if (!m->tied_output && (rc = check_tensor(m, g, "output.weight", D, V, err, errlen)))
		return rc;
	char tn3[96];
#define NAME3(l, s) (snprintf(tn3, sizeof tn3, "blk.%d.%s", l, s), tn3)
	for (int l = 0; l < m->n_layers; l++) {
		if (m->is_hybrid) { /* its own layer kinds (dn_tensors), then the FFN below */
			if ((rc = dn_tensors(m, g, l, err, errlen)) ||
			    (!meta_layer_moe(m, l) &&
			     ((rc = check_tensor(m, g, NAME3(l, "ffn_gate.weight"), D, F, err,
						 errlen)) ||
			      (rc = check_tensor(m, g, NAME3(l, "ffn_up.weight"), D, F, err,
						 errlen)) ||
			      (rc = check_tensor(m, g, NAME3(l, "ffn_down.weight"), F, D, err,
						 errlen)))) ||
			    (meta_layer_moe(m, l) && (rc = moe_tensors(m, g, l, err, errlen))))
				return rc;
			continue;
		}
		static const struct {
			const char *name;
			int r0, r1; /* 0 D, 1 QD, 2 KD, 3 F, 4 head_dim, -1 vector */
		} need[] = {
		    {"attn_norm.weight", 0, -1},
		    {"attn_q.weight", 0, 1},
		    {"attn_k.weight", 0, 2},
		    {"attn_v.weight", 0, 2},
		    {"attn_output.weight", 1, 0},
		    {"ffn_norm.weight", 0, -1},
		    {"ffn_gate.weight", 0, 3},
		    {"ffn_up.weight", 0, 3},
		    {"ffn_down.weight", 3, 0},
		    {"attn_q.bias", 1, -1},
		    {"attn_k.bias", 2, -1},
		    {"attn_v.bias", 2, -1},
		    {"attn_q_norm.weight", 4, -1},
		    {"attn_k_norm.weight", 4, -1},
		    {"post_attention_norm.weight", 0, -1},
		    {"post_ffw_norm.weight", 0, -1},
		};
		int64_t sz[5] = {D, QD, KD, F, m->head_dim};
		for (size_t i = 0; i < ARRAY_LEN(need); i++) {
			if (m->is_mla && i >= 1 && i <= 4) /* Q/K/V/output: mla_tensors */
				continue;
			if (i >= 6 && i < 9 && meta_layer_moe(m, l))
				continue; /* experts instead of the dense FFN (moe_tensors) */
			if (i == 5 && m->ffn_norm_post)
				continue; /* glm4moe, gpt-oss: post_attention_norm instead (i 14) */
			if (i >= 9 && i < 12 && !m->has_qkv_bias)
				continue;
			if (i >= 12 && i < 14 && !m->has_qk_norm)
				continue;
			if (i >= 14 && !m->has_post_norm && !(i == 14 && m->ffn_norm_post))
				continue;
			char tn[96];
			snprintf(tn, sizeof tn, "blk.%d.%s", l, need[i].name);
			rc = check_tensor(m, g, tn, sz[need[i].r0],
					  need[i].r1 < 0 ? 0 : sz[need[i].r1], err, errlen);
			if (rc)
				return rc;
		}
		if (meta_layer_moe(m, l) && (rc = moe_tensors(m, g, l, err, errlen)))
			return rc;
		char tb[64]; /* glm4moe's selection bias is required (load_arch_tensors) */
		snprintf(tb, sizeof tb, "blk.%d.exp_probs_b.bias", l);
		if (meta_layer_moe(m, l) && m->arch == META_GLM4MOE && !gguf_find_tensor(g, tb))
			return sh_fail(err, errlen, SH_EFORMAT, "missing tensor %s (expected [%d])",
				       tb, m->n_experts);
		if (m->is_mla && (rc = mla_tensors(m, g, l, err, errlen)))
			return rc;
		if (m->arch == META_GPTOSS && (rc = meta_gptoss_tensors(m, g, l, err, errlen)))
			return rc;
	}
#undef NAME3
	for (int i = 0; i < gguf_n_tensors(g); i++)
		m->types_used |= 1ull << gguf_tensor(g, i)->type;
	m->weight_bytes = gguf_tensor_bytes(g);
	for (int i = 0; m->n_nextn && i < gguf_n_tensors(g); i++) { /* skipped layers: not held */
		const gguf_tensor_t *t = gguf_tensor(g, i);
		int l;
		if (sscanf(t->name, "blk.%d.", &l) == 1 && l >= m->n_layers)
			m->weight_bytes -= t->nbytes;
	}
	return 0;
}

void meta_types_str(const model_meta_t *m, char *buf, size_t len)
{
	size_t k = 0;
	if (len)
		buf[0] = 0;
	for (int t = 0; t < 64 && len; t++) {
		if (!(m->types_used & (1ull << t)))
			continue;
		int w = snprintf(buf + k, len - k, "%s%s", k ? " " : "", quant_type_ggml_name(t));
		if (w < 0 || (size_t)w >= len - k)
			break;
		k += (size_t)w;
	}
}
