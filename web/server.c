/*
 * server.c: the HTTP side: libmicrohttpd daemon, routing, API-key auth, body limits, follower
 * redirects, the built-in GET endpoints (health, models, cluster, events, metrics, dashboard),
 * and the services the endpoint files use (web_send, web_engine_get, ...). Generation and
 * embedding requests of every API are answered by generate.c through the route's endpoint.
 *
 * libmicrohttpd runs a small pool of event-loop threads (each an epoll loop over many
 * connections, see httpd_start), so no callback here may block: a non-streaming request parks
 * its connection until its job ends, a streaming one returns a callback response whose reader
 * parks it between tokens, and the events stream parks it between snapshots (guard.c). The
 * guard's watch thread polls parked clients' sockets, so a client that hangs up cancels its
 * generation even before a write fails.
 *
 * Invariant: every request that reaches the queue holds a job reference until its reply ends;
 * shutdown stops the scheduler first (every job then ends), then resumes every parked connection
 * (libmicrohttpd must not find one suspended), then the daemon, then frees the scheduler.
 */
#include "web/web_int.h"

#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

#define SSE_BLOCK   16384
#define HTTP_IDLE_S 60 /* libmicrohttpd's own idle timeout (restarts on every byte) */
#ifndef MSG_NOSIGNAL   /* macOS: both commands ignore SIGPIPE (the early 413 send) */
#define MSG_NOSIGNAL 0
#endif

struct web {
	struct MHD_Daemon *d;
	int port;
	char *host, *api_key, *model_name;
	int queue_max, timeout_ms;
	web_health_fn health;
	web_cluster_fn cluster;
	void *ud;
	web_sched_t *sched;
	web_metrics_t metrics;
	pthread_mutex_t mu; /* leader */
	char *leader;       /* follower mode when non-NULL */
	atomic_int stopping;
	long long started; /* unix seconds */
	web_guard_t *guard;
	int tls;
	atomic_int parsing;    /* bodies being parsed (WEB_PARSE_CONCURRENCY at most) */
	atomic_int proxy_port; /* --exec: /v1/... goes to 127.0.0.1:proxy_port (proxy.c) */
	web_history_t *hist;   /* the dashboard's series, events and requests (history.c) */
	web_rstore_t *rstore;  /* finished responses for previous_response_id (responses.c) */
};

typedef web_conn_t conn_t;

enum route {
	R_NONE = 0,
	R_DASH,
	R_HEALTH,
	R_METRICS,
	R_MODELS,
	R_CLUSTER,
	R_EVENTS,
	R_HISTORY,
	R_PROXY
};

#define A (&web_proto_anthropic)
#define O (&web_proto_ollama)
static const web_route_t routes[] = {
    {"/", R_DASH, "GET", 0, 0, NULL, NULL, NULL},
    {"/health", R_HEALTH, "GET", 0, 0, NULL, NULL, NULL},
    {"/metrics", R_METRICS, "GET", 0, 0, NULL, NULL, NULL},
    {"/v1/models", R_MODELS, "GET", 1, 1, NULL, NULL, NULL},
    {"/v1/cluster", R_CLUSTER, "GET", 0, 0, NULL, NULL, NULL},
    {"/v1/events", R_EVENTS, "GET", 0, 0, NULL, NULL, NULL},
    {"/v1/history", R_HISTORY, "GET", 0, 0, NULL, NULL, NULL},
    /* OpenAI */
    {"/v1/chat/completions", 0, "POST", 1, 1, &web_ep_chat, NULL, NULL},
    {"/v1/completions", 0, "POST", 1, 1, &web_ep_completions, NULL, NULL},
    {"/v1/responses", 0, "POST", 1, 1, &web_ep_responses, NULL, NULL},
    {"/v1/embeddings", 0, "POST", 1, 1, &web_ep_embeddings, NULL, NULL},
    /* Anthropic */
    {"/v1/messages", 0, "POST", 1, 1, &web_ep_messages, NULL, A},
    {"/v1/messages/count_tokens", 0, "POST", 1, 1, NULL, web_messages_count_tokens, A},
    /* Ollama */
    {"/api/chat", 0, "POST", 1, 1, &web_ep_ollama_chat, NULL, O},
    {"/api/generate", 0, "POST", 1, 1, &web_ep_ollama_generate, NULL, O},
    {"/api/embed", 0, "POST", 1, 1, &web_ep_ollama_embed, NULL, O},
    {"/api/embeddings", 0, "POST", 1, 1, &web_ep_ollama_embeddings, NULL, O},
    {"/api/tags", 0, "GET", 1, 1, NULL, web_ollama_tags, O},
    {"/api/ps", 0, "GET", 1, 1, NULL, web_ollama_ps, O},
    {"/api/show", 0, "POST", 1, 1, NULL, web_ollama_show, O},
    {"/api/version", 0, "GET", 0, 0, NULL, web_ollama_version, O},
};
#undef A
#undef O

/* ---- small helpers -------------------------------------------------------------------------- */

static char *xstrdup(const char *s)
{
	return s ? strdup(s) : NULL;
}

int web_conn_fd(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	return ci ? (int)ci->connect_fd : -1;
}

static void add_common_headers(struct MHD_Response *r, const char *ctype)
{
	MHD_add_response_header(r, "Content-Type", ctype);
	MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
	MHD_add_response_header(r, "Cache-Control", "no-store");
}

/* Queues body (malloc'd, taken) with status; counts it. */
static enum MHD_Result send_body(web_t *w, struct MHD_Connection *c, int status, char *body,
				 const char *ctype, const char *h1, const char *v1)
{
	if (!body) {
		status = 500;
		body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
			      "\"param\":null,\"code\":null}}");
		if (!body)
			return MHD_NO;
		ctype = "application/json";
	}
	struct MHD_Response *r =
	    MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	add_common_headers(r, ctype);
	if (h1)
		MHD_add_response_header(r, h1, v1);
	enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
	MHD_destroy_response(r);
	web_metrics_status(&w->metrics, status);
	return ok;
}

static enum MHD_Result send_json(web_t *w, struct MHD_Connection *c, int status, json_t *root)
{
	char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
	json_decref(root);
	return send_body(w, c, status, s, "application/json", NULL, NULL);
}

int web_send_error(web_t *w, struct MHD_Connection *c, const web_proto_t *proto, const web_err_t *e)
{
	const char *retry = NULL;
	if (e->status == 429)
		retry = "1";
	else if (e->status == 503)
		retry = "2";
	return send_body(w, c, e->status,
			 proto && proto->error ? proto->error(e) : web_json_error(e),
			 "application/json", retry ? "Retry-After" : NULL, retry);
}

int web_send(web_t *w, struct MHD_Connection *c, int status, char *body, const char *ctype,
	     const char *h1, const char *v1)
{
	return send_body(w, c, status, body, ctype, h1, v1);
}

int web_send_json(web_t *w, struct MHD_Connection *c, int status, json_t *root)
{
	return send_json(w, c, status, root);
}

static enum MHD_Result send_errorp(web_t *w, struct MHD_Connection *c, const web_proto_t *proto,
				   int status, const char *type, const char *code, const char *fmt,
				   ...) __attribute__((format(printf, 7, 8)));

static enum MHD_Result send_errorp(web_t *w, struct MHD_Connection *c, const web_proto_t *proto,
				   int status, const char *type, const char *code, const char *fmt,
				   ...)
{
	web_err_t e;
	memset(&e, 0, sizeof e);
	e.status = status;
	e.type = type;
	snprintf(e.code, sizeof e.code, "%s", code ? code : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e.message, sizeof e.message, fmt, ap);
	va_end(ap);
	return (enum MHD_Result)web_send_error(w, c, proto, &e);
}

#define send_errorf(w, c, ...) send_errorp(w, c, NULL, __VA_ARGS__)

/* The node's state for /health and for gating the API. */
static int node_state(web_t *w, char *reason, size_t len)
{
	reason[0] = 0;
	if (atomic_load(&w->stopping)) {
		snprintf(reason, len, "shutting down");
		return WEB_STOPPING;
	}
	if (w->health)
		return w->health(w->ud, reason, len);
	eng_t *e = web_sched_engine_acquire(w->sched);
	if (!e) {
		snprintf(reason, len, "no model loaded");
		return WEB_LOADING;
	}
	web_sched_engine_release(w->sched);
	return WEB_SERVING;
}

/* Model id and context length (engine acquired by the caller, may be NULL). */
static void model_id(web_t *w, eng_t *e, char *out, size_t len, int *n_ctx)
{
	const eng_info_t *in = e ? eng_info(e) : NULL;
	snprintf(out, len, "%s",
		 w->model_name    ? w->model_name
		 : in && in->name ? in->name
				  : "shoal");
	if (n_ctx)
		*n_ctx = in ? in->n_ctx : 0;
}

/* ---- services to generate.c and the API files ------------------------------------------------ */

void web_model_id(web_t *w, eng_t *e, char *out, size_t len)
{
	model_id(w, e, out, len, NULL);
}

eng_t *web_engine_get(web_t *w, web_err_t *e)
{
	char reason[200];
	int state = node_state(w, reason, sizeof reason);
	eng_t *eng = state == WEB_SERVING ? web_sched_engine_acquire(w->sched) : NULL;
	if (!eng)
		web_err_set(e, 503, "unavailable", NULL, "unavailable", "not serving yet: %s",
			    reason[0] ? reason : "no model loaded");
	return eng;
}

web_sched_t *web_sched_of(web_t *w)
{
	return w->sched;
}
web_guard_t *web_guard_of(web_t *w)
{
	return w->guard;
}
web_metrics_t *web_metrics_of(web_t *w)
{
	return &w->metrics;
}
web_rstore_t *web_rstore_of(web_t *w)
{
	return w ? w->rstore : NULL;
}
int web_timeout_of(web_t *w)
{
	return w->timeout_ms;
}
long long web_started_of(web_t *w)
{
	return w->started;
}
atomic_int *web_parsing_of(web_t *w)
{
	return &w->parsing;
}

/* ---- GET endpoints -------------------------------------------------------------------------- */

static int is_follower(web_t *w);

static enum MHD_Result do_health(web_t *w, struct MHD_Connection *c)
{
	char reason[200], model[128];
	int st = node_state(w, reason, sizeof reason);
	int pp = atomic_load(&w->proxy_port); /* --exec: serving means the command answers */
	if (st == WEB_SERVING && pp > 0 && !is_follower(w) && !web_proxy_alive(pp)) {
		st = WEB_LOADING;
		snprintf(reason, sizeof reason, "the --exec command does not answer on port %d yet",
			 pp);
	}
	int q, run;
	web_sched_depth(w->sched, &q, &run);
	if (st == WEB_SERVING) {
		eng_t *e = web_sched_engine_acquire(w->sched);
		model_id(w, e, model, sizeof model, NULL);
		if (e)
			web_sched_engine_release(w->sched);
		return send_json(w, c, 200,
				 json_pack("{s:s, s:s, s:s, s:i, s:i}", "status", "ok", "state",
					   "serving", "model", model, "queue_depth", q, "running",
					   run));
	}
	json_t *body =
	    json_pack("{s:s, s:s, s:s}", "status", "unavailable", "state", web_state_name(st),
		      "reason", reason[0] ? reason : web_state_name(st));
	char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
	json_decref(body);
	return send_body(w, c, 503, s, "application/json", "Retry-After", "2");
}

static enum MHD_Result do_models(web_t *w, struct MHD_Connection *c)
{
	eng_t *e = web_sched_engine_acquire(w->sched);
	char model[128];
	int n_ctx = 0;
	model_id(w, e, model, sizeof model, &n_ctx);
	json_t *data = json_array();
	if (e) {
		const eng_info_t *in = eng_info(e);
		char when[40]; /* Anthropic's models list: type, display_name, created_at */
		time_t t = (time_t)w->started;
		strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
		json_array_append_new(
		    data,
		    json_pack("{s:s, s:s, s:I, s:s, s:i, s:i, s:s?, s:I, s:s, s:s, s:s}", "id",
			      model, "object", "model", "created", (json_int_t)w->started,
			      "owned_by", "shoal", "context_length", n_ctx, "max_model_len", n_ctx,
			      "arch", in->arch, "weight_bytes", (json_int_t)in->weight_bytes,
			      "type", "model", "display_name", model, "created_at", when));
		web_sched_engine_release(w->sched);
	}
	json_t *first =
	    json_array_size(data) ? json_object_get(json_array_get(data, 0), "id") : NULL;
	return send_json(w, c, 200,
			 json_pack("{s:s, s:o, s:b, s:O?, s:O?}", "object", "list", "data", data,
				   "has_more", 0, "first_id", first, "last_id", first));
}

static long long mem_total_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	return pages > 0 && psz > 0 ? (long long)pages * psz : 0;
}

/* The cluster description: the agent's, or a one-node one for `shoal serve`. */
static json_t *cluster_json(web_t *w)
{
	if (w->cluster) {
		char *s = w->cluster(w->ud);
		json_t *j = s ? json_loads(s, 0, NULL) : NULL;
		free(s);
		if (j)
			return j;
	}
	char host[256] = "localhost", reason[200], model[128];
	gethostname(host, sizeof host - 1);
	int st = node_state(w, reason, sizeof reason);
	eng_t *e = web_sched_engine_acquire(w->sched);
	int n_ctx = 0;
	model_id(w, e, model, sizeof model, &n_ctx);
	long long wbytes = 0;
	int layers = 0;
	if (e) {
		wbytes = (long long)eng_info(e)->weight_bytes;
		layers = eng_info(e)->n_layers;
		web_sched_engine_release(w->sched);
	}
	char addr[300];
	snprintf(addr, sizeof addr, "%s:%d", w->host, w->port);
	json_t *member = json_pack(
	    "{s:s, s:s, s:s, s:s, s:i, s:s, s:b, s:I, s:I, s:[], s:{s:[i,i]}}", "id", host, "name",
	    host, "addr", addr, "role", "leader", "rank", 0, "state", web_state_name(st), "healthy",
	    st == WEB_SERVING, "mem_total", (json_int_t)mem_total_bytes(), "mem_model",
	    (json_int_t)wbytes, "rdma", "holds", "layers", 0, layers);
	return json_pack("{s:s, s:s, s:s, s:[o], s:[], s:{s:s, s:i, s:[f], s:s, s:i, s:i}}",
			 "state", web_state_name(st), "leader", host, "self", host, "members",
			 member, "links", "plan", "strategy", "single", "ranks", 1, "shares", 1.0,
			 "model", model, "layers", layers, "n_ctx", n_ctx);
}

/* ---- the live events stream (dashboard) ----------------------------------------------------- */

typedef struct events {
	web_t *w;
	web_buf_t pend;
	size_t off;
	unsigned long long last_tokens;
	int64_t last_ms;
	int n;
	int interval_ms;         /* between snapshots (?interval_ms=, default 1000) */
	int64_t due_ms;          /* the next snapshot's time: a fixed cadence, late wake-ups do
				    not add up */
	int64_t hist_t;          /* the history sent so far: its last sample's time, */
	uint64_t ev_seq, rq_seq; /* last event and last request */
	web_park_t park; /* parked between snapshots; the watch thread resumes it when due */
} events_t;

static void events_snapshot(events_t *ev)
{
	web_t *w = ev->w;
	char reason[200];
	int st = node_state(w, reason, sizeof reason);
	int q, run;
	web_sched_depth(w->sched, &q, &run);
	unsigned long long tok = atomic_load(&w->metrics.tokens_live);
	int64_t now = now_ms();
	double rate = 0;
	if (ev->n > 0 && now > ev->last_ms)
		rate = (double)(tok - ev->last_tokens) * 1000.0 / (double)(now - ev->last_ms);
	ev->last_tokens = tok;
	ev->last_ms = now;
	pthread_mutex_lock(&w->metrics.mu);
	double last_tps = w->metrics.last_tps, step = w->metrics.step_ms, comm = w->metrics.comm_ms;
	unsigned long long reqs = w->metrics.api_requests, gen = w->metrics.completion_tokens;
	pthread_mutex_unlock(&w->metrics.mu);
	char model[128];
	eng_t *e = web_sched_engine_acquire(w->sched);
	model_id(w, e, model, sizeof model, NULL);
	if (e)
		web_sched_engine_release(w->sched);
	json_t *snap = json_pack(
	    "{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:f, s:f, s:I, s:I, s:I, s:o, s:o}", "state",
	    web_state_name(st), "reason", reason, "model", model, "tok_s", rate, "last_tok_s",
	    last_tps, "queued", q, "running", run, "step_ms", step, "comm_ms", comm, "requests",
	    (json_int_t)reqs, "generated_tokens", (json_int_t)gen, "tokens_live", (json_int_t)tok,
	    "cluster", cluster_json(w), "batch", web_metrics_batch_json(&w->metrics));
	/* what the history gained since the last snapshot (all of it in the first) */
	json_t *hj = web_history_json(w->hist, ev->hist_t, ev->ev_seq, ev->rq_seq);
	if (snap && hj) {
		json_t *ts = json_object_get(hj, "t");
		size_t nt = json_array_size(ts);
		if (nt)
			ev->hist_t = (int64_t)json_integer_value(json_array_get(ts, nt - 1));
		ev->ev_seq = (uint64_t)json_integer_value(json_object_get(hj, "event_seq"));
		ev->rq_seq = (uint64_t)json_integer_value(json_object_get(hj, "request_seq"));
		json_object_set_new(hj, "full", json_boolean(ev->n == 0));
		json_object_set_new(snap, "history", hj);
	} else
		json_decref(hj);
	char *s = snap ? json_dumps(snap, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
	json_decref(snap);
	ev->pend.len = 0;
	ev->off = 0;
	if (s)
		web_sse_add(&ev->pend, s);
	ev->n++;
}

static ssize_t events_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	events_t *ev = cls;
	web_t *w = ev->w;
	if (ev->off >= ev->pend.len) {
		if (atomic_load(&w->stopping))
			return MHD_CONTENT_READER_END_OF_STREAM;
		int64_t now = now_ms();
		if (ev->n > 0 && now < ev->due_ms) {
			atomic_store(&ev->park.wake_at, ev->due_ms);
			return web_park_suspend(w->guard, &ev->park)
				   ? 0
				   : MHD_CONTENT_READER_END_OF_STREAM;
		}
		/* one snapshot a second by default, on a fixed cadence (restarted after a stall) */
		ev->due_ms = ev->n > 0 && now - ev->due_ms < ev->interval_ms
				 ? ev->due_ms + ev->interval_ms
				 : now + ev->interval_ms;
		events_snapshot(ev);
		if (ev->pend.len == 0)
			return MHD_CONTENT_READER_END_WITH_ERROR;
	}
	size_t n = MIN(max, ev->pend.len - ev->off);
	memcpy(buf, ev->pend.p + ev->off, n);
	ev->off += n;
	return (ssize_t)n;
}

static void events_free(void *cls)
{
	events_t *ev = cls;
	if (ev->park.c)
		web_park_detach(ev->w->guard, &ev->park);
	web_buf_free(&ev->pend);
	free(ev);
}

static enum MHD_Result do_events(web_t *w, struct MHD_Connection *c)
{
	events_t *ev = calloc(1, sizeof *ev);
	if (!ev)
		return MHD_NO;
	ev->w = w;
	ev->interval_ms = 1000;
	const char *iv = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "interval_ms");
	if (iv) /* a faster feed for tests and wall displays; bounded both ways */
		ev->interval_ms = (int)MAX(100, MIN(10000, strtol(iv, NULL, 10)));
	ev->park.c = c;
	ev->park.fd = web_conn_fd(c);
	web_park_attach(w->guard, &ev->park);
	struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK,
								   events_read, ev, events_free);
	if (!r) {
		events_free(ev);
		return MHD_NO;
	}
	add_common_headers(r, "text/event-stream");
	MHD_add_response_header(r, "X-Accel-Buffering", "no");
	enum MHD_Result ok = MHD_queue_response(c, 200, r);
	MHD_destroy_response(r);
	return ok;
}

int web_refuse(web_t *w, struct MHD_Connection *c, const web_proto_t *proto, int api,
	       const web_err_t *e)
{
	web_reqrec_t r;
	memset(&r, 0, sizeof r);
	snprintf(r.api, sizeof r.api, "%s", web_api_name(api));
	r.status = e->status;
	r.ttft_ms = r.tok_s = -1;
	web_reqrec_error(&r, e);
	web_history_request(w->hist, &r);
	if (e->status == 429 || e->status == 503)
		web_history_rejected(w->hist, e->status, e->code);
	return web_send_error(w, c, proto, e);
}

int web_replan_hold(web_t *w, web_conn_t *cn, web_err_t *err)
{
	char reason[200];
	int state = node_state(w, reason, sizeof reason), wait_ms;
	if ((state == WEB_SERVING && web_sched_ready(w->sched)) ||
	    !web_sched_holding(w->sched, &wait_ms))
		return 0;
	int64_t now = now_ms();
	if (!cn->hold_until)
		cn->hold_until = now + wait_ms;
	if (now < cn->hold_until)
		return 1;
	web_err_set(err, 503, "unavailable", NULL, "replanning",
		    "the cluster is re-planning and no plan served the model within %d s; retry",
		    wait_ms / 1000);
	return -1;
}

/* Parks cn's connection on a timer (the parse slots are taken, or no engine yet); the handler
 * runs again after ms. */
int web_park_retry(web_t *w, struct MHD_Connection *c, web_conn_t *cn, int ms)
{
	if (!cn->parked) {
		cn->park.c = c;
		cn->park.fd = web_conn_fd(c);
		web_park_attach(w->guard, &cn->park);
		cn->parked = 1;
	}
	atomic_store(&cn->park.wake_at, now_ms() + ms);
	if (web_park_suspend(w->guard, &cn->park))
		return MHD_YES;
	return send_errorp(w, c, cn->rt ? cn->rt->errors : NULL, 503, "unavailable", "unavailable",
			   "the server is stopping; retry");
}

/* ---- routing -------------------------------------------------------------------------------- */

/* The key: "Authorization: Bearer KEY" (OpenAI's clients, Ollama's with headers set) or
 * "x-api-key: KEY" (Anthropic's). */
static int auth_ok(web_t *w, struct MHD_Connection *c)
{
	if (!w->api_key || !w->api_key[0])
		return 1;
	const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
	if (h && !strncasecmp(h, "Bearer ", 7)) {
		h += 7;
		while (*h == ' ')
			h++;
	} else if (!(h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"))) {
		return 0;
	}
	size_t a = strlen(h), b = strlen(w->api_key);
	unsigned diff = (unsigned)(a ^ b);
	for (size_t i = 0; i < a && i < b; i++) /* no early exit: timing says nothing */
		diff |= (unsigned char)(h[i] ^ w->api_key[i]);
	return diff == 0;
}

/* 401, counted among the refusals of the event log (no row in the request table: a client
 * without the key could fill it). */
static enum MHD_Result refuse_auth(web_t *w, struct MHD_Connection *c, const web_proto_t *errs)
{
	web_history_rejected(w->hist, 401, "invalid_api_key");
	return send_errorp(w, c, errs, 401, "authentication_error", "invalid_api_key",
			   "a valid API key is required: send 'Authorization: Bearer KEY' or "
			   "'x-api-key: KEY'");
}

static enum MHD_Result redirect(web_t *w, struct MHD_Connection *c, const char *url)
{
	char loc[1024];
	pthread_mutex_lock(&w->mu);
	snprintf(loc, sizeof loc, "%s%s", w->leader ? w->leader : "", url);
	pthread_mutex_unlock(&w->mu);
	web_err_t e;
	web_err_set(&e, 307, "redirect", NULL, "not_leader",
		    "this node is a follower; the API is at %s", loc);
	return send_body(w, c, 307, web_json_error(&e), "application/json", "Location", loc);
}

static int is_follower(web_t *w)
{
	pthread_mutex_lock(&w->mu);
	int f = w->leader != NULL;
	pthread_mutex_unlock(&w->mu);
	return f;
}

/* The final call for a request whose body (if any) has arrived: answer it. */
static enum MHD_Result dispatch(web_t *w, struct MHD_Connection *c, conn_t *cn)
{
	switch (cn->route) {
	case R_DASH:
		return send_body(w, c, 200, strdup(web_dashboard_html), "text/html; charset=utf-8",
				 NULL, NULL);
	case R_HEALTH: return do_health(w, c);
	case R_METRICS: {
		web_buf_t b = {0};
		int q, run;
		char reason[200];
		web_sched_depth(w->sched, &q, &run);
		int st = node_state(w, reason, sizeof reason);
		if (web_metrics_prometheus(&w->metrics, &b, q, run, st) != 0)
			web_buf_free(&b);
		return send_body(w, c, 200, b.p, "text/plain; version=0.0.4", NULL, NULL);
	}
	case R_MODELS: return do_models(w, c);
	case R_CLUSTER: return send_json(w, c, 200, cluster_json(w));
	case R_EVENTS: return do_events(w, c);
	case R_HISTORY: {
		const char *since = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "since");
		json_t *h = web_history_json(w->hist, since ? strtoll(since, NULL, 10) : 0, 0, 0);
		char *body = h ? json_dumps(h, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
		json_decref(h);
		return send_body(w, c, 200, body, "application/json", NULL, NULL);
	}
	}
	if (cn->raw_replied)
		return MHD_NO; /* the 413 went out already; close */
	if (cn->too_large)
		return send_errorp(w, c, cn->rt ? cn->rt->errors : NULL, 413,
				   "invalid_request_error", "request_too_large",
				   "the request body is larger than %u bytes", WEB_BODY_MAX);
	if (cn->route == R_PROXY)
		return (enum MHD_Result)web_proxy_answer(c, atomic_load(&w->proxy_port), cn->method,
							 cn->url, cn->body.p, cn->body.len,
							 &w->stopping, w->timeout_ms);
	if (cn->rt && cn->rt->ep)
		return (enum MHD_Result)web_generate_answer(w, c, cn, cn->rt->ep);
	if (cn->rt && cn->rt->handler)
		return (enum MHD_Result)cn->rt->handler(w, c, cn);
	return MHD_NO;
}

/*
 * A chunked body has passed WEB_BODY_MAX. libmicrohttpd (0.9.75) accepts a response only before
 * the body or after all of it, so the 413 is written to the socket here, the write side is shut
 * (the client reads the reply and end-of-file, and stops sending) and the rest is discarded for a
 * bounded while. Over TLS the socket is not ours to write: returns 0 and the caller closes.
 * Returns 1 when the reply went out.
 */
static int early_413(web_t *w, struct MHD_Connection *c)
{
	int fd = web_conn_fd(c);
	if (w->tls || fd < 0)
		return 0;
	web_err_t e;
	web_err_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
		    "the request body is larger than %u bytes", WEB_BODY_MAX);
	char *body = web_json_error(&e);
	if (!body)
		return 0;
	char head[256];
	int hn = snprintf(head, sizeof head,
			  "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
			  "Content-Length: %zu\r\nConnection: close\r\n"
			  "Access-Control-Allow-Origin: *\r\n\r\n",
			  strlen(body));
	/* small and the first bytes on this socket: the send buffer takes it whole */
	ssize_t a = send(fd, head, (size_t)hn, MSG_NOSIGNAL | MSG_DONTWAIT);
	ssize_t b = a == hn ? send(fd, body, strlen(body), MSG_NOSIGNAL | MSG_DONTWAIT) : -1;
	int ok = b == (ssize_t)strlen(body);
	free(body);
	shutdown(fd, SHUT_WR);
	web_metrics_status(&w->metrics, 413);
	return ok;
}

/*
 * libmicrohttpd calls this several times per request: first with the headers (*con_cls NULL),
 * then once per piece of body, then once more with no data. Refusals (404, 405, 401, redirects,
 * an announced oversized body) are answered on the first call, which also makes libmicrohttpd
 * close the connection without reading the body; everything else is answered on the last call,
 * which keeps the connection alive for the client's next request.
 */
static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
			      const char *method, const char *version, const char *upload_data,
			      size_t *upload_data_size, void **con_cls)
{
	(void)version;
	web_t *w = cls;
	conn_t *cn = *con_cls;
	if (cn) {
		if (*upload_data_size) {
			size_t n = *upload_data_size;
			*upload_data_size = 0;
			if (!cn->too_large && cn->body.len + n > WEB_BODY_MAX) {
				cn->too_large = 1;
				web_buf_free(&cn->body);
				cn->raw_replied = early_413(w, c);
				if (!cn->raw_replied)
					return MHD_NO;
			}
			if (cn->too_large) { /* discard a bounded amount while the client stops */
				cn->discarded += n;
				return cn->discarded > WEB_BODY_MAX ? MHD_NO : MHD_YES;
			}
			if (web_buf_add(&cn->body, upload_data, n) != 0)
				cn->too_large = 1;
			return MHD_YES;
		}
		if (cn->job) /* resumed: the job ended (or a spurious wake-up) */
			return (enum MHD_Result)web_generate_reply(w, c, cn);
		web_guard_phase(w->guard, c, WEB_PHASE_WORK);
		return dispatch(w, c, cn);
	}

	if (!strcmp(method, "OPTIONS")) { /* CORS preflight from a browser page elsewhere */
		struct MHD_Response *r =
		    MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
		if (!r)
			return MHD_NO;
		MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
		MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
		MHD_add_response_header(
		    r, "Access-Control-Allow-Headers",
		    "Authorization, Content-Type, x-api-key, anthropic-version, "
		    "anthropic-beta");
		enum MHD_Result ok = MHD_queue_response(c, 204, r);
		MHD_destroy_response(r);
		return ok;
	}

	const web_route_t *rt = NULL;
	for (size_t i = 0; i < ARRAY_LEN(routes); i++)
		if (!strcmp(url, routes[i].path))
			rt = &routes[i];
	int v1 = !strncmp(url, "/v1/", 4), api = !strncmp(url, "/api/", 5);
	/* errors in the shape the route's clients read: Ollama's under /api/ */
	const web_proto_t *errs = rt ? rt->errors : api ? &web_proto_ollama : NULL;
	if ((!rt || rt->leader_only) && (v1 || api) && is_follower(w))
		return redirect(w, c, url);
	if ((!rt || rt->leader_only) && v1 && atomic_load(&w->proxy_port) > 0) { /* --exec */
		if (!auth_ok(w, c))
			return refuse_auth(w, c, errs);
		if (!(cn = calloc(1, sizeof *cn)) || !(cn->url = strdup(url))) {
			free(cn);
			return MHD_NO;
		}
		cn->route = R_PROXY;
		snprintf(cn->method, sizeof cn->method, "%s", method);
		*con_cls = cn;
		return MHD_YES;
	}
	if (!rt)
		return send_errorp(w, c, errs, 404, "not_found_error", "unknown_url",
				   "unknown path %.100s %.200s (see docs/api.md)", method, url);
	int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
	if (strcmp(method, rt->method) != 0 && !(is_get && !strcmp(rt->method, "GET"))) {
		web_err_t e;
		web_err_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
			    "%.20s is not allowed on %s; use %s", method, rt->path, rt->method);
		return send_body(w, c, 405,
				 errs && errs->error ? errs->error(&e) : web_json_error(&e),
				 "application/json", "Allow", rt->method);
	}
	if (rt->auth && !auth_ok(w, c))
		return refuse_auth(w, c, errs);
	/* refuse an announced oversized body before reading it */
	const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
	if (cl && strtoull(cl, NULL, 10) > WEB_BODY_MAX)
		return send_errorp(w, c, errs, 413, "invalid_request_error", "request_too_large",
				   "the request body is larger than %u bytes", WEB_BODY_MAX);
	cn = calloc(1, sizeof *cn);
	if (!cn)
		return MHD_NO;
	cn->route = rt->route;
	cn->rt = rt;
	*con_cls = cn;
	unsigned long long announced = cl ? strtoull(cl, NULL, 10) : 0;
	if (announced > 0 && web_buf_add(&cn->body, "", 0) == 0) { /* one allocation, exact size */
		char *p = realloc(cn->body.p, (size_t)announced + 1);
		if (p) {
			cn->body.p = p;
			cn->body.cap = (size_t)announced + 1;
		}
	}
	/* the body (if any) must arrive within the body deadline, however slowly it trickles */
	web_guard_phase(w->guard, c, strcmp(method, "POST") ? WEB_PHASE_WORK : WEB_PHASE_BODY);
	return MHD_YES;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
		      enum MHD_RequestTerminationCode toe)
{
	(void)toe;
	web_t *w = cls;
	conn_t *cn = *con_cls;
	if (cn) {
		if (cn->job) {
			web_job_t *j = cn->job;
			pthread_mutex_lock(&j->mu);
			int done = j->state == JOB_DONE;
			j->wake = NULL;
			pthread_mutex_unlock(&j->mu);
			if (!done) { /* the connection ended before the reply */
				web_sched_cancel(w->sched, j, 1);
				web_metrics_status(&w->metrics, 499);
			}
			web_job_unref(j);
		}
		if (cn->parked)
			web_park_detach(w->guard, &cn->park);
		web_buf_free(&cn->body);
		free(cn->url);
		free(cn);
		*con_cls = NULL;
	}
	/* keep-alive: the next request's headers must come within the header deadline */
	web_guard_phase(w->guard, c, WEB_PHASE_HEADERS);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	(void)cls;
	char line[512];
	vsnprintf(line, sizeof line, fmt, ap);
	size_t n = strlen(line);
	while (n && line[n - 1] == '\n')
		line[--n] = 0;
	LOG(LOG_DEBUG, "web: microhttpd: %s", line);
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

void web_opts_default(web_opts_t *o)
{
	memset(o, 0, sizeof *o);
	o->host = "127.0.0.1";
	o->port = 8080;
	o->queue_max = 16;
	o->request_timeout_ms = 300000;
	const char *k = getenv("SHOAL_API_KEY");
	if (k && *k)
		o->api_key = k;
}

/* Reads a whole small file (a PEM) into a malloc'd string. */
static char *read_pem(const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		sh_fail(err, errlen, SH_EIO, "%s: %s", path, strerror(errno));
		return NULL;
	}
	web_buf_t b = {0};
	char chunk[4096];
	size_t n;
	while ((n = fread(chunk, 1, sizeof chunk, f)) > 0 && b.len < (1u << 20))
		if (web_buf_add(&b, chunk, n) != 0)
			break;
	fclose(f);
	if (!b.p || !strstr(b.p, "-----BEGIN ")) {
		sh_fail(err, errlen, SH_EINVAL, "%s: not a PEM file", path);
		web_buf_free(&b);
		return NULL;
	}
	return b.p;
}

/*
 * The one place libmicrohttpd is configured: a pool of event-loop threads (epoll on Linux, poll
 * elsewhere; MHD_USE_AUTO), suspend/resume for parked replies, connection caps in total and per
 * client address, the guard's per-connection notifications, and TLS when asked for.
 */
static int httpd_start(web_t *w, const web_opts_t *o, const struct addrinfo *ai, char *err,
		       size_t errlen)
{
	struct rlimit rl;
	unsigned max_conns = o->max_conns > 0 ? (unsigned)o->max_conns : 2048;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    rl.rlim_cur < max_conns + 128) /* room for models, peers and the engine */
		max_conns = rl.rlim_cur > 256 ? (unsigned)rl.rlim_cur - 128 : 64;
	unsigned per_ip = o->per_ip_max > 0 ? (unsigned)o->per_ip_max : 64;
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned pool = (unsigned)MAX(2, MIN(8, cores > 0 ? cores : 2));
	unsigned flags = MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME |
			 MHD_USE_ERROR_LOG;
	if (ai->ai_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	char *cert = NULL, *key = NULL;
	if (o->tls_cert || o->tls_key) {
		if (!o->tls_cert || !o->tls_key)
			return sh_fail(err, errlen, SH_EINVAL,
				       "--tls-cert and --tls-key go together");
		if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
			return sh_fail(err, errlen, SH_EINVAL,
				       "this libmicrohttpd was built without TLS (GnuTLS)");
		if (!(cert = read_pem(o->tls_cert, err, errlen)) ||
		    !(key = read_pem(o->tls_key, err, errlen))) {
			free(cert);
			return SH_EINVAL;
		}
		flags |= MHD_USE_TLS;
		w->tls = 1;
	}
	/* TLS 1.2 and 1.3 only (a GnuTLS priority string) */
	static char prio[] = "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2";
	struct MHD_OptionItem tls_opts[] = {
	    {cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, cert},
	    {MHD_OPTION_HTTPS_MEM_KEY, 0, key},
	    {MHD_OPTION_HTTPS_PRIORITIES, 0, prio},
	    {MHD_OPTION_END, 0, NULL},
	};
	/* clang-format off */
	w->d = MHD_start_daemon(flags, 0, NULL, NULL, handle, w,
				MHD_OPTION_SOCK_ADDR, ai->ai_addr,
				MHD_OPTION_THREAD_POOL_SIZE, pool,
				MHD_OPTION_CONNECTION_LIMIT, max_conns,
				MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_IDLE_S,
				MHD_OPTION_NOTIFY_COMPLETED, completed, w,
				MHD_OPTION_NOTIFY_CONNECTION, web_guard_notify, w->guard,
				MHD_OPTION_EXTERNAL_LOGGER, mhd_log, w,
				MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
				MHD_OPTION_ARRAY, tls_opts, /* empty without TLS */
				MHD_OPTION_END);
	/* clang-format on */
	int e = errno;
	/* libmicrohttpd copies neither PEM: it hands them to GnuTLS at start, which copies them */
	if (key) {
		sodium_memzero(key, strlen(key));
		free(key);
	}
	free(cert);
	if (!w->d)
		return sh_fail(err, errlen, SH_EIO, "cannot listen%s: %s", w->tls ? " (TLS)" : "",
			       strerror(e ? e : EADDRINUSE));
	LOG(LOG_DEBUG, "web: %u event threads, %u connections (%u per address)%s", pool, max_conns,
	    per_ip, w->tls ? ", HTTPS" : "");
	return 0;
}

int web_new(web_t **out, const web_opts_t *o, eng_t *eng, char *err, size_t errlen)
{
	*out = NULL;
	int rc = SH_ENOMEM;
	struct addrinfo *ai = NULL;
	web_t *w = calloc(1, sizeof *w);
	if (!w)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	pthread_mutex_init(&w->mu, NULL);
	web_metrics_init(&w->metrics);
	w->host = xstrdup(o->host && o->host[0] ? o->host : "127.0.0.1");
	w->api_key = o->api_key && o->api_key[0] ? xstrdup(o->api_key) : NULL;
	w->model_name = o->model_name && o->model_name[0] ? xstrdup(o->model_name) : NULL;
	w->queue_max = o->queue_max > 0 ? o->queue_max : 16;
	w->timeout_ms = o->request_timeout_ms > 0 ? o->request_timeout_ms : 300000;
	w->health = o->health;
	w->cluster = o->cluster;
	w->ud = o->ud;
	w->started = (long long)time(NULL);
	w->rstore = web_rstore_new(WEB_RSTORE_BYTES, WEB_RSTORE_ITEMS);
	if (!w->host || !w->rstore)
		goto fail;
	if ((rc = web_sched_new(&w->sched, &w->metrics, w->queue_max, o->replan_wait_ms,
				o->engine_lost, o->ud)) != 0) {
		sh_fail(err, errlen, rc, "cannot start the scheduler thread");
		goto fail;
	}
	web_sched_set_engine(w->sched, eng);
	char self[256] = "self"; /* shoal serve: the host, as its one-node cluster names it */
	if (!o->node_id || !o->node_id[0])
		gethostname(self, sizeof self - 1);
	if (!(w->hist =
		  web_history_new(&w->metrics, w->sched,
				  o->node_id && o->node_id[0] ? o->node_id : self, o->show_text))) {
		rc = SH_ENOMEM;
		goto fail;
	}
	web_sched_set_history(w->sched, w->hist);
	if ((rc = web_history_start(w->hist)) != 0) {
		sh_fail(err, errlen, rc, "cannot start the history thread");
		goto fail;
	}
	if ((rc = web_guard_new(&w->guard, w->sched, o->header_timeout_ms, o->body_timeout_ms))) {
		sh_fail(err, errlen, rc, "cannot start the connection watch thread");
		goto fail;
	}

	char port[16];
	snprintf(port, sizeof port, "%d", o->port < 0 ? 8080 : o->port);
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
				 .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	int gai = getaddrinfo(w->host, port, &hints, &ai);
	if (gai != 0) {
		rc = sh_fail(err, errlen, SH_EINVAL, "cannot resolve %s: %s", w->host,
			     gai_strerror(gai));
		goto fail;
	}
	char herr[200] = "";
	if ((rc = httpd_start(w, o, ai, herr, sizeof herr)) != 0) {
		sh_fail(err, errlen, rc, "%s:%s: %s", w->host, port, herr);
		goto fail;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(w->d, MHD_DAEMON_INFO_BIND_PORT);
	w->port = di && di->port ? di->port : o->port;
	freeaddrinfo(ai);
	*out = w;
	return 0;
fail:
	if (ai)
		freeaddrinfo(ai);
	if (rc == SH_ENOMEM && err && errlen && !err[0])
		sh_fail(err, errlen, rc, "out of memory");
	web_free(w);
	return rc;
}

void web_free(web_t *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	atomic_store(&w->stopping, 1);
	pthread_mutex_unlock(&w->mu);
	if (w->sched)
		web_sched_stop(w->sched); /* every job ends and wakes its parked connection */
	web_guard_stop(w->guard);         /* and every other parked connection resumes */
	if (w->d)
		MHD_stop_daemon(w->d);
	web_guard_free(w->guard);
	web_sched_free(w->sched);
	web_history_free(w->hist); /* after the scheduler, which records into it */
	web_rstore_free(w->rstore);
	web_metrics_destroy(&w->metrics);
	pthread_mutex_destroy(&w->mu);
	free(w->host);
	free(w->api_key);
	free(w->model_name);
	free(w->leader);
	free(w);
}

int web_port(const web_t *w)
{
	return w->port;
}

void web_set_engine(web_t *w, eng_t *eng)
{
	web_sched_set_engine(w->sched, eng);
}

void web_set_unavailable(web_t *w, const char *why)
{
	web_sched_unavailable(w->sched, why);
}

void web_set_leader(web_t *w, const char *url)
{
	char *copy = url && url[0] ? strdup(url) : NULL;
	if (copy) { /* "http://h:p/" + "/v1/..." would double the slash */
		size_t n = strlen(copy);
		while (n && copy[n - 1] == '/')
			copy[--n] = 0;
	}
	pthread_mutex_lock(&w->mu);
	free(w->leader);
	w->leader = copy;
	pthread_mutex_unlock(&w->mu);
	if (copy) /* the waiting requests' connections are to this node: they end here */
		web_sched_unavailable(w->sched, "this node no longer leads the cluster");
}

void web_set_proxy(web_t *w, int port)
{
	atomic_store(&w->proxy_port, port > 0 ? port : 0);
}

void web_set_step_metrics(web_t *w, double step_ms, double comm_ms)
{
	pthread_mutex_lock(&w->metrics.mu);
	w->metrics.step_ms = step_ms;
	w->metrics.comm_ms = comm_ms;
	w->metrics.step_external = step_ms >= 0;
	pthread_mutex_unlock(&w->metrics.mu);
}

double web_last_decode_tok_s(web_t *w)
{
	if (!w)
		return 0;
	pthread_mutex_lock(&w->metrics.mu);
	double v = w->metrics.last_tps;
	pthread_mutex_unlock(&w->metrics.mu);
	return v > 0 ? v : 0;
}

void web_event(web_t *w, const char *kind, const char *fmt, ...)
{
	if (!w)
		return;
	char text[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	web_history_event(w->hist, kind, text);
}

void web_node_step(web_t *w, const char *node, double step_ms, double comm_ms)
{
	if (w)
		web_history_node_step(w->hist, node, step_ms, comm_ms);
}

void web_set_rank_count(web_t *w, int n_ranks)
{
	pthread_mutex_lock(&w->metrics.mu);
	w->metrics.n_ranks = MAX(0, MIN(n_ranks, WEB_MAX_RANKS));
	pthread_mutex_unlock(&w->metrics.mu);
}

void web_set_rank_health(web_t *w, int rank, int healthy)
{
	if (rank < 0 || rank >= WEB_MAX_RANKS)
		return;
	pthread_mutex_lock(&w->metrics.mu);
	w->metrics.rank_ok[rank] = healthy ? 1 : 0;
	if (rank >= w->metrics.n_ranks)
		w->metrics.n_ranks = rank + 1;
	pthread_mutex_unlock(&w->metrics.mu);
}
