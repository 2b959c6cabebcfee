/*
 * session.h (internal to agent/): a plan's session on this node. It forms the plan's
 * tensor-parallel group, opens the engine with this rank's share (after fetching the share's
 * bytes on a node that holds only a slice of the model), and then on rank 0 serves the API
 * through the web server, on the other ranks runs the worker loop, until it is told to stop or
 * the group fails. With --exec the command is the engine: the session loads nothing and only
 * marks the plan as served (session/exec.h runs the command beside it).
 *
 * The agent starts at most one session at a time (the cluster core decides when) and learns how
 * it goes by polling: session_phase, then, once DONE, session_error and session_stalled_rank.
 *
 * Where future work lands: the engine's options are in session_cfg_t; what happens to the API's
 * accepted requests while a group is re-formed is session_attach/session_detach's business on rank
 * 0 (today detaching fails the queued requests with 503: a session could instead hand them to the
 * next one).
 *
 * Threads: a session runs on its own thread. session_start, session_phase, session_worker_stats,
 * session_error, session_stalled_rank, session_stop, session_fail and session_free are for the
 * agent's thread. Ownership: session_start copies what it needs from cfg and the plan (both
 * borrowed for the call, except cfg->keys, cfg->web and cfg->group_broken, which must outlive the
 * session).
 */
#ifndef SHOAL_AGENT_SESSION_H
#define SHOAL_AGENT_SESSION_H

#include "agent/modelstore/modelstore.h"
#include "infer/infer.h"
#include "planner/planner.h"
#include "transport/transport.h"
#include "web/web.h"

#include <stdatomic.h>

typedef struct session_cfg {
	const char *model_path; /* the model, or a slice of it (slice.model_path) */
	int threads, parallel, step_timeout_ms;
	const char *kv_type;
	/* speculative decoding (docs/speculative.md): rank 0's engine only (the others verify) */
	const char *spec;         /* "auto", "off", "ngram", "model"; NULL = auto */
	const char *draft_model;  /* this node's draft GGUF, or NULL */
	int draft_max;            /* 0 = the engine's default */
	const tp_keys_t *keys;    /* the group's keys */
	const uint8_t *node_id;   /* this node's ID (TP_NODE_ID_BYTES) */
	const char *state_dir;    /* rdma-devices.json (written with the plan's files) */
	int exec;                 /* --exec: nothing to load; READY until stopped */
	web_t *web;               /* rank 0 attaches its engine here (NULL: no API on this node) */
	atomic_int *group_broken; /* set by the web server when a request met a broken group */
	int slice;                /* the model is a slice: fetch the share's bytes first */
	modelstore_share_t share; /* ... from this holder (slice only) */
} session_cfg_t;

typedef struct session session_t;
enum session_phase { SESSION_FORMING, SESSION_LOADING, SESSION_READY, SESSION_DONE };

/* Starts the session of plan p as rank `rank`. NULL with a reason on failure. */
session_t *session_start(const session_cfg_t *cfg, const plan_t *p, int rank, char *err,
			 size_t errlen);
int session_phase(session_t *s);
/* A worker rank (not rank 0) while it computes: its step and communication figures so far
 * (eng_worker_comm_stats); 0, or -1 when this session runs no worker. */
int session_worker_stats(session_t *s, eng_comm_t *out);
const char *session_error(session_t *s); /* valid once DONE ("": it was asked to stop) */
/* Once DONE: the rank that broke the group by not answering within the step timeout while its
 * channel stayed up (the transport's SH_ETIMEDOUT failure), else -1. */
int session_stalled_rank(session_t *s);
/* Asks the session to end (any phase); returns at once. */
void session_stop(session_t *s);
/* Stops it as session_stop, but it ends with the error why (the core then re-plans). */
void session_fail(session_t *s, const char *why);
/* Joins the thread: only once DONE (or at exit, where it waits). NULL-safe. */
void session_free(session_t *s);

#endif
