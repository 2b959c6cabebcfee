/*
 * grammar.h: constrained sampling for structured output (internal to infer/; the public handle
 * eng_grammar_t and its constructor are in infer.h).
 *
 * A JSON Schema is compiled into a small graph of nodes (object, array, string, number,
 * integer, literal sets for enum/const/boolean/null, anyOf). A matcher walks the bytes of the
 * output through that graph with a stack per alternative (a handful of alternatives at most,
 * for anyOf), so it answers "may this byte come next?" without lookahead. To mask logits, every
 * vocabulary token's bytes are precomputed once per engine (gram_vocab_t) and sorted, so tokens
 * that share a prefix share the work and a rejected prefix rejects the whole run of tokens
 * behind it: one step costs about one walk over the live part of the vocabulary trie.
 *
 * Output form: compact JSON with at most one space after ':' and ','; properties in schema
 * order; \u escapes are not generated. Termination: with a budget of B tokens left, a token is
 * allowed only if the shortest completion after it fits in B - 1 single-byte tokens, so output
 * always closes before max_tokens or the context end; once the value is complete only
 * end-of-generation tokens are allowed.
 *
 * Threads: a gram_vocab_t and an eng_grammar_t are immutable once built (share freely); a
 * gram_match_t belongs to one request.
 */
#ifndef SHOAL_GRAMMAR_H
#define SHOAL_GRAMMAR_H

#include "infer/infer.h"
#include "infer/tok/tokenizer.h"

#include <stddef.h>

typedef struct gram_vocab gram_vocab_t;
typedef struct gram_match gram_match_t;

/* Each token's bytes (tok_piece without special text) and whether it ends generation. NULL on
 * allocation failure. */
gram_vocab_t *gram_vocab_new(const tok_t *t);
void gram_vocab_free(gram_vocab_t *v); /* NULL-safe */
/* The same, shared by every caller with the same tokenizer (samplers of one engine): counted
 * references under a lock; the table is built on the first call and freed with the last
 * release. NULL on allocation failure. Any thread. */
gram_vocab_t *gram_vocab_shared(const tok_t *t);
void gram_vocab_release(gram_vocab_t *v); /* NULL-safe */

/* A matcher at the start of the value; g and v are borrowed and must outlive it. */
gram_match_t *gram_match_new(const eng_grammar_t *g, const gram_vocab_t *v);
void gram_match_free(gram_match_t *m); /* NULL-safe */
/* A copy of m at the same point (NULL on allocation failure). */
gram_match_t *gram_match_clone(const gram_match_t *m);

/* Sets logits of every token that may not come next to -INFINITY. budget: tokens still allowed
 * including this one (>= 1). When nothing is possible (a vocabulary without the needed
 * bytes), end-of-generation tokens are left allowed. */
void gram_match_mask(gram_match_t *m, float *logits, int budget);

/* Advances over token id's bytes (a token the mask allowed). Returns 0, or -1 when the token
 * does not fit (the matcher is then left unchanged). */
int gram_match_accept(gram_match_t *m, int id);

/* Byte-level use (tests): feeds s[0..n). Returns 0 or -1 (unchanged on -1). */
int gram_match_feed(gram_match_t *m, const char *s, size_t n);
/* 1 when the bytes so far form a complete value. */
int gram_match_done(const gram_match_t *m);
/* Bytes of the shortest completion from here (0 when done). */
int gram_match_min_close(const gram_match_t *m);

#endif
