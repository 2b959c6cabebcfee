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
	return 0;
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
	if ((rc = plan_model_check(m, err, errlen)))
		rc = SH_EFORMAT;
done:
	json_decref(o);
	return rc;
}
