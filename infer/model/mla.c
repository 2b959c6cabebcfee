/*
 * mla.c: deepseek2's Multi-head Latent Attention, with the key/value up-projection absorbed so
 * the cache holds only the compressed latent.
 *
 * Per token t (x = the attention-normed hidden state), as llama.cpp's src/models/deepseek2.cpp:
 *   q_h = [q_nope_h | q_pe_h] = (W_q x)_h, or (W_qb rmsnorm(W_qa x))_h   (qk_nope + qk_rope)
 *   [c_t | k_pe_t] = W_kva x;  c_t = rmsnorm(c_t) (kv_lora);  k_pe_t = rope(k_pe_t) (qk_rope)
 *   k_h,t = [W_kb,h c_t | k_pe_t],  v_h,t = W_vb,h c_t   (W_kb,h, W_vb,h: attn_kv_b's rows of h)
 *   o_h = sum_t softmax_t(s * q_h . k_h,t) v_h,t;  out = W_o [o_0 | o_1 | ...]
 * Absorbed, which is what this file computes:
 *   q_h . k_h,t = (W_kb,h^T q_nope_h) . c_t + rope(q_pe_h) . k_pe_t = qa_h . [c_t | k_pe_t]
 *   o_h = W_vb,h (sum_t p_t c_t)
 * so a score is one dot product of length kv_lora + qk_rope against a cache row, and a value is
 * one weighted sum of cache rows followed by a [v_head x kv_lora] product.
 *
 * Layout: the cache is F32 [layer][slot][position][c (kv_lora) | rotated k_pe (qk_rope)], the same
 * on every rank (each rank computes the latent itself: W_kva and its norm are replicated); a rank
 * holds the query rows, W_kb,h, W_vb,h and attn_output's input columns of its heads only.
 * W_kb,h^T comes from attn_k_b as the file stores it (today's converter writes it transposed,
 * [qk_nope x kv_lora] rows per head); legacy files with only attn_kv_b get an F32 transposed copy
 * of the shard's heads at load. W_vb,h is read in place (attn_v_b, or attn_kv_b's rows).
 *
 * The projections of x (W_q or W_qa/W_qb, W_kva) go through matmul(); the per-head products
 * (W_kb,h^T, W_vb,h) are small matvecs run inside the attention work items with the weight
 * type's row kernel, as attn.c runs its score dot products.
 *
 * RoPE: adjacent pairs on the qk_rope part only, frequencies with YaRN's ramp when
 * rope.scaling.type is yarn. The score scale is mscale^2 / sqrt(qk_nope + qk_rope) with llama.cpp's
 * mscale (see mla_new), which is 1 / sqrt(key length) when there is no scaling.
 *
 * Invariant: each slot's cache rows [0, pos) of every layer of the shard are filled;
 * mla_attention() writes the (slot, position) rows of its batch's tokens, then token b reads only
 * rows [0, bpos[b]] of its own slot bslot[b] (a batch may mix sequences).
 */
#include "common/common.h"
#include "infer/model/model_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct mla_layer {
	int n_heads;      /* this shard's heads */
	wmat_t wq;        /* Lite: [n_heads*(qk_nope+qk_rope) x dim], the shard's rows */
	wmat_t wq_a;      /* [q_lora x dim], whole: every rank computes the low-rank query */
	float *q_a_norm;  /* [q_lora] */
	wmat_t wq_b;      /* [n_heads*(qk_nope+qk_rope) x q_lora], the shard's rows */
	wmat_t wkv_a;     /* [kv_lora + qk_rope x dim], whole: the latent is replicated */
	float *kv_a_norm; /* [kv_lora] */
	wmat_t *kb;      /* [n_heads] of [kv_lora x qk_nope] = W_kb,h^T (absorbed into the query) */
	wmat_t *vb;      /* [n_heads] of [v_head x kv_lora] = W_vb,h (applied after attention) */
	float *kb_own;   /* legacy attn_kv_b: the transposed F32 copy kb points into */
	wmat_t *kb_file; /* legacy: [n_heads] the attn_kv_b key rows each copy came from */
};

struct mla_state {
	int lw;         /* cache row: kv_lora + qk_rope */
	float *lat;     /* [layer1 - layer0][n_slots][n_ctx][lw] */
	float kq_scale; /* mscale^2 / sqrt(qk_nope + qk_rope) */
	float *qa;      /* [max_b][q_lora] low-rank query */
	float *kv;      /* [max_b][lw] this batch's latents */
	float *tq;      /* [threads][lw] absorbed query of one head */
	float *tl;      /* [threads][kv_lora] latent attention output of one head */
	uint8_t *tact;  /* [threads][act_stride] prepared activations for kb / vb */
	size_t act_stride;
};

/* ---- binding ------------------------------------------------------------------------------ */

int mla_bind(model_t *m, const gguf_t *g, int l, char *err, size_t errlen)
{
	layer_t *L = &m->layers[l];
	const model_meta_t *mt = &m->meta;
	const meta_mla_t *x = &mt->mla;
	int nq = m->sh.n_q_heads, h0 = m->sh.q_head0, dk = mt->head_dim;
	int kvl = x->kv_lora, nope = x->qk_nope, dv = x->v_head;
	char n[96];
	int rc;
	struct mla_layer *a = calloc(1, sizeof *a);
	if (!a || !(a->kb = calloc((size_t)nq, sizeof *a->kb)) ||
	    !(a->vb = calloc((size_t)nq, sizeof *a->vb))) {
		if (a)
			free(a->kb);
		free(a);
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	}
	L->mla = a;
	a->n_heads = nq;
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
	if (x->q_lora) {
		if ((rc = bind_mat(m, g, NAME("attn_q_a.weight"), &a->wq_a, err, errlen)) ||
		    (rc = bind_vec(g, NAME("attn_q_a_norm.weight"), 0, x->q_lora, &a->q_a_norm, err,
				   errlen)) ||
		    (rc = bind_mat(m, g, NAME("attn_q_b.weight"), &a->wq_b, err, errlen)))
			return rc;
		a->wq_b = mat_rows(a->wq_b, h0 * dk, nq * dk);
	} else {
		if ((rc = bind_mat(m, g, NAME("attn_q.weight"), &a->wq, err, errlen)))
			return rc;
		a->wq = mat_rows(a->wq, h0 * dk, nq * dk);
	}
	if ((rc = bind_mat(m, g, NAME("attn_kv_a_mqa.weight"), &a->wkv_a, err, errlen)) ||
	    (rc = bind_vec(g, NAME("attn_kv_a_norm.weight"), 0, kvl, &a->kv_a_norm, err, errlen)) ||
	    (rc = bind_mat(m, g, NAME("attn_output.weight"), &L->wo, err, errlen)) ||
	    (rc = mat_cols(g, &L->wo, h0 * dv, nq * dv, &L->wo_own, "attn_output", err, errlen)))
		return rc;
	if (x->split_kvb) {
		/* attn_k_b [n_head][kv_lora][qk_nope], attn_v_b [n_head][v_head][kv_lora] */
		wmat_t kb, vb;
		if ((rc = bind_mat(m, g, NAME("attn_k_b.weight"), &kb, err, errlen)) ||
		    (rc = bind_mat(m, g, NAME("attn_v_b.weight"), &vb, err, errlen)))
			return rc;
		const gguf_tensor_t *tk = gguf_find_tensor(g, NAME("attn_k_b.weight"));
		const gguf_tensor_t *tv = gguf_find_tensor(g, NAME("attn_v_b.weight"));
		if (kb.row_bytes * (uint64_t)kvl * mt->n_heads > tk->nbytes ||
		    vb.row_bytes * (uint64_t)dv * mt->n_heads > tv->nbytes)
			return sh_fail(err, errlen, SH_EFORMAT,
				       "blk.%d: attn_k_b or attn_v_b is truncated", l);
		for (int h = 0; h < nq; h++) {
			a->kb[h] = mat_rows(kb, (h0 + h) * kvl, kvl);
			a->vb[h] = mat_rows(vb, (h0 + h) * dv, dv);
		}
	} else {
		/* attn_kv_b: head h's rows are [k_nope (qk_nope) | v (v_head)], kv_lora columns */
		wmat_t kvb;
		if ((rc = bind_mat(m, g, NAME("attn_kv_b.weight"), &kvb, err, errlen)))
			return rc;
		float *row = malloc((size_t)kvl * sizeof *row);
		a->kb_own = malloc((size_t)nq * kvl * nope * sizeof(float));
		a->kb_file = calloc((size_t)nq, sizeof *a->kb_file);
		if (!row || !a->kb_own || !a->kb_file) {
			free(row);
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory for attn_kv_b");
		}
		const quant_ops_t *f32 = quant_ops(QT_F32);
		for (int h = 0; h < nq; h++) {
			int r0 = (h0 + h) * (nope + dv);
			float *kt = a->kb_own + (size_t)h * kvl * nope;
			for (int j = 0; j < nope; j++) {
				kvb.dequant(kvb.data + (size_t)(r0 + j) * kvb.row_bytes, row, kvl);
				for (int c = 0; c < kvl; c++)
					kt[(size_t)c * nope + j] = row[c];
			}
			a->kb[h] = (wmat_t){.data = (const uint8_t *)kt,
					    .type = QT_F32,
					    .rows = kvl,
					    .cols = nope,
					    .row_bytes = (size_t)nope * sizeof(float),
					    .ops = f32,
					    .dequant = quant_ops_ref(QT_F32)->dequant};
			a->vb[h] = mat_rows(kvb, r0 + nope, dv);
			a->kb_file[h] = mat_rows(kvb, r0, nope);
		}
		free(row);
	}
#undef NAME
	return 0;
}

/* ---- state -------------------------------------------------------------------------------- */

int mla_new(model_t *m, char *err, size_t errlen)
{
	const model_meta_t *mt = &m->meta;
	const meta_mla_t *x = &mt->mla;
	struct mla_state *s = calloc(1, sizeof *s);
	if (!s)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	m->mla = s;
	int nt = pool_threads(m->pool), kvl = x->kv_lora, rd = x->qk_rope;
	size_t nl = (size_t)(m->sh.layer1 - m->sh.layer0), b = (size_t)m->max_b;
	s->lw = kvl + rd;
	/* activation scratch for the per-head products: the widest input of any type used */
	size_t ab = 0;
	for (int l = m->sh.layer0; l < m->sh.layer1; l++) {
		const struct mla_layer *a = m->layers[l].mla;
		for (int h = 0; h < a->n_heads; h++)
			ab = MAX(ab, MAX(quant_act_bytes(a->kb[h].type, a->kb[h].cols),
					 quant_act_bytes(a->vb[h].type, a->vb[h].cols)));
	}
	s->act_stride = (ab + 63) & ~(size_t)63;
	s->lat = malloc(nl * (size_t)m->n_slots * (size_t)m->n_ctx * (size_t)s->lw * sizeof(float));
	s->qa = malloc(b * (size_t)MAX(x->q_lora, 1) * sizeof(float));
	s->kv = malloc(b * (size_t)s->lw * sizeof(float));
	s->tq = malloc((size_t)nt * s->lw * sizeof(float));
	s->tl = malloc((size_t)nt * kvl * sizeof(float));
	s->tact = aligned_alloc(64, (size_t)nt * MAX(s->act_stride, 64));
	if (!s->lat || !s->qa || !s->kv || !s->tq || !s->tl || !s->tact)
		return sh_fail(err, errlen, SH_ENOMEM,
			       "out of memory for a latent cache of %d x %d slots", m->n_ctx,
			       m->n_slots);

	/* llama.cpp's scaling, reduced (llama-context.cpp's cparams set-up, ggml's rope_yarn and
	 * deepseek2.cpp's kq_scale): f = rope.scaling.factor, L = yarn_log_multiplier as stored.
	 * YaRN: the rotation magnitude is 1 when L != 0 (deepseek2 special case: the mscale /
	 * mscale_all_dim ratio is 1), else 1 + 0.1 ln f; mscale = that magnitude * (1 + L ln f).
	 * Linear: plain interpolation, magnitude 1, mscale = (1 + 0.1 ln f)(1 + L ln f) (the graph
	 * multiplies by 1 + 0.1 ln(1 / freq_scale) whatever the type). None: no scaling. */
	float fs = 1.0f;
	if (mt->rope_scaling != META_SCALING_NONE && mt->rope_factor != 0)
		fs = 1.0f / mt->rope_factor;
	int yarn = mt->rope_scaling == META_SCALING_YARN;
	float lnf = logf(1.0f / fs), mag = 1.0f;
	if (yarn && mt->yarn_log_mul == 0 && 1.0f / fs > 1.0f)
		mag = 1.0f + 0.1f * lnf;
	float org = yarn ? mag : 1.0f + 0.1f * lnf;
	float ms = org * (1.0f + mt->yarn_log_mul * lnf);
	m->rope_mag = mag;
	s->kq_scale = ms * ms / sqrtf((float)mt->head_dim);
	rope_freqs(mt, mt->rope_base, fs, yarn, m->inv_freq); /* rope_dim = qk_rope */
	return 0;
}

void mla_free(model_t *m)
{
	if (m->layers)
		for (int l = 0; l < m->meta.n_layers; l++) {
			struct mla_layer *a = m->layers[l].mla;
			if (!a)
				continue;
			free(a->q_a_norm);
			free(a->kv_a_norm);
			free(a->kb);
			free(a->vb);
			free(a->kb_own);
			free(a->kb_file);
			free(a);
			m->layers[l].mla = NULL;
		}
	struct mla_state *s = m->mla;
	if (!s)
		return;
	free(s->lat);
	free(s->qa);
	free(s->kv);
	free(s->tq);
	free(s->tl);
	free(s->tact);
	free(s);
	m->mla = NULL;
}

size_t mla_kv_bytes_per_pos(const model_meta_t *meta, int n_layers)
{
	return (size_t)n_layers * (size_t)(meta->mla.kv_lora + meta->mla.qk_rope) * sizeof(float);
}

uint64_t mla_layer_bytes(const layer_t *L)
{
	const struct mla_layer *a = L->mla;
	if (!a)
		return 0;
	const wmat_t *w[] = {&a->wq, &a->wq_a, &a->wq_b, &a->wkv_a};
	uint64_t b = 0;
	for (size_t i = 0; i < ARRAY_LEN(w); i++)
		b += w[i]->row_bytes * (uint64_t)w[i]->rows;
	for (int h = 0; h < a->n_heads; h++)
		b += a->kb[h].row_bytes * (uint64_t)a->kb[h].rows +
		     a->vb[h].row_bytes * (uint64_t)a->vb[h].rows;
	return b;
}

int mla_weight_ranges(const layer_t *L, const uint8_t *base, model_range_t **r, int *n)
{
	const struct mla_layer *a = L->mla;
	const wmat_t *w[] = {&a->wq, &a->wq_a, &a->wq_b, &a->wkv_a};
	int rc = 0;
	for (size_t i = 0; !rc && i < ARRAY_LEN(w); i++)
		if (w[i]->rows)
			rc = mat_ranges(w[i], base, r, n);
	for (int h = 0; !rc && h < a->n_heads; h++)
		if (!(rc = mat_ranges(a->kb_file ? &a->kb_file[h] : &a->kb[h], base, r, n)))
			rc = mat_ranges(&a->vb[h], base, r, n);
	return rc;
}

/* ---- attention ---------------------------------------------------------------------------- */

/* Rotates the qk_rope values at h by token b's angles (YaRN's frequencies are in m->inv_freq,
 * its magnitude in m->rope_mag). */
static void mla_rope(const model_t *m, float *h, int b)
{
	rope(m, h, b);
}

/* out[w->rows] = w . x[w->cols], on the calling thread (act: that thread's scratch). */
static void mla_matvec(float *out, const wmat_t *w, const float *x, uint8_t *act)
{
	quant_act_t a;
	quant_act_prepare(w->type, x, w->cols, act, &a);
	w->ops->rows(out, w->data, w->row_bytes, w->rows, &a, w->cols);
}

typedef struct mla_job {
	model_t *m;
	const struct mla_layer *a;
	int layer, B;
} mla_job_t;

/* Row pos of slot in layer lc of the latent cache. */
static float *lat_at(const model_t *m, int lc, int slot, int pos)
{
	size_t row =
	    ((size_t)lc * (size_t)m->n_slots + (size_t)slot) * (size_t)m->n_ctx + (size_t)pos;
	return m->mla->lat + row * (size_t)m->mla->lw;
}

/* Work item i = (token b, local head h): att[b][h] = W_vb,h sum_t p_t c_t with
 * p = softmax(s * [W_kb,h^T q_nope | q_pe] . [c_t | k_pe_t]) over positions [0, bpos[b]] of
 * slot bslot[b]. */
static void mla_task(void *ctx, int c, int nc, int tid)
{
	mla_job_t *j = ctx;
	model_t *m = j->m;
	const struct mla_state *s = m->mla;
	const meta_mla_t *x = &m->meta.mla;
	int nq = j->a->n_heads, dk = m->meta.head_dim, dv = x->v_head, kvl = x->kv_lora;
	int lw = s->lw;
	float *qa = s->tq + (size_t)tid * lw, *ol = s->tl + (size_t)tid * kvl;
	float *sc = m->scores + (size_t)tid * m->n_ctx;
	uint8_t *act = s->tact + (size_t)tid * s->act_stride;
	int lo, hi;
	pool_split(j->B * nq, c, nc, 1, &lo, &hi);
	for (int it = lo; it < hi; it++) {
		int b = it / nq, h = it % nq, T = m->bpos[b] + 1;
		const float *lat = lat_at(m, j->layer, m->bslot[b], 0);
		const float *q = m->q + (size_t)b * nq * dk + (size_t)h * dk;
		/* qa = [W_kb,h^T q_nope | q_pe]: the query in the cache row's coordinates */
		mla_matvec(qa, &j->a->kb[h], q, act);
		memcpy(qa + kvl, q + x->qk_nope, (size_t)x->qk_rope * sizeof *qa);
		quant_act_t qf = {.type = QT_F32, .f = qa};
		m->f32->rows(sc, (const uint8_t *)lat, (size_t)lw * sizeof(float), T, &qf, lw);
		float mx = -INFINITY;
		for (int t = 0; t < T; t++) {
			sc[t] *= s->kq_scale;
			mx = fmaxf(mx, sc[t]);
		}
		float inv = 1.0f / m->expsum(sc, T, mx);
		for (int t = 0; t < T; t++)
			sc[t] *= inv;
		m->wsum(ol, sc, lat, (size_t)lw, T, kvl); /* sum_t p_t c_t */
		mla_matvec(m->att + (size_t)b * nq * dv + (size_t)h * dv, &j->a->vb[h], ol, act);
	}
}

void mla_attention(model_t *m, layer_t *L, int lc, int B)
{
	const model_meta_t *p = &m->meta;
	const meta_mla_t *x = &p->mla;
	const struct mla_layer *a = L->mla;
	struct mla_state *s = m->mla;
	int nq = a->n_heads, dk = p->head_dim, kvl = x->kv_lora, lw = s->lw;
	/* q[B][nq*dk] and the latents kv[B][lw]: the two products of xb in one dispatch */
	if (x->q_lora) {
		const wmat_t *w[2] = {&a->wq_a, &a->wkv_a};
		float *o[2] = {s->qa, s->kv};
		matmul_same_input(m, 2, w, o, m->xb, B);
		for (int b = 0; b < B; b++) {
			float *qa = s->qa + (size_t)b * x->q_lora;
			rmsnorm(qa, qa, a->q_a_norm, x->q_lora, p->rms_eps);
		}
		matmul(m, &a->wq_b, m->q, s->qa, B);
	} else {
		const wmat_t *w[2] = {&a->wq, &a->wkv_a};
		float *o[2] = {m->q, s->kv};
		matmul_same_input(m, 2, w, o, m->xb, B);
	}
	/* cache row = [rmsnorm(c) | rope(k_pe)]; rope on each head's q_pe */
	for (int b = 0; b < B; b++) {
		float *kv = s->kv + (size_t)b * lw;
		rmsnorm(kv, kv, a->kv_a_norm, kvl, p->rms_eps);
		int pos = m->bpos[b];
		mla_rope(m, kv + kvl, b);
		memcpy(lat_at(m, lc, m->bslot[b], pos), kv, (size_t)lw * sizeof *kv);
		for (int h = 0; h < nq; h++)
			mla_rope(m, m->q + (size_t)b * nq * dk + (size_t)h * dk + x->qk_nope, b);
	}
	mla_job_t j = {m, a, lc, B};
	int items = B * nq;
	pool_run(m->pool, mla_task, &j, MIN(items, 4 * pool_threads(m->pool)));
}
