/*
 * cost.c: the cost model. From the view's measurements (each node's decode and prefill kernel
 * rates, threads, cores and machine; each pair's round trip and throughput) and the model's
 * bytes and shapes, it predicts what a candidate plan does per token: the compute of its
 * slowest rank per layer, the all-reduces its tensor groups run (the transport's own paths,
 * transport/coll.c), the hidden state's hops between stages (infer/tp.c's hook_pipe), the
 * STEP broadcast and rank 0's head. Every figure is an input measured on the cluster; the few
 * fixed costs it must assume are named where they are used (PLAN_WAKE_US, the midpoint of a
 * link's median and p90, the transport's 64 KiB direct path).
 *
 * What one decode step costs (docs/view.md section 7 writes it out):
 *   step  = bcast + sum over stages [layers x (att + ffn) + syncs] + hops + head
 *   att, ffn: the slowest rank of the stage streaming its slice of that block
 *             (max(bytes / bw, B x bytes / prefill_bw): memory- or compute-bound)
 *   syncs:    2 per layer in a group of >= 2: all-reduces, the stage's last one a reduce to its
 *             root; each max(network time, wake) where wake > 0 only when ranks of the group
 *             share a machine whose cores their threads fill
 *   hops:     one per stage when there are >= 2: the root sends x[B][dim] (f32) to every rank of
 *             the next stage; the last stage's root to rank 0; at least the wake when sender
 *             and receiver share a machine whose cores the plan's threads fill (the receiver,
 *             asleep in poll, waits for a core as a woken rank in a sync does)
 *   bcast:    rank 0's STEP reaches the other ranks of stage 0 (a tensor group waits for it)
 *   head:     rank 0 streams the output matrix for its B rows
 *
 * Invariant: integer arithmetic only (nanoseconds, bytes, MB/s, Mbit/s), so every machine
 * predicts the same figures and picks the same plan.
 */
#include "planner/plan_int.h"

#include "common/common.h"

#include <stdlib.h>
#include <string.h>

/* The transport's all-reduce takes its one-exchange (N = 2) or two-exchange (N >= 3) paths up
 * to this many bytes and the ring above (transport/group.c: g->direct_max = 64 KiB). */
#define PLAN_DIRECT_MAX (64u * 1024)
/* Bytes of the lock-step STEP message (infer/tp.c: DIST_HDR_BYTES) and of each BATCH entry
 * that follows it when a step has more than two (DIST_BATCH_ENTRY). */
#define PLAN_STEP_BYTES  64
#define PLAN_ENTRY_BYTES 16
/* Tokens per forward pass of a prompt (infer/model/model.h: MODEL_MAX_BATCH). */
#define PLAN_PREFILL_ROWS 64

struct plan_cost_ctx {
	const plan_model_t *m;
	const plan_opts_t *o;
	int n;
	uint32_t bw[PLAN_MAX_NODES], pf[PLAN_MAX_NODES]; /* MB/s; 0 = not measured */
	int threads[PLAN_MAX_NODES], cores[PLAN_MAX_NODES];
	int mach[PLAN_MAX_NODES]; /* index of the first node on the same machine (itself if none) */
	uint64_t wake_ns[PLAN_MAX_NODES];
	uint64_t lat[PLAN_MAX_NODES][PLAN_MAX_NODES];  /* one-way ns */
	uint32_t mbps[PLAN_MAX_NODES][PLAN_MAX_NODES]; /* 0 = not measured */
	int any_bw, any_link;
};

static uint64_t div_up128(unsigned __int128 a, uint64_t b)
{
	unsigned __int128 x = (a + b - 1) / b;
	return x > UINT64_MAX ? UINT64_MAX : (uint64_t)x;
}

/* Node a's measurement towards b's id, or NULL (linear: a view's arrays may be unsorted). */
static const plan_meas_t *meas_of(const plan_node_t *a, const char *peer)
{
	for (size_t i = 0; i < a->n_links; i++)
		if (!strcmp(a->links[i].node_id, peer))
			return &a->links[i];
	return NULL;
}

plan_cost_ctx_t *plan_cost_ctx_new(const plan_node_t *const *nodes, int n, const plan_model_t *m,
				   const plan_opts_t *o)
{
	plan_cost_ctx_t *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->m = m, c->o = o, c->n = n;
	for (int i = 0; i < n; i++) {
		const plan_node_t *a = nodes[i];
		c->bw[i] = a->bw_mbs;
		c->pf[i] = a->prefill_mbs ? a->prefill_mbs : a->bw_mbs;
		c->cores[i] = a->cores;
		c->threads[i] = a->threads ? a->threads : a->cores;
		c->wake_ns[i] = (uint64_t)(a->wake_us ? a->wake_us : PLAN_WAKE_US) * 1000;
		c->mach[i] = i;
		for (int j = 0; j < i && a->machine[0]; j++)
			if (c->mach[j] == j && !strcmp(nodes[j]->machine, a->machine)) {
				c->mach[i] = j;
				break;
			}
		c->any_bw |= a->bw_mbs > 0;
	}
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++) {
			const plan_meas_t *x = meas_of(nodes[i], nodes[j]->node_id);
			const plan_meas_t *y = meas_of(nodes[j], nodes[i]->node_id);
			if (!x && !y)
				continue;
			/* both ends measured: the worse figures count (a slow leg slows the pair)
			 */
			uint64_t rtt = 0, p90 = 0;
			uint32_t mbps = UINT32_MAX;
			for (int d = 0; d < 2; d++) {
				const plan_meas_t *e = d ? y : x;
				if (!e)
					continue;
				rtt = MAX(rtt, e->rtt_us);
				p90 = MAX(p90, e->rtt_p90_us ? e->rtt_p90_us : e->rtt_us);
				mbps = MIN(mbps, e->mbps);
			}
			if (!rtt || !mbps)
				continue;
			/* One message costs half a round trip (the probes ride the authenticated
			 * channel, so its framing, sealing and wake-ups are in it). A step sums
			 * dozens of messages, so their mean counts; for a right-skewed delay it
			 * lies between median and p90: their midpoint is the estimate. */
			c->lat[i][j] = c->lat[j][i] = (rtt + MAX(p90, rtt)) * 1000 / 4;
			c->mbps[i][j] = c->mbps[j][i] = mbps;
			c->any_link = 1;
		}
	return c;
}

void plan_cost_ctx_free(plan_cost_ctx_t *c)
{
	free(c);
}

int plan_cost_ctx_measured(const plan_cost_ctx_t *c)
{
	return c->any_bw && (c->n == 1 || c->any_link);
}

uint32_t plan_cost_bw(const plan_cost_ctx_t *c, int i)
{
	return c->bw[i];
}

int plan_cost_pair_ok(const plan_cost_ctx_t *c, int i, int j)
{
	return i == j || c->mbps[i][j] > 0;
}

uint64_t plan_cost_lat(const plan_cost_ctx_t *c, int i, int j)
{
	return i == j ? 0 : c->lat[i][j];
}

uint64_t plan_cost_xfer(const plan_cost_ctx_t *c, int i, int j, uint64_t bytes)
{
	if (i == j || !bytes)
		return 0;
	/* bytes x 8 bits / (Mbit/s x 1e6) s = bytes x 8000 / mbps ns */
	return div_up128((unsigned __int128)bytes * 8000, c->mbps[i][j] ? c->mbps[i][j] : 1);
}

/* Time for node i to stream `bytes` of weights for B rows: bound by memory (the decode rate)
 * or by arithmetic (the 64-row rate, B rows' worth), whichever is slower. MB/s = bytes/us. */
static uint64_t compute_ns(const plan_cost_ctx_t *c, int i, uint64_t bytes, int B)
{
	if (!bytes)
		return 0;
	uint64_t mem = div_up128((unsigned __int128)bytes * 1000, c->bw[i] ? c->bw[i] : 1);
	uint64_t ari =
	    div_up128((unsigned __int128)bytes * 1000 * (unsigned)B, c->pf[i] ? c->pf[i] : 1);
	return MAX(mem, ari);
}

/* Node of rank r of layout l. */
static int node_at(const plan_layout_t *l, int r)
{
	return l->idx[r];
}

static void stage_range(const plan_layout_t *l, int s, int *r0, int *r1)
{
	*r0 = s ? l->stage_end[s - 1] : 0;
	*r1 = l->stage_end[s];
}

/* Ranks [r0, r1) compute at once. Per rank: its compute slowdown (permille) when the group's
 * threads on its machine outnumber the cores; and whether any machine holds >= 2 of them with
 * its cores filled (then a rank woken in a sync waits for a core: the wake cost). */
static int group_crowding(const plan_cost_ctx_t *c, const plan_layout_t *l, int r0, int r1,
			  uint64_t *permille, uint64_t *wake)
{
	int crowded = 0;
	*wake = 0;
	for (int r = r0; r < r1; r++) {
		int i = node_at(l, r), same = 0, threads = 0, cores = c->cores[i];
		for (int q = r0; q < r1; q++) {
			int j = node_at(l, q);
			if (c->mach[j] == c->mach[i]) {
				same++;
				threads += c->threads[j];
				cores = MIN(cores, c->cores[j]);
			}
		}
		/* its rate was measured alone with its own threads: sharing the cores with the
		 * others' threads slows it by threads / max(own, cores) */
		int own = MAX(c->threads[i], cores);
		permille[r - r0] = same >= 2 && cores > 0 && threads > own
				       ? (uint64_t)threads * 1000 / (uint64_t)own
				       : 1000;
		if (same >= 2 && cores > 0 && threads >= cores) {
			crowded = 1;
			*wake = MAX(*wake, c->wake_ns[i]);
		}
	}
	return crowded;
}

/* Rank root sends `bytes` to every other rank of [d0, d1) (or receives that from each): its
 * sends leave one after another through its link, their latencies overlap. */
static uint64_t fan_ns(const plan_cost_ctx_t *c, const plan_layout_t *l, int root, int d0, int d1,
		       uint64_t bytes)
{
	uint64_t lat = 0, x = 0;
	for (int q = d0; q < d1; q++) {
		if (q == root)
			continue;
		lat = MAX(lat, plan_cost_lat(c, node_at(l, root), node_at(l, q)));
		x = plan_add_sat(x, plan_cost_xfer(c, node_at(l, root), node_at(l, q), bytes));
	}
	return plan_add_sat(lat, x);
}

/* One exchange in which every rank of [r0, r1) sends `chunk` bytes to every other: the
 * slowest rank's sends. */
static uint64_t exchange_ns(const plan_cost_ctx_t *c, const plan_layout_t *l, int r0, int r1,
			    uint64_t chunk)
{
	uint64_t worst = 0;
	for (int r = r0; r < r1; r++)
		worst = MAX(worst, fan_ns(c, l, r, r0, r1, chunk));
	return worst;
}

/* An all-reduce of n floats over ranks [r0, r1), as transport/coll.c and coll_q8.c run it. */
static uint64_t allreduce_ns(const plan_cost_ctx_t *c, const plan_layout_t *l, int r0, int r1,
			     uint64_t n)
{
	int g = r1 - r0;
	if (g < 2)
		return 0;
	if (l->q8) { /* 36 bytes per 32 floats; N = 2 one exchange, else two of a chunk each */
		uint64_t blocks = (n + 31) / 32;
		if (g == 2)
			return exchange_ns(c, l, r0, r1, blocks * 36);
		return plan_mul_sat(
		    2, exchange_ns(c, l, r0, r1, (blocks + (uint64_t)g - 1) / (uint64_t)g * 36));
	}
	uint64_t bytes = n * 4, chunk = (n + (uint64_t)g - 1) / (uint64_t)g * 4;
	if (bytes <= PLAN_DIRECT_MAX) /* direct (N = 2) or two-phase (N >= 3) */
		return g == 2 ? exchange_ns(c, l, r0, r1, bytes)
			      : plan_mul_sat(2, exchange_ns(c, l, r0, r1, chunk));
	/* ring: reduce-scatter and all-gather, 2 (N - 1) steps to the next rank */
	uint64_t step = 0;
	for (int r = r0; r < r1; r++) {
		int a = node_at(l, r), b = node_at(l, r + 1 < r1 ? r + 1 : r0);
		step =
		    MAX(step, plan_add_sat(plan_cost_lat(c, a, b), plan_cost_xfer(c, a, b, chunk)));
	}
	return plan_mul_sat(2 * (uint64_t)(g - 1), step);
}

/* The head's bytes: the output matrix, or the tied embedding it reuses (output_bytes is then
 * only the final norm, 4 x dim). */
static uint64_t head_bytes(const plan_model_t *m)
{
	uint64_t norm = 4 * (uint64_t)m->dim;
	return m->output_bytes > norm ? m->output_bytes
				      : plan_add_sat(m->output_bytes, m->embd_bytes);
}

typedef struct {
	uint64_t total;                 /* ns of one forward pass */
	uint64_t stage[PLAN_MAX_NODES]; /* stage s's part, its outgoing hop included */
	uint64_t sync_ns, hop_ns;
	int n_syncs, n_hops;
} pass_t;

/* The per-layer compute (slowest rank) and the two syncs of stage [r0, r1) for B rows. */
static void stage_layer(const plan_cost_ctx_t *c, const plan_layout_t *l, const plan_t *p, int r0,
			int r1, int B, uint64_t *compute, uint64_t *sync, uint64_t *root)
{
	uint64_t permille[PLAN_MAX_NODES], wake, t_att = 0, t_ffn = 0;
	int crowded = group_crowding(c, l, r0, r1, permille, &wake);
	for (int r = r0; r < r1; r++) {
		uint64_t att, ffn;
		plan_rank_layer_bytes(p, &p->ranks[r], 1, &att, &ffn);
		int i = node_at(l, r);
		t_att = MAX(t_att, plan_mul_sat(compute_ns(c, i, att, B), permille[r - r0]) / 1000);
		t_ffn = MAX(t_ffn, plan_mul_sat(compute_ns(c, i, ffn, B), permille[r - r0]) / 1000);
	}
	*compute = plan_add_sat(t_att, t_ffn);
	*sync = *root = 0;
	if (r1 - r0 < 2)
		return;
	uint64_t n = (uint64_t)B * (uint64_t)c->m->dim;
	/* A rank that waits in a sync while the group's threads fill its machine's cores is
	 * woken onto a busy core: the sync costs at least that wake (absorbed when the network
	 * takes longer: the other rank's message is still on the way). */
	uint64_t w = crowded ? wake : 0;
	*sync = MAX(allreduce_ns(c, l, r0, r1, n), w);
	*root = MAX(fan_ns(c, l, r0, r0, r1, n * 4), w); /* f32 partial sums to the root */
}

uint64_t plan_cost_stage_layer_ns(const plan_cost_ctx_t *c, const plan_layout_t *l, const plan_t *p,
				  int r0, int r1)
{
	uint64_t compute, sync, root;
	stage_layer(c, l, p, r0, r1, 1, &compute, &sync, &root);
	return MAX(compute + 2 * sync, 1);
}

uint64_t plan_cost_stage_fixed_ns(const plan_cost_ctx_t *c, const plan_layout_t *l, const plan_t *p,
				  int s)
{
	int r0, r1, d0 = 0, d1 = 1;
	stage_range(l, s, &r0, &r1);
	uint64_t t = 0;
	if (s == 0)
		t += compute_ns(c, node_at(l, 0), head_bytes(c->m), 1) +
		     fan_ns(c, l, 0, r0, r1, PLAN_STEP_BYTES);
	if (l->n_stages > 1) {
		if (s + 1 < l->n_stages)
			stage_range(l, s + 1, &d0, &d1);
		t += fan_ns(c, l, r0, d0, d1, 4 * (uint64_t)c->m->dim);
	}
	(void)p;
	return t;
}

/* The wake a hop from rank root to ranks [d0, d1) costs at least: the root's wake_ns when a
 * receiver shares its machine and the plan's threads on that machine fill its cores, else 0. */
static uint64_t hop_wake(const plan_cost_ctx_t *c, const plan_layout_t *l, int root, int d0, int d1)
{
	int i = node_at(l, root), near = 0, threads = 0, cores = c->cores[i];
	for (int r = d0; r < d1; r++)
		near |= c->mach[node_at(l, r)] == c->mach[i] && node_at(l, r) != i;
	for (int r = 0; r < l->n; r++) {
		int j = node_at(l, r);
		if (c->mach[j] == c->mach[i]) {
			threads += c->threads[j];
			cores = MIN(cores, c->cores[j]);
		}
	}
	return near && cores > 0 && threads >= cores ? c->wake_ns[i] : 0;
}

/* One forward pass of B rows through plan p laid out as l; the head for head_rows rows. */
static void pass_time(const plan_cost_ctx_t *c, const plan_layout_t *l, const plan_t *p, int B,
		      int head_rows, pass_t *o)
{
	memset(o, 0, sizeof *o);
	uint64_t xbytes = (uint64_t)B * (uint64_t)c->m->dim * 4;
	int S = l->n_stages;
	for (int s = 0; s < S; s++) {
		int r0, r1;
		stage_range(l, s, &r0, &r1);
		uint64_t layers = (uint64_t)(p->ranks[r0].layer1 - p->ranks[r0].layer0);
		uint64_t compute, sync, root;
		stage_layer(c, l, p, r0, r1, B, &compute, &sync, &root);
		uint64_t st = plan_mul_sat(layers, compute); /* hostile figures saturate */
		if (r1 - r0 >= 2 && layers) {
			uint64_t syncs = plan_add_sat(plan_mul_sat(2 * layers - 1, sync), root);
			st = plan_add_sat(st, syncs);
			o->sync_ns = plan_add_sat(o->sync_ns, syncs);
			o->n_syncs += (int)(2 * layers);
		}
		if (S > 1) { /* to every rank of the next stage; from the last, to rank 0 */
			int d0 = 0, d1 = 1;
			if (s + 1 < S)
				stage_range(l, s + 1, &d0, &d1);
			uint64_t hop =
			    MAX(fan_ns(c, l, r0, d0, d1, xbytes), hop_wake(c, l, r0, d0, d1));
			st = plan_add_sat(st, hop);
			o->hop_ns = plan_add_sat(o->hop_ns, hop);
			o->n_hops++;
		}
		o->stage[s] = st;
		o->total = plan_add_sat(o->total, st);
	}
	/* the STEP (BATCH: entries follow when more than two) reaches stage 0's other ranks
	 * before they start; later stages have it long before their input arrives */
	int r0, r1;
	stage_range(l, 0, &r0, &r1);
	uint64_t msg = PLAN_STEP_BYTES + (B > 2 ? (uint64_t)B * PLAN_ENTRY_BYTES : 0);
	uint64_t bcast = fan_ns(c, l, 0, r0, r1, msg);
	uint64_t head = compute_ns(c, node_at(l, 0), head_bytes(c->m), head_rows);
	o->stage[0] = plan_add_sat(o->stage[0], plan_add_sat(bcast, head));
	o->total = plan_add_sat(o->total, plan_add_sat(bcast, head));
	o->total = MAX(o->total, 1);
}

uint64_t plan_cost_decode_ns(const plan_cost_ctx_t *c, const plan_layout_t *l, const plan_t *p)
{
	pass_t d;
	pass_time(c, l, p, 1, 1, &d);
	return d.total;
}

void plan_cost_predict(const plan_cost_ctx_t *c, const plan_layout_t *l, const plan_t *p,
		       plan_cost_t *out)
{
	memset(out, 0, sizeof *out);
	pass_t d;
	pass_time(c, l, p, 1, 1, &d);
	out->decode_ns = d.total;
	out->n_syncs = d.n_syncs, out->sync_ns = d.sync_ns;
	out->n_hops = d.n_hops, out->hop_ns = d.hop_ns;
	/* N streams: one batch of N rows per step; a pipeline that runs micro-batches in flight
	 * keeps m = min(N, stages) of them moving round the ring: the step is then bound by the
	 * ring's round (each micro-batch needs its sampled token back) or the busiest stage. */
	int N = MAX(c->o->parallel, 1), S = l->n_stages;
	if (c->o->engine_inflight && S > 1 && N > 1) {
		int m = MIN(N, S), b = (N + m - 1) / m;
		pass_t q;
		pass_time(c, l, p, b, b, &q);
		uint64_t busiest = 0;
		for (int s = 0; s < S; s++)
			busiest = MAX(busiest, q.stage[s]);
		uint64_t per = MAX((q.total + (uint64_t)m - 1) / (uint64_t)m, busiest);
		out->agg_mtoks = (uint64_t)b * 1000000000000ULL / MAX(per, 1);
	} else {
		pass_t q;
		pass_time(c, l, p, N, N, &q);
		out->agg_mtoks = (uint64_t)N * 1000000000000ULL / q.total;
	}
	pass_t f; /* a prompt: passes of 64 rows, the head on its last row only */
	pass_time(c, l, p, PLAN_PREFILL_ROWS, 1, &f);
	out->prefill_mtoks = (uint64_t)PLAN_PREFILL_ROWS * 1000000000000ULL / f.total;
	for (int r = 0; r < p->n_ranks; r++) {
		const plan_rank_t *k = &p->ranks[r];
		out->mem_max =
		    MAX(out->mem_max, plan_add_sat(plan_add_sat(k->weight_bytes, k->kv_cache_bytes),
						   plan_add_sat(k->rs_bytes, k->act_bytes)));
	}
}
