/*
 * links.c: what the view says about the links between nodes: the kind of each pair's link, the
 * RDMA device that serves it (the JACCL matrix), the ring address of each rank, and the three
 * MLX-facing files (ring hostfile, mlx.launch hosts, RDMA device matrix).
 *
 * The link between a and b is the interface on which a sees b: its seen_on entry, or failing
 * that, a guess from addresses in the same /24.
 *
 * Invariant: every lookup here picks the minimum of a total order among the matching entries,
 * never "the first one", so results do not depend on the order of the view's arrays.
 */
#include "planner/plan_int.h"

#include "common/common.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

/* The interface on which a sees peer (smallest name when several), or NULL. */
static const char *seen_if(const plan_node_t *a, const char *peer)
{
	const char *best = NULL;
	for (size_t i = 0; i < a->n_seen; i++)
		if (!strcmp(a->seen[i].node_id, peer) && a->seen[i].ifname[0] &&
		    (!best || strcmp(a->seen[i].ifname, best) < 0))
			best = a->seen[i].ifname;
	return best;
}

/* The active RDMA device on a's interface ifname (smallest name), or NULL. */
static const char *rdma_on(const plan_node_t *a, const char *ifname)
{
	const char *best = NULL;
	if (!ifname[0])
		return NULL;
	for (size_t i = 0; i < a->n_rdma; i++)
		if (a->rdma[i].port_active && !strcmp(a->rdma[i].ifname, ifname) &&
		    (!best || strcmp(a->rdma[i].name, best) < 0))
			best = a->rdma[i].name;
	return best;
}

/* Kind of a's interface: the best kind among its addresses, else guessed from the name. */
static plan_link_t if_kind(const plan_node_t *a, const char *ifname)
{
	int k = -1;
	for (size_t i = 0; i < a->n_addrs; i++)
		if (!strcmp(a->addrs[i].ifname, ifname) && (int)a->addrs[i].kind > k)
			k = (int)a->addrs[i].kind;
	return k >= 0 ? (plan_link_t)k : plan_link_guess(ifname);
}

static int is_ipv4(const char *ip)
{
	unsigned char b[4];
	return inet_pton(AF_INET, ip, b) == 1;
}

/* Preference of an address for the ring: RDMA-capable interface, then by kind; loopback last. */
static int addr_score(const plan_node_t *a, const plan_addr_t *ad)
{
	if (!strncmp(ad->ip, "127.", 4))
		return -1;
	return (int)ad->kind * 2 + (rdma_on(a, ad->ifname) ? 10 : 0);
}

/* Total order: better score first, then interface name, then address text. */
static int addr_before(const plan_node_t *a, const plan_addr_t *x, const plan_addr_t *y)
{
	int sx = addr_score(a, x), sy = addr_score(a, y);
	if (sx != sy)
		return sx > sy;
	int c = strcmp(x->ifname, y->ifname);
	return c ? c < 0 : strcmp(x->ip, y->ip) < 0;
}

static int same_24(const char *x, const char *y)
{
	unsigned char p[4], q[4];
	return inet_pton(AF_INET, x, p) == 1 && inet_pton(AF_INET, y, q) == 1 && !memcmp(p, q, 3);
}

/* The interface on which a sees b: from a's seen_on; without one, a's best interface with an
 * IPv4 address in the same /24 as one of b's (a guess: the view carries no netmasks). */
static const char *link_if(const plan_node_t *a, const plan_node_t *b)
{
	const char *s = seen_if(a, b->node_id);
	if (s)
		return s;
	const plan_addr_t *pick = NULL;
	for (size_t i = 0; i < a->n_addrs; i++) {
		const plan_addr_t *x = &a->addrs[i];
		if (!x->ifname[0] || addr_score(a, x) < 0)
			continue;
		for (size_t j = 0; j < b->n_addrs; j++)
			if (addr_score(b, &b->addrs[j]) >= 0 && same_24(x->ip, b->addrs[j].ip) &&
			    (!pick || addr_before(a, x, pick)))
				pick = x;
	}
	return pick ? pick->ifname : NULL;
}

const char *plan_pair_rdma(const plan_node_t *a, const plan_node_t *b)
{
	const char *ifn = link_if(a, b);
	return ifn ? rdma_on(a, ifn) : NULL;
}

/* Kind of the link as seen from a towards b, -1 when a does not say. */
static int dir_kind(const plan_node_t *a, const plan_node_t *b)
{
	const char *ifn = link_if(a, b);
	return ifn ? (int)if_kind(a, ifn) : -1;
}

plan_link_t plan_pair_link(const plan_node_t *a, const plan_node_t *b)
{
	if (plan_pair_rdma(a, b) && plan_pair_rdma(b, a))
		return PLAN_LINK_RDMA;
	int x = dir_kind(a, b), y = dir_kind(b, a);
	/* Both sides known: the worse one (a Wi-Fi leg slows the pair); one side: take it. */
	int k = x < 0 ? y : y < 0 ? x : MIN(x, y);
	return k < 0 ? PLAN_LINK_OTHER : (plan_link_t)k;
}

void plan_ring_addr(plan_rank_t *r, const plan_node_t *a, const plan_node_t *prev)
{
	r->n_ips = 0;
	r->ip[0] = 0;
	if (!prev) {
		strcpy(r->ip, "127.0.0.1");
		strcpy(r->ips[r->n_ips++], r->ip);
		return;
	}
	/* The ring edge prev -> a runs over the interface on which a sees prev: listen there. */
	const char *ifn = link_if(a, prev);
	const plan_addr_t *pick = NULL;
	for (size_t i = 0; ifn && i < a->n_addrs; i++) {
		const plan_addr_t *ad = &a->addrs[i];
		if (!strcmp(ad->ifname, ifn) && is_ipv4(ad->ip) && addr_score(a, ad) >= 0 &&
		    (!pick || strcmp(ad->ip, pick->ip) < 0))
			pick = ad;
	}
	/* Otherwise the best IPv4 address of the node (loopback only when nothing else). */
	int fallback = !pick;
	for (size_t j = 0; fallback && j < a->n_addrs; j++) {
		const plan_addr_t *ad = &a->addrs[j];
		if (is_ipv4(ad->ip) && (!pick || addr_before(a, ad, pick)))
			pick = ad;
	}
	if (!pick)
		return; /* plan_make reports the node has no IPv4 address */
	strcpy(r->ip, pick->ip);
	strcpy(r->ips[r->n_ips++], pick->ip);
	/* The other IPv4 addresses, best first, each once (selection sort: n <= PLAN_MAX_ADDRS). */
	const plan_addr_t *last = NULL;
	for (;;) {
		const plan_addr_t *next = NULL;
		for (size_t j = 0; j < a->n_addrs; j++) {
			const plan_addr_t *ad = &a->addrs[j];
			if (!is_ipv4(ad->ip) || addr_score(a, ad) < 0)
				continue;
			if (last && !addr_before(a, last, ad))
				continue; /* already emitted (at or before last) */
			if (!next || addr_before(a, ad, next))
				next = ad;
		}
		if (!next || r->n_ips >= PLAN_MAX_ADDRS)
			break;
		last = next;
		int dup = 0;
		for (int k = 0; k < r->n_ips; k++)
			dup |= !strcmp(r->ips[k], next->ip);
		if (!dup)
			strcpy(r->ips[r->n_ips++], next->ip);
	}
}

/* ---- the MLX-facing files ---- */

char *plan_hostfile_json(const plan_t *p)
{
	json_t *a = json_array();
	char *out = NULL;
	if (!a)
		return NULL;
	for (int r = 0; r < p->n_ranks; r++) {
		char row[PLAN_IP_MAX + 8];
		snprintf(row, sizeof row, "%s:%d", p->ranks[r].ip, p->ranks[r].port);
		if (json_array_append_new(a, json_string(row)))
			goto done;
	}
	out = plan_dump(a);
done:
	json_decref(a);
	return out;
}

static json_t *rdma_row(const plan_t *p, int r)
{
	json_t *row = json_array();
	for (int j = 0; row && j < p->n_ranks; j++) {
		const char *d = p->ranks[r].rdma[j];
		json_array_append_new(row, d[0] && j != r ? json_string(d) : json_null());
	}
	return row;
}

char *plan_mlx_hosts_json(const plan_t *p)
{
	json_t *a = json_array();
	char *out = NULL;
	if (!a)
		return NULL;
	for (int r = 0; r < p->n_ranks; r++) {
		const plan_rank_t *k = &p->ranks[r];
		json_t *ips = json_array();
		for (int i = 0; ips && i < k->n_ips; i++)
			json_array_append_new(ips, json_string(k->ips[i]));
		/* A single node runs locally: mlx.launch treats only "127.0.0.1" as local. */
		const char *ssh = p->n_ranks == 1 || !k->host[0] ? k->ip : k->host;
		json_t *h =
		    json_pack("{s:s, s:o, s:o}", "ssh", ssh, "ips", ips, "rdma", rdma_row(p, r));
		if (!h || json_array_append_new(a, h))
			goto done;
	}
	out = plan_dump(a);
done:
	json_decref(a);
	return out;
}

char *plan_rdma_json(const plan_t *p)
{
	/* One row per line so the file reads as a matrix: "[[...],\n [...]]\n". */
	char *rows[PLAN_MAX_NODES] = {0};
	char *out = NULL;
	size_t cap = 4;
	int n = 0;
	for (; n < p->n_ranks; n++) {
		json_t *row = rdma_row(p, n);
		rows[n] = row ? json_dumps(row, JSON_COMPACT) : NULL;
		json_decref(row);
		if (!rows[n])
			goto done;
		cap += strlen(rows[n]) + 3;
	}
	out = malloc(cap);
	if (!out)
		goto done;
	size_t len = 0;
	out[len++] = '[';
	for (int r = 0; r < n; r++) {
		if (r) {
			memcpy(out + len, ",\n ", 3);
			len += 3;
		}
		size_t k = strlen(rows[r]);
		memcpy(out + len, rows[r], k);
		len += k;
	}
	memcpy(out + len, "]\n", 3); /* with the NUL */
done:
	for (int r = 0; r < n; r++)
		free(rows[r]);
	return out;
}
