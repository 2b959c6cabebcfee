/*
 * agent.c: the agent's loop, and the executor of what the cluster core decides.
 *
 * One thread (agent_run) owns everything here. It polls the members' descriptors (members.h:
 * the control port, handshake results, mDNS, every member's channel), the status socket, the
 * model transfer port and a 100 ms tick, and wires the objects together: members (who is in
 * the cluster), the model store (which model this node holds), the plan store (plans.h), the
 * session of the plan in force (session/session.h) with --exec beside it (session/exec.h), and
 * the publisher (what /health, /v1/cluster and `shoal status` say: publish.h). None of these
 * calls another or back into this file: what happens to them comes back here (hooks, polled
 * phases, tick results) and goes to the core as events.
 *
 * The executor: every event is queued, and the queue is drained in one place, never re-entered:
 * an event is stepped through the core, then each of the actions that step queued is carried
 * out; what an action produces (a plan made, a session that could not start) is queued as an
 * event and stepped after the rest of the actions, in order (as canonical/raft's). A full queue
 * is an error that stops the loop, never a silent drop. After each drain the plan store keeps
 * exactly the plans the core refers to.
 *
 * Invariant: the core hears of every member exactly between its MEMBER_UP and MEMBER_DOWN,
 * and of the election's leader and epoch whenever they move.
 */
#include "agent/agent.h"
#include "agent/core.h"
#include "agent/links.h"
#include "agent/members.h"
#include "agent/modelstore/modelstore.h"
#include "agent/node.h"
#include "agent/planio.h"
#include "agent/plans.h"
#include "agent/publish.h"
#include "agent/session/exec.h"
#include "agent/session/session.h"
#include "common/common.h"
#include "infer/infer.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EVENTS_MAX 64 /* events waiting for the core: an action queues at most one */

/* An event with copies of what its pointers point to (core_event_t's are borrowed). */
typedef struct queued {
	core_event_t ev;
	core_plan_t plan;
	char hash[CORE_HASH_MAX], model[CORE_MODEL_MAX], text[512];
	disc_id_t ids[CORE_MAX_MEMBERS];
} queued_t;

struct agent {
	agent_config_t cfg;
	tp_keys_t keys;
	disc_id_t self;
	char self_hex[DISC_ID_HEX];
	disc_host_facts_t facts;
	uint64_t mem_avail; /* memory this node gives the model (--memory-limit) */
	core_t *core;
	members_t *members;
	links_t *links;                     /* this node's measured links (links.h) */
	node_compute_t compute;             /* this node's measured compute (node.h) */
	char compute_model[CORE_MODEL_MAX]; /* the model hash it was measured for */
	int links_wait;                     /* ms until the running probe wants the loop again */
	plan_meas_t pub_links[AGENT_MAX_LINKS]; /* what src_of hands the publisher */
	modelstore_t *model;
	plans_t *plans;
	pub_t *pub;
	session_t *sess;   /* the running session, or NULL */
	int sess_ready;    /* its READY went to the core */
	int64_t steps_due; /* a worker rank's next STEPS to the planner */
	uint64_t steps_sent;
	uint32_t in_force; /* the plan in force here (PLAN_IN_FORCE to PLAN_GONE), 0 = none */
	exec_t *exec;      /* --exec: the command's process group, or NULL */
	int status_fd, stop_pipe[2];
	char status_path[SH_SUBPATH_MAX];
	/* what the core was last told */
	disc_id_t fed_leader;
	uint64_t fed_epoch, fed_max_epoch;
	char fed_model[CORE_MODEL_MAX];
	/* the executor */
	queued_t q[EVENTS_MAX];
	int qhead, qlen, draining;
	int fatal; /* the loop cannot go on: its code */
	/* what was published last */
	int64_t pub_ms;
	int pub_state;
	char pub_reason[200];
};

/* The cluster core's log lines (core_config_t.log). */
static void core_log_line(void *ud, int level, const char *line)
{
	(void)ud;
	LOG(level, "%s", line);
}

/* ---- the executor --------------------------------------------------------------------------- */

static void act(agent_t *a, const core_action_t *x);

/* Steps the queued events through the core and carries out their actions, until none is left. */
static void drain(agent_t *a)
{
	a->draining = 1;
	while (a->qlen && !a->fatal) {
		queued_t e = a->q[a->qhead];
		a->qhead = (a->qhead + 1) % EVENTS_MAX;
		a->qlen--;
		e.ev.plan = e.ev.plan ? &e.plan : NULL; /* the copy's own fields */
		e.ev.hash = e.ev.hash ? e.hash : NULL;
		e.ev.model = e.ev.model ? e.model : NULL;
		e.ev.text = e.ev.text ? e.text : NULL;
		e.ev.ids = e.ev.ids ? e.ids : NULL;
		if (core_step(a->core, now_ms(), &e.ev)) {
			a->fatal = SH_EBUSY; /* logged by the core */
			break;
		}
		core_action_t x;
		while (core_next_action(a->core, &x))
			act(a, &x);
	}
	a->draining = 0;
	uint32_t keep[3];
	plans_keep(a->plans, keep, core_handles(a->core, keep));
}

/* Queues an event (its pointers are copied) and drains, unless a drain runs already. */
static void feed(agent_t *a, const core_event_t *ev)
{
	if (a->qlen == EVENTS_MAX) {
		LOG(LOG_ERROR, "agent: %d events wait for the core: stopping", EVENTS_MAX);
		a->fatal = SH_EBUSY;
		return;
	}
	queued_t *e = &a->q[(a->qhead + a->qlen++) % EVENTS_MAX];
	e->ev = *ev;
	if (ev->plan)
		e->plan = *ev->plan;
	snprintf(e->hash, sizeof e->hash, "%s", ev->hash ? ev->hash : "");
	snprintf(e->model, sizeof e->model, "%s", ev->model ? ev->model : "");
	snprintf(e->text, sizeof e->text, "%s", ev->text ? ev->text : "");
	e->ev.n = ev->ids ? MAX(0, MIN(ev->n, CORE_MAX_MEMBERS)) : 0;
	if (e->ev.n)
		memcpy(e->ids, ev->ids, (size_t)e->ev.n * sizeof *e->ids);
	if (!a->draining)
		drain(a);
}

/* Node who publishes measured links l[0..n): the core waits for a view's links before its
 * first plan (core_config_t.links_wait_ms). */
static void feed_links(agent_t *a, const disc_id_t *who, const plan_meas_t *l, int n)
{
	disc_id_t ids[CORE_MAX_MEMBERS];
	int k = 0;
	for (int i = 0; i < n && k < CORE_MAX_MEMBERS; i++)
		k += !disc_id_parse(l[i].node_id, &ids[k]);
	core_event_t ev = {.type = CORE_EV_LINKS, .id = *who, .ids = ids, .n = k};
	feed(a, &ev);
}

/* The election's leader and epoch, when they moved (after every election input). */
static void feed_leader(agent_t *a)
{
	const elec_t *e = members_election(a->members);
	disc_id_t l;
	if (!elec_leader(e, &l))
		memset(&l, 0, sizeof l);
	uint64_t ep = elec_epoch(e), mx = elec_max_epoch(e);
	if (!disc_id_cmp(&l, &a->fed_leader) && ep == a->fed_epoch && mx == a->fed_max_epoch)
		return;
	if (disc_id_cmp(&l, &a->fed_leader)) { /* the dashboard's event log */
		char was[DISC_ID_HEX] = "none", now[DISC_ID_HEX] = "none";
		if (!disc_id_is_zero(&a->fed_leader))
			disc_id_hex(&a->fed_leader, was);
		if (!disc_id_is_zero(&l))
			disc_id_hex(&l, now);
		web_event(pub_web(a->pub), strcmp(was, "none") ? "failover" : "leader",
			  "leader %.8s -> %.8s (epoch %llu)", was, now, (unsigned long long)ep);
	}
	a->fed_leader = l;
	a->fed_epoch = ep;
	a->fed_max_epoch = mx;
	core_event_t ev = {.type = CORE_EV_LEADER, .id = l, .epoch = ep, .max_epoch = mx};
	feed(a, &ev);
}

/* ---- the actions ---------------------------------------------------------------------------- */

/* This node's measurements into its description d. */
static void self_measured(agent_t *a, node_desc_t *d)
{
	d->compute = a->compute;
	d->nlinks = links_published(a->links, d->links, AGENT_MAX_LINKS);
}

static void send_node(agent_t *a, member_t *m)
{
	node_desc_t d = {.have = 1,
			 .http_port =
			     pub_web(a->pub) ? web_port(pub_web(a->pub)) : a->cfg.http_port,
			 .sync_port = modelstore_sync_port(a->model),
			 .model_size = modelstore_size(a->model),
			 .mem_avail = a->mem_avail};
	snprintf(d.model_hash, sizeof d.model_hash, "%s", modelstore_hash(a->model));
	node_self_addrs(&d);
	self_measured(a, &d);
	char *s = node_desc_json(&d);
	if (s)
		members_send(a->members, m, AGENT_MSG_NODE, s, strlen(s));
	free(s);
}

static void send_text(agent_t *a, const disc_id_t *to, uint16_t type, const char *text)
{
	member_t *m = members_find(a->members, to);
	if (m && text)
		members_send(a->members, m, type, text, strlen(text));
}

/* The planner: plans the nodes the core names (x->ids, with epoch x->epoch). */
static void make_plan(agent_t *a, const core_action_t *x)
{
	char err[1024] = "out of memory";
	core_plan_t cp;
	core_event_t ev = {.type = CORE_EV_PLAN_FAILED, .text = err};
	plan_view_t *v = calloc(1, sizeof *v);
	int rc = v && (v->nodes = calloc(PLAN_MAX_NODES, sizeof *v->nodes)) ? 0 : SH_ENOMEM;
	if (!rc)
		v->epoch = x->epoch; /* the group's tag: grows with the election's term */
	for (int i = 0; !rc && i < x->n && v->n_nodes < PLAN_MAX_NODES; i++) {
		char h[DISC_ID_HEX];
		disc_id_hex(&x->ids[i], h);
		if (!disc_id_cmp(&x->ids[i], &a->self)) {
			static node_desc_t me; /* the loop's thread only (it is large) */
			memset(&me, 0, sizeof me);
			node_self_addrs(&me);
			self_measured(a, &me);
			rc = node_to_plan(&v->nodes[v->n_nodes++], h, a->facts.hostname,
					  members_port(a->members), a->facts.mem_bytes,
					  a->mem_avail, a->facts.cores, a->facts.rdma, &me);
			continue;
		}
		const member_t *m = members_find(a->members, &x->ids[i]);
		if (m && m->desc.have)
			rc = node_to_plan(&v->nodes[v->n_nodes++], h, m->info.host, m->info.port,
					  m->info.mem_bytes, m->desc.mem_avail, m->info.cores,
					  m->info.rdma, &m->desc);
	}
	if (!rc) {
		plan_opts_t o;
		plan_opts_default(&o);
		o.ctx = a->cfg.ctx;
		o.strategy = (plan_strategy_t)a->cfg.strategy; /* --strategy: the planner's holds */
		o.parallel = a->cfg.parallel ? a->cfg.parallel : ENG_DEFAULT_PARALLEL;
		o.engine_hybrid = 1;   /* infer/tp.c runs stages of tensor groups */
		o.engine_inflight = 1; /* ... with several sequences' micro-batches in flight */
		o.keep_first =
		    1; /* this node (the smallest id of x->ids) serves the API as rank 0 */
		/* bytes per block of the KV type (checked when the flag was parsed): q8_0's 34 per
		 * 32 elements exactly */
		o.kv_bytes = eng_kv_block_bytes(a->cfg.kv_type, &o.kv_block);
		/* slots asked for are kept whole by the engine; its default it lowers to fit */
		o.slots = a->cfg.parallel;
		int p = members_port(a->members) + 1;
		o.base_port = p > 65535 - PLAN_MAX_NODES ? 0 : p;
		rc = plans_make(a->plans, v, modelstore_path(a->model), &o, &cp, err, sizeof err);
	}
	plan_view_free(v);
	if (rc)
		LOG(LOG_ERROR, "plan: %s", err);
	else
		ev = (core_event_t){.type = CORE_EV_PLAN_MADE, .plan = &cp};
	feed(a, &ev);
}

/* The member to fetch model bytes from: the planner when it holds the whole file, else the
 * member with the smallest ID that does. Returns 0 when none does. */
static int model_holder(agent_t *a, modelstore_holder_t *h)
{
	disc_id_t l;
	const member_t *c = NULL;
	if (!core_planner(a->core, &l)) /* the majority model's smallest holder (core.c) */
		return 0;
	/* the planner's model is the one served; a holder of it that is not a slice serves it */
	const char *want = modelstore_hash(a->model);
	int planner_serves = 0;
	if (disc_id_cmp(&l, &a->self)) {
		const member_t *lc = members_find(a->members, &l);
		if (!lc || !lc->desc.have || !lc->desc.model_hash[0])
			return 0;
		if ((planner_serves = lc->desc.sync_port != 0))
			c = lc;
		want = lc->desc.model_hash;
	}
	for (int i = 0; !planner_serves && i < members_count(a->members); i++) {
		const member_t *x = members_at(a->members, i);
		if (x->desc.have && x->desc.model_hash[0] && x->desc.sync_port &&
		    (!want[0] || !strcmp(x->desc.model_hash, want)) &&
		    (!c || disc_id_cmp(&x->id, &c->id) < 0))
			c = x;
	}
	if (!c)
		return 0;
	snprintf(h->host, sizeof h->host, "%s", c->addr);
	h->port = c->desc.sync_port;
	snprintf(h->hash, sizeof h->hash, "%s", c->desc.model_hash);
	h->size = c->desc.model_size;
	return 1;
}

static void start_session(agent_t *a, const core_action_t *x)
{
	char err[512] = "";
	const plan_t *p = plans_get(a->plans, x->handle);
	if (!p) {
		snprintf(err, sizeof err, "plan %s is not at hand", x->hash);
	} else {
		LOG(LOG_INFO,
		    "plan %s: epoch %llu, %d ranks, %s, this node is rank %d; files in %s",
		    plan_hash(p), (unsigned long long)plan_epoch(p), plan_n_ranks(p),
		    plan_strategy_name(plan_strategy(p)), x->rank, a->cfg.state_dir);
		web_event(pub_web(a->pub), "replan", "plan %s: %d ranks, %s; this node is rank %d",
			  plan_hash(p), plan_n_ranks(p), plan_strategy_name(plan_strategy(p)),
			  x->rank);
		session_cfg_t sc = {.model_path = modelstore_path(a->model),
				    .threads = a->cfg.threads,
				    .parallel = a->cfg.parallel,
				    .step_timeout_ms = a->cfg.step_timeout_ms,
				    .kv_type = a->cfg.kv_type,
				    .spec = a->cfg.spec,
				    .draft_model = a->cfg.draft_model,
				    .draft_max = a->cfg.draft_max,
				    .keys = &a->keys,
				    .node_id = a->self.b,
				    .state_dir = a->cfg.state_dir,
				    .exec = a->cfg.exec_cmd != NULL,
				    .web = pub_web(a->pub),
				    .group_broken = pub_group_broken(a->pub),
				    .slice = modelstore_slice(a->model)};
		modelstore_holder_t h;
		if (sc.slice)
			modelstore_share_of(a->model, model_holder(a, &h) ? &h : NULL, &sc.share);
		a->sess_ready = 0;
		if (agent_plan_write_files(p, a->cfg.state_dir, 0, err, sizeof err) == 0)
			a->sess = session_start(&sc, p, x->rank, err, sizeof err);
	}
	if (!a->sess) {
		LOG(LOG_ERROR, "plan %s: %s", x->hash, err);
		core_event_t ev = {.type = CORE_EV_SESSION_DONE, .text = err};
		feed(a, &ev);
	}
}

static void act(agent_t *a, const core_action_t *x)
{
	switch (x->type) {
	case CORE_ACT_MAKE_PLAN: make_plan(a, x); break;
	case CORE_ACT_SEND_PLAN:
		send_text(a, &x->to, AGENT_MSG_PLAN, plans_text(a->plans, x->handle));
		break;
	case CORE_ACT_EXCLUDE: send_text(a, &x->to, AGENT_MSG_EXCLUDED, x->text); break;
	case CORE_ACT_ACK: {
		char *s = node_ack_json(x->hash, x->ack, x->text, x->epoch);
		send_text(a, &x->to, AGENT_MSG_ACK, s);
		free(s);
		break;
	}
	case CORE_ACT_START_SESSION: start_session(a, x); break;
	case CORE_ACT_STOP_SESSION: session_stop(a->sess); break;
	case CORE_ACT_PLAN_IN_FORCE: /* --exec follows it (tick) */
		LOG(LOG_INFO, "plan %s: in force", x->hash);
		a->in_force = x->handle;
		break;
	case CORE_ACT_PLAN_GONE:
		LOG(LOG_INFO, "plan %s: no longer in force", x->hash);
		a->in_force = 0;
		break;
	}
}

/* ---- what the members say (members.h hooks) ------------------------------------------------- */

static void on_joined(void *ud, member_t *m)
{
	agent_t *a = ud;
	char h[DISC_ID_HEX];
	disc_id_hex(&m->id, h);
	web_event(pub_web(a->pub), "join", "%.8s joined from %s", h, m->addr);
	send_node(a, m);
	links_member_up(a->links, m, now_ms());
	core_event_t ev = {.type = CORE_EV_MEMBER_UP, .id = m->id};
	feed(a, &ev);
}

static void on_reconnected(void *ud, member_t *m)
{
	agent_t *a = ud;
	send_node(a, m);
	links_member_up(a->links, m, now_ms());
}

static int on_probe(void *ud, member_t *m, uint16_t type, const uint8_t *p, size_t len)
{
	agent_t *a = ud;
	return links_take(a->links, m, type, p, len);
}

/* Does the planner plan from measurements (some node says its compute)? Without, it goes by
 * the links' kinds (docs/view.md section 4) and new link figures change nothing. */
static int cost_model_plans(agent_t *a)
{
	if (a->compute.bw_mbs)
		return 1;
	for (int i = 0; i < members_count(a->members); i++)
		if (members_at(a->members, i)->desc.compute.bw_mbs)
			return 1;
	return 0;
}

/* Did a description's measurements change (what the planner reads of them)? */
static int meas_differ(const node_desc_t *x, const node_desc_t *y)
{
	return x->compute.bw_mbs != y->compute.bw_mbs ||
	       x->compute.prefill_mbs != y->compute.prefill_mbs ||
	       x->compute.threads != y->compute.threads ||
	       strcmp(x->compute.machine, y->compute.machine) || x->nlinks != y->nlinks ||
	       memcmp(x->links, y->links, (size_t)x->nlinks * sizeof x->links[0]);
}

static void on_left(void *ud, const disc_id_t *id, const char *addr, const char *why)
{
	agent_t *a = ud;
	char h[DISC_ID_HEX];
	disc_id_hex(id, h);
	web_event(pub_web(a->pub), "leave", "%.8s (%s) left: %s", h, addr, why);
	links_member_down(a->links, id);
	core_event_t ev = {.type = CORE_EV_MEMBER_DOWN, .id = *id};
	feed(ud, &ev);
}

static void on_election(void *ud)
{
	feed_leader(ud);
}

static int on_message(void *ud, member_t *m, uint16_t type, const uint8_t *p, size_t len)
{
	agent_t *a = ud;
	char h[DISC_ID_HEX], why[CORE_WHY_MAX];
	core_event_t ev = {.id = m->id};
	core_plan_t cp;
	node_ack_t ack;
	disc_id_hex(&m->id, h);
	switch (type) {
	case AGENT_MSG_NODE: {
		static node_desc_t was; /* the loop's thread only (it is large) */
		was = m->desc;
		if (node_desc_parse(&m->desc, p, len)) {
			LOG(LOG_WARN, "agent: node %.8s sent a malformed description", h);
			return SH_EFORMAT;
		}
		/* links.h: published on a change. Told first: the description and its links may
		 * complete the view the first plan waits for, and that plan reads them already */
		if (was.have && meas_differ(&was, &m->desc) && cost_model_plans(a)) {
			core_event_t rm = {.type = CORE_EV_REMEASURED, .id = m->id};
			feed(a, &rm);
		}
		ev.type = CORE_EV_MEMBER_DESC;
		ev.model = m->desc.model_hash;
		ev.model_size = m->desc.model_size;
		feed(a, &ev);
		feed_links(a, &m->id, m->desc.links, m->desc.nlinks);
		return 0;
	}
	case AGENT_MSG_PLAN:
		if (plans_receive(a->plans, p, len, &cp, why, sizeof why)) {
			ev.type = CORE_EV_PLAN_BAD;
			ev.text = why;
		} else {
			ev.type = CORE_EV_PLAN;
			ev.plan = &cp;
		}
		break;
	case AGENT_MSG_ACK:
		if (node_ack_parse(&ack, p, len))
			return SH_EFORMAT;
		LOG(LOG_DEBUG, "plan %s: node %.8s %s", ack.hash, h, core_ack_name(ack.ack));
		ev.type = CORE_EV_ACK;
		ev.hash = ack.hash;
		ev.ack = ack.ack;
		ev.text = ack.error;
		ev.epoch = ack.epoch;
		break;
	case AGENT_MSG_STEPS: { /* the dashboard's series of this rank: the mean since the last */
		node_steps_t s, *was = &m->steps;
		if (node_steps_parse(&s, p, len)) {
			/* figures for the dashboard only: refused, but no reason to drop a rank
			 * of the plan (that re-planned a forming cluster) */
			LOG(LOG_DEBUG, "agent: node %.8s sent step figures that do not add up", h);
			return 0;
		}
		if (s.steps > was->steps && s.step_ms >= was->step_ms &&
		    s.comm_ms >= was->comm_ms) {
			double n = (double)(s.steps - was->steps);
			web_node_step(pub_web(a->pub), h, (s.step_ms - was->step_ms) / n,
				      (s.comm_ms - was->comm_ms) / n);
		}
		*was = s; /* a new session counts from 0 again */
		return 0;
	}
	case AGENT_MSG_EXCLUDED:
		node_excluded_text(why, sizeof why, p, len);
		ev.type = CORE_EV_EXCLUDED;
		ev.text = why;
		break;
	default: return 0; /* another version's message: not ours to judge */
	}
	feed(a, &ev);
	return 0;
}

/* ---- the tick ------------------------------------------------------------------------------- */

static void src_of(agent_t *a, pub_src_t *s)
{
	const core_plan_t *cp = core_plan(a->core);
	*s =
	    (pub_src_t){.cfg = &a->cfg,
			.core = a->core,
			.members = a->members,
			.plan = cp ? plans_get(a->plans, cp->handle) : NULL,
			.pmodel = plans_model(a->plans),
			.facts = &a->facts,
			.self_hex = a->self_hex,
			.cid_hex = a->keys.cid_hex,
			.model_path = modelstore_path(a->model),
			.port = members_port(a->members),
			.http_port = pub_web(a->pub) ? web_port(pub_web(a->pub)) : a->cfg.http_port,
			.links = a->pub_links,
			.nlinks = links_published(a->links, a->pub_links, AGENT_MAX_LINKS),
			.measured_tok_s = web_last_decode_tok_s(pub_web(a->pub))};
}

/* The session's phase, as events for the core. */
static void session_poll(agent_t *a)
{
	if (!a->sess)
		return;
	int ph = session_phase(a->sess);
	if (ph == SESSION_READY && !a->sess_ready) {
		a->sess_ready = 1;
		core_event_t ev = {.type = CORE_EV_SESSION_READY};
		feed(a, &ev);
	} else if (ph == SESSION_DONE) {
		char e[256];
		snprintf(e, sizeof e, "%s", session_error(a->sess));
		int r = session_stalled_rank(a->sess);
		session_free(a->sess);
		a->sess = NULL;
		if (e[0])
			web_event(pub_web(a->pub), "error", "session ended: %s", e);
		/* a rank that stalled while its channel stayed up: the core leaves it out a while
		 */
		const core_plan_t *cp = core_plan(a->core);
		if (r > 0 && cp && r < cp->n) {
			core_event_t st = {.type = CORE_EV_RANK_STALLED, .id = cp->ranks[r]};
			feed(a, &st);
		}
		core_event_t ev = {.type = CORE_EV_SESSION_DONE, .text = e};
		feed(a, &ev);
	}
}

/* A worker rank tells the planner its step figures about once a second while they move: the
 * leader's dashboard draws a step and communication series per node. */
static void steps_report(agent_t *a, int64_t now)
{
	const core_plan_t *cp = core_plan(a->core);
	eng_comm_t c;
	if (!a->sess || !a->sess_ready || !cp || now < a->steps_due ||
	    session_worker_stats(a->sess, &c) || c.steps == a->steps_sent)
		return;
	a->steps_due = now + 1000;
	a->steps_sent = c.steps;
	node_steps_t s = {c.steps, c.step_ms, c.comm_ms};
	char *t = node_steps_json(&s);
	send_text(a, &cp->ranks[0], AGENT_MSG_STEPS, t);
	free(t);
}

/* Followers (and the excluded) send API clients to the planner, which serves as rank 0. */
static void follow_planner(agent_t *a)
{
	char url[128] = "";
	disc_id_t l;
	if (core_planner(a->core, &l) && disc_id_cmp(&l, &a->self)) {
		const member_t *c = members_find(a->members, &l);
		if (c && c->desc.have)
			snprintf(url, sizeof url,
				 strchr(c->addr, ':') ? "http://[%s]:%d" : "http://%s:%d", c->addr,
				 c->desc.http_port);
	}
	pub_follow(a->pub, url);
}

/* Health and the cluster document (at most every 250 ms unless the state moved). */
static void publish(agent_t *a, int64_t now)
{
	char reason[200];
	int ws = (int)core_health(a->core, reason, sizeof reason);
	const char *news = modelstore_news(a->model);
	if (ws != WEB_SERVING && core_state(a->core) == AGENT_SETTLED && news[0])
		snprintf(reason, sizeof reason, "%s", news); /* the model transfer's news */
	pub_src_t s;
	src_of(a, &s);
	web_t *w = pub_web(a->pub);
	if (w && s.plan && core_is_planner(a->core)) {
		web_set_rank_count(w, plan_n_ranks(s.plan));
		for (int r = 0; r < plan_n_ranks(s.plan); r++)
			web_set_rank_health(w, r, core_rank_up(a->core, r));
	}
	if (ws == a->pub_state && now - a->pub_ms < 250 && !strcmp(reason, a->pub_reason))
		return;
	a->pub_ms = now;
	a->pub_state = ws;
	snprintf(a->pub_reason, sizeof a->pub_reason, "%s", reason);
	pub_set(a->pub, ws, reason, pub_agent_cluster(&s));
}

/* SHOAL_COMPUTE=off: this node says nothing of its compute, so the planner chooses by the
 * links' kinds (docs/view.md section 4) while the links are still measured and shown: for tests
 * of everything but the cost model's choice (t_dashboard_netns wants all 3 nodes as ranks). */
static int no_compute(void)
{
	const char *e = getenv("SHOAL_COMPUTE");
	return e && !strcmp(e, "off");
}

/* Measures this node's compute for its model (node.h), once per model: at start when --model
 * gives one (before the network starts), else when the model arrives. */
static int measure_compute(agent_t *a)
{
	const char *path = modelstore_path(a->model), *hash = modelstore_hash(a->model);
	if (!path || !hash[0] || !strcmp(hash, a->compute_model) || no_compute())
		return 0;
	snprintf(a->compute_model, sizeof a->compute_model, "%s", hash);
	node_compute_t c;
	char err[256];
	if (node_compute_get(&c, a->cfg.state_dir, path, a->cfg.threads, err, sizeof err))
		LOG(LOG_WARN, "compute: not measured: %s", err); /* the planner goes by kind */
	if (!memcmp(&c, &a->compute, sizeof c))
		return 0;
	a->compute = c;
	return 1;
}

/* This node's measurements changed: every member hears, the planner plans again. */
static void remeasured(agent_t *a)
{
	for (int i = 0; i < members_count(a->members); i++)
		send_node(a, members_at(a->members, i));
	core_event_t ev = {.type = CORE_EV_REMEASURED};
	if (cost_model_plans(a))
		feed(a, &ev);
	plan_meas_t mine[AGENT_MAX_LINKS]; /* after: a first plan they complete reads them */
	feed_links(a, &a->self, mine, links_published(a->links, mine, AGENT_MAX_LINKS));
}

static void tick(agent_t *a, int64_t now)
{
	modelstore_holder_t h;
	int news = modelstore_tick(a->model, model_holder(a, &h) ? &h : NULL, now);
	if (modelstore_event(a->model)[0])
		web_event(pub_web(a->pub), "model", "%s", modelstore_event(a->model));
	if (news & MODELSTORE_ANNOUNCE)
		for (int i = 0; i < members_count(a->members); i++)
			send_node(a, members_at(a->members, i));
	if (news & MODELSTORE_ROTTED)
		session_fail(a->sess, "the model's slice changed on disk");
	if (strcmp(a->fed_model, modelstore_hash(a->model))) { /* a model arrived, or changed */
		snprintf(a->fed_model, sizeof a->fed_model, "%s", modelstore_hash(a->model));
		if (measure_compute(a))
			remeasured(a);
		core_event_t ev = {.type = CORE_EV_MODEL,
				   .model = a->fed_model,
				   .model_size = modelstore_size(a->model)};
		feed(a, &ev);
	}
	session_poll(a);
	steps_report(a, now);
	core_event_t ev = {.type = CORE_EV_TICK};
	feed(a, &ev);
	follow_planner(a);
	if (a->cfg.exec_cmd) { /* --exec (session/exec.h): CMD runs while the plan is in force */
		exec_cfg_t ec = {a->cfg.exec_cmd, a->cfg.exec_port, a->cfg.state_dir};
		const plan_t *p = plans_get(a->plans, a->in_force);
		exec_sync(&a->exec, &ec, p, p ? plan_rank_of(p, a->self_hex) : -1, now);
	}
	publish(a, now);
}

/* ---- the loop ------------------------------------------------------------------------------- */

int agent_run(agent_t *a)
{
	struct pollfd pf[3 + 3 + MEMBERS_MAX];
	for (;;) {
		/* a session forming or loading is polled more often: its READY is the cluster's
		 * first 200 (formation time) */
		int timeout = a->sess && !a->sess_ready ? 20 : 100;
		timeout = MIN(timeout, a->links_wait);
		pf[0] = (struct pollfd){.fd = a->stop_pipe[0], .events = POLLIN};
		pf[1] = (struct pollfd){.fd = a->status_fd, .events = POLLIN};
		pf[2] = (struct pollfd){.fd = modelstore_fd(a->model), .events = POLLIN};
		int n = members_pollfds(a->members, pf + 3, (int)ARRAY_LEN(pf) - 3, &timeout);
		if (poll(pf, (nfds_t)(3 + n), timeout) < 0 && errno != EINTR)
			return SH_EIO;
		if (pf[0].revents)
			return 0;
		if (pf[1].revents & POLLIN) {
			pub_src_t s;
			src_of(a, &s);
			pub_status_serve(a->status_fd, &s);
		}
		if (pf[2].revents & POLLIN)
			modelstore_accept(a->model);
		members_handle(a->members, pf + 3, n);
		int64_t now = now_ms();
		members_tick(a->members, now);
		a->links_wait = 100;
		if (links_tick(a->links, a->members, now, &a->links_wait))
			remeasured(a);
		tick(a, now);
		if (a->fatal)
			return a->fatal;
	}
}

void agent_stop(agent_t *a)
{
	char b = 1;
	if (write(a->stop_pipe[1], &b, 1) != 1) {
		/* the pipe is full: a stop is already pending */
	}
}

/* ---- life ----------------------------------------------------------------------------------- */

/* The memory this node gives the model: what the system has now, capped by --memory-limit. */
static int memory_for_model(agent_t *a, char *err, size_t errlen)
{
	const agent_config_t *cfg = &a->cfg;
	a->mem_avail = node_mem_available();
	if (!a->mem_avail || a->mem_avail > a->facts.mem_bytes)
		a->mem_avail = a->facts.mem_bytes;
	if (cfg->memory_limit) {
		uint64_t cap;
		if (sh_size_parse(cfg->memory_limit, a->facts.mem_bytes, &cap))
			return sh_fail(
			    err, errlen, SH_EINVAL,
			    "bad --memory-limit '%s' (BYTES with K, M, G or T, or PCT%%)",
			    cfg->memory_limit);
		if (cap < a->mem_avail)
			a->mem_avail = cap;
	}
	LOG(LOG_INFO, "memory: %.1f GiB of %.1f GiB for the model%s",
	    (double)a->mem_avail / (1 << 30), (double)a->facts.mem_bytes / (1 << 30),
	    cfg->memory_limit ? " (--memory-limit)" : " (available now)");
	return 0;
}

agent_t *agent_new(const agent_config_t *cfg, const tp_keys_t *keys, char *errbuf, size_t errlen)
{
	agent_t *a = calloc(1, sizeof *a);
	if (!a) {
		sh_fail(errbuf, errlen, SH_ENOMEM, "out of memory");
		return NULL;
	}
	a->cfg = *cfg;
	a->keys = *keys;
	a->status_fd = a->stop_pipe[0] = a->stop_pipe[1] = -1;
	members_hooks_t hooks = {.joined = on_joined,
				 .reconnected = on_reconnected,
				 .left = on_left,
				 .election = on_election,
				 .message = on_message,
				 .probe = on_probe,
				 .ud = a};
	int created = 0;
	if (disc_identity_load(cfg->state_dir, &a->self, &created, errbuf, errlen))
		goto err;
	disc_id_hex(&a->self, a->self_hex);
	LOG(LOG_INFO, "node ID %s (%s %s/node_id)", a->self_hex, created ? "created" : "from",
	    cfg->state_dir);
	disc_host_facts_get(&a->facts);
	if (memory_for_model(a, errbuf, errlen))
		goto err;
	/* this node's compute (node.h): before the network starts, so that peers never wait on a
	 * node that measures (one node of a machine at a time, a few seconds the first time) */
	if (cfg->model && !no_compute() &&
	    node_compute_get(&a->compute, cfg->state_dir, cfg->model, cfg->threads, errbuf, errlen))
		LOG(LOG_WARN, "compute: not measured: %s", errbuf);
	if (pipe(a->stop_pipe) != 0) {
		sh_fail(errbuf, errlen, SH_EIO, "pipe: %s", strerror(errno));
		goto err;
	}
	for (int i = 0; i < 2; i++) {
		fcntl(a->stop_pipe[i], F_SETFL, fcntl(a->stop_pipe[i], F_GETFL) | O_NONBLOCK);
		fcntl(a->stop_pipe[i], F_SETFD, FD_CLOEXEC);
	}
	if (members_new(&a->members, &a->cfg, &a->keys, &a->self, &a->facts, &hooks, errbuf,
			errlen))
		goto err;
	a->cfg.port = members_port(a->members);
	if ((a->status_fd = pub_status_listen(cfg->state_dir, a->status_path, errbuf, errlen)) < 0)
		goto err;
	/* publish before hashing a small model: mDNS probing (~0.75 s) runs meanwhile (formation
	 * time). A large model's first hash takes long: peers would time out handshaking with a
	 * node that does not answer yet, so it publishes after. */
	struct stat st;
	int early = !cfg->model || (stat(cfg->model, &st) == 0 && st.st_size < (1LL << 30));
	if (early && members_publish(a->members, errbuf, errlen))
		goto err;
	if (!(a->model =
		  modelstore_new(cfg->model, cfg->state_dir, &a->keys, &a->self, errbuf, errlen)))
		goto err;
	if (cfg->model) /* measured before the network started: the model's hash names it */
		snprintf(a->compute_model, sizeof a->compute_model, "%s",
			 modelstore_hash(a->model));
	if (!early && members_publish(a->members, errbuf, errlen))
		goto err;
	core_config_t cc;
	core_config_default(&cc);
	cc.replan_delay_ms = cfg->replan_delay_ms;
	/* a view's links are measured within about a second per member (agent/links.h's stagger)
	 * of a join; without compute figures the planner goes by link kind and need not wait */
	cc.links_wait_ms = no_compute() ? 0 : CORE_LINKS_WAIT_MS;
	cc.log = core_log_line;
	cc.log_level = log_threshold;
	a->pub = pub_new(&a->cfg, a->self_hex);
	a->plans = plans_new();
	a->core = core_new(&a->self, &cc, now_ms());
	a->links = links_new(&a->self);
	a->links_wait = 100;
	if (!a->pub || !a->plans || !a->core || !a->links) {
		sh_fail(errbuf, errlen, SH_ENOMEM, "out of memory");
		goto err;
	}
	a->pub_state = WEB_FORMING;
	if (members_elect(a->members, errbuf, errlen))
		goto err;
	LOG(LOG_INFO,
	    "agent: control port %d, cluster %s, mDNS %s, %d static peers, settle %lld ms%s",
	    a->cfg.port, keys->cid_hex, members_mdns(a->members), cfg->npeers,
	    (long long)cfg->settle_ms, cfg->expect ? ", expecting members" : "");
	return a;
err:
	agent_free(a);
	return NULL;
}

void agent_free(agent_t *a)
{
	if (!a)
		return;
	exec_free(a->exec); /* --exec: the command's process group goes first */
	if (a->sess) {      /* the session reads the keys and the web server */
		session_stop(a->sess);
		session_free(a->sess);
	}
	pub_free(a->pub);
	modelstore_free(a->model);
	members_free(a->members);
	links_free(a->links);
	plans_free(a->plans);
	core_free(a->core);
	if (a->status_fd >= 0) {
		close(a->status_fd);
		unlink(a->status_path);
	}
	for (int i = 0; i < 2; i++)
		if (a->stop_pipe[i] >= 0)
			close(a->stop_pipe[i]);
	tp_keys_wipe(&a->keys);
	free(a);
}
