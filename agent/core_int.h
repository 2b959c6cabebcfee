/*
 * core_int.h: the cluster core's own state, shared by its two files and nothing else: core.c
 * (the state machine: core_step and what it calls) and core_view.c (reading it: core.h's
 * readers). Both are pure (core.h); core.c calls nothing of core_view.c.
 */
#ifndef SHOAL_AGENT_CORE_INT_H
#define SHOAL_AGENT_CORE_INT_H

#include "agent/core.h"

/* A step queues at most: a SEND_PLAN per rank and an EXCLUDE per member, and a few for this node
 * (ACK, START/STOP_SESSION, PLAN_GONE/IN_FORCE, MAKE_PLAN). */
#define CORE_QUEUE 256
_Static_assert(CORE_QUEUE >= 2 * CORE_MAX_MEMBERS + 16, "the action queue holds a whole step");

typedef struct core_member {
	disc_id_t id;
	int described;
	char model[CORE_MODEL_MAX];
	uint64_t model_size;
	int64_t joined_ms;
	core_ack_t ack; /* about ack_hash */
	char ack_hash[CORE_HASH_MAX];
	char sent_hash[CORE_HASH_MAX]; /* the plan last sent to it (planner) */
	int64_t sent_ms;
	char excluded[CORE_WHY_MAX];   /* the reason it was last told ("" = planned) */
	char left_hash[CORE_HASH_MAX]; /* it left this plan's formed group (said IDLE) */
	int64_t stalled_until;
	disc_id_t linked[CORE_MAX_MEMBERS]; /* the peers it published measured links towards */
	int nlinked;
} core_member_t;

enum sess { SESS_NONE, SESS_RUNNING, SESS_READY, SESS_STOPPING };
enum lead { LEAD_OFF, LEAD_WAITING, LEAD_STEADY, LEAD_DRIFT, LEAD_MAKING };

struct core {
	disc_id_t self;
	core_config_t cfg;
	int64_t now; /* of the last step (for the readers) */
	agent_state_t state;
	/* the election's view */
	int have_leader;
	disc_id_t leader;
	uint64_t term;
	core_member_t members[CORE_MAX_MEMBERS];
	int n;
	char model[CORE_MODEL_MAX];
	uint64_t model_size;
	/* whose plans we run, and the plans */
	int have_following;
	disc_id_t following;
	core_plan_t cur, pending;
	int have_cur, have_pending;
	enum sess sess;
	int served_once;
	char why[CORE_WHY_MAX];
	/* the planner's side */
	enum lead lead;
	core_plan_t made; /* the last plan this node made while planning */
	int have_made;
	disc_id_t want[CORE_MAX_RANKS], planned[CORE_MAX_RANKS];
	int nwant, nplanned;
	int64_t change_ms, retry_ms;
	uint64_t seq_term, seq;
	int stale;               /* the election knows a newer epoch than the one we follow/lead */
	uint64_t max_plan_epoch; /* the largest plan epoch seen (made, received, acknowledged) */
	uint64_t ran_epoch;      /* the largest epoch of a plan this node accepted */
	char broken[CORE_WHY_MAX]; /* why the made plan does not compute ("" = it does) */
	int remeasured;            /* measurements changed since the last plan was made here */
	disc_id_t linked[CORE_MAX_MEMBERS]; /* this node's measured links (CORE_EV_LINKS) */
	int nlinked;
	int64_t born_ms; /* core_new's time: this node's own "join" for links_wait_ms */
	/* actions */
	int qhead, qlen;
	int overflow;        /* an action found the queue full this step */
	core_action_t spill; /* where such an action is written (and dropped, reported) */
	core_action_t q[CORE_QUEUE];
};

/* The member with this ID, or NULL (self is never a member). */
const core_member_t *core_member_get(const core_t *c, const disc_id_t *id);
/* Does member m (NULL: not connected) answer plan p: connected, not stalled, in its group, and
 * it acknowledged p (or p went out less than ack_wait ago)? */
int core_member_answers(const core_t *c, const core_member_t *m, const core_plan_t *p, int64_t now);

#endif
