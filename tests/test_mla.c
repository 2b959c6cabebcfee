/* test_mla.c: deepseek2's Multi-head Latent Attention. A plain-C reference forward pass written
 * straight from the math (F32, one token at a time, no kernels or threads, the un-absorbed form
 * that expands every head's K and V from the latent and caches them) against the engine (absorbed
 * W_kb / W_vb, latent-only cache): F32 logits within 1e-4 relative, Q8_0 top-1 equal over 32
 * greedy steps (there the reference follows llama.cpp's int8 activations, which makes it compute
 * the attention absorbed too: ref_absorbed); q_lora and Lite variants, split attn_k_b/attn_v_b and
 * legacy attn_kv_b, YaRN on and off; split heads across shards; bad files refused with one-line
 * errors.
 *
 * Formulas as llama.cpp reads deepseek2 files: src/models/deepseek2.cpp (q = [nope | rope] per
 * head, kv_a_mqa = [latent | k_pe], kv_b rows per head = [k_nope | v], kq_scale = mscale^2 /
 * sqrt(key_length_mla)), llama_model_deepseek2::load_arch_hparams (yarn_log_multiplier / 0.1),
 * llama-context.cpp's YaRN attn_factor set-up and ggml's rope_yarn / rope_yarn_corr_dims. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "gen_model.h"
#include "harness.h"
#include "infer/gguf.h"
#include "infer/gguf_write.h"
#include "infer/model/meta.h"
#include "infer/model/model.h"
#include "infer/pool.h"
#include "infer/quant/quant.h"
#include "ref_util.h"

#define CTX 96

/* ---- the reference --------------------------------------------------------------------------- */

typedef struct ref_layer {
	float *attn_norm, *wq, *wq_a, *q_a_norm, *wq_b, *wkv_a, *kv_a_norm;
	float *kvb; /* [H * (nope + dv)][kvl], head h's rows = [k_nope | v] */
	float *wo, *ffn_norm, *gate, *up, *down;
	/* routed layers: router [E][D], experts [E][F][D] / [E][D][F], bias [E], shared block */
	float *router, *gate_e, *up_e, *down_e, *bias, *sh_gate, *sh_up, *sh_down;
} ref_layer_t;

typedef struct ref {
	model_meta_t mt;
	int H, dk, nope, rd, dv, kvl, ql, D, F, V;
	float *embd, *out_norm, *out;
	ref_layer_t *L;
	float *K, *Vc; /* expanded cache: [layer][pos][H][dk], [layer][pos][H][dv] */
	/* the matrices (all of one type in mkmodel's files but the F32 router) and the output take
	 * Q8_0 activations: their inputs go through ref_q8_0_round as llama.cpp's */
	int q8, q8_out;
	/* int8 activations in the per-head products too (attn_k_b, attn_v_b or legacy kv_b's value
	 * rows; legacy kv_b's key rows become an F32 copy in the engine): then the attention is
	 * computed absorbed (ref_absorbed), on the latent cache C [layer][pos][kv_lora | k_pe] */
	int q8_kb, q8_vb, absorb;
	float *C;
} ref_t;

static float *ldl(const gguf_t *g, int l, const char *s)
{
	char n[96];
	snprintf(n, sizeof n, "blk.%d.%s", l, s);
	return ref_deq(g, n);
}

static int ref_open(ref_t *r, const gguf_t *g, const model_meta_t *mt)
{
	memset(r, 0, sizeof *r);
	r->mt = *mt;
	r->H = mt->n_heads, r->dk = mt->head_dim, r->nope = mt->mla.qk_nope;
	r->rd = mt->mla.qk_rope, r->dv = mt->mla.v_head, r->kvl = mt->mla.kv_lora;
	r->ql = mt->mla.q_lora, r->D = mt->dim, r->F = mt->ffn, r->V = mt->n_vocab;
	r->embd = ref_deq(g, "token_embd.weight");
	r->out_norm = ref_deq(g, "output_norm.weight");
	r->out = ref_deq(g, "output.weight");
	r->q8 = ref_q8_act(g, "blk.0.attn_kv_a_mqa.weight");
	r->q8_out = ref_q8_act(g, "output.weight");
	int split = gguf_find_tensor(g, "blk.0.attn_k_b.weight") != NULL;
	r->q8_kb = split && ref_q8_act(g, "blk.0.attn_k_b.weight");
	r->q8_vb = ref_q8_act(g, split ? "blk.0.attn_v_b.weight" : "blk.0.attn_kv_b.weight");
	r->absorb = r->q8_kb || r->q8_vb;
	r->L = calloc((size_t)mt->n_layers, sizeof *r->L);
	int H = r->H, nope = r->nope, dv = r->dv, kvl = r->kvl;
	for (int l = 0; l < mt->n_layers; l++) {
		ref_layer_t *L = &r->L[l];
		L->attn_norm = ldl(g, l, "attn_norm.weight");
		L->wq = ldl(g, l, "attn_q.weight");
		L->wq_a = ldl(g, l, "attn_q_a.weight");
		L->q_a_norm = ldl(g, l, "attn_q_a_norm.weight");
		L->wq_b = ldl(g, l, "attn_q_b.weight");
		L->wkv_a = ldl(g, l, "attn_kv_a_mqa.weight");
		L->kv_a_norm = ldl(g, l, "attn_kv_a_norm.weight");
		L->wo = ldl(g, l, "attn_output.weight");
		L->ffn_norm = ldl(g, l, "ffn_norm.weight");
		L->gate = ldl(g, l, "ffn_gate.weight");
		L->up = ldl(g, l, "ffn_up.weight");
		L->down = ldl(g, l, "ffn_down.weight");
		L->router = ldl(g, l, "ffn_gate_inp.weight");
		L->gate_e = ldl(g, l, "ffn_gate_exps.weight");
		L->up_e = ldl(g, l, "ffn_up_exps.weight");
		L->down_e = ldl(g, l, "ffn_down_exps.weight");
		L->bias = ldl(g, l, "exp_probs_b.bias");
		L->sh_gate = ldl(g, l, "ffn_gate_shexp.weight");
		L->sh_up = ldl(g, l, "ffn_up_shexp.weight");
		L->sh_down = ldl(g, l, "ffn_down_shexp.weight");
		L->kvb = ldl(g, l, "attn_kv_b.weight");
		if (!L->kvb) { /* rebuild kv_b from the split form: k_b[h][c][j], v_b[h][i][c] */
			float *kb = ldl(g, l, "attn_k_b.weight"),
			      *vb = ldl(g, l, "attn_v_b.weight");
			if (!kb || !vb)
				return -1;
			L->kvb = malloc((size_t)H * (nope + dv) * kvl * sizeof(float));
			for (int h = 0; h < H; h++) {
				for (int j = 0; j < nope; j++)
					for (int c = 0; c < kvl; c++)
						L->kvb[((size_t)h * (nope + dv) + j) * kvl + c] =
						    kb[((size_t)h * kvl + c) * nope + j];
				for (int i = 0; i < dv; i++)
					memcpy(L->kvb + ((size_t)h * (nope + dv) + nope + i) * kvl,
					       vb + ((size_t)h * dv + i) * kvl,
					       kvl * sizeof(float));
			}
			free(kb);
			free(vb);
		}
		if (!L->attn_norm || !(L->wq || L->wq_a) || !L->wkv_a || !L->wo ||
		    !(L->down || L->down_e))
			return -1;
	}
	r->K = malloc((size_t)mt->n_layers * CTX * H * r->dk * sizeof(float));
	r->Vc = malloc((size_t)mt->n_layers * CTX * H * dv * sizeof(float));
	r->C = malloc((size_t)mt->n_layers * CTX * (kvl + r->rd) * sizeof(float));
	return 0;
}

static void ref_close(ref_t *r)
{
	for (int l = 0; l < r->mt.n_layers; l++) {
		ref_layer_t *L = &r->L[l];
		float *p[] = {L->attn_norm, L->wq,     L->wq_a,   L->q_a_norm, L->wq_b,   L->wkv_a,
			      L->kv_a_norm, L->kvb,    L->wo,     L->ffn_norm, L->gate,   L->up,
			      L->down,      L->router, L->gate_e, L->up_e,     L->down_e, L->bias,
			      L->sh_gate,   L->sh_up,  L->sh_down};
		for (size_t i = 0; i < ARRAY_LEN(p); i++)
			free(p[i]);
	}
	free(r->L);
	free(r->embd);
	free(r->out_norm);
	free(r->out);
	free(r->K);
	free(r->Vc);
	free(r->C);
}

/* llama.cpp's scaling for deepseek2, from the definitions: freq_scale fs = 1 / factor, YaRN's
 * ext_factor 1; cparams.yarn_attn_factor = (L != 0 ? 1 : get_mscale(f, 1)) / (1 + 0.1 ln f); the
 * rope multiplies cos/sin by attn_factor * (1 + 0.1 ln(1/fs)); the graph's
 * attn_factor_org = attn_factor * (1 + 0.1 ln(1/fs)), mscale = attn_factor_org * (1 + 0.1 *
 * (L / 0.1) * ln(1/fs)), kq_scale = mscale^2 / sqrt(dk). */
static void ref_scales(const ref_t *r, double *rope_mag, double *kq_scale)
{
	const model_meta_t *mt = &r->mt;
	double f = mt->rope_factor > 0 ? mt->rope_factor : 1, fs = 1 / f;
	int yarn = mt->rope_scaling == META_SCALING_YARN;
	double attn_factor = 1;
	if (yarn) {
		double get_mscale = f <= 1 ? 1 : 1 + 0.1 * log(f);
		attn_factor = (mt->yarn_log_mul != 0 ? 1 : get_mscale) / (1 + 0.1 * log(f));
	}
	*rope_mag = attn_factor * (yarn ? 1 + 0.1 * log(1 / fs) : 1);
	double org = attn_factor * (1 + 0.1 * log(1 / fs));
	double ms = org * (1 + 0.1 * (mt->yarn_log_mul / 0.1) * log(1 / fs));
	*kq_scale = ms * ms / sqrt((double)r->dk);
}

/* Rotates adjacent pairs of h[rd] for position pos (ggml's rope_yarn, in double). */
static void ref_rope(const ref_t *r, float *h, int pos, double mag)
{
	const model_meta_t *mt = &r->mt;
	int n = r->rd, yarn = mt->rope_scaling == META_SCALING_YARN;
	double fs = mt->rope_factor > 0 ? 1 / mt->rope_factor : 1, lo = 0, hi = 0;
	if (yarn) {
		double cf = n * log(mt->rope_orig_ctx / (32 * 2 * M_PI)) / (2 * log(mt->rope_base));
		double cs = n * log(mt->rope_orig_ctx / (1 * 2 * M_PI)) / (2 * log(mt->rope_base));
		lo = fmax(0, floor(cf)), hi = fmin(n - 1, ceil(cs));
	}
	for (int i0 = 0; i0 < n; i0 += 2) {
		double extrap = pos * pow(mt->rope_base, -(double)i0 / n);
		double interp = fs * extrap, theta = interp;
		if (yarn) {
			double y = (i0 / 2 - lo) / fmax(0.001, hi - lo);
			double ramp = 1 - fmin(1, fmax(0, y));
			theta = interp * (1 - ramp) + extrap * ramp;
		}
		double c = cos(theta) * mag, s = sin(theta) * mag, x0 = h[i0], x1 = h[i0 + 1];
		h[i0] = (float)(x0 * c - x1 * s);
		h[i0 + 1] = (float)(x0 * s + x1 * c);
	}
}

/* One token at pos; fills logits[V]. */
/* y = the routed layer's FFN of xn, from DeepSeek's math: p = softmax or sigmoid of the router
 * logits; the k largest p + bias are chosen; their weights are the unbiased p, divided by their
 * sum (floored at 2^-14) when expert_weights_norm, times expert_weights_scale; plus the shared
 * experts (not gated). */
static void ref_moe(const ref_t *r, const ref_layer_t *L, const float *xn, float *y)
{
	const model_meta_t *mt = &r->mt;
	int D = r->D, E = mt->n_experts, K = mt->n_experts_used, F = mt->ffn_exp, S = mt->ffn_shexp;
	float lg[64], h[512], u[512], t[512];
	double p[64], sel_s[64], w[8], sum = 0;
	int sel[8];
	ref_mv(lg, L->router, xn, E, D);
	double mx = -1e300, z = 0;
	for (int e = 0; e < E; e++)
		mx = fmax(mx, lg[e]);
	for (int e = 0; e < E; e++)
		z += p[e] = mt->gating == META_GATE_SIGMOID ? 1 / (1 + exp(-(double)lg[e]))
							    : exp(lg[e] - mx);
	for (int e = 0; e < E; e++) {
		if (mt->gating != META_GATE_SIGMOID)
			p[e] /= z;
		sel_s[e] = p[e] + (L->bias ? L->bias[e] : 0);
	}
	if (mt->n_groups > 1) { /* V3: only the groups whose two best scores sum highest */
		int per = E / mt->n_groups, keep[64] = {0};
		double gsum[64];
		for (int gi = 0; gi < mt->n_groups; gi++) {
			double a = -1e300, b = -1e300; /* the two largest */
			for (int j = 0; j < per; j++) {
				double v = sel_s[gi * per + j];
				if (v > a)
					b = a, a = v;
				else if (v > b)
					b = v;
			}
			gsum[gi] = a + b;
		}
		for (int u = 0; u < mt->groups_used; u++) {
			int best = -1;
			for (int gi = 0; gi < mt->n_groups; gi++)
				if (!keep[gi] && (best < 0 || gsum[gi] > gsum[best]))
					best = gi;
			keep[best] = 1;
		}
		for (int e = 0; e < E; e++)
			if (!keep[e / per])
				sel_s[e] = -1e301;
	}
	for (int i = 0; i < K; i++) {
		int b = -1;
		for (int e = 0; e < E; e++)
			if (sel_s[e] > -1e300 && (b < 0 || sel_s[e] > sel_s[b]))
				b = e;
		sel[i] = b, w[i] = p[b], sum += p[b];
		sel_s[b] = -1e301;
	}
	memset(y, 0, D * sizeof *y);
	for (int i = 0; i < K; i++) {
		double wi =
		    (mt->exp_norm ? w[i] / fmax(sum, 6.103515625e-5) : w[i]) * mt->exp_scale;
		ref_mv_act(h, L->gate_e + (size_t)sel[i] * F * D, xn, F, D, r->q8);
		ref_mv_act(u, L->up_e + (size_t)sel[i] * F * D, xn, F, D, r->q8);
		for (int j = 0; j < F; j++)
			h[j] = (float)(h[j] / (1 + exp(-(double)h[j])) * u[j]);
		ref_mv_act(t, L->down_e + (size_t)sel[i] * D * F, h, D, F, r->q8);
		for (int j = 0; j < D; j++)
			y[j] += (float)(wi * t[j]);
	}
	if (S) {
		ref_mv_act(h, L->sh_gate, xn, S, D, r->q8);
		ref_mv_act(u, L->sh_up, xn, S, D, r->q8);
		for (int j = 0; j < S; j++)
			h[j] = (float)(h[j] / (1 + exp(-(double)h[j])) * u[j]);
		ref_mv_act(t, L->sh_down, h, D, S, r->q8);
		for (int j = 0; j < D; j++)
			y[j] += t[j];
	}
}

/* Head h's attention output o[dv] at pos in the absorbed form llama.cpp and the engine compute
 * (mla.c): qa = W_kb,h^T q_nope (kv_lora), score_t = qa . c_t + q_pe . k_pe_t, then
 * o = W_vb,h (sum_t p_t c_t). The same numbers as the expanded form, but with int8 activations
 * the roundings fall on q_nope and on the weighted latent, not on each c_t: so a quantized file
 * is followed this way (each product's input rounded where its weight's type says). */
static void ref_absorbed(const ref_t *r, const ref_layer_t *L, int l, int h, int pos, double kq,
			 const float *qh, float *o)
{
	int nope = r->nope, dv = r->dv, kvl = r->kvl, lr = kvl + r->rd;
	const float *kb = L->kvb + (size_t)h * (nope + dv) * kvl, *vb = kb + (size_t)nope * kvl;
	float qn[512], qa[512], lat[512];
	double p[CTX];
	memcpy(qn, qh, nope * sizeof *qn);
	if (r->q8_kb)
		ref_q8_0_round(qn, qh, nope);
	for (int c = 0; c < kvl; c++) {
		double a = 0;
		for (int j = 0; j < nope; j++)
			a += (double)kb[(size_t)j * kvl + c] * qn[j];
		qa[c] = (float)a;
	}
	for (int t = 0; t <= pos; t++) {
		const float *ct = r->C + ((size_t)l * CTX + t) * lr;
		double s = 0;
		for (int c = 0; c < kvl; c++)
			s += (double)qa[c] * ct[c];
		for (int i = 0; i < r->rd; i++)
			s += (double)qh[nope + i] * ct[kvl + i];
		p[t] = s * kq;
	}
	ref_softmax(p, pos + 1);
	for (int c = 0; c < kvl; c++) {
		double a = 0;
		for (int t = 0; t <= pos; t++)
			a += p[t] * r->C[((size_t)l * CTX + t) * lr + c];
		lat[c] = (float)a;
	}
	ref_mv_act(o, vb, lat, dv, kvl, r->q8_vb);
}

static void ref_forward(ref_t *r, int tok, int pos, float *logits)
{
	int H = r->H, dk = r->dk, nope = r->nope, dv = r->dv, kvl = r->kvl, D = r->D, F = r->F;
	float eps = r->mt.rms_eps;
	double mag, kq;
	ref_scales(r, &mag, &kq);
	float *x = malloc(D * sizeof *x), *xn = malloc(D * sizeof *xn);
	float *q = malloc((size_t)H * dk * sizeof *q), *qa = malloc((r->ql + 1) * sizeof *qa);
	float *kva = malloc((kvl + r->rd) * sizeof *kva), *c = malloc(kvl * sizeof *c);
	float *kvh = malloc((nope + dv) * sizeof *kvh), *o = malloc((size_t)H * dv * sizeof *o);
	float *y = malloc(D * sizeof *y), *g = malloc(F * sizeof *g), *u = malloc(F * sizeof *u);
	double *p = malloc(CTX * sizeof *p);
	memcpy(x, r->embd + (size_t)tok * D, D * sizeof *x);
	for (int l = 0; l < r->mt.n_layers; l++) {
		ref_layer_t *L = &r->L[l];
		ref_norm(xn, x, L->attn_norm, D, eps);
		if (r->ql) {
			ref_mv_act(qa, L->wq_a, xn, r->ql, D, r->q8);
			ref_norm(qa, qa, L->q_a_norm, r->ql, eps);
			ref_mv_act(q, L->wq_b, qa, H * dk, r->ql, r->q8);
		} else {
			ref_mv_act(q, L->wq, xn, H * dk, D, r->q8);
		}
		ref_mv_act(kva, L->wkv_a, xn, kvl + r->rd, D, r->q8);
		ref_norm(c, kva, L->kv_a_norm, kvl, eps);
		ref_rope(r, kva + kvl, pos, mag);
		/* expand: K[h] = [W_kb,h c | k_pe], V[h] = W_vb,h c */
		float *K = r->K + ((size_t)l * CTX + pos) * H * dk;
		float *Vv = r->Vc + ((size_t)l * CTX + pos) * H * dv;
		for (int h = 0; h < H; h++) {
			ref_rope(r, q + h * dk + nope, pos, mag);
			ref_mv(kvh, L->kvb + (size_t)h * (nope + dv) * kvl, c, nope + dv, kvl);
			memcpy(K + h * dk, kvh, nope * sizeof *kvh);
			memcpy(K + h * dk + nope, kva + kvl, r->rd * sizeof *kva);
			memcpy(Vv + h * dv, kvh + nope, dv * sizeof *kvh);
		}
		float *lat = r->C + ((size_t)l * CTX + pos) * (kvl + r->rd);
		memcpy(lat, c, kvl * sizeof *c);
		memcpy(lat + kvl, kva + kvl, r->rd * sizeof *kva);
		for (int h = 0; r->absorb && h < H; h++)
			ref_absorbed(r, L, l, h, pos, kq, q + h * dk, o + h * dv);
		for (int h = 0; !r->absorb && h < H; h++) {
			for (int t = 0; t <= pos; t++) {
				const float *k = r->K + ((size_t)l * CTX + t) * H * dk + h * dk;
				double s = 0;
				for (int i = 0; i < dk; i++)
					s += (double)q[h * dk + i] * k[i];
				p[t] = s * kq;
			}
			ref_softmax(p, pos + 1);
			for (int i = 0; i < dv; i++) {
				double a = 0;
				for (int t = 0; t <= pos; t++)
					a += p[t] *
					     r->Vc[((size_t)l * CTX + t) * H * dv + h * dv + i];
				o[h * dv + i] = (float)a;
			}
		}
		ref_mv_act(y, L->wo, o, D, H * dv, r->q8);
		for (int i = 0; i < D; i++)
			x[i] += y[i];
		ref_norm(xn, x, L->ffn_norm, D, eps);
		if (L->router) {
			ref_moe(r, L, xn, y);
		} else {
			ref_mv_act(g, L->gate, xn, F, D, r->q8);
			ref_mv_act(u, L->up, xn, F, D, r->q8);
			for (int i = 0; i < F; i++)
				g[i] = (float)(g[i] / (1 + exp(-(double)g[i])) * u[i]);
			ref_mv_act(y, L->down, g, D, F, r->q8);
		}
		for (int i = 0; i < D; i++)
			x[i] += y[i];
	}
	ref_norm(xn, x, r->out_norm, D, eps);
	ref_mv_act(logits, r->out, xn, r->V, D, r->q8_out);
	free(x), free(xn), free(q), free(qa), free(kva), free(c), free(kvh), free(o), free(y);
	free(g), free(u), free(p);
}

/* ---- engine side ------------------------------------------------------------------------------
 */

static mkmodel_opts_t base_opts(int type)
{
	return (mkmodel_opts_t){.arch = "deepseek2",
				.dim = 128,
				.layers = 2,
				.heads = 4,
				.kv_heads = 1,
				.ffn = 256,
				.vocab = 320,
				.ctx = CTX,
				.type = type,
				.seed = 11,
				.kv_lora = 64,
				.q_lora = 96,
				.qk_nope = 32,
				.qk_rope = 16,
				.v_head = 32};
}

/* The fixture (gen_model.h) with this file's context and an F32 cache. */
static int mla_open(gen_t *x, const mkmodel_opts_t *o, const char *tag, int threads)
{
	return gen_open_opts(x, o, tag, threads, CTX, QT_F32);
}

static const int prompt[12] = {300, 10, 47, 299, 256, 100, 101, 102, 32, 33, 34, 35};

/* max |a - b| / max |b| */
static double rel_err(const float *a, const float *b, int n)
{
	double d = 0, mx = 0;
	for (int i = 0; i < n; i++) {
		d = fmax(d, fabs((double)a[i] - b[i]));
		mx = fmax(mx, fabs((double)b[i]));
	}
	return d / mx;
}

/* Engine (12-token prompt batched, then decode steps) vs the reference token by token: F32
 * logits within 1e-4 relative at the prompt's last token and every decode step. */
static void f32_matches_reference(const mkmodel_opts_t *o, const char *tag)
{
	gen_t x;
	ref_t r;
	if (mla_open(&x, o, tag, 2) || ref_open(&r, x.g, &x.meta)) {
		CHECK(0);
		gen_close(&x);
		return;
	}
	int V = x.meta.n_vocab;
	float *le = malloc(V * sizeof *le), *lr = malloc(V * sizeof *lr);
	CHECK_EQ_INT(model_forward(x.m, prompt, 12, 0, le), 0);
	for (int i = 0; i < 12; i++)
		ref_forward(&r, prompt[i], i, lr);
	double worst = rel_err(le, lr, V);
	int tok = sh_argmax(lr, V);
	for (int s = 0; s < 20; s++) {
		CHECK_EQ_INT(model_forward(x.m, &tok, 1, 12 + s, le), 0);
		ref_forward(&r, tok, 12 + s, lr);
		worst = fmax(worst, rel_err(le, lr, V));
		tok = sh_argmax(lr, V);
	}
	if (!(worst < 1e-4))
		fprintf(stderr, "%s: engine vs reference max relative error %g\n", tag, worst);
	CHECK(worst < 1e-4);
	free(le);
	free(lr);
	ref_close(&r);
	gen_close(&x);
}

TEST(f32_qlora_split)
{
	mkmodel_opts_t o = base_opts(QT_F32);
	f32_matches_reference(&o, "qlora");
}

/* Routed layers (DeepSeek-V3's routing: sigmoid, selection bias, renormalised, scale 2.5, one
 * shared expert) after one dense layer. */
TEST(f32_qlora_moe)
{
	mkmodel_opts_t o = base_opts(QT_F32);
	o.layers = 3, o.experts = 8, o.experts_used = 2, o.expert_ffn = 64;
	f32_matches_reference(&o, "moe");
}

/* The same with DeepSeek-V3's group-limited routing: 8 experts in 4 groups, the best 2 groups. */
TEST(f32_qlora_moe_groups)
{
	mkmodel_opts_t o = base_opts(QT_F32);
	o.layers = 3, o.experts = 8, o.experts_used = 2, o.expert_ffn = 64;
	o.expert_groups = 4, o.expert_groups_used = 2;
	f32_matches_reference(&o, "moegroups");
}

TEST(f32_lite_legacy_kvb)
{
	mkmodel_opts_t o = base_opts(QT_F32);
	o.q_lora = 0, o.mla_legacy = 1, o.v_head = 48; /* v_head != qk_nope + qk_rope */
	f32_matches_reference(&o, "lite");
}

/* YaRN with DeepSeek-V2's numbers scaled down: factor 40, the converter's 0.1 * mscale_all_dim
 * (0.0707), an original context short enough that the ramp falls inside the rotated dims. */
TEST(f32_qlora_yarn)
{
	mkmodel_opts_t o = base_opts(QT_F32);
	o.rope_factor = 40, o.yarn_log_mul = 0.0707f, o.rope_orig_ctx = 64, o.qk_rope = 32;
	f32_matches_reference(&o, "yarn");
}

TEST(f32_lite_legacy_yarn_no_log_mul)
{
	mkmodel_opts_t o = base_opts(QT_F32);
	o.q_lora = 0, o.mla_legacy = 1, o.rope_factor = 4, o.rope_orig_ctx = 32;
	f32_matches_reference(&o, "yarn0");
}

/* The split and legacy files of one seed hold the same kv_b: identical F32 logits (to float
 * rounding) although one absorbs attn_k_b as stored and the other a transposed copy. */
TEST(split_equals_legacy)
{
	mkmodel_opts_t a = base_opts(QT_F32), b = base_opts(QT_F32);
	b.mla_legacy = 1;
	gen_t x, y;
	if (mla_open(&x, &a, "split", 1) || mla_open(&y, &b, "legacy", 1)) {
		CHECK(0);
		return;
	}
	int V = x.meta.n_vocab;
	float *l1 = malloc(V * sizeof *l1), *l2 = malloc(V * sizeof *l2);
	CHECK_EQ_INT(model_forward(x.m, prompt, 12, 0, l1), 0);
	CHECK_EQ_INT(model_forward(y.m, prompt, 12, 0, l2), 0);
	CHECK(rel_err(l1, l2, V) < 1e-5);
	CHECK_EQ_INT(x.meta.mla.split_kvb, 1);
	CHECK_EQ_INT(y.meta.mla.split_kvb, 0);
	free(l1);
	free(l2);
	gen_close(&x);
	gen_close(&y);
}

/* Q8_0 weights: the engine's greedy ids equal the reference's over 32 steps, for the q_lora, the
 * MoE and the Lite model. The reference rounds each product's input through Q8_0 where llama.cpp
 * does (absorbed attention: q_nope and the weighted latent), and then equals the engine to ~1e-7
 * relative (measured: q8, q8lite at every step), until its double sums and the engine's float
 * ones fall on either side of an int8 rounding step or a router's near tie: the logits then move
 * by ~1% of their largest (q8moe from its 11th prompt token on). */
static void q8_greedy(const mkmodel_opts_t *o, const char *tag)
{
	gen_t x;
	ref_t r;
	if (mla_open(&x, o, tag, 2) || ref_open(&r, x.g, &x.meta)) {
		CHECK(0);
		gen_close(&x);
		return;
	}
	int V = x.meta.n_vocab, te, tr, same = 1;
	float *le = malloc(V * sizeof *le), *lr = malloc(V * sizeof *lr);
	CHECK_EQ_INT(model_forward(x.m, prompt, 12, 0, le), 0);
	for (int i = 0; i < 12; i++)
		ref_forward(&r, prompt[i], i, lr);
	for (int s = 0; s < 32 && same; s++) {
		te = sh_argmax(le, V), tr = sh_argmax(lr, V);
		/* equal, or a near-tie in the reference itself (its top two within 1 %, the jump
		 * of one int8 rounding flip above); both then go on with the engine's token */
		int tie = te != tr && lr[tr] - lr[te] < 0.01f * fabsf(lr[tr]);
		if (te != tr) {
			fprintf(stderr, "%s: step %d engine %d reference %d (%s, %g vs %g)\n", tag,
				s, te, tr, tie ? "a near-tie" : "DIFFER", (double)lr[tr],
				(double)lr[te]);
			same = tie;
		}
		CHECK_EQ_INT(model_forward(x.m, &te, 1, 12 + s, le), 0);
		ref_forward(&r, te, 12 + s, lr);
	}
	CHECK(same);
	free(le);
	free(lr);
	ref_close(&r);
	gen_close(&x);
}

TEST(q8_0_greedy_qlora)
{
	mkmodel_opts_t o = base_opts(QT_Q8_0);
	q8_greedy(&o, "q8");
}

TEST(q8_0_greedy_moe)
{
	mkmodel_opts_t o = base_opts(QT_Q8_0);
	o.layers = 3, o.experts = 8, o.experts_used = 2, o.expert_ffn = 64;
	q8_greedy(&o, "q8moe");
}

TEST(q8_0_greedy_lite_yarn)
{
	mkmodel_opts_t o = base_opts(QT_Q8_0);
	o.q_lora = 0, o.rope_factor = 40, o.yarn_log_mul = 0.0707f, o.rope_orig_ctx = 64;
	q8_greedy(&o, "q8lite");
}

/* Every weight type mkmodel writes (attn_k_b's 128-element rows in llama.cpp's fallback type
 * for the 256-element K-quants): the engine's logits stay close to the reference on the same
 * dequantized weights (8-bit activations: a relative RMS near 1e-2) and pick a top token. */
TEST(every_weight_type)
{
	static const int types[] = {QT_F16,  QT_BF16, QT_Q4_0, QT_Q5_0, QT_Q5_1, QT_Q8_0,
				    QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K};
	for (size_t i = 0; i < ARRAY_LEN(types); i++) {
		mkmodel_opts_t o = base_opts(types[i]);
		o.dim = 256, o.ffn = 512, o.kv_lora = 256, o.q_lora = 256, o.qk_nope = 128;
		o.qk_rope = 64, o.v_head = 64, o.heads = 4;
		char tag[32];
		snprintf(tag, sizeof tag, "type%d", types[i]);
		gen_t x;
		ref_t r;
		if (mla_open(&x, &o, tag, 2) || ref_open(&r, x.g, &x.meta)) {
			CHECK(0);
			gen_close(&x);
			continue;
		}
		int V = x.meta.n_vocab;
		float *le = malloc(V * sizeof *le), *lr = malloc(V * sizeof *lr);
		CHECK_EQ_INT(model_forward(x.m, prompt, 12, 0, le), 0);
		for (int t = 0; t < 12; t++)
			ref_forward(&r, prompt[t], t, lr);
		double se = 0, sr = 0;
		for (int k = 0; k < V; k++) {
			se += (le[k] - lr[k]) * (double)(le[k] - lr[k]);
			sr += lr[k] * (double)lr[k];
		}
		double rms = sqrt(se / sr);
		if (!(rms < 2e-2))
			fprintf(stderr, "%s: relative RMS %g\n", quant_type_name(types[i]), rms);
		if (getenv("MLA_DBG"))
			fprintf(stderr, "%s: relative RMS %g\n", quant_type_name(types[i]), rms);
		CHECK(rms < 2e-2);
		/* top-1 may flip between near-equal logits (random weights): the engine's choice
		 * must be one the reference scores within 1% of its largest logit */
		int ae = sh_argmax(le, V), ar = sh_argmax(lr, V);
		if (getenv("MLA_DBG"))
			fprintf(stderr, "  top-1 %d (%g) vs %d (%g)\n", ae, lr[ae], ar, lr[ar]);
		CHECK(lr[ae] >= lr[ar] - 0.01f * fabsf(lr[ar]));
		free(le);
		free(lr);
		ref_close(&r);
		gen_close(&x);
	}
}

/* The cache holds only the latent: kv bytes per position = layers * (kv_lora + qk_rope) * 4, on
 * every shard whatever its heads. */
TEST(kv_bytes_are_the_latent)
{
	mkmodel_opts_t o = base_opts(QT_F32);
	gen_t x;
	if (mla_open(&x, &o, "kvb", 1)) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(model_kv_bytes_per_pos(&x.meta, NULL, QT_F32), 2 * (64 + 16) * 4);
	model_shard_t s = {1, 2, 0, 1, 0, 256, 1, 2, 0, 0, 0, 0};
	CHECK_EQ_INT(model_kv_bytes_per_pos(&x.meta, &s, QT_F32), 1 * (64 + 16) * 4);
	CHECK_EQ_INT(x.meta.n_kv_heads, 1);
	CHECK_EQ_INT(x.meta.head_dim, 48);
	gen_close(&x);
}

/* Two sequences in two slots of one latent cache, their prompts interleaved in one batch and
 * then decoded together: every logit row equals the sequence run alone (bit for bit is not
 * required: the batch goes through the batched kernels; within 1e-5 relative). */
TEST(slots_mixed_batch)
{
	mkmodel_opts_t o = base_opts(QT_F32);
	gen_t x;
	char err[256];
	if (mla_open(&x, &o, "slots", 2)) {
		CHECK(0);
		return;
	}
	static const int pa[5] = {300, 10, 47, 299, 256}, pb[5] = {100, 101, 102, 32, 33};
	int V = x.meta.n_vocab;
	/* alone: slot 0 of the one-slot model, the last prompt token's logits then one decode */
	float *alone = malloc(4 * (size_t)V * sizeof *alone);
	for (int s = 0; s < 2; s++) {
		const int *p = s ? pb : pa;
		int next = 7 + s;
		CHECK_EQ_INT(model_forward(x.m, p, 5, 0, alone + (size_t)(2 * s) * V), 0);
		CHECK_EQ_INT(model_forward(x.m, &next, 1, 5, alone + (size_t)(2 * s + 1) * V), 0);
	}
	model_t *m2 = NULL;
	CHECK_EQ_INT(model_new_slots(&m2, x.g, &x.meta, NULL, CTX, 2, MODEL_KV_DEFAULT, x.pool, err,
				     sizeof err),
		     0);
	if (m2) {
		int tok[10], slot[10], pos[10], out[10];
		for (int i = 0; i < 10; i++) { /* a0 b0 a1 b1 ... */
			tok[i] = i % 2 ? pb[i / 2] : pa[i / 2];
			slot[i] = i % 2, pos[i] = i / 2, out[i] = i >= 8;
		}
		float *got = malloc(4 * (size_t)V * sizeof *got);
		model_batch_t bt = {10, tok, slot, pos, out, NULL, NULL};
		CHECK_EQ_INT(model_forward_batch(m2, &bt, got), 0);
		int t2[2] = {7, 8}, s2[2] = {0, 1}, p2[2] = {5, 5}, o2[2] = {1, 1};
		model_batch_t bd = {2, t2, s2, p2, o2, NULL, NULL};
		CHECK_EQ_INT(model_forward_batch(m2, &bd, got + 2 * (size_t)V), 0);
		/* got: [a prompt, b prompt, a decode, b decode]; alone: [a p, a d, b p, b d] */
		static const int map[4] = {0, 2, 1, 3};
		for (int k = 0; k < 4; k++)
			CHECK(rel_err(got + (size_t)k * V, alone + (size_t)map[k] * V, V) < 1e-5);
		free(got);
	}
	model_free(m2);
	free(alone);
	gen_close(&x);
}

/* ---- sharded heads ----------------------------------------------------------------------------
 */

typedef struct rk {
	mem_group_t *g;
	int rank;
	model_t *m;
	float *logits;
	int ids[8], rc;
} rk_t;

static int sum_allreduce(void *ctx, float *x, int n)
{
	rk_t *r = ctx;
	mem_group_allreduce(r->g, r->rank, x, n);
	return 0;
}

static void *rk_main(void *arg)
{
	rk_t *r = arg;
	int V = 320; /* base_opts' vocabulary */
	r->rc = model_forward(r->m, prompt, 12, 0, r->logits);
	for (int s = 0; s < 8 && !r->rc; s++) {
		r->ids[s] = sh_argmax(r->logits, V);
		r->rc = model_forward(r->m, &r->ids[s], 1, 12 + s, r->logits);
	}
	return NULL;
}

/* Heads split (latent replicated) over n ranks with the given head counts: greedy ids equal
 * the one-rank model's. */
static void sharded(int type, int n, const int *heads)
{
	mkmodel_opts_t o = base_opts(type);
	gen_t x;
	char err[256];
	if (mla_open(&x, &o, "tp", 1)) {
		CHECK(0);
		return;
	}
	rk_t one = {.m = x.m, .logits = malloc(320 * sizeof(float))};
	rk_main(&one);
	CHECK_EQ_INT(one.rc, 0);
	mem_group_t grp = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, n, 0, 0, {0}};
	rk_t rk[3];
	pool_t *pools[3];
	pthread_t th[3];
	for (int r = 0, h0 = 0, f0 = 0; r < n; r++) {
		int nf = r == n - 1 ? o.ffn - f0 : (o.ffn / n) / 32 * 32; /* whole Q8_0 blocks */
		model_shard_t s = {h0, heads[r], 0, 1, f0, nf, 0, o.layers, 0, 0, 0, 0};
		h0 += heads[r], f0 += nf;
		grp.slot[r] = malloc(64 * o.dim * sizeof(float));
		pools[r] = pool_new(1);
		rk[r] = (rk_t){.g = &grp, .rank = r, .logits = malloc(320 * sizeof(float))};
		CHECK_EQ_INT(model_new(&rk[r].m, x.g, &x.meta, &s, CTX, pools[r], err, sizeof err),
			     0);
		model_set_allreduce(rk[r].m, sum_allreduce, &rk[r]);
	}
	for (int r = 0; r < n; r++)
		pthread_create(&th[r], NULL, rk_main, &rk[r]);
	for (int r = 0; r < n; r++)
		pthread_join(th[r], NULL);
	for (int r = 0; r < n; r++) {
		CHECK_EQ_INT(rk[r].rc, 0);
		CHECK(!memcmp(rk[r].ids, one.ids, sizeof one.ids));
		CHECK(rel_err(rk[r].logits, one.logits, 320) < 1e-4);
		model_free(rk[r].m);
		pool_free(pools[r]);
		free(rk[r].logits);
		free(grp.slot[r]);
	}
	free(one.logits);
	gen_close(&x);
}

TEST(sharded_heads_2_ranks_f32)
{
	sharded(QT_F32, 2, (const int[]){2, 2});
}

TEST(sharded_heads_3_ranks_q8_0_uneven)
{
	sharded(QT_Q8_0, 3, (const int[]){2, 1, 1});
}

/* ---- bad files --------------------------------------------------------------------------------
 */

enum mut {
	MUT_NONE,
	MUT_KV_LORA_HUGE, /* kv_lora_rank larger than the head data */
	MUT_NO_KV_A,      /* attn_kv_a_mqa missing */
	MUT_KB_SHAPE,     /* attn_k_b [kvl][nope] swapped */
	MUT_MOE_LAYER,    /* leading_dense_block_count < block_count */
	MUT_ROPE_TOO_BIG, /* rope.dimension_count >= key length */
	MUT_KEY_LENGTH,   /* key_length != kv_lora + rope in the split form */
	MUT_SCALING,      /* rope.scaling.type longrope */
	MUT_NO_KV_LORA,   /* attention.kv_lora_rank missing */
	MUT_Q_B_SHAPE,    /* attn_q_b rows not heads * key length */
};

/* A minimal deepseek2 file (no tokenizer; meta_load does not read it) with one mutation. */
static int write_bad(const char *path, int mut)
{
	int H = 2, D = 64, nope = 32, rd = 16, dv = 32, kvl = 32, ql = 32, F = 64, V = 40;
	int kvl_key = mut == MUT_KV_LORA_HUGE ? 4096 : kvl;
	gguf_writer_t *w = gw_new();
	char err[128];
	int rc = gw_kv_str(w, "general.architecture", "deepseek2") |
		 gw_kv_u32(w, "deepseek2.block_count", 1) |
		 gw_kv_u32(w, "deepseek2.embedding_length", D) |
		 gw_kv_u32(w, "deepseek2.feed_forward_length", F) |
		 gw_kv_u32(w, "deepseek2.attention.head_count", H) |
		 gw_kv_u32(w, "deepseek2.attention.head_count_kv", 1) |
		 gw_kv_u32(w, "deepseek2.attention.key_length",
			   mut == MUT_KEY_LENGTH ? 40 : kvl_key + rd) |
		 gw_kv_u32(w, "deepseek2.attention.value_length", kvl_key) |
		 gw_kv_u32(w, "deepseek2.attention.key_length_mla", nope + rd) |
		 gw_kv_u32(w, "deepseek2.attention.value_length_mla", dv) |
		 gw_kv_u32(w, "deepseek2.rope.dimension_count", mut == MUT_ROPE_TOO_BIG ? 48 : rd) |
		 gw_kv_u32(w, "deepseek2.attention.q_lora_rank", ql) |
		 gw_kv_u32(w, "deepseek2.leading_dense_block_count", mut == MUT_MOE_LAYER ? 0 : 1);
	if (mut != MUT_NO_KV_LORA)
		rc |= gw_kv_u32(w, "deepseek2.attention.kv_lora_rank", kvl_key);
	if (mut == MUT_SCALING)
		rc |= gw_kv_str(w, "deepseek2.rope.scaling.type", "longrope");
	struct {
		const char *n;
		int64_t ne[3];
	} t[] = {
	    {"token_embd.weight", {D, V, 0}},
	    {"output_norm.weight", {D, 0, 0}},
	    {"blk.0.attn_norm.weight", {D, 0, 0}},
	    {"blk.0.attn_q_a.weight", {D, ql, 0}},
	    {"blk.0.attn_q_a_norm.weight", {ql, 0, 0}},
	    {"blk.0.attn_q_b.weight", {ql, mut == MUT_Q_B_SHAPE ? H * 40 : H * (nope + rd), 0}},
	    {mut == MUT_NO_KV_A ? "blk.0.attn_kv_a_mq" : "blk.0.attn_kv_a_mqa.weight",
	     {D, kvl + rd, 0}},
	    {"blk.0.attn_kv_a_norm.weight", {kvl, 0, 0}},
	    {"blk.0.attn_k_b.weight", {mut == MUT_KB_SHAPE ? kvl + 1 : nope, kvl, H}},
	    {"blk.0.attn_v_b.weight", {kvl, dv, H}},
	    {"blk.0.attn_output.weight", {H * dv, D, 0}},
	    {"blk.0.ffn_norm.weight", {D, 0, 0}},
	    {"blk.0.ffn_gate.weight", {D, F, 0}},
	    {"blk.0.ffn_up.weight", {D, F, 0}},
	    {"blk.0.ffn_down.weight", {F, D, 0}},
	};
	for (size_t i = 0; i < ARRAY_LEN(t); i++)
		rc |= gw_tensor(w, t[i].n, t[i].ne[2] ? 3 : t[i].ne[1] ? 2 : 1, t[i].ne, QT_F32);
	if (rc || gw_begin(w, path, err, sizeof err)) {
		gw_free(w);
		return -1;
	}
	float zero[4096] = {0};
	for (size_t i = 0; i < ARRAY_LEN(t) && !rc; i++) {
		int64_t n =
		    t[i].ne[0] * (t[i].ne[1] ? t[i].ne[1] : 1) * (t[i].ne[2] ? t[i].ne[2] : 1);
		for (; n > 0 && !rc; n -= 4096)
			rc =
			    gw_data(w, zero, (size_t)MIN(n, 4096) * sizeof(float), err, sizeof err);
	}
	rc = rc || gw_finish(w, err, sizeof err);
	gw_free(w);
	return rc ? -1 : 0;
}

TEST(bad_files_one_line_errors)
{
	char path[256], err[256];
	snprintf(path, sizeof path, "/tmp/shoal-test-mla-%d-bad.gguf", (int)getpid());
	static const char *const want[] = {
	    [MUT_KV_LORA_HUGE] = "larger than the head data",
	    [MUT_NO_KV_A] = "attn_kv_a_mqa",
	    [MUT_KB_SHAPE] = "attn_k_b",
	    [MUT_MOE_LAYER] = "zero experts", /* routing layers without expert_count */
	    [MUT_ROPE_TOO_BIG] = "rope dimension",
	    [MUT_KEY_LENGTH] = "key_length",
	    [MUT_SCALING] = "rope scaling",
	    [MUT_NO_KV_LORA] = "kv_lora_rank",
	    [MUT_Q_B_SHAPE] = "attn_q_b",
	};
	for (int mut = 0; mut < (int)ARRAY_LEN(want); mut++) {
		gguf_t *g = NULL;
		model_meta_t mt;
		err[0] = 0;
		if (write_bad(path, mut) || gguf_open(&g, path, err, sizeof err)) {
			fprintf(stderr, "mutation %d: %s\n", mut, err);
			CHECK(0);
			continue;
		}
		int rc = meta_load(&mt, g, err, sizeof err);
		if (mut == MUT_NONE) {
			CHECK_EQ_INT(rc, 0);
		} else {
			CHECK(rc < 0);
			CHECK(strchr(err, '\n') == NULL);
			if (!strstr(err, want[mut]))
				fprintf(stderr, "mutation %d: '%s' lacks '%s'\n", mut, err,
					want[mut]);
			CHECK(strstr(err, want[mut]) != NULL);
		}
		gguf_free(g);
	}
	unlink(path);
}

int main(void)
{
	quant_init(0);
	RUN(f32_qlora_split);
	RUN(f32_lite_legacy_kvb);
	RUN(f32_qlora_moe);
	RUN(f32_qlora_moe_groups);
	RUN(f32_qlora_yarn);
	RUN(f32_lite_legacy_yarn_no_log_mul);
	RUN(split_equals_legacy);
	RUN(q8_0_greedy_qlora);
	RUN(q8_0_greedy_lite_yarn);
	RUN(q8_0_greedy_moe);
	RUN(every_weight_type);
	RUN(slots_mixed_batch);
	RUN(kv_bytes_are_the_latent);
	RUN(sharded_heads_2_ranks_f32);
	RUN(sharded_heads_3_ranks_q8_0_uneven);
	RUN(bad_files_one_line_errors);
	return harness_done();
}
