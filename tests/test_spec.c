/* test_spec.c: speculative decoding (infer/spec.h, docs/speculative.md).
 *
 * Greedy output is the same token for token with drafts as without: stories260K drafted by
 * prompt lookup and by its F16 copy (gguf_convert), alone, with several sequences batched and
 * admitted at staggered steps, on 2 tensor and 3 pipeline ranks (the draft on rank 0 only), with
 * stop strings, max_tokens, log-probabilities, a JSON grammar, and on a hybrid model whose
 * recurrent layers go back to the accepted position (qwen35). With a temperature, prompt lookup
 * (a deterministic draft) keeps a seed's text; a draft model with its own distribution keeps the
 * output distribution: a chi-square test of the first three tokens of 3000 seeded generations
 * against the exact distribution computed from the target's log-probabilities (threshold at
 * p = 1e-6, so a correct rule passes with overwhelming probability; the same test rejects
 * samples of the draft model itself). A draft with another vocabulary is a clear error. */
#include <math.h>
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

#define GEN  160 /* tokens per greedy request */
#define MAXG 512

static char S16[256], RA[256], RAQ[256], RB[256], Q35[256], Q35B[256];
static const char *STORIES;
static tp_keys_t KEYS;

typedef struct out {
	int ids[MAXG], n;
	float lp[MAXG];
	char text[8192];
	size_t len;
	eng_result_t res;
} out_t;

static int collect(void *ud, const eng_token_t *t)
{
	out_t *o = ud;
	if (o->n < MAXG) {
		o->lp[o->n] = t->logprob;
		o->ids[o->n++] = t->id;
	}
	if (o->len + t->text_len < sizeof o->text) {
		memcpy(o->text + o->len, t->text, t->text_len);
		o->len += t->text_len;
		o->text[o->len] = 0;
	}
	return 0;
}

static eng_t *open_spec(const char *path, const char *spec, const char *draft, int parallel,
			const eng_dist_t *d, char *err)
{
	eng_opts_t o = {.model_path = path,
			.threads = 1,
			.ctx = 512,
			.parallel = parallel,
			.dist = d,
			.spec = spec,
			.draft_model = draft};
	eng_t *e = NULL;
	if (eng_open(&e, &o, err, 256))
		return NULL;
	return e;
}

static int tokens(eng_t *e, const char *text, int **ids, int *n)
{
	char err[256];
	return eng_tokenize(e, text, 1, 0, ids, n, err, sizeof err);
}

/* One greedy (or seeded) request of text on an engine opened with spec/draft. */
static int run_one(const char *path, const char *spec, const char *draft, const char *text,
		   const eng_sampling_t *sp, out_t *o, eng_spec_stats_t *st)
{
	char err[256];
	eng_t *e = open_spec(path, spec, draft, 1, NULL, err);
	if (!e) {
		printf("  open %s (%s): %s\n", path, spec, err);
		return -1;
	}
	int *ids = NULL, n = 0, rc = tokens(e, text, &ids, &n);
	memset(o, 0, sizeof *o);
	if (!rc)
		rc = eng_generate(e, ids, n, sp, collect, o, &o->res);
	if (st)
		eng_spec_stats(e, st);
	free(ids);
	eng_free(e);
	return rc;
}

static int same_out(const out_t *a, const out_t *b, const char *what)
{
	int same = a->n == b->n && !memcmp(a->ids, b->ids, (size_t)a->n * sizeof(int)) &&
		   a->res.completion_tokens == b->res.completion_tokens &&
		   a->res.finish == b->res.finish && a->len == b->len &&
		   !memcmp(a->text, b->text, a->len);
	if (!same) {
		int i = 0;
		while (i < a->n && i < b->n && a->ids[i] == b->ids[i])
			i++;
		printf("  %s: differs at token %d (%d vs %d tokens, finish %d vs %d)\n", what, i,
		       b->n, a->n, b->res.finish, a->res.finish);
	}
	return same;
}

static const char *REPEAT = "Tom had a big red ball. Tom had a big red ball. Tom had a big red "
			    "ball. Tom had a big red ball. Tom";

TEST(greedy_same_one_node)
{
	if (!STORIES)
		SKIP("no stories260K");
	const char *prompts[] = {"Once upon a time", REPEAT};
	for (int p = 0; p < 2; p++) {
		eng_sampling_t sp;
		eng_sampling_default(&sp);
		sp.max_tokens = GEN;
		static out_t off, on;
		eng_spec_stats_t st;
		CHECK_EQ_INT(run_one(STORIES, "off", NULL, prompts[p], &sp, &off, NULL), 0);
		CHECK_EQ_INT(off.n, GEN);
		const char *modes[][2] = {
		    {"ngram", NULL}, {"model", S16}, {"auto", S16}, {"auto", NULL}};
		for (int m = 0; m < 4; m++) {
			char what[64];
			snprintf(what, sizeof what, "prompt %d, %s%s", p, modes[m][0],
				 modes[m][1] ? " + f16 draft" : "");
			CHECK_EQ_INT(
			    run_one(STORIES, modes[m][0], modes[m][1], prompts[p], &sp, &on, &st),
			    0);
			CHECK(same_out(&off, &on, what));
			if (!strcmp(modes[m][0], "model")) { /* forced: every step drafts */
				CHECK(st.verifies > 0);
				CHECK(st.accepted > st.drafted * 9 / 10); /* f16 copy: ~all */
				CHECK(st.emitted == st.accepted + st.verifies ||
				      st.emitted + 1 == st.accepted + st.verifies);
			}
			if (!strcmp(modes[m][0], "ngram") && p == 1)
				CHECK(st.accepted > 0); /* the repeated sentence is found */
		}
	}
}

/* Stop strings, max_tokens, log-probabilities (of the target: equal within float noise of the
 * batched rows) and usage with drafts. */
TEST(stop_logprobs_usage)
{
	if (!STORIES)
		SKIP("no stories260K");
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.max_tokens = 90;
	const char *stop[] = {"park"};
	sp.stop = stop;
	sp.n_stop = 1;
	sp.top_logprobs = 3;
	static out_t off, on;
	CHECK_EQ_INT(run_one(STORIES, "off", NULL, "Once upon a time", &sp, &off, NULL), 0);
	CHECK_EQ_INT(off.res.finish, ENG_FINISH_STOP); /* "...play outside in the park" */
	CHECK(!strstr(off.text, "park"));
	for (int m = 0; m < 2; m++) {
		CHECK_EQ_INT(run_one(STORIES, m ? "model" : "ngram", m ? S16 : NULL,
				     "Once upon a time", &sp, &on, NULL),
			     0);
		CHECK(same_out(&off, &on, m ? "stop, model" : "stop, ngram"));
		for (int i = 0; i < off.n && i < on.n; i++)
			CHECK_NEAR(on.lp[i], off.lp[i], 2e-3);
	}
	sp.n_stop = 0;
	sp.max_tokens = 7; /* ends inside a draft */
	CHECK_EQ_INT(run_one(STORIES, "off", NULL, REPEAT, &sp, &off, NULL), 0);
	CHECK_EQ_INT(run_one(STORIES, "model", S16, REPEAT, &sp, &on, NULL), 0);
	CHECK(same_out(&off, &on, "max_tokens 7"));
	CHECK_EQ_INT(on.res.completion_tokens, 7);
	CHECK_EQ_INT(on.res.finish, ENG_FINISH_LENGTH);
}

/* Structured output: the grammar masks every verified row, and drafts it rejects are cut. */
TEST(grammar_same)
{
	if (!STORIES)
		SKIP("no stories260K");
	eng_grammar_t *g = NULL;
	char err[256];
	const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
			     "\"age\":{\"type\":\"integer\"}},\"required\":[\"name\",\"age\"]}";
	CHECK_EQ_INT(eng_grammar_new(&g, schema, strlen(schema), err, sizeof err), 0);
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.max_tokens = 60;
	sp.grammar = g;
	static out_t off, on;
	CHECK_EQ_INT(run_one(STORIES, "off", NULL,
			     "Lily said: {\"name\": \"Lily\", \"age\": 3}. Tom", &sp, &off, NULL),
		     0);
	CHECK(off.len > 0 && off.text[0] == '{');
	for (int m = 0; m < 2; m++) {
		CHECK_EQ_INT(run_one(STORIES, m ? "model" : "ngram", m ? S16 : NULL,
				     "Lily said: {\"name\": \"Lily\", \"age\": 3}. Tom", &sp, &on,
				     NULL),
			     0);
		CHECK(same_out(&off, &on, m ? "grammar, model" : "grammar, ngram"));
	}
	eng_grammar_free(g);
}

/* Several sequences batched, admitted at staggered steps, each drafting: each equals its text
 * alone without drafts. */
TEST(batched_same)
{
	if (!STORIES)
		SKIP("no stories260K");
	const char *texts[] = {"Once upon a time", REPEAT, "The cat sat on the mat. The cat",
			       "One day, a little bird", "Sam and Sue went to the park"};
	enum { N = 5 };
	static out_t want[N], got[N];
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.max_tokens = 100;
	for (int i = 0; i < N; i++)
		CHECK_EQ_INT(run_one(STORIES, "off", NULL, texts[i], &sp, &want[i], NULL), 0);
	for (int m = 0; m < 2; m++) {
		char err[256];
		eng_t *e = open_spec(STORIES, m ? "model" : "ngram", m ? S16 : NULL, 3, NULL, err);
		CHECK(e != NULL);
		if (!e)
			return;
		int next = 0, ended = 0, step = 0, *ids[N], n_ids[N];
		for (int i = 0; i < N; i++) {
			CHECK_EQ_INT(tokens(e, texts[i], &ids[i], &n_ids[i]), 0);
			memset(&got[i], 0, sizeof got[i]);
		}
		eng_done_t done[ENG_MAX_PARALLEL];
		while (ended < N && step < 10000) {
			if (next < N && (step % 4 == 0) && eng_active(e) < eng_info(e)->n_slots) {
				int id = eng_seq_start(e, ids[next], n_ids[next], &sp, collect,
						       &got[next], &got[next].res);
				CHECK(id >= 0);
				next++;
			}
			int nd = 0;
			CHECK_EQ_INT(eng_step(e, done, &nd), 0);
			ended += nd;
			step++;
		}
		for (int i = 0; i < N; i++) {
			char what[64];
			snprintf(what, sizeof what, "batched %s, request %d", m ? "model" : "ngram",
				 i);
			CHECK(same_out(&want[i], &got[i], what));
			free(ids[i]);
		}
		eng_spec_stats_t st;
		eng_spec_stats(e, &st);
		CHECK(st.verifies > 0);
		eng_free(e);
	}
}

/* ---- several ranks: the draft on rank 0, every rank verifies the batch ------------------- */

typedef struct rank {
	loop_rank_t l; /* first: loop_run fills it */
	int pipeline;
	out_t out;
	int rc;
	char err[320];
} rank_t;

static void *rank_main(void *arg)
{
	rank_t *c = arg;
	tp_group_t *g = NULL;
	eng_t *e = NULL;
	if ((c->rc = loop_join(&g, &c->l, 21, &KEYS, NULL, 20000, c->err, sizeof c->err)))
		goto out;
	eng_dist_t d = {.group = g, .pipeline = c->pipeline, .step_timeout_ms = 5000};
	if (!(e = open_spec(STORIES, "model", S16, 2, &d, c->err))) {
		c->rc = -1;
		goto out;
	}
	if (c->l.rank == 0) {
		eng_sampling_t sp;
		eng_sampling_default(&sp);
		sp.max_tokens = GEN;
		int *ids = NULL, n = 0;
		if (!(c->rc = tokens(e, "Once upon a time", &ids, &n)))
			c->rc = eng_generate(e, ids, n, &sp, collect, &c->out, &c->out.res);
		free(ids);
		if (strcmp(eng_info(e)->spec, "model"))
			c->rc = -2;
	} else {
		c->rc = eng_worker_run(e, c->err, sizeof c->err);
		if (eng_info(e)->draft) /* the draft is rank 0's alone */
			c->rc = -3;
	}
out:
	eng_free(e);
	tp_group_free(g);
	return NULL;
}

TEST(greedy_same_ranks)
{
	if (!STORIES)
		SKIP("no stories260K");
	static out_t off;
	static rank_t ctx[3];
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.max_tokens = GEN;
	CHECK_EQ_INT(run_one(STORIES, "off", NULL, "Once upon a time", &sp, &off, NULL), 0);
	for (int pipeline = 0; pipeline < 2; pipeline++) {
		int world = pipeline ? 3 : 2;
		memset(ctx, 0, sizeof ctx);
		for (int r = 0; r < world; r++)
			ctx[r].pipeline = pipeline;
		loop_run(ctx, sizeof ctx[0], world, rank_main);
		for (int r = 0; r < world; r++) {
			if (ctx[r].rc)
				printf("  rank %d: %d %s\n", r, ctx[r].rc, ctx[r].err);
			CHECK_EQ_INT(ctx[r].rc, 0);
		}
		CHECK(
		    same_out(&off, &ctx[0].out, pipeline ? "3 pipeline ranks" : "2 tensor ranks"));
	}
}

/* A hybrid model: the recurrent layers continue from the state after the last accepted token
 * (the ring of rollback states, model.h); rejections happen, the output does not change. The
 * drafts: prompt lookup, and another qwen35 (same tokenizer, other weights: its own recurrent
 * layers go back too). */
TEST(hybrid_rollback)
{
	char err[256];
	eng_t *e = open_spec(Q35, "off", NULL, 1, NULL, err);
	CHECK(e != NULL);
	if (!e)
		return;
	int prompt[64];
	for (int i = 0; i < 64; i++) /* a repeated phrase: prompt lookup finds drafts */
		prompt[i] = 40 + (i % 7) * 3 + (i % 3);
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.max_tokens = 80;
	static out_t off, on;
	memset(&off, 0, sizeof off);
	CHECK_EQ_INT(eng_generate(e, prompt, 64, &sp, collect, &off, &off.res), 0);
	CHECK(off.n > 20); /* long enough to draft a few times */
	eng_free(e);
	const char *modes[][2] = {{"ngram", NULL}, {"model", Q35B}};
	for (int m = 0; m < 2; m++) {
		e = open_spec(Q35, modes[m][0], modes[m][1], 1, NULL, err);
		if (!e)
			printf("  %s: %s\n", modes[m][0], err);
		CHECK(e != NULL);
		if (!e)
			continue;
		memset(&on, 0, sizeof on);
		CHECK_EQ_INT(eng_generate(e, prompt, 64, &sp, collect, &on, &on.res), 0);
		CHECK(same_out(&off, &on, modes[m][0]));
		eng_spec_stats_t st;
		eng_spec_stats(e, &st);
		printf("  qwen35 %s: %llu of %llu drafted accepted in %llu verifies\n", modes[m][0],
		       (unsigned long long)st.accepted, (unsigned long long)st.drafted,
		       (unsigned long long)st.verifies);
		if (m) {
			CHECK(st.verifies > 0);
			CHECK(st.accepted < st.drafted); /* some went back */
		}
		eng_free(e);
	}
}

/* ---- temperature -------------------------------------------------------------------------- */

/* Prompt lookup is a deterministic draft: a seed gives the text it gives without drafts. */
TEST(seeded_ngram_same_text)
{
	if (!STORIES)
		SKIP("no stories260K");
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.max_tokens = 100;
	sp.temperature = 0.9f;
	sp.top_p = 0.95f;
	sp.repeat_penalty = 1.1f;
	static out_t off, on;
	for (uint64_t seed = 1; seed <= 6; seed++) {
		sp.seed = seed;
		eng_spec_stats_t st;
		CHECK_EQ_INT(run_one(STORIES, "off", NULL, REPEAT, &sp, &off, NULL), 0);
		CHECK_EQ_INT(run_one(STORIES, "ngram", NULL, REPEAT, &sp, &on, &st), 0);
		CHECK(same_out(&off, &on, "seeded ngram"));
		CHECK(st.verifies > 0);
	}
}

/* The upper tail of chi-square with df degrees of freedom at p = 1e-6 (Wilson-Hilferty:
 * within a few percent for df >= 3; z = 4.753 is the standard normal's 1e-6 upper quantile). */
static double chi2_crit(int df)
{
	double a = 2.0 / (9.0 * df), z = 4.753;
	return df * pow(1 - a + z * sqrt(a), 3);
}

enum { K = 3, CELLS = K * K * K, NSAMP = 3000 };

typedef struct alt {
	int id[K];
	float lp[K];
	int n;
} alt_t;

static int alt_cb(void *ud, const eng_token_t *t)
{
	alt_t *a = ud;
	for (int i = 0; i < t->n_top && i < K; i++) {
		a->id[i] = t->top[i].token;
		a->lp[i] = t->top[i].logprob;
	}
	a->n = MIN(t->n_top, K);
	return 0;
}

/* The top K tokens after p[0..n) and their probabilities under temperature t and top-k K
 * (renormalised over them: the reported log-probabilities are before truncation). */
static int topk(eng_t *e, const int *p, int n, float t, int *id, double *pr)
{
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.max_tokens = 1;
	sp.top_logprobs = K;
	sp.temperature = t;
	sp.top_k = K;
	alt_t a = {{0}, {0}, 0};
	eng_result_t res;
	if (eng_generate(e, p, n, &sp, alt_cb, &a, &res) || a.n != K)
		return -1;
	double z = 0;
	for (int i = 0; i < K; i++)
		z += exp(a.lp[i]);
	for (int i = 0; i < K; i++) {
		id[i] = a.id[i];
		pr[i] = exp(a.lp[i]) / z;
	}
	return 0;
}

/* The exact distribution of the first three tokens after p (n tokens) on model path: cells
 * (i, j, l) index the top-K choices at each position; ids[27][3] their tokens. */
static int exact3(const char *path, const int *p, int n, float t, double *prob, int (*ids)[3])
{
	char err[256];
	eng_t *e = open_spec(path, "off", NULL, 1, NULL, err);
	if (!e)
		return -1;
	int ctx[64], a[K], b[K], c[K], rc = 0;
	double pa[K], pb[K], pc[K];
	memcpy(ctx, p, (size_t)n * sizeof *p);
	rc |= topk(e, ctx, n, t, a, pa);
	for (int i = 0; i < K && !rc; i++) {
		ctx[n] = a[i];
		rc |= topk(e, ctx, n + 1, t, b, pb);
		for (int j = 0; j < K && !rc; j++) {
			ctx[n + 1] = b[j];
			rc |= topk(e, ctx, n + 2, t, c, pc);
			for (int l = 0; l < K; l++) {
				int x = (i * K + j) * K + l;
				prob[x] = pa[i] * pb[j] * pc[l];
				ids[x][0] = a[i], ids[x][1] = b[j], ids[x][2] = c[l];
			}
		}
	}
	eng_free(e);
	return rc;
}

/* Chi-square of NSAMP seeded generations of 3 tokens on target (drafted per spec/draft) against
 * prob; cells with an expected count under 5 are pooled. Returns the statistic, *df its degrees
 * of freedom; -1 on an error. */
static double chi2_run(const char *target, const char *spec, const char *draft, const int *p, int n,
		       float t, const double *prob, int (*ids)[3], int *df, eng_spec_stats_t *st)
{
	char err[256];
	eng_t *e = open_spec(target, spec, draft, 1, NULL, err);
	if (!e) {
		printf("  open: %s\n", err);
		return -1;
	}
	static int count[CELLS + 1];
	memset(count, 0, sizeof count);
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.max_tokens = 3;
	sp.temperature = t;
	sp.top_k = K;
	static out_t o;
	for (int s = 0; s < NSAMP; s++) {
		sp.seed = 1000003ull * (uint64_t)s + 17;
		memset(&o, 0, sizeof o);
		if (eng_generate(e, p, n, &sp, collect, &o, &o.res) || o.n != 3) {
			eng_free(e);
			return -1;
		}
		int x = 0;
		while (x < CELLS && memcmp(ids[x], o.ids, sizeof ids[x]))
			x++;
		count[x]++; /* x == CELLS: outside the support, impossible for a correct rule */
	}
	if (st)
		eng_spec_stats(e, st);
	eng_free(e);
	double chi = 0, pool_e = 0, pool_o = count[CELLS];
	int cells = 0;
	for (int x = 0; x < CELLS; x++) {
		double ex = prob[x] * NSAMP;
		if (ex < 5) {
			pool_e += ex, pool_o += count[x];
			continue;
		}
		chi += (count[x] - ex) * (count[x] - ex) / ex;
		cells++;
	}
	if (pool_e > 0) {
		chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
		cells++;
	} else if (pool_o > 0) {
		chi += 1e9; /* tokens where the distribution has none */
	}
	*df = cells - 1;
	return chi;
}

/* A draft model with its own distribution (another model with the same vocabulary): the rule
 * accepts with min(1, p/q) and else draws from the residual, so the output follows the target's
 * distribution; samples of the draft model itself do not. */
TEST(distribution_kept)
{
	int p[12];
	for (int i = 0; i < 12; i++)
		p[i] = 30 + 7 * i;
	float t = 1.0f;
	static double prob[CELLS];
	static int ids[CELLS][3];
	CHECK_EQ_INT(exact3(RA, p, 12, t, prob, ids), 0);
	int df = 0;
	eng_spec_stats_t st;
	/* a draft that mostly agrees (both branches of the rule) and one that never does (every
	 * token from the residual) */
	const char *drafts[] = {RAQ, RB};
	for (int d = 0; d < 2; d++) {
		double chi = chi2_run(RA, "model", drafts[d], p, 12, t, prob, ids, &df, &st);
		printf("  %s draft: chi2 %.1f, df %d, limit %.1f; %llu of %llu drafted accepted\n",
		       d ? "another model's" : "a q4_0", chi, df, chi2_crit(df),
		       (unsigned long long)st.accepted, (unsigned long long)st.drafted);
		CHECK(chi >= 0 && chi < chi2_crit(df));
		CHECK(st.drafted > NSAMP / 2); /* the rule ran */
		if (!d)
			CHECK(st.accepted > st.drafted / 2 && st.accepted < st.drafted);
	}
	double chi = chi2_run(RA, "off", NULL, p, 12, t, prob, ids, &df, NULL);
	printf("  no draft: chi2 %.1f, df %d, limit %.1f\n", chi, df, chi2_crit(df));
	CHECK(chi >= 0 && chi < chi2_crit(df));
	/* power: the draft model's own samples are told apart */
	chi = chi2_run(RB, "off", NULL, p, 12, t, prob, ids, &df, NULL);
	printf("  the draft's own samples: chi2 %.1f, df %d, limit %.1f\n", chi, df, chi2_crit(df));
	CHECK(chi > chi2_crit(df));
}

/* A draft model with another vocabulary is a one-line error naming the difference. */
TEST(vocab_mismatch)
{
	if (!STORIES)
		SKIP("no stories260K");
	char err[256] = "";
	eng_t *e = open_spec(STORIES, "model", RA, 1, NULL, err);
	CHECK(e == NULL);
	CHECK(strstr(err, "vocabulary") != NULL || strstr(err, "token") != NULL);
	printf("  %s\n", err);
	eng_free(e);
	e = open_spec(STORIES, "model", NULL, 1, NULL, err);
	CHECK(e == NULL);
	CHECK(strstr(err, "--draft-model") != NULL);
	e = open_spec(STORIES, "fast", NULL, 1, NULL, err);
	CHECK(e == NULL);
	CHECK(strstr(err, "fast") != NULL);
	e = open_spec(STORIES, "model", "/nonexistent.gguf", 1, NULL, err);
	CHECK(e == NULL);
}

int main(void)
{
	char err[256];
	quant_init(0);
	if (tp_keys_derive(&KEYS, "test-spec", 9, err, sizeof err)) {
		fprintf(stderr, "keys: %s\n", err);
		return 1;
	}
	STORIES = harness_stories();
	/* the converted copies beside gen_write's files */
	int pid = (int)getpid();
	snprintf(S16, sizeof S16, "/tmp/shoal-test-%d-spec-s16.gguf", pid);
	snprintf(RAQ, sizeof RAQ, "/tmp/shoal-test-%d-spec-aq.gguf", pid);
	if (STORIES && gguf_convert(STORIES, S16, QT_F16, err, sizeof err)) {
		fprintf(stderr, "convert: %s\n", err);
		return 1;
	}
	/* two small llamas with the same tokenizer and other weights: a target and a draft that
	 * disagree often */
	mkmodel_opts_t o = {.arch = "llama",
			    .dim = 64,
			    .layers = 2,
			    .heads = 4,
			    .kv_heads = 2,
			    .ffn = 128,
			    .vocab = 320,
			    .ctx = 512,
			    .type = QT_F32,
			    .seed = 3};
	mkmodel_opts_t q = gen_hybrid_opts(512, 18);
	if (gen_write(RA, &o, "spec-a") || (o.seed = 4, gen_write(RB, &o, "spec-b")) ||
	    gen_write(Q35, &q, "spec-q35") || (q.seed = 19, gen_write(Q35B, &q, "spec-q35b")))
		return 1;
	/* and the target's own weights, quantized: a draft that mostly agrees */
	if (gguf_convert(RA, RAQ, QT_Q4_0, err, sizeof err)) {
		fprintf(stderr, "convert: %s\n", err);
		return 1;
	}
	RUN(greedy_same_one_node);
	RUN(stop_logprobs_usage);
	RUN(grammar_same);
	RUN(batched_same);
	RUN(greedy_same_ranks);
	RUN(hybrid_rollback);
	RUN(seeded_ngram_same_text);
	RUN(distribution_kept);
	RUN(vocab_mismatch);
	unlink(S16);
	unlink(RA);
	unlink(RB);
	unlink(RAQ);
	unlink(Q35);
	unlink(Q35B);
	return harness_done();
}
