/* test_moe.c: the mixture-of-experts models (Mixtral = llama with experts, qwen2moe, qwen3moe).
 *
 * A plain-C reference forward pass written straight from the math (no kernels, no threads, F32
 * weights dequantized from the file, double sums) is compared with the engine: F32 logits
 * within 1e-4 relative at every step and the same experts chosen in every layer; Q8_0 top-1
 * equal over 32 greedy steps. The routing function is checked on its own (deepseek2's sigmoid +
 * selection bias, renormalisation, scale). Expert-parallel shards (dist_split at 2:1 and 2:1:1,
 * run in-process with a toy all-reduce) must give one rank's greedy ids. Bad files give a
 * one-line error. The semantics follow llama.cpp: src/llama-model.cpp (load_hparams,
 * load_tensors: n_ff_exp, n_ff_shexp) and src/llama-graph.cpp build_moe_ffn (softmax/sigmoid,
 * exp_probs_b for selection only, norm_w with the sum clamped at 2^-14, scale_w).
 */
#include "common/common.h"
#include "gen_model.h"
#include "harness.h"
#include "infer/gguf_write.h"
#include "infer/model/model_int.h"
#include "infer/quant/quant.h"
#include "infer/tp.h"
#include "ref_util.h"

#include <math.h>
#include <pthread.h>

#define CTX 64

/* ---- the reference -------------------------------------------------------------------------- */

typedef struct ref {
	const model_meta_t *p;
	int moe_norm, shexp_gated, neox;
	float *embd, *out_norm, *out;
	struct {
		float *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *qn, *kn, *ffn_norm;
		float *router, *gate, *up, *down;          /* experts: [E][F][D], [E][D][F] */
		float *sh_gate, *sh_up, *sh_down, *sh_inp; /* shared block, its gate vector */
		float *kc, *vc;                            /* [CTX][kvd] */
	} L[8];
	int choice[8][8]; /* the last token's experts per layer */
} ref_t;

static void ref_open(ref_t *R, const gguf_t *g, const model_meta_t *p)
{
	memset(R, 0, sizeof *R);
	R->p = p;
	/* from the architecture, not from the engine's flags */
	R->moe_norm = p->arch != META_QWEN2MOE;
	R->shexp_gated = p->arch == META_QWEN2MOE;
	R->neox = p->arch != META_LLAMA;
	R->embd = ref_deq(g, "token_embd.weight");
	R->out_norm = ref_deq(g, "output_norm.weight");
	R->out = ref_deq(g, "output.weight");
	char n[96];
	for (int l = 0; l < p->n_layers; l++) {
#define D(f, s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), R->L[l].f = ref_deq(g, n))
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
		D(ffn_norm, "ffn_norm.weight");
		D(router, "ffn_gate_inp.weight");
		D(gate, "ffn_gate_exps.weight");
		D(up, "ffn_up_exps.weight");
		D(down, "ffn_down_exps.weight");
		D(sh_gate, "ffn_gate_shexp.weight");
		D(sh_up, "ffn_up_shexp.weight");
		D(sh_down, "ffn_down_shexp.weight");
		D(sh_inp, "ffn_gate_inp_shexp.weight");
#undef D
		int kvd = p->n_kv_heads * p->head_dim;
		R->L[l].kc = calloc((size_t)CTX * kvd, sizeof(float));
		R->L[l].vc = calloc((size_t)CTX * kvd, sizeof(float));
	}
}

static void ref_close(ref_t *R)
{
	free(R->embd);
	free(R->out_norm);
	free(R->out);
	for (int l = 0; l < R->p->n_layers; l++) {
		float **f = &R->L[l].attn_norm;
		for (size_t i = 0; i < sizeof R->L[l] / sizeof(float *); i++)
			free(f[i]);
	}
}

static void rot(const ref_t *R, float *h, int pos)
{
	int hd = R->p->head_dim, half = hd / 2;
	for (int i = 0; i < half; i++) {
		double a = pos * pow(R->p->rope_base, -2.0 * i / hd);
		int i0 = R->neox ? i : 2 * i, i1 = R->neox ? i + half : 2 * i + 1;
		double x0 = h[i0], x1 = h[i1];
		h[i0] = (float)(x0 * cos(a) - x1 * sin(a));
		h[i1] = (float)(x0 * sin(a) + x1 * cos(a));
	}
}

static double silu(double g)
{
	return g / (1.0 + exp(-g));
}

/* One token at pos; logits[n_vocab]. */
static void ref_step(ref_t *R, int tok, int pos, float *logits)
{
	const model_meta_t *p = R->p;
	int D = p->dim, hd = p->head_dim, H = p->n_heads, KH = p->n_kv_heads, qd = H * hd,
	    kvd = KH * hd;
	int E = p->n_experts, K = p->n_experts_used, F = p->ffn_exp, S = p->ffn_shexp;
	float x[1024], xb[1024], q[1024], k[1024], v[1024], att[1024], y[1024], h[2048], t[1024];
	memcpy(x, R->embd + (size_t)tok * D, D * sizeof *x);
	for (int l = 0; l < p->n_layers; l++) {
		typeof(R->L[0]) *L = &R->L[l];
		ref_norm(xb, x, L->attn_norm, D, p->rms_eps);
		ref_mv(q, L->wq, xb, qd, D);
		ref_mv(k, L->wk, xb, kvd, D);
		ref_mv(v, L->wv, xb, kvd, D);
		for (int i = 0; L->bq && i < qd; i++)
			q[i] += L->bq[i];
		for (int i = 0; L->bk && i < kvd; i++)
			k[i] += L->bk[i], v[i] += L->bv[i];
		for (int hh = 0; hh < H; hh++) {
			if (L->qn)
				ref_norm(q + hh * hd, q + hh * hd, L->qn, hd, p->rms_eps);
			rot(R, q + hh * hd, pos);
		}
		for (int hh = 0; hh < KH; hh++) {
			if (L->kn)
				ref_norm(k + hh * hd, k + hh * hd, L->kn, hd, p->rms_eps);
			rot(R, k + hh * hd, pos);
		}
		memcpy(L->kc + (size_t)pos * kvd, k, kvd * sizeof *k);
		memcpy(L->vc + (size_t)pos * kvd, v, kvd * sizeof *v);
		for (int hh = 0; hh < H; hh++) {
			int kh = hh / (H / KH);
			double sc[CTX];
			for (int s = 0; s <= pos; s++) {
				double d = 0;
				for (int i = 0; i < hd; i++)
					d += (double)q[hh * hd + i] *
					     L->kc[(size_t)s * kvd + kh * hd + i];
				sc[s] = d / sqrt(hd);
			}
			ref_softmax(sc, pos + 1);
			for (int i = 0; i < hd; i++) {
				double a = 0;
				for (int s = 0; s <= pos; s++)
					a += sc[s] * L->vc[(size_t)s * kvd + kh * hd + i];
				att[hh * hd + i] = (float)a;
			}
		}
		ref_mv(y, L->wo, att, D, qd);
		for (int i = 0; i < D; i++)
			x[i] += y[i];

		/* the experts */
		ref_norm(xb, x, L->ffn_norm, D, p->rms_eps);
		float lg[64];
		double pr[64];
		ref_mv(lg, L->router, xb, E, D);
		for (int e = 0; e < E; e++)
			pr[e] = lg[e];
		ref_softmax(pr, E);
		int sel[8];
		double w[8], wsum = 0;
		for (int i = 0; i < K; i++) {
			int b = -1;
			for (int e = 0; e < E; e++) {
				int taken = 0;
				for (int j = 0; j < i; j++)
					taken |= sel[j] == e;
				if (!taken && (b < 0 || pr[e] > pr[b]))
					b = e;
			}
			sel[i] = b, w[i] = pr[b], wsum += pr[b];
			R->choice[l][i] = b;
		}
		memset(y, 0, sizeof y);
		for (int i = 0; i < K; i++) {
			double wi = R->moe_norm ? w[i] / wsum : w[i];
			int e = sel[i];
			ref_mv(h, L->gate + (size_t)e * F * D, xb, F, D);
			ref_mv(h + F, L->up + (size_t)e * F * D, xb, F, D);
			for (int j = 0; j < F; j++)
				h[j] = (float)(silu(h[j]) * h[F + j]);
			ref_mv(t, L->down + (size_t)e * D * F, h, D, F);
			for (int j = 0; j < D; j++)
				y[j] += (float)(wi * t[j]);
		}
		if (S) {
			ref_mv(h, L->sh_gate, xb, S, D);
			ref_mv(h + S, L->sh_up, xb, S, D);
			for (int j = 0; j < S; j++)
				h[j] = (float)(silu(h[j]) * h[S + j]);
			ref_mv(t, L->sh_down, h, D, S);
			double gsc = 1;
			if (R->shexp_gated) {
				float gl;
				ref_mv(&gl, L->sh_inp, xb, 1, D);
				gsc = 1.0 / (1.0 + exp(-(double)gl));
			}
			for (int j = 0; j < D; j++)
				y[j] += (float)(gsc * t[j]);
		}
		for (int i = 0; i < D; i++)
			x[i] += y[i];
	}
	ref_norm(xb, x, R->out_norm, D, p->rms_eps);
	ref_mv(logits, R->out, xb, p->n_vocab, D);
}

/* ---- fixtures ------------------------------------------------------------------------------- */

/* A small file of each MoE family: 8 experts of 64, 2 used (glm4moe: 4 of them, after its
 * leading dense layer, sigmoid router; gpt-oss: the experts' biases; qwen35moe: DeltaNet layers,
 * a gated shared expert). */
static mkmodel_opts_t family_opts(const char *arch, int type)
{
	mkmodel_opts_t o = {.arch = arch,
			    .dim = 128,
			    .layers = 2,
			    .heads = 4,
			    .kv_heads = 2,
			    .ffn = 128,
			    .vocab = 320,
			    .ctx = CTX,
			    .type = type,
			    .seed = 11,
			    .experts = 8,
			    .experts_used = 2,
			    .expert_ffn = 64};
	if (!strcmp(arch, "glm4moe"))
		o.layers = 3, o.head_dim = 32, o.experts_used = 4, o.nextn = 1;
	if (!strcmp(arch, "gpt-oss"))
		o.head_dim = 32, o.ffn = 64, o.swa_window = 8;
	if (!strcmp(arch, "qwen35moe"))
		o.layers = 4, o.head_dim = 32, o.ssm_state = 32, o.ssm_k_heads = 2,
		o.ssm_v_heads = 4, o.attn_interval = 3, o.rope_dim = 8;
	return o;
}

/* The fixture (gen_model.h): a small mixture of experts of arch in weight type, this file's
 * context, an F32 cache. */
static int moe_open(gen_t *x, const char *arch, int type, int threads)
{
	mkmodel_opts_t o = family_opts(arch, type);
	return gen_open_opts(x, &o, "moe", threads, CTX, QT_F32);
}

static const int prompt[12] = {256, 72, 101, 108, 108, 111, 32, 116, 104, 101, 281, 300};

/* ---- engine vs reference -------------------------------------------------------------------- */

static void f32_matches_reference(const char *arch)
{
	gen_t x;
	if (moe_open(&x, arch, QT_F32, 2)) {
		CHECK(0);
		return;
	}
	ref_t R;
	ref_open(&R, x.g, &x.meta);
	int V = x.meta.n_vocab, K = x.meta.n_experts_used;
	float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
	int trace[8 * 8];
	moe_set_trace(x.m, trace);
	double worst = 0;
	int choices_ok = 1;
	for (int i = 0; i < 24; i++) {
		int t = i < 12 ? prompt[i] : sh_argmax(b, V);
		CHECK_EQ_INT(model_forward(x.m, &t, 1, i, a), 0);
		ref_step(&R, t, i, b);
		double md = 0, mr = 0;
		for (int k = 0; k < V; k++)
			md = fmax(md, fabs(a[k] - b[k])), mr = fmax(mr, fabs(b[k]));
		worst = fmax(worst, md / mr);
		for (int l = 0; l < x.meta.n_layers; l++)
			for (int k = 0; k < K; k++)
				choices_ok &= trace[l * K + k] == R.choice[l][k];
	}
	if (worst > 1e-4 || !choices_ok)
		fprintf(stderr, "%s f32: worst relative logit error %g, choices %s\n", arch, worst,
			choices_ok ? "equal" : "DIFFER");
	CHECK(worst <= 1e-4);
	CHECK(choices_ok);
	free(a);
	free(b);
	ref_close(&R);
	gen_close(&x);
}

TEST(mixtral_f32_vs_reference)
{
	f32_matches_reference("mixtral");
}
TEST(qwen2moe_f32_vs_reference)
{
	f32_matches_reference("qwen2moe");
}
TEST(qwen3moe_f32_vs_reference)
{
	f32_matches_reference("qwen3moe");
}

/* Q8_0: greedy top-1 of the engine equals the reference's (on the dequantized weights). */
static void q8_greedy_matches_reference(const char *arch)
{
	gen_t x;
	if (moe_open(&x, arch, QT_Q8_0, 2)) {
		CHECK(0);
		return;
	}
	ref_t R;
	ref_open(&R, x.g, &x.meta);
	int V = x.meta.n_vocab, same = 0, steps = 32;
	float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
	CHECK_EQ_INT(model_forward(x.m, prompt, 12, 0, a), 0); /* batched prefill */
	for (int i = 0; i < 12; i++)
		ref_step(&R, prompt[i], i, b);
	for (int s = 0; s < steps; s++) {
		int ta = sh_argmax(a, V), tb = sh_argmax(b, V);
		/* equal, or a near-tie in the reference itself (its top two within 0.5 %: int8
		 * activations legitimately break those either way) */
		int tie = ta != tb && b[tb] - b[ta] < 0.005f * fabsf(b[tb]);
		same += ta == tb || tie;
		if (ta != tb)
			fprintf(stderr, "%s q8_0 step %d: engine %d reference %d (%s, %g vs %g)\n",
				arch, s, ta, tb, tie ? "a near-tie" : "DIFFER", b[tb], b[ta]);
		CHECK_EQ_INT(model_forward(x.m, &ta, 1, 12 + s, a), 0);
		ref_step(&R, ta, 12 + s, b);
	}
	CHECK_EQ_INT(same, steps);
	free(a);
	free(b);
	ref_close(&R);
	gen_close(&x);
}

TEST(mixtral_q8_0_greedy)
{
	q8_greedy_matches_reference("mixtral");
}
TEST(qwen2moe_q8_0_greedy)
{
	q8_greedy_matches_reference("qwen2moe");
}
TEST(qwen3moe_q8_0_greedy)
{
	q8_greedy_matches_reference("qwen3moe");
}

/* Batched prefill (tokens grouped by expert, the sgemm path for F32) = one token at a time. */
TEST(prefill_groups_tokens_by_expert)
{
	gen_t x, y;
	if (moe_open(&x, "qwen2moe", QT_F32, 2) || moe_open(&y, "qwen2moe", QT_F32, 1)) {
		CHECK(0);
		return;
	}
	int V = x.meta.n_vocab, toks[40];
	for (int i = 0; i < 40; i++)
		toks[i] = (i * 37 + 11) % 300;
	float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
	CHECK_EQ_INT(model_forward(x.m, toks, 40, 0, a), 0);
	for (int i = 0; i < 40; i++)
		CHECK_EQ_INT(model_forward(y.m, &toks[i], 1, i, b), 0);
	double md = 0, mr = 0;
	for (int k = 0; k < V; k++)
		md = fmax(md, fabs(a[k] - b[k])), mr = fmax(mr, fabs(b[k]));
	CHECK(md / mr < 1e-4);
	CHECK_EQ_INT(sh_argmax(a, V), sh_argmax(b, V));
	free(a);
	free(b);
	gen_close(&x);
	gen_close(&y);
}

/* The three paths of moe.c give the same bits: one token (moe_ffn_one: the chosen experts' and
 * the shared block's matrices in two pool dispatches), a few (moe_ffn_few, up to 8: the same
 * over each expert's tokens) and a batch (one expert at a time). After 5 tokens one at a time,
 * 12 in one batch, 3 in another, the logits equal those of the 20 one at a time, bit for bit,
 * with 1 and 2 threads, for each MoE family and the weight types its experts take (F32 on the
 * row kernel; Q8_0 and MXFP4 on the repacked tiled kernel, the shared blocks too). */
static void decode_bits_equal_batch(mkmodel_opts_t o)
{
	int toks[20];
	for (int i = 0; i < 20; i++)
		toks[i] = (i * 37 + 11) % 300;
	for (int threads = 1; threads <= 2; threads++) {
		gen_t x, y;
		if (gen_open_opts(&x, &o, "moe1", threads, CTX, QT_F32) ||
		    gen_open_opts(&y, &o, "moe1", threads, CTX, QT_F32)) {
			CHECK(0);
			gen_close(&x);
			return;
		}
		int V = x.meta.n_vocab;
		float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
		for (int i = 0; i < 20; i++) {
			if (i < 5)
				CHECK_EQ_INT(model_forward(x.m, &toks[i], 1, i, a), 0);
			CHECK_EQ_INT(model_forward(y.m, &toks[i], 1, i, b), 0);
		}
		CHECK_EQ_INT(model_forward(x.m, toks + 5, 12, 5, a), 0);
		CHECK_EQ_INT(model_forward(x.m, toks + 17, 3, 17, a), 0);
		int same = !memcmp(a, b, (size_t)V * sizeof *a);
		if (!same)
			fprintf(stderr,
				"%s type %d, %d threads: decode's logits differ from the batch's\n",
				o.arch, o.type, threads);
		CHECK(same);
		free(a);
		free(b);
		gen_close(&x);
		gen_close(&y);
	}
}

TEST(decode_bits_equal_batch)
{
	static const char *arch[] = {"mixtral", "qwen2moe", "qwen3moe",
				     "glm4moe", "gpt-oss",  "qwen35moe"};
	static const int type[] = {QT_F32, QT_Q8_0, QT_MXFP4};
	for (size_t i = 0; i < ARRAY_LEN(arch); i++)
		for (int t = 0; t < 2 + !strcmp(arch[i], "gpt-oss"); t++)
			decode_bits_equal_batch(family_opts(arch[i], type[t]));
}

/* ---- the routing function on its own ------------------------------------------------------ */

TEST(route_softmax_topk_norm)
{
	float lg[4] = {1.0f, 3.0f, 2.0f, 0.0f};
	int sel[2];
	float w[2];
	double z = exp(1) + exp(3) + exp(2) + exp(0);
	moe_route_t r = {4, 2, META_GATE_SOFTMAX, 0, 1.0f, NULL, 0, 0};
	moe_route(&r, lg, sel, w); /* qwen2moe: the raw probabilities */
	CHECK_EQ_INT(sel[0], 1);
	CHECK_EQ_INT(sel[1], 2);
	CHECK(fabs(w[0] - exp(3) / z) < 1e-6 && fabs(w[1] - exp(2) / z) < 1e-6);
	r.norm = 1; /* Mixtral, qwen3moe: renormalised */
	moe_route(&r, lg, sel, w);
	CHECK(fabs(w[0] - exp(3) / (exp(3) + exp(2))) < 1e-6);
	CHECK(fabs(w[0] + w[1] - 1) < 1e-6);
}

TEST(route_deepseek_sigmoid_bias_norm_scale)
{
	/* DeepSeek-V3: sigmoid probabilities, the bias picks expert 3 over expert 0 though its
	 * probability is lower, the weights stay the unbiased probabilities, renormalised, then
	 * scaled by expert_weights_scale */
	float lg[4] = {2.0f, 1.0f, -1.0f, 0.5f}, bias[4] = {0, 0, 0, 1.0f};
	int sel[2];
	float w[2];
	double s0 = 1 / (1 + exp(-2.0)), s1 = 1 / (1 + exp(-1.0)), s3 = 1 / (1 + exp(-0.5));
	moe_route_t r = {4, 2, META_GATE_SIGMOID, 0, 2.5f, bias, 0, 0};
	moe_route(&r, lg, sel, w);
	CHECK_EQ_INT(sel[0], 3); /* s3 + 1 > s0 */
	CHECK_EQ_INT(sel[1], 0);
	CHECK(fabs(w[0] - 2.5 * s3) < 1e-6 && fabs(w[1] - 2.5 * s0) < 1e-6);
	r.norm = 1;
	moe_route(&r, lg, sel, w);
	CHECK(fabs(w[0] - 2.5 * s3 / (s3 + s0)) < 1e-6);
	CHECK(fabs(w[1] - 2.5 * s0 / (s3 + s0)) < 1e-6);
	r.bias = NULL; /* without the bias: the two largest probabilities */
	moe_route(&r, lg, sel, w);
	CHECK_EQ_INT(sel[0], 0);
	CHECK_EQ_INT(sel[1], 1);
	CHECK(fabs(w[0] - 2.5 * s0 / (s0 + s1)) < 1e-6);
	/* the renormalising sum is floored at 2^-14 (llama.cpp's clamp) */
	float tiny[2] = {-40.0f, -41.0f};
	moe_route_t t = {2, 1, META_GATE_SIGMOID, 1, 1.0f, NULL, 0, 0};
	moe_route(&t, tiny, sel, w);
	CHECK(w[0] < 1e-3f);
}

/* DeepSeek-V3's group-limited routing (llama.cpp build_moe_ffn, n_expert_groups): 8 experts in 4
 * groups of 2; a group scores the sum of its two biased scores; only the 2 best groups may give
 * experts, so expert 6 (the single best score, in a weak group) is passed over. */
TEST(route_deepseek_groups)
{
	float lg[8] = {1.0f, 0.9f, -3.0f, -3.0f, 0.8f, 0.8f, 2.0f, -4.0f};
	int sel[2];
	float w[2];
	moe_route_t r = {8, 2, META_GATE_SIGMOID, 1, 1.0f, NULL, 4, 2};
	moe_route(&r, lg, sel, w);
	/* group sums (sigmoid): g0 .73+.71, g1 .05+.05, g2 .69+.69, g3 .88+.02 */
	CHECK_EQ_INT(sel[0], 0);
	CHECK_EQ_INT(sel[1], 1);
	r.n_groups = 0; /* ungrouped: expert 6 first */
	moe_route(&r, lg, sel, w);
	CHECK_EQ_INT(sel[0], 6);
	CHECK_EQ_INT(sel[1], 0);
}

/* ---- expert-parallel shards in-process ------------------------------------------------------ */

#define MAXR 3

/* Greedy: 12-token prefill then 16 decoded ids. */
static int greedy(model_t *m, int V, int *ids)
{
	return ref_greedy(m, V, prompt, 12, 16, ids);
}

static void shards_match_one_rank(const char *arch, int world, const int *w)
{
	gen_t x;
	char err[256];
	if (moe_open(&x, arch, QT_Q8_0, 1)) {
		CHECK(0);
		return;
	}
	int want[16], V = x.meta.n_vocab;
	CHECK_EQ_INT(greedy(x.m, V, want), 0);
	model_shard_t sh[MAXR];
	CHECK_EQ_INT(dist_split(&x.meta, 32, 0, world, w, sh, err, sizeof err), 0);
	model_t *m[MAXR];
	pool_t *pools[MAXR];
	int held = 0, ids[MAXR][16];
	for (int r = 0; r < world; r++) {
		held += sh[r].n_exp;
		pools[r] = pool_new(1);
		m[r] = NULL;
		CHECK_EQ_INT(model_new(&m[r], x.g, &x.meta, &sh[r], CTX, pools[r], err, sizeof err),
			     0);
		if (!m[r])
			return;
	}
	CHECK_EQ_INT(held, x.meta.n_experts);
	CHECK(sh[0].n_exp > sh[world - 1].n_exp); /* in proportion to the shares */
	CHECK_EQ_INT(mem_shards_greedy(m, world, V, x.meta.dim, prompt, 12, 16, &ids[0][0]), 0);
	for (int r = 0; r < world; r++) {
		CHECK(!memcmp(ids[r], want, sizeof want));
		model_free(m[r]);
		pool_free(pools[r]);
	}
	gen_close(&x);
}

static const int w21[2] = {2, 1}, w211[3] = {2, 1, 1};
TEST(mixtral_shards_2_1)
{
	shards_match_one_rank("mixtral", 2, w21);
}
TEST(qwen2moe_shards_2_1_1)
{
	shards_match_one_rank("qwen2moe", 3, w211);
}
TEST(qwen3moe_shards_2_1_1)
{
	shards_match_one_rank("qwen3moe", 3, w211);
}
TEST(qwen2moe_shards_2_1)
{
	shards_match_one_rank("qwen2moe", 2, w21);
}

/* Pipeline: each stage holds all experts of its layers. */
TEST(pipeline_split_keeps_experts_whole)
{
	gen_t x;
	char err[256];
	if (moe_open(&x, "qwen3moe", QT_Q8_0, 1)) {
		CHECK(0);
		return;
	}
	model_shard_t sh[2];
	CHECK_EQ_INT(dist_split(&x.meta, 32, 1, 2, NULL, sh, err, sizeof err), 0);
	for (int r = 0; r < 2; r++) {
		CHECK_EQ_INT(sh[r].exp0, 0);
		CHECK_EQ_INT(sh[r].n_exp, 8);
	}
	gen_close(&x);
}

/* ---- bytes per token ------------------------------------------------------------------------ */

TEST(bytes_per_token_counts_used_experts)
{
	gen_t x;
	if (moe_open(&x, "mixtral", QT_Q8_0, 1)) {
		CHECK(0);
		return;
	}
	uint64_t all = x.meta.weight_bytes, ex = x.meta.expert_bytes;
	/* non-expert + k/E x expert bytes (+ no token_embd but one row: within a few percent) */
	double want = (double)(all - ex) + (double)ex * 2 / 8;
	double got = (double)model_bytes_per_token(x.m);
	const gguf_tensor_t *emb = gguf_find_tensor(x.g, "token_embd.weight");
	want -= (double)emb->nbytes; /* the head reads one embedding row, not the table */
	if (fabs(got - want) / want > 0.05)
		fprintf(stderr, "bytes/token %.0f, expected %.0f\n", got, want);
	CHECK(fabs(got - want) / want <= 0.05);
	gen_close(&x);
}

/* ---- bad input ------------------------------------------------------------------------------ */

/* Writes a small qwen3moe file with one key or tensor altered; returns meta_load's code and
 * its message in err. */
static int bad_model(const char *what, char *err, size_t errlen)
{
	char path[256];
	snprintf(path, sizeof path, "/tmp/shoal-test-moe-bad-%d.gguf", (int)getpid());
	gguf_writer_t *w = gw_new();
	int E = 4, D = 32, F = 32, n = 0;
	int64_t ne[3], sizes[32];
	gw_kv_str(w, "general.architecture", !strcmp(what, "arch") ? "grok" : "qwen3moe");
	gw_kv_u32(w, "qwen3moe.block_count", 1);
	gw_kv_u32(w, "qwen3moe.embedding_length", D);
	gw_kv_u32(w, "qwen3moe.feed_forward_length", 64);
	gw_kv_u32(w, "qwen3moe.attention.head_count", 2);
	gw_kv_u32(w, "qwen3moe.attention.key_length", 16);
	if (strcmp(what, "zero"))
		gw_kv_u32(w, "qwen3moe.expert_count", E);
	gw_kv_u32(w, "qwen3moe.expert_used_count", !strcmp(what, "used") ? 5 : 2);
	gw_kv_u32(w, "qwen3moe.expert_feed_forward_length", F);
#define TEN(name, nd, a, b, c)                                                                     \
	(ne[0] = a, ne[1] = b, ne[2] = c, sizes[n++] = 4 * (a) * (b) * (c),                        \
	 gw_tensor(w, name, nd, ne, QT_F32))
	TEN("token_embd.weight", 2, D, 300, 1);
	TEN("output_norm.weight", 1, D, 1, 1);
	TEN("blk.0.attn_norm.weight", 1, D, 1, 1);
	TEN("blk.0.attn_q.weight", 2, D, 32, 1);
	TEN("blk.0.attn_k.weight", 2, D, 32, 1);
	TEN("blk.0.attn_v.weight", 2, D, 32, 1);
	TEN("blk.0.attn_output.weight", 2, 32, D, 1);
	TEN("blk.0.attn_q_norm.weight", 1, 16, 1, 1);
	TEN("blk.0.attn_k_norm.weight", 1, 16, 1, 1);
	TEN("blk.0.ffn_norm.weight", 1, D, 1, 1);
	TEN("blk.0.ffn_gate_inp.weight", 2, D, E, 1);
	TEN("blk.0.ffn_gate_exps.weight", 3, D, F, E);
	if (strcmp(what, "missing"))
		TEN("blk.0.ffn_up_exps.weight", 3, D, F, E);
	TEN("blk.0.ffn_down_exps.weight", 3, !strcmp(what, "shape") ? F + 32 : F, D, E);
#undef TEN
	static const uint8_t zero[65536];
	int rc = gw_begin(w, path, err, errlen);
	for (int i = 0; i < n && !rc; i++)
		rc = gw_data(w, zero, (size_t)sizes[i], err, errlen);
	if (!rc)
		rc = gw_finish(w, err, errlen);
	gw_free(w);
	gguf_t *g = NULL;
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
	CHECK_EQ_INT(bad_model("arch", err, sizeof err), SH_EUNSUPP);
	CHECK(strstr(err, "'grok'") && strstr(err, "qwen3moe") && strstr(err, "qwen2moe"));
	CHECK(bad_model("zero", err, sizeof err) < 0);
	CHECK(strstr(err, "zero experts") != NULL);
	CHECK(bad_model("used", err, sizeof err) < 0);
	CHECK(strstr(err, "expert_used_count 5") != NULL);
	CHECK(bad_model("missing", err, sizeof err) < 0);
	CHECK(strstr(err, "blk.0.ffn_up_exps.weight") && strstr(err, "[32, 32, 4]"));
	CHECK(bad_model("shape", err, sizeof err) < 0);
	CHECK(strstr(err, "blk.0.ffn_down_exps.weight") && strstr(err, "expected [32, 32, 4]"));
	/* a shard naming experts past the end is refused */
	gen_t x;
	if (moe_open(&x, "mixtral", QT_Q8_0, 1)) {
		CHECK(0);
		return;
	}
	model_shard_t s;
	model_shard_full(&x.meta, &s);
	s.exp0 = 6, s.n_exp = 4;
	model_t *m = NULL;
	CHECK(model_new(&m, x.g, &x.meta, &s, CTX, x.pool, err, sizeof err) < 0);
	CHECK(strstr(err, "expert") != NULL);
	gen_close(&x);
}

int main(void)
{
	quant_init(0);
	RUN(route_softmax_topk_norm);
	RUN(route_deepseek_sigmoid_bias_norm_scale);
	RUN(route_deepseek_groups);
	RUN(mixtral_f32_vs_reference);
	RUN(qwen2moe_f32_vs_reference);
	RUN(qwen3moe_f32_vs_reference);
	RUN(mixtral_q8_0_greedy);
	RUN(qwen2moe_q8_0_greedy);
	RUN(qwen3moe_q8_0_greedy);
	RUN(prefill_groups_tokens_by_expert);
	RUN(decode_bits_equal_batch);
	RUN(mixtral_shards_2_1);
	RUN(qwen2moe_shards_2_1);
	RUN(qwen2moe_shards_2_1_1);
	RUN(qwen3moe_shards_2_1_1);
	RUN(pipeline_split_keeps_experts_whole);
	RUN(bytes_per_token_counts_used_experts);
	RUN(bad_input);
	return harness_done();
}
