/*
 * tok_spm.c: SentencePiece-style encoding (tokenizer.ggml.model "llama"), as llama.cpp's
 * llm_tokenizer_spm does it: spaces become U+2581, the text is cut into UTF-8 characters, and
 * the adjacent pair whose concatenation is the highest-scoring vocabulary entry is merged
 * repeatedly (ties: leftmost first). A max-heap of candidate pairs keeps this O(n log n); stale
 * candidates are recognised by their length no longer matching. A final piece missing from the
 * vocabulary falls back to its bytes (<0xNN> tokens), else to <unk>.
 */
#include "infer/tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

struct sym {
	int prev, next;
	size_t start, n; /* n == 0: merged away */
};

struct bigram {
	float score;
	int left, right;
	size_t size;
};

struct heap {
	struct bigram *v;
	size_t n, cap;
	int oom;
};

static int bg_before(const struct bigram *a, const struct bigram *b)
{
	return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(struct heap *h, struct bigram b)
{
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 64;
		struct bigram *v = realloc(h->v, cap * sizeof *v);
		if (!v) {
			h->oom = 1;
			return;
		}
		h->v = v;
		h->cap = cap;
	}
	size_t i = h->n++;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!bg_before(&b, &h->v[p]))
			break;
		h->v[i] = h->v[p];
		i = p;
	}
	h->v[i] = b;
}

static struct bigram heap_pop(struct heap *h)
{
	struct bigram top = h->v[0], last = h->v[--h->n];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= h->n)
			break;
		if (c + 1 < h->n && bg_before(&h->v[c + 1], &h->v[c]))
			c++;
		if (!bg_before(&h->v[c], &last))
			break;
		h->v[i] = h->v[c];
		i = c;
	}
	if (h->n)
		h->v[i] = last;
	return top;
}

static void try_pair(const tok_t *t, const char *s, const struct sym *sy, int l, int r,
		     struct heap *h)
{
	if (l < 0 || r < 0)
		return;
	size_t size = sy[l].n + sy[r].n;
	int id = tok_map_get(&t->vocab, s + sy[l].start, size);
	if (id < 0)
		return;
	struct bigram b = {t->score ? t->score[id] : 0.0f, l, r, size};
	heap_push(h, b);
}

void tok_spm_encode(const tok_t *t, const char *in, size_t n_in, tok_ids_t *out)
{
	/* escape spaces: ' ' (1 byte) -> U+2581 (3 bytes) */
	size_t n = 0;
	for (size_t i = 0; i < n_in; i++)
		n += in[i] == ' ' ? 3 : 1;
	char *s = malloc(n + 1);
	struct sym *sy = malloc((n + 1) * sizeof *sy);
	struct heap h = {0};
	if (!s || !sy) {
		out->oom = 1;
		goto done;
	}
	size_t k = 0;
	for (size_t i = 0; i < n_in; i++) {
		if (in[i] == ' ') {
			memcpy(s + k, "\xe2\x96\x81", 3);
			k += 3;
		} else {
			s[k++] = in[i];
		}
	}
	int ns = 0;
	for (size_t off = 0; off < n;) {
		/* a character, or a single byte where the UTF-8 is invalid */
		size_t l = (size_t)tok_utf8_valid((const unsigned char *)s + off, n - off);
		if (!l)
			l = 1;
		sy[ns].start = off;
		sy[ns].n = l;
		sy[ns].prev = ns - 1;
		off += l;
		sy[ns].next = off == n ? -1 : ns + 1;
		ns++;
	}
	for (int i = 1; i < ns; i++)
		try_pair(t, s, sy, i - 1, i, &h);
	while (h.n && !h.oom) {
		struct bigram b = heap_pop(&h);
		struct sym *L = &sy[b.left];
		struct sym *R = &sy[b.right];
		if (L->n == 0 || R->n == 0 || L->n + R->n != b.size)
			continue; /* stale: one side changed since the pair was queued */
		L->n += R->n;
		R->n = 0;
		L->next = R->next;
		if (R->next >= 0)
			sy[R->next].prev = b.left;
		try_pair(t, s, sy, L->prev, b.left, &h);
		try_pair(t, s, sy, b.left, L->next, &h);
	}
	if (h.oom) {
		out->oom = 1;
		goto done;
	}
	for (int i = ns ? 0 : -1; i >= 0; i = sy[i].next) {
		int id = tok_map_get(&t->vocab, s + sy[i].start, sy[i].n);
		if (id >= 0) {
			tok_ids_push(out, id);
			continue;
		}
		for (size_t j = 0; j < sy[i].n; j++) {
			int b = t->byte_tok[(uint8_t)s[sy[i].start + j]];
			tok_ids_push(out, b >= 0 ? b : t->unk >= 0 ? t->unk : 0);
		}
	}
done:
	free(s);
	free(sy);
	free(h.v);
}
