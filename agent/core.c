/*
 * core.c: the agent's cluster core (core.h), pure: events and the time come in, actions go out
 * through a queue; no sockets, no clock, no allocation after core_new.
 *
 * Who plans: the election settles on a leader; the planner is that leader when it holds the model
 * most members hold (the majority model; ties go to the model of the smallest ID), else the
 * smallest ID among the majority model's holders. Every node computes the same planner from the
 * same view, accepts plans only from it and sends its API clients there (rank 0 is the planner).
 *
 * The planner's phases (enum lead): OFF (someone else plans), WAITING (no plan in force: plan as
 * soon as descriptions are in and no back-off holds), STEADY (the plan holds every plannable
 * member and every rank answers), DRIFT (the set of members that should be planned, or the set
 * that answers, differs from the plan since change_ms: plan again after replan_delay), MAKING (the
 * shell is running the planner). A rank answers while its channel is up, it is not stalled, and it
 * acknowledged the plan (or the plan went out less than ack_wait ago).
 *
 * Every node's own state (agent_state_t) moves only in convert(), along the transition table
 * below (an illegal move is a programmer bug: assert), logging old -> new; leaving SERVING queues
 * CORE_ACT_PLAN_GONE and entering it CORE_ACT_PLAN_IN_FORCE. A session runs at most once at a
 * time: a newer plan waits in `pending` until the running session reports DONE.
 *
 * Epochs only grow: a plan's epoch (its group's tag) is term << 20 | sequence, raised above every
 * plan epoch this node has seen (made, received, or reported in an acknowledgement); a node never
 * runs a plan older than one it ran (it refuses it and says its epoch), and a planner that the
 * election knows to be behind (it was paused or partitioned) plans only after it announced above.
 *
 * Invariant: members[] holds each ID at most once and never self; the term never shrinks.
 */
#include "agent/core.h"
#include "agent/core_int.h"
#include "common/common.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the transition table ------------------------------------------------------------------- */

static const struct {
	agent_state_t from, to;
	const char *on;
} transitions[] = {
    {AGENT_DISCOVERING, AGENT_SETTLED, "leader known"},
    {AGENT_SETTLED, AGENT_DISCOVERING, "leader lost"},
    {AGENT_SETTLED, AGENT_PLANNED, "plan accepted"},
    {AGENT_PLANNED, AGENT_LOADING, "session started"},
    {AGENT_PLANNED, AGENT_SETTLED, "planner changed"},
    {AGENT_LOADING, AGENT_SERVING, "session ready"},
    {AGENT_LOADING, AGENT_PLANNED, "newer plan"},
    {AGENT_LOADING, AGENT_SETTLED, "session ended or planner changed"},
    {AGENT_SERVING, AGENT_PLANNED, "newer plan"},
    {AGENT_SERVING, AGENT_SETTLED, "session ended or planner changed"},
};

const char *agent_state_name(agent_state_t s)
{
	switch (s) {
	case AGENT_DISCOVERING: return "discovering";
	case AGENT_SETTLED: return "settled";
	case AGENT_PLANNED: return "planned";
	case AGENT_LOADING: return "loading";
	case AGENT_SERVING: return "serving";
	}
	return "?";
}

static int legal(agent_state_t from, agent_state_t to)
{
	for (size_t i = 0; i < ARRAY_LEN(transitions); i++)
		if (transitions[i].from == from && transitions[i].to == to)
			return 1;
	return 0;
}

void core_table_dot(FILE *f)
{
	fprintf(f, "digraph agent {\n\trankdir=LR;\n\tnode [shape=box, style=rounded];\n");
	for (size_t i = 0; i < ARRAY_LEN(transitions); i++)
		fprintf(f, "\t%s -> %s [label=\"%s\"];\n", agent_state_name(transitions[i].from),
			agent_state_name(transitions[i].to), transitions[i].on);
	fprintf(f, "}\n");
}

/* ---- the core ------------------------------------------------------------------------------- */

static const char *const lead_names[] = {"off", "waiting", "steady", "drift", "making"};

/* The core's LOG: formatted only when the shell listens at that level. */
static void core_log(const core_t *c, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void core_log(const core_t *c, int level, const char *fmt, ...)
{
	if (!c->cfg.log || level > c->cfg.log_level)
		return;
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	c->cfg.log(c->cfg.log_ud, level, line);
}

const char *core_ack_name(core_ack_t a)
{
	static const char *const names[] = {"", "idle", "planned", "loading", "serving", "failed"};
	return a >= CORE_ACK_NONE && a <= CORE_ACK_FAILED ? names[a] : "";
}

core_ack_t core_ack_parse(const char *s)
{
	for (int a = CORE_ACK_IDLE; a <= CORE_ACK_FAILED; a++)
		if (s && !strcmp(s, core_ack_name((core_ack_t)a)))
			return (core_ack_t)a;
	return CORE_ACK_NONE;
}

void core_config_default(core_config_t *c)
{
	c->replan_delay_ms = 500;
	c->desc_wait_ms = 1000;
	c->ack_wait_ms = 2000;
	c->retry_ms = 1000;
	c->stall_hold_ms = 10000;
	c->log = NULL;
	c->log_ud = NULL;
	c->log_level = LOG_INFO;
}

core_t *core_new(const disc_id_t *self, const core_config_t *cfg, int64_t now_ms)
{
	core_t *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->self = *self;
	c->cfg = *cfg;
	c->state = AGENT_DISCOVERING;
	c->retry_ms = c->now = c->born_ms = now_ms;
	return c;
}

void core_free(core_t *c)
{
	free(c);
}

static void short_hex(const disc_id_t *id, char out[9])
{
	char h[DISC_ID_HEX];
	disc_id_hex(id, h);
	memcpy(out, h, 8);
	out[8] = 0;
}

static int is_self(const core_t *c, const disc_id_t *id)
{
	return !disc_id_cmp(&c->self, id);
}

static core_member_t *member_find(core_t *c, const disc_id_t *id)
{
	for (int i = 0; i < c->n; i++)
		if (!disc_id_cmp(&c->members[i].id, id))
			return &c->members[i];
	return NULL;
}

const core_member_t *core_member_get(const core_t *c, const disc_id_t *id)
{
	return member_find((core_t *)c, id);
}

static core_action_t *push(core_t *c, core_act_type_t type)
{
	core_action_t *a = &c->spill;
	if (c->qlen == CORE_QUEUE) /* CORE_QUEUE bounds a step: a bug, which core_step reports */
		c->overflow = 1;
	else
		a = &c->q[(c->qhead + c->qlen++) % CORE_QUEUE];
	memset(a, 0, sizeof *a);
	a->type = type;
	return a;
}

int core_next_action(core_t *c, core_action_t *out)
{
	if (!c->qlen)
		return 0;
	*out = c->q[c->qhead];
	c->qhead = (c->qhead + 1) % CORE_QUEUE;
	c->qlen--;
	return 1;
}

/* An action about plan p (its hash and handle). */
static core_action_t *plan_action(core_t *c, core_act_type_t type, const core_plan_t *p)
{
	core_action_t *x = push(c, type);
	snprintf(x->hash, sizeof x->hash, "%s", p->hash);
	x->handle = p->handle;
	return x;
}

/* The one place this node's state changes. */
static void convert(core_t *c, agent_state_t to, const char *why)
{
	if (c->state == to)
		return;
	assert(legal(c->state, to));
	if (!legal(c->state, to))
		return;
	core_log(c, LOG_INFO, "agent: %s -> %s (%s)", agent_state_name(c->state),
		 agent_state_name(to), why);
	if (c->state == AGENT_SERVING && c->have_cur)
		plan_action(c, CORE_ACT_PLAN_GONE, &c->cur);
	c->state = to;
	if (to == AGENT_SERVING)
		plan_action(c, CORE_ACT_PLAN_IN_FORCE, &c->cur);
}

static void lead_convert(core_t *c, enum lead to, const char *why, int64_t now)
{
	if (c->lead == to)
		return;
	if (to != LEAD_MAKING && c->lead != LEAD_MAKING)
		core_log(c, LOG_INFO, "plan: %s -> %s (%s)", lead_names[c->lead], lead_names[to],
			 why);
	if (to == LEAD_DRIFT || to == LEAD_WAITING)
		c->change_ms = now;
	c->lead = to;
}

static void ack(core_t *c, const char *hash, core_ack_t a, const char *err)
{
	if (!c->have_following || is_self(c, &c->following))
		return;
	core_action_t *x = push(c, CORE_ACT_ACK);
	x->to = c->following;
	x->ack = a;
	x->epoch = c->ran_epoch;
	snprintf(x->hash, sizeof x->hash, "%s", hash);
	snprintf(x->text, sizeof x->text, "%s", err ? err : "");
}

/* ---- the majority model and the planner ----------------------------------------------------- */

/* Model of node i (-1 = self), or NULL when it has none (or has not said). */
static const char *model_of(const core_t *c, int i, uint64_t *size, const disc_id_t **id)
{
	if (i < 0) {
		*size = c->model_size;
		*id = &c->self;
		return c->model[0] ? c->model : NULL;
	}
	const core_member_t *m = &c->members[i];
	*size = m->model_size;
	*id = &m->id;
	return m->described && m->model[0] ? m->model : NULL;
}

/* The majority model: held by the most nodes; ties go to the model of the smallest ID. Returns
 * the index (-1 = self, -2 = none) of a node holding it. */
static int majority(const core_t *c)
{
	int best = -2, best_count = 0;
	const disc_id_t *best_min = NULL;
	for (int i = -1; i < c->n; i++) {
		uint64_t sz, sz2;
		const disc_id_t *id, *id2;
		const char *m = model_of(c, i, &sz, &id);
		if (!m)
			continue;
		int count = 0;
		const disc_id_t *min = NULL;
		for (int k = -1; k < c->n; k++) {
			const char *m2 = model_of(c, k, &sz2, &id2);
			if (m2 && sz2 == sz && !strcmp(m2, m)) {
				count++;
				if (!min || disc_id_cmp(id2, min) < 0)
					min = id2;
			}
		}
		if (count > best_count || (count == best_count && disc_id_cmp(min, best_min) < 0)) {
			best = i;
			best_count = count;
			best_min = min;
		}
	}
	return best;
}

static int holds(const core_t *c, int maj, int i)
{
	uint64_t sz, sz2;
	const disc_id_t *id;
	const char *m = model_of(c, maj, &sz, &id), *m2 = model_of(c, i, &sz2, &id);
	return m && m2 && sz == sz2 && !strcmp(m, m2);
}

const char *core_majority_model(const core_t *c)
{
	int maj = majority(c);
	uint64_t sz;
	const disc_id_t *id;
	const char *m = maj == -2 ? NULL : model_of(c, maj, &sz, &id);
	return m ? m : "";
}

int core_planner(const core_t *c, disc_id_t *out)
{
	if (!c->have_leader)
		return 0;
	int maj = majority(c);
	int li = -2;
	if (is_self(c, &c->leader))
		li = -1;
	else
		for (int i = 0; i < c->n; i++)
			if (!disc_id_cmp(&c->members[i].id, &c->leader))
				li = i;
	if (li == -2)
		return 0; /* a leader we no longer see (it just left): none until the election says
			   */
	if (maj == -2 || holds(c, maj, li)) {
		*out = c->leader;
		return 1;
	}
	const disc_id_t *best = NULL;
	for (int i = -1; i < c->n; i++) {
		uint64_t sz;
		const disc_id_t *id;
		if (holds(c, maj, i) &&
		    (model_of(c, i, &sz, &id), !best || disc_id_cmp(id, best) < 0))
			best = id;
	}
	*out = best ? *best : c->leader;
	return 1;
}

int core_is_planner(const core_t *c)
{
	disc_id_t p;
	return core_planner(c, &p) && is_self(c, &p);
}

/* Why member i cannot be planned now ("" = it can). */
static void member_why(const core_t *c, int maj, int i, int64_t now, char *why, size_t len)
{
	const core_member_t *m = &c->members[i];
	uint64_t sz;
	const disc_id_t *id;
	why[0] = 0;
	if (!m->described)
		snprintf(why, len, "its description has not arrived");
	else if (!m->model[0])
		snprintf(why, len, "it has no model yet (receiving it from the leader)");
	else if (!holds(c, maj, i)) {
		const char *mm = model_of(c, maj, &sz, &id);
		snprintf(why, len,
			 "it holds another model (hash %.12s, %llu bytes) than most nodes (hash "
			 "%.12s, %llu bytes)",
			 m->model, (unsigned long long)m->model_size, mm ? mm : "-",
			 (unsigned long long)sz);
	} else if (m->stalled_until > now)
		snprintf(why, len, "it missed a step within the step timeout (left out for %lld s)",
			 (long long)((m->stalled_until - now + 999) / 1000));
}

static int cmp_id(const void *x, const void *y)
{
	return disc_id_cmp(x, y);
}

/* The plannable nodes (sorted, self included when it holds the majority model); tells members
 * left out why, once per reason. Returns 1 while a new member's description is awaited. */
static int want_compute(core_t *c, int64_t now)
{
	int maj = majority(c), waiting = 0;
	c->nwant = 0;
	if (holds(c, maj, -1))
		c->want[c->nwant++] = c->self;
	for (int i = 0; i < c->n && c->nwant < CORE_MAX_RANKS; i++) {
		core_member_t *m = &c->members[i];
		char why[CORE_WHY_MAX];
		member_why(c, maj, i, now, why, sizeof why);
		if (!why[0]) {
			c->want[c->nwant++] = m->id;
			m->excluded[0] = 0;
			continue;
		}
		if (!m->described) {
			waiting |= now - m->joined_ms < c->cfg.desc_wait_ms;
			continue;
		}
		if (!strncmp(m->excluded, why, 24))
			continue; /* already told (the stall countdown alone is no news) */
		snprintf(m->excluded, sizeof m->excluded, "%s", why);
		char h[9];
		short_hex(&m->id, h);
		core_log(c, LOG_WARN, "plan: leaving node %s out: %s", h, why);
		core_action_t *x = push(c, CORE_ACT_EXCLUDE);
		x->to = m->id;
		snprintf(x->text, sizeof x->text, "%s", why);
	}
	qsort(c->want, (size_t)c->nwant, sizeof c->want[0], cmp_id);
	return waiting;
}

/* A node's published links (self or a member): NULL when it is neither. */
static const disc_id_t *linked_of(const core_t *c, const disc_id_t *id, int *n, int64_t *since)
{
	if (is_self(c, id)) {
		*n = c->nlinked, *since = c->born_ms;
		return c->linked;
	}
	const core_member_t *m = core_member_get(c, id);
	if (!m)
		return NULL;
	*n = m->nlinked, *since = m->joined_ms;
	return m->linked;
}

/* The pairs of the wanted nodes whose link is not measured yet while the later of the two
 * joined less than links_wait_ms ago: the node with the smaller ID of a pair measures it
 * (agent/links.h). Planning before they are measured makes a plan per link measured. */
static int links_pending(const core_t *c, int64_t now)
{
	int pending = 0;
	if (c->cfg.links_wait_ms <= 0)
		return 0;
	for (int i = 0; i < c->nwant; i++)
		for (int j = i + 1; j < c->nwant; j++) {
			int lo = disc_id_cmp(&c->want[i], &c->want[j]) < 0 ? i : j, hi = i + j - lo,
			    n;
			int64_t t_lo, t_hi;
			const disc_id_t *l = linked_of(c, &c->want[lo], &n, &t_lo);
			if (!l || !linked_of(c, &c->want[hi], &(int){0}, &t_hi) ||
			    now - MAX(t_lo, t_hi) >= c->cfg.links_wait_ms)
				continue;
			int k = 0;
			while (k < n && disc_id_cmp(&l[k], &c->want[hi]))
				k++;
			pending += k == n;
		}
	return pending;
}

/* Does rank member m answer plan p? */
int core_member_answers(const core_t *c, const core_member_t *m, const core_plan_t *p, int64_t now)
{
	if (!m || m->stalled_until > now || !strcmp(m->left_hash, p->hash))
		return 0;
	if (!strcmp(m->ack_hash, p->hash))
		return m->ack == CORE_ACK_PLANNED || m->ack == CORE_ACK_LOADING ||
		       m->ack == CORE_ACK_SERVING;
	return !strcmp(m->sent_hash, p->hash) && now - m->sent_ms < c->cfg.ack_wait_ms;
}

/* Why the plan this node made does not compute ("" = it does). */
static void broken_check(core_t *c, int64_t now, char *why, size_t len)
{
	why[0] = 0;
	if (!c->have_made)
		return;
	for (int r = 0; r < c->made.n; r++) {
		const disc_id_t *id = &c->made.ranks[r];
		if (is_self(c, id))
			continue;
		const core_member_t *m = core_member_get(c, id);
		if (core_member_answers(c, m, &c->made, now))
			continue;
		char h[9];
		short_hex(id, h);
		snprintf(why, len, "rank %d (%s) %s", r, h,
			 !m                                    ? "is not connected"
			 : m->stalled_until > now              ? "stalled"
			 : !strcmp(m->left_hash, c->made.hash) ? "left the group"
			 : m->ack == CORE_ACK_FAILED && !strcmp(m->ack_hash, c->made.hash)
			     ? "failed the plan"
			     : "does not answer");
		return;
	}
}

static int same_set(const disc_id_t *a, int na, const disc_id_t *b, int nb)
{
	return na == nb && !memcmp(a, b, (size_t)na * sizeof *a);
}

/* The planner's rules, once per step. */
static void lead_step(core_t *c, int64_t now)
{
	if (!core_is_planner(c)) {
		if (c->lead != LEAD_OFF)
			lead_convert(c, LEAD_OFF, "another node plans", now);
		c->have_made = 0;
		c->nplanned = 0;
		c->remeasured = 0;
		return;
	}
	int waiting = want_compute(c, now);
	if (c->lead == LEAD_OFF)
		lead_convert(c, LEAD_WAITING, "this node plans", now);
	if (c->lead == LEAD_MAKING)
		return;
	/* a member of the made plan that (re)joined gets it again (a repeat is acknowledged) */
	if (c->have_made)
		for (int r = 0; r < c->made.n; r++) {
			core_member_t *m = member_find(c, &c->made.ranks[r]);
			if (!m || !strcmp(m->sent_hash, c->made.hash))
				continue;
			snprintf(m->sent_hash, sizeof m->sent_hash, "%s", c->made.hash);
			m->sent_ms = now;
			plan_action(c, CORE_ACT_SEND_PLAN, &c->made)->to = m->id;
		}
	char broken[CORE_WHY_MAX];
	broken_check(c, now, broken, sizeof broken);
	if (strcmp(broken, c->broken)) {
		if (broken[0])
			core_log(c, LOG_WARN, "plan %s: %s", c->made.hash, broken);
		snprintf(c->broken, sizeof c->broken, "%s", broken);
	}
	int moved = !same_set(c->want, c->nwant, c->planned, c->nplanned);
	int differs = broken[0] || moved || (c->remeasured && c->have_made);
	if (c->lead == LEAD_STEADY && differs)
		lead_convert(c, LEAD_DRIFT,
			     broken[0] ? broken
			     : moved   ? "members changed"
				       : "measurements changed",
			     now);
	else if (c->lead == LEAD_DRIFT && !differs)
		lead_convert(c, LEAD_STEADY, "members are back as planned", now);
	int64_t delay = c->lead == LEAD_DRIFT ? c->cfg.replan_delay_ms : 0;
	if ((c->lead != LEAD_WAITING && c->lead != LEAD_DRIFT) || waiting || now < c->retry_ms ||
	    now - c->change_ms < delay)
		return;
	if (!c->nwant || !holds(c, majority(c), -1)) {
		snprintf(c->why, sizeof c->why, "%s",
			 c->model[0] ? "this node's model differs from the majority's"
				     : "the leader has no model");
		return;
	}
	if (c->stale) { /* we were away: the election announces above the newer epoch first */
		snprintf(c->why, sizeof c->why, "waiting for the election's newer epoch");
		return;
	}
	int unmeasured = links_pending(c, now);
	if (unmeasured) {
		snprintf(c->why, sizeof c->why, "waiting for %d link measurement%s", unmeasured,
			 unmeasured > 1 ? "s" : "");
		return;
	}
	if (c->seq_term != c->term) {
		c->seq_term = c->term;
		c->seq = 0;
	}
	core_action_t *x = push(c, CORE_ACT_MAKE_PLAN);
	x->epoch = c->term << 20 | ++c->seq;
	if (x->epoch <= c->max_plan_epoch) /* another planner's plans in this term: go above */
		x->epoch = c->max_plan_epoch + 1;
	c->max_plan_epoch = x->epoch;
	x->n = c->nwant;
	memcpy(x->ids, c->want, (size_t)c->nwant * sizeof *c->want);
	memcpy(c->planned, c->want, (size_t)c->nwant * sizeof *c->want);
	c->nplanned = c->nwant;
	c->remeasured = 0;
	lead_convert(c, LEAD_MAKING, "planning", now);
}

/* ---- plans and sessions --------------------------------------------------------------------- */

static int rank_of(const core_plan_t *p, const disc_id_t *id)
{
	for (int r = 0; r < p->n; r++)
		if (!disc_id_cmp(&p->ranks[r], id))
			return r;
	return -1;
}

static core_ack_t my_ack(const core_t *c)
{
	if (c->have_pending)
		return CORE_ACK_PLANNED;
	switch (c->sess) {
	case SESS_RUNNING: return CORE_ACK_LOADING;
	case SESS_READY: return CORE_ACK_SERVING;
	default: return CORE_ACK_IDLE;
	}
}

static void plan_accept(core_t *c, const disc_id_t *from, const core_plan_t *p)
{
	char h[9];
	short_hex(from, h);
	disc_id_t planner;
	if (!core_planner(c, &planner) || disc_id_cmp(&planner, from)) {
		core_log(c, LOG_INFO, "plan: ignoring plan %s from %s, which does not plan here",
			 p->hash, h);
		return;
	}
	if (rank_of(p, &c->self) < 0) {
		core_log(c, LOG_WARN, "plan %s: this node is not in it (%d ranks)", p->hash, p->n);
		snprintf(c->why, sizeof c->why, "not in the leader's plan");
		return;
	}
	if ((c->have_cur && c->sess != SESS_NONE && !strcmp(c->cur.hash, p->hash)) ||
	    (c->have_pending && !strcmp(c->pending.hash, p->hash))) {
		ack(c, p->hash, my_ack(c), ""); /* a repeat: say where we are */
		return;
	}
	if (p->epoch < c->ran_epoch) { /* epochs only grow: the ack tells the planner ours */
		char e[96];
		snprintf(e, sizeof e, "plan epoch %llx is older than epoch %llx this node ran",
			 (unsigned long long)p->epoch, (unsigned long long)c->ran_epoch);
		core_log(c, LOG_WARN, "plan %s: refused: %s", p->hash, e);
		ack(c, p->hash, CORE_ACK_FAILED, e);
		return;
	}
	c->ran_epoch = p->epoch;
	c->pending = *p;
	c->have_pending = 1;
	if (c->sess == SESS_RUNNING || c->sess == SESS_READY) {
		push(c, CORE_ACT_STOP_SESSION);
		c->sess = SESS_STOPPING;
	}
	if (c->state == AGENT_DISCOVERING) /* cannot happen: a planner implies a leader */
		convert(c, AGENT_SETTLED, "leader known");
	convert(c, AGENT_PLANNED, "plan received");
	ack(c, p->hash, CORE_ACK_PLANNED, "");
}

/* Follows the planner; a new one ends what the old one planned here. */
static void follow_step(core_t *c)
{
	disc_id_t p;
	if (c->have_leader && c->state == AGENT_DISCOVERING)
		convert(c, AGENT_SETTLED, "leader known");
	else if (!c->have_leader && c->state == AGENT_SETTLED)
		convert(c, AGENT_DISCOVERING, "no leader");
	/* with a plan running, a moment without a leader changes nothing: a new planner, or the
	 * group failing, ends the session */
	if (!core_planner(c, &p) || (c->have_following && !disc_id_cmp(&p, &c->following)))
		return;
	char was[9] = "none", now_s[9];
	if (c->have_following)
		short_hex(&c->following, was);
	short_hex(&p, now_s);
	core_log(c, LOG_INFO, "plan: planner %s -> %s%s", was, now_s,
		 is_self(c, &p) ? " (this node)" : "");
	c->following = p;
	c->have_following = 1;
	c->have_pending = 0;
	if (c->sess == SESS_RUNNING || c->sess == SESS_READY) {
		push(c, CORE_ACT_STOP_SESSION);
		c->sess = SESS_STOPPING;
	}
	if (c->state > AGENT_SETTLED)
		convert(c, AGENT_SETTLED, "planner changed");
	c->have_made = 0;
	c->nplanned = 0;
	c->broken[0] = 0;
	c->lead = LEAD_OFF;
	ack(c, "", CORE_ACK_IDLE, ""); /* tells the planner what runs here: nothing of its own */
}

static void session_step(core_t *c)
{
	if (!c->have_pending || c->sess != SESS_NONE)
		return;
	c->cur = c->pending;
	c->have_cur = 1;
	c->have_pending = 0;
	core_action_t *x = plan_action(c, CORE_ACT_START_SESSION, &c->cur);
	x->rank = rank_of(&c->cur, &c->self);
	x->epoch = c->cur.epoch;
	c->sess = SESS_RUNNING;
	convert(c, AGENT_LOADING, "forming the group");
	ack(c, c->cur.hash, CORE_ACK_LOADING, "");
}

static void session_done(core_t *c, const char *err, int64_t now)
{
	c->sess = SESS_NONE;
	const char *hash = c->have_cur ? c->cur.hash : "";
	if (err && err[0] && !c->have_pending) {
		core_log(c, LOG_WARN, "plan %s: session ended: %s", hash, err);
		snprintf(c->why, sizeof c->why, "%.190s", err);
		ack(c, hash, CORE_ACK_FAILED, err);
		if (core_is_planner(c)) { /* plan again, after a pause */
			c->nplanned = 0;
			c->retry_ms = now + c->cfg.retry_ms;
			if (c->lead != LEAD_OFF && c->lead != LEAD_MAKING)
				lead_convert(c, LEAD_WAITING, "this node's session failed", now);
		}
	} else if (!c->have_pending)
		ack(c, hash, CORE_ACK_IDLE, "");
	if (!c->have_pending && c->state > AGENT_SETTLED)
		convert(c, AGENT_SETTLED, err && err[0] ? "session failed" : "session ended");
}

/* ---- the one input -------------------------------------------------------------------------- */

static void on_ack(core_t *c, core_member_t *m, const core_event_t *ev, int64_t now)
{
	const char *hash = ev->hash ? ev->hash : "";
	int in_made = c->have_made && rank_of(&c->made, &m->id) >= 0;
	if (ev->ack == CORE_ACK_IDLE && in_made) {
		/* it runs nothing of ours. Once our own share of the made plan is formed, the group
		 * has lost it (it followed someone else meanwhile): plan again. Before, it may just
		 * have ignored the plan while it followed someone else: send it again. */
		int formed =
		    c->sess == SESS_READY && c->have_cur && !strcmp(c->cur.hash, c->made.hash);
		if (formed || c->made.epoch >> 20 < c->term) /* or made in an older term */
			snprintf(m->left_hash, sizeof m->left_hash, "%s", c->made.hash);
		else
			m->sent_hash[0] = 0;
	}
	if (ev->ack == CORE_ACK_FAILED) {
		char h[9];
		short_hex(&m->id, h);
		core_log(c, LOG_WARN, "plan %s: node %s failed: %s", hash, h,
			 ev->text ? ev->text : "?");
		if (in_made && !strcmp(hash, c->made.hash))
			c->retry_ms = now + c->cfg.retry_ms;
	}
	m->ack = ev->ack;
	snprintf(m->ack_hash, sizeof m->ack_hash, "%s", hash);
	c->max_plan_epoch = MAX(c->max_plan_epoch, ev->epoch);
}

int core_step(core_t *c, int64_t now, const core_event_t *ev)
{
	core_member_t *m = NULL;
	c->now = now;
	if (ev->type != CORE_EV_TICK && ev->type != CORE_EV_LEADER)
		m = member_find(c, &ev->id);
	switch (ev->type) {
	case CORE_EV_TICK: break;
	case CORE_EV_LEADER:
		c->have_leader = !disc_id_is_zero(&ev->id);
		c->leader = ev->id;
		if (ev->epoch > c->term)
			c->term = ev->epoch;
		c->stale = ev->max_epoch > ev->epoch;
		break;
	case CORE_EV_MEMBER_UP:
		if (m || is_self(c, &ev->id) || c->n == CORE_MAX_MEMBERS)
			break;
		m = &c->members[c->n++];
		memset(m, 0, sizeof *m);
		m->id = ev->id;
		m->joined_ms = now;
		break;
	case CORE_EV_MEMBER_DOWN:
		if (m)
			*m = c->members[--c->n];
		break;
	case CORE_EV_MEMBER_DESC:
		if (!m)
			break;
		m->described = 1;
		snprintf(m->model, sizeof m->model, "%s", ev->model ? ev->model : "");
		m->model_size = ev->model_size;
		break;
	case CORE_EV_MODEL:
		snprintf(c->model, sizeof c->model, "%s", ev->model ? ev->model : "");
		c->model_size = ev->model_size;
		break;
	case CORE_EV_PLAN:
		if (!ev->plan)
			break;
		c->max_plan_epoch = MAX(c->max_plan_epoch, ev->plan->epoch);
		plan_accept(c, &ev->id, ev->plan);
		break;
	case CORE_EV_PLAN_BAD:
		core_log(c, LOG_ERROR, "plan: refused a plan: %s", ev->text ? ev->text : "?");
		ack(c, "", CORE_ACK_FAILED, ev->text);
		break;
	case CORE_EV_PLAN_MADE:
		if (c->lead != LEAD_MAKING || !ev->plan)
			break;
		c->made = *ev->plan;
		c->have_made = 1;
		c->broken[0] = 0;
		lead_convert(c, LEAD_STEADY, "plan made", now);
		for (int r = 0; r < c->made.n; r++) {
			core_member_t *x = member_find(c, &c->made.ranks[r]);
			if (!x)
				continue;
			x->ack = CORE_ACK_NONE;
			x->ack_hash[0] = 0;
			snprintf(x->sent_hash, sizeof x->sent_hash, "%s", c->made.hash);
			x->sent_ms = now;
			plan_action(c, CORE_ACT_SEND_PLAN, &c->made)->to = x->id;
		}
		plan_accept(c, &c->self, &c->made);
		break;
	case CORE_EV_PLAN_FAILED:
		if (c->lead != LEAD_MAKING)
			break;
		snprintf(c->why, sizeof c->why, "no plan: %.180s", ev->text ? ev->text : "?");
		c->retry_ms = now + c->cfg.retry_ms;
		c->nplanned = 0;
		lead_convert(c, LEAD_WAITING, "the planner failed", now);
		break;
	case CORE_EV_ACK:
		if (m)
			on_ack(c, m, ev, now);
		break;
	case CORE_EV_EXCLUDED:
		if (ev->text && strcmp(c->why, ev->text))
			core_log(c, LOG_WARN, "plan: the leader leaves this node out: %s",
				 ev->text);
		snprintf(c->why, sizeof c->why, "%s", ev->text ? ev->text : "");
		break;
	case CORE_EV_SESSION_READY:
		if (c->sess != SESS_RUNNING)
			break;
		c->sess = SESS_READY;
		c->served_once = 1;
		c->why[0] = 0;
		convert(c, AGENT_SERVING, core_is_planner(c) ? "serving the API" : "computing");
		ack(c, c->cur.hash, CORE_ACK_SERVING, "");
		break;
	case CORE_EV_SESSION_DONE:
		if (c->sess != SESS_NONE)
			session_done(c, ev->text, now);
		break;
	case CORE_EV_REMEASURED: c->remeasured = 1; break;
	case CORE_EV_LINKS: {
		disc_id_t *to = is_self(c, &ev->id) ? c->linked : m ? m->linked : NULL;
		int n = to ? MAX(0, MIN(ev->n, CORE_MAX_MEMBERS)) : 0;
		if (to && n)
			memcpy(to, ev->ids, (size_t)n * sizeof *to);
		if (is_self(c, &ev->id))
			c->nlinked = n;
		else if (m)
			m->nlinked = n;
		break;
	}
	case CORE_EV_RANK_STALLED:
		if (m) {
			m->stalled_until = now + c->cfg.stall_hold_ms;
			char h[9];
			short_hex(&m->id, h);
			core_log(c, LOG_WARN, "plan: node %s stalled; leaving it out for %lld ms",
				 h, (long long)c->cfg.stall_hold_ms);
		}
		break;
	}
	follow_step(c);
	lead_step(c, now);
	session_step(c);
	if (!c->overflow)
		return 0;
	c->overflow = 0;
	core_log(c, LOG_ERROR, "core: more than %d actions in one step; some were lost",
		 CORE_QUEUE);
	return SH_EBUSY;
}
