/* test_detbatch.c: a greedy request's logits do not depend on what else is in the batch (issue
 * 28). N identical requests admitted together, and staggered so that their prompt chunks meet
 * other sequences' decode steps at other boundaries and land in other slots, each give the ids
 * and the bits of the logits (the chosen token's log-probability and the 20 best alternatives',
 * which move with any change of the hidden state) of the same request run alone on the same
 * engine: on one node, on 2 and 3 tensor-parallel ranks and on 3 pipeline ranks (loopback
 * groups), for every weight type the kernels treat differently (Q4_0, Q8_0 and the K-quants
 * repacked; F32, F16 and BF16 through their row kernels, one input or 8 at a time). Each worker
 * rank's communication time stays within its steps' time (the figures it reports). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "harness.h"
#include "infer/gguf_write.h"
#include "infer/infer.h"
#include "infer/quant/quant.h"
#include "loop_group.h"
#include "transport/transport.h"

#define GEN   40 /* tokens per request */
#define TOPN  20
#define NREQ  5 /* identical requests, more than the slots */
#define SLOTS 4
#define PLEN  45 /* prompt: more than a chunk while others decode */
#define CTX   128

static tp_keys_t KEYS;

typedef struct rec {
	int ids[GEN + 1], n;
	uint32_t bits[GEN + 1][1 + TOPN]; /* logprob, then the alternatives' */
	eng_result_t res;
} rec_t;

static const char *SPEC; /* speculative decoding of the engines check_type opens (NULL: auto) */
static const rec_t *REF; /* when set, what every run must equal too (the request without drafts) */
static rec_t *RECORD;    /* when set, check_cases only runs the request alone into it */

static int collect(void *ud, const eng_token_t *t)
{
	rec_t *r = ud;
	if (r->n > GEN)
		return 0;
	r->ids[r->n] = t->id;
	memcpy(&r->bits[r->n][0], &t->logprob, 4);
	for (int i = 0; i < t->n_top && i < TOPN; i++)
		memcpy(&r->bits[r->n][1 + i], &t->top[i].logprob, 4);
	r->n++;
	return 0;
}

static void prompt_of(int *p, int vocab)
{
	uint32_t x = 777;
	for (int k = 0; k < PLEN; k++) {
		x = x * 1103515245u + 12345u;
		p[k] = 3 + (int)((x >> 8) % (uint32_t)(vocab - 3));
	}
}

static void sampling(eng_sampling_t *sp)
{
	eng_sampling_default(sp);
	sp->max_tokens = GEN;
	sp->top_logprobs = TOPN;
	sp->ignore_eos = 1; /* every request runs GEN tokens whatever the random model says */
}

/* The request alone, then NREQ copies: all at step 0 (staggered = 0) or one every 3rd step. */
static int run_case(eng_t *e, int staggered, rec_t *alone, rec_t *got)
{
	int prompt[PLEN];
	eng_sampling_t sp;
	sampling(&sp);
	prompt_of(prompt, eng_info(e)->n_vocab);
	memset(alone, 0, sizeof *alone);
	int rc = eng_generate(e, prompt, PLEN, &sp, collect, alone, &alone->res);
	if (rc)
		return rc;
	memset(got, 0, sizeof *got * NREQ);
	eng_done_t done[ENG_MAX_PARALLEL];
	int next = 0, ended = 0, step = 0;
	while (ended < NREQ) {
		while (next < NREQ && (!staggered || step % 3 == 0) &&
		       eng_active(e) < eng_info(e)->n_slots) {
			int id = eng_seq_start(e, prompt, PLEN, &sp, collect, &got[next],
					       &got[next].res);
			if (id < 0)
				return id;
			next++;
			if (staggered)
				break;
		}
		int nd = 0;
		rc = eng_step(e, done, &nd);
		for (int i = 0; i < nd; i++)
			if (done[i].rc)
				return done[i].rc;
		ended += nd;
		if (rc)
			return rc;
		if (++step > 100000)
			return SH_ETIMEDOUT;
	}
	return 0;
}

static int same(const rec_t *a, const rec_t *b, int *at)
{
	for (int i = 0; i < a->n && i < b->n; i++)
		if (a->ids[i] != b->ids[i] || memcmp(a->bits[i], b->bits[i], sizeof a->bits[i])) {
			*at = i;
			return 0;
		}
	*at = MIN(a->n, b->n);
	return a->n == b->n;
}

static void check_cases(eng_t *e, const char *what)
{
	static rec_t alone, got[NREQ];
	if (RECORD) { /* the request alone, as the reference of the next run */
		int prompt[PLEN];
		eng_sampling_t sp;
		sampling(&sp);
		prompt_of(prompt, eng_info(e)->n_vocab);
		memset(RECORD, 0, sizeof *RECORD);
		CHECK_EQ_INT(eng_generate(e, prompt, PLEN, &sp, collect, RECORD, &RECORD->res), 0);
		return;
	}
	for (int staggered = 0; staggered < 2; staggered++) {
		int rc = run_case(e, staggered, &alone, got);
		if (rc)
			printf("  %s: %s\n", what, sh_strerror(rc));
		CHECK_EQ_INT(rc, 0);
		CHECK_EQ_INT(alone.n, GEN);
		int at;
		if (REF && !same(REF, &alone, &at)) {
			printf("  %s: alone differs from the run without drafts at token %d\n",
			       what, at);
			CHECK(0);
		}
		for (int i = 0; i < NREQ; i++) {
			int at;
			int ok = same(&alone, &got[i], &at);
			if (!ok)
				printf("  %s%s: request %d differs from alone at token %d\n", what,
				       staggered ? " staggered" : "", i, at);
			CHECK(ok);
		}
	}
	if (REF) { /* drafts were verified: tokens came out of verify batches (how many drafted
		    * tokens the random model accepts varies with its text) */
		eng_spec_stats_t st;
		eng_spec_stats(e, &st);
		printf("  %s: %llu verifies, %llu of %llu drafted accepted\n", what,
		       (unsigned long long)st.verifies, (unsigned long long)st.accepted,
		       (unsigned long long)st.drafted);
		CHECK(st.verifies > 0);
	}
}

static eng_t *open_eng(const char *path, int threads, const eng_dist_t *d, char *err)
{
	eng_opts_t o = {.model_path = path,
			.threads = threads,
			.ctx = CTX,
			.parallel = SLOTS,
			.dist = d,
			.spec = SPEC};
	eng_t *e = NULL;
	return eng_open(&e, &o, err, 256) ? NULL : e;
}

/* ---- ranks -------------------------------------------------------------------------------- */

typedef struct rank {
	loop_rank_t l; /* first: loop_run fills it */
	int pipeline;
	const char *path, *what;
	int rc;
	char err[320];
} rank_t;

static void *rank_main(void *arg)
{
	rank_t *c = arg;
	tp_group_t *g = NULL;
	eng_t *e = NULL;
	if ((c->rc = loop_join(&g, &c->l, 28, &KEYS, NULL, 20000, c->err, sizeof c->err)))
		goto out;
	eng_dist_t d = {.group = g, .pipeline = c->pipeline, .step_timeout_ms = 20000};
	if (!(e = open_eng(c->path, 1, &d, c->err))) {
		c->rc = -1;
		goto out;
	}
	if (c->l.rank == 0) {
		check_cases(e, c->what);
	} else if (!(c->rc = eng_worker_run(e, c->err, sizeof c->err))) {
		/* a worker's totals (the leader's dashboard refuses, node_steps_parse, figures
		 * whose communication exceeds the steps' time): the batches' entries, sent after
		 * the step's header, count in both */
		eng_comm_t s;
		eng_worker_comm_stats(e, &s);
		if (!(s.steps > 0 && s.comm_ms <= s.step_ms)) {
			c->rc = -1;
			snprintf(c->err, sizeof c->err,
				 "worker figures: %llu steps, %.3f ms communication of %.3f ms",
				 (unsigned long long)s.steps, s.comm_ms, s.step_ms);
		}
	}
out:
	eng_free(e);
	tp_group_free(g);
	return NULL;
}

static void check_ranks(const char *path, int world, int pipeline, const char *what)
{
	static rank_t ctx[4];
	memset(ctx, 0, sizeof ctx);
	for (int r = 0; r < world; r++)
		ctx[r].pipeline = pipeline, ctx[r].path = path, ctx[r].what = what;
	loop_run(ctx, sizeof *ctx, world, rank_main);
	for (int r = 0; r < world; r++) {
		if (ctx[r].rc)
			printf("  %s: rank %d: %s\n", what, r, ctx[r].err);
		CHECK_EQ_INT(ctx[r].rc, 0);
	}
}

static char PATHS[9][256];
static const struct {
	int type;
	const char *name, *arch;
} TYPES[] = {{QT_Q4_0, "q4_0", "llama"},
	     {QT_Q8_0, "q8_0", "llama"},
	     {QT_F32, "f32", "llama"},
	     {QT_F16, "f16", "llama"},
	     {QT_Q4_K, "q4_k", "llama"},
	     {QT_Q6_K, "q6_k", "llama"},
	     {QT_BF16, "bf16", "llama"},
	     {QT_Q8_0, "q8_0 deepseek2", "deepseek2"},
	     {QT_F16, "f16 one KV head", "llama"}};

/* Type i on configuration c: one node, 2 and 3 tensor ranks, 3 pipeline ranks. */
static void check_config(int i, int c)
{
	static const char *names[] = {"one node", "2 tensor ranks", "3 tensor ranks",
				      "3 pipeline ranks"};
	char what[64], err[256];
	snprintf(what, sizeof what, "%s %s", TYPES[i].name, names[c]);
	if (c == 0) {
		eng_t *e = open_eng(PATHS[i], 2, NULL, err);
		CHECK(e != NULL);
		if (e)
			check_cases(e, what);
		eng_free(e);
	} else {
		check_ranks(PATHS[i], c == 1 ? 2 : 3, c == 3, what);
	}
}

static void check_type(int i)
{
	for (int c = 0; c < 4; c++)
		check_config(i, c);
}

/* One node only: 2 and 3 tensor ranks cut KV heads. */
TEST(f16_one_kv_head)
{
	check_config(8, 0);
}

TEST(q4_0)
{
	check_type(0);
}
TEST(q8_0)
{
	check_type(1);
}
TEST(f32)
{
	check_type(2);
}
TEST(f16)
{
	check_type(3);
}
TEST(q4_k)
{
	check_type(4);
}
TEST(q6_k)
{
	check_type(5);
}
TEST(bf16)
{
	check_type(6);
}
/* latent attention (mla.c: per-head products inside the attention items) and experts (moe.c:
 * one token, few tokens and batches grouped per expert, a shared expert), Q8_0 */
TEST(q8_0_deepseek2)
{
	check_type(7);
}
/* prompt lookup on every step: a token is computed in a verify batch of up to 9 rows, or alone
 * where nothing was drafted, and the requests still equal the one alone (which drafts too) */
TEST(spec_ngram)
{
	static rec_t off;
	const int types[] = {1, 7};
	for (size_t k = 0; k < ARRAY_LEN(types); k++)
		for (int c = 0; c < 4; c++) {
			SPEC = "off", RECORD = &off;
			check_config(types[k], c);
			SPEC = "ngram", RECORD = NULL, REF = &off;
			check_config(types[k], c);
			SPEC = NULL, REF = NULL;
		}
}

int main(void)
{
	char err[256];
	quant_init(0);
	if (tp_keys_derive(&KEYS, "test-detbatch", 13, err, sizeof err))
		return 1;
	for (size_t i = 0; i < ARRAY_LEN(TYPES); i++) {
		snprintf(PATHS[i], sizeof PATHS[i], "/tmp/shoal-test-detbatch-%d-%s.gguf",
			 (int)getpid(), TYPES[i].name);
		/* 3 ranks cut 4 KV heads 2+1+1 and 768 FFN units; the K-quants' 256-element blocks
		 * need heads of 128 */
		int kq = TYPES[i].type == QT_Q4_K || TYPES[i].type == QT_Q6_K;
		mkmodel_opts_t o = {.arch = TYPES[i].arch,
				    .dim = kq ? 1024 : 256,
				    .layers = 3,
				    .heads = 8,
				    .kv_heads = 4,
				    .ffn = 768,
				    .vocab = 512,
				    .ctx = 256,
				    .type = TYPES[i].type,
				    .seed = 28 + (uint64_t)i};
		/* one KV head (Gemma 3's shape): a decode step's attention is one work item of
		 * all query heads, a batch's one per run of tokens (attn.c) */
		if (strstr(TYPES[i].name, "one KV head"))
			o.kv_heads = 1;
		/* deepseek2: 12 experts (3 ranks take 4 each); seed 3 because its greedy text
		 * repeats, so prompt lookup's drafts are accepted (about 2 in 3 on one node: what
		 * spec_ngram covers, not its verdict) */
		if (!strcmp(TYPES[i].arch, "deepseek2"))
			o.experts = 12, o.experts_used = 2, o.expert_ffn = 128,
			o.shared_experts = 1, o.seed = 3;
		if (mkmodel_write(&o, PATHS[i], err, sizeof err)) {
			fprintf(stderr, "mkmodel %s: %s\n", TYPES[i].name, err);
			return 1;
		}
	}
	RUN(q4_0);
	RUN(q8_0);
	RUN(f32);
	RUN(f16);
	RUN(q4_k);
	RUN(q6_k);
	RUN(bf16);
	RUN(q8_0_deepseek2);
	RUN(spec_ngram);
	RUN(f16_one_kv_head);
	for (size_t i = 0; i < ARRAY_LEN(TYPES); i++)
		unlink(PATHS[i]);
	return harness_done();
}
