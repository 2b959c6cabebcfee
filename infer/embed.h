/*
 * embed.h: pooling of a sequence's final hidden states into one embedding (internal to infer/;
 * the engine and tests/test_embed.c use it). Pure arithmetic, any thread.
 *
 * The kinds are the GGUF's `<arch>.pooling_type` numbers (llama.cpp's enum llama_pooling_type,
 * infer.h's enum eng_pooling): MEAN averages every token's hidden state, CLS takes the first
 * token's, LAST the last token's; the result is then scaled to unit Euclidean length, as
 * llama.cpp's common_embd_normalize(.., 2) does (a zero vector stays zero).
 *
 * Use: embed_pool_wants() says which positions of an n-token prompt the pool reads; each of
 * those hidden states goes to embed_pool_add() (in position order, any number per call site);
 * embed_pool_finish() turns the accumulator into the embedding.
 */
#ifndef SHOAL_INFER_EMBED_H
#define SHOAL_INFER_EMBED_H

/* 1 when pooling kind reads the hidden state of position pos of an n-token sequence. */
int embed_pool_wants(int kind, int pos, int n);

/* Adds the hidden state h[dim] of position pos (one embed_pool_wants says yes to) to acc[dim],
 * which starts zeroed. */
void embed_pool_add(float *acc, const float *h, int dim, int kind, int pos, int n);

/* Finishes acc[dim] for an n-token sequence: the mean for MEAN, then unit length. */
void embed_pool_finish(float *acc, int dim, int kind, int n);

/* Scales v[n] to unit Euclidean length (sum of squares in double); returns the length before. */
double embed_l2_normalize(float *v, int n);

#endif
