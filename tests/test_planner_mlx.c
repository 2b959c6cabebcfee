/*
 * test_planner_mlx.c: the files shoal writes for MLX, checked against MLX's rules as MLX's own
 * source states them (ml-explore/mlx at the commit docs/mlx.md names). One test per finding of
 * issue 17, on four views: three hosts on Ethernet with 2, 1 and 2 addresses; a 4-Mac
 * Thunderbolt full mesh with Wi-Fi on en0; the 4-Mac partial ring cabled mac1-mac3-mac2-mac4-mac1;
 * one node. Each view is built from a physical description (which interface sits on which cable
 * or LAN), and that description, not the planner, says which address a rank can reach.
 *
 * The checks below are our own C for MLX's rules (no MLX code): each names the MLX file and
 * function it follows. Every view is planned twice: with seen_on (what mDNS would tell) and
 * without (the planner's /24 guess, what the agent's views carry today): same verdicts.
 */
#include "planner/plan_int.h"

#include "agent/session/exec.h"
#include "common/common.h"
#include "harness.h"

#include <arpa/inet.h>
#include <jansson.h>

/* ---- the physical fixtures ---- */

/* The fixtures below leave a segment's trailing prefix out when it has none. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#define MAXEND 4
typedef struct {
	const char *kind; /* "thunderbolt" (a cable, RDMA on both ends), "ethernet", "wifi" */
	int n;
	struct {
		int node;
		const char *ifn, *ip;
	} end[MAXEND];
	int prefix; /* netmask length given in the view, 0 = none */
} seg_t;

typedef struct {
	int n_nodes;
	const char *host[4];
	int n_segs;
	seg_t seg[8];
} fixture_t;

/* Node i's id: ascending with i, so mac1 (i = 0) is rank 0. */
static void fx_id(char *out, int i)
{
	snprintf(out, PLAN_ID_LEN + 1, "%02x%030x", (unsigned)(0x10 * (i + 1)) & 0xff, i & 0xff);
}

static int fx_node_of(const fixture_t *f, const char *id)
{
	for (int i = 0; i < f->n_nodes; i++) {
		char x[33];
		fx_id(x, i);
		if (!strcmp(x, id))
			return i;
	}
	return -1;
}

/* Does node `from` reach address ip? Only when it has an interface on ip's cable or LAN. */
static int fx_reaches(const fixture_t *f, int from, const char *ip, int *owner)
{
	for (int s = 0; s < f->n_segs; s++) {
		const seg_t *g = &f->seg[s];
		int has_ip = -1, on = 0;
		for (int e = 0; e < g->n; e++) {
			if (!strcmp(g->end[e].ip, ip))
				has_ip = g->end[e].node;
			on |= g->end[e].node == from;
		}
		if (has_ip >= 0) {
			if (owner)
				*owner = has_ip;
			return on || has_ip == from;
		}
	}
	return 0;
}

/* The interface of node a on a cable to node b ("" when none). */
static const char *fx_cable_if(const fixture_t *f, int a, int b)
{
	for (int s = 0; s < f->n_segs; s++) {
		const seg_t *g = &f->seg[s];
		if (strcmp(g->kind, "thunderbolt"))
			continue;
		const char *ia = NULL;
		int hb = 0;
		for (int e = 0; e < g->n; e++) {
			if (g->end[e].node == a)
				ia = g->end[e].ifn;
			hb |= g->end[e].node == b;
		}
		if (ia && hb)
			return ia;
	}
	return "";
}

/* The view JSON of a fixture: addresses from the segments, an active RDMA device on every
 * Thunderbolt interface (macOS names: rdma_ + interface), seen_on for every peer on a shared
 * segment when with_seen. */
static plan_view_t *fx_view(const fixture_t *f, int with_seen)
{
	json_t *nodes = json_array();
	for (int i = 0; i < f->n_nodes; i++) {
		char id[33];
		fx_id(id, i);
		json_t *addrs = json_array(), *devs = json_array(), *seen = json_array();
		for (int s = 0; s < f->n_segs; s++) {
			const seg_t *g = &f->seg[s];
			for (int e = 0; e < g->n; e++) {
				if (g->end[e].node != i)
					continue;
				json_t *ad = json_pack("{s:s,s:s,s:s}", "ip", g->end[e].ip,
						       "ifname", g->end[e].ifn, "kind", g->kind);
				if (g->prefix)
					json_object_set_new(ad, "prefix", json_integer(g->prefix));
				json_array_append_new(addrs, ad);
				if (!strcmp(g->kind, "thunderbolt")) {
					char dev[64];
					snprintf(dev, sizeof dev, "rdma_%s", g->end[e].ifn);
					json_array_append_new(devs,
							      json_pack("{s:s}", "name", dev));
				}
				for (int q = 0; with_seen && q < g->n; q++) {
					char pid[33];
					fx_id(pid, g->end[q].node);
					if (g->end[q].node != i)
						json_array_append_new(
						    seen, json_pack("{s:s,s:s}", "node_id", pid,
								    "ifname", g->end[e].ifn));
				}
			}
		}
		json_array_append_new(nodes,
				      json_pack("{s:s,s:s,s:I,s:o,s:o,s:o}", "node_id", id, "host",
						f->host[i], "mem_avail", (json_int_t)64 << 30,
						"addresses", addrs, "rdma", devs, "seen_on", seen));
	}
	json_t *root = json_pack("{s:i,s:o}", "epoch", 1, "nodes", nodes);
	char *text = json_dumps(root, 0);
	json_decref(root);
	plan_view_t *v = NULL;
	char err[256] = "";
	if (plan_view_from_json(&v, text, err, sizeof err))
		fprintf(stderr, "view: %s\n", err);
	free(text);
	return v;
}

/* 1: three hosts on Ethernet; A and C also share a second LAN: 2, 1 and 2 addresses. */
static const fixture_t ETH3 = {
    3,
    {"a.local", "b.local", "c.local"},
    2,
    {{"ethernet",
      3,
      {{0, "eth0", "192.168.1.10"}, {1, "eth0", "192.168.1.11"}, {2, "eth0", "192.168.1.12"}}},
     {"ethernet", 2, {{0, "eth1", "10.10.0.10"}, {2, "eth1", "10.10.0.12"}}}}};

/* 2: four Macs, a Thunderbolt cable per pair (en1..en3), Wi-Fi on en0. */
#define TB(a, ia, b, ib, net)                                                                      \
	{                                                                                          \
		"thunderbolt", 2,                                                                  \
		{                                                                                  \
			{a, ia, "10.0." #net ".1"},                                                \
			{                                                                          \
				b, ib, "10.0." #net ".2"                                           \
			}                                                                          \
		}                                                                                  \
	}
static const fixture_t MESH4 = {4,
				{"mac1.local", "mac2.local", "mac3.local", "mac4.local"},
				7,
				{{"wifi",
				  4,
				  {{0, "en0", "192.168.1.11"},
				   {1, "en0", "192.168.1.12"},
				   {2, "en0", "192.168.1.13"},
				   {3, "en0", "192.168.1.14"}}},
				 TB(0, "en1", 1, "en1", 12),
				 TB(0, "en2", 2, "en1", 13),
				 TB(0, "en3", 3, "en1", 14),
				 TB(1, "en2", 2, "en2", 23),
				 TB(1, "en3", 3, "en2", 24),
				 TB(2, "en3", 3, "en3", 34)}};

/* 3: four Macs cabled mac1-mac3-mac2-mac4-mac1 (two ports each), Wi-Fi on en0. */
static const fixture_t RING4 = {4,
				{"mac1.local", "mac2.local", "mac3.local", "mac4.local"},
				5,
				{{"wifi",
				  4,
				  {{0, "en0", "192.168.1.11"},
				   {1, "en0", "192.168.1.12"},
				   {2, "en0", "192.168.1.13"},
				   {3, "en0", "192.168.1.14"}}},
				 TB(0, "en1", 2, "en1", 13),
				 TB(2, "en2", 1, "en1", 32),
				 TB(1, "en2", 3, "en1", 24),
				 TB(3, "en2", 0, "en2", 41)}};

/* 3b: the same cables with the addresses MLX's config.py hands out (IPConfigurator: /30 pairs
 * 192.168.0.1/.2, .5/.6, ... all inside one /24), their netmask in the view. Without the prefix
 * every cable would look like one LAN. */
#define TB30(a, ia, b, ib, x, y)                                                                   \
	{                                                                                          \
		"thunderbolt", 2, {{a, ia, "192.168.0." #x}, {b, ib, "192.168.0." #y}}, 30         \
	}
static const fixture_t RING4_CFG = {4,
				    {"mac1.local", "mac2.local", "mac3.local", "mac4.local"},
				    5,
				    {{"wifi",
				      4,
				      {{0, "en0", "192.168.1.11"},
				       {1, "en0", "192.168.1.12"},
				       {2, "en0", "192.168.1.13"},
				       {3, "en0", "192.168.1.14"}}},
				     TB30(0, "en1", 2, "en1", 1, 2),
				     TB30(2, "en2", 1, "en1", 5, 6),
				     TB30(1, "en2", 3, "en1", 9, 10),
				     TB30(3, "en2", 0, "en2", 13, 14)}};

/* 4: one node. */
static const fixture_t ONE = {
    1, {"solo.local"}, 1, {{"ethernet", 1, {{0, "en0", "192.168.1.20"}}}}};

/* ---- planning ---- */

static plan_t *plan_fx(const fixture_t *f, int with_seen)
{
	static const char *MODEL =
	    "{\"n_layers\":16,\"n_heads\":16,\"n_kv_heads\":4,\"dim\":1024,"
	    "\"ffn\":4096,\"n_vocab\":32000,\"n_ctx\":2048,\"wtype\":\"F16\"}";
	plan_model_t m;
	char err[512] = "";
	plan_model_from_json(&m, MODEL, err, sizeof err);
	plan_view_t *v = fx_view(f, with_seen);
	plan_t *p = NULL;
	if (!v || plan_make(&p, v, &m, NULL, err, sizeof err))
		fprintf(stderr, "plan: %s\n", err);
	plan_view_free(v);
	return p;
}

/* The fixture node behind rank r. */
static int node_of_rank(const fixture_t *f, const plan_t *p, int r)
{
	return fx_node_of(f, plan_rank(p, r)->node_id);
}

/* ---- MLX's rules, our own C ---- */

/* mlx/distributed/utils.cpp parse_address: "ip:port" split at the first ':'; getaddrinfo on the
 * ip (we want an IPv4 literal: MLX's TCPSocket makes AF_INET sockets, ring.cpp). */
static int addr_split(const char *s, char *ip, size_t iplen, int *port)
{
	const char *c = strchr(s, ':');
	unsigned char b[4];
	if (!c || (size_t)(c - s) >= iplen)
		return -1;
	memcpy(ip, s, (size_t)(c - s));
	ip[c - s] = 0;
	*port = atoi(c + 1);
	return inet_pton(AF_INET, ip, b) == 1 && *port > 0 && *port < 65536 ? 0 : -1;
}

/*
 * The ring as MLX forms it from a hostfile (mlx/distributed/ring/ring.cpp load_nodes and the
 * RingGroup constructor): the file is a list, one list of "ip:port" per rank; rank r listens on
 * every address of its own row and connects to every address of row (r+1) % N; it throws unless
 * it has as many connections to the left as to the right. Physically: the address rank r
 * listens on must be its own, and rank r-1 must reach it. Returns "" or what fails.
 */
static const char *mlx_ring_forms(const fixture_t *f, const plan_t *p, json_t *rows)
{
	static char why[256];
	int n = plan_n_ranks(p);
	if (!json_is_array(rows) || (int)json_array_size(rows) != n)
		return "not a list with one row per rank";
	size_t count = 0;
	for (int r = 0; r < n; r++) {
		json_t *row = json_array_get(rows, (size_t)r);
		if (!json_is_array(row) || !json_array_size(row))
			return "a row is not a non-empty list (load_nodes wants a list per rank)";
		if (r && json_array_size(row) != count)
			return "rows differ in length: not as many connections left as right";
		count = json_array_size(row);
		int me = node_of_rank(f, p, r), left = node_of_rank(f, p, (r + n - 1) % n);
		for (size_t c = 0; c < count; c++) {
			char ip[64];
			int port, owner = -1;
			const char *s = json_string_value(json_array_get(row, c));
			if (!s || addr_split(s, ip, sizeof ip, &port))
				return "an entry is not \"ipv4:port\" (utils.cpp parse_address)";
			if (!fx_reaches(f, left, ip, &owner) || owner != me) {
				snprintf(why, sizeof why,
					 "rank %d dials %s, which it cannot reach on rank %d",
					 (r + n - 1) % n, ip, r);
				return why;
			}
		}
	}
	return "";
}

/* python/mlx/_distributed_utils/launch.py launch_ring: the rows mlx.launch makes from the hosts
 * file: every entry of "ips" becomes an "ip:port" (ports from 32323 up), one row per host. */
static json_t *launch_ring_rows(json_t *hosts)
{
	json_t *rows = json_array();
	int port = 32323;
	size_t i;
	json_t *h;
	json_array_foreach(hosts, i, h)
	{
		json_t *row = json_array(), *ips = json_object_get(h, "ips");
		size_t k;
		json_t *ip;
		json_array_foreach(ips, k, ip)
		{
			char s[80];
			snprintf(s, sizeof s, "%s:%d", json_string_value(ip), port++);
			json_array_append_new(row, json_string(s));
		}
		json_array_append_new(rows, row);
	}
	return rows;
}

/* jaccl/lib/jaccl/jaccl.cpp parse_devices_json: a list of N lists of N entries, each null, a
 * string or a list of strings. Fills cnt[i][j] (devices from i towards j); -1 when malformed. */
static int jaccl_parse(json_t *m, int cnt[8][8])
{
	size_t n = json_array_size(m);
	if (!json_is_array(m) || n > 8)
		return -1;
	for (size_t i = 0; i < n; i++) {
		json_t *row = json_array_get(m, i);
		if (!json_is_array(row) || json_array_size(row) != n)
			return -1;
		for (size_t j = 0; j < n; j++) {
			json_t *e = json_array_get(row, j);
			if (json_is_string(e))
				cnt[i][j] = 1;
			else if (json_is_array(e))
				cnt[i][j] = (int)json_array_size(e);
			else if (json_is_null(e))
				cnt[i][j] = 0;
			else
				return -1;
		}
	}
	return (int)n;
}

/* jaccl.cpp Config::is_valid_mesh: size >= 2, no device on the diagonal, one or more elsewhere. */
static int jaccl_is_mesh(int n, int cnt[8][8])
{
	if (n < 2)
		return 0;
	for (int i = 0; i < n; i++)
		for (int j = 0; j < n; j++)
			if ((i == j && cnt[i][j]) || (i != j && !cnt[i][j]))
				return 0;
	return 1;
}

/* jaccl.cpp Config::is_valid_ring: size >= 2, and every rank has as many devices towards its
 * left and its right neighbour as rank 0 has towards rank 1. (MLX's check passes a matrix with
 * none at all; we also want that count above zero, or the ring has no link.) */
static int jaccl_is_ring(int n, int cnt[8][8])
{
	if (n < 2 || !cnt[0][1])
		return 0;
	for (int i = 0; i < n; i++)
		if (cnt[i][(i + n - 1) % n] != cnt[0][1] || cnt[i][(i + 1) % n] != cnt[0][1])
			return 0;
	return 1;
}

/* Every device in the matrix sits on a cable between the two ranks it names. */
static int jaccl_devices_real(const fixture_t *f, const plan_t *p, json_t *m)
{
	int n = plan_n_ranks(p);
	for (int i = 0; i < n; i++)
		for (int j = 0; j < n; j++) {
			const char *d = json_string_value(json_array_get(json_array_get(m, i), j));
			if (!d)
				continue;
			const char *ifn =
			    fx_cable_if(f, node_of_rank(f, p, i), node_of_rank(f, p, j));
			if (strncmp(d, "rdma_", 5) || strcmp(d + 5, ifn))
				return 0;
		}
	return 1;
}

/* launch.py launch_jaccl: hosts[0] has ips; every rdma row has one entry per host, null at its
 * own index; the coordinator is hosts[0].ips[0], which every rank must reach. */
static const char *launch_jaccl_ok(const fixture_t *f, const plan_t *p, json_t *hosts)
{
	int n = (int)json_array_size(hosts);
	json_t *ips0 = json_object_get(json_array_get(hosts, 0), "ips");
	if (!json_array_size(ips0))
		return "rank 0 has no ips";
	for (int i = 0; i < n; i++) {
		json_t *row = json_object_get(json_array_get(hosts, (size_t)i), "rdma");
		if ((int)json_array_size(row) != n || !json_is_null(json_array_get(row, (size_t)i)))
			return "malformed hostfile for jaccl";
	}
	const char *coord = json_string_value(json_array_get(ips0, 0));
	for (int r = 0; r < n; r++) {
		int owner = -1;
		if (!fx_reaches(f, node_of_rank(f, p, r), coord, &owner) ||
		    owner != node_of_rank(f, p, 0))
			return "a rank cannot reach the coordinator";
	}
	return "";
}

/* The three files of a plan, parsed. */
typedef struct {
	char *hostfile_text;
	json_t *hostfile, *hosts_obj, *hosts, *rdma, *plan;
} files_t;

static void files_load(files_t *x, const plan_t *p)
{
	char *m = plan_mlx_hosts_json(p), *r = plan_rdma_json(p), *j = plan_to_json(p);
	x->hostfile_text = plan_hostfile_json(p);
	x->hostfile = json_loads(x->hostfile_text, 0, NULL);
	x->hosts_obj = json_loads(m, 0, NULL);
	x->hosts = json_object_get(x->hosts_obj, "hosts");
	x->rdma = json_loads(r, 0, NULL);
	x->plan = json_loads(j, 0, NULL);
	free(m), free(r), free(j);
}

static void files_free(files_t *x)
{
	free(x->hostfile_text);
	json_decref(x->hostfile), json_decref(x->hosts_obj), json_decref(x->rdma);
	json_decref(x->plan);
}

/* Plans fixture f (with_seen: with the links it observed) and loads the files the plan writes
 * into x; NULL (a failed check) when planning failed. plan_done() frees both. */
static plan_t *plan_load(const fixture_t *f, int with_seen, files_t *x)
{
	plan_t *p = plan_fx(f, with_seen);
	CHECK(p != NULL);
	if (p)
		files_load(x, p);
	return p;
}

static void plan_done(plan_t *p, files_t *x)
{
	files_free(x);
	plan_free(p);
}

/* mlx_ring_forms' verdict: "" or why the ring would not form (printed with the case). */
static void check_forms(const char *why, size_t k, int seen)
{
	if (why[0])
		fprintf(stderr, "fixture %zu seen %d: %s\n", k, seen, why);
	CHECK_EQ_STR(why, "");
}

static const char *mlx_field(const files_t *x, const char *k)
{
	const char *s = json_string_value(json_object_get(json_object_get(x->plan, "mlx"), k));
	return s ? s : "(null)";
}

/* ---- the findings ---- */

/* Finding 1: hostfile.json is MLX's nested form, one list of "ip:port" per rank
 * (ring.cpp load_nodes iterates each rank's list), and the ring it describes forms. */
TEST(f1_hostfile_nested)
{
	const fixture_t *fx[] = {&ETH3, &MESH4, &RING4, &RING4_CFG};
	for (size_t k = 0; k < ARRAY_LEN(fx); k++)
		for (int seen = 0; seen < 2; seen++) {
			files_t x;
			plan_t *p = plan_load(fx[k], seen, &x);
			if (!p)
				continue;
			for (size_t r = 0; r < json_array_size(x.hostfile); r++)
				CHECK(json_is_array(json_array_get(x.hostfile, r)));
			const char *why = mlx_ring_forms(fx[k], p, x.hostfile);
			check_forms(why, k, seen);
			plan_done(p, &x);
		}
}

/* Finding 2: one rank gets an empty hostfile, as mlx.launch writes it (launch.py launch_ring:
 * json.dumps(ring_hosts) if len(ring_hosts) > 1 else ""); a one-row file would make RingGroup's
 * rank 0 (connect_to = 0, not above its rank) dial itself before it listens. */
TEST(f2_one_rank_empty_hostfile)
{
	for (int seen = 0; seen < 2; seen++) {
		files_t x;
		plan_t *p = plan_load(&ONE, seen, &x);
		if (!p)
			continue;
		CHECK_EQ_STR(x.hostfile_text, "");
		CHECK_EQ_STR(json_string_value(json_object_get(x.hosts_obj, "backend")), "ring");
		json_t *h0 = json_array_get(x.hosts, 0);
		/* launch.py RemoteProcess: only the exact string "127.0.0.1" runs locally */
		CHECK_EQ_STR(json_string_value(json_object_get(h0, "ssh")), "127.0.0.1");
		CHECK_EQ_STR(mlx_field(&x, "jaccl"), "none");
		plan_done(p, &x);
	}
}

/* Finding 3: "ips" holds only what the backend needs. mlx.launch --backend ring makes every
 * entry a connection (launch.py launch_ring), so the ring it builds from mlx-hosts.json must
 * form: equal counts (RingGroup: as many connections to the left as to the right) and each
 * address on a link the left neighbour is on (config.py configure_ring: ips[node, peer] of the
 * left peer). The 3-host Ethernet view with 2, 1, 2 addresses, and the 4-Mac mesh (as a ring
 * over the LAN addresses there: every host lists one). */
TEST(f3_ips_per_backend)
{
	const fixture_t *fx[] = {&ETH3, &MESH4, &RING4};
	for (size_t k = 0; k < ARRAY_LEN(fx); k++)
		for (int seen = 0; seen < 2; seen++) {
			files_t x;
			plan_t *p = plan_load(fx[k], seen, &x);
			if (!p)
				continue;
			json_t *rows = launch_ring_rows(x.hosts);
			const char *why = mlx_ring_forms(fx[k], p, rows);
			check_forms(why, k, seen);
			for (size_t r = 0; r < json_array_size(x.hosts); r++)
				CHECK_EQ_INT(json_array_size(json_object_get(
						 json_array_get(x.hosts, r), "ips")),
					     1);
			json_decref(rows);
			plan_done(p, &x);
		}
	/* the Ethernet view is a TCP ring: its ips are the ring's own addresses */
	files_t x;
	plan_t *p = plan_load(&ETH3, 1, &x);
	if (p) {
		CHECK_EQ_STR(json_string_value(json_object_get(x.hosts_obj, "backend")), "ring");
		for (int r = 0; r < 3; r++)
			CHECK_EQ_STR(
			    json_string_value(json_array_get(
				json_object_get(json_array_get(x.hosts, (size_t)r), "ips"), 0)),
			    plan_rank(p, r)->ip);
		plan_done(p, &x);
	}
}

/* Finding 4: the JACCL coordinator (launch.py launch_jaccl: hosts[0].ips[0]) is an address every
 * rank reaches: in the 4-Mac mesh, mac1's Wi-Fi address, not a point-to-point cable's end
 * (config.py configure_jaccl lists the en0 address, add_ips). */
TEST(f4_coordinator_reachable)
{
	const fixture_t *fx[] = {&MESH4, &RING4, &RING4_CFG};
	for (size_t k = 0; k < ARRAY_LEN(fx); k++)
		for (int seen = 0; seen < 2; seen++) {
			files_t x;
			plan_t *p = plan_load(fx[k], seen, &x);
			if (!p)
				continue;
			CHECK_EQ_STR(launch_jaccl_ok(fx[k], p, x.hosts), "");
			CHECK_EQ_STR(plan_coordinator(p), "192.168.1.11:32323");
			CHECK_EQ_STR(mlx_field(&x, "coordinator"), "192.168.1.11:32323");
			plan_done(p, &x);
		}
}

/* Finding 5: ranks follow the cables. In the ring cabled mac1-mac3-mac2-mac4-mac1, ID order
 * would put mac1 next to mac2 (no cable); the planner's order makes the matrix a valid JACCL
 * ring (jaccl.cpp is_valid_ring) and every ring hop a cable; in the mesh it is a valid mesh
 * (is_valid_mesh). plan.json says which and why. */
TEST(f5_ranks_follow_cables)
{
	for (int seen = 0; seen < 4; seen++) {
		const fixture_t *f = seen < 2 ? &RING4 : &RING4_CFG;
		files_t x;
		plan_t *p = plan_load(f, seen & 1, &x);
		if (!p)
			continue;
		int cnt[8][8] = {{0}}, n = jaccl_parse(x.rdma, cnt);
		CHECK_EQ_INT(n, 4);
		CHECK(jaccl_is_ring(n, cnt));
		CHECK(!jaccl_is_mesh(n, cnt));
		CHECK(jaccl_devices_real(f, p, x.rdma));
		CHECK_EQ_INT(node_of_rank(f, p, 0), 0); /* mac1, the smallest id */
		for (int r = 0; r < 4; r++)             /* consecutive ranks share a cable */
			CHECK(fx_cable_if(f, node_of_rank(f, p, r),
					  node_of_rank(f, p, (r + 1) % 4))[0]);
		/* and the deterministic pick of the two directions: mac1, mac3, mac2, mac4 */
		CHECK_EQ_INT(node_of_rank(f, p, 1), 2);
		CHECK_EQ_INT(node_of_rank(f, p, 2), 1);
		CHECK_EQ_INT(node_of_rank(f, p, 3), 3);
		CHECK_EQ_STR(mlx_field(&x, "jaccl"), "jaccl-ring");
		CHECK_EQ_STR(mlx_field(&x, "backend"), "jaccl-ring");
		CHECK(strstr(mlx_field(&x, "why"), "JACCL ring") != NULL);
		CHECK_EQ_STR(plan_jaccl(p), "jaccl-ring");
		/* no ring hop over Wi-Fi: the hostfile's addresses are cable ends */
		for (int r = 0; r < 4; r++)
			CHECK(strncmp(plan_rank(p, r)->ip, "192.168.1.", 10));
		CHECK_EQ_STR(mlx_ring_forms(f, p, x.hostfile), "");
		plan_done(p, &x);
	}
	for (int seen = 0; seen < 2; seen++) {
		files_t x;
		plan_t *p = plan_load(&MESH4, seen, &x);
		if (!p)
			continue;
		int cnt[8][8] = {{0}}, n = jaccl_parse(x.rdma, cnt);
		CHECK_EQ_INT(n, 4);
		CHECK(jaccl_is_mesh(n, cnt));
		CHECK(jaccl_devices_real(&MESH4, p, x.rdma));
		CHECK_EQ_STR(mlx_field(&x, "jaccl"), "jaccl");
		for (int r = 0; r < 4; r++) /* a uniform mesh keeps ascending ids */
			CHECK_EQ_INT(node_of_rank(&MESH4, p, r), r);
		plan_done(p, &x);
	}
	files_t x;
	plan_t *p = plan_load(&ETH3, 1, &x);
	if (p) {
		int cnt[8][8] = {{0}}, n = jaccl_parse(x.rdma, cnt);
		CHECK_EQ_INT(n, 3);
		CHECK(!jaccl_is_mesh(n, cnt) && !jaccl_is_ring(n, cnt));
		CHECK_EQ_STR(mlx_field(&x, "jaccl"), "none");
		CHECK_EQ_STR(mlx_field(&x, "why"),
			     "no RDMA device links any two ranks: MLX's TCP ring");
		plan_done(p, &x);
	}
}

/* Finding 6: mlx-hosts.json is the object form current mlx.launch reads (common.py
 * Hostfile.from_file: "backend", "envs", "hosts"), with MLX_METAL_FAST_SYNCH=1 for JACCL (the
 * example in from_file's docstring); --mlx-list keeps the bare list, which every version reads. */
TEST(f6_object_form)
{
	const fixture_t *fx[] = {&ETH3, &MESH4, &RING4, &ONE};
	const char *want[] = {"ring", "jaccl", "jaccl-ring", "ring"};
	for (size_t k = 0; k < ARRAY_LEN(fx); k++) {
		files_t x;
		plan_t *p = plan_load(fx[k], 1, &x);
		if (!p)
			continue;
		CHECK(json_is_object(x.hosts_obj));
		CHECK_EQ_STR(json_string_value(json_object_get(x.hosts_obj, "backend")), want[k]);
		json_t *envs = json_object_get(x.hosts_obj, "envs");
		CHECK(json_is_array(envs));
		if (strcmp(want[k], "ring"))
			CHECK_EQ_STR(json_string_value(json_array_get(envs, 0)),
				     "MLX_METAL_FAST_SYNCH=1");
		else
			CHECK_EQ_INT(json_array_size(envs), 0);
		CHECK_EQ_INT(json_array_size(x.hosts), fx[k]->n_nodes);
		for (size_t r = 0; r < json_array_size(x.hosts); r++) {
			json_t *h = json_array_get(x.hosts, r);
			CHECK(json_is_string(json_object_get(h, "ssh")));
			CHECK(json_equal(json_object_get(h, "rdma"), json_array_get(x.rdma, r)));
		}
		char *list = plan_mlx_list_json(p);
		json_t *l = json_loads(list, 0, NULL);
		CHECK(json_equal(l, x.hosts));
		json_decref(l);
		free(list);
		plan_done(p, &x);
	}
}

/* The order is a function of the view: shuffled input, same plan (and still rank 0 first). */
TEST(order_deterministic)
{
	plan_t *a = plan_fx(&RING4, 1), *b = plan_fx(&RING4, 1);
	CHECK(a && b);
	if (a && b)
		CHECK_EQ_STR(plan_hash(a), plan_hash(b));
	/* a parsed plan (a follower's) writes the same files */
	char *s = a ? plan_to_json(a) : NULL, err[256] = "";
	plan_t *q = NULL;
	CHECK(s && plan_from_json(&q, s, err, sizeof err) == 0);
	if (q) {
		char *h1 = plan_mlx_hosts_json(a), *h2 = plan_mlx_hosts_json(q);
		CHECK_EQ_STR(h1, h2);
		CHECK_EQ_STR(plan_mlx_backend(q), "jaccl-ring");
		free(h1), free(h2);
	}
	plan_free(q);
	free(s);
	plan_free(a), plan_free(b);
}

/* Looks NAME up in env[n] ("NAME=value"); NULL when absent. */
static const char *env_get(char env[][EXEC_ENV_LEN], int n, const char *name)
{
	size_t k = strlen(name);
	for (int i = 0; i < n; i++)
		if (!strncmp(env[i], name, k) && env[i][k] == '=')
			return env[i] + k + 1;
	return NULL;
}

/* --exec gives each rank what mlx.launch gives it (launch.py): launch_ring sets MLX_HOSTFILE
 * (and MLX_RANK); launch_jaccl sets MLX_IBV_DEVICES, MLX_JACCL_COORDINATOR = hosts[0].ips[0] +
 * ":" + starting port, MLX_JACCL_RING=1 for jaccl-ring, and the hosts file's envs. A variable
 * of the other backend is absent (distributed.cpp init tries the ring first when MLX_HOSTFILE
 * is set); one rank gets no MLX_HOSTFILE (its empty file is no JSON for load_nodes). */
TEST(exec_env_per_backend)
{
	static char env[16][EXEC_ENV_LEN];
	exec_cfg_t cfg = {"true", 18500, "/st"};
	const fixture_t *fx[] = {&ETH3, &MESH4, &RING4, &ONE};
	for (size_t k = 0; k < ARRAY_LEN(fx); k++) {
		plan_t *p = plan_fx(fx[k], 1);
		if (!p)
			continue;
		int r = plan_n_ranks(p) - 1, n = exec_env(p, r, &cfg, env, 16);
		char want[16];
		snprintf(want, sizeof want, "%d", r);
		CHECK_EQ_STR(env_get(env, n, "MLX_RANK"), want);
		CHECK_EQ_STR(env_get(env, n, "SHOAL_PLAN"), "/st/plan.json");
		CHECK_EQ_STR(env_get(env, n, "SHOAL_EXEC_PORT"), "18500");
		const char *b = plan_mlx_backend(p);
		if (!strcmp(b, "ring")) {
			if (plan_n_ranks(p) > 1)
				CHECK_EQ_STR(env_get(env, n, "MLX_HOSTFILE"), "/st/hostfile.json");
			else
				CHECK(env_get(env, n, "MLX_HOSTFILE") == NULL);
			CHECK(env_get(env, n, "MLX_IBV_DEVICES") == NULL);
			CHECK(env_get(env, n, "MLX_JACCL_COORDINATOR") == NULL);
			CHECK(env_get(env, n, "MLX_METAL_FAST_SYNCH") == NULL);
		} else {
			CHECK(env_get(env, n, "MLX_HOSTFILE") == NULL);
			CHECK_EQ_STR(env_get(env, n, "MLX_IBV_DEVICES"), "/st/rdma-devices.json");
			CHECK_EQ_STR(env_get(env, n, "MLX_JACCL_COORDINATOR"),
				     "192.168.1.11:32323");
			CHECK_EQ_STR(env_get(env, n, "MLX_METAL_FAST_SYNCH"), "1");
			if (!strcmp(b, "jaccl-ring"))
				CHECK_EQ_STR(env_get(env, n, "MLX_JACCL_RING"), "1");
			else
				CHECK(env_get(env, n, "MLX_JACCL_RING") == NULL);
		}
		plan_free(p);
	}
}

int main(void)
{
	RUN(f1_hostfile_nested);
	RUN(f2_one_rank_empty_hostfile);
	RUN(f3_ips_per_backend);
	RUN(f4_coordinator_reachable);
	RUN(f5_ranks_follow_cables);
	RUN(f6_object_form);
	RUN(order_deterministic);
	RUN(exec_env_per_backend);
	return harness_done();
}
