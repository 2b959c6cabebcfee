/*
 * test_web_history.c: the dashboard's memory (web/history.c): the one-a-second samples and their
 * ring, latency quantiles over the window, per-node step columns, the event and request rings
 * with their sequence numbers, refusals summed up as events, text kept only when asked; then
 * the scheduler filling the request table from real requests (stories260K), and the server's
 * GET /v1/history and the history inside /v1/events over a loopback socket.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "web/web.h"
#include "web/web_int.h"
#include "web_jobs.h"

static json_t *hist_json(web_history_t *h, int64_t since, uint64_t ev, uint64_t rq)
{
	json_t *j = web_history_json(h, since, ev, rq);
	CHECK(j != NULL);
	return j;
}

static size_t arr_len(json_t *o, const char *k)
{
	return json_array_size(json_object_get(o, k));
}

static double arr_num(json_t *o, const char *k, size_t i)
{
	json_t *v = json_array_get(json_object_get(o, k), i);
	return json_is_number(v) ? json_number_value(v) : NAN;
}

static int arr_null(json_t *o, const char *k, size_t i)
{
	return json_is_null(json_array_get(json_object_get(o, k), i));
}

/* The node entry called name in o's "nodes", or NULL. */
static json_t *node_entry(json_t *o, const char *name)
{
	size_t i;
	json_t *n;
	json_array_foreach(json_object_get(o, "nodes"), i, n)
	{
		if (!strcmp(json_string_value(json_object_get(n, "node")), name))
			return n;
	}
	return NULL;
}

TEST(samples)
{
	web_metrics_t m;
	web_metrics_init(&m);
	web_history_t *h = web_history_new(&m, NULL, "node-a", 0);
	CHECK(h != NULL);
	if (!h)
		return;
	web_history_tick(h, 1000);
	atomic_fetch_add(&m.tokens_live, 50);
	pthread_mutex_lock(&m.mu);
	web_hist_add(&m.ttft, 0.2);
	web_hist_add(&m.itl, 0.02);
	web_hist_add(&m.itl, 0.02);
	m.n_slots = 4;
	m.slot_state[1] = 2;
	pthread_mutex_unlock(&m.mu);
	web_history_step(h, 10, 2);
	web_history_step(h, 20, -1);
	web_history_node_step(h, "node-b", 30, 5);
	web_history_tick(h, 2000);
	web_history_tick(h, 3000); /* nothing happened in this second */

	json_t *j = hist_json(h, 0, 0, 0);
	CHECK_EQ_INT((int)arr_len(j, "t"), 3);
	CHECK_EQ_STR(json_string_value(json_object_get(j, "self")), "node-a");
	CHECK_NEAR(arr_num(j, "t", 1), 2000, 0);
	CHECK_NEAR(arr_num(j, "tok_s", 1), 50, 1e-3); /* 50 tokens in one second */
	CHECK_NEAR(arr_num(j, "tok_s", 2), 0, 0);
	CHECK(arr_null(j, "ttft_p50_ms", 0)); /* nothing yet: null, not 0 */
	/* 0.2 s falls in the (0.1, 0.25] bucket; quantiles interpolate inside it */
	CHECK(arr_num(j, "ttft_p50_ms", 1) > 100 && arr_num(j, "ttft_p50_ms", 1) <= 250);
	CHECK(arr_num(j, "itl_p95_ms", 1) > 10 && arr_num(j, "itl_p95_ms", 1) <= 25);
	/* the quantile window still covers that second one second later */
	CHECK(!arr_null(j, "ttft_p50_ms", 2));
	CHECK_NEAR(arr_num(j, "active_slots", 1), 1, 0);
	CHECK_NEAR(arr_num(j, "slots", 1), 4, 0);
	json_t *a = node_entry(j, "node-a"), *b = node_entry(j, "node-b");
	CHECK(a && b);
	if (a && b) {
		CHECK_NEAR(arr_num(a, "step_ms", 1), 15, 1e-3); /* mean of the second's steps */
		CHECK_NEAR(arr_num(a, "comm_ms", 1), 2, 1e-3);  /* only the known one */
		CHECK(arr_null(a, "step_ms", 2));               /* no step in that second */
		CHECK_NEAR(arr_num(b, "step_ms", 1), 30, 1e-3);
	}
	json_decref(j);

	/* only what came after since */
	j = hist_json(h, 2000, 0, 0);
	CHECK_EQ_INT((int)arr_len(j, "t"), 1);
	CHECK_NEAR(arr_num(j, "t", 0), 3000, 0);
	CHECK(node_entry(j, "node-b") == NULL); /* no figure of it in that range */
	json_decref(j);

	/* the ring keeps the last WEB_HISTORY_SECONDS; old quantiles leave the window */
	for (int k = 0; k < WEB_HISTORY_SECONDS + 10; k++)
		web_history_tick(h, 4000 + 1000 * k);
	j = hist_json(h, 0, 0, 0);
	CHECK_EQ_INT((int)arr_len(j, "t"), WEB_HISTORY_SECONDS);
	CHECK_NEAR(arr_num(j, "t", 0), 4000 + 1000.0 * 10, 0);
	CHECK(arr_null(j, "ttft_p50_ms", WEB_HISTORY_SECONDS - 1));
	json_decref(j);

	/* node columns: WEB_HISTORY_NODES at most; node-b's figures have left the ring, so its
	 * column is free again: n0..n5 fill the six never used, n6 takes node-b's, n7 finds none */
	char name[32];
	for (int i = 0; i < WEB_HISTORY_NODES + 1; i++) {
		snprintf(name, sizeof name, "n%d", i);
		web_history_node_step(h, name, i, -1);
	}
	web_history_tick(h, 1000000);
	j = hist_json(h, 0, 0, 0);
	snprintf(name, sizeof name, "n%d", WEB_HISTORY_NODES - 2);
	CHECK(node_entry(j, name) != NULL);
	snprintf(name, sizeof name, "n%d", WEB_HISTORY_NODES - 1);
	CHECK(node_entry(j, name) == NULL);
	json_decref(j);
	for (int k = 1; k <= WEB_HISTORY_SECONDS; k++)
		web_history_tick(h, 1000000 + 1000 * k);
	web_history_node_step(h, "late", 7, 1);
	web_history_tick(h, 3000000);
	j = hist_json(h, 2990000, 0, 0);
	json_t *late = node_entry(j, "late");
	CHECK(late != NULL);
	if (late)
		CHECK_NEAR(arr_num(late, "step_ms", 0), 7, 1e-3);
	json_decref(j);
	web_history_free(h);
	web_metrics_destroy(&m);
}

TEST(events_and_requests)
{
	web_history_t *h = web_history_new(NULL, NULL, NULL, 0);
	CHECK(h != NULL);
	if (!h)
		return;
	char text[64];
	for (int i = 1; i <= WEB_EVENTS_MAX + 50; i++) {
		snprintf(text, sizeof text, "event %d\nsecond line", i);
		web_history_event(h, i % 2 ? "join" : "leave", text);
	}
	json_t *j = hist_json(h, 0, 0, 0);
	json_t *ev = json_object_get(j, "events");
	CHECK_EQ_INT((int)json_array_size(ev), WEB_EVENTS_MAX); /* the oldest were overwritten */
	CHECK_NEAR(json_number_value(json_object_get(json_array_get(ev, 0), "seq")), 51, 0);
	CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(ev, 0), "text")),
		     "event 51 second line"); /* one line */
	CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(ev, 0), "kind")), "join");
	CHECK_NEAR(json_number_value(json_object_get(j, "event_seq")), WEB_EVENTS_MAX + 50, 0);
	CHECK_EQ_STR(json_string_value(json_object_get(j, "self")), "self");
	json_decref(j);
	j = hist_json(h, 0, WEB_EVENTS_MAX + 40, 0); /* only what a reader has not seen */
	CHECK_EQ_INT((int)arr_len(j, "events"), 10);
	json_decref(j);

	/* refusals become one event per sample, summed by status and code */
	for (int i = 0; i < 3; i++)
		web_history_rejected(h, 429, "queue_full");
	web_history_rejected(h, 503, "unavailable");
	web_history_tick(h, 5000);
	web_history_tick(h, 6000); /* none since: no event */
	j = hist_json(h, 0, WEB_EVENTS_MAX + 50, 0);
	CHECK_EQ_INT((int)arr_len(j, "events"), 1);
	json_t *r = json_array_get(json_object_get(j, "events"), 0);
	CHECK_EQ_STR(json_string_value(json_object_get(r, "kind")), "rejected");
	CHECK_EQ_STR(json_string_value(json_object_get(r, "text")),
		     "4 requests refused: 3 x 429 queue_full, 1 x 503 unavailable");
	json_decref(j);

	/* requests: text is dropped unless show_text */
	web_reqrec_t q;
	memset(&q, 0, sizeof q);
	snprintf(q.id, sizeof q.id, "chatcmpl-1");
	snprintf(q.api, sizeof q.api, "chat");
	q.status = 200;
	q.prompt_tokens = 5;
	q.completion_tokens = 7;
	q.ttft_ms = 12.5;
	q.tok_s = -1;
	snprintf(q.finish, sizeof q.finish, "stop");
	snprintf(q.prompt, sizeof q.prompt, "secret prompt");
	snprintf(q.reply, sizeof q.reply, "secret reply");
	for (int i = 0; i < WEB_REQUESTS_MAX + 5; i++)
		web_history_request(h, &q);
	j = hist_json(h, 0, 0, 0);
	json_t *rq = json_object_get(j, "requests");
	CHECK_EQ_INT((int)json_array_size(rq), WEB_REQUESTS_MAX);
	json_t *r0 = json_array_get(rq, 0);
	CHECK_NEAR(json_number_value(json_object_get(r0, "seq")), 6, 0);
	CHECK_EQ_STR(json_string_value(json_object_get(r0, "api")), "chat");
	CHECK_NEAR(json_number_value(json_object_get(r0, "ttft_ms")), 12.5, 1e-9);
	CHECK(json_is_null(json_object_get(r0, "tok_s")));
	CHECK(json_object_get(r0, "prompt") == NULL && json_object_get(r0, "reply") == NULL);
	char *dump = json_dumps(j, JSON_COMPACT);
	CHECK(dump && !strstr(dump, "secret"));
	free(dump);
	json_decref(j);
	web_history_free(h);

	h = web_history_new(NULL, NULL, "x", 1);
	if (!h)
		return;
	CHECK(web_history_show_text(h));
	/* a reply cut inside a UTF-8 sequence (a token's piece) comes out repaired */
	web_text_head(q.reply, sizeof q.reply, "caf\xc3", 4);
	web_history_request(h, &q);
	j = hist_json(h, 0, 0, 0);
	r0 = json_array_get(json_object_get(j, "requests"), 0);
	CHECK_EQ_STR(json_string_value(json_object_get(r0, "prompt")), "secret prompt");
	CHECK(json_string_value(json_object_get(r0, "reply")) &&
	      !strncmp(json_string_value(json_object_get(r0, "reply")), "caf", 3));
	json_decref(j);
	/* cut at a character boundary: "é" (2 bytes) does not fit in the last byte */
	char small[5];
	web_text_head(small, sizeof small, "abc\xc3\xa9", 5);
	CHECK_EQ_STR(small, "abc");
	web_history_free(h);
	web_history_free(NULL);
}

/* ---- the scheduler records what ran (stories260K) ------------------------------------------ */

static web_job_t *job(eng_t *e, const char *body, int kind, int max_tokens)
{
	web_req_t r;
	web_err_t er;
	if (web_req_parse(&r, kind, body, strlen(body), &er) != 0)
		return NULL;
	r.samp.max_tokens = max_tokens;
	int *ids = NULL, n = 0;
	char msg[256];
	if (kind == WEB_CHAT ? web_chat_prompt(e, &r, &ids, &n, msg, sizeof msg, &er) != 0
			     : eng_tokenize(e, r.prompt, 1, 0, &ids, &n, NULL, 0) != 0) {
		web_req_clear(&r);
		return NULL;
	}
	return web_job_new(&r, ids, n, "m", 60000);
}

TEST(sched_records)
{
	char path[512], err[256];
	snprintf(path, sizeof path, "%s/models/stories260K.gguf", harness_shared());
	if (access(path, R_OK) != 0)
		SKIP("stories260K.gguf not found");
	eng_opts_t eo = {.model_path = path, .threads = 1, .parallel = 2};
	eng_t *e = NULL;
	CHECK_EQ_INT(eng_open(&e, &eo, err, sizeof err), 0);
	if (!e)
		return;
	web_metrics_t m;
	web_metrics_init(&m);
	web_sched_t *s = NULL;
	CHECK_EQ_INT(web_sched_new(&s, &m, 4, 0, NULL, NULL), 0);
	web_history_t *h = web_history_new(&m, s, "me", 1);
	web_sched_set_history(s, h);
	web_sched_set_engine(s, e);
	web_job_t *a = job(e, "{\"prompt\":\"Once upon\",\"temperature\":0}", WEB_COMPLETION, 8);
	web_job_t *b = job(e, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi there\"}]}",
			   WEB_CHAT, 100000);
	CHECK(a && b);
	if (!a || !b)
		return;
	b->api = "messages"; /* another API's handler names itself */
	CHECK_EQ_INT(web_sched_submit(s, a), 0);
	CHECK_EQ_INT(web_sched_submit(s, b), 0);
	job_wait(a);
	web_sched_cancel(s, b, 1); /* its client went away */
	job_wait(b);
	/* the row is written just after the job ends (its waiter may run first) */
	json_t *j = NULL;
	for (int k = 0; k < 5000; k++) {
		json_decref(j);
		j = hist_json(h, 0, 0, 0);
		if (json_integer_value(json_object_get(j, "request_seq")) >= 2)
			break;
		usleep(1000);
	}
	json_decref(j);
	web_history_tick(h, 1000);
	j = hist_json(h, 0, 0, 0);
	json_t *rq = json_object_get(j, "requests");
	CHECK_EQ_INT((int)json_array_size(rq), 2);
	if (json_array_size(rq) != 2) {
		char *d = json_dumps(rq, 0);
		fprintf(stderr, "%s\n", d);
		free(d);
	}
	json_t *ra = json_array_get(rq, 0), *rb = json_array_get(rq, 1);
	if (!ra || !rb)
		return;
	CHECK_EQ_STR(json_string_value(json_object_get(ra, "api")), "completions");
	CHECK_EQ_STR(json_string_value(json_object_get(ra, "id")), a->rid.id);
	CHECK_NEAR(json_number_value(json_object_get(ra, "status")), 200, 0);
	CHECK_NEAR(json_number_value(json_object_get(ra, "completion_tokens")), 8, 0);
	CHECK(json_number_value(json_object_get(ra, "prompt_tokens")) > 0);
	CHECK(json_number_value(json_object_get(ra, "ttft_ms")) > 0);
	CHECK(json_number_value(json_object_get(ra, "tok_s")) > 0);
	CHECK_EQ_STR(json_string_value(json_object_get(ra, "finish")), "length");
	CHECK_EQ_STR(json_string_value(json_object_get(ra, "prompt")), "Once upon");
	CHECK(strlen(json_string_value(json_object_get(ra, "reply"))) > 0);
	CHECK_EQ_STR(json_string_value(json_object_get(rb, "api")), "messages");
	CHECK_NEAR(json_number_value(json_object_get(rb, "status")), 499, 0);
	CHECK(strstr(json_string_value(json_object_get(rb, "error")), "client_closed") != NULL);
	CHECK_EQ_STR(json_string_value(json_object_get(rb, "prompt")), "Hi there");
	/* the scheduler timed its steps: this node's column has a step time */
	json_t *me = node_entry(j, "me");
	CHECK(me && !arr_null(me, "step_ms", 0) && arr_num(me, "step_ms", 0) > 0);
	CHECK(me && arr_null(me, "comm_ms", 0)); /* one node: no communication */
	json_decref(j);
	web_sched_free(s);
	web_history_free(h);
	web_job_unref(a);
	web_job_unref(b);
	web_metrics_destroy(&m);
	eng_free(e);
}

/* ---- the server ------------------------------------------------------------------------------ */

/* Sends req to 127.0.0.1:port and reads up to len - 1 bytes, until the server closes or
 * timeout_ms have passed in all (a stream never closes). */
static int http_raw(int port, const char *req, char *resp, size_t len, int timeout_ms)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		close(fd);
		return -1;
	}
	if (write(fd, req, strlen(req)) < 0) {
		close(fd);
		return -1;
	}
	size_t off = 0;
	ssize_t n;
	int64_t end = now_ms() + timeout_ms;
	while (off + 1 < len && now_ms() < end && (n = read(fd, resp + off, len - 1 - off)) > 0)
		off += (size_t)n;
	resp[off] = 0;
	close(fd);
	int status = 0;
	sscanf(resp, "HTTP/1.%*d %d", &status);
	return status;
}

TEST(server_history)
{
	web_opts_t o;
	web_opts_default(&o);
	o.port = 0;
	o.api_key = "k";
	o.node_id = "node-x";
	web_t *w = NULL;
	char err[256];
	static char resp[1 << 18];
	CHECK_EQ_INT(web_new(&w, &o, NULL, err, sizeof err), 0);
	if (!w)
		return;
	int port = web_port(w);
	web_event(w, "join", "node %s joined from %s", "b", "10.0.0.2");
	web_event(NULL, "join", "nobody hears this");
	const char *chat = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
			   "Content-Type: application/json\r\nContent-Length: 2\r\n"
			   "Authorization: Bearer k\r\n\r\n{}";
	CHECK_EQ_INT(http_raw(port, chat, resp, sizeof resp, 5000), 400); /* no messages */
	CHECK_EQ_INT(http_raw(port,
			      "GET /v1/history HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
			      resp, sizeof resp, 5000),
		     200);
	char *body = strstr(resp, "\r\n\r\n");
	json_t *j = body ? json_loads(body + 4, 0, NULL) : NULL;
	CHECK(j != NULL);
	CHECK_EQ_STR(json_string_value(json_object_get(j, "self")), "node-x");
	json_t *e0 = json_array_get(json_object_get(j, "events"), 0);
	CHECK_EQ_STR(json_string_value(json_object_get(e0, "text")), "node b joined from 10.0.0.2");
	json_t *r0 = json_array_get(json_object_get(j, "requests"), 0);
	CHECK_NEAR(json_number_value(json_object_get(r0, "status")), 400, 0);
	CHECK_EQ_STR(json_string_value(json_object_get(r0, "api")), "chat");
	json_decref(j);
	/* the events stream: its first snapshot carries the whole history, then the new parts
	 * (a fast stream: ?interval_ms) */
	CHECK(http_raw(
		  port,
		  "GET /v1/events?interval_ms=100 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		  resp, sizeof resp, 1500) == 200);
	char *first = strstr(resp, "data: {");
	CHECK(first && strstr(first, "\"history\":{") && strstr(first, "\"full\":true"));
	CHECK(first && strstr(first, "node b joined"));
	char *second = first ? strstr(first + 6, "data: {") : NULL;
	CHECK(second && strstr(second, "\"full\":false"));
	/* the later snapshots do not repeat the event */
	CHECK(second && !strstr(second, "node b joined"));
	web_free(w);
}

int main(void)
{
	log_threshold = LOG_WARN;
	RUN(samples);
	RUN(events_and_requests);
	RUN(sched_records);
	RUN(server_history);
	return harness_done();
}
