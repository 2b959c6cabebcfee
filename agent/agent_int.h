/*
 * agent_int.h: the agent's internals shared by its files (core.c, behind core.h: the pure cluster
 * core that decides; agent.c: the loop, members and handshakes; cluster.c: node descriptions,
 * the core's actions, the view, the plan and its distribution, the
 * /v1/cluster document; session/session.c: a plan's session (group, engine, worker loop) and the
 * web glue; status.c: the status socket and its JSON). Not for other modules.
 *
 * Everything here is owned by the thread that runs agent_run (see agent.h), except the fields
 * marked "pub" (behind pub_mu, read by the web server's threads) and a session's own fields
 * (session/session.c says which thread touches what).
 */
#ifndef SHOAL_AGENT_INT_H
#define SHOAL_AGENT_INT_H

#include "agent/agent.h"
#include "agent/core.h"
#include "common/common.h"

#include "planner/planner.h"
#include "web/web.h"

#include <pthread.h>
#include <stdatomic.h>

#define HANDSHAKE_MS    2000
#define FALLBACK_MS     3000
#define RETRY_MS        1000
#define STATIC_RETRY_MS 2000
#define MAX_CONNS       DISC_MAX_PEERS
#define MAX_DIALS       32
#define MAX_HANDSHAKES  64 /* handshake threads at once, both directions */

/* Agent messages on the control channel (range 0x0300-0x03ff, docs/agent.md; never reused). */
enum agent_msg {
	AGENT_MSG_NODE = 0x0300, /* JSON: this node's addresses, API port, model hash (on join) */
	AGENT_MSG_PLAN = 0x0301, /* leader -> member: the plan JSON (plan_to_json) */
	AGENT_MSG_ACK = 0x0302,  /* member -> leader: JSON {"hash","state","error"} */
	AGENT_MSG_EXCLUDED = 0x0303, /* leader -> member: text, why it is left out of the plan */
};

#define AGENT_MAX_ADDRS 16
#define AGENT_HASH_HEX  65 /* model content hash: 64 hex characters + NUL */

/* What a node says about itself in AGENT_MSG_NODE. */
typedef struct node_desc {
	int have; /* the message arrived */
	int http_port;
	int sync_port;                   /* where its model file may be fetched (0 = none) */
	char model_hash[AGENT_HASH_HEX]; /* "" = no model (yet) */
	uint64_t model_size;
	uint64_t mem_avail; /* memory it can give the model (0 = not said) */
	int naddrs;
	char ip[AGENT_MAX_ADDRS][PLAN_IP_MAX];
	char ifname[AGENT_MAX_ADDRS][PLAN_IFNAME_MAX];
	int kind[AGENT_MAX_ADDRS];   /* plan_link_t, as the node itself sees its interface */
	int prefix[AGENT_MAX_ADDRS]; /* IPv4 netmask length, 0 = unknown (the planner's /24) */
} node_desc_t;

typedef struct conn {
	tp_chan_t *ch;
	disc_id_t id;
	int initiator_is_me;
	int64_t last_rx_ms, last_tx_ms;
	int64_t joined_ms;
	char addr[DISC_ADDR_MAX]; /* peer address without port */
	disc_info_t info;         /* from the peer's INFO */
	node_desc_t desc;         /* from the peer's NODE */
} conn_t;

/* A plan's session on this node: forming the group, loading the engine, serving (rank 0) or
 * running the worker loop (others), on its own thread. session/session.c. */
typedef struct session session_t;
enum session_phase { SESSION_FORMING, SESSION_LOADING, SESSION_READY, SESSION_DONE };

/* A handshake on its own thread; the result comes back through result_pipe. */
typedef struct dial {
	agent_t *a;
	int outgoing;
	char host[DISC_HOST_MAX];
	int port;
	int fd;           /* incoming: the accepted socket */
	int static_index; /* outgoing to --peer i, else -1 */
	disc_id_t target; /* outgoing to an mDNS peer (zero for static) */
	/* result */
	tp_chan_t *ch;
	int rc;
	char err[256];
} dial_t;

struct agent {
	agent_config_t cfg;
	tp_keys_t keys;
	disc_id_t self;
	char self_hex[DISC_ID_HEX];
	disc_host_facts_t facts;
	uint64_t nonce;
	core_t *core;          /* the cluster core (core.h): states, planning, health */
	disc_id_t core_leader; /* the election's leader and epoch as last fed to the core */
	uint64_t core_epoch, core_max_epoch;
	char core_model[AGENT_HASH_HEX]; /* the model hash as last fed to the core */
	uint64_t mem_avail;              /* memory this node gives the model (--memory-limit) */
	uint64_t term_saved;             /* the election epoch last written to STATE_DIR/term */
	elec_t *elec;
	disc_mdns_t *mdns;
	disc_table_t *table;
	int listen_fd, status_fd;
	char status_path[SH_SUBPATH_MAX];
	int result_pipe[2], stop_pipe[2];
	atomic_int dials_running;
	conn_t conns[MAX_CONNS];
	int nconns;
	/* dials in flight, so one target is dialled once at a time */
	disc_id_t dialing[MAX_DIALS];
	int ndialing;
	int static_dialing[AGENT_MAX_STATIC_PEERS];
	int64_t static_last_ms[AGENT_MAX_STATIC_PEERS];
	disc_id_t static_id[AGENT_MAX_STATIC_PEERS]; /* learnt at the first handshake */
	int static_self[AGENT_MAX_STATIC_PEERS];     /* the --peer is this node itself */
	int static_err_logged[AGENT_MAX_STATIC_PEERS];
	int64_t mdns_last_try_ms[DISC_MAX_PEERS]; /* indexed like the table (a rate limit only) */
	unsigned mdns_tries[DISC_MAX_PEERS];
	int64_t last_hb_ms;
	int duplicate; /* another live node uses our ID */
	char duplicate_where[128];
	int stood_down; /* found the duplicate before joining anyone: the other node keeps the ID */
	char foreign_seen[8][DISC_NAME_MAX]; /* other clusters' services, logged once each */
	int nforeign;
	disc_id_t last_leader;
	/* the model (modelstore/modelstore.c) */
	char model_hash[AGENT_HASH_HEX]; /* "" without --model until fetched */
	uint64_t model_size;
	char model_path[SH_SUBPATH_MAX]; /* a fetched model's path (then cfg.model points here) */
	int sync_fd, sync_port;          /* model transfer listener */
	atomic_int sync_running;         /* serving threads */
	struct fetch *fetch;             /* the running fetch, or NULL */
	int64_t fetch_retry_ms;
	atomic_int fetch_permille;
	struct verify *verify;  /* the running periodic re-hash, or NULL */
	int64_t verify_next_ms; /* when the next one starts */
	int model_slice; /* 1: cfg.model is a slice file holding only the bytes of this node's
			  * shares (modelsync.h); it serves no one and fetches each new share's
			  * bytes from a holder of the whole file when a session starts */
	/* plans (cluster.c); which plan runs when is the core's decision */
	plan_t *plan;    /* the plan this node runs (or last ran), or NULL */
	plan_t *pending; /* the plan the core accepted, until its session starts */
	plan_t *made;    /* planner: the last plan made here, and its JSON */
	char *made_text;
	session_t *sess;     /* the running session, or NULL */
	int sess_ready;      /* its READY went to the core */
	char why[200];       /* the model transfer's news for /health (modelstore/modelstore.c) */
	plan_model_t pmodel; /* the model's shapes for the planner (loaded once) */
	int have_pmodel;
	struct exec *exec; /* --exec: the command's process group (session/exec.c), or NULL */
	int in_force;      /* a->plan is in force here (agent_plan_hook) */
	/* the API */
	web_t *web;
	char leader_url[128];
	pthread_mutex_t pub_mu;
	int pub_state;        /* pub: enum web_state */
	char pub_reason[200]; /* pub */
	char *pub_cluster;    /* pub: the /v1/cluster JSON */
	int64_t pub_ms;
	atomic_int group_broken; /* set by the web server when a request met a broken group */
	int fatal;               /* the loop cannot go on (a core step overflowed): its code */
};

/* ---- agent.c ---- */
/* Sends to one member; a failure drops nothing here (heartbeats notice). */
int agent_send(agent_t *a, conn_t *c, uint16_t type, const void *p, size_t len);

/* ---- modelstore/modelstore.c ---- */
/* Hashes --model (if any) and opens the transfer listener. */
int agent_model_init(agent_t *a, char *err, size_t errlen);
void agent_sync_accept(agent_t *a); /* the transfer listener is readable */
void agent_model_tick(agent_t *a, int64_t now);
void agent_model_free(agent_t *a);
/* The member to fetch model bytes from: the planner when it holds the whole file, else the
 * member with the smallest ID that does; NULL when none does. Agent thread. */
conn_t *agent_model_holder(agent_t *a);
/* On a slice node (a->model_slice), before a session computes: makes the slice file hold the
 * bytes of this rank's share (dist NULL: the whole model), fetching what it lacks from host:port
 * (a holder, chosen by session_start). Blocking; any thread (reads only cfg, keys, self, hash).
 * Returns 0 or SH_E* with a reason. */
int agent_model_ensure_share(agent_t *a, const eng_dist_t *dist, int rank, const char *host,
			     int port, char *err, size_t errlen);

/* ---- cluster.c ---- */
void agent_send_node(agent_t *a, conn_t *c);
/* Handles an agent message (0x0300-0x03ff). Returns 0 or SH_EFORMAT (drop the member). */
int agent_cluster_msg(agent_t *a, conn_t *c, uint16_t type, const uint8_t *p, size_t len);
/* Steps the core with ev and carries out its actions. */
void agent_core_feed(agent_t *a, const core_event_t *ev);
/* Feeds the election's leader and epoch to the core when they moved. */
void agent_core_leader(agent_t *a);
/* What runs beside the engine follows this: plan `hash` (a->plan) serves on this node from now
 * on (in_force = 1: its session is ready, the plan files are in the state directory), or no
 * longer (0: its session is ending or ended). It sets a->in_force, which --exec follows (CMD
 * starts, restarts and stops from agent_cluster_tick, which also reaps it). Agent thread; must
 * not block. */
void agent_plan_hook(agent_t *a, const char *hash, int in_force);
/* Once per loop turn: the core's tick, sessions, the published health and cluster. */
void agent_cluster_tick(agent_t *a, int64_t now);
/* Stops and frees the session and plans (agent_free). */
void agent_cluster_free(agent_t *a);

/* ---- session/session.c ---- */
/* Starts the session for plan p (borrowed for the call) as rank `rank`. NULL on failure. */
session_t *session_start(agent_t *a, const plan_t *p, int rank, char *err, size_t errlen);
int session_phase(session_t *s);
const char *session_error(session_t *s); /* valid once DONE */
/* Asks the session to end (any phase); returns at once. */
void session_stop(session_t *s);
/* Stops it as session_stop, but it ends with the error why (the core then re-plans). */
void session_fail(session_t *s, const char *why);
/* Joins the thread: only once DONE (or at exit, where it waits). NULL-safe. */
void session_free(session_t *s);
/* Starts the API server (every node). */
int agent_web_start(agent_t *a, char *err, size_t errlen);
/* Publishes the health state and reason (called by the loop). */
void agent_pub_set(agent_t *a, int web_state, const char *reason, char *cluster_json);

/* The member with this node ID, or NULL. */
conn_t *agent_conn_find(agent_t *a, const disc_id_t *id);

/* Opens STATE_DIR/agent.sock (refusing when a live agent answers on it). */
int agent_status_listen(agent_t *a, char *errbuf, size_t errlen);

/* Answers one client waiting on the status socket with the status JSON. */
void agent_status_serve(agent_t *a);

#endif
