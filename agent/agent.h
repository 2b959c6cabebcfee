/*
 * agent.h: the agent every machine runs (`shoal agent`): it ties discovery, planner, transport,
 * infer and web together on every node. docs/agent.md.
 *
 * The agent publishes itself over mDNS, connects to the peers it finds (and to --peer addresses)
 * over the authenticated control channel, keeps members alive with heartbeats and runs the
 * election; the cluster core (core.h) decides who plans, what, and when this node's session
 * starts and stops. The planner plans the cluster from the members' descriptions and sends the
 * plan to every member; each writes the plan files into its state directory, forms the
 * tensor-parallel group and loads its share; the planner serves the OpenAI API on --http-port
 * as rank 0, the others redirect there. It answers `shoal status` on a unix socket in its state
 * directory (STATE_DIR/agent.sock: connect, read one JSON object, EOF).
 *
 * Where the flags of future work land: agent_config_t (then cli/cmd_agent.c parses them), and
 * from here the object that uses them: a planner option (--strategy) in agent.c's make_plan,
 * an engine option (--draft-model, --spec) in session/session.h's session_cfg_t.
 *
 * Threads: agent_run's thread owns everything. The mDNS backend has its own thread (events come
 * through a queue); each handshake runs on a short-lived thread (handshake.h); a plan's session
 * runs on its own thread (session/session.h); the web server has its threads and reads what
 * the loop publishes (publish.h). agent_stop is the only call allowed from another thread or a
 * signal handler.
 */
#ifndef SHOAL_AGENT_H
#define SHOAL_AGENT_H

#include "discovery/discovery.h"
#include "transport/transport.h"

#include <stdint.h>

#define AGENT_DEFAULT_PORT      7411
#define AGENT_DEFAULT_HTTP_PORT 8080
#define AGENT_MAX_STATIC_PEERS  32
#define AGENT_HEARTBEAT_MS      300  /* every member hears from us this often */
#define AGENT_DEAD_MS           1500 /* a member silent this long is dropped */

/* The agent's settings. Strings are borrowed for the agent's life. */
typedef struct agent_config {
	const char *state_dir;
	int port;      /* control port (TCP, and the port published over mDNS) */
	int http_port; /* the API port (every node; followers redirect to the leader) */
	int expect;    /* settle at once with this many members; 0 = wait settle_ms */
	int64_t settle_ms;
	const char *peers[AGENT_MAX_STATIC_PEERS]; /* "HOST:PORT" or "[V6]:PORT" */
	int npeers;
	const char *model;        /* GGUF path, or NULL (the node waits for model transfer) */
	int no_mdns;              /* static peers only */
	int64_t replan_delay_ms;  /* a membership change waits this long before re-planning */
	int step_timeout_ms;      /* bound on a tensor-parallel step (0 = the engine's default) */
	int threads;              /* compute threads (0 = cores) */
	int ctx;                  /* context length (0 = the model's) */
	const char *memory_limit; /* cap on the memory the model may take on this node: BYTES
				     (K, M, G, T suffixes: powers of 1024) or PCT% of the
				     total; NULL = what the system has available */
	const char *api_key;      /* Bearer key for the API (NULL: SHOAL_API_KEY, else none) */
	const char *tls_cert;     /* PEM files: both given = the API is HTTPS only */
	const char *tls_key;
	const char *exec_cmd; /* --exec: run this while a plan is in force (agent/session/exec.h);
			       * then shoal loads no model share and the leader proxies /v1/ */
	int exec_port;        /* --exec-port: rank 0's command serves the API here */
	int parallel;         /* KV slots, sequences run together (0 = the engine's default) */
	const char *kv_type;  /* KV cache elements ("f16", "f32", "q8_0"; NULL = f16) */
	int dashboard_show_text; /* the dashboard's request table shows prompts and replies */
	/* Speculative decoding on rank 0's engine (docs/speculative.md): the mode ("auto", "off",
	 * "ngram", "model"; NULL = auto), a draft GGUF on this node (used when it is rank 0), the
	 * longest draft (0 = the engine's default). */
	const char *spec;
	const char *draft_model;
	int draft_max;
	int strategy; /* --strategy: plan_strategy_t (0 auto; the planner's value holds) */
} agent_config_t;

typedef struct agent agent_t;

/* Loads (or creates) the node ID, opens the control port and the status socket, starts mDNS.
 * keys are copied. Returns NULL with a one-line message in errbuf. */
agent_t *agent_new(const agent_config_t *cfg, const tp_keys_t *keys, char *errbuf, size_t errlen);

/* Runs the loop until agent_stop. Returns 0, or a negative code when the loop cannot go on. */
int agent_run(agent_t *a);

/* Asks agent_run to return soon. Async-signal-safe. */
void agent_stop(agent_t *a);

/* Closes everything (waits for running handshakes, at most their timeout). NULL is fine. */
void agent_free(agent_t *a);

/* The status socket of a state directory: STATE_DIR/agent.sock. */
int agent_status_path(const char *state_dir, char *out, size_t len);

#endif
