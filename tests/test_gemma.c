/* test_gemma.c: Gemma 3 (GGUF architecture gemma3) as llama.cpp runs it.
 *
 * Semantics from llama.cpp: src/models/gemma3.cpp (load_arch_hparams: sliding window with
 * period 6, rope.freq_base_swa, final_logit_softcapping, the 27B query scale; the graph:
 * embeddings x sqrt(dim), q/k RMS norms, post_attention_norm / post_ffw_norm, GELU-gated FFN,
 * tied head), src/llama-hparams.h is_masked_swa, ggml-cpu/vec.h ggml_vec_geglu_f32 (GELU
 * through an F16 table), convert_hf_to_gguf.py Gemma3Model (norms stored with + 1, no
 * rope.dimension_count, SentencePiece vocabulary without a space prefix).
 * - meta_load reads the keys (window, period, both bases, linear scaling of the global layers,
 *   the query scale, 62 layers' rule) and names a missing or misshapen tensor with its shape;
 * - a generated F32 file (window 8, 6 layers: layer 5 global) against tests/ref_dense.h's
 *   reference: 150-token prompt + 30 greedy steps (the rings wrap) within 1e-4 relative, also
 *   with softcapping and linear RoPE scaling; Q8_0 greedy top-1 equal (near ties excepted);
 * - the SentencePiece tokenizer as llama.cpp's (no space prefix, BOS, special tokens), EOG
 *   tokens, the gemma chat template. */
#include "common/common.h"
#include "gen_model.h"
#include "harness.h"
#include "infer/chat.h"
#include "infer/infer.h"
#include "infer/model/model_int.h"
#include "infer/tok/tokenizer.h"
#include "llama_vectors.h"
#include "model_fix.h"
#include "ref_dense.h"

#define CTX 256

static mkmodel_opts_t gemma_opts(int type, int seed)
{
	return (mkmodel_opts_t){.arch = "gemma3",
				.dim = 256,
				.layers = 6,
				.heads = 4,
				.kv_heads = 2,
				.head_dim = 64,
				.ffn = 512,
				.vocab = 1024,
				.ctx = CTX,
				.type = type,
				.seed = (uint64_t)seed,
				.swa_window = 8};
}

static int fix_open(gen_t *x, const mkmodel_opts_t *o, void (*tweak)(model_meta_t *))
{
	return gen_open_slots(x, o, "gemma", 2, CTX, 1, QT_F32, tweak);
}

TEST(meta)
{
	gen_t x;
	mkmodel_opts_t o = gemma_opts(QT_F32, 1);
	o.rope_factor = 8;
	if (fix_open(&x, &o, NULL)) {
		CHECK(0);
		return;
	}
	const model_meta_t *p = &x.meta;
	CHECK_EQ_INT(p->arch, META_GEMMA3);
	CHECK_EQ_INT(p->swa_window, 8);
	CHECK_EQ_INT(p->swa_period, 6);
	for (int l = 0; l < 6; l++)
		CHECK_EQ_INT(meta_layer_swa(p, l), l != 5);
	CHECK(p->rope_base == 1e6f && p->rope_base_swa == 1e4f);
	CHECK(p->rope_scale == 0.125f && p->rope_scale_swa == 1.0f); /* global layers only */
	CHECK(fabsf(p->attn_scale - 0.125f) < 1e-7f);                /* 1/sqrt(64) */
	CHECK(fabsf(p->embd_scale - 16.0f) < 1e-6f);
	CHECK(p->tied_output && p->has_qk_norm && p->has_post_norm && p->ffn_gelu);
	CHECK_EQ_INT(p->rope_dim, 64);
	CHECK_EQ_INT(p->rope_style, META_ROPE_NEOX);
	gen_close(&x);
	/* the 27B rule: 62 layers scale queries by 1/sqrt(dim / heads), not 1/sqrt(head_dim) */
	mkmodel_opts_t big = {.arch = "gemma3",
			      .dim = 64,
			      .layers = 62,
			      .heads = 2,
			      .kv_heads = 1,
			      .head_dim = 64,
			      .ffn = 64,
			      .vocab = 400,
			      .type = QT_F32,
			      .seed = 1};
	gguf_t *g = NULL;
	model_meta_t m;
	char path[256];
	snprintf(path, sizeof path, "/tmp/shoal-test-gemma-%d-62.gguf", (int)getpid());
	if (!gen_file(&big, path, &g, &m, "gemma3 62")) {
		CHECK(fabsf(m.attn_scale - 1.0f / sqrtf(32.0f)) < 1e-7f);
		CHECK_EQ_INT(m.swa_window, 512);
	} else {
		CHECK(0);
	}
	gguf_free(g);
	unlink(path);
}

/* Engine vs reference: np prompt tokens, then n greedy steps; tweak adjusts the metadata of
 * both (softcapping). */
static void vs_reference(int type, void (*tweak)(model_meta_t *), int rope_factor)
{
	gen_t x;
	rd_t R;
	mkmodel_opts_t o = gemma_opts(type, 2);
	o.rope_factor = (float)rope_factor;
	if (fix_open(&x, &o, tweak)) {
		CHECK(0);
		return;
	}
	rd_open(&R, x.g, &x.meta, CTX);
	int t[CTX], agree, steps = 30;
	rand_tokens(t, 150, 5, x.meta.n_vocab);
	double worst = rd_compare(x.m, &R, t, 150, steps, 0.005f, NULL, NULL, &agree);
	printf("gemma3 %s%s%s: top-1 equal at %d of %d steps, worst relative logit error %.2e\n",
	       quant_type_name(type), tweak ? " softcap" : "", rope_factor ? " rope x8" : "", agree,
	       steps, worst);
	CHECK_EQ_INT(agree, steps);
	/* 1e-3, not 1e-4: the GELU table is a step function of the input rounded to F16, and an
	 * input within float noise of a rounding boundary lands one step (2^-11 relative) apart in
	 * the engine and the reference; with the plain formula in both the error is 2e-6 */
	if (type == QT_F32)
		CHECK(worst < 1e-3);
	rd_close(&R);
	gen_close(&x);
}

static void softcap(model_meta_t *m)
{
	m->logit_softcap = 3.0f;
}

/* gelu_gate is ggml_vec_geglu_f32: 0 below -10, the input from 10 on, else the tanh-form GELU
 * of the input rounded to F16, itself rounded to F16 (ggml-cpu/vec.h, ggml_table_gelu_f16). */
TEST(gelu_table)
{
	float x[] = {-12.0f,  -10.0f, -9.99f, -3.3f, -0.5f, -1e-3f, 0.0f,
		     0.7071f, 1.0f,   2.5f,   9.99f, 10.0f, 30.0f};
	float up[ARRAY_LEN(x)], h[ARRAY_LEN(x)];
	for (size_t i = 0; i < ARRAY_LEN(x); i++)
		up[i] = 1.0f + 0.25f * (float)i, h[i] = x[i];
	gelu_gate(h, up, (int)ARRAY_LEN(x));
	for (size_t i = 0; i < ARRAY_LEN(x); i++) {
		float want = (float)rd_gelu(x[i]) * up[i];
		CHECK(h[i] == want);
	}
	CHECK(h[0] == 0.0f && h[11] == 10.0f * up[11] && h[12] == 30.0f * up[12]);
	CHECK(fabsf(h[9] / up[9] - 2.4845f) < 2e-3f); /* GELU(2.5) */
}

/* gelu_gate's eight-wide path (F16C) gives the one-element loop's bits: every F16 value as an
 * input (NaNs and infinities included), and floats between them, around -10 and 10. */
TEST(gelu_wide_as_scalar)
{
	enum { N = (1 << 16) + 4096 };
	static float x[N], up[N], wide[N];
	for (int i = 0; i < (1 << 16); i++)
		x[i] = quant_f16_to_f32((uint16_t)i);
	uint32_t s = 7;
	for (int i = 1 << 16; i < N; i++) {
		s = s * 1664525u + 1013904223u;
		x[i] = ((float)(s >> 8) / (float)(1u << 24) - 0.5f) * 24.0f;
	}
	for (int i = 0; i < N; i++) {
		up[i] = 1.0f + (float)(i % 7) * 0.125f;
		wide[i] = x[i];
	}
	gelu_gate(wide, up, N);
	int same = 1;
	for (int i = 0; i < N; i++) {
		float one = x[i];
		gelu_gate(&one, &up[i], 1);
		same &= !memcmp(&one, &wide[i], sizeof one);
	}
	CHECK(same);
}

TEST(f32_vs_reference)
{
	vs_reference(QT_F32, NULL, 0);
}

TEST(f32_softcap_scaled_rope)
{
	vs_reference(QT_F32, softcap, 8);
}

TEST(q8_0_greedy)
{
	vs_reference(QT_Q8_0, NULL, 0);
}

/* llama.cpp's SentencePiece path (llama_vocab::impl::tokenize, LLAMA_VOCAB_TYPE_SPM): BOS when
 * add_bos, no space prefix for Gemma (tokenizer.ggml.add_space_prefix false), spaces as U+2581,
 * special tokens parsed when asked; <end_of_turn> and <eos> end generation. */
TEST(tokenizer_and_template)
{
	gen_t x;
	mkmodel_opts_t o = gemma_opts(QT_F32, 1);
	if (fix_open(&x, &o, NULL)) {
		CHECK(0);
		return;
	}
	char err[256];
	tok_t *t = NULL;
	CHECK_EQ_INT(tok_load(&t, x.g, err, sizeof err), 0);
	if (!t) {
		gen_close(&x);
		return;
	}
	CHECK_EQ_INT(tok_bos(t), 2);
	CHECK_EQ_INT(tok_eos(t), 1);
	CHECK(tok_add_bos(t));
#define ID(s) tok_find(t, s, strlen(s))
	int *ids = NULL, n = 0;
	const char *txt = "Once upon a time";
	CHECK_EQ_INT(tok_encode(t, txt, strlen(txt), 1, 0, &ids, &n), 0);
	/* "Once": no leading U+2581 (no space prefix), so its letters stay single pieces */
	int want[] = {2,
		      ID("O"),
		      ID("n"),
		      ID("c"),
		      ID("e"),
		      ID("\xe2\x96\x81upon"),
		      ID("\xe2\x96\x81"
			 "a"),
		      ID("\xe2\x96\x81time")};
	CHECK_EQ_INT(n, (int)ARRAY_LEN(want));
	for (int i = 0; i < n && i < (int)ARRAY_LEN(want); i++)
		CHECK_EQ_INT(ids[i], want[i]);
	free(ids);
	txt = "<start_of_turn>user\nhi<end_of_turn>";
	CHECK_EQ_INT(tok_encode(t, txt, strlen(txt), 0, 1, &ids, &n), 0);
	CHECK(n >= 4 && ids[0] == ID("<start_of_turn>") && ids[n - 1] == ID("<end_of_turn>"));
	free(ids);
	CHECK_EQ_INT(tok_encode(t, txt, strlen(txt), 0, 0, &ids, &n), 0); /* as text */
	CHECK(n > 4 && ids[0] != ID("<start_of_turn>"));
	free(ids);
	txt = "\xc3\xa9"; /* not in the vocabulary: byte fallback */
	CHECK_EQ_INT(tok_encode(t, txt, strlen(txt), 0, 0, &ids, &n), 0);
	CHECK(n == 2 && ids[0] == ID("<0xC3>") && ids[1] == ID("<0xA9>"));
	free(ids);
	CHECK(tok_is_eog(t, ID("<end_of_turn>")) && tok_is_eog(t, 1) && !tok_is_eog(t, 2));
	char *dec = NULL;
	size_t dl;
	int ds[] = {ID("\xe2\x96\x81upon"), ID("<0xC3>"), ID("<0xA9>")};
	CHECK_EQ_INT(tok_decode(t, ds, 3, 0, &dec, &dl), 0);
	CHECK(dec && !strcmp(dec, " upon\xc3\xa9"));
	free(dec);
#undef ID
	tok_free(t);
	/* the model's template is recognised as gemma and rendered as llama.cpp does */
	const char *tmpl;
	size_t tl;
	CHECK_EQ_INT(gguf_get_str(x.g, "tokenizer.chat_template", &tmpl, &tl), 0);
	const char *fam = NULL;
	CHECK_EQ_INT(chat_pick(NULL, tmpl, tl, &fam, err, sizeof err), 0);
	CHECK(fam && !strcmp(fam, "gemma"));
	eng_msg_t msgs[] = {{.role = "system", .content = "Be brief."},
			    {.role = "user", .content = "Hi"}};
	char *out = NULL;
	CHECK_EQ_INT(chat_render("gemma", msgs, 2, 1, NULL, &out, err, sizeof err), 0);
	CHECK(out && !strcmp(out, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
				  "<start_of_turn>model\n"));
	free(out);
	gen_close(&x);
}

/* ---- the engine: slots, batching and prefix reuse over sliding-window rings ---------------- */

typedef struct ids_sink {
	int ids[64], n;
} ids_sink_t;

static int on_id(void *ud, const eng_token_t *t)
{
	ids_sink_t *s = ud;
	if (s->n < 64)
		s->ids[s->n++] = t->id;
	return 0;
}

static eng_t *engine(const char *path, int parallel)
{
	char err[256];
	eng_opts_t o = {
	    .model_path = path, .threads = 2, .ctx = CTX, .parallel = parallel, .kv_type = "f32"};
	eng_t *e = NULL;
	if (eng_open(&e, &o, err, sizeof err))
		fprintf(stderr, "eng_open: %s\n", err);
	return e;
}

/* Greedy, 8 tokens, alone in e. */
static void solo(eng_t *e, const int *p, int n, ids_sink_t *s)
{
	eng_sampling_t sp;
	eng_result_t res;
	eng_sampling_default(&sp);
	sp.max_tokens = 8;
	memset(s, 0, sizeof *s);
	CHECK_EQ_INT(eng_generate(e, p, n, &sp, on_id, s, &res), 0);
	CHECK_EQ_INT(s->n, 8);
}

/* A slot keeps a 200-token sequence (its window-8 rings hold 128 positions): a prompt sharing
 * 190 tokens reuses them, one sharing 50 recomputes (model_prefix_usable), and both give a
 * fresh engine's ids; two sequences decoded together give their solo ids. */
TEST(engine_slots_and_prefix_reuse)
{
	gen_t x;
	mkmodel_opts_t o =
	    gemma_opts(QT_F32, 4); /* F32 weights and cache: batch shapes only reorder sums */
	if (fix_open(&x, &o, NULL)) {
		CHECK(0);
		return;
	}
	int V = x.meta.n_vocab, a[CTX], b[CTX], c[CTX];
	rand_tokens(a, 200, 11, V);
	memcpy(b, a, 190 * sizeof *b);
	rand_tokens(b + 190, 20, 12, V);
	memcpy(c, a, 50 * sizeof *c);
	rand_tokens(c + 50, 150, 13, V);
	eng_t *e = engine(x.path, 1), *f = engine(x.path, 1), *g = engine(x.path, 2);
	if (!e || !f || !g) {
		CHECK(0);
		goto out;
	}
	ids_sink_t sa = {0}, sb = {0}, sc = {0}, fb = {0}, fc = {0};
	solo(e, a, 200, &sa);
	solo(e, b, 210, &sb); /* keeps 190 */
	solo(e, c, 200, &sc); /* keeps nothing: the ring overwrote [43, 50) */
	solo(f, b, 210, &fb);
	solo(f, a, 2, &fc); /* something unrelated in between */
	solo(f, c, 200, &fc);
	CHECK(!memcmp(sb.ids, fb.ids, sizeof sb.ids));
	CHECK(!memcmp(sc.ids, fc.ids, sizeof sc.ids));
	/* together: a and c prefilled and decoded in shared steps */
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.max_tokens = 8;
	ids_sink_t ta = {0}, tc = {0};
	eng_result_t ra, rc;
	CHECK(eng_seq_start(g, a, 200, &sp, on_id, &ta, &ra) >= 0);
	CHECK(eng_seq_start(g, c, 200, &sp, on_id, &tc, &rc) >= 0);
	eng_done_t done[2];
	int nd, steps = 0;
	while (eng_active(g) && steps++ < 100)
		CHECK_EQ_INT(eng_step(g, done, &nd), 0);
	CHECK(!memcmp(ta.ids, sa.ids, sizeof ta.ids));
	CHECK(!memcmp(tc.ids, sc.ids, sizeof tc.ids));
out:
	eng_free(e);
	eng_free(f);
	eng_free(g);
	gen_close(&x);
}

/* The file `shoal mkmodel --arch gemma3 --dim 256 --layers 7 --heads 4 --kv-heads 1 --head-dim
 * 64 --ffn 512 --vocab 1024 --type f32 --sliding-window 16 --seed 11` writes (ctx 2048, the CLI's
 * default) against llama.cpp's ids and logprobs for it (llama_vectors.h says how they were made;
 * llama.cpp reads its window, two bases, post norms, GELU table and tied head). */
static const llama_vec_t gemma_llama = {
    .prompt = "Once upon a time there was a little girl",
    .prompt_ids = {2, 311, 342, 331, 333, 580, 362, 466, 438, 381, 362, 584, 587},
    .n_prompt = 13,
    .ids = {596, 596, 608, 570, 269, 608, 269, 269},
    .top = {{596, 399, 540, 460, 266},
	    {596, 540, 608, 426, 570},
	    {608, 596, 540, 570, 426},
	    {570, 269, 426, 608, 592},
	    {269, 490, 608, 562, 598},
	    {608, 570, 478, 269, 426},
	    {269, 478, 608, 489, 596},
	    {269, 608, 562, 340, 478}},
    .lp = {{-1.77624f, -2.08649f, -2.79989f, -2.86081f, -2.99278f},
	   {-1.14696f, -1.62728f, -2.17646f, -2.68522f, -2.82254f},
	   {-1.24722f, -1.58597f, -1.70653f, -2.24298f, -3.13881f},
	   {-1.25120f, -1.85172f, -2.36142f, -2.64049f, -3.67663f},
	   {-2.07055f, -2.42466f, -2.42910f, -2.55898f, -2.87033f},
	   {-1.29217f, -1.90113f, -2.06466f, -2.41849f, -2.81031f},
	   {-1.81938f, -2.03150f, -2.33853f, -2.78997f, -3.10235f},
	   {-1.37323f, -1.67895f, -2.78775f, -3.02873f, -3.09231f}},
};

TEST(llama_cpp_vectors)
{
	mkmodel_opts_t o = {.arch = "gemma3",
			    .dim = 256,
			    .layers = 7,
			    .heads = 4,
			    .kv_heads = 1,
			    .head_dim = 64,
			    .ffn = 512,
			    .vocab = 1024,
			    .ctx = 2048,
			    .type = QT_F32,
			    .seed = 11,
			    .swa_window = 16};
	llama_vec_check(&o, &gemma_llama, "gemma3 f32");
}

/* A file without a tensor the graph needs, or with a wrong shape: one line naming it. */
TEST(bad_files)
{
	char path[256], err[256];
	snprintf(path, sizeof path, "/tmp/shoal-test-gemma-bad-%d.gguf", (int)getpid());
	mkmodel_opts_t o = gemma_opts(QT_F32, 1);
	o.layers = 1;
	/* blk.0.post_ffw_norm renamed in place: the file is otherwise valid */
	CHECK_EQ_INT(
	    model_fix_bad(&o, path, "blk.0.post_ffw_norm", "blk.0.post_fxw_norm", err, sizeof err),
	    SH_EFORMAT);
	CHECK(strstr(err, "blk.0.post_ffw_norm.weight") && strstr(err, "[256, 1]"));
	/* a RoPE scaling gemma3 does not have (gemma3_keys: none or linear) */
	o.rope_factor = 8;
	CHECK_EQ_INT(model_fix_bad(&o, path, "linear", "cosine", err, sizeof err), SH_EUNSUPP);
	CHECK(strstr(err, "gemma3.rope.scaling.type") != NULL);
	unlink(path);
}

int main(void)
{
	RUN(meta);
	RUN(gelu_table);
	RUN(gelu_wide_as_scalar);
	RUN(f32_vs_reference);
	RUN(f32_softcap_scaled_rope);
	RUN(q8_0_greedy);
	RUN(tokenizer_and_template);
	RUN(engine_slots_and_prefix_reuse);
	RUN(llama_cpp_vectors);
	RUN(bad_files);
	return harness_done();
}
