/* test_hybrid.c: the collectives of hybrid plans on loopback (ranks in threads): all-reduce over
 * teams (subsets of a group) running side by side, bad teams, and tagged point-to-point messages
 * with several in flight around a ring of pipeline stages, waiting on whichever source is ready,
 * messages over one frame, and the errors (too long, out of step). */
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdatomic.h>

#include "common/common.h"
#include "harness.h"
#include "loop_group.h"
#include "transport/keys.h"
#include "transport/transport.h"

static tp_keys_t K;

typedef struct hrank hrank_t;
struct hrank {
	loop_rank_t l; /* first: loop_run fills it */
	void (*fn)(tp_group_t *g, hrank_t *h);
	int rc_new, fails;
	char err[256];
	atomic_int *flag; /* shared between the ranks of one run */
};

#define HCHECK(h, cond)                                                                            \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "rank %d: %s:%d: %s\n", (h)->l.rank, __FILE__, __LINE__,   \
				#cond);                                                            \
			(h)->fails++;                                                              \
		}                                                                                  \
	} while (0)

static void *hrank_main(void *p)
{
	hrank_t *h = p;
	tp_group_t *g = NULL;
	h->rc_new = loop_join(&g, &h->l, 0, &K, NULL, 5000, h->err, sizeof h->err);
	if (h->rc_new == 0)
		h->fn(g, h);
	tp_group_free(g);
	return NULL;
}

static void run(int world, void (*fn)(tp_group_t *, hrank_t *))
{
	hrank_t h[LOOP_MAX] = {0};
	atomic_int flag = 0;
	for (int r = 0; r < world; r++) {
		h[r].fn = fn;
		h[r].flag = &flag;
	}
	loop_run(h, sizeof h[0], world, hrank_main);
	for (int r = 0; r < world; r++) {
		if (h[r].rc_new)
			fprintf(stderr, "rank %d: %s\n", r, h[r].err);
		CHECK_EQ_INT(h[r].rc_new, 0);
		CHECK_EQ_INT(h[r].fails, 0);
	}
}

/* ---- teams -------------------------------------------------------------------------------- */

static float tval(int r, size_t i)
{
	return (float)((int)(i % 977) * (r + 1)) * 0.37f - (float)r * 11.5f;
}

/* Reduces n floats over team[0..k) and checks every element against the rank-order sum. */
static void team_reduce(tp_group_t *g, hrank_t *h, const int *team, int k, size_t rows, size_t cols)
{
	char err[256];
	size_t n = rows * cols;
	float *v = malloc(n * sizeof *v);
	for (size_t i = 0; i < n; i++)
		v[i] = tval(h->l.rank, i);
	int rc = tp_all_reduce_team(g, team, k, v, rows, cols, 10000, err, sizeof err);
	HCHECK(h, rc == 0);
	if (rc)
		fprintf(stderr, "rank %d: %s\n", h->l.rank, err);
	size_t bad = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		float want = tval(team ? team[0] : 0, i);
		for (int j = 1; j < k; j++)
			want += tval(team ? team[j] : j, i);
		bad += memcmp(&want, &v[i], sizeof want) != 0;
	}
	HCHECK(h, bad == 0);
	free(v);
}

static void fn_teams(tp_group_t *g, hrank_t *h)
{
	int r = h->l.rank;
	/* two stages of two ranks each, reducing at the same time, small and large */
	int stage[2][2] = {{0, 1}, {2, 3}};
	for (int it = 0; it < 20; it++)
		team_reduce(g, h, stage[r / 2], 2, 1, 2048);
	team_reduce(g, h, stage[r / 2], 2, 64, 2048);
	/* a team of three (rank 2 sits out), both paths */
	int three[3] = {0, 1, 3};
	if (r != 2) {
		team_reduce(g, h, three, 3, 1, 3000);  /* direct */
		team_reduce(g, h, three, 3, 40, 3000); /* 2-phase */
	}
	/* and the whole group afterwards: the pairs' sequence numbers stayed in step */
	team_reduce(g, h, (int[]){0, 1, 2, 3}, 4, 1, 1000);
	team_reduce(g, h, NULL, 4, 1, 1000);
	/* bad teams are refused before anything is sent */
	char err[256];
	float v[4] = {0};
	int other = r == 0 ? 1 : 0;
	HCHECK(h, tp_all_reduce_team(g, (int[]){other}, 1, v, 1, 4, 100, err, sizeof err) ==
		      SH_EINVAL);
	HCHECK(h, strstr(err, "not in the team") != NULL);
	HCHECK(h,
	       tp_all_reduce_team(g, (int[]){1, 0}, 2, v, 1, 4, 100, err, sizeof err) == SH_EINVAL);
	HCHECK(h,
	       tp_all_reduce_team(g, (int[]){r, 9}, 2, v, 1, 4, 100, err, sizeof err) == SH_EINVAL);
	HCHECK(h, tp_all_reduce_team(g, (int[]){r}, 1, v, 1, 4, 100, err, sizeof err) == 0);
	HCHECK(h, tp_group_check(g, err, sizeof err) == 0);
}

TEST(teams_side_by_side)
{
	run(4, fn_teams);
}

/* ---- tagged messages ---------------------------------------------------------------------- */

#define MB 4

static size_t mb_len(int k)
{
	return k == 0 ? 0 : k == 1 ? 7 : k == 2 ? 100000 : 8192;
}

/* Rank 0 starts MB micro-batches without waiting, ranks 1 and 2 pass each on (adding their rank
 * to every byte), rank 2 sends back to 0, which collects them in order. */
static void fn_ring(tp_group_t *g, hrank_t *h)
{
	char err[256];
	int r = h->l.rank;
	uint8_t *buf = malloc(100000), *got = malloc(100000);
	uint32_t tag;
	size_t len;
	if (r == 0) {
		for (int k = 0; k < MB; k++) {
			memset(buf, k, mb_len(k));
			HCHECK(h, tp_group_send_msg(g, 1, 100 + (uint32_t)k, buf, mb_len(k), 5000,
						    err, sizeof err) == 0);
		}
		for (int k = 0; k < MB; k++) {
			int ready = -1;
			HCHECK(h, tp_group_wait_msg(g, (int[]){2}, 1, &ready, 5000, err,
						    sizeof err) == 0);
			HCHECK(h, ready == 2);
			HCHECK(h, tp_group_recv_msg(g, 2, &tag, got, 100000, &len, 5000, err,
						    sizeof err) == 0);
			HCHECK(h, tag == 100 + (uint32_t)k && len == mb_len(k));
			size_t bad = 0;
			for (size_t i = 0; i < len; i++)
				bad += got[i] != (uint8_t)(k + 1 + 2);
			HCHECK(h, bad == 0);
		}
	} else {
		for (int k = 0; k < MB; k++) {
			HCHECK(h, tp_group_recv_msg(g, r - 1, &tag, got, 100000, &len, 5000, err,
						    sizeof err) == 0);
			HCHECK(h, tag == 100 + (uint32_t)k && len == mb_len(k));
			for (size_t i = 0; i < len; i++)
				got[i] = (uint8_t)(got[i] + r);
			HCHECK(h, tp_group_send_msg(g, (r + 1) % 3, tag, got, len, 5000, err,
						    sizeof err) == 0);
		}
	}
	/* messages share each pair's order with the collectives: an all-reduce still works */
	float v[16] = {1};
	HCHECK(h, tp_all_reduce_f32(g, v, 16, 5000, err, sizeof err) == 0);
	HCHECK(h, v[0] == 3);
	free(buf);
	free(got);
}

TEST(micro_batches_around_a_ring)
{
	run(3, fn_ring);
}

/* Rank 2 takes whichever source is ready: rank 1 sends only after rank 2 got rank 0's message,
 * so the first ready source must be 0. */
static void fn_wait_any(tp_group_t *g, hrank_t *h)
{
	char err[256];
	int r = h->l.rank, ready = -1;
	uint32_t tag;
	size_t len;
	uint8_t b[16] = {0};
	if (r == 0) {
		HCHECK(h, tp_group_send_msg(g, 2, 1, "zero", 4, 5000, err, sizeof err) == 0);
	} else if (r == 1) {
		for (int i = 0; i < 5000 && !atomic_load(h->flag); i++)
			usleep(1000);
		HCHECK(h, tp_group_send_msg(g, 2, 2, "one", 3, 5000, err, sizeof err) == 0);
	}
	if (r != 2) { /* stay: a closed link would count as ready */
		for (int i = 0; i < 10000 && atomic_load(h->flag) < 2; i++)
			usleep(1000);
	} else {
		/* nothing yet from rank 1: timeout 0 just looks */
		HCHECK(h, tp_group_wait_msg(g, (int[]){1}, 1, &ready, 0, err, sizeof err) ==
			      SH_ETIMEDOUT);
		HCHECK(h,
		       tp_group_wait_msg(g, (int[]){0, 1}, 2, &ready, 5000, err, sizeof err) == 0);
		HCHECK(h, ready == 0);
		HCHECK(h, tp_group_recv_msg(g, ready, &tag, b, sizeof b, &len, 5000, err,
					    sizeof err) == 0);
		HCHECK(h, tag == 1 && len == 4 && !memcmp(b, "zero", 4));
		atomic_store(h->flag, 1);
		HCHECK(h,
		       tp_group_wait_msg(g, (int[]){0, 1}, 2, &ready, 5000, err, sizeof err) == 0);
		HCHECK(h, ready == 1);
		HCHECK(h, tp_group_recv_msg(g, ready, &tag, b, sizeof b, &len, 5000, err,
					    sizeof err) == 0);
		HCHECK(h, tag == 2 && len == 3 && !memcmp(b, "one", 3));
		HCHECK(h, tp_group_check(g, err, sizeof err) == 0);
		HCHECK(h, tp_group_wait_msg(g, (int[]){2}, 1, &ready, 0, err, sizeof err) ==
			      SH_EINVAL); /* ourselves */
		atomic_store(h->flag, 2);
	}
}

TEST(wait_for_whichever_source)
{
	run(3, fn_wait_any);
}

/* A message over one frame (16 MiB), then one longer than the receiver's room. */
static void fn_big(tp_group_t *g, hrank_t *h)
{
	char err[256];
	size_t n = (17u << 20) + 5;
	uint8_t *b = malloc(n);
	uint32_t tag;
	size_t len;
	if (h->l.rank == 0) {
		for (size_t i = 0; i < n; i++)
			b[i] = (uint8_t)(i * 31 + 7);
		HCHECK(h, tp_group_send_msg(g, 1, 9, b, n, 10000, err, sizeof err) == 0);
		HCHECK(h, tp_group_send_msg(g, 1, 10, b, 1000, 10000, err, sizeof err) == 0);
	} else {
		memset(b, 0, n);
		HCHECK(h, tp_group_recv_msg(g, 0, &tag, b, n, &len, 10000, err, sizeof err) == 0);
		HCHECK(h, tag == 9 && len == n);
		size_t bad = 0;
		for (size_t i = 0; i < n; i++)
			bad += b[i] != (uint8_t)(i * 31 + 7);
		HCHECK(h, bad == 0);
		HCHECK(h, tp_group_recv_msg(g, 0, &tag, b, 999, &len, 10000, err, sizeof err) ==
			      SH_EINVAL);
		HCHECK(h, strstr(err, "room for 999") != NULL);
		HCHECK(h, tp_group_check(g, err, sizeof err) == SH_EINVAL); /* broken for good */
	}
	free(b);
}

TEST(message_over_one_frame_and_too_long)
{
	run(2, fn_big);
}

/* One side sends a message, the other expects an all-reduce: out of step, on both. */
static void fn_mismatch(tp_group_t *g, hrank_t *h)
{
	char err[256];
	float v[8] = {0};
	int rc = h->l.rank == 0 ? tp_group_send_msg(g, 1, 1, v, sizeof v, 2000, err, sizeof err)
				: tp_all_reduce_f32(g, v, 8, 2000, err, sizeof err);
	if (h->l.rank == 1) {
		HCHECK(h, rc == SH_EFORMAT);
		HCHECK(h, strstr(err, "out of step") != NULL);
	}
}

TEST(message_where_a_collective_is_expected)
{
	run(2, fn_mismatch);
}

int main(void)
{
	char err[128];
	signal(SIGPIPE, SIG_IGN);
	if (sodium_init() < 0)
		return 1;
	tp_keys_set_cost_for_tests(1, 8192);
	if (tp_keys_derive(&K, "hybrid-token", 12, err, sizeof err))
		return 1;
	RUN(teams_side_by_side);
	RUN(micro_batches_around_a_ring);
	RUN(wait_for_whichever_source);
	RUN(message_over_one_frame_and_too_long);
	RUN(message_where_a_collective_is_expected);
	return harness_done();
}
