/*
 * view.c: the membership view as JSON (docs/view.md) <-> plan_view_t, link-kind guessing, and
 * the checks a hand-built view must pass.
 *
 * Invariant: a view parsed here is canonical: node ids are lowercase, nodes are sorted by id and
 * each node's addresses, RDMA devices and seen_on entries are sorted by a total order, so the
 * same view in any input order gives the same struct and the same plan_view_to_json text.
 * Hostile input (wrong types, huge counts, long strings) is an error value, never a crash.
 */
#include "planner/plan_int.h"

#include "common/common.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static const char *const link_names[] = {"other", "wifi", "ethernet", "thunderbolt", "rdma"};

const char *plan_link_name(plan_link_t k)
{
	return (unsigned)k < ARRAY_LEN(link_names) ? link_names[k] : "other";
}

int plan_link_parse(const char *s)
{
	for (size_t i = 0; i < ARRAY_LEN(link_names) - 1; i++) /* "rdma" is not an address kind */
		if (!strcmp(s, link_names[i]))
			return (int)i;
	return -1;
}

static int has_prefix(const char *s, const char *p)
{
	return !strncmp(s, p, strlen(p));
}

plan_link_t plan_link_guess(const char *ifname)
{
	/* Order matters: "wl" before "en" cannot clash, but "ens"/"enp" are just "en". */
	if (has_prefix(ifname, "wl") || has_prefix(ifname, "wifi") || has_prefix(ifname, "ath"))
		return PLAN_LINK_WIFI;
	if (has_prefix(ifname, "thunderbolt") || has_prefix(ifname, "tb") ||
	    has_prefix(ifname, "bridge"))
		return PLAN_LINK_THUNDERBOLT;
	if (has_prefix(ifname, "en") || has_prefix(ifname, "eth") || has_prefix(ifname, "veth") ||
	    has_prefix(ifname, "ib"))
		return PLAN_LINK_ETHERNET;
	return PLAN_LINK_OTHER;
}

/* ---- canonical order ---- */

static int cmp_addr(const void *a, const void *b)
{
	const plan_addr_t *x = a, *y = b;
	if (x->kind != y->kind)
		return x->kind > y->kind ? -1 : 1; /* best link first */
	int c = strcmp(x->ifname, y->ifname);
	return c ? c : strcmp(x->ip, y->ip);
}

static int cmp_rdma(const void *a, const void *b)
{
	const plan_rdma_t *x = a, *y = b;
	int c = strcmp(x->name, y->name);
	if (!c)
		c = strcmp(x->ifname, y->ifname);
	return c ? c : (y->port_active - x->port_active);
}

static int cmp_seen(const void *a, const void *b)
{
	const plan_seen_t *x = a, *y = b;
	int c = strcmp(x->node_id, y->node_id);
	return c ? c : strcmp(x->ifname, y->ifname);
}

static int cmp_meas(const void *a, const void *b)
{
	return strcmp(((const plan_meas_t *)a)->node_id, ((const plan_meas_t *)b)->node_id);
}

static int cmp_node(const void *a, const void *b)
{
	return strcmp(((const plan_node_t *)a)->node_id, ((const plan_node_t *)b)->node_id);
}

static void view_sort(plan_view_t *v)
{
	for (size_t i = 0; i < v->n_nodes; i++) {
		plan_node_t *n = &v->nodes[i];
		if (n->n_addrs)
			qsort(n->addrs, n->n_addrs, sizeof *n->addrs, cmp_addr);
		if (n->n_rdma)
			qsort(n->rdma, n->n_rdma, sizeof *n->rdma, cmp_rdma);
		if (n->n_seen)
			qsort(n->seen, n->n_seen, sizeof *n->seen, cmp_seen);
		if (n->n_links)
			qsort(n->links, n->n_links, sizeof *n->links, cmp_meas);
	}
	if (v->n_nodes)
		qsort(v->nodes, v->n_nodes, sizeof *v->nodes, cmp_node);
}

/* ---- checks ---- */

static int id_ok(const char *s)
{
	size_t n = 0;
	for (; s[n]; n++)
		if (!isxdigit((unsigned char)s[n]) || isupper((unsigned char)s[n]))
			return 0;
	return n == PLAN_ID_LEN;
}

/* A fixed-size string field holds its NUL (a hand-built view may not). */
#define TERMINATED(field) (memchr((field), 0, sizeof(field)) != NULL)

static int node_strings_ok(const plan_node_t *n)
{
	if (!TERMINATED(n->node_id) || !TERMINATED(n->host) || !TERMINATED(n->machine))
		return 0;
	for (size_t k = 0; k < n->n_links; k++)
		if (!TERMINATED(n->links[k].node_id))
			return 0;
	for (size_t a = 0; a < n->n_addrs; a++)
		if (!TERMINATED(n->addrs[a].ip) || !TERMINATED(n->addrs[a].ifname))
			return 0;
	for (size_t d = 0; d < n->n_rdma; d++)
		if (!TERMINATED(n->rdma[d].name) || !TERMINATED(n->rdma[d].ifname))
			return 0;
	for (size_t k = 0; k < n->n_seen; k++)
		if (!TERMINATED(n->seen[k].node_id) || !TERMINATED(n->seen[k].ifname))
			return 0;
	return 1;
}

int plan_view_check(const plan_view_t *v, char *err, size_t errlen)
{
	if (!v || !v->n_nodes)
		return sh_fail(err, errlen, SH_EINVAL, "view has no nodes");
	if (v->n_nodes > PLAN_MAX_NODES)
		return sh_fail(err, errlen, SH_EINVAL, "view has %zu nodes (at most %d)",
			       v->n_nodes, PLAN_MAX_NODES);
	for (size_t i = 0; i < v->n_nodes; i++) {
		const plan_node_t *n = &v->nodes[i];
		if ((n->n_addrs && !n->addrs) || (n->n_rdma && !n->rdma) ||
		    (n->n_seen && !n->seen) || (n->n_links && !n->links))
			return sh_fail(err, errlen, SH_EINVAL, "node %zu: missing array", i);
		if (n->n_addrs > PLAN_MAX_ADDRS || n->n_rdma > PLAN_MAX_RDMA ||
		    n->n_seen > PLAN_MAX_NODES || n->n_links > PLAN_MAX_NODES)
			return sh_fail(err, errlen, SH_EINVAL, "node %zu: too many entries", i);
		if (!node_strings_ok(n))
			return sh_fail(err, errlen, SH_EINVAL, "node %zu: unterminated string", i);
		if (!id_ok(n->node_id))
			return sh_fail(err, errlen, SH_EINVAL,
				       "node %zu: node_id must be 32 lowercase hex characters", i);
		for (size_t j = 0; j < i; j++)
			if (!strcmp(v->nodes[j].node_id, n->node_id))
				return sh_fail(err, errlen, SH_EINVAL, "node %s appears twice",
					       n->node_id);
		if (!n->mem_avail)
			return sh_fail(err, errlen, SH_EINVAL, "node %s: mem_avail is 0",
				       n->node_id);
		for (size_t a = 0; a < n->n_addrs; a++)
			if ((unsigned)n->addrs[a].kind > PLAN_LINK_THUNDERBOLT)
				return sh_fail(err, errlen, SH_EINVAL, "node %s: bad address kind",
					       n->node_id);
		if (n->threads < 0)
			return sh_fail(err, errlen, SH_EINVAL, "node %s: negative threads",
				       n->node_id);
		for (size_t k = 0; k < n->n_links; k++) {
			const plan_meas_t *e = &n->links[k];
			if (!e->rtt_us || !e->mbps)
				return sh_fail(
				    err, errlen, SH_EINVAL,
				    "node %s: the link to %.8s needs rtt_us and mbps > 0",
				    n->node_id, e->node_id);
			if (!strcmp(e->node_id, n->node_id))
				return sh_fail(err, errlen, SH_EINVAL, "node %s: a link to itself",
					       n->node_id);
			for (size_t q = 0; q < k; q++)
				if (!strcmp(n->links[q].node_id, e->node_id))
					return sh_fail(err, errlen, SH_EINVAL,
						       "node %s: two links to %.8s", n->node_id,
						       e->node_id);
		}
	}
	return 0;
}

/* ---- JSON -> view ---- */

/* Copies a string member into dst. required: missing is an error; otherwise dst stays "". */
static int get_str(json_t *o, const char *key, char *dst, size_t cap, int required,
		   const char *what, char *err, size_t errlen)
{
	json_t *j = json_object_get(o, key);
	dst[0] = 0;
	if (!j) {
		if (required)
			return sh_fail(err, errlen, SH_EFORMAT, "%s: missing \"%s\"", what, key);
		return 0;
	}
	if (!json_is_string(j))
		return sh_fail(err, errlen, SH_EFORMAT, "%s: \"%s\" must be a string", what, key);
	size_t len = json_string_length(j);
	const char *s = json_string_value(j);
	if (len >= cap || strlen(s) != len)
		return sh_fail(err, errlen, SH_EFORMAT, "%s: \"%s\" is too long or has a NUL", what,
			       key);
	memcpy(dst, s, len + 1);
	return 0;
}

/* Reads a non-negative integer member no larger than max; missing leaves *out unchanged. */
static int get_uint(json_t *o, const char *key, uint64_t *out, uint64_t max, int required,
		    const char *what, char *err, size_t errlen)
{
	json_t *j = json_object_get(o, key);
	if (!j) {
		if (required)
			return sh_fail(err, errlen, SH_EFORMAT, "%s: missing \"%s\"", what, key);
		return 0;
	}
	if (!json_is_integer(j) || json_integer_value(j) < 0 ||
	    (uint64_t)json_integer_value(j) > max)
		return sh_fail(err, errlen, SH_EFORMAT,
			       "%s: \"%s\" must be an integer from 0 to %llu", what, key,
			       (unsigned long long)max);
	*out = (uint64_t)json_integer_value(j);
	return 0;
}

static int get_array(json_t *o, const char *key, size_t max, json_t **out, const char *what,
		     char *err, size_t errlen)
{
	json_t *j = json_object_get(o, key);
	*out = NULL;
	if (!j || json_is_null(j))
		return 0;
	if (!json_is_array(j))
		return sh_fail(err, errlen, SH_EFORMAT, "%s: \"%s\" must be an array", what, key);
	if (json_array_size(j) > max)
		return sh_fail(err, errlen, SH_EFORMAT, "%s: \"%s\" has more than %zu entries",
			       what, key, max);
	*out = j;
	return 0;
}

static int parse_id(json_t *o, const char *key, char *dst, const char *what, char *err,
		    size_t errlen)
{
	int rc = get_str(o, key, dst, PLAN_ID_LEN + 1, 1, what, err, errlen);
	if (rc)
		return rc;
	for (char *p = dst; *p; p++)
		*p = (char)tolower((unsigned char)*p);
	if (!id_ok(dst))
		return sh_fail(err, errlen, SH_EFORMAT, "%s: \"%s\" must be 32 hex characters",
			       what, key);
	return 0;
}

static int parse_addr(plan_addr_t *a, json_t *o, const char *what, char *err, size_t errlen)
{
	if (!json_is_object(o))
		return sh_fail(err, errlen, SH_EFORMAT, "%s: an address must be an object", what);
	int rc = get_str(o, "ip", a->ip, sizeof a->ip, 1, what, err, errlen);
	if (!rc)
		rc = get_str(o, "ifname", a->ifname, sizeof a->ifname, 0, what, err, errlen);
	char kind[32];
	if (!rc)
		rc = get_str(o, "kind", kind, sizeof kind, 0, what, err, errlen);
	if (rc)
		return rc;
	unsigned char buf[16];
	if (inet_pton(AF_INET, a->ip, buf) != 1 && inet_pton(AF_INET6, a->ip, buf) != 1)
		return sh_fail(err, errlen, SH_EFORMAT, "%s: \"%s\" is not an IP address", what,
			       a->ip);
	uint64_t prefix = 0;
	if ((rc = get_uint(o, "prefix", &prefix, 128, 0, what, err, errlen)))
		return rc;
	a->prefix = (int)prefix;
	if (kind[0]) {
		int k = plan_link_parse(kind);
		if (k < 0)
			return sh_fail(
			    err, errlen, SH_EFORMAT,
			    "%s: kind \"%s\" is not thunderbolt, ethernet, wifi or other", what,
			    kind);
		a->kind = (plan_link_t)k;
	} else {
		a->kind = plan_link_guess(a->ifname);
	}
	return 0;
}

static int parse_rdma(plan_rdma_t *d, json_t *o, const char *what, char *err, size_t errlen)
{
	if (!json_is_object(o))
		return sh_fail(err, errlen, SH_EFORMAT, "%s: an RDMA device must be an object",
			       what);
	int rc = get_str(o, "name", d->name, sizeof d->name, 1, what, err, errlen);
	if (!rc)
		rc = get_str(o, "ifname", d->ifname, sizeof d->ifname, 0, what, err, errlen);
	if (rc)
		return rc;
	/* macOS names a device after its Thunderbolt interface: rdma_en3 -> en3. */
	if (!d->ifname[0] && has_prefix(d->name, "rdma_") && strlen(d->name + 5) < sizeof d->ifname)
		strcpy(d->ifname, d->name + 5);
	json_t *pa = json_object_get(o, "port_active");
	if (pa && !json_is_boolean(pa))
		return sh_fail(err, errlen, SH_EFORMAT, "%s: \"port_active\" must be a boolean",
			       what);
	d->port_active = pa ? json_is_true(pa) : 1;
	return 0;
}

/* A number of GB/s (0..1e6) kept as whole MB/s; missing or null leaves *out 0. */
static int get_gbs(json_t *o, const char *key, uint32_t *out, const char *what, char *err,
		   size_t errlen)
{
	json_t *j = json_object_get(o, key);
	if (!j || json_is_null(j))
		return 0;
	if (!json_is_number(j) || !(json_number_value(j) >= 0) || json_number_value(j) > 1e6)
		return sh_fail(err, errlen, SH_EFORMAT,
			       "%s: \"%s\" must be a number of GB/s from 0 to 1e6", what, key);
	*out = (uint32_t)(json_number_value(j) * 1000.0 + 0.5);
	return 0;
}

/* A measured figure: a number from 0 to max, rounded to an integer. */
static int get_figure(json_t *o, const char *key, uint32_t *out, double max, int required,
		      const char *what, char *err, size_t errlen)
{
	json_t *j = json_object_get(o, key);
	if (!j) {
		if (required)
			return sh_fail(err, errlen, SH_EFORMAT, "%s: a link needs \"%s\"", what,
				       key);
		return 0;
	}
	if (!json_is_number(j) || !(json_number_value(j) >= 0) || json_number_value(j) > max)
		return sh_fail(err, errlen, SH_EFORMAT,
			       "%s: \"%s\" must be a number from 0 to %.0f", what, key, max);
	*out = (uint32_t)(json_number_value(j) + 0.5);
	return 0;
}

static int parse_meas(plan_meas_t *e, json_t *o, const char *what, char *err, size_t errlen)
{
	if (!json_is_object(o))
		return sh_fail(err, errlen, SH_EFORMAT, "%s: a link must be an object", what);
	int rc;
	if ((rc = parse_id(o, "node_id", e->node_id, what, err, errlen)) ||
	    (rc = get_figure(o, "rtt_us", &e->rtt_us, 1e8, 1, what, err, errlen)) ||
	    (rc = get_figure(o, "rtt_p90_us", &e->rtt_p90_us, 1e8, 0, what, err, errlen)) ||
	    (rc = get_figure(o, "mbps", &e->mbps, 1e9, 1, what, err, errlen)))
		return rc;
	if (!e->rtt_us || !e->mbps)
		return sh_fail(err, errlen, SH_EFORMAT,
			       "%s: the link to %.8s needs rtt_us and mbps above 0", what,
			       e->node_id);
	return 0;
}

static int parse_node(plan_node_t *n, json_t *o, size_t idx, char *err, size_t errlen)
{
	char what[64];
	snprintf(what, sizeof what, "node %zu", idx);
	if (!json_is_object(o))
		return sh_fail(err, errlen, SH_EFORMAT, "%s: must be an object", what);
	int rc = parse_id(o, "node_id", n->node_id, what, err, errlen);
	if (rc)
		return rc;
	snprintf(what, sizeof what, "node %.8s", n->node_id);
	uint64_t port = 0, cores = 0, mem_total = 0;
	if ((rc = get_str(o, "host", n->host, sizeof n->host, 0, what, err, errlen)) ||
	    (rc = get_uint(o, "port", &port, 65535, 0, what, err, errlen)) ||
	    (rc = get_uint(o, "mem_avail", &n->mem_avail, (uint64_t)1 << 60, 1, what, err,
			   errlen)) ||
	    (rc = get_uint(o, "mem_total", &mem_total, (uint64_t)1 << 60, 0, what, err, errlen)) ||
	    (rc = get_uint(o, "cores", &cores, 1 << 20, 0, what, err, errlen)))
		return rc;
	if (!n->mem_avail)
		return sh_fail(err, errlen, SH_EFORMAT, "%s: mem_avail must be positive", what);
	n->port = (int)port;
	n->cores = (int)cores;
	n->mem_total = mem_total ? mem_total : n->mem_avail;
	uint64_t threads = 0, wake = 0;
	if ((rc = get_gbs(o, "bw", &n->bw_mbs, what, err, errlen)) ||
	    (rc = get_gbs(o, "prefill_bw", &n->prefill_mbs, what, err, errlen)) ||
	    (rc = get_uint(o, "threads", &threads, 1 << 20, 0, what, err, errlen)) ||
	    (rc = get_uint(o, "wake_us", &wake, 100000000, 0, what, err, errlen)) ||
	    (rc = get_str(o, "machine", n->machine, sizeof n->machine, 0, what, err, errlen)))
		return rc;
	n->threads = (int)threads;
	n->wake_us = (uint32_t)wake;
	json_t *arr;
	size_t i;
	json_t *e;
	if ((rc = get_array(o, "addresses", PLAN_MAX_ADDRS, &arr, what, err, errlen)))
		return rc;
	if (arr && json_array_size(arr)) {
		n->addrs = calloc(json_array_size(arr), sizeof *n->addrs);
		if (!n->addrs)
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		json_array_foreach(arr, i, e)
		{
			if ((rc = parse_addr(&n->addrs[i], e, what, err, errlen)))
				return rc;
			n->n_addrs++;
		}
	}
	if ((rc = get_array(o, "rdma", PLAN_MAX_RDMA, &arr, what, err, errlen)))
		return rc;
	if (arr && json_array_size(arr)) {
		n->rdma = calloc(json_array_size(arr), sizeof *n->rdma);
		if (!n->rdma)
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		json_array_foreach(arr, i, e)
		{
			if ((rc = parse_rdma(&n->rdma[i], e, what, err, errlen)))
				return rc;
			n->n_rdma++;
		}
	}
	if ((rc = get_array(o, "seen_on", PLAN_MAX_NODES, &arr, what, err, errlen)))
		return rc;
	if (arr && json_array_size(arr)) {
		n->seen = calloc(json_array_size(arr), sizeof *n->seen);
		if (!n->seen)
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		json_array_foreach(arr, i, e)
		{
			if (!json_is_object(e))
				return sh_fail(err, errlen, SH_EFORMAT,
					       "%s: a seen_on entry must be an object", what);
			if ((rc = parse_id(e, "node_id", n->seen[i].node_id, what, err, errlen)) ||
			    (rc = get_str(e, "ifname", n->seen[i].ifname, sizeof n->seen[i].ifname,
					  1, what, err, errlen)))
				return rc;
			n->n_seen++;
		}
	}
	if ((rc = get_array(o, "links", PLAN_MAX_NODES, &arr, what, err, errlen)))
		return rc;
	if (arr && json_array_size(arr)) {
		n->links = calloc(json_array_size(arr), sizeof *n->links);
		if (!n->links)
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		json_array_foreach(arr, i, e)
		{
			if ((rc = parse_meas(&n->links[i], e, what, err, errlen)))
				return rc;
			n->n_links++;
		}
	}
	return 0;
}

void plan_view_free(plan_view_t *v)
{
	if (!v)
		return;
	for (size_t i = 0; i < v->n_nodes; i++) {
		free(v->nodes[i].addrs);
		free(v->nodes[i].rdma);
		free(v->nodes[i].seen);
		free(v->nodes[i].links);
	}
	free(v->nodes);
	free(v);
}

int plan_view_from_json(plan_view_t **out, const char *json, char *err, size_t errlen)
{
	*out = NULL;
	json_error_t jerr;
	json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return sh_fail(err, errlen, SH_EFORMAT, "view: line %d: %s", jerr.line, jerr.text);
	int rc = 0;
	plan_view_t *v = calloc(1, sizeof *v);
	if (!v) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto fail;
	}
	if (!json_is_object(root)) {
		rc = sh_fail(err, errlen, SH_EFORMAT, "view: must be a JSON object");
		goto fail;
	}
	if ((rc = get_uint(root, "epoch", &v->epoch, INT64_MAX, 0, "view", err, errlen)))
		goto fail;
	json_t *nodes = json_object_get(root, "nodes");
	if (!json_is_array(nodes) || !json_array_size(nodes)) {
		rc = sh_fail(err, errlen, SH_EFORMAT, "view: \"nodes\" must be a non-empty array");
		goto fail;
	}
	if (json_array_size(nodes) > PLAN_MAX_NODES) {
		rc = sh_fail(err, errlen, SH_EFORMAT, "view: more than %d nodes", PLAN_MAX_NODES);
		goto fail;
	}
	v->nodes = calloc(json_array_size(nodes), sizeof *v->nodes);
	if (!v->nodes) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto fail;
	}
	size_t i;
	json_t *e;
	json_array_foreach(nodes, i, e)
	{
		v->n_nodes++; /* counted first so a half-parsed node is freed */
		if ((rc = parse_node(&v->nodes[i], e, i, err, errlen)))
			goto fail;
	}
	view_sort(v);
	if ((rc = plan_view_check(v, err, errlen))) {
		rc = SH_EFORMAT;
		goto fail;
	}
	json_decref(root);
	*out = v;
	return 0;
fail:
	json_decref(root);
	plan_view_free(v);
	return rc;
}

/* ---- view -> JSON ---- */

static json_t *node_json(const plan_node_t *n)
{
	json_t *o = json_object(), *a = json_array(), *r = json_array(), *s = json_array();
	if (!o || !a || !r || !s)
		goto fail;
	json_object_set_new(o, "node_id", json_string(n->node_id));
	json_object_set_new(o, "host", json_string(n->host));
	json_object_set_new(o, "port", json_integer(n->port));
	json_object_set_new(o, "mem_total", json_integer((json_int_t)n->mem_total));
	json_object_set_new(o, "mem_avail", json_integer((json_int_t)n->mem_avail));
	json_object_set_new(o, "cores", json_integer(n->cores));
	if (n->bw_mbs)
		json_object_set_new(o, "bw", json_real(n->bw_mbs / 1000.0));
	if (n->prefill_mbs)
		json_object_set_new(o, "prefill_bw", json_real(n->prefill_mbs / 1000.0));
	if (n->threads)
		json_object_set_new(o, "threads", json_integer(n->threads));
	if (n->wake_us)
		json_object_set_new(o, "wake_us", json_integer(n->wake_us));
	if (n->machine[0])
		json_object_set_new(o, "machine", json_string(n->machine));
	for (size_t i = 0; i < n->n_addrs; i++) {
		json_t *ad =
		    json_pack("{s:s, s:s, s:s}", "ip", n->addrs[i].ip, "ifname", n->addrs[i].ifname,
			      "kind", plan_link_name(n->addrs[i].kind));
		if (ad && n->addrs[i].prefix)
			json_object_set_new(ad, "prefix", json_integer(n->addrs[i].prefix));
		json_array_append_new(a, ad);
	}
	for (size_t i = 0; i < n->n_rdma; i++)
		json_array_append_new(r, json_pack("{s:s, s:s, s:b}", "name", n->rdma[i].name,
						   "ifname", n->rdma[i].ifname, "port_active",
						   n->rdma[i].port_active));
	for (size_t i = 0; i < n->n_seen; i++)
		json_array_append_new(s, json_pack("{s:s, s:s}", "node_id", n->seen[i].node_id,
						   "ifname", n->seen[i].ifname));
	json_object_set_new(o, "addresses", a);
	json_object_set_new(o, "rdma", r);
	json_object_set_new(o, "seen_on", s);
	if (n->n_links) {
		json_t *l = json_array();
		for (size_t i = 0; l && i < n->n_links; i++) {
			const plan_meas_t *e = &n->links[i];
			json_t *x =
			    json_pack("{s:s, s:I, s:I, s:I}", "node_id", e->node_id, "rtt_us",
				      (json_int_t)e->rtt_us, "rtt_p90_us",
				      (json_int_t)(e->rtt_p90_us ? e->rtt_p90_us : e->rtt_us),
				      "mbps", (json_int_t)e->mbps);
			json_array_append_new(l, x);
		}
		json_object_set_new(o, "links", l);
	}
	return o;
fail:
	json_decref(o);
	json_decref(a);
	json_decref(r);
	json_decref(s);
	return NULL;
}

char *plan_view_to_json(const plan_view_t *v)
{
	/* Canonical regardless of how the caller ordered a hand-built view: sort a copy. */
	plan_view_t c = *v;
	plan_node_t *nodes = calloc(v->n_nodes ? v->n_nodes : 1, sizeof *nodes);
	json_t *root = json_object(), *arr = json_array();
	char *out = NULL;
	size_t k = 0;
	if (!nodes || !root || !arr)
		goto done;
	for (; k < v->n_nodes; k++) {
		const plan_node_t *n = &v->nodes[k];
		nodes[k] = *n;
		nodes[k].addrs = n->n_addrs ? malloc(n->n_addrs * sizeof *n->addrs) : NULL;
		nodes[k].rdma = n->n_rdma ? malloc(n->n_rdma * sizeof *n->rdma) : NULL;
		nodes[k].seen = n->n_seen ? malloc(n->n_seen * sizeof *n->seen) : NULL;
		nodes[k].links = n->n_links ? malloc(n->n_links * sizeof *n->links) : NULL;
		if ((n->n_addrs && !nodes[k].addrs) || (n->n_rdma && !nodes[k].rdma) ||
		    (n->n_seen && !nodes[k].seen) || (n->n_links && !nodes[k].links)) {
			k++;
			goto done;
		}
		if (n->n_addrs)
			memcpy(nodes[k].addrs, n->addrs, n->n_addrs * sizeof *n->addrs);
		if (n->n_rdma)
			memcpy(nodes[k].rdma, n->rdma, n->n_rdma * sizeof *n->rdma);
		if (n->n_seen)
			memcpy(nodes[k].seen, n->seen, n->n_seen * sizeof *n->seen);
		if (n->n_links)
			memcpy(nodes[k].links, n->links, n->n_links * sizeof *n->links);
	}
	c.nodes = nodes;
	view_sort(&c);
	json_object_set_new(root, "epoch", json_integer((json_int_t)v->epoch));
	for (size_t i = 0; i < c.n_nodes; i++) {
		json_t *nj = node_json(&c.nodes[i]);
		if (!nj || json_array_append_new(arr, nj))
			goto done;
	}
	json_object_set(root, "nodes", arr);
	out = plan_dump(root);
done:
	if (nodes)
		for (size_t i = 0; i < k; i++) {
			free(nodes[i].addrs);
			free(nodes[i].rdma);
			free(nodes[i].seen);
			free(nodes[i].links);
		}
	free(nodes);
	json_decref(arr);
	json_decref(root);
	return out;
}

char *plan_dump(json_t *j)
{
	/* 15 significant digits: a figure in tenths (44.1) prints as itself, not 44.100000000000001
	 */
	char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
	if (!s)
		return NULL;
	size_t n = strlen(s);
	char *t = realloc(s, n + 2);
	if (!t) {
		free(s);
		return NULL;
	}
	t[n] = '\n';
	t[n + 1] = 0;
	return t;
}
