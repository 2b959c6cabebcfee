/*
 * generate.c: one generation or embedding request, from its body to its reply, whatever API it
 * came through: the endpoint's parser fills a web_req_t, the prompt is built and checked against
 * the context (the chat template, a completion prompt, or the endpoint's own step), a job goes
 * into the scheduler's queue, and the connection either streams what the job appends to its
 * output (SSE or NDJSON) or parks until the job ends and sends the whole reply.
 *
 * libmicrohttpd's event-loop threads never block here: a whole reply parks its connection until
 * the job's wake-up resumes it (web_generate_reply then runs), a stream's reader parks it between
 * tokens (guard.c).
 *
 * Invariant: every request that reaches the queue holds a job reference until its reply ends
 * (the stream's free callback, or server.c's completion callback for a whole reply).
 */
#include "web/web_int.h"

#include <jansson.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

#define SSE_BLOCK    16384
#define KEEPALIVE_MS 15000

/* ---- OpenAI's chat and completions ----------------------------------------------------------- */

static int parse_chat(web_t *w, web_req_t *r, const char *body, size_t len, web_err_t *e)
{
	(void)w;
	return web_req_parse(r, WEB_CHAT, body, len, e);
}

static int parse_completion(web_t *w, web_req_t *r, const char *body, size_t len, web_err_t *e)
{
	(void)w;
	return web_req_parse(r, WEB_COMPLETION, body, len, e);
}

const web_endpoint_t web_ep_chat = {WEB_CHAT, NULL, parse_chat, NULL};
const web_endpoint_t web_ep_completions = {WEB_COMPLETION, NULL, parse_completion, NULL};

/* ---- streaming ------------------------------------------------------------------------------ */

typedef struct stream {
	web_t *w;
	web_job_t *job;
	web_park_t park; /* parked while the job has nothing new; its wake hook resumes it */
	int64_t last_write_ms;
} stream_t;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	stream_t *st = cls;
	web_job_t *j = st->job;
	int64_t now = now_ms();
	pthread_mutex_lock(&j->mu);
	if (j->out.len > 0) {
		size_t n = MIN(max, j->out.len);
		memcpy(buf, j->out.p, n);
		memmove(j->out.p, j->out.p + n, j->out.len - n);
		j->out.len -= n;
		j->out.p[j->out.len] = 0;
		pthread_mutex_unlock(&j->mu);
		st->last_write_ms = now;
		atomic_store(&st->park.wake_at, now + KEEPALIVE_MS);
		return (ssize_t)n;
	}
	if (j->state == JOB_DONE) {
		pthread_mutex_unlock(&j->mu);
		web_job_ended(st->w, j);
		return MHD_CONTENT_READER_END_OF_STREAM;
	}
	/* SSE comments keep proxies from closing an idle stream; NDJSON has no comments */
	if ((!j->proto || j->proto->keepalive) && now - st->last_write_ms >= KEEPALIVE_MS) {
		pthread_mutex_unlock(&j->mu);
		static const char ka[] = ": keep-alive\n\n";
		size_t n = MIN(max, sizeof ka - 1);
		memcpy(buf, ka, n);
		st->last_write_ms = now;
		atomic_store(&st->park.wake_at, now + KEEPALIVE_MS);
		return (ssize_t)n;
	}
	/* nothing yet: park (under j->mu, so the scheduler's next wake-up finds it suspended) */
	int parked = web_park_suspend(web_guard_of(st->w), &st->park);
	pthread_mutex_unlock(&j->mu);
	return parked ? 0 : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls)
{
	stream_t *st = cls;
	pthread_mutex_lock(&st->job->mu);
	int done = st->job->state == JOB_DONE;
	st->job->wake = NULL;
	pthread_mutex_unlock(&st->job->mu);
	web_park_detach(web_guard_of(st->w), &st->park);
	if (!done) /* the client went away mid-stream */
		web_sched_cancel(web_sched_of(st->w), st->job, 1);
	web_job_unref(st->job);
	free(st);
}

/* ---- the prompt ----------------------------------------------------------------------------- */

/* The chat template or the completion prompt, tokenized. Returns 0 or an HTTP status. */
static int default_prompt(eng_t *e, web_req_t *rq, int **ids, int *n_ids, web_err_t *err)
{
	char msg[256] = "";
	int rc;
	const eng_info_t *in = eng_info(e);
	const char *param = rq->kind == WEB_CHAT ? "messages" : "prompt";
	if (rq->kind == WEB_CHAT) {
		rc = web_chat_prompt(e, rq, ids, n_ids, msg, sizeof msg, err); /* tools.c */
		if (rc >= 400)
			return rc;
	} else if (rq->prompt) {
		rc = eng_tokenize(e, rq->prompt, 1, 0, ids, n_ids, msg, sizeof msg);
	} else {
		for (int i = 0; i < rq->n_prompt_ids; i++)
			if (rq->prompt_ids[i] >= in->n_vocab)
				return web_err_set(
				    err, 400, "invalid_request_error", "prompt", "invalid_value",
				    "'prompt': token id %d is outside the vocabulary "
				    "(%d tokens)",
				    rq->prompt_ids[i], in->n_vocab);
		*ids = rq->prompt_ids;
		*n_ids = rq->n_prompt_ids;
		rq->prompt_ids = NULL;
		rq->n_prompt_ids = 0;
		rc = 0;
	}
	if (rc == SH_EINVAL || rc == SH_EUNSUPP)
		return web_err_set(err, 400, "invalid_request_error", param, "invalid_value", "%s",
				   msg[0] ? msg : "the prompt could not be built");
	if (rc < 0)
		return web_err_set(err, 500, "server_error", param, NULL, "%s",
				   msg[0] ? msg : sh_strerror(rc));
	return 0;
}

/* The prompt for rq, checked against the context. Returns 0 or an HTTP status. */
static int build_prompt(const web_endpoint_t *ep, eng_t *e, web_req_t *rq, int **ids, int *n_ids,
			web_err_t *err)
{
	int rc = ep->prompt ? ep->prompt(e, rq, ids, n_ids, err)
			    : default_prompt(e, rq, ids, n_ids, err);
	if (rc || rq->kind == WEB_EMBED)
		return rc;
	rq->think_open = rq->kind == WEB_CHAT && eng_info(e)->think_open;
	const char *param = rq->kind == WEB_CHAT ? "messages" : "prompt";
	int n_ctx = eng_info(e)->n_ctx;
	if (rq->max_ctx > 0 && rq->max_ctx < n_ctx)
		n_ctx = rq->max_ctx;
	if (*n_ids <= 0)
		return web_err_set(err, 400, "invalid_request_error", param, "invalid_value",
				   "the prompt is empty");
	if (*n_ids >= n_ctx)
		return web_err_set(err, 400, "invalid_request_error", param,
				   "context_length_exceeded",
				   "the prompt has %d tokens; the context holds %d (including the "
				   "reply)",
				   *n_ids, n_ctx);
	if (rq->max_ctx > 0) { /* a smaller context asked for: the reply stops at its end */
		int room = n_ctx - *n_ids;
		if (!rq->samp.max_tokens || rq->samp.max_tokens > room)
			rq->samp.max_tokens = room;
	}
	return 0;
}

/* ---- the reply ------------------------------------------------------------------------------ */

int web_generate_reply(web_t *w, struct MHD_Connection *c, web_conn_t *cn)
{
	web_job_t *j = cn->job;
	const web_proto_t *proto = j->proto;
	pthread_mutex_lock(&j->mu);
	if (j->state != JOB_DONE) {
		int parked = web_park_suspend(web_guard_of(w), &cn->park);
		pthread_mutex_unlock(&j->mu);
		if (parked)
			return MHD_YES;
		web_err_t e;
		web_err_set(&e, 503, "unavailable", NULL, "unavailable",
			    "the server is stopping; retry");
		return web_send_error(w, c, proto, &e);
	}
	pthread_mutex_unlock(&j->mu);
	web_job_ended(w, j);
	if (j->err.status)
		return web_send_error(w, c, proto, &j->err);
	char *body;
	if (proto) {
		body = proto->reply(j);
	} else {
		web_usage_t u = {j->res.prompt_tokens, j->res.completion_tokens};
		body =
		    web_json_reply(&j->rid, j->text.p, j->text.len, j->res.finish, &u, j->logprobs);
		j->logprobs = NULL; /* stolen */
	}
	return web_send(w, c, 200, body, "application/json", NULL, NULL);
}

/* The sequences of an embedding job: one per input, and room for their vectors. */
static int embed_seqs(web_job_t *j, int dim)
{
	j->n_seq = j->req.n_inputs;
	j->dim = dim;
	j->vecs = calloc((size_t)MAX(j->n_seq, 1) * (size_t)dim, sizeof *j->vecs);
	j->seq_res = calloc((size_t)MAX(j->n_seq, 1), sizeof *j->seq_res);
	return j->vecs && j->seq_res ? 0 : SH_ENOMEM;
}

int web_generate_answer(web_t *w, struct MHD_Connection *c, web_conn_t *cn,
			const web_endpoint_t *ep)
{
	web_req_t rq;
	web_err_t err;
	memset(&err, 0, sizeof err);
	/* a parsed tree is bounded by the pre-scan; at most WEB_PARSE_CONCURRENCY exist at once */
	atomic_int *parsing = web_parsing_of(w);
	if (atomic_fetch_add(parsing, 1) >= WEB_PARSE_CONCURRENCY) {
		atomic_fetch_sub(parsing, 1);
		return web_park_retry(w, c, cn);
	}
	memset(&rq, 0, sizeof rq);
	int prc = ep->parse(w, &rq, cn->body.p ? cn->body.p : "", cn->body.len, &err);
	atomic_fetch_sub(parsing, 1);
	web_buf_free(&cn->body);
	int api = rq.api; /* set by the parser even when it fails */
	if (prc) {
		web_req_clear(&rq);
		return web_refuse(w, c, ep->proto, api, &err);
	}
	eng_t *e = web_engine_get(w, &err);
	if (!e) {
		web_req_clear(&rq);
		return web_refuse(w, c, ep->proto, api, &err);
	}
	int *ids = NULL, n_ids = 0;
	char model[128];
	web_model_id(w, e, model, sizeof model);
	int dim = eng_info(e)->dim;
	int status = rq.no_work ? 0 : build_prompt(ep, e, &rq, &ids, &n_ids, &err);
	web_sched_engine_release(web_sched_of(w));
	if (status) {
		free(ids);
		web_req_clear(&rq);
		return web_refuse(w, c, ep->proto, api, &err);
	}
	int nothing = rq.no_work; /* e.g. Ollama's empty input or model load: a reply at once */
	web_job_t *j = web_job_new(&rq, ids, n_ids, model, web_timeout_of(w));
	if (!j || (j->req.kind == WEB_EMBED && embed_seqs(j, dim))) {
		if (!j)
			free(ids);
		web_req_clear(&rq);
		web_job_unref(j);
		web_err_set(&err, 500, "server_error", NULL, NULL, "out of memory");
		return web_send_error(w, c, ep->proto, &err);
	}
	j->metrics = web_metrics_of(w);
	j->proto = ep->proto;
	j->api = web_api_name(api); /* the dashboard's request table */
	int rc = nothing ? 0 : web_sched_submit(web_sched_of(w), j);
	if (nothing) {
		j->state = JOB_DONE;
		j->res.finish = ENG_FINISH_STOP;
	}
	if (rc) {
		web_job_unref(j);
		if (rc == SH_EBUSY)
			web_err_set(&err, 429, "rate_limit_error", NULL, "queue_full",
				    "the request queue is full; retry shortly");
		else
			web_err_set(&err, 503, "unavailable", NULL, "unavailable",
				    "not serving: the model is being reloaded or the server stops");
		return web_refuse(w, c, ep->proto, api, &err);
	}
	int fd = web_conn_fd(c);
	if (j->req.stream) {
		stream_t *st = calloc(1, sizeof *st);
		struct MHD_Response *r = NULL;
		if (st) {
			st->w = w;
			st->job = j;
			st->park.c = c;
			st->park.fd = fd;
			st->park.job = j;
			st->last_write_ms = now_ms();
			r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK,
							      stream_read, st, stream_free);
		}
		if (!r) {
			web_sched_cancel(web_sched_of(w), j, 1);
			web_job_unref(j);
			free(st);
			return MHD_NO;
		}
		web_park_attach(web_guard_of(w), &st->park);
		pthread_mutex_lock(&j->mu);
		j->wake = web_park_wake;
		j->wake_ud = &st->park;
		pthread_mutex_unlock(&j->mu);
		MHD_add_response_header(r, "Content-Type",
					j->proto ? j->proto->stream_ctype : "text/event-stream");
		MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
		MHD_add_response_header(r, "Cache-Control", "no-store");
		MHD_add_response_header(r, "X-Accel-Buffering", "no");
		enum MHD_Result ok = MHD_queue_response(c, 200, r);
		MHD_destroy_response(r);
		web_metrics_status(web_metrics_of(w), 200);
		return ok;
	}
	cn->job = j; /* the request's reference, dropped in server.c's completed() */
	if (!cn->parked) {
		cn->park.c = c;
		cn->park.fd = fd;
		web_park_attach(web_guard_of(w), &cn->park);
		cn->parked = 1;
	}
	atomic_store(&cn->park.wake_at, 0);
	cn->park.job = j;
	pthread_mutex_lock(&j->mu);
	j->wake = web_park_wake;
	j->wake_ud = &cn->park;
	pthread_mutex_unlock(&j->mu);
	return web_generate_reply(w, c, cn);
}
