/*
 * tokenizer.h: text <-> token ids from a GGUF file's tokenizer.* metadata. Internal to infer/.
 *
 * Two families: SentencePiece style (tokenizer.ggml.model "llama": score-driven merges over UTF-8
 * characters, byte fallback <0xNN>, spaces as U+2581 and a leading space) and byte-level BPE
 * ("gpt2": the pre-tokenizer regexes named by tokenizer.ggml.pre, the GPT-2 byte-to-unicode
 * mapping, merge ranks). Both follow what llama.cpp and Hugging Face produce, token for token.
 *
 * Ownership: a tok_t borrows the gguf_t it was loaded from (token texts point into the mapping);
 * the gguf_t must outlive it. Everything else returned is either malloc'd for the caller (said
 * so) or lives as long as the tok_t.
 *
 * Threads: a tok_t is immutable after tok_load(); all functions may be called concurrently. A
 * tok_stream_t belongs to one caller.
 */
#ifndef SHOAL_TOKENIZER_H
#define SHOAL_TOKENIZER_H

#include "infer/gguf.h"

#include <stddef.h>

typedef struct tok tok_t;

enum tok_kind { TOK_SPM = 0, TOK_BPE = 1 };

/* Token types from tokenizer.ggml.token_type. */
enum tok_type {
	TOK_T_NORMAL = 1,
	TOK_T_UNKNOWN = 2,
	TOK_T_CONTROL = 3,
	TOK_T_USER = 4,
	TOK_T_UNUSED = 5,
	TOK_T_BYTE = 6
};

/* Loads the tokenizer of g. Returns 0, SH_EUNSUPP (unknown tokenizer model or pre-tokenizer,
 * named in err), SH_EFORMAT (missing or malformed arrays) or SH_ENOMEM. */
int tok_load(tok_t **out, const gguf_t *g, char *err, size_t errlen);
void tok_free(tok_t *t); /* NULL-safe */

int tok_kind(const tok_t *t);              /* enum tok_kind */
const char *tok_kind_name(const tok_t *t); /* "spm" or "bpe" */
const char *tok_pre_name(const tok_t *t);  /* the pre-tokenizer ("default" when unnamed) */
int tok_n_vocab(const tok_t *t);
int tok_bos(const tok_t *t);          /* -1 when absent */
int tok_eos(const tok_t *t);          /* -1 when absent */
int tok_eot(const tok_t *t);          /* end of turn (<|eot_id|>, <|im_end|>, ...) or -1 */
int tok_add_bos(const tok_t *t);      /* the model wants BOS prepended */
int tok_add_eos(const tok_t *t);      /* the model wants EOS appended (embedding inputs) */
int tok_type(const tok_t *t, int id); /* enum tok_type, or 0 for a bad id */
/* End of generation: eos, eot, eom and control tokens such as <|im_end|>, <|eot_id|>, <|end|>. */
int tok_is_eog(const tok_t *t, int id);
/* The vocabulary text of id (as stored: U+2581 for spaces, byte-level characters for BPE). */
const char *tok_text(const tok_t *t, int id, size_t *len);
/* Id of the token whose vocabulary text is exactly s[0..len), or -1. */
int tok_find(const tok_t *t, const char *s, size_t len);

/* Text -> ids. add_bos: prepend BOS (when the vocabulary has one). parse_special: control and
 * unknown tokens written in the text (e.g. "<|im_start|>", "<unk>") become their ids (the
 * longest match wins); user-defined tokens always do, as in Hugging Face and llama.cpp. Invalid
 * UTF-8 is encoded byte by byte, never rejected. *ids is malloc'd (caller frees), *n_ids its
 * length. Returns 0 or SH_ENOMEM. */
int tok_encode(const tok_t *t, const char *text, size_t len, int add_bos, int parse_special,
	       int **ids, int *n_ids);

enum {
	TOK_DECODE_SPECIAL = 1, /* render control tokens' text (else they decode to nothing) */
	TOK_DECODE_STRIP = 2    /* drop the leading space SentencePiece adds (whole texts) */
};

/* The bytes id stands for (spaces restored, byte tokens as their byte, BPE characters mapped
 * back to bytes). Control tokens give "" unless special. Pointer lives as long as t. */
const char *tok_piece(const tok_t *t, int id, int special, size_t *len);

/* Ids -> text, malloc'd and NUL-terminated (caller frees); may hold invalid UTF-8 when the ids
 * do. flags: TOK_DECODE_*. Unknown ids are skipped. Returns 0 or SH_ENOMEM. */
int tok_decode(const tok_t *t, const int *ids, int n_ids, int flags, char **text, size_t *len);

/* Streaming decoder for generation: feed ids one at a time, receive only whole UTF-8
 * characters; bytes that can never form a character become U+FFFD, so the output is always
 * valid UTF-8. */
typedef struct tok_stream {
	const tok_t *t;
	int special;
	unsigned char pend[4]; /* an incomplete character carried to the next token */
	int n_pend;
	char *buf; /* output of the last call (internal) */
	size_t cap;
} tok_stream_t;

int tok_stream_init(tok_stream_t *s, const tok_t *t, int special); /* 0 or SH_ENOMEM */
void tok_stream_free(tok_stream_t *s);
/* Returns the text this token completes (possibly empty), valid until the next call. */
const char *tok_stream_push(tok_stream_t *s, int id, size_t *len);
/* What is still pending, as U+FFFD characters (end of generation). */
const char *tok_stream_flush(tok_stream_t *s, size_t *len);

#endif
