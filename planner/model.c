/*
 * model.c: the model metadata the planner needs (shapes and byte counts), from a small JSON
 * (docs/view.md) or from shapes plus a ggml tensor type.
 *
 * Invariant: a plan_model_t that passed plan_model_check has every shape within the limits
 * below and n_heads a multiple of n_kv_heads, so the shard arithmetic cannot overflow an int.
 */
#include "planner/plan_int.h"

#include "common/common.h"

#include <string.h>

static const struct wtype {
	int id;
	const char *name;
	int block_elems, block_bytes;
} wtypes[] = {
    {0, "F32", 1, 4},    {1, "F16", 1, 2},       {30, "BF16", 1, 2},     {2, "Q4_0", 32, 18},
    {8, "Q8_0", 32, 34}, {12, "Q4_K", 256, 144}, {14, "Q6_K", 256, 210},
};

static const struct wtype *wtype_by_id(int id)
{
	for (size_t i = 0; i < ARRAY_LEN(wtypes); i++)
		if (wtypes[i].id == id)
			return &wtypes[i];
	return NULL;
}

/* Bytes of rows x cols elements of type t, rows laid along cols (ggml's ne[0] = cols). */
static uint64_t tensor_bytes(const struct wtype *t, uint64_t rows, uint64_t cols)
{
	uint64_t blocks = (cols + (uint64_t)t->block_elems - 1) / (uint64_t)t->block_elems;
	return plan_mul_sat(plan_mul_sat(rows, blocks), (uint64_t)t->block_bytes);
}

int plan_model_set_type(plan_model_t *m, int ggml_type, int tied_output)
{
	const struct wtype *t = wtype_by_id(ggml_type);
	if (!t)
		return SH_EUNSUPP;
	uint64_t dim = (uint64_t)MAX(m->dim, 0),
		 q = (uint64_t)MAX(m->n_heads, 0) * MAX(m->head_dim, 0);
	uint64_t kv = (uint64_t)MAX(m->n_kv_heads, 0) * MAX(m->head_dim, 0);
	uint64_t ffn = (uint64_t)MAX(m->ffn, 0), vocab = (uint64_t)MAX(m->n_vocab, 0);
	m->ffn_block = MAX(t->block_elems, 32);
	/* attn_q: q rows of dim; attn_output: dim rows of q. */
	m->attn_qo_bytes = plan_add_sat(tensor_bytes(t, q, dim), tensor_bytes(t, dim, q));
	m->attn_kv_bytes = plan_mul_sat(2, tensor_bytes(t, kv, dim));
	/* gate and up: ffn rows of dim; down: dim rows of ffn. */
	m->ffn_bytes =
	    plan_add_sat(plan_mul_sat(2, tensor_bytes(t, ffn, dim)), tensor_bytes(t, dim, ffn));
	m->norm_bytes = plan_mul_sat(2 * 4, dim); /* attn_norm + ffn_norm, F32 */
	m->embd_bytes = tensor_bytes(t, vocab, dim);
	m->output_bytes = plan_add_sat(tied_output ? 0 : tensor_bytes(t, vocab, dim), 4 * dim);
	return 0;
}

int plan_model_check(const plan_model_t *m, char *err, size_t errlen)
{
	const struct {
		const char *name;
		int v, max;
	} lim[] = {
	    {"n_layers", m->n_layers, 1 << 16},
	    {"n_heads", m->n_heads, 1 << 16},
	    {"n_kv_heads", m->n_kv_heads, 1 << 16},
	    {"head_dim", m->head_dim, 1 << 16},
	    {"dim", m->dim, 1 << 20},
	    {"ffn", m->ffn, 1 << 22},
	    {"n_vocab", m->n_vocab, 1 << 24},
	    {"n_ctx", m->n_ctx, 1 << 24},
	    {"ffn_block", m->ffn_block, 4096},
	};
	for (size_t i = 0; i < ARRAY_LEN(lim); i++)
		if (lim[i].v < 1 || lim[i].v > lim[i].max)
			return sh_fail(err, errlen, SH_EINVAL,
				       "model: %s must be from 1 to %d (is %d)", lim[i].name,
				       lim[i].max, lim[i].v);
	if (m->n_experts < 0 || m->n_experts > 512 || m->ffn_shexp < 0 ||
	    m->ffn_shexp > (1 << 22) || m->n_expert_used < 0 || m->n_expert_used > 512)
		return sh_fail(err, errlen, SH_EINVAL, "model: bad expert count or shared width");
	if (m->n_kv_heads > m->n_heads || m->n_heads % m->n_kv_heads)
		return sh_fail(err, errlen, SH_EINVAL,
			       "model: n_heads (%d) must be a multiple of n_kv_heads (%d)",
			       m->n_heads, m->n_kv_heads);
	size_t n = strnlen(m->layer_kinds, sizeof m->layer_kinds);
	if (n == sizeof m->layer_kinds || strspn(m->layer_kinds, "fsr") != n)
		return sh_fail(err, errlen, SH_EINVAL,
			       "model: layer_kinds must be up to %d of f, s and r", PLAN_MAX_KINDS);
	if (m->swa_kv_pos < 0 || m->swa_kv_pos > (1 << 24))
		return sh_fail(err, errlen, SH_EINVAL, "model: bad swa_kv_pos %d", m->swa_kv_pos);
	if (memchr(m->layer_kinds, 'r', n) &&
	    (m->rs_k_heads < 1 || m->rs_k_heads > (1 << 16) || m->rs_unit < 1 ||
	     m->rs_unit > m->rs_k_heads || m->rs_copies < 1 || m->rs_copies > 1024))
		return sh_fail(err, errlen, SH_EINVAL,
			       "model: recurrent layers need rs_k_heads (1..65536), rs_unit (1.."
			       "rs_k_heads) and rs_copies (1..1024)");
	return 0;
}

/* Tokens one internal pass of the engine writes before it attends (MODEL_MAX_BATCH): a
 * sliding-window ring keeps window - 1 + this, in whole tiles (infer/model/swa.c). */
#define PLAN_SWA_BATCH 64

/* A recurrent layer's sizes from its shape (qwen35's Gated DeltaNet, infer/model/meta.c
 * dn_tensors): nk key and nv value heads of ds dimensions, a conv of dc taps. Its matrices
 * (attn_qkv, attn_gate, ssm_alpha, ssm_beta, ssm_out) and one state buffer of one sequence
 * (conv state and the delta-rule state, F32: meta_dn_state_bytes). The attention layers'
 * queries carry a gate (2 x the query rows). */
static void set_recurrent(plan_model_t *m, const struct wtype *t, uint64_t nk, uint64_t nv,
			  uint64_t ds, uint64_t dc)
{
	uint64_t dim = (uint64_t)m->dim, q = (uint64_t)m->n_heads * (uint64_t)m->head_dim;
	uint64_t ch = 2 * nk * ds + nv * ds;
	m->rec_bytes = plan_add_sat(tensor_bytes(t, ch, dim), tensor_bytes(t, nv * ds, dim));
	m->rec_bytes = plan_add_sat(m->rec_bytes, plan_mul_sat(2, tensor_bytes(t, nv, dim)));
	m->rec_bytes = plan_add_sat(m->rec_bytes, tensor_bytes(t, dim, nv * ds));
	m->attn_qo_bytes = plan_add_sat(tensor_bytes(t, 2 * q, dim), tensor_bytes(t, dim, q));
	m->rs_bytes = 4 * ((dc ? dc - 1 : 0) * ch + nv * ds * ds);
	m->rs_k_heads = (int)nk;
	/* whole quant blocks of ssm_out's columns per run of key heads (model_dn_head_unit) */
	int unit = 1;
	while ((uint64_t)unit * ds % (uint64_t)t->block_elems && unit < (int)nk)
		unit++;
	m->rs_unit = (uint64_t)unit * ds % (uint64_t)t->block_elems ? (int)nk : unit;
	m->rs_copies = 3; /* the state and the engine's two checkpoints (MODEL_CHECKPOINTS) */
}

static int get_int(json_t *o, const char *key, int *out, int required, char *err, size_t errlen)
{
	json_t *j = json_object_get(o, key);
	if (!j) {
		if (required)
			return sh_fail(err, errlen, SH_EFORMAT, "model: missing \"%s\"", key);
		return 0;
	}
	if (!json_is_integer(j) || json_integer_value(j) < 0 || json_integer_value(j) > INT32_MAX)
		return sh_fail(err, errlen, SH_EFORMAT, "model: \"%s\" must be a positive integer",
			       key);
	*out = (int)json_integer_value(j);
	return 0;
}

static int get_bytes(json_t *o, const char *key, uint64_t *out, char *err, size_t errlen)
{
	json_t *j = json_object_get(o, key);
	if (!j)
		return 0;
	if (!json_is_integer(j) || json_integer_value(j) < 0)
		return sh_fail(err, errlen, SH_EFORMAT, "model: \"%s\" must be a byte count", key);
	*out = (uint64_t)json_integer_value(j);
	return 0;
}

int plan_model_from_json(plan_model_t *m, const char *json, char *err, size_t errlen)
{
	memset(m, 0, sizeof *m);
	json_error_t jerr;
	json_t *o = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
	if (!o)
		return sh_fail(err, errlen, SH_EFORMAT, "model: line %d: %s", jerr.line, jerr.text);
	int rc = 0;
	if (!json_is_object(o)) {
		rc = sh_fail(err, errlen, SH_EFORMAT, "model: must be a JSON object");
		goto done;
	}
	json_t *arch = json_object_get(o, "arch");
	if (arch && (!json_is_string(arch) || json_string_length(arch) >= sizeof m->arch)) {
		rc = sh_fail(err, errlen, SH_EFORMAT, "model: \"arch\" must be a short string");
		goto done;
	}
	snprintf(m->arch, sizeof m->arch, "%s", arch ? json_string_value(arch) : "llama");
	if ((rc = get_int(o, "n_layers", &m->n_layers, 1, err, errlen)) ||
	    (rc = get_int(o, "n_heads", &m->n_heads, 1, err, errlen)) ||
	    (rc = get_int(o, "dim", &m->dim, 1, err, errlen)) ||
	    (rc = get_int(o, "ffn", &m->ffn, 1, err, errlen)) ||
	    (rc = get_int(o, "n_vocab", &m->n_vocab, 1, err, errlen)) ||
	    (rc = get_int(o, "n_ctx", &m->n_ctx, 1, err, errlen)))
		goto done;
	m->n_kv_heads = m->n_heads;
	m->head_dim = m->n_heads ? m->dim / m->n_heads : 0;
	if ((rc = get_int(o, "n_kv_heads", &m->n_kv_heads, 0, err, errlen)) ||
	    (rc = get_int(o, "head_dim", &m->head_dim, 0, err, errlen)))
		goto done;
	json_t *wt = json_object_get(o, "wtype"), *tied = json_object_get(o, "tied_output");
	const char *wname = json_is_string(wt) ? json_string_value(wt) : wt ? NULL : "F32";
	const struct wtype *t = NULL;
	for (size_t i = 0; wname && i < ARRAY_LEN(wtypes); i++)
		if (!strcmp(wtypes[i].name, wname))
			t = &wtypes[i];
	if (!t) {
		rc = sh_fail(err, errlen, SH_EFORMAT,
			     "model: \"wtype\" must be F32, F16, BF16, Q4_0, Q8_0, Q4_K or Q6_K");
		goto done;
	}
	if (tied && !json_is_boolean(tied)) {
		rc = sh_fail(err, errlen, SH_EFORMAT, "model: \"tied_output\" must be a boolean");
		goto done;
	}
	plan_model_set_type(m, t->id, tied && json_is_true(tied));
	/* Explicit figures (e.g. measured from a real file) override the derived ones. */
	if ((rc = get_int(o, "ffn_block", &m->ffn_block, 0, err, errlen)) ||
	    (rc = get_bytes(o, "attn_qo_bytes", &m->attn_qo_bytes, err, errlen)) ||
	    (rc = get_bytes(o, "attn_kv_bytes", &m->attn_kv_bytes, err, errlen)) ||
	    (rc = get_bytes(o, "ffn_bytes", &m->ffn_bytes, err, errlen)) ||
	    (rc = get_bytes(o, "norm_bytes", &m->norm_bytes, err, errlen)) ||
	    (rc = get_bytes(o, "embd_bytes", &m->embd_bytes, err, errlen)) ||
	    (rc = get_bytes(o, "output_bytes", &m->output_bytes, err, errlen)) ||
	    (rc = get_int(o, "n_experts", &m->n_experts, 0, err, errlen)) ||
	    (rc = get_int(o, "n_expert_used", &m->n_expert_used, 0, err, errlen)) ||
	    (rc = get_int(o, "ffn_shexp", &m->ffn_shexp, 0, err, errlen)) ||
	    (rc = get_bytes(o, "expert_bytes", &m->expert_bytes, err, errlen)) ||
	    (rc = get_bytes(o, "shexp_bytes", &m->shexp_bytes, err, errlen)))
		goto done;
	/* experts from their width when their bytes are not given: gate, up, down each */
	int ef = 0;
	if ((rc = get_int(o, "expert_ffn", &ef, 0, err, errlen)))
		goto done;
	uint64_t d = (uint64_t)m->dim, e = (uint64_t)ef, sf = (uint64_t)MAX(m->ffn_shexp, 0);
	if (ef && !json_object_get(o, "expert_bytes"))
		m->expert_bytes = plan_mul_sat(
		    (uint64_t)MAX(m->n_experts, 0),
		    plan_add_sat(plan_mul_sat(2, tensor_bytes(t, e, d)), tensor_bytes(t, d, e)));
	if (sf && !json_object_get(o, "shexp_bytes"))
		m->shexp_bytes =
		    plan_add_sat(plan_mul_sat(2, tensor_bytes(t, sf, d)), tensor_bytes(t, d, sf));
	/* layer kinds, the sliding window and the recurrent layers (docs/view.md, "Memory") */
	json_t *kinds = json_object_get(o, "layer_kinds");
	if (kinds && (!json_is_string(kinds) || json_string_length(kinds) > PLAN_MAX_KINDS)) {
		rc = sh_fail(err, errlen, SH_EFORMAT,
			     "model: \"layer_kinds\" must be a string of up to %d of f, s and r",
			     PLAN_MAX_KINDS);
		goto done;
	}
	snprintf(m->layer_kinds, sizeof m->layer_kinds, "%s",
		 kinds ? json_string_value(kinds) : "");
	int win = 0, nk = 0, nv = 0, ds = 0, dc = 4;
	if ((rc = get_int(o, "swa_window", &win, 0, err, errlen)) ||
	    (rc = get_int(o, "ssm_k_heads", &nk, 0, err, errlen)) ||
	    (rc = get_int(o, "ssm_v_heads", &nv, 0, err, errlen)) ||
	    (rc = get_int(o, "ssm_state", &ds, 0, err, errlen)) ||
	    (rc = get_int(o, "ssm_conv", &dc, 0, err, errlen)))
		goto done;
	if (win > (1 << 24) || nk > (1 << 16) || nv > (1 << 16) || ds > 4096 || dc > 64 ||
	    (nk && (!nv || nv % nk || !ds || !dc))) {
		rc = sh_fail(err, errlen, SH_EFORMAT,
			     "model: bad swa_window or ssm_* shape (ssm_v_heads a multiple of "
			     "ssm_k_heads, ssm_state and ssm_conv set)");
		goto done;
	}
	if (win) /* model_swa_ring */
		m->swa_kv_pos =
		    (win - 1 + PLAN_SWA_BATCH + PLAN_KV_TILE - 1) / PLAN_KV_TILE * PLAN_KV_TILE;
	if (nk)
		set_recurrent(m, t, (uint64_t)nk, (uint64_t)nv, (uint64_t)ds, (uint64_t)dc);
	if ((rc = get_int(o, "swa_kv_pos", &m->swa_kv_pos, 0, err, errlen)) ||
	    (rc = get_bytes(o, "rec_bytes", &m->rec_bytes, err, errlen)) ||
	    (rc = get_bytes(o, "rs_bytes", &m->rs_bytes, err, errlen)) ||
	    (rc = get_int(o, "rs_k_heads", &m->rs_k_heads, 0, err, errlen)) ||
	    (rc = get_int(o, "rs_unit", &m->rs_unit, 0, err, errlen)) ||
	    (rc = get_int(o, "rs_copies", &m->rs_copies, 0, err, errlen)) ||
	    (rc = get_bytes(o, "kv_latent_bytes", &m->kv_latent_bytes, err, errlen)))
		goto done;
	/* explicit attention figures win over the gated query set_recurrent assumed */
	if ((rc = get_bytes(o, "attn_qo_bytes", &m->attn_qo_bytes, err, errlen)))
		goto done;
	if ((rc = plan_model_check(m, err, errlen)))
		rc = SH_EFORMAT;
done:
	json_decref(o);
	return rc;
}
