/*
 * test_plan_cost.c: the cost model and the search on simulated clusters (planner/cost.c,
 * planner/search.c): predictions against hand-computed figures and against the figures issue 26
 * measured in the latency lab, the choice flipping from tensor to pipeline as latency grows, a
 * slow or far node left standby, hybrid for two fast pairs joined by a slow link, subsets never
 * slower, shuffled views giving byte-identical plans, plan.json round trips of every strategy.
 */
#include "planner/plan_int.h"

#include "common/common.h"
#include "harness.h"

#include <jansson.h>

#define GIB  ((uint64_t)1 << 30)
#define MAXN 8

/* One simulated node. */
typedef struct {
	double bw, pf; /* GB/s: decode and 64-row kernel rates (pf 0: absent) */
	int threads, cores;
	const char *machine; /* NULL: its own */
	uint64_t mem;        /* bytes */
} nd_t;

/* The links: rtt/p90 in us, mbps; 0 rtt = not measured. */
typedef struct {
	uint32_t rtt[MAXN][MAXN], p90[MAXN][MAXN], mbps[MAXN][MAXN];
} links_t;

static void node_id(char *out, int i)
{
	snprintf(out, PLAN_ID_LEN + 1, "%08x%024x", (unsigned)((i + 1) * 0x9e3779b9u), i);
}

static void links_all(links_t *l, int n, uint32_t rtt, uint32_t p90, uint32_t mbps)
{
	memset(l, 0, sizeof *l);
	for (int i = 0; i < n; i++)
		for (int j = 0; j < n; j++)
			if (i != j)
				l->rtt[i][j] = rtt, l->p90[i][j] = p90, l->mbps[i][j] = mbps;
}

static void link_set(links_t *l, int i, int j, uint32_t rtt, uint32_t mbps)
{
	l->rtt[i][j] = l->rtt[j][i] = rtt;
	l->p90[i][j] = l->p90[j][i] = rtt;
	l->mbps[i][j] = l->mbps[j][i] = mbps;
}

static unsigned lcg(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return *s >> 8;
}

/* A view JSON of n nodes on one Ethernet switch; node i has id node_id(ids[i]) (ids NULL: i).
 * both = 1: every link from both ends, else from the lower index only. perm != 0 shuffles
 * nodes and every node's links. */
static char *view_text(int n, const nd_t *nd, const int *ids, const links_t *lk, int both,
		       unsigned perm)
{
	json_t *nodes = json_array();
	for (int i = 0; i < n; i++) {
		char id[33], ip[32], host[32];
		node_id(id, ids ? ids[i] : i);
		snprintf(ip, sizeof ip, "10.0.0.%d", i + 1);
		snprintf(host, sizeof host, "host%d", i);
		json_t *links = json_array();
		for (int j = 0; j < n; j++) {
			if (j == i || !lk->rtt[i][j] || (!both && j < i))
				continue;
			char pid[33];
			node_id(pid, ids ? ids[j] : j);
			json_array_append_new(links, json_pack("{s:s,s:i,s:i,s:i}", "node_id", pid,
							       "rtt_us", (int)lk->rtt[i][j],
							       "rtt_p90_us", (int)lk->p90[i][j],
							       "mbps", (int)lk->mbps[i][j]));
		}
		json_t *o =
		    json_pack("{s:s,s:s,s:I,s:i,s:[{s:s,s:s}],s:o}", "node_id", id, "host", host,
			      "mem_avail", (json_int_t)nd[i].mem, "cores", nd[i].cores, "addresses",
			      "ip", ip, "ifname", "eth0", "links", links);
		if (nd[i].bw > 0)
			json_object_set_new(o, "bw", json_real(nd[i].bw));
		if (nd[i].pf > 0)
			json_object_set_new(o, "prefill_bw", json_real(nd[i].pf));
		if (nd[i].threads)
			json_object_set_new(o, "threads", json_integer(nd[i].threads));
		if (nd[i].machine)
			json_object_set_new(o, "machine", json_string(nd[i].machine));
		json_array_append_new(nodes, o);
	}
	if (perm) {
		unsigned s = perm;
		json_t *out = json_array();
		while (json_array_size(nodes)) {
			size_t k = lcg(&s) % json_array_size(nodes);
			json_t *node = json_incref(json_array_get(nodes, k));
			json_array_remove(nodes, k);
			json_t *arr = json_object_get(node, "links"), *na = json_array();
			while (json_array_size(arr)) {
				size_t x = lcg(&s) % json_array_size(arr);
				json_array_append(na, json_array_get(arr, x));
				json_array_remove(arr, x);
			}
			json_object_set_new(node, "links", na);
			json_array_append_new(out, node);
		}
		json_decref(nodes);
		nodes = out;
	}
	json_t *v = json_pack("{s:i,s:o}", "epoch", 9, "nodes", nodes);
	char *s = json_dumps(v, 0);
	json_decref(v);
	return s;
}

static plan_view_t *view_ids(int n, const nd_t *nd, const int *ids, const links_t *lk, int both,
			     unsigned perm)
{
	char *s = view_text(n, nd, ids, lk, both, perm), err[256] = "";
	plan_view_t *v = NULL;
	if (plan_view_from_json(&v, s, err, sizeof err))
		fprintf(stderr, "view: %s\n", err);
	free(s);
	return v;
}

static plan_view_t *view_of(int n, const nd_t *nd, const links_t *lk, int both, unsigned perm)
{
	return view_ids(n, nd, NULL, lk, both, perm);
}

/* The ~0.85B llama of the benchmarks (scripts/bench_infer.sh) in Q4_0. */
static plan_model_t model_085b(void)
{
	plan_model_t m;
	char err[256];
	int rc = plan_model_from_json(&m,
				      "{\"n_layers\":16,\"n_heads\":32,\"n_kv_heads\":8,"
				      "\"head_dim\":64,\"dim\":2048,\"ffn\":5632,\"n_vocab\":32000,"
				      "\"n_ctx\":4096,\"wtype\":\"Q4_0\"}",
				      err, sizeof err);
	if (rc)
		fprintf(stderr, "model: %s\n", err);
	return m;
}

static plan_t *make(const plan_view_t *v, const plan_model_t *m, plan_strategy_t s, int hybrid,
		    int *rc, char *err, size_t errlen)
{
	plan_opts_t o;
	plan_opts_default(&o);
	o.strategy = s;
	o.ctx = 2048;
	o.kv_bytes = 2;
	o.engine_hybrid = hybrid;
	plan_t *p = NULL;
	*rc = v ? plan_make(&p, v, m, &o, err, errlen) : SH_EINVAL;
	if (*rc && getenv("PLAN_COST_VERBOSE"))
		fprintf(stderr, "plan: %s\n", err);
	return p;
}

static double decode_of(const plan_t *p)
{
	const plan_pred_t *d = p ? plan_predicted(p) : NULL;
	return d ? (double)d->decode_dtok / 10.0 : 0;
}

static void show(const char *what, const plan_t *p)
{
	if (!getenv("PLAN_COST_VERBOSE") || !p)
		return;
	fprintf(stderr, "%s: %s over %d: %.1f tok/s (%s)\n", what,
		plan_strategy_name(plan_strategy(p)), plan_n_ranks(p), decode_of(p),
		plan_reason(p));
}

/* ---- the issue's measured facts ---- */

/* Issue 26, 2 hosts in the latency lab (one 2-core machine: the lab's namespaces share it), 1
 * thread each, the 0.85B Q4_0 model: tensor and pipeline decode per profile. The predictions
 * must be within 30 % (the acceptance's bound); the compute rate is set so that one node
 * decodes the model in the 20.1 ms the pipeline's 49.7 tok/s imply. */
TEST(issue_lab_two_hosts)
{
	static const struct {
		uint32_t rtt, mbps;
		double tensor, pipeline;
	} prof[] = {
	    {190, 941, 40.8, 49.7},  /* 40 us one way: the lab's ping RTT 0.19 ms */
	    {600, 941, 38.7, 49.7},  /* 250 us: RTT 0.57-0.63 ms */
	    {3080, 282, 14.1, 44.3}, /* 1.5 ms / 300 Mbit: RTT 3.07-3.09 ms, 282 Mbit/s */
	};
	plan_model_t m = model_085b();
	nd_t nd[2] = {{22.0, 0, 1, 2, "lab", 24 * GIB}, {22.0, 0, 1, 2, "lab", 24 * GIB}};
	for (size_t c = 0; c < ARRAY_LEN(prof); c++) {
		links_t lk;
		links_all(&lk, 2, prof[c].rtt, prof[c].rtt, prof[c].mbps);
		plan_view_t *v = view_of(2, nd, &lk, 1, 0);
		char err[512] = "";
		int rc;
		plan_t *t = make(v, &m, PLAN_TENSOR, 0, &rc, err, sizeof err);
		plan_t *q = make(v, &m, PLAN_PIPELINE, 0, &rc, err, sizeof err);
		plan_t *a = make(v, &m, PLAN_AUTO, 0, &rc, err, sizeof err);
		show("tensor", t), show("pipeline", q), show("auto", a);
		CHECK(t && plan_n_ranks(t) == 2 && q && plan_n_ranks(q) == 2 && a);
		double pt = decode_of(t), pp = decode_of(q);
		CHECK(pt > prof[c].tensor * 0.7 && pt < prof[c].tensor * 1.3);
		CHECK(pp > prof[c].pipeline * 0.7 && pp < prof[c].pipeline * 1.3);
		/* one node holds the model: nothing beats it for one stream on one thread */
		CHECK(a && plan_n_ranks(a) == 1 && decode_of(a) >= pp && decode_of(a) >= pt);
		plan_free(t), plan_free(q), plan_free(a);
		plan_view_free(v);
	}
}

/* The candidate of strategy st over n ranks, or NULL. */
static const plan_pred_t *cand(const plan_t *p, const char *st, int n)
{
	for (int i = 0; p && i < plan_n_candidates(p); i++) {
		const plan_pred_t *d = plan_candidate(p, i);
		if (!strcmp(d->strategy, st) && d->n_ranks == n)
			return d;
	}
	return NULL;
}

/* Issue 26, 3 agents in the lab (1 thread each on the 2-core machine), auto = tensor over 3:
 * 24.7 tok/s at 250 us, 8.1 at 1.5 ms / 300 Mbit. The model predicts those within 30 %, and
 * the acceptance's profiles (40 us / 10 Gbit too) all leave tensor out: one node (or a
 * pipeline) is the fastest single stream there. */
TEST(issue_lab_three_nodes)
{
	static const struct {
		uint32_t rtt, mbps;
		double tensor3; /* measured, 0 = not measured */
	} prof[] = {{190, 2500, 0}, {600, 941, 24.7}, {3080, 282, 8.1}};
	plan_model_t m = model_085b();
	nd_t nd[3];
	for (int i = 0; i < 3; i++)
		nd[i] = (nd_t){22.0, 0, 1, 2, "lab", 24 * GIB};
	for (size_t c = 0; c < ARRAY_LEN(prof); c++) {
		links_t lk;
		links_all(&lk, 3, prof[c].rtt, prof[c].rtt, prof[c].mbps);
		plan_view_t *v = view_of(3, nd, &lk, 1, 0);
		char err[512] = "";
		int rc;
		plan_t *a = make(v, &m, PLAN_AUTO, 1, &rc, err, sizeof err);
		show("auto", a);
		CHECK(a != NULL);
		const plan_pred_t *t3 = cand(a, "tensor", 3);
		CHECK(t3 != NULL);
		if (t3 && prof[c].tensor3 > 0) {
			double f = (double)t3->decode_dtok / 10.0;
			if (getenv("PLAN_COST_VERBOSE"))
				fprintf(stderr, "tensor over 3: %.1f (measured %.1f)\n", f,
					prof[c].tensor3);
			CHECK(f > prof[c].tensor3 * 0.7 && f < prof[c].tensor3 * 1.3);
		}
		CHECK(a && plan_strategy(a) != PLAN_TENSOR ? 1 : plan_n_ranks(a) == 1);
		CHECK_EQ_INT(plan_n_ranks(a) + plan_n_standby(a), 3);
		/* the twins of the node chosen are no faster alone */
		for (int i = 0; a && i < plan_n_standby(a); i++)
			CHECK(!strncmp(plan_standby(a, i)->reason,
				       "not needed: the best plan using it (single node ", 48));
		plan_free(a);
		plan_view_free(v);
	}
}

/* A model with round byte counts (F32 shapes; the bytes given), so figures can be computed by
 * hand: per layer q+o 2 MB, k+v 1 MB, FFN 6 MB; embedding and head 1 MB each. */
static plan_model_t model_round(void)
{
	plan_model_t m;
	char err[256];
	if (plan_model_from_json(&m,
				 "{\"n_layers\":4,\"n_heads\":4,\"n_kv_heads\":4,\"head_dim\":256,"
				 "\"dim\":1024,\"ffn\":4096,\"n_vocab\":1000,\"n_ctx\":64,"
				 "\"attn_qo_bytes\":2000000,\"attn_kv_bytes\":1000000,"
				 "\"ffn_bytes\":6000000,\"norm_bytes\":0,\"embd_bytes\":1000000,"
				 "\"output_bytes\":1000000}",
				 err, sizeof err))
		fprintf(stderr, "model: %s\n", err);
	return m;
}

/* Two machines at 1 GB/s (1 byte per ns), 200 us round trips, 1000 Mbit/s: tensor over 2.
 *   compute per layer: attention 2e6/2 + 1e6/2 = 1.5e6 ns, FFN 6e6/2 = 3e6 ns; 4 layers 18e6
 *   a sync: 100000 ns one way + 4096 bytes x 8000 / 1000 = 132768 ns; 7 all-reduces and the
 *   reduce to rank 0 (the same here): 8 x 132768 = 1062144
 *   STEP: 100000 + 64 x 8 = 100512; head on rank 0: 1e6
 *   decode = 18e6 + 1062144 + 100512 + 1e6 = 20162656 ns -> 49.6 tok/s
 *   prefill (64 rows, 64 GB/s batched: compute as decode): the all-reduces of 256 KiB take
 *   the ring, 2 steps of 100000 + 131072 x 8 = 1148576 -> 2297152 each, 7 of them, the
 *   reduce 100000 + 262144 x 8 = 2197152; the BATCH 64 + 64 x 16 bytes: 108704; head 1e6:
 *   18e6 + 18277216 + 108704 + 1e6 = 37385920 ns -> 64 / that = 1711.9 tok/s
 *   the 8-bit wire would save 1.7 %: below the 5 % it must gain. */
TEST(hand_computed)
{
	plan_model_t m = model_round();
	nd_t nd[2] = {{1.0, 64.0, 8, 8, NULL, 64 * GIB}, {1.0, 64.0, 8, 8, NULL, 64 * GIB}};
	links_t lk;
	links_all(&lk, 2, 200, 200, 1000);
	plan_view_t *v = view_of(2, nd, &lk, 1, 0);
	char err[512] = "";
	int rc;
	plan_t *p = make(v, &m, PLAN_AUTO, 0, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	const plan_pred_t *d = p ? plan_predicted(p) : NULL;
	CHECK(d != NULL);
	if (d) {
		CHECK_EQ_INT(plan_strategy(p), PLAN_TENSOR);
		CHECK_EQ_INT(plan_n_ranks(p), 2);
		CHECK_EQ_INT(plan_q8_wire(p), 0);
		CHECK_EQ_INT(d->decode_dtok, 496); /* 1e10 / 20162656 = 495.97 */
		CHECK_EQ_INT(d->aggregate_dtok, 496);
		CHECK_EQ_INT(d->prefill_dtok, 17119);
		CHECK_EQ_INT(d->n_syncs, 8);
		CHECK_EQ_INT(d->sync_us, 133);
		CHECK_EQ_INT(d->n_hops, 0);
		CHECK_EQ_STR(d->strategy, "tensor");
		CHECK_EQ_STR(d->what, "chosen");
		/* single node: 4 x 9e6 + 1e6 = 37e6 ns -> 27.0; pipeline over 2: the same compute
		 * and two hops of 132768 -> 26.8 */
		const plan_pred_t *one = cand(p, "single", 1), *pp = cand(p, "pipeline", 2);
		CHECK(one && one->decode_dtok == 270);
		CHECK(pp && pp->decode_dtok == 268 && pp->n_hops == 2 && pp->hop_us == 133);
		CHECK(strstr(plan_reason(p), "tensor over 2: predicted 49.6 tok/s (8 syncs at 0.13 "
					     "ms) vs single node ") != NULL);
		/* the fit figures are the memory: weights 2 x (1.5 + 3) MB per layer + embedding
		 * (+ head on rank 0) */
		CHECK_EQ_INT(plan_rank(p, 0)->weight_bytes, 4 * 4500000 + 2000000);
		CHECK_EQ_INT(plan_rank(p, 1)->weight_bytes, 4 * 4500000 + 1000000);
	}
	plan_free(p);
	plan_view_free(v);
}

/* Two machines that cannot hold the model alone: tensor while the link is fast, pipeline once
 * its latency outweighs halving the compute, and never back. */
TEST(flip_tensor_to_pipeline)
{
	plan_model_t m = model_085b();
	uint64_t mem = (512ull << 20) + 330000000; /* headroom + ~70 % of weights and KV */
	nd_t nd[2] = {{22.0, 0, 4, 4, NULL, mem}, {22.0, 0, 4, 4, NULL, mem}};
	static const uint32_t rtts[] = {20, 60, 100, 200, 400, 800, 1600, 3200, 6400};
	int flips = 0, last = -1;
	for (size_t c = 0; c < ARRAY_LEN(rtts); c++) {
		links_t lk;
		links_all(&lk, 2, rtts[c], rtts[c] + rtts[c] / 4, 941);
		plan_view_t *v = view_of(2, nd, &lk, 0, 0);
		char err[512] = "";
		int rc;
		plan_t *p = make(v, &m, PLAN_AUTO, 0, &rc, err, sizeof err);
		CHECK_EQ_INT(rc, 0);
		show("flip", p);
		if (p) {
			CHECK_EQ_INT(plan_n_ranks(p), 2);
			int s = plan_strategy(p);
			CHECK(s == PLAN_TENSOR || s == PLAN_PIPELINE);
			if (c == 0)
				CHECK_EQ_INT(s, PLAN_TENSOR);
			if (c + 1 == ARRAY_LEN(rtts))
				CHECK_EQ_INT(s, PLAN_PIPELINE);
			flips += last >= 0 && s != last;
			last = s;
			CHECK(strstr(plan_reason(p), plan_strategy_name((plan_strategy_t)s)) ==
			      plan_reason(p));
		}
		plan_free(p);
		plan_view_free(v);
	}
	CHECK_EQ_INT(flips, 1);
}

/* Three fast machines and a fourth that would slow any plan using it: far slower compute, or
 * far away. It stays a standby member with the reason and the figures. */
TEST(slow_or_far_node_standby)
{
	plan_model_t m = model_085b();
	for (int kind = 0; kind < 2; kind++) {
		nd_t nd[4];
		for (int i = 0; i < 4; i++)
			nd[i] = (nd_t){22.0, 0, 4, 4, NULL, 16 * GIB};
		links_t lk;
		links_all(&lk, 4, 40, 50, 9400);
		if (kind == 0)
			nd[3].bw = 1.0;
		else
			for (int j = 0; j < 3; j++)
				link_set(&lk, 3, j, 5000, 100);
		plan_view_t *v = view_of(4, nd, &lk, 1, 0);
		char err[512] = "", id3[33];
		int rc;
		node_id(id3, 3);
		plan_t *p = make(v, &m, PLAN_AUTO, 1, &rc, err, sizeof err);
		CHECK_EQ_INT(rc, 0);
		show(kind ? "far" : "slow", p);
		if (p) {
			CHECK_EQ_INT(plan_rank_of(p, id3), -1);
			CHECK_EQ_INT(plan_n_ranks(p), 3);
			CHECK_EQ_INT(plan_n_standby(p), 1);
			const plan_standby_t *b = plan_standby(p, 0);
			CHECK(b && !strcmp(b->node_id, id3));
			CHECK(b &&
			      !strncmp(b->reason, "slower with it: the best plan using it (", 40));
			char *s = plan_to_json(p);
			CHECK(s && strstr(s, "\"standby\": [") && strstr(s, id3));
			free(s);
		}
		plan_free(p);
		plan_view_free(v);
	}
}

/* Two pairs on fast cables, the pairs joined by a slow link; no pair holds the model: tensor
 * inside each pair, a pipeline between them. Without the engine's hybrid support auto takes
 * the best of the rest and still reports the hybrid's prediction. */
TEST(hybrid_two_fast_pairs)
{
	plan_model_t m = model_085b();
	uint64_t mem = (512ull << 20) + 180000000; /* ~35 % of the model each */
	nd_t nd[4];
	for (int i = 0; i < 4; i++)
		nd[i] = (nd_t){22.0, 0, 4, 4, NULL, mem};
	links_t lk;
	links_all(&lk, 4, 3000, 3500, 300);
	link_set(&lk, 0, 2, 30, 9400);
	link_set(&lk, 1, 3, 30, 9400);
	plan_view_t *v = view_of(4, nd, &lk, 1, 0);
	char err[512] = "";
	int rc;
	plan_t *p = make(v, &m, PLAN_AUTO, 1, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	show("hybrid", p);
	if (p) {
		CHECK_EQ_INT(plan_strategy(p), PLAN_HYBRID);
		CHECK_EQ_INT(plan_n_ranks(p), 4);
		CHECK_EQ_INT(plan_n_stages(p), 2);
		CHECK_EQ_INT(plan_check_cover(p, err, sizeof err), 0);
		CHECK(!strncmp(plan_reason(p), "hybrid over 4 (2+2): predicted ", 31));
		/* each stage is a cabled pair, its root the stage's first rank */
		char a[33], b[33];
		for (int r = 0; r < 4; r++) {
			const plan_rank_t *k = plan_rank(p, r);
			CHECK_EQ_INT(k->stage, r / 2);
			CHECK_EQ_INT(k->stage0, r / 2 * 2);
			CHECK_EQ_INT(k->stage1, r / 2 * 2 + 2);
		}
		const plan_rank_t *k0 = plan_rank(p, 0), *k1 = plan_rank(p, 1);
		node_id(a, 0), node_id(b, 2);
		int pair02 = (!strcmp(k0->node_id, a) || !strcmp(k0->node_id, b)) &&
			     (!strcmp(k1->node_id, a) || !strcmp(k1->node_id, b));
		node_id(a, 1), node_id(b, 3);
		int pair13 = (!strcmp(k0->node_id, a) || !strcmp(k0->node_id, b)) &&
			     (!strcmp(k1->node_id, a) || !strcmp(k1->node_id, b));
		CHECK(pair02 || pair13);
		/* the stages split the layers, each rank half of its stage's heads */
		CHECK_EQ_INT(k0->layer0, 0);
		CHECK_EQ_INT(k0->layer1, plan_rank(p, 2)->layer0);
		CHECK_EQ_INT(plan_rank(p, 3)->layer1, 16);
		CHECK_EQ_INT(k0->kv1 - k0->kv0, 4);
		CHECK_EQ_INT(plan_rank(p, 2)->kv0, 0);
		/* plan.json carries the stages and parses back byte for byte */
		char *s = plan_to_json(p);
		CHECK(s && strstr(s, "\"strategy\": \"hybrid\"") &&
		      strstr(s, "\"stage_ranks\": ["));
		plan_t *q = NULL;
		CHECK_EQ_INT(plan_from_json(&q, s, err, sizeof err), 0);
		if (q) {
			char *s2 = plan_to_json(q);
			CHECK_EQ_STR(s2, s);
			CHECK_EQ_INT(plan_strategy(q), PLAN_HYBRID);
			CHECK_EQ_INT(plan_n_stages(q), 2);
			CHECK_EQ_INT(plan_rank(q, 3)->stage, 1);
			free(s2);
			plan_free(q);
		}
		free(s);
	}
	double hybrid = decode_of(p);
	plan_free(p);
	p = make(v, &m, PLAN_AUTO, 0, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (p) {
		CHECK(plan_strategy(p) != PLAN_HYBRID);
		CHECK(decode_of(p) < hybrid);
		const plan_pred_t *h = cand(p, "hybrid", 4);
		CHECK(h && (double)h->decode_dtok / 10.0 == hybrid);
	}
	plan_free(p);
	/* forced: the best arrangement of each strategy */
	p = make(v, &m, PLAN_HYBRID, 0, &rc, err, sizeof err);
	CHECK(p && plan_strategy(p) == PLAN_HYBRID && decode_of(p) == hybrid);
	CHECK(p && !strncmp(plan_reason(p), "hybrid requested: hybrid over 4 (2+2) predicts ", 47));
	plan_free(p);
	p = make(v, &m, PLAN_PIPELINE, 1, &rc, err, sizeof err);
	CHECK(p && plan_strategy(p) == PLAN_PIPELINE && plan_n_ranks(p) == 4);
	CHECK(p && strstr(plan_reason(p), "; faster: hybrid over 4 (2+2) ") != NULL);
	plan_free(p);
	/* no tensor group holds the model (the embedding is on every rank): the kind-based
	 * planner's own message */
	p = make(v, &m, PLAN_TENSOR, 1, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, SH_ENOFIT);
	CHECK(!strncmp(err, "model does not fit (tensor, 4 ranks)", 36));
	plan_view_free(v);
}

static double rnd01(unsigned *s)
{
	return (double)(lcg(s) % 10000) / 10000.0;
}

/* A random measured cluster: speeds, memory, links, sometimes machines shared. */
static void random_cluster(unsigned *s, int n, nd_t *nd, links_t *lk)
{
	for (int i = 0; i < n; i++) {
		int cores = 1 + (int)(lcg(s) % 8);
		nd[i] = (nd_t){1.0 + 40 * rnd01(s),
			       lcg(s) % 2 ? 0 : 50 + 400 * rnd01(s),
			       1 + (int)(lcg(s) % (unsigned)cores),
			       cores,
			       lcg(s) % 4 == 0 ? "box" : NULL,
			       (512ull << 20) + (uint64_t)(100e6 + 900e6 * rnd01(s))};
		if (nd[i].machine)
			nd[i].cores = 4;
	}
	memset(lk, 0, sizeof *lk);
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++) {
			uint32_t rtt = 10 + (uint32_t)(lcg(s) % 4000), mbps = 50 + lcg(s) % 20000;
			link_set(lk, i, j, rtt, mbps);
			lk->p90[i][j] = lk->p90[j][i] = rtt + (uint32_t)(lcg(s) % 1000);
		}
}

/* Adding a node never makes the plan slower (every subset is a candidate). */
TEST(subsets_never_slower)
{
	plan_model_t m = model_085b();
	unsigned s = 12345;
	int compared = 0;
	for (int it = 0; it < 120 && !h_cur_failed; it++) {
		int n = 2 + (int)(lcg(&s) % 5);
		nd_t nd[MAXN];
		links_t lk;
		random_cluster(&s, n, nd, &lk);
		plan_view_t *v = view_of(n, nd, &lk, 1, 0);
		char err[512] = "";
		int rc;
		plan_t *full = make(v, &m, PLAN_AUTO, (int)(it & 1), &rc, err, sizeof err);
		plan_view_free(v);
		/* without node x: the same cluster one node short */
		for (int x = 0; x < n; x++) {
			nd_t nd2[MAXN];
			int ids[MAXN];
			links_t lk2;
			memset(&lk2, 0, sizeof lk2);
			for (int i = 0, a = 0; i < n; i++) {
				if (i == x)
					continue;
				nd2[a] = nd[i];
				ids[a] = i; /* the same node ids as in the full cluster */
				for (int j = 0, b = 0; j < n; j++) {
					if (j == x)
						continue;
					lk2.rtt[a][b] = lk.rtt[i][j], lk2.p90[a][b] = lk.p90[i][j];
					lk2.mbps[a][b] = lk.mbps[i][j];
					b++;
				}
				a++;
			}
			plan_view_t *v2 = view_ids(n - 1, nd2, ids, &lk2, 1, 0);
			plan_t *part = make(v2, &m, PLAN_AUTO, (int)(it & 1), &rc, err, sizeof err);
			if (part) { /* the smaller cluster plans: the larger one at least as fast */
				CHECK(full != NULL);
				CHECK(decode_of(full) >= decode_of(part));

				compared++;
			}
			plan_free(part);
			plan_view_free(v2);
		}
		plan_free(full);
	}
	CHECK(compared > 200);
}

/* The same measured view in any order (nodes, links; each link from one end or both) gives
 * byte-identical plans. */
TEST(shuffled_measured_identical)
{
	plan_model_t m = model_085b();
	unsigned s = 777;
	for (int it = 0; it < 12; it++) {
		int n = 3 + it % 6;
		nd_t nd[MAXN];
		links_t lk;
		random_cluster(&s, n, nd, &lk);
		plan_view_t *v0 = view_of(n, nd, &lk, 1, 0);
		char err[512] = "";
		int rc;
		plan_t *p0 = make(v0, &m, PLAN_AUTO, 1, &rc, err, sizeof err);
		char *ref = p0 ? plan_to_json(p0) : NULL;
		char *vref = plan_view_to_json(v0);
		CHECK(ref != NULL);
		for (unsigned perm = 1; ref && perm <= 6; perm++) {
			plan_view_t *v = view_of(n, nd, &lk, (int)(perm & 1), perm * 7919);
			plan_t *p = make(v, &m, PLAN_AUTO, 1, &rc, err, sizeof err);
			char *got = p ? plan_to_json(p) : NULL;
			CHECK_EQ_STR(got, ref);
			if (perm & 1) { /* the canonical view text too */
				char *vt = plan_view_to_json(v);
				CHECK_EQ_STR(vt, vref);
				free(vt);
			}
			free(got);
			plan_free(p);
			plan_view_free(v);
		}
		free(ref);
		free(vref);
		plan_free(p0);
		plan_view_free(v0);
	}
}

/* Costed plan.json: the predictions, candidates and standby parse back and are hashed. */
TEST(costed_plan_json)
{
	plan_model_t m = model_085b();
	nd_t nd[3];
	for (int i = 0; i < 3; i++)
		nd[i] = (nd_t){22.0, 300.0, 1, 2, "lab", 24 * GIB};
	links_t lk;
	links_all(&lk, 3, 600, 700, 941);
	plan_view_t *v = view_of(3, nd, &lk, 1, 0);
	char err[512] = "";
	int rc;
	plan_t *p = make(v, &m, PLAN_AUTO, 1, &rc, err, sizeof err), *q = NULL;
	char *s = p ? plan_to_json(p) : NULL;
	CHECK(s != NULL);
	if (s) {
		CHECK(strstr(s, "\"predicted_decode_tok_s\": ") != NULL);
		CHECK(strstr(s, "\"predicted_aggregate_tok_s\": ") != NULL);
		CHECK(strstr(s, "\"predicted_prefill_tok_s\": ") != NULL);
		CHECK(strstr(s, "\"predicted_mem_max_bytes\": ") != NULL);
		CHECK(strstr(s, "\"candidates\": [") != NULL);
		/* tenths print as tenths, not 44.100000000000001 */
		const char *x = strstr(s, "\"predicted_decode_tok_s\": ");
		CHECK(x && strcspn(x + 26, ",\n") <= 6);
		CHECK_EQ_INT(plan_from_json(&q, s, err, sizeof err), 0);
		if (q) {
			char *s2 = plan_to_json(q);
			CHECK_EQ_STR(s2, s);
			CHECK_EQ_STR(plan_hash(q), plan_hash(p));
			CHECK(plan_predicted(q) &&
			      plan_predicted(q)->decode_dtok == plan_predicted(p)->decode_dtok);
			CHECK_EQ_INT(plan_n_candidates(q), plan_n_candidates(p));
			CHECK_EQ_INT(plan_n_standby(q), plan_n_standby(p));
			free(s2);
			plan_free(q);
		}
		/* a changed prediction breaks the hash; a standby rank breaks the cover */
		json_t *j = json_loads(s, 0, NULL);
		json_object_set_new(j, "predicted_decode_tok_s", json_real(99.5));
		json_array_set_new(
		    json_object_get(j, "candidates"), 0,
		    json_deep_copy(json_array_get(json_object_get(j, "candidates"), 0)));
		json_object_set_new(json_array_get(json_object_get(j, "candidates"), 0),
				    "predicted_decode_tok_s", json_real(99.5));
		char *t = json_dumps(j, 0);
		CHECK_EQ_INT(plan_from_json(&q, t, err, sizeof err), SH_EFORMAT);
		CHECK(!strncmp(err, "plan: hash mismatch", 19));
		free(t);
		json_object_set_new(j, "predicted_decode_tok_s", json_real(12.5));
		t = json_dumps(j, 0);
		CHECK_EQ_INT(plan_from_json(&q, t, err, sizeof err), SH_EFORMAT);
		CHECK_EQ_STR(err, "plan: bad predictions, candidates or standby");
		free(t);
		json_decref(j);
	}
	free(s);
	plan_free(p);
	plan_view_free(v);
}

/* The measurement fields in a view: canonical text, and bad values refused with a reason. */
TEST(view_measurements)
{
	const char *id0 = "00000000000000000000000000000001",
		   *id1 = "00000000000000000000000000000002";
	char js[2048], err[256] = "";
	snprintf(js, sizeof js,
		 "{\"nodes\":[{\"node_id\":\"%s\",\"mem_avail\":1000000000,\"bw\":21.5,"
		 "\"prefill_bw\":300,\"threads\":2,\"cores\":4,\"machine\":\"boot-1\","
		 "\"wake_us\":250,\"links\":[{\"node_id\":\"%s\",\"rtt_us\":380.4,"
		 "\"rtt_p90_us\":520,\"mbps\":940}]},"
		 "{\"node_id\":\"%s\",\"mem_avail\":1000000000}]}",
		 id0, id1, id1);
	plan_view_t *v = NULL;
	CHECK_EQ_INT(plan_view_from_json(&v, js, err, sizeof err), 0);
	if (v) {
		const plan_node_t *a = &v->nodes[0];
		CHECK_EQ_INT(a->bw_mbs, 21500);
		CHECK_EQ_INT(a->prefill_mbs, 300000);
		CHECK_EQ_INT(a->threads, 2);
		CHECK_EQ_INT(a->wake_us, 250);
		CHECK_EQ_STR(a->machine, "boot-1");
		CHECK_EQ_INT(a->n_links, 1);
		CHECK_EQ_INT(a->links[0].rtt_us, 380);
		CHECK_EQ_INT(a->links[0].rtt_p90_us, 520);
		CHECK_EQ_INT(a->links[0].mbps, 940);
		char *t = plan_view_to_json(v);
		CHECK(t && strstr(t, "\"bw\": 21.5,") && strstr(t, "\"prefill_bw\": 300.0") &&
		      strstr(t, "\"rtt_us\": 380,"));
		plan_view_t *w = NULL;
		CHECK_EQ_INT(plan_view_from_json(&w, t, err, sizeof err), 0);
		char *t2 = w ? plan_view_to_json(w) : NULL;
		CHECK_EQ_STR(t2, t);
		free(t), free(t2);
		plan_view_free(w);
	}
	plan_view_free(v);
	static const struct {
		const char *links, *want;
	} bad[] = {
	    {"[{\"node_id\":\"%s\",\"rtt_us\":0,\"mbps\":1}]", "needs rtt_us and mbps above 0"},
	    {"[{\"node_id\":\"%s\",\"mbps\":1}]", "a link needs \"rtt_us\""},
	    {"[{\"node_id\":\"%s\",\"rtt_us\":-4,\"mbps\":1}]", "must be a number"},
	    {"[{\"node_id\":\"%s\",\"rtt_us\":4,\"mbps\":1},"
	     "{\"node_id\":\"%s\",\"rtt_us\":5,\"mbps\":1}]",
	     "two links to"},
	    {"{}", "\"links\" must be an array"},
	};
	for (size_t c = 0; c < ARRAY_LEN(bad); c++) {
		char links[512];
		snprintf(links, sizeof links, bad[c].links, id1, id1);
		snprintf(js, sizeof js,
			 "{\"nodes\":[{\"node_id\":\"%s\",\"mem_avail\":1000000000,"
			 "\"links\":%s},{\"node_id\":\"%s\",\"mem_avail\":1000000000}]}",
			 id0, links, id1);
		v = NULL;
		CHECK_EQ_INT(plan_view_from_json(&v, js, err, sizeof err), SH_EFORMAT);
		if (!strstr(err, bad[c].want))
			fprintf(stderr, "case %zu: %s\n", c, err);
		CHECK(strstr(err, bad[c].want) != NULL);
		plan_view_free(v);
	}
}

/* Unmeasured views keep the kind-based plan; forced hybrid needs measurements; a member
 * without figures is standby, not a reason to give up the measured ones. */
TEST(unmeasured_fallbacks)
{
	plan_model_t m = model_085b();
	nd_t nd[3];
	for (int i = 0; i < 3; i++)
		nd[i] = (nd_t){0, 0, 4, 4, NULL, 16 * GIB};
	links_t none;
	memset(&none, 0, sizeof none);
	plan_view_t *v = view_of(3, nd, &none, 1, 0);
	char err[512] = "";
	int rc;
	plan_t *p = make(v, &m, PLAN_AUTO, 1, &rc, err, sizeof err);
	CHECK(p && plan_predicted(p) == NULL && plan_n_ranks(p) == 3 && !plan_n_candidates(p));
	CHECK(p && !strncmp(plan_reason(p), "every pair of nodes has a wired", 31));
	char *s = p ? plan_to_json(p) : NULL;
	CHECK(s && !strstr(s, "predicted") && !strstr(s, "standby"));
	free(s);
	plan_free(p);
	p = make(v, &m, PLAN_HYBRID, 1, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, SH_EINVAL);
	CHECK_EQ_STR(err, "hybrid needs measured compute and links in the view (docs/view.md)");
	plan_view_free(v);
	/* two measured, the third without a compute figure: standby, "not measured" */
	nd[0].bw = nd[1].bw = 22.0;
	links_t lk;
	links_all(&lk, 3, 100, 120, 9000);
	v = view_of(3, nd, &lk, 1, 0);
	p = make(v, &m, PLAN_AUTO, 1, &rc, err, sizeof err);
	CHECK(p && plan_predicted(p) && plan_n_standby(p) == 1);
	if (p && plan_n_standby(p) == 1) {
		char id2[33];
		node_id(id2, 2);
		CHECK_EQ_STR(plan_standby(p, 0)->node_id, id2);
		CHECK_EQ_STR(plan_standby(p, 0)->reason,
			     "not measured: no compute figure (bw) in the view");
	}
	plan_free(p);
	/* forced pipeline with one measured node: that node (pipeline of one stage) */
	nd[1].bw = 0;
	plan_view_free(v);
	v = view_of(3, nd, &lk, 1, 0);
	p = make(v, &m, PLAN_PIPELINE, 1, &rc, err, sizeof err);
	CHECK(p && plan_strategy(p) == PLAN_PIPELINE && plan_n_ranks(p) == 1);
	CHECK(p && plan_check_cover(p, err, sizeof err) == 0);
	plan_free(p);
	plan_view_free(v);
}

/* The aggregate at --parallel 4: one batch of 4 rows per step; a pipeline whose engine runs
 * micro-batches in flight keeps its stages busy at once (issue 26), so its aggregate grows with
 * the stages, while a pipeline that runs them one after another gains nothing. */
TEST(aggregate_in_flight)
{
	plan_model_t m = model_085b();
	nd_t nd[3];
	for (int i = 0; i < 3; i++)
		nd[i] = (nd_t){22.0, 300.0, 4, 4, NULL, 16 * GIB};
	links_t lk;
	links_all(&lk, 3, 60, 80, 9400);
	plan_view_t *v = view_of(3, nd, &lk, 1, 0);
	double agg[2][2] = {{0}}; /* [in flight][single, pipeline over 3] */
	for (int f = 0; f < 2; f++) {
		plan_opts_t o;
		plan_opts_default(&o);
		o.ctx = 2048, o.kv_bytes = 2, o.parallel = 4, o.engine_inflight = f;
		plan_t *p = NULL;
		char err[512] = "";
		CHECK_EQ_INT(plan_make(&p, v, &m, &o, err, sizeof err), 0);
		const plan_pred_t *one = cand(p, "single", 1), *p3 = cand(p, "pipeline", 3);
		CHECK(p && plan_predicted(p)->parallel == 4 && one && p3);
		if (one && p3) {
			agg[f][0] = (double)one->aggregate_dtok / 10;
			agg[f][1] = (double)p3->aggregate_dtok / 10;
			/* 4 rows stream the weights once: close to 4 x one stream */
			CHECK(one->aggregate_dtok > 3 * one->decode_dtok);
		}
		/* fast links, separate machines: tensor over the three for one stream */
		CHECK(p && plan_strategy(p) == PLAN_TENSOR && plan_n_ranks(p) == 3);
		plan_free(p);
	}
	CHECK(agg[0][1] < agg[0][0]); /* stages one after another: no gain */
	/* in flight: three micro-batches of 2 rows, the stages at once (each re-reads its
	 * weights per micro-batch, so less than 3 x the batch of 4) */
	CHECK(agg[1][1] > agg[0][1] * 1.3);
	CHECK(agg[1][1] > agg[1][0] * 1.3);
	CHECK_EQ_INT((int)(agg[1][0] * 10),
		     (int)(agg[0][0] * 10)); /* one node: nothing to overlap */
	plan_view_free(v);
}

int main(void)
{
	RUN(hand_computed);
	RUN(issue_lab_two_hosts);
	RUN(issue_lab_three_nodes);
	RUN(flip_tensor_to_pipeline);
	RUN(slow_or_far_node_standby);
	RUN(hybrid_two_fast_pairs);
	RUN(subsets_never_slower);
	RUN(shuffled_measured_identical);
	RUN(costed_plan_json);
	RUN(view_measurements);
	RUN(unmeasured_fallbacks);
	RUN(aggregate_in_flight);
	return harness_done();
}
