/* test_batch.c: continuous batching (infer.h's eng_seq_start / eng_step). At temperature 0
 * every request of a batch, admitted at staggered steps with more requests than slots, yields
 * exactly the ids it yields run alone on a fresh engine: on stories260K, a generated F32 llama
 * and a generated Q8_0 llama over 64 steps (top-1 every step), on one node and on 2 tensor /
 * 3 pipeline ranks (BATCH messages). Also: slot choice by the longest common prefix, SH_EBUSY
 * when full, cancellation frees the slot at once, long prompts are chunked between the decode
 * steps of others, and a failed rank ends every sequence with an error. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "gen_model.h"
#include "harness.h"
#include "infer/gguf_write.h"
#include "infer/infer.h"
#include "infer/quant/quant.h"
#include "loop_group.h"
#include "transport/transport.h"

#define N_REQ 6 /* requests, more than the slots */
#define SLOTS 4
#define GEN   64 /* tokens per request */
#define MAXP  80 /* longest prompt: more than a prefill chunk, so chunks meet decodes */
#define MAXR  3
#define CTX   192

static char F32[256], Q8[256], Q35[256];
static tp_keys_t KEYS;

typedef struct req {
	int prompt[MAXP], n_prompt;
	int ids[GEN + 1], n; /* generated ids */
	eng_result_t res;
	int id; /* sequence id while running */
} req_t;

static int collect(void *ud, const eng_token_t *t)
{
	req_t *r = ud;
	if (r->n <= GEN)
		r->ids[r->n++] = t->id;
	return 0;
}

/* Deterministic prompts of different lengths; 1 and 4 share a long prefix (0's prompt). */
static void make_prompts(req_t *rq, int vocab)
{
	static const int len[N_REQ] = {40, 70, 5, 12, 52, 80};
	uint32_t x = 12345;
	memset(rq, 0, sizeof *rq * N_REQ);
	for (int i = 0; i < N_REQ; i++) {
		rq[i].n_prompt = len[i];
		for (int k = 0; k < len[i]; k++) {
			x = x * 1103515245u + 12345u;
			rq[i].prompt[k] = 3 + (int)((x >> 8) % (uint32_t)(vocab - 3));
		}
	}
	memcpy(rq[4].prompt, rq[0].prompt, 40 * sizeof(int)); /* prefix of 0, then its own */
	memcpy(rq[1].prompt, rq[0].prompt, 30 * sizeof(int));
}

static eng_t *open_eng(const char *path, int parallel, const eng_dist_t *d, char *err)
{
	eng_opts_t o = {
	    .model_path = path, .threads = 2, .ctx = CTX, .parallel = parallel, .dist = d};
	eng_t *e = NULL;
	if (eng_open(&e, &o, err, 256))
		return NULL;
	return e;
}

static void sampling(eng_sampling_t *sp)
{
	eng_sampling_default(sp);
	sp->max_tokens = GEN;
}

/* Each request alone on a fresh one-slot engine. */
static int run_alone(const char *path, req_t *rq)
{
	char err[256];
	eng_sampling_t sp;
	sampling(&sp);
	for (int i = 0; i < N_REQ; i++) {
		eng_t *e = open_eng(path, 1, NULL, err);
		if (!e) {
			fprintf(stderr, "open %s: %s\n", path, err);
			return -1;
		}
		rq[i].n = 0;
		int rc =
		    eng_generate(e, rq[i].prompt, rq[i].n_prompt, &sp, collect, &rq[i], &rq[i].res);
		eng_free(e);
		if (rc)
			return rc;
	}
	return 0;
}

/* Each request alone, one after another, on engine e (on several ranks: the same group). */
static int run_each(eng_t *e, req_t *rq)
{
	eng_sampling_t sp;
	sampling(&sp);
	for (int i = 0; i < N_REQ; i++) {
		rq[i].n = 0;
		int rc =
		    eng_generate(e, rq[i].prompt, rq[i].n_prompt, &sp, collect, &rq[i], &rq[i].res);
		if (rc)
			return rc;
	}
	return 0;
}

/* All requests through one engine: two at once, the rest admitted at later steps as slots free
 * up (FIFO). Returns 0 or the first error. */
static int run_batched(eng_t *e, req_t *rq)
{
	eng_sampling_t sp;
	sampling(&sp);
	eng_done_t done[ENG_MAX_PARALLEL];
	int next = 0, ended = 0, step = 0, max_active = 0;
	int owner[ENG_MAX_PARALLEL];
	while (ended < N_REQ) {
		/* admission: two at step 0, then one more every third step while slots are free */
		while (next < N_REQ && (step == 0 ? next < 2 : step % 3 == 0) &&
		       eng_active(e) < eng_info(e)->n_slots) {
			req_t *r = &rq[next];
			r->n = 0;
			int id = eng_seq_start(e, r->prompt, r->n_prompt, &sp, collect, r, &r->res);
			if (id < 0)
				return id;
			owner[id] = next++;
			if (step)
				break;
		}
		max_active = MAX(max_active, eng_active(e));
		int nd = 0, rc = eng_step(e, done, &nd);
		for (int i = 0; i < nd; i++) {
			ended++;
			if (done[i].rc)
				return done[i].rc;
			(void)owner;
		}
		if (rc)
			return rc;
		step++;
		if (step > 100000)
			return SH_ETIMEDOUT;
	}
	return max_active >= 3 ? 0 : SH_EINVAL; /* the batch really held several sequences */
}

static void compare(const req_t *want, const req_t *got, const char *what)
{
	for (int i = 0; i < N_REQ; i++) {
		int same = want[i].n == got[i].n &&
			   !memcmp(want[i].ids, got[i].ids, (size_t)want[i].n * sizeof(int));
		if (!same)
			printf("  %s: request %d differs (%d vs %d tokens)\n", what, i, got[i].n,
			       want[i].n);
		CHECK(same);
		CHECK_EQ_INT(got[i].res.completion_tokens, want[i].res.completion_tokens);
		CHECK_EQ_INT(got[i].res.finish, want[i].res.finish);
	}
}

static void check_one_node(const char *path, const char *what)
{
	req_t want[N_REQ], got[N_REQ];
	char err[256];
	eng_t *e = open_eng(path, 0, NULL, err);
	if (!e) {
		printf("  %s: %s\n", what, err);
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(eng_info(e)->n_slots, ENG_DEFAULT_PARALLEL);
	make_prompts(want, eng_info(e)->n_vocab);
	make_prompts(got, eng_info(e)->n_vocab);
	CHECK_EQ_INT(run_alone(path, want), 0);
	CHECK_EQ_INT(run_batched(e, got), 0);
	compare(want, got, what);
	/* a second round on the same engine: slots now hold old prefixes, results stay the same */
	make_prompts(got, eng_info(e)->n_vocab);
	CHECK_EQ_INT(run_batched(e, got), 0);
	compare(want, got, what);
	eng_free(e);
}

TEST(same_as_alone_one_node)
{
	const char *s = harness_stories();
	if (s)
		check_one_node(s, "stories260K");
	check_one_node(F32, "llama f32");
	check_one_node(Q8, "llama q8_0");
}

TEST(slots_prefix_busy_cancel)
{
	char err[256];
	eng_t *e = open_eng(F32, 2, NULL, err);
	CHECK(e != NULL);
	if (!e)
		return;
	req_t rq[N_REQ];
	make_prompts(rq, eng_info(e)->n_vocab);
	eng_sampling_t sp;
	sampling(&sp);
	sp.max_tokens = 4;
	eng_done_t done[2];
	int nd;
	/* request 0 alone: it lands in some slot; request 4 (0's prompt as prefix) must follow it
	 */
	int a = eng_seq_start(e, rq[0].prompt, rq[0].n_prompt, &sp, collect, &rq[0], &rq[0].res);
	CHECK(a >= 0);
	while (eng_active(e))
		eng_step(e, done, &nd);
	int c = eng_seq_start(e, rq[2].prompt, rq[2].n_prompt, &sp, collect, &rq[2], &rq[2].res);
	CHECK(c >= 0 && c != a); /* the unrelated prompt takes the other (empty) slot */
	int b = eng_seq_start(e, rq[4].prompt, rq[4].n_prompt, &sp, collect, &rq[4], &rq[4].res);
	CHECK_EQ_INT(b, a);
	CHECK_EQ_INT(eng_active(e), 2);
	CHECK_EQ_INT(
	    eng_seq_start(e, rq[3].prompt, rq[3].n_prompt, &sp, collect, &rq[3], &rq[3].res),
	    SH_EBUSY);
	eng_step(e, done, &nd);
	/* cancel: the slot is free at once, the result says canceled */
	eng_seq_cancel(e, c);
	CHECK_EQ_INT(eng_active(e), 1);
	CHECK_EQ_INT(rq[2].res.finish, ENG_FINISH_CANCELED);
	CHECK_EQ_INT(eng_slot_state(e, c), 0);
	int d = eng_seq_start(e, rq[3].prompt, rq[3].n_prompt, &sp, collect, &rq[3], &rq[3].res);
	CHECK_EQ_INT(d, c);
	while (eng_active(e))
		eng_step(e, done, &nd);
	CHECK_EQ_INT(rq[3].res.finish, ENG_FINISH_LENGTH);
	CHECK_EQ_INT(rq[4].res.completion_tokens, 4);
	/* a bad prompt is an error value */
	int bad = 1 << 20;
	CHECK_EQ_INT(eng_seq_start(e, &bad, 1, &sp, NULL, NULL, &rq[0].res), SH_EINVAL);
	CHECK_EQ_INT(rq[0].res.finish, ENG_FINISH_ERROR);
	eng_free(e);
}

/* A long prompt admitted while another request decodes is spread over steps of at most
 * ENG_PREFILL_CHUNK prompt tokens: the decoding request gets one token in every one of those
 * steps (bounded added inter-token latency). */
TEST(prefill_chunks_interleave)
{
	char err[256];
	eng_t *e = open_eng(F32, 2, NULL, err);
	CHECK(e != NULL);
	if (!e)
		return;
	req_t rq[N_REQ];
	make_prompts(rq, eng_info(e)->n_vocab);
	eng_sampling_t sp;
	sampling(&sp);
	eng_done_t done[2];
	int nd;
	req_t *a = &rq[2], *b = &rq[5]; /* 5 and 80 prompt tokens */
	CHECK(eng_seq_start(e, a->prompt, a->n_prompt, &sp, collect, a, &a->res) >= 0);
	eng_step(e, done, &nd); /* a's prompt and first token */
	CHECK_EQ_INT(a->n, 1);
	CHECK(eng_seq_start(e, b->prompt, b->n_prompt, &sp, collect, b, &b->res) >= 0);
	int steps = (b->n_prompt + ENG_PREFILL_CHUNK - 1) / ENG_PREFILL_CHUNK;
	for (int k = 1; k <= steps; k++) {
		eng_step(e, done, &nd);
		CHECK_EQ_INT(a->n, 1 + k);              /* a never waits a step */
		CHECK_EQ_INT(b->n, k == steps ? 1 : 0); /* b's first token after its last chunk */
	}
	eng_free(e);
}

/* ---- several ranks ------------------------------------------------------------------------ */

typedef struct rank {
	loop_eng_t e; /* first: the harness's record (loop_group.h) */
	int alone;    /* rank 0 runs the requests one after another (eng_generate), not batched */
	req_t rq[N_REQ];
} rank_t;

static int lead(loop_eng_t *r, eng_t *e)
{
	rank_t *c = (rank_t *)r;
	make_prompts(c->rq, eng_info(e)->n_vocab);
	return c->alone ? run_each(e, c->rq) : run_batched(e, c->rq);
}

static void run_ranks(rank_t *ctx, int world, int pipeline, const char *path, int vanish, int alone)
{
	memset(ctx, 0, sizeof *ctx * (size_t)world);
	for (int r = 0; r < world; r++)
		ctx[r] = (rank_t){.e = {.keys = &KEYS,
					.tag = 16,
					.path = path,
					.pipeline = pipeline,
					.threads = 2,
					.ctx = CTX,
					.step_timeout_ms = 3000,
					.slots = SLOTS,
					.want_slots = SLOTS,
					.vanish = vanish,
					.lead = lead},
				  .alone = alone};
	loop_run(ctx, sizeof *ctx, world, loop_eng_main);
}

static void check_ranks(const char *path, int world, int pipeline, const char *what)
{
	static rank_t ctx[MAXR];
	req_t want[N_REQ];
	char err[256];
	eng_t *e = open_eng(path, 1, NULL, err);
	if (!e) {
		CHECK(0);
		return;
	}
	make_prompts(want, eng_info(e)->n_vocab);
	eng_free(e);
	CHECK_EQ_INT(run_alone(path, want), 0);
	run_ranks(ctx, world, pipeline, path, 0, 0);
	for (int r = 0; r < world; r++) {
		if (ctx[r].e.rc)
			printf("  %s: rank %d: %s\n", what, r, ctx[r].e.err);
		CHECK_EQ_INT(ctx[r].e.rc, 0);
	}
	compare(want, ctx[0].rq, what);
}

TEST(same_as_alone_ranks)
{
	check_ranks(Q8, 2, 0, "q8_0 2 tensor ranks");
	check_ranks(F32, 3, 1, "f32 3 pipeline ranks");
	const char *s = harness_stories();
	if (s)
		check_ranks(s, 3, 0, "stories260K 3 tensor ranks");
}

/* A hybrid (qwen35: DeltaNet layers with a recurrent state per slot): batching, slots reused
 * with old prefixes (resumed only where a state is held: checkpoints, BATCH keep flags), on one
 * node, 2 tensor ranks and 3 pipeline stages. */
TEST(qwen35_same_as_alone)
{
	check_one_node(Q35, "qwen35 one node");
	check_ranks(Q35, 2, 0, "qwen35 2 tensor ranks");
	check_ranks(Q35, 3, 1, "qwen35 3 pipeline ranks");
}

/* The rollback depth (speculative decoding) is rank 0's on every rank: a worker asking for none
 * keeps the same ring of states per slot (SETUP carries it), and the group still generates. */
static int rb_lead(loop_eng_t *r, eng_t *e)
{
	static req_t rq[N_REQ];
	eng_sampling_t sp;
	(void)r;
	sampling(&sp);
	sp.max_tokens = 8;
	make_prompts(rq, eng_info(e)->n_vocab);
	return eng_generate(e, rq[0].prompt, rq[0].n_prompt, &sp, collect, &rq[0], &rq[0].res);
}

TEST(qwen35_rollback_agreed)
{
	static loop_eng_t ctx[2];
	char err[256];
	for (int r = 0; r < 2; r++)
		ctx[r] = (loop_eng_t){.keys = &KEYS,
				      .tag = 17,
				      .path = Q35,
				      .threads = 1,
				      .ctx = 64,
				      .step_timeout_ms = 3000,
				      .slots = 2,
				      .rollback = 2,
				      .lead = rb_lead};
	loop_run(ctx, sizeof *ctx, 2, loop_eng_main);
	for (int r = 0; r < 2; r++) {
		if (ctx[r].rc)
			printf("  rank %d: %s\n", r, ctx[r].err);
		CHECK_EQ_INT(ctx[r].rc, 0);
	}
	CHECK(ctx[0].rs_bytes > 0 && ctx[1].rs_bytes == ctx[0].rs_bytes);
	/* one node without rollback: 3 of the 5 states per slot of a depth of 2 (for all heads) */
	eng_t *e = open_eng(Q35, 2, NULL, err);
	CHECK(e && eng_info(e)->rs_bytes * 5 == ctx[0].rs_bytes * 2 * 3);
	eng_free(e);
}

TEST(lost_rank_fails_every_sequence)
{
	static rank_t ctx[2];
	run_ranks(ctx, 2, 0, Q8, 1, 0);
	CHECK(ctx[0].e.rc != 0); /* the step failed: every running sequence ended with an error */
	int errors = 0;
	for (int i = 0; i < N_REQ; i++)
		errors += ctx[0].rq[i].res.finish == ENG_FINISH_ERROR;
	CHECK(errors >= 1);
}

/* `test_batch --model PATH` (tests/t_big_models.sh, the 0.85B Q8_0 model of make bench): the
 * same-as-alone checks on one node and on 2 tensor ranks for that file only. On the ranks each
 * request alone runs on the same 2-rank group: their partial sums add in another order than one
 * node's, and over 64 steps of a random 0.85B model with an F16 cache that flips near-ties, which
 * is tensor parallelism's rounding (test_tp), not batching's. */
static int big_model(const char *path)
{
	static rank_t alone[2], batched[2];
	check_one_node(path, "one node");
	run_ranks(alone, 2, 0, path, 0, 1);
	run_ranks(batched, 2, 0, path, 0, 0);
	for (int r = 0; r < 2; r++) {
		if (alone[r].e.rc || batched[r].e.rc)
			printf("  rank %d: %s %s\n", r, alone[r].e.err, batched[r].e.err);
		CHECK_EQ_INT(alone[r].e.rc, 0);
		CHECK_EQ_INT(batched[r].e.rc, 0);
	}
	compare(alone[0].rq, batched[0].rq, "2 tensor ranks");
	return harness_done();
}

int main(int argc, char **argv)
{
	char err[256];
	quant_init(0);
	if (tp_keys_derive(&KEYS, "test-batch", 10, err, sizeof err)) {
		fprintf(stderr, "keys: %s\n", err);
		return 1;
	}
	if (argc == 3 && !strcmp(argv[1], "--model"))
		return big_model(argv[2]);
	mkmodel_opts_t o = {.arch = "llama",
			    .dim = 128,
			    .layers = 3,
			    .heads = 4,
			    .kv_heads = 2,
			    .ffn = 256,
			    .vocab = 512,
			    .ctx = 256,
			    .type = QT_F32,
			    .seed = 16};
	if (gen_write(F32, &o, "batch-f32") || (o.type = QT_Q8_0, gen_write(Q8, &o, "batch-q8")))
		return 1;
	mkmodel_opts_t q = gen_hybrid_opts(256, 17);
	if (gen_write(Q35, &q, "batch-q35"))
		return 1;
	RUN(same_as_alone_one_node);
	RUN(slots_prefix_busy_cancel);
	RUN(prefill_chunks_interleave);
	RUN(same_as_alone_ranks);
	RUN(qwen35_same_as_alone);
	RUN(qwen35_rollback_agreed);
	RUN(lost_rank_fails_every_sequence);
	unlink(F32);
	unlink(Q8);
	unlink(Q35);
	return harness_done();
}
