/*
 * links.c: this node's measured links (links.h).
 *
 * One probe runs at a time (two at once would share the node's link and CPU and each measure
 * less than the link gives). The first measurement of a member waits LINKS_FIRST_MS after it
 * joined plus LINKS_STAGGER_MS for every member with a smaller ID than this node's: in a
 * cluster forming all at once the smallest node measures its peers first, the next one after
 * it, and so on, instead of all of them at the same time.
 *
 * Invariant: peers[] holds each member ID at most once; `probe` runs on peers[cur] only.
 */
#include "agent/links.h"
#include "common/common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LINKS_FIRST_MS   500  /* after a join, before the first measurement */
#define LINKS_STAGGER_MS 1000 /* ... and this much more per smaller member ID */
#define LINKS_RETRY_MS   5000 /* after a failed measurement */
/* After the first measurement, two more soon: a node that joins is often busy (loading a model,
 * planning) and its first figures too slow; a later one 2x better replaces them at once. */
#define LINKS_SOON_MS 4000
#define LINKS_SOON    2
/* A link already measured is measured again only while the machine is quiet: under
 * LINKS_QUIET of all its CPUs busy over the last LINKS_LOAD_MS. A burst costs the CPUs that
 * carry it (sealing, and in the latency lab the userspace switch): probes back to back slowed
 * a 1-thread decode on the 2-core lab machine by 3-9 %. A machine that never quiets down is
 * measured anyway LINKS_DEFER_MS after the measurement was due. */
#define LINKS_LOAD_MS  1000
#define LINKS_QUIET    0.25
#define LINKS_DEFER_MS 300000

typedef struct peer {
	disc_id_t id;
	int64_t due_ms;  /* next measurement */
	int have;        /* pub is published */
	plan_meas_t pub; /* what this node says about the link */
	int off;         /* measurements in a row far from pub */
	int runs;        /* measurements done */
} peer_t;

struct links {
	disc_id_t self;
	peer_t peers[MEMBERS_MAX];
	int n;
	int cur; /* the peer being measured, -1 = none */
	tp_probe_t *probe;
	int busy;                  /* the machine was busy over the last load window */
	int64_t load_ms;           /* when that window started (0 = not yet) */
	unsigned long long jb, jt; /* busy and total CPU ticks at its start */
};

links_t *links_new(const disc_id_t *self)
{
	links_t *l = calloc(1, sizeof *l);
	if (l) {
		l->self = *self;
		l->cur = -1;
	}
	return l;
}

static void probe_stop(links_t *l)
{
	tp_probe_free(l->probe);
	l->probe = NULL;
	l->cur = -1;
}

void links_free(links_t *l)
{
	if (!l)
		return;
	tp_probe_free(l->probe);
	free(l);
}

static int peer_find(const links_t *l, const disc_id_t *id)
{
	for (int i = 0; i < l->n; i++)
		if (!disc_id_cmp(&l->peers[i].id, id))
			return i;
	return -1;
}

void links_member_up(links_t *l, const member_t *m, int64_t now_ms)
{
	if (disc_id_cmp(&l->self, &m->id) > 0)
		return; /* the other end measures this pair */
	int i = peer_find(l, &m->id);
	if (i == l->cur)
		probe_stop(l); /* its channel changed under the probe */
	if (i < 0) {
		if (l->n == MEMBERS_MAX)
			return;
		i = l->n++;
		memset(&l->peers[i], 0, sizeof l->peers[i]);
		l->peers[i].id = m->id;
	}
	l->peers[i].due_ms = now_ms + LINKS_FIRST_MS;
	l->peers[i].runs = 0;
}

void links_member_down(links_t *l, const disc_id_t *id)
{
	int i = peer_find(l, id);
	if (i < 0)
		return;
	if (i == l->cur)
		probe_stop(l);
	if (l->cur == l->n - 1)
		l->cur = i;
	l->peers[i] = l->peers[--l->n];
}

/* Is a far from b: a round trip or the throughput LINKS_FACTOR times larger or smaller? */
static int far(const plan_meas_t *a, const plan_meas_t *b)
{
	uint64_t f = LINKS_FACTOR;
	return a->rtt_us >= f * b->rtt_us || b->rtt_us >= f * a->rtt_us || a->mbps >= f * b->mbps ||
	       b->mbps >= f * a->mbps;
}

/* The finished probe's figures for peer p: published when they are the first, or when they
 * stayed far from the published ones. Returns 1 when the published figures changed. */
static int probe_done(links_t *l, peer_t *p, int64_t now_ms)
{
	tp_link_stats_t st;
	char h[DISC_ID_HEX];
	disc_id_hex(&p->id, h);
	if (tp_probe_result(l->probe, &st) || st.tput_mbit <= 0 || st.rtt_us_median <= 0) {
		p->due_ms = now_ms + LINKS_RETRY_MS;
		return 0;
	}
	plan_meas_t m = {.rtt_us = (uint32_t)MAX(1, lround(st.rtt_us_median)),
			 .rtt_p90_us = (uint32_t)MAX(1, lround(st.rtt_us_p90)),
			 .mbps = (uint32_t)MAX(1, MIN(lround(st.tput_mbit), 100000000))};
	snprintf(m.node_id, sizeof m.node_id, "%s", h);
	p->due_ms = now_ms + (++p->runs <= LINKS_SOON ? LINKS_SOON_MS : LINKS_PERIOD_MS);
	/* a round trip far shorter than the published one: that one met a busy node (a link
	 * does not get faster by itself); believed at once */
	int better = p->have && (uint64_t)m.rtt_us * LINKS_FACTOR <= p->pub.rtt_us;
	LOG(LOG_DEBUG, "links: %.8s: round trip %u us (p90 %u), %u Mbit/s", h, m.rtt_us,
	    m.rtt_p90_us, m.mbps);
	if (p->have && !far(&m, &p->pub)) {
		p->off = 0;
		return 0;
	}
	if (p->have && !better && ++p->off < LINKS_SUSTAIN)
		return 0;
	LOG(LOG_INFO, "links: %.8s: round trip %u us (p90 %u), %u Mbit/s%s", h, m.rtt_us,
	    m.rtt_p90_us, m.mbps, p->have ? " (changed)" : "");
	p->pub = m;
	p->have = 1;
	p->off = 0;
	return 1;
}

/* Updates l->busy once a load window has passed (a machine whose load cannot be read is quiet). */
static void load_sample(links_t *l, int64_t now_ms)
{
	if (l->load_ms && now_ms - l->load_ms < LINKS_LOAD_MS)
		return;
	unsigned long long b, t;
	if (sh_cpu_jiffies(&b, &t)) {
		l->busy = 0;
		return;
	}
	if (l->load_ms)
		l->busy = t > l->jt && (double)(b - l->jb) >= LINKS_QUIET * (double)(t - l->jt);
	l->load_ms = now_ms, l->jb = b, l->jt = t;
}

int links_tick(links_t *l, members_t *ms, int64_t now_ms, int *timeout_ms)
{
	int changed = 0;
	load_sample(l, now_ms);
	if (l->cur < 0) { /* the next one due */
		int smaller = 0;
		for (int i = 0; i < members_count(ms); i++)
			smaller += disc_id_cmp(&members_at(ms, i)->id, &l->self) < 0;
		int64_t stagger = (int64_t)smaller * LINKS_STAGGER_MS;
		for (int i = 0; i < l->n && l->cur < 0; i++) {
			peer_t *p = &l->peers[i];
			if (now_ms < p->due_ms + (p->have ? 0 : stagger))
				continue;
			/* again later, when it does not slow the cluster's work */
			if (p->have && l->busy && now_ms < p->due_ms + LINKS_DEFER_MS)
				continue;
			tp_probe_opts_t o;
			tp_probe_opts_default(&o);
			o.probes = 24;   /* docs/view.md: >= 20 round trips */
			o.train = 0;     /* the planner models no separate per-message gap */
			o.burst_ms = 60; /* >= 50 ms, or 4 MiB */
			char err[128];
			if (tp_probe_new(&l->probe, &o, err, sizeof err)) {
				p->due_ms = now_ms + LINKS_RETRY_MS;
				continue;
			}
			l->cur = i;
		}
	}
	if (l->cur < 0)
		return 0;
	peer_t *p = &l->peers[l->cur];
	member_t *m = members_find(ms, &p->id);
	if (!m) {
		probe_stop(l);
		return 0;
	}
	int wait = 0, rc = tp_probe_step(l->probe, m->ch, now_ns(), &wait);
	if (rc == 1)
		changed = probe_done(l, p, now_ms);
	else if (rc < 0) {
		char h[DISC_ID_HEX];
		disc_id_hex(&p->id, h);
		LOG(LOG_DEBUG, "links: measuring %.8s failed: %s", h, sh_strerror(rc));
		p->due_ms = now_ms + LINKS_RETRY_MS;
	}
	if (rc)
		probe_stop(l);
	else if (wait < *timeout_ms)
		*timeout_ms = wait;
	return changed;
}

int links_take(links_t *l, const member_t *m, uint16_t type, const void *p, size_t len)
{
	if (l->cur < 0 || disc_id_cmp(&l->peers[l->cur].id, &m->id))
		return 0;
	return tp_probe_take(l->probe, type, p, len, now_ns());
}

static int meas_cmp(const void *a, const void *b)
{
	return strcmp(((const plan_meas_t *)a)->node_id, ((const plan_meas_t *)b)->node_id);
}

int links_published(const links_t *l, plan_meas_t *out, int max)
{
	int n = 0;
	for (int i = 0; i < l->n && n < max; i++)
		if (l->peers[i].have)
			out[n++] = l->peers[i].pub;
	qsort(out, (size_t)n, sizeof *out, meas_cmp);
	return n;
}
