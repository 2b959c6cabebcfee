/*
 * test_planner.c: the planner, table-driven: 1..8 nodes, unequal memory, RDMA full / partial /
 * none, KV heads fewer than nodes, layer counts not divisible by the node count, a model that
 * does not fit (exact message), shuffled input giving byte-identical files, and every file
 * parsed back against docs/formats.md (ring row r = rank r, [i][j] semantics, null diagonal).
 */
#include "planner/plan_int.h"

#include "common/common.h"
#include "harness.h"

#include <jansson.h>

#define GIB ((uint64_t)1 << 30)

/* ---- fixtures ---- */

enum topo {
	T_SWITCH_ETH,  /* every node on one Ethernet switch: eth0 */
	T_SWITCH_WIFI, /* every node on Wi-Fi: wlan0 */
	T_MESH_TB,     /* a Thunderbolt cable per pair (macOS names), Wi-Fi en0 as well */
};

/* Node i's id: not in index order, so rank order must come from sorting. */
static void node_id(char *out, int i)
{
	snprintf(out, PLAN_ID_LEN + 1, "%08x%024x", (unsigned)((i + 1) * 0x9e3779b9u), i);
}

/* Interface of node i towards j in the Thunderbolt mesh: en1..en7 (never i itself). */
static int tb_if(int i, int j)
{
	return j < i ? j + 1 : j;
}

/* Builds a view JSON. mem_gib[i] per node; rdma[i][j] (T_MESH_TB): the pair has an active RDMA
 * port (NULL = every pair); bw[i] GB/s or NULL. perm (may be NULL) reorders nodes and entries. */
static json_t *view_json(int n, const uint64_t *mem_gib, enum topo t, int rdma[8][8],
			 const double *bw, unsigned perm)
{
	json_t *nodes = json_array();
	for (int i = 0; i < n; i++) {
		char id[33], host[48], ip[48], ifn[48];
		node_id(id, i);
		snprintf(host, sizeof host, "host%d.local", i);
		json_t *addrs = json_array(), *seen = json_array(), *devs = json_array();
		if (t == T_MESH_TB) {
			snprintf(ip, sizeof ip, "192.168.1.%d", 10 + i);
			json_array_append_new(addrs, json_pack("{s:s,s:s,s:s}", "ip", ip, "ifname",
							       "en0", "kind", "wifi"));
			for (int j = 0; j < n; j++) {
				if (j == i)
					continue;
				snprintf(ifn, sizeof ifn, "en%d", tb_if(i, j));
				snprintf(ip, sizeof ip, "10.%d.%d.%d", MIN(i, j), MAX(i, j), i + 1);
				json_array_append_new(addrs,
						      json_pack("{s:s,s:s}", "ip", ip, "ifname",
								ifn)); /* kind guessed */
				json_array_append_new(
				    seen, json_pack("{s:s,s:s}", "node_id", "", "ifname", ifn));
				char pid[33];
				node_id(pid, j);
				json_object_set_new(json_array_get(seen, json_array_size(seen) - 1),
						    "node_id", json_string(pid));
				if (!rdma || rdma[i][j]) {
					char dev[64];
					snprintf(dev, sizeof dev, "rdma_%s", ifn);
					json_array_append_new(
					    devs,
					    json_pack("{s:s,s:b}", "name", dev, "port_active", 1));
				}
			}
			/* Wired IPv4 on the Thunderbolt bridge is the macOS shape. */
		} else {
			const char *ifname = t == T_SWITCH_ETH ? "eth0" : "wlan0";
			snprintf(ip, sizeof ip, "10.0.0.%d", i + 1);
			json_array_append_new(addrs,
					      json_pack("{s:s,s:s}", "ip", ip, "ifname", ifname));
			json_array_append_new(
			    addrs, json_pack("{s:s,s:s}", "ip", "127.0.0.1", "ifname", "lo"));
			for (int j = 0; j < n; j++) {
				char pid[33];
				node_id(pid, j);
				if (j != i)
					json_array_append_new(seen,
							      json_pack("{s:s,s:s}", "node_id", pid,
									"ifname", ifname));
			}
		}
		json_t *node =
		    json_pack("{s:s,s:s,s:i,s:I,s:I,s:i,s:o,s:o,s:o}", "node_id", id, "host", host,
			      "port", 7070, "mem_total", (json_int_t)((mem_gib[i] + 8) * GIB),
			      "mem_avail", (json_int_t)(mem_gib[i] * GIB), "cores", 8, "addresses",
			      addrs, "seen_on", seen, "rdma", devs);
		if (bw)
			json_object_set_new(node, "bw", json_real(bw[i]));
		json_array_append_new(nodes, node);
	}
	if (perm) { /* a deterministic shuffle of nodes and of each node's arrays */
		unsigned s = perm;
		const char *keys[] = {"addresses", "seen_on", "rdma"};
		json_t *out = json_array();
		while (json_array_size(nodes)) {
			s = s * 1103515245u + 12345u;
			size_t k = (s >> 8) % json_array_size(nodes);
			json_t *node = json_incref(json_array_get(nodes, k));
			json_array_remove(nodes, k);
			for (size_t q = 0; q < 3; q++) {
				json_t *arr = json_object_get(node, keys[q]), *na = json_array();
				while (json_array_size(arr)) {
					s = s * 1103515245u + 12345u;
					size_t x = (s >> 8) % json_array_size(arr);
					json_array_append(na, json_array_get(arr, x));
					json_array_remove(arr, x);
				}
				json_object_set_new(node, keys[q], na);
			}
			json_array_append_new(out, node);
		}
		json_decref(nodes);
		nodes = out;
	}
	return json_pack("{s:i,s:o}", "epoch", 42, "nodes", nodes);
}

static plan_view_t *view_make(int n, const uint64_t *mem_gib, enum topo t, int rdma[8][8],
			      const double *bw, unsigned perm)
{
	json_t *j = view_json(n, mem_gib, t, rdma, bw, perm);
	char *s = json_dumps(j, 0), err[256] = "";
	json_decref(j);
	plan_view_t *v = NULL;
	int rc = plan_view_from_json(&v, s, err, sizeof err);
	if (rc)
		fprintf(stderr, "view: %s\n", err);
	free(s);
	return v;
}

/* An 8B-class model in Q8_0: 32 layers, 32 heads, 8 KV heads. */
static const char *MODEL_8B = "{\"arch\":\"llama\",\"n_layers\":32,\"n_heads\":32,\"n_kv_heads\":8,"
			      "\"head_dim\":128,\"dim\":4096,\"ffn\":14336,\"n_vocab\":128256,"
			      "\"n_ctx\":8192,\"wtype\":\"Q8_0\"}";

static plan_model_t model(const char *json)
{
	plan_model_t m;
	char err[256] = "";
	if (plan_model_from_json(&m, json, err, sizeof err))
		fprintf(stderr, "model: %s\n", err);
	return m;
}

static plan_model_t model_shape(int layers, int heads, int kv, int ffn)
{
	char js[512];
	snprintf(js, sizeof js,
		 "{\"n_layers\":%d,\"n_heads\":%d,\"n_kv_heads\":%d,\"head_dim\":64,\"dim\":%d,"
		 "\"ffn\":%d,\"n_vocab\":32000,\"n_ctx\":2048,\"wtype\":\"F16\"}",
		 layers, heads, kv, heads * 64, ffn);
	return model(js);
}

static plan_t *make(const plan_view_t *v, const plan_model_t *m, plan_strategy_t s, int *rc,
		    char *err, size_t errlen)
{
	plan_opts_t o;
	plan_opts_default(&o);
	o.strategy = s;
	plan_t *p = NULL;
	*rc = plan_make(&p, v, m, &o, err, errlen);
	return p;
}

/* ---- tests ---- */

TEST(link_guess)
{
	CHECK_EQ_INT(plan_link_guess("eth0"), PLAN_LINK_ETHERNET);
	CHECK_EQ_INT(plan_link_guess("enp3s0"), PLAN_LINK_ETHERNET);
	CHECK_EQ_INT(plan_link_guess("eno1"), PLAN_LINK_ETHERNET);
	CHECK_EQ_INT(plan_link_guess("en3"), PLAN_LINK_ETHERNET); /* macOS: ambiguous, see kind */
	CHECK_EQ_INT(plan_link_guess("veth1"), PLAN_LINK_ETHERNET);
	CHECK_EQ_INT(plan_link_guess("wlan0"), PLAN_LINK_WIFI);
	CHECK_EQ_INT(plan_link_guess("wlp2s0"), PLAN_LINK_WIFI);
	CHECK_EQ_INT(plan_link_guess("thunderbolt0"), PLAN_LINK_THUNDERBOLT);
	CHECK_EQ_INT(plan_link_guess("bridge0"), PLAN_LINK_THUNDERBOLT);
	CHECK_EQ_INT(plan_link_guess("lo"), PLAN_LINK_OTHER);
	CHECK_EQ_INT(plan_link_guess(""), PLAN_LINK_OTHER);
	CHECK_EQ_INT(plan_link_parse("wifi"), PLAN_LINK_WIFI);
	CHECK_EQ_INT(plan_link_parse("rdma"), -1);
}

TEST(view_roundtrip_and_errors)
{
	uint64_t mem[3] = {16, 16, 16};
	plan_view_t *v = view_make(3, mem, T_MESH_TB, NULL, NULL, 0);
	CHECK(v != NULL);
	if (!v)
		return;
	CHECK_EQ_INT(v->epoch, 42);
	CHECK(strcmp(v->nodes[0].node_id, v->nodes[1].node_id) < 0);
	/* rdma_en1 without "ifname" gets en1 (the macOS naming rule) */
	CHECK_EQ_STR(v->nodes[0].rdma[0].ifname, v->nodes[0].rdma[0].name + 5);
	char *s = plan_view_to_json(v), err[256];
	plan_view_t *v2 = NULL;
	CHECK_EQ_INT(plan_view_from_json(&v2, s, err, sizeof err), 0);
	char *s2 = v2 ? plan_view_to_json(v2) : NULL;
	CHECK_EQ_STR(s, s2);
	free(s);
	free(s2);
	plan_view_free(v2);
	plan_view_free(v);
	plan_view_free(NULL);

	static const struct {
		const char *json, *msg;
	} bad[] = {
	    {"[", "view: line 1: "},
	    {"[]", "view: must be a JSON object"},
	    {"{\"nodes\":[]}", "view: \"nodes\" must be a non-empty array"},
	    {"{\"nodes\":[{\"node_id\":\"12\",\"mem_avail\":1}]}",
	     "node 0: \"node_id\" must be 32 hex characters"},
	    {"{\"nodes\":[{\"node_id\":\"0123456789abcdef0123456789ABCDEF\"}]}",
	     "node 01234567: missing \"mem_avail\""},
	    {"{\"nodes\":[{\"node_id\":\"0123456789abcdef0123456789abcdef\",\"mem_avail\":1},"
	     "{\"node_id\":\"0123456789abcdef0123456789abcdef\",\"mem_avail\":1}]}",
	     "node 0123456789abcdef0123456789abcdef appears twice"},
	    {"{\"nodes\":[{\"node_id\":\"0123456789abcdef0123456789abcdef\",\"mem_avail\":1,"
	     "\"addresses\":[{\"ip\":\"1.2.3\"}]}]}",
	     "node 01234567: \"1.2.3\" is not an IP address"},
	    {"{\"nodes\":[{\"node_id\":\"0123456789abcdef0123456789abcdef\",\"mem_avail\":1,"
	     "\"addresses\":[{\"ip\":\"1.2.3.4\",\"kind\":\"pigeon\"}]}]}",
	     "node 01234567: kind \"pigeon\" is not thunderbolt, ethernet, wifi or other"},
	    {"{\"nodes\":[{\"node_id\":\"0123456789abcdef0123456789abcdef\",\"mem_avail\":-5}]}",
	     "node 01234567: \"mem_avail\" must be an integer from 0 to 1152921504606846976"},
	};
	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		plan_view_t *x = NULL;
		err[0] = 0;
		CHECK_EQ_INT(plan_view_from_json(&x, bad[i].json, err, sizeof err), SH_EFORMAT);
		CHECK(x == NULL);
		if (strncmp(err, bad[i].msg, strlen(bad[i].msg))) {
			fprintf(stderr, "case %zu: got \"%s\"\n", i, err);
			CHECK(0);
		}
	}
}

TEST(model_json)
{
	plan_model_t m = model(MODEL_8B);
	CHECK_EQ_INT(m.n_layers, 32);
	CHECK_EQ_INT(m.ffn_block, 32);
	/* Q8_0: 34 bytes per 32 weights; attn_q 4096x4096 + attn_output 4096x4096 */
	CHECK_EQ_INT(m.attn_qo_bytes, 2ull * 4096 * 4096 / 32 * 34);
	CHECK_EQ_INT(m.attn_kv_bytes, 2ull * 1024 * 4096 / 32 * 34);
	CHECK_EQ_INT(m.ffn_bytes, 3ull * 14336 * 4096 / 32 * 34);
	CHECK_EQ_INT(m.embd_bytes, 128256ull * 4096 / 32 * 34);
	char err[256];
	plan_model_t x;
	CHECK_EQ_INT(plan_model_from_json(&x,
					  "{\"n_layers\":2,\"n_heads\":6,\"n_kv_heads\":4,"
					  "\"dim\":64,\"ffn\":64,\"n_vocab\":9,\"n_ctx\":8}",
					  err, sizeof err),
		     SH_EFORMAT);
	CHECK_EQ_STR(err, "model: n_heads (6) must be a multiple of n_kv_heads (4)");
	CHECK_EQ_INT(plan_model_from_json(&x, "{\"n_layers\":2}", err, sizeof err), SH_EFORMAT);
	CHECK_EQ_STR(err, "model: missing \"n_heads\"");
	CHECK_EQ_INT(plan_model_from_json(&x,
					  "{\"n_layers\":2,\"n_heads\":4,\"dim\":64,\"ffn\":512,"
					  "\"n_vocab\":9,\"n_ctx\":8,\"wtype\":\"Q4_K\"}",
					  err, sizeof err),
		     0);
	CHECK_EQ_INT(x.ffn_block, 256);
	CHECK_EQ_INT(x.head_dim, 16);
}

/* 1 to 8 nodes on a switch: tensor, sorted ranks, rows and ports, exact cover. */
TEST(nodes_1_to_8)
{
	plan_model_t m = model(MODEL_8B);
	for (int n = 1; n <= 8; n++) {
		uint64_t mem[8];
		for (int i = 0; i < n; i++)
			mem[i] = 64;
		plan_view_t *v = view_make(n, mem, T_SWITCH_ETH, NULL, NULL, 0);
		char err[512] = "";
		int rc;
		plan_t *p = make(v, &m, PLAN_AUTO, &rc, err, sizeof err);
		CHECK_EQ_INT(rc, 0);
		if (!p) {
			fprintf(stderr, "n=%d: %s\n", n, err);
			plan_view_free(v);
			continue;
		}
		CHECK_EQ_INT(plan_n_ranks(p), n);
		CHECK_EQ_INT(plan_strategy(p), PLAN_TENSOR);
		CHECK_EQ_STR(plan_reason(p), n == 1
						 ? "single node"
						 : "every pair of nodes has a wired or RDMA link "
						   "(slowest: ethernet between ranks 0 and 1)");
		CHECK_EQ_INT(plan_check_cover(p, err, sizeof err), 0);
		CHECK_EQ_INT(strlen(plan_hash(p)), 16);
		CHECK_EQ_INT(plan_epoch(p), 42);
		for (int r = 0; r < n; r++) {
			const plan_rank_t *k = plan_rank(p, r);
			CHECK_EQ_INT(k->port, PLAN_DEFAULT_PORT + r);
			CHECK_EQ_INT(plan_rank_of(p, k->node_id), r);
			if (r)
				CHECK(strcmp(plan_rank(p, r - 1)->node_id, k->node_id) < 0);
			if (n == 1)
				CHECK_EQ_STR(k->ip, "127.0.0.1");
			else
				CHECK(!strncmp(k->ip, "10.0.0.", 7));
			/* equal machines: KV groups differ by at most one */
			CHECK((k->kv1 - k->kv0) == 8 / n || (k->kv1 - k->kv0) == 8 / n + 1);
		}
		CHECK(plan_rank(p, n) == NULL);
		CHECK_EQ_INT(plan_rank_of(p, "nope"), -1);
		plan_free(p);
		plan_view_free(v);
	}
}

/* 64/32/16 GB: shares in proportion, in both strategies; bandwidth weighting. */
TEST(unequal_memory)
{
	uint64_t mem[3] = {64, 32, 16};
	plan_model_t m = model(MODEL_8B);
	plan_view_t *v = view_make(3, mem, T_SWITCH_ETH, NULL, NULL, 0);
	char err[512] = "", id[33];
	int rc, r64, r32, r16;
	plan_t *p = make(v, &m, PLAN_PIPELINE, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (!p)
		goto out;
	node_id(id, 0), r64 = plan_rank_of(p, id);
	node_id(id, 1), r32 = plan_rank_of(p, id);
	node_id(id, 2), r16 = plan_rank_of(p, id);
	/* 32 layers by 4:2:1: 18.29, 9.14, 4.57 -> 18, 9, 4, and the one left to the largest
	 * remainder (.57) */
#define LAYERS(r) (plan_rank(p, r)->layer1 - plan_rank(p, r)->layer0)
	CHECK_EQ_INT(LAYERS(r64), 18);
	CHECK_EQ_INT(LAYERS(r32), 9);
	CHECK_EQ_INT(LAYERS(r16), 5);
	CHECK_EQ_STR(plan_reason(p), "pipeline requested");
	plan_free(p);

	p = make(v, &m, PLAN_TENSOR, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (!p)
		goto out;
		/* 448 FFN blocks of 32 columns: 4:2:1 within one block of 256/128/64 */
#define COLS(r) (plan_rank(p, r)->ffn1 - plan_rank(p, r)->ffn0)
	CHECK(abs(COLS(r64) - 256 * 32) <= 32);
	CHECK(abs(COLS(r32) - 128 * 32) <= 32);
	CHECK(abs(COLS(r16) - 64 * 32) <= 32);
	CHECK_EQ_INT(plan_check_cover(p, err, sizeof err), 0);
	/* 8 KV groups, the larger machine never gets fewer */
	int kvs = 0;
	for (int r = 0; r < 3; r++)
		kvs += plan_rank(p, r)->kv1 - plan_rank(p, r)->kv0;
	CHECK_EQ_INT(kvs, 8);
	CHECK(plan_rank(p, r64)->kv1 - plan_rank(p, r64)->kv0 >=
	      plan_rank(p, r32)->kv1 - plan_rank(p, r32)->kv0);
	plan_free(p);
	plan_view_free(v);

	/* equal memory, bandwidth 100 vs 50 GB/s: 2:1 */
	uint64_t eq[2] = {64, 64};
	double bw[2] = {100.0, 50.0};
	v = view_make(2, eq, T_SWITCH_ETH, NULL, bw, 0);
	p = make(v, &m, PLAN_PIPELINE, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (p) {
		node_id(id, 0);
		int fast = plan_rank_of(p, id);
		CHECK_EQ_INT(LAYERS(fast), 21); /* 21.33 and 10.67: the one left goes to .67 */
		CHECK_EQ_INT(LAYERS(1 - fast), 11);
		plan_free(p);
	}
	plan_view_free(v);

	/* 64/1/1 GB on 4 layers: quotas 3.93/0.03/0.03 give 4/0/0; the small ones take a layer
	 * each from the largest, so no rank is empty */
	uint64_t tiny[3] = {64, 1, 1};
	plan_model_t m4 = model_shape(4, 8, 8, 1024);
	v = view_make(3, tiny, T_SWITCH_WIFI, NULL, NULL, 0);
	p = make(v, &m4, PLAN_PIPELINE, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (p) {
		node_id(id, 0), r64 = plan_rank_of(p, id);
		CHECK_EQ_INT(LAYERS(r64), 2);
		CHECK_EQ_INT(plan_check_cover(p, err, sizeof err), 0);
		plan_free(p);
	}
out:
	plan_view_free(v);
}

static const char *mat(const plan_t *p, int i, int j)
{
	const char *d = plan_rank(p, i)->rdma[j];
	return d[0] ? d : "null";
}

/* A macOS-shaped 3-Mac Thunderbolt mesh (rdma_enX named after the interface): full mesh. */
/* Mixture of experts (Mixtral 8x7B-shaped, Q8_0, a shared block too): routed experts split whole
 * by memory 4:2:1 (8 experts: 5/2/1), the shared block by columns, the fit check counts the
 * held experts' bytes; plan.json carries the ranges and parses back; pipeline keeps them whole. */
TEST(moe_experts)
{
	uint64_t mem[3] = {64, 32, 16};
	uint64_t exp_layer = 3ull * 4096 * 14336 * 8 / 32 * 34; /* 8 experts' gate/up/down */
	char js[1024], err[512] = "", id[33];
	snprintf(js, sizeof js,
		 "{\"arch\":\"llama\",\"n_layers\":32,\"n_heads\":32,\"n_kv_heads\":8,"
		 "\"head_dim\":128,\"dim\":4096,\"ffn\":14336,\"n_vocab\":32000,\"n_ctx\":4096,"
		 "\"wtype\":\"Q8_0\",\"ffn_bytes\":0,\"n_experts\":8,\"ffn_shexp\":1024,"
		 "\"expert_bytes\":%llu,\"shexp_bytes\":%llu}",
		 (unsigned long long)exp_layer, (unsigned long long)(3ull * 4096 * 1024 / 32 * 34));
	plan_model_t m = model(js);
	CHECK_EQ_INT(m.n_experts, 8);
	plan_view_t *v = view_make(3, mem, T_SWITCH_ETH, NULL, NULL, 0);
	int rc, r[3];
	plan_t *p = make(v, &m, PLAN_TENSOR, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (!p) {
		fprintf(stderr, "moe plan: %s\n", err);
		plan_view_free(v);
		return;
	}
	for (int i = 0; i < 3; i++)
		node_id(id, i), r[i] = plan_rank_of(p, id);
#define EXPS(k) (plan_rank(p, k)->exp1 - plan_rank(p, k)->exp0)
	CHECK_EQ_INT(EXPS(r[0]), 5);
	CHECK_EQ_INT(EXPS(r[1]), 2);
	CHECK_EQ_INT(EXPS(r[2]), 1);
	CHECK_EQ_INT(plan_check_cover(p, err, sizeof err), 0);
	int shx = 0;
	for (int k = 0; k < 3; k++) {
		shx += plan_rank(p, k)->shx1 - plan_rank(p, k)->shx0;
		CHECK_EQ_INT(plan_rank(p, k)->shx0 % m.ffn_block, 0);
	}
	CHECK_EQ_INT(shx, 1024);
	/* the largest rank's weights include its 5 experts of every layer */
	CHECK(plan_rank(p, r[0])->weight_bytes > 32 * (exp_layer / 8 * 5));
	CHECK(plan_rank(p, r[2])->weight_bytes < 32 * (exp_layer / 8 * 2));
	char *s = plan_to_json(p);
	CHECK(s && strstr(s, "\"experts\"") && strstr(s, "\"n_experts\": 8"));
	plan_t *q = NULL;
	CHECK_EQ_INT(plan_from_json(&q, s, err, sizeof err), 0);
	if (q) {
		for (int k = 0; k < 3; k++) {
			CHECK_EQ_INT(plan_rank(q, k)->exp0, plan_rank(p, k)->exp0);
			CHECK_EQ_INT(plan_rank(q, k)->exp1, plan_rank(p, k)->exp1);
			CHECK_EQ_INT(plan_rank(q, k)->shx1, plan_rank(p, k)->shx1);
		}
		plan_free(q);
	}
	free(s);
	plan_free(p);
	p = make(v, &m, PLAN_PIPELINE, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	for (int k = 0; p && k < 3; k++)
		CHECK_EQ_INT(EXPS(k), 8);
#undef EXPS
	plan_free(p);
	plan_view_free(v);
}

TEST(rdma_full_mesh_macos)
{
	uint64_t mem[3] = {64, 64, 64};
	plan_model_t m = model(MODEL_8B);
	plan_view_t *v = view_make(3, mem, T_MESH_TB, NULL, NULL, 0);
	char err[512] = "";
	int rc;
	plan_t *p = make(v, &m, PLAN_AUTO, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (!p) {
		fprintf(stderr, "%s\n", err);
		plan_view_free(v);
		return;
	}
	CHECK_EQ_INT(plan_strategy(p), PLAN_TENSOR);
	CHECK_EQ_STR(plan_reason(p), "every pair of nodes has an RDMA link");
	CHECK(plan_rdma_full_mesh(p));
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 3; j++) {
			if (i == j) {
				CHECK_EQ_STR(mat(p, i, j), "null");
				continue;
			}
			/* device on rank i towards rank j = rdma_ + the interface i sees j on */
			char want[32], a[33];
			int ni = -1, nj = -1;
			for (int x = 0; x < 3; x++) {
				node_id(a, x);
				if (!strcmp(a, plan_rank(p, i)->node_id))
					ni = x;
				if (!strcmp(a, plan_rank(p, j)->node_id))
					nj = x;
			}
			snprintf(want, sizeof want, "rdma_en%d", tb_if(ni, nj));
			CHECK_EQ_STR(mat(p, i, j), want);
		}
	/* ring: rank r listens on the Thunderbolt address of its link to rank r-1; the JACCL
	 * hosts file lists the LAN (Wi-Fi) address, the one every rank reaches (docs/mlx.md) */
	CHECK_EQ_STR(plan_mlx_backend(p), "jaccl");
	for (int r = 0; r < 3; r++) {
		const plan_rank_t *k = plan_rank(p, r);
		CHECK(!strncmp(k->ip, "10.", 3));
		CHECK(k->n_ips == 1);
		CHECK(!strncmp(k->ips[0], "192.168.1.", 10));
	}
	plan_free(p);
	plan_view_free(v);
}

/* Only ranks' pair (node 0, node 1) has RDMA: a partial mesh, still wired -> tensor. */
TEST(rdma_partial_and_none)
{
	uint64_t mem[3] = {64, 64, 64};
	int part[8][8] = {{0}};
	part[0][1] = part[1][0] = 1;
	plan_model_t m = model(MODEL_8B);
	plan_view_t *v = view_make(3, mem, T_MESH_TB, part, NULL, 0);
	char err[512] = "", a[33], b[33];
	int rc;
	plan_t *p = make(v, &m, PLAN_AUTO, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (p) {
		CHECK(!plan_rdma_full_mesh(p));
		CHECK_EQ_INT(plan_strategy(p), PLAN_TENSOR);
		CHECK(strstr(plan_reason(p), "wired or RDMA link (slowest: ethernet") != NULL);
		node_id(a, 0), node_id(b, 1);
		int ra = plan_rank_of(p, a), rb = plan_rank_of(p, b), nulls = 0;
		CHECK_EQ_STR(mat(p, ra, rb), "rdma_en1");
		CHECK_EQ_STR(mat(p, rb, ra), "rdma_en1");
		for (int i = 0; i < 3; i++)
			for (int j = 0; j < 3; j++)
				nulls += !strcmp(mat(p, i, j), "null");
		CHECK_EQ_INT(nulls, 7);
		plan_free(p);
	}
	plan_view_free(v);

	v = view_make(3, mem, T_SWITCH_WIFI, NULL, NULL, 0);
	p = make(v, &m, PLAN_AUTO, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (p) {
		CHECK_EQ_INT(plan_strategy(p), PLAN_PIPELINE);
		CHECK_EQ_STR(plan_reason(p),
			     "ranks 0 and 1 are linked only by wifi: a pipeline moves less data");
		CHECK(!plan_rdma_full_mesh(p));
		for (int i = 0; i < 3; i++)
			for (int j = 0; j < 3; j++)
				CHECK_EQ_STR(mat(p, i, j), "null");
		CHECK_EQ_INT(plan_check_cover(p, err, sizeof err), 0);
		plan_free(p);
	}
	plan_view_free(v);
}

/* KV heads fewer than nodes: query heads split, KV heads replicated where needed. */
TEST(kv_heads_fewer_than_nodes)
{
	static const struct {
		int n, heads, kv;
		int q[8], kv0[8], kv1[8];
	} cases[] = {
	    {4, 8, 2, {2, 2, 2, 2}, {0, 0, 1, 1}, {1, 1, 2, 2}},
	    {3, 8, 2, {3, 3, 2}, {0, 0, 1}, {1, 2, 2}},
	    {5, 8, 1, {2, 2, 2, 1, 1}, {0, 0, 0, 0, 0}, {1, 1, 1, 1, 1}},
	    {2, 8, 8, {4, 4}, {0, 4}, {4, 8}},
	};
	for (size_t c = 0; c < ARRAY_LEN(cases); c++) {
		uint64_t mem[8] = {32, 32, 32, 32, 32, 32, 32, 32};
		plan_model_t m = model_shape(12, cases[c].heads, cases[c].kv, 1024);
		plan_view_t *v = view_make(cases[c].n, mem, T_SWITCH_ETH, NULL, NULL, 0);
		char err[512] = "";
		int rc;
		plan_t *p = make(v, &m, PLAN_TENSOR, &rc, err, sizeof err);
		CHECK_EQ_INT(rc, 0);
		if (p) {
			for (int r = 0; r < cases[c].n; r++) {
				const plan_rank_t *k = plan_rank(p, r);
				CHECK_EQ_INT(k->q1 - k->q0, cases[c].q[r]);
				CHECK_EQ_INT(k->kv0, cases[c].kv0[r]);
				CHECK_EQ_INT(k->kv1, cases[c].kv1[r]);
			}
			CHECK_EQ_INT(plan_check_cover(p, err, sizeof err), 0);
			plan_free(p);
		}
		plan_view_free(v);
	}
	/* 8 ranks, 4 query heads: tensor is impossible; auto says so and pipelines */
	uint64_t mem[8] = {32, 32, 32, 32, 32, 32, 32, 32};
	plan_model_t m = model_shape(12, 4, 2, 1024);
	plan_view_t *v = view_make(8, mem, T_SWITCH_ETH, NULL, NULL, 0);
	char err[512] = "";
	int rc;
	plan_t *p = make(v, &m, PLAN_AUTO, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (p) {
		CHECK_EQ_INT(plan_strategy(p), PLAN_PIPELINE);
		CHECK_EQ_STR(plan_reason(p), "8 ranks outnumber the model's 4 query heads");
		plan_free(p);
	}
	p = make(v, &m, PLAN_TENSOR, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, SH_EINVAL);
	CHECK_EQ_STR(err, "tensor parallel is impossible: 8 ranks outnumber the model's 4 query "
			  "heads");
	m.n_layers = 4;
	p = make(v, &m, PLAN_PIPELINE, &rc, err, sizeof err);
	CHECK_EQ_INT(rc, SH_EINVAL);
	CHECK_EQ_STR(err, "pipeline is impossible: 8 ranks outnumber the model's 4 layers");
	plan_view_free(v);
}

/* Layer counts not divisible by the node count: every layer exactly once. */
TEST(pipeline_layers_not_divisible)
{
	static const struct {
		int n, layers;
		int want[8];
	} cases[] = {
	    {5, 32, {7, 7, 6, 6, 6}},         {3, 22, {8, 7, 7}}, {7, 8, {2, 1, 1, 1, 1, 1, 1}},
	    {8, 8, {1, 1, 1, 1, 1, 1, 1, 1}}, {2, 3, {2, 1}},     {6, 61, {11, 10, 10, 10, 10, 10}},
	};
	for (size_t c = 0; c < ARRAY_LEN(cases); c++) {
		uint64_t mem[8] = {32, 32, 32, 32, 32, 32, 32, 32};
		plan_model_t m = model_shape(cases[c].layers, 8, 8, 1024);
		plan_view_t *v = view_make(cases[c].n, mem, T_SWITCH_WIFI, NULL, NULL, 0);
		char err[512] = "";
		int rc;
		plan_t *p = make(v, &m, PLAN_AUTO, &rc, err, sizeof err);
		CHECK_EQ_INT(rc, 0);
		if (p) {
			CHECK_EQ_INT(plan_strategy(p), PLAN_PIPELINE);
			int pos = 0;
			for (int r = 0; r < cases[c].n; r++) {
				const plan_rank_t *k = plan_rank(p, r);
				CHECK_EQ_INT(k->layer0, pos);
				CHECK_EQ_INT(k->layer1 - k->layer0, cases[c].want[r]);
				pos = k->layer1;
			}
			CHECK_EQ_INT(pos, cases[c].layers);
			CHECK_EQ_INT(plan_check_cover(p, err, sizeof err), 0);
			plan_free(p);
		}
		plan_view_free(v);
	}
}

/* Not fitting: the exact message, single node and a cluster. */
TEST(not_fitting_message)
{
	/* 10 layers of 2e9 bytes + 1e9 embedding + 1e9 output = 22 GB of weights */
	plan_model_t m =
	    model("{\"n_layers\":10,\"n_heads\":4,\"head_dim\":16,\"dim\":64,"
		  "\"ffn\":256,\"n_vocab\":1000,\"n_ctx\":1000,\"attn_qo_bytes\":500000000,"
		  "\"attn_kv_bytes\":500000000,\"ffn_bytes\":1000000000,\"norm_bytes\":0,"
		  "\"embd_bytes\":1000000000,\"output_bytes\":1000000000}");
	const char *view = "{\"nodes\":[{\"node_id\":\"abcdef0123456789abcdef0123456789\","
			   "\"host\":\"tiny.local\",\"mem_avail\":10000000000}]}";
	plan_view_t *v = NULL;
	char err[512] = "";
	CHECK_EQ_INT(plan_view_from_json(&v, view, err, sizeof err), 0);
	plan_opts_t o;
	plan_opts_default(&o);
	o.headroom_bytes = 1000000000;
	o.headroom_permille = 0;
	plan_t *p = NULL;
	CHECK_EQ_INT(plan_make(&p, v, &m, &o, err, sizeof err), SH_ENOFIT);
	CHECK(p == NULL);
	/* KV: 1000 tokens * 10 layers * 2 * 4 heads * 16 * 4 bytes = 5.12 MB */
	CHECK_EQ_STR(err,
		     "model does not fit (tensor, 1 rank): short by 13.0 GB in total; rank 0 "
		     "(tiny.local, node abcdef01) needs 23.0 GB (weights 22.0, KV cache 0.0 for "
		     "1000 tokens, activations 0.0, headroom 1.0) but has 10.0 GB available; "
		     "fix: add nodes, use a shorter context (--ctx, now 1000) or a smaller "
		     "quantization");
	plan_view_free(v);

	/* the 8B model, 8192 tokens of F32 KV cache (4.3 GB) on two 4 GiB machines, wired */
	uint64_t mem[2] = {4, 4};
	plan_model_t big = model(MODEL_8B);
	v = view_make(2, mem, T_SWITCH_ETH, NULL, NULL, 0);
	plan_opts_default(&o);
	CHECK_EQ_INT(plan_make(&p, v, &big, &o, err, sizeof err), SH_ENOFIT);
	CHECK_EQ_STR(err,
		     "model does not fit (tensor, 2 ranks): short by 3.7 GB in total; rank 0 "
		     "(host1.local, node 3c6ef372) needs 6.4 GB (weights 4.8, KV cache 1.1 for "
		     "8192 tokens, activations 0.0, headroom 0.5) but has 4.3 GB available; "
		     "fix: add nodes, use a shorter context (--ctx, now 8192) or a smaller "
		     "quantization");
	plan_view_free(v);
	/* the first fix it names works: four such machines */
	uint64_t mem4[4] = {4, 4, 4, 4};
	v = view_make(4, mem4, T_SWITCH_ETH, NULL, NULL, 0);
	CHECK_EQ_INT(plan_make(&p, v, &big, &o, err, sizeof err), 0);
	plan_free(p);
	plan_view_free(v);
}

/* Writes the four outputs (and the canonical view) of a plan into one string. */
static char *all_outputs(const plan_view_t *v, const plan_t *p)
{
	char *a = plan_hostfile_json(p), *b = plan_mlx_hosts_json(p), *c = plan_rdma_json(p);
	char *d = plan_to_json(p), *e = plan_view_to_json(v);
	size_t n = strlen(a) + strlen(b) + strlen(c) + strlen(d) + strlen(e) + 1;
	char *s = malloc(n);
	snprintf(s, n, "%s%s%s%s%s", a, b, c, d, e);
	free(a), free(b), free(c), free(d), free(e);
	return s;
}

TEST(shuffled_input_identical_output)
{
	uint64_t mem[6] = {64, 32, 16, 48, 24, 96};
	int part[8][8] = {{0}};
	part[0][2] = part[2][0] = part[3][4] = part[4][3] = 1;
	plan_model_t m = model(MODEL_8B);
	for (int t = 0; t < 3; t++) {
		plan_view_t *v0 = view_make(6, mem, (enum topo)t, part, NULL, 0);
		char err[512] = "";
		int rc;
		plan_t *p0 = make(v0, &m, PLAN_AUTO, &rc, err, sizeof err);
		CHECK_EQ_INT(rc, 0);
		char *ref = p0 ? all_outputs(v0, p0) : NULL;
		for (unsigned perm = 1; ref && perm <= 10; perm++) {
			plan_view_t *v = view_make(6, mem, (enum topo)t, part, NULL, perm * 7919);
			plan_t *p = make(v, &m, PLAN_AUTO, &rc, err, sizeof err);
			CHECK_EQ_INT(rc, 0);
			char *got = p ? all_outputs(v, p) : NULL;
			CHECK_EQ_STR(got, ref);
			CHECK_EQ_STR(plan_hash(p), plan_hash(p0));
			free(got);
			plan_free(p);
			plan_view_free(v);
		}
		free(ref);
		plan_free(p0);
		plan_view_free(v0);
	}
}

/* Every output parses back and follows formats.md. */
TEST(outputs_parse_back)
{
	uint64_t mem[4] = {64, 32, 16, 8};
	int part[8][8] = {{0}};
	part[0][1] = part[1][0] = part[1][2] = part[2][1] = 1;
	plan_model_t m = model_shape(16, 16, 4, 2048);
	for (int n = 1; n <= 4; n++) {
		plan_view_t *v = view_make(n, mem, T_MESH_TB, part, NULL, 0);
		char err[512] = "";
		int rc;
		plan_t *p = make(v, &m, PLAN_AUTO, &rc, err, sizeof err);
		CHECK_EQ_INT(rc, 0);
		if (!p) {
			plan_view_free(v);
			continue;
		}
		char *hs = plan_hostfile_json(p), *ms = plan_mlx_hosts_json(p),
		     *rs = plan_rdma_json(p);
		char *ps = plan_to_json(p);
		json_t *h = json_loads(hs, 0, NULL), *mo = json_loads(ms, 0, NULL);
		json_t *mh = json_object_get(mo, "hosts");
		json_t *rd = json_loads(rs, 0, NULL), *pj = json_loads(ps, 0, NULL);
		/* one rank: an empty hostfile, as mlx.launch writes it (launch.py launch_ring) */
		CHECK(n == 1 ? !h && !hs[0] : json_is_array(h) && json_array_size(h) == (size_t)n);
		CHECK(json_is_array(mh) && json_array_size(mh) == (size_t)n);
		CHECK(json_is_array(rd) && json_array_size(rd) == (size_t)n);
		CHECK(json_is_object(pj));
		CHECK((n == 1 || hs[strlen(hs) - 1] == '\n') && rs[strlen(rs) - 1] == '\n');
		for (int i = 0; mh && rd && i < n; i++) {
			const plan_rank_t *k = plan_rank(p, i);
			char row[64];
			snprintf(row, sizeof row, "%s:%d", k->ip, PLAN_DEFAULT_PORT + i);
			if (n > 1)
				CHECK_EQ_STR(json_string_value(
						 json_array_get(json_array_get(h, (size_t)i), 0)),
					     row);
			else
				CHECK_EQ_STR(row, "127.0.0.1:32323");
			json_t *e = json_array_get(mh, (size_t)i);
			CHECK_EQ_STR(json_string_value(json_object_get(e, "ssh")),
				     n == 1 ? "127.0.0.1" : k->host);
			CHECK_EQ_STR(
			    json_string_value(json_array_get(json_object_get(e, "ips"), 0)),
			    k->ips[0]);
			json_t *mrow = json_object_get(e, "rdma"),
			       *rrow = json_array_get(rd, (size_t)i);
			CHECK(json_array_size(mrow) == (size_t)n &&
			      json_array_size(rrow) == (size_t)n);
			for (int j = 0; j < n; j++) {
				json_t *x = json_array_get(rrow, (size_t)j);
				CHECK(json_equal(x, json_array_get(mrow, (size_t)j)));
				if (i == j)
					CHECK(json_is_null(x));
				else if (k->rdma[j][0])
					CHECK_EQ_STR(json_string_value(x), k->rdma[j]);
				else
					CHECK(json_is_null(x));
			}
		}
		CHECK_EQ_STR(json_string_value(json_object_get(pj, "hash")), plan_hash(p));
		CHECK_EQ_INT(json_array_size(json_object_get(pj, "ranks")), n);
		/* a follower parses the plan and gets the same bytes back */
		plan_t *q = NULL;
		CHECK_EQ_INT(plan_from_json(&q, ps, err, sizeof err), 0);
		if (q) {
			char *ps2 = plan_to_json(q), *hs2 = plan_hostfile_json(q);
			char *ms2 = plan_mlx_hosts_json(q), *rs2 = plan_rdma_json(q);
			CHECK_EQ_STR(ps2, ps);
			CHECK_EQ_STR(hs2, hs);
			CHECK_EQ_STR(ms2, ms);
			CHECK_EQ_STR(rs2, rs);
			free(ps2), free(hs2), free(ms2), free(rs2);
			plan_free(q);
		}
		json_decref(h), json_decref(mo), json_decref(rd), json_decref(pj);
		free(hs), free(ms), free(rs), free(ps);
		plan_free(p);
		plan_view_free(v);
	}
}

TEST(rdma_matrix_text)
{
	uint64_t mem[3] = {64, 64, 64};
	plan_model_t m = model(MODEL_8B);
	plan_view_t *v = view_make(3, mem, T_MESH_TB, NULL, NULL, 0);
	char err[512] = "";
	int rc;
	plan_t *p = make(v, &m, PLAN_AUTO, &rc, err, sizeof err);
	if (p) {
		char *s = plan_rdma_json(p);
		/* one row per line, as in formats.md */
		int lines = 0;
		for (char *c = s; *c; c++)
			lines += *c == '\n';
		CHECK_EQ_INT(lines, 3);
		CHECK(!strncmp(s, "[[null,\"rdma_en", 15));
		free(s);
		plan_free(p);
	}
	plan_view_free(v);
}

TEST(plan_from_json_rejects_tampering)
{
	uint64_t mem[2] = {64, 32};
	plan_model_t m = model(MODEL_8B);
	plan_view_t *v = view_make(2, mem, T_SWITCH_ETH, NULL, NULL, 0);
	char err[512] = "";
	int rc;
	plan_t *p = make(v, &m, PLAN_TENSOR, &rc, err, sizeof err), *q = NULL;
	char *s = p ? plan_to_json(p) : NULL;
	if (s) {
		/* shift the boundary between the two ranks' FFN columns: still a valid cover */
		json_t *j = json_loads(s, 0, NULL);
		json_t *r0 = json_array_get(json_object_get(j, "ranks"), 0);
		json_t *r1 = json_array_get(json_object_get(j, "ranks"), 1);
		int b = (int)json_integer_value(json_array_get(json_object_get(r0, "ffn"), 1));
		json_array_set_new(json_object_get(r0, "ffn"), 1, json_integer(b - 32));
		json_array_set_new(json_object_get(r1, "ffn"), 0, json_integer(b - 32));
		char *t = json_dumps(j, 0);
		CHECK_EQ_INT(plan_from_json(&q, t, err, sizeof err), SH_EFORMAT);
		CHECK(!strncmp(err, "plan: hash mismatch (says ", 26));
		/* an overlap is caught before the hash */
		json_array_set_new(json_object_get(r1, "ffn"), 0, json_integer(b - 64));
		free(t);
		t = json_dumps(j, 0);
		CHECK_EQ_INT(plan_from_json(&q, t, err, sizeof err), SH_EFORMAT);
		CHECK_EQ_STR(err, "plan: FFN columns not covered once");
		CHECK_EQ_INT(plan_from_json(&q, "{}", err, sizeof err), SH_EFORMAT);
		CHECK_EQ_STR(err, "plan: missing or bad top-level field");
		free(t);
		json_decref(j);
	}
	free(s);
	plan_free(p);
	plan_view_free(v);
}

/* Views without seen_on (hand-written): links are guessed from addresses in the same /24. */
TEST(links_without_seen_on)
{
	static const struct {
		const char *if_a, *ip_a, *if_b, *ip_b;
		plan_strategy_t want;
		const char *reason;
	} cases[] = {
	    {"eth0", "10.0.0.1", "eth0", "10.0.0.2", PLAN_TENSOR,
	     "every pair of nodes has a wired or RDMA link (slowest: ethernet between ranks 0 and "
	     "1)"},
	    {"eth0", "10.0.0.1", "wlan0", "10.0.0.2", PLAN_PIPELINE,
	     "ranks 0 and 1 are linked only by wifi: a pipeline moves less data"},
	    {"eth0", "10.0.0.1", "eth0", "10.0.9.2", PLAN_PIPELINE,
	     "ranks 0 and 1 are linked only by an unknown link: a pipeline moves less data"},
	};
	plan_model_t m = model(MODEL_8B);
	for (size_t c = 0; c < ARRAY_LEN(cases); c++) {
		char js[1024], err[512] = "";
		snprintf(js, sizeof js,
			 "{\"nodes\":[{\"node_id\":\"%032d\",\"mem_avail\":64000000000,"
			 "\"addresses\":[{\"ip\":\"%s\",\"ifname\":\"%s\"}]},"
			 "{\"node_id\":\"%032d\",\"mem_avail\":64000000000,"
			 "\"addresses\":[{\"ip\":\"%s\",\"ifname\":\"%s\"}]}]}",
			 1, cases[c].ip_a, cases[c].if_a, 2, cases[c].ip_b, cases[c].if_b);
		plan_view_t *v = NULL;
		CHECK_EQ_INT(plan_view_from_json(&v, js, err, sizeof err), 0);
		int rc;
		plan_t *p = v ? make(v, &m, PLAN_AUTO, &rc, err, sizeof err) : NULL;
		CHECK(p != NULL);
		if (p) {
			CHECK_EQ_INT(plan_strategy(p), cases[c].want);
			CHECK_EQ_STR(plan_reason(p), cases[c].reason);
			CHECK_EQ_STR(plan_rank(p, 0)->ip, cases[c].ip_a);
		}
		plan_free(p);
		plan_view_free(v);
	}
}

int main(void)
{
	RUN(link_guess);
	RUN(view_roundtrip_and_errors);
	RUN(model_json);
	RUN(nodes_1_to_8);
	RUN(unequal_memory);
	RUN(moe_experts);
	RUN(rdma_full_mesh_macos);
	RUN(rdma_partial_and_none);
	RUN(kv_heads_fewer_than_nodes);
	RUN(pipeline_layers_not_divisible);
	RUN(not_fitting_message);
	RUN(shuffled_input_identical_output);
	RUN(outputs_parse_back);
	RUN(rdma_matrix_text);
	RUN(plan_from_json_rejects_tampering);
	RUN(links_without_seen_on);
	return harness_done();
}
