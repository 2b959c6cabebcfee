/* test_rdma.c: the JACCL device matrix parser, queue-pair data on the wire, the fallback decision,
 * device discovery without devices, and a group given a matrix on a host without RDMA: every pair
 * falls back to TCP with a logged reason and collectives still work. */
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>

#include "common/common.h"
#include "harness.h"
#include "transport/keys.h"
#include "transport/rdma.h"
#include "transport/transport.h"

static tp_keys_t K;

static int parse(const char *json, int n, tp_rdma_matrix_t **m, char *err)
{
	return tp_rdma_matrix_parse(m, json, strlen(json), n, err, 200);
}

TEST(matrix_valid)
{
	char err[200];
	tp_rdma_matrix_t *m = NULL;
	const char *j = "[[null, \"rdma_en5\", \"rdma_en4\"],"
			" [\"rdma_en5\", null, [\"rdma_en3\", \"rdma_en6\"]],"
			" [\"rdma_en4\", \"rdma_en3\", null]]";
	CHECK_EQ_INT(parse(j, 3, &m, err), 0);
	if (!m)
		return;
	CHECK_EQ_INT(tp_rdma_matrix_size(m), 3);
	CHECK_EQ_INT(tp_rdma_matrix_count(m, 0, 0), 0);
	CHECK(tp_rdma_matrix_dev(m, 0, 0, 0) == NULL);
	CHECK_EQ_STR(tp_rdma_matrix_dev(m, 0, 1, 0), "rdma_en5");
	CHECK_EQ_INT(tp_rdma_matrix_count(m, 1, 2), 2);
	CHECK_EQ_STR(tp_rdma_matrix_dev(m, 1, 2, 1), "rdma_en6");
	CHECK(tp_rdma_matrix_dev(m, 1, 2, 2) == NULL);
	CHECK(tp_rdma_matrix_dev(m, 5, 0, 0) == NULL);
	tp_rdma_matrix_free(m);
	/* off-diagonal null = that pair has no RDMA (TCP); size not checked with 0 */
	CHECK_EQ_INT(parse("[[null, null], [\"mlx5_0\", null]]", 0, &m, err), 0);
	CHECK_EQ_INT(tp_rdma_matrix_count(m, 0, 1), 0);
	tp_rdma_matrix_free(m);
	CHECK_EQ_INT(parse("[[null]]", 1, &m, err), 0);
	tp_rdma_matrix_free(m);
	tp_rdma_matrix_free(NULL);
}

TEST(matrix_malformed)
{
	char err[200];
	tp_rdma_matrix_t *m = (tp_rdma_matrix_t *)1;
	const char *bad[] = {
		"",                                   /* not JSON */
		"[[null, \"a\"], [\"b\", null]",      /* truncated */
		"{}",                                 /* not a list */
		"[]",                                 /* empty */
		"[[null, \"a\"], [\"b\"]]",           /* ragged */
		"[[null, \"a\"], \"b\"]",             /* row not a list */
		"[[\"x\", \"a\"], [\"b\", null]]",    /* non-null diagonal */
		"[[null, 5], [\"b\", null]]",         /* number */
		"[[null, \"\"], [\"b\", null]]",      /* empty name */
		"[[null, []], [\"b\", null]]",        /* empty list */
		"[[null, [\"a\", 3]], [\"b\", null]]", /* list with a number */
		"[[null, \"../x\"], [\"b\", null]]",  /* a path, not a name */
	};
	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		m = (tp_rdma_matrix_t *)1;
		int rc = parse(bad[i], 0, &m, err);
		if (rc != SH_EFORMAT)
			fprintf(stderr, "accepted bad matrix %zu: %s\n", i, bad[i]);
		CHECK_EQ_INT(rc, SH_EFORMAT);
		CHECK(m == NULL);
	}
	CHECK_EQ_INT(parse("[[null, \"x\"], [\"x\", \"d\"]]", 0, &m, err), SH_EFORMAT);
	CHECK(strstr(err, "diagonal") != NULL);
	/* wrong size for the group */
	CHECK_EQ_INT(parse("[[null, \"a\"], [\"b\", null]]", 3, &m, err), SH_EFORMAT);
	CHECK(strstr(err, "2 rows for 3 ranks") != NULL);
	/* missing file */
	CHECK_EQ_INT(tp_rdma_matrix_load(&m, "/nonexistent/rdma.json", 2, err, sizeof err),
		     SH_ENOENT);
}

TEST(qp_round_trip_and_malformed)
{
	tp_rdma_qp_info_t q = {.lid = 0, .port = 1, .gid_index = 3, .qpn = 0x123456,
			       .psn = 0xabcdef, .mtu = 1024, .buf_bytes = 1 << 20, .rkey = 77,
			       .addr = 0x7fff12345678ull}, r;
	q.gid[10] = 0xff;
	q.gid[11] = 0xff;
	q.gid[12] = 10;
	q.gid[15] = 2;
	uint8_t w[TP_RDMA_QP_WIRE + 8];
	char err[200];
	tp_rdma_qp_encode(w, &q);
	CHECK_EQ_INT(tp_rdma_qp_decode(&r, w, TP_RDMA_QP_WIRE, err, sizeof err), 0);
	CHECK(r.status == 0 && r.lid == q.lid && r.port == 1 && r.gid_index == 3);
	CHECK(r.qpn == q.qpn && r.psn == q.psn && r.mtu == 1024 && r.buf_bytes == q.buf_bytes);
	CHECK(r.rkey == 77 && r.addr == q.addr && memcmp(r.gid, q.gid, 16) == 0);
	CHECK_EQ_INT(tp_rdma_qp_decode(&r, w, TP_RDMA_QP_WIRE - 1, err, sizeof err), SH_EFORMAT);
	CHECK_EQ_INT(tp_rdma_qp_decode(&r, w, TP_RDMA_QP_WIRE + 1, err, sizeof err), SH_EFORMAT);
	tp_rdma_qp_info_t b = q;
	b.qpn = 0x1000000;
	tp_rdma_qp_encode(w, &b);
	CHECK_EQ_INT(tp_rdma_qp_decode(&r, w, TP_RDMA_QP_WIRE, err, sizeof err), SH_EFORMAT);
	b = q;
	b.mtu = 1500;
	tp_rdma_qp_encode(w, &b);
	CHECK_EQ_INT(tp_rdma_qp_decode(&r, w, TP_RDMA_QP_WIRE, err, sizeof err), SH_EFORMAT);
	CHECK(strstr(err, "MTU") != NULL);
	b = q;
	memset(b.gid, 0, 16);
	tp_rdma_qp_encode(w, &b);
	CHECK_EQ_INT(tp_rdma_qp_decode(&r, w, TP_RDMA_QP_WIRE, err, sizeof err), SH_EFORMAT);
	b.lid = 5; /* InfiniBand: a LID instead of a GID is fine */
	tp_rdma_qp_encode(w, &b);
	CHECK_EQ_INT(tp_rdma_qp_decode(&r, w, TP_RDMA_QP_WIRE, err, sizeof err), 0);
	/* a decline with its reason */
	tp_rdma_qp_info_t d = {.status = TP_RDMA_DECLINE};
	tp_rdma_qp_encode(w, &d);
	memcpy(w + TP_RDMA_QP_WIRE, "no dev", 6);
	CHECK_EQ_INT(tp_rdma_qp_decode(&r, w, TP_RDMA_QP_WIRE + 6, err, sizeof err), 0);
	CHECK_EQ_INT(r.status, TP_RDMA_DECLINE);
}

TEST(fallback_decisions)
{
	char b[200];
	tp_rdma_facts_t ok = {.dev = "rxe0", .verbs_built = 1, .ndevices = 1, .dev_found = 1,
			      .port_state_active = 1, .have_addr = 1};
	CHECK(tp_rdma_decide(&ok, b, sizeof b) == NULL);
	struct {
		tp_rdma_facts_t f;
		const char *want;
	} cases[] = {
		{{.dev = NULL, .verbs_built = 1}, "no RDMA device listed"},
		{{.dev = "rxe0", .verbs_built = 0}, "without libibverbs"},
		{{.dev = "rxe0", .verbs_built = 1, .ndevices = 0}, "no RDMA devices on this host"},
		{{.dev = "rxe0", .verbs_built = 1, .ndevices = -1}, "cannot list"},
		{{.dev = "rxe0", .verbs_built = 1, .ndevices = 2}, "device rxe0 not found"},
		{{.dev = "rxe0", .verbs_built = 1, .ndevices = 1, .dev_found = 1},
		 "port not ACTIVE"},
		{{.dev = "rxe0", .verbs_built = 1, .ndevices = 1, .dev_found = 1,
		  .port_state_active = 1},
		 "no LID and no IPv4 GID"},
		{{.dev = "rxe0", .verbs_built = 1, .ndevices = 1, .dev_found = 1,
		  .port_state_active = 1, .have_addr = 1, .verbs_failed = "ibv_create_qp"},
		 "ibv_create_qp failed"},
		{{.dev = "rxe0", .verbs_built = 1, .ndevices = 1, .dev_found = 1,
		  .port_state_active = 1, .have_addr = 1, .peer_declined = 1,
		  .peer_reason = "port not ACTIVE"},
		 "peer cannot use RDMA (port not ACTIVE)"},
	};
	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		const char *r = tp_rdma_decide(&cases[i].f, b, sizeof b);
		CHECK(r != NULL);
		if (r && !strstr(r, cases[i].want))
			fprintf(stderr, "case %zu: \"%s\" lacks \"%s\"\n", i, r, cases[i].want);
		CHECK(r && strstr(r, cases[i].want));
	}
}

TEST(device_discovery_never_crashes)
{
	char names[512];
	int n = tp_rdma_list_devices(names, sizeof names);
	CHECK(n >= 0);
	fprintf(stderr, "RDMA devices here: %d (%s)\n", n, names);
	if (n == 0)
		CHECK_EQ_STR(names, "");
}

/* ---- a group given a matrix on this machine ------------------------------------------------ */

struct rk {
	int rank, lfd, rc;
	int *ports;
	const char **hosts;
	const char *matrix;
	char link[8];
	float sum;
	char err[256];
};

static void *rank_main(void *p)
{
	struct rk *r = p;
	uint8_t id[16] = {(uint8_t)(r->rank + 1)};
	tp_group_cfg_t cfg = {.rank = r->rank, .world = 2, .hosts = r->hosts, .ports = r->ports,
			      .listen_fd = r->lfd, .keys = &K, .node_id = id, .timeout_ms = 5000,
			      .rdma_devices = r->matrix};
	tp_group_t *g = NULL;
	r->rc = tp_group_new(&g, &cfg, r->err, sizeof r->err);
	if (r->rc == 0) {
		snprintf(r->link, sizeof r->link, "%s", tp_group_link(g, 1 - r->rank));
		float v[4] = {1, 2, 3, (float)r->rank};
		r->rc = tp_all_reduce_f32(g, v, 4, 5000, r->err, sizeof r->err);
		r->sum = v[0] + v[3];
	}
	tp_group_free(g);
	return NULL;
}

static void run_pair(const char *m0, const char *m1, struct rk *r)
{
	static const char *hosts[2] = {"127.0.0.1", "127.0.0.1"};
	static int ports[2];
	char err[100];
	pthread_t t[2];
	for (int i = 0; i < 2; i++) {
		r[i] = (struct rk){.rank = i, .ports = ports, .hosts = hosts,
				   .matrix = i ? m1 : m0};
		tp_listen("127.0.0.1", 0, &r[i].lfd, &ports[i], err, sizeof err);
	}
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, rank_main, &r[i]);
	for (int i = 0; i < 2; i++) {
		pthread_join(t[i], NULL);
		close(r[i].lfd);
	}
}

/* Runs f with stderr captured into buf. */
static void capture_stderr(char *buf, size_t cap, void (*f)(void *), void *arg)
{
	char path[] = "/tmp/shoal-rdma-log-XXXXXX";
	int fd = mkstemp(path);
	int saved = dup(2);
	fflush(stderr);
	dup2(fd, 2);
	f(arg);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	lseek(fd, 0, SEEK_SET);
	ssize_t n = read(fd, buf, cap - 1);
	buf[n > 0 ? n : 0] = 0;
	close(fd);
	unlink(path);
	fputs(buf, stderr); /* keep it in the test log too */
}

struct pair_run {
	const char *m0, *m1;
	struct rk r[2];
};

static void pair_thunk(void *p)
{
	struct pair_run *x = p;
	run_pair(x->m0, x->m1, x->r);
}

TEST(group_falls_back_to_tcp)
{
	char path[] = "/tmp/shoal-rdma-XXXXXX";
	int fd = mkstemp(path);
	const char *j = "[[null, \"rxe0\"], [\"rxe0\", null]]";
	CHECK((size_t)write(fd, j, strlen(j)) == strlen(j));
	close(fd);
	static char log[16384];
	struct pair_run x = {.m0 = path, .m1 = path};
	capture_stderr(log, sizeof log, pair_thunk, &x);
	for (int i = 0; i < 2; i++) {
		CHECK_EQ_INT(x.r[i].rc, 0);
		CHECK_EQ_STR(x.r[i].link, "tcp");
		CHECK(x.r[i].sum == 2.0f + 1.0f);
	}
	char names[256];
	if (tp_rdma_list_devices(names, sizeof names) == 0) {
		CHECK(strstr(log, "rank 0: rank 1 uses TCP: no RDMA devices on this host "
				  "(wanted rxe0)") != NULL);
		CHECK(strstr(log, "rank 1: rank 0 uses TCP: no RDMA devices on this host") !=
		      NULL);
	} else {
		CHECK(strstr(log, "uses TCP:") != NULL);
	}
	/* a malformed matrix on one rank only, none on the other: both still agree on TCP */
	fd = open(path, O_WRONLY | O_TRUNC);
	CHECK(write(fd, "[[1]]", 5) == 5);
	close(fd);
	struct pair_run y = {.m0 = path, .m1 = NULL};
	capture_stderr(log, sizeof log, pair_thunk, &y);
	for (int i = 0; i < 2; i++) {
		CHECK_EQ_INT(y.r[i].rc, 0);
		CHECK_EQ_STR(y.r[i].link, "tcp");
	}
	CHECK(strstr(log, "RDMA device matrix unusable") != NULL);
	unlink(path);
}

int main(void)
{
	char err[128];
	if (sodium_init() < 0)
		return 1;
	tp_keys_set_cost_for_tests(1, 8192);
	if (tp_keys_derive(&K, "rdma-token", 10, err, sizeof err))
		return 1;
	RUN(matrix_valid);
	RUN(matrix_malformed);
	RUN(qp_round_trip_and_malformed);
	RUN(fallback_decisions);
	RUN(device_discovery_never_crashes);
	RUN(group_falls_back_to_tcp);
	return harness_done();
}
