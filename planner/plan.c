/*
 * plan.c: plan_make. Orders the ranks (order.c), picks the strategy, splits the model in proportion
 * to usable memory (weighted by bandwidth when every node measured it), checks that every rank's
 * share fits, and fills the ring addresses and RDMA matrix.
 *
 * Invariant: a plan that plan_make returns assigns every query head, every FFN column and every
 * layer to exactly one rank in its split dimension (tensor: heads and columns, layers replicated;
 * pipeline: layers, heads and columns whole), each rank getting at least one unit; every rank's
 * figures (weights + KV cache + activations + headroom) are within its available memory.
 * All arithmetic is integer so every machine computes the same plan.
 */
#include "planner/plan_int.h"

#include "common/common.h"

#include <stdlib.h>
#include <string.h>

#define GB 1e9

void plan_opts_default(plan_opts_t *o)
{
	memset(o, 0, sizeof *o);
	o->strategy = PLAN_AUTO;
	o->kv_bytes = 4;
	o->headroom_bytes = (uint64_t)512 << 20;
	o->headroom_permille = 50;
	o->base_port = PLAN_DEFAULT_PORT;
}

static const char *const strategy_names[] = {"auto", "tensor", "pipeline", "hybrid"};

const char *plan_strategy_name(plan_strategy_t s)
{
	return (unsigned)s < ARRAY_LEN(strategy_names) ? strategy_names[s] : "auto";
}

int plan_strategy_parse(const char *s)
{
	for (size_t i = 0; i < ARRAY_LEN(strategy_names); i++)
		if (!strcmp(s, strategy_names[i]))
			return (int)i;
	return -1;
}

void plan_split(int *out, int n, int units, int min_each, const uint64_t *w)
{
	sh_split_units(out, n, units, min_each, w);
}

static int cmp_node_ptr(const void *a, const void *b)
{
	return strcmp((*(const plan_node_t *const *)a)->node_id,
		      (*(const plan_node_t *const *)b)->node_id);
}

/* ceil(a * b / c) without overflow (c > 0), saturating. */
static uint64_t mul_div_up(uint64_t a, uint64_t b, uint64_t c)
{
	unsigned __int128 x = ((unsigned __int128)a * b + c - 1) / c;
	return x > UINT64_MAX ? UINT64_MAX : (uint64_t)x;
}

uint64_t plan_headroom(const plan_opts_t *o, uint64_t mem)
{
	return MAX(o->headroom_bytes, mem / 1000 * (uint64_t)o->headroom_permille);
}

void plan_slices_fill(plan_t *p, int r0, int r1, const uint64_t *w)
{
	const plan_model_t *m = &p->model;
	int n = r1 - r0, cnt[PLAN_MAX_NODES], pos = 0;
	plan_rank_t *k0 = p->ranks + r0;
	w += r0;
	if (n == 1) { /* one rank holds it all (what the splits below give, without them) */
		k0->q0 = 0, k0->q1 = m->n_heads, k0->kv0 = 0, k0->kv1 = m->n_kv_heads;
		k0->ffn0 = 0, k0->ffn1 = m->ffn, k0->exp0 = 0, k0->exp1 = m->n_experts;
		k0->shx0 = 0, k0->shx1 = m->ffn_shexp;
		return;
	}
	int g = m->n_heads / m->n_kv_heads;
	if (n <= m->n_kv_heads) { /* whole KV-head groups */
		plan_split(cnt, n, m->n_kv_heads, 1, w);
		for (int r = 0; r < n; pos += cnt[r++]) {
			plan_rank_t *k = &k0[r];
			k->kv0 = pos, k->kv1 = pos + cnt[r];
			k->q0 = k->kv0 * g, k->q1 = k->kv1 * g;
		}
	} else { /* query heads; a KV head is replicated on every rank that needs it */
		plan_split(cnt, n, m->n_heads, 1, w);
		for (int r = 0; r < n; pos += cnt[r++]) {
			plan_rank_t *k = &k0[r];
			k->q0 = pos, k->q1 = pos + cnt[r];
			k->kv0 = k->q0 / g, k->kv1 = (k->q1 - 1) / g + 1;
		}
	}
	int blocks = (m->ffn + m->ffn_block - 1) / m->ffn_block;
	plan_split(cnt, n, blocks, 1, w);
	pos = 0;
	for (int r = 0; r < n; pos += cnt[r++]) {
		k0[r].ffn0 = pos * m->ffn_block;
		k0[r].ffn1 = MIN((pos + cnt[r]) * m->ffn_block, m->ffn);
	}
	/* routed experts whole, in proportion to the shares (a rank may get none); the shared
	 * block by columns like the dense FFN */
	plan_split(cnt, n, m->n_experts, 0, w);
	pos = 0;
	for (int r = 0; r < n; pos += cnt[r++])
		k0[r].exp0 = pos, k0[r].exp1 = pos + cnt[r];
	int sblocks = (m->ffn_shexp + m->ffn_block - 1) / m->ffn_block;
	plan_split(cnt, n, sblocks, 0, w);
	pos = 0;
	for (int r = 0; r < n; pos += cnt[r++]) {
		k0[r].shx0 = MIN(pos * m->ffn_block, m->ffn_shexp);
		k0[r].shx1 = MIN((pos + cnt[r]) * m->ffn_block, m->ffn_shexp);
	}
}

void plan_layers_set(plan_t *p, const int *stage_layers)
{
	int pos = 0;
	for (int r = 0; r < p->n_ranks; r++) {
		plan_rank_t *k = &p->ranks[r];
		if (r && k->stage != p->ranks[r - 1].stage)
			pos += stage_layers[k->stage - 1];
		k->layer0 = pos, k->layer1 = pos + stage_layers[k->stage];
	}
}

/* Fills the share ranges of every rank for strategy s (tensor or pipeline) with weights w. */
static void shares_fill(plan_t *p, plan_strategy_t s, const uint64_t *w)
{
	const plan_model_t *m = &p->model;
	int n = p->n_ranks, cnt[PLAN_MAX_NODES];
	for (int r = 0; r < n; r++) {
		plan_rank_t *k = &p->ranks[r];
		k->q0 = 0, k->q1 = m->n_heads, k->kv0 = 0, k->kv1 = m->n_kv_heads;
		k->ffn0 = 0, k->ffn1 = m->ffn, k->layer0 = 0, k->layer1 = m->n_layers;
		k->exp0 = 0, k->exp1 = m->n_experts, k->shx0 = 0, k->shx1 = m->ffn_shexp;
		k->stage = s == PLAN_PIPELINE ? r : 0;
		k->stage0 = s == PLAN_PIPELINE ? r : 0;
		k->stage1 = s == PLAN_PIPELINE ? r + 1 : n;
	}
	p->n_stages = s == PLAN_PIPELINE ? n : 1;
	if (s == PLAN_PIPELINE) {
		plan_split(cnt, n, m->n_layers, 1, w);
		plan_layers_set(p, cnt);
		return;
	}
	plan_slices_fill(p, 0, n, w);
}

static int kind_index(char c)
{
	return c == 's' ? PLAN_KIND_S : c == 'r' ? PLAN_KIND_R : PLAN_KIND_F;
}

char plan_layer_kind(const plan_model_t *m, int l)
{
	size_t n = strnlen(m->layer_kinds, PLAN_MAX_KINDS);
	return n && l >= 0 ? m->layer_kinds[(size_t)l % n] : 'f';
}

void plan_kind_counts(const plan_model_t *m, int l0, int l1, int cnt[PLAN_KINDS])
{
	int n = (int)strnlen(m->layer_kinds, PLAN_MAX_KINDS), per[PLAN_KINDS] = {0};
	for (int i = 0; i < PLAN_KINDS; i++)
		cnt[i] = 0;
	if (l1 <= l0 || l0 < 0)
		return;
	if (!n) {
		cnt[PLAN_KIND_F] = l1 - l0;
		return;
	}
	for (int i = 0; i < n; i++)
		per[kind_index(m->layer_kinds[i])]++;
	int len = l1 - l0, cycles = len / n;
	for (int i = 0; i < PLAN_KINDS; i++)
		cnt[i] = cycles * per[i];
	for (int i = 0; i < len % n; i++)
		cnt[kind_index(m->layer_kinds[(l0 + i) % n])]++;
}

/* The FFN block's bytes per layer on rank k (dense columns, experts, shared units). */
static uint64_t ffn_share(const plan_model_t *m, const plan_rank_t *k, int read)
{
	uint64_t f = mul_div_up(m->ffn_bytes, (uint64_t)(k->ffn1 - k->ffn0), (uint64_t)m->ffn);
	if (m->n_experts) { /* whole experts; a token reads the ones it routes to */
		uint64_t held = mul_div_up(m->expert_bytes, (uint64_t)(k->exp1 - k->exp0),
					   (uint64_t)m->n_experts);
		if (read && m->n_expert_used > 0 && m->n_expert_used < m->n_experts)
			held = mul_div_up(held, (uint64_t)m->n_expert_used, (uint64_t)m->n_experts);
		f = plan_add_sat(f, held);
	}
	if (m->ffn_shexp)
		f = plan_add_sat(f, mul_div_up(m->shexp_bytes, (uint64_t)(k->shx1 - k->shx0),
					       (uint64_t)m->ffn_shexp));
	return f;
}

/* Key heads of a recurrent layer rank k holds: the engine's model_dn_heads
 * (infer/model/deltanet.c), its query-head share scaled to rs_k_heads, boundaries on
 * multiples of rs_unit. */
static int rank_rs_heads(const plan_model_t *m, const plan_rank_t *k)
{
	int nk = m->rs_k_heads, u = MAX(m->rs_unit, 1);
	int a = (int)((int64_t)k->q0 * nk / m->n_heads),
	    b = (int)((int64_t)k->q1 * nk / m->n_heads);
	a -= a % u;
	if (b < nk)
		b -= b % u;
	return MAX(b - a, 0);
}

/* A token mixer's bytes per layer on rank k: attention (q and output by query heads, k and v
 * by KV heads) or a recurrent block (by key heads). */
static void mixer_share(const plan_model_t *m, const plan_rank_t *k, uint64_t *att, uint64_t *rec)
{
	uint64_t qh = (uint64_t)(k->q1 - k->q0), kvh = (uint64_t)(k->kv1 - k->kv0);
	*att = plan_add_sat(mul_div_up(m->attn_qo_bytes, qh, (uint64_t)m->n_heads),
			    mul_div_up(m->attn_kv_bytes, kvh, (uint64_t)m->n_kv_heads));
	*rec = m->rs_k_heads ? mul_div_up(m->rec_bytes, (uint64_t)rank_rs_heads(m, k),
					  (uint64_t)m->rs_k_heads)
			     : 0;
}

void plan_rank_layer_bytes(const plan_t *p, const plan_rank_t *k, int read, uint64_t *att,
			   uint64_t *ffn)
{
	const plan_model_t *m = &p->model;
	uint64_t a, r;
	int cnt[PLAN_KINDS];
	mixer_share(m, k, &a, &r);
	plan_kind_counts(m, 0, m->n_layers, cnt);
	if (cnt[PLAN_KIND_R]) /* averaged over the model's layers, as the stage's layers mix */
		a = mul_div_up(a, (uint64_t)(cnt[PLAN_KIND_F] + cnt[PLAN_KIND_S]),
			       (uint64_t)m->n_layers) +
		    mul_div_up(r, (uint64_t)cnt[PLAN_KIND_R], (uint64_t)m->n_layers);
	*att = plan_add_sat(a, m->norm_bytes / 2);
	*ffn = plan_add_sat(ffn_share(m, k, read), m->norm_bytes - m->norm_bytes / 2);
}

void plan_rank_kind_needs(const plan_t *p, const plan_rank_t *k, plan_need_t need[PLAN_KINDS])
{
	const plan_model_t *m = &p->model;
	uint64_t att, rec, slots = (uint64_t)MAX(p->slots, 1);
	mixer_share(m, k, &att, &rec);
	uint64_t rest = plan_add_sat(ffn_share(m, k, 0), m->norm_bytes);
	need[PLAN_KIND_F].w = need[PLAN_KIND_S].w = plan_add_sat(att, rest);
	need[PLAN_KIND_R].w = plan_add_sat(rec, rest);
	/* K and V of the rank's KV heads: whole tiles of the context per slot; a sliding-window
	 * layer its ring (infer/model/swa.c, model_swa_ring) when shorter */
	uint64_t blk = (uint64_t)MAX(p->kv_block, 1),
		 hrow = ((uint64_t)m->head_dim + blk - 1) / blk;
	uint64_t row = plan_mul_sat(2 * (uint64_t)(k->kv1 - k->kv0) * hrow, (uint64_t)p->kv_bytes);
	uint64_t full = ((uint64_t)p->ctx + PLAN_KV_TILE - 1) / PLAN_KV_TILE * PLAN_KV_TILE;
	uint64_t ring =
	    m->swa_kv_pos > 0 && (uint64_t)m->swa_kv_pos < full ? (uint64_t)m->swa_kv_pos : full;
	need[PLAN_KIND_F].kv = plan_mul_sat(plan_mul_sat(row, full), slots);
	need[PLAN_KIND_S].kv = plan_mul_sat(plan_mul_sat(row, ring), slots);
	if (m->kv_latent_bytes) /* MLA: the latent of every position of the context (mla.c) */
		need[PLAN_KIND_F].kv = need[PLAN_KIND_S].kv =
		    plan_mul_sat(plan_mul_sat(m->kv_latent_bytes, (uint64_t)p->ctx), slots);
	need[PLAN_KIND_R].kv = 0;
	/* a recurrent layer: its key heads' state, rs_copies buffers per slot (deltanet.c) */
	need[PLAN_KIND_F].rs = need[PLAN_KIND_S].rs = 0;
	uint64_t rs = m->rs_k_heads
			  ? m->rs_bytes / (uint64_t)m->rs_k_heads * (uint64_t)rank_rs_heads(m, k)
			  : 0; /* the state is linear in the heads: exact */
	need[PLAN_KIND_R].rs =
	    plan_mul_sat(plan_mul_sat(rs, (uint64_t)MAX(m->rs_copies, 1)), slots);
}

/* The output head (and final norm) is on rank 0, which samples, in every strategy (tensor and
 * pipeline alike: docs/parallel.md); the embedding on every rank of the first stage (a tensor
 * group embeds its tokens on each rank without a broadcast). */
static int has_out(const plan_rank_t *k)
{
	return k->rank == 0;
}

static int has_embd(const plan_rank_t *k)
{
	return k->stage == 0;
}

/* F32 scratch: residual and norms, the FFN's columns (gate, up, product), one score row per
 * query head over the context, and the logits where the output head is. */
static uint64_t act_bytes(const plan_t *p, const plan_rank_t *k)
{
	uint64_t act = 8 * (uint64_t)p->model.dim + 3 * (uint64_t)(k->ffn1 - k->ffn0) +
		       (uint64_t)(k->q1 - k->q0) * (uint64_t)p->ctx;
	act += has_out(k) ? (uint64_t)p->model.n_vocab : 0;
	return 4 * act;
}

uint64_t plan_rank_fixed_bytes(const plan_t *p, const plan_opts_t *o, const plan_rank_t *k)
{
	const plan_model_t *m = &p->model;
	uint64_t f =
	    plan_add_sat(has_embd(k) ? m->embd_bytes : 0, has_out(k) ? m->output_bytes : 0);
	f = plan_add_sat(f, act_bytes(p, k));
	return plan_add_sat(f, plan_headroom(o, k->mem_avail));
}

/* The most any c consecutive layers of the model need on a rank, from the prefix sums cyc of its
 * needs over the kind pattern (n layers) laid twice, and a whole cycle's need (128-bit: hostile
 * figures must not wrap into a fit). */
static unsigned __int128 window_max(const plan_model_t *m, const unsigned __int128 *cyc, int n,
				    int c)
{
	unsigned __int128 most = 0, full = (unsigned __int128)(c / n) * cyc[n];
	int starts = MIN(n, m->n_layers - c + 1);
	for (int s = 0; s < starts; s++)
		most = MAX(most, full + cyc[s + c % n] - cyc[s]);
	return most;
}

int plan_rank_layer_cap(const plan_t *p, const plan_rank_t *k, uint64_t budget)
{
	const plan_model_t *m = &p->model;
	plan_need_t need[PLAN_KINDS];
	uint64_t per[PLAN_KINDS];
	unsigned __int128 cyc[2 * PLAN_MAX_KINDS + 1];
	plan_rank_kind_needs(p, k, need);
	for (int i = 0; i < PLAN_KINDS; i++)
		per[i] = plan_add_sat(plan_add_sat(need[i].w, need[i].kv), need[i].rs);
	int n = (int)strnlen(m->layer_kinds, PLAN_MAX_KINDS);
	const char *pat = n ? m->layer_kinds : "f";
	n = MAX(n, 1);
	cyc[0] = 0;
	for (int i = 0; i < 2 * n; i++)
		cyc[i + 1] = cyc[i] + per[kind_index(pat[i % n])];
	int lo = 0, hi = m->n_layers; /* the cap is in [lo, hi]: lo fits */
	while (lo < hi) {
		int mid = lo + (hi - lo + 1) / 2;
		if (window_max(m, cyc, n, mid) <= budget)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

int plan_fit_check(plan_t *p, const plan_opts_t *o, char *err, size_t errlen)
{
	const plan_model_t *m = &p->model;
	int n = p->n_ranks, worst = -1;
	uint64_t worst_short = 0, total_short = 0;
	for (int r = 0; r < n; r++) {
		plan_rank_t *k = &p->ranks[r];
		plan_need_t per[PLAN_KINDS];
		int cnt[PLAN_KINDS];
		plan_rank_kind_needs(p, k, per);
		plan_kind_counts(m, k->layer0, k->layer1, cnt);
		uint64_t wt =
		    plan_add_sat(has_embd(k) ? m->embd_bytes : 0, has_out(k) ? m->output_bytes : 0);
		k->kv_cache_bytes = k->rs_bytes = 0;
		for (int i = 0; i < PLAN_KINDS; i++) {
			wt = plan_add_sat(wt, plan_mul_sat(per[i].w, (uint64_t)cnt[i]));
			k->kv_cache_bytes = plan_add_sat(k->kv_cache_bytes,
							 plan_mul_sat(per[i].kv, (uint64_t)cnt[i]));
			k->rs_bytes =
			    plan_add_sat(k->rs_bytes, plan_mul_sat(per[i].rs, (uint64_t)cnt[i]));
		}
		k->weight_bytes = wt;
		k->act_bytes = act_bytes(p, k);
		k->headroom_bytes = plan_headroom(o, k->mem_avail);
		uint64_t need = plan_add_sat(
		    plan_add_sat(k->weight_bytes, plan_add_sat(k->kv_cache_bytes, k->rs_bytes)),
		    plan_add_sat(k->act_bytes, k->headroom_bytes));
		if (need > k->mem_avail) {
			uint64_t s = need - k->mem_avail;
			total_short = plan_add_sat(total_short, s);
			if (worst < 0 || s > worst_short)
				worst = r, worst_short = s;
		}
	}
	if (worst < 0)
		return 0;
	if (!err)
		return SH_ENOFIT;
	const plan_rank_t *k = &p->ranks[worst];
	double need = (double)k->weight_bytes + (double)k->kv_cache_bytes + (double)k->rs_bytes +
		      (double)k->act_bytes + (double)k->headroom_bytes;
	char rs[64] = "", slots[32] = "", fewer[48] = "";
	if (k->rs_bytes)
		snprintf(rs, sizeof rs, ", recurrent state %.1f", k->rs_bytes / GB);
	if (p->slots > 1) {
		snprintf(slots, sizeof slots, " x %d slots", p->slots);
		snprintf(fewer, sizeof fewer, ", fewer slots (now %d)", p->slots);
	}
	return sh_fail(
	    err, errlen, SH_ENOFIT,
	    "model does not fit (%s, %d rank%s): short by %.1f GB in total; rank %d "
	    "(%s, node %.8s) needs %.1f GB (weights %.1f, KV cache %.1f for %d tokens%s%s, "
	    "activations %.1f, headroom %.1f) but has %.1f GB available; fix: add nodes, "
	    "use a shorter context (--ctx, now %d)%s or a smaller quantization",
	    plan_strategy_name(p->strategy), n, n == 1 ? "" : "s", total_short / GB, worst,
	    k->host[0] ? k->host : "no host name", k->node_id, need / GB, k->weight_bytes / GB,
	    k->kv_cache_bytes / GB, p->ctx, slots, rs, k->act_bytes / GB, k->headroom_bytes / GB,
	    k->mem_avail / GB, p->ctx, fewer);
}

/* Why tensor parallel cannot be used at all, or NULL. */
static const char *tensor_impossible(const plan_t *p, char *buf, size_t len)
{
	const plan_model_t *m = &p->model;
	int blocks = (m->ffn + m->ffn_block - 1) / m->ffn_block;
	if (p->n_ranks > m->n_heads)
		snprintf(buf, len, "%d ranks outnumber the model's %d query heads", p->n_ranks,
			 m->n_heads);
	else if (p->n_ranks > blocks)
		snprintf(buf, len, "%d ranks outnumber the model's %d FFN blocks of %d columns",
			 p->n_ranks, blocks, m->ffn_block);
	else
		return NULL;
	return buf;
}

/* Chooses the strategy and writes why into p->reason; SH_EINVAL when the request is impossible. */
static int choose(plan_t *p, const plan_node_t *const *nodes, plan_strategy_t want, char *err,
		  size_t errlen)
{
	char why[160];
	const char *no_tensor = tensor_impossible(p, why, sizeof why);
	int n = p->n_ranks, no_pipe = n > p->model.n_layers;
	if (want == PLAN_TENSOR && no_tensor)
		return sh_fail(err, errlen, SH_EINVAL, "tensor parallel is impossible: %s",
			       no_tensor);
	if (want == PLAN_PIPELINE && no_pipe)
		return sh_fail(err, errlen, SH_EINVAL,
			       "pipeline is impossible: %d ranks outnumber the model's %d layers",
			       n, p->model.n_layers);
	if (want != PLAN_AUTO) {
		p->strategy = want;
		snprintf(p->reason, sizeof p->reason, "%s requested", plan_strategy_name(want));
		return 0;
	}
	if (n == 1) {
		p->strategy = PLAN_TENSOR;
		snprintf(p->reason, sizeof p->reason, "single node");
		return 0;
	}
	/* The worst link over all pairs decides (ties: the first pair in rank order). */
	int wi = 0, wj = 1, all_rdma = 1;
	plan_link_t worst = PLAN_LINK_RDMA;
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++) {
			plan_link_t k = plan_pair_link(nodes[i], nodes[j]);
			all_rdma &= k == PLAN_LINK_RDMA;
			if (k < worst)
				worst = k, wi = i, wj = j;
		}
	if (no_tensor && no_pipe)
		return sh_fail(err, errlen, SH_EINVAL,
			       "no strategy fits %d ranks: %s, and they outnumber the %d layers", n,
			       no_tensor, p->model.n_layers);
	if (worst >= PLAN_LINK_ETHERNET && !no_tensor) {
		p->strategy = PLAN_TENSOR;
		if (all_rdma)
			snprintf(p->reason, sizeof p->reason,
				 "every pair of nodes has an RDMA link");
		else
			snprintf(
			    p->reason, sizeof p->reason,
			    "every pair of nodes has a wired or RDMA link (slowest: %s between "
			    "ranks %d and %d)",
			    plan_link_name(worst), wi, wj);
		return 0;
	}
	if (no_pipe) { /* slow links, but too many ranks for a pipeline: tensor still works */
		p->strategy = PLAN_TENSOR;
		snprintf(p->reason, sizeof p->reason,
			 "ranks %d and %d are linked only by %s, but %d ranks outnumber the %d "
			 "layers",
			 wi, wj, plan_link_name(worst), n, p->model.n_layers);
		return 0;
	}
	p->strategy = PLAN_PIPELINE;
	if (no_tensor)
		snprintf(p->reason, sizeof p->reason, "%s", no_tensor);
	else
		snprintf(p->reason, sizeof p->reason,
			 "ranks %d and %d are linked only by %s: a pipeline moves less data", wi,
			 wj, worst == PLAN_LINK_WIFI ? "wifi" : "an unknown link");
	return 0;
}

void plan_free(plan_t *p)
{
	if (!p)
		return;
	free(p->ranks);
	free(p->cands);
	free(p->standby);
	free(p);
}

/* The rank fields that come from the node, the ring address and the RDMA row of every rank;
 * then the MLX decisions. nodes[r] is rank r's node. */
static int ranks_place(plan_t *p, const plan_node_t *const *nodes, char *err, size_t errlen)
{
	int n = p->n_ranks;
	for (int r = 0; r < n; r++) {
		plan_rank_t *k = &p->ranks[r];
		const plan_node_t *a = nodes[r];
		k->rank = r;
		memcpy(k->node_id, a->node_id, sizeof k->node_id);
		snprintf(k->host, sizeof k->host, "%s", a->host);
		k->mem_avail = a->mem_avail;
		k->port = p->base_port + r;
		plan_ring_addr(k, a, n > 1 ? nodes[(r + n - 1) % n] : NULL);
		if (!k->ip[0])
			return sh_fail(err, errlen, SH_EINVAL,
				       "node %.8s has no IPv4 address for the ring", a->node_id);
		int full = 1;
		for (int j = 0; j < n; j++) {
			const char *d = j == r ? NULL : plan_pair_rdma(a, nodes[j]);
			snprintf(k->rdma[j], sizeof k->rdma[j], "%s", d ? d : "");
			full &= j == r || d != NULL;
		}
		p->rdma_full_mesh = r ? p->rdma_full_mesh && full : full;
	}
	char lan[PLAN_MAX_NODES][PLAN_IP_MAX];
	for (int r = 0; r < n; r++)
		plan_lan_addr(lan[r], nodes, n, r);
	plan_mlx_decide(p, lan);
	return 0;
}

/* The plan the cost model chose: its nodes in its order, its stages, shares and figures. */
static int build_costed(plan_t *p, const plan_choice_t *ch, const plan_cost_ctx_t *c,
			const plan_node_t *const *sorted, const plan_opts_t *o, char *err,
			size_t errlen)
{
	const plan_layout_t *l = &ch->layout;
	const plan_node_t *nodes[PLAN_MAX_NODES];
	p->n_ranks = l->n;
	for (int r = 0; r < l->n; r++)
		nodes[r] = sorted[l->idx[r]];
	int rc = ranks_place(p, nodes, err, errlen);
	if (rc)
		return rc;
	p->strategy = l->strategy;
	p->q8_wire = l->q8;
	if ((rc = plan_layout_fill(c, l, p, o)))
		return sh_fail(err, errlen, rc, "the chosen plan does not fit (a planner bug)");
	p->costed = 1;
	snprintf(p->reason, sizeof p->reason, "%s", ch->reason);
	plan_pred_fill(&p->pred, "chosen", l, &ch->cost, sorted, o->parallel, &p->model);
	p->cands = calloc((size_t)MAX(ch->n_cands, 1), sizeof *p->cands);
	p->standby = calloc((size_t)MAX(ch->n_standby, 1), sizeof *p->standby);
	if (!p->cands || !p->standby)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	p->n_cands = ch->n_cands;
	memcpy(p->cands, ch->cands, (size_t)ch->n_cands * sizeof *p->cands);
	p->n_standby = ch->n_standby;
	memcpy(p->standby, ch->standby, (size_t)ch->n_standby * sizeof *p->standby);
	return 0;
}

int plan_make(plan_t **out, const plan_view_t *v, const plan_model_t *m, const plan_opts_t *o,
	      char *err, size_t errlen)
{
	*out = NULL;
	plan_opts_t defaults;
	if (!o) {
		plan_opts_default(&defaults);
		o = &defaults;
	}
	int rc = plan_view_check(v, err, errlen);
	if (rc)
		return rc;
	if ((rc = plan_model_check(m, err, errlen)))
		return rc;
	if ((unsigned)o->strategy > PLAN_HYBRID || o->ctx < 0 || o->ctx > (1 << 24) ||
	    o->kv_bytes < 0 || o->kv_bytes > (o->kv_block > 1 ? 1024 : 8) || o->kv_block < 0 ||
	    o->kv_block > 256 || o->headroom_permille < 0 || o->headroom_permille > 1000 ||
	    o->base_port < 0 || o->base_port + (int)v->n_nodes - 1 > 65535 || o->parallel < 0 ||
	    o->parallel > 65536 || o->slots < 0 || o->slots > 65536)
		return sh_fail(err, errlen, SH_EINVAL, "bad planner options");
	plan_t *p = calloc(1, sizeof *p);
	plan_cost_ctx_t *c = NULL;
	plan_choice_t *ch = NULL;
	const plan_node_t *nodes[PLAN_MAX_NODES];
	int n = (int)v->n_nodes;
	if (!p || !(p->ranks = calloc((size_t)n, sizeof *p->ranks))) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto fail;
	}
	p->epoch = v->epoch;
	p->model = *m;
	p->ctx = o->ctx ? o->ctx : m->n_ctx;
	p->kv_bytes = o->kv_bytes ? o->kv_bytes : 4;
	p->slots = MAX(o->slots, 1);
	p->kv_block = MAX(o->kv_block, 1);
	p->base_port = o->base_port ? o->base_port : PLAN_DEFAULT_PORT;
	p->n_ranks = n;
	for (int i = 0; i < n; i++)
		nodes[i] = &v->nodes[i];
	qsort(nodes, (size_t)n, sizeof *nodes, cmp_node_ptr);

	/* Measured: the cost model picks nodes, strategy and arrangement (search.c). When no
	 * measured candidate fits, the kind-based choice below says why in its own terms. */
	if (!(c = plan_cost_ctx_new(nodes, n, m, o))) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto fail;
	}
	if (plan_cost_ctx_measured(c)) {
		if (!(ch = calloc(1, sizeof *ch))) {
			rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
			goto fail;
		}
		rc = plan_search(ch, c, nodes, n, m, o, err, errlen);
		if (!rc)
			rc = build_costed(p, ch, c, nodes, o, err, errlen);
		if (!rc)
			goto done;
		if (rc != SH_ENOFIT)
			goto fail;
	}
	if (o->strategy == PLAN_HYBRID) {
		rc = sh_fail(err, errlen, SH_EINVAL,
			     "hybrid needs measured compute and links in the view (docs/view.md)");
		goto fail;
	}
	plan_ring_order(nodes, n); /* rank 0 stays the smallest id; the rest follow the cables */

	/* Weights: usable memory in MiB, times MB/s when every node measured its bandwidth. */
	uint64_t w_mem[PLAN_MAX_NODES], w_bw[PLAN_MAX_NODES];
	int all_bw = 1;
	for (int r = 0; r < n; r++) {
		const plan_node_t *a = nodes[r];
		uint64_t h = plan_headroom(o, a->mem_avail);
		w_mem[r] = ((a->mem_avail > h ? a->mem_avail - h : 0) >> 20) + 1;
		w_bw[r] = w_mem[r] * a->bw_mbs;
		all_bw &= a->bw_mbs > 0;
	}
	if ((rc = ranks_place(p, nodes, err, errlen)))
		goto fail;
	if ((rc = choose(p, nodes, o->strategy, err, errlen)))
		goto fail;

	/* Bandwidth-weighted shares first; memory-weighted when those do not fit; for auto, a
	 * pipeline when tensor shares do not fit (no embedding replicated on every rank). */
	plan_strategy_t chosen = p->strategy;
	char first_err[512] = "";
	rc = SH_ENOFIT;
	if (all_bw) {
		shares_fill(p, p->strategy, w_bw);
		rc = plan_fit_check(p, o, first_err, sizeof first_err);
	}
	if (rc) {
		shares_fill(p, p->strategy, w_mem);
		rc = plan_fit_check(p, o, first_err, sizeof first_err);
	}
	if (rc && o->strategy == PLAN_AUTO && chosen == PLAN_TENSOR && n > 1 && n <= m->n_layers) {
		p->strategy = PLAN_PIPELINE;
		shares_fill(p, PLAN_PIPELINE, w_mem);
		char e2[512];
		if (!plan_fit_check(p, o, e2, sizeof e2)) {
			snprintf(p->reason, sizeof p->reason,
				 "tensor shares do not fit (the embedding is on every rank); "
				 "pipeline does");
			rc = 0;
		} else {
			p->strategy = chosen;
			shares_fill(p, chosen, w_mem);
			plan_fit_check(p, o, first_err, sizeof first_err);
		}
	}
	if (rc) {
		rc = sh_fail(err, errlen, SH_ENOFIT, "%s", first_err);
		goto fail;
	}
done:
	if ((rc = plan_hash_compute(p))) {
		sh_fail(err, errlen, rc, "out of memory");
		goto fail;
	}
	plan_cost_ctx_free(c);
	free(ch);
	*out = p;
	return 0;
fail:
	plan_cost_ctx_free(c);
	free(ch);
	plan_free(p);
	return rc;
}

int plan_n_ranks(const plan_t *p)
{
	return p->n_ranks;
}

const plan_rank_t *plan_rank(const plan_t *p, int r)
{
	return r >= 0 && r < p->n_ranks ? &p->ranks[r] : NULL;
}

int plan_rank_of(const plan_t *p, const char *node_id)
{
	for (int r = 0; r < p->n_ranks; r++)
		if (!strcmp(p->ranks[r].node_id, node_id))
			return r;
	return -1;
}

plan_strategy_t plan_strategy(const plan_t *p)
{
	return p->strategy;
}
const char *plan_reason(const plan_t *p)
{
	return p->reason;
}
const char *plan_hash(const plan_t *p)
{
	return p->hash;
}
uint64_t plan_epoch(const plan_t *p)
{
	return p->epoch;
}
int plan_rdma_full_mesh(const plan_t *p)
{
	return p->rdma_full_mesh;
}
int plan_ctx(const plan_t *p)
{
	return p->ctx;
}
int plan_slots(const plan_t *p)
{
	return MAX(p->slots, 1);
}
int plan_n_stages(const plan_t *p)
{
	return p->n_stages;
}
int plan_q8_wire(const plan_t *p)
{
	return p->q8_wire;
}
const plan_pred_t *plan_predicted(const plan_t *p)
{
	return p->costed ? &p->pred : NULL;
}
int plan_n_candidates(const plan_t *p)
{
	return p->n_cands;
}
const plan_pred_t *plan_candidate(const plan_t *p, int i)
{
	return i >= 0 && i < p->n_cands ? &p->cands[i] : NULL;
}
int plan_n_standby(const plan_t *p)
{
	return p->n_standby;
}
const plan_standby_t *plan_standby(const plan_t *p, int i)
{
	return i >= 0 && i < p->n_standby ? &p->standby[i] : NULL;
}
