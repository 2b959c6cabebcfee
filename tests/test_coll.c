/* test_coll.c: groups of 2..5 ranks (threads, and forked processes for kill -9) on loopback:
 * forming, all-reduce on both paths with exact and bit-identical sums, broadcast, all-gather,
 * barrier, point-to-point, and failures: a stalled rank, a dead rank, a wrong token, a wrong
 * group tag. */
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <sys/wait.h>

#include "common/common.h"
#include "harness.h"
#include "loop_group.h"
#include "transport/group.h"
#include "transport/keys.h"
#include "transport/transport.h"

#define MAXR 8
static tp_keys_t K1, K2;

typedef struct rank_ctx rank_ctx_t;
typedef void (*rank_fn)(tp_group_t *g, rank_ctx_t *c);

struct rank_ctx {
	loop_rank_t l; /* first: loop_run fills it */
	const tp_keys_t *keys;
	uint64_t tag;
	int form_timeout;
	uint8_t id[16];
	rank_fn fn;
	void *user;
	int rc_new;
	char err[256];
	int fails; /* checks failed inside the rank (counted in the main thread) */
	/* results the test inspects */
	float *out;
	size_t n;
	int rc;
	int64_t ms;
	int start_delay_ms; /* sleep before forming (start-order tests) */
};

static void *rank_main(void *p)
{
	rank_ctx_t *c = p;
	tp_group_t *g = NULL;
	if (c->start_delay_ms)
		usleep((useconds_t)c->start_delay_ms * 1000);
	c->rc_new =
	    loop_join(&g, &c->l, c->tag, c->keys, c->id, c->form_timeout, c->err, sizeof c->err);
	if (c->rc_new == 0 && c->fn)
		c->fn(g, c);
	tp_group_free(g);
	return NULL;
}

/* Runs fn on `world` ranks in threads; ctx[i] holds each rank's results. */
static void run_ranks(int world, rank_fn fn, rank_ctx_t *ctx, void *user)
{
	for (int r = 0; r < world; r++) {
		rank_ctx_t *c = &ctx[r];
		if (!c->keys)
			c->keys = &K1;
		if (!c->form_timeout)
			c->form_timeout = 5000;
		c->id[0] = (uint8_t)(r + 1);
		c->fn = fn;
		c->user = user;
	}
	loop_run(ctx, sizeof *ctx, world, rank_main);
}

#define RCHECK(c, cond)                                                                            \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "rank %d: %s:%d: %s\n", (c)->l.rank, __FILE__, __LINE__,   \
				#cond);                                                            \
			(c)->fails++;                                                              \
		}                                                                                  \
	} while (0)

static int all_formed(rank_ctx_t *ctx, int world)
{
	int ok = 1;
	for (int r = 0; r < world; r++) {
		if (ctx[r].rc_new) {
			fprintf(stderr, "rank %d: %s\n", r, ctx[r].err);
			ok = 0;
		}
		CHECK_EQ_INT(ctx[r].fails, 0);
	}
	return ok;
}

/* ---- all-reduce --------------------------------------------------------------------------- */

static const size_t SIZES[] = {1, 7, 1000, 16384, 16385, 100003, (1u << 20) + 3};

static void fn_allreduce(tp_group_t *g, rank_ctx_t *c)
{
	char err[256];
	RCHECK(c, !strcmp(tp_group_link(g, (c->l.rank + 1) % c->l.world),
			  c->l.world > 1 ? "tcp" : "self"));
	for (size_t si = 0; si < ARRAY_LEN(SIZES); si++) {
		size_t n = SIZES[si];
		float *b = malloc(n * sizeof *b);
		/* small integers: every order of addition gives the exact sum */
		for (size_t i = 0; i < n; i++)
			b[i] = (float)((int)(i % 1000) * (c->l.rank + 1) - 500);
		int rc = tp_all_reduce_f32(g, b, n, 10000, err, sizeof err);
		RCHECK(c, rc == 0);
		int tri = c->l.world * (c->l.world + 1) / 2;
		size_t bad = 0;
		for (size_t i = 0; i < n; i++)
			if (b[i] != (float)((int)(i % 1000) * tri - 500 * c->l.world))
				bad++;
		if (bad)
			fprintf(stderr, "rank %d n %zu: %zu wrong sums\n", c->l.rank, n, bad);
		RCHECK(c, bad == 0);
		free(b);
	}
	/* random floats: bit-identical on every rank, near the reference */
	size_t n = c->n;
	for (size_t i = 0; i < n; i++) {
		uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(c->l.rank * 40503u + 17);
		h ^= h >> 13;
		h *= 0x5bd1e995u;
		h ^= h >> 15;
		c->out[i] = ((float)(h & 0xffffff) / 16777216.0f - 0.5f) * 3.0f;
	}
	uint64_t b0 = tp_group_bytes_sent(g);
	c->rc = tp_all_reduce_f32(g, c->out, n, 10000, err, sizeof err);
	/* bytes per rank: S for 2 ranks; (N-1) x S on the direct path, which small messages take
	 * (one latency instead of two); else the bandwidth-optimal 2 (N-1)/N x S */
	uint64_t sent = tp_group_bytes_sent(g) - b0, S = n * 4, w = (uint64_t)c->l.world;
	if (w == 2)
		RCHECK(c, sent == S);
	else if (w > 2 && (w - 1) * S <= TP_DIRECT_MAX_DEFAULT)
		RCHECK(c, sent == (w - 1) * S);
	else if (w > 2)
		RCHECK(c, sent <= 2 * S * (w - 1) / w + 8 * w);
	/* many small ones in a row (decode-like) */
	float v[1024];
	for (int it = 0; it < 100; it++) {
		for (int i = 0; i < 1024; i++)
			v[i] = (float)(c->l.rank + it + i);
		RCHECK(c, tp_all_reduce_f32(g, v, 1024, 5000, err, sizeof err) == 0);
		float want = 0;
		for (int r = 0; r < c->l.world; r++)
			want += (float)(r + it + 5);
		RCHECK(c, v[5] == want);
	}
}

static void check_identical(rank_ctx_t *ctx, int world, size_t n)
{
	/* reference in double from the same generator */
	double maxerr = 0;
	for (int r = 0; r < world; r++) {
		CHECK_EQ_INT(ctx[r].rc, 0);
		CHECK(memcmp(ctx[r].out, ctx[0].out, n * sizeof(float)) == 0);
	}
	for (size_t i = 0; i < n; i++) {
		double ref = 0;
		for (int r = 0; r < world; r++) {
			uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + 17);
			h ^= h >> 13;
			h *= 0x5bd1e995u;
			h ^= h >> 15;
			ref += (double)(((float)(h & 0xffffff) / 16777216.0f - 0.5f) * 3.0f);
		}
		double e = fabs(ref - (double)ctx[0].out[i]);
		if (e > maxerr)
			maxerr = e;
	}
	CHECK(maxerr < 1e-5);
}

static void allreduce_world(int world)
{
	rank_ctx_t ctx[MAXR] = {0};
	size_t ns[] = {3000, 300001}; /* direct path, 2-phase path (3+ ranks) */
	for (size_t k = 0; k < ARRAY_LEN(ns); k++) {
		memset(ctx, 0, sizeof ctx);
		for (int r = 0; r < world; r++) {
			ctx[r].n = ns[k];
			ctx[r].out = malloc(ns[k] * sizeof(float));
		}
		run_ranks(world, fn_allreduce, ctx, NULL);
		if (all_formed(ctx, world))
			check_identical(ctx, world, ns[k]);
		for (int r = 0; r < world; r++)
			free(ctx[r].out);
	}
}

TEST(all_reduce_world_1)
{
	allreduce_world(1);
}
TEST(all_reduce_world_2)
{
	allreduce_world(2);
}
TEST(all_reduce_world_3)
{
	allreduce_world(3);
}
TEST(all_reduce_world_4)
{
	allreduce_world(4);
}
TEST(all_reduce_world_5)
{
	allreduce_world(5);
}

static void fn_one_sum(tp_group_t *g, rank_ctx_t *c)
{
	char err[256];
	float v = 1;
	c->rc = tp_all_reduce_f32(g, &v, 1, 5000, err, sizeof err);
	RCHECK(c, v == (float)c->l.world);
}

TEST(start_order_does_not_matter)
{
	/* reverse order with gaps, and a random-ish order */
	int delays[2][4] = {{600, 400, 200, 0}, {150, 0, 450, 300}};
	for (int k = 0; k < 2; k++) {
		rank_ctx_t ctx[MAXR] = {0};
		for (int r = 0; r < 4; r++)
			ctx[r].start_delay_ms = delays[k][r];
		run_ranks(4, fn_one_sum, ctx, NULL);
		if (all_formed(ctx, 4))
			for (int r = 0; r < 4; r++)
				CHECK_EQ_INT(ctx[r].rc, 0);
	}
}

/* ---- broadcast, all-gather, barrier, point-to-point --------------------------------------- */

static void fn_misc(tp_group_t *g, rank_ctx_t *c)
{
	char err[256];
	int w = c->l.world, r = c->l.rank;
	for (int root = 0; root < w; root++) {
		size_t lens[] = {0, 5, 70000};
		for (size_t k = 0; k < ARRAY_LEN(lens); k++) {
			uint8_t b[70000];
			for (size_t i = 0; i < lens[k]; i++)
				b[i] = (uint8_t)(r == root ? i * 3 + (size_t)root : 0xee);
			RCHECK(c, tp_broadcast(g, b, lens[k], root, 5000, err, sizeof err) == 0);
			size_t bad = 0;
			for (size_t i = 0; i < lens[k]; i++)
				bad += b[i] != (uint8_t)(i * 3 + (size_t)root);
			RCHECK(c, bad == 0);
		}
	}
	RCHECK(c, tp_broadcast(g, NULL, 0, w, 100, err, sizeof err) == SH_EINVAL);
	/* all-gather: separate in/out and in-place */
	uint32_t in[100], out[MAXR * 100];
	for (int i = 0; i < 100; i++)
		in[i] = (uint32_t)(r * 1000 + i);
	RCHECK(c, tp_all_gather(g, in, sizeof in, out, 5000, err, sizeof err) == 0);
	for (int q = 0; q < w; q++)
		RCHECK(c, out[q * 100 + 42] == (uint32_t)(q * 1000 + 42));
	memset(out, 0, sizeof out);
	memcpy(out + r * 100, in, sizeof in);
	RCHECK(c, tp_all_gather(g, out + r * 100, sizeof in, out, 5000, err, sizeof err) == 0);
	for (int q = 0; q < w; q++)
		RCHECK(c, out[q * 100 + 99] == (uint32_t)(q * 1000 + 99));
	for (int i = 0; i < 5; i++)
		RCHECK(c, tp_barrier(g, 5000, err, sizeof err) == 0);
	/* pipeline: r sends to r+1, the last rank sends back to 0 */
	if (w > 1) {
		uint8_t msg[3000], got[3000];
		memset(msg, r, sizeof msg);
		int to = (r + 1) % w, from = (r + w - 1) % w;
		if (r == 0) {
			RCHECK(c,
			       tp_group_send(g, to, msg, sizeof msg, 5000, err, sizeof err) == 0);
			RCHECK(c,
			       tp_group_recv(g, from, got, sizeof got, 5000, err, sizeof err) == 0);
		} else {
			RCHECK(c,
			       tp_group_recv(g, from, got, sizeof got, 5000, err, sizeof err) == 0);
			RCHECK(c,
			       tp_group_send(g, to, msg, sizeof msg, 5000, err, sizeof err) == 0);
		}
		RCHECK(c, got[0] == from && got[2999] == from);
		RCHECK(c, tp_group_send(g, r, msg, 1, 100, err, sizeof err) == SH_EINVAL);
	}
	RCHECK(c, tp_group_bytes_sent(g) > 0 || w == 1);
}

TEST(broadcast_gather_barrier_p2p)
{
	for (int w = 1; w <= 4; w++) {
		rank_ctx_t ctx[MAXR] = {0};
		run_ranks(w, fn_misc, ctx, NULL);
		all_formed(ctx, w);
	}
}

/* ---- 8-bit blocks on the wire ------------------------------------------------------------- */

TEST(q8_codec)
{
	float x[70], y[70];
	uint8_t q[3 * 36];
	for (int i = 0; i < 70; i++)
		x[i] = sinf((float)i * 0.7f) * (i < 32 ? 1.0f : 100.0f);
	x[5] = 0;
	CHECK_EQ_INT(tp_q8_size(70), 3 * 36);
	CHECK_EQ_INT(tp_q8_size(0), 0);
	tp_q8_encode(q, x, 70);
	tp_q8_decode(y, q, 70, 0);
	for (int b = 0; b < 3; b++) {
		float amax = 0;
		for (int i = b * 32; i < MIN(70, b * 32 + 32); i++)
			amax = fmaxf(amax, fabsf(x[i]));
		for (int i = b * 32; i < MIN(70, b * 32 + 32); i++)
			CHECK(fabsf(y[i] - x[i]) <= amax / 254.0f * 1.0001f);
	}
	CHECK(y[5] == 0);
	/* decoding is deterministic and add mode adds */
	float z[70];
	memcpy(z, y, sizeof z);
	tp_q8_decode(z, q, 70, 1);
	for (int i = 0; i < 70; i++)
		CHECK(z[i] == y[i] + y[i]);
	/* zeros, Inf and NaN: no undefined behaviour, non-finite blocks become NaN */
	float w[32] = {0};
	tp_q8_encode(q, w, 32);
	tp_q8_decode(y, q, 32, 0);
	CHECK(y[0] == 0 && y[31] == 0);
	w[3] = INFINITY;
	tp_q8_encode(q, w, 32);
	tp_q8_decode(y, q, 32, 0);
	CHECK(isnan(y[3]) && isnan(y[0]));
	w[3] = NAN;
	tp_q8_encode(q, w, 32);
	tp_q8_decode(y, q, 32, 0);
	CHECK(isnan(y[7]));
}

static void fn_q8(tp_group_t *g, rank_ctx_t *c)
{
	char err[256];
	RCHECK(c, tp_group_set_q8(g, 1) == 0);
	size_t n = c->n;
	for (size_t i = 0; i < n; i++)
		c->out[i] = sinf((float)(i * 13 + (size_t)c->l.rank * 7)) * (float)(1 + i % 5);
	uint64_t b0 = tp_group_bytes_sent(g);
	c->rc = tp_all_reduce_f32(g, c->out, n, 10000, err, sizeof err);
	uint64_t sent = tp_group_bytes_sent(g) - b0;
	/* 36/128 of the f32 bytes: to each peer on the direct path, else ~2 x that */
	uint64_t w = (uint64_t)c->l.world, q = tp_q8_size(n);
	if (w == 2 || (w - 1) * q <= TP_DIRECT_MAX_DEFAULT)
		RCHECK(c, sent == (w - 1) * q);
	else
		RCHECK(c, sent < n * 4 * 2 / 3);
	if (c->rc)
		snprintf(c->err, sizeof c->err, "%s", err);
}

TEST(q8_all_reduce)
{
	size_t ns[] = {1000, 70001};
	for (int w = 2; w <= 4; w++) {
		for (size_t k = 0; k < ARRAY_LEN(ns); k++) {
			size_t n = ns[k];
			rank_ctx_t ctx[MAXR] = {0};
			for (int r = 0; r < w; r++) {
				ctx[r].n = n;
				ctx[r].out = malloc(n * sizeof(float));
			}
			run_ranks(w, fn_q8, ctx, NULL);
			if (all_formed(ctx, w)) {
				double worst = 0;
				for (int r = 0; r < w; r++) {
					CHECK_EQ_INT(ctx[r].rc, 0);
					CHECK(memcmp(ctx[r].out, ctx[0].out, n * 4) == 0);
				}
				/* against the exact sum, with the documented bound per element:
				 * sum_P amax_P / 254 + amax(sum) / 254, amax <= 5 per rank here */
				for (size_t i = 0; i < n; i++) {
					double ref = 0;
					for (int r = 0; r < w; r++)
						ref +=
						    (double)(sinf((float)(i * 13 + (size_t)r * 7)) *
							     (float)(1 + i % 5));
					worst = fmax(worst, fabs(ref - (double)ctx[0].out[i]));
				}
				double bound = (5.0 * w + 5.0 * w) / 254.0;
				CHECK(worst <= bound);
				fprintf(stderr,
					"q8 all-reduce world %d n %zu: max error %.4g "
					"(bound %.4g)\n",
					w, n, worst, bound);
			}
			for (int r = 0; r < w; r++)
				free(ctx[r].out);
		}
	}
}

static void fn_q8_mismatch(tp_group_t *g, rank_ctx_t *c)
{
	char err[256];
	float v[1000] = {0};
	tp_group_set_q8(g, c->l.rank == 0);
	c->rc = tp_all_reduce_f32(g, v, 1000, 2000, err, sizeof err);
	snprintf(c->err, sizeof c->err, "%s", err);
}

TEST(q8_mismatch_is_out_of_step)
{
	rank_ctx_t ctx[MAXR] = {0};
	run_ranks(2, fn_q8_mismatch, ctx, NULL);
	all_formed(ctx, 2);
	for (int r = 0; r < 2; r++) {
		CHECK_EQ_INT(ctx[r].rc, SH_EFORMAT);
		CHECK(strstr(ctx[r].err, "out of step") != NULL);
	}
}

/* ---- deterministic sums: a row's result never depends on the batch or the path --------------- */

/* Rank r's contribution to element i of row `row`: magnitudes spread over 7 decades, so that a
 * different order of addition would change the low bits. */
static float det_val(int r, int row, size_t i)
{
	uint32_t h = ((uint32_t)row * 7919u + (uint32_t)i * 104729u) ^ ((uint32_t)r * 2654435761u);
	h ^= h >> 15;
	h *= 0x2c1b3c6du;
	h ^= h >> 12;
	float scale[] = {1e-3f, 1e-2f, 0.1f, 1.0f, 10.0f, 100.0f, 1000.0f};
	return ((float)(h & 0xffff) / 65536.0f - 0.5f) * scale[(h >> 16) % 7];
}

/* The expected bits of one row: f32, rank order 0..N-1; q8, dq(q(x)) of every rank's row
 * (blocks per row) in rank order, and for 3+ ranks dq(q(sum)). */
static void det_ref(float *out, int world, int row, size_t cols, int q8)
{
	float *x = malloc(cols * sizeof *x);
	uint8_t *q = malloc(tp_q8_size(cols));
	for (int r = 0; r < world; r++) {
		for (size_t i = 0; i < cols; i++)
			x[i] = det_val(r, row, i);
		if (q8) {
			tp_q8_encode(q, x, cols);
			tp_q8_decode(out, q, cols, r > 0);
		} else {
			for (size_t i = 0; i < cols; i++)
				out[i] = r ? out[i] + x[i] : x[i];
		}
	}
	if (q8 && world >= 3) {
		tp_q8_encode(q, out, cols);
		tp_q8_decode(out, q, cols, 0);
	}
	free(x);
	free(q);
}

struct det_cfg {
	size_t cols;
	int q8;
	size_t direct_max;
};

static void fn_det(tp_group_t *g, rank_ctx_t *c)
{
	const struct det_cfg *dc = c->user;
	char err[256];
	size_t cols = dc->cols;
	int batches[] = {1, 2, 3, 8, 9, 17, 64};
	float *buf = malloc(64 * cols * sizeof *buf), *ref = malloc(cols * sizeof *ref);
	tp_group_set_q8(g, dc->q8);
	tp_group_set_direct_max(g, dc->direct_max);
	size_t bad = 0;
	for (size_t k = 0; k < ARRAY_LEN(batches); k++) {
		int B = batches[k], first = (int)k * 5; /* row 5 appears in several batches */
		for (int b = 0; b < B; b++)
			for (size_t i = 0; i < cols; i++)
				buf[(size_t)b * cols + i] = det_val(c->l.rank, first + b, i);
		int rc = tp_all_reduce_team(g, NULL, 0, buf, (size_t)B, cols, 10000, err,
					    sizeof err);
		RCHECK(c, rc == 0);
		if (rc)
			break;
		for (int b = 0; b < B; b++) {
			det_ref(ref, c->l.world, first + b, cols, dc->q8);
			if (memcmp(ref, buf + (size_t)b * cols, cols * sizeof *ref))
				bad++;
		}
	}
	if (bad)
		fprintf(stderr, "rank %d: %zu rows differ from the row reduced alone\n", c->l.rank,
			bad);
	RCHECK(c, bad == 0);
	free(buf);
	free(ref);
}

TEST(sums_do_not_depend_on_batch_or_path)
{
	/* every row's bits equal the rank-order sum of that row alone: the same row in batches of
	 * 1..64 rows, on 2 and 3 ranks, direct and 2-phase paths, f32 and the q8 wire, rows
	 * whole blocks long (2048) or not (100) */
	size_t cols[] = {2048, 100};
	size_t dmax[] = {0, 1u << 30}; /* always 2-phase (3 ranks), always direct */
	for (int w = 2; w <= 3; w++)
		for (size_t ci = 0; ci < ARRAY_LEN(cols); ci++)
			for (int q8 = 0; q8 <= 1; q8++)
				for (size_t di = 0; di < ARRAY_LEN(dmax); di++) {
					struct det_cfg dc = {cols[ci], q8, dmax[di]};
					rank_ctx_t ctx[MAXR] = {0};
					run_ranks(w, fn_det, ctx, &dc);
					all_formed(ctx, w);
				}
}

/* ---- reduce to one member: the bits the all-reduce gives it ---------------------------------- */

/* Every rank root in turn, the whole group and (3 ranks) the team {0, 2}; rows 1 and 3 of cols
 * (100, 2048, and 40000 floats: several frames); root's rows equal det_ref (what the all-reduce
 * gives, the test above), the others' are untouched. A root outside the team is refused and the
 * group stays usable. */
static void fn_reduce(tp_group_t *g, rank_ctx_t *c)
{
	const struct det_cfg *dc = c->user;
	char err[256];
	size_t cols = dc->cols;
	float *buf = malloc(3 * cols * sizeof *buf), *ref = malloc(cols * sizeof *ref);
	tp_group_set_q8(g, dc->q8);
	int w = c->l.world, me = c->l.rank, team02[2] = {0, 2};
	size_t bad = 0;
	for (int t = 0; t < (w == 3 ? 2 : 1); t++) {
		const int *ranks = t ? team02 : NULL;
		int n = t ? 2 : 0;
		if (t && me == 1)
			continue; /* not in the team */
		for (int root = 0; root < w; root++) {
			if (t && root == 1)
				continue;
			for (int rows = 1; rows <= 3; rows += 2) {
				for (int b = 0; b < rows; b++)
					for (size_t i = 0; i < cols; i++)
						buf[(size_t)b * cols + i] = det_val(me, root + b, i);
				int rc = tp_reduce_team(g, ranks, n, root, buf, (size_t)rows, cols,
							10000, err, sizeof err);
				RCHECK(c, rc == 0);
				if (rc) {
					fprintf(stderr, "rank %d: %s\n", me, err);
					goto out;
				}
				for (int b = 0; b < rows; b++) {
					const float *row = buf + (size_t)b * cols;
					if (me == root) {
						if (t) { /* ranks 0 and 2: as a world of 2 */
							float *x = malloc(cols * sizeof *x);
							det_ref(ref, 1, root + b, cols, dc->q8);
							for (size_t i = 0; i < cols; i++)
								x[i] = det_val(2, root + b, i);
							if (dc->q8) {
								uint8_t *q = malloc(tp_q8_size(cols));
								tp_q8_encode(q, x, cols);
								tp_q8_decode(ref, q, cols, 1);
								free(q);
							} else {
								for (size_t i = 0; i < cols; i++)
									ref[i] += x[i];
							}
							free(x);
						} else {
							det_ref(ref, w, root + b, cols, dc->q8);
						}
					} else {
						for (size_t i = 0; i < cols; i++)
							ref[i] = det_val(me, root + b, i);
					}
					bad += memcmp(ref, row, cols * sizeof *ref) != 0;
				}
			}
		}
	}
	RCHECK(c, tp_reduce_team(g, NULL, 0, w, buf, 1, cols, 1000, err, sizeof err) == SH_EINVAL);
	RCHECK(c, tp_group_check(g, err, sizeof err) == 0);
out:
	if (bad)
		fprintf(stderr, "rank %d: %zu rows differ\n", me, bad);
	RCHECK(c, bad == 0);
	free(buf);
	free(ref);
}

/* fn on 2 and 3 ranks, for each row length of cols[n], f32 and the q8 wire (default paths). */
static void run_wires(rank_fn fn, const size_t *cols, size_t n)
{
	for (int w = 2; w <= 3; w++)
		for (size_t ci = 0; ci < n; ci++)
			for (int q8 = 0; q8 <= 1; q8++) {
				struct det_cfg dc = {cols[ci], q8, TP_DIRECT_MAX_DEFAULT};
				rank_ctx_t ctx[MAXR] = {0};
				run_ranks(w, fn, ctx, &dc);
				all_formed(ctx, w);
			}
}

TEST(reduce_to_one_gives_the_all_reduce_bits)
{
	size_t cols[] = {100, 2048, 40000};
	run_wires(fn_reduce, cols, ARRAY_LEN(cols));
}

/* ---- streamed all-reduce: the same bits as the plain one ---------------------------------- */

static void fn_stream(tp_group_t *g, rank_ctx_t *c)
{
	const struct det_cfg *dc = c->user;
	char err[256];
	size_t cols = dc->cols;
	float *a = malloc(3 * cols * sizeof *a), *b = malloc(3 * cols * sizeof *b);
	tp_group_set_q8(g, dc->q8);
	size_t bad = 0;
	for (int rows = 1; rows <= 3; rows += 2)
		for (int nc = 1; nc <= 4; nc *= 2) {
			for (int r = 0; r < rows; r++)
				for (size_t i = 0; i < cols; i++)
					a[(size_t)r * cols + i] = b[(size_t)r * cols + i] =
					    det_val(c->l.rank, r + nc, i);
			RCHECK(c, tp_all_reduce_team(g, NULL, 0, a, (size_t)rows, cols, 5000, err,
						     sizeof err) == 0);
			int rc = tp_all_reduce_begin(g, NULL, 0, b, (size_t)rows, cols, nc, 5000,
						     err, sizeof err);
			for (int k = 0; k < nc && !rc; k++) {
				size_t c0, c1;
				tp_all_reduce_chunk(cols, nc, k, &c0, &c1);
				RCHECK(c, c0 % 32 == 0 && c1 > c0);
				rc = tp_all_reduce_push(g, k, err, sizeof err);
			}
			if (!rc)
				rc = tp_all_reduce_end(g, err, sizeof err);
			RCHECK(c, rc == 0);
			if (rc)
				fprintf(stderr, "rank %d: %s\n", c->l.rank, err);
			bad += memcmp(a, b, (size_t)rows * cols * sizeof *a) != 0;
		}
	RCHECK(c, bad == 0);
	/* misuse: out of order, early end, twice begun; the group stays usable */
	RCHECK(c, tp_all_reduce_begin(g, NULL, 0, b, 1, cols, 2, 5000, err, sizeof err) == 0);
	RCHECK(c,
	       tp_all_reduce_begin(g, NULL, 0, b, 1, cols, 2, 5000, err, sizeof err) == SH_EINVAL);
	RCHECK(c, tp_all_reduce_push(g, 1, err, sizeof err) == SH_EINVAL);
	RCHECK(c, tp_all_reduce_end(g, err, sizeof err) == SH_EINVAL);
	RCHECK(c, tp_all_reduce_begin(g, NULL, 0, b, 1, cols, 9999, 5000, err, sizeof err) ==
		      SH_EINVAL);
	RCHECK(c, tp_group_check(g, err, sizeof err) == 0);
	free(a);
	free(b);
}

TEST(streamed_sums_equal_plain_ones)
{
	size_t cols[] = {2048, 100};
	run_wires(fn_stream, cols, ARRAY_LEN(cols));
}

TEST(stream_chunk_policy)
{
	/* pure: chunk bounds tile the row in whole blocks */
	size_t c0, c1, prev = 0;
	for (int k = 0; k < 3; k++) {
		tp_all_reduce_chunk(2048, 3, k, &c0, &c1);
		CHECK(c0 == prev && c0 % 32 == 0);
		prev = c1;
	}
	CHECK_EQ_INT(prev, 2048);
	tp_all_reduce_chunk(100, 2, 1, &c0, &c1);
	CHECK(c0 == 64 && c1 == 100);
	CHECK_EQ_INT(tp_all_reduce_stream_chunks(NULL, 1, 2048), 0);
}

/* ---- failures ----------------------------------------------------------------------------- */

/* The last rank stalls (never calls); the others time out. */
static void fn_stall(tp_group_t *g, rank_ctx_t *c)
{
	char err[256];
	float v[256] = {0};
	if (c->l.rank == c->l.world - 1) {
		usleep(1500 * 1000);
		return;
	}
	int64_t t0 = now_ms();
	c->rc = tp_all_reduce_f32(g, v, 256, 300, err, sizeof err);
	c->ms = now_ms() - t0;
	if (c->rc)
		snprintf(c->err, sizeof c->err, "%s", err);
	/* broken for good */
	RCHECK(c, tp_barrier(g, 100, err, sizeof err) == c->rc);
}

TEST(stalled_rank_times_out)
{
	rank_ctx_t ctx[MAXR] = {0};
	run_ranks(3, fn_stall, ctx, NULL);
	all_formed(ctx, 3);
	for (int r = 0; r < 2; r++) {
		CHECK_EQ_INT(ctx[r].rc, SH_ETIMEDOUT);
		CHECK(ctx[r].ms < 1400); /* it returned before the stalled rank woke up */
		CHECK(strstr(ctx[r].err, "rank 2") != NULL || strstr(ctx[r].err, "rank ") != NULL);
	}
}

/* The last rank leaves (its sockets close, as when killed); the others see it at once. */
static void fn_leave(tp_group_t *g, rank_ctx_t *c)
{
	char err[256];
	float v[100000] = {0};
	if (c->l.rank == c->l.world - 1)
		return; /* rank_main frees the group */
	usleep(100 * 1000);
	int64_t t0 = now_ms();
	c->rc = tp_all_reduce_f32(g, v, c->l.rank == 0 ? 100000 : 100000, 5000, err, sizeof err);
	c->ms = now_ms() - t0;
	snprintf(c->err, sizeof c->err, "%s", err);
}

TEST(dead_rank_is_an_error)
{
	rank_ctx_t ctx[MAXR] = {0};
	run_ranks(4, fn_leave, ctx, NULL);
	all_formed(ctx, 4);
	for (int r = 0; r < 3; r++) {
		/* the all-reduce breaks: every survivor fails, either from the dead rank or a
		 * peer that failed; nobody waits for the full 5 s except through a failed peer */
		CHECK(ctx[r].rc == SH_ECLOSED || ctx[r].rc == SH_ETIMEDOUT);
		fprintf(stderr, "rank %d after a peer left: %s (%lld ms)\n", r, ctx[r].err,
			(long long)ctx[r].ms);
	}
	CHECK(ctx[2].rc == SH_ECLOSED); /* it exchanges with the dead rank: sees it directly */
}

TEST(wrong_token_cannot_join)
{
	rank_ctx_t ctx[MAXR] = {0};
	ctx[1].keys = &K2;
	ctx[0].form_timeout = ctx[1].form_timeout = 800;
	run_ranks(2, NULL, ctx, NULL);
	CHECK_EQ_INT(ctx[1].rc_new, SH_EAUTH);
	CHECK(strstr(ctx[1].err, "does not hold our token") != NULL);
	CHECK_EQ_INT(ctx[0].rc_new, SH_ETIMEDOUT);
	CHECK(strstr(ctx[0].err, "ranks 1 did not join") != NULL);
}

TEST(wrong_tag_cannot_join)
{
	rank_ctx_t ctx[MAXR] = {0};
	ctx[0].tag = 1;
	ctx[1].tag = 2;
	ctx[0].form_timeout = ctx[1].form_timeout = 800;
	run_ranks(2, NULL, ctx, NULL);
	CHECK(ctx[0].rc_new != 0);
	/* rank 0 answers as its own group: rank 1 sees the other tag, a code it may retry on */
	CHECK_EQ_INT(ctx[1].rc_new, SH_EBUSY);
	CHECK(strstr(ctx[1].err, "belongs to another group") != NULL);
	fprintf(stderr, "rank 1: %s\n", ctx[1].err);
}

static const uint8_t WANT_IDS[2][16] = {{1}, {0x77}}; /* rank 1 is expected to be node 77.. */

static void *rank_main_ids(void *p)
{
	rank_ctx_t *c = p;
	tp_group_cfg_t cfg = {.rank = c->l.rank,
			      .world = 2,
			      .hosts = c->l.hosts,
			      .ports = c->l.ports,
			      .listen_fd = c->l.lfd,
			      .keys = &K1,
			      .node_id = c->id,
			      .peer_ids = c->l.rank == 0 ? WANT_IDS : NULL,
			      .timeout_ms = 800};
	tp_group_t *g = NULL;
	c->rc_new = tp_group_new(&g, &cfg, c->err, sizeof c->err);
	tp_group_free(g);
	return NULL;
}

TEST(unexpected_node_id_cannot_join)
{
	rank_ctx_t ctx[2] = {0};
	for (int r = 0; r < 2; r++)
		ctx[r].id[0] = (uint8_t)(r + 1); /* rank 1 is node 02.., not 77.. */
	loop_run(ctx, sizeof *ctx, 2, rank_main_ids);
	CHECK_EQ_INT(ctx[0].rc_new, SH_ETIMEDOUT);
	CHECK_EQ_INT(ctx[1].rc_new, SH_EAUTH);
	CHECK(strstr(ctx[1].err, "but is node 02") != NULL);
	fprintf(stderr, "rank 1: %s\n", ctx[1].err);
}

TEST(killed_process_rank)
{
	/* rank 1 is a forked process that forms the group and is then SIGKILLed mid-collective */
	char err[256];
	int lfd[2], ports[2];
	const char *hosts[2] = {"127.0.0.1", "127.0.0.1"};
	for (int r = 0; r < 2; r++)
		if (tp_listen("127.0.0.1", 0, &lfd[r], &ports[r], err, sizeof err))
			abort();
	pid_t pid = fork();
	if (pid == 0) {
		loop_rank_t l1 = {
		    .rank = 1, .world = 2, .lfd = lfd[1], .hosts = hosts, .ports = ports};
		tp_group_t *g = NULL;
		if (loop_join(&g, &l1, 0, &K1, NULL, 5000, err, sizeof err) == 0)
			pause(); /* stall inside the group until killed */
		_exit(1);
	}
	loop_rank_t l0 = {.rank = 0, .world = 2, .lfd = lfd[0], .hosts = hosts, .ports = ports};
	tp_group_t *g = NULL;
	CHECK_EQ_INT(loop_join(&g, &l0, 0, &K1, NULL, 5000, err, sizeof err), 0);
	usleep(100 * 1000);
	kill(pid, SIGKILL);
	float v[64] = {0};
	int64_t t0 = now_ms();
	int rc = tp_all_reduce_f32(g, v, 64, 3000, err, sizeof err);
	CHECK_EQ_INT(rc, SH_ECLOSED);
	CHECK(now_ms() - t0 < 3000);
	CHECK(strstr(err, "rank 1") != NULL);
	tp_group_free(g);
	waitpid(pid, NULL, 0);
	close(lfd[0]);
	close(lfd[1]);
}

/* ---- bench mode (scripts/bench_transport.sh): `test_coll bench [world]` ------------------- */

static double bench_seal(size_t len, int iters)
{
	uint8_t key[32] = {1}, nonce[24] = {0}, tag[16];
	uint8_t *b = calloc(1, len);
	int64_t t0 = now_ns();
	for (int i = 0; i < iters; i++) {
		nonce[0] = (uint8_t)i;
		crypto_aead_xchacha20poly1305_ietf_encrypt_detached(b, tag, NULL, b, len, NULL, 0,
								    NULL, nonce, key);
	}
	double us = (double)(now_ns() - t0) / 1e3 / iters;
	free(b);
	return us;
}

static void bench_rank(int rank, int world, int *lfd, int *ports)
{
	static const char *hosts[MAXR] = {"127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1",
					  "127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1"};
	char err[256];
	loop_rank_t l = {
	    .rank = rank, .world = world, .lfd = lfd[rank], .hosts = hosts, .ports = ports};
	tp_group_t *g = NULL;
	if (loop_join(&g, &l, 0, &K1, NULL, 10000, err, sizeof err)) {
		fprintf(stderr, "rank %d: %s\n", rank, err);
		return;
	}
	size_t small = 2048, big = 2u << 20; /* 8 KB and 8 MB of f32 */
	float *b = calloc(big, sizeof *b);
	int it_small = 2000, it_big = 10;
	for (int i = 0; i < 50; i++) /* warm-up: buffers reach their size */
		tp_all_reduce_f32(g, b, small, 10000, err, sizeof err);
	tp_all_reduce_f32(g, b, big, 10000, err, sizeof err);
	tp_barrier(g, 10000, err, sizeof err);
	uint64_t sent0 = tp_group_bytes_sent(g);
	int64_t t0 = now_ns();
	for (int i = 0; i < it_small; i++)
		if (tp_all_reduce_f32(g, b, small, 10000, err, sizeof err))
			break;
	int64_t t1 = now_ns();
	uint64_t sent1 = tp_group_bytes_sent(g);
	for (int i = 0; i < it_big; i++)
		if (tp_all_reduce_f32(g, b, big, 30000, err, sizeof err))
			break;
	int64_t t2 = now_ns();
	tp_group_set_q8(g, 1);
	for (int i = 0; i < 50; i++)
		tp_all_reduce_f32(g, b, small, 10000, err, sizeof err);
	uint64_t sent2 = tp_group_bytes_sent(g);
	int64_t t3 = now_ns();
	for (int i = 0; i < it_small; i++)
		if (tp_all_reduce_f32(g, b, small, 10000, err, sizeof err))
			break;
	int64_t t4 = now_ns();
	uint64_t sent3 = tp_group_bytes_sent(g);
	if (rank == 0) {
		fflush(stdout);
		double us = (double)(t1 - t0) / 1e3 / it_small;
		double s = (double)(t2 - t1) / 1e9 / it_big;
		printf("world %d, loopback, every frame XChaCha20-Poly1305 sealed:\n", world);
		printf("  all_reduce 8 KB (%s): %.1f us per call, %.0f bytes sent per call "
		       "per rank\n",
		       (world - 1) * 8192 <= (int)TP_DIRECT_MAX_DEFAULT ? "direct " : "2-phase", us,
		       (double)(sent1 - sent0) / it_small);
		printf("  all_reduce 8 MB (%s):  %.1f ms per call, %.2f GB/s algorithm "
		       "bandwidth (8 MB / time)\n",
		       world == 2 ? " direct" : "2-phase", s * 1e3, (double)big * 4 / s / 1e9);
		printf("  all_reduce 8 KB, q8 wire:  %.1f us per call, %.0f bytes sent per call "
		       "per rank\n",
		       (double)(t4 - t3) / 1e3 / it_small, (double)(sent3 - sent2) / it_small);
		fflush(stdout);
	}
	free(b);
	tp_group_free(g);
}

static int bench_main(int world)
{
	int lfd[MAXR], ports[MAXR];
	char err[128];
	if (world < 2 || world > MAXR)
		return 2;
	log_init_from_env();
	double big_us = bench_seal(8u << 20, 5);
	printf("XChaCha20-Poly1305 seal on this machine: 8 KB %.2f us, 8 MB %.2f ms (%.2f GB/s)\n",
	       bench_seal(8192, 2000), big_us / 1e3, (double)(8u << 20) / (big_us * 1e3));
	fflush(stdout);
	for (int r = 0; r < world; r++)
		if (tp_listen("127.0.0.1", 0, &lfd[r], &ports[r], err, sizeof err))
			return 1;
	pid_t pids[MAXR];
	for (int r = 1; r < world; r++) {
		pids[r] = fork();
		if (pids[r] == 0) {
			bench_rank(r, world, lfd, ports);
			_exit(0);
		}
	}
	bench_rank(0, world, lfd, ports);
	for (int r = 1; r < world; r++)
		waitpid(pids[r], NULL, 0);
	return 0;
}

/* ---- peer mode (the latency lab, scripts/bench_tp.sh): one rank of a group per process ------ */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* `test_coll peer RANK WORLD H0:P0,H1:P1,... [FLOATS [ITERS [COMPUTE_US [Q8 [CHUNKS]]]]]`: forms
 * the group, then ITERS all-reduces of FLOATS floats, each after COMPUTE_US of busy work (a
 * decode step's matmul between two syncs; CHUNKS > 0: streamed, a chunk pushed after each
 * 1/CHUNKS of the work), and prints this rank's time per all-reduce beyond the work (median,
 * p10, p90, mean, in us) and the bytes it sent per call. PEER_MEMBOUND=1: the work streams
 * through 16 MB as a matmul does (on a VM shared with the lab's switch that slows the network
 * path: q8 2048 floats, mean 145-196 us -> 254-292). */
static int peer_main(int argc, char **argv)
{
	char err[256], hosts_s[TP_MAX_WORLD][64];
	const char *hosts[TP_MAX_WORLD];
	int ports[TP_MAX_WORLD];
	if (argc < 5)
		return 2;
	int rank = atoi(argv[2]), world = atoi(argv[3]);
	size_t n = argc > 5 ? (size_t)atol(argv[5]) : 2048;
	int iters = argc > 6 ? atoi(argv[6]) : 2000, compute_us = argc > 7 ? atoi(argv[7]) : 0;
	int q8 = argc > 8 ? atoi(argv[8]) : 0, chunks = argc > 9 ? atoi(argv[9]) : 0;
	char *list = strdup(argv[4]), *save = NULL;
	int k = 0;
	for (char *t = strtok_r(list, ",", &save); t && k < TP_MAX_WORLD;
	     t = strtok_r(NULL, ",", &save), k++) {
		if (tp_hostport_parse(t, hosts_s[k], sizeof hosts_s[k], &ports[k], err, sizeof err))
			return 2;
		hosts[k] = hosts_s[k];
	}
	free(list);
	if (k != world || rank < 0 || rank >= world || iters < 1 || n < 1)
		return 2;
	log_init_from_env();
	uint8_t id[TP_NODE_ID_BYTES] = {(uint8_t)(rank + 1)};
	tp_group_cfg_t cfg = {.rank = rank,
			      .world = world,
			      .hosts = hosts,
			      .ports = ports,
			      .listen_fd = -1,
			      .keys = &K1,
			      .node_id = id,
			      .timeout_ms = 20000};
	tp_group_t *g;
	if (tp_group_new(&g, &cfg, err, sizeof err)) {
		fprintf(stderr, "rank %d: %s\n", rank, err);
		return 1;
	}
	tp_group_set_q8(g, q8);
	float *b = calloc(n, sizeof *b);
	double *us = calloc((size_t)iters, sizeof *us);
	float *mem = getenv("PEER_MEMBOUND") ? calloc(4u << 20, sizeof *mem) : NULL;
	size_t mpos = 0;
	int rc = 0;
	for (int i = 0; i < 50 && !rc; i++)
		rc = tp_all_reduce_f32(g, b, n, 10000, err, sizeof err);
	uint64_t s0 = tp_group_bytes_sent(g);
	for (int i = 0; i < iters && !rc; i++) {
		/* the time beyond the compute: all of the all-reduce, or (streamed) the pushes
		 * and the wait at the end */
		int64_t t0 = now_ns(), end = t0;
		if (chunks)
			rc = tp_all_reduce_begin(g, NULL, 0, b, 1, n, chunks, 10000, err,
						 sizeof err);
		for (int c = 0; c < (chunks ? chunks : 1) && !rc; c++) {
			end += (int64_t)compute_us * 1000 / (chunks ? chunks : 1);
			while (now_ns() < end) /* memory-bound work, as a decode step's matmul */
				for (size_t j = 0; mem && j < (1u << 14); j += 16)
					mem[(mpos = (mpos + 4096) % (16u << 20)) / 4] += 1.0f;
			for (size_t j = 0; j < n; j++)
				b[j] = (float)((j + (size_t)i) % 7) - 3.0f;
			if (chunks)
				rc = tp_all_reduce_push(g, c, err, sizeof err);
		}
		if (!rc)
			rc = chunks ? tp_all_reduce_end(g, err, sizeof err)
				    : tp_all_reduce_f32(g, b, n, 10000, err, sizeof err);
		us[i] = (double)(now_ns() - t0) / 1e3 - compute_us;
	}
	if (rc) {
		fprintf(stderr, "rank %d: %s\n", rank, err);
	} else {
		double sum = 0;
		for (int i = 0; i < iters; i++)
			sum += us[i];
		qsort(us, (size_t)iters, sizeof *us, cmp_double);
		printf("rank %d/%d all_reduce %zu floats%s%s, %d us compute between: median %.1f "
		       "us, p10 %.1f, p90 %.1f, mean %.1f; %.0f bytes sent per call\n",
		       rank, world, n, q8 ? " (q8 wire)" : "", chunks ? " streamed" : "",
		       compute_us, us[iters / 2], us[iters / 10], us[iters * 9 / 10], sum / iters,
		       (double)(tp_group_bytes_sent(g) - s0) / iters);
	}
	free(b);
	free(us);
	free(mem);
	tp_group_free(g);
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	char err[128];
	signal(SIGPIPE, SIG_IGN);
	if (sodium_init() < 0)
		return 1;
	tp_keys_set_cost_for_tests(1, 8192);
	if (tp_keys_derive(&K1, "coll-token", 10, err, sizeof err) ||
	    tp_keys_derive(&K2, "other-token", 11, err, sizeof err))
		return 1;
	if (argc > 1 && !strcmp(argv[1], "peer"))
		return peer_main(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "bench"))
		return bench_main(argc > 2 ? atoi(argv[2]) : 2);
	RUN(all_reduce_world_1);
	RUN(all_reduce_world_2);
	RUN(all_reduce_world_3);
	RUN(all_reduce_world_4);
	RUN(all_reduce_world_5);
	RUN(start_order_does_not_matter);
	RUN(broadcast_gather_barrier_p2p);
	RUN(q8_codec);
	RUN(q8_all_reduce);
	RUN(q8_mismatch_is_out_of_step);
	RUN(sums_do_not_depend_on_batch_or_path);
	RUN(reduce_to_one_gives_the_all_reduce_bits);
	RUN(streamed_sums_equal_plain_ones);
	RUN(stream_chunk_policy);
	RUN(stalled_rank_times_out);
	RUN(dead_rank_is_an_error);
	RUN(wrong_token_cannot_join);
	RUN(wrong_tag_cannot_join);
	RUN(unexpected_node_id_cannot_join);
	RUN(killed_process_rank);
	return harness_done();
}
