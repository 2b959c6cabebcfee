/* test_gptoss.c: gpt-oss (GGUF "gpt-oss", llama.cpp's LLM_ARCH_OPENAI_MOE).
 *
 * A plain-C reference forward pass written from llama.cpp's semantics (no kernels, no threads,
 * weights dequantized from the file, double sums) is compared with the engine on generated
 * files: src/models/openai-moe.cpp (the block: biased Q/K/V/O, NeoX RoPE with YaRN, attention
 * with sinks, post_attention_norm, experts with biases), src/llama-graph.cpp build_moe_ffn
 * (router bias, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT: top k by logit, softmax over the
 * k; LLM_FFN_SWIGLU_OAI_MOE with alpha 1.702, limit 7, ggml-cpu's swiglu_oai), ggml-cpu's
 * soft_max with sinks (the sink in the max and the sum), llama-hparams.h is_masked_swa and
 * set_swa_pattern(2) (layers 0, 2, ... see the last n_swa positions), llama-context.cpp's YaRN
 * set-up with ggml's rope_yarn (ramp between the correction dims, cos/sin times
 * 1 + 0.1 ln factor).
 *
 * Then the engine against llama.cpp itself: ids and top-5 logprobs llama.cpp produced for the
 * same generated files (see LLAMA_* below for how), 2 and 3 ranks (heads and experts split, the
 * output bias added once) against one, and bad files.
 */
#include "common/common.h"
#include "gen_model.h"
#include "harness.h"
#include "infer/chat.h"
#include "infer/gguf_write.h"
#include "infer/model/model_int.h"
#include "infer/quant/quant.h"
#include "infer/tok/tok_internal.h"
#include "infer/tp.h"
#include "ref_util.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <time.h>

#define CTX  96
#define MAXL 4

/* ---- the reference -------------------------------------------------------------------------- */

typedef struct ref {
	const model_meta_t *p;
	float *embd, *out_norm, *out;
	struct {
		float *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo, *sinks, *post_norm;
		float *router, *router_b, *gate, *up, *down; /* experts: [E][F][D], [E][D][F] */
		float *gate_b, *up_b, *down_b;               /* [E][F], [E][F], [E][D] */
		float *kc, *vc;                              /* [CTX][kvd] */
	} L[MAXL];
	double inv_freq[64], mag;
} ref_t;

static void ref_open(ref_t *R, const gguf_t *g, const model_meta_t *p)
{
	memset(R, 0, sizeof *R);
	R->p = p;
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
		D(bo, "attn_output.bias");
		D(sinks, "attn_sinks.weight");
		D(post_norm, "post_attention_norm.weight");
		D(router, "ffn_gate_inp.weight");
		D(router_b, "ffn_gate_inp.bias");
		D(gate, "ffn_gate_exps.weight");
		D(up, "ffn_up_exps.weight");
		D(down, "ffn_down_exps.weight");
		D(gate_b, "ffn_gate_exps.bias");
		D(up_b, "ffn_up_exps.bias");
		D(down_b, "ffn_down_exps.bias");
#undef D
		int kvd = p->n_kv_heads * p->head_dim;
		R->L[l].kc = calloc((size_t)CTX * kvd, sizeof(float));
		R->L[l].vc = calloc((size_t)CTX * kvd, sizeof(float));
	}
	/* YaRN, from the file's keys (not the engine's tables): ggml_rope_yarn_corr_dims with
	 * beta_fast 32, beta_slow 1, ext_factor 1; magnitude 1 + 0.1 ln factor */
	uint32_t orig = 0;
	float factor = 0;
	gguf_get_u32(g, "gpt-oss.rope.scaling.original_context_length", &orig);
	gguf_get_f32(g, "gpt-oss.rope.scaling.factor", &factor);
	int hd = p->head_dim;
	double base = p->rope_base;
#define CORR(nr) (hd * log(orig / ((nr)*2 * M_PI)) / (2 * log(base)))
	double lo = fmax(0, floor(CORR(32.0))), hi = fmin(hd - 1, ceil(CORR(1.0)));
#undef CORR
	for (int i = 0; i < hd / 2; i++) {
		double r = 1 - fmin(1, fmax(0, (i - lo) / fmax(0.001, hi - lo)));
		R->inv_freq[i] = pow(base, -2.0 * i / hd) * ((1.0 / factor) * (1 - r) + r);
	}
	R->mag = 1 + 0.1 * log(factor);
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

/* NeoX rotation (pairs i, i + hd/2) with YaRN's frequencies and magnitude. */
static void rot(const ref_t *R, float *h, int pos)
{
	int half = R->p->head_dim / 2;
	for (int i = 0; i < half; i++) {
		double a = pos * R->inv_freq[i], x0 = h[i], x1 = h[i + half];
		h[i] = (float)(R->mag * (x0 * cos(a) - x1 * sin(a)));
		h[i + half] = (float)(R->mag * (x0 * sin(a) + x1 * cos(a)));
	}
}

/* One token at pos; logits[n_vocab]. */
static void ref_step(ref_t *R, int tok, int pos, float *logits)
{
	const model_meta_t *p = R->p;
	int D = p->dim, hd = p->head_dim, H = p->n_heads, KH = p->n_kv_heads, qd = H * hd,
	    kvd = KH * hd, E = p->n_experts, K = p->n_experts_used, F = p->ffn_exp;
	float x[1024], xb[1024], q[1024], k[1024], v[1024], att[1024], y[1024], h[2048], t[1024];
	memcpy(x, R->embd + (size_t)tok * D, D * sizeof *x);
	for (int l = 0; l < p->n_layers; l++) {
		typeof(R->L[0]) *L = &R->L[l];
		ref_norm(xb, x, L->attn_norm, D, p->rms_eps);
		ref_mv(q, L->wq, xb, qd, D);
		ref_mv(k, L->wk, xb, kvd, D);
		ref_mv(v, L->wv, xb, kvd, D);
		for (int i = 0; i < qd; i++)
			q[i] += L->bq[i];
		for (int i = 0; i < kvd; i++)
			k[i] += L->bk[i], v[i] += L->bv[i];
		for (int hh = 0; hh < H; hh++)
			rot(R, q + hh * hd, pos);
		for (int hh = 0; hh < KH; hh++)
			rot(R, k + hh * hd, pos);
		memcpy(L->kc + (size_t)pos * kvd, k, kvd * sizeof *k);
		memcpy(L->vc + (size_t)pos * kvd, v, kvd * sizeof *v);
		/* even layers slide: a query at pos sees keys s with pos - s < n_swa */
		int s0 = l % 2 == 0 && pos - p->swa_window + 1 > 0 ? pos - p->swa_window + 1 : 0;
		for (int hh = 0; hh < H; hh++) {
			int kh = hh / (H / KH);
			double sc[CTX], mx = L->sinks[hh], sum = 0;
			for (int s = s0; s <= pos; s++) {
				double d = 0;
				for (int i = 0; i < hd; i++)
					d += (double)q[hh * hd + i] *
					     L->kc[(size_t)s * kvd + kh * hd + i];
				sc[s] = d / sqrt(hd);
				mx = fmax(mx, sc[s]);
			}
			for (int s = s0; s <= pos; s++)
				sum += sc[s] = exp(sc[s] - mx);
			sum += exp(L->sinks[hh] - mx);
			for (int i = 0; i < hd; i++) {
				double a = 0;
				for (int s = s0; s <= pos; s++)
					a += sc[s] / sum * L->vc[(size_t)s * kvd + kh * hd + i];
				att[hh * hd + i] = (float)a;
			}
		}
		ref_mv(y, L->wo, att, D, qd);
		for (int i = 0; i < D; i++)
			x[i] += y[i] + L->bo[i];

		/* the experts: top k by biased logit, softmax over those k */
		ref_norm(xb, x, L->post_norm, D, p->rms_eps);
		float lg[64];
		ref_mv(lg, L->router, xb, E, D);
		for (int e = 0; e < E; e++)
			lg[e] += L->router_b[e];
		int sel[8];
		double w[8], wsum = 0;
		for (int i = 0; i < K; i++) {
			int b = -1;
			for (int e = 0; e < E; e++) {
				int taken = 0;
				for (int j = 0; j < i; j++)
					taken |= sel[j] == e;
				if (!taken && (b < 0 || lg[e] > lg[b]))
					b = e;
			}
			sel[i] = b;
		}
		for (int i = 0; i < K; i++)
			wsum += w[i] = exp((double)lg[sel[i]] - lg[sel[0]]);
		memset(y, 0, sizeof y);
		for (int i = 0; i < K; i++) {
			int e = sel[i];
			ref_mv(h, L->gate + (size_t)e * F * D, xb, F, D);
			ref_mv(h + F, L->up + (size_t)e * F * D, xb, F, D);
			for (int j = 0; j < F; j++) {
				double g = fmin(h[j] + L->gate_b[e * F + j], 7.0);
				double u = fmax(-7.0, fmin(h[F + j] + L->up_b[e * F + j], 7.0));
				h[j] = (float)(g / (1 + exp(-1.702 * g)) * (u + 1));
			}
			ref_mv(t, L->down + (size_t)e * D * F, h, D, F);
			for (int j = 0; j < D; j++)
				y[j] += (float)(w[i] / wsum * (t[j] + L->down_b[e * D + j]));
		}
		for (int i = 0; i < D; i++)
			x[i] += y[i];
	}
	ref_norm(xb, x, R->out_norm, D, p->rms_eps);
	ref_mv(logits, R->out, xb, p->n_vocab, D);
}

/* ---- fixtures ------------------------------------------------------------------------------- */

/* The generated file the llama.cpp vectors below were made from: `shoal mkmodel --arch gpt-oss
 * --dim 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --ffn 64 --experts 8
 * --experts-used 2 --vocab 320 --ctx 96 --sliding-window 8 --seed 11 --type T`. */
static mkmodel_opts_t fix_opts(int type)
{
	return (mkmodel_opts_t){.arch = "gpt-oss",
				.dim = 128,
				.layers = 4,
				.heads = 4,
				.kv_heads = 2,
				.head_dim = 32,
				.ffn = 64,
				.vocab = 320,
				.ctx = CTX,
				.type = type,
				.seed = 11,
				.experts = 8,
				.experts_used = 2,
				.swa_window = 8};
}

/* The fixture in weight type, its own path, as gen_model.h opens generated files. */
typedef struct fix {
	gen_t x;
	char path[256];
} fix_t;

static int fix_open(fix_t *f, int type, int threads, int kv_type)
{
	mkmodel_opts_t o = fix_opts(type);
	int rc = gen_open_opts(&f->x, &o, "gptoss", threads, CTX, kv_type);
	snprintf(f->path, sizeof f->path, "%s", f->x.path);
	return rc;
}

static void fix_close(fix_t *f)
{
	gen_close(&f->x);
}

/* 12 tokens: BOS-free, as llama.cpp tokenizes for a gpt-4o vocabulary without add_bos */
static const int prompt[12] = {256, 72, 101, 108, 108, 111, 32, 116, 104, 101, 281, 300};

/* ---- engine vs reference -------------------------------------------------------------------- */

/* F32 weights and cache: the engine's logits within 1e-4 (relative to the largest) of the
 * reference's at every step of a 12-token prompt and 28 greedy steps (past the window of 8 in
 * the even layers), fused attention and the plain one. */
static void f32_matches_reference(int attn_ref)
{
	fix_t x;
	if (fix_open(&x, QT_F32, 2, QT_F32)) {
		CHECK(0);
		return;
	}
	x.x.m->attn_ref = attn_ref;
	CHECK_EQ_INT(x.x.meta.arch, META_GPTOSS);
	CHECK_EQ_INT(x.x.meta.swa_window, 8);
	ref_t R;
	ref_open(&R, x.x.g, &x.x.meta);
	int V = x.x.meta.n_vocab;
	float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
	double worst = 0;
	for (int i = 0; i < 40; i++) {
		int t = i < 12 ? prompt[i] : sh_argmax(b, V);
		CHECK_EQ_INT(model_forward(x.x.m, &t, 1, i, a), 0);
		ref_step(&R, t, i, b);
		double md = 0, mr = 0;
		for (int k = 0; k < V; k++)
			md = fmax(md, fabs(a[k] - b[k])), mr = fmax(mr, fabs(b[k]));
		worst = fmax(worst, md / mr);
	}
	if (worst > 1e-4)
		fprintf(stderr, "gpt-oss f32 (attn_ref %d): worst relative logit error %g\n",
			attn_ref, worst);
	CHECK(worst <= 1e-4);
	free(a);
	free(b);
	ref_close(&R);
	fix_close(&x);
}

TEST(f32_vs_reference)
{
	f32_matches_reference(0);
}
TEST(f32_vs_reference_plain_attention)
{
	f32_matches_reference(1);
}

/* A prompt in one batch equals the same prompt a token at a time (F32 cache). */
TEST(prefill_equals_decode)
{
	fix_t x;
	if (fix_open(&x, QT_Q8_0, 2, QT_F32)) {
		CHECK(0);
		return;
	}
	int V = x.x.meta.n_vocab;
	float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
	CHECK_EQ_INT(model_forward(x.x.m, prompt, 12, 0, a), 0);
	for (int i = 0; i < 12; i++)
		CHECK_EQ_INT(model_forward(x.x.m, &prompt[i], 1, i, b), 0);
	double md = 0, mr = 0;
	for (int k = 0; k < V; k++)
		md = fmax(md, fabs(a[k] - b[k])), mr = fmax(mr, fabs(b[k]));
	CHECK(md / mr < 1e-3);
	CHECK_EQ_INT(sh_argmax(a, V), sh_argmax(b, V));
	free(a);
	free(b);
	fix_close(&x);
}

/* ---- engine vs llama.cpp -------------------------------------------------------------------- */

/* What llama.cpp computed on the fixture's file (fix_opts, written again here from the same seed:
 * same options, same bytes) for the 12-token prompt: each greedy step's top 5 ids and log
 * probabilities (log-softmax of the logits), 16 steps. Made with a small C++ program linked
 * against libllama.so of the 2026 llama.cpp tree at /work/llama.cpp/src (unslothai/llama.cpp
 * snapshot, ggml 0.18.1; build commit not recorded): llama_model_load_from_file with default
 * parameters, llama_init_from_model with n_ctx 512, 2 threads and the default F16 KV cache,
 * llama_decode of the prompt in one batch, then one token at a time, greedy. */
struct lc_step {
	int id[5];
	float lp[5];
};
/* f32 */
static const struct lc_step lc_f32[16] = {
    {{90, 49, 47, 117, 258}, {-1.939758f, -2.005178f, -2.260304f, -2.564513f, -2.632215f}},
    {{65, 39, 101, 262, 118}, {-1.952250f, -2.296092f, -2.456233f, -2.517658f, -2.827724f}},
    {{75, 39, 54, 97, 278}, {-0.627842f, -0.952093f, -4.900571f, -4.983260f, -5.188956f}},
    {{279, 273, 52, 307, 110}, {-1.000889f, -1.561065f, -2.855861f, -3.297517f, -3.397023f}},
    {{291, 284, 39, 55, 268}, {-1.171292f, -1.462197f, -1.867888f, -3.016898f, -3.090318f}},
    {{315, 46, 45, 293, 295}, {-0.654963f, -1.567818f, -2.304195f, -3.766141f, -3.909866f}},
    {{77, 67, 46, 263, 310}, {-0.884622f, -1.081471f, -2.889890f, -3.668666f, -4.084748f}},
    {{72, 46, 262, 74, 88}, {-2.079527f, -2.683701f, -2.820271f, -2.839372f, -2.854641f}},
    {{278, 263, 258, 309, 265}, {-1.644304f, -1.869503f, -1.990527f, -2.292990f, -2.593559f}},
    {{316, 47, 301, 293, 106}, {-0.472713f, -2.664268f, -2.707074f, -3.183404f, -3.642224f}},
    {{75, 95, 77, 110, 36}, {-0.064747f, -4.263658f, -4.663191f, -5.195508f, -5.473290f}},
    {{279, 72, 273, 271, 57}, {-1.417728f, -2.207926f, -2.386497f, -2.457367f, -2.545827f}},
    {{47, 284, 110, 74, 309}, {-1.413239f, -1.709848f, -2.861270f, -2.875396f, -2.883447f}},
    {{116, 294, 275, 286, 77}, {-1.517908f, -1.862371f, -2.370245f, -2.386682f, -2.824213f}},
    {{107, 97, 53, 115, 280}, {-0.807317f, -1.785818f, -2.310807f, -3.218524f, -3.507418f}},
    {{262, 277, 296, 282, 301}, {-0.167074f, -3.426507f, -4.433000f, -4.570306f, -4.643952f}},
};
/* q8_0 */
static const struct lc_step lc_q8_0[16] = {
    {{90, 49, 47, 258, 117}, {-1.940976f, -2.066767f, -2.238409f, -2.471273f, -2.599788f}},
    {{65, 39, 101, 262, 118}, {-1.973698f, -2.283589f, -2.467179f, -2.606314f, -2.808874f}},
    {{75, 39, 97, 54, 311}, {-0.621148f, -0.955065f, -4.953175f, -4.968500f, -5.206025f}},
    {{279, 273, 52, 307, 110}, {-1.033685f, -1.571617f, -2.790611f, -3.255331f, -3.416734f}},
    {{291, 284, 39, 55, 268}, {-1.138524f, -1.449451f, -1.868439f, -3.044937f, -3.171479f}},
    {{315, 46, 45, 293, 295}, {-0.627361f, -1.664555f, -2.293065f, -3.662271f, -3.959114f}},
    {{77, 67, 46, 263, 310}, {-0.915576f, -1.028723f, -2.895751f, -3.735308f, -4.072038f}},
    {{72, 46, 74, 88, 262}, {-2.028966f, -2.704724f, -2.810568f, -2.833634f, -2.857877f}},
    {{278, 263, 258, 309, 265}, {-1.658211f, -1.863255f, -1.963410f, -2.382980f, -2.543965f}},
    {{316, 47, 301, 293, 106}, {-0.450993f, -2.645748f, -2.781103f, -3.235637f, -3.768794f}},
    {{75, 95, 77, 110, 36}, {-0.060408f, -4.352540f, -4.717451f, -5.278481f, -5.503010f}},
    {{279, 72, 273, 271, 57}, {-1.469771f, -2.224220f, -2.341428f, -2.422183f, -2.520786f}},
    {{47, 284, 110, 74, 309}, {-1.463460f, -1.700309f, -2.815991f, -2.831646f, -2.941081f}},
    {{116, 294, 77, 286, 275}, {-1.289152f, -2.598270f, -2.599348f, -2.831369f, -2.897435f}},
    {{107, 97, 53, 115, 280}, {-0.838861f, -1.781736f, -2.282742f, -3.225681f, -3.463999f}},
    {{262, 277, 296, 282, 301}, {-0.152420f, -3.483181f, -4.500050f, -4.715217f, -4.759057f}},
};
/* mxfp4 */
static const struct lc_step lc_mxfp4[16] = {
    {{49, 90, 282, 117, 273}, {-1.136205f, -2.215968f, -2.448877f, -2.589890f, -3.059978f}},
    {{268, 73, 262, 46, 276}, {-0.516335f, -1.765141f, -2.544456f, -3.213430f, -4.436684f}},
    {{295, 70, 87, 67, 118}, {-0.976869f, -1.540417f, -2.302681f, -2.639214f, -3.354807f}},
    {{70, 289, 57, 45, 117}, {-0.713584f, -1.375820f, -2.892631f, -3.391665f, -3.572890f}},
    {{40, 51, 315, 268, 273}, {-1.515718f, -1.781032f, -2.432890f, -3.114120f, -3.119598f}},
    {{93, 92, 105, 83, 121}, {-1.673997f, -2.216475f, -2.295177f, -2.591191f, -2.855776f}},
    {{278, 272, 257, 114, 307}, {-0.008785f, -5.858479f, -6.887114f, -6.948758f, -7.010801f}},
    {{119, 85, 274, 316, 65}, {-1.010329f, -2.091543f, -2.321260f, -3.022702f, -3.702860f}},
    {{92, 64, 119, 46, 45}, {-1.868649f, -2.168103f, -2.309015f, -2.431231f, -2.599817f}},
    {{41, 117, 51, 76, 265}, {-1.768193f, -1.803617f, -1.892217f, -2.310376f, -2.532653f}},
    {{40, 265, 260, 98, 117}, {-1.371252f, -2.427500f, -2.534562f, -2.558789f, -3.300729f}},
    {{53, 75, 93, 117, 92}, {-1.668388f, -2.017164f, -2.186387f, -2.391497f, -2.755202f}},
    {{46, 45, 267, 298, 102}, {-0.083271f, -3.829473f, -4.071492f, -5.274649f, -5.297535f}},
    {{57, 280, 77, 288, 262}, {-0.816359f, -1.918659f, -3.187503f, -3.280942f, -3.414419f}},
    {{265, 64, 75, 54, 117}, {-1.471832f, -2.205261f, -2.225441f, -2.683328f, -2.826800f}},
    {{40, 62, 286, 101, 91}, {-0.432937f, -2.109465f, -2.591208f, -3.085975f, -3.491042f}},
};

/* The engine's log-softmax of logits[V]: the top 5 ids (falling) and their log probabilities. */
static void top5(const float *lg, int V, int *id, float *lp)
{
	double mx = lg[0], z = 0;
	for (int i = 1; i < V; i++)
		mx = fmax(mx, lg[i]);
	for (int i = 0; i < V; i++)
		z += exp(lg[i] - mx);
	for (int k = 0; k < 5; k++) {
		int b = -1;
		for (int i = 0; i < V; i++) {
			int taken = 0;
			for (int j = 0; j < k; j++)
				taken |= id[j] == i;
			if (!taken && (b < 0 || lg[i] > lg[b]))
				b = i;
		}
		id[k] = b;
		lp[k] = (float)(lg[b] - mx - log(z));
	}
}

/* Runs the engine (F16 cache, as llama.cpp's) greedily on the prompt; returns how many leading
 * steps chose llama.cpp's id, and the largest |delta log probability| over those steps' top 5
 * when the top-5 ids agree (*top5_equal cleared otherwise). */
static int vs_llama(int type, const struct lc_step *want, double *worst, int *top5_equal)
{
	fix_t x;
	*worst = 0;
	*top5_equal = 1;
	if (fix_open(&x, type, 2, QT_F16))
		return -1;
	int V = x.x.meta.n_vocab, same = 0;
	float *lg = malloc(V * sizeof *lg);
	int rc = model_forward(x.x.m, prompt, 12, 0, lg);
	for (int s = 0; s < 16 && !rc; s++) {
		int id[5];
		float lp[5];
		top5(lg, V, id, lp);
		if (id[0] != want[s].id[0])
			break;
		same++;
		for (int k = 0; k < 5; k++) {
			*top5_equal &= id[k] == want[s].id[k];
			if (id[k] == want[s].id[k])
				*worst = fmax(*worst, fabs(lp[k] - want[s].lp[k]));
		}
		rc = model_forward(x.x.m, &id[0], 1, 12 + s, lg);
	}
	free(lg);
	fix_close(&x);
	return rc ? -1 : same;
}

/* F32: 16 greedy ids exact, top 5 equal, |delta log probability| <= 0.03 (measured 0.005; the
 * issue's bound). Q8_0 and MXFP4 (experts MXFP4, the rest F16): the first id equal (measured:
 * Q8_0 16 of 16, MXFP4 9 of 16; with 8-bit activations a rounding flip upstream moves these
 * random models' log probabilities by up to ~0.06, so only the ids are held). */
TEST(llama_cpp_vectors)
{
	double worst;
	int t5;
	int n = vs_llama(QT_F32, lc_f32, &worst, &t5);
	if (n != 16 || !t5 || worst > 0.03)
		fprintf(stderr, "f32 vs llama.cpp: %d ids equal, top-5 %s, max |dlogprob| %g\n", n,
			t5 ? "equal" : "differ", worst);
	CHECK_EQ_INT(n, 16);
	CHECK(t5);
	CHECK(worst <= 0.03);
	n = vs_llama(QT_Q8_0, lc_q8_0, &worst, &t5);
	CHECK(n >= 1);
	fprintf(stderr, "q8_0 vs llama.cpp: %d of 16 ids equal, max |dlogprob| %g\n", n, worst);
	n = vs_llama(QT_MXFP4, lc_mxfp4, &worst, &t5);
	CHECK(n >= 1);
	fprintf(stderr, "mxfp4 vs llama.cpp: %d of 16 ids equal, max |dlogprob| %g\n", n, worst);
}

/* build_moe_ffn with LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT: the top k by raw logit,
 * weights the softmax over those k (not over all), no renormalisation. */
TEST(route_softmax_weight)
{
	float lg[6] = {0.5f, 3.0f, -1.0f, 2.0f, 2.5f, -4.0f};
	moe_route_t r = {6, 3, META_GATE_SOFTMAX_WEIGHT, 0, 1.0f, NULL, 0, 0};
	int sel[3];
	float w[3];
	moe_route(&r, lg, sel, w);
	CHECK_EQ_INT(sel[0], 1);
	CHECK_EQ_INT(sel[1], 4);
	CHECK_EQ_INT(sel[2], 3);
	double z = exp(3.0) + exp(2.5) + exp(2.0);
	CHECK_NEAR(w[0], exp(3.0) / z, 1e-6);
	CHECK_NEAR(w[1], exp(2.5) / z, 1e-6);
	CHECK_NEAR(w[2], exp(2.0) / z, 1e-6);
}

/* ---- ranks ---------------------------------------------------------------------------------- */

#define MAXR 3

/* world ranks splitting heads and experts by weights w (tensor + expert parallel) give one
 * rank's greedy ids (ref_util.h's in-process group). */
static void ranks_match_one(int world, const int *w)
{
	fix_t x;
	char err[256];
	if (fix_open(&x, QT_Q8_0, 1, QT_F32)) {
		CHECK(0);
		return;
	}
	int want[16], V = x.x.meta.n_vocab, ids[MAXR][16];
	CHECK_EQ_INT(ref_greedy(x.x.m, V, prompt, 12, 16, want), 0);
	model_shard_t sh[MAXR];
	int drc = dist_split(&x.x.meta, 32, 0, world, w, sh, err, sizeof err);
	if (drc)
		fprintf(stderr, "dist_split: %s\n", err);
	CHECK_EQ_INT(drc, 0);
	model_t *m[MAXR];
	pool_t *pools[MAXR];
	int held = 0, heads = 0;
	for (int r = 0; r < world; r++) {
		held += sh[r].n_exp;
		heads += sh[r].n_q_heads;
		pools[r] = pool_new(1);
		m[r] = NULL;
		CHECK_EQ_INT(model_new_kv(&m[r], x.x.g, &x.x.meta, &sh[r], CTX, QT_F32, pools[r],
					  err, sizeof err),
			     0);
		if (!m[r])
			return;
	}
	CHECK_EQ_INT(held, x.x.meta.n_experts);
	CHECK_EQ_INT(heads, x.x.meta.n_heads);
	CHECK_EQ_INT(mem_shards_greedy(m, world, V, x.x.meta.dim, prompt, 12, 16, &ids[0][0]), 0);
	for (int r = 0; r < world; r++) {
		CHECK(!memcmp(ids[r], want, sizeof want));
		model_free(m[r]);
		pool_free(pools[r]);
	}
	fix_close(&x);
}

static const int w11[2] = {1, 1}, w211[3] = {2, 1, 1};
TEST(two_ranks_equal_one)
{
	ranks_match_one(2, w11);
}
TEST(three_ranks_equal_one)
{
	ranks_match_one(3, w211);
}

/* ---- the o200k pre-tokenizer ------------------------------------------------------------- */

static void collect(void *ud, const char *w, size_t n)
{
	char *o = ud;
	size_t k = strlen(o);
	if (k + n + 2 < 1024) {
		memcpy(o + k, w, n);
		o[k + n] = '|';
		o[k + n + 1] = 0;
	}
}

/* tokenizer.ggml.pre "gpt-4o" splits text as llama.cpp does: the expected words were printed by
 * llama.cpp's own unicode_regex_split (src/unicode.cpp, exported by libllama.so at the commit
 * of /work/llama.cpp/src, 2026) with the regex llama-vocab.cpp gives
 * LLAMA_VOCAB_PRE_TYPE_GPT4O, joined by '|'. Its letter classes differ from tokenizer.json's
 * original: a non-ASCII lowercase letter continues a word's capitals ("aÉb" one word, where
 * \p{Lu}/\p{Ll} would cut "a|Éb"), combining marks are not letters, and a titlecase letter
 * (U+01C8) is a capital. */
TEST(o200k_pre_tokenizer)
{
	static const struct {
		const char *text, *want;
	} v[] = {
	    {"HelloWorld ThisIsCamelCase IBM's PDFs are OK'd",
	     "Hello|World| This|Is|Camel|Case| IBM's| PDFs| are| OK'd|"},
	    {"I'll we've they're he'd you'LL SHE'S Don'T",
	     "I'll| we've| they're| he'd| you'LL| SHE'S| Don'T|"},
	    {"12345 1234567 3.14159 -42 1,000,000",
	     "123|45| |123|456|7| |3|.|141|59| -|42| |1|,|000|,|000|"},
	    {"line one\nline two\n\n   trailing spaces   \n",
	     "line| one|\n|line| two|\n\n|  | trailing| spaces|   \n|"},
	    {"caf\xc3\xa9 a\xc3\x89"
	     "b \xc3\x80\xc3\x89\xc3\x8e \xc3\xa9T\xc3\xa9 \xc7\x85ungla \xc7\x88J",
	     "caf\xc3\xa9| a\xc3\x89"
	     "b| \xc3\x80\xc3\x89\xc3\x8e| \xc3\xa9T\xc3\xa9| \xc7\x85ungla| \xc7\x88|J|"},
	    {"e\xcc\x81 combining: n\xcc\x83 a\xcc\x80"
	     "b",
	     "e|\xcc\x81| combining|:| n|\xcc\x83| a|\xcc\x80"
	     "b|"},
	    {"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xe4\xb8\xad\xe6\x96\x87"
	     "ABC\xe4\xb8\xad abc\xe4\xb8\xad",
	     "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e| \xe4\xb8\xad\xe6\x96\x87"
	     "ABC\xe4\xb8\xad| abc\xe4\xb8\xad|"},
	    {"emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xc2\xa9\xe2\x84\xa2 "
	     "\xe2\x82\xac\xc2\xa5 \xc2\xbd \xc2\xb2x \xe2\x85\xa7",
	     "emoji| \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd| \xc2\xa9\xe2\x84\xa2| "
	     "\xe2\x82\xac\xc2\xa5| |\xc2\xbd| |\xc2\xb2|x| |\xe2\x85\xa7|"},
	    {"$100 @user #tag http://x.com/p?x=1&y=2 a/b//\n",
	     "$|100| @|user| #|tag| http|://|x|.com|/p|?x|=|1|&y|=|2| a|/b|//\n|"},
	    {"code:\n    if x:\n        return 1\n",
	     "code|:\n|   | if| x|:\n|       | return| |1|\n|"},
	    {"foo\r\nbar\r\n\r\nbaz  \n\n  \n", "foo|\r\n|bar|\r\n\r\n|baz|  \n\n  \n|"},
	    {"a\t\tb  \t c NBSP\xc2\xa0x\xc2\xa0 thin\xe2\x80\x89y \xe3\x80\x80z",
	     "a|\t|\tb|  \t| c| NBSP|\xc2\xa0x|\xc2\xa0| thin|\xe2\x80\x89y| |\xe3\x80\x80z|"},
	    {"x'S's'ss ''m 'LL", "x'S|'s's|s| ''|m| '|LL|"},
	};
	struct tok_pre *p;
	int im;
	char err[256];
	CHECK_EQ_INT(tok_pre_new(&p, "gpt-4o", &im, err, sizeof err), 0);
	CHECK_EQ_INT(im, 0);
	for (size_t i = 0; i < ARRAY_LEN(v); i++) {
		char got[1024] = "";
		CHECK_EQ_INT(tok_pre_split(p, v[i].text, strlen(v[i].text), collect, got), 0);
		if (strcmp(got, v[i].want))
			fprintf(stderr, "o200k split %zu:\n  got  %s\n  want %s\n", i, got,
				v[i].want);
		CHECK(!strcmp(got, v[i].want));
	}
	tok_pre_free(p);
}

/* The harmony tokens as llama.cpp's vocabulary loader adjusts them (llama-vocab.cpp: <|channel|>,
 * <|message|>, <|start|>, <|constrain|> user-defined; <|end|> not an end of generation when
 * <|return|> and <|call|> are): a gpt-oss file's text keeps its channels, and a reply ends on
 * <|return|> or <|call|>. */
TEST(harmony_tokens)
{
	fix_t x;
	char err[256];
	if (fix_open(&x, QT_Q8_0, 1, QT_F32)) {
		CHECK(0);
		return;
	}
	tok_t *t = NULL;
	CHECK_EQ_INT(tok_load(&t, x.x.g, err, sizeof err), 0);
	if (t) {
		static const char *const user[] = {"<|channel|>", "<|message|>", "<|start|>",
						   "<|constrain|>", "<|end|>"};
		for (size_t i = 0; i < ARRAY_LEN(user); i++) {
			int id = tok_find(t, user[i], strlen(user[i]));
			CHECK(id >= 0 && tok_type(t, id) == TOK_T_USER && !tok_is_eog(t, id));
		}
		CHECK(tok_is_eog(t, tok_find(t, "<|return|>", 10)));
		CHECK(tok_is_eog(t, tok_find(t, "<|call|>", 8)));
		CHECK_EQ_INT(tok_add_bos(t), 0);
		/* rendered as text by a plain decode, parsed back from text */
		const char *s = "<|channel|>final<|message|>hi<|end|>";
		int *ids = NULL, n = 0;
		CHECK_EQ_INT(tok_encode(t, s, strlen(s), 0, 0, &ids, &n), 0);
		CHECK_EQ_INT(ids[0], tok_find(t, "<|channel|>", 11));
		char *back = NULL;
		size_t len;
		CHECK_EQ_INT(tok_decode(t, ids, n, 0, &back, &len), 0);
		CHECK(back && !strcmp(back, s));
		free(back);
		free(ids);
	}
	tok_free(t);
	fix_close(&x);
}

/* ---- harmony replies ------------------------------------------------------------------------ */

/* The pieces of kind joined (at most 255 bytes). */
static const char *joined(const eng_harmony_t *h, int kind, char *buf)
{
	size_t k = 0;
	for (int i = 0; i < h->n; i++)
		if (h->piece[i].kind == kind && k + h->piece[i].len < 255) {
			memcpy(buf + k, h->piece[i].p, h->piece[i].len);
			k += h->piece[i].len;
		}
	buf[k] = 0;
	return buf;
}

/* A reply read back as common/chat.cpp's gpt-oss parser reads it (common_chat_params_init_gpt_oss:
 * analysis = reasoning, final and commentary preambles = content, a recipient to=functions.NAME
 * in the role header or after the channel = a call whose message is the arguments), and every
 * prefix of it parsing to a prefix of the whole (what a stream may send). */
TEST(harmony_parse)
{
	char a[256], b[256];
	eng_harmony_t h;
	const char *r1 = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>"
			 "final<|message|>The answer is 4.";
	eng_harmony_parse(r1, strlen(r1), 1, &h);
	CHECK_EQ_STR(joined(&h, ENG_H_REASONING, a), "Think.");
	CHECK_EQ_STR(joined(&h, ENG_H_CONTENT, b), "The answer is 4.");
	const char *r2 =
	    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
	    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
	    "{\"city\":\"Paris\"}";
	eng_harmony_parse(r2, strlen(r2), 1, &h);
	CHECK_EQ_INT(h.n, 2);
	CHECK(h.piece[1].kind == ENG_H_CALL && h.piece[1].name_len == 11 &&
	      !memcmp(h.piece[1].name, "get_weather", 11));
	CHECK(h.piece[1].len == 16 && !memcmp(h.piece[1].p, "{\"city\":\"Paris\"}", 16));
	CHECK_EQ_STR(joined(&h, ENG_H_CONTENT, b), "");
	const char *r3 = " to=functions.add<|channel|>commentary json<|message|>{\"a\": 1}<|call|>";
	eng_harmony_parse(r3, strlen(r3), 1, &h);
	CHECK(h.n == 1 && h.piece[0].kind == ENG_H_CALL && h.piece[0].name_len == 3 &&
	      h.piece[0].done);
	const char *r4 = "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant"
			 "<|channel|>final<|message|>Done<|return|>";
	eng_harmony_parse(r4, strlen(r4), 1, &h);
	CHECK_EQ_STR(joined(&h, ENG_H_CONTENT, b), "Let me check.Done");
	eng_harmony_parse("plain words", 11, 1, &h); /* no channel at all: content as it is */
	CHECK_EQ_STR(joined(&h, ENG_H_CONTENT, b), "plain words");
	/* streaming: each prefix shows a prefix of the final reasoning and content, and holds back
	 * a tail that may still become a token ("<|e" of <|end|>) */
	const char *all[] = {r1, r2, r4};
	for (size_t k = 0; k < ARRAY_LEN(all); k++) {
		char fr[256], fc[256], pr[256], pc[256];
		size_t n = strlen(all[k]);
		eng_harmony_parse(all[k], n, 1, &h);
		joined(&h, ENG_H_REASONING, fr);
		joined(&h, ENG_H_CONTENT, fc);
		int ok = 1;
		for (size_t i = 0; i <= n; i++) {
			eng_harmony_parse(all[k], i, 0, &h);
			joined(&h, ENG_H_REASONING, pr);
			joined(&h, ENG_H_CONTENT, pc);
			ok &= !strncmp(fr, pr, strlen(pr)) && !strncmp(fc, pc, strlen(pc)) &&
			      !strchr(pr, '<') && !strchr(pc, '<');
		}
		CHECK(ok);
	}
}

/* gpt-oss's own template (llama.cpp's models/templates/openai-gpt-oss-120b.jinja) as llama.cpp
 * renders it: the expected text is llama-server's /apply-template output (--jinja
 * --chat-template-file that template, the 2026 tree at /work/llama.cpp/src) for this conversation:
 * a system message, a user turn, an assistant tool call with reasoning (dropped: a later answer
 * follows), its result, that answer, a user turn with non-ASCII text; two tools, one with string,
 * integer (a default), enum, array and nested object parameters (whose types the template writes
 * after a newline and 16 spaces), one with none. Only the date is today's. */
TEST(harmony_render)
{
	static const char want_fmt[] =
	    "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
	    "OpenAI.\nKnow"
	    "ledge cutoff: 2024-06\nCurrent date: %s\n\nReasoning: medium\n\n# Valid channels: "
	    "analysis"
	    ", commentary, final. Channel must be included for every message.\nCalls to these "
	    "tools mus"
	    "t go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># "
	    "Instruct"
	    "ions\n\nBe brief.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// Get the "
	    "weathe"
	    "r\ntype get_weather = (_: {\n// City name\ncity: string,\ndays?: number, // default: "
	    "1,\nu"
	    "nit?: \"c\" | \"f\",\ntags?: string[],\nopts?: {\na: \n                boolean, b?: "
	    "\n    "
	    "            number},\n}) => any;\n\n// Current time\ntype now = () => any;\n\n} // "
	    "namespa"
	    "ce functions<|end|><|start|>user<|message|>What is the weather in "
	    "Paris?<|end|><|start|>as"
	    "sistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": "
	    "\"Paris\","
	    " \"days\": 2}<|call|><|start|>functions.get_weather "
	    "to=assistant<|channel|>commentary<|mes"
	    "sage|>\"Sunny, 21 C\"<|end|><|start|>assistant<|channel|>final<|message|>It is "
	    "sunny.<|end"
	    "|><|start|>user<|message|>And in Z\xc3\xbcrich?<|end|><|start|>assistant";

	const char *call = "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
			   "\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\", "
			   "\\\"days\\\": 2}\"}}]";
	const eng_msg_t m[] = {
	    {.role = "system", .content = "Be brief."},
	    {.role = "user", .content = "What is the weather in Paris?"},
	    {.role = "assistant",
	     .content = "",
	     .reasoning = "I should call the tool.",
	     .tool_calls = call},
	    {.role = "tool", .content = "Sunny, 21 C", .tool_call_id = "call_1"},
	    {.role = "assistant", .content = "It is sunny."},
	    {.role = "user", .content = "And in Z\xc3\xbcrich?"},
	};
	const char *tools =
	    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get "
	    "the weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
	    "\"string\",\"description\":\"City "
	    "name\"},\"days\":{\"type\":\"integer\",\"default\":1},"
	    "\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]},\"tags\":{\"type\":\"array\","
	    "\"items\":{\"type\":\"string\"}},\"opts\":{\"type\":\"object\",\"properties\":{\"a\":{"
	    "\"type\":\"boolean\"},\"b\":{\"type\":\"number\"}},\"required\":[\"a\"]}},"
	    "\"required\":["
	    "\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"now\",\"description\":"
	    "\"Current time\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]";
	char date[16], want[4096], err[256], *out = NULL;
	time_t now = time(NULL);
	struct tm tm;
	localtime_r(&now, &tm);
	strftime(date, sizeof date, "%Y-%m-%d", &tm);
	snprintf(want, sizeof want, want_fmt, date);
	CHECK_EQ_INT(chat_render_tools("gpt-oss", CHAT_TOOLS_HARMONY, m, (int)ARRAY_LEN(m), tools, 0, NULL,
				       &out, err, sizeof err),
		     0);
	if (out && strcmp(out, want))
		fprintf(stderr, "harmony render:\n%s\n---- want:\n%s\n", out, want);
	CHECK(out && !strcmp(out, want));
	free(out);
	/* the family is recognised from a template carrying <|start|> and <|channel|> */
	CHECK_EQ_STR(chat_detect("{{'<|start|>' + role}}<|channel|>final", 37), "gpt-oss");
	CHECK_EQ_INT(chat_tool_format(chat_tool_style("gpt-oss", NULL, 0)), ENG_TOOLS_HARMONY);
}

/* ---- bad input ------------------------------------------------------------------------------ */

/* The fixture's file with one tensor left out or misshapen (or a key dropped): meta_load's code
 * and message. */
static int bad_model(const char *drop, const char *reshape, const char *nokey, char *err,
		     size_t errlen)
{
	char src[256], dst[256];
	mkmodel_opts_t o = fix_opts(QT_F32);
	snprintf(src, sizeof src, "/tmp/shoal-test-gptoss-src-%d.gguf", (int)getpid());
	snprintf(dst, sizeof dst, "/tmp/shoal-test-gptoss-bad-%d.gguf", (int)getpid());
	gguf_t *g = NULL, *b = NULL;
	int rc = mkmodel_write(&o, src, err, errlen);
	if (!rc)
		rc = gguf_open(&g, src, err, errlen);
	gguf_writer_t *w = gw_new();
	for (int i = 0; !rc && i < gguf_n_kv(g); i++) { /* copy the keys we use */
		const char *k = gguf_key(g, i);
		if (nokey && !strcmp(k, nokey))
			continue;
		int64_t iv;
		double fv;
		const char *s;
		size_t n;
		if (gguf_kv_type(g, i) == GGUF_STR && !gguf_kv_str(g, i, &s, &n)) {
			char *c = strndup(s, n);
			gw_kv_str(w, k, c);
			free(c);
		} else if (gguf_kv_type(g, i) == GGUF_F32 && !gguf_kv_f64(g, i, &fv)) {
			gw_kv_f32(w, k, (float)fv);
		} else if (gguf_kv_type(g, i) != GGUF_ARR && !gguf_kv_i64(g, i, &iv)) {
			gw_kv_u32(w, k, (uint32_t)iv);
		}
	}
	int nt = 0;
	for (int i = 0; !rc && i < gguf_n_tensors(g); i++) {
		const gguf_tensor_t *t = gguf_tensor(g, i);
		if (drop && !strcmp(t->name, drop))
			continue;
		int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
		if (reshape && !strcmp(t->name, reshape))
			ne[0] /= 2, ne[1] *= 2;
		gw_tensor(w, t->name, t->n_dims, ne, t->type);
		nt++;
	}
	if (!rc)
		rc = gw_begin(w, dst, err, errlen);
	for (int i = 0; !rc && i < gguf_n_tensors(g); i++) {
		const gguf_tensor_t *t = gguf_tensor(g, i);
		if (!(drop && !strcmp(t->name, drop)))
			rc = gw_data(w, t->data, t->nbytes, err, errlen);
	}
	if (!rc)
		rc = gw_finish(w, err, errlen);
	gw_free(w);
	model_meta_t m;
	if (!rc && !(rc = gguf_open(&b, dst, err, errlen)))
		rc = meta_load(&m, b, err, errlen);
	gguf_free(b);
	gguf_free(g);
	unlink(src);
	unlink(dst);
	(void)nt;
	return rc;
}

TEST(bad_input)
{
	char err[256];
	CHECK_EQ_INT(bad_model(NULL, NULL, NULL, err, sizeof err), 0);
	CHECK(bad_model("blk.1.attn_sinks.weight", NULL, NULL, err, sizeof err) < 0);
	CHECK(strstr(err, "missing tensor blk.1.attn_sinks.weight") != NULL);
	CHECK(bad_model(NULL, "blk.0.ffn_up_exps.bias", NULL, err, sizeof err) < 0);
	CHECK(strstr(err, "blk.0.ffn_up_exps.bias") && strstr(err, "expected [64, 8]"));
	CHECK(bad_model("blk.2.post_attention_norm.weight", NULL, NULL, err, sizeof err) < 0);
	CHECK(strstr(err, "blk.2.post_attention_norm.weight") != NULL);
	CHECK(bad_model(NULL, NULL, "gpt-oss.attention.sliding_window", err, sizeof err) < 0);
	CHECK(strstr(err, "missing key gpt-oss.attention.sliding_window") != NULL);
	CHECK(bad_model(NULL, NULL, "gpt-oss.expert_feed_forward_length", err, sizeof err) < 0);
	CHECK(strstr(err, "gpt-oss.expert_feed_forward_length") != NULL);
}

int main(void)
{
	quant_init(0);
	RUN(route_softmax_weight);
	RUN(o200k_pre_tokenizer);
	RUN(harmony_tokens);
	RUN(harmony_parse);
	RUN(harmony_render);
	RUN(f32_vs_reference);
	RUN(llama_cpp_vectors);
	RUN(f32_vs_reference_plain_attention);
	RUN(prefill_equals_decode);
	RUN(two_ranks_equal_one);
	RUN(three_ranks_equal_one);
	RUN(bad_input);
	return harness_done();
}
