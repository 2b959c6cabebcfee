/*
 * moe.c: the mixture-of-experts FFN block (Mixtral, qwen2moe, qwen3moe, deepseek2's routed and
 * shared experts), called from the one forward() in model.c for every layer that routes.
 *
 * Per token: router logits = W_r . x (+ gpt-oss's router bias; F32, router_logits), probabilities
 * (softmax or sigmoid; gpt-oss: the logits themselves), top-k by probability (+ deepseek's
 * selection bias), weights renormalised and scaled as the architecture says (gpt-oss: the
 * softmax over the k chosen logits) (moe_route), then
 * y = sum_k w_k . down_e(act(gate_e x, up_e x)) over the chosen experts e, act SiLU(g) * u or
 * gpt-oss's clamped SwiGLU with each expert's biases on gate, up and down, plus the shared
 * block (qwen2moe: times sigmoid(w_sh . x)).
 *
 * Expert parallel: a rank holds whole experts [exp0, exp0 + n_exp) and a column slice of the
 * shared block; it adds only its experts' outputs and its shared slice into the layer's FFN
 * output, which model.c's one all-reduce sums over ranks. The router is computed by the same
 * loop (router_logits) on every rank, so all ranks choose the same experts whatever their thread
 * counts.
 *
 * Batch: the tokens of a batch are grouped by expert, so each chosen expert's weights are read
 * once per batch; an expert no token chose is not read at all (decode reads k of n experts).
 *
 * Invariant: the 3-D expert tensors are only read through row views of the held experts
 * (expert e of gate/up = rows [e*F, (e+1)*F) of the [E*F x dim] matrix; of down = rows
 * [e*dim, (e+1)*dim) of [E*dim x F]); the pages of the other experts are released at bind.
 */
#include "common/common.h"
#include "infer/model/model_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct moe_layer {
	int layer;        /* its index in the model */
	float *router_tr; /* [dim][E]: the router transposed (router_logits) */
	const gguf_tensor_t *router_t, *shexp_gate_t; /* their bytes in the file */
	float *exp_bias;                              /* [E] selection bias, or NULL */
	float *shexp_gate;                            /* qwen2moe: [dim], or NULL */
	float *router_b;                              /* gpt-oss: [E] router bias, or NULL */
	float *gate_b, *up_b;           /* gpt-oss: [n_exp][F] the held experts' biases, or NULL */
	float *down_b;                  /* gpt-oss: [n_exp][dim] */
	const gguf_tensor_t *bias_t[3]; /* their tensors (read whole by every rank) */
	wmat_t gate, up;                /* [E*F x dim] */
	wmat_t down;                    /* [E*dim x F] */
	wmat_t gate_h, up_h, down_h;    /* the held experts' rows of each (repacked: moe_repack) */
	int has_sh;                     /* this rank holds a slice of the shared block */
	wmat_t sh_gate, sh_up;          /* [n_shx x dim] */
	wmat_t sh_down;                 /* [dim x n_shx] */
	uint8_t *sh_down_own;
};

#define MOE_ONE_K 16 /* more chosen experts than this take the batch path */
#define MOE_FEW_B 8  /* tokens up to this (a few sequences' decode) take moe_ffn_few */

struct moe_scratch {
	float *logits;  /* [max_b][E] */
	int *sel;       /* [max_b][K] */
	float *wt;      /* [max_b][K] */
	float *xs, *ys; /* [max_b][dim]: inputs gathered for one expert, its outputs */
	float *h, *h2;  /* [max_b][max(F, n_shx)] */
	int *tok;       /* [max_b]: the batch rows routed to the expert at hand */
	float *tw;      /* [max_b]: their weights */
	int *trace;     /* test hook (borrowed), or NULL */
	/* one token (moe_ffn_one) or a few (moe_ffn_few): the chosen experts' and the shared
	 * block's rows side by side; n_few = MOE_FEW_B x K (token, expert) pairs at most */
	float *eh, *eh2; /* [n_few][F] + [MOE_FEW_B][n_shx] (one token: [K + 1][max(F, n_shx)]) */
	float *ey;       /* [n_few + MOE_FEW_B][dim] */
	uint8_t *act;    /* [n_few + 3 MOE_FEW_B][m->act_stride]: prepared inputs */
	quant_act_t *qa; /* [n_few + 3 MOE_FEW_B]: their descriptors, then per pair */
	int *ptok;       /* [n_few]: the pairs' tokens, expert after expert (ascending) */
	float *pw;       /* [n_few]: their weights */
	wmat_t *mv;      /* [3 n_few + 3]: views of the experts' matrices */
	const wmat_t **w;
	float **o;
	int *nb;
	const quant_act_t **xa; /* [2 n_few + 2] each */
};

/* ---- routing ------------------------------------------------------------------------------ */

void moe_route(const moe_route_t *r, const float *logits, int *sel, float *w)
{
	float p[META_MAX_EXPERTS], s[META_MAX_EXPERTS];
	int E = r->n_experts;
	if (r->gating == META_GATE_SOFTMAX_WEIGHT) { /* chosen by logit, softmax over the k */
		for (int e = 0; e < E; e++)
			p[e] = logits[e];
	} else if (r->gating == META_GATE_SIGMOID) {
		for (int e = 0; e < E; e++)
			p[e] = 1.0f / (1.0f + expf(-logits[e]));
	} else {
		float mx = logits[0], sum = 0;
		for (int e = 1; e < E; e++)
			mx = MAX(mx, logits[e]);
		for (int e = 0; e < E; e++)
			sum += p[e] = expf(logits[e] - mx);
		for (int e = 0; e < E; e++)
			p[e] /= sum;
	}
	unsigned char taken[META_MAX_EXPERTS] = {0};
	for (int e = 0; e < E; e++)
		s[e] = r->bias ? p[e] + r->bias[e] : p[e];
	if (r->n_groups > 1) { /* group score = its two best; experts of the other groups are out */
		int per = E / r->n_groups;
		float gs[META_MAX_EXPERTS];
		unsigned char gtaken[META_MAX_EXPERTS] = {0};
		for (int gi = 0; gi < r->n_groups; gi++) {
			const float *x = s + gi * per;
			int b0 = 0;
			for (int j = 1; j < per; j++)
				if (x[j] > x[b0])
					b0 = j;
			int b1 = b0 ? 0 : 1;
			for (int j = 0; j < per; j++)
				if (j != b0 && x[j] > x[b1])
					b1 = j;
			gs[gi] = x[b0] + x[b1];
		}
		for (int u = 0; u < r->groups_used; u++) {
			int best = -1;
			for (int gi = 0; gi < r->n_groups; gi++)
				if (!gtaken[gi] && (best < 0 || gs[gi] > gs[best]))
					best = gi;
			gtaken[best] = 1;
		}
		for (int e = 0; e < E; e++)
			taken[e] = !gtaken[e / per];
	}
	float tot = 0;
	for (int i = 0; i < r->k; i++) { /* k is small: repeated arg-max, ties to the lower id */
		int best = -1;           /* (NaN or -inf scores from a bad file still pick one) */
		for (int e = 0; e < E; e++)
			if (!taken[e] && (best < 0 || s[e] > s[best]))
				best = e;
		sel[i] = best;
		w[i] = p[best];
		tot += p[best];
		taken[best] = 1;
	}
	if (r->gating == META_GATE_SOFTMAX_WEIGHT) { /* softmax over the chosen logits */
		float mx = w[0], sum = 0;
		for (int i = 1; i < r->k; i++)
			mx = MAX(mx, w[i]);
		for (int i = 0; i < r->k; i++)
			sum += w[i] = expf(w[i] - mx);
		for (int i = 0; i < r->k; i++)
			w[i] /= sum;
		tot = 1.0f;
	}
	float inv = r->norm ? 1.0f / MAX(tot, 6.103515625e-5f) : 1.0f;
	for (int i = 0; i < r->k; i++)
		w[i] *= inv * r->scale;
}

/* ---- binding ------------------------------------------------------------------------------ */

/* Releases the whole pages inside [p, p + n) from this process (another rank's experts). */
static void release(const uint8_t *p, size_t n)
{
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), b = ((uintptr_t)p + n) & ~(pg - 1);
	if (b > a)
		madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Rows [r0, r0 + nr) of the 2-D tensor name (rows of cols elements, any type) as F32 into
 * *out (malloc'd; nr = 0 gives NULL); *t = the tensor. */
static int bind_rows(const gguf_t *g, const char *name, int r0, int nr, int cols, float **out,
		     const gguf_tensor_t **t, char *err, size_t errlen)
{
	*t = gguf_find_tensor(g, name);
	if (!*t || (*t)->ne[0] != cols || (*t)->ne[1] < r0 + nr)
		return sh_fail(err, errlen, SH_EFORMAT, "tensor %s: expected [%d, %d]", name, cols,
			       r0 + nr);
	if (nr == 0)
		return 0;
	size_t rb = quant_row_bytes((*t)->type, cols);
	if (!(*out = malloc((size_t)nr * cols * sizeof(float))))
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	for (int r = 0; r < nr; r++)
		quant_dequant_row((*t)->type, (const uint8_t *)(*t)->data + (size_t)(r0 + r) * rb,
				  *out + (size_t)r * cols, cols);
	return 0;
}

/* A 3-D expert tensor as one [E * per x cols] matrix; releases the rows of experts outside
 * [e0, e1). */
static int bind_experts(model_t *m, const gguf_t *g, const char *name, int per, int e0, int e1,
			wmat_t *w, char *err, size_t errlen)
{
	int rc = bind_mat(m, g, name, w, err, errlen);
	if (rc)
		return rc;
	const gguf_tensor_t *t = gguf_find_tensor(g, name);
	w->rows = (int)(t->ne[1] * t->ne[2]);
	if ((uint64_t)w->row_bytes * (uint64_t)w->rows > t->nbytes)
		return sh_fail(err, errlen, SH_EFORMAT, "tensor %s is truncated", name);
	size_t eb = (size_t)per * w->row_bytes;
	release(w->data, (size_t)e0 * eb);
	release(w->data + (size_t)e1 * eb, (size_t)(m->meta.n_experts - e1) * eb);
	return 0;
}

int moe_layer_new(model_t *m, const gguf_t *g, int l, moe_layer_t **out, char *err, size_t errlen)
{
	const model_meta_t *p = &m->meta;
	const model_shard_t *sh = &m->sh;
	int D = p->dim, E = p->n_experts, F = p->ffn_exp, rc;
	char n[96];
	moe_layer_t *ml = calloc(1, sizeof *ml);
	*out = ml;
	if (!ml)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	ml->layer = l;
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
	const gguf_tensor_t *r = gguf_find_tensor(g, NAME("ffn_gate_inp.weight"));
	if (!r || r->ne[0] != D || r->ne[1] != E)
		return sh_fail(err, errlen, SH_EFORMAT, "tensor %s: expected [%d, %d]", n, D, E);
	ml->router_t = r;
	float *row = malloc((size_t)D * sizeof *row);
	if (!row || !(ml->router_tr = malloc((size_t)E * D * sizeof(float)))) {
		free(row);
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	}
	size_t rb = quant_row_bytes(r->type, D);
	for (int e = 0; e < E; e++) {
		quant_dequant_row(r->type, (const uint8_t *)r->data + rb * e, row, D);
		for (int i = 0; i < D; i++)
			ml->router_tr[(size_t)i * E + e] = row[i];
	}
	free(row);
	if (gguf_find_tensor(g, NAME("exp_probs_b.bias")) &&
	    (rc = bind_vec(g, n, 0, E, &ml->exp_bias, err, errlen)))
		return rc;
	if (p->shexp_gated && (rc = bind_vec(g, NAME("ffn_gate_inp_shexp.weight"), 0, D,
					     &ml->shexp_gate, err, errlen)))
		return rc;
	ml->shexp_gate_t = p->shexp_gated ? gguf_find_tensor(g, n) : NULL;
	int e0 = sh->exp0, e1 = sh->exp0 + sh->n_exp;
	if (p->has_moe_bias) { /* gpt-oss: router bias, the held experts' rows of theirs */
		if ((rc = bind_vec(g, NAME("ffn_gate_inp.bias"), 0, E, &ml->router_b, err,
				   errlen)) ||
		    (rc = bind_rows(g, NAME("ffn_gate_exps.bias"), e0, e1 - e0, F, &ml->gate_b,
				    &ml->bias_t[0], err, errlen)) ||
		    (rc = bind_rows(g, NAME("ffn_up_exps.bias"), e0, e1 - e0, F, &ml->up_b,
				    &ml->bias_t[1], err, errlen)) ||
		    (rc = bind_rows(g, NAME("ffn_down_exps.bias"), e0, e1 - e0, D, &ml->down_b,
				    &ml->bias_t[2], err, errlen)))
			return rc;
	}
	if ((rc = bind_experts(m, g, NAME("ffn_gate_exps.weight"), F, e0, e1, &ml->gate, err,
			       errlen)) ||
	    (rc =
		 bind_experts(m, g, NAME("ffn_up_exps.weight"), F, e0, e1, &ml->up, err, errlen)) ||
	    (rc = bind_experts(m, g, NAME("ffn_down_exps.weight"), D, e0, e1, &ml->down, err,
			       errlen)))
		return rc;
	if (ml->gate.cols != D || ml->gate.rows != E * F || ml->up.rows != E * F ||
	    ml->up.cols != D || ml->down.cols != F || ml->down.rows != E * D)
		return sh_fail(err, errlen, SH_EFORMAT, "layer %d: expert tensors misshapen", l);
	ml->gate_h = mat_rows(ml->gate, e0 * F, (e1 - e0) * F);
	ml->up_h = mat_rows(ml->up, e0 * F, (e1 - e0) * F);
	ml->down_h = mat_rows(ml->down, e0 * D, (e1 - e0) * D);
	if (p->ffn_shexp && sh->n_shx > 0) {
		ml->has_sh = 1;
		if ((rc = bind_mat(m, g, NAME("ffn_gate_shexp.weight"), &ml->sh_gate, err,
				   errlen)) ||
		    (rc = bind_mat(m, g, NAME("ffn_up_shexp.weight"), &ml->sh_up, err, errlen)) ||
		    (rc = bind_mat(m, g, NAME("ffn_down_shexp.weight"), &ml->sh_down, err, errlen)))
			return rc;
		ml->sh_gate = mat_rows(ml->sh_gate, sh->shx0, sh->n_shx);
		ml->sh_up = mat_rows(ml->sh_up, sh->shx0, sh->n_shx);
		if ((rc = mat_cols(g, &ml->sh_down, sh->shx0, sh->n_shx, &ml->sh_down_own,
				   "ffn_down_shexp", err, errlen)))
			return rc;
	}
#undef NAME
	return 0;
}

int moe_repack(model_t *m, moe_layer_t *ml)
{
	/* the shared block is three plain matrices (its down projection perhaps a private column
	 * slice): left to the row kernels it was 6 % of a Qwen3.5-35B-A3B-wide decode */
	uint8_t *none = NULL;
	if (ml->has_sh && (wmat_repack_own(m, &ml->sh_gate, &none) ||
			   wmat_repack_own(m, &ml->sh_up, &none) ||
			   wmat_repack_own(m, &ml->sh_down, &ml->sh_down_own)))
		return SH_ENOMEM;
	/* one expert's rows start on a group when its width is whole groups (gpt-oss 2880,
	 * Mixtral 14336, Qwen3 768); otherwise the experts keep their rows */
	if (m->meta.ffn_exp % QR_ROWS || m->meta.dim % QR_ROWS || !m->sh.n_exp)
		return 0;
	wmat_t *w[3] = {&ml->gate_h, &ml->up_h, &ml->down_h};
	for (int i = 0; i < 3; i++) {
		int rc = wmat_repack(m, w[i], 1);
		if (rc)
			return rc;
	}
	return 0;
}

void moe_shared_mats(const moe_layer_t *ml, const wmat_t *out[3])
{
	out[0] = ml->has_sh ? &ml->sh_gate : NULL;
	out[1] = ml->has_sh ? &ml->sh_up : NULL;
	out[2] = ml->has_sh ? &ml->sh_down : NULL;
}

void moe_layer_free(moe_layer_t *ml)
{
	if (!ml)
		return;
	wmat_release(&ml->gate_h);
	wmat_release(&ml->up_h);
	wmat_release(&ml->down_h);
	wmat_release(&ml->sh_gate);
	wmat_release(&ml->sh_up);
	wmat_release(&ml->sh_down);
	free(ml->router_tr);
	free(ml->exp_bias);
	free(ml->shexp_gate);
	free(ml->router_b);
	free(ml->gate_b);
	free(ml->up_b);
	free(ml->down_b);
	free(ml->sh_down_own);
	free(ml);
}

int moe_scratch_new(model_t *m)
{
	const model_meta_t *p = &m->meta;
	size_t b = (size_t)m->max_b, w = (size_t)MAX(p->ffn_exp, MAX(m->sh.n_shx, 1));
	moe_scratch_t *s = calloc(1, sizeof *s);
	m->moe = s;
	if (!s)
		return SH_ENOMEM;
	s->logits = malloc(b * p->n_experts * sizeof(float));
	s->sel = malloc(b * p->n_experts_used * sizeof(int));
	s->wt = malloc(b * p->n_experts_used * sizeof(float));
	s->xs = malloc(b * p->dim * sizeof(float));
	s->ys = malloc(b * p->dim * sizeof(float));
	s->h = malloc(b * w * sizeof(float));
	s->h2 = malloc(b * w * sizeof(float));
	s->tok = malloc(b * sizeof(int));
	s->tw = malloc(b * sizeof(float));
	size_t k1 = (size_t)p->n_experts_used + 1, nf = (size_t)MOE_FEW_B * p->n_experts_used;
	size_t S = (size_t)m->sh.n_shx, hw = MAX(k1 * w, nf * p->ffn_exp + MOE_FEW_B * S);
	size_t na = MAX(2 * k1, nf + 3 * MOE_FEW_B), nm = 2 * nf + 2;
	s->eh = malloc(hw * sizeof(float));
	s->eh2 = malloc(hw * sizeof(float));
	s->ey = malloc(MAX(k1, nf + MOE_FEW_B) * p->dim * sizeof(float));
	s->act = aligned_alloc(64, na * m->act_stride);
	s->qa = malloc((na + 2 * nf) * sizeof *s->qa);
	s->ptok = malloc(nf * sizeof(int));
	s->pw = malloc(nf * sizeof(float));
	s->mv = malloc((3 * nf + 3) * sizeof *s->mv);
	s->w = malloc(nm * sizeof *s->w);
	s->o = malloc(nm * sizeof *s->o);
	s->nb = malloc(nm * sizeof *s->nb);
	s->xa = malloc(nm * sizeof *s->xa);
	if (!s->logits || !s->sel || !s->wt || !s->xs || !s->ys || !s->h || !s->h2 || !s->tok ||
	    !s->tw || !s->eh || !s->eh2 || !s->ey || !s->act || !s->qa || !s->ptok || !s->pw ||
	    !s->mv || !s->w || !s->o || !s->nb || !s->xa)
		return SH_ENOMEM;
	return 0;
}

void moe_scratch_free(moe_scratch_t *s)
{
	if (!s)
		return;
	free(s->logits);
	free(s->sel);
	free(s->wt);
	free(s->xs);
	free(s->ys);
	free(s->h);
	free(s->h2);
	free(s->tok);
	free(s->tw);
	free(s->eh);
	free(s->eh2);
	free(s->ey);
	free(s->act);
	free(s->qa);
	free(s->ptok);
	free(s->pw);
	free(s->mv);
	free(s->w);
	free(s->o);
	free(s->nb);
	free(s->xa);
	free(s);
}

void moe_set_trace(model_t *m, int *trace)
{
	if (m->moe)
		m->moe->trace = trace;
}

uint64_t moe_bytes_per_token(const model_t *m, const moe_layer_t *ml)
{
	const model_meta_t *p = &m->meta;
	uint64_t b = (uint64_t)p->n_experts * p->dim * sizeof(float);
	if (ml->has_sh)
		b += ml->sh_gate.row_bytes * (uint64_t)ml->sh_gate.rows * 2 +
		     quant_row_bytes(ml->sh_down.type, ml->sh_down.cols) *
			 (uint64_t)ml->sh_down.rows;
	/* one expert's three matrices, times the expected number of held experts a token uses */
	uint64_t one = (ml->gate.row_bytes + ml->up.row_bytes) * (uint64_t)p->ffn_exp +
		       ml->down.row_bytes * (uint64_t)p->dim;
	b += one * (uint64_t)m->sh.n_exp * p->n_experts_used / p->n_experts;
	return b;
}

int moe_weight_ranges(const model_t *m, const moe_layer_t *ml, const uint8_t *base,
		      model_range_t **r, int *n)
{
	const gguf_tensor_t *v[5] = {ml->router_t, ml->shexp_gate_t, ml->bias_t[0], ml->bias_t[1],
				     ml->bias_t[2]}; /* read whole everywhere */
	int rc = 0, F = m->meta.ffn_exp, D = m->meta.dim, e0 = m->sh.exp0, ne = m->sh.n_exp;
	for (int i = 0; i < 5 && !rc; i++)
		if (v[i])
			rc = range_push(r, n, (uint64_t)((const uint8_t *)v[i]->data - base),
					v[i]->nbytes, 0);
	if (ne > 0) { /* the held experts: one run of rows in each 3-D tensor */
		wmat_t g = mat_rows(ml->gate, e0 * F, ne * F), u = mat_rows(ml->up, e0 * F, ne * F);
		wmat_t d = mat_rows(ml->down, e0 * D, ne * D);
		if (!rc)
			rc = mat_ranges(&g, base, r, n);
		if (!rc)
			rc = mat_ranges(&u, base, r, n);
		if (!rc)
			rc = mat_ranges(&d, base, r, n);
	}
	if (ml->has_sh) {
		const wmat_t *w[3] = {&ml->sh_gate, &ml->sh_up, &ml->sh_down};
		for (int i = 0; i < 3 && !rc; i++)
			rc = mat_ranges(w[i], base, r, n);
	}
	return rc;
}

/* ---- the block ---------------------------------------------------------------------------- */

/* h[n] = act(gate h, up h2): SiLU(h) * h2, or gpt-oss's clamped SwiGLU (ggml-cpu's
 * ggml_compute_forward_swiglu_oai_f32: x = min(h, limit), y = clamp(h2, -limit, limit),
 * x / (1 + exp(-alpha x)) * (y + 1)). */
static void swiglu(const model_meta_t *p, float *h, const float *h2, int n)
{
	if (p->exp_act == META_ACT_SWIGLU_OAI) {
		float a = p->act_alpha, lim = p->act_limit;
		for (int i = 0; i < n; i++) {
			float x = MIN(h[i], lim), y = MAX(-lim, MIN(h2[i], lim));
			h[i] = x / (1.0f + expf(a * -x)) * (y + 1.0f);
		}
		return;
	}
	for (int i = 0; i < n; i++)
		h[i] = h[i] / (1.0f + expf(-h[i])) * h2[i];
}

/* x[n][w] += b[w] for each of the n rows (an expert's bias on its tokens' outputs). */
static void add_bias(float *x, const float *b, int n, int w)
{
	for (int i = 0; b && i < n; i++)
		for (int j = 0; j < w; j++)
			x[(size_t)i * w + j] += b[j];
}

static float dot(const float *a, const float *b, int n)
{
	float s = 0;
	for (int i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* moe_ffn_one's step between its two dispatches, chunk i for block i: the expert's gate and up
 * biases (gpt-oss), the activation, and its row prepared for the down projection. On the main
 * thread alone this was the longest wait of the pool's threads in a gpt-oss decode step (24 us
 * per layer: expf over every chosen expert's FFN width); each element is computed as before,
 * so the bits are too. */
typedef struct moe_act_job {
	model_t *m;
	const moe_layer_t *ml;
	moe_scratch_t *s;
	const int *le;       /* local expert of block i < n */
	const wmat_t *g, *d; /* block i's gate (its rows: the width) and down */
	int n;               /* blocks that are experts (the shared block after them) */
	size_t W;            /* floats between blocks in eh, eh2 */
} moe_act_job_t;

static void moe_act_task(void *ctx, int i, int nc, int tid)
{
	moe_act_job_t *j = ctx;
	const model_meta_t *p = &j->m->meta;
	const moe_layer_t *ml = j->ml;
	int F = p->ffn_exp;
	float *h = j->s->eh + i * j->W, *h2 = j->s->eh2 + i * j->W;
	(void)nc, (void)tid;
	if (i < j->n) { /* gpt-oss: the expert's biases */
		add_bias(h, ml->gate_b ? ml->gate_b + (size_t)j->le[i] * F : NULL, 1, F);
		add_bias(h2, ml->up_b ? ml->up_b + (size_t)j->le[i] * F : NULL, 1, F);
	}
	swiglu(p, h, h2, j->g[i].rows);
	quant_act_prepare(j->d[i].type, h, j->d[i].cols, j->s->act + (size_t)i * j->m->act_stride,
			  &j->s->qa[i]);
}

/* One token (decode): the chosen held experts' gate and up and the shared block's in one pool
 * dispatch over the one prepared input, then their down projections in another (each pool run
 * wakes the threads; one per matrix left them waiting more than working on a 0.5B MoE); every
 * output element is the same dot as moe_ffn's batch path computes, and the weighted sum adds
 * the experts in the same (ascending) order, so the bits are those of any batch. */
static void moe_ffn_one(model_t *m, const moe_layer_t *ml)
{
	const model_meta_t *p = &m->meta;
	moe_scratch_t *s = m->moe;
	int D = p->dim, K = p->n_experts_used, F = p->ffn_exp, n = 0;
	size_t W = (size_t)MAX(F, MAX(m->sh.n_shx, 1));
	const float *xb = m->xb;
	float *out = m->xb2;
	int le[MOE_ONE_K];
	float tw[MOE_ONE_K];
	for (int e = m->sh.exp0; e < m->sh.exp0 + m->sh.n_exp; e++) /* ascending, as the batch */
		for (int k = 0; k < K; k++)
			if (s->sel[k] == e) {
				le[n] = e - m->sh.exp0;
				tw[n++] = s->wt[k];
			}
	int nm = n + ml->has_sh;
	if (!nm) {
		memset(out, 0, (size_t)D * sizeof *out);
		return;
	}
	wmat_t g[MOE_ONE_K + 1], u[MOE_ONE_K + 1], d[MOE_ONE_K + 1];
	const wmat_t *w[2 * (MOE_ONE_K + 1)];
	float *o[2 * (MOE_ONE_K + 1)];
	const float *x[2 * (MOE_ONE_K + 1)];
	for (int i = 0; i < n; i++) {
		g[i] = mat_rows(ml->gate_h, le[i] * F, F);
		u[i] = mat_rows(ml->up_h, le[i] * F, F);
		d[i] = mat_rows(ml->down_h, le[i] * D, D);
	}
	if (ml->has_sh) {
		g[n] = ml->sh_gate;
		u[n] = ml->sh_up;
		d[n] = ml->sh_down;
	}
	for (int i = 0; i < nm; i++) {
		w[2 * i] = &g[i];
		w[2 * i + 1] = &u[i];
		o[2 * i] = s->eh + i * W;
		o[2 * i + 1] = s->eh2 + i * W;
		x[2 * i] = x[2 * i + 1] = xb;
	}
	matmul_each(m, 2 * nm, w, o, x, s->act);
	/* each block's activation and its down projection's input, one block per chunk */
	const quant_act_t *xa[MOE_ONE_K + 1];
	int nb[MOE_ONE_K + 1];
	moe_act_job_t aj = {m, ml, s, le, g, d, n, W};
	pool_run(m->pool, moe_act_task, &aj, nm);
	for (int i = 0; i < nm; i++) {
		w[i] = &d[i];
		o[i] = s->ey + (size_t)i * D;
		xa[i] = &s->qa[i];
		nb[i] = 1;
	}
	matmul_each_acts(m, nm, w, o, nb, xa);
	memset(out, 0, (size_t)D * sizeof *out);
	for (int i = 0; i < n; i++) {
		float *y = s->ey + (size_t)i * D;
		add_bias(y, ml->down_b ? ml->down_b + (size_t)le[i] * D : NULL, 1, D);
		for (int j = 0; j < D; j++)
			out[j] += tw[i] * y[j];
	}
	if (ml->has_sh) {
		float gsc = 1.0f;
		if (ml->shexp_gate)
			gsc = 1.0f / (1.0f + expf(-dot(ml->shexp_gate, xb, D)));
		const float *y = s->ey + (size_t)n * D;
		for (int j = 0; j < D; j++)
			out[j] += gsc * y[j];
	}
}

/* A few tokens (continuous batching's decode of several sequences): the same two dispatches as
 * moe_ffn_one, each chosen expert over the tokens that chose it (its weights read once); each
 * token's row prepared once for gate and up of all its experts. The weighted sum adds each
 * token's experts in ascending order, as the batch path below. Falls back to that path (returns
 * 0) when gate and up differ in type. */
static int moe_ffn_few(model_t *m, const moe_layer_t *ml, int B)
{
	const model_meta_t *p = &m->meta;
	moe_scratch_t *s = m->moe;
	int D = p->dim, K = p->n_experts_used, F = p->ffn_exp, n = 0, np = 0;
	int S = ml->has_sh ? ml->sh_gate.rows : 0;
	if (ml->gate_h.type != ml->up_h.type)
		return 0;
	const float *xb = m->xb;
	float *out = m->xb2;
	uint8_t *act = s->act;
	quant_act_t *qg = s->qa, *qs = s->qa + B, *qd = s->qa + 2 * B; /* xb for gate/up, shared */
	quant_act_t *qp = qd + (size_t)B * K + B; /* per pair: its token's xb for gate/up */
	int le[MOE_FEW_B * MOE_ONE_K], p0[MOE_FEW_B * MOE_ONE_K + 1];
	for (int e = m->sh.exp0; e < m->sh.exp0 + m->sh.n_exp; e++) { /* ascending, as below */
		int start = np;
		for (int b = 0; b < B; b++)
			for (int k = 0; k < K; k++)
				if (s->sel[b * K + k] == e) {
					s->ptok[np] = b;
					s->pw[np++] = s->wt[b * K + k];
				}
		if (np > start)
			le[n] = e - m->sh.exp0, p0[n++] = start;
	}
	p0[n] = np;
	for (int b = 0; b < B; b++, act += m->act_stride)
		quant_act_prepare(ml->gate_h.type, xb + (size_t)b * D, D, act, &qg[b]);
	if (ml->has_sh)
		for (int b = 0; b < B; b++, act += m->act_stride)
			quant_act_prepare(ml->sh_gate.type, xb + (size_t)b * D, D, act, &qs[b]);
	for (int i = 0; i < np; i++)
		qp[i] = qg[s->ptok[i]];
	int nm = 0;
	wmat_t *v = s->mv;
	for (int i = 0; i < n; i++, v += 3) {
		int c = p0[i + 1] - p0[i];
		v[0] = mat_rows(ml->gate_h, le[i] * F, F);
		v[1] = mat_rows(ml->up_h, le[i] * F, F);
		v[2] = mat_rows(ml->down_h, le[i] * D, D);
		for (int g = 0; g < 2; g++, nm++) {
			s->w[nm] = &v[g];
			s->o[nm] = (g ? s->eh2 : s->eh) + (size_t)p0[i] * F;
			s->nb[nm] = c;
			s->xa[nm] = qp + p0[i];
		}
	}
	if (ml->has_sh) {
		const wmat_t *sw[2] = {&ml->sh_gate, &ml->sh_up};
		for (int g = 0; g < 2; g++, nm++) {
			s->w[nm] = sw[g];
			s->o[nm] = (g ? s->eh2 : s->eh) + (size_t)np * F;
			s->nb[nm] = B;
			s->xa[nm] = qs;
		}
	}
	matmul_each_acts(m, nm, s->w, s->o, s->nb, s->xa);
	/* the activations, then the down projections' inputs */
	nm = 0;
	v = s->mv;
	for (int i = 0; i < n; i++, v += 3) {
		int c = p0[i + 1] - p0[i];
		float *h = s->eh + (size_t)p0[i] * F, *h2 = s->eh2 + (size_t)p0[i] * F;
		add_bias(h, ml->gate_b ? ml->gate_b + (size_t)le[i] * F : NULL, c, F);
		add_bias(h2, ml->up_b ? ml->up_b + (size_t)le[i] * F : NULL, c, F);
		swiglu(p, h, h2, c * F);
		for (int r = 0; r < c; r++, act += m->act_stride)
			quant_act_prepare(v[2].type, h + (size_t)r * F, F, act, &qd[p0[i] + r]);
		s->w[nm] = &v[2];
		s->o[nm] = s->ey + (size_t)p0[i] * D;
		s->nb[nm] = c;
		s->xa[nm++] = qd + p0[i];
	}
	if (ml->has_sh) {
		float *h = s->eh + (size_t)np * F;
		swiglu(p, h, s->eh2 + (size_t)np * F, B * S);
		for (int b = 0; b < B; b++, act += m->act_stride)
			quant_act_prepare(ml->sh_down.type, h + (size_t)b * S, S, act, &qd[np + b]);
		s->w[nm] = &ml->sh_down;
		s->o[nm] = s->ey + (size_t)np * D;
		s->nb[nm] = B;
		s->xa[nm++] = qd + np;
	}
	matmul_each_acts(m, nm, s->w, s->o, s->nb, s->xa);
	memset(out, 0, (size_t)B * D * sizeof *out);
	for (int i = 0; i < n; i++)
		for (int q = p0[i]; q < p0[i + 1]; q++) {
			float *y = s->ey + (size_t)q * D, *o = out + (size_t)s->ptok[q] * D;
			add_bias(y, ml->down_b ? ml->down_b + (size_t)le[i] * D : NULL, 1, D);
			for (int j = 0; j < D; j++)
				o[j] += s->pw[q] * y[j];
		}
	for (int b = 0; ml->has_sh && b < B; b++) {
		float gsc = 1.0f;
		if (ml->shexp_gate)
			gsc = 1.0f / (1.0f + expf(-dot(ml->shexp_gate, xb + (size_t)b * D, D)));
		float *o = out + (size_t)b * D;
		const float *y = s->ey + (size_t)(np + b) * D;
		for (int j = 0; j < D; j++)
			o[j] += gsc * y[j];
	}
	return 1;
}

/* lg[e] = W_r[e, :] . x for experts [e0, e1), each the plain loop's sum (dot: from 0, i
 * ascending, every product rounded and then added), 32, 16 or 4 experts side by side over the
 * transposed router: one dot is a chain of dim dependent adds (~3 cycles each), which made the
 * router alone ~2 ms a layer at 512 experts of 4096 (Qwen3.5-397B). Each expert's lane sums in
 * the same order whatever its neighbours, so a logit has the same bits in any range. */
typedef float v4f __attribute__((vector_size(16))); /* SSE2 / NEON without target flags */

/* nv x 4 experts from e: a constant nv (inlined) keeps the accumulators in registers */
static inline __attribute__((always_inline)) void router_block(const float *rt, int E, int D,
							       const float *x, float *lg, int e,
							       const int nv)
{
	v4f a[8];
	for (int k = 0; k < nv; k++)
		a[k] = (v4f){0};
	for (int i = 0; i < D; i++) {
		const float *p = rt + (size_t)i * E + e;
		v4f xi = {x[i], x[i], x[i], x[i]};
		for (int k = 0; k < nv; k++) {
			v4f r;
			memcpy(&r, p + 4 * k, sizeof r);
			a[k] += r * xi;
		}
	}
	memcpy(lg + e, a, (size_t)nv * sizeof a[0]);
}

static void router_logits(const float *rt, int E, int D, const float *x, float *lg, int e0,
			  int e1)
{
	int e = e0;
	for (; e + 32 <= e1; e += 32)
		router_block(rt, E, D, x, lg, e, 8);
	for (; e + 16 <= e1; e += 16)
		router_block(rt, E, D, x, lg, e, 4);
	for (; e + 4 <= e1; e += 4)
		router_block(rt, E, D, x, lg, e, 1);
	for (; e < e1; e++) {
		float s = 0;
		for (int i = 0; i < D; i++)
			s += rt[(size_t)i * E + e] * x[i];
		lg[e] = s;
	}
}

/* The router of B tokens on the pool: chunk c is token c / per's experts in part c % per
 * (16-expert boundaries). On the main thread alone it read the whole F32 router while the
 * other threads waited: 8 MiB a layer for Qwen3.5-397B's 512 experts of 4096. */
typedef struct router_job {
	const float *rt, *x;
	float *lg;
	int E, D, per;
} router_job_t;

static void router_task(void *ctx, int c, int nc, int tid)
{
	router_job_t *j = ctx;
	int b = c / j->per, e0, e1;
	(void)nc, (void)tid;
	pool_split(j->E, c % j->per, j->per, 16, &e0, &e1);
	router_logits(j->rt, j->E, j->D, j->x + (size_t)b * j->D, j->lg + (size_t)b * j->E, e0,
		      e1);
}

void moe_ffn(model_t *m, const moe_layer_t *ml, int B)
{
	const model_meta_t *p = &m->meta;
	moe_scratch_t *s = m->moe;
	int D = p->dim, E = p->n_experts, K = p->n_experts_used, F = p->ffn_exp;
	const float *xb = m->xb;
	float *out = m->xb2;
	moe_route_t rt = {
	    E, K, p->gating, p->exp_norm, p->exp_scale, ml->exp_bias, p->n_groups, p->groups_used};

	/* routing: logits[B][E], sel/wt[B][K] */
	router_job_t rj = {ml->router_tr, xb, s->logits, E, D,
			   MAX(1, MIN((E + 15) / 16, pool_threads(m->pool)))};
	pool_run(m->pool, router_task, &rj, B * rj.per);
	for (int b = 0; b < B; b++) {
		float *lg = s->logits + (size_t)b * E;
		for (int e = 0; e < E; e++) /* (+0 too, as before: -0 logits become +0) */
			lg[e] += ml->router_b ? ml->router_b[e] : 0.0f;
		moe_route(&rt, lg, s->sel + (size_t)b * K, s->wt + (size_t)b * K);
	}
	if (s->trace)
		memcpy(s->trace + (size_t)ml->layer * K, s->sel + (size_t)(B - 1) * K,
		       (size_t)K * sizeof(int));
	if (B == 1 && K <= MOE_ONE_K) {
		moe_ffn_one(m, ml);
		return;
	}
	if (B <= MOE_FEW_B && K <= MOE_ONE_K && moe_ffn_few(m, ml, B))
		return;
	memset(out, 0, (size_t)B * D * sizeof *out);

	/* routed experts held here: each one's tokens gathered, its weights read once */
	for (int e = m->sh.exp0; e < m->sh.exp0 + m->sh.n_exp; e++) {
		int n = 0;
		for (int b = 0; b < B; b++)
			for (int k = 0; k < K; k++)
				if (s->sel[b * K + k] == e) {
					s->tok[n] = b;
					s->tw[n++] = s->wt[b * K + k];
				}
		if (!n)
			continue;
		for (int i = 0; i < n; i++)
			memcpy(s->xs + (size_t)i * D, xb + (size_t)s->tok[i] * D,
			       (size_t)D * sizeof *xb);
		int le = e - m->sh.exp0; /* its rows in the held views (and their copies) */
		wmat_t g = mat_rows(ml->gate_h, le * F, F), u = mat_rows(ml->up_h, le * F, F);
		wmat_t d = mat_rows(ml->down_h, le * D, D);
		const wmat_t *gu[2] = {&g, &u};
		float *gu_out[2] = {s->h, s->h2};
		matmul_same_input(m, 2, gu, gu_out, s->xs, n); /* h, h2 [n][F] */
		/* gpt-oss: the expert's biases */
		add_bias(s->h, ml->gate_b ? ml->gate_b + (size_t)le * F : NULL, n, F);
		add_bias(s->h2, ml->up_b ? ml->up_b + (size_t)le * F : NULL, n, F);
		swiglu(p, s->h, s->h2, n * F);
		matmul(m, &d, s->ys, s->h, n); /* ys [n][D] */
		add_bias(s->ys, ml->down_b ? ml->down_b + (size_t)le * D : NULL, n, D);
		for (int i = 0; i < n; i++) {
			float *o = out + (size_t)s->tok[i] * D;
			const float *y = s->ys + (size_t)i * D;
			for (int j = 0; j < D; j++)
				o[j] += s->tw[i] * y[j];
		}
	}

	/* this rank's columns of the shared block, over the whole batch */
	if (ml->has_sh) {
		int S = ml->sh_gate.rows;
		const wmat_t *gu[2] = {&ml->sh_gate, &ml->sh_up};
		float *gu_out[2] = {s->h, s->h2};
		matmul_same_input(m, 2, gu, gu_out, xb, B); /* h, h2 [B][S] */
		swiglu(p, s->h, s->h2, B * S);
		matmul(m, &ml->sh_down, s->ys, s->h, B); /* ys [B][D] */
		for (int b = 0; b < B; b++) {
			float gsc = 1.0f;
			if (ml->shexp_gate)
				gsc = 1.0f /
				      (1.0f + expf(-dot(ml->shexp_gate, xb + (size_t)b * D, D)));
			float *o = out + (size_t)b * D;
			const float *y = s->ys + (size_t)b * D;
			for (int j = 0; j < D; j++)
				o[j] += gsc * y[j];
		}
	}
}
