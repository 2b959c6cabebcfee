/*
 * test_web.c: web/'s pure parts (request parsing and validation, reply and chunk shapes, UTF-8
 * repair, metrics text) and the server with no engine attached (health 503, errors, auth,
 * follower redirects, body limit) over a real loopback socket.
 * Generation itself is tested end to end against the real engine by tests/t_api.sh and
 * tests/t_openai.sh.
 */
#include "harness.h"
#include "infer/gguf_write.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "common/common.h"
#include "web/web.h"
#include "web/web_int.h"
#include "web_jobs.h"

static int parse(web_req_t *r, int kind, const char *body, web_err_t *e)
{
	return web_req_parse(r, kind, body, strlen(body), e);
}

/* Parses body expecting an error with status and param; returns 1 when it matched. */
static int parse_fails(int kind, const char *body, int status, const char *param)
{
	web_req_t r;
	web_err_t e;
	int rc = parse(&r, kind, body, &e);
	web_req_clear(&r);
	if (rc != status || strcmp(e.param, param ? param : "") != 0 || !e.message[0]) {
		fprintf(stderr, "  body %s: got %d param '%s' (%s)\n", body, rc, e.param, e.message);
		return 0;
	}
	return 1;
}

TEST(parse_chat_fields)
{
	web_req_t r;
	web_err_t e;
	const char *b = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
			"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi \"},"
			"{\"type\":\"text\",\"text\":\"there\"}]}],\"max_tokens\":7,\"temperature\":0,"
			"\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"seed\":-3,\"stop\":[\"\\n\",\"END\"],"
			"\"stream\":true,\"stream_options\":{\"include_usage\":true},"
			"\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"logprobs\":true,"
			"\"top_logprobs\":3,\"n\":1,\"user\":\"u\",\"whatever\":{\"x\":[1]}}";
	CHECK_EQ_INT(parse(&r, WEB_CHAT, b, &e), 0);
	CHECK_EQ_STR(r.model, "m");
	CHECK_EQ_INT(r.n_msgs, 2);
	CHECK_EQ_STR(r.msgs[0].role, "system");
	CHECK_EQ_STR(r.msgs[1].content, "hi there");
	CHECK_EQ_INT(r.samp.max_tokens, 7);
	CHECK_NEAR(r.samp.temperature, 0, 1e-6);
	CHECK_NEAR(r.samp.top_p, 0.9, 1e-6);
	CHECK_EQ_INT(r.samp.top_k, 40);
	CHECK_NEAR(r.samp.min_p, 0.05, 1e-6);
	CHECK(r.seed_given && r.samp.seed == (uint64_t)-3);
	CHECK_EQ_INT(r.samp.n_stop, 2);
	CHECK_EQ_STR(r.samp.stop[1], "END");
	CHECK(r.stream && r.include_usage && r.logprobs);
	CHECK_EQ_INT(r.samp.top_logprobs, 3);
	CHECK_NEAR(r.samp.presence_penalty, 0.5, 1e-6);
	CHECK_NEAR(r.samp.frequency_penalty, -0.5, 1e-6);
	web_req_clear(&r);

	/* defaults: OpenAI's temperature 1, max_completion_tokens, developer = system */
	CHECK_EQ_INT(parse(&r, WEB_CHAT,
			   "{\"messages\":[{\"role\":\"developer\",\"content\":\"x\"}],"
			   "\"max_completion_tokens\":3,\"stop\":\"S\",\"seed\":null}",
			   &e),
		     0);
	CHECK_NEAR(r.samp.temperature, 1, 1e-6);
	CHECK_EQ_INT(r.samp.max_tokens, 3);
	CHECK_EQ_STR(r.msgs[0].role, "system");
	CHECK_EQ_INT(r.samp.n_stop, 1);
	CHECK(!r.seed_given && !r.stream);
	web_req_clear(&r);
}

TEST(parse_completion_fields)
{
	web_req_t r;
	web_err_t e;
	CHECK_EQ_INT(parse(&r, WEB_COMPLETION, "{\"prompt\":\"Once\",\"logprobs\":2}", &e), 0);
	CHECK_EQ_STR(r.prompt, "Once");
	CHECK(r.logprobs);
	CHECK_EQ_INT(r.samp.top_logprobs, 2);
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&r, WEB_COMPLETION, "{\"prompt\":[\"One\"]}", &e), 0);
	CHECK_EQ_STR(r.prompt, "One");
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&r, WEB_COMPLETION, "{\"prompt\":[1,403,407]}", &e), 0);
	CHECK_EQ_INT(r.n_prompt_ids, 3);
	CHECK_EQ_INT(r.prompt_ids[2], 407);
	web_req_clear(&r);
}

TEST(parse_errors)
{
	CHECK(parse_fails(WEB_CHAT, "", 400, NULL));
	CHECK(parse_fails(WEB_CHAT, "{\"messages\":", 400, NULL));
	CHECK(parse_fails(WEB_CHAT, "[1,2]", 400, NULL));
	CHECK(parse_fails(WEB_CHAT, "{}", 400, "messages"));
	CHECK(parse_fails(WEB_CHAT, "{\"messages\":[]}", 400, "messages"));
	CHECK(parse_fails(WEB_CHAT, "{\"messages\":\"hi\"}", 400, "messages"));
	CHECK(parse_fails(WEB_CHAT, "{\"messages\":[3]}", 400, "messages[0]"));
	CHECK(parse_fails(WEB_CHAT, "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400,
			  "messages[0].role"));
	CHECK(parse_fails(WEB_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role"));
	CHECK(parse_fails(WEB_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", 400,
			  "messages[0].content"));
	CHECK(parse_fails(WEB_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
			  "messages[0].content"));
	CHECK(parse_fails(WEB_CHAT,
			  "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
			  400, "messages[0].content"));
	const char *m = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
	char b[256];
	static const struct {
		const char *field, *param;
	} bad[] = {
		{"\"n\":2", "n"},
		{"\"n\":\"1\"", "n"},
		{"\"max_tokens\":\"5\"", "max_tokens"},
		{"\"max_tokens\":0", "max_tokens"},
		{"\"max_tokens\":1.5", "max_tokens"},
		{"\"temperature\":\"hot\"", "temperature"},
		{"\"temperature\":3", "temperature"},
		{"\"top_p\":1.5", "top_p"},
		{"\"top_k\":\"a\"", "top_k"},
		{"\"stop\":5", "stop"},
		{"\"stop\":[\"a\",1]", "stop"},
		{"\"stream\":\"yes\"", "stream"},
		{"\"stream_options\":1", "stream_options"},
		{"\"logprobs\":1", "logprobs"},
		{"\"top_logprobs\":3", "top_logprobs"},
		{"\"top_logprobs\":99,\"logprobs\":true", "top_logprobs"},
		{"\"model\":7", "model"},
		{"\"seed\":\"s\"", "seed"},
		{"\"presence_penalty\":5", "presence_penalty"},
		{"\"user\":1", "user"},
	};
	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		snprintf(b, sizeof b, "{%s,%s}", m, bad[i].field);
		CHECK(parse_fails(WEB_CHAT, b, 400, bad[i].param));
	}
	CHECK(parse_fails(WEB_COMPLETION, "{}", 400, "prompt"));
	CHECK(parse_fails(WEB_COMPLETION, "{\"prompt\":5}", 400, "prompt"));
	CHECK(parse_fails(WEB_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt"));
	CHECK(parse_fails(WEB_COMPLETION, "{\"prompt\":[1,-2]}", 400, "prompt"));
	CHECK(parse_fails(WEB_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":9}", 400, "logprobs"));

	/* the n error says why */
	web_req_t r;
	web_err_t e;
	snprintf(b, sizeof b, "{%s,\"n\":3}", m);
	parse(&r, WEB_CHAT, b, &e);
	web_req_clear(&r);
	CHECK(strstr(e.message, "must be 1") != NULL);
	CHECK_EQ_STR(e.type, "invalid_request_error");
}

static json_t *load(char *s)
{
	json_t *j = s ? json_loads(s, 0, NULL) : NULL;
	free(s);
	return j;
}

TEST(reply_shapes)
{
	web_reply_id_t rid = {.kind = WEB_CHAT, .id = "chatcmpl-1", .created = 5, .model = "m"};
	web_usage_t u = {4, 2};
	json_t *j = load(web_json_reply(&rid, "hi", 2, ENG_FINISH_STOP, &u, NULL));
	CHECK(j != NULL);
	CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "chat.completion");
	json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
	CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(ch, "message"), "content")),
		     "hi");
	CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(ch, "message"), "role")),
		     "assistant");
	CHECK_EQ_STR(json_string_value(json_object_get(ch, "finish_reason")), "stop");
	CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")),
		     6);
	json_decref(j);

	/* first chunk: role; content chunk; final: empty delta with finish_reason; usage chunk */
	j = load(web_json_chunk(&rid, "assistant", "", 0, ENG_FINISH_NONE, 1, NULL));
	ch = json_array_get(json_object_get(j, "choices"), 0);
	CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
	CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(ch, "delta"), "role")),
		     "assistant");
	CHECK(json_is_null(json_object_get(ch, "finish_reason")));
	CHECK(json_is_null(json_object_get(j, "usage")));
	json_decref(j);
	j = load(web_json_chunk(&rid, NULL, NULL, 0, ENG_FINISH_LENGTH, 0, NULL));
	ch = json_array_get(json_object_get(j, "choices"), 0);
	CHECK_EQ_INT(json_object_size(json_object_get(ch, "delta")), 0);
	CHECK_EQ_STR(json_string_value(json_object_get(ch, "finish_reason")), "length");
	CHECK(json_object_get(j, "usage") == NULL);
	json_decref(j);
	j = load(web_json_usage_chunk(&rid, &u));
	CHECK_EQ_INT(json_array_size(json_object_get(j, "choices")), 0);
	CHECK_EQ_INT(
		json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), 4);
	json_decref(j);

	/* completions */
	rid.kind = WEB_COMPLETION;
	j = load(web_json_reply(&rid, "abc", 3, ENG_FINISH_LENGTH, &u, NULL));
	ch = json_array_get(json_object_get(j, "choices"), 0);
	CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "text_completion");
	CHECK_EQ_STR(json_string_value(json_object_get(ch, "text")), "abc");
	json_decref(j);

	/* errors */
	web_err_t e;
	web_err_set(&e, 400, "invalid_request_error", "n", "x", "bad %d", 1);
	j = load(web_json_error(&e));
	json_t *er = json_object_get(j, "error");
	CHECK_EQ_STR(json_string_value(json_object_get(er, "message")), "bad 1");
	CHECK_EQ_STR(json_string_value(json_object_get(er, "type")), "invalid_request_error");
	CHECK_EQ_STR(json_string_value(json_object_get(er, "param")), "n");
	json_decref(j);

	/* SSE framing */
	web_buf_t b = {0};
	CHECK_EQ_INT(web_sse_add(&b, strdup("{}")), 0);
	CHECK_EQ_STR(b.p, "data: {}\n\n");
	web_buf_free(&b);
}

TEST(utf8_repair)
{
	web_reply_id_t rid = {.kind = WEB_CHAT, .id = "c", .model = "m"};
	/* a lone continuation byte and a truncated sequence become U+FFFD, valid text stays */
	const char bad[] = "a\x80" "b\xe2\x82" "\xc3\xa9";
	json_t *j = load(web_json_chunk(&rid, NULL, bad, sizeof bad - 1, ENG_FINISH_NONE, 0, NULL));
	CHECK(j != NULL);
	const char *c = json_string_value(json_object_get(
		json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta"),
		"content"));
	CHECK(c && !strcmp(c, "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd\xc3\xa9"));
	json_decref(j);
}

TEST(metrics_text)
{
	web_metrics_t m;
	web_metrics_init(&m);
	web_metrics_status(&m, 200);
	web_metrics_status(&m, 429);
	eng_result_t r = {.prompt_tokens = 5, .completion_tokens = 10, .gen_ms = 100};
	web_metrics_finished(&m, &r);
	web_buf_t b = {0};
	CHECK_EQ_INT(web_metrics_prometheus(&m, &b, 3, 1, WEB_SERVING), 0);
	CHECK(strstr(b.p, "shoal_requests_total{status=\"429\"} 1\n") != NULL);
	CHECK(strstr(b.p, "shoal_generated_tokens_total 10\n") != NULL);
	CHECK(strstr(b.p, "shoal_tokens_per_second 100.000\n") != NULL);
	CHECK(strstr(b.p, "shoal_queue_depth 3\n") != NULL);
	CHECK(strstr(b.p, "shoal_step_seconds 0.010000\n") != NULL);
	web_buf_free(&b);
	web_metrics_destroy(&m);
}

/* ---- the server with no engine, over loopback ---------------------------------------------- */

/* One HTTP/1.1 exchange; returns the status and puts the response (headers + body) in resp. */
static int http(int port, const char *req, char *resp, size_t len)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	size_t n = strlen(req), off = 0;
	while (off < n) {
		ssize_t w = send(fd, req + off, n - off, MSG_NOSIGNAL);
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	size_t got = 0;
	ssize_t r;
	while (got + 1 < len && (r = recv(fd, resp + got, len - 1 - got, 0)) > 0)
		got += (size_t)r;
	resp[got] = 0;
	close(fd);
	int status = -1;
	sscanf(resp, "HTTP/1.%*d %d", &status);
	return status;
}

static char *req_get(char *buf, size_t len, const char *path, const char *extra)
{
	snprintf(buf, len, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n", path,
		 extra ? extra : "");
	return buf;
}

static char *req_post(char *buf, size_t len, const char *method, const char *path,
		      const char *body, const char *extra)
{
	snprintf(buf, len,
		 "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
		 "application/json\r\nContent-Length: %zu\r\n%s\r\n%s",
		 method, path, strlen(body), extra ? extra : "", body);
	return buf;
}

static int follower_state(void *ud, char *reason, size_t len)
{
	(void)ud;
	snprintf(reason, len, "waiting for 2 more nodes");
	return WEB_FORMING;
}

TEST(server_without_engine)
{
	web_opts_t o;
	web_opts_default(&o);
	o.port = 0;
	o.api_key = "sekret";
	web_t *w = NULL;
	char err[256], req[4096];
	static char resp[1 << 16];
	CHECK_EQ_INT(web_new(&w, &o, NULL, err, sizeof err), 0);
	if (!w)
		return;
	int port = web_port(w);
	CHECK(port > 0);

	CHECK_EQ_INT(http(port, req_get(req, sizeof req, "/health", NULL), resp, sizeof resp), 503);
	CHECK(strstr(resp, "Retry-After: 2") != NULL);
	CHECK(strstr(resp, "\"state\":\"loading\"") != NULL);
	CHECK_EQ_INT(http(port, req_get(req, sizeof req, "/", NULL), resp, sizeof resp), 200);
	CHECK(strstr(resp, "text/html") != NULL);
	CHECK_EQ_INT(http(port, req_get(req, sizeof req, "/metrics", NULL), resp, sizeof resp), 200);
	CHECK(strstr(resp, "shoal_queue_depth 0") != NULL);
	CHECK_EQ_INT(http(port, req_get(req, sizeof req, "/v1/cluster", NULL), resp, sizeof resp),
		     200);
	CHECK(strstr(resp, "\"members\"") != NULL);
	CHECK_EQ_INT(http(port, req_get(req, sizeof req, "/nope", NULL), resp, sizeof resp), 404);
	CHECK(strstr(resp, "not_found_error") != NULL);
	CHECK_EQ_INT(http(port, req_post(req, sizeof req, "DELETE", "/health", "", NULL), resp,
			  sizeof resp),
		     405);
	CHECK(strstr(resp, "Allow: GET") != NULL);

	const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
	CHECK_EQ_INT(http(port, req_post(req, sizeof req, "POST", "/v1/chat/completions", chat, NULL),
			  resp, sizeof resp),
		     401);
	CHECK(strstr(resp, "authentication_error") != NULL);
	CHECK_EQ_INT(http(port, req_post(req, sizeof req, "POST", "/v1/chat/completions", chat,
					 "Authorization: Bearer wrong\r\n"),
			  resp, sizeof resp),
		     401);
	const char *auth = "Authorization: Bearer sekret\r\n";
	CHECK_EQ_INT(http(port, req_post(req, sizeof req, "POST", "/v1/chat/completions", chat, auth),
			  resp, sizeof resp),
		     503);
	CHECK(strstr(resp, "Retry-After") != NULL);
	/* validation comes before the engine check */
	CHECK_EQ_INT(http(port, req_post(req, sizeof req, "POST", "/v1/chat/completions", "{x", auth),
			  resp, sizeof resp),
		     400);
	CHECK_EQ_INT(http(port, req_get(req, sizeof req, "/v1/chat/completions", auth), resp,
			  sizeof resp),
		     405);

	/* a body announced over 1 MiB is refused before it is read */
	snprintf(req, sizeof req,
		 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s"
		 "Content-Length: %u\r\n\r\n{",
		 auth, WEB_BODY_MAX + 1);
	CHECK_EQ_INT(http(port, req, resp, sizeof resp), 413);

	/* follower mode: API paths redirect, health and cluster stay local */
	web_set_leader(w, "http://10.1.2.3:8080/");
	CHECK_EQ_INT(http(port, req_post(req, sizeof req, "POST", "/v1/chat/completions", chat, NULL),
			  resp, sizeof resp),
		     307);
	CHECK(strstr(resp, "Location: http://10.1.2.3:8080/v1/chat/completions\r\n") != NULL);
	CHECK_EQ_INT(http(port, req_get(req, sizeof req, "/v1/models", NULL), resp, sizeof resp), 307);
	CHECK_EQ_INT(http(port, req_get(req, sizeof req, "/v1/cluster", NULL), resp, sizeof resp),
		     200);
	web_set_leader(w, NULL);
	CHECK_EQ_INT(http(port, req_get(req, sizeof req, "/v1/models", NULL), resp, sizeof resp), 401);

	web_set_rank_health(w, 1, 0);
	web_set_step_metrics(w, 12.5, 3.0);
	CHECK_EQ_INT(http(port, req_get(req, sizeof req, "/metrics", NULL), resp, sizeof resp), 200);
	CHECK(strstr(resp, "shoal_rank_up{rank=\"1\"} 0") != NULL);
	CHECK(strstr(resp, "shoal_step_seconds 0.012500") != NULL);
	CHECK(strstr(resp, "shoal_communication_seconds 0.003000") != NULL);
	web_free(w);

	/* a health callback (the agent's) decides the state */
	o.api_key = NULL;
	o.health = follower_state;
	CHECK_EQ_INT(web_new(&w, &o, NULL, err, sizeof err), 0);
	if (!w)
		return;
	CHECK_EQ_INT(http(web_port(w), req_get(req, sizeof req, "/health", NULL), resp, sizeof resp),
		     503);
	CHECK(strstr(resp, "\"state\":\"forming\"") != NULL);
	CHECK(strstr(resp, "waiting for 2 more nodes") != NULL);
	web_free(w);
	web_free(NULL);
}

TEST(bind_error)
{
	web_opts_t o;
	web_opts_default(&o);
	o.host = "203.0.113.77"; /* TEST-NET-3: not ours */
	o.port = 0;
	web_t *w = NULL;
	char err[256] = "";
	CHECK(web_new(&w, &o, NULL, err, sizeof err) < 0);
	CHECK(w == NULL);
	CHECK(err[0] != 0);
}

TEST(dashboard_page)
{
	/* the compiled page is web/dashboard.html (regenerate with web/gen_page.sh) */
	char *html = NULL;
	size_t n = 0;
	CHECK_EQ_INT(read_file_all("web/dashboard.html", &html, &n, NULL, 0), 0);
	CHECK(html && !strcmp(html, web_dashboard_html));
	free(html);
	/* self-contained: no CDN, no remote scripts, styles or fonts */
	CHECK(strstr(web_dashboard_html, "src=\"http") == NULL);
	CHECK(strstr(web_dashboard_html, "href=\"http") == NULL);
	CHECK(strstr(web_dashboard_html, "@import") == NULL);
	CHECK(strstr(web_dashboard_html, "/v1/events") != NULL);
	CHECK(strstr(web_dashboard_html, "id=\"topo\"") != NULL);
	CHECK(strlen(web_dashboard_html) < 100 * 1024); /* issue 32: the page stays under 100 KB */
}

/* ---- the scheduler with the real engine (stories260K) -------------------------------------- */

static web_job_t *long_job(eng_t *e, int max_tokens, int stream)
{
	web_req_t r;
	web_err_t er;
	const char *b = "{\"prompt\":\"hello\",\"temperature\":0}";
	if (web_req_parse(&r, WEB_COMPLETION, b, strlen(b), &er) != 0)
		return NULL;
	r.samp.max_tokens = max_tokens;
	r.stream = stream;
	int *ids = NULL, n = 0;
	if (eng_tokenize(e, r.prompt, 1, 0, &ids, &n, NULL, 0) != 0) {
		web_req_clear(&r);
		return NULL;
	}
	return web_job_new(&r, ids, n, "m", 60000);
}

TEST(sched_cancel_and_detach)
{
	char err[256];
	const char *path = harness_stories();
	if (!path)
		SKIP("stories260K.gguf not found");
	/* one slot: the one-at-a-time behaviour (queue order, bound, detach) */
	eng_opts_t eo = {.model_path = path, .threads = 1, .parallel = 1};
	eng_t *e = NULL;
	CHECK_EQ_INT(eng_open(&e, &eo, err, sizeof err), 0);
	if (!e)
		return;
	web_metrics_t m;
	web_metrics_init(&m);
	web_sched_t *s = NULL;
	CHECK_EQ_INT(web_sched_new(&s, &m, 2, 0, NULL, NULL), 0);
	web_sched_set_engine(s, e);

	/* A runs (greedy from "hello" never meets EOS); B and C wait; D finds the queue full */
	web_job_t *a = long_job(e, 2000, 1), *b = long_job(e, 8, 0), *c = long_job(e, 8, 0),
		  *d = long_job(e, 8, 0);
	CHECK(a && b && c && d);
	CHECK_EQ_INT(web_sched_submit(s, a), 0);
	while (job_state(a) == JOB_QUEUED)
		usleep(1000);
	CHECK_EQ_INT(web_sched_submit(s, b), 0);
	CHECK_EQ_INT(web_sched_submit(s, c), 0);
	CHECK_EQ_INT(web_sched_submit(s, d), SH_EBUSY);
	int q, run;
	web_sched_depth(s, &q, &run);
	CHECK_EQ_INT(q, 2);
	CHECK_EQ_INT(run, 1);

	/* a queued job canceled by its client ends at once, the running one is untouched */
	web_sched_cancel(s, b, 1);
	CHECK_EQ_INT(job_state(b), JOB_DONE);
	CHECK_EQ_INT(b->err.status, 499);
	/* the running one stops at its next token, with the timeout error */
	web_sched_cancel(s, a, 2);
	job_wait(a);
	CHECK_EQ_INT(a->err.status, 504);
	CHECK(a->res.completion_tokens < 2000);
	CHECK(strstr(a->out.p, "data: {\"error\"") != NULL); /* the stream ends with an error event */
	CHECK(strstr(a->out.p, "[DONE]") == NULL);
	job_wait(c); /* C runs next and completes */
	CHECK_EQ_INT(c->err.status, 0);
	CHECK_EQ_INT(c->res.completion_tokens, 8);
	CHECK(c->text.len > 0);

	/* detaching the engine is a re-plan: the running job is suspended between steps, the
	 * queued one waits, new ones are taken; on the next engine (a fresh one: no prefix cache)
	 * the suspended job goes on from its state and ends as an undisturbed run would */
	web_job_t *ref = long_job(e, 300, 0);
	CHECK_EQ_INT(web_sched_submit(s, ref), 0);
	job_wait(ref);
	CHECK_EQ_INT(ref->err.status, 0);
	web_job_t *f = long_job(e, 300, 0), *g = long_job(e, 8, 1);
	CHECK_EQ_INT(web_sched_submit(s, f), 0);
	while (job_state(f) == JOB_QUEUED)
		usleep(1000);
	CHECK_EQ_INT(web_sched_submit(s, g), 0);
	web_sched_set_engine(s, NULL);
	CHECK_EQ_INT(job_state(f), JOB_QUEUED); /* suspended, not failed */
	CHECK_EQ_INT(job_state(g), JOB_QUEUED);
	CHECK_EQ_INT(web_sched_holding(s, NULL), 1);
	CHECK_EQ_INT(web_sched_ready(s), 0);
	CHECK_EQ_INT(web_sched_submit(s, d), SH_EBUSY); /* the suspended count in the bound */
	CHECK(web_sched_engine_acquire(s) == NULL);
	eng_t *e2 = NULL;
	CHECK_EQ_INT(eng_open(&e2, &eo, err, sizeof err), 0);
	if (!e2)
		return;
	web_sched_set_engine(s, e2);
	job_wait(f);
	job_wait(g);
	CHECK_EQ_INT(f->err.status, 0);
	CHECK_EQ_INT(f->res.completion_tokens, 300);
	CHECK_EQ_INT((int)f->res.finish, (int)ENG_FINISH_LENGTH);
	CHECK(f->text.p && ref->text.p && !strcmp(f->text.p, ref->text.p));
	CHECK_EQ_INT(g->err.status, 0);
	CHECK(g->out.p && strstr(g->out.p, "[DONE]") && !strstr(g->out.p, "\"error\""));
	web_buf_t pm = {0};
	CHECK_EQ_INT(web_metrics_prometheus(&m, &pm, 0, 0, WEB_SERVING), 0);
	CHECK(pm.p && strstr(pm.p, "shoal_requests_resumed_total 1") != NULL);
	web_buf_free(&pm);

	/* no plan can serve the model: the jobs that wait end with 503 at once, new ones are
	 * refused until the next engine */
	web_job_t *f2 = long_job(e, 2000, 1), *g2 = long_job(e, 8, 0), *d2 = long_job(e, 8, 0);
	CHECK_EQ_INT(web_sched_submit(s, f2), 0);
	while (job_state(f2) == JOB_QUEUED)
		usleep(1000);
	web_sched_set_engine(s, NULL);
	CHECK_EQ_INT(web_sched_submit(s, g2), 0);
	web_sched_unavailable(s, "no plan fits");
	CHECK_EQ_INT(job_state(f2), JOB_DONE);
	CHECK_EQ_INT(f2->err.status, 503);
	CHECK(strstr(f2->err.message, "no plan fits") != NULL);
	CHECK(f2->out.p && strstr(f2->out.p, "data: {\"error\"") != NULL);
	CHECK_EQ_INT(job_state(g2), JOB_DONE);
	CHECK_EQ_INT(g2->err.status, 503);
	CHECK_EQ_INT(web_sched_holding(s, NULL), 0);
	CHECK_EQ_INT(web_sched_submit(s, d2), SH_ENOENT);
	web_sched_set_engine(s, e);
	CHECK_EQ_INT(web_sched_submit(s, d2), 0);
	job_wait(d2);
	CHECK_EQ_INT(d2->err.status, 0);
	eng_free(e2);

	/* stopping with work queued: every job still ends */
	web_job_t *h = long_job(e, 2000, 1), *i = long_job(e, 8, 1);
	CHECK_EQ_INT(web_sched_submit(s, h), 0);
	CHECK_EQ_INT(web_sched_submit(s, i), 0);
	web_sched_free(s);
	CHECK_EQ_INT(job_state(h), JOB_DONE);
	CHECK_EQ_INT(job_state(i), JOB_DONE);
	CHECK(i->err.status == 503);

	web_job_t *all[] = {a, b, c, d, f, g, h, i, ref, f2, g2, d2};
	for (size_t k = 0; k < ARRAY_LEN(all); k++)
		web_job_unref(all[k]);
	web_metrics_destroy(&m);
	eng_free(e);
}

/* A re-plan that brings no engine in time: the waiting job ends with 503 "replanning" (its
 * connection gets Retry-After) once the wait bound passes. */
TEST(sched_replan_wait)
{
	char err[256];
	const char *path = harness_stories();
	if (!path)
		SKIP("stories260K.gguf not found");
	eng_opts_t eo = {.model_path = path, .threads = 1, .parallel = 1};
	eng_t *e = NULL;
	CHECK_EQ_INT(eng_open(&e, &eo, err, sizeof err), 0);
	if (!e)
		return;
	web_sched_t *s = NULL;
	CHECK_EQ_INT(web_sched_new(&s, NULL, 4, 200, NULL, NULL), 0);
	web_job_t *a = long_job(e, 8, 0), *b = long_job(e, 8, 1);
	CHECK(a && b);
	CHECK_EQ_INT(web_sched_submit(s, a), SH_ENOENT); /* never served: refused at once */
	web_sched_set_engine(s, e);
	web_sched_set_engine(s, NULL);
	CHECK_EQ_INT(web_sched_submit(s, a), 0);
	CHECK_EQ_INT(web_sched_submit(s, b), 0);
	job_wait(a);
	job_wait(b);
	CHECK_EQ_INT(a->err.status, 503);
	CHECK(!strcmp(a->err.code, "replanning"));
	CHECK(b->out.p && strstr(b->out.p, "replanning") != NULL);
	web_sched_free(s);
	web_job_unref(a);
	web_job_unref(b);
	eng_free(e);
}

/* Continuous batching: two slots run two requests at once, later ones wait in the bounded
 * queue and are admitted (FIFO) as soon as a slot frees, a canceled request frees its slot, and
 * /metrics carries the batching histograms and slot states. */
TEST(sched_batches)
{
	char err[256];
	const char *path = harness_stories();
	if (!path)
		SKIP("stories260K.gguf not found");
	eng_opts_t eo = {.model_path = path, .threads = 1, .parallel = 2};
	eng_t *e = NULL;
	CHECK_EQ_INT(eng_open(&e, &eo, err, sizeof err), 0);
	if (!e)
		return;
	web_metrics_t m;
	web_metrics_init(&m);
	web_sched_t *s = NULL;
	CHECK_EQ_INT(web_sched_new(&s, &m, 2, 0, NULL, NULL), 0);
	web_sched_set_engine(s, e);
	web_job_t *a = long_job(e, 100000, 1), *b = long_job(e, 100000, 1), *c = long_job(e, 8, 0),
		  *d = long_job(e, 8, 0), *x = long_job(e, 8, 0);
	CHECK(a && b && c && d && x);
	CHECK_EQ_INT(web_sched_submit(s, a), 0);
	CHECK_EQ_INT(web_sched_submit(s, b), 0);
	int q = 0, run = 0;
	for (int k = 0; k < 5000 && run < 2; k++) {
		usleep(1000);
		web_sched_depth(s, &q, &run);
	}
	CHECK_EQ_INT(run, 2); /* both at once */
	CHECK_EQ_INT(web_sched_submit(s, c), 0);
	CHECK_EQ_INT(web_sched_submit(s, d), 0);
	CHECK_EQ_INT(web_sched_submit(s, x), SH_EBUSY); /* the queue bound still holds */
	web_sched_depth(s, &q, &run);
	CHECK_EQ_INT(q, 2);
	/* the client of a goes away: its slot goes to c, which completes while b still runs */
	web_sched_cancel(s, a, 1);
	job_wait(a);
	CHECK_EQ_INT(a->err.status, 499);
	job_wait(c);
	job_wait(d);
	CHECK_EQ_INT(c->err.status, 0);
	CHECK_EQ_INT(c->res.completion_tokens, 8);
	CHECK_EQ_INT(d->res.completion_tokens, 8);
	CHECK_EQ_INT(job_state(b), JOB_RUNNING);
	web_buf_t pm = {0};
	CHECK_EQ_INT(web_metrics_prometheus(&m, &pm, 0, 1, WEB_SERVING), 0);
	CHECK(pm.p && strstr(pm.p, "shoal_time_to_first_token_seconds_count 4") != NULL);
	CHECK(pm.p && strstr(pm.p, "shoal_inter_token_seconds_bucket{le=\"+Inf\"}") != NULL);
	CHECK(pm.p && strstr(pm.p, "shoal_batch_size_bucket{le=\"2\"}") != NULL);
	CHECK(pm.p && strstr(pm.p, "shoal_slot_state{slot=\"1\",state=\"decode\"}") != NULL);
	web_buf_free(&pm);
	pthread_mutex_lock(&m.mu);
	CHECK(m.batch.count > 0 && m.batch.sum / (double)m.batch.count > 1.0); /* real batches */
	pthread_mutex_unlock(&m.mu);
	/* stopping ends the running one with an error */
	web_sched_free(s);
	CHECK_EQ_INT(job_state(b), JOB_DONE);
	CHECK_EQ_INT(b->err.status, 503);
	web_job_t *all[] = {a, b, c, d, x};
	for (size_t k = 0; k < ARRAY_LEN(all); k++)
		web_job_unref(all[k]);
	web_metrics_destroy(&m);
	eng_free(e);
}

/* Speculative decoding through the scheduler: a streamed job gets every verified token, usage
 * counts them, and /metrics and the dashboard's batch figures carry the acceptance. */
TEST(sched_spec_metrics)
{
	char path[512], draft[256], err[256];
	snprintf(path, sizeof path, "%s/models/stories260K.gguf", harness_shared());
	if (access(path, R_OK) != 0)
		SKIP("stories260K.gguf not found");
	snprintf(draft, sizeof draft, "/tmp/shoal-test-web-%d-s16.gguf", (int)getpid());
	CHECK_EQ_INT(gguf_convert(path, draft, 1 /* F16 */, err, sizeof err), 0);
	eng_opts_t eo = {
	    .model_path = path, .threads = 1, .parallel = 1, .spec = "model", .draft_model = draft};
	eng_t *e = NULL;
	CHECK_EQ_INT(eng_open(&e, &eo, err, sizeof err), 0);
	unlink(draft);
	if (!e)
		return;
	web_metrics_t m;
	web_metrics_init(&m);
	web_sched_t *s = NULL;
	CHECK_EQ_INT(web_sched_new(&s, &m, 2, 0, NULL, NULL), 0);
	web_sched_set_engine(s, e);
	web_job_t *a = long_job(e, 40, 1);
	CHECK(a != NULL);
	CHECK_EQ_INT(web_sched_submit(s, a), 0);
	job_wait(a);
	CHECK_EQ_INT(a->err.status, 0);
	CHECK_EQ_INT(a->res.completion_tokens, 40);
	CHECK(a->out.p && strstr(a->out.p, "[DONE]") != NULL);
	web_buf_t pm = {0};
	CHECK_EQ_INT(web_metrics_prometheus(&m, &pm, 0, 0, WEB_SERVING), 0);
	CHECK(pm.p && strstr(pm.p, "shoal_spec_acceptance_rate{mode=\"model\"}") != NULL);
	CHECK(pm.p && strstr(pm.p, "shoal_spec_tokens_per_verify") != NULL);
	CHECK(pm.p && strstr(pm.p, "shoal_spec_draft_seconds_total") != NULL);
	CHECK(pm.p && !strstr(pm.p, "shoal_spec_accepted_tokens_total 0\n"));
	web_buf_free(&pm);
	json_t *b = web_metrics_batch_json(&m);
	json_t *sp = b ? json_object_get(b, "spec") : NULL;
	CHECK(sp && !strcmp(json_string_value(json_object_get(sp, "mode")), "model"));
	CHECK(sp && json_real_value(json_object_get(sp, "acceptance")) > 0.5);
	CHECK(sp && json_real_value(json_object_get(sp, "tokens_per_verify")) > 1.0);
	json_decref(b);
	web_sched_free(s);
	web_job_unref(a);
	web_metrics_destroy(&m);
	eng_free(e);
}

/* A re-plan that detaches the engine the moment its last job ends, and frees it: the
 * scheduler's turn still read the engine after that job's end (its step metrics), which the
 * sanitizer build caught in t_joinleave as a use after free (web/sched.c: sched_turn holds the
 * engine for the whole turn). Many rounds, each a fresh engine, to meet the window. */
TEST(sched_detach_at_job_end)
{
	char err[256];
	const char *path = harness_stories();
	if (!path)
		SKIP("stories260K.gguf not found");
	eng_opts_t eo = {.model_path = path, .threads = 1, .parallel = 1};
	web_metrics_t m;
	web_metrics_init(&m);
	web_sched_t *s = NULL;
	CHECK_EQ_INT(web_sched_new(&s, &m, 2, 0, NULL, NULL), 0);
	int ok = 0;
	for (int round = 0; round < 60; round++) {
		eng_t *e = NULL;
		if (eng_open(&e, &eo, err, sizeof err))
			break;
		web_sched_set_engine(s, e);
		web_job_t *j = long_job(e, 1 + round % 3, round & 1);
		if (j && web_sched_submit(s, j) == 0) {
			job_wait(j);
			ok += j->err.status == 0;
		}
		web_sched_set_engine(s, NULL);
		eng_free(e); /* what the session thread does next (agent/session/session.c) */
		if (j)
			web_job_unref(j);
	}
	CHECK_EQ_INT(ok, 60);
	web_sched_free(s);
	web_metrics_destroy(&m);
}

int main(void)
{
	log_threshold = LOG_WARN;
	RUN(parse_chat_fields);
	RUN(parse_completion_fields);
	RUN(parse_errors);
	RUN(reply_shapes);
	RUN(utf8_repair);
	RUN(metrics_text);
	RUN(server_without_engine);
	RUN(bind_error);
	RUN(dashboard_page);
	RUN(sched_cancel_and_detach);
	RUN(sched_replan_wait);
	RUN(sched_batches);
	RUN(sched_spec_metrics);
	RUN(sched_detach_at_job_end);
	return harness_done();
}
