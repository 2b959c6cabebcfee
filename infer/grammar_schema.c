/*
 * grammar_schema.c: JSON Schema (jansson tree) -> the node graph of grammar_int.h, and the
 * costs of shortest values that the matcher's termination rule needs.
 *
 * Every keyword outside the supported set is refused with its name and its place in the
 * schema (an annotation such as "description" is ignored); nothing is silently dropped, so a
 * reply that follows the graph validates against the schema. Invariant: on success every node
 * has a finite cost (a node with none would be a schema no value satisfies: refused).
 */
#include "infer/grammar_int.h"

#include "common/common.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- compiling ---------------------------------------------------------------------------- */

static int grow(void **p, int *cap, int need, size_t elem)
{
	if (need <= *cap)
		return 0;
	int nc = *cap ? *cap * 2 : 16;
	while (nc < need)
		nc *= 2;
	void *np = realloc(*p, (size_t)nc * elem);
	if (!np)
		return SH_ENOMEM;
	*p = np;
	*cap = nc;
	return 0;
}

static int node_add(eng_grammar_t *g, int type)
{
	if (grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes))
		return SH_ENOMEM;
	gnode_t *n = &g->nodes[g->n_nodes];
	memset(n, 0, sizeof *n);
	n->type = type;
	n->child = -1;
	n->hi = INT_MAX;
	return g->n_nodes++;
}

/* Adds the literals (JSON texts of values) as one node. */
static int lits_add(eng_grammar_t *g, json_t **vals, int nv)
{
	int id = node_add(g, G_LITS);
	if (id < 0)
		return id;
	if (grow((void **)&g->lits, &g->cap_lits, g->n_lits + nv, sizeof *g->lits))
		return SH_ENOMEM;
	/* lit_len follows lits' capacity */
	int *ll = realloc(g->lit_len, (size_t)g->cap_lits * sizeof *ll);
	if (!ll)
		return SH_ENOMEM;
	g->lit_len = ll;
	g->nodes[id].a = g->n_lits;
	for (int i = 0; i < nv; i++) {
		char *s = json_dumps(vals[i], JSON_COMPACT | JSON_ENCODE_ANY);
		if (!s)
			return SH_ENOMEM;
		g->lits[g->n_lits] = s;
		g->lit_len[g->n_lits++] = (int)strlen(s);
	}
	g->nodes[id].n = nv;
	return id;
}

static int lits_words(eng_grammar_t *g, const char *a, const char *b, const char *c)
{
	json_t *v[3];
	int n = 0;
	const char *w[3] = {a, b, c};
	for (int i = 0; i < 3; i++)
		if (w[i])
			v[n++] = !strcmp(w[i], "null")   ? json_null()
				 : !strcmp(w[i], "true") ? json_true()
							 : json_false();
	int rc = lits_add(g, v, n);
	for (int i = 0; i < n; i++)
		json_decref(v[i]);
	return rc;
}

static int alts_add(eng_grammar_t *g, const int *alt, int n)
{
	int id = node_add(g, G_ANYOF);
	if (id < 0)
		return id;
	if (grow((void **)&g->alts, &g->cap_alts, g->n_alts + n, sizeof *g->alts))
		return SH_ENOMEM;
	g->nodes[id].a = g->n_alts;
	g->nodes[id].n = n;
	memcpy(g->alts + g->n_alts, alt, (size_t)n * sizeof *alt);
	g->n_alts += n;
	return id;
}

/* The node for "any JSON value" (built once): anyOf object, array, string, number, literals. */
static int any_node(eng_grammar_t *g)
{
	if (g->any >= 0)
		return g->any;
	int alt[5];
	if ((alt[0] = node_add(g, G_OBJECT)) < 0 || (alt[1] = node_add(g, G_ARRAY)) < 0 ||
	    (alt[2] = node_add(g, G_STRING)) < 0 || (alt[3] = node_add(g, G_NUMBER)) < 0 ||
	    (alt[4] = lits_words(g, "true", "false", "null")) < 0)
		return SH_ENOMEM;
	int any = alts_add(g, alt, 5);
	if (any < 0)
		return any;
	g->nodes[alt[0]].child = any;
	g->nodes[alt[1]].child = any;
	g->any = any;
	return any;
}

typedef struct cctx {
	eng_grammar_t *g;
	char *err;
	size_t errlen;
	int depth;
} cctx_t;

static int compile(cctx_t *c, json_t *s, const char *path);

static int unsupported(cctx_t *c, const char *kw, const char *path)
{
	return sh_fail(c->err, c->errlen, SH_EUNSUPP,
		       "unsupported JSON Schema keyword '%s' at %s (supported: type, properties, "
		       "required, additionalProperties, items, enum, const, anyOf, minLength, "
		       "maxLength, minItems, maxItems)",
		       kw, path[0] ? path : "/");
}

static int bad_schema(cctx_t *c, const char *path, const char *what)
{
	return sh_fail(c->err, c->errlen, SH_EINVAL, "invalid schema at %s: %s",
		       path[0] ? path : "/", what);
}

/* A non-negative integer keyword, or dflt when absent. */
static int get_bound(cctx_t *c, json_t *s, const char *k, int dflt, const char *path, int *out)
{
	json_t *v = json_object_get(s, k);
	*out = dflt;
	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1 << 20)
		return sh_fail(c->err, c->errlen, SH_EINVAL,
			       "invalid schema at %s: '%s' must be a non-negative integer",
			       path[0] ? path : "/", k);
	*out = (int)json_integer_value(v);
	return 0;
}

static int value_has_type(json_t *v, const char *t)
{
	if (!strcmp(t, "string"))
		return json_is_string(v);
	if (!strcmp(t, "number"))
		return json_is_number(v);
	if (!strcmp(t, "integer"))
		return json_is_integer(v) ||
		       (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
	if (!strcmp(t, "boolean"))
		return json_is_boolean(v);
	if (!strcmp(t, "null"))
		return json_is_null(v);
	if (!strcmp(t, "object"))
		return json_is_object(v);
	if (!strcmp(t, "array"))
		return json_is_array(v);
	return 0;
}

static int compile_object(cctx_t *c, json_t *s, const char *path)
{
	eng_grammar_t *g = c->g;
	json_t *props = json_object_get(s, "properties");
	json_t *req = json_object_get(s, "required");
	json_t *addl = json_object_get(s, "additionalProperties");
	char sub[512];
	if (props && !json_is_object(props))
		return bad_schema(c, path, "'properties' must be an object");
	if (req && !json_is_array(req))
		return bad_schema(c, path, "'required' must be an array of names");
	if (addl && !json_is_boolean(addl) && !json_is_object(addl))
		return bad_schema(c, path, "'additionalProperties' must be a boolean or a schema");
	size_t nreq = req ? json_array_size(req) : 0;
	for (size_t i = 0; i < nreq; i++)
		if (!json_is_string(json_array_get(req, i)))
			return bad_schema(c, path, "'required' must be an array of names");
	size_t np = props ? json_object_size(props) : 0;
	/* required names that have no schema of their own take any value (or are impossible) */
	int extra_req = 0;
	for (size_t i = 0; i < nreq; i++)
		if (!json_object_get(props, json_string_value(json_array_get(req, i))))
			extra_req++;
	if (extra_req && json_is_false(addl))
		return bad_schema(c, path,
				  "a required property is not in 'properties' while "
				  "additionalProperties is false");
	if (np + (size_t)extra_req > GMAXSET)
		return sh_fail(c->err, c->errlen, SH_EUNSUPP,
			       "schema at %s has more than %d properties", path[0] ? path : "/",
			       GMAXSET);
	if (np + (size_t)extra_req == 0) { /* a free-form object */
		int id = node_add(g, G_OBJECT);
		if (id < 0)
			return id;
		int child = -1; /* -1: only "{}" */
		if (json_is_object(addl)) {
			snprintf(sub, sizeof sub, "%s/additionalProperties", path);
			if ((child = compile(c, addl, sub)) < 0)
				return child;
		} else if (!json_is_false(addl)) {
			if ((child = any_node(g)) < 0)
				return child;
		}
		g->nodes[id].child = child;
		return id;
	}
	int kids[GMAXSET];
	char *keys[GMAXSET];
	int isreq[GMAXSET];
	int k = 0;
	const char *name;
	json_t *ps;
	json_object_foreach(props, name, ps)
	{
		snprintf(sub, sizeof sub, "%s/properties/%s", path, name);
		if ((kids[k] = compile(c, ps, sub)) < 0)
			return kids[k];
		keys[k] = (char *)name;
		isreq[k] = 0;
		for (size_t i = 0; i < nreq; i++)
			if (!strcmp(json_string_value(json_array_get(req, i)), name))
				isreq[k] = 1;
		k++;
	}
	for (size_t i = 0; i < nreq; i++) {
		const char *rn = json_string_value(json_array_get(req, i));
		if (json_object_get(props, rn))
			continue;
		int dup = 0;
		for (int j = 0; j < k; j++)
			dup |= !strcmp(keys[j], rn);
		if (dup)
			continue;
		if ((kids[k] = json_is_object(addl) ? compile(c, addl, path) : any_node(g)) < 0)
			return kids[k];
		keys[k] = (char *)rn;
		isreq[k++] = 1;
	}
	int id = node_add(g, G_OBJECT);
	if (id < 0)
		return id;
	if (grow((void **)&g->props, &g->cap_props, g->n_props + k, sizeof *g->props))
		return SH_ENOMEM;
	g->nodes[id].a = g->n_props;
	g->nodes[id].n = k;
	for (int i = 0; i < k; i++) {
		json_t *js = json_string(keys[i]);
		char *kj = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
		json_decref(js);
		if (!kj)
			return SH_ENOMEM;
		g->props[g->n_props++] = (gprop_t){kj, (int)strlen(kj), kids[i], isreq[i]};
	}
	return id;
}

/* One "type" of s (with the keywords that apply to it). */
static int compile_typed(cctx_t *c, json_t *s, const char *t, const char *path)
{
	eng_grammar_t *g = c->g;
	char sub[512];
	int id, rc;
	if (!strcmp(t, "object"))
		return compile_object(c, s, path);
	if (!strcmp(t, "array")) {
		json_t *items = json_object_get(s, "items");
		int item;
		if (items && json_is_array(items))
			return unsupported(c, "items (as an array)", path);
		if (items) {
			snprintf(sub, sizeof sub, "%s/items", path);
			item = compile(c, items, sub);
		} else {
			item = any_node(g);
		}
		if (item < 0)
			return item;
		if ((id = node_add(g, G_ARRAY)) < 0)
			return id;
		g->nodes[id].child = item;
		if ((rc = get_bound(c, s, "minItems", 0, path, &g->nodes[id].lo)) ||
		    (rc = get_bound(c, s, "maxItems", INT_MAX, path, &g->nodes[id].hi)))
			return rc;
		if (g->nodes[id].lo > g->nodes[id].hi)
			return bad_schema(c, path, "minItems is above maxItems");
		return id;
	}
	if (!strcmp(t, "string")) {
		if ((id = node_add(g, G_STRING)) < 0)
			return id;
		if ((rc = get_bound(c, s, "minLength", 0, path, &g->nodes[id].lo)) ||
		    (rc = get_bound(c, s, "maxLength", INT_MAX, path, &g->nodes[id].hi)))
			return rc;
		if (g->nodes[id].lo > g->nodes[id].hi)
			return bad_schema(c, path, "minLength is above maxLength");
		return id;
	}
	if (!strcmp(t, "number"))
		return node_add(g, G_NUMBER);
	if (!strcmp(t, "integer"))
		return node_add(g, G_INTEGER);
	if (!strcmp(t, "boolean"))
		return lits_words(g, "true", "false", NULL);
	if (!strcmp(t, "null"))
		return lits_words(g, "null", NULL, NULL);
	char msg[96];
	snprintf(msg, sizeof msg, "unknown type '%.40s'", t);
	return bad_schema(c, path, msg);
}

static const char *const annotations[] = {"title",    "description", "$schema",  "$id",
					  "default",  "examples",    "$comment", "deprecated",
					  "readOnly", "writeOnly"};
static const char *const keywords[] = {
    "type",      "properties", "required", "additionalProperties",
    "items",     "enum",       "const",    "anyOf",
    "minLength", "maxLength",  "minItems", "maxItems"};

static int compile(cctx_t *c, json_t *s, const char *path)
{
	eng_grammar_t *g = c->g;
	if (json_is_true(s))
		return any_node(g);
	if (!json_is_object(s))
		return bad_schema(c, path, "a schema must be an object");
	if (++c->depth > 32) {
		c->depth--;
		return bad_schema(c, path, "nested more than 32 levels");
	}
	const char *k;
	json_t *v;
	json_object_foreach(s, k, v)
	{
		int ok = 0;
		for (size_t i = 0; i < ARRAY_LEN(annotations) && !ok; i++)
			ok = !strcmp(k, annotations[i]);
		for (size_t i = 0; i < ARRAY_LEN(keywords) && !ok; i++)
			ok = !strcmp(k, keywords[i]);
		if (!ok) {
			c->depth--;
			return unsupported(c, k, path);
		}
	}
	int id;
	json_t *type = json_object_get(s, "type");
	json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
	json_t *any = json_object_get(s, "anyOf");
	char sub[512];
	if (type && !json_is_string(type) && !json_is_array(type)) {
		id = bad_schema(c, path, "'type' must be a string or an array of strings");
	} else if (cn || en) {
		json_t *vals[GMAXSET];
		int nv = 0;
		size_t n = cn ? 1 : json_is_array(en) ? json_array_size(en) : 0;
		if (!cn && (!json_is_array(en) || n == 0))
			id = bad_schema(c, path, "'enum' must be a non-empty array");
		else if (n > GMAXSET)
			id = sh_fail(c->err, c->errlen, SH_EUNSUPP,
				     "'enum' at %s has more than %d values", path[0] ? path : "/",
				     GMAXSET);
		else {
			for (size_t i = 0; i < n; i++) {
				json_t *x = cn ? cn : json_array_get(en, i);
				int keep = !type;
				for (size_t j = 0;
				     type && j < (json_is_array(type) ? json_array_size(type) : 1);
				     j++) {
					json_t *tj =
					    json_is_array(type) ? json_array_get(type, j) : type;
					keep |= json_is_string(tj) &&
						value_has_type(x, json_string_value(tj));
				}
				if (keep)
					vals[nv++] = x;
			}
			id = nv ? lits_add(g, vals, nv)
				: bad_schema(c, path, "no 'enum'/'const' value has the given type");
		}
	} else if (any) {
		int alt[GMAXSET];
		size_t n = json_is_array(any) ? json_array_size(any) : 0;
		id = 0;
		if (n == 0)
			id = bad_schema(c, path, "'anyOf' must be a non-empty array");
		else if (n > GMAXSET)
			id = bad_schema(c, path, "'anyOf' has too many alternatives");
		else if (type)
			id = unsupported(c, "type (beside anyOf)", path);
		for (size_t i = 0; id == 0 && i < n; i++) {
			snprintf(sub, sizeof sub, "%s/anyOf/%zu", path, i);
			int a = compile(c, json_array_get(any, i), sub);
			if (a < 0)
				id = a;
			else
				alt[i] = a;
		}
		if (id == 0)
			id = alts_add(g, alt, (int)n);
	} else if (json_is_string(type)) {
		id = compile_typed(c, s, json_string_value(type), path);
	} else if (json_is_array(type)) {
		int alt[8];
		size_t n = json_array_size(type);
		id = 0;
		if (n == 0 || n > 8)
			id = bad_schema(c, path, "'type' must list 1 to 8 types");
		for (size_t i = 0; id == 0 && i < n; i++) {
			json_t *t = json_array_get(type, i);
			int a = json_is_string(t) ? compile_typed(c, s, json_string_value(t), path)
						  : bad_schema(c, path, "'type' must be strings");
			if (a < 0)
				id = a;
			else
				alt[i] = a;
		}
		if (id == 0)
			id = n == 1 ? alt[0] : alts_add(g, alt, (int)n);
	} else if (json_object_get(s, "properties") || json_object_get(s, "required") ||
		   json_object_get(s, "additionalProperties")) {
		id = compile_typed(c, s, "object", path);
	} else if (json_object_get(s, "items")) {
		id = compile_typed(c, s, "array", path);
	} else {
		id = any_node(g);
	}
	c->depth--;
	return id;
}

/* Shortest serialisations, to a fixed point (the "any" node refers to itself). */
static int costs(eng_grammar_t *g)
{
	for (int i = 0; i < g->n_nodes; i++)
		g->nodes[i].cost = GINF;
	for (int pass = 0, changed = 1; changed && pass < 4 * g->n_nodes + 4; pass++) {
		changed = 0;
		for (int i = 0; i < g->n_nodes; i++) {
			gnode_t *n = &g->nodes[i];
			long long c = GINF;
			switch (n->type) {
			case G_OBJECT:
				c = 2;
				for (int j = 0, first = 1; j < n->n; j++) {
					gprop_t *p = &g->props[n->a + j];
					if (p->req) {
						c += (first ? 0 : 1) + p->klen + 1 +
						     g->nodes[p->node].cost;
						first = 0;
					}
				}
				break;
			case G_ARRAY:
				c = n->lo == 0 ? 2
					       : 2 + (long long)n->lo * g->nodes[n->child].cost +
						     (n->lo - 1);
				break;
			case G_STRING: c = 2 + (long long)n->lo; break;
			case G_NUMBER:
			case G_INTEGER: c = 1; break;
			case G_LITS:
				for (int j = 0; j < n->n; j++)
					c = MIN(c, g->lit_len[n->a + j]);
				break;
			case G_ANYOF:
				for (int j = 0; j < n->n; j++)
					c = MIN(c, g->nodes[g->alts[n->a + j]].cost);
				break;
			}
			if (gram_sat(c) < n->cost) {
				n->cost = gram_sat(c);
				changed = 1;
			}
		}
	}
	for (int i = 0; i < g->n_nodes; i++) {
		gnode_t *n = &g->nodes[i];
		if (n->type != G_OBJECT || n->n == 0)
			continue;
		n->after = malloc((size_t)(n->n + 1) * sizeof *n->after);
		if (!n->after)
			return SH_ENOMEM;
		long long c = 1;
		n->after[n->n] = 1;
		for (int j = n->n - 1; j >= 0; j--) {
			gprop_t *p = &g->props[n->a + j];
			if (p->req)
				c += 1 + p->klen + 1 + g->nodes[p->node].cost;
			n->after[j] = gram_sat(c);
		}
	}
	return 0;
}

void eng_grammar_free(eng_grammar_t *g)
{
	if (!g)
		return;
	for (int i = 0; i < g->n_nodes; i++)
		free(g->nodes[i].after);
	for (int i = 0; i < g->n_props; i++)
		free(g->props[i].key);
	for (int i = 0; i < g->n_lits; i++)
		free(g->lits[i]);
	free(g->nodes);
	free(g->props);
	free(g->lits);
	free(g->lit_len);
	free(g->alts);
	free(g);
}

int eng_grammar_new(eng_grammar_t **out, const char *schema, size_t len, char *err, size_t errlen)
{
	*out = NULL;
	eng_grammar_t *g = calloc(1, sizeof *g);
	if (!g)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	g->any = -1;
	cctx_t c = {g, err, errlen, 0};
	int rc;
	if (!schema) { /* any JSON object */
		int id = node_add(g, G_OBJECT);
		int any = any_node(g);
		rc = id < 0 ? id : any < 0 ? any : 0;
		if (!rc) {
			g->nodes[id].child = any;
			g->root = id;
		}
	} else {
		json_error_t je;
		json_t *s = json_loadb(schema, len, JSON_DECODE_ANY, &je);
		if (!s) {
			rc = sh_fail(err, errlen, SH_EINVAL, "the schema is not JSON: %s", je.text);
		} else {
			rc = compile(&c, s, "");
			if (rc >= 0) {
				g->root = rc;
				rc = 0;
			}
			json_decref(s);
		}
	}
	if (!rc) {
		g->str = node_add(g, G_STRING); /* keys of free-form objects */
		rc = g->str < 0 ? g->str : costs(g);
	}
	if (!rc && g->nodes[g->root].cost >= GINF)
		rc = sh_fail(err, errlen, SH_EINVAL, "no JSON value satisfies the schema");
	if (rc) {
		if (rc == SH_ENOMEM)
			sh_fail(err, errlen, rc, "out of memory compiling the schema");
		eng_grammar_free(g);
		return rc;
	}
	*out = g;
	return 0;
}
