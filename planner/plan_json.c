/*
 * plan_json.c: plan.json (docs/view.md) both ways, the plan hash, and the check that a plan's
 * shares cover the model exactly once (used on plans read from a peer and by the tests).
 *
 * Invariant: the hash is FNV-1a 64 over the compact, key-sorted JSON of the plan without its
 * "hash" member, so it covers everything a rank acts on (order, addresses, RDMA rows, shares,
 * fit figures) and nothing else; a plan parsed here re-serialises to the same bytes.
 */
#include "planner/plan_int.h"

#include "common/common.h"

#include <arpa/inet.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

uint64_t plan_fnv1a64(const char *s)
{
	return sh_fnv1a64(SH_FNV1A64_INIT, s, strlen(s));
}

static json_t *range(int a, int b)
{
	return json_pack("[i, i]", a, b);
}

static json_t *rank_json(const plan_t *p, const plan_rank_t *k)
{
	json_t *ips = json_array(), *rdma = json_array();
	for (int i = 0; ips && i < k->n_ips; i++)
		json_array_append_new(ips, json_string(k->ips[i]));
	for (int j = 0; rdma && j < p->n_ranks; j++)
		json_array_append_new(rdma, k->rdma[j][0] ? json_string(k->rdma[j]) : json_null());
	json_t *fit =
	    json_pack("{s:I, s:I, s:I, s:I}", "weights", (json_int_t)k->weight_bytes, "kv_cache",
		      (json_int_t)k->kv_cache_bytes, "activations", (json_int_t)k->act_bytes,
		      "headroom", (json_int_t)k->headroom_bytes);
	json_t *o =
	    json_pack("{s:i, s:s, s:s, s:s, s:i, s:o, s:o, s:I, s:o, s:o, s:o, s:o, s:o}", "rank",
		      k->rank, "node_id", k->node_id, "host", k->host, "ip", k->ip, "port", k->port,
		      "ips", ips, "rdma", rdma, "mem_avail", (json_int_t)k->mem_avail, "q_heads",
		      range(k->q0, k->q1), "kv_heads", range(k->kv0, k->kv1), "ffn",
		      range(k->ffn0, k->ffn1), "layers", range(k->layer0, k->layer1), "fit", fit);
	if (o && p->model.n_experts) { /* MoE only: dense plans keep their bytes and hash */
		json_object_set_new(o, "experts", range(k->exp0, k->exp1));
		json_object_set_new(o, "shared", range(k->shx0, k->shx1));
	}
	return o;
}

json_t *plan_json_object(const plan_t *p, int with_hash)
{
	const plan_model_t *m = &p->model;
	json_t *ranks = json_array();
	for (int r = 0; ranks && r < p->n_ranks; r++) {
		json_t *k = rank_json(p, &p->ranks[r]);
		if (!k || json_array_append_new(ranks, k)) {
			json_decref(ranks);
			return NULL;
		}
	}
	json_t *model =
	    json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "arch", m->arch,
		      "n_layers", m->n_layers, "n_heads", m->n_heads, "n_kv_heads", m->n_kv_heads,
		      "head_dim", m->head_dim, "dim", m->dim, "ffn", m->ffn, "n_vocab", m->n_vocab,
		      "n_ctx", m->n_ctx, "ffn_block", m->ffn_block);
	if (model && m->n_experts) {
		json_object_set_new(model, "n_experts", json_integer(m->n_experts));
		json_object_set_new(model, "ffn_shexp", json_integer(m->ffn_shexp));
	}
	json_t *o = json_object();
	if (!o || !ranks || !model) {
		json_decref(o), json_decref(ranks), json_decref(model);
		return NULL;
	}
	/* Fixed key order (jansson keeps insertion order); the hash near the top of the file. */
	json_object_set_new(o, "version", json_integer(2));
	if (with_hash)
		json_object_set_new(o, "hash", json_string(p->hash));
	json_object_set_new(o, "epoch", json_integer((json_int_t)p->epoch));
	json_object_set_new(o, "strategy", json_string(plan_strategy_name(p->strategy)));
	json_object_set_new(o, "reason", json_string(p->reason));
	json_object_set_new(o, "ctx", json_integer(p->ctx));
	json_object_set_new(o, "kv_bytes", json_integer(p->kv_bytes));
	json_object_set_new(o, "base_port", json_integer(p->base_port));
	json_object_set_new(o, "rdma_full_mesh", json_boolean(p->rdma_full_mesh));
	json_object_set_new(
	    o, "mlx",
	    json_pack("{s:s, s:s, s:s, s:o}", "backend", p->mlx_backend, "jaccl", p->jaccl, "why",
		      p->mlx_why, "coordinator",
		      p->coordinator[0] ? json_string(p->coordinator) : json_null()));
	json_object_set_new(o, "model", model);
	json_object_set_new(o, "ranks", ranks);
	return o;
}

int plan_hash_compute(plan_t *p)
{
	json_t *o = plan_json_object(p, 0);
	char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(o);
	if (!s)
		return SH_ENOMEM;
	snprintf(p->hash, sizeof p->hash, "%016llx", (unsigned long long)plan_fnv1a64(s));
	free(s);
	return 0;
}

char *plan_to_json(const plan_t *p)
{
	json_t *o = plan_json_object(p, 1);
	char *s = o ? plan_dump(o) : NULL;
	json_decref(o);
	return s;
}

/* Contiguous, non-empty ranges from 0 to end over the ranks; field offsets name the range. */
static int covers(const plan_t *p, size_t off0, size_t off1, int end)
{
	int pos = 0;
	for (int r = 0; r < p->n_ranks; r++) {
		const char *k = (const char *)&p->ranks[r];
		int a = *(const int *)(k + off0), b = *(const int *)(k + off1);
		if (a != pos || b <= a)
			return 0;
		pos = b;
	}
	return pos == end;
}

static int whole(const plan_t *p, size_t off0, size_t off1, int end)
{
	for (int r = 0; r < p->n_ranks; r++) {
		const char *k = (const char *)&p->ranks[r];
		if (*(const int *)(k + off0) != 0 || *(const int *)(k + off1) != end)
			return 0;
	}
	return 1;
}

#define RANGE(f0, f1) offsetof(plan_rank_t, f0), offsetof(plan_rank_t, f1)

/* Contiguous ranges from 0 to end in rank order, empty ones allowed (experts). */
static int tiles(const plan_t *p, size_t off0, size_t off1, int end)
{
	int pos = 0;
	for (int r = 0; r < p->n_ranks; r++) {
		const char *k = (const char *)&p->ranks[r];
		int a = *(const int *)(k + off0), b = *(const int *)(k + off1);
		if (a != pos || b < a)
			return 0;
		pos = b;
	}
	return pos == end;
}

int plan_check_cover(const plan_t *p, char *err, size_t errlen)
{
	const plan_model_t *m = &p->model;
	if (p->strategy == PLAN_PIPELINE) {
		if (!covers(p, RANGE(layer0, layer1), m->n_layers))
			return sh_fail(err, errlen, SH_EFORMAT, "plan: layers not covered once");
		if (!whole(p, RANGE(q0, q1), m->n_heads) ||
		    !whole(p, RANGE(kv0, kv1), m->n_kv_heads) ||
		    !whole(p, RANGE(ffn0, ffn1), m->ffn) ||
		    !whole(p, RANGE(exp0, exp1), m->n_experts) ||
		    !whole(p, RANGE(shx0, shx1), m->ffn_shexp))
			return sh_fail(err, errlen, SH_EFORMAT, "plan: pipeline rank not whole");
		return 0;
	}
	if (!whole(p, RANGE(layer0, layer1), m->n_layers))
		return sh_fail(err, errlen, SH_EFORMAT, "plan: tensor rank without every layer");
	if (!covers(p, RANGE(q0, q1), m->n_heads))
		return sh_fail(err, errlen, SH_EFORMAT, "plan: query heads not covered once");
	if (!covers(p, RANGE(ffn0, ffn1), m->ffn))
		return sh_fail(err, errlen, SH_EFORMAT, "plan: FFN columns not covered once");
	if (!tiles(p, RANGE(exp0, exp1), m->n_experts) ||
	    !tiles(p, RANGE(shx0, shx1), m->ffn_shexp))
		return sh_fail(err, errlen, SH_EFORMAT, "plan: experts not covered once");
	int g = m->n_heads / m->n_kv_heads;
	if (p->n_ranks <= m->n_kv_heads && !covers(p, RANGE(kv0, kv1), m->n_kv_heads))
		return sh_fail(err, errlen, SH_EFORMAT, "plan: KV heads not covered once");
	for (int r = 0; r < p->n_ranks; r++) {
		const plan_rank_t *k = &p->ranks[r];
		if (k->ffn0 % m->ffn_block)
			return sh_fail(err, errlen, SH_EFORMAT, "plan: FFN share off the block");
		if (k->kv0 != k->q0 / g || k->kv1 != (k->q1 - 1) / g + 1)
			return sh_fail(err, errlen, SH_EFORMAT, "plan: KV heads do not match");
	}
	return 0;
}

/* ---- parsing ---- */

static int int_at(json_t *o, const char *key, int lo, int hi, int *out)
{
	json_t *j = json_object_get(o, key);
	if (!json_is_integer(j) || json_integer_value(j) < lo || json_integer_value(j) > hi)
		return -1;
	*out = (int)json_integer_value(j);
	return 0;
}

static int u64_at(json_t *o, const char *key, uint64_t *out)
{
	json_t *j = json_object_get(o, key);
	if (!json_is_integer(j) || json_integer_value(j) < 0)
		return -1;
	*out = (uint64_t)json_integer_value(j);
	return 0;
}

static int str_at(json_t *o, const char *key, char *dst, size_t cap)
{
	json_t *j = json_object_get(o, key);
	if (!json_is_string(j) || json_string_length(j) >= cap ||
	    strlen(json_string_value(j)) != json_string_length(j))
		return -1;
	memcpy(dst, json_string_value(j), json_string_length(j) + 1);
	return 0;
}

static int range_at(json_t *o, const char *key, int hi, int *a, int *b)
{
	json_t *j = json_object_get(o, key);
	if (!json_is_array(j) || json_array_size(j) != 2)
		return -1;
	json_t *x = json_array_get(j, 0), *y = json_array_get(j, 1);
	if (!json_is_integer(x) || !json_is_integer(y) || json_integer_value(x) < 0 ||
	    json_integer_value(y) > hi || json_integer_value(x) >= json_integer_value(y))
		return -1;
	*a = (int)json_integer_value(x);
	*b = (int)json_integer_value(y);
	return 0;
}

/* [a, b] with 0 <= a <= b <= hi (an empty range allowed). */
static int range0_at(json_t *o, const char *key, int hi, int *a, int *b)
{
	json_t *j = json_object_get(o, key);
	if (!json_is_array(j) || json_array_size(j) != 2)
		return -1;
	json_t *x = json_array_get(j, 0), *y = json_array_get(j, 1);
	if (!json_is_integer(x) || !json_is_integer(y) || json_integer_value(x) < 0 ||
	    json_integer_value(y) > hi || json_integer_value(x) > json_integer_value(y))
		return -1;
	*a = (int)json_integer_value(x);
	*b = (int)json_integer_value(y);
	return 0;
}

static int rank_from_json(plan_t *p, int r, json_t *o)
{
	plan_rank_t *k = &p->ranks[r];
	const plan_model_t *m = &p->model;
	json_t *ips = json_object_get(o, "ips"), *rdma = json_object_get(o, "rdma");
	json_t *fit = json_object_get(o, "fit");
	if (!json_is_object(o) || int_at(o, "rank", r, r, &k->rank) ||
	    str_at(o, "node_id", k->node_id, sizeof k->node_id) ||
	    str_at(o, "host", k->host, sizeof k->host) || str_at(o, "ip", k->ip, sizeof k->ip) ||
	    int_at(o, "port", 1, 65535, &k->port) || u64_at(o, "mem_avail", &k->mem_avail) ||
	    range_at(o, "q_heads", m->n_heads, &k->q0, &k->q1) ||
	    range_at(o, "kv_heads", m->n_kv_heads, &k->kv0, &k->kv1) ||
	    range_at(o, "ffn", m->ffn, &k->ffn0, &k->ffn1) ||
	    range_at(o, "layers", m->n_layers, &k->layer0, &k->layer1) || !json_is_object(fit) ||
	    u64_at(fit, "weights", &k->weight_bytes) ||
	    u64_at(fit, "kv_cache", &k->kv_cache_bytes) ||
	    u64_at(fit, "activations", &k->act_bytes) ||
	    u64_at(fit, "headroom", &k->headroom_bytes) || !json_is_array(ips) ||
	    json_array_size(ips) > PLAN_MAX_ADDRS || !json_is_array(rdma) ||
	    json_array_size(rdma) != (size_t)p->n_ranks)
		return -1;
	if (m->n_experts && (range0_at(o, "experts", m->n_experts, &k->exp0, &k->exp1) ||
			     range0_at(o, "shared", m->ffn_shexp, &k->shx0, &k->shx1)))
		return -1;
	unsigned char buf[4];
	if (strlen(k->node_id) != PLAN_ID_LEN ||
	    strspn(k->node_id, "0123456789abcdef") != PLAN_ID_LEN ||
	    inet_pton(AF_INET, k->ip, buf) != 1 ||
	    (r && strcmp(p->ranks[0].node_id, k->node_id) >= 0))
		return -1; /* rank 0 has the smallest id, the ring address is IPv4 */
	for (int q = 1; q < r; q++)
		if (!strcmp(p->ranks[q].node_id, k->node_id))
			return -1; /* ids unique */
	size_t i;
	json_t *e;
	json_array_foreach(ips, i, e)
	{
		if (!json_is_string(e) || json_string_length(e) >= PLAN_IP_MAX)
			return -1;
		strcpy(k->ips[k->n_ips++], json_string_value(e));
	}
	json_array_foreach(rdma, i, e)
	{
		if (json_is_null(e))
			continue;
		if (!json_is_string(e) || json_string_length(e) >= PLAN_DEV_MAX ||
		    !json_string_length(e) || i == (size_t)r)
			return -1;
		strcpy(k->rdma[i], json_string_value(e));
	}
	return 0;
}

int plan_from_json(plan_t **out, const char *json, char *err, size_t errlen)
{
	*out = NULL;
	json_error_t jerr;
	json_t *o = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
	if (!o)
		return sh_fail(err, errlen, SH_EFORMAT, "plan: line %d: %s", jerr.line, jerr.text);
	int rc = SH_EFORMAT, version = 0;
	char strategy[16], hash[17];
	plan_t *p = calloc(1, sizeof *p);
	json_t *m = json_object_get(o, "model"), *ranks = json_object_get(o, "ranks");
	json_t *mesh = json_object_get(o, "rdma_full_mesh");
	if (!p) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto fail;
	}
	json_t *mlx = json_object_get(o, "mlx"), *coord = json_object_get(mlx, "coordinator");
	if (!json_is_object(o) || int_at(o, "version", 2, 2, &version) ||
	    u64_at(o, "epoch", &p->epoch) || str_at(o, "strategy", strategy, sizeof strategy) ||
	    str_at(o, "reason", p->reason, sizeof p->reason) ||
	    str_at(o, "hash", hash, sizeof hash) || int_at(o, "ctx", 1, 1 << 24, &p->ctx) ||
	    int_at(o, "kv_bytes", 1, 8, &p->kv_bytes) ||
	    int_at(o, "base_port", 1, 65535, &p->base_port) || !json_is_boolean(mesh) ||
	    !json_is_object(m) || !json_is_array(ranks) || !json_array_size(ranks) ||
	    json_array_size(ranks) > PLAN_MAX_NODES || !json_is_object(mlx) ||
	    str_at(mlx, "backend", p->mlx_backend, sizeof p->mlx_backend) ||
	    str_at(mlx, "jaccl", p->jaccl, sizeof p->jaccl) ||
	    str_at(mlx, "why", p->mlx_why, sizeof p->mlx_why) ||
	    (!json_is_null(coord) &&
	     str_at(mlx, "coordinator", p->coordinator, sizeof p->coordinator))) {
		sh_fail(err, errlen, rc, "plan: missing or bad top-level field");
		goto fail;
	}
	if ((strcmp(p->mlx_backend, "ring") && strcmp(p->mlx_backend, "jaccl") &&
	     strcmp(p->mlx_backend, "jaccl-ring")) ||
	    (strcmp(p->jaccl, "none") && strcmp(p->jaccl, "jaccl") &&
	     strcmp(p->jaccl, "jaccl-ring"))) {
		sh_fail(err, errlen, rc, "plan: unknown MLX backend");
		goto fail;
	}
	p->rdma_full_mesh = json_is_true(mesh);
	int s = plan_strategy_parse(strategy);
	if (s != PLAN_TENSOR && s != PLAN_PIPELINE) {
		sh_fail(err, errlen, rc, "plan: strategy must be tensor or pipeline");
		goto fail;
	}
	p->strategy = (plan_strategy_t)s;
	plan_model_t *pm = &p->model;
	if (str_at(m, "arch", pm->arch, sizeof pm->arch) ||
	    int_at(m, "n_layers", 1, 1 << 16, &pm->n_layers) ||
	    int_at(m, "n_heads", 1, 1 << 16, &pm->n_heads) ||
	    int_at(m, "n_kv_heads", 1, 1 << 16, &pm->n_kv_heads) ||
	    int_at(m, "head_dim", 1, 1 << 16, &pm->head_dim) ||
	    int_at(m, "dim", 1, 1 << 20, &pm->dim) || int_at(m, "ffn", 1, 1 << 22, &pm->ffn) ||
	    int_at(m, "n_vocab", 1, 1 << 24, &pm->n_vocab) ||
	    int_at(m, "n_ctx", 1, 1 << 24, &pm->n_ctx) ||
	    int_at(m, "ffn_block", 1, 4096, &pm->ffn_block) ||
	    (json_object_get(m, "n_experts") &&
	     (int_at(m, "n_experts", 1, 512, &pm->n_experts) ||
	      int_at(m, "ffn_shexp", 0, 1 << 22, &pm->ffn_shexp))) ||
	    plan_model_check(pm, NULL, 0)) {
		sh_fail(err, errlen, rc, "plan: bad model shape");
		goto fail;
	}
	p->n_ranks = (int)json_array_size(ranks);
	if (!(p->ranks = calloc((size_t)p->n_ranks, sizeof *p->ranks))) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto fail;
	}
	for (int r = 0; r < p->n_ranks; r++)
		if (rank_from_json(p, r, json_array_get(ranks, (size_t)r))) {
			sh_fail(err, errlen, rc, "plan: rank %d is malformed", r);
			goto fail;
		}
	if ((rc = plan_check_cover(p, err, errlen)))
		goto fail;
	rc = SH_EFORMAT;
	if (plan_hash_compute(p)) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto fail;
	}
	if (strcmp(p->hash, hash)) {
		sh_fail(err, errlen, rc, "plan: hash mismatch (says %s, content gives %s)", hash,
			p->hash);
		goto fail;
	}
	json_decref(o);
	*out = p;
	return 0;
fail:
	json_decref(o);
	plan_free(p);
	return rc;
}
