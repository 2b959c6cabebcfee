/*
 * tok_bpe.c: byte-level BPE (tokenizer.ggml.model "gpt2"). The pre-tokenizer (tok_pre.c) cuts
 * the text into words; each word's bytes are mapped to GPT-2's printable characters, then the
 * adjacent pair with the lowest merge rank is merged until no pair has a rank (ties: leftmost).
 * As in llama.cpp, a min-heap of candidate pairs makes this O(n log n) per word; a candidate is
 * stale when either side has changed size since it was queued.
 */
#include "infer/tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* GPT-2's mapping: printable Latin-1 bytes stand for themselves, the other 68 bytes take the
 * code points 256.. in byte order. */
static int printable(int b)
{
	return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
}

uint32_t tok_byte_to_cp(uint8_t b)
{
	if (printable(b))
		return b;
	uint32_t k = 0;
	for (int c = 0; c < b; c++)
		k += !printable(c);
	return 256 + k;
}

int tok_cp_to_byte(uint32_t cp)
{
	if (cp < 256)
		return printable((int)cp) ? (int)cp : -1;
	if (cp >= 256 + 68)
		return -1;
	uint32_t k = 0;
	for (int c = 0; c < 256; c++)
		if (!printable(c) && k++ == cp - 256)
			return c;
	return -1;
}

struct sym {
	int prev, next;
	size_t start, n;
};

struct pair {
	int rank, left, right;
	size_t size;
};

struct work {
	const tok_t *t;
	tok_ids_t *out;
	char *enc; /* byte-level text of the current word */
	size_t enc_cap;
	char *key; /* "left right" lookup buffer */
	struct sym *sy;
	size_t sy_cap;
	struct pair *h; /* min-heap */
	size_t hn, hcap;
	char cp_utf8[256][2];
	uint8_t cp_len[256];
};

static int pr_before(const struct pair *a, const struct pair *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static int heap_push(struct work *w, struct pair p)
{
	if (w->hn == w->hcap) {
		size_t cap = w->hcap ? w->hcap * 2 : 64;
		struct pair *v = realloc(w->h, cap * sizeof *v);
		if (!v)
			return -1;
		w->h = v;
		w->hcap = cap;
	}
	size_t i = w->hn++;
	while (i > 0) {
		size_t p2 = (i - 1) / 2;
		if (!pr_before(&p, &w->h[p2]))
			break;
		w->h[i] = w->h[p2];
		i = p2;
	}
	w->h[i] = p;
	return 0;
}

static struct pair heap_pop(struct work *w)
{
	struct pair top = w->h[0], last = w->h[--w->hn];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= w->hn)
			break;
		if (c + 1 < w->hn && pr_before(&w->h[c + 1], &w->h[c]))
			c++;
		if (!pr_before(&w->h[c], &last))
			break;
		w->h[i] = w->h[c];
		i = c;
	}
	if (w->hn)
		w->h[i] = last;
	return top;
}

static int try_pair(struct work *w, int l, int r)
{
	if (l < 0 || r < 0)
		return 0;
	size_t ln = w->sy[l].n, rn = w->sy[r].n;
	memcpy(w->key, w->enc + w->sy[l].start, ln);
	w->key[ln] = ' ';
	memcpy(w->key + ln + 1, w->enc + w->sy[r].start, rn);
	int rank = tok_map_get(&w->t->merges, w->key, ln + rn + 1);
	if (rank < 0)
		return 0;
	struct pair p = {rank, l, r, ln + rn};
	return heap_push(w, p);
}

static void emit(struct work *w, const char *s, size_t n)
{
	int id = tok_map_get(&w->t->vocab, s, n);
	if (id >= 0) {
		tok_ids_push(w->out, id);
		return;
	}
	/* not in the vocabulary: one token per byte character, skipping what is missing */
	for (size_t i = 0; i < n;) {
		size_t l = (size_t)tok_utf8_len((uint8_t)s[i]);
		if (l > n - i)
			l = n - i;
		id = tok_map_get(&w->t->vocab, s + i, l);
		if (id >= 0)
			tok_ids_push(w->out, id);
		i += l;
	}
}

static void bpe_word(void *ud, const char *word, size_t n)
{
	struct work *w = ud;
	if (!n || w->out->oom)
		return;
	if (n * 2 + 1 > w->enc_cap || n + 1 > w->sy_cap) {
		size_t cap = n * 2 + 64;
		char *e = realloc(w->enc, cap);
		char *k = e ? realloc(w->key, cap + 1) : NULL;
		if (e)
			w->enc = e;
		if (k)
			w->key = k;
		struct sym *sy = k ? realloc(w->sy, (n + 1) * sizeof *sy) : NULL;
		if (!sy) {
			w->out->oom = 1;
			return;
		}
		w->sy = sy;
		w->enc_cap = cap;
		w->sy_cap = n + 1;
	}
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		uint8_t b = (uint8_t)word[i];
		w->sy[i].start = k;
		w->sy[i].n = w->cp_len[b];
		w->sy[i].prev = (int)i - 1;
		w->sy[i].next = i + 1 == n ? -1 : (int)i + 1;
		memcpy(w->enc + k, w->cp_utf8[b], w->cp_len[b]);
		k += w->cp_len[b];
	}
	if (w->t->ignore_merges && tok_map_get(&w->t->vocab, w->enc, k) >= 0) {
		emit(w, w->enc, k);
		return;
	}
	w->hn = 0;
	for (size_t i = 1; i < n; i++)
		if (try_pair(w, (int)i - 1, (int)i)) {
			w->out->oom = 1;
			return;
		}
	while (w->hn) {
		struct pair p = heap_pop(w);
		struct sym *L = &w->sy[p.left], *R = &w->sy[p.right];
		if (L->n == 0 || R->n == 0 || L->n + R->n != p.size)
			continue;
		L->n += R->n;
		R->n = 0;
		L->next = R->next;
		if (R->next >= 0)
			w->sy[R->next].prev = p.left;
		if (try_pair(w, L->prev, p.left) || try_pair(w, p.left, L->next)) {
			w->out->oom = 1;
			return;
		}
	}
	for (int i = 0; i >= 0; i = w->sy[i].next)
		emit(w, w->enc + w->sy[i].start, w->sy[i].n);
}

void tok_bpe_encode(const tok_t *t, const char *s, size_t n, tok_ids_t *out)
{
	struct work w;
	memset(&w, 0, sizeof w);
	w.t = t;
	w.out = out;
	for (int b = 0; b < 256; b++) {
		char tmp[4];
		w.cp_len[b] = (uint8_t)tok_utf8_put(tmp, tok_byte_to_cp((uint8_t)b));
		memcpy(w.cp_utf8[b], tmp, 2);
	}
	if (tok_pre_split(t->pre_re, s, n, bpe_word, &w))
		out->oom = 1;
	free(w.enc);
	free(w.key);
	free(w.sy);
	free(w.h);
}
