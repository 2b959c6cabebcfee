/*
 * spec.h: speculative decoding's drafts and the controller that sizes them (internal to infer/;
 * the engine calls it, docs/speculative.md says why it is built this way).
 *
 * Each step, for every decoding sequence, the engine asks for a draft of k tokens that probably
 * follow its context: from prompt lookup (the latest earlier occurrence of the context's last
 * 4, 3 or 2 tokens, and what followed it: no model, no cost) or from a draft model (a small GGUF
 * with the target's vocabulary, run on this node alone with a KV slot per target slot, kept in
 * step with the target's accepted tokens by their longest common prefix). The engine then
 * verifies the k + 1 positions in the step's one batch (every rank computes them as any batch)
 * and reports how many were accepted.
 *
 * k is chosen per sequence and step to maximise the predicted tokens per second of the whole
 * step: expected tokens (1 - a^(k+1)) / (1 - a) for an acceptance rate a measured per sequence
 * (started from the engine's figure for the method), over the predicted time of a step of that
 * many tokens (measured per batch size, interpolated where not yet seen), the draft's time and a
 * per-token cost. Auto mode drafts only when that beats no draft by SPEC_MARGIN, so where a
 * batch costs what its tokens cost one at a time (one node, compute-bound) it stays off; prompt
 * lookup's acceptance is measured in the shadow (its guess against the token sampled) while it
 * is off, a draft model's by a short probe every SPEC_PROBE steps.
 *
 * Threads: the engine's one caller thread; the draft model runs on the engine's pool.
 */
#ifndef SHOAL_INFER_SPEC_H
#define SHOAL_INFER_SPEC_H

#include "infer/infer.h"
#include "infer/pool.h"
#include "infer/sample.h"
#include "infer/tok/tokenizer.h"

#define SPEC_MAX_DRAFT     16 /* longest draft (eng_opts_t.draft_max) */
#define SPEC_DEFAULT_DRAFT 8
#define SPEC_MARGIN                                                                                \
	0.3           /* auto: predicted gain a draft must show over none (the                     \
		       * estimates are rough; where drafts pay, they pay 2-8x) */
#define SPEC_PROBE 32 /* auto with a draft model: steps without drafts between probes */

enum spec_mode { SPEC_OFF = 0, SPEC_AUTO, SPEC_NGRAM, SPEC_MODEL };

/* "auto", "off", "ngram", "model" -> enum spec_mode; NULL -> SPEC_AUTO; -1 when unknown. */
int spec_mode_parse(const char *s);

typedef struct spec spec_t;

typedef struct spec_opts {
	int mode;               /* enum spec_mode (not SPEC_OFF) */
	const char *draft_path; /* GGUF of the draft model (borrowed for the call), or NULL */
	int draft_max;          /* 1..SPEC_MAX_DRAFT */
	const tok_t *tok;       /* the target's tokenizer (borrowed, outlives the spec) */
	int n_vocab;            /* the target's logits per row */
	int n_slots, n_ctx;     /* the target's KV slots and positions per slot */
	int kv_type;            /* the draft model's KV cache elements (quant.h type) */
	pool_t *pool;           /* the engine's compute threads (borrowed) */
} spec_opts_t;

/* Opens the draft model when mode is SPEC_MODEL, or SPEC_AUTO with a draft_path; checks that
 * its vocabulary is the target's (size, every token's text and type, BOS / EOS / end of turn):
 * SH_EINVAL with the first difference in err otherwise. Returns 0 or SH_E* with a reason. */
int spec_new(spec_t **out, const spec_opts_t *o, char *err, size_t errlen);
void spec_free(spec_t *s); /* NULL-safe */

const char *spec_mode_name(const spec_t *s);  /* "auto", "ngram" or "model" */
const char *spec_draft_name(const spec_t *s); /* the draft model's name, or NULL */

/* One decoding sequence of the step being built. */
typedef struct spec_seq {
	int slot;
	const int *ctx; /* its tokens: positions 0 .. n - 1, the last one fed in this step */
	int n;
	int max_k;       /* most drafted tokens the context and max_tokens leave room for */
	int budget;      /* tokens the request may still produce after ctx (grammar masks) */
	sampler_t *samp; /* its sampler: parameters, grammar, the draft's generator */
	/* filled by spec_draft */
	int k;                     /* drafted tokens, 0..max_k */
	int draft[SPEC_MAX_DRAFT]; /* they follow ctx at positions n .. n + k - 1 */
	const float *q;            /* [k][n_vocab] the draft's distributions, or NULL when the
				    * drafts are deterministic (q one-hot); lives to the next
				    * spec_draft */
} spec_seq_t;

/* Drafts for the n decoding sequences of a step (every slot at most once); n_other: tokens of
 * the step that are not theirs (prompt chunks of others). */
void spec_draft(spec_t *s, spec_seq_t *seqs, int n, int n_other);

/* After a forward pass: its tokens and wall time (submitted to collected, on a pipeline). */
void spec_step_timed(spec_t *s, int n_tokens, double forward_ms);
/* After the pass's rows are sampled: the time that took and the tokens it produced (the
 * per-token cost outside the forward pass). */
void spec_step_done(spec_t *s, double sample_ms, int emitted);

/* The outcome of slot's draft this step: k drafted, `accepted` of them taken, `emitted` tokens
 * produced; first: the token produced at the first position (checks a prompt-lookup guess made
 * while drafting was off). */
void spec_verified(spec_t *s, int slot, int k, int accepted, int emitted, int first);

/* A new sequence in slot: its acceptance rate starts from the engine's. */
void spec_seq_start(spec_t *s, int slot);

void spec_stats(const spec_t *s, eng_spec_stats_t *out);

#endif
