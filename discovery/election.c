/*
 * election.c: the election core. Pure: membership changes, received messages and the time come in
 * as arguments; messages to send go out through a small queue the shell drains. Nothing here does
 * I/O, reads a clock or draws random numbers, so a whole cluster can be stepped deterministically
 * (tests/test_election.c).
 *
 * Rule: the leader is the member with the smallest node ID (self included). A node decides only
 * when its view is settled: unchanged for settle_ms (a node still alone also waits grace_ms after
 * start, the time mDNS needs to find anyone), or for quick_ms while the shell says the view is
 * complete (every node discovery knows of is a member), or expect members present. The smallest
 * member then announces itself with a view epoch one above every epoch it has seen; others follow
 * the announcement of the node they too see as smallest, and tell a leader about a smaller member
 * it does not seem to know. Epochs only grow: a leader that hears of an epoch above its own (it was
 * paused or partitioned while others elected someone) announces again above it before anyone
 * follows it, and a node never follows an announcement older than the largest epoch it has seen
 * (min_epoch carries that across restarts). A larger node joining never moves leadership (no
 * flapping); losing the leader makes the next smallest take over once the survivors' view settles.
 *
 * Invariant: members[] is sorted ascending, contains self, and has no duplicates; state changes
 * happen only in convert(), which logs old -> new.
 */
#include "common/common.h"
#include "discovery/discovery.h"

#include <stdlib.h>
#include <string.h>

#define ELEC_QUEUE 16

struct elec {
	disc_id_t self;
	elec_config_t cfg;
	int64_t start_ms, last_change_ms;
	int n;
	disc_id_t members[ELEC_MAX_MEMBERS];
	elec_state_t state;
	disc_id_t leader; /* zero when none */
	uint64_t epoch;   /* of the announcement we lead or follow */
	uint64_t max_epoch;
	int dirty;    /* leader: the view changed since the last announcement */
	int holding;  /* leader told of a smaller node it cannot see */
	int complete; /* the shell: every node discovery knows of is a member */
	disc_id_t hint;
	int64_t hold_until_ms;
	int64_t last_smaller_ms;
	disc_id_t last_smaller_to;
	int qhead, qlen;
	elec_msg_t q[ELEC_QUEUE];
};

const char *elec_state_name(elec_state_t s)
{
	switch (s) {
	case ELEC_UNSETTLED: return "unsettled";
	case ELEC_LEADER: return "leader";
	case ELEC_FOLLOWER: return "follower";
	}
	return "?";
}

static const disc_id_t zero_id;

static void short_hex(const disc_id_t *id, char out[9])
{
	char h[DISC_ID_HEX];
	disc_id_hex(id, h);
	memcpy(out, h, 8);
	out[8] = 0;
}

/* The one place the state changes. */
static void convert(elec_t *e, elec_state_t to, const disc_id_t *leader, uint64_t epoch)
{
	int same_leader = !disc_id_cmp(&e->leader, leader);
	if (e->state == to && same_leader && e->epoch == epoch)
		return;
	char me[9], was[9], now[9];
	short_hex(&e->self, me);
	short_hex(&e->leader, was);
	short_hex(leader, now);
	if (e->state != to || !same_leader)
		LOG(LOG_INFO, "election %s: %s -> %s (leader %s -> %s, epoch %llu, %d members)", me,
		    elec_state_name(e->state), elec_state_name(to),
		    disc_id_is_zero(&e->leader) ? "none" : was,
		    disc_id_is_zero(leader) ? "none" : now, (unsigned long long)epoch, e->n);
	else
		LOG(LOG_INFO, "election %s: epoch %llu -> %llu (%s, %d members)", me,
		    (unsigned long long)e->epoch, (unsigned long long)epoch, elec_state_name(to),
		    e->n);
	e->state = to;
	e->leader = *leader;
	e->epoch = epoch;
}

static elec_msg_t *queue_push(elec_t *e)
{
	if (e->qlen == ELEC_QUEUE) { /* drop the oldest: a newer announcement supersedes it */
		e->qhead = (e->qhead + 1) % ELEC_QUEUE;
		e->qlen--;
	}
	elec_msg_t *m = &e->q[(e->qhead + e->qlen++) % ELEC_QUEUE];
	memset(m, 0, sizeof *m);
	return m;
}

int elec_next_msg(elec_t *e, elec_msg_t *out)
{
	if (!e->qlen)
		return 0;
	*out = e->q[e->qhead];
	e->qhead = (e->qhead + 1) % ELEC_QUEUE;
	e->qlen--;
	return 1;
}

elec_t *elec_new(const disc_id_t *self, const elec_config_t *cfg, int64_t now_ms)
{
	elec_t *e = calloc(1, sizeof *e);
	if (!e)
		return NULL;
	e->self = *self;
	e->cfg = *cfg;
	e->start_ms = e->last_change_ms = now_ms;
	e->n = 1;
	e->members[0] = *self;
	e->state = ELEC_UNSETTLED;
	e->max_epoch = cfg->min_epoch;
	return e;
}

void elec_free(elec_t *e)
{
	free(e);
}

static int find(const elec_t *e, const disc_id_t *id)
{
	for (int i = 0; i < e->n; i++)
		if (!disc_id_cmp(&e->members[i], id))
			return i;
	return -1;
}

void elec_set_complete(elec_t *e, int complete)
{
	e->complete = complete;
}

int elec_is_member(const elec_t *e, const disc_id_t *id)
{
	return find(e, id) >= 0;
}

static int is_self(const elec_t *e, const disc_id_t *id)
{
	return !disc_id_cmp(&e->self, id);
}

void elec_member_up(elec_t *e, const disc_id_t *id, int64_t now_ms)
{
	if (is_self(e, id) || find(e, id) >= 0 || e->n == ELEC_MAX_MEMBERS || disc_id_is_zero(id))
		return;
	int i = e->n;
	while (i > 0 && disc_id_cmp(&e->members[i - 1], id) > 0) {
		e->members[i] = e->members[i - 1];
		i--;
	}
	e->members[i] = *id;
	e->n++;
	e->last_change_ms = now_ms;
	e->dirty = 1;
	if (e->holding && !disc_id_cmp(&e->hint, id))
		e->holding = 0; /* the node we were told about is here: the normal rule decides */
	elec_tick(e, now_ms);
}

void elec_member_down(elec_t *e, const disc_id_t *id, int64_t now_ms)
{
	int i = find(e, id);
	if (i < 0 || is_self(e, id))
		return;
	memmove(&e->members[i], &e->members[i + 1], (size_t)(e->n - i - 1) * sizeof(disc_id_t));
	e->n--;
	e->last_change_ms = now_ms;
	e->dirty = 1;
	if (!disc_id_cmp(&e->leader, id))
		convert(e, ELEC_UNSETTLED, &zero_id, e->epoch);
	elec_tick(e, now_ms);
}

static int settled(const elec_t *e, int64_t now_ms)
{
	if (e->cfg.expect > 0 && e->n >= e->cfg.expect)
		return 1;
	int64_t at = e->last_change_ms + e->cfg.settle_ms;
	if (e->complete && e->n > 1 && e->cfg.quick_ms > 0)
		at = e->last_change_ms + MIN(e->cfg.quick_ms, e->cfg.settle_ms);
	if (e->n == 1)
		at = MAX(at, e->start_ms + e->cfg.settle_ms + e->cfg.grace_ms);
	return now_ms >= at;
}

static void announce(elec_t *e)
{
	elec_msg_t *m = queue_push(e);
	m->type = DISC_MSG_LEADER;
	m->broadcast = 1;
	m->epoch = e->epoch;
	m->subject = e->self;
	m->n = e->n;
	memcpy(m->members, e->members, (size_t)e->n * sizeof(disc_id_t));
}

/* Tells `to`, which claims to lead, about the smaller member we see; at most once per settle
 * period per target so a confused leader is not flooded. */
static void tell_smaller(elec_t *e, const disc_id_t *to, int64_t now_ms)
{
	if (!disc_id_cmp(&e->last_smaller_to, to) &&
	    now_ms - e->last_smaller_ms < MAX(e->cfg.settle_ms, 500))
		return;
	e->last_smaller_to = *to;
	e->last_smaller_ms = now_ms;
	elec_msg_t *m = queue_push(e);
	m->type = DISC_MSG_SMALLER;
	m->to = *to;
	m->subject = e->members[0];
}

void elec_tick(elec_t *e, int64_t now_ms)
{
	if (e->holding && now_ms >= e->hold_until_ms)
		e->holding = 0;
	if (!settled(e, now_ms))
		return;
	if (is_self(e, &e->members[0])) {
		if (e->holding) {
			if (e->state == ELEC_LEADER)
				convert(e, ELEC_UNSETTLED, &zero_id, e->epoch);
			return;
		}
		if (e->state != ELEC_LEADER || e->dirty) {
			e->max_epoch++;
			e->dirty = 0;
			convert(e, ELEC_LEADER, &e->self, e->max_epoch);
			announce(e);
		}
		return;
	}
	/* Someone smaller is a member: we follow it once it announces (elec_on_leader). */
	if (e->state == ELEC_LEADER)
		convert(e, ELEC_UNSETTLED, &zero_id, e->epoch);
	else if (e->state == ELEC_FOLLOWER && disc_id_cmp(&e->leader, &e->members[0]))
		convert(e, ELEC_UNSETTLED, &zero_id, e->epoch);
}

static void follow(elec_t *e, const disc_id_t *from, uint64_t epoch)
{
	if (e->state == ELEC_FOLLOWER && !disc_id_cmp(&e->leader, from) && epoch <= e->epoch)
		return; /* an older or repeated announcement */
	if (epoch < e->max_epoch)
		return; /* a stale term (the sender was away): it announces again above ours */
	convert(e, ELEC_FOLLOWER, from, epoch);
}

/* Another node speaks of a newer epoch than the one we lead: announce again above it. */
static void epoch_seen(elec_t *e, uint64_t epoch)
{
	if (epoch > e->max_epoch)
		e->max_epoch = epoch;
	if (e->state == ELEC_LEADER && epoch > e->epoch)
		e->dirty = 1;
}

void elec_on_leader(elec_t *e, const disc_id_t *from, uint64_t epoch, const disc_id_t *members,
		    int n, int64_t now_ms)
{
	(void)members;
	(void)n;
	epoch_seen(e, epoch);
	if (find(e, from) < 0 || is_self(e, from))
		return; /* not (yet) a member of our view */
	if (disc_id_cmp(&e->members[0], from) < 0) {
		tell_smaller(e, from, now_ms);
		return;
	}
	follow(e, from, epoch);
}

void elec_on_heartbeat(elec_t *e, const disc_id_t *from, uint64_t epoch, const disc_id_t *leader,
		       int sender_is_leader, int64_t now_ms)
{
	(void)leader;
	epoch_seen(e, epoch);
	if (!sender_is_leader || find(e, from) < 0 || is_self(e, from))
		return;
	if (disc_id_cmp(&e->members[0], from) < 0)
		tell_smaller(e, from, now_ms);
	else if (!(e->state == ELEC_FOLLOWER && !disc_id_cmp(&e->leader, from)))
		follow(e, from, epoch); /* a missed announcement: the heartbeat says the same */
}

void elec_on_smaller(elec_t *e, const disc_id_t *from, const disc_id_t *smaller, int64_t now_ms)
{
	(void)from;
	if (e->state != ELEC_LEADER || disc_id_cmp(smaller, &e->self) >= 0)
		return;
	if (find(e, smaller) >= 0)
		return; /* we see it too; our own tick steps down once the view settles */
	char h[DISC_ID_HEX];
	disc_id_hex(smaller, h);
	LOG(LOG_WARN, "election: told of smaller node %s that this node cannot reach; holding back",
	    h);
	e->holding = 1;
	e->hint = *smaller;
	e->hold_until_ms = now_ms + e->cfg.hold_ms;
	e->dirty = 1;
	convert(e, ELEC_UNSETTLED, &zero_id, e->epoch);
}

elec_state_t elec_state(const elec_t *e)
{
	return e->state;
}

int elec_leader(const elec_t *e, disc_id_t *out)
{
	*out = e->leader;
	return !disc_id_is_zero(&e->leader);
}

uint64_t elec_epoch(const elec_t *e)
{
	return e->epoch;
}

uint64_t elec_max_epoch(const elec_t *e)
{
	return e->max_epoch;
}

int elec_member_count(const elec_t *e)
{
	return e->n;
}

const disc_id_t *elec_member_at(const elec_t *e, int i)
{
	return i >= 0 && i < e->n ? &e->members[i] : NULL;
}

int elec_hint(const elec_t *e, disc_id_t *out)
{
	if (!e->holding)
		return 0;
	*out = e->hint;
	return 1;
}
