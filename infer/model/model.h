/*
 * model.h: the transformer forward pass over weights bound to a memory-mapped GGUF file
 * (internal to infer/; the engine and the tensor-parallel code in tp.c use it).
 *
 * A model_t holds pointers into the mapping (weights are never copied or expanded, except the
 * tiny norm and bias vectors, kept as F32), a KV cache for its context, and scratch buffers.
 * model_forward() appends tokens to the cache and returns the logits of the last one.
 *
 * Slots (continuous batching): the KV cache holds n_slots independent sequences of n_ctx
 * positions each. model_forward_batch() runs one batch whose tokens each name their own slot and
 * position (prefill chunks and decode tokens of several sequences mixed): every matrix sees the
 * B rows at once, attention runs per token over its own slot's positions. model_forward() is the
 * special case of one sequence in slot 0 at consecutive positions.
 *
 * Tensor-parallel seam: a model computes the slice of every layer given by its shard (query heads,
 * the KV heads they use, FFN columns; default: everything). Q/K/V/gate/up are read by output rows,
 * attn_output/ffn_down by input columns (each row's slice is a contiguous run of quant blocks);
 * after each of those two projections the partial sums go through the all-reduce hook (NULL on
 * one node), so every rank ends the layer with the full residual stream. Pipeline seam: a shard
 * may hold a contiguous range of layers; the pipe hook moves the hidden state between stages.
 *
 * Threads: one caller thread drives a model_t; the compute runs on the pool given at creation.
 */
#ifndef SHOAL_MODEL_H
#define SHOAL_MODEL_H

#include "infer/gguf.h"
#include "infer/model/meta.h"
#include "infer/pool.h"

#include <stddef.h>
#include <stdint.h>

typedef struct model model_t;

/* The part of each layer a rank computes. Head and column ranges must keep column slices of
 * attn_output / ffn_down on quant block boundaries (model_new checks). */
typedef struct model_shard {
	int q_head0, n_q_heads;   /* query heads [q_head0, q_head0 + n_q_heads) */
	int kv_head0, n_kv_heads; /* KV heads held in this rank's cache; must cover the groups of
				   * its query heads */
	int ffn0, n_ffn;          /* FFN hidden units [ffn0, ffn0 + n_ffn) */
	int layer0, layer1;       /* pipeline stage: layers [layer0, layer1); layer1 == 0 means
				   * every layer (so older initializers keep working) */
	/* mixture of experts: whole routed experts [exp0, exp0 + n_exp) (expert parallel) and the
	 * shared block's hidden units [shx0, shx0 + n_shx) (split like the dense FFN). Both
	 * {0, 0} mean everything (older initializers); a rank holding none has exp0 ==
	 * n_experts (shx0 == ffn_shexp) and a count of 0. */
	int exp0, n_exp;
	int shx0, n_shx;
} model_shard_t;

/* Sums x[n] over all ranks in place; returns 0 or a negative SH_E* code. */
typedef int (*model_allreduce_fn)(void *ctx, float *x, int n);

/* Streamed all-reduce (optional, tensor parallel): so that the sums' transfer overlaps the
 * matmul that produces them. For a one-token batch, begin(ctx, x, n) returns the number of
 * chunks to produce x[0..n) in (0: not this time, the all-reduce hook runs as usual; < 0: an
 * error); the model then, for c = 0.. that number - 1, computes x's rows [r0, r1) (from
 * chunk(ctx, c, ...): multiples of 16 but at the end) and calls push(ctx, c); then end(ctx)
 * leaves the sum in x. The sums must be the same bits as the plain hook's. */
typedef struct model_ar_stream {
	int (*begin)(void *ctx, float *x, int n);
	void (*chunk)(void *ctx, int c, int *r0, int *r1);
	int (*push)(void *ctx, int c);
	int (*end)(void *ctx);
} model_ar_stream_t;

/* Pipeline hook. dir 0 (in): a stage that does not start at layer 0 receives the hidden state
 * x[B][dim] before its first layer (instead of the embedding). dir 1 (out): called after the
 * stage's last layer when the shard is a partial range of layers; the stage sends x on, and the
 * stage that computes the head (logits != NULL) must leave the final hidden state of every token
 * of the batch in x[0..B) when it returns. Returns 0 or a negative SH_E* code. */
typedef int (*model_pipe_fn)(void *ctx, int dir, float *x, int B, int dim);

/* The whole model on one rank. */
void model_shard_full(const model_meta_t *meta, model_shard_t *s);

/* KV cache element types (quant.h type numbers): QT_F32, QT_F16 (the default: half the memory,
 * greedy output equal to F32 on the tested models) or QT_Q8_0 (head_dim a multiple of 32). */
#define MODEL_KV_DEFAULT 1 /* QT_F16 */
/* kv_type for model_new_slots that binds the weights only: no cache, nothing repacked (for
 * model_weight_ranges: which bytes of the file a shard reads). */
#define MODEL_KV_NONE (-1)

/* Binds the weights of g (borrowed: must outlive the model) and allocates a KV cache of n_ctx
 * positions of the default type. shard NULL = everything. pool borrowed. Returns 0 or SH_E* with
 * a reason. */
int model_new(model_t **out, const gguf_t *g, const model_meta_t *meta, const model_shard_t *shard,
	      int n_ctx, pool_t *pool, char *err, size_t errlen);
/* The same with the KV cache in kv_type (one of the types above; SH_EINVAL with a reason for any
 * other, or for Q8_0 when head_dim is not whole blocks). */
int model_new_kv(model_t **out, const gguf_t *g, const model_meta_t *meta,
		 const model_shard_t *shard, int n_ctx, int kv_type, pool_t *pool, char *err,
		 size_t errlen);
/* The one constructor: a KV cache of n_slots sequences of n_ctx positions each, in kv_type
 * (model_new: 1 slot, F16; model_new_kv: 1 slot). */
int model_new_slots(model_t **out, const gguf_t *g, const model_meta_t *meta,
		    const model_shard_t *shard, int n_ctx, int n_slots, int kv_type, pool_t *pool,
		    char *err, size_t errlen);
void model_free(model_t *m); /* NULL-safe */

/* Installs the all-reduce hook (fn NULL = single node). */
void model_set_allreduce(model_t *m, model_allreduce_fn fn, void *ctx);

/* Installs the streamed all-reduce (s NULL = none; copied; ctx is the all-reduce hook's). */
void model_set_allreduce_stream(model_t *m, const model_ar_stream_t *s);

/* Installs the pipeline hook (fn NULL = no pipeline). */
void model_set_pipe(model_t *m, model_pipe_fn fn, void *ctx);

/* Bytes of KV cache per position for a shard (NULL = whole model) with elements of kv_type, in
 * the layers that keep every position (all but the sliding-window ones; for sizing n_ctx before
 * model_new; 0 for a type the cache cannot hold). */
size_t model_kv_bytes_per_pos(const model_meta_t *meta, const model_shard_t *shard, int kv_type);
/* Bytes of one slot's KV cache at n_ctx positions for a shard (NULL = whole model): the above
 * times n_ctx plus the sliding-window layers' rings (swa.c; 0 for a type the cache cannot
 * hold). */
uint64_t model_kv_bytes(const model_meta_t *meta, const model_shard_t *shard, int kv_type,
			int n_ctx);
/* Bytes of KV cache a token at position pos reads (the layers that keep every position: pos + 1
 * positions; sliding-window layers: at most their window): decode's cache traffic. */
uint64_t model_kv_read_bytes(const model_meta_t *meta, const model_shard_t *shard, int kv_type,
			     int pos);
/* Positions a sliding-window layer keeps per slot and KV head at a context of n_ctx (its window
 * plus one internal batch, in whole attention tiles), or 0 when it keeps every position (no SWA
 * layer, or a context not longer than that). */
int model_swa_ring(const model_meta_t *meta, int n_ctx);
/* How much of slot's cached prefix a new sequence may keep when it shares its first k positions:
 * k when every sliding-window ring still holds the positions position k attends to, else 0
 * (the ring overwrote them: recompute from the start). k for a model without rings. */
int model_prefix_usable(const model_t *m, int slot, int k);
/* 0 when kv_type can hold this model's cache, else SH_EINVAL with a reason. */
int model_kv_type_check(const model_meta_t *meta, int kv_type, char *err, size_t errlen);

/* Runs tokens[0..n) at positions pos..pos+n-1 (pos + n <= n_ctx), filling the KV cache, and
 * writes the last token's logits (n_vocab floats) into logits (may be NULL to skip the head).
 * Returns 0, SH_EINVAL for a bad token id or position, or the all-reduce hook's error. */
int model_forward(model_t *m, const int *tokens, int n, int pos, float *logits);

#define MODEL_MAX_BATCH 64 /* tokens per internal pass; longer batches are split in order */

/* One batch: token i goes to slot[i] at position pos[i]. Within a slot, positions must be
 * consecutive and increasing in batch order, and the slot's earlier positions already computed
 * (attention of token i reads positions [0, pos[i]] of its slot). out[i] == MODEL_OUT_LOGITS
 * asks for token i's logits: they are written to logits in batch order (n_vocab floats each);
 * out[i] == MODEL_OUT_EMBD asks for its final hidden state after the output norm (what the head
 * would read, llama.cpp's t_embd), written to embd in batch order (dim floats each) and only
 * where embd is given (the rank that computes the head: it holds the whole residual stream).
 * out may be NULL (no outputs). Returns 0, SH_EINVAL for a bad id, slot or position, or a hook's
 * error. */
#define MODEL_OUT_LOGITS 1
#define MODEL_OUT_EMBD   2
typedef struct model_batch {
	int n;
	const int *tokens; /* [n] */
	const int *slot;   /* [n] 0 .. n_slots-1 */
	const int *pos;    /* [n] 0 .. n_ctx-1 */
	const int *out;    /* [n] or NULL: 0, MODEL_OUT_LOGITS or MODEL_OUT_EMBD */
	const int *keep;   /* [n] or NULL: keep[i] != 0 checkpoints the recurrent state after
			    * token i (see "Recurrent state" below; ignored without one) */
	float *embd;       /* [n_embd][dim] for the MODEL_OUT_EMBD tokens, or NULL */
} model_batch_t;
int model_forward_batch(model_t *m, const model_batch_t *b, float *logits);

/* The output head alone, of final hidden states (rows that went through every layer: a
 * pipeline's rank 0 gets them back from the last stage after a pass it ran with logits NULL):
 * out[n] are a batch's entries as in model_batch_t (NULL: n entries that all want logits) and
 * x holds the rows of those with out[i] != 0, in order. Logits of the MODEL_OUT_LOGITS rows go
 * to logits, the normed MODEL_OUT_EMBD rows to embd (each skipped when NULL), in order.
 * Returns 0 or SH_EINVAL. */
int model_head(model_t *m, const float *x, const int *out, int n, float *logits, float *embd);

/* ---- Recurrent state (hybrid models: qwen35's DeltaNet layers, deltanet.c) -----------------
 * Such a layer keeps per slot a state that only moves forward, instead of a KV cache holding
 * every position. A slot holds the state after its last rollback + 1 positions computed (a
 * ring: a speculative step that fed k + 1 tokens can take back up to `rollback` of them) and
 * up to MODEL_CHECKPOINTS states at positions a batch marked with keep (the oldest is
 * replaced). A batch may continue slot s at position p only when p == 0 (from scratch) or the
 * slot holds the state after p tokens; else the pass fails with SH_EINVAL. Continuing at p
 * forgets every state after p (it belonged to other tokens). Models without recurrent layers
 * accept any p (their KV cache is positional). The states follow the batches, so every rank of
 * a group holds the same positions. */
#define MODEL_CHECKPOINTS 2

/* The largest position <= limit at which slot can continue: limit itself for a model without
 * recurrent layers; else the latest held state <= limit, or 0. */
int model_seq_resume_pos(const model_t *m, int slot, int limit);
/* Keeps the states after the last depth + 1 positions of each slot (default 0: the last one).
 * Reallocates the state and forgets every slot's: call before the first pass (or when every
 * slot starts again). 0 or SH_ENOMEM / SH_EINVAL with a reason. */
int model_set_rollback(model_t *m, int depth, char *err, size_t errlen);
/* Bytes of recurrent state per slot on this rank (every buffer; 0 without such layers). */
uint64_t model_rs_bytes_per_slot(const model_t *m);
/* Key heads of a recurrent (DeltaNet) layer a rank holds: [k0, k1), its share of the query
 * heads scaled to the key heads, boundaries on multiples of unit (model_dn_head_unit: a run of
 * heads whose ssm_out columns are whole quant blocks). Its state is meta_dn_state_bytes(k1 - k0)
 * per buffer, and its DeltaNet matrices those heads' rows. Pure. */
void model_dn_heads(const model_meta_t *meta, const model_shard_t *sh, int unit, int *k0, int *k1);
int model_dn_head_unit(const model_meta_t *meta, const gguf_t *g);

int model_n_ctx(const model_t *m);
int model_n_slots(const model_t *m);

/* A byte range of the model file. */
typedef struct model_range {
	uint64_t off, len;
	int compact; /* 1: a column slice's row piece (kept in a sidecar, see gguf.h) */
} model_range_t;

/* Appends to *r (realloc'd, *n entries, caller frees) the byte ranges of the file (offsets from
 * its start) that this model's weight matrices read: the shard's rows and column slices, the
 * embedding, and the output head when with_head. Returns 0 or SH_ENOMEM. */
int model_weight_ranges(const model_t *m, const gguf_t *g, int with_head, model_range_t **r,
			int *n);

/* Weight bytes one decoded token reads (every matrix of the shard once, the head, one embedding
 * row): the numerator of the bandwidth figure in `shoal bench`. */
uint64_t model_bytes_per_token(const model_t *m);

#endif
