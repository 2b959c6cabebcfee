/*
 * publish.h (internal to agent/): what this node tells the outside. The API server runs on every
 * node from the start (web/web.h): /health and /v1/cluster answer from what the loop publishes
 * here (pub_set), a follower redirects inference requests to the planner (pub_follow). The
 * /v1/cluster document is built in one place (pub_cluster_json) for the agent and for
 * `shoal serve` (one node); `shoal status` reads the status socket (STATE_DIR/agent.sock:
 * connect, read one JSON object, EOF), answered from the same sources (status.c).
 *
 * The links of /v1/cluster are every pair of the plan (TCP or its RDMA device) and every pair
 * a member measured (links.h: round trip median and p90, throughput; of a pair measured from
 * both ends, the worse figures), so the dashboard's topology and `shoal status` show them.
 *
 * Threads: pub_new, pub_set, pub_follow, pub_free and the status calls belong to the loop's
 * thread; the web server's threads read the published copies under a mutex (they never touch
 * the agent's objects). Ownership: pub_new's object is freed by pub_free (NULL-safe), which also
 * stops the web server.
 */
#ifndef SHOAL_AGENT_PUBLISH_H
#define SHOAL_AGENT_PUBLISH_H

#include "agent/agent.h"
#include "agent/core.h"
#include "agent/members.h"
#include "planner/planner.h"
#include "web/web.h"

#include <stdatomic.h>
#include <stdint.h>

/* ---- the /v1/cluster document (docs/api.md) ---- */

typedef struct pub_member {
	char id[DISC_HOST_MAX]; /* the node ID (or, for `shoal serve`, the host name) */
	char name[DISC_HOST_MAX];
	char addr[DISC_HOST_MAX + 16]; /* ADDR:HTTP_PORT, [V6]:PORT */
	const char *role;              /* "leader", "follower" or "standby" */
	int rank;                      /* -1: not in the plan */
	const char *standby_reason;    /* left out of the plan on purpose (the cost model's), or NULL */
	const plan_rank_t *holds; /* what this rank holds (the dashboard's topology), or NULL;
				   * q1 0: whole layers (layer0..layer1 only) */
	int holds_experts;             /* MoE: say its routed experts too */
	const char *state;             /* the node's state, or what it said about the plan */
	int healthy;
	uint64_t mem_total, mem_model;
	char rdma[256]; /* "dev:ifname,..." (the devices are listed) */
} pub_member_t;

typedef struct pub_link {
	const char *a, *b; /* node IDs (borrowed) */
	const char *dev;   /* the RDMA device, or NULL: TCP */
	/* measured (links.h; measured 0: not measured): the worse end's figures */
	int measured;
	double rtt_ms, rtt_p90_ms, mbit_s;
} pub_link_t;

typedef struct pub_cluster {
	const char *state, *leader, *self; /* leader NULL: none */
	uint64_t epoch;                    /* the election's (0: not said) */
	int n;
	pub_member_t *members; /* n, the first this node */
	/* the plan in force (strategy NULL: none) */
	const char *strategy;
	int ranks, layers, n_ctx;
	double *shares;    /* ranks */
	int (*experts)[2]; /* ranks [first, last) routed experts, or NULL (dense) */
	const char *model, *hash;
	const char *reason;     /* why the planner chose this plan, or NULL */
	double predicted_tok_s; /* single-stream decode predicted from measured links (0: none) */
	double measured_tok_s;  /* the last finished request's decode rate (0: none yet) */
	uint64_t plan_epoch;
	int nlinks;
	pub_link_t *links;
} pub_cluster_t;

/* The document as JSON text (malloc'd, the caller frees), NULL when out of memory. */
char *pub_cluster_json(const pub_cluster_t *c);

/* What the agent's documents (/v1/cluster, `shoal status`) are made from, all borrowed. */
typedef struct pub_src {
	const agent_config_t *cfg;
	const core_t *core;
	members_t *members;
	const plan_t *plan;         /* the plan this node runs (or last ran), or NULL */
	const plan_model_t *pmodel; /* the model's shapes, or NULL (known to the planner) */
	const disc_host_facts_t *facts;
	const char *self_hex, *cid_hex, *model_path;
	int port, http_port;
	const plan_meas_t *links; /* this node's measured links (links.h) */
	int nlinks;
	double measured_tok_s; /* the web server's last decode rate (0: none) */
} pub_src_t;

/* The agent's /v1/cluster document as this node sees it. */
char *pub_agent_cluster(const pub_src_t *s);

/* ---- the API server ---- */

typedef struct pub pub_t;

/* Starts the API server (every node; a port that cannot be opened costs only the API: logged,
 * pub_web is then NULL). NULL when out of memory. */
pub_t *pub_new(const agent_config_t *cfg, const char *self_hex);
void pub_free(pub_t *p);
web_t *pub_web(pub_t *p);
/* Set by the web server when a request met a broken group; the session reads and clears it. */
atomic_int *pub_group_broken(pub_t *p);

/* Publishes health (enum web_state), its reason and (when not NULL) the /v1/cluster JSON (taken
 * over: freed here). */
void pub_set(pub_t *p, int web_state, const char *reason, char *cluster_json);
/* Followers send the API's clients to url ("http://HOST:PORT"); NULL or "": served here. */
void pub_follow(pub_t *p, const char *url);

/* ---- the status socket (status.c) ---- */

/* Opens STATE_DIR/agent.sock (refusing when a live agent answers on it): a descriptor to poll,
 * or -1 with a reason. path gets the socket's path (SH_SUBPATH_MAX bytes). */
int pub_status_listen(const char *state_dir, char *path, char *err, size_t errlen);
/* Answers one client waiting on the socket with the status JSON. */
void pub_status_serve(int fd, const pub_src_t *s);

#endif
