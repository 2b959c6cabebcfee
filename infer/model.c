/*
 * model.c: weights bound to the GGUF mapping and the forward pass (llama, qwen2, qwen3).
 *
 * forward() reads like llama2.c's: embedding, then per layer RMSNorm -> Q/K/V (+bias, +q/k norm)
 * -> RoPE -> cache -> attention -> output projection -> residual, RMSNorm -> gate/up -> SwiGLU ->
 * down -> residual; final norm and the head. Every matrix product goes through matmul(), the one
 * place that chooses the kernel: types with a batched integer kernel (rows8: Q8_0/Q4_0 with
 * AVX512-VNNI) use it for any batch; otherwise a batch of fewer than BLAS_MIN tokens uses the
 * integer matvec kernels (weights read once per batch, rows split over the pool) and a larger
 * one dequantizes tiles of rows and calls cblas_sgemm on each pool thread (OpenBLAS itself
 * single-threaded).
 *
 * Invariant: the KV cache holds positions [0, pos) of the current sequence for this shard's KV
 * heads; model_forward() only appends.
 */
#include "infer/model.h"
#include "common/common.h"
#include "infer/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SHOAL_ACCELERATE
#include <Accelerate/Accelerate.h>
#else
#include <cblas.h>
#endif

#define BLAS_MIN  16  /* batches this large go through sgemm */
#define TILE_ROWS 256 /* rows dequantized per sgemm call (amortizes packing x) */
#define MV_CHUNK  16  /* rows per batched matvec step (stay in L1/L2 across the batch) */
#define MAX_MULTI 3   /* matrices sharing one input in one pool dispatch (Q,K,V / gate,up) */

typedef struct wmat {
	const uint8_t *data; /* rows x cols of `type`, row-major, row_bytes apart */
	int type, rows, cols;
	size_t row_bytes;
	const quant_ops_t *ops;
	quant_dequant_fn dequant;
} wmat_t;

typedef struct layer {
	float *attn_norm;       /* [dim] */
	wmat_t wq;              /* [n_heads*head_dim x dim] */
	wmat_t wk, wv;          /* [n_kv_heads*head_dim x dim] */
	wmat_t wo;              /* [dim x n_heads*head_dim] */
	float *bq, *bk, *bv;    /* qwen2: [q_dim], [kv_dim], [kv_dim] (this shard's rows) */
	float *q_norm, *k_norm; /* qwen3: [head_dim] */
	float *ffn_norm;        /* [dim] */
	wmat_t w_gate, w_up;    /* [ffn x dim] */
	wmat_t w_down;          /* [dim x ffn] */
} layer_t;

struct model {
	model_meta_t meta;
	model_shard_t sh;
	pool_t *pool;
	int n_ctx;
	int qd, kvd;     /* this shard's q and kv widths: n_q_heads*hd, n_kv_heads*hd */
	wmat_t embd;     /* [n_vocab x dim] */
	wmat_t out;      /* [n_vocab x dim] (= embd when tied) */
	float *out_norm; /* [dim] */
	layer_t *layers; /* [n_layers] */
	float *inv_freq; /* [rope_dim/2] */
	float *kc, *vc;  /* [n_layers][n_ctx][kvd] */
	/* scratch for a batch of up to max_b tokens */
	int max_b;
	float *x, *xb, *xb2; /* [max_b][dim] */
	float *q, *k, *v;    /* [max_b][qd], [max_b][kvd] x2 */
	float *att;          /* [max_b][qd] */
	float *hb, *hb2;     /* [max_b][n_ffn] */
	float *scores;       /* [threads][n_ctx] */
	uint8_t *act;        /* prepared activations, [max_b][act_stride] */
	size_t act_stride;
	float **tiles; /* [threads][TILE_ROWS * max_cols] for sgemm */
	model_allreduce_fn ar;
	void *ar_ctx;
	const quant_ops_t *f32; /* F32 matvec, for attention scores */
	quant_axpy_fn axpy;     /* for attention's weighted sum of values */
};

/* ---- binding ------------------------------------------------------------------------------ */

static int bind_mat(model_t *m, const gguf_t *g, const char *name, wmat_t *w, char *err,
		    size_t errlen)
{
	const gguf_tensor_t *t = gguf_find_tensor(g, name);
	if (!t)
		return sh_fail(err, errlen, SH_EFORMAT, "missing tensor %s", name);
	if (!quant_type_supported(t->type))
		return sh_fail(err, errlen, SH_EUNSUPP, "unsupported tensor type %s for %s",
			       gguf_type_name(t->type), name);
	if (t->ne[0] % quant_block_elems(t->type))
		return sh_fail(err, errlen, SH_EFORMAT,
			       "tensor %s: row of %lld is not whole blocks", name,
			       (long long)t->ne[0]);
	w->data = t->data;
	w->type = t->type;
	w->cols = (int)t->ne[0];
	w->rows = (int)t->ne[1];
	w->row_bytes = quant_row_bytes(t->type, t->ne[0]);
	w->ops = quant_ops(t->type);
	w->dequant = w->ops->dequant ? w->ops->dequant : quant_ops_ref(t->type)->dequant;
	(void)m;
	if ((uint64_t)w->row_bytes * (uint64_t)w->rows > t->nbytes)
		return sh_fail(err, errlen, SH_EFORMAT, "tensor %s is truncated", name);
	return 0;
}

/* A norm or bias vector as F32 (a small copy): n elements starting at element off. */
static int bind_vec(const gguf_t *g, const char *name, int off, int n, float **out, char *err,
		    size_t errlen)
{
	const gguf_tensor_t *t = gguf_find_tensor(g, name);
	if (!t)
		return sh_fail(err, errlen, SH_EFORMAT, "missing tensor %s", name);
	if (t->ne[0] < off + n)
		return sh_fail(err, errlen, SH_EFORMAT, "tensor %s is too short", name);
	float *v = malloc((size_t)t->ne[0] * sizeof *v);
	if (!v)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	quant_dequant_row(t->type, t->data, v, t->ne[0]);
	if (off)
		memmove(v, v + off, (size_t)n * sizeof *v);
	*out = v;
	return 0;
}

void model_shard_full(const model_meta_t *meta, model_shard_t *s)
{
	s->q_head0 = 0;
	s->n_q_heads = meta->n_heads;
	s->kv_head0 = 0;
	s->n_kv_heads = meta->n_kv_heads;
	s->ffn0 = 0;
	s->n_ffn = meta->ffn;
}

size_t model_kv_bytes_per_pos(const model_meta_t *meta, const model_shard_t *shard)
{
	model_shard_t full;
	if (!shard) {
		model_shard_full(meta, &full);
		shard = &full;
	}
	return (size_t)meta->n_layers * 2 * (size_t)shard->n_kv_heads * (size_t)meta->head_dim *
	       sizeof(float);
}

static int shard_check(const model_meta_t *mt, const model_shard_t *s, char *err, size_t errlen)
{
	int grp = mt->n_heads / mt->n_kv_heads;
	if (s->n_q_heads <= 0 || s->q_head0 < 0 || s->q_head0 + s->n_q_heads > mt->n_heads ||
	    s->n_kv_heads <= 0 || s->kv_head0 < 0 || s->kv_head0 + s->n_kv_heads > mt->n_kv_heads ||
	    s->n_ffn <= 0 || s->ffn0 < 0 || s->ffn0 + s->n_ffn > mt->ffn)
		return sh_fail(err, errlen, SH_EINVAL, "shard out of range");
	if (s->q_head0 / grp < s->kv_head0 ||
	    (s->q_head0 + s->n_q_heads - 1) / grp >= s->kv_head0 + s->n_kv_heads)
		return sh_fail(err, errlen, SH_EINVAL,
			       "shard's KV heads do not cover its query heads");
	return 0;
}

/* A row slice [r0, r0+n) of w, as its own matrix. */
static wmat_t mat_rows(wmat_t w, int r0, int n)
{
	w.data += (size_t)r0 * w.row_bytes;
	w.rows = n;
	return w;
}

/* A column slice [c0, c0+n) of w: rows keep their stride, data starts c0's block. */
static int mat_cols(wmat_t *w, int c0, int n, const char *name, char *err, size_t errlen)
{
	int be = quant_block_elems(w->type);
	if (c0 % be || n % be)
		return sh_fail(err, errlen, SH_EINVAL, "shard splits %s inside a %d-element block",
			       name, be);
	w->data += quant_row_bytes(w->type, c0);
	w->cols = n;
	return 0;
}

int model_n_ctx(const model_t *m)
{
	return m->n_ctx;
}

void model_set_allreduce(model_t *m, model_allreduce_fn fn, void *ctx)
{
	m->ar = fn;
	m->ar_ctx = ctx;
}

static int alloc_scratch(model_t *m, int max_b)
{
	const model_meta_t *mt = &m->meta;
	int nt = pool_threads(m->pool);
	int maxc = MAX(MAX(mt->dim, m->qd), m->sh.n_ffn);
	size_t b = (size_t)max_b;
	m->max_b = max_b;
	m->x = calloc(b * mt->dim, sizeof(float));
	m->xb = calloc(b * mt->dim, sizeof(float));
	m->xb2 = calloc(b * mt->dim, sizeof(float));
	m->q = calloc(b * m->qd, sizeof(float));
	m->k = calloc(b * m->kvd, sizeof(float));
	m->v = calloc(b * m->kvd, sizeof(float));
	m->att = calloc(b * m->qd, sizeof(float));
	m->hb = calloc(b * m->sh.n_ffn, sizeof(float));
	m->hb2 = calloc(b * m->sh.n_ffn, sizeof(float));
	m->scores = calloc((size_t)nt * m->n_ctx, sizeof(float));
	/* activation scratch: the largest input width, 8-bit blocks + scales (+ bsums) */
	m->act_stride = ((size_t)maxc + (size_t)maxc / 16 * 2 + (size_t)maxc / 32 * 6 + 63) & ~63u;
	m->act = aligned_alloc(64, b * m->act_stride);
	m->tiles = calloc((size_t)nt, sizeof *m->tiles);
	if (!m->x || !m->xb || !m->xb2 || !m->q || !m->k || !m->v || !m->att || !m->hb || !m->hb2 ||
	    !m->scores || !m->act || !m->tiles)
		return SH_ENOMEM;
	for (int i = 0; i < nt; i++)
		if (!(m->tiles[i] = malloc((size_t)TILE_ROWS * maxc * sizeof(float))))
			return SH_ENOMEM;
	return 0;
}

int model_new(model_t **out, const gguf_t *g, const model_meta_t *meta, const model_shard_t *shard,
	      int n_ctx, pool_t *pool, char *err, size_t errlen)
{
	*out = NULL;
	model_t *m = calloc(1, sizeof *m);
	if (!m)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	int rc;
	m->meta = *meta;
	if (shard)
		m->sh = *shard;
	else
		model_shard_full(meta, &m->sh);
	if ((rc = shard_check(meta, &m->sh, err, errlen)))
		goto err;
	m->pool = pool;
	m->n_ctx = n_ctx;
	int hd = meta->head_dim;
	m->qd = m->sh.n_q_heads * hd;
	m->kvd = m->sh.n_kv_heads * hd;

	if ((rc = bind_mat(m, g, "token_embd.weight", &m->embd, err, errlen)) ||
	    (rc = bind_vec(g, "output_norm.weight", 0, meta->dim, &m->out_norm, err, errlen)))
		goto err;
	if (meta->tied_output)
		m->out = m->embd;
	else if ((rc = bind_mat(m, g, "output.weight", &m->out, err, errlen)))
		goto err;

	m->layers = calloc((size_t)meta->n_layers, sizeof *m->layers);
	if (!m->layers) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto err;
	}
	int q0 = m->sh.q_head0 * hd, k0 = m->sh.kv_head0 * hd;
	for (int l = 0; l < meta->n_layers; l++) {
		layer_t *L = &m->layers[l];
		char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
		if ((rc = bind_vec(g, NAME("attn_norm.weight"), 0, meta->dim, &L->attn_norm, err,
				   errlen)) ||
		    (rc = bind_vec(g, NAME("ffn_norm.weight"), 0, meta->dim, &L->ffn_norm, err,
				   errlen)) ||
		    (rc = bind_mat(m, g, NAME("attn_q.weight"), &L->wq, err, errlen)) ||
		    (rc = bind_mat(m, g, NAME("attn_k.weight"), &L->wk, err, errlen)) ||
		    (rc = bind_mat(m, g, NAME("attn_v.weight"), &L->wv, err, errlen)) ||
		    (rc = bind_mat(m, g, NAME("attn_output.weight"), &L->wo, err, errlen)) ||
		    (rc = bind_mat(m, g, NAME("ffn_gate.weight"), &L->w_gate, err, errlen)) ||
		    (rc = bind_mat(m, g, NAME("ffn_up.weight"), &L->w_up, err, errlen)) ||
		    (rc = bind_mat(m, g, NAME("ffn_down.weight"), &L->w_down, err, errlen)))
			goto err;
		if (meta->has_qkv_bias &&
		    ((rc = bind_vec(g, NAME("attn_q.bias"), q0, m->qd, &L->bq, err, errlen)) ||
		     (rc = bind_vec(g, NAME("attn_k.bias"), k0, m->kvd, &L->bk, err, errlen)) ||
		     (rc = bind_vec(g, NAME("attn_v.bias"), k0, m->kvd, &L->bv, err, errlen))))
			goto err;
		if (meta->has_qk_norm && ((rc = bind_vec(g, NAME("attn_q_norm.weight"), 0, hd,
							 &L->q_norm, err, errlen)) ||
					  (rc = bind_vec(g, NAME("attn_k_norm.weight"), 0, hd,
							 &L->k_norm, err, errlen))))
			goto err;
#undef NAME
		/* this shard's slices: Q/K/V/gate/up by rows, O/down by input columns */
		L->wq = mat_rows(L->wq, q0, m->qd);
		L->wk = mat_rows(L->wk, k0, m->kvd);
		L->wv = mat_rows(L->wv, k0, m->kvd);
		L->w_gate = mat_rows(L->w_gate, m->sh.ffn0, m->sh.n_ffn);
		L->w_up = mat_rows(L->w_up, m->sh.ffn0, m->sh.n_ffn);
		if ((rc = mat_cols(&L->wo, q0, m->qd, "attn_output", err, errlen)) ||
		    (rc = mat_cols(&L->w_down, m->sh.ffn0, m->sh.n_ffn, "ffn_down", err, errlen)))
			goto err;
	}

	int half = meta->rope_dim / 2;
	m->inv_freq = malloc((size_t)MAX(half, 1) * sizeof(float));
	size_t kv_elems = (size_t)meta->n_layers * (size_t)n_ctx * (size_t)m->kvd;
	m->kc = malloc(kv_elems * sizeof(float));
	m->vc = malloc(kv_elems * sizeof(float));
	if (!m->inv_freq || !m->kc || !m->vc || alloc_scratch(m, 64)) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory for a context of %d", n_ctx);
		goto err;
	}
	m->f32 = quant_ops(QT_F32);
	m->axpy = quant_axpy();
	for (int i = 0; i < half; i++)
		m->inv_freq[i] = (float)pow(meta->rope_base, -2.0 * i / meta->rope_dim);
#ifndef SHOAL_ACCELERATE
	openblas_set_num_threads(1); /* parallelism comes from the pool, one sgemm per thread */
#endif
	*out = m;
	return 0;
err:
	model_free(m);
	return rc;
}

void model_free(model_t *m)
{
	if (!m)
		return;
	if (m->layers)
		for (int l = 0; l < m->meta.n_layers; l++) {
			layer_t *L = &m->layers[l];
			free(L->attn_norm);
			free(L->ffn_norm);
			free(L->bq);
			free(L->bk);
			free(L->bv);
			free(L->q_norm);
			free(L->k_norm);
		}
	if (m->tiles)
		for (int i = 0; i < pool_threads(m->pool); i++)
			free(m->tiles[i]);
	free(m->tiles);
	free(m->layers);
	free(m->out_norm);
	free(m->inv_freq);
	free(m->kc);
	free(m->vc);
	free(m->x);
	free(m->xb);
	free(m->xb2);
	free(m->q);
	free(m->k);
	free(m->v);
	free(m->att);
	free(m->hb);
	free(m->hb2);
	free(m->scores);
	free(m->act);
	free(m);
}

uint64_t model_bytes_per_token(const model_t *m)
{
	uint64_t b = m->out.row_bytes * (uint64_t)m->out.rows + m->embd.row_bytes;
	for (int l = 0; l < m->meta.n_layers; l++) {
		const layer_t *L = &m->layers[l];
		const wmat_t *w[] = {&L->wq, &L->wk, &L->wv, &L->w_gate, &L->w_up};
		for (size_t i = 0; i < ARRAY_LEN(w); i++)
			b += w[i]->row_bytes * (uint64_t)w[i]->rows;
		b += quant_row_bytes(L->wo.type, L->wo.cols) * (uint64_t)L->wo.rows;
		b += quant_row_bytes(L->w_down.type, L->w_down.cols) * (uint64_t)L->w_down.rows;
	}
	return b;
}

/* ---- matmul: out[b][r] = W[r, :] . x[b][:] for B inputs and up to MAX_MULTI matrices -------- */

typedef struct mm_job {
	model_t *m;
	int n_mat;
	const wmat_t *w[MAX_MULTI];
	float *out[MAX_MULTI]; /* [B][w->rows] */
	const float *x;        /* [B][cols] (same cols for every matrix) */
	int B, cols;
	int per;              /* chunks per matrix */
	quant_act_t acts[64]; /* per input, integer path */
} mm_job_t;

/* Chunk c of a multi-matrix job: matrix c / per, part c % per of its rows. */
static void mm_chunk_rows(const mm_job_t *j, int c, int align, const wmat_t **w, int *k, int *lo,
			  int *hi)
{
	*k = c / j->per;
	*w = j->w[*k];
	pool_split((*w)->rows, c % j->per, j->per, align, lo, hi);
}

static void mm_matvec_task(void *ctx, int c, int nc, int tid)
{
	mm_job_t *j = ctx;
	const wmat_t *w;
	int k, lo, hi;
	(void)nc;
	(void)tid;
	mm_chunk_rows(j, c, 4, &w, &k, &lo, &hi);
	for (int r = lo; r < hi; r += MV_CHUNK) {
		int nr = MIN(MV_CHUNK, hi - r);
		const uint8_t *wr = w->data + (size_t)r * w->row_bytes;
		if (j->B > 1 && w->ops->rows8) { /* one pass over these rows per 8 inputs */
			for (int b = 0; b < j->B; b += 8)
				w->ops->rows8(j->out[k] + (size_t)b * w->rows + r, w->rows, wr,
					      w->row_bytes, nr, &j->acts[b], MIN(8, j->B - b),
					      j->cols);
			continue;
		}
		for (int b = 0; b < j->B; b++)
			w->ops->rows(j->out[k] + (size_t)b * w->rows + r, wr, w->row_bytes, nr,
				     &j->acts[b], j->cols);
	}
}

static void mm_sgemm_task(void *ctx, int c, int nc, int tid)
{
	mm_job_t *j = ctx;
	float *tile = j->m->tiles[tid];
	const wmat_t *w;
	int k, lo, hi;
	(void)nc;
	mm_chunk_rows(j, c, 16, &w, &k, &lo, &hi);
	for (int r = lo; r < hi; r += TILE_ROWS) {
		int nr = MIN(TILE_ROWS, hi - r);
		for (int i = 0; i < nr; i++)
			w->dequant(w->data + (size_t)(r + i) * w->row_bytes,
				   tile + (size_t)i * j->cols, j->cols);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->B, nr, j->cols, 1.0f, j->x,
			    j->cols, tile, j->cols, 0.0f, j->out[k] + r, w->rows);
	}
}

/* All matrices must share cols and weight type (true for Q/K/V and gate/up of one file in
 * practice; otherwise call once per matrix). */
static void matmul_multi(model_t *m, int n_mat, const wmat_t **w, float **out, const float *x,
			 int B)
{
	mm_job_t j;
	j.m = m;
	j.n_mat = n_mat;
	j.x = x;
	j.B = B;
	j.cols = w[0]->cols;
	for (int k = 0; k < n_mat; k++) {
		j.w[k] = w[k];
		j.out[k] = out[k];
	}
	int nt = pool_threads(m->pool), rows = w[0]->rows;
	if (B >= BLAS_MIN && !w[0]->ops->rows8) {
		j.per = MAX(1, MIN((rows + TILE_ROWS - 1) / TILE_ROWS, 2 * nt));
		pool_run(m->pool, mm_sgemm_task, &j, n_mat * j.per);
		return;
	}
	for (int b = 0; b < B; b++)
		quant_act_prepare(w[0]->type, x + (size_t)b * j.cols, j.cols,
				  m->act + (size_t)b * m->act_stride, &j.acts[b]);
	j.per = nt == 1 ? 1 : MAX(1, MIN(rows / 64, 4 * nt));
	pool_run(m->pool, mm_matvec_task, &j, n_mat * j.per);
}

static void matmul(model_t *m, const wmat_t *w, float *out, const float *x, int B)
{
	matmul_multi(m, 1, &w, &out, x, B);
}

/* Q, K, V (or gate, up) in one dispatch when their types agree. */
static void matmul_same_input(model_t *m, int n, const wmat_t **w, float **out, const float *x,
			      int B)
{
	int same = 1;
	for (int k = 1; k < n; k++)
		same &= w[k]->type == w[0]->type && w[k]->cols == w[0]->cols;
	if (same) {
		matmul_multi(m, n, w, out, x, B);
		return;
	}
	for (int k = 0; k < n; k++)
		matmul(m, w[k], out[k], x, B);
}

/* ---- small kernels ------------------------------------------------------------------------ */

static void rmsnorm(float *o, const float *x, const float *w, int n, float eps)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	float s = (float)(1.0 / sqrt(ss / n + eps));
	for (int i = 0; i < n; i++)
		o[i] = x[i] * s * w[i];
}

/* Rotates one head vector h[head_dim] for position pos. */
static void rope(const model_t *m, float *h, int pos)
{
	int half = m->meta.rope_dim / 2;
	for (int i = 0; i < half; i++) {
		float a = (float)pos * m->inv_freq[i], c = cosf(a), s = sinf(a);
		int i0, i1;
		if (m->meta.rope_style == META_ROPE_NEOX)
			i0 = i, i1 = i + half;
		else
			i0 = 2 * i, i1 = 2 * i + 1;
		float x0 = h[i0], x1 = h[i1];
		h[i0] = x0 * c - x1 * s;
		h[i1] = x0 * s + x1 * c;
	}
}

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct att_job {
	model_t *m;
	int layer, B, pos;
} att_job_t;

/* Work item i = (token b, local head h): att[b][h] = softmax(q . K^T / sqrt(hd)) V over
 * positions [0, pos + b]. */
static void att_task(void *ctx, int c, int nc, int tid)
{
	att_job_t *j = ctx;
	model_t *m = j->m;
	int hd = m->meta.head_dim, nh = m->sh.n_q_heads;
	int grp = m->meta.n_heads / m->meta.n_kv_heads;
	float scale = 1.0f / sqrtf((float)hd);
	float *sc = m->scores + (size_t)tid * m->n_ctx;
	const float *kc = m->kc + (size_t)j->layer * m->n_ctx * m->kvd;
	const float *vc = m->vc + (size_t)j->layer * m->n_ctx * m->kvd;
	int lo, hi;
	pool_split(j->B * nh, c, nc, 1, &lo, &hi);
	for (int it = lo; it < hi; it++) {
		int b = it / nh, h = it % nh;
		int kvh = (m->sh.q_head0 + h) / grp - m->sh.kv_head0;
		int T = j->pos + b + 1;
		const float *q = m->q + (size_t)b * m->qd + (size_t)h * hd;
		/* sc[t] = q . k_t: the F32 matvec kernel over the cache rows of this KV head */
		quant_act_t qa = {.type = QT_F32, .f = q};
		m->f32->rows(sc, (const uint8_t *)(kc + (size_t)kvh * hd),
			     (size_t)m->kvd * sizeof(float), T, &qa, hd);
		float mx = -INFINITY;
		for (int t = 0; t < T; t++) {
			sc[t] *= scale;
			mx = fmaxf(mx, sc[t]);
		}
		float sum = 0;
		for (int t = 0; t < T; t++) {
			sc[t] = expf(sc[t] - mx);
			sum += sc[t];
		}
		float *o = m->att + (size_t)b * m->qd + (size_t)h * hd;
		memset(o, 0, (size_t)hd * sizeof *o);
		for (int t = 0; t < T; t++)
			m->axpy(o, sc[t] / sum, vc + (size_t)t * m->kvd + (size_t)kvh * hd, hd);
	}
}

/* ---- forward ------------------------------------------------------------------------------ */

static int forward_batch(model_t *m, const int *tokens, int B, int pos, float *logits)
{
	const model_meta_t *p = &m->meta;
	int D = p->dim, hd = p->head_dim, F = m->sh.n_ffn;
	int rc;

	/* x[B][D] = token_embd[tokens] */
	for (int b = 0; b < B; b++)
		quant_dequant_row(m->embd.type,
				  m->embd.data + (size_t)tokens[b] * m->embd.row_bytes,
				  m->x + (size_t)b * D, D);

	for (int l = 0; l < p->n_layers; l++) {
		layer_t *L = &m->layers[l];
		/* attention block: xb[B][D] = rmsnorm(x); q[B][qd], k,v[B][kvd] */
		for (int b = 0; b < B; b++)
			rmsnorm(m->xb + (size_t)b * D, m->x + (size_t)b * D, L->attn_norm, D,
				p->rms_eps);
		const wmat_t *qkv[3] = {&L->wq, &L->wk, &L->wv};
		float *qkv_out[3] = {m->q, m->k, m->v};
		matmul_same_input(m, 3, qkv, qkv_out, m->xb, B);
		for (int b = 0; b < B; b++) {
			float *q = m->q + (size_t)b * m->qd, *k = m->k + (size_t)b * m->kvd;
			float *v = m->v + (size_t)b * m->kvd;
			if (L->bq) {
				for (int i = 0; i < m->qd; i++)
					q[i] += L->bq[i];
				for (int i = 0; i < m->kvd; i++) {
					k[i] += L->bk[i];
					v[i] += L->bv[i];
				}
			}
			for (int h = 0; h < m->sh.n_q_heads; h++) {
				if (L->q_norm)
					rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, p->rms_eps);
				rope(m, q + h * hd, pos + b);
			}
			for (int h = 0; h < m->sh.n_kv_heads; h++) {
				if (L->k_norm)
					rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, p->rms_eps);
				rope(m, k + h * hd, pos + b);
			}
			size_t at = ((size_t)l * m->n_ctx + (size_t)(pos + b)) * m->kvd;
			memcpy(m->kc + at, k, (size_t)m->kvd * sizeof *k);
			memcpy(m->vc + at, v, (size_t)m->kvd * sizeof *v);
		}
		att_job_t aj = {m, l, B, pos};
		int items = B * m->sh.n_q_heads;
		pool_run(m->pool, att_task, &aj, MIN(items, 4 * pool_threads(m->pool)));
		/* xb2[B][D] = W_o[:, shard cols] . att (partial over ranks) */
		matmul(m, &L->wo, m->xb2, m->att, B);
		if (m->ar && (rc = m->ar(m->ar_ctx, m->xb2, B * D)))
			return rc;
		for (int i = 0; i < B * D; i++)
			m->x[i] += m->xb2[i];

		/* FFN block: hb[B][F] = silu(gate(xb)) * up(xb); xb2 = down(hb) */
		for (int b = 0; b < B; b++)
			rmsnorm(m->xb + (size_t)b * D, m->x + (size_t)b * D, L->ffn_norm, D,
				p->rms_eps);
		const wmat_t *gu[2] = {&L->w_gate, &L->w_up};
		float *gu_out[2] = {m->hb, m->hb2};
		matmul_same_input(m, 2, gu, gu_out, m->xb, B);
		for (int i = 0; i < B * F; i++) {
			float g = m->hb[i];
			m->hb[i] = g / (1.0f + expf(-g)) * m->hb2[i];
		}
		matmul(m, &L->w_down, m->xb2, m->hb, B);
		if (m->ar && (rc = m->ar(m->ar_ctx, m->xb2, B * D)))
			return rc;
		for (int i = 0; i < B * D; i++)
			m->x[i] += m->xb2[i];
	}

	if (logits) { /* only the last token's logits are needed */
		float *xl = m->x + (size_t)(B - 1) * D;
		rmsnorm(m->xb, xl, m->out_norm, D, p->rms_eps);
		matmul(m, &m->out, logits, m->xb, 1);
	}
	return 0;
}

int model_forward(model_t *m, const int *tokens, int n, int pos, float *logits)
{
	if (n <= 0 || pos < 0 || pos + n > m->n_ctx)
		return SH_EINVAL;
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= m->meta.n_vocab)
			return SH_EINVAL;
	for (int done = 0; done < n;) {
		int B = MIN(m->max_b, n - done);
		int last = done + B == n;
		int rc = forward_batch(m, tokens + done, B, pos + done, last ? logits : NULL);
		if (rc)
			return rc;
		done += B;
	}
	return 0;
}
