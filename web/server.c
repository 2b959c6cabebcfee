/*
 * server.c: the HTTP side: libmicrohttpd daemon, routing, bearer auth, body limits, follower
 * redirects, and the glue between a connection and its job in the scheduler.
 *
 * libmicrohttpd runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION), so a handler
 * may block: a non-streaming request waits for its job inside the handler; a streaming one
 * returns a callback response whose reader blocks until the scheduler appends bytes. Both poll
 * the client's socket while they wait, so a client that hangs up cancels its generation even
 * before a write fails.
 *
 * Invariant: every request that reaches the queue holds a job reference until its reply ends;
 * shutdown stops the scheduler first (every job then ends), then the daemon (every connection
 * thread returns), then frees the scheduler.
 */
#include "web/web_int.h"

#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

#define SSE_BLOCK 16384
#define KEEPALIVE_MS 15000

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
	pthread_mutex_t mu; /* leader, and the events wake-up */
	pthread_cond_t cv;  /* signalled at shutdown (events streams sleep on it) */
	char *leader;       /* follower mode when non-NULL */
	atomic_int stopping;
	long long started; /* unix seconds */
};

/* Per-connection state while a body is uploaded. */
typedef struct conn {
	int route;
	web_buf_t body;
	int too_large;
} conn_t;

enum route { R_NONE = 0, R_DASH, R_HEALTH, R_METRICS, R_MODELS, R_CLUSTER, R_EVENTS, R_CHAT,
	     R_COMPLETIONS };

static const struct route_def {
	const char *path;
	int route;
	const char *method; /* the one allowed (HEAD is allowed with GET) */
	int auth;           /* needs the API key */
	int leader_only;    /* followers redirect it */
} routes[] = {
	{"/", R_DASH, "GET", 0, 0},
	{"/health", R_HEALTH, "GET", 0, 0},
	{"/metrics", R_METRICS, "GET", 0, 0},
	{"/v1/models", R_MODELS, "GET", 1, 1},
	{"/v1/cluster", R_CLUSTER, "GET", 0, 0},
	{"/v1/events", R_EVENTS, "GET", 0, 0},
	{"/v1/chat/completions", R_CHAT, "POST", 1, 1},
	{"/v1/completions", R_COMPLETIONS, "POST", 1, 1},
};

/* ---- small helpers -------------------------------------------------------------------------- */

static char *xstrdup(const char *s) { return s ? strdup(s) : NULL; }

/* 1 when the peer closed its end or the socket failed. */
static int peer_gone(int fd)
{
	if (fd < 0)
		return 0;
	struct pollfd p = {.fd = fd, .events = POLLIN};
#ifdef POLLRDHUP
	p.events |= POLLRDHUP;
#endif
	if (poll(&p, 1, 0) <= 0)
		return 0;
	if (p.revents & (POLLHUP | POLLERR | POLLNVAL))
		return 1;
#ifdef POLLRDHUP
	if (p.revents & POLLRDHUP)
		return 1;
#endif
	if (p.revents & POLLIN) {
		char c;
		ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
		if (n == 0)
			return 1;
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return 1;
	}
	return 0;
}

static int conn_fd(struct MHD_Connection *c)
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

static enum MHD_Result send_error(web_t *w, struct MHD_Connection *c, const web_err_t *e)
{
	const char *retry = NULL;
	if (e->status == 429)
		retry = "1";
	else if (e->status == 503)
		retry = "2";
	return send_body(w, c, e->status, web_json_error(e), "application/json",
			 retry ? "Retry-After" : NULL, retry);
}

static enum MHD_Result send_errorf(web_t *w, struct MHD_Connection *c, int status, const char *type,
				   const char *code, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));

static enum MHD_Result send_errorf(web_t *w, struct MHD_Connection *c, int status, const char *type,
				   const char *code, const char *fmt, ...)
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
	return send_error(w, c, &e);
}

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
		 w->model_name ? w->model_name : in && in->name ? in->name : "shoal");
	if (n_ctx)
		*n_ctx = in ? in->n_ctx : 0;
}

/* ---- GET endpoints -------------------------------------------------------------------------- */

static enum MHD_Result do_health(web_t *w, struct MHD_Connection *c)
{
	char reason[200], model[128];
	int st = node_state(w, reason, sizeof reason);
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
	json_t *body = json_pack("{s:s, s:s, s:s}", "status", "unavailable", "state",
				 web_state_name(st), "reason", reason[0] ? reason : web_state_name(st));
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
		json_array_append_new(
			data, json_pack("{s:s, s:s, s:I, s:s, s:i, s:i, s:s?, s:I}", "id", model,
					"object", "model", "created", (json_int_t)w->started,
					"owned_by", "shoal", "context_length", n_ctx, "max_model_len",
					n_ctx, "arch", in->arch, "weight_bytes",
					(json_int_t)in->weight_bytes));
		web_sched_engine_release(w->sched);
	}
	return send_json(w, c, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
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
	json_t *member = json_pack("{s:s, s:s, s:s, s:s, s:i, s:s, s:b, s:I, s:I, s:[]}", "id", host,
				   "name", host, "addr", addr, "role", "leader", "rank", 0, "state",
				   web_state_name(st), "healthy", st == WEB_SERVING, "mem_total",
				   (json_int_t)mem_total_bytes(), "mem_model", (json_int_t)wbytes,
				   "rdma");
	return json_pack("{s:s, s:s, s:s, s:[o], s:[], s:{s:s, s:i, s:[f], s:s, s:i, s:i}}", "state",
			 web_state_name(st), "leader", host, "self", host, "members", member,
			 "links", "plan", "strategy", "single", "ranks", 1, "shares", 1.0, "model",
			 model, "layers", layers, "n_ctx", n_ctx);
}

/* ---- the live events stream (dashboard) ----------------------------------------------------- */

typedef struct events {
	web_t *w;
	web_buf_t pend;
	size_t off;
	unsigned long long last_tokens;
	int64_t last_ms;
	int n;
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
	json_t *snap = json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:f, s:f, s:I, s:I, s:I, s:o, s:o}",
				 "state", web_state_name(st), "reason", reason, "model", model,
				 "tok_s", rate, "last_tok_s", last_tps, "queued", q, "running", run,
				 "step_ms", step, "comm_ms", comm, "requests", (json_int_t)reqs,
				 "generated_tokens", (json_int_t)gen, "tokens_live", (json_int_t)tok,
				 "cluster", cluster_json(w), "batch",
				 web_metrics_batch_json(&w->metrics));
	char *s = snap ? json_dumps(snap, JSON_COMPACT) : NULL;
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
		if (ev->n > 0) { /* one snapshot a second; wake early at shutdown */
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			pthread_mutex_lock(&w->mu);
			if (!atomic_load(&w->stopping))
				pthread_cond_timedwait(&w->cv, &w->mu, &ts);
			pthread_mutex_unlock(&w->mu);
		}
		if (atomic_load(&w->stopping))
			return MHD_CONTENT_READER_END_OF_STREAM;
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
	web_buf_free(&ev->pend);
	free(ev);
}

static enum MHD_Result do_events(web_t *w, struct MHD_Connection *c)
{
	events_t *ev = calloc(1, sizeof *ev);
	if (!ev)
		return MHD_NO;
	ev->w = w;
	struct MHD_Response *r =
		MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, events_read, ev,
						  events_free);
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

/* ---- completions ---------------------------------------------------------------------------- */

typedef struct stream {
	web_t *w;
	web_job_t *job;
	int fd;
	int64_t last_write_ms;
} stream_t;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	stream_t *st = cls;
	web_job_t *j = st->job;
	pthread_mutex_lock(&j->mu);
	for (;;) {
		if (j->out.len > 0) {
			size_t n = MIN(max, j->out.len);
			memcpy(buf, j->out.p, n);
			memmove(j->out.p, j->out.p + n, j->out.len - n);
			j->out.len -= n;
			j->out.p[j->out.len] = 0;
			pthread_mutex_unlock(&j->mu);
			st->last_write_ms = now_ms();
			return (ssize_t)n;
		}
		if (j->state == JOB_DONE) {
			pthread_mutex_unlock(&j->mu);
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 250 * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) != ETIMEDOUT)
			continue;
		pthread_mutex_unlock(&j->mu);
		if (peer_gone(st->fd)) {
			web_sched_cancel(st->w->sched, j, 1);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
		if (now_ms() > j->deadline_ms + 1000)
			web_sched_cancel(st->w->sched, j, 2); /* ends the job; the error follows */
		if (now_ms() - st->last_write_ms > KEEPALIVE_MS) {
			static const char ka[] = ": keep-alive\n\n";
			size_t n = MIN(max, sizeof ka - 1);
			memcpy(buf, ka, n);
			st->last_write_ms = now_ms();
			return (ssize_t)n;
		}
		pthread_mutex_lock(&j->mu);
	}
}

static void stream_free(void *cls)
{
	stream_t *st = cls;
	pthread_mutex_lock(&st->job->mu);
	int done = st->job->state == JOB_DONE;
	pthread_mutex_unlock(&st->job->mu);
	if (!done) /* the client went away mid-stream */
		web_sched_cancel(st->w->sched, st->job, 1);
	web_job_unref(st->job);
	free(st);
}

/* Tokenizes the request and checks it against the context. Returns 0 or an HTTP status. */
static int build_prompt(web_t *w, eng_t *e, web_req_t *rq, int **ids, int *n_ids, web_err_t *err)
{
	char msg[256] = "";
	int rc;
	const eng_info_t *in = eng_info(e);
	const char *param = rq->kind == WEB_CHAT ? "messages" : "prompt";
	(void)w;
	if (rq->kind == WEB_CHAT) {
		rc = eng_chat_prompt(e, rq->msgs, rq->n_msgs, ids, n_ids, msg, sizeof msg);
	} else if (rq->prompt) {
		rc = eng_tokenize(e, rq->prompt, 1, 0, ids, n_ids, msg, sizeof msg);
	} else {
		for (int i = 0; i < rq->n_prompt_ids; i++)
			if (rq->prompt_ids[i] >= in->n_vocab)
				return web_err_set(err, 400, "invalid_request_error", "prompt",
						   "invalid_value",
						   "'prompt': token id %d is outside the vocabulary "
						   "(%d tokens)",
						   rq->prompt_ids[i], in->n_vocab);
		*ids = rq->prompt_ids;
		*n_ids = rq->n_prompt_ids;
		rq->prompt_ids = NULL;
		rq->n_prompt_ids = 0;
		rc = 0;
	}
	if (rc == SH_EINVAL)
		return web_err_set(err, 400, "invalid_request_error", param, "invalid_value", "%s",
				   msg[0] ? msg : "the prompt could not be built");
	if (rc < 0)
		return web_err_set(err, 500, "server_error", param, NULL, "%s",
				   msg[0] ? msg : sh_strerror(rc));
	if (*n_ids <= 0)
		return web_err_set(err, 400, "invalid_request_error", param, "invalid_value",
				   "the prompt is empty");
	if (*n_ids >= in->n_ctx)
		return web_err_set(err, 400, "invalid_request_error", param,
				   "context_length_exceeded",
				   "the prompt has %d tokens; the context holds %d (including the "
				   "reply)",
				   *n_ids, in->n_ctx);
	return 0;
}

/* Waits for a non-streaming job, watching the client. Returns 1 done, 0 client gone. */
static int wait_job(web_t *w, web_job_t *j, int fd)
{
	pthread_mutex_lock(&j->mu);
	while (j->state != JOB_DONE) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 250 * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) != ETIMEDOUT)
			continue;
		pthread_mutex_unlock(&j->mu);
		if (peer_gone(fd)) {
			web_sched_cancel(w->sched, j, 1);
			return 0;
		}
		if (now_ms() > j->deadline_ms + 1000)
			web_sched_cancel(w->sched, j, 2);
		pthread_mutex_lock(&j->mu);
	}
	pthread_mutex_unlock(&j->mu);
	return 1;
}

static enum MHD_Result do_generate(web_t *w, struct MHD_Connection *c, conn_t *cn)
{
	web_req_t rq;
	web_err_t err;
	int kind = cn->route == R_CHAT ? WEB_CHAT : WEB_COMPLETION;
	if (web_req_parse(&rq, kind, cn->body.p ? cn->body.p : "", cn->body.len, &err)) {
		web_req_clear(&rq);
		return send_error(w, c, &err);
	}
	char reason[200];
	int state = node_state(w, reason, sizeof reason);
	eng_t *e = state == WEB_SERVING ? web_sched_engine_acquire(w->sched) : NULL;
	if (!e) {
		web_req_clear(&rq);
		return send_errorf(w, c, 503, "unavailable", "unavailable", "not serving yet: %s",
				   reason[0] ? reason : "no model loaded");
	}
	int *ids = NULL, n_ids = 0;
	char model[128];
	model_id(w, e, model, sizeof model, NULL);
	int status = build_prompt(w, e, &rq, &ids, &n_ids, &err);
	web_sched_engine_release(w->sched);
	if (status) {
		free(ids);
		web_req_clear(&rq);
		return send_error(w, c, &err);
	}
	web_job_t *j = web_job_new(&rq, ids, n_ids, model, w->timeout_ms);
	if (!j) {
		free(ids);
		web_req_clear(&rq);
		return send_errorf(w, c, 500, "server_error", NULL, "out of memory");
	}
	j->metrics = &w->metrics;
	int rc = web_sched_submit(w->sched, j);
	if (rc) {
		web_job_unref(j);
		if (rc == SH_EBUSY)
			return send_errorf(w, c, 429, "rate_limit_error", "queue_full",
					   "the request queue is full (%d waiting); retry shortly",
					   w->queue_max);
		return send_errorf(w, c, 503, "unavailable", "unavailable",
				   "not serving: the model is being reloaded or the server stops");
	}
	int fd = conn_fd(c);
	if (j->req.stream) {
		stream_t *st = calloc(1, sizeof *st);
		struct MHD_Response *r = NULL;
		if (st) {
			st->w = w;
			st->job = j;
			st->fd = fd;
			st->last_write_ms = now_ms();
			r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK,
							      stream_read, st, stream_free);
		}
		if (!r) {
			web_sched_cancel(w->sched, j, 1);
			web_job_unref(j);
			free(st);
			return MHD_NO;
		}
		add_common_headers(r, "text/event-stream");
		MHD_add_response_header(r, "X-Accel-Buffering", "no");
		enum MHD_Result ok = MHD_queue_response(c, 200, r);
		MHD_destroy_response(r);
		web_metrics_status(&w->metrics, 200);
		return ok;
	}
	if (!wait_job(w, j, fd)) {
		web_metrics_status(&w->metrics, 499);
		web_job_unref(j);
		return MHD_NO;
	}
	enum MHD_Result ok;
	if (j->err.status) {
		ok = send_error(w, c, &j->err);
	} else {
		web_usage_t u = {j->res.prompt_tokens, j->res.completion_tokens};
		char *body = web_json_reply(&j->rid, j->text.p, j->text.len, j->res.finish, &u,
					    j->logprobs);
		j->logprobs = NULL; /* stolen */
		ok = send_body(w, c, 200, body, "application/json", NULL, NULL);
	}
	web_job_unref(j);
	return ok;
}

/* ---- routing -------------------------------------------------------------------------------- */

static int auth_ok(web_t *w, struct MHD_Connection *c)
{
	if (!w->api_key || !w->api_key[0])
		return 1;
	const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
	if (!h || strncasecmp(h, "Bearer ", 7) != 0)
		return 0;
	h += 7;
	while (*h == ' ')
		h++;
	size_t a = strlen(h), b = strlen(w->api_key);
	unsigned diff = (unsigned)(a ^ b);
	for (size_t i = 0; i < a && i < b; i++) /* no early exit: timing says nothing */
		diff |= (unsigned char)(h[i] ^ w->api_key[i]);
	return diff == 0;
}

static enum MHD_Result redirect(web_t *w, struct MHD_Connection *c, const char *url)
{
	char loc[1024];
	pthread_mutex_lock(&w->mu);
	snprintf(loc, sizeof loc, "%s%s", w->leader ? w->leader : "", url);
	pthread_mutex_unlock(&w->mu);
	web_err_t e;
	web_err_set(&e, 307, "redirect", NULL, "not_leader", "this node is a follower; the API is at %s",
		    loc);
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
	}
	if (cn->too_large)
		return send_errorf(w, c, 413, "invalid_request_error", "request_too_large",
				   "the request body is larger than %u bytes", WEB_BODY_MAX);
	return do_generate(w, c, cn);
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
			if (!cn->too_large && cn->body.len + *upload_data_size > WEB_BODY_MAX) {
				cn->too_large = 1;
				web_buf_free(&cn->body);
			}
			if (!cn->too_large &&
			    web_buf_add(&cn->body, upload_data, *upload_data_size) != 0)
				cn->too_large = 1;
			*upload_data_size = 0;
			return MHD_YES;
		}
		return dispatch(w, c, cn);
	}

	if (!strcmp(method, "OPTIONS")) { /* CORS preflight from a browser page elsewhere */
		struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
		if (!r)
			return MHD_NO;
		MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
		MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
		MHD_add_response_header(r, "Access-Control-Allow-Headers",
					"Authorization, Content-Type");
		enum MHD_Result ok = MHD_queue_response(c, 204, r);
		MHD_destroy_response(r);
		return ok;
	}

	const struct route_def *rt = NULL;
	for (size_t i = 0; i < ARRAY_LEN(routes); i++)
		if (!strcmp(url, routes[i].path))
			rt = &routes[i];
	int v1 = !strncmp(url, "/v1/", 4);
	if ((!rt || rt->leader_only) && v1 && is_follower(w))
		return redirect(w, c, url);
	if (!rt)
		return send_errorf(w, c, 404, "not_found_error", "unknown_url",
				   "unknown path %.100s %.200s (see docs/api.md)", method, url);
	int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
	if (strcmp(method, rt->method) != 0 && !(is_get && !strcmp(rt->method, "GET"))) {
		web_err_t e;
		web_err_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
			    "%.20s is not allowed on %s; use %s", method, rt->path, rt->method);
		return send_body(w, c, 405, web_json_error(&e), "application/json", "Allow",
				 rt->method);
	}
	if (rt->auth && !auth_ok(w, c))
		return send_errorf(w, c, 401, "authentication_error", "invalid_api_key",
				   "a valid API key is required: send 'Authorization: Bearer KEY'");
	/* refuse an announced oversized body before reading it */
	const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
	if (cl && strtoull(cl, NULL, 10) > WEB_BODY_MAX)
		return send_errorf(w, c, 413, "invalid_request_error", "request_too_large",
				   "the request body is larger than %u bytes", WEB_BODY_MAX);
	cn = calloc(1, sizeof *cn);
	if (!cn)
		return MHD_NO;
	cn->route = rt->route;
	*con_cls = cn;
	return MHD_YES;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
		      enum MHD_RequestTerminationCode toe)
{
	(void)cls;
	(void)c;
	(void)toe;
	conn_t *cn = *con_cls;
	if (cn) {
		web_buf_free(&cn->body);
		free(cn);
		*con_cls = NULL;
	}
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

int web_new(web_t **out, const web_opts_t *o, eng_t *eng, char *err, size_t errlen)
{
	*out = NULL;
	int rc = SH_ENOMEM;
	struct addrinfo *ai = NULL;
	web_t *w = calloc(1, sizeof *w);
	if (!w)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
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
	if (!w->host)
		goto fail;
	if ((rc = web_sched_new(&w->sched, &w->metrics, w->queue_max)) != 0) {
		sh_fail(err, errlen, rc, "cannot start the scheduler thread");
		goto fail;
	}
	web_sched_set_engine(w->sched, eng);

	char port[16];
	snprintf(port, sizeof port, "%d", o->port < 0 ? 8080 : o->port);
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	int gai = getaddrinfo(w->host, port, &hints, &ai);
	if (gai != 0) {
		rc = sh_fail(err, errlen, SH_EINVAL, "cannot resolve %s: %s", w->host,
			     gai_strerror(gai));
		goto fail;
	}
	unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
			 MHD_USE_AUTO | MHD_USE_ERROR_LOG;
	if (ai->ai_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	w->d = MHD_start_daemon(flags, 0, NULL, NULL, handle, w, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
				MHD_OPTION_CONNECTION_LIMIT, (unsigned)512,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
				MHD_OPTION_NOTIFY_COMPLETED, completed, w,
				MHD_OPTION_EXTERNAL_LOGGER, mhd_log, w,
				MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
	if (!w->d) {
		rc = sh_fail(err, errlen, SH_EIO, "cannot listen on %s:%s: %s", w->host, port,
			     strerror(errno ? errno : EADDRINUSE));
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
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	if (w->sched)
		web_sched_stop(w->sched); /* every job ends, so every handler returns */
	if (w->d)
		MHD_stop_daemon(w->d);
	web_sched_free(w->sched);
	web_metrics_destroy(&w->metrics);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	free(w->host);
	free(w->api_key);
	free(w->model_name);
	free(w->leader);
	free(w);
}

int web_port(const web_t *w) { return w->port; }

void web_set_engine(web_t *w, eng_t *eng) { web_sched_set_engine(w->sched, eng); }

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
}

void web_set_step_metrics(web_t *w, double step_ms, double comm_ms)
{
	pthread_mutex_lock(&w->metrics.mu);
	w->metrics.step_ms = step_ms;
	w->metrics.comm_ms = comm_ms;
	w->metrics.step_external = step_ms >= 0;
	pthread_mutex_unlock(&w->metrics.mu);
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
