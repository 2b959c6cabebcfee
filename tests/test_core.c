/*
 * test_core.c: the agent's cluster core (agent/core.c) with the election core, stepped as a whole
 * simulated cluster on a fake clock, in the style of canonical/raft's fixture and
 * tests/test_election.c.
 *
 * The simulator plays the shell: channels between nodes (one per pair, with a generation number:
 * a message sent on an older channel is never delivered on a newer one), heartbeats every 300 ms,
 * a member silent for 1500 ms dropped (and the other side told by a close), messages delayed in
 * order per channel, duplicated, and lost (a lost control message breaks the channel, as TCP
 * would), links cut and healed, processes killed, restarted (with their durable term) and paused
 * (a paused node's clock jumps; what was sent to it waits). Sessions are simulated too: a plan's
 * group forms when every rank runs a session of it, a worker rank fails when its group loses a
 * member, rank 0 notices nothing by itself (as the real engine, which fails only at the next
 * request). "Serving" is what a client sees: the planner is SERVING, and every rank of its plan
 * runs a formed session of that plan.
 *
 * Everything is deterministic (seeded LCG), so a failing seed reproduces: SHOAL_CORE_SEED=N runs
 * one schedule with the core's log at info.
 */
#include "agent/core.h"
#include "common/common.h"
#include "discovery/discovery.h"
#include "harness.h"

#define NMAX      8
#define STEP      10 /* ms */
#define DEAD_MS   1500
#define HB_MS     300
#define QMAX      8192
#define PLANS_MAX 4096

enum kind { M_HB, M_LEADER, M_SMALLER, M_NODE, M_PLAN, M_ACK, M_EXCL, M_CLOSE };
enum sess { S_NONE, S_FORMING, S_READY, S_STOPPING };

typedef struct msg {
	int64_t at;
	int from, to;
	unsigned gen;
	enum kind kind;
	uint64_t epoch;
	disc_id_t subj;
	int is_leader;
	char hash[CORE_HASH_MAX];
	core_ack_t ack;
	char text[CORE_WHY_MAX];
} msg_t;

typedef struct node {
	int started, alive, paused;
	elec_t *e;
	core_t *c;
	disc_id_t id;
	char model[CORE_MODEL_MAX];
	disc_id_t fed_leader;
	uint64_t fed_epoch, term; /* term: the durable STATE_DIR/term */
	uint64_t plan_epoch;      /* the largest plan epoch it ran (across restarts) */
	int64_t next_hb;
	enum sess sess;
	char sess_hash[CORE_HASH_MAX];
	int sess_rank, ready_fed;
	unsigned group; /* the formed group it belongs to (ranks that formed together) */
	int64_t sess_t;
	char sess_err[64];
} node_t;

typedef struct sim {
	int n;
	int64_t now;
	node_t nd[NMAX];
	int conn[NMAX][NMAX]; /* i holds a channel to j */
	unsigned gen[NMAX][NMAX];
	int64_t last_rx[NMAX][NMAX], last_at[NMAX][NMAX], next_dial[NMAX][NMAX];
	int cut[NMAX][NMAX];
	msg_t *q;
	int nq;
	core_plan_t *plans;
	int nplans;
	unsigned p_drop, p_dup; /* per 1000 */
	int max_delay;
	int64_t lie_ms, lie_max; /* the planner says 200 while its plan cannot compute */
	unsigned groups;
	int epoch_back;     /* a node ran a plan older than one it had run before */
	int64_t links_wait; /* the cores' links_wait_ms (0: they do not wait for links) */
} sim_t;

static int verbose; /* SHOAL_CORE_SEED=N: one schedule with the cores' log lines */

static uint32_t rng_state;
static uint32_t rng(void)
{
	rng_state = rng_state * 1664525u + 1013904223u;
	return rng_state >> 8;
}

static int running(const sim_t *s, int i)
{
	return s->nd[i].started && s->nd[i].alive && !s->nd[i].paused;
}

static void sim_init(sim_t *s, int n)
{
	memset(s, 0, sizeof *s);
	s->n = n;
	s->q = calloc(QMAX, sizeof *s->q);
	s->plans = calloc(PLANS_MAX, sizeof *s->plans);
	s->max_delay = 5;
	for (int i = 0; i < n; i++) {
		for (int k = 0; k < DISC_ID_LEN; k++)
			s->nd[i].id.b[k] = (uint8_t)rng();
		s->nd[i].id.b[0] = (uint8_t)(0x10 + i); /* node 0 is the smallest */
		snprintf(s->nd[i].model, sizeof s->nd[i].model, "%064d", 7);
	}
}

static void node_stop(node_t *d)
{
	elec_free(d->e);
	core_free(d->c);
	d->e = NULL;
	d->c = NULL;
}

static void sim_free(sim_t *s)
{
	for (int i = 0; i < s->n; i++)
		node_stop(&s->nd[i]);
	free(s->q);
	free(s->plans);
}

static int index_of(const sim_t *s, const disc_id_t *id)
{
	for (int i = 0; i < s->n; i++)
		if (!disc_id_cmp(&s->nd[i].id, id))
			return i;
	return -1;
}

static const core_plan_t *plan_find(const sim_t *s, const char *hash)
{
	for (int k = s->nplans - 1; k >= 0; k--)
		if (!strcmp(s->plans[k].hash, hash))
			return &s->plans[k];
	return NULL;
}

/* ---- the bus -------------------------------------------------------------------------------- */

static void breakconn(sim_t *s, int i, int j);

static void bus_send(sim_t *s, int from, int to, msg_t m)
{
	if (!s->conn[from][to] || s->nq + 2 > QMAX)
		return;
	if (m.kind != M_CLOSE && rng() % 1000 < s->p_drop) {
		if (m.kind != M_HB) { /* a lost control message: the channel breaks */
			breakconn(s, from, to);
			return;
		}
		return;
	}
	m.from = from;
	m.to = to;
	m.gen = s->gen[MIN(from, to)][MAX(from, to)];
	m.at = MAX(s->now + 1 + (int64_t)(rng() % (unsigned)s->max_delay), s->last_at[from][to]);
	s->last_at[from][to] = m.at;
	s->q[s->nq++] = m;
	if (m.kind != M_CLOSE && rng() % 1000 < s->p_dup)
		s->q[s->nq++] = m;
}

static void feed(sim_t *s, int i, const core_event_t *ev);

static void feed_leader(sim_t *s, int i)
{
	node_t *d = &s->nd[i];
	disc_id_t l;
	if (!elec_leader(d->e, &l))
		memset(&l, 0, sizeof l);
	uint64_t ep = elec_epoch(d->e), mx = elec_max_epoch(d->e);
	if (!disc_id_cmp(&l, &d->fed_leader) && ep == d->fed_epoch && mx == d->term)
		return;
	d->term = MAX(d->term, mx);
	d->fed_leader = l;
	d->fed_epoch = ep;
	core_event_t ev = {.type = CORE_EV_LEADER, .id = l, .epoch = ep, .max_epoch = mx};
	feed(s, i, &ev);
}

/* i drops its channel to j; with notify, j hears the close. */
static void drop(sim_t *s, int i, int j, int notify)
{
	if (!s->conn[i][j])
		return;
	if (notify) {
		msg_t m = {.kind = M_CLOSE};
		bus_send(s, i, j, m);
	}
	s->conn[i][j] = 0;
	elec_member_down(s->nd[i].e, &s->nd[j].id, s->now);
	core_event_t ev = {.type = CORE_EV_MEMBER_DOWN, .id = s->nd[j].id};
	feed(s, i, &ev);
	feed_leader(s, i);
}

static void breakconn(sim_t *s, int i, int j)
{
	drop(s, i, j, 1);
}

static void send_elec(sim_t *s, int i)
{
	elec_msg_t em;
	while (elec_next_msg(s->nd[i].e, &em))
		for (int j = 0; j < s->n; j++) {
			if (!s->conn[i][j] || (!em.broadcast && disc_id_cmp(&em.to, &s->nd[j].id)))
				continue;
			msg_t m = {.kind = em.type == DISC_MSG_LEADER ? M_LEADER : M_SMALLER,
				   .epoch = em.epoch,
				   .subj = em.subject};
			bus_send(s, i, j, m);
		}
}

/* ---- the shell's part: actions -------------------------------------------------------------- */

static void make_plan(sim_t *s, int i, const core_action_t *x)
{
	core_plan_t p = {.epoch = x->epoch};
	p.ranks[p.n++] = s->nd[i].id; /* the planner is rank 0 */
	for (int k = 0; k < x->n; k++)
		if (disc_id_cmp(&x->ids[k], &s->nd[i].id))
			p.ranks[p.n++] = x->ids[k];
	snprintf(p.hash, sizeof p.hash, "%04x%012llx", (unsigned)(s->nplans & 0xffff),
		 (unsigned long long)x->epoch);
	if (s->nplans < PLANS_MAX)
		s->plans[s->nplans++] = p;
	core_event_t ev = {.type = CORE_EV_PLAN_MADE, .plan = &p};
	feed(s, i, &ev);
}

static void feed(sim_t *s, int i, const core_event_t *ev)
{
	node_t *d = &s->nd[i];
	CHECK_EQ_INT(core_step(d->c, s->now, ev), 0);
	core_action_t x;
	while (core_next_action(d->c, &x)) {
		int j = index_of(s, &x.to);
		msg_t m = {0};
		switch (x.type) {
		case CORE_ACT_MAKE_PLAN: make_plan(s, i, &x); break;
		case CORE_ACT_SEND_PLAN:
			m.kind = M_PLAN;
			snprintf(m.hash, sizeof m.hash, "%s", x.hash);
			if (j >= 0)
				bus_send(s, i, j, m);
			break;
		case CORE_ACT_EXCLUDE:
			m.kind = M_EXCL;
			snprintf(m.text, sizeof m.text, "%s", x.text);
			if (j >= 0)
				bus_send(s, i, j, m);
			break;
		case CORE_ACT_ACK:
			m.kind = M_ACK;
			m.ack = x.ack;
			m.epoch = x.epoch;
			snprintf(m.hash, sizeof m.hash, "%s", x.hash);
			if (j >= 0)
				bus_send(s, i, j, m);
			break;
		case CORE_ACT_START_SESSION:
			CHECK(d->sess == S_NONE); /* one session at a time */
			d->sess = S_FORMING;
			d->ready_fed = 0;
			d->sess_t = s->now;
			d->sess_rank = x.rank;
			snprintf(d->sess_hash, sizeof d->sess_hash, "%s", x.hash);
			break;
		case CORE_ACT_STOP_SESSION:
			if (d->sess != S_NONE && d->sess != S_STOPPING) {
				d->sess = S_STOPPING;
				d->sess_t = s->now;
				d->sess_err[0] = 0;
			}
			break;
		case CORE_ACT_PLAN_IN_FORCE:
		case CORE_ACT_PLAN_GONE: break;
		}
	}
}

/* ---- processes ------------------------------------------------------------------------------ */

/* A core's log line (core_config_t.log), with its node's short ID. */
static void log_line(void *ud, int level, const char *line)
{
	const node_t *d = ud;
	fprintf(stderr, "[%02x] %s%s\n", d->id.b[0], level <= LOG_WARN ? "! " : "", line);
}

static void node_start(sim_t *s, int i)
{
	node_t *d = &s->nd[i];
	elec_config_t ec = {
	    .settle_ms = 500, .grace_ms = 1000, .hold_ms = 5000, .min_epoch = d->term};
	core_config_t cc;
	core_config_default(&cc);
	cc.log = verbose ? log_line : NULL;
	cc.log_ud = d;
	cc.links_wait_ms = s->links_wait;
	d->e = elec_new(&d->id, &ec, s->now);
	d->c = core_new(&d->id, &cc, s->now);
	d->started = d->alive = 1;
	d->paused = 0;
	d->sess = S_NONE;
	memset(&d->fed_leader, 0, sizeof d->fed_leader);
	d->fed_epoch = 0;
	d->next_hb = s->now;
	core_event_t ev = {.type = CORE_EV_MODEL, .model = d->model, .model_size = 1000};
	feed(s, i, &ev);
}

/* kill -9: channels close (the peers hear it), the session ends with it */
static void node_kill(sim_t *s, int i)
{
	for (int j = 0; j < s->n; j++)
		if (s->conn[i][j]) {
			msg_t m = {.kind = M_CLOSE};
			bus_send(s, i, j, m);
			s->conn[i][j] = 0;
		}
	node_stop(&s->nd[i]);
	s->nd[i].alive = 0;
	s->nd[i].sess = S_NONE;
}

static void establish(sim_t *s, int i, int j)
{
	unsigned *g = &s->gen[MIN(i, j)][MAX(i, j)];
	(*g)++;
	int pair[2] = {i, j};
	for (int k = 0; k < 2; k++) {
		int a = pair[k], b = pair[1 - k];
		s->conn[a][b] = 1;
		s->last_rx[a][b] = s->now;
		s->last_at[a][b] = s->now;
		elec_member_up(s->nd[a].e, &s->nd[b].id, s->now);
		core_event_t ev = {.type = CORE_EV_MEMBER_UP, .id = s->nd[b].id};
		feed(s, a, &ev);
		feed_leader(s, a);
		msg_t m = {.kind = M_NODE};
		bus_send(s, a, b, m);
	}
}

static void deliver(sim_t *s, const msg_t *m)
{
	int i = m->to, j = m->from;
	node_t *d = &s->nd[i];
	if (m->gen != s->gen[MIN(i, j)][MAX(i, j)] || !s->conn[i][j])
		return; /* an older channel's message */
	s->last_rx[i][j] = s->now;
	core_event_t ev = {.id = s->nd[j].id};
	switch (m->kind) {
	case M_HB:
		elec_on_heartbeat(d->e, &s->nd[j].id, m->epoch, &m->subj, m->is_leader, s->now);
		feed_leader(s, i);
		break;
	case M_LEADER:
		elec_on_leader(d->e, &s->nd[j].id, m->epoch, NULL, 0, s->now);
		feed_leader(s, i);
		break;
	case M_SMALLER:
		elec_on_smaller(d->e, &s->nd[j].id, &m->subj, s->now);
		feed_leader(s, i);
		break;
	case M_NODE:
		ev.type = CORE_EV_MEMBER_DESC;
		ev.model = s->nd[j].model;
		ev.model_size = 1000;
		feed(s, i, &ev);
		break;
	case M_PLAN:
		ev.type = CORE_EV_PLAN;
		ev.plan = plan_find(s, m->hash);
		feed(s, i, &ev);
		break;
	case M_ACK:
		ev.type = CORE_EV_ACK;
		ev.epoch = m->epoch;
		ev.hash = m->hash;
		ev.ack = m->ack;
		ev.text = "";
		feed(s, i, &ev);
		break;
	case M_EXCL:
		ev.type = CORE_EV_EXCLUDED;
		ev.text = m->text;
		feed(s, i, &ev);
		break;
	case M_CLOSE: drop(s, i, j, 0); break;
	}
}

/* ---- sessions and groups -------------------------------------------------------------------- */

/* Does every rank of plan p run a session of it, all forming (form = 1) or all in one formed
 * group (form = 0), with no link between them cut? A group, once formed, takes nobody in. */
static int group_whole(const sim_t *s, const core_plan_t *p, int form)
{
	unsigned g = 0;
	for (int r = 0; r < p->n; r++) {
		int k = index_of(s, &p->ranks[r]);
		if (k < 0 || !s->nd[k].alive || strcmp(s->nd[k].sess_hash, p->hash) ||
		    s->nd[k].sess != (form ? S_FORMING : S_READY))
			return 0;
		if (!form && r && s->nd[k].group != g)
			return 0;
		g = s->nd[k].group;
		for (int r2 = 0; r2 < r; r2++) {
			int k2 = index_of(s, &p->ranks[r2]);
			if (s->cut[k][k2])
				return 0;
		}
	}
	return 1;
}

static void sessions(sim_t *s)
{
	for (int i = 0; i < s->n; i++) {
		node_t *d = &s->nd[i];
		if (!running(s, i) || d->sess == S_NONE)
			continue;
		const core_plan_t *p = plan_find(s, d->sess_hash);
		if (d->sess == S_FORMING && p && group_whole(s, p, 1)) {
			int all_running = 1;
			for (int r = 0; r < p->n; r++)
				all_running &= running(s, index_of(s, &p->ranks[r]));
			s->groups += all_running;
			for (int r = 0; all_running && r < p->n; r++) {
				s->nd[index_of(s, &p->ranks[r])].sess = S_READY;
				s->nd[index_of(s, &p->ranks[r])].group = s->groups;
			}
		}
		int whole = p && group_whole(s, p, 0);
		if (d->sess == S_FORMING && s->now - d->sess_t > 10000) {
			d->sess = S_STOPPING;
			d->sess_t = s->now;
			snprintf(d->sess_err, sizeof d->sess_err, "forming timed out");
		}
		if (d->sess == S_READY && !whole && d->sess_rank > 0) {
			d->sess = S_STOPPING; /* a worker sees its group fail */
			d->sess_t = s->now;
			snprintf(d->sess_err, sizeof d->sess_err, "rank lost");
		}
	}
	for (int i = 0; i < s->n; i++) {
		node_t *d = &s->nd[i];
		if (!running(s, i))
			continue;
		if (d->sess == S_READY && !d->ready_fed) {
			d->ready_fed = 1;
			core_event_t ev = {.type = CORE_EV_SESSION_READY};
			feed(s, i, &ev);
		} else if (d->sess == S_STOPPING && s->now - d->sess_t >= 20) {
			d->sess = S_NONE;
			core_event_t ev = {.type = CORE_EV_SESSION_DONE, .text = d->sess_err};
			feed(s, i, &ev);
		}
	}
}

/* ---- the step ------------------------------------------------------------------------------- */

static int serving_plan(const sim_t *s, int *planner, const core_plan_t **plan);

static void sim_step(sim_t *s)
{
	s->now += STEP;
	/* due messages, in order of arrival, to running nodes */
	int w = 0;
	msg_t *due = malloc((size_t)s->nq * sizeof *due + 1);
	int nd = 0;
	for (int k = 0; k < s->nq; k++) {
		if (s->q[k].at <= s->now && running(s, s->q[k].to))
			due[nd++] = s->q[k];
		else if (s->nd[s->q[k].to].alive)
			s->q[w++] = s->q[k];
	}
	s->nq = w;
	for (int k = 0; k < nd; k++)
		if (running(s, due[k].to))
			deliver(s, &due[k]);
	free(due);
	for (int i = 0; i < s->n; i++) {
		if (!running(s, i))
			continue;
		node_t *d = &s->nd[i];
		for (int j = 0; j < s->n; j++)
			if (s->conn[i][j] && s->now - s->last_rx[i][j] > DEAD_MS)
				breakconn(s, i, j);
		for (int j = i + 1; j < s->n; j++)
			if (running(s, j) && !s->cut[i][j] && !s->conn[i][j] && !s->conn[j][i] &&
			    s->now >= s->next_dial[i][j]) {
				s->next_dial[i][j] = s->now + 100 + (int64_t)(rng() % 200);
				establish(s, i, j);
			}
		elec_tick(d->e, s->now);
		feed_leader(s, i);
		core_event_t ev = {.type = CORE_EV_TICK};
		feed(s, i, &ev);
		if (s->now >= d->next_hb) {
			d->next_hb = s->now + HB_MS;
			disc_id_t l;
			elec_leader(d->e, &l);
			int lead = elec_state(d->e) == ELEC_LEADER;
			msg_t m = {.kind = M_HB,
				   .epoch = lead ? elec_epoch(d->e) : elec_max_epoch(d->e),
				   .subj = l,
				   .is_leader = lead};
			for (int j = 0; j < s->n; j++)
				bus_send(s, i, j, m);
		}
		send_elec(s, i);
	}
	sessions(s);
	/* the truth of /health: a planner saying 200 whose plan cannot compute */
	int lying = 0;
	for (int i = 0; i < s->n; i++) {
		char why[CORE_WHY_MAX];
		if (!running(s, i) || !core_is_planner(s->nd[i].c) ||
		    core_health(s->nd[i].c, why, sizeof why) != CORE_HEALTH_SERVING)
			continue;
		const core_plan_t *p = core_plan(s->nd[i].c);
		lying |= !p || !group_whole(s, p, 0);
		for (int r = 0; p && r < p->n; r++)
			lying |= !running(s, index_of(s, &p->ranks[r]));
	}
	s->lie_ms = lying ? s->lie_ms + STEP : 0;
	for (int i = 0; i < s->n; i++) {
		const core_plan_t *p = running(s, i) ? core_plan(s->nd[i].c) : NULL;
		if (!p)
			continue;
		if (p->epoch < s->nd[i].plan_epoch && getenv("SHOAL_CORE_SEED"))
			fprintf(stderr, "  t=%lld node %d runs plan epoch %llx after %llx\n",
				(long long)s->now, i, (unsigned long long)p->epoch,
				(unsigned long long)s->nd[i].plan_epoch);
		s->epoch_back += p->epoch < s->nd[i].plan_epoch;
		s->nd[i].plan_epoch = MAX(s->nd[i].plan_epoch, p->epoch);
	}
	s->lie_max = MAX(s->lie_max, s->lie_ms);
}

static void sim_run(sim_t *s, int64_t ms)
{
	int64_t end = s->now + ms;
	while (s->now < end)
		sim_step(s);
}

/* Is the cluster serving, as a client sees it? The planner every running node in `mask` agrees
 * on serves its plan, every rank runs a formed session of it, and the plan holds exactly `ranks`
 * (a bit mask of node indices). */
static int serving_plan(const sim_t *s, int *planner, const core_plan_t **plan)
{
	int p = -1;
	for (int i = 0; i < s->n; i++) {
		disc_id_t x;
		if (!running(s, i))
			continue;
		if (!core_planner(s->nd[i].c, &x))
			return 0;
		int k = index_of(s, &x);
		if (p >= 0 && k != p)
			return 0;
		p = k;
	}
	if (p < 0 || !running(s, p))
		return 0;
	char why[CORE_WHY_MAX];
	const core_plan_t *pl = core_plan(s->nd[p].c);
	if (core_state(s->nd[p].c) != AGENT_SERVING ||
	    core_health(s->nd[p].c, why, sizeof why) != CORE_HEALTH_SERVING || !pl)
		return 0;
	for (int r = 0; r < pl->n; r++) {
		int k = index_of(s, &pl->ranks[r]);
		if (k < 0 || !running(s, k) || s->nd[k].sess != S_READY ||
		    strcmp(s->nd[k].sess_hash, pl->hash))
			return 0;
		const core_plan_t *kp = core_plan(s->nd[k].c);
		if (!kp || strcmp(kp->hash, pl->hash) || !core_rank_up(s->nd[p].c, r))
			return 0;
	}
	*planner = p;
	*plan = pl;
	return 1;
}

static unsigned plan_mask(const sim_t *s, const core_plan_t *p)
{
	unsigned m = 0;
	for (int r = 0; r < p->n; r++)
		m |= 1u << index_of(s, &p->ranks[r]);
	return m;
}

/* Runs until the cluster serves with `ranks` planned by `planner` (-1: any); the time, or -1. */
static int64_t until_serving(sim_t *s, unsigned ranks, int planner, int64_t deadline)
{
	int64_t t0 = s->now;
	while (s->now - t0 <= deadline) {
		int p;
		const core_plan_t *pl;
		if (serving_plan(s, &p, &pl) && plan_mask(s, pl) == ranks &&
		    (planner < 0 || p == planner))
			return s->now - t0;
		sim_step(s);
	}
	return -1;
}

static unsigned all_mask(int n)
{
	return (1u << n) - 1;
}

static void start_all(sim_t *s, int spread_ms)
{
	for (int i = 0; i < s->n; i++) {
		if (spread_ms)
			sim_run(s, (int64_t)(rng() % (unsigned)spread_ms) / STEP * STEP);
		node_start(s, i);
	}
}

/* ---- scenarios ------------------------------------------------------------------------------ */

/* The measurements changed (the shell's judgement: agent/links.h): the planner plans again,
 * after the re-plan delay, and the cluster serves the new plan; a follower hearing it does
 * nothing (it does not plan). */
TEST(remeasured_replans)
{
	sim_t s;
	rng_state = 21;
	sim_init(&s, 3);
	start_all(&s, 0);
	CHECK(until_serving(&s, 0x7, 0, 5000) >= 0);
	sim_run(&s, 1000);
	const core_plan_t *was = core_plan(s.nd[0].c);
	char h0[CORE_HASH_MAX];
	snprintf(h0, sizeof h0, "%s", was ? was->hash : "");
	core_event_t rm = {.type = CORE_EV_REMEASURED};
	feed(&s, 1, &rm); /* a follower: nothing moves */
	sim_run(&s, 2000);
	CHECK(core_plan(s.nd[0].c) && !strcmp(core_plan(s.nd[0].c)->hash, h0));
	feed(&s, 0, &rm); /* the planner: a new plan of the same members */
	CHECK(until_serving(&s, 0x7, 0, 5000) >= 0);
	sim_run(&s, 1000);
	CHECK(until_serving(&s, 0x7, 0, 5000) >= 0);
	CHECK(core_plan(s.nd[0].c) && strcmp(core_plan(s.nd[0].c)->hash, h0));
	sim_free(&s);
}

/* Node i of the planner's view (i = 0: the planner itself) publishes links towards nodes
 * to[0..n). */
static void links_of(sim_t *s, int i, const int *to, int n)
{
	disc_id_t ids[NMAX];
	for (int k = 0; k < n; k++)
		ids[k] = s->nd[to[k]].id;
	core_event_t ev = {.type = CORE_EV_LINKS, .id = s->nd[i].id, .ids = ids, .n = n};
	feed(s, 0, &ev);
}

/* With links_wait_ms the planner's first plan waits until every pair's link is measured (the
 * smaller ID of a pair measures it), so that it reads measured links: one plan, not one per
 * link measured; a join waits for the new pairs the same way; a link never measured holds
 * the plan back links_wait_ms at most. */
TEST(links_measured_before_the_first_plan)
{
	sim_t s;
	rng_state = 31;
	sim_init(&s, 4);
	s.links_wait = 4000;
	for (int i = 0; i < 3; i++)
		node_start(&s, i);
	sim_run(&s, 1500);
	CHECK(!s.nplans);
	char why[CORE_WHY_MAX];
	core_health(s.nd[0].c, why, sizeof why);
	CHECK(strstr(why, "waiting for 3 link measurements") != NULL);
	links_of(&s, 0, (int[]){1, 2}, 2);
	sim_run(&s, 200);
	CHECK(!s.nplans);
	core_health(s.nd[0].c, why, sizeof why);
	CHECK(strstr(why, "waiting for 1 link measurement") != NULL);
	links_of(&s, 1, (int[]){2}, 1);
	CHECK(until_serving(&s, 0x7, 0, 3000) >= 0);
	CHECK_EQ_INT(s.nplans, 1);
	/* a join: its pairs are waited for too, then one plan of all four */
	node_start(&s, 3);
	sim_run(&s, 2000);
	CHECK_EQ_INT(s.nplans, 1);
	links_of(&s, 0, (int[]){1, 2, 3}, 3);
	links_of(&s, 1, (int[]){2, 3}, 2);
	links_of(&s, 2, (int[]){3}, 1);
	CHECK(until_serving(&s, 0xf, 0, 3000) >= 0);
	CHECK_EQ_INT(s.nplans, 2);
	sim_free(&s);
	/* links never measured: the plan comes once links_wait_ms has passed */
	rng_state = 32;
	sim_init(&s, 3);
	s.links_wait = 4000;
	start_all(&s, 0);
	sim_run(&s, 3000);
	CHECK(!s.nplans);
	CHECK(until_serving(&s, 0x7, 0, 4000) >= 0);
	CHECK_EQ_INT(s.nplans, 1);
	sim_free(&s);
}

TEST(forms_and_agrees)
{
	for (int n = 1; n <= 5; n++) {
		sim_t s;
		rng_state = 100 + (uint32_t)n;
		sim_init(&s, n);
		start_all(&s, 300);
		int64_t t = until_serving(&s, all_mask(n), 0, 5000);
		CHECK(t >= 0);
		if (t < 0)
			fprintf(stderr, "  %d nodes did not form\n", n);
		CHECK(s.lie_max < 2000);
		sim_free(&s);
	}
}

TEST(join_and_leave)
{
	sim_t s;
	rng_state = 7;
	sim_init(&s, 4);
	for (int i = 0; i < 3; i++)
		node_start(&s, i);
	CHECK(until_serving(&s, 0x7, 0, 5000) >= 0);
	node_start(&s, 3);
	int64_t t = until_serving(&s, 0xf, 0, 5000);
	CHECK(t >= 0 && t < 3000);
	node_kill(&s, 2); /* a follower dies */
	t = until_serving(&s, 0xb, 0, 5000);
	CHECK(t >= 0 && t < 3000);
	CHECK(s.lie_max < 2000);
	sim_free(&s);
}

TEST(leader_death)
{
	sim_t s;
	rng_state = 8;
	sim_init(&s, 3);
	start_all(&s, 0);
	CHECK(until_serving(&s, 0x7, 0, 5000) >= 0);
	node_kill(&s, 0);
	int64_t t = until_serving(&s, 0x6, 1, 5000);
	CHECK(t >= 0 && t < 3000);
	node_start(&s, 0); /* it comes back: the smallest ID leads again */
	t = until_serving(&s, 0x7, 0, 8000);
	CHECK(t >= 0);
	CHECK(s.lie_max < 2000);
	sim_free(&s);
}

/* issue 14: SIGSTOP of the leader for 3, 10, 30 s, then SIGCONT: within 5 s every node agrees
 * on one leader and one plan, and the plan computes. */
TEST(paused_leader_comes_back)
{
	int64_t pauses[] = {3000, 10000, 30000};
	for (size_t k = 0; k < ARRAY_LEN(pauses); k++)
		for (int run = 0; run < (k ? 4 : 10); run++) {
			sim_t s;
			rng_state = 1000 + (uint32_t)(k * 10 + (size_t)run);
			sim_init(&s, 3);
			s.max_delay = 20;
			start_all(&s, 200);
			CHECK(until_serving(&s, 0x7, 0, 5000) >= 0);
			s.nd[0].paused = 1;
			int64_t t = until_serving(&s, 0x6, 1, pauses[k]);
			if (pauses[k] >= 5000)
				CHECK(t >= 0); /* the others serve meanwhile */
			sim_run(&s, pauses[k] - (t > 0 ? t : 0));
			s.nd[0].paused = 0;
			t = until_serving(&s, 0x7, 0, 5000);
			CHECK(t >= 0);
			if (t < 0)
				fprintf(stderr,
					"  pause %lld run %d: no agreement 5 s after resume\n",
					(long long)pauses[k], run);
			CHECK(s.lie_max < 2000);
			sim_free(&s);
		}
}

TEST(paused_follower_comes_back)
{
	for (int run = 0; run < 10; run++) {
		sim_t s;
		rng_state = 2000 + (uint32_t)run;
		sim_init(&s, 3);
		s.max_delay = 20;
		start_all(&s, 200);
		CHECK(until_serving(&s, 0x7, 0, 5000) >= 0);
		s.nd[2].paused = 1;
		/* dropped after DEAD_MS; the two others serve again (step timeout + 2 s) */
		int64_t t = until_serving(&s, 0x3, 0, 4000);
		CHECK(t >= 0);
		sim_run(&s, 6000);
		s.nd[2].paused = 0;
		t = until_serving(&s, 0x7, 0, 5000);
		CHECK(t >= 0);
		CHECK(s.lie_max < 2000);
		sim_free(&s);
	}
}

/* A rank whose channel stays up but that misses the step timeout (rank 0 says so) is left out;
 * it comes back once the hold is over. */
TEST(stalled_rank)
{
	sim_t s;
	rng_state = 9;
	sim_init(&s, 3);
	start_all(&s, 0);
	CHECK(until_serving(&s, 0x7, 0, 5000) >= 0);
	core_event_t ev = {.type = CORE_EV_RANK_STALLED, .id = s.nd[1].id};
	feed(&s, 0, &ev);
	char why[CORE_WHY_MAX];
	CHECK(core_health(s.nd[0].c, why, sizeof why) != CORE_HEALTH_SERVING);
	CHECK(!core_rank_up(s.nd[0].c, 1));
	int64_t t = until_serving(&s, 0x5, 0, 3000);
	CHECK(t >= 0 && t < 2000);
	const char *ex = core_member_excluded(s.nd[0].c, &s.nd[1].id);
	CHECK(ex && strstr(ex, "step timeout"));
	t = until_serving(&s, 0x7, 0, 15000); /* re-admitted after the hold (10 s) */
	CHECK(t >= 0);
	sim_free(&s);
}

/* Node 0 has the smallest ID but another model: the majority's model is served, rank 0 is the
 * smallest of its holders, and node 0 hears why it is left out. */
TEST(another_model_smallest_id)
{
	for (int ties = 0; ties < 2; ties++) {
		sim_t s;
		rng_state = 10 + (uint32_t)ties;
		sim_init(&s, ties ? 2 : 4);
		snprintf(s.nd[0].model, sizeof s.nd[0].model, "%064d", 9);
		start_all(&s, 100);
		if (!ties) {
			CHECK(until_serving(&s, 0xe, 1, 6000) >= 0);
			CHECK(strcmp(core_majority_model(s.nd[3].c), s.nd[1].model) == 0);
			const char *ex = core_member_excluded(s.nd[1].c, &s.nd[0].id);
			CHECK(ex && strstr(ex, "another model"));
			char why[CORE_WHY_MAX];
			core_health(s.nd[0].c, why, sizeof why);
			CHECK(strstr(why, "another model") != NULL);
		} else /* one node each: the model of the smallest ID wins */
			CHECK(until_serving(&s, 0x1, 0, 6000) >= 0);
		sim_free(&s);
	}
}

/* A copied state directory: the shell refuses a channel to our own ID; the core ignores it. */
TEST(duplicate_id_ignored)
{
	core_config_t cc;
	core_config_default(&cc);
	disc_id_t me = {{1, 2, 3}};
	core_t *c = core_new(&me, &cc, 0);
	core_event_t ev = {.type = CORE_EV_MEMBER_UP, .id = me};
	CHECK_EQ_INT(core_step(c, 10, &ev), 0);
	CHECK(core_member_excluded(c, &me) == NULL);
	core_action_t x;
	while (core_next_action(c, &x))
		;
	core_free(c);
}

TEST(flapping_link)
{
	sim_t s;
	rng_state = 11;
	sim_init(&s, 3);
	start_all(&s, 0);
	CHECK(until_serving(&s, 0x7, 0, 5000) >= 0);
	for (int k = 0; k < 8; k++) {
		s.cut[0][2] = s.cut[2][0] = !s.cut[0][2];
		sim_run(&s, 400 + (int64_t)(rng() % 2000) / STEP * STEP);
	}
	s.cut[0][2] = s.cut[2][0] = 0;
	int64_t t = until_serving(&s, 0x7, 0, 8000);
	CHECK(t >= 0);
	CHECK(s.lie_max < 2000);
	sim_free(&s);
}

/* Seeded random schedules: kills, restarts, pauses, cuts, drops and duplicates for 20 s; then
 * everything heals and the whole cluster must serve one plan within 12 s. */
static int random_schedule(uint32_t seed, int verbose)
{
	sim_t s;
	rng_state = seed;
	int n = 2 + (int)(rng() % 4);
	sim_init(&s, n);
	s.max_delay = 1 + (int)(rng() % 30);
	s.p_dup = rng() % 20;
	s.p_drop = rng() % 10;
	start_all(&s, 600);
	int64_t resume[NMAX] = {0};
	int64_t end = s.now + 20000;
	while (s.now < end) {
		sim_run(&s, 200 + (int64_t)(rng() % 1500) / STEP * STEP);
		int i = (int)(rng() % (unsigned)n), j = (int)(rng() % (unsigned)n);
		switch (rng() % 6) {
		case 0:
			if (s.nd[i].alive)
				node_kill(&s, i);
			else
				node_start(&s, i);
			break;
		case 1:
			if (s.nd[i].alive && !s.nd[i].paused) {
				s.nd[i].paused = 1;
				resume[i] = s.now + 500 + (int64_t)(rng() % 12000);
			}
			break;
		case 2:
			if (i != j)
				s.cut[i][j] = s.cut[j][i] = !s.cut[i][j];
			break;
		default: break;
		}
		for (int k = 0; k < n; k++)
			if (s.nd[k].paused && s.now >= resume[k])
				s.nd[k].paused = 0;
	}
	for (int k = 0; k < n; k++) {
		s.nd[k].paused = 0;
		for (int l = 0; l < n; l++)
			s.cut[k][l] = 0;
		if (!s.nd[k].alive)
			node_start(&s, k);
	}
	s.p_drop = 0;
	s.lie_max = 0;
	int64_t t = until_serving(&s, all_mask(n), 0, 12000);
	int ok = t >= 0 && s.lie_max < 2000 && !s.epoch_back;
	if (!ok || verbose)
		fprintf(stderr,
			"  seed %u: %d nodes, %s after healing (%lld ms), lie %lld ms, %d older "
			"plans\n",
			seed, n, t >= 0 ? "serving" : "NOT serving", (long long)t,
			(long long)s.lie_max, s.epoch_back);
	sim_free(&s);
	return ok;
}

TEST(random_schedules)
{
	const char *one = getenv("SHOAL_CORE_SEED");
	if (one) {
		log_threshold = LOG_INFO;
		verbose = 1;
		CHECK(random_schedule((uint32_t)strtoul(one, NULL, 10), 1));
		return;
	}
	int bad = 0;
	const char *many = getenv("SHOAL_CORE_SEEDS"); /* a longer soak: SHOAL_CORE_SEEDS=5000 */
	uint32_t nseeds = many ? (uint32_t)strtoul(many, NULL, 10) : 250;
	for (uint32_t seed = 1; seed <= nseeds; seed++)
		bad += !random_schedule(seed, 0);
	CHECK(bad == 0);
}

/* Epochs only grow (discovery/election.c): a leader that hears of a larger epoch announces again
 * above it; a node does not follow an announcement older than the largest epoch it has seen; a
 * restarted node starts from its durable term. */
TEST(epochs_only_grow)
{
	disc_id_t a = {{1}}, b = {{2}};
	elec_config_t ec = {.settle_ms = 100, .grace_ms = 0};
	elec_t *l = elec_new(&a, &ec, 0), *f = elec_new(&b, &ec, 0);
	elec_member_up(l, &b, 0);
	elec_member_up(f, &a, 0);
	elec_tick(l, 200);
	CHECK(elec_state(l) == ELEC_LEADER && elec_epoch(l) == 1);
	/* f saw epoch 7 meanwhile (it followed someone else while l was paused) */
	elec_on_heartbeat(f, &b, 7, &b, 0, 200);
	elec_on_leader(f, &a, 1, NULL, 0, 210);
	CHECK(elec_state(f) != ELEC_FOLLOWER); /* a stale announcement */
	elec_msg_t m;
	while (elec_next_msg(l, &m))
		;
	elec_on_heartbeat(l, &b, 7, &b, 0, 220); /* f's heartbeat carries its largest epoch */
	elec_tick(l, 230);
	CHECK(elec_state(l) == ELEC_LEADER && elec_epoch(l) == 8);
	CHECK(elec_next_msg(l, &m) && m.type == DISC_MSG_LEADER && m.epoch == 8);
	elec_on_leader(f, &a, 8, NULL, 0, 240);
	CHECK(elec_state(f) == ELEC_FOLLOWER && elec_epoch(f) == 8);
	elec_free(l);
	elec_free(f);
	ec.min_epoch = 8; /* STATE_DIR/term after a restart */
	l = elec_new(&a, &ec, 0);
	elec_tick(l, 500);
	CHECK(elec_state(l) == ELEC_LEADER && elec_epoch(l) == 9);
	elec_free(l);
}

/* Formation: a complete view (every sighted node is a member) settles after quick_ms, not the
 * whole settle time; an incomplete one waits settle_ms. */
TEST(quick_settle)
{
	disc_id_t a = {{1}}, b = {{2}};
	elec_config_t ec = {.settle_ms = 1000, .grace_ms = 1000, .quick_ms = 250};
	for (int complete = 0; complete < 2; complete++) {
		elec_t *e = elec_new(&a, &ec, 0);
		elec_member_up(e, &b, 100);
		elec_set_complete(e, complete);
		elec_tick(e, 360);
		CHECK((elec_state(e) == ELEC_LEADER) == complete);
		elec_tick(e, 1100);
		CHECK(elec_state(e) == ELEC_LEADER);
		elec_free(e);
	}
}

/* docs/agent.md shows the diagram generated from the transition table: the block between
 * "```dot" and "```" must be core_table_dot's output (SHOAL_CORE_DOT=1 prints it). */
TEST(table_dot)
{
	char *buf = NULL, *doc = NULL, err[256];
	size_t len = 0, dlen = 0;
	FILE *f = open_memstream(&buf, &len);
	core_table_dot(f);
	fclose(f);
	CHECK(buf && strstr(buf, "digraph agent") && strstr(buf, "loading -> serving"));
	if (getenv("SHOAL_CORE_DOT"))
		printf("%s", buf);
	if (read_file_all("docs/agent.md", &doc, &dlen, err, sizeof err) == 0) {
		char *a = strstr(doc, "```dot\n"), *b = a ? strstr(a + 7, "```") : NULL;
		int same = a && b && (size_t)(b - (a + 7)) == len && !memcmp(a + 7, buf, len);
		CHECK(same);
		if (!same)
			fprintf(stderr,
				"  docs/agent.md's state diagram is stale: paste the output of "
				"SHOAL_CORE_DOT=1 build/tests/test_core\n");
	}
	free(doc);
	free(buf);
}

int main(void)
{
	log_threshold = -1; /* the simulated nodes' logs: SHOAL_CORE_SEED=N shows one run's */
	RUN(forms_and_agrees);
	RUN(remeasured_replans);
	RUN(links_measured_before_the_first_plan);
	RUN(join_and_leave);
	RUN(leader_death);
	RUN(paused_leader_comes_back);
	RUN(paused_follower_comes_back);
	RUN(stalled_rank);
	RUN(another_model_smallest_id);
	RUN(duplicate_id_ignored);
	RUN(flapping_link);
	RUN(random_schedules);
	RUN(epochs_only_grow);
	RUN(quick_settle);
	RUN(table_dot);
	return harness_done();
}
