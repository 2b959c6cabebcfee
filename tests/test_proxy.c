/*
 * test_proxy.c: web/proxy.c, the --exec proxy, against a scripted upstream on loopback: the
 * request (method, path, body) arrives intact; a Server-Sent Events reply sent in pieces arrives
 * whole with its status and type; nothing listening is a 503 with Retry-After; an upstream that
 * hangs up, sends garbage or a chunked body is a 502; /health and /v1/cluster stay local; the API
 * key is checked before anything goes upstream.
 */
#include "web/web_int.h"

#include "common/common.h"
#include "harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

/* ---- a one-connection-at-a-time scripted upstream ---- */

typedef struct {
	int lfd, port;
	const char *reply[4]; /* written in pieces, 20 ms apart; NULL ends; "" = hang up at once */
	char got[4096];       /* the last request, headers and body */
	pthread_t th;
	int stop;
} upstream_t;

static void *up_main(void *arg)
{
	upstream_t *u = arg;
	for (;;) {
		int c = accept(u->lfd, NULL, NULL);
		if (c < 0 || u->stop) {
			if (c >= 0)
				close(c);
			return NULL;
		}
		size_t n = 0;
		ssize_t k;
		char *body = NULL;
		/* the headers, then Content-Length bytes of body */
		while (n + 1 < sizeof u->got &&
		       (k = recv(c, u->got + n, sizeof u->got - 1 - n, 0)) > 0) {
			n += (size_t)k;
			u->got[n] = 0;
			body = strstr(u->got, "\r\n\r\n");
			const char *cl = strstr(u->got, "Content-Length: ");
			if (body && cl &&
			    (size_t)(u->got + n - (body + 4)) >= strtoul(cl + 16, NULL, 10))
				break;
		}
		for (int i = 0; i < 4 && u->reply[i] && u->reply[i][0]; i++) {
			send(c, u->reply[i], strlen(u->reply[i]), MSG_NOSIGNAL);
			usleep(20000);
		}
		close(c);
	}
}

static void up_start(upstream_t *u)
{
	u->lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t l = sizeof a;
	bind(u->lfd, (struct sockaddr *)&a, sizeof a);
	listen(u->lfd, 8);
	getsockname(u->lfd, (struct sockaddr *)&a, &l);
	u->port = ntohs(a.sin_port);
	pthread_create(&u->th, NULL, up_main, u);
}

static void up_stop(upstream_t *u)
{
	u->stop = 1;
	int fd = socket(AF_INET, SOCK_STREAM, 0); /* wake accept */
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)u->port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	connect(fd, (struct sockaddr *)&a, sizeof a);
	close(fd);
	pthread_join(u->th, NULL);
	close(u->lfd);
}

/* One HTTP/1.1 exchange with the server; returns the status, the whole response in resp. */
static int http(int port, const char *req, char *resp, size_t len)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
		close(fd);
		return -1;
	}
	send(fd, req, strlen(req), MSG_NOSIGNAL);
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

static const char *POST = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
			  "Content-Type: application/json\r\nContent-Length: 13\r\n%s\r\n"
			  "{\"stream\":1}\n";

static int serving(void *ud, char *reason, size_t len)
{
	(void)ud, (void)reason, (void)len;
	return WEB_SERVING;
}

static web_t *server(const char *key)
{
	web_opts_t o;
	web_opts_default(&o);
	o.port = 0;
	o.api_key = key;
	o.health = serving; /* the agent says serving: /health then asks the command */
	web_t *w = NULL;
	char err[256];
	CHECK_EQ_INT(web_new(&w, &o, NULL, err, sizeof err), 0);
	return w;
}

TEST(forwards_and_streams)
{
	upstream_t u = {
	    .reply = {
		"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: {\"a\":1}\n\n",
		"data: {\"b\":2}\n\n", "data: [DONE]\n\n", NULL}};
	up_start(&u);
	web_t *w = server(NULL);
	if (!w)
		return;
	web_set_proxy(w, u.port);
	char req[1024], resp[8192];
	snprintf(req, sizeof req, POST, "");
	CHECK_EQ_INT(http(web_port(w), req, resp, sizeof resp), 200);
	CHECK(strstr(resp, "Content-Type: text/event-stream") != NULL);
	CHECK(strstr(resp, "data: {\"a\":1}") && strstr(resp, "data: {\"b\":2}"));
	CHECK(strstr(resp, "data: [DONE]") != NULL);
	/* what the upstream got: the method, the path, the body, as HTTP/1.0 */
	CHECK(!strncmp(u.got, "POST /v1/chat/completions HTTP/1.0\r\n", 36));
	CHECK(strstr(u.got, "\r\n\r\n{\"stream\":1}\n") != NULL);
	/* local paths stay local */
	snprintf(req, sizeof req, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	u.got[0] = 0;
	CHECK(http(web_port(w), req, resp, sizeof resp) > 0);
	snprintf(req, sizeof req,
		 "GET /v1/cluster HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	CHECK_EQ_INT(http(web_port(w), req, resp, sizeof resp), 200);
	CHECK_EQ_STR(u.got, "");
	/* a Content-Length reply keeps its length */
	u.reply[0] = "HTTP/1.0 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: "
		     "2\r\n\r\n{}";
	u.reply[1] = NULL;
	snprintf(req, sizeof req,
		 "GET /v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	CHECK_EQ_INT(http(web_port(w), req, resp, sizeof resp), 404);
	CHECK(strstr(resp, "\r\n\r\n{}") != NULL);
	web_free(w);
	up_stop(&u);
}

TEST(bad_upstreams)
{
	upstream_t u = {.reply = {"", NULL}};
	up_start(&u);
	web_t *w = server("sekret");
	if (!w)
		return;
	char req[1024], resp[8192], noauth[1024];
	snprintf(req, sizeof req, POST, "Authorization: Bearer sekret\r\n");
	/* nothing listening (a port just closed): 503, Retry-After, an OpenAI error */
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t l = sizeof a;
	bind(s, (struct sockaddr *)&a, sizeof a);
	getsockname(s, (struct sockaddr *)&a, &l);
	close(s);
	web_set_proxy(w, ntohs(a.sin_port));
	CHECK_EQ_INT(http(web_port(w), req, resp, sizeof resp), 503);
	CHECK(strstr(resp, "Retry-After: 2") != NULL);
	CHECK(strstr(resp, "\"type\":\"unavailable\"") != NULL);
	/* and /health says why the leader is not serving */
	snprintf(noauth, sizeof noauth,
		 "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	CHECK_EQ_INT(http(web_port(w), noauth, resp, sizeof resp), 503);
	CHECK(strstr(resp, "the --exec command does not answer on port") != NULL);
	web_set_proxy(w, u.port);
	CHECK_EQ_INT(http(web_port(w), noauth, resp, sizeof resp), 200);
	/* no key: 401 before anything goes upstream */
	snprintf(noauth, sizeof noauth, POST, "");
	u.got[0] = 0;
	CHECK_EQ_INT(http(web_port(w), noauth, resp, sizeof resp), 401);
	CHECK_EQ_STR(u.got, "");
	/* hangs up without a reply, garbage, a chunked body: 502 */
	CHECK_EQ_INT(http(web_port(w), req, resp, sizeof resp), 502);
	u.reply[0] = "SSH-2.0-OpenSSH\r\n\r\n";
	CHECK_EQ_INT(http(web_port(w), req, resp, sizeof resp), 502);
	u.reply[0] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
	CHECK_EQ_INT(http(web_port(w), req, resp, sizeof resp), 502);
	CHECK(strstr(resp, "chunked") != NULL);
	/* off again: the path is the server's own (no engine: 503 from the scheduler side) */
	web_set_proxy(w, 0);
	u.got[0] = 0;
	CHECK(http(web_port(w), req, resp, sizeof resp) != 200);
	CHECK_EQ_STR(u.got, "");
	web_free(w);
	up_stop(&u);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	RUN(forwards_and_streams);
	RUN(bad_upstreams);
	return harness_done();
}
