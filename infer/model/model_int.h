/*
 * model_int.h: the model's internals shared by the files of infer/model/ (never included from
 * outside it): the weight-matrix view, the layer and model structs, and the verbs forward() uses.
 *
 * Split by concept: model.c binds the weights and holds forward(); matmul.c is the one place that
 * chooses a matrix kernel; attn.c is attention over the KV cache. A new architecture's block
 * (experts, latent attention: mla.c) gets its own file here and is called from the one
 * forward().
 *
 * Threads: as model.h: one caller thread drives a model_t; the verbs below dispatch on its pool.
 */
#ifndef SHOAL_MODEL_INT_H
#define SHOAL_MODEL_INT_H

#include "infer/model/model.h"
#include "infer/quant/quant.h"
#include "infer/quant/repack.h"

#include <stddef.h>
#include <stdint.h>

#define MV_CHUNK  16 /* rows per batched matvec step (stay in L1/L2 across the batch) */
#define MAX_MULTI 3  /* matrices sharing one input in one pool dispatch (Q,K,V / gate,up) */
#define ATT_TILE  64 /* cache positions per attention tile (attn.c) */
#define ATT_GROUP 64 /* query heads per KV head at most */
#define ATT_QB    16 /* tokens per attention work item (they share each converted tile) */

typedef struct wmat {
	const uint8_t *data; /* rows x cols of `type`, row-major, row_bytes apart */
	int type, rows, cols;
	size_t row_bytes;
	const quant_ops_t *ops;
	quant_dequant_fn dequant;
	const uint8_t *src; /* where row 0 of this view lies in the mapping (data, unless a column
			     * slice was copied out), rows src_stride apart: the bytes of the file
			     * this view reads (model_weight_ranges) */
	size_t src_stride;
	/* Optional interleaved copy (wmat_repack): rows [0, 16 * rp_groups) in the R16 layout of
	 * repack.h, used while data == rp_of and rows >= 16 * rp_groups (a view made by copying
	 * the struct and moving data or rows falls back to the rows above by itself; mat_rows
	 * carries the copy along when the view starts on a group). */
	const uint8_t *rp, *rp_of;
	int rp_groups;
	int rp_min_b; /* batches smaller than this keep the original rows (their kernel is faster)
		       */
	quant_gemm_fn gemm;
	uint8_t *rp_own; /* what to unmap (wmat_release) */
	size_t rp_bytes; /* its size */
} wmat_t;

typedef struct moe_layer moe_layer_t;     /* moe.c: a layer's experts */
typedef struct dn_state dn_state_t;       /* deltanet.c: recurrent state and scratch */
#define DN_MAX_GROUPS 16                  /* value heads per key head (qwen35: 1 to 4) */
typedef struct moe_scratch moe_scratch_t; /* moe.c: the MoE block's buffers */

/* One layer's part of the KV cache. npos is a multiple of ATT_TILE, so a tile of positions
 * [t0, t0 + ATT_TILE) with t0 a multiple of ATT_TILE is contiguous also in a ring. */
typedef struct kv_layer {
	size_t off; /* byte offset of the layer's rows in kc and vc */
	int npos;   /* rows per (slot, head): kv_npos, or the ring of a sliding-window layer */
	int win;    /* sliding window (a query at p sees p0 > p - win); 0 = all earlier positions */
	int layer;  /* the model layer it belongs to */
} kv_layer_t;

typedef struct layer {
	float *attn_norm;            /* [dim] */
	wmat_t wq;                   /* [n_heads*head_dim x dim] */
	wmat_t wk, wv;               /* [n_kv_heads*head_dim x dim] */
	wmat_t wo;                   /* [dim x n_heads*head_dim] */
	float *bq, *bk, *bv;         /* qwen2: [q_dim], [kv_dim], [kv_dim] (this shard's rows) */
	float *q_norm, *k_norm;      /* qwen3: [head_dim] */
	float *sinks;                /* gpt-oss: [n_q_heads] the shard's heads' sink logits */
	float *bo;                   /* gpt-oss: [dim] attn_output.bias (added after the sum) */
	float *ffn_norm;             /* [dim] (glm4moe, gpt-oss: the file's post_attention_norm) */
	float *post_attn, *post_ffn; /* gemma3: [dim] norms of the attention and FFN outputs */
	wmat_t w_gate, w_up;         /* [ffn x dim] */
	wmat_t w_down;               /* [dim x ffn] */
	uint8_t *wo_own, *down_own;  /* private copies of partial column slices (NULL: mapped) */
	moe_layer_t *moe;            /* experts instead of w_gate/w_up/w_down (NULL: dense) */
	struct mla_layer *mla;       /* deepseek2: latent attention's weights (mla.c), else NULL */
	struct dn_layer *dn; /* qwen35: a DeltaNet layer's weights (deltanet.c), else NULL */
	int q_gated;         /* qwen35: wq rows are [query | gate] per head (2 x qd) */
	int kv_lc;           /* this layer's index in the KV cache (attention layers) */
} layer_t;

struct model {
	model_meta_t meta;
	const gguf_t *g; /* the file (borrowed), for gguf_at when copying column slices */
	model_shard_t sh;
	pool_t *pool;
	int n_ctx;
	int qd, kvd;     /* this shard's q and kv widths: n_q_heads*hd, n_kv_heads*hd */
	wmat_t embd;     /* [n_vocab x dim] */
	wmat_t out;      /* [n_vocab x dim] (= embd when tied) */
	float *out_norm; /* [dim] */
	layer_t *layers; /* [n_layers] (only the shard's layer range is bound) */
	float *inv_freq; /* [rope_dim/2] */
	float *rope_cs;  /* [max_b][rope_dim/2][2]: cos, sin of this pass's token b (rope_table) */
	float rope_mag;  /* cos and sin are times this (YaRN's magnitude; 1 without) */
	float *inv_freq_swa,
	    *rope_cs_swa; /* the same for the sliding-window layers (their own
			   * base and scale), NULL when they rotate like the rest */
	int n_slots;      /* sequences with their own KV range (model_new_slots) */
	/* KV cache: per layer [n_slots][sh.n_kv_heads][kvl[lc].npos] rows of head_dim elements of
	 * kv_type, kv_hrow bytes each (kv_at), the layers one after another. Head-major: one head's
	 * attention reads its rows contiguously. With an element type (F16, F32: kt_tiled) K is
	 * stored as tiles of ATT_TILE positions already transposed, [head_dim][ATT_TILE] (kv_k_at):
	 * the scores kernel reads K that way, and transposing each tile on every read had been most
	 * of attention's cost (a 16x16 register transpose per 256 elements). V stays row-major. */
	uint8_t *kc, *vc;
	int kv_type;
	size_t kv_hrow;
	int kv_npos;               /* positions per head: n_ctx rounded up to whole tiles */
	kv_layer_t *kvl;           /* [layer1 - layer0]: where each layer's rows are (kv_at) */
	int ring;                  /* positions a sliding-window layer keeps (a ring: position p in
				    * row p % ring), 0 when they keep every position (swa.c) */
	int *ring_lo;              /* [n_slots]: the oldest position every ring still holds */
	int kt_tiled;              /* K stored as transposed tiles */
	const quant_ops_t *kv_ops; /* the cache type's kernels (dequantize) */
	/* scratch for a batch of up to max_b tokens */
	int max_b;
	const int *bslot, *bpos; /* [B] slot and position of each token of the batch in progress */
	float *x, *xb, *xb2;     /* [max_b][dim] */
	float *q, *k, *v;        /* [max_b][qd], [max_b][kvd] x2 */
	float *att;              /* [max_b][qd] */
	float *hb, *hb2;         /* [max_b][n_ffn] */
	float *scores;           /* [threads][n_ctx] */
	float *att_tiles;        /* [threads][2][ATT_TILE * head_dim]: a K tile (F32, transposed:
				  * [head_dim][ATT_TILE]) and a V tile (F32, [ATT_TILE][head_dim]) */
	uint8_t *act;            /* prepared activations, [max_b][act_stride] */
	size_t act_stride;
	model_allreduce_fn ar;
	void *ar_ctx;
	model_ar_stream_t ars; /* begin NULL: none */
	model_pipe_fn pipe;
	void *pipe_ctx;
	int attn_ref;           /* tests: 1 = forward() uses attention_ref() */
	quant_qkt_fn qkt;       /* attention scores against a transposed K tile */
	quant_av_fn av;         /* weighted sums of a V tile */
	quant_expsum_fn expsum; /* softmax numerators */
	const quant_ops_t *f32; /* F32 matvec and weighted sum: latent attention's scores (mla.c) */
	quant_wsum_fn wsum;
	moe_scratch_t *moe;    /* NULL for a dense model */
	struct mla_state *mla; /* deepseek2: latent cache, YaRN tables, scratch (mla.c) */
	dn_state_t *dn;        /* qwen35: recurrent state per slot, scratch (deltanet.c) */
	int n_kv_layers;       /* layers of the shard with a KV cache (all but DeltaNet ones) */
	float *qfull;          /* qwen35: [max_b][2 qd] gated query rows before the split */
	float *qgate;          /* qwen35: [max_b][qd] the attention output's gate */
};

/* ---- matmul.c ---------------------------------------------------------------------------- */

/* Makes the interleaved copy of w when its type has a fast tiled kernel on this CPU (and
 * SHOAL_NO_REPACK is unset), the rearranging split over the pool. With release, the pages of
 * the original rows are then dropped from this process (the file and its mapping are never
 * written; a later read of them faults them back in). Otherwise, with release, a matrix of 2 MiB
 * and more is copied as it is into huge pages (w->data then points at the copy, which w owns
 * as rp_own: wmat_release frees it). Returns 0 (also when nothing was done) or SH_ENOMEM. */
int wmat_repack(model_t *m, wmat_t *w, int release);
/* wmat_repack for a matrix that may be a private column slice (*own, malloc'd, or NULL: rows of
 * the file, released). A slice wholly repacked is freed and *own set to NULL: nothing reads its
 * rows any more. 0 or SH_ENOMEM. */
int wmat_repack_own(model_t *m, wmat_t *w, uint8_t **own);
void wmat_release(wmat_t *w); /* frees the interleaved copy; NULL-safe fields */

/* out[b][r] = W[r, :] . x[b][:] for B inputs (B <= the model's max batch). */
void matmul(model_t *m, const wmat_t *w, float *out, const float *x, int B);
/* One input (B = 1): out[r] for rows r0 <= r < r1 only (r0 a multiple of 16: repacked matrices
 * keep their tiled kernel), the same bits as matmul's. */
void matmul_rows(model_t *m, const wmat_t *w, float *out, const float *x, int r0, int r1);
/* Several matrices (n <= MAX_MULTI) over the same input x[B][cols] (Q, K, V or gate, up): one
 * pool dispatch when their types and widths agree. */
void matmul_same_input(model_t *m, int n, const wmat_t **w, float **out, const float *x, int B);
/* One token, an input per matrix (a MoE layer's chosen experts and shared block): out[k][r] =
 * W_k[r, :] . x[k][:] for the n matrices (any types and widths) in one pool dispatch (per 32
 * matrices), each out[k] the same bits as matmul(m, w[k], out[k], x[k], 1). An input is prepared
 * once per weight type and width (by pointer: the same x for gate and up) into act, caller-owned
 * scratch of n x m->act_stride bytes. */
void matmul_each(model_t *m, int n, const wmat_t **w, float **out, const float **x, uint8_t *act);
/* The same with inputs the caller prepared (quant_act_prepare for each matrix's type and width):
 * matrix k over its nb[k] <= 8 inputs xa[k][0..nb[k]), out[k] [nb[k]][rows], each output the
 * bits matmul gives that input in any batch (a few sequences' tokens grouped by expert). */
void matmul_each_acts(model_t *m, int n, const wmat_t **w, float **out, const int *nb,
		      const quant_act_t *const *xa);

/* ---- attn.c ------------------------------------------------------------------------------ */

/* att[b] = softmax(q[b] . K^T / sqrt(hd)) V over positions [0, bpos[b]] of slot bslot[b], for
 * each of the B tokens and each of the shard's query heads, reading layer lc of the KV cache: one
 * pass over the positions in tiles with a running max and sum (online softmax), the full score
 * row is never stored. */
void attention(model_t *m, int lc, int B);
/* The same computed plainly (whole score row, reference dequantize, scalar loops): the test
 * oracle for attention(). */
void attention_ref(model_t *m, int lc, int B);
/* Stores k[kvd], v[kvd] (F32; the local KV heads one after another) as position pos of slot in
 * layer lc of the cache, in its type. */
void attn_cache_put(model_t *m, int lc, int slot, int pos, const float *k, const float *v);

/* Byte offset of local KV head h's row at position pos of slot in layer lc of the KV cache (kc
 * and vc alike); the head's next position is kv_hrow bytes on. */
static inline size_t kv_at(const model_t *m, int lc, int slot, int h, int pos)
{
	const kv_layer_t *k = &m->kvl[lc];
	size_t head = (size_t)slot * (size_t)m->sh.n_kv_heads + (size_t)h;
	return k->off + (head * (size_t)k->npos + (size_t)(pos % k->npos)) * m->kv_hrow;
}

/* Byte offset of element d of K at position pos when K is tiled (kt_tiled): within the tile of
 * pos, row d holds the tile's ATT_TILE positions. */
static inline size_t kv_k_at(const model_t *m, int lc, int slot, int h, int pos, int d)
{
	size_t es = m->kv_hrow / (size_t)m->meta.head_dim; /* element bytes */
	return kv_at(m, lc, slot, h, pos - pos % ATT_TILE) +
	       ((size_t)d * ATT_TILE + (size_t)(pos % ATT_TILE)) * es;
}

/* ---- swa.c: sliding-window layers' KV rings ------------------------------------------------ */

/* Lays out the KV cache (m->kvl, m->ring, m->ring_lo) for the shard's layers, n_ctx and n_slots
 * already set in m; *rows = the rows of kc (and of vc) to allocate. Returns 0 or SH_ENOMEM. */
int swa_layout(model_t *m, size_t *rows);
void swa_free(model_t *m);
/* Records that the batch wrote position pos of slot (call in batch order): what the rings
 * hold. */
void swa_note(model_t *m, int slot, int pos);

/* ---- moe.c ------------------------------------------------------------------------------- */

/* One token's routing: probabilities from the router logits (softmax, or sigmoid), the top k by
 * probability + bias (bias NULL = none; it only steers the choice), weights = the unbiased
 * probabilities of the chosen, renormalised to sum 1 when norm (sum floored at 2^-14 as
 * llama.cpp does), times scale. */
typedef struct moe_route {
	int n_experts, k, gating, norm; /* gating: enum meta_gating */
	float scale;
	const float *bias;         /* [n_experts] or NULL */
	int n_groups, groups_used; /* > 1 groups: choose only within the groups_used groups whose
				      two best biased scores sum highest (DeepSeek-V3); 0 = none */
} moe_route_t;
/* sel[k] = chosen experts (by falling biased probability), w[k] = their weights. */
void moe_route(const moe_route_t *r, const float *logits, int *sel, float *w);

/* Binds layer l's router, this shard's experts (pages of the others released) and its slice of
 * the shared block. */
int moe_layer_new(model_t *m, const gguf_t *g, int l, moe_layer_t **out, char *err, size_t errlen);
void moe_layer_free(moe_layer_t *ml); /* NULL-safe */
/* The interleaved copies of this rank's experts and shared block (wmat_repack: the tiled
 * kernels, decode included, for every matrix the type has one for). 0 or SH_ENOMEM. */
int moe_repack(model_t *m, moe_layer_t *ml);
/* out[0..2] = the shared block's gate, up and down as this rank holds them, or NULL each when
 * it holds none (tests look at their copies). */
void moe_shared_mats(const moe_layer_t *ml, const wmat_t *out[3]);
int moe_scratch_new(model_t *m); /* after m->max_b is set; SH_ENOMEM */
void moe_scratch_free(moe_scratch_t *s);
/* m->xb2[B][dim] = this rank's part of the MoE FFN of m->xb[B][dim] (its experts' weighted
 * outputs + its slice of the shared block): summed over ranks it is the whole block. */
void moe_ffn(model_t *m, const moe_layer_t *ml, int B);
/* Expected weight bytes one decoded token reads in ml on this rank (router, shared slice,
 * experts used / experts of the held experts). */
uint64_t moe_bytes_per_token(const model_t *m, const moe_layer_t *ml);
/* Appends the file ranges ml reads on this rank (router, shared gate, held experts, the
 * shared slice) for model_weight_ranges. Returns 0 or SH_ENOMEM. */
int moe_weight_ranges(const model_t *m, const moe_layer_t *ml, const uint8_t *base,
		      model_range_t **r, int *n);
/* Test hook: when set, moe_ffn writes the last token's choices of each layer l to
 * trace[l * n_experts_used + i] (NULL: off). */
void moe_set_trace(model_t *m, int *trace);

/* ---- mla.c: deepseek2's Multi-head Latent Attention --------------------------------------- */

/* Binds layer l's MLA weights for the shard's heads, and L->wo (attn_output by input columns). */
int mla_bind(model_t *m, const gguf_t *g, int l, char *err, size_t errlen);
/* The latent cache, rope tables and scratch; after the layers are bound and the scratch made. */
int mla_new(model_t *m, char *err, size_t errlen);
void mla_free(model_t *m); /* frees the state and every layer's MLA weights; NULL-safe parts */
/* att[B][n_q_heads*v_head] from xb[B][dim] for the batch's tokens (slot bslot[b], position
 * bpos[b]), writing their latents to layer lc of the latent cache first. */
void mla_attention(model_t *m, layer_t *L, int lc, int B);
size_t mla_kv_bytes_per_pos(const model_meta_t *meta, int n_layers);
uint64_t mla_layer_bytes(const layer_t *L); /* weight bytes one token reads (0 without MLA) */
/* Appends the file ranges layer L's MLA matrices read (model_weight_ranges; base: the mapping's
 * first byte). Returns 0 or SH_ENOMEM. */
int mla_weight_ranges(const layer_t *L, const uint8_t *base, model_range_t **r, int *n);

/* ---- deltanet.c: qwen35's Gated DeltaNet layers ------------------------------------------ */

/* The rank's head range and shapes (m->sh, m->meta set): before binding the layers. */
int deltanet_init(model_t *m, char *err, size_t errlen);
/* Binds layer l's DeltaNet weights for the rank's heads (L->dn). */
int deltanet_bind(model_t *m, const gguf_t *g, int l, char *err, size_t errlen);
/* The interleaved copies of its matrices (matmul.c's wmat_repack). SH_ENOMEM. */
int deltanet_repack(model_t *m, layer_t *L);
void deltanet_layer_free(layer_t *L); /* NULL-safe */
/* (Re)allocates the state (n_ring + MODEL_CHECKPOINTS buffers per slot and layer, every tag
 * empty) and, once, the scratch; after the layers are bound and m->max_b is set. */
int deltanet_alloc(model_t *m, int n_ring, char *err, size_t errlen);
void deltanet_free(model_t *m); /* the state and scratch; NULL-safe */
/* Bytes of state per slot on this rank (every buffer of every recurrent layer held). */
uint64_t deltanet_slot_bytes(const model_t *m);
/* Weight bytes one token reads in layer L (0 without DeltaNet), with its state's read and
 * write. */
uint64_t deltanet_layer_bytes(const model_t *m, const layer_t *L);
int deltanet_weight_ranges(const layer_t *L, const uint8_t *base, model_range_t **r, int *n);
/* Before a pass of B tokens: checks that every slot continues at a position whose state is
 * held (SH_EINVAL otherwise), restores checkpoints, starts fresh slots from zeros, and decides
 * which buffer each token reads and writes. */
int deltanet_plan(model_t *m, const int *slot, const int *pos, const int *keep, int B);
/* After the pass succeeded: the written buffers' tags. */
void deltanet_commit(model_t *m, const int *pos);
/* xb2[B][D] = this rank's part of DeltaNet layer L's output for the normed xb[B][D]. */
void deltanet_forward(model_t *m, layer_t *L, int B);
/* The largest position <= limit at which slot sl can continue (0: from the start). */
int deltanet_resume_pos(const model_t *m, int sl, int limit);

/* ---- model.c: binding helpers (shared with mla.c) ------------------------------------------ */

/* w = tensor name of g (borrowed view into the mapping; rows = ne[1]). */
int bind_mat(model_t *m, const gguf_t *g, const char *name, wmat_t *w, char *err, size_t errlen);
/* *out = a malloc'd F32 copy of elements [off, off+n) of vector tensor name. */
int bind_vec(const gguf_t *g, const char *name, int off, int n, float **out, char *err,
	     size_t errlen);
/* Rows [r0, r0+n) of w. */
wmat_t mat_rows(wmat_t w, int r0, int n);
/* Appends the file ranges w reads (its rows at w->src) to *r. */
int mat_ranges(const wmat_t *w, const uint8_t *base, model_range_t **r, int *n);
/* Input columns [c0, c0+n) of w, copied into *own when partial (freed by the caller; read
 * through gguf_copy so a slice node's sidecar serves them). */
int mat_cols(const gguf_t *g, wmat_t *w, int c0, int n, uint8_t **own, const char *name, char *err,
	     size_t errlen);
int range_push(model_range_t **r, int *n, uint64_t off, uint64_t len, int compact);

/* ---- gemma3.c: Gemma 3's pieces of the forward pass ---------------------------------------- */

/* h[i] = gelu(h[i]) * up[i] for i < n, GELU in its tanh form as ggml's CPU backend computes it
 * (through an F16 table). */
void gelu_gate(float *h, const float *up, int n);

/* ---- model.c: small kernels ------------------------------------------------------------- */

void rmsnorm(float *o, const float *x, const float *w, int n, float eps);
/* inv_freq[rope_dim/2] for base with frequency scale fs (1 / the linear or YaRN factor; 1 =
 * none), YaRN's ramp between scaled and unscaled frequencies when yarn (ggml's rope_yarn, the
 * correction dims from rope_orig_ctx). rope_yarn_mag: YaRN's cos/sin magnitude as llama.cpp
 * sets it up for an architecture other than deepseek2. */
void rope_freqs(const model_meta_t *mt, float base, float fs, int yarn, float *inv_freq);
float rope_yarn_mag(const model_meta_t *mt);
/* cos and sin of every RoPE angle of the B tokens at pos[] (once per pass: every head of every
 * layer rotates by the same angles). */
void rope_table(model_t *m, const int *pos, int B);
/* Rotates one head vector h[head_dim] by token b's angles (rope_table). */
void rope(const model_t *m, float *h, int b);
/* The same with a sliding-window layer's angles when swa (Gemma 3's local RoPE base). */
void rope_layer(const model_t *m, float *h, int b, int swa);

#endif
