/*
 * tok_vocab.c: loading a vocabulary from GGUF, the special-token partition that runs before
 * either encoder, decoding (whole and streaming), and the small shared helpers (hash map, UTF-8).
 *
 * Invariant after tok_load(): every id stored in the tok_t (bos, eos, eot, special list, byte
 * tokens) is either -1 or < n_vocab, and piece[id] holds the decoded bytes of every id, so
 * decoding never touches the GGUF again.
 */
#include "infer/tok/tok_internal.h"

#include "common/common.h"

#include <stdlib.h>
#include <string.h>

/* ---- small helpers ---- */

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
	return h ^ (h >> 29);
}

int tok_map_init(tok_map_t *m, size_t n)
{
	size_t cap = 16;
	while (cap < n * 2 + 1)
		cap <<= 1;
	m->key = calloc(cap, sizeof *m->key);
	m->klen = calloc(cap, sizeof *m->klen);
	m->val = malloc(cap * sizeof *m->val);
	m->cap = cap;
	if (!m->key || !m->klen || !m->val) {
		tok_map_free(m);
		return SH_ENOMEM;
	}
	return 0;
}

void tok_map_free(tok_map_t *m)
{
	free(m->key);
	free(m->klen);
	free(m->val);
	memset(m, 0, sizeof *m);
}

void tok_map_put(tok_map_t *m, const char *k, size_t len, int v)
{
	size_t mask = m->cap - 1, h = hash_bytes(k, len) & mask;
	while (m->key[h]) {
		if (m->klen[h] == len && !memcmp(m->key[h], k, len)) {
			m->val[h] = v;
			return;
		}
		h = (h + 1) & mask;
	}
	m->key[h] = k ? k : "";
	m->klen[h] = (uint32_t)len;
	m->val[h] = v;
}

int tok_map_get(const tok_map_t *m, const char *k, size_t len)
{
	if (!m->cap)
		return -1;
	size_t mask = m->cap - 1, h = hash_bytes(k, len) & mask;
	while (m->key[h]) {
		if (m->klen[h] == len && !memcmp(m->key[h], k, len))
			return m->val[h];
		h = (h + 1) & mask;
	}
	return -1;
}

void tok_ids_push(tok_ids_t *o, int id)
{
	if (o->oom)
		return;
	if (o->n == o->cap) {
		int cap = o->cap ? o->cap * 2 : 64;
		int *v = realloc(o->v, (size_t)cap * sizeof *v);
		if (!v) {
			o->oom = 1;
			return;
		}
		o->v = v;
		o->cap = cap;
	}
	o->v[o->n++] = id;
}

int tok_utf8_len(uint8_t c)
{
	if (c < 0x80)
		return 1;
	if ((c & 0xe0) == 0xc0)
		return 2;
	if ((c & 0xf0) == 0xe0)
		return 3;
	if ((c & 0xf8) == 0xf0)
		return 4;
	return 1;
}

int tok_utf8_valid(const unsigned char *s, size_t n)
{
	if (!n)
		return 0;
	uint8_t c = s[0];
	if (c < 0x80)
		return 1;
	int k;
	uint32_t cp;
	if (c >= 0xc2 && c <= 0xdf)
		k = 2, cp = c & 0x1f;
	else if ((c & 0xf0) == 0xe0)
		k = 3, cp = c & 0x0f;
	else if (c >= 0xf0 && c <= 0xf4)
		k = 4, cp = c & 0x07;
	else
		return 0;
	if ((size_t)k > n)
		return 0;
	for (int i = 1; i < k; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	if ((k == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
	    (k == 4 && (cp < 0x10000 || cp > 0x10ffff)))
		return 0;
	return k;
}

size_t tok_utf8_put(char *o, uint32_t cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xc0 | (cp >> 6));
		o[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xe0 | (cp >> 12));
		o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		o[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | (cp >> 18));
	o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	o[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/* ---- load ---- */

/* Decodes the vocabulary text of id into bytes (dst has room for 4 * len bytes). */
static size_t make_piece(const tok_t *t, int id, char *dst)
{
	const char *s = t->text[id];
	size_t n = t->text_len[id], k = 0;
	int ty = t->type[id];
	if (ty == TOK_T_BYTE && n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>') {
		char hex[3] = {s[3], s[4], 0};
		char *end;
		long v = strtol(hex, &end, 16);
		if (*end == 0) {
			dst[0] = (char)v;
			return 1;
		}
	}
	if (ty == TOK_T_USER || ty == TOK_T_CONTROL || ty == TOK_T_UNKNOWN || ty == TOK_T_UNUSED) {
		/* their text is literal (user-defined tokens of SPM still use U+2581 for spaces) */
		if (t->kind == TOK_BPE) {
			memcpy(dst, s, n);
			return n;
		}
	}
	if (t->kind == TOK_SPM) {
		for (size_t i = 0; i < n; i++) {
			if (i + 2 < n && !memcmp(s + i, "\xe2\x96\x81", 3)) {
				dst[k++] = ' ';
				i += 2;
			} else {
				dst[k++] = s[i];
			}
		}
		return k;
	}
	/* byte-level BPE: each character stands for one byte */
	for (size_t i = 0; i < n;) {
		int l = tok_utf8_valid((const unsigned char *)s + i, n - i);
		if (!l) {
			dst[k++] = s[i++];
			continue;
		}
		uint32_t cp = (uint8_t)s[i] & (l == 1   ? 0x7f
					       : l == 2 ? 0x1f
					       : l == 3 ? 0x0f
							: 0x07);
		for (int j = 1; j < l; j++)
			cp = (cp << 6) | ((uint8_t)s[i + j] & 0x3f);
		int b = tok_cp_to_byte(cp);
		if (b >= 0) {
			dst[k++] = (char)b;
		} else {
			memcpy(dst + k, s + i, (size_t)l);
			k += (size_t)l;
		}
		i += (size_t)l;
	}
	return k;
}

static int get_id(const gguf_t *g, const char *key, int n_vocab, int dflt)
{
	uint32_t v;
	int rc = gguf_get_u32(g, key, &v);
	if (rc == SH_ENOENT)
		return dflt < n_vocab ? dflt : -1;
	if (rc || v >= (uint32_t)n_vocab)
		return -1;
	return (int)v;
}

struct len_id {
	uint8_t first;
	uint32_t len;
	int id;
};

/* Grouped by first byte, longest text first within a group (the longest match wins). */
static int cmp_special(const void *a, const void *b)
{
	const struct len_id *x = a, *y = b;
	if (x->first != y->first)
		return x->first < y->first ? -1 : 1;
	if (x->len != y->len)
		return x->len > y->len ? -1 : 1;
	return x->id - y->id;
}

static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>",         "<end_of_turn>",         "<|endoftext|>",
    "<|eom_id|>", "<EOT>",      "<|end_of_text|>", "<｜end▁of▁sentence｜>", "<|return|>",
    "<|call|>",
};
/* o200k_harmony (gpt-oss), as llama.cpp's llama_vocab::impl::load adjusts it: the format's
 * markers <|channel|>, <|message|>, <|start|>, <|constrain|> are user-defined (rendered as text,
 * so a reply's channels can be parsed), and when <|return|>, <|call|> and <|end|> all end
 * generation, <|end|> does not (it closes a message inside a reply) and is user-defined too. */
static void harmony_attrs(tok_t *t)
{
	static const char *const shown[] = {"<|channel|>", "<|message|>", "<|start|>",
					    "<|constrain|>"};
	for (size_t i = 0; i < ARRAY_LEN(shown); i++) {
		int id = tok_map_get(&t->vocab, shown[i], strlen(shown[i]));
		if (id >= 0)
			t->type[id] = TOK_T_USER;
	}
	int ret = tok_map_get(&t->vocab, "<|return|>", 10),
	    call = tok_map_get(&t->vocab, "<|call|>", 8),
	    end = tok_map_get(&t->vocab, "<|end|>", 7);
	if (ret >= 0 && call >= 0 && end >= 0 && t->eog[ret] && t->eog[call] && t->eog[end]) {
		t->eog[end] = 0;
		t->type[end] = TOK_T_USER;
	}
}

static const char *const eot_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "<｜end▁of▁sentence｜>",
};

int tok_load(tok_t **out, const gguf_t *g, char *err, size_t errlen)
{
	*out = NULL;
	const char *s;
	size_t n;
	int rc;
	if (gguf_get_str(g, "tokenizer.ggml.model", &s, &n))
		return sh_fail(err, errlen, SH_EFORMAT, "missing key tokenizer.ggml.model");
	tok_t *t = calloc(1, sizeof *t);
	if (!t)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	t->g = g;
	if (n == 5 && !memcmp(s, "llama", 5)) {
		t->kind = TOK_SPM;
	} else if (n == 4 && !memcmp(s, "gpt2", 4)) {
		t->kind = TOK_BPE;
	} else {
		char m[33];
		size_t k = MIN(n, sizeof m - 1);
		for (size_t i = 0; i < k; i++)
			m[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
		m[k] = 0;
		rc = sh_fail(err, errlen, SH_EUNSUPP,
			     "unsupported tokenizer model '%s' (supported: llama, gpt2)", m);
		goto fail;
	}
	int ti = gguf_find_key(g, "tokenizer.ggml.tokens");
	if (ti < 0 || gguf_arr_type(g, ti) != GGUF_STR || gguf_arr_n(g, ti) == 0 ||
	    gguf_arr_n(g, ti) > (1u << 24)) {
		rc = sh_fail(err, errlen, SH_EFORMAT, "missing or bad tokenizer.ggml.tokens");
		goto fail;
	}
	t->n_vocab = (int)gguf_arr_n(g, ti);
	size_t nv = (size_t)t->n_vocab;
	t->text = malloc(nv * sizeof *t->text);
	t->text_len = malloc(nv * sizeof *t->text_len);
	t->type = malloc(nv);
	t->eog = calloc(nv, 1);
	t->piece = malloc(nv * sizeof *t->piece);
	t->piece_len = malloc(nv * sizeof *t->piece_len);
	if (!t->text || !t->text_len || !t->type || !t->eog || !t->piece || !t->piece_len ||
	    tok_map_init(&t->vocab, nv))
		goto oom;
	size_t total = 0;
	for (int i = 0; i < t->n_vocab; i++) {
		if (gguf_arr_str(g, ti, (uint64_t)i, &s, &n) || n > 65535) {
			rc = sh_fail(err, errlen, SH_EFORMAT, "token %d has a bad text", i);
			goto fail;
		}
		t->text[i] = s;
		t->text_len[i] = (uint32_t)n;
		t->type[i] = TOK_T_NORMAL;
		total += n;
		/* the first id wins: added tokens that repeat a base token (DeepSeek's "ÿ") must
		 * not shadow it, as in Hugging Face where the model's own vocabulary is looked up
		 */
		if (tok_map_get(&t->vocab, s, n) < 0)
			tok_map_put(&t->vocab, s, n, i);
	}
	int ty = gguf_find_key(g, "tokenizer.ggml.token_type");
	if (ty >= 0) {
		if (gguf_arr_n(g, ty) != nv) {
			rc = sh_fail(err, errlen, SH_EFORMAT,
				     "tokenizer.ggml.token_type has %llu entries for %d tokens",
				     (unsigned long long)gguf_arr_n(g, ty), t->n_vocab);
			goto fail;
		}
		for (int i = 0; i < t->n_vocab; i++) {
			int64_t v;
			if (gguf_arr_i64(g, ty, (uint64_t)i, &v)) {
				rc = sh_fail(err, errlen, SH_EFORMAT,
					     "bad tokenizer.ggml.token_type");
				goto fail;
			}
			t->type[i] = (v >= 1 && v <= 6) ? (uint8_t)v : TOK_T_NORMAL;
		}
	}
	int si = gguf_find_key(g, "tokenizer.ggml.scores");
	if (si >= 0) {
		if (gguf_arr_n(g, si) != nv) {
			rc = sh_fail(err, errlen, SH_EFORMAT,
				     "tokenizer.ggml.scores has %llu entries for %d tokens",
				     (unsigned long long)gguf_arr_n(g, si), t->n_vocab);
			goto fail;
		}
		t->score = malloc(nv * sizeof *t->score);
		if (!t->score)
			goto oom;
		for (int i = 0; i < t->n_vocab; i++)
			if (gguf_arr_f32(g, si, (uint64_t)i, &t->score[i])) {
				rc = sh_fail(err, errlen, SH_EFORMAT, "bad tokenizer.ggml.scores");
				goto fail;
			}
	}
	if (t->kind == TOK_BPE) {
		int mi = gguf_find_key(g, "tokenizer.ggml.merges");
		if (mi < 0 || gguf_arr_type(g, mi) != GGUF_STR) {
			rc = sh_fail(err, errlen, SH_EFORMAT, "missing tokenizer.ggml.merges");
			goto fail;
		}
		uint64_t nm = gguf_arr_n(g, mi);
		if (tok_map_init(&t->merges, (size_t)nm))
			goto oom;
		for (uint64_t i = 0; i < nm && i < INT32_MAX; i++) {
			if (gguf_arr_str(g, mi, i, &s, &n))
				continue;
			/* merges already read "left right"; the same string is our lookup key.
			 * Keep the first rank for a duplicate pair. */
			if (tok_map_get(&t->merges, s, n) < 0)
				tok_map_put(&t->merges, s, n, (int)i);
		}
		s = NULL;
		n = 0;
		if (gguf_get_str(g, "tokenizer.ggml.pre", &s, &n) || n == 0) {
			s = "default";
			n = 7;
		}
		n = MIN(n, sizeof t->pre - 1);
		memcpy(t->pre, s, n);
		t->pre[n] = 0;
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)t->pre[i] < 0x20 || (unsigned char)t->pre[i] >= 0x7f)
				t->pre[i] = '?';
		rc = tok_pre_new(&t->pre_re, t->pre, &t->ignore_merges, err, errlen);
		if (rc)
			goto fail;
	} else {
		strcpy(t->pre, "default");
	}

	/* special ids; SentencePiece vocabularies default to <unk>=0 <s>=1 </s>=2 */
	int spm = t->kind == TOK_SPM;
	t->bos = get_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, spm ? 1 : -1);
	t->eos = get_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, spm ? 2 : -1);
	t->unk = get_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, spm ? 0 : -1);
	t->eot = get_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, -1);
	t->eom = get_id(g, "tokenizer.ggml.eom_token_id", t->n_vocab, -1);
	t->add_bos = spm;
	int b;
	if (!gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b))
		t->add_bos = b;
	/* EOS after the text (llama.cpp's add_special): off for SentencePiece and BPE unless the
	 * file says so (embedding models such as Qwen3-Embedding do) */
	t->add_eos = 0;
	if (!gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b))
		t->add_eos = b;
	t->add_space_prefix = spm;
	if (!gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b))
		t->add_space_prefix = b;
	if (t->bos < 0)
		t->add_bos = 0;
	if (t->eos < 0)
		t->add_eos = 0;
	for (size_t i = 0; i < ARRAY_LEN(eot_texts) && t->eot < 0; i++) {
		int id = tok_map_get(&t->vocab, eot_texts[i], strlen(eot_texts[i]));
		if (id >= 0 && t->type[id] == TOK_T_CONTROL && id != t->eos)
			t->eot = id;
	}
	for (size_t i = 0; i < ARRAY_LEN(eog_texts); i++) {
		int id = tok_map_get(&t->vocab, eog_texts[i], strlen(eog_texts[i]));
		if (id >= 0 && (t->type[id] == TOK_T_CONTROL || t->type[id] == TOK_T_USER))
			t->eog[id] = 1;
	}
	if (t->eos >= 0)
		t->eog[t->eos] = 1;
	if (t->eot >= 0)
		t->eog[t->eot] = 1;
	if (t->eom >= 0)
		t->eog[t->eom] = 1;
	harmony_attrs(t);

	/* special tokens matched in text, longest first */
	t->special = malloc(nv * sizeof *t->special);
	struct len_id *li = malloc(nv * sizeof *li);
	if (!t->special || !li) {
		free(li);
		goto oom;
	}
	for (int i = 0; i < t->n_vocab; i++)
		if ((t->type[i] == TOK_T_CONTROL || t->type[i] == TOK_T_USER ||
		     t->type[i] == TOK_T_UNKNOWN) &&
		    t->text_len[i])
			li[t->n_special++] =
			    (struct len_id){(uint8_t)t->text[i][0], t->text_len[i], i};
	qsort(li, (size_t)t->n_special, sizeof *li, cmp_special);
	for (int i = 0; i < t->n_special; i++)
		t->special[i] = li[i].id;
	for (int c = 0, i = 0; c < 256; c++) {
		t->special_at[c] = i;
		while (i < t->n_special && li[i].first == c)
			i++;
	}
	t->special_at[256] = t->n_special;
	free(li);

	for (int c = 0; c < 256; c++) {
		char hex[8];
		snprintf(hex, sizeof hex, "<0x%02X>", c);
		t->byte_tok[c] = tok_map_get(&t->vocab, hex, 6);
		if (t->byte_tok[c] < 0) {
			char one = (char)c;
			t->byte_tok[c] = tok_map_get(&t->vocab, &one, 1);
		}
	}

	/* decoded pieces: at most 4 bytes out per byte in, for BPE never more than in */
	if (total > SIZE_MAX / 4 - 1)
		goto oom;
	t->piece_buf = malloc(total + 1);
	if (!t->piece_buf)
		goto oom;
	size_t off = 0;
	for (int i = 0; i < t->n_vocab; i++) {
		t->piece[i] = t->piece_buf + off;
		t->piece_len[i] = (uint32_t)make_piece(t, i, t->piece_buf + off);
		off += t->piece_len[i];
	}
	*out = t;
	return 0;
oom:
	rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory loading the tokenizer");
fail:
	tok_free(t);
	return rc;
}

void tok_free(tok_t *t)
{
	if (!t)
		return;
	free(t->text);
	free(t->text_len);
	free(t->score);
	free(t->type);
	free(t->piece);
	free(t->piece_len);
	free(t->piece_buf);
	free(t->eog);
	free(t->special);
	tok_map_free(&t->vocab);
	tok_map_free(&t->merges);
	tok_pre_free(t->pre_re);
	free(t);
}

/* ---- queries ---- */

int tok_kind(const tok_t *t)
{
	return t->kind;
}
const char *tok_kind_name(const tok_t *t)
{
	return t->kind == TOK_SPM ? "spm" : "bpe";
}
const char *tok_pre_name(const tok_t *t)
{
	return t->pre;
}
int tok_n_vocab(const tok_t *t)
{
	return t->n_vocab;
}
int tok_bos(const tok_t *t)
{
	return t->bos;
}
int tok_eos(const tok_t *t)
{
	return t->eos;
}
int tok_eot(const tok_t *t)
{
	return t->eot;
}
int tok_add_bos(const tok_t *t)
{
	return t->add_bos;
}
int tok_add_eos(const tok_t *t)
{
	return t->add_eos;
}
int tok_type(const tok_t *t, int id)
{
	return id >= 0 && id < t->n_vocab ? t->type[id] : 0;
}
int tok_is_eog(const tok_t *t, int id)
{
	return id >= 0 && id < t->n_vocab && t->eog[id];
}

const char *tok_text(const tok_t *t, int id, size_t *len)
{
	if (id < 0 || id >= t->n_vocab) {
		*len = 0;
		return "";
	}
	*len = t->text_len[id];
	return t->text[id];
}

int tok_find(const tok_t *t, const char *s, size_t len)
{
	return tok_map_get(&t->vocab, s, len);
}

/* ---- encode ---- */

/* Longest special token starting at s (n bytes left), or -1. */
static int match_special(const tok_t *t, const char *s, size_t n, int parse_special)
{
	uint8_t c = (uint8_t)s[0];
	for (int i = t->special_at[c]; i < t->special_at[c + 1]; i++) {
		int id = t->special[i];
		size_t l = t->text_len[id];
		if (l > n || memcmp(t->text[id], s, l))
			continue;
		if (t->type[id] != TOK_T_USER && !parse_special)
			continue;
		return id;
	}
	return -1;
}

static void encode_fragment(const tok_t *t, const char *s, size_t n, int prev_special, tok_ids_t *o)
{
	if (t->kind == TOK_BPE) {
		tok_bpe_encode(t, s, n, o);
		return;
	}
	if (!(t->add_space_prefix && prev_special)) {
		tok_spm_encode(t, s, n, o);
		return;
	}
	char *buf = malloc(n + 1);
	if (!buf) {
		o->oom = 1;
		return;
	}
	buf[0] = ' ';
	memcpy(buf + 1, s, n);
	tok_spm_encode(t, buf, n + 1, o);
	free(buf);
}

int tok_encode(const tok_t *t, const char *text, size_t len, int add_bos, int parse_special,
	       int **ids, int *n_ids)
{
	tok_ids_t o = {0};
	*ids = NULL;
	*n_ids = 0;
	if (add_bos && t->bos >= 0)
		tok_ids_push(&o, t->bos);
	int prev_special = 1; /* SentencePiece prefixes a space to the first fragment */
	size_t start = 0;
	for (size_t i = 0; i < len;) {
		int id = match_special(t, text + i, len - i, parse_special);
		if (id < 0) {
			i++;
			continue;
		}
		if (i > start) {
			encode_fragment(t, text + start, i - start, prev_special, &o);
			prev_special = 0;
		}
		tok_ids_push(&o, id);
		prev_special = 1;
		i += t->text_len[id];
		start = i;
	}
	if (len > start)
		encode_fragment(t, text + start, len - start, prev_special, &o);
	if (o.oom) {
		free(o.v);
		return SH_ENOMEM;
	}
	if (!o.v) {
		o.v = malloc(sizeof(int));
		if (!o.v)
			return SH_ENOMEM;
	}
	*ids = o.v;
	*n_ids = o.n;
	return 0;
}

/* ---- decode ---- */

const char *tok_piece(const tok_t *t, int id, int special, size_t *len)
{
	*len = 0;
	if (id < 0 || id >= t->n_vocab)
		return "";
	int ty = t->type[id];
	if ((ty == TOK_T_CONTROL || ty == TOK_T_UNKNOWN || ty == TOK_T_UNUSED) && !special)
		return "";
	*len = t->piece_len[id];
	return t->piece[id];
}

int tok_decode(const tok_t *t, const int *ids, int n_ids, int flags, char **text, size_t *len)
{
	size_t total = 0, k = 0;
	int special = (flags & TOK_DECODE_SPECIAL) != 0;
	for (int i = 0; i < n_ids; i++) {
		size_t l;
		(void)tok_piece(t, ids[i], special, &l);
		total += l;
	}
	char *out = malloc(total + 1);
	if (!out)
		return SH_ENOMEM;
	int strip = (flags & TOK_DECODE_STRIP) && t->kind == TOK_SPM && t->add_space_prefix;
	for (int i = 0; i < n_ids; i++) {
		size_t l;
		const char *p = tok_piece(t, ids[i], special, &l);
		if (strip && ids[i] != t->bos) { /* the space to drop follows BOS */
			if (l && p[0] == ' ') {
				p++;
				l--;
			}
			strip = 0;
		}
		memcpy(out + k, p, l);
		k += l;
	}
	out[k] = 0;
	*text = out;
	if (len)
		*len = k;
	return 0;
}

/* ---- streaming ---- */

int tok_stream_init(tok_stream_t *s, const tok_t *t, int special)
{
	memset(s, 0, sizeof *s);
	s->t = t;
	s->special = special;
	s->cap = 256;
	s->buf = malloc(s->cap);
	return s->buf ? 0 : SH_ENOMEM;
}

void tok_stream_free(tok_stream_t *s)
{
	free(s->buf);
	s->buf = NULL;
}

static const char *stream_out(tok_stream_t *s, const unsigned char *in, size_t n, int final,
			      size_t *len)
{
	/* each input byte becomes at most 3 output bytes (U+FFFD) */
	if (n * 3 + 1 > s->cap) {
		size_t cap = n * 3 + 64;
		char *b = realloc(s->buf, cap);
		if (!b) {
			*len = 0;
			return "";
		}
		s->buf = b;
		s->cap = cap;
	}
	size_t k = 0, i = 0;
	s->n_pend = 0;
	while (i < n) {
		int l = tok_utf8_valid(in + i, n - i);
		if (l) {
			memcpy(s->buf + k, in + i, (size_t)l);
			k += (size_t)l;
			i += (size_t)l;
			continue;
		}
		/* incomplete at the end (all continuation bytes so far): keep for later */
		int need = tok_utf8_len(in[i]);
		if (!final && in[i] >= 0xc2 && in[i] <= 0xf4 && n - i < (size_t)need) {
			int ok = 1;
			for (size_t j = i + 1; j < n; j++)
				ok &= (in[j] & 0xc0) == 0x80;
			if (ok) {
				memcpy(s->pend, in + i, n - i);
				s->n_pend = (int)(n - i);
				break;
			}
		}
		memcpy(s->buf + k, "\xef\xbf\xbd", 3);
		k += 3;
		i++;
	}
	s->buf[k] = 0;
	*len = k;
	return s->buf;
}

const char *tok_stream_push(tok_stream_t *s, int id, size_t *len)
{
	size_t l;
	const char *p = tok_piece(s->t, id, s->special, &l);
	unsigned char tmp[512];
	unsigned char *in = l + 4 <= sizeof tmp ? tmp : malloc(l + 4);
	if (!in) {
		*len = 0;
		return "";
	}
	memcpy(in, s->pend, (size_t)s->n_pend);
	memcpy(in + s->n_pend, p, l);
	const char *r = stream_out(s, in, (size_t)s->n_pend + l, 0, len);
	if (in != tmp)
		free(in);
	return r;
}

const char *tok_stream_flush(tok_stream_t *s, size_t *len)
{
	unsigned char in[4];
	size_t n = (size_t)s->n_pend;
	memcpy(in, s->pend, n);
	return stream_out(s, in, n, 1, len);
}
