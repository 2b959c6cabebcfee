/*
 * core.h: the agent's cluster core, pure. It decides who plans, when a plan is made, which
 * members it holds and which are left out (and why), when this node's session starts and stops,
 * and what /health, `shoal status` and shoal_rank_up report. It does no I/O, reads no clock and
 * allocates nothing after core_new: events and the time come in through core_step, actions go
 * out through a queue the shell drains (core_next_action), in the shape of discovery/election.c.
 * The shell (agent.c and the objects it wires) owns sockets, plan_t objects, files and threads;
 * it feeds events and carries out the actions. tests/test_core.c steps a whole simulated cluster.
 *
 * Pure at link time: this file and core.c need only libc, common/ and the election's value types
 * (discovery.h's inline ID helpers); the build links tests/test_core with agent/core.o,
 * discovery/election.o and common/ alone, and tests/t_pure.sh reads their undefined symbols.
 * The core writes nothing: its log lines go to a callback (core_config_t.log).
 *
 * Threads: a core belongs to the thread that runs agent_run; nothing here is thread-safe.
 * Ownership: core_new returns a core the caller frees with core_free (NULL-safe). Pointers in an
 * event are borrowed for the call; actions are copied out.
 */
#ifndef SHOAL_AGENT_CORE_H
#define SHOAL_AGENT_CORE_H

#include "discovery/discovery.h"

#include <stdint.h>
#include <stdio.h>

#define CORE_MAX_MEMBERS   64 /* members of the view besides this node (= PLAN_MAX_NODES) */
#define CORE_MAX_RANKS     64
#define CORE_LINKS_WAIT_MS 5000 /* the agent's core_config_t.links_wait_ms */
#define CORE_HASH_MAX      20   /* plan hash: 16 hex characters + NUL (room to spare) */
#define CORE_MODEL_MAX     65   /* model content hash: 64 hex characters + NUL */
#define CORE_WHY_MAX       200

/* The node's own state (the agent's states: docs/agent.md's diagram is their table). */
typedef enum agent_state {
	AGENT_DISCOVERING, /* the view is not settled: no leader yet */
	AGENT_SETTLED,     /* a leader is known (this node or another); no plan runs here */
	AGENT_PLANNED,     /* a plan that includes this node arrived; its files are written */
	AGENT_LOADING,     /* forming the group and loading this node's share */
	AGENT_SERVING,     /* the leader serves the API; followers compute their share */
} agent_state_t;

const char *agent_state_name(agent_state_t s); /* "discovering", ...; "?" for no state */

/* What a rank last said about a plan (AGENT_MSG_ACK's "state"). */
typedef enum core_ack {
	CORE_ACK_NONE,    /* nothing yet */
	CORE_ACK_IDLE,    /* follows this leader, runs none of its plans */
	CORE_ACK_PLANNED, /* accepted; waiting for its previous session to end */
	CORE_ACK_LOADING, /* forming the group, loading its share */
	CORE_ACK_SERVING, /* computing its share */
	CORE_ACK_FAILED,  /* refused the plan or its session failed */
} core_ack_t;
const char *core_ack_name(core_ack_t a);
core_ack_t core_ack_parse(const char *s); /* unknown: CORE_ACK_NONE */

/* A plan as the core sees it: its hash, its epoch (the group's tag) and its ranks in order, and
 * the shell's handle of the plan itself (opaque here: the core hands it back in its actions and
 * core_handles, so the shell keeps exactly the plans the core refers to; agent/plans.h). */
typedef struct core_plan {
	char hash[CORE_HASH_MAX];
	uint64_t epoch;
	int n;
	disc_id_t ranks[CORE_MAX_RANKS];
	uint32_t handle;
} core_plan_t;

typedef enum core_ev_type {
	CORE_EV_TICK,          /* time passed */
	CORE_EV_LEADER,        /* the election's leader (zero id: none) and epoch changed */
	CORE_EV_MEMBER_UP,     /* id: a channel to it is up */
	CORE_EV_MEMBER_DOWN,   /* id: its channel is gone */
	CORE_EV_MEMBER_DESC,   /* id described itself: model, model_size */
	CORE_EV_MODEL,         /* this node's own model is known (model, size) */
	CORE_EV_PLAN,          /* id sent plan (parsed and verified by the shell) */
	CORE_EV_PLAN_BAD,      /* id sent a plan the shell could not use; text says why */
	CORE_EV_PLAN_MADE,     /* the planner made plan (after CORE_ACT_MAKE_PLAN) */
	CORE_EV_PLAN_FAILED,   /* the planner could not plan; text says why */
	CORE_EV_ACK,           /* id says ack about hash (text: its error, if any) */
	CORE_EV_EXCLUDED,      /* id (our leader) leaves us out; text says why */
	CORE_EV_SESSION_READY, /* the session reached its serving phase */
	CORE_EV_SESSION_DONE,  /* the session ended; text: its error ("" = asked to stop) */
	CORE_EV_RANK_STALLED,  /* id missed a step while its channel stayed up (rank 0 saw it) */
	CORE_EV_REMEASURED,    /* the measurements a plan reads (links, compute) changed enough
				  to plan again (the shell judges: agent/links.h) */
	CORE_EV_LINKS,         /* id (a member, or this node) publishes measured links towards
				  ids[0..n) (agent/links.h: the smaller ID of a pair measures) */
} core_ev_type_t;

typedef struct core_event {
	core_ev_type_t type;
	disc_id_t id;
	uint64_t epoch;          /* LEADER: its epoch; ACK: the largest plan epoch the sender ran */
	uint64_t max_epoch;      /* LEADER: the largest epoch the election has seen */
	const core_plan_t *plan; /* PLAN, PLAN_MADE */
	const char *hash;        /* ACK */
	core_ack_t ack;          /* ACK */
	const char *text;        /* PLAN_BAD, PLAN_FAILED, ACK, EXCLUDED, SESSION_DONE */
	const char *model;       /* MEMBER_DESC, MODEL: content hash ("" = none) */
	uint64_t model_size;     /* MEMBER_DESC, MODEL */
	const disc_id_t *ids;    /* LINKS: the peers measured (borrowed for the call) */
	int n;                   /* LINKS */
} core_event_t;

typedef enum core_act_type {
	CORE_ACT_MAKE_PLAN,     /* plan ids[0..n) (self first when in it) with epoch; answer
				   with CORE_EV_PLAN_MADE or CORE_EV_PLAN_FAILED */
	CORE_ACT_SEND_PLAN,     /* send the plan with hash to `to` */
	CORE_ACT_EXCLUDE,       /* tell `to` it is left out: text */
	CORE_ACT_ACK,           /* send `to` (the leader) ack about hash, text = error, epoch =
				   the largest plan epoch this node ran */
	CORE_ACT_START_SESSION, /* start the session of plan hash as rank `rank` */
	CORE_ACT_STOP_SESSION,  /* ask the running session to end (CORE_EV_SESSION_DONE follows) */
	CORE_ACT_PLAN_IN_FORCE, /* the plan hash serves now (hook: --exec and friends) */
	CORE_ACT_PLAN_GONE,     /* the plan hash no longer serves */
} core_act_type_t;

typedef struct core_action {
	core_act_type_t type;
	disc_id_t to;
	uint32_t
	    handle; /* SEND_PLAN, START_SESSION, PLAN_IN_FORCE, PLAN_GONE: core_plan_t.handle */
	char hash[CORE_HASH_MAX];
	int rank;
	core_ack_t ack;
	uint64_t epoch;
	char text[CORE_WHY_MAX];
	int n;
	disc_id_t ids[CORE_MAX_RANKS];
} core_action_t;

/* Where the core's log lines go: one line (no newline) at a common.h LOG_* level. Called from
 * core_step on its caller's thread; the line is borrowed for the call. */
typedef void (*core_log_fn)(void *ud, int level, const char *line);

typedef struct core_config {
	int64_t replan_delay_ms; /* a plan that still computes waits this long after a change */
	int64_t desc_wait_ms;    /* a new member's description is waited for this long */
	int64_t links_wait_ms;   /* a plan waits this long after a join for the links of the new
				  pairs (CORE_EV_LINKS), so that the first plan of a view reads
				  measured links, not one plan per link measured; 0: never waits */
	int64_t ack_wait_ms;     /* a rank that has not acknowledged a plan within this is down */
	int64_t retry_ms;        /* after a failed plan or session, plan again after this */
	int64_t stall_hold_ms;   /* a stalled rank stays out of plans this long */
	core_log_fn log;         /* NULL: the core says nothing */
	void *log_ud;
	int log_level; /* lines above this level are not even formatted (LOG_INFO by default) */
} core_config_t;
void core_config_default(core_config_t *c);

/* What /health says (enum web_state's values, kept equal by a static assert in publish.c). */
typedef enum core_health {
	CORE_HEALTH_SERVING = 0,
	CORE_HEALTH_FORMING,
	CORE_HEALTH_LOADING,
	CORE_HEALTH_REPLANNING,
} core_health_t;

typedef struct core core_t;

core_t *core_new(const disc_id_t *self, const core_config_t *cfg, int64_t now_ms);
void core_free(core_t *c);

/* The one input. Each may queue actions and change the state. Returns 0, or SH_EBUSY when the
 * action queue overflowed (a step queues at most CORE_QUEUE actions, which the shell drains
 * after every step: a bug, never a silent drop; the shell stops). */
int core_step(core_t *c, int64_t now_ms, const core_event_t *ev);
/* 1 and the next action, or 0 when none is queued. */
int core_next_action(core_t *c, core_action_t *out);

/* ---- reading the core (status, /health, /v1/cluster, metrics) ---- */
agent_state_t core_state(const core_t *c);
core_health_t core_health(const core_t *c, char *reason, size_t len);
/* The node whose plans this node follows (smallest ID among the majority model's holders that
 * the election has settled on); 0 when none. */
int core_planner(const core_t *c, disc_id_t *out);
int core_is_planner(const core_t *c);
/* The plan this node runs (or last ran), NULL when none. Lives until the next core_step. */
const core_plan_t *core_plan(const core_t *c);
/* The plan accepted and waiting for the running session to end, NULL when none. */
const core_plan_t *core_pending(const core_t *c);
/* The handles of the plans the core refers to (the current, the pending and the one made here),
 * at most 3 into out; returns how many. */
int core_handles(const core_t *c, uint32_t out[3]);
/* Does rank r of the current plan answer (connected, acknowledged, not stalled)? */
int core_rank_up(const core_t *c, int r);
/* Why member id is left out of plans ("" = it is not); NULL when it is not a member. */
const char *core_member_excluded(const core_t *c, const disc_id_t *id);
/* What member id last said about the current plan (CORE_ACK_NONE when not in it). */
core_ack_t core_member_ack(const core_t *c, const disc_id_t *id);
/* The majority model's hash ("" when no member has one yet). */
const char *core_majority_model(const core_t *c);

/* The transition table as Graphviz dot (docs/agent.md). */
void core_table_dot(FILE *f);

#endif
