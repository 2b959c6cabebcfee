/*
 * history.c: the dashboard's memory. A ring of one sample a second over the last 15 minutes
 * (generated tokens/s, time to first token and between tokens at p50 and p95, queue depth,
 * running requests and active slots, each node's step and communication time), the cluster's
 * events (joins, leaves, re-plans, failovers, rejected requests, model fetches) and the last
 * requests (API, tokens, latency, finish, error; their text only with --dashboard-show-text).
 * Served whole as GET /v1/history and piece by piece in /v1/events.
 *
 * A thread of its own takes a sample each second (web_history_tick), so the series has a point
 * for every second, busy or idle. Latency quantiles come from the metrics' cumulative
 * histograms: a sample's are those of the counts added over its last WEB_HISTORY_QWINDOW
 * seconds (the difference of two cumulative snapshots), so the hot path adds nothing.
 *
 * Invariant: every field is read and written under h->mu (the metrics' and the scheduler's
 * own fields under their mutexes, taken before h->mu and never while it is held: the lock order
 * is scheduler, then history); the rings overwrite only their oldest entry; the sequence
 * numbers of events and requests only grow, so a reader asks for what followed the last one it
 * saw and never misses one that is still kept.
 */
#include "web/web_int.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"

#define NODE_NAME_MAX 72

typedef struct sample {
	int64_t t;                          /* unix ms */
	float tok_s;                        /* tokens sampled per second since the last one */
	float ttft50, ttft95, itl50, itl95; /* ms over the quantile window; NAN = none */
	uint16_t queued, running, active, slots;
	float step[WEB_HISTORY_NODES]; /* ms, mean of the steps in this second; NAN none */
	float comm[WEB_HISTORY_NODES];
} sample_t;

typedef struct hevent {
	uint64_t seq;
	int64_t t;
	char kind[16];
	char text[200];
} hevent_t;

struct web_history {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* wakes the sampler thread when it must stop */
	pthread_t th;
	int started, stop;
	web_metrics_t *m;
	web_sched_t *s;
	int show_text;
	sample_t samples[WEB_HISTORY_SECONDS];
	int n_samples, head; /* head: the next one written */
	/* cumulative TTFT and ITL bucket counts of the last QWINDOW + 1 ticks (a ring) */
	uint64_t q_ttft[WEB_HISTORY_QWINDOW + 1][WEB_HIST_BUCKETS + 1];
	uint64_t q_itl[WEB_HISTORY_QWINDOW + 1][WEB_HIST_BUCKETS + 1];
	int q_n, q_head;
	unsigned long long last_tokens;
	int64_t last_t;
	/* node columns of the step series: 0 is this node */
	char nodes[WEB_HISTORY_NODES][NODE_NAME_MAX];
	int n_nodes;
	double acc_step[WEB_HISTORY_NODES], acc_comm[WEB_HISTORY_NODES];
	int acc_n[WEB_HISTORY_NODES], acc_comm_n[WEB_HISTORY_NODES];
	hevent_t ev[WEB_EVENTS_MAX];
	uint64_t ev_seq; /* of the newest; the ring holds seq - min(seq, MAX) + 1 .. seq */
	web_reqrec_t rq[WEB_REQUESTS_MAX];
	uint64_t rq_seq;
	struct {
		int status, n;
		char code[32];
	} rej[4]; /* refusals since the last sample, by status and code */
	int n_rej, rej_other;
};

static int64_t wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

web_history_t *web_history_new(web_metrics_t *m, web_sched_t *s, const char *self, int show_text)
{
	web_history_t *h = calloc(1, sizeof *h);
	if (!h)
		return NULL;
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, NULL);
	h->m = m;
	h->s = s;
	h->show_text = show_text;
	snprintf(h->nodes[0], NODE_NAME_MAX, "%s", self && self[0] ? self : "self");
	h->n_nodes = 1;
	return h;
}

static void *sampler_main(void *arg)
{
	web_history_t *h = arg;
	pthread_mutex_lock(&h->mu);
	while (!h->stop) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&h->cv, &h->mu, &ts);
		if (h->stop)
			break;
		pthread_mutex_unlock(&h->mu);
		web_history_tick(h, wall_ms());
		pthread_mutex_lock(&h->mu);
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

int web_history_start(web_history_t *h)
{
	if (pthread_create(&h->th, NULL, sampler_main, h) != 0)
		return SH_EIO;
	h->started = 1;
	return 0;
}

void web_history_free(web_history_t *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	h->stop = 1;
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
	if (h->started)
		pthread_join(h->th, NULL);
	pthread_cond_destroy(&h->cv);
	pthread_mutex_destroy(&h->mu);
	free(h);
}

int web_history_show_text(const web_history_t *h)
{
	return h && h->show_text;
}

void web_text_head(char *dst, size_t n, const char *src, size_t len)
{
	if (!src)
		len = 0;
	if (len > n - 1) {
		len = n - 1;
		while (len > 0 && ((unsigned char)src[len] & 0xC0) == 0x80)
			len--; /* do not end inside a UTF-8 sequence */
	}
	for (size_t i = 0; i < len; i++)
		dst[i] = (unsigned char)src[i] < 32 ? ' ' : src[i];
	dst[len] = 0;
}

/* Appends an event, overwriting the oldest when the ring is full (h->mu held). */
static void event_add(web_history_t *h, const char *kind, const char *text)
{
	hevent_t *e = &h->ev[h->ev_seq % WEB_EVENTS_MAX];
	e->seq = ++h->ev_seq;
	e->t = wall_ms();
	web_text_head(e->kind, sizeof e->kind, kind, kind ? strlen(kind) : 0);
	web_text_head(e->text, sizeof e->text, text, text ? strlen(text) : 0);
}

/* ---- samples -------------------------------------------------------------------------------- */

/* p50 and p95 in ms of the counts added between two cumulative snapshots; NAN when none. */
static void window_quantiles(const double *le, const uint64_t *now, const uint64_t *then,
			     float *p50, float *p95)
{
	web_hist_t d = {.le = le};
	for (int i = 0; i <= WEB_HIST_BUCKETS; i++) {
		d.cnt[i] = now[i] - then[i];
		d.count += d.cnt[i];
	}
	*p50 = d.count ? (float)(1000 * web_hist_quantile(&d, 0.5)) : NAN;
	*p95 = d.count ? (float)(1000 * web_hist_quantile(&d, 0.95)) : NAN;
}

/* Summarises the refusals since the last sample as one event (h->mu held). */
static void rejected_event(web_history_t *h)
{
	if (!h->n_rej)
		return;
	char text[200];
	int total = h->rej_other, o;
	for (int i = 0; i < h->n_rej; i++)
		total += h->rej[i].n;
	o = snprintf(text, sizeof text, "%d request%s refused:", total, total == 1 ? "" : "s");
	for (int i = 0; i < h->n_rej && o < (int)sizeof text; i++)
		o += snprintf(text + o, sizeof text - (size_t)o, "%s %d x %d %s", i ? "," : "",
			      h->rej[i].n, h->rej[i].status, h->rej[i].code);
	if (h->rej_other && o < (int)sizeof text)
		snprintf(text + o, sizeof text - (size_t)o, ", %d other", h->rej_other);
	h->n_rej = h->rej_other = 0;
	event_add(h, "rejected", text);
}

void web_history_tick(web_history_t *h, int64_t t_ms)
{
	sample_t x;
	memset(&x, 0, sizeof x);
	x.t = t_ms;
	int q = 0, run = 0;
	if (h->s)
		web_sched_depth(h->s, &q, &run);
	x.queued = (uint16_t)MIN(q, 65535);
	x.running = (uint16_t)MIN(run, 65535);
	uint64_t ttft[WEB_HIST_BUCKETS + 1] = {0}, itl[WEB_HIST_BUCKETS + 1] = {0};
	unsigned long long tok = 0;
	const double *le = NULL;
	if (h->m) {
		web_metrics_t *m = h->m;
		tok = atomic_load(&m->tokens_live);
		pthread_mutex_lock(&m->mu);
		memcpy(ttft, m->ttft.cnt, sizeof ttft);
		memcpy(itl, m->itl.cnt, sizeof itl);
		le = m->ttft.le;
		x.slots = (uint16_t)m->n_slots;
		for (int i = 0; i < m->n_slots; i++)
			x.active += m->slot_state[i] != 0;
		pthread_mutex_unlock(&m->mu);
	}
	pthread_mutex_lock(&h->mu);
	x.tok_s =
	    h->last_t && t_ms > h->last_t && tok >= h->last_tokens
		? (float)((double)(tok - h->last_tokens) * 1000.0 / (double)(t_ms - h->last_t))
		: 0;
	h->last_tokens = tok;
	h->last_t = t_ms;
	/* the quantile window: this tick's counts against those QWINDOW ticks ago */
	memcpy(h->q_ttft[h->q_head], ttft, sizeof ttft);
	memcpy(h->q_itl[h->q_head], itl, sizeof itl);
	int oldest =
	    h->q_n < WEB_HISTORY_QWINDOW + 1 ? 0 : (h->q_head + 1) % (WEB_HISTORY_QWINDOW + 1);
	x.ttft50 = x.ttft95 = x.itl50 = x.itl95 = NAN;
	if (le && h->q_n) {
		window_quantiles(le, ttft, h->q_ttft[oldest], &x.ttft50, &x.ttft95);
		window_quantiles(le, itl, h->q_itl[oldest], &x.itl50, &x.itl95);
	}
	h->q_head = (h->q_head + 1) % (WEB_HISTORY_QWINDOW + 1);
	h->q_n = MIN(h->q_n + 1, WEB_HISTORY_QWINDOW + 1);
	for (int i = 0; i < WEB_HISTORY_NODES; i++) {
		x.step[i] = h->acc_n[i] ? (float)(h->acc_step[i] / h->acc_n[i]) : NAN;
		x.comm[i] = h->acc_comm_n[i] ? (float)(h->acc_comm[i] / h->acc_comm_n[i]) : NAN;
		h->acc_step[i] = h->acc_comm[i] = 0;
		h->acc_n[i] = h->acc_comm_n[i] = 0;
	}
	h->samples[h->head] = x;
	h->head = (h->head + 1) % WEB_HISTORY_SECONDS;
	h->n_samples = MIN(h->n_samples + 1, WEB_HISTORY_SECONDS);
	rejected_event(h);
	pthread_mutex_unlock(&h->mu);
}

/* The column of node name, taking a free one (a column with no figure left in the ring) for a
 * new name; -1 when all are in use (h->mu held). */
static int node_col(web_history_t *h, const char *name)
{
	for (int i = 0; i < h->n_nodes; i++)
		if (!strcmp(h->nodes[i], name))
			return i;
	int col = h->n_nodes < WEB_HISTORY_NODES ? h->n_nodes : -1;
	for (int i = 1; col < 0 && i < WEB_HISTORY_NODES; i++) {
		int used = h->acc_n[i] || h->acc_comm_n[i];
		for (int k = 0; k < h->n_samples && !used; k++)
			used = !isnan(h->samples[k].step[i]) || !isnan(h->samples[k].comm[i]);
		if (!used)
			col = i;
	}
	if (col < 0)
		return -1;
	if (col == h->n_nodes)
		h->n_nodes++;
	snprintf(h->nodes[col], NODE_NAME_MAX, "%s", name);
	return col;
}

static void add_step(web_history_t *h, int col, double step_ms, double comm_ms)
{
	if (col < 0)
		return;
	if (step_ms >= 0 && isfinite(step_ms)) {
		h->acc_step[col] += step_ms;
		h->acc_n[col]++;
	}
	if (comm_ms >= 0 && isfinite(comm_ms)) {
		h->acc_comm[col] += comm_ms;
		h->acc_comm_n[col]++;
	}
}

void web_history_step(web_history_t *h, double step_ms, double comm_ms)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	add_step(h, 0, step_ms, comm_ms);
	pthread_mutex_unlock(&h->mu);
}

void web_history_node_step(web_history_t *h, const char *node, double step_ms, double comm_ms)
{
	if (!h || !node || !node[0])
		return;
	pthread_mutex_lock(&h->mu);
	add_step(h, node_col(h, node), step_ms, comm_ms);
	pthread_mutex_unlock(&h->mu);
}

/* ---- events and requests -------------------------------------------------------------------- */

void web_history_event(web_history_t *h, const char *kind, const char *text)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	event_add(h, kind, text);
	pthread_mutex_unlock(&h->mu);
}

void web_history_rejected(web_history_t *h, int status, const char *code)
{
	if (!h)
		return;
	code = code && code[0] ? code : "-";
	pthread_mutex_lock(&h->mu);
	int i = 0;
	while (i < h->n_rej && (h->rej[i].status != status || strcmp(h->rej[i].code, code)))
		i++;
	if (i == h->n_rej && i < (int)ARRAY_LEN(h->rej)) {
		h->rej[i].status = status;
		h->rej[i].n = 0;
		snprintf(h->rej[i].code, sizeof h->rej[i].code, "%s", code);
		h->n_rej++;
	}
	if (i < h->n_rej)
		h->rej[i].n++;
	else
		h->rej_other++;
	pthread_mutex_unlock(&h->mu);
}

void web_reqrec_error(web_reqrec_t *r, const web_err_t *e)
{
	char t[sizeof e->code + sizeof e->message + 4];
	snprintf(t, sizeof t, "%s%s%s", e->code, e->code[0] ? ": " : "", e->message);
	web_text_head(r->error, sizeof r->error, t, strlen(t));
}

void web_history_request(web_history_t *h, const web_reqrec_t *r)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	web_reqrec_t *d = &h->rq[h->rq_seq % WEB_REQUESTS_MAX];
	*d = *r;
	d->seq = ++h->rq_seq;
	if (!d->t_ms)
		d->t_ms = wall_ms();
	if (!h->show_text)
		d->prompt[0] = d->reply[0] = 0;
	pthread_mutex_unlock(&h->mu);
}

/* ---- JSON ------------------------------------------------------------------------------------ */

static json_t *num_or_null(double v)
{
	return isnan(v) || !isfinite(v) ? json_null() : json_real(v);
}

/* A string from text that may hold a broken UTF-8 sequence (a token's piece). */
static json_t *str_repaired(const char *s)
{
	web_buf_t b = {0};
	json_t *j = NULL;
	if (web_utf8_repair(&b, s, strlen(s)) == 0)
		j = json_string(b.p ? b.p : "");
	web_buf_free(&b);
	return j ? j : json_string("");
}

static json_t *request_json(const web_reqrec_t *r)
{
	json_t *o = json_pack("{s:I, s:I, s:s, s:s, s:i, s:i, s:i, s:o, s:o, s:s, s:s}", "seq",
			      (json_int_t)r->seq, "t", (json_int_t)r->t_ms, "id", r->id, "api",
			      r->api, "status", r->status, "prompt_tokens", r->prompt_tokens,
			      "completion_tokens", r->completion_tokens, "ttft_ms",
			      r->ttft_ms >= 0 ? json_real(r->ttft_ms) : json_null(), "tok_s",
			      r->tok_s >= 0 ? json_real(r->tok_s) : json_null(), "finish",
			      r->finish, "error", r->error);
	if (o && (r->prompt[0] || r->reply[0])) {
		json_object_set_new(o, "prompt", str_repaired(r->prompt));
		json_object_set_new(o, "reply", str_repaired(r->reply));
	}
	return o;
}

json_t *web_history_json(web_history_t *h, int64_t since_ms, uint64_t ev_after, uint64_t rq_after)
{
	json_t *o = json_object(), *t = json_array(), *tok = json_array(), *t50 = json_array(),
	       *t95 = json_array(), *i50 = json_array(), *i95 = json_array(), *qd = json_array(),
	       *rn = json_array(), *act = json_array(), *sl = json_array(), *nodes = json_array(),
	       *evs = json_array(), *rqs = json_array();
	if (!o || !t || !tok || !t50 || !t95 || !i50 || !i95 || !qd || !rn || !act || !sl ||
	    !nodes || !evs || !rqs) {
		json_t *all[] = {o, t, tok, t50, t95, i50, i95, qd, rn, act, sl, nodes, evs, rqs};
		for (size_t i = 0; i < ARRAY_LEN(all); i++)
			json_decref(all[i]);
		return NULL;
	}
	pthread_mutex_lock(&h->mu);
	int first = (h->head - h->n_samples + WEB_HISTORY_SECONDS) % WEB_HISTORY_SECONDS;
	int start = h->n_samples; /* index (0 = oldest) of the first sample after since_ms */
	for (int k = 0; k < h->n_samples; k++)
		if (h->samples[(first + k) % WEB_HISTORY_SECONDS].t > since_ms) {
			start = k;
			break;
		}
	json_t *step[WEB_HISTORY_NODES] = {0}, *comm[WEB_HISTORY_NODES] = {0};
	int any[WEB_HISTORY_NODES] = {0};
	for (int c = 0; c < h->n_nodes; c++) {
		step[c] = json_array();
		comm[c] = json_array();
	}
	for (int k = start; k < h->n_samples; k++) {
		const sample_t *x = &h->samples[(first + k) % WEB_HISTORY_SECONDS];
		json_array_append_new(t, json_integer((json_int_t)x->t));
		json_array_append_new(tok, json_real(x->tok_s));
		json_array_append_new(t50, num_or_null(x->ttft50));
		json_array_append_new(t95, num_or_null(x->ttft95));
		json_array_append_new(i50, num_or_null(x->itl50));
		json_array_append_new(i95, num_or_null(x->itl95));
		json_array_append_new(qd, json_integer(x->queued));
		json_array_append_new(rn, json_integer(x->running));
		json_array_append_new(act, json_integer(x->active));
		json_array_append_new(sl, json_integer(x->slots));
		for (int c = 0; c < h->n_nodes; c++) {
			any[c] |= !isnan(x->step[c]) || !isnan(x->comm[c]);
			json_array_append_new(step[c], num_or_null(x->step[c]));
			json_array_append_new(comm[c], num_or_null(x->comm[c]));
		}
	}
	/* node 0 always (this node), others only while they have a figure in the range */
	for (int c = 0; c < h->n_nodes; c++) {
		if (c == 0 || any[c])
			json_array_append_new(nodes,
					      json_pack("{s:s, s:o, s:o}", "node", h->nodes[c],
							"step_ms", step[c], "comm_ms", comm[c]));
		else {
			json_decref(step[c]);
			json_decref(comm[c]);
		}
	}
	uint64_t lo = h->ev_seq > WEB_EVENTS_MAX ? h->ev_seq - WEB_EVENTS_MAX : 0;
	for (uint64_t s = MAX(lo, ev_after) + 1; s <= h->ev_seq; s++) {
		const hevent_t *e = &h->ev[(s - 1) % WEB_EVENTS_MAX];
		json_array_append_new(evs, json_pack("{s:I, s:I, s:s, s:s}", "seq",
						     (json_int_t)e->seq, "t", (json_int_t)e->t,
						     "kind", e->kind, "text", e->text));
	}
	lo = h->rq_seq > WEB_REQUESTS_MAX ? h->rq_seq - WEB_REQUESTS_MAX : 0;
	for (uint64_t s = MAX(lo, rq_after) + 1; s <= h->rq_seq; s++)
		json_array_append_new(rqs, request_json(&h->rq[(s - 1) % WEB_REQUESTS_MAX]));
	json_object_set_new(o, "interval_ms", json_integer(1000));
	json_object_set_new(o, "window_s", json_integer(WEB_HISTORY_SECONDS));
	json_object_set_new(o, "now", json_integer((json_int_t)wall_ms()));
	json_object_set_new(o, "self", json_string(h->nodes[0]));
	json_object_set_new(o, "event_seq", json_integer((json_int_t)h->ev_seq));
	json_object_set_new(o, "request_seq", json_integer((json_int_t)h->rq_seq));
	json_object_set_new(o, "show_text", json_boolean(h->show_text));
	pthread_mutex_unlock(&h->mu);
	json_object_set_new(o, "t", t);
	json_object_set_new(o, "tok_s", tok);
	json_object_set_new(o, "ttft_p50_ms", t50);
	json_object_set_new(o, "ttft_p95_ms", t95);
	json_object_set_new(o, "itl_p50_ms", i50);
	json_object_set_new(o, "itl_p95_ms", i95);
	json_object_set_new(o, "queued", qd);
	json_object_set_new(o, "running", rn);
	json_object_set_new(o, "active_slots", act);
	json_object_set_new(o, "slots", sl);
	json_object_set_new(o, "nodes", nodes);
	json_object_set_new(o, "events", evs);
	json_object_set_new(o, "requests", rqs);
	return o;
}
