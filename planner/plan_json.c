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
	if (fit && k->rs_bytes) /* recurrent layers only: other plans keep their bytes and hash */
		json_object_set_new(fit, "recurrent", json_integer((json_int_t)k->rs_bytes));
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
	if (o && p->strategy == PLAN_HYBRID) { /* tensor and pipeline imply their stages */
		json_object_set_new(o, "stage", json_integer(k->stage));
		json_object_set_new(o, "stage_ranks", range(k->stage0, k->stage1));
	}
	return o;
}

/* Tenths as a JSON number with one decimal (written with JSON_REAL_PRECISION(15), it reads
 * back as the same tenths). */
static json_t *tenths(uint64_t x)
{
	return json_real((double)x / 10.0);
}

static json_t *pred_json(const plan_pred_t *d)
{
	json_t *st = json_array(), *ids = json_array();
	for (int s = 0; st && s < d->n_stages; s++)
		json_array_append_new(st, json_integer(d->stage_size[s]));
	for (int r = 0; ids && r < d->n_ranks; r++)
		json_array_append_new(ids, json_string(d->node_ids[r]));
	json_t *o = json_object();
	if (!o || !st || !ids) {
		json_decref(o), json_decref(st), json_decref(ids);
		return NULL;
	}
	json_object_set_new(o, "what", json_string(d->what));
	json_object_set_new(o, "strategy", json_string(d->strategy));
	json_object_set_new(o, "ranks", json_integer(d->n_ranks));
	json_object_set_new(o, "stages", st);
	json_object_set_new(o, "q8_wire", json_boolean(d->q8_wire));
	json_object_set_new(o, "nodes", ids);
	json_object_set_new(o, "predicted_decode_tok_s", tenths(d->decode_dtok));
	json_object_set_new(o, "predicted_aggregate_tok_s", tenths(d->aggregate_dtok));
	json_object_set_new(o, "predicted_prefill_tok_s", tenths(d->prefill_dtok));
	json_object_set_new(o, "predicted_mem_max_bytes",
			    json_integer((json_int_t)d->mem_max_bytes));
	json_object_set_new(o, "syncs", json_integer(d->n_syncs));
	json_object_set_new(o, "sync_us", json_integer((json_int_t)d->sync_us));
	json_object_set_new(o, "hops", json_integer(d->n_hops));
	json_object_set_new(o, "hop_us", json_integer((json_int_t)d->hop_us));
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
	if (p->kv_block > 1) /* bytes per block of kv_block elements (q8_0: 34 per 32) */
		json_object_set_new(o, "kv_block", json_integer(p->kv_block));
	if (p->slots > 1) /* one slot is implied (and keeps older plans' hashes) */
		json_object_set_new(o, "slots", json_integer(p->slots));
	json_object_set_new(o, "base_port", json_integer(p->base_port));
	json_object_set_new(o, "rdma_full_mesh", json_boolean(p->rdma_full_mesh));
	if (p->costed) { /* a plan the cost model made: its predictions (docs/view.md) */
		const plan_pred_t *d = &p->pred;
		json_object_set_new(o, "q8_wire", json_boolean(p->q8_wire));
		json_object_set_new(o, "predicted_decode_tok_s", tenths(d->decode_dtok));
		json_object_set_new(o, "predicted_aggregate_tok_s", tenths(d->aggregate_dtok));
		json_object_set_new(o, "predicted_parallel", json_integer(d->parallel));
		json_object_set_new(o, "predicted_prefill_tok_s", tenths(d->prefill_dtok));
		json_object_set_new(o, "predicted_mem_max_bytes",
				    json_integer((json_int_t)d->mem_max_bytes));
	}
	json_object_set_new(
	    o, "mlx",
	    json_pack("{s:s, s:s, s:s, s:o}", "backend", p->mlx_backend, "jaccl", p->jaccl, "why",
		      p->mlx_why, "coordinator",
		      p->coordinator[0] ? json_string(p->coordinator) : json_null()));
	json_object_set_new(o, "model", model);
	json_object_set_new(o, "ranks", ranks);
	if (p->costed) {
		json_t *sb = json_array(), *cands = json_array();
		for (int i = 0; sb && i < p->n_standby; i++)
			json_array_append_new(sb, json_pack("{s:s, s:s, s:s}", "node_id",
							    p->standby[i].node_id, "host",
							    p->standby[i].host, "reason",
							    p->standby[i].reason));
		for (int i = 0; cands && i < p->n_cands; i++) {
			json_t *c = pred_json(&p->cands[i]);
			if (!c || json_array_append_new(cands, c)) {
				json_decref(sb), json_decref(cands), json_decref(o);
				return NULL;
			}
		}
		if (!sb || !cands) {
			json_decref(sb), json_decref(cands), json_decref(o);
			return NULL;
		}
		json_object_set_new(o, "standby", sb);
		json_object_set_new(o, "candidates", cands);
	}
	return o;
}

int plan_hash_compute(plan_t *p)
{
	json_t *o = plan_json_object(p, 0);
	char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(15)) : NULL;
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

/* Contiguous ranges from 0 to end over ranks [a, b) in rank order, each non-empty (or, with
 * empty_ok, possibly empty: experts); field offsets name the range. */
static int covers(const plan_t *p, int a, int b, size_t off0, size_t off1, int end, int empty_ok)
{
	int pos = 0;
	for (int r = a; r < b; r++) {
		const char *k = (const char *)&p->ranks[r];
		int x = *(const int *)(k + off0), y = *(const int *)(k + off1);
		if (x != pos || y < x || (y == x && !empty_ok))
			return 0;
		pos = y;
	}
	return pos == end;
}

#define RANGE(f0, f1) offsetof(plan_rank_t, f0), offsetof(plan_rank_t, f1)

/* Stages: numbered from 0 in rank order, contiguous, each rank naming its stage's ranks. */
static int stages_ok(const plan_t *p, int *n_stages)
{
	int n = p->n_ranks, S = 0;
	for (int r = 0; r < n; r++) {
		const plan_rank_t *k = &p->ranks[r];
		int first = r == 0 || k->stage != p->ranks[r - 1].stage;
		int last = r + 1 == n || p->ranks[r + 1].stage != k->stage;
		if (first && (k->stage != S++ || k->stage0 != r))
			return 0;
		if (!first &&
		    (k->stage0 != p->ranks[r - 1].stage0 || k->stage1 != p->ranks[r - 1].stage1))
			return 0;
		if (k->stage1 <= r || k->stage1 > n || (last && k->stage1 != r + 1))
			return 0;
	}
	*n_stages = S;
	return 1;
}

int plan_check_cover(const plan_t *p, char *err, size_t errlen)
{
	const plan_model_t *m = &p->model;
	int n = p->n_ranks, S;
	if (!stages_ok(p, &S) || (p->strategy == PLAN_TENSOR && S != 1) ||
	    (p->strategy == PLAN_PIPELINE && S != n) ||
	    (p->strategy == PLAN_HYBRID && (S < 2 || S >= n)))
		return sh_fail(err, errlen, SH_EFORMAT, "plan: stages do not match the strategy");
	int g = m->n_heads / m->n_kv_heads, pos = 0;
	for (int a = 0; a < n; a = p->ranks[a].stage1) {
		int b = p->ranks[a].stage1;
		for (int r = a; r < b; r++)
			if (p->ranks[r].layer0 != pos || p->ranks[r].layer1 != p->ranks[a].layer1 ||
			    p->ranks[r].layer1 <= pos)
				return sh_fail(err, errlen, SH_EFORMAT,
					       "plan: layers not covered once");
		pos = p->ranks[a].layer1;
		if (!covers(p, a, b, RANGE(q0, q1), m->n_heads, 0))
			return sh_fail(err, errlen, SH_EFORMAT,
				       "plan: query heads not covered once");
		if (!covers(p, a, b, RANGE(ffn0, ffn1), m->ffn, 0))
			return sh_fail(err, errlen, SH_EFORMAT,
				       "plan: FFN columns not covered once");
		if (!covers(p, a, b, RANGE(exp0, exp1), m->n_experts, 1) ||
		    !covers(p, a, b, RANGE(shx0, shx1), m->ffn_shexp, 1))
			return sh_fail(err, errlen, SH_EFORMAT, "plan: experts not covered once");
		if (b - a <= m->n_kv_heads && !covers(p, a, b, RANGE(kv0, kv1), m->n_kv_heads, 0))
			return sh_fail(err, errlen, SH_EFORMAT, "plan: KV heads not covered once");
		for (int r = a; r < b; r++) {
			const plan_rank_t *k = &p->ranks[r];
			if (k->ffn0 % m->ffn_block)
				return sh_fail(err, errlen, SH_EFORMAT,
					       "plan: FFN share off the block");
			if (k->kv0 != k->q0 / g || k->kv1 != (k->q1 - 1) / g + 1)
				return sh_fail(err, errlen, SH_EFORMAT,
					       "plan: KV heads do not match");
		}
	}
	if (pos != m->n_layers)
		return sh_fail(err, errlen, SH_EFORMAT, "plan: layers not covered once");
	for (int i = 0; i < p->n_standby; i++)
		for (int r = 0; r < n; r++)
			if (!strcmp(p->standby[i].node_id, p->ranks[r].node_id))
				return sh_fail(err, errlen, SH_EFORMAT,
					       "plan: a standby node is also a rank");
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
	    u64_at(fit, "headroom", &k->headroom_bytes) ||
	    (json_object_get(fit, "recurrent") && u64_at(fit, "recurrent", &k->rs_bytes)) ||
	    !json_is_array(ips) || json_array_size(ips) > PLAN_MAX_ADDRS || !json_is_array(rdma) ||
	    json_array_size(rdma) != (size_t)p->n_ranks)
		return -1;
	if (m->n_experts && (range0_at(o, "experts", m->n_experts, &k->exp0, &k->exp1) ||
			     range0_at(o, "shared", m->ffn_shexp, &k->shx0, &k->shx1)))
		return -1;
	if (p->strategy == PLAN_HYBRID) {
		if (int_at(o, "stage", 0, p->n_ranks - 1, &k->stage) ||
		    range_at(o, "stage_ranks", p->n_ranks, &k->stage0, &k->stage1))
			return -1;
	} else { /* implied: one stage (tensor), one per rank (pipeline) */
		int pipe = p->strategy == PLAN_PIPELINE;
		k->stage = pipe ? r : 0;
		k->stage0 = pipe ? r : 0;
		k->stage1 = pipe ? r + 1 : p->n_ranks;
	}
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

/* A number of tokens/s with one decimal, back to tenths. */
static int tenths_at(json_t *o, const char *key, uint64_t *out)
{
	json_t *j = json_object_get(o, key);
	if (!json_is_number(j) || !(json_number_value(j) >= 0) || json_number_value(j) > 1e15)
		return -1;
	*out = (uint64_t)(json_number_value(j) * 10.0 + 0.5);
	return 0;
}

static int pred_from_json(plan_pred_t *d, json_t *o, int parallel)
{
	json_t *st = json_object_get(o, "stages"), *ids = json_object_get(o, "nodes");
	json_t *q8 = json_object_get(o, "q8_wire");
	uint64_t x;
	memset(d, 0, sizeof *d);
	d->parallel = parallel;
	if (!json_is_object(o) || str_at(o, "what", d->what, sizeof d->what) ||
	    str_at(o, "strategy", d->strategy, sizeof d->strategy) ||
	    int_at(o, "ranks", 1, PLAN_MAX_NODES, &d->n_ranks) || !json_is_array(st) ||
	    !json_array_size(st) || json_array_size(st) > (size_t)d->n_ranks ||
	    !json_is_array(ids) || json_array_size(ids) != (size_t)d->n_ranks ||
	    !json_is_boolean(q8) || tenths_at(o, "predicted_decode_tok_s", &d->decode_dtok) ||
	    tenths_at(o, "predicted_aggregate_tok_s", &d->aggregate_dtok) ||
	    tenths_at(o, "predicted_prefill_tok_s", &d->prefill_dtok) ||
	    u64_at(o, "predicted_mem_max_bytes", &d->mem_max_bytes) ||
	    int_at(o, "syncs", 0, 1 << 30, &d->n_syncs) || u64_at(o, "sync_us", &d->sync_us) ||
	    int_at(o, "hops", 0, 1 << 30, &d->n_hops) || u64_at(o, "hop_us", &x))
		return -1;
	d->hop_us = x;
	d->q8_wire = json_is_true(q8);
	d->n_stages = (int)json_array_size(st);
	int sum = 0;
	for (int s = 0; s < d->n_stages; s++) {
		json_t *e = json_array_get(st, (size_t)s);
		if (!json_is_integer(e) || json_integer_value(e) < 1 ||
		    json_integer_value(e) > d->n_ranks)
			return -1;
		d->stage_size[s] = (int)json_integer_value(e);
		sum += d->stage_size[s];
	}
	for (int r = 0; r < d->n_ranks; r++) {
		json_t *e = json_array_get(ids, (size_t)r);
		if (!json_is_string(e) || json_string_length(e) != PLAN_ID_LEN)
			return -1;
		memcpy(d->node_ids[r], json_string_value(e), PLAN_ID_LEN + 1);
	}
	return sum == d->n_ranks ? 0 : -1;
}

/* The cost model's part of a plan.json (absent from kind-based plans). */
static int costed_from_json(plan_t *p, json_t *o)
{
	json_t *q8 = json_object_get(o, "q8_wire"), *sb = json_object_get(o, "standby");
	json_t *cands = json_object_get(o, "candidates");
	if (!json_object_get(o, "predicted_decode_tok_s"))
		return q8 || sb || cands ? -1 : 0;
	plan_pred_t *d = &p->pred;
	p->costed = 1;
	if (!json_is_boolean(q8) || !json_is_array(sb) || json_array_size(sb) > PLAN_MAX_NODES ||
	    !json_is_array(cands) || !json_array_size(cands) ||
	    json_array_size(cands) > PLAN_MAX_CANDS ||
	    tenths_at(o, "predicted_decode_tok_s", &d->decode_dtok) ||
	    tenths_at(o, "predicted_aggregate_tok_s", &d->aggregate_dtok) ||
	    int_at(o, "predicted_parallel", 1, 65536, &d->parallel) ||
	    tenths_at(o, "predicted_prefill_tok_s", &d->prefill_dtok) ||
	    u64_at(o, "predicted_mem_max_bytes", &d->mem_max_bytes))
		return -1;
	p->q8_wire = json_is_true(q8);
	p->cands = calloc(json_array_size(cands), sizeof *p->cands);
	p->standby = calloc(json_array_size(sb) + 1, sizeof *p->standby);
	if (!p->cands || !p->standby)
		return -1;
	size_t i;
	json_t *e;
	json_array_foreach(cands, i, e)
	{
		if (pred_from_json(&p->cands[i], e, d->parallel))
			return -1;
		p->n_cands++;
	}
	json_array_foreach(sb, i, e)
	{
		plan_standby_t *b = &p->standby[i];
		if (!json_is_object(e) || str_at(e, "node_id", b->node_id, sizeof b->node_id) ||
		    str_at(e, "host", b->host, sizeof b->host) ||
		    str_at(e, "reason", b->reason, sizeof b->reason))
			return -1;
		p->n_standby++;
	}
	/* the top-level figures are the chosen candidate's (the first one) */
	plan_pred_t *c = &p->cands[0];
	if (strcmp(c->what, "chosen") || c->decode_dtok != d->decode_dtok ||
	    c->aggregate_dtok != d->aggregate_dtok || c->prefill_dtok != d->prefill_dtok ||
	    c->mem_max_bytes != d->mem_max_bytes || c->n_ranks != p->n_ranks ||
	    c->q8_wire != p->q8_wire)
		return -1;
	*d = *c;
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
	    int_at(o, "kv_bytes", 1, 1024, &p->kv_bytes) ||
	    (json_object_get(o, "kv_block") && int_at(o, "kv_block", 2, 256, &p->kv_block)) ||
	    (json_object_get(o, "slots") && int_at(o, "slots", 2, 65536, &p->slots)) ||
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
	if (s != PLAN_TENSOR && s != PLAN_PIPELINE && s != PLAN_HYBRID) {
		sh_fail(err, errlen, rc, "plan: strategy must be tensor, pipeline or hybrid");
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
	p->n_stages = p->ranks[p->n_ranks - 1].stage + 1;
	if (costed_from_json(p, o)) {
		sh_fail(err, errlen, rc, "plan: bad predictions, candidates or standby");
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
