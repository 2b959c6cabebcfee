/* test_swa.c: sliding-window attention's mask and KV rings (infer/model/swa.c, attn.c).
 *
 * The semantics are llama.cpp's: src/llama-hparams.h is_masked_swa (swa_type standard: a query
 * at p sees the key at p0 when p - p0 < n_swa) and llama_hparams::set_swa_pattern (layer l is
 * SWA when l % period < period - 1); SWA layers rope with rope_freq_base_train_swa
 * (llama_model::get_rope_freq_base). A generated llama model (F32) is given a window of 7 and
 * period 3 in its metadata here (layers 0 and 1 SWA, 2 full, the SWA layers with their own RoPE
 * base), so the engine's rings (128 positions at a context of 320) wrap:
 * - a 200-token prompt in one call (passes of 64) and 40 greedy steps give the logits of
 *   tests/ref_dense.h's forward (whole history, window as a mask) within 1e-4 relative;
 * - the fused attention equals attention_ref over the same steps;
 * - a new sequence keeping a slot's first 190 positions (model_prefix_usable says it may) gives
 *   the logits of the whole sequence computed in a fresh slot; keeping 50 is refused (the ring
 *   overwrote what they attend to); a restart from 0 makes the slot usable again;
 * - two slots prefilled in one batch = each alone;
 * - model_kv_bytes counts the rings, and a context within the ring keeps every position. */
#include "harness.h"
#include "infer/model/model_int.h"
#include "model_fix.h"
#include "ref_dense.h"

#define CTX 320
#define WIN 7

static void swa_meta(model_meta_t *m)
{
	m->swa_window = WIN;
	m->swa_period = 3;
	m->rope_base_swa = 300.0f;
}

/* A llama F32 file given a window (swa_meta), n_slots slots of CTX positions, F32 cache. */
static int fix_open(gen_t *x, int n_slots)
{
	mkmodel_opts_t o = {.arch = "llama",
			    .dim = 128,
			    .layers = 3,
			    .heads = 4,
			    .kv_heads = 2,
			    .ffn = 256,
			    .vocab = 320,
			    .ctx = CTX,
			    .type = QT_F32,
			    .seed = 5};
	return gen_open_slots(x, &o, "swa", 2, CTX, n_slots, QT_F32, swa_meta);
}

TEST(layout)
{
	gen_t x;
	if (fix_open(&x, 2)) {
		CHECK(0);
		return;
	}
	model_t *m = x.m;
	CHECK(meta_layer_swa(&x.meta, 0) && meta_layer_swa(&x.meta, 1) &&
	      !meta_layer_swa(&x.meta, 2) && meta_layer_swa(&x.meta, 3));
	CHECK_EQ_INT(m->ring, 128); /* 7 - 1 + 64 in whole tiles */
	CHECK_EQ_INT(model_swa_ring(&x.meta, CTX), 128);
	CHECK_EQ_INT(model_swa_ring(&x.meta, 128), 0); /* the ring would hold it all */
	CHECK_EQ_INT(m->kvl[0].npos, 128);
	CHECK_EQ_INT(m->kvl[0].win, WIN);
	CHECK_EQ_INT(m->kvl[2].npos, CTX);
	CHECK_EQ_INT(m->kvl[2].win, 0);
	size_t row = 2 * 64 * 4; /* 2 KV heads x head_dim 32, F32, K and V */
	CHECK_EQ_INT(model_kv_bytes_per_pos(&x.meta, NULL, QT_F32), 1 * row);
	CHECK_EQ_INT(model_kv_bytes(&x.meta, NULL, QT_F32, CTX), row * (CTX + 2 * 128));
	CHECK_EQ_INT(model_kv_bytes(&x.meta, NULL, QT_F32, 100), row * 3 * 100);
	model_shard_t s; /* pipeline stage of layers [1, 3): one SWA, one full */
	model_shard_full(&x.meta, &s);
	s.layer0 = 1;
	CHECK_EQ_INT(model_kv_bytes(&x.meta, &s, QT_F32, CTX), row * (CTX + 128));
	gen_close(&x);
}

/* Reference vs engine over a 200-token prompt and 40 greedy steps; attn_ref picks the
 * engine's plain attention. */
static void run_ref(int attn_ref)
{
	gen_t x;
	rd_t R;
	if (fix_open(&x, 1)) {
		CHECK(0);
		return;
	}
	x.m->attn_ref = attn_ref;
	rd_open(&R, x.g, &x.meta, CTX);
	int t[CTX], agree;
	rand_tokens(t, 200, 3, x.meta.n_vocab);
	double worst = rd_compare(x.m, &R, t, 200, 40, 0.0f, NULL, NULL, &agree);
	printf("swa (%s attention): worst relative logit error %.2e over 41 steps\n",
	       attn_ref ? "plain" : "fused", worst);
	CHECK_EQ_INT(agree, 40);
	CHECK(worst < 1e-4);
	rd_close(&R);
	gen_close(&x);
}

TEST(reference_fused)
{
	run_ref(0);
}

TEST(reference_plain)
{
	run_ref(1);
}

TEST(prefix_reuse)
{
	gen_t x;
	if (fix_open(&x, 2)) {
		CHECK(0);
		return;
	}
	int V = x.meta.n_vocab, a[CTX], b[CTX];
	float *la = malloc(V * sizeof *la), *lb = malloc(V * sizeof *lb);
	rand_tokens(a, 200, 7, V);
	memcpy(b, a, 190 * sizeof *b);
	rand_tokens(b + 190, 70, 9, V);
	/* slot 1: sequence a (200 positions); slot 0: b whole (260) */
	int sl[CTX], ps[CTX], out[CTX] = {0};
	for (int i = 0; i < 260; i++)
		sl[i] = 1, ps[i] = i;
	model_batch_t bt = {200, a, sl, ps, NULL, NULL, NULL};
	CHECK_EQ_INT(model_forward_batch(x.m, &bt, NULL), 0);
	CHECK_EQ_INT(model_forward(x.m, b, 260, 0, lb), 0);
	/* the ring of slot 1 holds [72, 200): position 190 attends to [184, 190] */
	CHECK_EQ_INT(model_prefix_usable(x.m, 1, 190), 190);
	CHECK_EQ_INT(model_prefix_usable(x.m, 1, 50), 0);
	CHECK_EQ_INT(model_prefix_usable(x.m, 1, 78), 78);
	CHECK_EQ_INT(model_prefix_usable(x.m, 1, 77), 0);
	/* keep 190 of slot 1, compute b's rest there: the same logits as slot 0's */
	out[69] = 1;
	bt = (model_batch_t){70, b + 190, sl + 190, ps + 190, out, NULL, NULL};
	CHECK_EQ_INT(model_forward_batch(x.m, &bt, la), 0);
	CHECK(rel_err(la, lb, V) < 1e-5);
	/* a restart from 0 in slot 1: what it writes is usable again */
	bt = (model_batch_t){10, a, sl, ps, NULL, NULL, NULL};
	CHECK_EQ_INT(model_forward_batch(x.m, &bt, NULL), 0);
	CHECK_EQ_INT(model_prefix_usable(x.m, 1, 10), 10);
	CHECK_EQ_INT(model_prefix_usable(x.m, 0, 259), 259);
	CHECK_EQ_INT(model_prefix_usable(x.m, 0, 100), 0);
	free(la);
	free(lb);
	gen_close(&x);
}

TEST(two_slots_one_batch)
{
	gen_t x;
	if (fix_open(&x, 2)) {
		CHECK(0);
		return;
	}
	int V = x.meta.n_vocab, a[150], b[150];
	rand_tokens(a, 150, 21, V);
	rand_tokens(b, 150, 22, V);
	/* interleaved chunks of 50: a[0..50) b[0..50) a[50..100) ... in one call */
	int tok[300], sl[300], ps[300], out[300] = {0};
	for (int c = 0, n = 0; c < 3; c++)
		for (int s = 0; s < 2; s++)
			for (int i = c * 50; i < c * 50 + 50; i++, n++) {
				tok[n] = s ? b[i] : a[i];
				sl[n] = s;
				ps[n] = i;
				out[n] = i == 149;
			}
	float *both = malloc(2 * V * sizeof *both), *one = malloc(V * sizeof *one);
	model_batch_t bt = {300, tok, sl, ps, out, NULL, NULL};
	CHECK_EQ_INT(model_forward_batch(x.m, &bt, both), 0);
	gen_t y;
	if (fix_open(&y, 1)) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(model_forward(y.m, a, 150, 0, one), 0);
	CHECK(rel_err(both, one, V) < 1e-5);
	model_free(y.m);
	y.m = NULL;
	char err[256];
	CHECK_EQ_INT(
	    model_new_slots(&y.m, y.g, &y.meta, NULL, CTX, 1, QT_F32, y.pool, err, sizeof err), 0);
	CHECK_EQ_INT(model_forward(y.m, b, 150, 0, one), 0);
	CHECK(rel_err(both + V, one, V) < 1e-5);
	free(both);
	free(one);
	gen_close(&y);
	gen_close(&x);
}

int main(void)
{
	RUN(layout);
	RUN(reference_fused);
	RUN(reference_plain);
	RUN(prefix_reuse);
	RUN(two_slots_one_batch);
	return harness_done();
}
