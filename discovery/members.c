/*
 * members.c: the sighting table. mDNS reports one resolution per (service, interface, protocol);
 * this table folds them into one entry per node ID with every address and the interface it came
 * from, which the agent uses to connect and the planner to match RDMA interfaces.
 *
 * Invariant: an entry exists only while it has at least one address; (name, ifindex, ipv6) is
 * unique within an entry. Pure data: no I/O, time comes in as an argument.
 */
#include "common/common.h"
#include "discovery/discovery.h"

#include <stdlib.h>
#include <string.h>

struct disc_table {
	int n;
	disc_peer_t peers[DISC_MAX_PEERS];
};

disc_table_t *disc_table_new(void)
{
	return calloc(1, sizeof(disc_table_t));
}

void disc_table_free(disc_table_t *t)
{
	free(t);
}

void disc_table_clear(disc_table_t *t)
{
	t->n = 0;
}

int disc_table_count(const disc_table_t *t)
{
	return t->n;
}

const disc_peer_t *disc_table_at(const disc_table_t *t, int i)
{
	return i >= 0 && i < t->n ? &t->peers[i] : NULL;
}

static int index_of(const disc_table_t *t, const disc_id_t *id)
{
	for (int i = 0; i < t->n; i++)
		if (!disc_id_cmp(&t->peers[i].id, id))
			return i;
	return -1;
}

const disc_peer_t *disc_table_find(const disc_table_t *t, const disc_id_t *id)
{
	int i = index_of(t, id);
	return i < 0 ? NULL : &t->peers[i];
}

static int same_slot(const disc_peer_addr_t *a, const disc_sighting_t *s)
{
	return a->ifindex == s->ifindex && a->ipv6 == s->ipv6 && !strcmp(a->name, s->name);
}

const disc_peer_t *disc_table_add(disc_table_t *t, const disc_sighting_t *s, int64_t now_ms)
{
	if (disc_id_is_zero(&s->id))
		return NULL;
	int i = index_of(t, &s->id);
	if (i < 0) {
		if (t->n == DISC_MAX_PEERS)
			return NULL;
		i = t->n++;
		memset(&t->peers[i], 0, sizeof t->peers[i]);
		t->peers[i].id = s->id;
		t->peers[i].first_seen_ms = now_ms;
	}
	disc_peer_t *p = &t->peers[i];
	/* The newest resolution's TXT data wins: a restarted peer advertises fresh values. */
	snprintf(p->host, sizeof p->host, "%s", s->host);
	p->mem_bytes = s->mem_bytes;
	p->cores = s->cores;
	snprintf(p->rdma, sizeof p->rdma, "%s", s->rdma);
	p->nonce = s->nonce;
	int a;
	for (a = 0; a < p->naddrs; a++)
		if (same_slot(&p->addrs[a], s))
			break;
	if (a == p->naddrs) {
		if (p->naddrs == DISC_MAX_ADDRS)
			return p; /* keep the first few; enough to reach the peer */
		p->naddrs++;
	}
	disc_peer_addr_t *pa = &p->addrs[a];
	snprintf(pa->name, sizeof pa->name, "%s", s->name);
	snprintf(pa->addr, sizeof pa->addr, "%s", s->addr);
	snprintf(pa->ifname, sizeof pa->ifname, "%s", s->ifname);
	pa->port = s->port;
	pa->ifindex = s->ifindex;
	pa->ipv6 = s->ipv6;
	return p;
}

int disc_table_remove(disc_table_t *t, const disc_sighting_t *s)
{
	/* DOWN events from a browser carry no TXT, so the ID may be unknown: match by slot. */
	for (int i = 0; i < t->n; i++) {
		disc_peer_t *p = &t->peers[i];
		for (int a = 0; a < p->naddrs; a++) {
			if (!same_slot(&p->addrs[a], s))
				continue;
			p->addrs[a] = p->addrs[--p->naddrs];
			if (p->naddrs == 0) {
				t->peers[i] = t->peers[--t->n];
				return 1;
			}
			return 0;
		}
	}
	return 0;
}
