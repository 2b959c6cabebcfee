/* test_qwen35.c: the hybrid Qwen3.5 models (qwen35 dense, qwen35moe with a gated shared expert):
 * Gated DeltaNet layers with a recurrent state per sequence, gated full attention every few
 * layers, interleaved M-RoPE.
 *
 * A plain-C reference forward pass written from llama.cpp's semantics (src/models/qwen35.cpp
 * graph / build_layer_attn / build_layer_attn_linear, src/models/delta-net-base.cpp
 * build_delta_net_autoregressive, ggml-cpu/ops.cpp ggml_compute_forward_ssm_conv,
 * ggml_compute_forward_gated_delta_net and ggml_mrope_cache_init's is_imrope branch,
 * llama-graph.cpp llm_graph_input_pos::set_input for text positions, qwen35moe.cpp build_layer_ffn;
 * one token at a time, double sums, F32 weights dequantized from the file) is compared with the
 * engine: F32 logits within 1e-3 of the reference's scale at every step, Q8_0 greedy ids equal. The
 * recurrent state is checked the ways the engine uses it: a prompt in one pass or in chunks =
 * token by token; several slots in one batch = each alone; a checkpoint (batch keep) and the
 * rollback ring resume to the same logits as a fresh pass; a position without a held state is
 * refused. Tensor-parallel shards (2 and 3 ranks, unequal) and pipeline stages give one rank's
 * greedy ids. An MTP block (nextn_predict_layers) is skipped at load. Bad files give one line
 * naming the tensor and its expected shape.
 */
#include "common/common.h"
#include "gen_model.h"
#include "harness.h"
#include "infer/gguf_write.h"
#include "infer/infer.h"
#include "infer/model/model_int.h"
#include "infer/quant/quant.h"
#include "infer/tp.h"
#include "ref_util.h"

#include <math.h>
#include <pthread.h>

#define CTX  96
#define MAXL 8

/* The fixture: 6 layers, full attention at 2 and 5 (interval 3), 4 query heads over 2 KV heads
 * of 32, rope on 8 dims whose last pair falls in the (unrotated) fourth M-RoPE section;
 * DeltaNet 2 key heads, 4 value heads (value head h reads key head h % 2), state 32. */
static mkmodel_opts_t fix_opts(const char *arch, int type, int seed)
{
	mkmodel_opts_t o = {.arch = arch,
			    .dim = 128,
			    .layers = 6,
			    .heads = 4,
			    .kv_heads = 2,
			    .head_dim = 32,
			    .ffn = 256,
			    .vocab = 512,
			    .ctx = 256,
			    .type = type,
			    .seed = (uint64_t)seed,
			    .experts = 8,
			    .experts_used = 2,
			    .expert_ffn = 64,
			    .ssm_state = 32,
			    .ssm_k_heads = 2,
			    .ssm_v_heads = 4,
			    .attn_interval = 3,
			    .rope_dim = 8};
	return o;
}

/* ---- the reference -------------------------------------------------------------------------- */

typedef struct ref {
	const model_meta_t *p;
	float *embd, *out_norm, *out;
	struct {
		float *attn_norm, *post_norm;
		float *wq, *wk, *wv, *wo, *qn, *kn;                            /* full attention */
		float *qkv, *gate, *conv, *dt, *a, *beta, *alpha, *norm, *out; /* DeltaNet */
		float *w1, *w2, *w3;                                /* dense: gate, up, down */
		float *router, *eg, *eu, *ed, *sg, *su, *sd, *sinp; /* experts, shared */
		float *kc, *vc;                                     /* [CTX][kvd] */
		double *hist;                                       /* [d_conv - 1][conv] */
		double *S;                                          /* [n_v][ds][ds] */
	} L[MAXL];
} ref_t;

static void ref_open(ref_t *R, const gguf_t *g, const model_meta_t *p)
{
	memset(R, 0, sizeof *R);
	R->p = p;
	R->embd = ref_deq(g, "token_embd.weight");
	R->out_norm = ref_deq(g, "output_norm.weight");
	R->out = ref_deq(g, "output.weight");
	const meta_dn_t *x = &p->dn;
	int conv = (2 * x->n_k_heads + x->n_v_heads) * x->d_state;
	char n[96];
	for (int l = 0; l < p->n_layers; l++) {
#define D(f, s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), R->L[l].f = ref_deq(g, n))
		D(attn_norm, "attn_norm.weight");
		D(post_norm, "post_attention_norm.weight");
		D(wq, "attn_q.weight");
		D(wk, "attn_k.weight");
		D(wv, "attn_v.weight");
		D(wo, "attn_output.weight");
		D(qn, "attn_q_norm.weight");
		D(kn, "attn_k_norm.weight");
		D(qkv, "attn_qkv.weight");
		D(gate, "attn_gate.weight");
		D(conv, "ssm_conv1d.weight");
		D(dt, "ssm_dt.bias");
		D(a, "ssm_a");
		D(beta, "ssm_beta.weight");
		D(alpha, "ssm_alpha.weight");
		D(norm, "ssm_norm.weight");
		D(out, "ssm_out.weight");
		D(w1, "ffn_gate.weight");
		D(w2, "ffn_up.weight");
		D(w3, "ffn_down.weight");
		D(router, "ffn_gate_inp.weight");
		D(eg, "ffn_gate_exps.weight");
		D(eu, "ffn_up_exps.weight");
		D(ed, "ffn_down_exps.weight");
		D(sg, "ffn_gate_shexp.weight");
		D(su, "ffn_up_shexp.weight");
		D(sd, "ffn_down_shexp.weight");
		D(sinp, "ffn_gate_inp_shexp.weight");
#undef D
		int kvd = p->n_kv_heads * p->head_dim;
		R->L[l].kc = calloc((size_t)CTX * kvd, sizeof(float));
		R->L[l].vc = calloc((size_t)CTX * kvd, sizeof(float));
		R->L[l].hist = calloc((size_t)(x->d_conv - 1) * conv + 1, sizeof(double));
		R->L[l].S = calloc((size_t)x->n_v_heads * x->d_state * x->d_state, sizeof(double));
	}
}

static void ref_close(ref_t *R)
{
	free(R->embd);
	free(R->out_norm);
	free(R->out);
	for (int l = 0; l < R->p->n_layers; l++) {
		float **f = &R->L[l].attn_norm;
		for (int i = 0; f + i < &R->L[l].kc + 2; i++)
			free(f[i]);
		free(R->L[l].hist);
		free(R->L[l].S);
	}
}

/* Interleaved M-RoPE on text (every position component = pos, the fourth = 0), NeoX pairs over
 * the first rope_dim dims: pair i turns by pos * base^(-2i/rope_dim) unless its sector falls
 * in the fourth section (then by 0). */
static void ref_rope(const model_meta_t *p, float *h, int pos)
{
	const int *s = p->dn.sections;
	int half = p->rope_dim / 2, sum = s[0] + s[1] + s[2] + s[3];
	for (int i = 0; i < half; i++) {
		int k = i % sum;
		int t = (k % 3 == 0 && k < 3 * s[0]) || (k % 3 == 1 && k < 3 * s[1]) ||
			(k % 3 == 2 && k < 3 * s[2]);
		double a = t ? pos * pow(p->rope_base, -2.0 * i / p->rope_dim) : 0;
		double x0 = h[i], x1 = h[i + half];
		h[i] = (float)(x0 * cos(a) - x1 * sin(a));
		h[i + half] = (float)(x0 * sin(a) + x1 * cos(a));
	}
}

static double dsilu(double g)
{
	return g / (1.0 + exp(-g));
}

static double dsig(double g)
{
	return 1.0 / (1.0 + exp(-g));
}

/* The DeltaNet block of layer l for x (normed) into y[D]. */
static void ref_deltanet(ref_t *R, int l, const float *xn, float *y)
{
	const model_meta_t *p = R->p;
	const meta_dn_t *x = &p->dn;
	int D = p->dim, ds = x->d_state, nk = x->n_k_heads, nv = x->n_v_heads, K = x->d_conv;
	int kd = nk * ds, vd = nv * ds, conv = 2 * kd + vd;
	float *raw = malloc(conv * sizeof *raw), *z = malloc(vd * sizeof *z);
	double *c = malloc(conv * sizeof *c), *o = malloc(vd * sizeof *o);
	float be[64], al[64], *yo = malloc(vd * sizeof *yo);
	ref_mv(raw, R->L[l].qkv, xn, conv, D);
	ref_mv(z, R->L[l].gate, xn, vd, D);
	ref_mv(be, R->L[l].beta, xn, nv, D);
	ref_mv(al, R->L[l].alpha, xn, nv, D);
	double *hist = R->L[l].hist;
	for (int ch = 0; ch < conv; ch++) { /* window: K - 1 earlier inputs, then this one */
		double s = 0;
		for (int k = 0; k < K - 1; k++)
			s += hist[(size_t)k * conv + ch] * R->L[l].conv[(size_t)ch * K + k];
		s += raw[ch] * R->L[l].conv[(size_t)ch * K + K - 1];
		for (int k = 0; k + 1 < K - 1; k++)
			hist[(size_t)k * conv + ch] = hist[(size_t)(k + 1) * conv + ch];
		if (K > 1)
			hist[(size_t)(K - 2) * conv + ch] = raw[ch];
		c[ch] = dsilu(s);
	}
	for (int h = 0; h < 2 * nk; h++) { /* q, k unit length */
		double ss = 0;
		for (int i = 0; i < ds; i++)
			ss += c[h * ds + i] * c[h * ds + i];
		double sc = 1.0 / fmax(sqrt(ss), p->rms_eps);
		for (int i = 0; i < ds; i++)
			c[h * ds + i] *= sc;
	}
	for (int h = 0; h < nv; h++) {
		const double *q = c + (h % nk) * ds, *k = c + kd + (h % nk) * ds,
			     *v = c + 2 * kd + h * ds;
		double a = al[h] + R->L[l].dt[h];
		double gg = (a > 20 ? a : log(1 + exp(a))) * R->L[l].a[h], b = dsig(be[h]);
		double *S = R->L[l].S + (size_t)h * ds * ds; /* S[j][i]: value j, key i */
		for (int j = 0; j < ds; j++) {
			double sk = 0;
			for (int i = 0; i < ds; i++) {
				S[j * ds + i] *= exp(gg);
				sk += S[j * ds + i] * k[i];
			}
			double d = (v[j] - sk) * b, oj = 0;
			for (int i = 0; i < ds; i++) {
				S[j * ds + i] += d * k[i];
				oj += S[j * ds + i] * q[i];
			}
			o[h * ds + j] = oj / sqrt((double)ds);
		}
		double ss = 0;
		for (int i = 0; i < ds; i++)
			ss += o[h * ds + i] * o[h * ds + i];
		double sc = 1.0 / sqrt(ss / ds + p->rms_eps);
		for (int i = 0; i < ds; i++)
			yo[h * ds + i] =
			    (float)(o[h * ds + i] * sc * R->L[l].norm[i] * dsilu(z[h * ds + i]));
	}
	ref_mv(y, R->L[l].out, yo, D, vd);
	free(raw);
	free(z);
	free(c);
	free(o);
	free(yo);
}

/* Gated full attention of layer l at pos. */
static void ref_attn(ref_t *R, int l, const float *xn, int pos, float *y)
{
	const model_meta_t *p = R->p;
	int D = p->dim, hd = p->head_dim, H = p->n_heads, KH = p->n_kv_heads, qd = H * hd;
	int kvd = KH * hd;
	float qf[2048], q[1024], k[512], v[512], att[1024];
	ref_mv(qf, R->L[l].wq, xn, 2 * qd, D);
	ref_mv(k, R->L[l].wk, xn, kvd, D);
	ref_mv(v, R->L[l].wv, xn, kvd, D);
	for (int h = 0; h < H; h++) {
		ref_norm(q + h * hd, qf + h * 2 * hd, R->L[l].qn, hd, p->rms_eps);
		ref_rope(p, q + h * hd, pos);
	}
	for (int h = 0; h < KH; h++) {
		ref_norm(k + h * hd, k + h * hd, R->L[l].kn, hd, p->rms_eps);
		ref_rope(p, k + h * hd, pos);
	}
	memcpy(R->L[l].kc + (size_t)pos * kvd, k, kvd * sizeof *k);
	memcpy(R->L[l].vc + (size_t)pos * kvd, v, kvd * sizeof *v);
	for (int h = 0; h < H; h++) {
		int kh = h / (H / KH);
		double sc[CTX];
		for (int t = 0; t <= pos; t++) {
			double d = 0;
			for (int i = 0; i < hd; i++)
				d += (double)q[h * hd + i] *
				     R->L[l].kc[(size_t)t * kvd + kh * hd + i];
			sc[t] = d / sqrt((double)hd);
		}
		ref_softmax(sc, pos + 1);
		for (int i = 0; i < hd; i++) {
			double o = 0;
			for (int t = 0; t <= pos; t++)
				o += sc[t] * R->L[l].vc[(size_t)t * kvd + kh * hd + i];
			att[h * hd + i] = (float)(o * dsig(qf[h * 2 * hd + hd + i]));
		}
	}
	ref_mv(y, R->L[l].wo, att, D, qd);
}

/* The FFN of layer l: dense SwiGLU, or softmax top-k experts renormalised + the shared expert
 * times sigmoid(w . x). */
static void ref_ffn(ref_t *R, int l, const float *xn, float *y)
{
	const model_meta_t *p = R->p;
	int D = p->dim;
	float h[1024], h2[1024], t[1024];
	if (!p->n_experts) {
		int F = p->ffn;
		ref_mv(h, R->L[l].w1, xn, F, D);
		ref_mv(h2, R->L[l].w2, xn, F, D);
		for (int i = 0; i < F; i++)
			h[i] = (float)(dsilu(h[i]) * h2[i]);
		ref_mv(y, R->L[l].w3, h, D, F);
		return;
	}
	int E = p->n_experts, K = p->n_experts_used, F = p->ffn_exp, S = p->ffn_shexp;
	float lg[64];
	double pr[64], wsum = 0;
	int sel[8];
	ref_mv(lg, R->L[l].router, xn, E, D);
	for (int e = 0; e < E; e++)
		pr[e] = lg[e];
	ref_softmax(pr, E);
	for (int i = 0; i < K; i++) {
		int b = -1;
		for (int e = 0; e < E; e++) {
			int used = 0;
			for (int j = 0; j < i; j++)
				used |= sel[j] == e;
			if (!used && (b < 0 || pr[e] > pr[b]))
				b = e;
		}
		sel[i] = b;
		wsum += pr[b];
	}
	memset(y, 0, D * sizeof *y);
	for (int i = 0; i < K; i++) {
		int e = sel[i];
		ref_mv(h, R->L[l].eg + (size_t)e * F * D, xn, F, D);
		ref_mv(h2, R->L[l].eu + (size_t)e * F * D, xn, F, D);
		for (int j = 0; j < F; j++)
			h[j] = (float)(dsilu(h[j]) * h2[j]);
		ref_mv(t, R->L[l].ed + (size_t)e * D * F, h, D, F);
		for (int j = 0; j < D; j++)
			y[j] += (float)(pr[e] / wsum * t[j]);
	}
	ref_mv(h, R->L[l].sg, xn, S, D);
	ref_mv(h2, R->L[l].su, xn, S, D);
	for (int j = 0; j < S; j++)
		h[j] = (float)(dsilu(h[j]) * h2[j]);
	ref_mv(t, R->L[l].sd, h, D, S);
	double gs = 0;
	for (int j = 0; j < D; j++)
		gs += (double)R->L[l].sinp[j] * xn[j];
	for (int j = 0; j < D; j++)
		y[j] += (float)(dsig(gs) * t[j]);
}

/* One token at pos; logits[n_vocab]. */
static void ref_step(ref_t *R, int tok, int pos, float *logits)
{
	const model_meta_t *p = R->p;
	int D = p->dim;
	float x[1024], xn[1024], y[1024];
	memcpy(x, R->embd + (size_t)tok * D, D * sizeof *x);
	for (int l = 0; l < p->n_layers; l++) {
		ref_norm(xn, x, R->L[l].attn_norm, D, p->rms_eps);
		if (p->dn.recurrent[l])
			ref_deltanet(R, l, xn, y);
		else
			ref_attn(R, l, xn, pos, y);
		for (int i = 0; i < D; i++)
			x[i] += y[i];
		ref_norm(xn, x, R->L[l].post_norm, D, p->rms_eps);
		ref_ffn(R, l, xn, y);
		for (int i = 0; i < D; i++)
			x[i] += y[i];
	}
	ref_norm(xn, x, R->out_norm, D, p->rms_eps);
	ref_mv(logits, R->out, xn, p->n_vocab, D);
}

/* ---- fixtures ------------------------------------------------------------------------------- */

typedef struct fix {
	gguf_t *g;
	model_meta_t meta;
	model_t *m;
	pool_t *pool;
	char path[256];
} fix_t;

static int fix_open_opts(fix_t *x, const mkmodel_opts_t *o, int threads, int slots)
{
	char err[256];
	memset(x, 0, sizeof *x);
	snprintf(x->path, sizeof x->path, "/tmp/shoal-test-q35-%d-%s-%d.gguf", (int)getpid(),
		 o->arch, o->type);
	if (gen_file(o, x->path, &x->g, &x->meta, o->arch))
		return -1;
	if (!(x->pool = pool_new(threads)) ||
	    model_new_slots(&x->m, x->g, &x->meta, NULL, CTX, slots, QT_F32, x->pool, err,
			    sizeof err)) {
		fprintf(stderr, "fix_open %s: %s\n", o->arch, err);
		return -1;
	}
	return 0;
}

static int fix_open(fix_t *x, const char *arch, int type, int threads)
{
	mkmodel_opts_t o = fix_opts(arch, type, 5);
	return fix_open_opts(x, &o, threads, 2);
}

static void fix_close(fix_t *x)
{
	model_free(x->m);
	pool_free(x->pool);
	gguf_free(x->g);
	unlink(x->path);
}

static const int prompt[12] = {256, 72, 101, 108, 108, 111, 32, 116, 104, 101, 281, 300};

/* max |a - b| over n, relative to max |b| */
static double rel_err(const float *a, const float *b, int n)
{
	double e = 0, s = 1e-9;
	for (int i = 0; i < n; i++) {
		e = fmax(e, fabs((double)a[i] - b[i]));
		s = fmax(s, fabs((double)b[i]));
	}
	return e / s;
}

/* ---- engine vs reference -------------------------------------------------------------------- */

/* F32: the prompt token by token, then 20 greedy steps; logits close at every step. */
static void f32_matches_reference(const char *arch)
{
	fix_t x;
	if (fix_open(&x, arch, QT_F32, 2)) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(x.meta.n_layers, 6);
	CHECK_EQ_INT(x.meta.dn.n_recurrent, 4);
	CHECK(x.meta.dn.recurrent[0] && !x.meta.dn.recurrent[2] && !x.meta.dn.recurrent[5]);
	ref_t R;
	ref_open(&R, x.g, &x.meta);
	int V = x.meta.n_vocab;
	float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
	double worst = 0;
	int tok = prompt[0], same = 1;
	for (int pos = 0; pos < 32; pos++) {
		if (pos < 12)
			tok = prompt[pos];
		CHECK_EQ_INT(model_forward(x.m, &tok, 1, pos, a), 0);
		ref_step(&R, tok, pos, b);
		worst = fmax(worst, rel_err(a, b, V));
		same &= sh_argmax(a, V) == sh_argmax(b, V);
		tok = sh_argmax(b, V);
	}
	if (worst > 1e-3 || !same)
		fprintf(stderr, "%s: worst relative logit error %.2e, same argmax %d\n", arch,
			worst, same);
	CHECK(worst <= 1e-3);
	CHECK(same);
	ref_close(&R);
	free(a);
	free(b);
	fix_close(&x);
}

TEST(qwen35_f32_vs_reference)
{
	f32_matches_reference("qwen35");
}
TEST(qwen35moe_f32_vs_reference)
{
	f32_matches_reference("qwen35moe");
}

/* Q8_0: the engine's greedy ids equal the reference's on the dequantized weights. */
static void q8_greedy_matches_reference(const char *arch)
{
	fix_t x;
	if (fix_open(&x, arch, QT_Q8_0, 2)) {
		CHECK(0);
		return;
	}
	ref_t R;
	ref_open(&R, x.g, &x.meta);
	int V = x.meta.n_vocab, agree = 0;
	float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
	CHECK_EQ_INT(model_forward(x.m, prompt, 12, 0, a), 0);
	for (int pos = 0; pos < 12; pos++)
		ref_step(&R, prompt[pos], pos, b);
	for (int i = 0; i < 16; i++) {
		int ta = sh_argmax(a, V), tb = sh_argmax(b, V);
		agree += ta == tb;
		if (ta != tb) /* how near a tie the reference had it */
			fprintf(stderr, "%s q8_0 step %d: %d vs %d, reference margin %.4f\n", arch,
				i, ta, tb, b[tb] - b[ta]);
		if (getenv("Q35_DEBUG"))
			fprintf(stderr, "step %d rel %.4f\n", i, rel_err(a, b, V));
		CHECK_EQ_INT(model_forward(x.m, &tb, 1, 12 + i, a), 0);
		ref_step(&R, tb, 12 + i, b);
	}
	if (agree < 14)
		fprintf(stderr, "%s q8_0: %d of 16 greedy ids agree\n", arch, agree);
	/* 8-bit activations flip near ties; in a MoE layer a flipped expert choice also moves the
	 * recurrent state for the steps after (measured: 15 and 14 of 16 here) */
	CHECK(agree >= 14);
	ref_close(&R);
	free(a);
	free(b);
	fix_close(&x);
}

TEST(qwen35_q8_0_greedy)
{
	q8_greedy_matches_reference("qwen35");
}
TEST(qwen35moe_q8_0_greedy)
{
	q8_greedy_matches_reference("qwen35moe");
}

/* ---- the recurrent state -------------------------------------------------------------------- */

/* The prompt in one pass, in chunks of 5 and token by token: the same last logits. */
TEST(prefill_chunks_equal_recurrence)
{
	fix_t x;
	if (fix_open(&x, "qwen35", QT_F32, 2)) {
		CHECK(0);
		return;
	}
	int V = x.meta.n_vocab;
	float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b), *c = malloc(V * sizeof *c);
	CHECK_EQ_INT(model_forward(x.m, prompt, 12, 0, a), 0);
	for (int p = 0; p < 12; p += 5)
		CHECK_EQ_INT(model_forward(x.m, prompt + p, MIN(5, 12 - p), p, b), 0);
	for (int p = 0; p < 12; p++)
		CHECK_EQ_INT(model_forward(x.m, prompt + p, 1, p, c), 0);
	CHECK(rel_err(a, c, V) < 1e-5);
	CHECK(rel_err(b, c, V) < 1e-5);
	free(a);
	free(b);
	free(c);
	fix_close(&x);
}

/* Two sequences interleaved in batches (one prefilling while the other decodes) give each one's
 * logits alone. */
TEST(slots_batch_equals_alone)
{
	fix_t x;
	if (fix_open(&x, "qwen35moe", QT_F32, 2)) {
		CHECK(0);
		return;
	}
	int V = x.meta.n_vocab;
	static const int other[6] = {300, 260, 301, 97, 98, 99};
	float *alone0 = malloc(V * sizeof(float)), *alone1 = malloc(V * sizeof(float));
	float *both = malloc(2 * V * sizeof(float));
	CHECK_EQ_INT(model_forward(x.m, other, 6, 0, alone1), 0);
	CHECK_EQ_INT(model_forward(x.m, prompt, 12, 0, alone0), 0);
	/* slot 0: prompt[0..8) then [8..12); slot 1: other[0..3) then [3..6), mixed */
	int t1[11], s1[11], p1[11], o1[11];
	int n = 0;
	for (int i = 0; i < 8; i++)
		t1[n] = prompt[i], s1[n] = 0, p1[n] = i, o1[n++] = 0;
	for (int i = 0; i < 3; i++)
		t1[n] = other[i], s1[n] = 1, p1[n] = i, o1[n++] = 0;
	model_batch_t b1 = {n, t1, s1, p1, o1, NULL, NULL};
	CHECK_EQ_INT(model_forward_batch(x.m, &b1, NULL), 0);
	int t2[7], s2[7], p2[7], o2[7];
	n = 0;
	for (int i = 3; i < 6; i++) /* slot 1 first this time */
		t2[n] = other[i], s2[n] = 1, p2[n] = i, o2[n++] = i == 5;
	for (int i = 8; i < 12; i++)
		t2[n] = prompt[i], s2[n] = 0, p2[n] = i, o2[n++] = i == 11;
	model_batch_t b2 = {n, t2, s2, p2, o2, NULL, NULL};
	CHECK_EQ_INT(model_forward_batch(x.m, &b2, both), 0);
	CHECK(rel_err(both, alone1, V) < 1e-5);
	CHECK(rel_err(both + V, alone0, V) < 1e-5);
	free(alone0);
	free(alone1);
	free(both);
	fix_close(&x);
}

/* Logits of tokens[0..n) in slot 0 from position 0 on a fresh pass. */
static void fresh(fix_t *x, const int *tokens, int n, float *out)
{
	CHECK_EQ_INT(model_forward(x->m, tokens, n, 0, out), 0);
}

/* A checkpoint kept at position 8 of a 12-token prompt: a second sequence sharing the first 10
 * tokens resumes from it (model_seq_resume_pos says 8), and equals a fresh pass. Without a
 * held state the pass is refused. */
TEST(checkpoint_resume)
{
	fix_t x;
	if (fix_open(&x, "qwen35", QT_F32, 2)) {
		CHECK(0);
		return;
	}
	int V = x.meta.n_vocab;
	float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
	int keep[12] = {0}, slot[12] = {0}, pos[12], out[12] = {0};
	for (int i = 0; i < 12; i++)
		pos[i] = i;
	keep[7] = 1; /* the state after 8 tokens */
	out[11] = 1;
	model_batch_t bt = {12, prompt, slot, pos, out, keep, NULL};
	CHECK_EQ_INT(model_forward_batch(x.m, &bt, a), 0);
	CHECK_EQ_INT(model_seq_resume_pos(x.m, 0, 12), 12);
	CHECK_EQ_INT(model_seq_resume_pos(x.m, 0, 10), 8);
	CHECK_EQ_INT(model_seq_resume_pos(x.m, 0, 7), 0);
	CHECK_EQ_INT(model_seq_resume_pos(x.m, 1, 12), 0); /* the other slot holds nothing */
	/* a position between states is refused, and changes nothing */
	int t = 300;
	CHECK_EQ_INT(model_forward(x.m, &t, 1, 10, b), SH_EINVAL);
	int alt[12];
	memcpy(alt, prompt, sizeof alt);
	alt[10] = 400, alt[11] = 401;
	CHECK_EQ_INT(model_forward(x.m, alt + 8, 4, 8, a), 0); /* resumes at the checkpoint */
	CHECK_EQ_INT(model_seq_resume_pos(x.m, 0, 12), 12);
	/* the same on a fresh model: slot 0 of another model from scratch */
	fix_t y;
	if (fix_open(&y, "qwen35", QT_F32, 1)) {
		CHECK(0);
	} else {
		fresh(&y, alt, 12, b);
		CHECK(rel_err(a, b, V) < 1e-5);
		fix_close(&y);
	}
	free(a);
	free(b);
	fix_close(&x);
}

/* Rollback (speculative decoding): with a ring of 4, a step feeding 4 tokens at once keeps the
 * state after each; continuing after the 2nd of them (the others rejected) with another token
 * equals a fresh pass over the accepted tokens. Depth 0 keeps only the last. */
TEST(rollback_ring)
{
	fix_t x;
	char err[256];
	if (fix_open(&x, "qwen35moe", QT_F32, 2)) {
		CHECK(0);
		return;
	}
	int V = x.meta.n_vocab;
	float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
	CHECK_EQ_INT(model_set_rollback(x.m, 3, err, sizeof err), 0);
	CHECK(model_rs_bytes_per_slot(x.m) > 0);
	CHECK_EQ_INT(model_forward(x.m, prompt, 8, 0, a), 0);
	CHECK_EQ_INT(model_forward(x.m, prompt + 8, 4, 8, a), 0); /* "verify" 4 at once */
	for (int p = 9; p <= 12; p++)
		CHECK_EQ_INT(model_seq_resume_pos(x.m, 0, p), p);
	CHECK_EQ_INT(model_seq_resume_pos(x.m, 0, 8), 0); /* left the ring */
	int acc[11];
	memcpy(acc, prompt, 10 * sizeof *acc);
	acc[10] = 333;
	CHECK_EQ_INT(model_forward(x.m, acc + 10, 1, 10, a), 0); /* 2 of 4 accepted */
	CHECK_EQ_INT(model_seq_resume_pos(x.m, 0, 12), 11);      /* 11, 12 forgotten */
	fix_t y;
	if (fix_open(&y, "qwen35moe", QT_F32, 1)) {
		CHECK(0);
	} else {
		fresh(&y, acc, 11, b);
		CHECK(rel_err(a, b, V) < 1e-5);
		fix_close(&y);
	}
	CHECK_EQ_INT(model_set_rollback(x.m, 0, err, sizeof err), 0);
	CHECK_EQ_INT(model_forward(x.m, prompt, 12, 0, a), 0);
	CHECK_EQ_INT(model_seq_resume_pos(x.m, 0, 11), 0);
	CHECK(model_set_rollback(x.m, -1, err, sizeof err) < 0);
	free(a);
	free(b);
	fix_close(&x);
}

/* ---- the engine: prefix reuse across requests ------------------------------------------------ */

typedef struct got {
	int ids[16], n;
} got_t;

static int on_tok(void *ud, const eng_token_t *t)
{
	got_t *g = ud;
	if (g->n < 16)
		g->ids[g->n++] = t->id;
	return 0;
}

/* One slot: a request, then one sharing its prompt but for the last 3 tokens (resumes from the
 * checkpoint 4 tokens before the first prompt's end), then the first again (from the one before
 * its end): each gives the ids of a fresh engine. */
TEST(engine_prefix_reuse)
{
	char path[256], err[256];
	snprintf(path, sizeof path, "/tmp/shoal-test-q35-eng-%d.gguf", (int)getpid());
	mkmodel_opts_t o = fix_opts("qwen35", QT_F32, 9);
	if (mkmodel_write(&o, path, err, sizeof err)) {
		fprintf(stderr, "%s\n", err);
		CHECK(0);
		return;
	}
	eng_opts_t eo = {
	    .model_path = path, .threads = 2, .ctx = 64, .parallel = 1, .kv_type = "f32"};
	eng_t *e = NULL, *f = NULL;
	CHECK_EQ_INT(eng_open(&e, &eo, err, sizeof err), 0);
	CHECK(eng_info(e)->rs_bytes > 0);
	eng_sampling_t s;
	eng_sampling_default(&s);
	s.max_tokens = 6;
	int p2[12];
	memcpy(p2, prompt, sizeof p2);
	p2[9] = 290, p2[10] = 291, p2[11] = 292;
	const int *ps[3] = {prompt, p2, prompt};
	got_t g1[3] = {{{0}, 0}}, g2[3] = {{{0}, 0}};
	eng_result_t r;
	for (int i = 0; e && i < 3; i++)
		CHECK_EQ_INT(eng_generate(e, ps[i], 12, &s, on_tok, &g1[i], &r), 0);
	for (int i = 0; i < 3; i++) {
		CHECK_EQ_INT(eng_open(&f, &eo, err, sizeof err), 0);
		if (f)
			CHECK_EQ_INT(eng_generate(f, ps[i], 12, &s, on_tok, &g2[i], &r), 0);
		eng_free(f);
		f = NULL;
		CHECK_EQ_INT(g1[i].n, g2[i].n);
		CHECK(!memcmp(g1[i].ids, g2[i].ids, sizeof g1[i].ids));
	}
	eng_free(e);
	/* a rollback depth keeps that many more states per slot (1 + depth in the ring, plus the
	 * checkpoints) */
	eo.rollback = 3;
	CHECK_EQ_INT(eng_open(&e, &eo, err, sizeof err), 0);
	if (e) {
		gguf_t *g = NULL;
		model_meta_t mt;
		CHECK_EQ_INT(gguf_open(&g, path, err, sizeof err), 0);
		CHECK_EQ_INT(meta_load(&mt, g, err, sizeof err), 0);
		CHECK_EQ_INT(eng_info(e)->rs_bytes, meta_dn_state_bytes(&mt, mt.dn.n_k_heads) *
							mt.dn.n_recurrent *
							(4 + MODEL_CHECKPOINTS));
		gguf_free(g);
		got_t g3 = {{0}, 0};
		CHECK_EQ_INT(eng_generate(e, prompt, 12, &s, on_tok, &g3, &r), 0);
		CHECK(!memcmp(g3.ids, g2[0].ids, sizeof g3.ids)); /* the same text */
		eng_free(e);
	}
	eo.rollback = 65;
	CHECK(eng_open(&e, &eo, err, sizeof err) < 0);
	unlink(path);
}

/* ---- llama.cpp ---------------------------------------------------------------------------------
 * Expected outputs of llama.cpp for tiny generated files. The files are `shoal mkmodel --arch
 * ARCH --dim 128 --layers 6 --heads 4 --kv-heads 2 --head-dim 32 --ffn 256 --vocab 512 --ctx 256
 * --type TYPE --seed 11 --experts 8 --experts-used 2 --expert-ffn 64 --ssm-state 32
 * --ssm-k-heads 2 --ssm-v-heads 4 --attn-interval 3 --rope-dim 8 --nextn 1` (regenerated here
 * from the same options: mkmodel is deterministic), so they carry an MTP block llama.cpp skips
 * too. The numbers came from the 2026 llama.cpp tree this project was given (src/ at
 * /work/llama.cpp, ggml 0.18.1, no git metadata; libllama built with its CMake defaults, CPU
 * only) through a 40-line C++ program against libllama: llama_tokenize(prompt, add_special,
 * parse_special), llama_batch_get_one over the prompt then one token per step, default context
 * parameters (F16 KV cache, flash attention auto, n_ctx 512), greedy, log-softmax of
 * llama_get_logits_ith(-1). Its prompt ids equal shoal's (30 tokens). Measured: F32 ids and
 * top-5 equal, |delta logprob| <= 0.0013 over the 8 steps; Q8_0 the same first id (later steps
 * differ on near ties: 8-bit activations round differently). */
static const char VPROMPT[] = "The quick brown fox jumps over the lazy dog";

typedef struct lvec {
	const char *arch;
	int type;
	int ids[8];
	struct {
		int id;
		float lp;
	} top[8][5];
} lvec_t;

static const lvec_t LVEC[] = {
    {"qwen35",
     QT_F32,
     {488, 338, 82, 360, 336, 39, 433, 71},
     {{{488, -1.26457f}, {414, -2.17177f}, {444, -2.85747f}, {270, -3.13615f}, {508, -3.20762f}},
      {{338, -0.54969f}, {288, -3.31931f}, {98, -3.41494f}, {65, -3.54370f}, {76, -3.57109f}},
      {{82, -2.14851f}, {342, -2.50346f}, {323, -2.64969f}, {377, -2.65238f}, {437, -3.01205f}},
      {{360, -0.51456f}, {383, -1.37642f}, {33, -2.89589f}, {295, -4.07260f}, {304, -5.15629f}},
      {{336, -1.05174f}, {285, -1.67948f}, {299, -2.37832f}, {335, -2.78592f}, {356, -3.11582f}},
      {{39, -1.94041f}, {482, -1.94876f}, {92, -2.15681f}, {86, -2.36159f}, {366, -2.51115f}},
      {{433, -1.72782f}, {470, -1.93684f}, {376, -2.04961f}, {368, -2.15920f}, {261, -3.11503f}},
      {{71, -1.38147f}, {117, -2.58111f}, {300, -2.70270f}, {399, -2.80538f}, {57, -2.88417f}}}},
    {"qwen35moe",
     QT_F32,
     {392, 310, 383, 434, 101, 345, 341, 81},
     {{{392, -1.97066f}, {108, -2.05658f}, {399, -2.23472f}, {490, -3.02389f}, {316, -3.22324f}},
      {{310, -2.16967f}, {55, -2.43984f}, {10, -2.72237f}, {449, -2.93832f}, {396, -2.94054f}},
      {{383, -1.82694f}, {64, -2.26243f}, {365, -2.45688f}, {496, -3.27795f}, {470, -3.29086f}},
      {{434, -1.16934f}, {324, -1.90597f}, {353, -2.32113f}, {354, -3.00851f}, {447, -3.63424f}},
      {{101, -1.44331f}, {270, -2.55926f}, {49, -2.56535f}, {401, -3.19221f}, {451, -3.68880f}},
      {{345, -2.07408f}, {32, -2.11176f}, {359, -2.11204f}, {465, -2.13763f}, {449, -2.84895f}},
      {{341, -0.52038f}, {393, -2.07238f}, {470, -3.61141f}, {264, -3.86271f}, {60, -4.34587f}},
      {{81, -0.08359f}, {289, -3.72255f}, {392, -4.39457f}, {287, -5.01138f}, {469, -5.14970f}}}},
    {"qwen35",
     QT_Q8_0,
     {488, 338, 82, 360, 336, 482, 475, 451},
     {{{488, -1.25318f}, {414, -2.16323f}, {444, -2.93629f}, {270, -3.11645f}, {508, -3.21901f}},
      {{338, -0.54776f}, {98, -3.27563f}, {65, -3.33004f}, {288, -3.37734f}, {52, -3.53800f}},
      {{82, -2.06286f}, {342, -2.42941f}, {377, -2.67335f}, {323, -2.85541f}, {437, -3.11008f}},
      {{360, -0.53875f}, {383, -1.33981f}, {33, -2.83703f}, {295, -4.06747f}, {304, -5.09973f}},
      {{336, -1.16581f}, {285, -1.50621f}, {299, -2.21692f}, {335, -2.79546f}, {356, -3.14792f}},
      {{482, -1.92766f}, {39, -1.97529f}, {92, -2.15114f}, {86, -2.37182f}, {366, -2.51077f}},
      {{475, -1.23354f}, {266, -1.68783f}, {439, -1.83831f}, {318, -2.59336f}, {378, -3.26288f}},
      {{451, -1.81537f}, {53, -1.99723f}, {322, -2.71900f}, {296, -2.72816f}, {61, -2.82766f}}}},
    {"qwen35moe",
     QT_Q8_0,
     {392, 55, 79, 291, 490, 478, 43, 370},
     {{{392, -1.89684f}, {108, -2.06266f}, {399, -2.25703f}, {490, -3.08329f}, {316, -3.16945f}},
      {{55, -2.41882f}, {310, -2.44585f}, {449, -2.81546f}, {10, -2.84556f}, {124, -2.88957f}},
      {{79, -1.34372f}, {483, -2.09569f}, {350, -2.83750f}, {429, -2.84272f}, {73, -2.92923f}},
      {{291, -1.93093f}, {505, -2.55292f}, {361, -2.58607f}, {118, -2.92244f}, {482, -2.96207f}},
      {{490, -1.05606f}, {498, -2.28934f}, {98, -2.75628f}, {83, -3.02503f}, {393, -3.49535f}},
      {{478, -1.14863f}, {317, -1.69262f}, {86, -2.03965f}, {327, -3.44739f}, {76, -3.64900f}},
      {{43, -1.38208f}, {289, -2.01102f}, {125, -2.82096f}, {381, -2.91709f}, {52, -3.34865f}},
      {{370, -1.76558f}, {89, -1.83615f}, {403, -2.51598f}, {303, -3.03513f}, {358, -3.08583f}}}},
};

typedef struct lgot {
	int n, ids[8];
	eng_logprob_t top[8][5];
} lgot_t;

static int lcollect(void *ud, const eng_token_t *t)
{
	lgot_t *g = ud;
	if (g->n < 8 && t->n_top == 5) {
		g->ids[g->n] = t->id;
		memcpy(g->top[g->n++], t->top, sizeof g->top[0]);
	}
	return 0;
}

TEST(llama_cpp_vectors)
{
	for (size_t v = 0; v < ARRAY_LEN(LVEC); v++) {
		const lvec_t *x = &LVEC[v];
		char path[256], err[256];
		snprintf(path, sizeof path, "/tmp/shoal-test-q35-lv-%d-%zu.gguf", (int)getpid(), v);
		mkmodel_opts_t o = fix_opts(x->arch, x->type, 11);
		o.nextn = 1;
		if (mkmodel_write(&o, path, err, sizeof err)) {
			fprintf(stderr, "%s\n", err);
			CHECK(0);
			continue;
		}
		eng_opts_t eo = {.model_path = path, .threads = 2, .ctx = 128, .parallel = 1};
		eng_t *e = NULL;
		int *ids = NULL, n = 0;
		CHECK_EQ_INT(eng_open(&e, &eo, err, sizeof err), 0);
		if (!e)
			continue;
		CHECK_EQ_INT(eng_tokenize(e, VPROMPT, 1, 1, &ids, &n, err, sizeof err), 0);
		CHECK_EQ_INT(n, 30);
		eng_sampling_t s;
		eng_sampling_default(&s);
		s.max_tokens = 8;
		s.top_logprobs = 5;
		lgot_t g = {0, {0}, {{{0, 0}}}};
		eng_result_t r;
		CHECK_EQ_INT(eng_generate(e, ids, n, &s, lcollect, &g, &r), 0);
		CHECK_EQ_INT(g.n, 8);
		if (x->type == QT_F32) { /* 8 ids, the top 5 and their log-probabilities */
			double worst = 0;
			int same = !memcmp(g.ids, x->ids, sizeof g.ids);
			for (int i = 0; i < g.n; i++)
				for (int k = 0; k < 5; k++) {
					same &= g.top[i][k].token == x->top[i][k].id;
					worst = fmax(worst,
						     fabs(g.top[i][k].logprob - x->top[i][k].lp));
				}
			if (!same || worst > 0.01)
				fprintf(stderr, "%s f32 vs llama.cpp: same %d, worst %.4f\n",
					x->arch, same, worst);
			CHECK(same);
			CHECK(worst <= 0.01);
		} else { /* quantized: the first id */
			CHECK_EQ_INT(g.ids[0], x->ids[0]);
		}
		free(ids);
		eng_free(e);
		unlink(path);
	}
}

/* ---- tensor and pipeline parallel in-process ------------------------------------------------- */

#define MAXR 3

/* Greedy: 12-token prefill then 16 decoded ids. */
static int greedy(model_t *m, int V, int *ids)
{
	return ref_greedy(m, V, prompt, 12, 16, ids);
}

static void shards_match_one_rank(const char *arch, int type, int world, const int *w)
{
	fix_t x;
	char err[256];
	if (fix_open(&x, arch, type, 1)) {
		CHECK(0);
		return;
	}
	int want[16], V = x.meta.n_vocab;
	CHECK_EQ_INT(greedy(x.m, V, want), 0);
	model_shard_t sh[MAXR];
	CHECK_EQ_INT(dist_split(&x.meta, 32, 0, world, w, sh, err, sizeof err), 0);
	model_t *m[MAXR];
	pool_t *pools[MAXR];
	int ids[MAXR][16];
	for (int r = 0; r < world; r++) {
		pools[r] = pool_new(1);
		m[r] = NULL;
		if (model_new_slots(&m[r], x.g, &x.meta, &sh[r], CTX, 1, QT_F32, pools[r], err,
				    sizeof err)) {
			fprintf(stderr, "rank %d: %s\n", r, err);
			CHECK(0);
			return;
		}
	}
	CHECK_EQ_INT(mem_shards_greedy(m, world, V, x.meta.dim, prompt, 12, 16, &ids[0][0]), 0);
	for (int r = 0; r < world; r++) {
		if (memcmp(ids[r], want, sizeof want)) {
			fprintf(stderr, "%s world %d rank %d:", arch, world, r);
			for (int i = 0; i < 16; i++)
				fprintf(stderr, " %d/%d", ids[r][i], want[i]);
			fprintf(stderr, "\n");
		}
		CHECK(!memcmp(ids[r], want, sizeof want));
		model_free(m[r]);
		pool_free(pools[r]);
	}
	fix_close(&x);
}

static const int w11[2] = {1, 1}, w21[2] = {2, 1}, w211[3] = {2, 1, 1};
TEST(qwen35_tensor_2)
{
	shards_match_one_rank("qwen35", QT_Q8_0, 2, w11);
}
TEST(qwen35_tensor_2_1_1)
{
	shards_match_one_rank("qwen35", QT_Q8_0, 3, w211);
}
TEST(qwen35moe_tensor_2_1)
{
	shards_match_one_rank("qwen35moe", QT_Q8_0, 2, w21);
}
TEST(qwen35moe_tensor_2_1_1)
{
	shards_match_one_rank("qwen35moe", QT_F32, 3, w211);
}

/* Pipeline: stages of layers, the hidden state handed on in-process (stage r reads what r - 1
 * wrote; the last stage keeps its output and computes the head). */
typedef struct hand {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int turn;
	float *buf; /* [B][dim] */
} hand_t;

typedef struct stage {
	int r, world, V, rc, ids[16];
	model_t *m;
	hand_t *h;
	mem_group_t *g;
} stage_t;

static int stage_pipe(void *ctx, int dir, float *x, int B, int dim)
{
	stage_t *s = ctx;
	hand_t *h = s->h;
	size_t n = (size_t)B * dim * sizeof *x;
	pthread_mutex_lock(&h->mu);
	if (dir == 0) {
		while (h->turn != s->r)
			pthread_cond_wait(&h->cv, &h->mu);
		memcpy(x, h->buf, n);
	} else {
		memcpy(h->buf, x, n);
		h->turn = s->r + 1 < s->world ? s->r + 1 : 0;
		pthread_cond_broadcast(&h->cv);
	}
	pthread_mutex_unlock(&h->mu);
	return 0;
}

static void *stage_main(void *arg)
{
	stage_t *s = arg;
	/* only the last stage's logits are real; it decides the tokens via the shared buffer */
	float *lg = malloc(s->V * sizeof *lg);
	int tok[12];
	memcpy(tok, prompt, sizeof tok);
	s->rc = model_forward(s->m, tok, 12, 0, s->r == s->world - 1 ? lg : NULL);
	for (int i = 0; i < 16 && !s->rc; i++) {
		static int next;
		if (s->r == s->world - 1)
			next = sh_argmax(lg, s->V);
		mem_group_wait(s->g);
		s->ids[i] = next;
		mem_group_wait(s->g);
		s->rc =
		    model_forward(s->m, &s->ids[i], 1, 12 + i, s->r == s->world - 1 ? lg : NULL);
	}
	free(lg);
	return NULL;
}

static void pipeline_matches_one_rank(const char *arch, int world)
{
	fix_t x;
	char err[256];
	if (fix_open(&x, arch, QT_Q8_0, 1)) {
		CHECK(0);
		return;
	}
	int want[16], V = x.meta.n_vocab;
	CHECK_EQ_INT(greedy(x.m, V, want), 0);
	model_shard_t sh[MAXR];
	CHECK_EQ_INT(dist_split(&x.meta, 32, 1, world, NULL, sh, err, sizeof err), 0);
	mem_group_t g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, world, 0, 0, {0}};
	hand_t hd = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0,
		     malloc((size_t)64 * x.meta.dim * sizeof(float))};
	stage_t st[MAXR];
	pool_t *pools[MAXR];
	pthread_t th[MAXR];
	for (int r = 0; r < world; r++) {
		pools[r] = pool_new(1);
		st[r] = (stage_t){r, world, V, 0, {0}, NULL, &hd, &g};
		if (model_new_slots(&st[r].m, x.g, &x.meta, &sh[r], CTX, 1, QT_F32, pools[r], err,
				    sizeof err)) {
			fprintf(stderr, "stage %d: %s\n", r, err);
			CHECK(0);
			return;
		}
		model_set_pipe(st[r].m, stage_pipe, &st[r]);
	}
	for (int r = 0; r < world; r++)
		pthread_create(&th[r], NULL, stage_main, &st[r]);
	for (int r = 0; r < world; r++)
		pthread_join(th[r], NULL);
	for (int r = 0; r < world; r++) {
		CHECK_EQ_INT(st[r].rc, 0);
		CHECK(!memcmp(st[r].ids, want, sizeof want));
		/* every stage keeps the same positions, layers or not */
		CHECK_EQ_INT(model_seq_resume_pos(st[r].m, 0, CTX), 28);
		model_free(st[r].m);
		pool_free(pools[r]);
	}
	free(hd.buf);
	fix_close(&x);
}

TEST(qwen35_pipeline_2)
{
	pipeline_matches_one_rank("qwen35", 2);
}
TEST(qwen35moe_pipeline_3)
{
	pipeline_matches_one_rank("qwen35moe", 3);
}

/* ---- loading ------------------------------------------------------------------------------ */

/* An MTP block (nextn_predict_layers 1, block_count 7) is not a layer of the model. */
TEST(mtp_block_skipped)
{
	mkmodel_opts_t o = fix_opts("qwen35moe", QT_Q8_0, 5);
	o.nextn = 1;
	fix_t x;
	if (fix_open_opts(&x, &o, 1, 1)) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(x.meta.n_layers, 6);
	CHECK_EQ_INT(x.meta.dn.n_nextn, 1);
	CHECK(gguf_find_tensor(x.g, "blk.6.nextn.eh_proj.weight") != NULL);
	int ids[16];
	CHECK_EQ_INT(greedy(x.m, x.meta.n_vocab, ids), 0);
	fix_close(&x);
}

/* Bytes per token count the DeltaNet matrices and one slot's state read and written. */
TEST(bytes_per_token)
{
	fix_t x;
	if (fix_open(&x, "qwen35", QT_Q8_0, 1)) {
		CHECK(0);
		return;
	}
	uint64_t want = x.meta.weight_bytes;
	want -= gguf_find_tensor(x.g, "token_embd.weight")->nbytes; /* one row of it */
	uint64_t st = meta_dn_state_bytes(&x.meta, x.meta.dn.n_k_heads);
	want += 2 * st * (uint64_t)x.meta.dn.n_recurrent;
	double got = (double)model_bytes_per_token(x.m);
	CHECK(fabs(got - (double)want) / (double)want < 0.05);
	/* the state of one slot: (1 ring + checkpoints) buffers of every DeltaNet layer */
	CHECK_EQ_INT(model_rs_bytes_per_slot(x.m),
		     st * x.meta.dn.n_recurrent * (1 + MODEL_CHECKPOINTS));
	fix_close(&x);
}

/* The planner's facts: which layers keep a KV cache, the state per slot of the others. */
TEST(model_shape_facts)
{
	char path[256], err[256];
	snprintf(path, sizeof path, "/tmp/shoal-test-q35-shape-%d.gguf", (int)getpid());
	mkmodel_opts_t o = fix_opts("qwen35moe", QT_Q8_0, 2);
	o.nextn = 1;
	CHECK_EQ_INT(mkmodel_write(&o, path, err, sizeof err), 0);
	eng_model_shape_t s;
	CHECK_EQ_INT(eng_model_shape(path, &s, err, sizeof err), 0);
	CHECK_EQ_INT(s.n_layers, 6);
	CHECK_EQ_INT(s.n_kv_layers, 2);
	CHECK_EQ_INT(s.recurrent[0], 0x1b); /* layers 0 1 3 4 */
	/* conv (4 - 1) x (2 x 2 + 4) x 32 + 4 value heads x 32 x 32, floats */
	CHECK_EQ_INT(s.rs_layer_bytes, 4 * (3 * 8 * 32 + 4 * 32 * 32));
	CHECK_EQ_INT(s.rs_copies, 1 + MODEL_CHECKPOINTS);
	unlink(path);
}

/* A qwen35 file with one key or tensor altered: meta_load's code and message. */
static int bad_model(const char *what, char *err, size_t errlen)
{
	char path[256];
	snprintf(path, sizeof path, "/tmp/shoal-test-q35-bad-%d.gguf", (int)getpid());
	mkmodel_opts_t o = fix_opts("qwen35", QT_F32, 3);
	o.layers = 2, o.attn_interval = 2;
	int rc = mkmodel_write(&o, path, err, errlen);
	if (rc)
		return rc;
	/* rewrite with the change: copy every key and tensor through the writer */
	gguf_t *g = NULL;
	if ((rc = gguf_open(&g, path, err, errlen)))
		return rc;
	gguf_writer_t *w = gw_new();
	for (int i = 0; i < gguf_n_kv(g); i++) {
		const char *k = gguf_key(g, i);
		int t = gguf_kv_type(g, i);
		if (!strcmp(what, "nosections") && strstr(k, "dimension_sections"))
			continue;
		if (t == GGUF_STR) {
			const char *s;
			size_t n;
			gguf_kv_str(g, i, &s, &n);
			char *c = strndup(s, n);
			gw_kv_str(w, k, c);
			free(c);
		} else if (t == GGUF_ARR && gguf_arr_type(g, i) == GGUF_STR) {
			uint64_t n = gguf_arr_n(g, i);
			const char **v = malloc(n * sizeof *v);
			char **own = malloc(n * sizeof *own);
			for (uint64_t j = 0; j < n; j++) {
				const char *s;
				size_t len;
				gguf_arr_str(g, i, j, &s, &len);
				v[j] = own[j] = strndup(s, len);
			}
			gw_kv_arr_str(w, k, v, n);
			for (uint64_t j = 0; j < n; j++)
				free(own[j]);
			free(own);
			free(v);
		} else if (t == GGUF_ARR) {
			uint64_t n = gguf_arr_n(g, i);
			int32_t *v = malloc(n * sizeof *v);
			for (uint64_t j = 0; j < n; j++) {
				int64_t x;
				gguf_arr_i64(g, i, j, &x);
				v[j] = (int32_t)x;
			}
			gw_kv_arr_i32(w, k, v, n);
			free(v);
		} else if (t == GGUF_F32) {
			double f;
			gguf_kv_f64(g, i, &f);
			gw_kv_f32(w, k, (float)f);
		} else if (t == GGUF_BOOL) {
			int64_t b;
			gguf_kv_i64(g, i, &b);
			gw_kv_bool(w, k, (int)b);
		} else {
			int64_t v;
			gguf_kv_i64(g, i, &v);
			if (!strcmp(what, "vheads") && strstr(k, "ssm.time_step_rank"))
				v = 3;
			gw_kv_u32(w, k, (uint32_t)v);
		}
	}
	for (int i = 0; i < gguf_n_tensors(g); i++) {
		const gguf_tensor_t *t = gguf_tensor(g, i);
		int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
		if (!strcmp(what, "missing") && !strcmp(t->name, "blk.0.ssm_alpha.weight"))
			continue;
		if (!strcmp(what, "shape") && !strcmp(t->name, "blk.0.ssm_out.weight"))
			ne[0] += 32;
		gw_tensor(w, t->name, t->n_dims, ne, t->type);
	}
	if (!(rc = gw_begin(w, path, err, errlen)))
		for (int i = 0; i < gguf_n_tensors(g) && !rc; i++) {
			const gguf_tensor_t *t = gguf_tensor(g, i);
			if (!strcmp(what, "missing") && !strcmp(t->name, "blk.0.ssm_alpha.weight"))
				continue;
			size_t n = t->nbytes;
			if (!strcmp(what, "shape") && !strcmp(t->name, "blk.0.ssm_out.weight"))
				n += (size_t)32 * 4 * t->ne[1];
			uint8_t *z = calloc(1, n);
			rc = gw_data(w, z, n, err, errlen);
			free(z);
		}
	if (!rc)
		rc = gw_finish(w, err, errlen);
	gw_free(w);
	gguf_free(g);
	g = NULL;
	model_meta_t m;
	if (!rc && !(rc = gguf_open(&g, path, err, errlen)))
		rc = meta_load(&m, g, err, errlen);
	gguf_free(g);
	unlink(path);
	return rc;
}

TEST(bad_input)
{
	char err[256];
	CHECK_EQ_INT(bad_model("ok", err, sizeof err), 0);
	CHECK_EQ_INT(bad_model("missing", err, sizeof err), SH_EFORMAT);
	CHECK(strstr(err, "blk.0.ssm_alpha.weight") != NULL);
	CHECK_EQ_INT(bad_model("shape", err, sizeof err), SH_EFORMAT);
	CHECK(strstr(err, "blk.0.ssm_out.weight") && strstr(err, "expected [128, 128]"));
	CHECK_EQ_INT(bad_model("vheads", err, sizeof err), SH_EFORMAT);
	CHECK(strstr(err, "value heads") != NULL);
	CHECK_EQ_INT(bad_model("nosections", err, sizeof err), SH_EFORMAT);
	CHECK(strstr(err, "rope.dimension_sections") != NULL);
}

int main(void)
{
	quant_init(0);
	RUN(qwen35_f32_vs_reference);
	RUN(qwen35moe_f32_vs_reference);
	RUN(qwen35_q8_0_greedy);
	RUN(qwen35moe_q8_0_greedy);
	RUN(prefill_chunks_equal_recurrence);
	RUN(slots_batch_equals_alone);
	RUN(checkpoint_resume);
	RUN(rollback_ring);
	RUN(engine_prefix_reuse);
	RUN(llama_cpp_vectors);
	RUN(qwen35_tensor_2);
	RUN(qwen35_tensor_2_1_1);
	RUN(qwen35moe_tensor_2_1);
	RUN(qwen35moe_tensor_2_1_1);
	RUN(qwen35_pipeline_2);
	RUN(qwen35moe_pipeline_3);
	RUN(mtp_block_skipped);
	RUN(bytes_per_token);
	RUN(model_shape_facts);
	RUN(bad_input);
	return harness_done();
}
