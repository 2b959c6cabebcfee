/*
 * tp.h: several ranks computing one model (internal to infer/; the engine and tests use it).
 *
 * A dist_t ties a model_t to a group of ranks (transport.h) and runs the lock-step protocol:
 * rank 0 drives; before every forward pass it broadcasts a STEP message (sequence number, flags,
 * position, tokens) and then computes its own part; every other rank waits in dist_serve() for
 * the next STEP and computes its part of the same pass. Within a pass the ranks meet in the
 * model's hooks: in tensor mode an all-reduce after attn_output and after ffn_down (the
 * transport sums in rank order on every rank, so every rank holds the same bits; the last one of
 * a batch is a reduce to rank 0, the only rank that needs the final residual); in pipeline
 * mode each stage receives the hidden state from the previous rank and sends it to the next,
 * and the last stage returns the rows that want logits to rank 0. Only rank 0 computes the
 * output head and samples (docs/parallel.md says why).
 *
 * Stages (hybrid plans, docs/view.md section 6): the ranks form stages in rank order, each a
 * tensor group over a contiguous range of layers; tensor mode is one stage of every rank,
 * pipeline mode a stage per rank. A stage's ranks all-reduce among themselves only (their last
 * sum goes to the stage's root, its lowest rank); the root sends the hidden state to every rank
 * of the next stage, and the last stage's root sends the rows that want logits to rank 0.
 * With several stages rank 0 may keep several passes (micro-batches of other sequences) in
 * flight round the ring (dist_submit / dist_collect): every rank runs the passes in the order
 * rank 0 sent them, so the stages work on different micro-batches at the same time.
 *
 * Messages (payloads of transport broadcasts from rank 0; docs/parallel.md has the layouts).
 * Numbers are in the lock-step range 0x0200-0x02ff of docs/protocol.md and never reused.
 *
 * Invariant: every rank has run exactly the steps rank 0 sent, in order (the sequence number
 * is checked), so every rank's KV cache holds the same positions. After any failure the group
 * is broken: every later call fails with the first error (form a new group to go on).
 *
 * Threads: a dist_t is driven by one thread (the engine's generate thread on rank 0, the
 * worker loop elsewhere), the same one that drives its model.
 */
#ifndef SHOAL_INFER_TP_H
#define SHOAL_INFER_TP_H

#include "infer/model/meta.h"
#include "infer/model/model.h"
#include "transport/transport.h"

#include <stddef.h>
#include <stdint.h>

#define DIST_VERSION       3  /* 2: SETUP shares carry expert ranges; 3: and the stage */
#define DIST_HDR_BYTES     64 /* SETUP and STEP are this size on the wire */
#define DIST_INLINE_TOKENS 9  /* a STEP carries up to this many tokens itself (28 + 36 = 64) */

enum dist_msg {
	DIST_MSG_SETUP = 0x0200, /* rank 0 -> all: version, context, model shape, strategy */
	DIST_MSG_STEP = 0x0201,  /* rank 0 -> all: one forward pass */
	DIST_MSG_STOP = 0x0202,  /* rank 0 -> all: leave the worker loop */
	DIST_MSG_SHARE = 0x0203, /* all <-> all (all-gather): status and share ranges */
	DIST_MSG_BATCH = 0x0204, /* rank 0 -> all: one forward pass of a multi-sequence batch */
};

#define DIST_BATCH_ENTRY  16 /* bytes per token of a BATCH: token, slot, position, flags (u32) */
#define DIST_INLINE_BATCH 2  /* a BATCH carries up to this many entries itself (28 + 32 <= 64) */
#define DIST_ENTRY_OUT    1u /* entry flag: rank 0 wants this token's logits */
#define DIST_ENTRY_KEEP   2u /* entry flag: checkpoint the recurrent state after it (model.h) */

#define DIST_STEP_NEW_REQUEST 1u        /* first pass of a request (prefill); informative */
#define DIST_MAX_STEP_TOKENS  (1 << 24) /* more tokens in one STEP is a protocol error */

/* A decoded STEP, BATCH or STOP. */
typedef struct dist_step {
	uint32_t type; /* DIST_MSG_STEP, DIST_MSG_BATCH or DIST_MSG_STOP */
	uint64_t seq;
	uint32_t flags;
	int pos, n; /* first position (STEP), token count (1..DIST_MAX_STEP_TOKENS; 0 for STOP) */
	int inline_tokens[DIST_INLINE_TOKENS]; /* STEP: the first min(n, 9) ids */
	uint8_t inline_batch[DIST_INLINE_BATCH * DIST_BATCH_ENTRY]; /* BATCH: entries when n <= 2 */
} dist_step_t;

/* Decodes a STEP/BATCH/STOP message of len bytes (pure; the worker loop and the fuzz target).
 * Returns 0, SH_EUNSUPP (another version) or SH_EFORMAT (wrong size, type or counts). Token ids
 * are checked against the vocabulary by the forward pass. */
int dist_step_decode(const uint8_t *h, size_t len, dist_step_t *s, char *err, size_t errlen);

typedef struct dist dist_t;

typedef struct dist_stats {
	uint64_t steps;      /* forward passes */
	uint64_t tokens;     /* tokens in those passes */
	uint64_t bytes_sent; /* payload bytes this rank sent through the group */
	double comm_ms;      /* wall time inside collectives (step message, all-reduce, pipe) */
	double step_ms;      /* wall time of the passes (compute + communication) */
	double comm_min_ms;  /* smallest communication time of one decode pass (1 token): close
				to the pure network cost, without waiting for a slower rank */
	int in_flight_max;   /* rank 0: most passes in flight at once (dist_submit) */
} dist_stats_t;

/* Splits the model over `world` ranks in proportion to weights (NULL = even) as the planner does:
 * tensor mode splits KV-head groups when world <= n_kv_heads, else query heads with their KV
 * heads replicated; FFN columns in multiples of ffn_block; pipeline mode splits layers. Every
 * rank gets at least one unit. out has world entries. Returns 0 or SH_EINVAL with a reason. */
int dist_split(const model_meta_t *meta, int ffn_block, int pipeline, int world, const int *weights,
	       model_shard_t *out, char *err, size_t errlen);

/* The parts a model is cut into over ranks, by what each tensor is split along (dist_split's
 * units). The planner sizes a rank's share by them (eng_model_shape, agent/planio.c), so its
 * figures are what the engine maps; the model binds each tensor along the same axis. */
typedef enum dist_part {
	DIST_PART_REPLICATED, /* norms, biases, routers, MLA's compressions: whole on every rank */
	DIST_PART_Q_HEADS,  /* attn_q, attn_output, MLA's per-head matrices: with the query heads */
	DIST_PART_KV_HEADS, /* attn_k, attn_v: with the KV heads */
	DIST_PART_FFN,      /* the dense FFN: by columns, in blocks of dist_ffn_block */
	DIST_PART_EXPERTS,  /* routed experts: whole */
	DIST_PART_SHEXP,    /* the shared expert: by columns, like the FFN */
	DIST_PART_RECURRENT, /* qwen35's DeltaNet matrices (attn_qkv, attn_gate, ssm_alpha,
			      * ssm_beta, ssm_out): with the key heads (deltanet.c) */
	DIST_PART_EMBD,      /* token_embd */
	DIST_PART_OUTPUT,    /* output, output_norm: rank 0's head */
	DIST_PART_COUNT
} dist_part_t;

/* The part a tensor (by its GGUF name) belongs to. Pure. */
dist_part_t dist_tensor_part(const char *name);

/* Elements per block of the FFN column split: the largest block of the FFN down projections'
 * types (dense and shared expert: their rows run along the FFN dimension), at least 32. */
int dist_ffn_block(const gguf_t *g);

/* Weights (world entries) that even out the work when rank 0 also computes the output head:
 * rank 0's share of the layers is smaller by the head's bytes (at least a quarter of the
 * others'). What dist_split gets when the user gave no shares. */
void dist_even_weights(const gguf_t *g, int world, int *w);

/* g borrowed (must outlive the dist). step_timeout_ms bounds every wait inside a pass. */
int dist_new(dist_t **out, tp_group_t *g, int pipeline, int step_timeout_ms);
void dist_free(dist_t *d); /* NULL-safe; does not stop the workers (see dist_stop) */

int dist_rank(const dist_t *d);
int dist_world(const dist_t *d);

/* Collective: agrees on the context length and the KV slot count (rank 0's *ctx and *slots
 * win; others receive them; slots may be NULL for 1), checks that
 * every rank loaded the same model (shape and fingerprint fp) and protocol version, and that the
 * shares of all ranks cover the model exactly once. Call on every rank before model_new. */
int dist_setup(dist_t *d, const model_meta_t *meta, uint64_t fp, const model_shard_t *mine,
	       int *ctx, int *slots, char *err, size_t errlen);

/* Rank 0, before dist_setup: the recurrent-state rollback depth every rank's model keeps
 * (model_set_rollback); after dist_setup, dist_rollback gives rank 0's on every rank. */
void dist_set_rollback(dist_t *d, int depth);
int dist_rollback(const dist_t *d);

/* A fingerprint of a model file (tensor names, types, shapes, sizes, the first and last 32 bytes
 * of each tensor): ranks whose files differ fail the setup instead of computing garbage. Reads one
 * or two pages per tensor. */
uint64_t dist_model_fingerprint(const gguf_t *g);

/* Before dist_setup: this rank's stage is ranks [stage0, stage1) (planner.h's plan_rank_t: the
 * stages tile the ranks in order, each holds a range of layers, and its ranks' shares split
 * those layers as a tensor group's). stage0 == stage1 (the default): the mode's layout, one
 * stage of every rank (tensor) or a stage per rank (pipeline). dist_setup checks that every
 * rank agrees and that the shares cover the model. */
void dist_set_stage(dist_t *d, int stage0, int stage1);
/* After dist_setup: the number of stages (1: tensor; the world: pipeline). */
int dist_n_stages(const dist_t *d);

/* Installs the model's hooks (all-reduce and/or pipe). m borrowed; detach by freeing both. */
void dist_attach(dist_t *d, model_t *m);

/* Rank 0: one lock-step forward pass (as model_forward), logits on rank 0 only. Returns 0 or
 * an error (then dist_error says which rank and why). */
int dist_forward(dist_t *d, const int *tokens, int n, int pos, unsigned flags, float *logits);

/* Rank 0: one lock-step pass of a multi-sequence batch (as model_forward_batch); the workers
 * get the batch's composition (token, slot, position of every entry) in a BATCH message. With
 * several stages: dist_submit then dist_collect. */
int dist_forward_batch(dist_t *d, const model_batch_t *b, float *logits);

/* Rank 0 of a group of several stages: micro-batches in flight. dist_submit sends the BATCH,
 * runs stage 0's share of b (its hidden state goes on to stage 1) and returns without waiting
 * for the rest of the ring; dist_collect waits for the oldest submitted pass's rows from the
 * last stage and writes the logits of its out rows (in batch order, as model_forward_batch;
 * logits may be NULL when it has none or they are not wanted); b is that pass's batch as
 * submitted, whose out and embd say which rows are hidden states for embd (model_head; NULL:
 * every row wants logits). Passes come back in the order
 * submitted. Every rank's caches follow the passes in that order, so a pass may hold a slot
 * whose earlier pass is still in flight. Keep the hidden states in flight below what the
 * sockets buffer (a few MB: tp_group_send_msg). Both return 0 or an error (dist_error). */
int dist_submit(dist_t *d, const model_batch_t *b);
int dist_collect(dist_t *d, const model_batch_t *b, float *logits);
/* Passes submitted and not yet collected. */
int dist_in_flight(const dist_t *d);

/* Ranks > 0: runs the passes rank 0 sends until STOP (returns 0) or a failure (error, message in
 * err). Waits for the next step without a time limit (a lost rank 0 closes the connection). */
int dist_serve(dist_t *d, char *err, size_t errlen);

/* Rank 0: tells the workers to leave dist_serve (best effort, bounded by the step timeout). */
int dist_stop(dist_t *d);

/* The first failure's message ("" when none). */
const char *dist_error(const dist_t *d);

void dist_get_stats(const dist_t *d, dist_stats_t *s);
/* A worker rank's figures as of its last pass, from any thread (bytes_sent not included): what
 * the agent reports to the leader's dashboard while dist_serve runs. */
void dist_get_stats_shared(dist_t *d, dist_stats_t *s);

#endif
