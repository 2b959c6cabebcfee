/*
 * web.h: the OpenAI-compatible HTTP API, metrics and the live dashboard (libmicrohttpd + jansson),
 * served by the leader on top of infer's engine interface.
 *
 * Endpoints (docs/api.md has the shapes): POST /v1/chat/completions, POST /v1/completions,
 * POST /v1/responses (OpenAI, plain or Server-Sent Events), POST /v1/embeddings, POST
 * /v1/messages and /v1/messages/count_tokens (Anthropic), /api/chat, /api/generate, /api/embed,
 * /api/embeddings, /api/tags, /api/ps, /api/show, /api/version (Ollama, NDJSON), GET /v1/models,
 * GET /health, GET /v1/cluster, GET /v1/events (SSE of live figures for the dashboard), GET
 * /v1/history (the last 15 minutes of figures, the cluster's events and the last requests), GET
 * /metrics (Prometheus text), GET / (the dashboard).
 *
 * Scheduling: accepted requests go into one bounded FIFO queue; a single scheduler thread owned
 * by the server takes them one at a time and runs eng_generate(), handing each token to the
 * request's connection as it comes (streaming). A full queue answers 429; each request has a
 * deadline; a client that goes away cancels its request.
 *
 * Threads: libmicrohttpd runs a small pool of event-loop threads (epoll where available) that
 * never block: waiting replies park their connections (web/guard.c); one watch thread enforces
 * hard header/body deadlines. The scheduler thread is the only caller of eng_generate(). Every
 * web_* function below may be called from any thread once web_new() has returned, except
 * web_free(). The health and cluster callbacks run on the pool threads: they must not block.
 *
 * Limits against hostile clients (docs/security.md): request headers within header_timeout_ms
 * and the body within body_timeout_ms however slowly bytes trickle in; at most max_conns
 * connections and per_ip_max from one address; bodies up to 512 KiB with bounded JSON nesting
 * and element counts; HTTPS when tls_cert and tls_key are given.
 *
 * Follower mode: after web_set_leader(w, url) the server answers /health, /metrics, /v1/cluster,
 * /v1/events, /v1/history and / itself and redirects (307) every other /v1/ and /api/ path to
 * url + path.
 */
#ifndef SHOAL_WEB_H
#define SHOAL_WEB_H

#include <stddef.h>

#include "infer/infer.h"

typedef struct web web_t;

/* What the node is doing, as /health reports it. Only WEB_SERVING answers 200. */
enum web_state { WEB_SERVING = 0, WEB_FORMING, WEB_LOADING, WEB_REPLANNING, WEB_STOPPING };

/* Health callback: returns an enum web_state and may write a one-line reason into reason.
 * Called from connection threads; must not block for long. */
typedef int (*web_health_fn)(void *ud, char *reason, size_t reason_len);

/* Cluster callback: returns a malloc'd JSON object (the caller frees it) describing the cluster
 * in the shape docs/api.md gives for GET /v1/cluster, or NULL. Called from connection threads. */
typedef char *(*web_cluster_fn)(void *ud);

/* Group-lost callback: a step failed because the engine's group broke (a rank lost or silent);
 * the running requests wait for the next engine (web_set_engine), so the owner should form a
 * new group. Called from the scheduler thread, once per break; must not block. */
typedef void (*web_engine_lost_fn)(void *ud);

typedef struct web_opts {
	const char *host;         /* address to bind; default "127.0.0.1"; "0.0.0.0" for all */
	int port;                 /* default 8080; 0 = any free port (see web_port) */
	const char *api_key;      /* NULL/"" = no auth, else "Authorization: Bearer KEY" on /v1/ */
	int queue_max;            /* requests waiting (not counting the running one); default 16 */
	int request_timeout_ms;   /* from acceptance to the last token; default 300000 */
	const char *model_name;   /* id in /v1/models and replies; NULL = the engine's name */
	web_health_fn health;     /* NULL: serving when an engine is attached, else loading */
	web_cluster_fn cluster;   /* NULL: a one-node description built from the engine */
	void *ud;                 /* passed to health, cluster and engine_lost */
	web_engine_lost_fn engine_lost; /* NULL: nobody to tell */
	const char *tls_cert;     /* PEM files: both given = HTTPS only; NULL = plain HTTP */
	const char *tls_key;
	int max_conns;            /* open connections; 0 = 2048 (less if the fd limit is low) */
	int per_ip_max;           /* connections from one client address; 0 = 64 */
	int header_timeout_ms;    /* headers complete within this; 0 = 15000 */
	int body_timeout_ms;      /* body complete within this after the headers; 0 = 60000 */
	int show_text;            /* the dashboard's request table shows prompts and replies
				     (--dashboard-show-text); 0 = tokens and timings only */
	const char *node_id;      /* this node in the history's per-node series (NULL: "self") */
	int replan_wait_ms;       /* the longest a request waits for the next engine during a
				     re-plan before 503 + Retry-After; 0 = 30000 */
} web_opts_t;

/* Fills o with the defaults above, then applies SHOAL_API_KEY from the environment if set. */
void web_opts_default(web_opts_t *o);

/* Starts listening and the scheduler thread. Strings in o are copied. eng may be NULL (the API
 * then answers 503 until web_set_engine). Returns 0 or a negative SH_E* code with a reason. */
int web_new(web_t **out, const web_opts_t *o, eng_t *eng, char *err, size_t errlen);

/* Stops accepting, ends every queued and running request with an error, stops the threads.
 * NULL-safe. The engine is not freed (the caller owns it). */
void web_free(web_t *w);

/* The port actually bound (useful after port 0). */
int web_port(const web_t *w);

/* Attaches, swaps or detaches (NULL) the engine. The engine stays owned by the caller. A swap or
 * a detach is a re-plan, not an end: the running requests are suspended between steps (or,
 * when their group broke, from the state the failed step handed back) and go on from there on
 * the next engine attached (re-prefilled; the client sees a pause), ahead of the queued ones;
 * the queued ones and new requests wait for it, each at most replan_wait_ms (then 503 +
 * Retry-After). Blocks until nothing uses the old engine; after that the caller may free it.
 * Before the first attach, and after web_set_unavailable, requests get 503 at once. */
void web_set_engine(web_t *w, eng_t *eng);

/* No plan can serve the model now (why: one line, copied): every request waiting for an engine
 * (suspended ones too) ends with 503 + Retry-After, and new ones get 503 at once until the next
 * web_set_engine. Use after detaching. web_set_leader(w, url) does it too (this node no longer
 * serves the API). */
void web_set_unavailable(web_t *w, const char *why);

/* Follower mode: redirect /v1/ inference paths to url ("http://10.0.0.1:8080"); NULL or "" =
 * serve them here (leader). The string is copied. Entering follower mode ends the requests that
 * wait for an engine here (web_set_unavailable): their connections are to this node. */
void web_set_leader(web_t *w, const char *url);

/* --exec: from now on this server forwards /v1/... (except /v1/cluster and /v1/events) to
 * 127.0.0.1:port, streaming included (web/proxy.c); 0 = off. A follower still redirects to the
 * leader, whose proxy answers. */
void web_set_proxy(web_t *w, int port);

/* Figures from the compute side, shown in /metrics and on the dashboard: time of one decode step
 * and the part of it spent communicating, in milliseconds (negative = unknown). */
void web_set_step_metrics(web_t *w, double step_ms, double comm_ms);

/* The decode rate (tokens/s) of the last finished request, 0 before one finished: the measured
 * figure /v1/cluster shows beside the plan's prediction. NULL-safe; any thread. */
double web_last_decode_tok_s(web_t *w);

/* A cluster event for the dashboard's log and charts, kept with its time (the last 200):
 * kind is a short word the page colours ("join", "leave", "replan", "failover", "model",
 * "error"; the server adds "rejected" itself), the text one line. NULL-safe on w; any thread. */
void web_event(web_t *w, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Step and communication time (ms, negative = unknown) of another node of the plan, by the id
 * the cluster document gives it; the dashboard charts it beside this node's own (measured by
 * the scheduler). Feed it about once a second per node. NULL-safe on w; any thread. */
void web_node_step(web_t *w, const char *node, double step_ms, double comm_ms);

/* Health of one rank (0..255): 1 healthy, 0 failed; n_ranks sets how many ranks exist. */
void web_set_rank_health(web_t *w, int rank, int healthy);
void web_set_rank_count(web_t *w, int n_ranks);

#endif
