/*
 * grammar_int.h: the compiled schema shared by the compiler (grammar_schema.c) and the matcher
 * (grammar.c). Internal to infer/.
 *
 * A schema is a graph of nodes held in arrays and referred to by index (the "any value" node
 * refers to itself through its object and array alternatives). Invariant after eng_grammar_new:
 * every node's cost is the exact byte length of its shortest value, finite for every node
 * reachable from the root, and objects with properties have after[] filled.
 */
#ifndef SHOAL_GRAMMAR_INT_H
#define SHOAL_GRAMMAR_INT_H

#include "infer/grammar.h"

#define GMAXSET    64 /* properties per object, values per enum */
#define GINF       (1 << 28)
#define NUM_DIGITS 15 /* digits per part of a number: stays exact in a double */

enum gtype { G_OBJECT, G_ARRAY, G_STRING, G_NUMBER, G_INTEGER, G_LITS, G_ANYOF };

typedef struct gprop {
	char *key; /* JSON-encoded, quotes included */
	int klen, node, req;
} gprop_t;

typedef struct gnode {
	int type;
	int a, n;   /* object: props[a..a+n); lits: lits[a..a+n); anyOf: alts[a..a+n) */
	int child;  /* array: items; object without properties: every value (-1: only "{}") */
	int lo, hi; /* string: length bounds; array: item bounds (hi INT_MAX = none) */
	int cost;   /* bytes of the shortest value */
	int *after; /* object with properties: [n+1] cost to close once props [0, idx) are done */
} gnode_t;

struct eng_grammar {
	gnode_t *nodes;
	int n_nodes, cap_nodes;
	gprop_t *props;
	int n_props, cap_props;
	char **lits;
	int *lit_len;
	int n_lits, cap_lits;
	int *alts;
	int n_alts, cap_alts;
	int root; /* the value to produce */
	int any;  /* "any JSON value" (built on first use), or -1 */
	int str;  /* a plain string: keys of free-form objects */
};

/* x capped at GINF (costs add up without overflowing). */
static inline int gram_sat(long long x)
{
	return x > GINF ? GINF : (int)x;
}

#endif
