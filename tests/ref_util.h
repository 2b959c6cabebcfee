/*
 * ref_util.h: the plain arithmetic of the tests' reference forward passes (test_moe, test_mla,
 * test_qwen35) and their in-process tensor-parallel groups: whole tensors as F32,
 * double-accumulated products, RMS norm (argmax: common.h), and an all-reduce over threads that
 * sums in rank order (so every rank gets the same bits; test_model's two shards use it too), with a
 * runner that decodes greedily on several shards at once (mem_shards_greedy).
 */
#ifndef SHOAL_TEST_REF_UTIL_H
#define SHOAL_TEST_REF_UTIL_H

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "infer/gguf.h"
#include "infer/model/model.h"
#include "infer/quant/quant.h"

/* The whole tensor as F32 (reference dequantization, row by row); NULL when absent. Caller
 * frees. */
static inline float *ref_deq(const gguf_t *g, const char *name)
{
	const gguf_tensor_t *t = gguf_find_tensor(g, name);
	if (!t)
		return NULL;
	int64_t cols = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
	float *o = malloc((size_t)(cols * rows) * sizeof *o);
	size_t rb = quant_row_bytes(t->type, cols);
	for (int64_t r = 0; r < rows; r++)
		quant_dequant_row(t->type, (const uint8_t *)t->data + r * rb, o + r * cols, cols);
	return o;
}

/* o[r] = W[r, :] . x for a [rows x cols] matrix, summed in double. */
static inline void ref_mv(float *o, const float *w, const float *x, int rows, int cols)
{
	for (int r = 0; r < rows; r++) {
		double s = 0;
		for (int c = 0; c < cols; c++)
			s += (double)w[(size_t)r * cols + c] * x[c];
		o[r] = (float)s;
	}
}

/* Whether the named tensor's kernels multiply it with Q8_0 activations (Q8_0, Q4_0, MXFP4, ...:
 * quant_ops_t.act_type), as llama.cpp's CPU backend does (their vec_dot_type is Q8_0). */
static inline int ref_q8_act(const gguf_t *g, const char *name)
{
	const gguf_tensor_t *t = gguf_find_tensor(g, name);
	return t && quant_ops_ref(t->type)->act_type == QT_Q8_0;
}

/* o[n] = x[n] rounded through Q8_0 activation blocks as ggml's quantize_row_q8_0_ref
 * (ggml/src/ggml-quants.c) and back: per 32 values d = amax / 127 kept as F16 (block_q8_0.d),
 * q = roundf(x / d) (x times 1 / d), o = d * q. Written from ggml, not from quant.c; the engine's
 * x86 and NEON quantizers round halves to even instead (ggml's own SIMD code does), which moves
 * one value by d now and then, against every value's |error| <= d / 2 of the rounding itself. */
static inline void ref_q8_0_round(float *o, const float *x, int n)
{
	for (int b = 0; b + 32 <= n; b += 32) {
		float amax = 0;
		for (int j = 0; j < 32; j++)
			amax = fmaxf(amax, fabsf(x[b + j]));
		float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
		float dh = quant_f16_to_f32(quant_f32_to_f16(d));
		for (int j = 0; j < 32; j++)
			o[b + j] = dh * roundf(x[b + j] * id);
	}
}

/* ref_mv on x rounded through Q8_0 (ref_q8_0_round) when q8: what a quantized weight's matvec
 * computes in llama.cpp (and in the engine), the int8 activations included, summed in double. */
static inline void ref_mv_act(float *o, const float *w, const float *x, int rows, int cols, int q8)
{
	float *xq = NULL;
	if (q8 && cols % 32 == 0 && (xq = malloc((size_t)cols * sizeof *xq))) {
		ref_q8_0_round(xq, x, cols);
		x = xq;
	}
	ref_mv(o, w, x, rows, cols);
	free(xq);
}

/* p[0..n) <- softmax(p) in double: the largest subtracted, exponentials summed in order, each
 * divided by the sum (the attention references' weights). */
static inline void ref_softmax(double *p, int n)
{
	double mx = -1e300, sum = 0;
	for (int t = 0; t < n; t++)
		mx = fmax(mx, p[t]);
	for (int t = 0; t < n; t++)
		sum += p[t] = exp(p[t] - mx);
	for (int t = 0; t < n; t++)
		p[t] /= sum;
}

static inline void ref_norm(float *o, const float *x, const float *w, int n, float eps)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	double s = 1.0 / sqrt(ss / n + eps);
	for (int i = 0; i < n; i++)
		o[i] = (float)(x[i] * s * w[i]);
}

/* n threads standing in for ranks: slot[r] is rank r's vector during a reduction. */
#define MEM_GROUP_MAX 8
typedef struct mem_group {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int n, waiting, phase;
	float *slot[MEM_GROUP_MAX];
} mem_group_t;

static inline void mem_group_wait(mem_group_t *g)
{
	pthread_mutex_lock(&g->mu);
	int phase = g->phase;
	if (++g->waiting == g->n) {
		g->waiting = 0;
		g->phase++;
		pthread_cond_broadcast(&g->cv);
	} else {
		while (phase == g->phase)
			pthread_cond_wait(&g->cv, &g->mu);
	}
	pthread_mutex_unlock(&g->mu);
}

/* x[n] summed over the group's ranks, in rank order on every rank. */
static inline void mem_group_allreduce(mem_group_t *g, int rank, float *x, int n)
{
	memcpy(g->slot[rank], x, (size_t)n * sizeof *x);
	mem_group_wait(g);
	for (int i = 0; i < n; i++) {
		float s = 0;
		for (int r = 0; r < g->n; r++)
			s += g->slot[r][i];
		x[i] = s;
	}
	mem_group_wait(g);
}

/* Greedy decoding: the prompt in one pass, then n_gen ids each fed back. 0 or the model's error. */
static inline int ref_greedy(model_t *m, int V, const int *prompt, int n_prompt, int n_gen,
			     int *ids)
{
	float *lg = malloc((size_t)V * sizeof *lg);
	int rc = lg ? model_forward(m, prompt, n_prompt, 0, lg) : -1;
	for (int i = 0; i < n_gen && !rc; i++) {
		ids[i] = sh_argmax(lg, V);
		rc = model_forward(m, &ids[i], 1, n_prompt + i, lg);
	}
	free(lg);
	return rc;
}

/* One shard of an in-process tensor-parallel group (mem_shards_greedy). */
typedef struct mem_rank {
	mem_group_t *g;
	int r, rc, V, n_prompt, n_gen;
	const int *prompt;
	int *ids; /* [n_gen] */
	model_t *m;
} mem_rank_t;

static inline int mem_rank_allreduce(void *ctx, float *x, int n)
{
	mem_rank_t *k = ctx;
	mem_group_allreduce(k->g, k->r, x, n);
	return 0;
}

static inline void *mem_rank_main(void *arg)
{
	mem_rank_t *k = arg;
	k->rc = ref_greedy(k->m, k->V, k->prompt, k->n_prompt, k->n_gen, k->ids);
	return NULL;
}

/* Runs the `world` shard models m[r] (of a model of width dim and V tokens) together, one thread
 * each, their partial sums added by the in-process all-reduce (installed here): rank r's greedy
 * ids go to ids[r * n_gen ..]. Returns 0 or the first rank's error. */
static inline int mem_shards_greedy(model_t **m, int world, int V, int dim, const int *prompt,
				    int n_prompt, int n_gen, int *ids)
{
	mem_group_t g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, world, 0, 0, {0}};
	mem_rank_t rk[MEM_GROUP_MAX];
	pthread_t th[MEM_GROUP_MAX];
	int rc = 0;
	for (int r = 0; r < world; r++) {
		g.slot[r] = malloc((size_t)MODEL_MAX_BATCH * dim * sizeof(float));
		rk[r] = (mem_rank_t){&g, r, 0, V, n_prompt, n_gen, prompt, ids + r * n_gen, m[r]};
		model_set_allreduce(m[r], mem_rank_allreduce, &rk[r]);
	}
	for (int r = 0; r < world; r++)
		pthread_create(&th[r], NULL, mem_rank_main, &rk[r]);
	for (int r = 0; r < world; r++) {
		pthread_join(th[r], NULL);
		if (rk[r].rc && !rc)
			rc = rk[r].rc;
		free(g.slot[r]);
	}
	return rc;
}

#endif
