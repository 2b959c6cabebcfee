/*
 * links.c: what the view says about the links between nodes: the kind of each pair's link, the
 * RDMA device that serves it (the JACCL matrix), the ring address of each rank and the LAN
 * address every rank reaches (mlx.c turns these into MLX's files).
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

/* The interface on which a sees peer, or NULL. When a sees it on several (Wi-Fi and a cable),
 * the best: an active RDMA device on it, then its kind, then the smaller name. */
static const char *seen_if(const plan_node_t *a, const char *peer)
{
	const char *best = NULL;
	int best_score = -1;
	for (size_t i = 0; i < a->n_seen; i++) {
		const char *ifn = a->seen[i].ifname;
		if (strcmp(a->seen[i].node_id, peer) || !ifn[0])
			continue;
		int sc = (int)if_kind(a, ifn) * 2 + (rdma_on(a, ifn) ? 10 : 0);
		if (!best || sc > best_score || (sc == best_score && strcmp(ifn, best) < 0))
			best = ifn, best_score = sc;
	}
	return best;
}

static int is_ipv4(const char *ip)
{
	unsigned char b[4];
	return inet_pton(AF_INET, ip, b) == 1;
}

int plan_node_has_ipv4(const plan_node_t *a)
{
	for (size_t i = 0; i < a->n_addrs; i++)
		if (is_ipv4(a->addrs[i].ip))
			return 1;
	return 0;
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

/* Are IPv4 addresses x and y on one subnet? The longer of their prefixes decides (a /30 cable
 * end is not on the /24 of another cable); without a prefix a /24 is assumed. */
static int same_net(const plan_addr_t *x, const plan_addr_t *y)
{
	unsigned char p[4], q[4];
	if (inet_pton(AF_INET, x->ip, p) != 1 || inet_pton(AF_INET, y->ip, q) != 1)
		return 0;
	int bits = MAX(x->prefix > 0 && x->prefix <= 32 ? x->prefix : 24,
		       y->prefix > 0 && y->prefix <= 32 ? y->prefix : 24);
	uint32_t a = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
	uint32_t b = (uint32_t)q[0] << 24 | (uint32_t)q[1] << 16 | (uint32_t)q[2] << 8 | q[3];
	uint32_t mask = bits >= 32 ? 0xffffffffu : ~(0xffffffffu >> bits);
	return (a & mask) == (b & mask);
}

/* The interface on which a sees b: from a's seen_on; without one, a's best interface with an
 * IPv4 address on the same subnet as one of b's (same_net: the prefix when the view gives it,
 * else a /24). */
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
			if (addr_score(b, &b->addrs[j]) >= 0 && same_net(x, &b->addrs[j]) &&
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
	if (pick)
		strcpy(r->ip, pick->ip);
}

/* Does node b reach address x of node a (ifn: the interface a sees b on)? Over the link between
 * them (the interface a sees b on), or, for an Ethernet or Wi-Fi address, when b has such an
 * address in the same /24 (a LAN; the view has no netmasks). A Thunderbolt address is a cable's
 * end: only the node on the other end reaches it. */
static int reaches(const plan_addr_t *x, const plan_node_t *b, const char *ifn /* link_if(a, b) */)
{
	if (ifn && !strcmp(ifn, x->ifname))
		return 1;
	if (x->kind == PLAN_LINK_THUNDERBOLT)
		return 0;
	for (size_t j = 0; j < b->n_addrs; j++) {
		const plan_addr_t *y = &b->addrs[j];
		if (y->kind != PLAN_LINK_THUNDERBOLT && addr_score(b, y) >= 0 && same_net(x, y))
			return 1;
	}
	return 0;
}

/* Preference among equally reachable LAN addresses: Ethernet, Wi-Fi, other, Thunderbolt. */
static int lan_rank(plan_link_t k)
{
	return k == PLAN_LINK_THUNDERBOLT ? 0 : k == PLAN_LINK_OTHER ? 1 : (int)k + 1;
}

int plan_lan_addr(char out[PLAN_IP_MAX], const plan_node_t *const *nodes, int n, int i)
{
	const plan_node_t *a = nodes[i];
	const plan_addr_t *pick = NULL;
	int pick_reach = -1;
	const char *lif[PLAN_MAX_NODES];
	out[0] = 0;
	for (int j = 0; j < n; j++)
		lif[j] = j == i ? NULL : link_if(a, nodes[j]);
	for (size_t k = 0; k < a->n_addrs; k++) {
		const plan_addr_t *x = &a->addrs[k];
		if (!is_ipv4(x->ip) || addr_score(a, x) < 0)
			continue;
		int reach = 0;
		for (int j = 0; j < n; j++)
			reach += j != i && reaches(x, nodes[j], lif[j]);
		int better = !pick || reach > pick_reach;
		if (pick && reach == pick_reach) {
			int lx = lan_rank(x->kind), lp = lan_rank(pick->kind);
			int c = strcmp(x->ifname, pick->ifname);
			better = lx != lp ? lx > lp : c ? c < 0 : strcmp(x->ip, pick->ip) < 0;
		}
		if (better)
			pick = x, pick_reach = reach;
	}
	if (pick)
		strcpy(out, pick->ip);
	return pick ? pick_reach : 0;
}
