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
 * Threads: a sampler belongs to one request on one thread.
 */
#ifndef SHOAL_SAMPLE_H
#define SHOAL_SAMPLE_H

#include "infer/infer.h"

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

/* Adds a chosen token to the penalty history. */
void sampler_accept(sampler_t *s, int token);

#endif
