/*
 * grammar.c: the byte matcher over a compiled schema (grammar_schema.c builds it) and the
 * vocabulary walk that masks logits (see grammar.h for the form of the output and the
 * termination rule).
 *
 * Invariant: every state a matcher can reach has a completion (the node costs are finite for
 * every node reachable from the root), so masking with the cost rule never strands a request:
 * some single byte always moves towards the end of the value.
 */
#include "infer/grammar_int.h"

#include "common/common.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GDEPTH   24 /* nesting limit of generated values */
#define GTHREADS 8  /* alternatives followed at once (anyOf) */

/* ---- matching ----------------------------------------------------------------------------- */

typedef struct gframe {
	int32_t node;
	uint8_t st, sp, u8, pad; /* state; a space was taken; UTF-8 bytes owed; their lead */
	int32_t pos;             /* key/literal byte, string character, item or digit count */
	int32_t idx;             /* object: properties done */
	uint64_t mask;           /* key or literal candidates */
} gframe_t;

typedef struct gthread {
	int depth;
	gframe_t f[GDEPTH];
} gthread_t;

typedef struct gset {
	int n;
	gthread_t t[GTHREADS];
} gset_t;

enum { O_START, O_FIRST, O_NEXT, O_KEY, O_COLON, O_VALUE, O_AFTER };
enum { A_START, A_FIRST, A_AFTER, A_ITEM };
enum { S_START, S_IN, S_ESC };
enum { N_START, N_SIGN, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
enum { R_FAIL, R_OK, R_DONE, R_POP, R_PUSH };

static size_t thread_size(const gthread_t *t)
{
	return offsetof(gthread_t, f) + (size_t)t->depth * sizeof(gframe_t);
}

static void set_copy(gset_t *d, const gset_t *s)
{
	d->n = s->n;
	for (int i = 0; i < s->n; i++)
		memcpy(&d->t[i], &s->t[i], thread_size(&s->t[i]));
}

static void set_add(gset_t *s, const gthread_t *t)
{
	size_t sz = thread_size(t);
	for (int i = 0; i < s->n; i++)
		if (s->t[i].depth == t->depth && !memcmp(&s->t[i], t, sz))
			return;
	if (s->n < GTHREADS) /* beyond: dropped; the others are still valid paths */
		memcpy(&s->t[s->n++], t, sz);
}

static int push(gthread_t *t, int node)
{
	if (t->depth >= GDEPTH)
		return R_FAIL;
	gframe_t *f = &t->f[t->depth++];
	memset(f, 0, sizeof *f);
	f->node = node;
	return R_PUSH;
}

/* Properties an object may name next: from idx up to and including the first required one. */
static uint64_t candidates(const eng_grammar_t *g, const gnode_t *n, int idx)
{
	uint64_t m = 0;
	for (int i = idx; i < n->n; i++) {
		m |= 1ull << i;
		if (g->props[n->a + i].req)
			break;
	}
	return m;
}

static int may_close(const eng_grammar_t *g, const gnode_t *n, int idx)
{
	for (int i = idx; i < n->n; i++)
		if (g->props[n->a + i].req)
			return 0;
	return 1;
}

static int obj_byte(const eng_grammar_t *g, gthread_t *t, gframe_t *f, const gnode_t *n, int b)
{
	int declared = n->n > 0;
	switch (f->st) {
	case O_START:
		if (b != '{')
			return R_FAIL;
		f->st = O_FIRST;
		return R_OK;
	case O_FIRST:
	case O_NEXT:
		if (f->st == O_NEXT && b == ' ' && !f->sp) {
			f->sp = 1;
			return R_OK;
		}
		if (f->st == O_FIRST && b == '}')
			return (declared ? may_close(g, n, f->idx) : 1) ? R_DONE : R_FAIL;
		if (b != '"')
			return R_FAIL;
		if (!declared) {
			if (n->child < 0)
				return R_FAIL;
			f->st = O_COLON;
			return push(t, g->str);
		}
		f->mask = candidates(g, n, f->idx);
		if (!f->mask)
			return R_FAIL;
		f->pos = 1;
		f->st = O_KEY;
		return R_OK;
	case O_KEY: {
		uint64_t m = 0;
		int done = -1;
		for (int i = 0; i < n->n; i++) {
			const gprop_t *p = &g->props[n->a + i];
			if ((f->mask >> i & 1) && p->klen > f->pos && p->key[f->pos] == b) {
				m |= 1ull << i;
				if (p->klen == f->pos + 1)
					done = i;
			}
		}
		if (!m)
			return R_FAIL;
		f->mask = m;
		f->pos++;
		if (done >= 0) {
			f->idx = done + 1;
			f->st = O_COLON;
		}
		return R_OK;
	}
	case O_COLON:
		if (b != ':')
			return R_FAIL;
		f->st = O_VALUE;
		f->sp = 0;
		return R_OK;
	case O_VALUE:
		if (b == ' ' && !f->sp) {
			f->sp = 1;
			return R_OK;
		}
		f->st = O_AFTER;
		return push(t, declared ? g->props[n->a + f->idx - 1].node : n->child);
	case O_AFTER:
		if (b == '}')
			return (declared ? may_close(g, n, f->idx) : 1) ? R_DONE : R_FAIL;
		if (b != ',' || (declared && !candidates(g, n, f->idx)))
			return R_FAIL;
		f->st = O_NEXT;
		f->sp = 0;
		return R_OK;
	}
	return R_FAIL;
}

static int arr_byte(gthread_t *t, gframe_t *f, const gnode_t *n, int b)
{
	switch (f->st) {
	case A_START:
		if (b != '[')
			return R_FAIL;
		f->st = A_FIRST;
		return R_OK;
	case A_FIRST:
		if (b == ']')
			return n->lo == 0 ? R_DONE : R_FAIL;
		if (n->hi == 0)
			return R_FAIL;
		f->st = A_AFTER;
		f->pos = 1;
		return push(t, n->child);
	case A_AFTER:
		if (b == ']')
			return f->pos >= n->lo ? R_DONE : R_FAIL;
		if (b != ',' || f->pos >= n->hi)
			return R_FAIL;
		f->st = A_ITEM;
		f->sp = 0;
		return R_OK;
	case A_ITEM:
		if (b == ' ' && !f->sp) {
			f->sp = 1;
			return R_OK;
		}
		f->st = A_AFTER;
		f->pos++;
		return push(t, n->child);
	}
	return R_FAIL;
}

static int str_byte(gframe_t *f, const gnode_t *n, int b)
{
	if (f->st == S_START) {
		if (b != '"')
			return R_FAIL;
		f->st = S_IN;
		return R_OK;
	}
	if (f->st == S_ESC) {
		if (!strchr("\"\\/bfnrt", b) || !b)
			return R_FAIL;
		f->st = S_IN;
		return R_OK;
	}
	if (f->u8) {
		/* the first continuation byte after E0, ED, F0, F4 is narrower: no overlong forms,
		 * no surrogates, nothing above U+10FFFF */
		int lo = 0x80, hi = 0xbf;
		if (f->pad == 0xe0)
			lo = 0xa0;
		else if (f->pad == 0xed)
			hi = 0x9f;
		else if (f->pad == 0xf0)
			lo = 0x90;
		else if (f->pad == 0xf4)
			hi = 0x8f;
		if (b < lo || b > hi)
			return R_FAIL;
		f->pad = 0;
		f->u8--;
		return R_OK;
	}
	if (b == '"')
		return f->pos >= n->lo ? R_DONE : R_FAIL;
	if (b < 0x20 || f->pos >= n->hi)
		return R_FAIL;
	if (b == '\\')
		f->st = S_ESC;
	else if (b >= 0xc2 && b <= 0xdf)
		f->u8 = 1;
	else if (b >= 0xe0 && b <= 0xef)
		f->u8 = 2;
	else if (b >= 0xf0 && b <= 0xf4)
		f->u8 = 3;
	else if (b >= 0x80)
		return R_FAIL;
	if (f->u8)
		f->pad = (uint8_t)b;
	f->pos++;
	return R_OK;
}

static int num_accepting(int st)
{
	return st == N_ZERO || st == N_INT || st == N_FRAC || st == N_EXP;
}

static int num_byte(gframe_t *f, const gnode_t *n, int b)
{
	int digit = b >= '0' && b <= '9', isint = n->type == G_INTEGER;
	int next = -1;
	switch (f->st) {
	case N_START: next = b == '-' ? N_SIGN : b == '0' ? N_ZERO : digit ? N_INT : -1; break;
	case N_SIGN: next = b == '0' ? N_ZERO : digit ? N_INT : -1; break;
	case N_ZERO:
	case N_INT:
		if (digit && f->st == N_INT && f->pos < NUM_DIGITS)
			next = N_INT;
		else if (!isint && b == '.')
			next = N_DOT;
		else if (!isint && (b == 'e' || b == 'E'))
			next = N_E;
		break;
	case N_DOT: next = digit ? N_FRAC : -1; break;
	case N_FRAC:
		if (digit && f->pos < NUM_DIGITS)
			next = N_FRAC;
		else if (b == 'e' || b == 'E')
			next = N_E;
		break;
	case N_E: next = b == '+' || b == '-' ? N_ESIGN : digit ? N_EXP : -1; break;
	case N_ESIGN: next = digit ? N_EXP : -1; break;
	case N_EXP: next = digit && f->pos < 2 ? N_EXP : -1; break; /* stays finite */
	}
	if (next < 0)
		return num_accepting(f->st) ? R_POP : R_FAIL;
	f->pos = next == f->st ? f->pos + 1 : 1;
	f->st = (uint8_t)next;
	return R_OK;
}

static int lits_complete(const eng_grammar_t *g, const gframe_t *f, const gnode_t *n)
{
	if (f->st == 0)
		return 0;
	for (int i = 0; i < n->n; i++)
		if ((f->mask >> i & 1) && g->lit_len[n->a + i] == f->pos)
			return 1;
	return 0;
}

static int lits_byte(const eng_grammar_t *g, gframe_t *f, const gnode_t *n, int b)
{
	if (f->st == 0) {
		f->st = 1;
		f->mask = n->n >= 64 ? ~0ull : (1ull << n->n) - 1;
	}
	uint64_t m = 0;
	for (int i = 0; i < n->n; i++) {
		int l = g->lit_len[n->a + i];
		if ((f->mask >> i & 1) && l > f->pos &&
		    (unsigned char)g->lits[n->a + i][f->pos] == b)
			m |= 1ull << i;
	}
	if (!m)
		return lits_complete(g, f, n) ? R_POP : R_FAIL;
	f->mask = m;
	f->pos++;
	return R_OK;
}

/* Feeds byte b to thread t (modified), adding the resulting threads to out. */
static void feed_thread(const eng_grammar_t *g, gthread_t *t, int b, gset_t *out)
{
	for (;;) {
		if (t->depth == 0)
			return;
		gframe_t *f = &t->f[t->depth - 1];
		const gnode_t *n = &g->nodes[f->node];
		int r = R_FAIL;
		switch (n->type) {
		case G_ANYOF:
			for (int i = 0; i < n->n; i++) {
				gthread_t c;
				memcpy(&c, t, thread_size(t));
				c.f[c.depth - 1].node = g->alts[n->a + i];
				feed_thread(g, &c, b, out);
			}
			return;
		case G_OBJECT: r = obj_byte(g, t, f, n, b); break;
		case G_ARRAY: r = arr_byte(t, f, n, b); break;
		case G_STRING: r = str_byte(f, n, b); break;
		case G_NUMBER:
		case G_INTEGER: r = num_byte(f, n, b); break;
		case G_LITS: r = lits_byte(g, f, n, b); break;
		}
		switch (r) {
		case R_FAIL: return;
		case R_OK: set_add(out, t); return;
		case R_DONE:
			t->depth--;
			set_add(out, t);
			return;
		case R_POP: t->depth--; continue;
		case R_PUSH: continue;
		}
	}
}

static void feed_set(const eng_grammar_t *g, const gset_t *in, int b, gset_t *out)
{
	out->n = 0;
	for (int i = 0; i < in->n; i++) {
		gthread_t t;
		memcpy(&t, &in->t[i], thread_size(&in->t[i]));
		feed_thread(g, &t, b, out);
	}
}

static int thread_done(const eng_grammar_t *g, const gthread_t *t)
{
	if (t->depth == 0)
		return 1;
	if (t->depth > 1)
		return 0;
	const gframe_t *f = &t->f[0];
	const gnode_t *n = &g->nodes[f->node];
	if (n->type == G_NUMBER || n->type == G_INTEGER)
		return f->st != N_START && num_accepting(f->st);
	if (n->type == G_LITS)
		return lits_complete(g, f, n);
	return 0;
}

static int set_done(const eng_grammar_t *g, const gset_t *s)
{
	for (int i = 0; i < s->n; i++)
		if (thread_done(g, &s->t[i]))
			return 1;
	return 0;
}

/* Bytes needed to finish the value of frame f from its state. */
static long long frame_cost(const eng_grammar_t *g, const gframe_t *f)
{
	const gnode_t *n = &g->nodes[f->node];
	int declared = n->n > 0;
	switch (n->type) {
	case G_ANYOF: return n->cost;
	case G_OBJECT:
		switch (f->st) {
		case O_START: return n->cost;
		case O_FIRST: return declared ? (n->after[0] > 1 ? n->after[0] - 1 : 1) : 1;
		case O_NEXT:
			if (!declared)
				return 4 + (long long)g->nodes[n->child].cost;
			if (n->after[f->idx] > 1)
				return n->after[f->idx] - 1;
			{
				long long best = GINF;
				uint64_t m = candidates(g, n, f->idx);
				for (int i = 0; i < n->n; i++)
					if (m >> i & 1)
						best = MIN(
						    best,
						    g->props[n->a + i].klen + 1 +
							(long long)g->nodes[g->props[n->a + i].node]
							    .cost +
							1);
				return best;
			}
		case O_KEY: {
			long long best = GINF;
			for (int i = 0; i < n->n; i++)
				if (f->mask >> i & 1) {
					const gprop_t *p = &g->props[n->a + i];
					best =
					    MIN(best, (long long)(p->klen - f->pos) + 1 +
							  g->nodes[p->node].cost + n->after[i + 1]);
				}
			return best;
		}
		case O_COLON:
		case O_VALUE: {
			long long colon = f->st == O_COLON;
			if (!declared)
				return colon + g->nodes[n->child].cost + 1;
			return colon + g->nodes[g->props[n->a + f->idx - 1].node].cost +
			       n->after[f->idx];
		}
		case O_AFTER: return declared ? n->after[f->idx] : 1;
		}
		return GINF;
	case G_ARRAY: {
		long long c = g->nodes[n->child].cost;
		switch (f->st) {
		case A_START: return n->cost;
		case A_FIRST: return n->lo == 0 ? 1 : n->lo * c + (n->lo - 1) + 1;
		case A_AFTER: return (long long)MAX(0, n->lo - f->pos) * (1 + c) + 1;
		case A_ITEM: return c + (long long)MAX(0, n->lo - f->pos - 1) * (1 + c) + 1;
		}
		return GINF;
	}
	case G_STRING:
		if (f->st == S_START)
			return n->cost;
		return f->u8 + MAX(0, n->lo - f->pos) + (f->st == S_ESC ? 2 : 1);
	case G_NUMBER:
	case G_INTEGER: return f->st != N_START && num_accepting(f->st) ? 0 : 1;
	case G_LITS: {
		if (f->st == 0)
			return n->cost;
		long long best = GINF;
		for (int i = 0; i < n->n; i++)
			if (f->mask >> i & 1)
				best = MIN(best, g->lit_len[n->a + i] - f->pos);
		return best;
	}
	}
	return GINF;
}

static int set_min_close(const eng_grammar_t *g, const gset_t *s)
{
	long long best = GINF;
	for (int i = 0; i < s->n; i++) {
		long long c = 0;
		for (int d = 0; d < s->t[i].depth; d++)
			c += frame_cost(g, &s->t[i].f[d]);
		best = MIN(best, c);
	}
	return gram_sat(best);
}

/* ---- vocabulary ----------------------------------------------------------------------------- */

struct gram_vocab {
	int n;
	char *blob;
	size_t *off; /* [n] token i's bytes at blob + off[i] */
	int *len;    /* [n] */
	unsigned char *eog;
	int *chars; /* [n] characters when the token is plain string text (no quote, backslash,
		       control byte, broken UTF-8), else -1: the fast path inside strings */
	int *order; /* [n] ids sorted by bytes */
	int *lcp;   /* [n] common prefix with the previous token in order */
	int maxlen;
};

/* Characters of s[0..n) when every byte is string text a string frame takes without changing
 * state (printable ASCII but '"' and '\\', or whole UTF-8 characters under str_byte's rules),
 * else -1. */
static int plain_chars(const unsigned char *s, int n)
{
	int chars = 0;
	if (n == 0)
		return -1;
	for (int i = 0; i < n; chars++) {
		unsigned b = s[i];
		if (b < 0x80) {
			if (b < 0x20 || b == '"' || b == '\\')
				return -1;
			i++;
			continue;
		}
		int k = b >= 0xc2 && b <= 0xdf   ? 1
			: b >= 0xe0 && b <= 0xef ? 2
			: b >= 0xf0 && b <= 0xf4 ? 3
						 : -1;
		if (k < 0 || i + k >= n) /* not a lead byte, or the character is cut */
			return -1;
		for (int j = 1; j <= k; j++) {
			unsigned c = s[i + j], lo = 0x80, hi = 0xbf;
			if (j == 1 && b == 0xe0)
				lo = 0xa0;
			else if (j == 1 && b == 0xed)
				hi = 0x9f;
			else if (j == 1 && b == 0xf0)
				lo = 0x90;
			else if (j == 1 && b == 0xf4)
				hi = 0x8f;
			if (c < lo || c > hi)
				return -1;
		}
		i += k + 1;
	}
	return chars;
}

static const gram_vocab_t *sort_v;

static int cmp_tok(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	int lx = sort_v->len[x], ly = sort_v->len[y];
	int c = memcmp(sort_v->blob + sort_v->off[x], sort_v->blob + sort_v->off[y],
		       (size_t)MIN(lx, ly));
	if (c)
		return c;
	return lx != ly ? lx - ly : x - y;
}

gram_vocab_t *gram_vocab_new(const tok_t *t)
{
	static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER; /* qsort has no context */
	gram_vocab_t *v = calloc(1, sizeof *v);
	if (!v)
		return NULL;
	int n = v->n = tok_n_vocab(t);
	if (n <= 0) {
		free(v);
		return NULL;
	}
	size_t total = 0;
	for (int i = 0; i < n; i++) {
		size_t l;
		tok_piece(t, i, 0, &l);
		total += l;
	}
	v->blob = malloc(total + 1);
	v->off = malloc((size_t)n * sizeof *v->off);
	v->len = malloc((size_t)n * sizeof *v->len);
	v->eog = malloc((size_t)n);
	v->order = malloc((size_t)n * sizeof *v->order);
	v->lcp = malloc((size_t)n * sizeof *v->lcp);
	v->chars = malloc((size_t)n * sizeof *v->chars);
	if (!v->blob || !v->off || !v->len || !v->eog || !v->order || !v->lcp || !v->chars) {
		gram_vocab_free(v);
		return NULL;
	}
	size_t o = 0;
	for (int i = 0; i < n; i++) {
		size_t l;
		const char *p = tok_piece(t, i, 0, &l);
		memcpy(v->blob + o, p, l);
		v->off[i] = o;
		v->eog[i] = (unsigned char)tok_is_eog(t, i);
		v->len[i] = v->eog[i] ? 0 : (int)l; /* an end token is never text */
		v->maxlen = MAX(v->maxlen, (int)l);
		o += l;
		v->order[i] = i;
		v->chars[i] = plain_chars((const unsigned char *)p, v->len[i]);
	}
	pthread_mutex_lock(&sort_mu);
	sort_v = v;
	qsort(v->order, (size_t)n, sizeof *v->order, cmp_tok);
	pthread_mutex_unlock(&sort_mu);
	for (int i = 0; i < n; i++) {
		int k = 0;
		if (i > 0) {
			int a = v->order[i - 1], b = v->order[i];
			while (k < v->len[a] && k < v->len[b] &&
			       v->blob[v->off[a] + k] == v->blob[v->off[b] + k])
				k++;
		}
		v->lcp[i] = k;
	}
	return v;
}

void gram_vocab_free(gram_vocab_t *v)
{
	if (!v)
		return;
	free(v->blob);
	free(v->off);
	free(v->len);
	free(v->eog);
	free(v->order);
	free(v->lcp);
	free(v->chars);
	free(v);
}

/* One table per tokenizer, however many samplers use it (a list: engines are few). */
static struct shared_vocab {
	const tok_t *t;
	gram_vocab_t *v;
	int refs;
	struct shared_vocab *next;
} * shared_list;
static pthread_mutex_t shared_mu = PTHREAD_MUTEX_INITIALIZER;

gram_vocab_t *gram_vocab_shared(const tok_t *t)
{
	pthread_mutex_lock(&shared_mu);
	struct shared_vocab *e = shared_list;
	while (e && e->t != t)
		e = e->next;
	if (!e && (e = calloc(1, sizeof *e))) {
		e->t = t;
		if (!(e->v = gram_vocab_new(t))) {
			free(e);
			e = NULL;
		} else {
			e->next = shared_list;
			shared_list = e;
		}
	}
	if (e)
		e->refs++;
	pthread_mutex_unlock(&shared_mu);
	return e ? e->v : NULL;
}

void gram_vocab_release(gram_vocab_t *v)
{
	if (!v)
		return;
	pthread_mutex_lock(&shared_mu);
	for (struct shared_vocab **pp = &shared_list; *pp; pp = &(*pp)->next)
		if ((*pp)->v == v) {
			struct shared_vocab *e = *pp;
			if (--e->refs == 0) {
				*pp = e->next;
				gram_vocab_free(e->v);
				free(e);
			}
			break;
		}
	pthread_mutex_unlock(&shared_mu);
}

/* ---- the matcher ---------------------------------------------------------------------------- */

struct gram_match {
	const eng_grammar_t *g;
	const gram_vocab_t *v;
	gset_t cur;
	gset_t *walk;      /* [maxlen + 1] states along the current token during a mask */
	unsigned char *ok; /* [n vocab] verdicts of one mask */
};

gram_match_t *gram_match_new(const eng_grammar_t *g, const gram_vocab_t *v)
{
	gram_match_t *m = calloc(1, sizeof *m);
	if (!m)
		return NULL;
	m->g = g;
	m->v = v;
	m->cur.n = 1;
	m->cur.t[0].depth = 0;
	push(&m->cur.t[0], g->root);
	return m;
}

gram_match_t *gram_match_clone(const gram_match_t *m)
{
	gram_match_t *c = gram_match_new(m->g, m->v);
	if (c)
		set_copy(&c->cur, &m->cur);
	return c;
}

void gram_match_free(gram_match_t *m)
{
	if (!m)
		return;
	free(m->walk);
	free(m->ok);
	free(m);
}

int gram_match_feed(gram_match_t *m, const char *s, size_t n)
{
	gset_t *a = malloc(2 * sizeof *a);
	if (!a)
		return -1;
	set_copy(&a[0], &m->cur);
	int k = 0;
	for (size_t i = 0; i < n; i++, k ^= 1) {
		feed_set(m->g, &a[k], (unsigned char)s[i], &a[k ^ 1]);
		if (a[k ^ 1].n == 0) {
			free(a);
			return -1;
		}
	}
	set_copy(&m->cur, &a[k]);
	free(a);
	return 0;
}

int gram_match_accept(gram_match_t *m, int id)
{
	const gram_vocab_t *v = m->v;
	if (!v || id < 0 || id >= v->n)
		return -1;
	return gram_match_feed(m, v->blob + v->off[id], (size_t)v->len[id]);
}

int gram_match_done(const gram_match_t *m)
{
	return set_done(m->g, &m->cur);
}

int gram_match_min_close(const gram_match_t *m)
{
	return set_min_close(m->g, &m->cur);
}

void gram_match_mask(gram_match_t *m, float *logits, int budget)
{
	const gram_vocab_t *v = m->v;
	const eng_grammar_t *g = m->g;
	int done = set_done(g, &m->cur);
	int valid = 0;      /* walk[0..valid] hold the states along the current prefix */
	int dead = INT_MAX; /* a prefix of this length (of the previous token) cannot occur */
	int fit = 0, any = 0;
	if (!m->walk) { /* the walk's buffers: only matchers that mask need them */
		m->walk = malloc((size_t)(v->maxlen + 1) * sizeof *m->walk);
		m->ok = malloc((size_t)v->n);
		if (!m->walk || !m->ok) { /* no memory: this one step goes unmasked */
			free(m->walk);
			free(m->ok);
			m->walk = NULL;
			m->ok = NULL;
			return;
		}
	}
	unsigned char *ok = m->ok; /* 0 no, 1 grammar only, 2 grammar and budget */
	/* Inside a string (one alternative, no character half done), a token of plain text only
	 * moves the character count: judged from its count, without walking its bytes. */
	int fast = 0, lo = 0, hi = 0, pos = 0, base = 0;
	if (m->cur.n == 1 && m->cur.t[0].depth > 0) {
		const gframe_t *top = &m->cur.t[0].f[m->cur.t[0].depth - 1];
		const gnode_t *tn = &g->nodes[top->node];
		if (tn->type == G_STRING && top->st == S_IN && top->u8 == 0) {
			fast = 1;
			lo = tn->lo, hi = tn->hi, pos = top->pos;
			base = set_min_close(g, &m->cur) - (MAX(0, lo - pos) + 1);
		}
	}
	set_copy(&m->walk[0], &m->cur);
	for (int i = 0; i < v->n; i++) {
		int id = v->order[i], len = v->len[id], l = v->lcp[i];
		const unsigned char *p = (const unsigned char *)v->blob + v->off[id];
		ok[id] = 0;
		if (l < valid)
			valid = l;
		if (l >= dead)
			continue;
		dead = INT_MAX;
		if (len == 0) {
			if (v->eog[id] && done)
				ok[id] = 2;
			continue;
		}
		if (fast && v->chars[id] > 0) {
			int c = v->chars[id];
			if ((long long)pos + c <= hi)
				ok[id] = base + MAX(0, lo - pos - c) + 1 <= budget - 1 ? 2 : 1;
			continue;
		}
		int j;
		for (j = valid; j < len; j++) {
			feed_set(g, &m->walk[j], p[j], &m->walk[j + 1]);
			if (m->walk[j + 1].n == 0)
				break;
		}
		if (j < len) {
			valid = j;
			dead = j + 1;
			continue;
		}
		valid = len;
		/* budget counts tokens, the cost bytes: exact when the closing bytes are single
		 * tokens, which byte-fallback and byte-level vocabularies always have */
		ok[id] = set_min_close(g, &m->walk[len]) <= budget - 1 ? 2 : 1;
	}
	for (int i = 0; i < v->n; i++) {
		fit += ok[i] == 2;
		any += ok[i] != 0;
	}
	/* nothing closes within the budget (the shortest value is longer than the tokens left):
	 * follow the grammar alone; with nothing at all (bytes missing), let it end */
	int need = fit ? 2 : any ? 1 : 0;
	for (int i = 0; i < v->n; i++)
		if (need ? ok[i] < need : !v->eog[i])
			logits[i] = -INFINITY;
}
