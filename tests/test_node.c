/*
 * test_node.c: a NODE description's measurements (agent/node.h, issue 26): written and read
 * back, a hostile peer's bad figures rejected, and the planner's view built from descriptions
 * (node_to_plan: compute, links, a link naming the node itself left out), planned with
 * keep_first (the agent's planner stays rank 0 of the cost model's plan).
 */
#include "agent/node.h"
#include "common/common.h"
#include "harness.h"
#include "planner/planner.h"

#include <jansson.h>

static void id_of(char out[33], int i)
{
	snprintf(out, 33, "%02x%030d", i, 0);
}

/* A description with compute and links towards n peers. */
static void desc_measured(node_desc_t *d, int self, int n)
{
	memset(d, 0, sizeof *d);
	d->have = 1;
	d->http_port = 8080;
	d->mem_avail = 8ull << 30;
	d->naddrs = 1;
	snprintf(d->ip[0], PLAN_IP_MAX, "10.0.0.%d", self + 1);
	snprintf(d->ifname[0], PLAN_IFNAME_MAX, "eth0");
	d->kind[0] = PLAN_LINK_ETHERNET;
	d->prefix[0] = 24;
	d->compute = (node_compute_t){.bw_mbs = 22000, .prefill_mbs = 120000, .threads = 1};
	snprintf(d->compute.machine, sizeof d->compute.machine,
		 "6a1f0c1e-2b3c-4d5e-8f90-1a2b3c4d5e6f");
	for (int j = 0; j < n; j++) {
		if (j == self)
			continue;
		plan_meas_t *m = &d->links[d->nlinks++];
		id_of(m->node_id, j);
		m->rtt_us = 190 + 10 * (uint32_t)j;
		m->rtt_p90_us = 240 + 10 * (uint32_t)j;
		m->mbps = 940;
	}
}

static int parse_text(node_desc_t *d, const char *s)
{
	return node_desc_parse(d, (const uint8_t *)s, strlen(s));
}

TEST(round_trip)
{
	node_desc_t d, e;
	desc_measured(&d, 0, 3);
	char *s = node_desc_json(&d);
	CHECK(s != NULL);
	CHECK_EQ_INT(parse_text(&e, s), 0);
	free(s);
	CHECK_EQ_INT(e.compute.bw_mbs, 22000);
	CHECK_EQ_INT(e.compute.prefill_mbs, 120000);
	CHECK_EQ_INT(e.compute.threads, 1);
	CHECK_EQ_STR(e.compute.machine, d.compute.machine);
	CHECK_EQ_INT(e.nlinks, 2);
	CHECK_EQ_STR(e.links[0].node_id, d.links[0].node_id);
	CHECK_EQ_INT(e.links[1].rtt_us, 210);
	CHECK_EQ_INT(e.links[1].rtt_p90_us, 260);
	CHECK_EQ_INT(e.links[1].mbps, 940);
}

/* An older node says nothing of measurements: still a description, with none. */
TEST(without_measurements)
{
	node_desc_t e;
	CHECK_EQ_INT(parse_text(&e, "{\"http_port\":8080,\"addrs\":[]}"), 0);
	CHECK_EQ_INT(e.compute.bw_mbs, 0);
	CHECK_EQ_INT(e.nlinks, 0);
	/* p90 may be absent (the planner then takes the median) */
	CHECK_EQ_INT(parse_text(&e,
				"{\"http_port\":1,\"addrs\":[],\"links\":[{\"id\":"
				"\"0100000000000000000000000000000a\",\"rtt_us\":5,\"mbps\":7}]}"),
		     0);
	CHECK_EQ_INT(e.nlinks, 1);
	CHECK_EQ_INT(e.links[0].rtt_p90_us, 0);
}

/* Each of these is one field of a valid description made hostile: the whole description is
 * malformed (node.c's invariant), never a figure the planner would trust. */
TEST(rejects_bad_figures)
{
	static const char *const bad[] = {
	    "\"bw_mbs\":0",
	    "\"bw_mbs\":-5",
	    "\"bw_mbs\":100000001",
	    "\"bw_mbs\":1.5e300",
	    "\"bw_mbs\":\"22\"",
	    "\"prefill_mbs\":0",
	    "\"threads\":0",
	    "\"threads\":100000",
	    "\"machine\":\"a b\"",
	    "\"machine\":\"x\\\"y\"",
	    "\"machine\":7",
	    "\"machine\":\"0123456789012345678901234567890123456789012345678901234567890123456\"",
	    "\"links\":{}",
	    "\"links\":[7]",
	    "\"links\":[{\"id\":\"0100000000000000000000000000000a\",\"rtt_us\":0,\"mbps\":7}]",
	    "\"links\":[{\"id\":\"0100000000000000000000000000000a\",\"rtt_us\":60000001,"
	    "\"mbps\":7}]",
	    "\"links\":[{\"id\":\"0100000000000000000000000000000a\",\"rtt_us\":500,"
	    "\"rtt_p90_us\":400,\"mbps\":7}]",
	    "\"links\":[{\"id\":\"0100000000000000000000000000000a\",\"rtt_us\":5,\"mbps\":0}]",
	    "\"links\":[{\"id\":\"0100000000000000000000000000000a\",\"rtt_us\":5,"
	    "\"mbps\":10000001}]",
	    "\"links\":[{\"id\":\"0100000000000000000000000000000A\",\"rtt_us\":5,\"mbps\":7}]",
	    "\"links\":[{\"id\":\"01000000\",\"rtt_us\":5,\"mbps\":7}]",
	    "\"links\":[{\"rtt_us\":5,\"mbps\":7}]",
	    "\"links\":[{\"id\":\"0100000000000000000000000000000a\",\"rtt_us\":5,\"mbps\":7},"
	    "{\"id\":\"0100000000000000000000000000000a\",\"rtt_us\":6,\"mbps\":8}]",
	};
	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		char s[1024];
		node_desc_t e;
		snprintf(s, sizeof s, "{\"http_port\":8080,\"addrs\":[],%s}", bad[i]);
		int rc = parse_text(&e, s);
		if (rc != SH_EFORMAT)
			fprintf(stderr, "accepted: %s\n", bad[i]);
		CHECK_EQ_INT(rc, SH_EFORMAT);
	}
	/* more links than a view has nodes */
	json_t *ls = json_array();
	for (int i = 0; i < AGENT_MAX_LINKS + 1; i++) {
		char id[33];
		id_of(id, i + 1);
		json_array_append_new(ls,
				      json_pack("{s:s,s:i,s:i}", "id", id, "rtt_us", 5, "mbps", 9));
	}
	json_t *o = json_pack("{s:i,s:[],s:o}", "http_port", 1, "addrs", "links", ls);
	char *s = json_dumps(o, 0);
	node_desc_t e;
	CHECK_EQ_INT(parse_text(&e, s), SH_EFORMAT);
	free(s);
	json_decref(o);
}

/* The arrays node_to_plan allocated, and the nodes (the view itself is on the stack). */
static void view_nodes_free(plan_view_t *v)
{
	for (size_t i = 0; i < v->n_nodes; i++) {
		free(v->nodes[i].addrs);
		free(v->nodes[i].rdma);
		free(v->nodes[i].links);
	}
	free(v->nodes);
}

static const char *model_json = "{\"n_layers\":16,\"n_heads\":32,\"n_kv_heads\":8,\"dim\":2048,"
				"\"ffn\":5632,\"n_vocab\":32000,\"n_ctx\":2048,\"wtype\":\"Q4_0\"}";

/* 3 nodes from their descriptions: node_to_plan carries compute and links (the link naming the
 * node itself dropped), the view checks, and the cost model plans. */
TEST(view_from_descriptions)
{
	plan_view_t v = {.epoch = 3};
	v.nodes = calloc(3, sizeof *v.nodes);
	for (int i = 0; i < 3; i++) {
		node_desc_t d;
		char id[33];
		desc_measured(&d, i, 3);
		id_of(id, i);
		if (i == 2) { /* a link to itself: left out */
			plan_meas_t *m = &d.links[d.nlinks++];
			snprintf(m->node_id, sizeof m->node_id, "%s", id);
			m->rtt_us = m->mbps = 1;
		}
		CHECK_EQ_INT(node_to_plan(&v.nodes[v.n_nodes++], id, "h", 7411, 16ull << 30,
					  8ull << 30, 2, "", &d),
			     0);
	}
	CHECK_EQ_INT(v.nodes[0].bw_mbs, 22000);
	CHECK_EQ_INT(v.nodes[0].prefill_mbs, 120000);
	CHECK_EQ_INT(v.nodes[1].threads, 1);
	CHECK_EQ_INT((int)v.nodes[2].n_links, 2);
	CHECK_EQ_STR(v.nodes[0].machine, "6a1f0c1e-2b3c-4d5e-8f90-1a2b3c4d5e6f");
	char err[512] = "";
	CHECK_EQ_INT(plan_view_check(&v, err, sizeof err), 0);
	plan_model_t m;
	CHECK_EQ_INT(plan_model_from_json(&m, model_json, err, sizeof err), 0);
	plan_opts_t o;
	plan_opts_default(&o);
	o.keep_first = 1;
	plan_t *p = NULL;
	CHECK_EQ_INT(plan_make(&p, &v, &m, &o, err, sizeof err), 0);
	CHECK(p && plan_predicted(p) != NULL);
	if (p) {
		char id0[33];
		id_of(id0, 0);
		CHECK_EQ_STR(plan_rank(p, 0)->node_id, id0);
		CHECK(plan_predicted(p)->decode_dtok > 0);
	}
	plan_free(p);
	/* a forced strategy from the agent's options */
	o.strategy = PLAN_PIPELINE;
	CHECK_EQ_INT(plan_make(&p, &v, &m, &o, err, sizeof err), 0);
	CHECK(p && plan_strategy(p) == PLAN_PIPELINE && plan_n_ranks(p) >= 2);
	plan_free(p);
	view_nodes_free(&v);
}

/* keep_first: the view's first node (the agent's planner) is rank 0 of the chosen plan even
 * when it is the slowest; without it, the fastest node alone is chosen and the first is
 * standby. */
TEST(keep_first)
{
	plan_view_t v = {.epoch = 1};
	v.nodes = calloc(2, sizeof *v.nodes);
	for (int i = 0; i < 2; i++) {
		node_desc_t d;
		char id[33];
		desc_measured(&d, i, 2);
		d.compute.bw_mbs = i == 0 ? 2000 : 30000; /* node 0 far slower */
		d.compute.machine[0] = 0;
		id_of(id, i);
		CHECK_EQ_INT(node_to_plan(&v.nodes[v.n_nodes++], id, "h", 7411, 16ull << 30,
					  8ull << 30, 2, "", &d),
			     0);
	}
	plan_model_t m;
	char err[512] = "";
	CHECK_EQ_INT(plan_model_from_json(&m, model_json, err, sizeof err), 0);
	plan_opts_t o;
	plan_opts_default(&o);
	plan_t *p = NULL;
	char id0[33], id1[33];
	id_of(id0, 0);
	id_of(id1, 1);
	CHECK_EQ_INT(plan_make(&p, &v, &m, &o, err, sizeof err), 0);
	CHECK(p && plan_n_ranks(p) == 1 && !strcmp(plan_rank(p, 0)->node_id, id1));
	CHECK(p && plan_n_standby(p) == 1 && !strcmp(plan_standby(p, 0)->node_id, id0));
	plan_free(p);
	o.keep_first = 1;
	CHECK_EQ_INT(plan_make(&p, &v, &m, &o, err, sizeof err), 0);
	CHECK(p && !strcmp(plan_rank(p, 0)->node_id, id0));
	plan_free(p);
	view_nodes_free(&v);
}

/* A worker rank's STEPS (the leader's per-node series): its totals round-trip; what a hostile
 * or broken peer could send instead is refused, never taken as figures. */
TEST(steps_message)
{
	node_steps_t s = {1234, 5678.25, 1234.5}, t;
	char *j = node_steps_json(&s);
	CHECK(j != NULL);
	CHECK_EQ_INT(node_steps_parse(&t, (const uint8_t *)j, strlen(j)), 0);
	free(j);
	CHECK(t.steps == 1234 && t.step_ms == 5678.25 && t.comm_ms == 1234.5);
	const char *bad[] = {"",
			     "[]",
			     "{\"steps\":1,\"step_ms\":2}",
			     "{\"steps\":-1,\"step_ms\":2,\"comm_ms\":1}",
			     "{\"steps\":1,\"step_ms\":-2,\"comm_ms\":0}",
			     "{\"steps\":1,\"step_ms\":2,\"comm_ms\":3}",
			     "{\"steps\":\"1\",\"step_ms\":2,\"comm_ms\":1}",
			     "{\"steps\":1,\"step_ms\":1e999,\"comm_ms\":1}"};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
		CHECK_EQ_INT(node_steps_parse(&t, (const uint8_t *)bad[i], strlen(bad[i])),
			     SH_EFORMAT);
}

int main(void)
{
	RUN(round_trip);
	RUN(without_measurements);
	RUN(rejects_bad_figures);
	RUN(view_from_descriptions);
	RUN(keep_first);
	RUN(steps_message);
	return harness_done();
}
