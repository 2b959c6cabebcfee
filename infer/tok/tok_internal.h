/*
 * tok_internal.h: what the tokenizer files (tok_*.c) share: the tok_t layout, a string hash map
 * and the per-family encoders. Not for use outside tok_*.c (and their tests).
 */
#ifndef SHOAL_TOK_INTERNAL_H
#define SHOAL_TOK_INTERNAL_H

#include "infer/tok/tokenizer.h"

#include <stddef.h>
#include <stdint.h>

/* Open-addressing map from borrowed byte strings to ints. Keys are not copied. */
typedef struct tok_map {
	const char **key;
	uint32_t *klen;
	int *val;
	size_t cap; /* power of two; 0 = empty map */
} tok_map_t;

int tok_map_init(tok_map_t *m, size_t n); /* room for n keys */
void tok_map_free(tok_map_t *m);
/* Inserts or overwrites (the last value for a key wins, as in llama.cpp). */
void tok_map_put(tok_map_t *m, const char *k, size_t len, int v);
int tok_map_get(const tok_map_t *m, const char *k, size_t len); /* value or -1 */

/* Growable int vector used by the encoders. */
typedef struct tok_ids {
	int *v;
	int n, cap;
	int oom;
} tok_ids_t;

void tok_ids_push(tok_ids_t *o, int id);

struct tok_pre; /* compiled pre-tokenizer (tok_pre.c) */

struct tok {
	const gguf_t *g;
	int kind;
	char pre[32];
	int n_vocab;
	const char **text; /* vocabulary texts (into the mapping) */
	uint32_t *text_len;
	float *score;  /* SPM scores (NULL = all 0) */
	uint8_t *type; /* enum tok_type */
	char **piece;  /* decoded bytes per token (malloc'd block, see piece_buf) */
	uint32_t *piece_len;
	char *piece_buf;
	tok_map_t vocab;  /* text -> id */
	tok_map_t merges; /* "left right" -> rank (BPE) */
	int bos, eos, eot, eom, unk;
	int add_bos, add_eos, add_space_prefix, ignore_merges;
	uint8_t *eog; /* per id: ends generation */
	int *special; /* control/user-defined/unknown ids by first byte, longest first */
	int n_special;
	int special_at[257]; /* special[special_at[c] .. special_at[c+1]) start with byte c */
	int byte_tok[256];   /* SPM: id of <0xNN> (or of the byte itself), -1 when absent */
	struct tok_pre *pre_re;
};

/* Encoders for one fragment of plain text (no special tokens in it), appending to out. */
void tok_spm_encode(const tok_t *t, const char *s, size_t n, tok_ids_t *out);
void tok_bpe_encode(const tok_t *t, const char *s, size_t n, tok_ids_t *out);

/* GPT-2 byte <-> unicode mapping. */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp); /* -1 when cp is not a mapped byte */

/* Pre-tokenizer: compiles the regexes for a tokenizer.ggml.pre name (SH_EUNSUPP when unknown),
 * and splits text into words, calling fn for each (in order, covering the whole text). */
int tok_pre_new(struct tok_pre **out, const char *name, int *ignore_merges, char *err,
		size_t errlen);
void tok_pre_free(struct tok_pre *p);
typedef void (*tok_word_fn)(void *ud, const char *w, size_t n);
int tok_pre_split(const struct tok_pre *p, const char *s, size_t n, tok_word_fn fn, void *ud);

/* UTF-8 helpers. */
int tok_utf8_len(uint8_t lead); /* 1..4 from the lead byte (1 for stray bytes) */
/* Length of a valid UTF-8 character at s (n bytes available), or 0 when invalid. */
int tok_utf8_valid(const unsigned char *s, size_t n);
size_t tok_utf8_put(char *out, uint32_t cp); /* writes 1..4 bytes */

#endif
