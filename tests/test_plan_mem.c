/* test_plan_mem.c: the planner's memory per rank counts what the engine allocates, by layer kind
 * (docs/view.md, "Memory"):
 * - full-attention layers keep K and V of the rank's KV heads for whole tiles of the context per
 *   slot; sliding-window layers their ring (infer/model/swa.c model_swa_ring: window - 1 + one
 *   internal batch, whole tiles, or every position when the context is not longer); recurrent
 *   layers no KV cache but rs_copies states per slot of the rank's key heads
 *   (infer/model/deltanet.c model_dn_heads, meta_dn_state_bytes);
 * - qwen35moe-, gpt-oss- and gemma3-shaped models from the model JSON, one node, tensor ranks and
 *   pipeline stages (stages hold different mixes of kinds);
 * - the stage cap holds any window of consecutive layers;
 * - Qwen3.5-397B-A17B's shape as a metadata-only GGUF (mkmodel header_only) on 4 x 128 GiB: the
 *   plan fits, a pipeline's weights sum to the file's tensor bytes, and every rank's KV cache
 *   and recurrent state equal the engine's own formulas (model_kv_bytes, meta_dn_state_bytes x
 *   (1 + MODEL_CHECKPOINTS)) for its share; gpt-oss- and deepseek2-shaped headers the same with
 *   their rings and latent cache.
 * The 397B shape (mlx-community/Qwen3.5-397B-A17B-4bit's card, Qwen's config): hidden 4096,
 * 60 layers (15 x 3 Gated DeltaNet + 1 full attention), 32 query / 2 KV heads of 256, linear
 * attention 16 key / 64 value heads of 128, conv 4, 512 experts (10 used) of 1024 + a shared
 * expert of 1024, vocab 248320, context 262144, partial rotary 64 dims. */
#include "agent/planio.h"
#include "common/common.h"
#include "harness.h"
#include "infer/gguf.h"
#include "infer/gguf_write.h"
#include "infer/model/model.h"
#include "infer/quant/quant.h"
#include "planner/plan_int.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GIB ((uint64_t)1 << 30)

/* A view of n nodes of mem_gib each on one Ethernet switch. */
static plan_view_t *view_of(int n, uint64_t mem_gib)
{
	char buf[16384];
	int o = snprintf(buf, sizeof buf, "{\"epoch\":1,\"nodes\":[");
	for (int i = 0; i < n; i++) {
		o += snprintf(
		    buf + o, sizeof buf - (size_t)o,
		    "%s{\"node_id\":\"%032x\",\"host\":\"mac%d.local\",\"mem_avail\":%llu,"
		    "\"cores\":8,\"addresses\":[{\"ip\":\"10.0.0.%d\",\"ifname\":"
		    "\"en0\",\"kind\":\"ethernet\"}],\"seen_on\":[",
		    i ? "," : "", i + 1, i + 1, (unsigned long long)(mem_gib * GIB), i + 1);
		for (int j = 0, f = 1; j < n; j++)
			if (j != i) {
				o += snprintf(buf + o, sizeof buf - (size_t)o,
					      "%s{\"node_id\":\"%032x\",\"ifname\":\"en0\"}",
					      f ? "" : ",", j + 1);
				f = 0;
			}
		o += snprintf(buf + o, sizeof buf - (size_t)o, "]}");
	}
	snprintf(buf + o, sizeof buf - (size_t)o, "]}");
	plan_view_t *v = NULL;
	char err[256];
	if (plan_view_from_json(&v, buf, err, sizeof err))
		fprintf(stderr, "view: %s\n", err);
	return v;
}

static int kv_type = QT_F16; /* of the engine's count (check_header); plans use its block */

static plan_t *make(const plan_model_t *m, int n, uint64_t mem_gib, plan_strategy_t s, int ctx,
		    int slots)
{
	plan_view_t *v = view_of(n, mem_gib);
	plan_opts_t o;
	plan_opts_default(&o);
	o.strategy = s, o.ctx = ctx, o.slots = slots;
	o.kv_bytes = (int)quant_block_bytes(kv_type), o.kv_block = quant_block_elems(kv_type);
	plan_t *p = NULL;
	char err[512];
	if (v && plan_make(&p, v, m, &o, err, sizeof err))
		fprintf(stderr, "plan: %s\n", err);
	plan_view_free(v);
	return p;
}

static int model_of(plan_model_t *m, const char *json)
{
	char err[256];
	int rc = plan_model_from_json(m, json, err, sizeof err);
	if (rc)
		fprintf(stderr, "model: %s\n", err);
	return rc;
}

static int count_kind(const plan_model_t *m, int l0, int l1, char k)
{
	int n = 0;
	for (int l = l0; l < l1; l++)
		n += plan_layer_kind(m, l) == k;
	return n;
}

/* Per-rank KV of layers [l0, l1): kvh KV heads of head_dim, F16, pos positions per full layer
 * and ring per sliding one, slots sequences. */
static uint64_t kv_expect(const plan_model_t *m, int l0, int l1, int kvh, uint64_t pos,
			  uint64_t ring, int slots)
{
	uint64_t row = 2 * (uint64_t)kvh * (uint64_t)m->head_dim * 2;
	return row * (uint64_t)slots *
	       ((uint64_t)count_kind(m, l0, l1, 'f') * pos +
		(uint64_t)count_kind(m, l0, l1, 's') * ring);
}

/* One state buffer of nk key heads (meta_dn_state_bytes): conv state and the delta-rule state. */
static uint64_t dn_state(uint64_t nk, uint64_t nv_per_k, uint64_t ds, uint64_t dc)
{
	uint64_t nv = nk * nv_per_k;
	return 4 * ((dc - 1) * (2 * nk * ds + nv * ds) + nv * ds * ds);
}

static const char *const QWEN397_JSON =
    "{\"arch\":\"qwen35moe\",\"n_layers\":60,\"n_heads\":32,\"n_kv_heads\":2,\"head_dim\":256,"
    "\"dim\":4096,\"ffn\":1024,\"n_vocab\":248320,\"n_ctx\":262144,\"wtype\":\"Q8_0\","
    "\"n_experts\":512,\"n_expert_used\":10,\"ffn_shexp\":1024,\"expert_ffn\":1024,"
    "\"layer_kinds\":\"rrrf\",\"ssm_k_heads\":16,\"ssm_v_heads\":64,\"ssm_state\":128,\"ssm_conv\":"
    "4}";

/* qwen35moe: 15 full-attention layers keep the context, 45 DeltaNet layers a state per slot. */
TEST(qwen35moe_kinds)
{
	plan_model_t m;
	CHECK_EQ_INT(model_of(&m, QWEN397_JSON), 0);
	CHECK_EQ_STR(m.layer_kinds, "rrrf");
	CHECK_EQ_INT(m.rs_k_heads, 16);
	CHECK_EQ_INT(m.rs_unit, 1); /* 128-wide heads are whole Q8_0 blocks */
	CHECK_EQ_INT(m.rs_copies, 3);
	CHECK_EQ_INT(m.rs_bytes, dn_state(16, 4, 128, 4));
	/* 512 experts of 3 x 1024 x 4096 Q8_0 (34 bytes per 32), the shared one the same */
	CHECK_EQ_INT(m.expert_bytes, (uint64_t)512 * 3 * 1024 * 4096 / 32 * 34);
	CHECK_EQ_INT(m.shexp_bytes, (uint64_t)3 * 1024 * 4096 / 32 * 34);
	/* one node, 4 slots of 8192 */
	plan_t *p = make(&m, 1, 1024, PLAN_AUTO, 8192, 4);
	CHECK(p != NULL);
	if (!p)
		return;
	const plan_rank_t *k = plan_rank(p, 0);
	CHECK_EQ_INT(plan_slots(p), 4);
	CHECK_EQ_INT(k->kv_cache_bytes, kv_expect(&m, 0, 60, 2, 8192, 0, 4));
	CHECK_EQ_INT(k->kv_cache_bytes, (uint64_t)15 * 2 * 2 * 256 * 2 * 8192 * 4);
	CHECK_EQ_INT(k->rs_bytes, (uint64_t)45 * dn_state(16, 4, 128, 4) * 3 * 4);
	/* plan.json carries the state and the slots, and parses back to the same figures */
	char *s = plan_to_json(p);
	plan_t *q = NULL;
	char err[256];
	CHECK_EQ_INT(plan_from_json(&q, s, err, sizeof err), 0);
	CHECK(strstr(s, "\"recurrent\"") != NULL && strstr(s, "\"slots\": 4") != NULL);
	if (q) {
		CHECK_EQ_INT(plan_rank(q, 0)->rs_bytes, k->rs_bytes);
		CHECK_EQ_INT(plan_slots(q), 4);
	}
	plan_free(q);
	free(s);
	plan_free(p);
	/* a context that is not whole tiles: the engine keeps whole tiles of 64 positions */
	p = make(&m, 1, 1024, PLAN_AUTO, 1000, 1);
	CHECK(p && plan_rank(p, 0)->kv_cache_bytes == kv_expect(&m, 0, 60, 2, 1024, 0, 1));
	plan_free(p);

	/* 4 tensor ranks: a query quarter each, one KV head each (replicated), 4 key heads */
	p = make(&m, 4, 128, PLAN_TENSOR, 262144, 1);
	CHECK(p != NULL);
	for (int r = 0; p && r < 4; r++) {
		k = plan_rank(p, r);
		CHECK_EQ_INT(k->q1 - k->q0, 8);
		CHECK_EQ_INT(k->kv_cache_bytes, kv_expect(&m, 0, 60, 1, 262144, 0, 1));
		CHECK_EQ_INT(k->rs_bytes, (uint64_t)45 * dn_state(4, 4, 128, 4) * 3);
	}
	plan_free(p);

	/* 4 pipeline stages: each keeps its own layers' kinds; the sums are the whole model's */
	p = make(&m, 4, 128, PLAN_PIPELINE, 262144, 2);
	CHECK(p != NULL);
	uint64_t kv = 0, rs = 0;
	for (int r = 0; p && r < 4; r++) {
		k = plan_rank(p, r);
		int nr = count_kind(&m, k->layer0, k->layer1, 'r');
		CHECK_EQ_INT(k->kv_cache_bytes,
			     kv_expect(&m, k->layer0, k->layer1, 2, 262144, 0, 2));
		CHECK_EQ_INT(k->rs_bytes, (uint64_t)nr * dn_state(16, 4, 128, 4) * 3 * 2);
		kv += k->kv_cache_bytes, rs += k->rs_bytes;
	}
	CHECK_EQ_INT(kv, kv_expect(&m, 0, 60, 2, 262144, 0, 2));
	CHECK_EQ_INT(rs, (uint64_t)45 * dn_state(16, 4, 128, 4) * 3 * 2);
	plan_free(p);
}

/* gpt-oss: sliding-window (128) and full layers alternate, the SWA ones first. */
TEST(gptoss_kinds)
{
	plan_model_t m;
	CHECK_EQ_INT(model_of(&m, "{\"arch\":\"gpt-oss\",\"n_layers\":24,\"n_heads\":64,"
				  "\"n_kv_heads\":8,\"head_dim\":64,\"dim\":2880,\"ffn\":2880,"
				  "\"n_vocab\":201088,\"n_ctx\":131072,\"wtype\":\"Q8_0\","
				  "\"n_experts\":32,\"n_expert_used\":4,\"layer_kinds\":\"sf\","
				  "\"swa_window\":128}"),
		     0);
	CHECK_EQ_INT(m.swa_kv_pos, 192); /* 127 + 64 in whole tiles of 64 */
	CHECK_EQ_INT(plan_layer_kind(&m, 0), 's');
	CHECK_EQ_INT(plan_layer_kind(&m, 23), 'f');
	plan_t *p = make(&m, 1, 256, PLAN_AUTO, 131072, 2);
	CHECK(p && plan_rank(p, 0)->kv_cache_bytes == kv_expect(&m, 0, 24, 8, 131072, 192, 2));
	CHECK(p && plan_rank(p, 0)->rs_bytes == 0);
	plan_free(p);
	/* a context within the ring: every layer keeps the (tiled) context */
	p = make(&m, 1, 256, PLAN_AUTO, 100, 1);
	CHECK(p && plan_rank(p, 0)->kv_cache_bytes == kv_expect(&m, 0, 24, 8, 128, 128, 1));
	plan_free(p);
	/* 3 pipeline stages of 8: 4 full + 4 SWA each */
	p = make(&m, 3, 64, PLAN_PIPELINE, 131072, 1);
	CHECK(p != NULL);
	for (int r = 0; p && r < 3; r++) {
		const plan_rank_t *k = plan_rank(p, r);
		CHECK_EQ_INT(k->kv_cache_bytes,
			     kv_expect(&m, k->layer0, k->layer1, 8, 131072, 192, 1));
	}
	plan_free(p);
}

/* Gemma 3 27B: 5 local (window 1024) : 1 global, 62 layers: 10 global, 52 local. */
TEST(gemma3_kinds)
{
	plan_model_t m;
	CHECK_EQ_INT(model_of(&m, "{\"arch\":\"gemma3\",\"n_layers\":62,\"n_heads\":32,"
				  "\"n_kv_heads\":16,\"head_dim\":128,\"dim\":5376,\"ffn\":21504,"
				  "\"n_vocab\":262208,\"n_ctx\":131072,\"wtype\":\"Q4_K\","
				  "\"tied_output\":true,\"layer_kinds\":\"sssssf\","
				  "\"swa_window\":1024}"),
		     0);
	CHECK_EQ_INT(m.swa_kv_pos, 1088);
	CHECK_EQ_INT(count_kind(&m, 0, 62, 'f'), 10);
	plan_t *p = make(&m, 2, 64, PLAN_TENSOR, 131072, 1);
	CHECK(p != NULL);
	for (int r = 0; p && r < 2; r++) {
		const plan_rank_t *k = plan_rank(p, r);
		CHECK_EQ_INT(k->kv1 - k->kv0, 8);
		CHECK_EQ_INT(k->kv_cache_bytes, kv_expect(&m, 0, 62, 8, 131072, 1088, 1));
	}
	/* what a full-context count would have said: 6 x more */
	CHECK(p &&
	      plan_rank(p, 0)->kv_cache_bytes * 5 < kv_expect(&m, 0, 62, 8, 131072, 131072, 1));
	plan_free(p);
}

/* Stage caps: the most consecutive layers that fit wherever they start. */
TEST(layer_cap_windows)
{
	plan_model_t m;
	CHECK_EQ_INT(model_of(&m, QWEN397_JSON), 0);
	plan_t p = {0};
	plan_rank_t k = {0};
	p.model = m, p.ctx = 262144, p.kv_bytes = 2, p.slots = 1;
	k.q0 = 0, k.q1 = m.n_heads, k.kv0 = 0, k.kv1 = m.n_kv_heads, k.ffn0 = 0, k.ffn1 = m.ffn;
	k.exp0 = 0, k.exp1 = m.n_experts, k.shx0 = 0, k.shx1 = m.ffn_shexp, k.stage = 1;
	plan_need_t need[PLAN_KINDS];
	plan_rank_kind_needs(&p, &k, need);
	uint64_t R = need[PLAN_KIND_R].w + need[PLAN_KIND_R].rs,
		 F = need[PLAN_KIND_F].w + need[PLAN_KIND_F].kv;
	CHECK(F > R); /* a full layer's KV over the whole context outweighs a state */
	/* any 4 consecutive layers hold one full layer; 3 may hold one too */
	CHECK_EQ_INT(plan_rank_layer_cap(&p, &k, 3 * R + F), 4);
	CHECK_EQ_INT(plan_rank_layer_cap(&p, &k, 3 * R + F - 1), 3);
	CHECK_EQ_INT(plan_rank_layer_cap(&p, &k, 2 * R + F), 3);
	CHECK_EQ_INT(plan_rank_layer_cap(&p, &k, 2 * R + F - 1), 2);
	CHECK_EQ_INT(plan_rank_layer_cap(&p, &k, 45 * R + 15 * F), 60);
	CHECK_EQ_INT(plan_rank_layer_cap(&p, &k, 0), 0);
	/* hostile sizes do not wrap into a fit: two layers of 2^63 exceed any budget */
	p.model.rec_bytes = UINT64_MAX / 2 + 1;
	CHECK_EQ_INT(plan_rank_layer_cap(&p, &k, UINT64_MAX), 1);
}

/* Bad kinds and recurrent layers without their sizes are refused with a reason. */
TEST(bad_kinds)
{
	plan_model_t m;
	char err[256];
	const char *base = "{\"n_layers\":4,\"n_heads\":4,\"dim\":64,\"ffn\":128,\"n_vocab\":100,"
			   "\"n_ctx\":64,";
	char j[512];
	snprintf(j, sizeof j, "%s\"layer_kinds\":\"fx\"}", base);
	CHECK(plan_model_from_json(&m, j, err, sizeof err) != 0 && strstr(err, "layer_kinds"));
	snprintf(j, sizeof j, "%s\"layer_kinds\":\"rf\"}", base);
	CHECK(plan_model_from_json(&m, j, err, sizeof err) != 0 && strstr(err, "rs_k_heads"));
	snprintf(j, sizeof j, "%s\"layer_kinds\":7}", base);
	CHECK(plan_model_from_json(&m, j, err, sizeof err) != 0);
	snprintf(j, sizeof j, "%s\"ssm_k_heads\":3,\"ssm_v_heads\":4,\"ssm_state\":8}", base);
	CHECK(plan_model_from_json(&m, j, err, sizeof err) != 0 && strstr(err, "ssm_"));
}

/* The engine's count for a rank's share: model_kv_bytes x slots, and its recurrent layers'
 * state (model_dn_heads of its query heads) x (1 + MODEL_CHECKPOINTS) x slots. */
static void engine_counts(const model_meta_t *mt, const gguf_t *g, const plan_rank_t *k, int ctx,
			  int slots, uint64_t *kv, uint64_t *rs)
{
	model_shard_t s = {k->q0,   k->q1 - k->q0,     k->kv0,    k->kv1 - k->kv0,
			   k->ffn0, k->ffn1 - k->ffn0, k->layer0, k->layer1,
			   k->exp0, k->exp1 - k->exp0, k->shx0,   k->shx1 - k->shx0};
	if (!s.n_exp)
		s.exp0 = mt->n_experts;
	if (!s.n_shx)
		s.shx0 = mt->ffn_shexp;
	*kv = model_kv_bytes(mt, &s, kv_type, ctx) * (uint64_t)slots;
	*rs = 0;
	if (!mt->is_hybrid)
		return;
	int k0, k1, nrec = 0;
	model_dn_heads(mt, &s, model_dn_head_unit(mt, g), &k0, &k1);
	for (int l = k->layer0; l < k->layer1; l++)
		nrec += meta_layer_recurrent(mt, l);
	*rs = (uint64_t)nrec * meta_dn_state_bytes(mt, k1 - k0) * (1 + MODEL_CHECKPOINTS) *
	      (uint64_t)slots;
}

/* The planner's model from a metadata-only GGUF, plans on it, and the engine's own counts. */
static void check_header(const mkmodel_opts_t *o, const char *path, int n, uint64_t mem_gib,
			 int ctx, int slots, const char *kinds)
{
	char err[256];
	CHECK_EQ_INT(mkmodel_write(o, path, err, sizeof err), 0);
	plan_model_t m;
	CHECK_EQ_INT(agent_plan_model_gguf(path, &m, err, sizeof err), 0);
	CHECK_EQ_STR(m.layer_kinds, kinds);
	gguf_t *g = NULL;
	model_meta_t mt;
	CHECK_EQ_INT(gguf_open(&g, path, err, sizeof err), 0);
	if (!g || meta_load(&mt, g, err, sizeof err)) {
		CHECK(0);
		gguf_free(g);
		return;
	}
	uint64_t total = 0;
	for (int i = 0; i < gguf_n_tensors(g); i++) { /* NextN layers after the stack: not held */
		int l;
		if (sscanf(gguf_tensor(g, i)->name, "blk.%d.", &l) != 1 || l < mt.n_layers)
			total += gguf_tensor(g, i)->nbytes;
	}
	for (int s = 0; s < 2; s++) {
		plan_t *p = make(&m, n, mem_gib, s ? PLAN_PIPELINE : PLAN_TENSOR, ctx, slots);
		CHECK(p != NULL);
		if (!p)
			continue;
		uint64_t wsum = 0;
		for (int r = 0; r < plan_n_ranks(p); r++) {
			const plan_rank_t *k = plan_rank(p, r);
			uint64_t kv, rs;
			engine_counts(&mt, g, k, ctx, slots, &kv, &rs);
			CHECK_EQ_INT(k->kv_cache_bytes, kv);
			CHECK_EQ_INT(k->rs_bytes, rs);
			CHECK(k->weight_bytes + k->kv_cache_bytes + k->rs_bytes + k->act_bytes +
				  k->headroom_bytes <=
			      k->mem_avail);
			wsum += k->weight_bytes;
			printf("  %s rank %d layers %d-%d: weights %.2f GB, KV %.2f GB, state %.3f "
			       "GB\n",
			       s ? "pipeline" : "tensor", r, k->layer0, k->layer1,
			       k->weight_bytes / 1e9, k->kv_cache_bytes / 1e9, k->rs_bytes / 1e9);
		}
		/* a pipeline holds every tensor once: its weights are the file's (per-layer
		 * figures rounded up: at most a few bytes per layer and part) */
		if (s)
			CHECK(wsum >= total && wsum - total <= (uint64_t)mt.n_layers * 16);
		plan_free(p);
	}
	gguf_free(g);
}

TEST(qwen397_header)
{
	char dir[] = "/tmp/test_plan_mem.XXXXXX", path[64];
	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof path, "%s/q397.gguf", dir);
	mkmodel_opts_t o = {.arch = "qwen35moe",
			    .dim = 4096,
			    .layers = 60,
			    .heads = 32,
			    .kv_heads = 2,
			    .head_dim = 256,
			    .ffn = 1024,
			    .vocab = 248320,
			    .ctx = 262144,
			    .experts = 512,
			    .experts_used = 10,
			    .expert_ffn = 1024,
			    .shared_experts = 1,
			    .ssm_state = 128,
			    .ssm_k_heads = 16,
			    .ssm_v_heads = 64,
			    .ssm_conv = 4,
			    .attn_interval = 4,
			    .rope_dim = 64,
			    .nextn = 1, /* the MTP layer the converter writes: skipped, not held */
			    .type = QT_Q8_0,
			    .seed = 1,
			    .header_only = 1};
	check_header(&o, path, 4, 128, 262144, 1, "rrrf");
	unlink(path);
	/* gpt-oss 120B-shaped: 36 layers, SWA 128 on the even ones */
	snprintf(path, sizeof path, "%s/goss.gguf", dir);
	mkmodel_opts_t g = {.arch = "gpt-oss",
			    .dim = 2880,
			    .layers = 36,
			    .heads = 64,
			    .kv_heads = 8,
			    .head_dim = 64,
			    .ffn = 2880,
			    .vocab = 201088,
			    .ctx = 131072,
			    .experts = 128,
			    .experts_used = 4,
			    .expert_ffn = 2880,
			    .swa_window = 128,
			    .type = QT_Q8_0,
			    .seed = 1,
			    .header_only = 1};
	check_header(&g, path, 2, 128, 131072, 4, "sf");
	kv_type = QT_Q8_0; /* a q8_0 cache: 34 bytes per 32 elements, not 2 per element */
	check_header(&g, path, 2, 128, 131072, 4, "sf");
	kv_type = QT_F16;
	unlink(path);
	/* DeepSeek-V2-Lite-shaped: latent attention keeps one F32 latent per position, whole on
	 * every rank (mla.c), whatever the KV heads and type */
	snprintf(path, sizeof path, "%s/ds2.gguf", dir);
	mkmodel_opts_t d = {.arch = "deepseek2",
			    .dim = 2048,
			    .layers = 27,
			    .heads = 16,
			    .kv_heads = 16,
			    .ffn = 10944,
			    .vocab = 102400,
			    .ctx = 32768,
			    .experts = 64,
			    .experts_used = 6,
			    .expert_ffn = 1408,
			    .kv_lora = 512,
			    .qk_nope = 128,
			    .qk_rope = 64,
			    .v_head = 128,
			    .type = QT_Q8_0,
			    .seed = 1,
			    .header_only = 1};
	check_header(&d, path, 2, 64, 32768, 2, "");
	unlink(path);
	rmdir(dir);
}

/* Gemma 3 27B-shaped (5 local layers of window 1024 : 1 global, 62 layers), once the engine reads
 * gemma3 (the gemma branch): its rings against model_kv_bytes. */
TEST(gemma3_header)
{
	char dir[] = "/tmp/test_plan_mem.XXXXXX", path[64], err[256];
	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof path, "%s/g3.gguf", dir);
	mkmodel_opts_t o = {.arch = "gemma3",
			    .dim = 5376,
			    .layers = 62,
			    .heads = 32,
			    .kv_heads = 16,
			    .head_dim = 128,
			    .ffn = 21504,
			    .vocab = 262208,
			    .ctx = 131072,
			    .swa_window = 1024,
			    .type = QT_Q8_0,
			    .seed = 1,
			    .header_only = 1};
	int rc = mkmodel_write(&o, path, err, sizeof err);
	if (!rc)
		check_header(&o, path, 2, 64, 131072, 1, "sssssf");
	unlink(path);
	rmdir(dir);
	if (rc)
		SKIP("mkmodel has no gemma3 here");
}

int main(void)
{
	RUN(qwen35moe_kinds);
	RUN(gptoss_kinds);
	RUN(gemma3_kinds);
	RUN(layer_cap_windows);
	RUN(bad_kinds);
	RUN(qwen397_header);
	RUN(gemma3_header);
	return harness_done();
}
