/*
 * ref_dense.h: a plain-C reference forward pass, one token at a time, for the llama-shaped
 * families that differ by a few steps: sliding-window attention (test_swa), Gemma 3 and GLM-4.x
 * MoE (test_gemma, test_glm). Written from llama.cpp's graphs, not from the engine: weights
 * dequantized to F32 from the file, double sums, the whole KV history kept and the window applied
 * as a mask (llama_hparams::is_masked_swa, standard: key p0 is seen from p when p - p0 < W).
 * Quantized files: each matrix's input rounded through Q8_0 first where llama.cpp's CPU backend
 * quantizes it (ref_mv_act), so the reference computes what llama.cpp does and only summation
 * order and the KV cache's format stand between it and the engine.
 *
 *   llama     src/models/llama.cpp: x += Wo attn(rope(Wq n), rope(Wk n), Wv n); x += ffn(n)
 *   gemma3    src/models/gemma3.cpp: x = embd * sqrt(dim); q/k RMS-normed per head; SWA
 *             layers rope with rope.freq_base_swa, the others with rope.freq_base and the
 *             linear scale; post_attention_norm and post_ffw_norm on each branch's output;
 *             GELU(gate) * up (ggml's CPU GELU reads an F16 table: input and output rounded to
 *             F16, ggml-cpu/vec.h ggml_vec_geglu_f32, so the reference rounds the same way);
 *             optional final_logit_softcapping
 *   glm4moe   src/models/glm4-moe.cpp: q/k/v biases, optional q/k norms, NEOX rope on the first
 *             rope.dimension_count dims, the FFN input normed by post_attention_norm, layers
 *             from leading_dense_block_count on route (sigmoid, exp_probs_b for the choice
 *             only, weights renormalised and scaled, llama-graph.cpp build_moe_ffn) plus the
 *             shared expert.
 * Test code only.
 */
#ifndef SHOAL_TEST_REF_DENSE_H
#define SHOAL_TEST_REF_DENSE_H

#include "infer/model/meta.h"
#include "infer/quant/quant.h"
#include "model_fix.h"
#include "ref_util.h"

#include <stdio.h>

#define RD_MAXL 8
#define RD_MAXD 1024

typedef struct rd {
	const model_meta_t *p;
	int ctx, neox, gemma, glm;
	float *embd, *out_norm, *out;
	struct rd_layer {
		float *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *qn, *kn;
		float *post_attn, *ffn_norm, *post_ffn;
		float *gate, *up, *down;                   /* dense FFN */
		float *router, *bias, *gexp, *uexp, *dexp; /* routed experts */
		float *sgate, *sup, *sdown;                /* shared expert */
		float *kc, *vc;                            /* [ctx][kvd]: every position */
	} L[RD_MAXL];
	int choice[RD_MAXL][8]; /* the last token's experts per layer */
	/* the layers' matrices (all of one type in mkmodel's files but the F32 router) and the
	 * output take Q8_0 activations: their inputs go through ref_q8_0_round as llama.cpp's */
	int q8, q8_out;
} rd_t;

static inline void rd_open(rd_t *R, const gguf_t *g, const model_meta_t *p, int ctx)
{
	memset(R, 0, sizeof *R);
	R->p = p;
	R->ctx = ctx;
	R->gemma = !strcmp(p->arch_name, "gemma3");
	R->glm = !strcmp(p->arch_name, "glm4moe");
	R->neox = strcmp(p->arch_name, "llama") != 0;
	R->embd = ref_deq(g, "token_embd.weight");
	R->out_norm = ref_deq(g, "output_norm.weight");
	R->out = ref_deq(g, "output.weight");
	R->q8 = ref_q8_act(g, "blk.0.attn_q.weight");
	R->q8_out = ref_q8_act(g, R->out ? "output.weight" : "token_embd.weight");
	char n[96];
	for (int l = 0; l < p->n_layers && l < RD_MAXL; l++) {
		struct rd_layer *L = &R->L[l];
#define D(f, s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), L->f = ref_deq(g, n))
		D(attn_norm, "attn_norm.weight");
		D(wq, "attn_q.weight");
		D(wk, "attn_k.weight");
		D(wv, "attn_v.weight");
		D(wo, "attn_output.weight");
		D(bq, "attn_q.bias");
		D(bk, "attn_k.bias");
		D(bv, "attn_v.bias");
		D(qn, "attn_q_norm.weight");
		D(kn, "attn_k_norm.weight");
		D(post_attn, "post_attention_norm.weight");
		D(ffn_norm, "ffn_norm.weight");
		D(post_ffn, "post_ffw_norm.weight");
		D(gate, "ffn_gate.weight");
		D(up, "ffn_up.weight");
		D(down, "ffn_down.weight");
		D(router, "ffn_gate_inp.weight");
		D(bias, "exp_probs_b.bias");
		D(gexp, "ffn_gate_exps.weight");
		D(uexp, "ffn_up_exps.weight");
		D(dexp, "ffn_down_exps.weight");
		D(sgate, "ffn_gate_shexp.weight");
		D(sup, "ffn_up_shexp.weight");
		D(sdown, "ffn_down_shexp.weight");
#undef D
		int kvd = p->n_kv_heads * p->head_dim;
		L->kc = calloc((size_t)ctx * kvd, sizeof(float));
		L->vc = calloc((size_t)ctx * kvd, sizeof(float));
	}
}

static inline void rd_close(rd_t *R)
{
	free(R->embd);
	free(R->out_norm);
	free(R->out);
	for (int l = 0; l < RD_MAXL; l++) {
		float **f = &R->L[l].attn_norm;
		for (size_t i = 0; i < sizeof R->L[l] / sizeof(float *); i++)
			free(f[i]);
	}
	memset(R, 0, sizeof *R);
}

/* Rotates the first rope_dim values of h by pos (base and linear scale of the layer's kind). */
static inline void rd_rope(const rd_t *R, float *h, int pos, int swa)
{
	const model_meta_t *p = R->p;
	int rd = p->rope_dim, half = rd / 2;
	double base = swa ? p->rope_base_swa : p->rope_base;
	double sc = swa ? p->rope_scale_swa : p->rope_scale;
	for (int i = 0; i < half; i++) {
		double a = pos * sc * pow(base, -2.0 * i / rd);
		int i0 = R->neox ? i : 2 * i, i1 = R->neox ? i + half : 2 * i + 1;
		double x0 = h[i0], x1 = h[i1];
		h[i0] = (float)(x0 * cos(a) - x1 * sin(a));
		h[i1] = (float)(x0 * sin(a) + x1 * cos(a));
	}
}

/* ggml's CPU GELU (tanh form) through its F16 table. */
static inline double rd_gelu(float x)
{
	if (x <= -10.0f)
		return 0;
	if (x >= 10.0f)
		return x;
	float h = quant_f16_to_f32(quant_f32_to_f16(x)); /* the table's entry, in float */
	float y =
	    0.5f * h *
	    (1.0f + tanhf(0.79788456080286535587989211986876f * h * (1.0f + 0.044715f * h * h)));
	return quant_f16_to_f32(quant_f32_to_f16(y));
}

/* y[D] = down(act(gate x) * up x) with F hidden units. */
static inline void rd_ffn(const rd_t *R, float *y, const float *gate, const float *up,
			  const float *down, const float *x, int F)
{
	int D = R->p->dim;
	float *h = malloc((size_t)2 * F * sizeof *h);
	ref_mv_act(h, gate, x, F, D, R->q8);
	ref_mv_act(h + F, up, x, F, D, R->q8);
	for (int j = 0; j < F; j++)
		h[j] = (float)((R->gemma ? rd_gelu(h[j]) : h[j] / (1.0 + exp(-(double)h[j]))) *
			       h[F + j]);
	ref_mv_act(y, down, h, D, F, R->q8);
	free(h);
}

/* The routed experts and the shared one (glm4moe): y[D] from x[D]. */
static inline void rd_moe(rd_t *R, int l, float *y, const float *x)
{
	const model_meta_t *p = R->p;
	const struct rd_layer *L = &R->L[l];
	int D = p->dim, E = p->n_experts, K = p->n_experts_used, F = p->ffn_exp;
	float lg[512], t[RD_MAXD];
	double pr[512], s[512], w[8], wsum = 0;
	int sel[8];
	ref_mv(lg, L->router, x, E, D);
	for (int e = 0; e < E; e++) {
		pr[e] = 1.0 / (1.0 + exp(-(double)lg[e])); /* sigmoid */
		s[e] = pr[e] + (L->bias ? L->bias[e] : 0); /* the bias only chooses */
	}
	for (int i = 0; i < K; i++) {
		int b = -1;
		for (int e = 0; e < E; e++) {
			int taken = 0;
			for (int j = 0; j < i; j++)
				taken |= sel[j] == e;
			if (!taken && (b < 0 || s[e] > s[b]))
				b = e;
		}
		sel[i] = b, w[i] = pr[b], wsum += pr[b];
		R->choice[l][i] = b;
	}
	double scale = p->exp_scale != 0 ? p->exp_scale : 1;
	memset(y, 0, (size_t)D * sizeof *y);
	for (int i = 0; i < K; i++) {
		double wi = (p->exp_norm ? w[i] / fmax(wsum, 6.103515625e-5) : w[i]) * scale;
		int e = sel[i];
		rd_ffn(R, t, L->gexp + (size_t)e * F * D, L->uexp + (size_t)e * F * D,
		       L->dexp + (size_t)e * D * F, x, F);
		for (int j = 0; j < D; j++)
			y[j] += (float)(wi * t[j]);
	}
	if (L->sgate) {
		rd_ffn(R, t, L->sgate, L->sup, L->sdown, x, p->ffn_shexp);
		for (int j = 0; j < D; j++)
			y[j] += t[j];
	}
}

/* One token at pos (positions before it already stepped); logits[n_vocab]. */
static inline void rd_step(rd_t *R, int tok, int pos, float *logits)
{
	const model_meta_t *p = R->p;
	int D = p->dim, hd = p->head_dim, H = p->n_heads, KH = p->n_kv_heads, qd = H * hd,
	    kvd = KH * hd;
	static float x[RD_MAXD], xb[RD_MAXD], q[4096], k[4096], v[4096], att[4096], y[RD_MAXD];
	double *sc = malloc((size_t)(pos + 1) * sizeof *sc);
	float es = R->gemma ? sqrtf((float)D) : 1.0f;
	for (int i = 0; i < D; i++)
		x[i] = R->embd[(size_t)tok * D + i] * es;
	double ascale = p->attn_scale > 0 ? p->attn_scale : 1.0 / sqrt(hd);
	for (int l = 0; l < p->n_layers; l++) {
		struct rd_layer *L = &R->L[l];
		int swa = meta_layer_swa(p, l);
		ref_norm(xb, x, L->attn_norm, D, p->rms_eps);
		ref_mv_act(q, L->wq, xb, qd, D, R->q8);
		ref_mv_act(k, L->wk, xb, kvd, D, R->q8);
		ref_mv_act(v, L->wv, xb, kvd, D, R->q8);
		for (int i = 0; L->bq && i < qd; i++)
			q[i] += L->bq[i];
		for (int i = 0; L->bk && i < kvd; i++)
			k[i] += L->bk[i];
		for (int i = 0; L->bv && i < kvd; i++)
			v[i] += L->bv[i];
		for (int h = 0; h < H; h++) {
			if (L->qn)
				ref_norm(q + h * hd, q + h * hd, L->qn, hd, p->rms_eps);
			rd_rope(R, q + h * hd, pos, swa);
		}
		for (int h = 0; h < KH; h++) {
			if (L->kn)
				ref_norm(k + h * hd, k + h * hd, L->kn, hd, p->rms_eps);
			rd_rope(R, k + h * hd, pos, swa);
		}
		memcpy(L->kc + (size_t)pos * kvd, k, kvd * sizeof *k);
		memcpy(L->vc + (size_t)pos * kvd, v, kvd * sizeof *v);
		int lo = swa && pos - p->swa_window + 1 > 0 ? pos - p->swa_window + 1 : 0;
		for (int h = 0; h < H; h++) {
			int kh = h / (H / KH);
			for (int s = lo; s <= pos; s++) {
				double d = 0;
				for (int i = 0; i < hd; i++)
					d += (double)q[h * hd + i] *
					     L->kc[(size_t)s * kvd + kh * hd + i];
				sc[s] = d * ascale;
			}
			ref_softmax(sc + lo, pos + 1 - lo);
			for (int i = 0; i < hd; i++) {
				double a = 0;
				for (int s = lo; s <= pos; s++)
					a += sc[s] * L->vc[(size_t)s * kvd + kh * hd + i];
				att[h * hd + i] = (float)a;
			}
		}
		ref_mv_act(y, L->wo, att, D, qd, R->q8);
		if (L->post_attn && R->gemma)
			ref_norm(y, y, L->post_attn, D, p->rms_eps);
		for (int i = 0; i < D; i++)
			x[i] += y[i];

		ref_norm(xb, x, R->glm ? L->post_attn : L->ffn_norm, D, p->rms_eps);
		if (L->router)
			rd_moe(R, l, y, xb);
		else
			rd_ffn(R, y, L->gate, L->up, L->down, xb, p->ffn);
		if (L->post_ffn)
			ref_norm(y, y, L->post_ffn, D, p->rms_eps);
		for (int i = 0; i < D; i++)
			x[i] += y[i];
	}
	ref_norm(xb, x, R->out_norm, D, p->rms_eps);
	ref_mv_act(logits, R->out ? R->out : R->embd, xb, p->n_vocab, D, R->q8_out);
	if (p->logit_softcap > 0)
		for (int i = 0; i < p->n_vocab; i++)
			logits[i] = (float)(p->logit_softcap * tanh(logits[i] / p->logit_softcap));
	free(sc);
}

/* Engine m vs reference R (fresh) over prompt t[np] and steps greedy tokens of the reference:
 * returns the worst relative logit error (model_fix.h's rel_err), *agree counts the steps whose
 * top-1 is the reference's or the reference's own top two are within tie x |top| (a near tie a
 * quantized engine may break), or excuse(ud, step) says why not (NULL: none). step_fn (NULL:
 * none) runs after each engine step. */
typedef int (*rd_excuse_fn)(void *ud, const rd_t *R);
static inline double rd_compare(model_t *m, rd_t *R, const int *t, int np, int steps, float tie,
				rd_excuse_fn excuse, void *ud, int *agree)
{
	int V = R->p->n_vocab;
	float *lg = malloc(V * sizeof *lg), *lr = malloc(V * sizeof *lr);
	*agree = 0;
	int rc = model_forward(m, t, np, 0, lg);
	for (int i = 0; i < np; i++)
		rd_step(R, t[i], i, lr);
	double worst = rel_err(lg, lr, V);
	for (int s = 0; s < steps && !rc; s++) {
		int tok = sh_argmax(lr, V), got = sh_argmax(lg, V);
		float l2 = -INFINITY; /* the reference's runner-up */
		for (int i = 0; i < V; i++)
			if (i != tok && lr[i] > l2)
				l2 = lr[i];
		*agree +=
		    got == tok || lr[tok] - l2 < tie * fabsf(lr[tok]) || (excuse && excuse(ud, R));
		rc = model_forward(m, &tok, 1, np + s, lg);
		rd_step(R, tok, np + s, lr);
		worst = fmax(worst, rel_err(lg, lr, V));
	}
	free(lg);
	free(lr);
	return rc ? INFINITY : worst;
}

#endif
