/*
 * engine.c: infer/infer.h on one node: a GGUF mapping, its tokenizer and chat template, the
 * model (forward pass + KV cache), the compute pool and a sampler.
 *
 * Continuous batching: the model's KV cache has n_slots slots; each active sequence owns one
 * (slot_t: its prompt, sampler, text state). eng_step() builds one batch of every decoding
 * sequence's next token and prompt chunks of the prefilling ones, runs one forward pass, then
 * samples each sequence that got logits. Text goes out through the tokenizer's streaming decoder
 * (whole UTF-8 characters only) and a per-sequence hold-back buffer: any tail of the output that
 * could still become a stop string is kept until it either completes one (the request stops and
 * the stop string is never emitted) or cannot any more. Each sampled token gets exactly one
 * callback; the last one carries whatever text was still held.
 *
 * Speculative decoding (infer/spec.h, docs/speculative.md): a decoding sequence's token may be
 * followed in its pass by a draft of k tokens; its k + 1 rows are sampled in order while the
 * drafted tokens are accepted, and n_cache then counts only the accepted positions (the rest are
 * written over by the next pass; recurrent layers keep rollback = draft_max states).
 *
 * A pipeline (several stages, tp.h) keeps up to one micro-batch per stage in flight round the
 * ring of stages (ring_step): the active sequences are split into that many passes, each
 * submitted while the others are still in the later stages, and each pass's sequences sampled
 * when it comes back. A sequence is in at most one pass at a time (`flying`), so it still gets
 * one token per pass of its own; every rank runs the passes in the order rank 0 submitted them.
 *
 * Invariant: slots[i].cache[0..n_cache) are the tokens whose keys/values slot i of the model's
 * KV cache holds, so a request that starts with the same tokens (a chat's earlier turns) only
 * computes the rest; a slot is FREE, PREFILL (n_cache < n_prompt) or DECODE (next is the sampled
 * token to feed at position n_cache), and n_active counts the slots that are not FREE.
 */
#include "common/common.h"
#include "infer/chat.h"
#include "infer/embed.h"
#include "infer/gguf.h"
#include "infer/infer.h"
#include "infer/model/meta.h"
#include "infer/model/model.h"
#include "infer/pool.h"
#include "infer/quant/quant.h"
#include "infer/sample.h"
#include "infer/spec.h"
#include "infer/tok/tokenizer.h"
#include "infer/tp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_TOP_LOGPROBS 20
#define ENG_KEEP_BACK                                                                              \
	4 /* a checkpoint of the recurrent state this many tokens before the                       \
	   * end of a prompt (llama.cpp's server keeps one 4 tokens back too) */

/* Text produced but not yet handed out (it may be the start of a stop string). */
typedef struct held {
	char *buf;
	size_t len, cap;
} held_t;

enum slot_state { SLOT_FREE = 0, SLOT_PREFILL = 1, SLOT_DECODE = 2 };

/* One KV slot and the sequence running in it. */
typedef struct slot {
	int state;  /* enum slot_state */
	int *cache; /* [n_ctx] tokens whose keys/values the slot holds */
	int n_cache;
	uint64_t used; /* e->clock at admission / release: FIFO prefill order, LRU choice */
	sampler_t *samp;
	int flying;   /* in the pass being built, or in one in flight round the ring */
	uint32_t gen; /* sequences admitted to the slot so far: a pass of an earlier one that
			 comes back after it ended is dropped (pass_t.gen) */
	/* the sequence (state != SLOT_FREE) */
	int *prompt;  /* [n_ctx] (owned): the tokens to prefill, [0, n_prompt), then every token
		       * sampled and handed out: [0, n_toks) is the sequence so far (its resumable
		       * state with the sampler's, ts and held: eng_seq_snapshot) */
	int n_prompt; /* tokens to prefill (a resumed sequence: all it had) */
	int n_toks;
	int n_req;         /* the request's own prompt tokens, [0, n_req) (usage) */
	eng_sampling_t sp; /* stop strings borrowed from the caller */
	int n_top;
	eng_token_cb cb;
	void *ud;
	eng_result_t *res; /* borrowed */
	tok_stream_t ts;
	held_t held;
	int next;       /* SLOT_DECODE: sampled token to feed at n_cache */
	int64_t t0, t1; /* admission, end of prefill (0 = not yet) */
	float *emb;     /* an embedding sequence: its pooled output [dim] (borrowed), else NULL */
	/* speculative decoding: the draft of the pass it is in, fed at n_cache + 1 .. n_cache + k
	 */
	int k;
	int draft[SPEC_MAX_DRAFT];
	const float *q; /* [k][n_vocab] its distributions, or NULL (deterministic) */
} slot_t;

/* The batch of one forward pass: a step's, or one of the micro-batches in flight round a
 * pipeline's stages. Arrays of n_slots * (1 + draft_max) + ENG_PREFILL_MAX entries: first the
 * decoding sequences' groups (their token and its draft), then prompt chunks. */
typedef struct pass {
	int n, n_dec;                /* entries, of which the decoding groups' */
	int *tok, *slot, *pos, *out; /* token i goes to slot[i] at pos[i]; out: wants logits */
	int *keep;                   /* checkpoint the recurrent state after it */
	uint32_t *gen;               /* the slot's sequence (slot_t.gen) when built */
	int64_t t_sent;              /* when it was submitted (speculative decoding's step time) */
} pass_t;

struct eng {
	gguf_t *g;
	model_meta_t meta;
	tok_t *tok;
	const char *chat;             /* template family (static string), NULL when unusable */
	chat_tool_style_t tool_style; /* how tools are rendered (chat.h) */
	char chat_err[256];           /* why there is no template */
	pool_t *pool;
	model_t *model;
	eng_info_t info;
	char name[160];
	int n_slots;
	int kv_type;   /* the KV cache elements (quant.h type) */
	slot_t *slots; /* [n_slots] */
	int n_active;
	uint64_t clock;
	float *logits; /* [n_slots * (1 + draft_max)][n_vocab]: a row per decoded position */
	pass_t *pass;  /* [ring_max]: passes in flight, ring_n of them from ring_head (oldest);
			  one node, tensor or lock-step: pass[0] is the step's */
	int ring_max, ring_head, ring_n;
	int last_batch;       /* tokens in the last step */
	eng_done_t *gen_done; /* [n_slots] for eng_generate */
	float *hidden;  /* [n_slots + ENG_PREFILL_MAX][dim]: a step's rows for embeddings (made at
			   the first embedding) */
	dist_t *dist;   /* NULL on one node; else this rank's part of the group (tp.h) */
	spec_t *spec;   /* speculative decoding (rank 0), or NULL */
	spec_seq_t *sq; /* [n_slots]: the drafting sequences of the pass being built */
	int draft_max;  /* 0 without speculative decoding */
};

static void seq_end(eng_t *e, slot_t *sl, int finish);

/* Bytes of memory still available (Linux: MemAvailable; else physical pages), 0 if unknown. */
static uint64_t mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	if (f) {
		char line[128];
		unsigned long long kb;
		while (fgets(line, sizeof line, f))
			if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
				fclose(f);
				return (uint64_t)kb * 1024;
			}
		fclose(f);
	}
#ifdef _SC_AVPHYS_PAGES
	long p = sysconf(_SC_AVPHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
	if (p > 0 && ps > 0)
		return (uint64_t)p * (uint64_t)ps;
#endif
	return 0;
}

/* The context to use: asked (0 = the model's), capped so the KV cache of all slots takes at
 * most half the memory left after the weights. */
static int pick_ctx(const model_meta_t *m, int asked, int slots, int kv_type)
{
	int ctx = asked > 0 ? asked : m->n_ctx;
	uint64_t avail = mem_available(),
		 per = model_kv_bytes_per_pos(m, NULL, kv_type) * (uint64_t)slots;
	if (asked <= 0 && avail && per) {
		uint64_t rest = avail > m->weight_bytes ? avail - m->weight_bytes : avail / 4;
		uint64_t cap = rest / 2 / per;
		if ((uint64_t)ctx > cap) {
			ctx = (int)MAX(cap, 256);
			LOG(LOG_INFO, "context capped to %d positions by available memory", ctx);
		}
	}
	return ctx;
}

/* The shard a plan's ranges name. */
static void shard_of_ranges(const model_meta_t *mt, const eng_dist_t *o, model_shard_t *s)
{
	*s = (model_shard_t){o->q0,   o->q1 - o->q0,     o->kv0,    o->kv1 - o->kv0,
			     o->ffn0, o->ffn1 - o->ffn0, o->layer0, o->layer1,
			     o->exp0, o->exp1 - o->exp0, o->shx0,   o->shx1 - o->shx0};
	if (!s->n_exp) /* an empty range: none (model.h's {0, 0} would mean all) */
		s->exp0 = mt->n_experts;
	if (!s->n_shx)
		s->shx0 = mt->ffn_shexp;
}

/* The default slot count, lowered (never below 1) so that the KV cache of all slots of this
 * rank's share takes at most half the memory left after its weights: a context that fits one
 * sequence (the planner checks one) must not fail to load because of the default. */
static int fit_slots(const model_meta_t *m, const model_shard_t *sh, int ctx, int slots, int world,
		     int kv_type)
{
	uint64_t avail = mem_available(), per = model_kv_bytes(m, sh, kv_type, ctx);
	/* recurrent layers: a state per slot (its ring and checkpoints), counted whole */
	for (int l = sh->layer0; l < (sh->layer1 ? sh->layer1 : m->n_layers); l++)
		if (meta_layer_recurrent(m, l))
			per += meta_dn_state_bytes(m, m->dn.n_k_heads) * (1 + MODEL_CHECKPOINTS);
	uint64_t w = m->weight_bytes / (uint64_t)MAX(world, 1);
	if (!avail || !per)
		return slots;
	uint64_t rest = avail > w ? avail - w : avail / 4, fit = rest / 2 / per;
	if (fit >= (uint64_t)slots)
		return slots;
	LOG(LOG_WARN, "KV cache: %d slots of %d positions do not fit the memory; using %d", slots,
	    ctx, (int)MAX(fit, 1));
	return (int)MAX(fit, 1);
}

/* This rank's share (the plan's ranges, or split from the weights) and the group's setup. */
static int dist_open(eng_t *e, const eng_dist_t *o, model_shard_t *shard, int *ctx, int *slots,
		     int *rollback, int parallel_given, char *err, size_t errlen)
{
	int rc, world = tp_group_world(o->group), rank = tp_group_rank(o->group);
	if (o->has_ranges) {
		shard_of_ranges(&e->meta, o, shard);
	} else {
		int blk = dist_ffn_block(e->g); /* as the planner cuts the FFN (eng_model_shape) */
		model_shard_t *all = calloc((size_t)world, sizeof *all);
		if (!all)
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		int even[TP_MAX_WORLD];
		const int *w = o->weights;
		if (!w) { /* equal work: rank 0's head counted */
			dist_even_weights(e->g, world, even);
			w = even;
		}
		rc = dist_split(&e->meta, blk, o->pipeline, world, w, all, err, errlen);
		*shard = all[rank];
		free(all);
		if (rc)
			return rc;
	}
	if (rank == 0 && !parallel_given)
		*slots = fit_slots(&e->meta, shard, *ctx, *slots, world, e->kv_type);
	if ((rc = dist_new(&e->dist, o->group, o->pipeline, o->step_timeout_ms)))
		return sh_fail(err, errlen, rc, "out of memory");
	dist_set_rollback(e->dist, *rollback);
	dist_set_stage(e->dist, o->stage0, o->stage1);
	if ((rc = dist_setup(e->dist, &e->meta, dist_model_fingerprint(e->g), shard, ctx, slots,
			     err, errlen)))
		return rc;
	*rollback = dist_rollback(e->dist);
	int stages = dist_n_stages(e->dist);
	LOG(LOG_INFO,
	    "rank %d/%d: %s share: q heads [%d,%d) kv [%d,%d) ffn [%d,%d) layers [%d,%d) "
	    "experts [%d,%d) shared [%d,%d), context %d x %d slots, %d stage%s",
	    rank, world,
	    stages == 1       ? "tensor"
	    : stages == world ? "pipeline"
			      : "hybrid",
	    shard->q_head0, shard->q_head0 + shard->n_q_heads, shard->kv_head0,
	    shard->kv_head0 + shard->n_kv_heads, shard->ffn0, shard->ffn0 + shard->n_ffn,
	    shard->layer0, shard->layer1, shard->exp0, shard->exp0 + shard->n_exp, shard->shx0,
	    shard->shx0 + shard->n_shx, *ctx, *slots, stages, stages == 1 ? "" : "s");
	return 0;
}

int eng_kv_elem_bytes(const char *kv_type)
{
	int t = kv_type ? quant_type_parse(kv_type) : MODEL_KV_DEFAULT;
	if (t != QT_F32 && t != QT_F16 && t != QT_Q8_0)
		return -1;
	return (int)((quant_block_bytes(t) + (size_t)quant_block_elems(t) - 1) /
		     (size_t)quant_block_elems(t));
}

/* The embedding pooling, the weight count and the main weight type (eng_info_t). */
static void model_info_extra(eng_t *e, eng_info_t *i)
{
	char key[96];
	uint32_t pt = 0; /* any integer type of key (gguf.c's key_int) */
	snprintf(key, sizeof key, "%s.pooling_type", e->meta.arch_name);
	i->pooling = ENG_POOL_LAST;
	if (!gguf_get_u32(e->g, key, &pt) && pt >= ENG_POOL_MEAN && pt <= ENG_POOL_RANK) {
		i->pooling = (int)pt;
		i->pooling_given = 1;
	}
	uint64_t best = 0, by_type[QT_NTYPES] = {0};
	for (int k = 0; k < gguf_n_tensors(e->g); k++) {
		const gguf_tensor_t *t = gguf_tensor(e->g, k);
		uint64_t n = 1;
		for (int d = 0; d < t->n_dims; d++)
			n *= (uint64_t)t->ne[d];
		i->n_params += n;
		if (t->n_dims >= 2 && t->type >= 0 && t->type < QT_NTYPES)
			by_type[t->type] += t->nbytes;
	}
	for (int ty = 0; ty < QT_NTYPES; ty++)
		if (by_type[ty] > best) {
			best = by_type[ty];
			i->weight_type = quant_type_ggml_name(ty);
		}
	if (!i->weight_type)
		i->weight_type = "F32";
	/* qwen3.5's prompt ends "<|im_start|>assistant\n<think>\n" (chat_qwen35.c) */
	i->think_open = e->chat && !strcmp(e->chat, "qwen3.5");
}

int eng_kv_block_bytes(const char *kv_type, int *elems)
{
	int t = kv_type ? quant_type_parse(kv_type) : MODEL_KV_DEFAULT;
	if (t != QT_F32 && t != QT_F16 && t != QT_Q8_0)
		return -1;
	*elems = quant_block_elems(t);
	return (int)quant_block_bytes(t);
}

int eng_open(eng_t **out, const eng_opts_t *opts, char *err, size_t errlen)
{
	*out = NULL;
	if (!opts || !opts->model_path)
		return sh_fail(err, errlen, SH_EINVAL, "no model path");
	if (opts->ctx < 0 || opts->threads < 0 || opts->parallel < 0 ||
	    opts->parallel > ENG_MAX_PARALLEL || opts->rollback < 0 || opts->rollback > 64)
		return sh_fail(err, errlen, SH_EINVAL, "bad context, thread or slot count");
	eng_t *e = calloc(1, sizeof *e);
	if (!e)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	int rc;
	char why[256];
	quant_init(getenv("SHOAL_REF_KERNELS") != NULL);
	if ((rc = gguf_open(&e->g, opts->model_path, why, sizeof why))) {
		rc = sh_fail(err, errlen, rc, "%s", why); /* names the file already */
		goto err;
	}
	if ((rc = meta_load(&e->meta, e->g, why, sizeof why)) ||
	    (rc = tok_load(&e->tok, e->g, why, sizeof why))) {
		rc = sh_fail(err, errlen, rc, "%s: %s", opts->model_path, why);
		goto err;
	}
	if (tok_n_vocab(e->tok) > e->meta.n_vocab) {
		rc = sh_fail(err, errlen, SH_EFORMAT, "%s: tokenizer has %d tokens, model %d",
			     opts->model_path, tok_n_vocab(e->tok), e->meta.n_vocab);
		goto err;
	}
	const char *tmpl = NULL;
	size_t tlen = 0;
	gguf_get_str(e->g, "tokenizer.chat_template", &tmpl, &tlen);
	if ((rc = chat_pick(opts->chat_template, tmpl, tlen, &e->chat, why, sizeof why))) {
		if (opts->chat_template) { /* an explicit bad name is the caller's error */
			rc = sh_fail(err, errlen, rc, "%s", why);
			goto err;
		}
		/* an unrecognised template only disables chat; completions still work */
		LOG(LOG_WARN, "%s: %s", opts->model_path, why);
		snprintf(e->chat_err, sizeof e->chat_err, "%s", why);
		e->chat = NULL;
		rc = 0;
	}
	int slots = opts->parallel ? opts->parallel : ENG_DEFAULT_PARALLEL;
	int kv_type = opts->kv_type ? quant_type_parse(opts->kv_type) : MODEL_KV_DEFAULT;
	if (kv_type < 0) {
		rc = sh_fail(err, errlen, SH_EINVAL, "unknown KV cache type '%s' (f32, f16, q8_0)",
			     opts->kv_type);
		goto err;
	}
	if ((rc = model_kv_type_check(&e->meta, kv_type, why, sizeof why))) {
		rc = sh_fail(err, errlen, rc, "%s: %s", opts->model_path, why);
		goto err;
	}
	e->kv_type = kv_type;
	int ctx = pick_ctx(&e->meta, opts->ctx, slots, kv_type);
	model_shard_t shard;
	model_shard_full(&e->meta, &shard);
	int rollback = opts->rollback;
	int spec = spec_mode_parse(opts->spec);
	if (spec < 0) {
		rc = sh_fail(err, errlen, SH_EINVAL,
			     "unknown speculative decoding mode '%s' (auto, off, ngram, model)",
			     opts->spec);
		goto err;
	}
	if (opts->draft_max < 0 || opts->draft_max > SPEC_MAX_DRAFT) {
		rc = sh_fail(err, errlen, SH_EINVAL, "draft length %d is not in 0..%d",
			     opts->draft_max, SPEC_MAX_DRAFT);
		goto err;
	}
	if (opts->dist && tp_group_rank(opts->dist->group) != 0)
		spec = SPEC_OFF; /* only rank 0 samples */
	/* recurrent layers keep a state per draft position and slot (tens of MiB each on large
	 * models): prompt lookup only when asked for */
	if (spec == SPEC_AUTO && e->meta.is_hybrid && !opts->draft_model)
		spec = SPEC_OFF;
	if (spec != SPEC_OFF) { /* recurrent layers keep the states a verify may go back to */
		e->draft_max = opts->draft_max ? opts->draft_max : SPEC_DEFAULT_DRAFT;
		rollback = MAX(rollback, e->draft_max);
	}
	if (opts->dist && (rc = dist_open(e, opts->dist, &shard, &ctx, &slots, &rollback,
					  opts->parallel > 0, err, errlen)))
		goto err;
	if (!opts->dist && !opts->parallel)
		slots = fit_slots(&e->meta, &shard, ctx, slots, 1, kv_type);
	if (!(e->pool = pool_new(opts->threads))) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "cannot start compute threads");
		goto err;
	}
	if ((rc = model_new_slots(&e->model, e->g, &e->meta, &shard, ctx, slots, kv_type, e->pool,
				  why, sizeof why))) {
		rc = sh_fail(err, errlen, rc, "%s: %s", opts->model_path, why);
		goto err;
	}
	if (rollback && (rc = model_set_rollback(e->model, rollback, why, sizeof why))) {
		rc = sh_fail(err, errlen, rc, "%s: %s", opts->model_path, why);
		goto err;
	}
	if (e->dist)
		dist_attach(e->dist, e->model);
	e->n_slots = slots;
	if (spec != SPEC_OFF) {
		spec_opts_t so = {spec,   opts->draft_model, e->draft_max,
				  e->tok, e->meta.n_vocab,   slots,
				  ctx,    kv_type,           e->pool};
		if ((rc = spec_new(&e->spec, &so, err, errlen)))
			goto err;
		if (!(e->sq = calloc((size_t)slots, sizeof *e->sq))) {
			rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
			goto err;
		}
	}
	size_t rows = (size_t)slots * (size_t)(1 + e->draft_max), nb = rows + ENG_PREFILL_MAX;
	e->slots = calloc((size_t)slots, sizeof *e->slots);
	e->logits = malloc(rows * (size_t)e->meta.n_vocab * sizeof *e->logits);
	/* a pipeline's rank 0: a pass in flight per stage (or as many as asked) */
	int stages = e->dist ? dist_n_stages(e->dist) : 1,
	    fly = opts->dist ? opts->dist->inflight : 1;
	e->ring_max =
	    stages > 1 && dist_rank(e->dist) == 0 ? (fly > 0 ? MIN(fly, stages) : stages) : 1;
	e->pass = calloc((size_t)e->ring_max, sizeof *e->pass);
	for (int i = 0; e->pass && i < e->ring_max; i++) {
		pass_t *p = &e->pass[i];
		int **a[] = {&p->tok, &p->slot, &p->pos, &p->out, &p->keep};
		for (size_t k = 0; k < ARRAY_LEN(a); k++)
			*a[k] = malloc(nb * sizeof(int));
		p->gen = malloc(nb * sizeof *p->gen);
	}
	e->gen_done = malloc((size_t)slots * sizeof *e->gen_done);
	int pass_ok = e->pass != NULL;
	for (int i = 0; pass_ok && i < e->ring_max; i++)
		pass_ok = e->pass[i].tok && e->pass[i].slot && e->pass[i].pos && e->pass[i].out &&
			  e->pass[i].keep && e->pass[i].gen;
	if (!e->slots || !e->logits || !pass_ok || !e->gen_done) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto err;
	}
	for (int i = 0; i < slots; i++)
		if (!(e->slots[i].samp = sampler_new(e->meta.n_vocab)) ||
		    !(e->slots[i].cache = malloc((size_t)ctx * sizeof(int)))) {
			rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
			goto err;
		} else /* structured output masks by the tokens' bytes */
			sampler_set_tok(e->slots[i].samp, e->tok);
	if (e->meta.name[0]) {
		snprintf(e->name, sizeof e->name, "%s", e->meta.name);
	} else {
		const char *b = strrchr(opts->model_path, '/');
		snprintf(e->name, sizeof e->name, "%s", b ? b + 1 : opts->model_path);
	}
	eng_info_t *i = &e->info;
	i->name = e->name;
	i->arch = e->meta.arch_name;
	i->n_ctx = ctx;
	i->kv_type = quant_type_name(kv_type);
	i->kv_bytes = model_kv_bytes(&e->meta, &shard, kv_type, ctx) * (uint64_t)slots;
	i->rs_bytes = model_rs_bytes_per_slot(e->model) * (uint64_t)slots;
	i->n_vocab = e->meta.n_vocab;
	i->n_layers = e->meta.n_layers;
	i->dim = e->meta.dim;
	i->n_heads = e->meta.n_heads;
	i->n_kv_heads = e->meta.n_kv_heads;
	i->head_dim = e->meta.head_dim;
	i->ffn = e->meta.ffn;
	i->bos = tok_bos(e->tok);
	i->eos = tok_eos(e->tok);
	i->weight_bytes = e->meta.weight_bytes;
	i->chat_template = e->chat;
	e->tool_style = chat_tool_style(e->chat, tmpl, tlen);
	i->tool_format = chat_tool_format(e->tool_style);
	i->rank = e->dist ? dist_rank(e->dist) : 0;
	i->world = e->dist ? dist_world(e->dist) : 1;
	i->n_slots = slots;
	i->n_stages = stages;
	model_info_extra(e, i);
	i->spec = e->spec ? spec_mode_name(e->spec) : "off";
	i->draft = e->spec ? spec_draft_name(e->spec) : NULL;
	*out = e;
	return 0;
err:
	eng_free(e);
	return rc;
}

int eng_model_shape(const char *path, eng_model_shape_t *s, char *err, size_t errlen)
{
	gguf_t *g = NULL;
	model_meta_t mm;
	char e[256];
	int rc = gguf_open(&g, path, e, sizeof e);
	if (!rc)
		rc = meta_load(&mm, g, e, sizeof e);
	if (rc) {
		gguf_free(g);
		return sh_fail(err, errlen, rc, "%s: %s", path, e);
	}
	memset(s, 0, sizeof *s);
	snprintf(s->arch, sizeof s->arch, "%s", mm.arch_name);
	s->n_layers = mm.n_layers, s->n_heads = mm.n_heads, s->n_kv_heads = mm.n_kv_heads;
	s->head_dim = mm.head_dim, s->dim = mm.dim, s->ffn = mm.ffn, s->n_vocab = mm.n_vocab;
	s->n_ctx = mm.n_ctx, s->n_experts = mm.n_experts, s->ffn_shexp = mm.ffn_shexp;
	if (mm.swa_window > 0 && !mm.is_mla) {
		s->swa_window = mm.swa_window, s->swa_period = mm.swa_period;
		s->swa_kv_pos = model_swa_ring(&mm, INT32_MAX - 64);
		for (int l = 0; l < mm.n_layers; l++)
			if (meta_layer_swa(&mm, l)) {
				s->swa[l / 8] |= (uint8_t)(1u << (l % 8));
				s->n_swa_layers++;
			}
	}
	s->n_kv_layers = mm.n_layers;
	for (int l = 0; l < mm.n_layers; l++)
		if (meta_layer_recurrent(&mm, l)) {
			s->recurrent[l / 8] |= (uint8_t)(1u << (l % 8));
			s->n_kv_layers--;
		}
	s->rs_layer_bytes = meta_dn_state_bytes(&mm, mm.dn.n_k_heads);
	s->rs_copies = mm.is_hybrid ? 1 + MODEL_CHECKPOINTS : 0; /* rollback 0: one ring buffer */
	if (mm.is_hybrid)
		s->rs_k_heads = mm.dn.n_k_heads, s->rs_unit = model_dn_head_unit(&mm, g);
	if (mm.is_mla)
		s->kv_latent_bytes =
		    model_kv_bytes_per_pos(&mm, NULL, QT_F32) / (size_t)s->n_kv_layers;
	s->ffn_block = dist_ffn_block(g);
	uint64_t *part[DIST_PART_COUNT] = {
	    [DIST_PART_REPLICATED] = &s->replicated_bytes, [DIST_PART_Q_HEADS] = &s->q_heads_bytes,
	    [DIST_PART_KV_HEADS] = &s->kv_heads_bytes,     [DIST_PART_FFN] = &s->ffn_bytes,
	    [DIST_PART_EXPERTS] = &s->expert_bytes,        [DIST_PART_SHEXP] = &s->shexp_bytes,
	    [DIST_PART_RECURRENT] = &s->recurrent_bytes,   [DIST_PART_EMBD] = &s->embd_bytes,
	    [DIST_PART_OUTPUT] = &s->output_bytes};
	uint64_t by_type[64] = {0}; /* matrices' bytes by type: the weight type is the largest */
	for (int i = 0; i < gguf_n_tensors(g); i++) {
		const gguf_tensor_t *t = gguf_tensor(g, i);
		int l;
		if (sscanf(t->name, "blk.%d.", &l) == 1 && l >= mm.n_layers)
			continue; /* NextN/MTP layers after the stack: skipped at load, not held */
		*part[dist_tensor_part(t->name)] += t->nbytes;
		if (t->n_dims >= 2 && t->type >= 0 && t->type < 64)
			by_type[t->type] += t->nbytes;
	}
	for (int t = 1; t < 64; t++)
		if (by_type[t] > by_type[s->wtype])
			s->wtype = t;
	gguf_free(g);
	return 0;
}

int eng_header_bytes(const void *prefix, size_t len, uint64_t *need, char *err, size_t errlen)
{
	return gguf_header_bytes(prefix, len, need, err, errlen);
}

static int range_cmp(const void *a, const void *b)
{
	const model_range_t *x = a, *y = b;
	if (x->compact != y->compact)
		return x->compact - y->compact;
	return x->off < y->off ? -1 : x->off > y->off;
}

int eng_shard_ranges(const char *path, const eng_dist_t *dist, int rank, eng_range_t **out,
		     int *n_out, char *err, size_t errlen)
{
	*out = NULL;
	*n_out = 0;
	if (dist && !dist->has_ranges)
		return sh_fail(err, errlen, SH_EINVAL, "a slice needs the plan's ranges");
	gguf_t *g = NULL;
	pool_t *pool = NULL;
	model_t *m = NULL;
	model_range_t *r = NULL;
	int n = 0, rc;
	char why[256];
	model_meta_t meta;
	quant_init(getenv("SHOAL_REF_KERNELS") != NULL);
	if ((rc = gguf_open(&g, path, why, sizeof why)) ||
	    (rc = meta_load(&meta, g, why, sizeof why))) {
		rc = sh_fail(err, errlen, rc, "%s", why);
		goto out;
	}
	model_shard_t shard;
	model_shard_full(&meta, &shard);
	if (dist)
		shard_of_ranges(&meta, dist, &shard);
	/* bind the share as eng_open would (context 1: no real cache), then ask what it reads */
	if (!(pool = pool_new(1))) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = model_new_slots(&m, g, &meta, &shard, 1, 1, MODEL_KV_NONE, pool, why,
				  sizeof why))) {
		rc = sh_fail(err, errlen, rc, "%s: %s", path, why);
		goto out;
	}
	if ((rc = model_weight_ranges(m, g, rank == 0, &r, &n)))
		goto nomem;
	/* the header, and every vector (norms, biases: read whole by every rank) */
	uint64_t doff = gguf_data_offset(g);
	model_range_t *nr = realloc(r, (size_t)(n + 1 + 3 * gguf_n_tensors(g)) * sizeof *nr);
	if (!nr)
		goto nomem;
	r = nr;
	r[n++] = (model_range_t){0, doff, 0};
	for (int i = 0; i < gguf_n_tensors(g); i++) {
		const gguf_tensor_t *t = gguf_tensor(g, i);
		if (t->n_dims <= 1 && t->nbytes)
			r[n++] = (model_range_t){doff + t->offset, t->nbytes, 0};
		/* the first and last 32 bytes of every tensor: dist_model_fingerprint reads them
		 * so that ranks agree they hold the same file */
		uint64_t k = MIN(t->nbytes, 32);
		r[n++] = (model_range_t){doff + t->offset, k, 0};
		r[n++] = (model_range_t){doff + t->offset + t->nbytes - k, k, 0};
	}
	qsort(r, (size_t)n, sizeof *r, range_cmp);
	int k = 0; /* merge overlapping and touching ranges */
	for (int i = 0; i < n; i++) {
		if (k && r[i].compact == r[k - 1].compact &&
		    r[i].off <= r[k - 1].off + r[k - 1].len) {
			uint64_t end = MAX(r[k - 1].off + r[k - 1].len, r[i].off + r[i].len);
			r[k - 1].len = end - r[k - 1].off;
		} else {
			r[k++] = r[i];
		}
	}
	eng_range_t *o = malloc((size_t)MAX(k, 1) * sizeof *o);
	if (!o)
		goto nomem;
	for (int i = 0; i < k; i++)
		o[i] = (eng_range_t){r[i].off, r[i].len, r[i].compact};
	*out = o;
	*n_out = k;
	rc = 0;
	goto out;
nomem:
	rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
out:
	free(r);
	model_free(m);
	pool_free(pool);
	gguf_free(g);
	return rc;
}

void eng_free(eng_t *e)
{
	if (!e)
		return;
	/* passes still in flight come back first: the last stage is not left sending to a rank
	 * that is gone */
	for (; e->ring_n > 0 && e->dist && !dist_error(e->dist)[0]; e->ring_n--)
		dist_collect(e->dist, NULL, NULL);
	if (e->dist && e->model && dist_rank(e->dist) == 0)
		dist_stop(e->dist);
	dist_free(e->dist);
	spec_free(e->spec);
	free(e->sq);
	model_free(e->model);
	pool_free(e->pool);
	for (int i = 0; e->slots && i < e->n_slots; i++) {
		slot_t *sl = &e->slots[i];
		if (sl->state != SLOT_FREE)
			seq_end(e, sl, ENG_FINISH_CANCELED);
		sampler_free(sl->samp);
		free(sl->cache);
	}
	free(e->slots);
	tok_free(e->tok);
	gguf_free(e->g);
	free(e->logits);
	for (int i = 0; e->pass && i < e->ring_max; i++) {
		pass_t *p = &e->pass[i];
		free(p->tok);
		free(p->slot);
		free(p->pos);
		free(p->out);
		free(p->keep);
		free(p->gen);
	}
	free(e->pass);
	free(e->gen_done);
	free(e->hidden);
	free(e);
}

const eng_info_t *eng_info(const eng_t *e)
{
	return &e->info;
}

int eng_tokenize(const eng_t *e, const char *text, int add_bos, int special, int **ids, int *n_ids,
		 char *err, size_t errlen)
{
	*ids = NULL;
	*n_ids = 0;
	if (!text)
		return sh_fail(err, errlen, SH_EINVAL, "no text");
	int rc = tok_encode(e->tok, text, strlen(text), add_bos && tok_add_bos(e->tok), special,
			    ids, n_ids);
	if (rc)
		return sh_fail(err, errlen, rc, "cannot tokenize: %s", sh_strerror(rc));
	return 0;
}

int eng_detokenize(const eng_t *e, const int *ids, int n_ids, char **text)
{
	size_t len;
	return tok_decode(e->tok, ids, n_ids, 0, text, &len);
}

int eng_chat_prompt(const eng_t *e, const eng_msg_t *msgs, int n_msgs, int **ids, int *n_ids,
		    char *err, size_t errlen)
{
	return eng_chat_prompt_tools(e, msgs, n_msgs, NULL, 0, ids, n_ids, err, errlen);
}

int eng_chat_prompt_tools(const eng_t *e, const eng_msg_t *msgs, int n_msgs, const char *tools_json,
			  int open_call, int **ids, int *n_ids, char *err, size_t errlen)
{
	*ids = NULL;
	*n_ids = 0;
	char *text = NULL;
	if (!e->chat)
		return sh_fail(err, errlen, SH_EUNSUPP, "%s", e->chat_err);
	size_t elen = 0;
	const char *eos =
	    tok_eos(e->tok) >= 0 ? tok_piece(e->tok, tok_eos(e->tok), 1, &elen) : NULL;
	char eosbuf[64];
	if (eos) { /* a piece is not NUL-terminated */
		snprintf(eosbuf, sizeof eosbuf, "%.*s", (int)MIN(elen, sizeof eosbuf - 1), eos);
		eos = eosbuf;
	}
	int rc = chat_render_tools(e->chat, e->tool_style, msgs, n_msgs, tools_json, open_call, eos,
				   &text, err, errlen);
	if (rc)
		return rc;
	/* the rendered template spells out its special tokens; BOS as the model wants, unless the
	 * template already starts with it */
	rc = tok_encode(e->tok, text, strlen(text), tok_add_bos(e->tok), 1, ids, n_ids);
	free(text);
	if (rc)
		return sh_fail(err, errlen, rc, "cannot tokenize the chat prompt");
	if (*n_ids >= 2 && (*ids)[0] == (*ids)[1] && (*ids)[0] == tok_bos(e->tok)) {
		memmove(*ids, *ids + 1, (size_t)(*n_ids - 1) * sizeof **ids);
		(*n_ids)--;
	}
	return 0;
}

/* ---- generation --------------------------------------------------------------------------- */

static int held_add(held_t *h, const char *s, size_t n)
{
	if (h->len + n + 1 > h->cap) {
		size_t nc = MAX(h->cap * 2, h->len + n + 64);
		char *nb = realloc(h->buf, nc);
		if (!nb)
			return SH_ENOMEM;
		h->buf = nb;
		h->cap = nc;
	}
	memcpy(h->buf + h->len, s, n);
	h->len += n;
	h->buf[h->len] = 0;
	return 0;
}

/* Earliest occurrence of any stop string in h: its offset, or -1; *which: its index. */
static long stop_find(const held_t *h, const eng_sampling_t *s, int *which)
{
	long best = -1;
	for (int i = 0; i < s->n_stop; i++) {
		const char *st = s->stop[i];
		size_t n = st ? strlen(st) : 0;
		if (!n || n > h->len)
			continue;
		for (size_t k = 0; k + n <= h->len; k++)
			if (!memcmp(h->buf + k, st, n)) {
				if (best < 0 || (long)k < best) {
					best = (long)k;
					*which = i;
				}
				break;
			}
	}
	return best;
}

/* Length of the longest tail of h that is a proper prefix of some stop string. */
static size_t stop_partial(const held_t *h, const eng_sampling_t *s)
{
	size_t best = 0;
	for (int i = 0; i < s->n_stop; i++) {
		const char *st = s->stop[i];
		size_t n = st ? strlen(st) : 0;
		for (size_t k = MIN(n ? n - 1 : 0, h->len); k > best; k--)
			if (!memcmp(h->buf + h->len - k, st, k)) {
				best = k;
				break;
			}
	}
	return best;
}

/* One forward pass: on this node, or as rank 0 of the group (every rank computes its part). */
static int eng_forward(eng_t *e, const model_batch_t *b)
{
	if (e->dist)
		return dist_forward_batch(e->dist, b, e->logits);
	return model_forward_batch(e->model, b, e->logits);
}

/* Why a forward pass failed, for res->error. */
static const char *eng_forward_why(const eng_t *e, int rc)
{
	return e->dist && dist_error(e->dist)[0] ? dist_error(e->dist) : sh_strerror(rc);
}

int eng_worker_run(eng_t *e, char *err, size_t errlen)
{
	if (!e->dist || dist_rank(e->dist) == 0)
		return sh_fail(err, errlen, SH_EINVAL, "not a worker rank");
	return dist_serve(e->dist, err, errlen);
}

void eng_comm_stats(const eng_t *e, eng_comm_t *out)
{
	memset(out, 0, sizeof *out);
	if (!e->dist)
		return;
	dist_stats_t s;
	dist_get_stats(e->dist, &s);
	*out = (eng_comm_t){s.steps,   s.tokens,      s.bytes_sent,   s.comm_ms,
			    s.step_ms, s.comm_min_ms, s.in_flight_max};
}

void eng_worker_comm_stats(eng_t *e, eng_comm_t *out)
{
	memset(out, 0, sizeof *out);
	if (!e->dist)
		return;
	dist_stats_t s;
	dist_get_stats_shared(e->dist, &s);
	*out = (eng_comm_t){s.steps, s.tokens, 0, s.comm_ms, s.step_ms, s.comm_min_ms, 0};
}

/* ---- sequences ---------------------------------------------------------------------------- */

int eng_active(const eng_t *e)
{
	return e->n_active;
}

int eng_slot_state(const eng_t *e, int i)
{
	return i >= 0 && i < e->n_slots ? e->slots[i].state : SLOT_FREE;
}

/* Ends the sequence in sl with finish (and error rc for ENG_FINISH_ERROR). */
static void seq_end(eng_t *e, slot_t *sl, int finish)
{
	sl->res->finish = finish;
	sl->res->gen_ms = sl->t1 ? (double)(now_ns() - sl->t1) / 1e6 : 0;
	if (!sl->t1)
		sl->res->prompt_ms = (double)(now_ns() - sl->t0) / 1e6;
	tok_stream_free(&sl->ts);
	free(sl->held.buf);
	free(sl->prompt);
	sl->held = (held_t){0};
	sl->prompt = NULL;
	sl->emb = NULL;
	sl->state = SLOT_FREE;
	sl->used = ++e->clock;
	e->n_active--;
}

/* Admits toks[0..n) as a sequence to prefill into the free slot whose cached tokens share the
 * longest prefix with them (ties: least recently used), with room for n_ctx tokens. Sets *out
 * and returns the slot number, or a negative code with res set (eng_seq_start's contract). The
 * caller sets up the sampler. */
static int seq_admit(eng_t *e, const int *toks, int n, const eng_sampling_t *s, eng_token_cb cb,
		     void *ud, eng_result_t *res, slot_t **out)
{
	memset(res, 0, sizeof *res);
	res->prompt_tokens = n;
	res->finish = ENG_FINISH_ERROR;
	int n_ctx = e->info.n_ctx, n_vocab = e->meta.n_vocab;
	if (e->dist && dist_rank(e->dist) != 0)
		return sh_fail(res->error, sizeof res->error, SH_EINVAL,
			       "only rank 0 of a group generates");
	if (n <= 0)
		return sh_fail(res->error, sizeof res->error, SH_EINVAL, "empty prompt");
	if (n >= n_ctx)
		return sh_fail(res->error, sizeof res->error, SH_EINVAL,
			       "prompt of %d tokens does not fit the context of %d", n, n_ctx);
	for (int i = 0; i < n; i++)
		if (toks[i] < 0 || toks[i] >= n_vocab)
			return sh_fail(res->error, sizeof res->error, SH_EINVAL, "bad token id %d",
				       toks[i]);
	/* the free slot sharing the longest prefix; ties to the least recently used */
	slot_t *sl = NULL;
	int best = -1, keep = 0;
	for (int i = 0; i < e->n_slots; i++) {
		slot_t *c = &e->slots[i];
		if (c->state != SLOT_FREE)
			continue;
		int k = 0;
		while (k < c->n_cache && k < n && c->cache[k] == toks[k])
			k++;
		/* a fully cached prompt still recomputes its last token for the logits; recurrent
		 * layers continue only from a state the slot holds (model.h), and a sliding-window
		 * ring may no longer hold what that position attends to (then from the start) */
		int use = model_seq_resume_pos(e->model, i, k == n ? k - 1 : k);
		k = use = model_prefix_usable(e->model, i, use); /* rank by what is kept */
		if (k > best || (k == best && c->used < sl->used)) {
			best = k;
			keep = use;
			sl = c;
		}
	}
	if (!sl) {
		res->finish = ENG_FINISH_NONE;
		return SH_EBUSY;
	}
	if (!(sl->prompt = malloc((size_t)n_ctx * sizeof *toks)) ||
	    tok_stream_init(&sl->ts, e->tok, 0)) {
		free(sl->prompt);
		sl->prompt = NULL;
		return sh_fail(res->error, sizeof res->error, SH_ENOMEM, "out of memory");
	}
	memcpy(sl->prompt, toks, (size_t)n * sizeof *toks);
	sl->n_prompt = sl->n_toks = sl->n_req = n;
	sl->n_cache = keep;
	sl->sp = s ? *s : (eng_sampling_t){0};
	if (!s)
		eng_sampling_default(&sl->sp);
	sl->n_top = MAX(0, MIN(MIN(sl->sp.top_logprobs, MAX_TOP_LOGPROBS), n_vocab));
	sl->cb = cb;
	sl->ud = ud;
	sl->res = res;
	sl->held = (held_t){0};
	sl->t0 = now_ns();
	sl->t1 = 0;
	sl->used = ++e->clock; /* admission order: prefills go first come, first served */
	sl->gen++;
	sl->flying = 0;
	sl->state = SLOT_PREFILL;
	if (e->spec)
		spec_seq_start(e->spec, (int)(sl - e->slots));
	e->n_active++;
	res->finish = ENG_FINISH_NONE;
	*out = sl;
	return (int)(sl - e->slots);
}

int eng_seq_start(eng_t *e, const int *prompt, int n_prompt, const eng_sampling_t *s,
		  eng_token_cb cb, void *ud, eng_result_t *res)
{
	slot_t *sl;
	int id = seq_admit(e, prompt, n_prompt, s, cb, ud, res, &sl);
	if (id >= 0)
		sampler_reset(sl->samp, &sl->sp, prompt, n_prompt);
	return id;
}

void eng_seq_cancel(eng_t *e, int id)
{
	if (id >= 0 && id < e->n_slots && e->slots[id].state != SLOT_FREE)
		seq_end(e, &e->slots[id], ENG_FINISH_CANCELED);
}

/* ---- resuming a sequence elsewhere ---------------------------------------------------------
 * A sequence's state is kept current as it runs (the tokens in sl->prompt, the sampler, ts,
 * held, res): a snapshot is a copy, taken between steps or when a step's pass failed (nothing
 * of that step was sampled, so the state is the one before it). */

struct eng_seq_state {
	int *toks; /* [n_toks]: the request's prompt [0, n_req), then the tokens handed out */
	int n_toks, n_req;
	sampler_pos_t pos;     /* the sampler's generator */
	unsigned char pend[4]; /* ts: an unfinished UTF-8 character */
	int n_pend;
	char *held; /* [n_held]: text held back (a stop string's possible start) */
	size_t n_held;
	int64_t t0, t1; /* admission and end of the first prefill (0 = not yet) */
	double prompt_ms;
};

static eng_seq_state_t *seq_snapshot(const slot_t *sl)
{
	eng_seq_state_t *st = calloc(1, sizeof *st);
	if (!st)
		return NULL;
	st->toks = malloc((size_t)sl->n_toks * sizeof *st->toks);
	st->held = malloc(sl->held.len + 1);
	if (!st->toks || !st->held) {
		eng_seq_state_free(st);
		return NULL;
	}
	memcpy(st->toks, sl->prompt, (size_t)sl->n_toks * sizeof *st->toks);
	st->n_toks = sl->n_toks;
	st->n_req = sl->n_req;
	sampler_get_pos(sl->samp, &st->pos);
	memcpy(st->pend, sl->ts.pend, sizeof st->pend);
	st->n_pend = sl->ts.n_pend;
	if (sl->held.len)
		memcpy(st->held, sl->held.buf, sl->held.len);
	st->n_held = sl->held.len;
	st->t0 = sl->t0;
	st->t1 = sl->t1;
	st->prompt_ms = sl->res->prompt_ms;
	return st;
}

eng_seq_state_t *eng_seq_snapshot(const eng_t *e, int id)
{
	if (id < 0 || id >= e->n_slots || e->slots[id].state == SLOT_FREE)
		return NULL;
	return seq_snapshot(&e->slots[id]);
}

void eng_seq_state_free(eng_seq_state_t *st)
{
	if (!st)
		return;
	free(st->toks);
	free(st->held);
	free(st);
}

int eng_seq_state_tokens(const eng_seq_state_t *st, int *n_generated)
{
	if (n_generated)
		*n_generated = st->n_toks - st->n_req;
	return st->n_toks;
}

int eng_seq_start_resume(eng_t *e, const eng_seq_state_t *st, const eng_sampling_t *s,
			 eng_token_cb cb, void *ud, eng_result_t *res)
{
	slot_t *sl;
	int id = seq_admit(e, st->toks, st->n_toks, s, cb, ud, res, &sl);
	if (id < 0)
		return id;
	sl->n_req = st->n_req;
	res->prompt_tokens = st->n_req;
	res->completion_tokens = st->n_toks - st->n_req;
	res->prompt_ms = st->prompt_ms;
	sl->t0 = st->t0;
	sl->t1 = st->t1;
	sampler_resume(sl->samp, &sl->sp, st->toks, st->n_req, st->n_toks, &st->pos);
	memcpy(sl->ts.pend, st->pend, sizeof st->pend);
	sl->ts.n_pend = st->n_pend;
	if (st->n_held && held_add(&sl->held, st->held, st->n_held)) {
		seq_end(e, sl, ENG_FINISH_ERROR);
		return sh_fail(res->error, sizeof res->error, SH_ENOMEM, "out of memory");
	}
	return id;
}

/* ---- embeddings --------------------------------------------------------------------------- */

int eng_embed_tokenize(const eng_t *e, const char *text, int **ids, int *n_ids, char *err,
		       size_t errlen)
{
	int rc = eng_tokenize(e, text, 1, 1, ids, n_ids, err, errlen);
	if (rc || !tok_add_eos(e->tok))
		return rc;
	int *p = realloc(*ids, (size_t)(*n_ids + 1) * sizeof **ids);
	if (!p) {
		free(*ids);
		*ids = NULL;
		*n_ids = 0;
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	}
	p[(*n_ids)++] = tok_eos(e->tok);
	*ids = p;
	return 0;
}

int eng_embed_start(eng_t *e, const int *ids, int n, float *out, eng_result_t *res)
{
	memset(res, 0, sizeof *res);
	res->prompt_tokens = n;
	res->finish = ENG_FINISH_ERROR;
	if (e->dist && dist_rank(e->dist) != 0)
		return sh_fail(res->error, sizeof res->error, SH_EINVAL,
			       "only rank 0 of a group computes");
	if (e->info.pooling == ENG_POOL_RANK)
		return sh_fail(res->error, sizeof res->error, SH_EINVAL,
			       "this model is a reranker (pooling rank): it gives no embeddings");
	if (n <= 0 || n > e->info.n_ctx)
		return sh_fail(res->error, sizeof res->error, SH_EINVAL,
			       "an input of %d tokens does not fit the context of %d", n,
			       e->info.n_ctx);
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= e->meta.n_vocab)
			return sh_fail(res->error, sizeof res->error, SH_EINVAL, "bad token id %d",
				       ids[i]);
	size_t rows = (size_t)e->n_slots + ENG_PREFILL_MAX;
	if (!e->hidden && !(e->hidden = malloc(rows * (size_t)e->meta.dim * sizeof *e->hidden)))
		return sh_fail(res->error, sizeof res->error, SH_ENOMEM, "out of memory");
	slot_t *sl = NULL; /* the least recently used free slot: recent chats keep theirs */
	for (int i = 0; i < e->n_slots; i++) {
		slot_t *c = &e->slots[i];
		if (c->state == SLOT_FREE && (!sl || c->used < sl->used))
			sl = c;
	}
	if (!sl) {
		res->finish = ENG_FINISH_NONE;
		return SH_EBUSY;
	}
	if (!(sl->prompt = malloc((size_t)n * sizeof *ids)))
		return sh_fail(res->error, sizeof res->error, SH_ENOMEM, "out of memory");
	memcpy(sl->prompt, ids, (size_t)n * sizeof *ids);
	sl->n_prompt = n;
	sl->n_cache = 0; /* from position 0 always: the pool reads every token it wants */
	sl->cb = NULL;
	sl->ud = NULL;
	sl->res = res;
	sl->held = (held_t){0};
	sl->ts = (tok_stream_t){0};
	sl->emb = out;
	memset(out, 0, (size_t)e->meta.dim * sizeof *out);
	sl->t0 = now_ns();
	sl->t1 = 0;
	sl->used = ++e->clock;
	sl->gen++;
	sl->flying = 0;
	sl->state = SLOT_PREFILL;
	e->n_active++;
	res->finish = ENG_FINISH_NONE;
	return (int)(sl - e->slots);
}

/* Samples sl's token at position n_cache from logits (the one after position n_cache - 1),
 * where a draft proposed `draft` from the distribution q (draft -1: none; q NULL: a
 * deterministic draft), and hands its text out. *tok gets the token, *accepted whether it is
 * the draft. Returns 1 when the sequence ended (res->finish set), 0 when it goes on with
 * sl->next. */
static int seq_sample(eng_t *e, slot_t *sl, float *logits, int draft, const float *q, int *tok,
		      int *accepted)
{
	eng_result_t *res = sl->res;
	const eng_sampling_t *s = &sl->sp;
	eng_logprob_t top[MAX_TOP_LOGPROBS];
	int n_top = sl->n_top;
	float lp = 0;
	size_t plen;
	/* a grammar (structured output) allows only what can still close within the tokens left */
	int left = e->info.n_ctx - sl->n_cache;
	if (s->max_tokens > 0)
		left = MIN(left, s->max_tokens - res->completion_tokens);
	sampler_mask(sl->samp, logits, left);
	if (s->ignore_eos)
		for (int i = 0; i < e->meta.n_vocab; i++)
			if (tok_is_eog(e->tok, i))
				logits[i] = -INFINITY;
	int t = sampler_sample_spec(sl->samp, logits, draft, q, &lp, top, n_top, accepted);
	*tok = t;
	if (tok_is_eog(e->tok, t)) {
		/* text still held back (a partial stop string, an unfinished character) is output
		 * after all: one last callback, carrying the end-of-generation id */
		const char *rest = tok_stream_flush(&sl->ts, &plen);
		if (held_add(&sl->held, rest, plen) == 0 && sl->held.len && sl->cb) {
			eng_token_t tk = {t, sl->held.buf, sl->held.len, lp, top, n_top};
			sl->cb(sl->ud, &tk);
		}
		res->finish = ENG_FINISH_STOP;
		return 1;
	}
	sampler_accept(sl->samp, t);
	res->completion_tokens++;
	if (sl->n_toks < e->info.n_ctx) /* the sequence's state (eng_seq_snapshot) */
		sl->prompt[sl->n_toks++] = t;
	const char *piece = tok_stream_push(&sl->ts, t, &plen);
	if (held_add(&sl->held, piece, plen)) {
		sh_fail(res->error, sizeof res->error, SH_ENOMEM, "out of memory");
		res->finish = ENG_FINISH_ERROR;
		return 1;
	}
	int last = (s->max_tokens > 0 && res->completion_tokens >= s->max_tokens) ||
		   sl->n_cache + 1 >= e->info.n_ctx;
	int which = 0;
	long at = stop_find(&sl->held, s, &which);
	size_t emit;
	int finish = ENG_FINISH_NONE;
	if (at >= 0) {
		emit = (size_t)at;
		finish = ENG_FINISH_STOP;
		res->stop_hit = which + 1;
	} else if (last) {
		const char *rest = tok_stream_flush(&sl->ts, &plen);
		if (held_add(&sl->held, rest, plen)) {
			sh_fail(res->error, sizeof res->error, SH_ENOMEM, "out of memory");
			res->finish = ENG_FINISH_ERROR;
			return 1;
		}
		emit = sl->held.len;
		finish = ENG_FINISH_LENGTH;
	} else {
		emit = sl->held.len - stop_partial(&sl->held, s);
	}
	eng_token_t tk = {t, sl->held.buf ? sl->held.buf : "", emit, lp, top, n_top};
	int cancel = sl->cb ? sl->cb(sl->ud, &tk) : 0;
	memmove(sl->held.buf, sl->held.buf + emit, sl->held.len - emit + 1);
	sl->held.len -= emit;
	if (finish != ENG_FINISH_NONE || cancel) {
		res->finish = finish != ENG_FINISH_NONE ? finish : ENG_FINISH_CANCELED;
		return 1;
	}
	sl->next = t; /* fed in the next step: its keys/values join the cache */
	return 0;
}

/* Speculative decoding: drafts for the n decoding sequences ids[] of the pass being built (spec.h
 * sizes them, 0 where a draft does not pay), copied into each slot (k, draft, q). n_other: the
 * pass's prompt tokens. */
static void pass_drafts(eng_t *e, const int *ids, int n, int n_other)
{
	for (int j = 0; j < n; j++) {
		slot_t *sl = &e->slots[ids[j]];
		/* the context: the cached tokens and the one this pass feeds */
		sl->cache[sl->n_cache] = sl->next;
		int room = e->info.n_ctx - 2 - sl->n_cache; /* positions the output may still use */
		int left = room + 1;
		if (sl->sp.max_tokens > 0) {
			left = MIN(left, sl->sp.max_tokens - sl->res->completion_tokens);
			room = MIN(room, left - 1); /* a pass makes at most k + 1 tokens */
		}
		e->sq[j] = (spec_seq_t){.slot = ids[j],
					.ctx = sl->cache,
					.n = sl->n_cache + 1,
					.max_k = room,
					.budget = left,
					.samp = sl->samp};
	}
	spec_draft(e->spec, e->sq, n, n_other);
	for (int j = 0; j < n; j++) {
		slot_t *sl = &e->slots[e->sq[j].slot];
		sl->k = e->sq[j].k;
		memcpy(sl->draft, e->sq[j].draft, (size_t)sl->k * sizeof *sl->draft);
		sl->q = e->sq[j].q;
	}
}

/* Builds pass p: one token of every decoding sequence that is not in flight, each followed by
 * its draft, then prompt chunks of prefilling ones, oldest admission first, within the prompt
 * budget; at most max_seq sequences. Returns the tokens in it. */
static int pass_build(eng_t *e, pass_t *p, int max_seq)
{
	int n = 0, seqs = 0, decoding = 0, ids[ENG_MAX_PARALLEL], n_ids = 0, n_prefill = 0;
	for (int i = 0; i < e->n_slots; i++) {
		decoding |= e->slots[i].state == SLOT_DECODE;
		if (e->slots[i].state == SLOT_PREFILL && !e->slots[i].flying)
			n_prefill += e->slots[i].n_prompt - e->slots[i].n_cache;
	}
	int budget = decoding ? ENG_PREFILL_CHUNK : ENG_PREFILL_MAX;
	for (int i = 0; i < e->n_slots && n_ids < max_seq; i++)
		if (e->slots[i].state == SLOT_DECODE && !e->slots[i].flying) {
			e->slots[i].k = 0;
			ids[n_ids++] = i;
		}
	if (e->spec && n_ids)
		pass_drafts(e, ids, n_ids, MIN(budget, n_prefill));
	/* one token of every decoding sequence at the end of its slot, and its draft after it */
	for (int j = 0; j < n_ids; j++, seqs++) {
		slot_t *sl = &e->slots[ids[j]];
		for (int d = 0; d <= sl->k; d++, n++) {
			p->tok[n] = d ? sl->draft[d - 1] : sl->next;
			p->slot[n] = ids[j], p->pos[n] = sl->n_cache + d, p->out[n] = 1;
			p->keep[n] = 0, p->gen[n] = sl->gen;
		}
		sl->flying = 1;
	}
	p->n_dec = n;
	/* then prompt chunks within the step's budget: while others decode, a short one so
	 * their next token is not held up long */
	while (budget > 0 && seqs < max_seq) {
		slot_t *sl = NULL;
		for (int i = 0; i < e->n_slots; i++) {
			slot_t *c = &e->slots[i];
			if (c->state == SLOT_PREFILL && !c->flying && (!sl || c->used < sl->used))
				sl = c;
		}
		if (!sl)
			break;
		int k = MIN(budget, sl->n_prompt - sl->n_cache), id = (int)(sl - e->slots);
		for (int j = 0; j < k; j++, n++) {
			int at = sl->n_cache + j;
			p->tok[n] = sl->prompt[at];
			p->slot[n] = id;
			p->pos[n] = at;
			p->gen[n] = sl->gen;
			if (sl->emb) { /* an embedding: the hidden states its pool reads */
				p->out[n] = embed_pool_wants(e->info.pooling, at, sl->n_prompt)
						? MODEL_OUT_EMBD
						: 0;
				p->keep[n] = 0;
				continue;
			}
			p->out[n] = at == sl->n_prompt - 1 ? MODEL_OUT_LOGITS : 0;
			/* checkpoints of the recurrent state a few tokens before the prompt's end:
			 * the next turn of a chat shares the prompt up to about there (a template
			 * may render the previous reply's opening differently), and the same prompt
			 * again resumes one token before its end */
			int after = at + 1;
			p->keep[n] =
			    after == sl->n_prompt - ENG_KEEP_BACK || after == sl->n_prompt - 1;
		}
		sl->flying = 1;
		seqs++;
		budget -= k;
	}
	p->n = n;
	return n;
}

/* A forward pass failed: every active sequence fails; the caches are unknown now. */
static int step_fail(eng_t *e, int rc, eng_done_t *done, int *n_done)
{
	for (int i = 0; i < e->n_slots; i++) {
		slot_t *sl = &e->slots[i];
		sl->flying = 0;
		if (sl->state != SLOT_FREE) {
			sh_fail(sl->res->error, sizeof sl->res->error, rc,
				"forward pass failed: %s", eng_forward_why(e, rc));
			sl->res->resume = seq_snapshot(sl); /* to go on elsewhere */
			seq_end(e, sl, ENG_FINISH_ERROR);
			done[(*n_done)++] = (eng_done_t){i, rc};
		}
		sl->n_cache = 0;
	}
	e->ring_n = 0;
	return rc;
}

/* Samples a decoding sequence's rows after its pass: the token after `next`, then while the
 * drafted tokens are accepted the one after each (the speculative-sampling rule, sample.h); the
 * first token not drafted ends it (the model's correction, or after a whole accepted draft its
 * bonus token). Positions of rejected drafts are left behind: n_cache counts only accepted
 * ones, and the next pass writes over the rest. *produced gets the tokens sampled. Returns 1
 * when the sequence ended. */
static int seq_verify(eng_t *e, slot_t *sl, const float *rows, int *produced)
{
	int base = sl->n_cache, k = sl->k, accepted = 0, first = -1, ended = 0, i;
	size_t nv = (size_t)e->meta.n_vocab;
	sl->cache[base] = sl->next;
	for (i = 0; i <= k; i++) {
		int t, ok = 0, d = i < k ? sl->draft[i] : -1;
		sl->n_cache = base + 1 + i; /* next and the drafts accepted so far */
		ended = seq_sample(e, sl, (float *)rows + (size_t)i * nv, d,
				   sl->q && i < k ? sl->q + (size_t)i * nv : NULL, &t, &ok);
		if (!i)
			first = t;
		if (ended || !ok || i == k)
			break;
		sl->cache[base + 1 + i] = t; /* accepted: its keys/values are in the cache */
		accepted++;
	}
	*produced = MIN(i, k) + 1;
	if (e->spec)
		spec_verified(e->spec, (int)(sl - e->slots), k, accepted, *produced, first);
	return ended;
}

/* Pass p is through: its tokens join their slots' caches, and every sequence that got logits
 * (rows of e->logits in batch order) samples its next tokens. Entries of a sequence that ended
 * while the pass was in flight are dropped (the slot may hold another one by now). Returns the
 * tokens produced. */
static int pass_finish(eng_t *e, const pass_t *p, eng_done_t *done, int *n_done)
{
	int row = 0, hrow = 0, produced = 0, D = e->meta.dim;
	size_t nv = (size_t)e->meta.n_vocab;
	/* the decoding sequences' groups: their token and its draft, a row each */
	for (int j = 0; j < p->n_dec;) {
		slot_t *sl = &e->slots[p->slot[j]];
		int g = 1;
		while (j + g < p->n_dec && p->slot[j + g] == p->slot[j])
			g++;
		const float *rows = e->logits + (size_t)row * nv;
		row += g;
		int live = sl->gen == p->gen[j];
		j += g;
		if (!live)
			continue;
		sl->flying = 0;
		if (sl->state != SLOT_DECODE)
			continue;
		int made = 0;
		if (seq_verify(e, sl, rows, &made)) {
			int err = sl->res->finish == ENG_FINISH_ERROR ? SH_ENOMEM : 0;
			seq_end(e, sl, sl->res->finish);
			done[(*n_done)++] = (eng_done_t){(int)(sl - e->slots), err};
		}
		produced += made;
	}
	/* then the prompt chunks; a prompt's last token is sampled, an embedding pools the hidden
	 * states it asked for (rows of e->hidden in batch order) and ends after its last token */
	for (int j = p->n_dec; j < p->n; j++) {
		slot_t *sl = &e->slots[p->slot[j]];
		float *lg = p->out[j] == MODEL_OUT_LOGITS ? e->logits + (size_t)row++ * nv : NULL;
		float *h = p->out[j] == MODEL_OUT_EMBD ? e->hidden + (size_t)hrow++ * D : NULL;
		if (sl->gen != p->gen[j])
			continue;
		sl->flying = 0;
		if (sl->state == SLOT_FREE)
			continue;
		sl->cache[p->pos[j]] = p->tok[j];
		sl->n_cache = p->pos[j] + 1;
		if (sl->emb) {
			if (h)
				embed_pool_add(sl->emb, h, D, e->info.pooling, p->pos[j],
					       sl->n_prompt);
			if (sl->n_cache == sl->n_prompt) { /* the input is done: its embedding */
				embed_pool_finish(sl->emb, D, e->info.pooling, sl->n_prompt);
				sl->t1 = now_ns();
				sl->res->prompt_ms = (double)(sl->t1 - sl->t0) / 1e6;
				seq_end(e, sl, ENG_FINISH_STOP);
				done[(*n_done)++] = (eng_done_t){p->slot[j], 0};
			}
			continue;
		}
		if (!lg)
			continue;
		if (!sl->t1) { /* (a resumed sequence keeps its first prefill's) */
			sl->t1 = now_ns();
			sl->res->prompt_ms = (double)(sl->t1 - sl->t0) / 1e6;
		}
		sl->state = SLOT_DECODE;
		int t, ok;
		if (seq_sample(e, sl, lg, -1, NULL, &t, &ok)) {
			int err = sl->res->finish == ENG_FINISH_ERROR ? SH_ENOMEM : 0;
			seq_end(e, sl, sl->res->finish);
			done[(*n_done)++] = (eng_done_t){p->slot[j], err};
		}
		produced++;
	}
	return produced;
}

/* Pass p came back after pass_ms: samples it, and gives speculative decoding the pass's time
 * and what sampling its rows cost per token. */
static void pass_done(eng_t *e, const pass_t *p, double pass_ms, eng_done_t *done, int *n_done)
{
	int64_t t0 = now_ns();
	int produced = pass_finish(e, p, done, n_done);
	if (e->spec) {
		spec_step_timed(e->spec, p->n, pass_ms);
		spec_step_done(e->spec, (double)(now_ns() - t0) / 1e6, produced);
	}
}

static model_batch_t pass_batch(const eng_t *e, const pass_t *p)
{
	return (model_batch_t){p->n, p->tok, p->slot, p->pos, p->out, p->keep, e->hidden};
}

/* A pipeline's rank 0 with micro-batches in flight: while the ring has room and sequences are
 * ready, submit passes that share the ready sequences evenly among the room left (so that every
 * stage has a pass to work on), then take the oldest pass back and sample its sequences. A
 * sequence whose pass is in flight waits for it, so each still gets one token per pass of its
 * own (and its draft's, speculative decoding). */
static int ring_step(eng_t *e, eng_done_t *done, int *n_done)
{
	int rc;
	while (e->ring_n < e->ring_max) {
		int ready = 0, room = e->ring_max - e->ring_n;
		for (int i = 0; i < e->n_slots; i++)
			ready += e->slots[i].state != SLOT_FREE && !e->slots[i].flying;
		pass_t *p = &e->pass[(e->ring_head + e->ring_n) % e->ring_max];
		if (!ready || !pass_build(e, p, (ready + room - 1) / room))
			break;
		model_batch_t b = pass_batch(e, p);
		e->last_batch = p->n;
		p->t_sent = now_ns();
		if ((rc = dist_submit(e->dist, &b)))
			return step_fail(e, rc, done, n_done);
		e->ring_n++;
	}
	if (!e->ring_n)
		return 0;
	const pass_t *p = &e->pass[e->ring_head];
	model_batch_t b = pass_batch(e, p);
	if ((rc = dist_collect(e->dist, &b, e->logits)))
		return step_fail(e, rc, done, n_done);
	e->ring_head = (e->ring_head + 1) % e->ring_max;
	e->ring_n--;
	pass_done(e, p, (double)(now_ns() - p->t_sent) / 1e6, done, n_done);
	return 0;
}

int eng_step(eng_t *e, eng_done_t *done, int *n_done)
{
	*n_done = 0;
	if (e->ring_max > 1)
		return ring_step(e, done, n_done);
	if (!e->n_active)
		return 0;
	pass_t *p = &e->pass[0];
	pass_build(e, p, e->n_slots);
	model_batch_t b = pass_batch(e, p);
	int64_t t0 = now_ns();
	int rc = eng_forward(e, &b);
	e->last_batch = p->n;
	if (rc)
		return step_fail(e, rc, done, n_done);
	pass_done(e, p, (double)(now_ns() - t0) / 1e6, done, n_done);
	return 0;
}

void eng_spec_stats(const eng_t *e, eng_spec_stats_t *out)
{
	memset(out, 0, sizeof *out);
	if (e->spec)
		spec_stats(e->spec, out);
}

int eng_generate(eng_t *e, const int *prompt, int n_prompt, const eng_sampling_t *s,
		 eng_token_cb cb, void *ud, eng_result_t *res)
{
	int id = eng_seq_start(e, prompt, n_prompt, s, cb, ud, res);
	if (id == SH_EBUSY)
		return sh_fail(res->error, sizeof res->error, SH_EBUSY, "every slot is busy");
	if (id < 0)
		return id;
	for (;;) {
		int nd = 0;
		eng_step(e, e->gen_done, &nd);
		for (int i = 0; i < nd; i++)
			if (e->gen_done[i].id == id) {
				eng_seq_state_free(res->resume); /* (nowhere to go on) */
				res->resume = NULL;
				int rc = e->gen_done[i].rc;
				if (res->finish == ENG_FINISH_ERROR)
					return rc ? rc : SH_EIO;
				return 0;
			}
	}
}
