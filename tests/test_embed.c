/* test_embed.c: embeddings (infer.h's eng_embed_start, infer/embed.h's pooling). The pooling
 * arithmetic on hand-made vectors; the engine's embeddings of generated qwen3 models with mean,
 * CLS and last-token pooling against a reference taken from the model's forward pass directly
 * (every token's normed hidden state, pooled and normalised here in double), for inputs of 1 to
 * 600 tokens (more than one step's prompt budget); embeddings computed in the same steps as a
 * generating sequence and other embeddings; the same on 2 tensor and 3 pipeline ranks; the
 * pooling type read from the file and its default; EOS appended when the tokenizer says so;
 * refusals (a reranker, an input longer than the context, bad ids, no free slot). The
 * comparison with llama.cpp's llama-embedding on the same file is tests/t_embed.sh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "gen_model.h"
#include "harness.h"
#include "infer/embed.h"
#include "infer/infer.h"
#include "infer/quant/quant.h"
#include "loop_group.h"
#include "transport/transport.h"

#define CTX   1024
#define NIN   5
#define MAXIN 600
#define MAXR  3

static const int LENS[NIN] = {1, 7, 40, 600, 3};
static char PATH[3][256]; /* mean, cls, last */
static const int KIND[3] = {ENG_POOL_MEAN, ENG_POOL_CLS, ENG_POOL_LAST};
static tp_keys_t KEYS;

static mkmodel_opts_t opts(const char *pooling)
{
	mkmodel_opts_t o = {.arch = "qwen3",
			    .dim = 128,
			    .layers = 3,
			    .heads = 4,
			    .kv_heads = 2,
			    .ffn = 256,
			    .vocab = 512,
			    .ctx = CTX,
			    .head_dim = 32,
			    .type = QT_F32,
			    .seed = 11,
			    .pooling = pooling};
	return o;
}

static void make_inputs(int in[NIN][MAXIN], int vocab)
{
	uint32_t x = 777;
	for (int i = 0; i < NIN; i++)
		for (int k = 0; k < LENS[i]; k++) {
			x = x * 1103515245u + 12345u;
			in[i][k] = 3 + (int)((x >> 8) % (uint32_t)(vocab - 3));
		}
}

static double cosine(const float *a, const float *b, int n)
{
	double ab = 0, aa = 0, bb = 0;
	for (int i = 0; i < n; i++)
		ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
	return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : (aa == bb ? 1 : 0);
}

static float max_diff(const float *a, const float *b, int n)
{
	float m = 0;
	for (int i = 0; i < n; i++)
		m = fmaxf(m, fabsf(a[i] - b[i]));
	return m;
}

/* ---- the pooling arithmetic ---------------------------------------------------------------- */

TEST(pool_math)
{
	const float h[3][2] = {{1, 2}, {3, 4}, {-2, 0}};
	float acc[2];
	/* mean of the three: (2/3, 2) -> unit length */
	memset(acc, 0, sizeof acc);
	for (int p = 0; p < 3; p++) {
		CHECK(embed_pool_wants(ENG_POOL_MEAN, p, 3));
		embed_pool_add(acc, h[p], 2, ENG_POOL_MEAN, p, 3);
	}
	embed_pool_finish(acc, 2, ENG_POOL_MEAN, 3);
	double n = sqrt(4.0 / 9 + 4);
	CHECK(fabs(acc[0] - (2.0 / 3) / n) < 1e-6 && fabs(acc[1] - 2 / n) < 1e-6);
	/* CLS: the first only; LAST: the last only */
	memset(acc, 0, sizeof acc);
	for (int p = 0; p < 3; p++)
		embed_pool_add(acc, h[p], 2, ENG_POOL_CLS, p, 3);
	embed_pool_finish(acc, 2, ENG_POOL_CLS, 3);
	CHECK(fabs(acc[0] - 1 / sqrt(5.0)) < 1e-6 && fabs(acc[1] - 2 / sqrt(5.0)) < 1e-6);
	CHECK(embed_pool_wants(ENG_POOL_CLS, 0, 3) && !embed_pool_wants(ENG_POOL_CLS, 2, 3));
	memset(acc, 0, sizeof acc);
	for (int p = 0; p < 3; p++)
		embed_pool_add(acc, h[p], 2, ENG_POOL_LAST, p, 3);
	embed_pool_finish(acc, 2, ENG_POOL_LAST, 3);
	CHECK(acc[0] == -1.0f && acc[1] == 0.0f);
	CHECK(embed_pool_wants(ENG_POOL_LAST, 2, 3) && !embed_pool_wants(ENG_POOL_LAST, 1, 3));
	/* a zero vector stays zero (no division by zero), a length is returned */
	float z[3] = {0, 0, 0}, v[2] = {3, 4};
	CHECK(embed_l2_normalize(z, 3) == 0 && z[0] == 0 && z[2] == 0);
	CHECK(fabs(embed_l2_normalize(v, 2) - 5) < 1e-12 && fabs(v[0] - 0.6f) < 1e-7);
}

/* ---- the engine ----------------------------------------------------------------------------- */

/* The reference: every token of in[0..n) through the model in slot 0 from position 0, the normed
 * hidden states pooled in double here. */
static int reference(const char *path, int kind, const int *in, int n, float *out)
{
	char err[256];
	gguf_t *g = NULL;
	model_meta_t meta;
	pool_t *pool = NULL;
	model_t *m = NULL;
	int rc = -1;
	int *slot = calloc((size_t)n, sizeof *slot), *pos = malloc((size_t)n * sizeof *pos),
	    *outs = malloc((size_t)n * sizeof *outs);
	float *h = NULL;
	if (gguf_open(&g, path, err, sizeof err) || meta_load(&meta, g, err, sizeof err) ||
	    !(pool = pool_new(2)) ||
	    model_new_kv(&m, g, &meta, NULL, CTX, QT_F32, pool, err, sizeof err) || !slot || !pos ||
	    !outs || !(h = malloc((size_t)n * meta.dim * sizeof *h)))
		goto out;
	for (int i = 0; i < n; i++)
		pos[i] = i, outs[i] = MODEL_OUT_EMBD;
	model_batch_t b = {n, in, slot, pos, outs, NULL, h};
	if (model_forward_batch(m, &b, NULL))
		goto out;
	int D = meta.dim;
	double *acc = calloc((size_t)D, sizeof *acc), len = 0;
	for (int i = 0; i < n; i++)
		if (kind == ENG_POOL_MEAN || (kind == ENG_POOL_CLS && i == 0) ||
		    (kind == ENG_POOL_LAST && i == n - 1))
			for (int d = 0; d < D; d++)
				acc[d] += h[(size_t)i * D + d] / (kind == ENG_POOL_MEAN ? n : 1);
	for (int d = 0; d < D; d++)
		len += acc[d] * acc[d];
	for (int d = 0; d < D; d++)
		out[d] = (float)(acc[d] / sqrt(len));
	free(acc);
	rc = 0;
out:
	free(h);
	free(slot);
	free(pos);
	free(outs);
	model_free(m);
	pool_free(pool);
	gguf_free(g);
	return rc;
}

static eng_t *open_eng(const char *path, int parallel, const eng_dist_t *d, char *err)
{
	eng_opts_t o = {.model_path = path,
			.threads = 2,
			.ctx = CTX,
			.parallel = parallel,
			.dist = d,
			.kv_type = "f32"};
	eng_t *e = NULL;
	return eng_open(&e, &o, err, 256) ? NULL : e;
}

/* Every input embedded on e: one by one (batched = 0), or all at once as slots allow with a
 * generating sequence beside them (batched = 1). out[i] gets dim floats. Returns 0 or an error. */
static int embed_all(eng_t *e, int in[NIN][MAXIN], float *out, int batched)
{
	int D = eng_info(e)->dim, next = 0, ended = 0, gen_id = -1, rc = 0;
	eng_result_t res[NIN], gres;
	eng_done_t done[ENG_MAX_PARALLEL];
	if (batched) {
		eng_sampling_t sp;
		eng_sampling_default(&sp);
		sp.max_tokens = 30;
		int p[4] = {5, 6, 7, 8};
		if ((gen_id = eng_seq_start(e, p, 4, &sp, NULL, NULL, &gres)) < 0)
			return gen_id;
	}
	while (ended < NIN) {
		while (next < NIN && (batched || next == ended)) {
			int id = eng_embed_start(e, in[next], LENS[next], out + (size_t)next * D,
						 &res[next]);
			if (id == SH_EBUSY)
				break;
			if (id < 0)
				return id;
			next++;
		}
		int nd = 0;
		if ((rc = eng_step(e, done, &nd)))
			return rc;
		for (int i = 0; i < nd; i++) { /* a slot number: the generation's, then reused */
			if (done[i].id == gen_id)
				gen_id = -2;
			else
				ended++;
		}
	}
	while (eng_active(e)) {
		int nd;
		eng_step(e, done, &nd);
	}
	for (int i = 0; i < NIN; i++)
		if (res[i].finish != ENG_FINISH_STOP || res[i].prompt_tokens != LENS[i])
			return -1;
	return 0;
}

static void compare(const float *want, const float *got, int D, double min_cos, const char *what)
{
	for (int i = 0; i < NIN; i++) {
		double c = cosine(want + (size_t)i * D, got + (size_t)i * D, D);
		float md = max_diff(want + (size_t)i * D, got + (size_t)i * D, D);
		if (!(c >= min_cos) || md > 1e-3f)
			printf("  %s: input %d (%d tokens): cosine %.9f, max diff %g\n", what, i,
			       LENS[i], c, md);
		CHECK(c >= min_cos);
		CHECK(md <= 1e-3f);
	}
}

TEST(engine_matches_forward_pass)
{
	static int in[NIN][MAXIN];
	char err[256];
	for (int k = 0; k < 3; k++) {
		eng_t *e = open_eng(PATH[k], 2, NULL, err);
		CHECK(e != NULL);
		if (!e) {
			printf("  %s\n", err);
			continue;
		}
		int D = eng_info(e)->dim;
		CHECK_EQ_INT(eng_info(e)->pooling, KIND[k]);
		CHECK_EQ_INT(eng_info(e)->pooling_given, 1);
		make_inputs(in, eng_info(e)->n_vocab);
		float *want = calloc((size_t)NIN * D, sizeof *want);
		float *one = calloc((size_t)NIN * D, sizeof *one);
		float *mixed = calloc((size_t)NIN * D, sizeof *mixed);
		for (int i = 0; i < NIN; i++)
			CHECK_EQ_INT(
			    reference(PATH[k], KIND[k], in[i], LENS[i], want + (size_t)i * D), 0);
		CHECK_EQ_INT(embed_all(e, in, one, 0), 0);
		compare(want, one, D, 0.999999, "alone");
		/* unit length */
		for (int i = 0; i < NIN; i++) {
			double l = 0;
			for (int d = 0; d < D; d++)
				l += (double)one[(size_t)i * D + d] * one[(size_t)i * D + d];
			CHECK(fabs(l - 1) < 1e-5);
		}
		/* the same inputs again: the same bits (nothing depends on what a slot held) */
		float *again = calloc((size_t)NIN * D, sizeof *again);
		CHECK_EQ_INT(embed_all(e, in, again, 0), 0);
		CHECK(!memcmp(one, again, (size_t)NIN * D * sizeof *one));
		/* in the same steps as a generating sequence and each other */
		CHECK_EQ_INT(embed_all(e, in, mixed, 1), 0);
		compare(want, mixed, D, 0.999999, "batched");
		/* different inputs, different embeddings */
		CHECK(cosine(one, one + D, D) < 0.999);
		free(want);
		free(one);
		free(mixed);
		free(again);
		eng_free(e);
	}
}

TEST(pooling_default_eos_and_refusals)
{
	char err[256], path[256];
	snprintf(path, sizeof path, "/tmp/shoal-test-embed-%d-x.gguf", (int)getpid());
	/* llama without a pooling key: LAST by default; qwen3's generated default says last */
	mkmodel_opts_t o = opts(NULL);
	o.arch = "llama", o.head_dim = 0, o.add_eos = 1;
	CHECK_EQ_INT(mkmodel_write(&o, path, err, sizeof err), 0);
	eng_t *e = open_eng(path, 1, NULL, err);
	CHECK(e != NULL);
	if (e) {
		CHECK_EQ_INT(eng_info(e)->pooling, ENG_POOL_LAST);
		CHECK_EQ_INT(eng_info(e)->pooling_given, 0);
		CHECK(eng_info(e)->n_params > 0);
		CHECK(!strcmp(eng_info(e)->weight_type, "F32"));
		int *ids = NULL, n = 0;
		CHECK_EQ_INT(eng_embed_tokenize(e, "hello world", &ids, &n, err, sizeof err), 0);
		CHECK(n >= 2 && ids[n - 1] == eng_info(e)->eos); /* add_eos_token */
		free(ids);
		/* refusals: too long, bad ids, busy */
		static int big[CTX + 1];
		static float v[1024];
		eng_result_t r;
		CHECK_EQ_INT(eng_embed_start(e, big, CTX + 1, v, &r), SH_EINVAL);
		CHECK(r.finish == ENG_FINISH_ERROR && r.error[0]);
		int bad = 1 << 20;
		CHECK_EQ_INT(eng_embed_start(e, &bad, 1, v, &r), SH_EINVAL);
		CHECK_EQ_INT(eng_embed_start(e, big, 0, v, &r), SH_EINVAL);
		int id = eng_embed_start(e, big, 4, v, &r);
		CHECK(id >= 0);
		eng_result_t r2;
		CHECK_EQ_INT(eng_embed_start(e, big, 4, v, &r2), SH_EBUSY);
		eng_seq_cancel(e, id); /* cancel frees the slot */
		CHECK_EQ_INT(r.finish, ENG_FINISH_CANCELED);
		CHECK_EQ_INT(eng_active(e), 0);
		eng_free(e);
	}
	/* without add_eos: no EOS; a reranker's pooling is refused */
	o = opts("none");
	o.arch = "qwen3";
	CHECK_EQ_INT(mkmodel_write(&o, path, err, sizeof err), 0);
	if ((e = open_eng(path, 1, NULL, err))) {
		int *ids = NULL, n = 0;
		CHECK_EQ_INT(eng_embed_tokenize(e, "hello world", &ids, &n, err, sizeof err), 0);
		CHECK(n >= 1 && ids[n - 1] != eng_info(e)->eos);
		free(ids);
		CHECK_EQ_INT(eng_info(e)->pooling_given, 0);
		eng_free(e);
	}
	o = opts(NULL);
	CHECK_EQ_INT(mkmodel_write(&o, path, err, sizeof err), 0);
	if ((e = open_eng(path, 1, NULL, err))) { /* qwen3's generated default */
		CHECK_EQ_INT(eng_info(e)->pooling, ENG_POOL_LAST);
		CHECK_EQ_INT(eng_info(e)->pooling_given, 1);
		eng_free(e);
	}
	o.pooling = "sum";
	CHECK(mkmodel_write(&o, path, err, sizeof err) != 0); /* an unknown pooling name */
	unlink(path);
}

/* ---- several ranks ------------------------------------------------------------------------ */

/* Rank 0 of the harness's engine group (loop_group.h): every input embedded, batched. */
typedef struct rank {
	loop_eng_t e; /* first: the harness's record */
	float *out;   /* NIN x dim */
} rank_t;

static int embed_lead(loop_eng_t *r, eng_t *e)
{
	static int in[NIN][MAXIN];
	make_inputs(in, eng_info(e)->n_vocab);
	int rc = embed_all(e, in, ((rank_t *)r)->out, 1);
	if (rc)
		snprintf(r->err, sizeof r->err, "embed_all: %d", rc);
	return rc;
}

static void check_ranks(int k, int world, int pipeline, const char *what)
{
	static rank_t ctx[MAXR];
	static int in[NIN][MAXIN];
	char err[256];
	eng_t *e = open_eng(PATH[k], 2, NULL, err);
	CHECK(e != NULL);
	if (!e)
		return;
	int D = eng_info(e)->dim;
	float *want = calloc((size_t)NIN * D, sizeof *want);
	make_inputs(in, eng_info(e)->n_vocab);
	CHECK_EQ_INT(embed_all(e, in, want, 0), 0);
	eng_free(e);
	memset(ctx, 0, sizeof ctx);
	for (int r = 0; r < world; r++)
		ctx[r].e = (loop_eng_t){.keys = &KEYS,
					.tag = 21,
					.path = PATH[k],
					.pipeline = pipeline,
					.threads = 2,
					.ctx = CTX,
					.step_timeout_ms = 5000,
					.slots = 3,
					.kv_type = "f32",
					.lead = embed_lead};
	ctx[0].out = calloc((size_t)NIN * D, sizeof(float));
	loop_run(ctx, sizeof *ctx, world, loop_eng_main);
	for (int r = 0; r < world; r++) {
		if (ctx[r].e.rc)
			printf("  %s: rank %d: %s\n", what, r, ctx[r].e.err);
		CHECK_EQ_INT(ctx[r].e.rc, 0);
	}
	compare(want, ctx[0].out, D, 0.99999, what);
	free(ctx[0].out);
	free(want);
}

TEST(same_on_ranks)
{
	check_ranks(0, 2, 0, "mean, 2 tensor ranks");
	check_ranks(2, 3, 1, "last, 3 pipeline ranks");
	check_ranks(1, 2, 1, "cls, 2 pipeline ranks");
}

int main(void)
{
	char err[256];
	quant_init(0);
	if (tp_keys_derive(&KEYS, "test-embed", 10, err, sizeof err)) {
		fprintf(stderr, "keys: %s\n", err);
		return 1;
	}
	static const char *const names[3] = {"mean", "cls", "last"};
	for (int k = 0; k < 3; k++) {
		char tag[16];
		snprintf(tag, sizeof tag, "embed-%s", names[k]);
		mkmodel_opts_t o = opts(names[k]);
		if (gen_write(PATH[k], &o, tag))
			return 1;
	}
	RUN(pool_math);
	RUN(engine_matches_forward_pass);
	RUN(pooling_default_eos_and_refusals);
	RUN(same_on_ranks);
	for (int k = 0; k < 3; k++)
		unlink(PATH[k]);
	return harness_done();
}
