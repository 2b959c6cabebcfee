/*
 * search.c: the candidates the cost model (cost.c) weighs, and the choice among them.
 *
 * Candidates, over every subset of the measured nodes (up to PLAN_EXHAUSTIVE of them; above,
 * the subsets a single-linkage clustering of the links suggests and their fastest-first
 * prefixes):
 *   single   one node holds the whole model;
 *   tensor   one group over the subset (rank order: order.c's ring through the cables);
 *   pipeline one rank per stage, the ring ordered for the cheapest hops (rank 0 first);
 *   hybrid   the subset cut where the clustering joins groups by their slowest links: each
 *            group a tensor stage, the stages ordered for the cheapest hops;
 * each with the 8-bit wire when it pays (PLAN_Q8_PERMILLE), and with layers split between
 * stages either so that every stage takes as long (balanced) or to the fastest stages first,
 * up to their memory (fill). Shares within a group follow each rank's decode rate.
 *
 * The choice: the fastest single-stream decode; ties go to the higher aggregate at
 * --parallel, then fewer ranks, faster prefill, no 8-bit wire, then the first found. Since
 * every subset is a candidate, adding a node never makes the chosen plan slower; a member the
 * chosen plan leaves out is standby, with the reason.
 *
 * Invariant: deterministic. The nodes arrive sorted by id, subsets and arrangements are
 * enumerated in a fixed order, costs are integers, and only a strictly better candidate
 * replaces the one kept, so the same view gives the same plan on every machine.
 */
#include "planner/plan_int.h"

#include "common/common.h"

#include <stdlib.h>
#include <string.h>

#define PLAN_EXHAUSTIVE 8 /* measured nodes up to which every subset is tried (247 of 8) */
/* The 8-bit wire changes the sums slightly (transport.h: error bound), so it is taken only
 * when it makes decode at least 5 % faster. */
#define PLAN_Q8_PERMILLE 950
#define PLAN_MAX_MASKS   8192 /* subsets kept above PLAN_EXHAUSTIVE nodes */

enum { CLS_SINGLE, CLS_TENSOR, CLS_PIPELINE, CLS_HYBRID, CLS_N };

typedef struct {
	int have;
	plan_layout_t l;
	plan_cost_t k;
} best_t;

typedef struct {
	const plan_cost_ctx_t *c;
	const plan_node_t *const *nodes; /* sorted by id */
	int n;
	const plan_model_t *m;
	const plan_opts_t *o;
	plan_t *p;                       /* scratch plan of PLAN_MAX_NODES ranks */
	uint64_t multi;                  /* nodes a plan of >= 2 ranks may use */
	uint64_t linked[PLAN_MAX_NODES]; /* per node: itself and the nodes it has a figure to */
	uint8_t kind[PLAN_MAX_NODES][PLAN_MAX_NODES]; /* link kinds (order.c's ring) */
	best_t chosen, cls[CLS_N], all[CLS_N], with[PLAN_MAX_NODES];
	/* tour search scratch */
	uint64_t cm[PLAN_MAX_NODES][PLAN_MAX_NODES];
	int path[PLAN_MAX_NODES], tbest[PLAN_MAX_NODES], used[PLAN_MAX_NODES];
	uint64_t tcost;
} search_t;

static int popcount64(uint64_t x)
{
	return __builtin_popcountll(x);
}

static int class_of(const plan_layout_t *l)
{
	if (l->n == 1)
		return CLS_SINGLE;
	return l->strategy == PLAN_PIPELINE ? CLS_PIPELINE
	       : l->strategy == PLAN_HYBRID ? CLS_HYBRID
					    : CLS_TENSOR;
}

static uint64_t mask_of(const plan_layout_t *l)
{
	uint64_t m = 0;
	for (int r = 0; r < l->n; r++)
		m |= 1ULL << l->idx[r];
	return m;
}

/* May the plan be this candidate? Forced: its strategy on >= 2 ranks; auto: anything the
 * engine runs. */
static int eligible(const search_t *s, const plan_layout_t *l)
{
	if (s->o->keep_first && !(mask_of(l) & 1)) /* nodes are sorted: 0 is the smallest id */
		return 0;
	if (s->o->strategy != PLAN_AUTO)
		return l->n >= 2 && l->strategy == s->o->strategy;
	return l->strategy != PLAN_HYBRID || s->o->engine_hybrid;
}

/* Is candidate a strictly better than b? */
static int better(const plan_layout_t *la, const plan_cost_t *a, const plan_layout_t *lb,
		  const plan_cost_t *b)
{
	if (a->decode_ns != b->decode_ns)
		return a->decode_ns < b->decode_ns;
	if (a->agg_mtoks != b->agg_mtoks)
		return a->agg_mtoks > b->agg_mtoks;
	if (la->n != lb->n)
		return la->n < lb->n;
	if (a->prefill_mtoks != b->prefill_mtoks)
		return a->prefill_mtoks > b->prefill_mtoks;
	return la->q8 < lb->q8;
}

static void keep(best_t *b, const plan_layout_t *l, const plan_cost_t *k)
{
	if (b->have && !better(l, k, &b->l, &b->k))
		return;
	b->have = 1;
	b->l = *l;
	b->k = *k;
}

static void stage_range(const plan_layout_t *l, int s, int *r0, int *r1)
{
	*r0 = s ? l->stage_end[s - 1] : 0;
	*r1 = l->stage_end[s];
}

/* ---- filling a candidate ---- */

/* Layers each stage can hold: the least over its ranks of the consecutive layers that fit in
 * (memory - layer-independent needs) wherever they start (weights, KV cache and recurrent state
 * differ by layer kind), so that any split within the caps fits. */
static int stage_cap(const plan_t *p, const plan_opts_t *o, int r0, int r1)
{
	int cap = p->model.n_layers;
	for (int r = r0; r < r1; r++) {
		const plan_rank_t *k = &p->ranks[r];
		uint64_t fixed = plan_rank_fixed_bytes(p, o, k);
		if (k->mem_avail <= fixed)
			return 0;
		cap = MIN(cap, plan_rank_layer_cap(p, k, k->mem_avail - fixed));
	}
	return cap;
}

/* Balanced: moves single layers from the stage that takes longest (its layers plus its fixed
 * time: the head on stage 0, the hop out) to the one that takes least, while that shortens the
 * longest; in-flight micro-batches then keep every stage equally busy. */
static void layers_even(int S, int *cnt, const int *cap, const uint64_t *t, const uint64_t *fix)
{
	for (int it = 0; it < 64 * PLAN_MAX_NODES; it++) {
		int a = 0, b = -1;
		for (int s = 1; s < S; s++)
			if ((uint64_t)cnt[s] * t[s] + fix[s] > (uint64_t)cnt[a] * t[a] + fix[a])
				a = s;
		for (int s = 0; s < S; s++)
			if (s != a && cnt[s] < cap[s] &&
			    (b < 0 ||
			     (uint64_t)cnt[s] * t[s] + fix[s] < (uint64_t)cnt[b] * t[b] + fix[b]))
				b = s;
		if (b < 0 || cnt[a] <= 1 ||
		    (uint64_t)(cnt[b] + 1) * t[b] + fix[b] >= (uint64_t)cnt[a] * t[a] + fix[a])
			return;
		cnt[a]--, cnt[b]++;
	}
}

/* Layers per stage: at least one each, within the caps; balanced (in proportion to each
 * stage's speed, water-filled against the caps, then evened out) or fill (the fastest stages
 * first). */
static int layers_split(const plan_cost_ctx_t *c, const plan_layout_t *l, const plan_t *p,
			const plan_opts_t *o, int *cnt)
{
	int S = l->n_stages, L = p->model.n_layers, cap[PLAN_MAX_NODES], sum = 0;
	uint64_t t[PLAN_MAX_NODES], fix[PLAN_MAX_NODES];
	if (L < S)
		return -1;
	for (int s = 0; s < S; s++) {
		int r0, r1;
		stage_range(l, s, &r0, &r1);
		cap[s] = stage_cap(p, o, r0, r1);
		t[s] = plan_cost_stage_layer_ns(c, l, p, r0, r1);
		fix[s] = plan_cost_stage_fixed_ns(c, l, p, s);
		if (cap[s] < 1)
			return -1;
		sum += cap[s];
		if (sum >= L)
			sum = L; /* no overflow; enough is enough */
	}
	if (sum < L)
		return -1;
	if (l->fill) {
		int left = L - S, done[PLAN_MAX_NODES] = {0};
		for (int s = 0; s < S; s++)
			cnt[s] = 1;
		for (int it = 0; it < S && left; it++) {
			int f = -1;
			for (int s = 0; s < S; s++)
				if (!done[s] && (f < 0 || t[s] < t[f]))
					f = s;
			done[f] = 1;
			int more = MIN(cap[f] - 1, left);
			cnt[f] += more, left -= more;
		}
		return left ? -1 : 0;
	}
	int fixed[PLAN_MAX_NODES] = {0}, left = L;
	for (;;) {
		int fi[PLAN_MAX_NODES], nf = 0, tmp[PLAN_MAX_NODES], over = 0;
		uint64_t w[PLAN_MAX_NODES];
		for (int s = 0; s < S; s++)
			if (!fixed[s])
				w[nf] = 1000000000000000000ULL / t[s], fi[nf++] = s;
		if (!nf)
			return left ? -1 : 0;
		if (left < nf)
			return -1;
		plan_split(tmp, nf, left, 1, w);
		for (int q = 0; q < nf; q++)
			if (tmp[q] > cap[fi[q]]) {
				fixed[fi[q]] = 1;
				cnt[fi[q]] = cap[fi[q]];
				left -= cap[fi[q]];
				over = 1;
			}
		if (!over) {
			for (int q = 0; q < nf; q++)
				cnt[fi[q]] = tmp[q];
			layers_even(S, cnt, cap, t, fix);
			return 0;
		}
	}
}

int plan_layout_fill(const plan_cost_ctx_t *c, const plan_layout_t *l, plan_t *p,
		     const plan_opts_t *o)
{
	const plan_model_t *m = &p->model;
	int n = l->n, S = l->n_stages;
	p->n_ranks = n;
	p->n_stages = S;
	p->strategy = l->strategy;
	p->q8_wire = l->q8;
	uint64_t w[2][PLAN_MAX_NODES];
	for (int s = 0; s < S; s++) {
		int r0, r1;
		stage_range(l, s, &r0, &r1);
		for (int r = r0; r < r1; r++) {
			plan_rank_t *k = &p->ranks[r];
			k->stage = s, k->stage0 = r0, k->stage1 = r1;
			k->layer0 = 0, k->layer1 = m->n_layers;
			uint64_t h = plan_headroom(o, k->mem_avail);
			w[0][r] = MAX(plan_cost_bw(c, l->idx[r]), 1);
			w[1][r] = ((k->mem_avail > h ? k->mem_avail - h : 0) >> 20) + 1;
		}
	}
	/* shares by decode rate (every rank of a group done at once); by memory if those do
	 * not fit (a fast node with little memory) */
	for (int a = 0; a < 2; a++) {
		int cnt[PLAN_MAX_NODES];
		for (int s = 0; s < S; s++) {
			int r0, r1;
			stage_range(l, s, &r0, &r1);
			plan_slices_fill(p, r0, r1, w[a]);
		}
		if (S == 1)
			cnt[0] = m->n_layers;
		else if (layers_split(c, l, p, o, cnt))
			continue;
		plan_layers_set(p, cnt);
		if (!plan_fit_check(p, o, NULL, 0))
			return 0;
	}
	return SH_ENOFIT;
}

/* ---- evaluating and keeping candidates ---- */

/* Fills the scratch plan for layout l: 0, or -1 when it does not fit. */
static int fill(search_t *s, const plan_layout_t *l)
{
	plan_t *p = s->p;
	for (int r = 0; r < l->n; r++) {
		plan_rank_t *x = &p->ranks[r]; /* only what filling reads (a rank is ~5 KB) */
		x->rank = r;
		x->mem_avail = s->nodes[l->idx[r]]->mem_avail;
	}
	return plan_layout_fill(s->c, l, p, s->o) ? -1 : 0;
}

/* Could a candidate of this decode time enter any record it is offered to? (keep() takes only
 * strictly better ones, and decode decides first: a slower one never does.) */
static int could_matter(const search_t *s, const plan_layout_t *l, uint64_t decode)
{
	int cls = class_of(l);
#define OPEN(b) (!(b).have || decode <= (b).k.decode_ns)
	if (OPEN(s->cls[cls]) || (cls != CLS_SINGLE && mask_of(l) == s->multi && OPEN(s->all[cls])))
		return 1;
	if (!eligible(s, l))
		return 0;
	if (OPEN(s->chosen))
		return 1;
	for (int r = 0; r < l->n; r++)
		if (OPEN(s->with[l->idx[r]]))
			return 1;
	return 0;
#undef OPEN
}

static void record(search_t *s, const plan_layout_t *l, const plan_cost_t *k)
{
	int cls = class_of(l);
	keep(&s->cls[cls], l, k);
	if (cls != CLS_SINGLE && mask_of(l) == s->multi)
		keep(&s->all[cls], l, k);
	if (!eligible(s, l))
		return;
	keep(&s->chosen, l, k);
	for (int r = 0; r < l->n; r++)
		keep(&s->with[l->idx[r]], l, k);
}

/* Evaluates a layout's variants (layers balanced or filled; the 8-bit wire) and records
 * those that fit. The full prediction only for one that may be kept. */
static void offer(search_t *s, plan_layout_t *l)
{
	int group = 0;
	for (int st = 0; st < l->n_stages; st++) {
		int r0, r1;
		stage_range(l, st, &r0, &r1);
		group |= r1 - r0 >= 2;
	}
	for (int f = 0; f < (l->n_stages > 1 ? 2 : 1); f++) {
		l->fill = f, l->q8 = 0;
		if (fill(s, l))
			continue;
		uint64_t d =
		    plan_cost_decode_ns(s->c, l, s->p); /* the wire does not change shares */
		if (group) {
			l->q8 = 1;
			uint64_t d8 = plan_cost_decode_ns(s->c, l, s->p);
			if ((unsigned __int128)d8 * 1000 <= (unsigned __int128)d * PLAN_Q8_PERMILLE)
				d = d8;
			else
				l->q8 = 0;
		}
		if (!could_matter(s, l, d))
			continue;
		plan_cost_t k;
		plan_cost_predict(s->c, l, s->p, &k);
		record(s, l, &k);
	}
}

/* ---- tours: the ring order of stages ---- */

static void tour_dfs(search_t *s, int depth, int K, uint64_t cost)
{
	if (cost >= s->tcost)
		return;
	if (depth == K) {
		uint64_t total = cost + s->cm[s->path[K - 1]][0];
		if (total < s->tcost) {
			s->tcost = total;
			memcpy(s->tbest, s->path, sizeof(int) * (size_t)K);
		}
		return;
	}
	for (int b = 1; b < K; b++) {
		if (s->used[b])
			continue;
		s->used[b] = 1;
		s->path[depth] = b;
		tour_dfs(s, depth + 1, K, cost + s->cm[s->path[depth - 1]][b]);
		s->used[b] = 0;
	}
}

/* The order of K items (item 0 first) that makes the cheapest ring under s->cm: every order
 * up to PLAN_EXHAUSTIVE items, nearest neighbour above. Writes it into s->tbest. */
static void tour(search_t *s, int K)
{
	s->tbest[0] = s->path[0] = 0;
	if (K <= PLAN_EXHAUSTIVE) {
		memset(s->used, 0, sizeof s->used);
		s->used[0] = 1;
		s->tcost = UINT64_MAX;
		tour_dfs(s, 1, K, 0);
		return;
	}
	int used[PLAN_MAX_NODES] = {1};
	for (int d = 1; d < K; d++) {
		int last = s->tbest[d - 1], pick = -1;
		for (int b = 1; b < K; b++)
			if (!used[b] && (pick < 0 || s->cm[last][b] < s->cm[last][pick]))
				pick = b;
		used[pick] = 1;
		s->tbest[d] = pick;
	}
}

/* A hop of the decode's hidden state (dim floats) from node i to node j. */
static uint64_t hop_ns(const search_t *s, int i, int j)
{
	return plan_cost_lat(s->c, i, j) + plan_cost_xfer(s->c, i, j, 4 * (uint64_t)s->m->dim);
}

/* ---- layouts ---- */

static void offer_single(search_t *s, int i)
{
	plan_layout_t l = {.strategy = PLAN_TENSOR, .n = 1, .n_stages = 1};
	l.idx[0] = i;
	l.stage_end[0] = 1;
	offer(s, &l);
}

static void offer_tensor(search_t *s, const int *mem, int k)
{
	int blocks = (s->m->ffn + s->m->ffn_block - 1) / s->m->ffn_block;
	if (k > s->m->n_heads || k > blocks)
		return;
	plan_layout_t l = {.strategy = PLAN_TENSOR, .n = k, .n_stages = 1};
	memcpy(l.idx, mem, sizeof(int) * (size_t)k);
	plan_ring_order_kinds(l.idx, k, (const uint8_t(*)[PLAN_MAX_NODES])s->kind); /* MLX's ring */
	l.stage_end[0] = k;
	offer(s, &l);
}

static void offer_pipeline(search_t *s, const int *mem, int k)
{
	if (k > s->m->n_layers)
		return;
	for (int a = 0; a < k; a++)
		for (int b = 0; b < k; b++)
			s->cm[a][b] = a == b ? 0 : hop_ns(s, mem[a], mem[b]);
	tour(s, k);
	plan_layout_t l = {.strategy = PLAN_PIPELINE, .n = k, .n_stages = k};
	for (int r = 0; r < k; r++) {
		l.idx[r] = mem[s->tbest[r]];
		l.stage_end[r] = r + 1;
	}
	offer(s, &l);
}

/* Groups given as a label per member (label = a member position); group 0 holds mem[0]. */
static void offer_hybrid(search_t *s, const int *mem, int k, const int *label)
{
	int blocks = (s->m->ffn + s->m->ffn_block - 1) / s->m->ffn_block;
	int G = 0, gl[PLAN_MAX_NODES], gsize[PLAN_MAX_NODES] = {0};
	int gmem[PLAN_MAX_NODES][PLAN_MAX_NODES];
	for (int j = 0; j < k; j++) {
		int g = 0;
		while (g < G && gl[g] != label[j])
			g++;
		if (g == G)
			gl[G++] = label[j];
		gmem[g][gsize[g]++] = mem[j];
	}
	if (G < 2 || G >= k || G > s->m->n_layers)
		return;
	for (int g = 0; g < G; g++)
		if (gsize[g] > s->m->n_heads || gsize[g] > blocks)
			return;
	/* ring of stages: the root of A sends to every rank of B; the last stage to rank 0 */
	for (int a = 0; a < G; a++)
		for (int b = 0; b < G; b++) {
			uint64_t lat = 0, x = 0;
			int root = gmem[a][0], nb = b ? gsize[b] : 1;
			for (int q = 0; a != b && q < nb; q++) {
				int j = gmem[b][q];
				lat = MAX(lat, plan_cost_lat(s->c, root, j));
				x += plan_cost_xfer(s->c, root, j, 4 * (uint64_t)s->m->dim);
			}
			s->cm[a][b] = lat + x;
		}
	tour(s, G);
	plan_layout_t l = {.strategy = PLAN_HYBRID, .n = k, .n_stages = G};
	int r = 0;
	for (int st = 0; st < G; st++) {
		int g = s->tbest[st];
		for (int q = 0; q < gsize[g]; q++)
			l.idx[r++] = gmem[g][q];
		l.stage_end[st] = r;
	}
	offer(s, &l);
}

typedef struct {
	uint64_t cost;
	int a, b;
} edge_t;

static int cmp_edge(const void *x, const void *y)
{
	const edge_t *e = x, *f = y;
	if (e->cost != f->cost)
		return e->cost < f->cost ? -1 : 1;
	if (e->a != f->a)
		return e->a - f->a;
	return e->b - f->b;
}

static int uf_find(int *par, int x)
{
	while (par[x] != x)
		x = par[x] = par[par[x]];
	return x;
}

/* Single-linkage clustering of mem[0..k) by hop cost (the cheapest links join first). Calls
 * back with each partition of 2..k-1 groups (labels per member), or, with clusters != NULL,
 * collects the member masks of the groups it forms. */
static void dendrogram(search_t *s, const int *mem, int k, int hybrids, uint64_t *clusters,
		       int *n_clusters)
{
	edge_t *e = malloc(sizeof *e * (size_t)(k * (k - 1) / 2 + 1));
	if (!e)
		return;
	int ne = 0, par[PLAN_MAX_NODES], groups = k;
	for (int a = 0; a < k; a++) {
		par[a] = a;
		for (int b = a + 1; b < k; b++)
			if (plan_cost_pair_ok(s->c, mem[a], mem[b]))
				e[ne++] = (edge_t){
				    MAX(hop_ns(s, mem[a], mem[b]), hop_ns(s, mem[b], mem[a])), a,
				    b};
	}
	qsort(e, (size_t)ne, sizeof *e, cmp_edge);
	for (int q = 0; q < ne && groups > 1; q++) {
		int x = uf_find(par, e[q].a), y = uf_find(par, e[q].b);
		if (x == y)
			continue;
		par[MAX(x, y)] = MIN(x, y);
		groups--;
		if (clusters && *n_clusters < PLAN_MAX_MASKS) {
			uint64_t m = 0;
			int root = MIN(x, y);
			for (int j = 0; j < k; j++)
				if (uf_find(par, j) == root)
					m |= 1ULL << mem[j];
			clusters[(*n_clusters)++] = m;
		}
		if (hybrids && groups >= 2 && groups < k) {
			int label[PLAN_MAX_NODES];
			for (int j = 0; j < k; j++)
				label[j] = uf_find(par, j);
			offer_hybrid(s, mem, k, label);
		}
	}
	free(e);
}

/* Every candidate over the nodes of mask (all measured to each other). */
static void offer_subset(search_t *s, uint64_t mask, int hybrids)
{
	int mem[PLAN_MAX_NODES], k = 0;
	for (int i = 0; i < s->n; i++)
		if (mask >> i & 1) {
			if ((s->linked[i] & mask) != mask)
				return;
			mem[k++] = i;
		}
	if (k < 2)
		return;
	offer_tensor(s, mem, k);
	offer_pipeline(s, mem, k);
	if (hybrids && k >= 3)
		dendrogram(s, mem, k, 1, NULL, NULL);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* More than PLAN_EXHAUSTIVE nodes: the clusters of the links (and every node together), each
 * with its hybrids, and their prefixes by decode rate (a slow node left out). */
static void offer_heuristic(search_t *s)
{
	uint64_t *masks = malloc(sizeof *masks * PLAN_MAX_MASKS);
	int mem[PLAN_MAX_NODES], k = 0, nm = 0;
	if (!masks)
		return;
	for (int i = 0; i < s->n; i++)
		if (s->multi >> i & 1)
			mem[k++] = i;
	masks[nm++] = s->multi;
	dendrogram(s, mem, k, 0, masks, &nm);
	int base = nm;
	qsort(masks, (size_t)nm, sizeof *masks, cmp_u64);
	for (int q = 0; q < base; q++) {
		if (q && masks[q] == masks[q - 1])
			continue;
		offer_subset(s, masks[q], 1);
	}
	for (int q = 0; q < base; q++) { /* prefixes by rate, fastest first (ties: lower id) */
		int order[PLAN_MAX_NODES], c = 0;
		for (int i = 0; i < s->n; i++)
			if (masks[q] >> i & 1)
				order[c++] = i;
		for (int a = 1; a < c; a++)
			for (int b = a; b > 0 && plan_cost_bw(s->c, order[b]) >
						     plan_cost_bw(s->c, order[b - 1]);
			     b--) {
				int t = order[b];
				order[b] = order[b - 1];
				order[b - 1] = t;
			}
		uint64_t m = 0;
		for (int j = 0; j < c - 1 && nm < PLAN_MAX_MASKS; j++) {
			m |= 1ULL << order[j];
			if (j)
				masks[nm++] = m;
		}
	}
	qsort(masks + base, (size_t)(nm - base), sizeof *masks, cmp_u64);
	for (int q = base; q < nm; q++)
		if (q == base || masks[q] != masks[q - 1])
			offer_subset(s, masks[q], 0);
	free(masks);
}

/* ---- the result ---- */

static uint64_t dtok(uint64_t ns)
{
	return (10000000000ULL + ns / 2) / MAX(ns, 1);
}

void plan_pred_fill(plan_pred_t *d, const char *what, const plan_layout_t *l, const plan_cost_t *k,
		    const plan_node_t *const *nodes, int parallel, const plan_model_t *m)
{
	(void)m;
	memset(d, 0, sizeof *d);
	snprintf(d->what, sizeof d->what, "%s", what);
	int cls = class_of(l);
	snprintf(d->strategy, sizeof d->strategy, "%s",
		 cls == CLS_SINGLE ? "single" : plan_strategy_name(l->strategy));
	d->n_ranks = l->n, d->n_stages = l->n_stages, d->q8_wire = l->q8;
	for (int st = 0; st < l->n_stages; st++)
		d->stage_size[st] = l->stage_end[st] - (st ? l->stage_end[st - 1] : 0);
	for (int r = 0; r < l->n; r++)
		memcpy(d->node_ids[r], nodes[l->idx[r]]->node_id, PLAN_ID_LEN + 1);
	d->parallel = MAX(parallel, 1);
	d->decode_dtok = dtok(k->decode_ns);
	d->aggregate_dtok = (k->agg_mtoks + 50) / 100;
	d->prefill_dtok = (k->prefill_mtoks + 50) / 100;
	d->mem_max_bytes = k->mem_max;
	d->n_syncs = k->n_syncs, d->n_hops = k->n_hops;
	d->sync_us = k->n_syncs ? (k->sync_ns / (uint64_t)k->n_syncs + 500) / 1000 : 0;
	d->hop_us = k->n_hops ? (k->hop_ns / (uint64_t)k->n_hops + 500) / 1000 : 0;
}

/* "tensor over 3", "single node 3c6ef372", "hybrid over 4 (2+2)"; with the 8-bit wire. */
static void describe(const search_t *s, const plan_layout_t *l, char *buf, size_t len)
{
	int cls = class_of(l);
	if (cls == CLS_SINGLE) {
		snprintf(buf, len, "single node %.8s", s->nodes[l->idx[0]]->node_id);
		return;
	}
	int o = snprintf(buf, len, "%s over %d", plan_strategy_name(l->strategy), l->n);
	if (cls == CLS_HYBRID)
		for (int st = 0; st < l->n_stages && o > 0 && (size_t)o < len; st++)
			o += snprintf(buf + o, len - (size_t)o, "%s%d", st ? "+" : " (",
				      l->stage_end[st] - (st ? l->stage_end[st - 1] : 0));
	if (cls == CLS_HYBRID && o > 0 && (size_t)o < len)
		o += snprintf(buf + o, len - (size_t)o, ")");
	if (l->q8 && o > 0 && (size_t)o < len)
		snprintf(buf + o, len - (size_t)o, " with the 8-bit wire");
}

/* " (32 syncs at 0.40 ms, 2 hops at 0.10 ms)" or "" */
static void details(const plan_cost_t *k, char *buf, size_t len)
{
	buf[0] = 0;
	if (!k->n_syncs && !k->n_hops)
		return;
	int o = snprintf(buf, len, " (");
	if (k->n_syncs)
		o += snprintf(buf + o, len - (size_t)o, "%d syncs at %.2f ms", k->n_syncs,
			      (double)(k->sync_ns / (uint64_t)k->n_syncs) / 1e6);
	if (k->n_hops && o > 0 && (size_t)o < len)
		o += snprintf(buf + o, len - (size_t)o, "%s%d hops at %.2f ms",
			      k->n_syncs ? ", " : "", k->n_hops,
			      (double)(k->hop_ns / (uint64_t)k->n_hops) / 1e6);
	if (o > 0 && (size_t)o < len)
		snprintf(buf + o, len - (size_t)o, ")");
}

static double tok_s(const plan_cost_t *k)
{
	return (double)dtok(k->decode_ns) / 10.0;
}

static void reason_write(const search_t *s, const best_t *ch, char *out, size_t len)
{
	char d[128], x[96];
	describe(s, &ch->l, d, sizeof d);
	details(&ch->k, x, sizeof x);
	int o;
	if (s->o->strategy != PLAN_AUTO)
		o = snprintf(out, len, "%s requested: %s predicts %.1f tok/s%s",
			     plan_strategy_name(s->o->strategy), d, tok_s(&ch->k), x);
	else
		o = snprintf(out, len, "%s: predicted %.1f tok/s%s", d, tok_s(&ch->k), x);
	/* the best of each other strategy (those the engine runs), and the chosen one's over
	 * every node when it leaves some out */
	int mine = class_of(&ch->l), first = 1;
	const best_t *alt[CLS_N + 1];
	int na = 0;
	for (int c = 0; c < CLS_N; c++)
		if (c != mine && s->cls[c].have && (c != CLS_HYBRID || s->o->engine_hybrid))
			alt[na++] = &s->cls[c];
	if (mine != CLS_SINGLE && s->all[mine].have && mask_of(&s->all[mine].l) != mask_of(&ch->l))
		alt[na++] = &s->all[mine];
	for (int q = 0; q < na && o > 0 && (size_t)o < len; q++) {
		if (s->o->strategy != PLAN_AUTO && !better(&alt[q]->l, &alt[q]->k, &ch->l, &ch->k))
			continue; /* forced: say only what would be faster */
		describe(s, &alt[q]->l, d, sizeof d);
		details(&alt[q]->k, x, sizeof x);
		o += snprintf(out + o, len - (size_t)o, "%s%s %.1f%s",
			      first ? (s->o->strategy != PLAN_AUTO ? "; faster: " : " vs ") : ", ",
			      d, tok_s(&alt[q]->k), x);
		first = 0;
	}
}

static int same_layout(const plan_layout_t *a, const plan_layout_t *b)
{
	if (a->strategy != b->strategy || a->n != b->n || a->n_stages != b->n_stages ||
	    a->q8 != b->q8 || a->fill != b->fill)
		return 0;
	return !memcmp(a->idx, b->idx, sizeof(int) * (size_t)a->n) &&
	       !memcmp(a->stage_end, b->stage_end, sizeof(int) * (size_t)a->n_stages);
}

static void cands_write(const search_t *s, plan_choice_t *out)
{
	struct {
		const char *what;
		const best_t *b;
	} list[1 + 2 * CLS_N];
	int nl = 0;
	list[nl++] = (typeof(list[0])){"chosen", &s->chosen};
	for (int c = 0; c < CLS_N; c++)
		list[nl++] = (typeof(list[0])){"best", &s->cls[c]};
	for (int c = CLS_TENSOR; c < CLS_N; c++)
		list[nl++] = (typeof(list[0])){"all", &s->all[c]};
	const plan_layout_t *seen[1 + 2 * CLS_N];
	out->n_cands = 0;
	for (int q = 0; q < nl && out->n_cands < PLAN_MAX_CANDS; q++) {
		const best_t *b = list[q].b;
		int dup = !b->have;
		for (int j = 0; !dup && j < out->n_cands; j++)
			dup = same_layout(seen[j], &b->l);
		if (dup)
			continue;
		seen[out->n_cands] = &b->l;
		plan_pred_fill(&out->cands[out->n_cands++], list[q].what, &b->l, &b->k, s->nodes,
			       s->o->parallel, s->m);
	}
}

static void standby_write(const search_t *s, plan_choice_t *out)
{
	uint64_t used = mask_of(&s->chosen.l);
	out->n_standby = 0;
	for (int i = 0; i < s->n; i++) {
		if (used >> i & 1)
			continue;
		plan_standby_t *b = &out->standby[out->n_standby++];
		const plan_node_t *a = s->nodes[i];
		memcpy(b->node_id, a->node_id, sizeof b->node_id);
		snprintf(b->host, sizeof b->host, "%s", a->host);
		int missing = -1;
		for (int j = 0; j < s->n && missing < 0; j++)
			if ((used >> j & 1) && !plan_cost_pair_ok(s->c, i, j))
				missing = j;
		char d[128];
		if (!plan_cost_bw(s->c, i))
			snprintf(b->reason, sizeof b->reason,
				 "not measured: no compute figure (bw) in the view");
		else if (!plan_node_has_ipv4(a))
			snprintf(b->reason, sizeof b->reason, "no IPv4 address for the ring");
		else if (missing >= 0)
			snprintf(b->reason, sizeof b->reason,
				 "not measured: no link figure to %.8s",
				 s->nodes[missing]->node_id);
		else if (s->with[i].have && s->with[i].k.decode_ns > s->chosen.k.decode_ns) {
			describe(s, &s->with[i].l, d, sizeof d);
			snprintf(b->reason, sizeof b->reason,
				 "slower with it: the best plan using it (%s) predicts %.1f tok/s, "
				 "this one %.1f",
				 d, tok_s(&s->with[i].k), tok_s(&s->chosen.k));
		} else if (s->with[i].have) { /* as fast (e.g. a twin of the node chosen) */
			describe(s, &s->with[i].l, d, sizeof d);
			snprintf(
			    b->reason, sizeof b->reason,
			    "not needed: the best plan using it (%s) is no faster (%.1f tok/s)", d,
			    tok_s(&s->with[i].k));
		} else
			snprintf(b->reason, sizeof b->reason,
				 "no plan using it fits (its memory, or the model's shape)");
	}
}

int plan_search(plan_choice_t *out, const plan_cost_ctx_t *c, const plan_node_t *const *nodes,
		int n, const plan_model_t *m, const plan_opts_t *o, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	search_t *s = calloc(1, sizeof *s);
	plan_t *p = calloc(1, sizeof *p);
	plan_rank_t *ranks = calloc(PLAN_MAX_NODES, sizeof *ranks);
	int rc = 0;
	if (!s || !p || !ranks) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto done;
	}
	p->ranks = ranks;
	p->model = *m;
	p->ctx = o->ctx ? o->ctx : m->n_ctx;
	p->kv_bytes = o->kv_bytes ? o->kv_bytes : 4;
	p->slots = MAX(o->slots, 1);
	p->kv_block = MAX(o->kv_block, 1);
	s->c = c, s->nodes = nodes, s->n = n, s->m = m, s->o = o, s->p = p;
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < n; j++)
			s->kind[i][j] = i == j ? 0 : (uint8_t)plan_pair_link(nodes[i], nodes[j]);
		s->linked[i] = 1ULL << i;
		for (int j = 0; j < n; j++)
			if (j != i && plan_cost_pair_ok(c, i, j))
				s->linked[i] |= 1ULL << j;
		if (plan_cost_bw(c, i) && plan_node_has_ipv4(nodes[i]))
			s->multi |= 1ULL << i;
	}
	for (int i = 0; i < n; i++)
		if (plan_cost_bw(c, i))
			offer_single(s, i);
	if (popcount64(s->multi) <= PLAN_EXHAUSTIVE) {
		/* every subset of two or more (bit b of q: the b-th usable node) */
		uint64_t all = s->multi;
		for (uint64_t q = 1; q < (1ULL << popcount64(all)); q++) {
			uint64_t mask = 0, bits = all;
			for (int b = 0; bits; b++, bits &= bits - 1)
				if (q >> b & 1)
					mask |= bits & -bits;
			if (popcount64(mask) >= 2)
				offer_subset(s, mask, 1);
		}
	} else {
		offer_heuristic(s);
	}
	if (!s->chosen.have && o->strategy == PLAN_HYBRID) {
		rc = sh_fail(err, errlen, SH_EINVAL,
			     "hybrid is impossible: no arrangement of the measured nodes in two or "
			     "more stages, one a tensor group, fits");
		goto done;
	}
	if (!s->chosen.have && o->strategy != PLAN_AUTO && s->cls[CLS_SINGLE].have) {
		s->chosen = s->cls[CLS_SINGLE]; /* one node: tensor and pipeline are the same */
		s->chosen.l.strategy = o->strategy;
	}
	if (!s->chosen.have) {
		rc = SH_ENOFIT;
		goto done;
	}
	out->layout = s->chosen.l;
	out->cost = s->chosen.k;
	reason_write(s, &s->chosen, out->reason, sizeof out->reason);
	cands_write(s, out);
	standby_write(s, out);
done:
	free(ranks);
	free(p);
	free(s);
	return rc;
}
