/*
 * test_planner_prop.c: property test over thousands of random views, models and options (seeded,
 * so a failure reproduces): the planner never crashes, and every plan it returns covers every
 * query head, KV head group, FFN column and layer exactly once, fits each rank's memory, survives
 * plan.json round trips byte for byte, and does not change when the view is shuffled. Half the
 * views carry measurements (compute, links, shared machines), so the cost model's plans (any
 * subset, hybrid stages, standby members) are held to the same properties; half the models mix
 * full, sliding-window and recurrent layers over several slots (stage caps must still fit).
 */
#include "planner/plan_int.h"

#include "common/common.h"
#include "harness.h"

static uint64_t rng_state;

static uint64_t rnd(void) /* xorshift64* */
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ULL;
}

static int rnd_in(int lo, int hi)
{
	return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}

static const char *const IFNAMES[] = {"en0",     "en1", "en3",          "en4",   "eth0", "wlan0",
				      "bridge0", "lo",  "thunderbolt0", "veth1", "tun0"};

static void random_node(plan_node_t *n, int i, const plan_view_t *v, int n_nodes)
{
	snprintf(n->node_id, sizeof n->node_id, "%016llx%016llx", (unsigned long long)rnd(),
		 (unsigned long long)(rnd() & 0xff) * (unsigned)(i + 1));
	snprintf(n->host, sizeof n->host, "h%d", rnd_in(0, 5));
	n->mem_avail =
	    (rnd() % 4 == 0) ? (uint64_t)rnd_in(1, 4096) << 20 : (uint64_t)rnd_in(1, 512) << 30;
	n->mem_total = n->mem_avail;
	n->bw_mbs = rnd() % 3 ? 0 : (uint32_t)rnd_in(1, 800000);
	n->n_addrs = rnd() % 100 == 0 ? 0 : (size_t)rnd_in(1, 4); /* rarely no address at all */
	n->addrs = calloc(n->n_addrs + 1, sizeof *n->addrs);
	for (size_t a = 0; a < n->n_addrs; a++) {
		plan_addr_t *ad = &n->addrs[a];
		snprintf(ad->ifname, sizeof ad->ifname, "%s", IFNAMES[rnd() % ARRAY_LEN(IFNAMES)]);
		int k = a ? rnd_in(0, 9) : 2; /* the first one IPv4 */
		if (k == 0)
			snprintf(ad->ip, sizeof ad->ip, "fe80::%x", rnd_in(1, 999));
		else if (k == 1)
			snprintf(ad->ip, sizeof ad->ip, "127.0.0.1");
		else
			snprintf(ad->ip, sizeof ad->ip, "10.%d.%d.%d", rnd_in(0, 3), rnd_in(0, 3),
				 rnd_in(1, 254));
		ad->kind = rnd() % 2 ? plan_link_guess(ad->ifname) : (plan_link_t)rnd_in(0, 3);
	}
	n->n_rdma = (size_t)rnd_in(0, 3);
	n->rdma = calloc(n->n_rdma + 1, sizeof *n->rdma);
	for (size_t d = 0; d < n->n_rdma; d++) {
		const char *ifn = IFNAMES[rnd() % ARRAY_LEN(IFNAMES)];
		snprintf(n->rdma[d].name, sizeof n->rdma[d].name, "rdma_%s", ifn);
		snprintf(n->rdma[d].ifname, sizeof n->rdma[d].ifname, "%s", ifn);
		n->rdma[d].port_active = rnd() % 4 != 0;
	}
	n->n_seen = (size_t)rnd_in(0, n_nodes + 1);
	n->seen = calloc(n->n_seen + 1, sizeof *n->seen);
	for (size_t s = 0; s < n->n_seen; s++) {
		/* peers already made, or made later (ids are fixed below), or strangers */
		int peer = rnd_in(0, n_nodes);
		if (peer < i)
			memcpy(n->seen[s].node_id, v->nodes[peer].node_id, PLAN_ID_LEN + 1);
		else
			snprintf(n->seen[s].node_id, sizeof n->seen[s].node_id, "%032x", peer);
		snprintf(n->seen[s].ifname, sizeof n->seen[s].ifname, "%s",
			 IFNAMES[rnd() % ARRAY_LEN(IFNAMES)]);
	}
}

/* Measurements on (most) nodes and links: compute rates, threads, machines shared now and then,
 * links from one end or both, a few missing. */
static void measure(plan_view_t *v)
{
	int n = (int)v->n_nodes;
	for (int i = 0; i < n; i++) {
		plan_node_t *a = &v->nodes[i];
		a->bw_mbs = rnd() % 10 ? (uint32_t)rnd_in(500, 400000) : 0;
		a->prefill_mbs = rnd() % 2 ? (uint32_t)rnd_in(500, 4000000) : 0;
		a->cores = rnd_in(0, 16);
		a->threads = rnd_in(0, 16);
		a->wake_us = rnd() % 3 ? 0 : (uint32_t)rnd_in(1, 5000);
		if (rnd() % 4 == 0)
			snprintf(a->machine, sizeof a->machine, "m%d", rnd_in(0, 2));
		a->links = calloc((size_t)n, sizeof *a->links);
		for (int j = 0; j < n; j++) {
			if (j == i || rnd() % 20 == 0 || (j < i && rnd() % 2))
				continue;
			plan_meas_t *e = &a->links[a->n_links++];
			memcpy(e->node_id, v->nodes[j].node_id, PLAN_ID_LEN + 1);
			e->rtt_us = (uint32_t)rnd_in(5, 20000);
			e->rtt_p90_us = rnd() % 2 ? 0 : e->rtt_us + (uint32_t)rnd_in(0, 5000);
			e->mbps = (uint32_t)rnd_in(10, 100000);
			if (rnd() % 30 == 0) /* extremes: nothing may wrap or divide by zero */
				e->rtt_us = 100000000, e->rtt_p90_us = 0, e->mbps = 1;
		}
		if (rnd() % 30 == 0)
			a->bw_mbs = 1, a->prefill_mbs = rnd() % 2 ? 1 : 1000000000;
	}
}

static plan_view_t *random_view(void)
{
	plan_view_t *v = calloc(1, sizeof *v);
	int n = rnd() % 10 == 0 ? rnd_in(1, PLAN_MAX_NODES) : rnd_in(1, 9);
	v->nodes = calloc((size_t)n, sizeof *v->nodes);
	v->n_nodes = (size_t)n;
	v->epoch = rnd() % 1000;
	for (int i = 0; i < n; i++)
		random_node(&v->nodes[i], i, v, n);
	if (n > 1 && rnd() % 50 == 0) /* now and then a duplicate id */
		memcpy(v->nodes[1].node_id, v->nodes[0].node_id, PLAN_ID_LEN + 1);
	if (rnd() % 2)
		measure(v);
	return v;
}

/* A copy with the nodes and every array in another order (and so another memory layout). */
static plan_view_t *shuffled(const plan_view_t *v)
{
	plan_view_t *c = calloc(1, sizeof *c);
	*c = *v;
	c->nodes = calloc(v->n_nodes, sizeof *c->nodes);
	for (size_t i = 0; i < v->n_nodes; i++) {
		const plan_node_t *a = &v->nodes[i];
		plan_node_t *b = &c->nodes[v->n_nodes - 1 - i]; /* nodes reversed */
		*b = *a;
		b->addrs = calloc(a->n_addrs + 1, sizeof *b->addrs);
		b->rdma = calloc(a->n_rdma + 1, sizeof *b->rdma);
		b->seen = calloc(a->n_seen + 1, sizeof *b->seen);
		b->links = calloc(a->n_links + 1, sizeof *b->links);
		for (size_t k = 0; k < a->n_links; k++)
			b->links[(k + 2) % a->n_links] = a->links[k];
		for (size_t k = 0; k < a->n_addrs; k++)
			b->addrs[k] = a->addrs[(k + 1) % a->n_addrs];
		for (size_t k = 0; k < a->n_rdma; k++)
			b->rdma[a->n_rdma - 1 - k] = a->rdma[k];
		for (size_t k = 0; k < a->n_seen; k++)
			b->seen[a->n_seen - 1 - k] = a->seen[k];
	}
	return c;
}

static void random_model(plan_model_t *m)
{
	memset(m, 0, sizeof *m);
	snprintf(m->arch, sizeof m->arch, "llama");
	m->n_layers = rnd_in(1, 100);
	m->n_kv_heads = rnd_in(1, 16);
	m->n_heads = m->n_kv_heads * rnd_in(1, 8);
	m->head_dim = 8 * rnd_in(1, 32);
	m->dim = m->n_heads * m->head_dim;
	m->ffn = rnd_in(1, 30000);
	m->n_vocab = rnd_in(1, 150000);
	m->n_ctx = rnd_in(1, 32768);
	static const int types[] = {0, 1, 2, 8, 12, 14, 30};
	plan_model_set_type(m, types[rnd() % ARRAY_LEN(types)], (int)(rnd() % 2));
	if (rnd() % 2) { /* layer kinds: sliding windows and recurrent layers (docs/view.md 2.1) */
		int n = rnd_in(1, 8);
		for (int i = 0; i < n; i++)
			m->layer_kinds[i] = "fsr"[rnd() % 3];
		m->swa_kv_pos = 64 * rnd_in(0, 40);
		m->rs_k_heads = rnd_in(1, 16);
		m->rs_unit = rnd_in(1, m->rs_k_heads);
		m->rs_copies = rnd_in(1, 5);
		m->rs_bytes = (uint64_t)m->rs_k_heads * (uint64_t)rnd_in(1, 1 << 20);
		m->rec_bytes = m->attn_qo_bytes + m->attn_kv_bytes;
	}
}

static int n_ok, n_nofit, n_inval, n_costed, n_hybrid, n_standby;

static void one_case(void)
{
	plan_view_t *v = random_view();
	plan_model_t m;
	random_model(&m);
	plan_opts_t o;
	plan_opts_default(&o);
	o.strategy = (plan_strategy_t)rnd_in(0, 3);
	o.parallel = rnd_in(0, 8);
	o.slots = rnd_in(0, 4);
	if (rnd() % 4 == 0) /* a q8_0 cache: 34 bytes per block of 32 */
		o.kv_bytes = 34, o.kv_block = 32;
	o.engine_hybrid = (int)(rnd() % 2);
	o.engine_inflight = (int)(rnd() % 2);
	o.ctx = rnd() % 2 ? 0 : rnd_in(1, 1 << 16);
	o.headroom_permille = rnd_in(0, 200);
	plan_t *p = NULL;
	char err[1024] = "";
	int rc = plan_make(&p, v, &m, &o, err, sizeof err);
	if (rc) {
		CHECK(p == NULL);
		CHECK(err[0] != 0);
		CHECK(rc == SH_EINVAL || rc == SH_ENOFIT);
		n_nofit += rc == SH_ENOFIT;
		n_inval += rc == SH_EINVAL;
		if (getenv("PLAN_PROP_VERBOSE"))
			fprintf(stderr, "%s\n", err);
		goto out;
	}
	n_ok++;
	CHECK_EQ_INT(plan_check_cover(p, err, sizeof err), 0);
	if (err[0])
		fprintf(stderr, "cover: %s\n", err);
	/* every member is a rank or a standby (the cost model's), never both */
	CHECK_EQ_INT(plan_n_ranks(p) + plan_n_standby(p), (int)v->n_nodes);
	n_costed += plan_predicted(p) != NULL;
	n_hybrid += plan_strategy(p) == PLAN_HYBRID;
	n_standby += plan_n_standby(p) > 0;
	if (plan_predicted(p)) {
		CHECK_EQ_INT(plan_predicted(p)->decode_dtok, plan_candidate(p, 0)->decode_dtok);
		CHECK(plan_n_candidates(p) >= 1);
		CHECK_EQ_STR(plan_candidate(p, 0)->what, "chosen");
	}
	for (int r = 0; r < plan_n_ranks(p); r++) {
		const plan_rank_t *k = plan_rank(p, r);
		CHECK(k->weight_bytes + k->kv_cache_bytes + k->rs_bytes + k->act_bytes +
			  k->headroom_bytes <=
		      k->mem_avail);
		CHECK(k->ip[0] != 0);
		CHECK(k->rdma[r][0] == 0);
	}
	/* plan.json round trip, byte for byte, and the other files from the parsed plan */
	char *s = plan_to_json(p), *h = plan_hostfile_json(p), *mh = plan_mlx_hosts_json(p);
	char *rd = plan_rdma_json(p);
	CHECK(s && h && mh && rd);
	plan_t *q = NULL;
	CHECK_EQ_INT(plan_from_json(&q, s, err, sizeof err), 0);
	if (q) {
		char *s2 = plan_to_json(q), *h2 = plan_hostfile_json(q), *rd2 = plan_rdma_json(q);
		CHECK_EQ_STR(s2, s);
		CHECK_EQ_STR(h2, h);
		CHECK_EQ_STR(rd2, rd);
		free(s2), free(h2), free(rd2);
		plan_free(q);
	}
	/* the same view in another order gives the same plan */
	plan_view_t *c = shuffled(v);
	plan_t *p2 = NULL;
	CHECK_EQ_INT(plan_make(&p2, c, &m, &o, err, sizeof err), 0);
	if (p2) {
		char *s3 = plan_to_json(p2);
		CHECK_EQ_STR(s3, s);
		free(s3);
		plan_free(p2);
	}
	plan_view_free(c);
	free(s), free(h), free(mh), free(rd);
out:
	plan_free(p);
	plan_view_free(v);
}

TEST(random_views)
{
	rng_state = 0x5eed5eed12345678ULL;
	n_ok = n_nofit = n_inval = n_costed = n_hybrid = n_standby = 0;
	for (int i = 0; i < 3000 && !h_cur_failed; i++) {
		uint64_t seed = rng_state;
		one_case();
		if (h_cur_failed)
			fprintf(stderr, "case %d (rng state %llx) failed\n", i,
				(unsigned long long)seed);
	}
	printf("random views: %d plans (%d by the cost model: %d hybrid, %d with standby "
	       "members), %d did not fit, %d invalid\n",
	       n_ok, n_costed, n_hybrid, n_standby, n_nofit, n_inval);
	CHECK(n_ok > 300); /* the generator must exercise the success path */
	CHECK(n_costed > 100 && n_hybrid > 5 && n_standby > 20);
}

/* The splitter alone: exact totals, minimums, and proportionality within one unit. */
TEST(split_properties)
{
	rng_state = 0x1234567ULL;
	for (int it = 0; it < 20000; it++) {
		int n = rnd_in(1, PLAN_MAX_NODES), min_each = rnd_in(0, 2);
		int units = n * min_each + rnd_in(0, 5000);
		uint64_t w[PLAN_MAX_NODES];
		for (int i = 0; i < n; i++)
			w[i] = rnd() % 5 == 0 ? 0 : rnd() >> rnd_in(0, 63);
		int out[PLAN_MAX_NODES], sum = 0;
		plan_split(out, n, units, min_each, w);
		for (int i = 0; i < n; i++) {
			sum += out[i];
			CHECK(out[i] >= min_each);
		}
		CHECK_EQ_INT(sum, units);
		/* without minimums, each rank gets the floor or floor + 1 of its exact quota */
		unsigned __int128 total = 0;
		for (int i = 0; i < n; i++)
			total += w[i] ? w[i] : 1;
		for (int i = 0; min_each == 0 && i < n; i++) {
			unsigned __int128 q =
			    (unsigned __int128)(unsigned)units * (w[i] ? w[i] : 1) / total;
			CHECK(out[i] == (int)q || out[i] == (int)q + 1);
		}
		if (h_cur_failed)
			break;
	}
}

int main(void)
{
	RUN(split_properties);
	RUN(random_views);
	return harness_done();
}
