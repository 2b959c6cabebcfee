/*
 * sample.h: choosing the next token from logits (internal to infer/).
 *
 * Order of operations, as llama.cpp's default chain: penalties (repetition, presence, frequency
 * over the last SAMPLE_PENALTY_WINDOW tokens of prompt + output), then temperature; greedy when
 * the temperature is 0; otherwise top-k, top-p, min-p on the sorted candidates and a draw from
 * the renormalised distribution with the sampler's own PRNG (seeded: same seed, same text).
 * Reported log-probabilities are those of the penalised, temperature-scaled distribution before
 * truncation (temperature 1 when greedy).
 *
 * Structured output: when the parameters carry a grammar (eng_sampling_t.grammar), the generation
 * loop calls sampler_mask() before sampler_sample(); it removes every token that cannot continue
 * the JSON value (infer/grammar.h), and sampler_accept() advances the grammar over the chosen
 * token. The vocabulary's byte table is built on the first such request (sampler_set_tok).
 *
 * Speculative decoding (infer/spec.h): sampler_sample_spec() picks the token of a position
 * whose draft was x by the speculative-sampling rule, which keeps the output distribution the
 * request's: with a draft distribution q, x is accepted with probability min(1, p(x) / q(x)),
 * else the token is drawn from norm(max(p - q, 0)); with a deterministic draft (q one-hot:
 * prompt lookup, a greedy draft) that is a draw from p that accepts x when it draws x. Greedy:
 * the argmax, accepting x when it is the argmax. Every position takes one value of the output
 * generator whether or not it was drafted, so with deterministic drafts the text of a seed is
 * the same as without speculation; acceptance tests and the draft's own draws take a second
 * generator.
 *
 * Threads: a sampler belongs to one request on one thread.
 */
#ifndef SHOAL_SAMPLE_H
#define SHOAL_SAMPLE_H

#include "infer/infer.h"
#include "infer/tok/tokenizer.h"

#include <stdint.h>

#define SAMPLE_PENALTY_WINDOW 64

typedef struct sampler sampler_t;

sampler_t *sampler_new(int n_vocab); /* NULL on allocation failure */
void sampler_free(sampler_t *s);     /* NULL-safe */

/* Starts a request: parameters (copied) and the prompt as penalty history. */
void sampler_reset(sampler_t *s, const eng_sampling_t *p, const int *prompt, int n_prompt);

/* Picks a token from logits[n_vocab] (modified in place). *logprob gets its log-probability;
 * top[0..n_top) the n_top most likely tokens, best first (n_top <= the request's top_logprobs
 * capacity; pass 0 for none). */
int sampler_sample(sampler_t *s, float *logits, float *logprob, eng_logprob_t *top, int n_top);

/* The same at a position whose draft was draft (-1: none) from the distribution q[n_vocab]
 * (NULL: a deterministic draft). *accepted (may be NULL) gets 1 when the returned token is the
 * draft. logits are modified in place. */
int sampler_sample_spec(sampler_t *s, float *logits, int draft, const float *q, float *logprob,
			eng_logprob_t *top, int n_top, int *accepted);

/* A draft model's choice from its logits[n_vocab] (modified: the caller may mask them first)
 * under the request's temperature and truncations (no penalties): a draw by the second
 * generator, with the distribution drawn from written densely to q[n_vocab] (0 outside the
 * kept candidates). Greedy: the argmax, q untouched (may be NULL). */
int sampler_draft(sampler_t *s, float *logits, float *q);

/* The request's parameters (stop strings and grammar cleared) and its grammar matcher (NULL
 * without a grammar; borrowed: lives until the next sampler_reset). */
const eng_sampling_t *sampler_params(const sampler_t *s);
struct gram_match;
struct gram_match *sampler_grammar(const sampler_t *s);

/* Adds a chosen token to the penalty history (and advances the grammar, if any). */
void sampler_accept(sampler_t *s, int token);

/* The tokenizer whose tokens the grammar masks (borrowed; outlives the sampler). */
void sampler_set_tok(sampler_t *s, const tok_t *t);

/* With a grammar: sets the logits of tokens that cannot come next to -INFINITY. budget: tokens
 * the request may still produce, this one included. Without a grammar: does nothing. */
void sampler_mask(sampler_t *s, float *logits, int budget);

#endif
