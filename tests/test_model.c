/* test_model.c: the forward pass. stories260K greedy from BOS + "Once upon a time" must give
 * exactly llama.cpp's 64 ids; a generated model in F32 and in Q8_0 must agree on the top-1 token
 * at every position of a prompt (catches layout bugs a self-consistent quantizer would hide);
 * one-token decoding must match batched prefill. */
#include "common/common.h"
#include "harness.h"
#include "infer/gguf_write.h"
#include "infer/model/model.h"
#include "infer/quant/quant.h"

#include <pthread.h>

static int read_expected(int *prompt, int *np, int *gen, int *ng)
{
	char path[512], *buf;
	size_t len;
	snprintf(path, sizeof path, "%s/models/stories260K.expected.txt", harness_shared());
	if (read_file_all(path, &buf, &len, NULL, 0))
		return -1;
	*np = *ng = 0;
	char *line = strtok(buf, "\n");
	for (; line; line = strtok(NULL, "\n")) {
		int *dst = NULL, *cnt = NULL;
		if (!strncmp(line, "prompt_ids:", 11))
			dst = prompt, cnt = np;
		else if (!strncmp(line, "generated_ids_64:", 17))
			dst = gen, cnt = ng;
		if (!dst)
			continue;
		char *p = strchr(line, ':') + 1, *end;
		for (long v; (v = strtol(p, &end, 10)), end != p; p = end)
			dst[(*cnt)++] = (int)v;
	}
	free(buf);
	return 0;
}

static void run_stories(int threads, int batched)
{
	char err[256];
	const char *path = harness_stories();
	int prompt[64], gen[128], np, ng;
	if (!path || read_expected(prompt, &np, gen, &ng)) {
		fprintf(stderr, "skip: no stories260K model\n");
		return;
	}
	CHECK_EQ_INT(ng, 64);
	gguf_t *g = NULL;
	model_meta_t meta;
	model_t *m = NULL;
	pool_t *pool = pool_new(threads);
	CHECK_EQ_INT(gguf_open(&g, path, err, sizeof err), 0);
	CHECK_EQ_INT(meta_load(&meta, g, err, sizeof err), 0);
	CHECK_EQ_INT(model_new(&m, g, &meta, NULL, 256, pool, err, sizeof err), 0);
	if (!m) {
		fprintf(stderr, "%s\n", err);
		return;
	}
	float *logits = malloc((size_t)meta.n_vocab * sizeof *logits);
	int pos = 0, ok = 1;
	if (batched) {
		CHECK_EQ_INT(model_forward(m, prompt, np, 0, logits), 0);
		pos = np;
	} else {
		for (; pos < np; pos++)
			CHECK_EQ_INT(model_forward(m, &prompt[pos], 1, pos, logits), 0);
	}
	for (int i = 0; i < ng; i++) {
		int t = sh_argmax(logits, meta.n_vocab);
		if (t != gen[i]) {
			fprintf(stderr, "stories260K step %d: got %d want %d\n", i, t, gen[i]);
			ok = 0;
			break;
		}
		CHECK_EQ_INT(model_forward(m, &t, 1, pos++, logits), 0);
	}
	CHECK(ok);
	free(logits);
	model_free(m);
	pool_free(pool);
	gguf_free(g);
}

TEST(stories260K_greedy)
{
	run_stories(1, 0);
}
TEST(stories260K_greedy_batched_2threads)
{
	run_stories(2, 1);
}

#include "gen_model.h"
#include "ref_util.h"

static const int prompt24[24] = {300, 10,  47,  299, 256, 100, 101, 102, 32, 33, 34, 35,
				 400, 401, 402, 403, 270, 271, 272, 273, 5,  6,  7,  8};

/* F32 vs Q8_0 of the same weights: top-1 agreement at every prompt position. */
TEST(f32_vs_q8_0_top1)
{
	gen_t a, b;
	if (gen_open(&a, "llama", QT_F32, 1) || gen_open(&b, "llama", QT_Q8_0, 2)) {
		CHECK(0);
		return;
	}
	int n = a.meta.n_vocab, agree = 0;
	float *la = malloc(n * sizeof *la), *lb = malloc(n * sizeof *lb);
	double num = 0, den = 0;
	for (int i = 0; i < 24; i++) {
		CHECK_EQ_INT(model_forward(a.m, &prompt24[i], 1, i, la), 0);
		CHECK_EQ_INT(model_forward(b.m, &prompt24[i], 1, i, lb), 0);
		agree += sh_argmax(la, n) == sh_argmax(lb, n);
		for (int k = 0; k < n; k++) {
			num += (la[k] - lb[k]) * (la[k] - lb[k]);
			den += la[k] * la[k];
		}
	}
	fprintf(stderr, "f32 vs q8_0: top-1 agreement %d/24, logits nmse %.2e\n", agree, num / den);
	CHECK(agree >= 23);
	CHECK(num / den < 1e-3);
	free(la);
	free(lb);
	gen_close(&a);
	gen_close(&b);
}

/* Batched prefill (sgemm path: 24 >= BLAS_MIN tokens) vs one token at a time, every arch and
 * a K-quant. */
static void batched_vs_sequential(const char *arch, int type)
{
	gen_t a;
	if (gen_open(&a, arch, type, 2)) {
		CHECK(0);
		return;
	}
	int n = a.meta.n_vocab;
	float *l1 = malloc(n * sizeof *l1), *l2 = malloc(n * sizeof *l2);
	CHECK_EQ_INT(model_forward(a.m, prompt24, 24, 0, l1), 0);
	for (int i = 0; i < 24; i++)
		CHECK_EQ_INT(model_forward(a.m, &prompt24[i], 1, i, l2), 0);
	double num = 0, den = 0, var = 0, mean = 0;
	for (int k = 0; k < n; k++) {
		num += (l1[k] - l2[k]) * (l1[k] - l2[k]);
		den += l2[k] * l2[k];
		mean += l2[k] / n;
	}
	for (int k = 0; k < n; k++)
		var += (l2[k] - mean) * (l2[k] - mean) / n;
	CHECK_EQ_INT(sh_argmax(l1, n), sh_argmax(l2, n));
	/* f32 activations in both paths: close; 8-bit activations only in the sequential one */
	double bound = type == QT_F32 ? 1e-8 : 1e-3;
	if (!(num / den < bound))
		fprintf(stderr, "%s/%d batched vs sequential nmse %g\n", arch, type, num / den);
	CHECK(num / den < bound);
	CHECK(var > 0.5); /* logits are spread, the model is not degenerate */
	free(l1);
	free(l2);
	gen_close(&a);
}

TEST(batched_llama_f32)
{
	batched_vs_sequential("llama", QT_F32);
}
TEST(batched_qwen2_q8_0)
{
	batched_vs_sequential("qwen2", QT_Q8_0);
}
TEST(batched_qwen3_q4_k)
{
	batched_vs_sequential("qwen3", QT_Q4_K);
}
TEST(batched_llama_q4_0)
{
	batched_vs_sequential("llama", QT_Q4_0);
}
TEST(batched_llama_q6_k)
{
	batched_vs_sequential("llama", QT_Q6_K);
}
TEST(batched_llama_f16)
{
	batched_vs_sequential("llama", QT_F16);
}
/* The low-bit types MoE files use (quant_lowbit.c): one forward pass, read in place. */
TEST(batched_lowbit_types)
{
	batched_vs_sequential("llama", QT_Q5_0);
	batched_vs_sequential("qwen2", QT_Q5_1);
	batched_vs_sequential("llama", QT_Q5_K);
	batched_vs_sequential("qwen3", QT_Q3_K);
	batched_vs_sequential("llama", QT_Q2_K);
}

/* ---- the tensor-parallel seam: two shards in two threads, summed by a toy all-reduce ---- */

typedef struct rank_ctx {
	mem_group_t *ar;
	int rank;
	model_t *m;
	float *logits;
	int rc;
} rank_ctx_t;

static int toy_allreduce(void *ctx, float *x, int n)
{
	rank_ctx_t *r = ctx;
	mem_group_allreduce(r->ar, r->rank, x, n); /* rank order on both: identical sums */
	return 0;
}

static void *rank_main(void *arg)
{
	rank_ctx_t *r = arg;
	r->rc = model_forward(r->m, prompt24, 24, 0, r->logits); /* batched: the sgemm path */
	for (int i = 0; i < 4 && !r->rc; i++) {
		int t = prompt24[i];
		r->rc = model_forward(r->m, &t, 1, 24 + i, r->logits); /* decode: the matvec path */
	}
	return NULL;
}

static void sharded_matches_full(int type, const model_shard_t *sh)
{
	char err[256];
	gen_t full;
	if (gen_open(&full, "qwen2", type, 1)) {
		CHECK(0);
		return;
	}
	int n = full.meta.n_vocab;
	float *want = malloc(n * sizeof *want);
	CHECK_EQ_INT(model_forward(full.m, prompt24, 24, 0, want), 0);
	for (int i = 0; i < 4; i++)
		CHECK_EQ_INT(model_forward(full.m, &prompt24[i], 1, 24 + i, want), 0);

	mem_group_t ar = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 2, 0, 0, {NULL}};
	rank_ctx_t rk[2];
	pool_t *pools[2];
	pthread_t th[2];
	for (int r = 0; r < 2; r++) {
		ar.slot[r] = malloc(64 * full.meta.dim * sizeof(float));
		pools[r] = pool_new(1);
		rk[r] = (rank_ctx_t){&ar, r, NULL, malloc(n * sizeof(float)), 0};
		CHECK_EQ_INT(
		    model_new(&rk[r].m, full.g, &full.meta, &sh[r], 256, pools[r], err, sizeof err),
		    0);
		model_set_allreduce(rk[r].m, toy_allreduce, &rk[r]);
	}
	for (int r = 0; r < 2; r++)
		pthread_create(&th[r], NULL, rank_main, &rk[r]);
	for (int r = 0; r < 2; r++)
		pthread_join(th[r], NULL);
	double num = 0, den = 0;
	for (int k = 0; k < n; k++) {
		num += (rk[0].logits[k] - want[k]) * (rk[0].logits[k] - want[k]);
		den += want[k] * want[k];
	}
	CHECK_EQ_INT(rk[0].rc, 0);
	CHECK_EQ_INT(rk[1].rc, 0);
	CHECK(!memcmp(rk[0].logits, rk[1].logits, n * sizeof(float))); /* ranks agree exactly */
	CHECK_EQ_INT(sh_argmax(rk[0].logits, n), sh_argmax(want, n));
	if (!(num / den < 1e-8))
		fprintf(stderr, "sharded vs full (type %d): nmse %g\n", type, num / den);
	CHECK(num / den < 1e-8);
	/* a shard whose column slice would split a quant block is refused */
	model_shard_t bad = {0, 4, 0, 1, 0, 100, 0, 0, 0, 0, 0, 0};
	model_t *mb = NULL;
	if (type != QT_F32)
		CHECK(model_new(&mb, full.g, &full.meta, &bad, 256, pools[0], err, sizeof err) < 0);
	model_free(mb);
	for (int r = 0; r < 2; r++) {
		model_free(rk[r].m);
		pool_free(pools[r]);
		free(rk[r].logits);
		free(ar.slot[r]);
	}
	free(want);
	gen_close(&full);
}

/* 8 heads / 2 KV heads / ffn 512: an even split, and a 3:1 split where rank 0 holds both KV
 * heads and rank 1 a replica of the second. */
static const model_shard_t even[2] = {{0, 4, 0, 1, 0, 256, 0, 0, 0, 0, 0, 0},
				      {4, 4, 1, 1, 256, 256, 0, 0, 0, 0, 0, 0}};
static const model_shard_t uneven[2] = {{0, 6, 0, 2, 0, 384, 0, 0, 0, 0, 0, 0},
					{6, 2, 1, 1, 384, 128, 0, 0, 0, 0, 0, 0}};
TEST(tensor_parallel_seam_f32)
{
	sharded_matches_full(QT_F32, even);
}
TEST(tensor_parallel_seam_q8_0_uneven)
{
	sharded_matches_full(QT_Q8_0, uneven);
}

TEST(bad_input)
{
	gen_t a;
	if (gen_open(&a, "llama", QT_Q8_0, 1)) {
		CHECK(0);
		return;
	}
	int bad = 100000, ok = 1;
	CHECK_EQ_INT(model_forward(a.m, &bad, 1, 0, NULL), SH_EINVAL);
	CHECK_EQ_INT(model_forward(a.m, &ok, 1, 256, NULL), SH_EINVAL);
	gen_close(&a);
}

int main(void)
{
	quant_init(0);
	RUN(stories260K_greedy);
	RUN(stories260K_greedy_batched_2threads);
	RUN(f32_vs_q8_0_top1);
	RUN(batched_llama_f32);
	RUN(batched_qwen2_q8_0);
	RUN(batched_qwen3_q4_k);
	RUN(batched_llama_q4_0);
	RUN(batched_llama_q6_k);
	RUN(batched_llama_f16);
	RUN(batched_lowbit_types);
	RUN(tensor_parallel_seam_f32);
	RUN(tensor_parallel_seam_q8_0_uneven);
	RUN(bad_input);
	return harness_done();
}
