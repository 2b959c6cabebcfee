/*
 * proxy.c: with `shoal agent --exec CMD --exec-port P`, the leader's /v1/... (all but /v1/cluster
 * and /v1/events, which the dashboard reads here) is forwarded to rank 0's CMD at 127.0.0.1:P,
 * streaming included. Rank 0 is the leader itself, so the upstream is always local.
 *
 * The request goes upstream as HTTP/1.0 with Connection: close, so the reply body is plain bytes
 * up to Content-Length or EOF (an HTTP/1.0 request may not get a chunked reply); each byte read
 * is handed to libmicrohttpd at once, which re-frames it for the client, so Server-Sent Events
 * pass token by token. A reply that is chunked anyway is refused (502) rather than garbled.
 *
 * Invariant: the upstream socket belongs to one client connection and is closed when that
 * connection ends (libmicrohttpd calls the free callback); no wait here is unbounded: each polls
 * in slices and gives up on server shutdown or after the request timeout.
 */
#include "web/web_int.h"

#include "common/common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef MSG_NOSIGNAL /* macOS: SO_NOSIGPIPE is set on the socket instead */
#define MSG_NOSIGNAL 0
#endif

#define PROXY_HEAD_MAX   16384
#define PROXY_CONNECT_MS 2000
#define PROXY_SLICE_MS   250

typedef struct {
	int fd;
	char *pre; /* body bytes that came with the headers */
	size_t pre_len, pre_off;
	const atomic_int *stopping;
	int timeout_ms;
} pstream_t;

/* Waits until fd is ready for ev; 1 ready, 0 timed out or stopping, -1 error. */
static int wait_fd(int fd, short ev, int timeout_ms, const atomic_int *stopping)
{
	int64_t end = now_ms() + timeout_ms;
	for (;;) {
		if (stopping && atomic_load(stopping))
			return 0;
		int64_t left = end - now_ms();
		if (left <= 0)
			return 0;
		struct pollfd p = {.fd = fd, .events = ev};
		int r = poll(&p, 1, (int)MIN(left, PROXY_SLICE_MS));
		if (r > 0)
			return (p.revents & (POLLERR | POLLNVAL)) && !(p.revents & ev) ? -1 : 1;
		if (r < 0 && errno != EINTR)
			return -1;
	}
}

static int upstream_connect(int port, char *err, size_t errlen)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return sh_fail(err, errlen, SH_EIO, "socket: %s", strerror(errno));
#ifdef SO_NOSIGPIPE
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
	if (rc && errno == EINPROGRESS && wait_fd(fd, POLLOUT, PROXY_CONNECT_MS, NULL) == 1) {
		int e = 0;
		socklen_t l = sizeof e;
		getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l);
		rc = e ? -1 : 0;
		errno = e;
	}
	if (rc) {
		sh_fail(err, errlen, SH_EIO, "%s", strerror(errno ? errno : ETIMEDOUT));
		close(fd);
		return -1;
	}
	return fd;
}

int web_proxy_alive(int port)
{
	char err[64];
	int fd = upstream_connect(port, err, sizeof err);
	if (fd >= 0)
		close(fd);
	return fd >= 0;
}

static int send_all(int fd, const char *p, size_t n, const atomic_int *stopping)
{
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
		if (k > 0) {
			p += k, n -= (size_t)k;
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
		    wait_fd(fd, POLLOUT, 30000, stopping) == 1)
			continue;
		return -1;
	}
	return 0;
}

static ssize_t pstream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	pstream_t *s = cls;
	if (s->pre_off < s->pre_len) {
		size_t k = MIN(max, s->pre_len - s->pre_off);
		memcpy(buf, s->pre + s->pre_off, k);
		s->pre_off += k;
		return (ssize_t)k;
	}
	for (;;) {
		int r = wait_fd(s->fd, POLLIN, s->timeout_ms, s->stopping);
		if (r <= 0)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		ssize_t k = recv(s->fd, buf, max, 0);
		if (k > 0)
			return k;
		if (k == 0)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
			return MHD_CONTENT_READER_END_WITH_ERROR;
	}
}

static void pstream_free(void *cls)
{
	pstream_t *s = cls;
	close(s->fd);
	free(s->pre);
	free(s);
}

/* The value of header name in head (CRLF lines), copied into out; 0 when found. */
static int header_get(const char *head, const char *name, char *out, size_t len)
{
	size_t n = strlen(name);
	for (const char *l = strstr(head, "\r\n"); l; l = strstr(l + 2, "\r\n")) {
		const char *h = l + 2;
		if (!strncasecmp(h, name, n) && h[n] == ':') {
			h += n + 1;
			while (*h == ' ' || *h == '\t')
				h++;
			size_t k = strcspn(h, "\r\n");
			snprintf(out, len, "%.*s", (int)k, h);
			return 0;
		}
	}
	return -1;
}

/* An OpenAI-shaped error reply; msg names the port (the log gets it too). */
static enum MHD_Result fail(struct MHD_Connection *c, int status, const char *code,
			    const char *retry, const char *msg)
{
	web_err_t e;
	LOG(LOG_WARN, "proxy: %s", msg);
	web_err_set(&e, status, status == 503 ? "unavailable" : "server_error", NULL, code, "%s",
		    msg);
	char *body = web_json_error(&e);
	if (!body)
		return MHD_NO;
	struct MHD_Response *r =
	    MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", "application/json");
	MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
	if (retry)
		MHD_add_response_header(r, "Retry-After", retry);
	enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
	MHD_destroy_response(r);
	return ok;
}

int web_proxy_answer(struct MHD_Connection *c, int port, const char *method, const char *url,
		     const char *body, size_t body_len, const atomic_int *stopping, int timeout_ms)
{
	char err[160] = "", msg[320], head[PROXY_HEAD_MAX + 1];
	int fd = upstream_connect(port, err, sizeof err);
	if (fd < 0) {
		snprintf(msg, sizeof msg,
			 "the --exec command is not serving on 127.0.0.1:%d (yet): %s", port, err);
		return fail(c, 503, "upstream_unavailable", "2", msg);
	}
	const char *ctype = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
	const char *accept = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept");
	int n = snprintf(head, sizeof head,
			 "%s %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n"
			 "Content-Length: %zu\r\n%s%s%s%s%s%s\r\n",
			 method, url, port, body_len, ctype ? "Content-Type: " : "",
			 ctype ? ctype : "", ctype ? "\r\n" : "", accept ? "Accept: " : "",
			 accept ? accept : "", accept ? "\r\n" : "");
	if (n < 0 || n >= (int)sizeof head || send_all(fd, head, (size_t)n, stopping) ||
	    (body_len && send_all(fd, body, body_len, stopping))) {
		close(fd);
		snprintf(msg, sizeof msg,
			 "could not send %s %.100s to the --exec command on port %d", method, url,
			 port);
		return fail(c, 502, "upstream_error", NULL, msg);
	}
	/* the status line and headers */
	size_t got = 0;
	char *end = NULL;
	while (!end && got < PROXY_HEAD_MAX) {
		if (wait_fd(fd, POLLIN, timeout_ms, stopping) <= 0)
			break;
		ssize_t k = recv(fd, head + got, PROXY_HEAD_MAX - got, 0);
		if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
			continue;
		if (k <= 0)
			break;
		got += (size_t)k;
		head[got] = 0;
		end = strstr(head, "\r\n\r\n");
	}
	int status = 0;
	char te[64] = "", ct[256] = "", cl[32] = "";
	if (!end || sscanf(head, "HTTP/%*d.%*d %d", &status) != 1 || status < 100 || status > 599) {
		close(fd);
		snprintf(msg, sizeof msg,
			 "the --exec command on port %d sent no valid HTTP reply to %s %.100s",
			 port, method, url);
		return fail(c, 502, "upstream_error", NULL, msg);
	}
	*end = 0; /* head now holds the status line and headers only */
	if (!header_get(head, "Transfer-Encoding", te, sizeof te) && strcasecmp(te, "identity")) {
		close(fd);
		snprintf(msg, sizeof msg,
			 "the --exec command on port %d answered an HTTP/1.0 request with a "
			 "chunked body",
			 port);
		return fail(c, 502, "upstream_error", NULL, msg);
	}
	pstream_t *s = calloc(1, sizeof *s);
	size_t rest = got - (size_t)(end + 4 - head);
	if (!s || (rest && !(s->pre = malloc(rest)))) {
		free(s);
		close(fd);
		return MHD_NO;
	}
	if (rest)
		memcpy(s->pre, end + 4, rest);
	s->pre_len = rest;
	s->fd = fd;
	s->stopping = stopping;
	s->timeout_ms = timeout_ms;
	uint64_t size = MHD_SIZE_UNKNOWN;
	if (!header_get(head, "Content-Length", cl, sizeof cl))
		size = strtoull(cl, NULL, 10);
	struct MHD_Response *r =
	    MHD_create_response_from_callback(size, 16384, pstream_read, s, pstream_free);
	if (!r) {
		pstream_free(s);
		return MHD_NO;
	}
	if (!header_get(head, "Content-Type", ct, sizeof ct))
		MHD_add_response_header(r, "Content-Type", ct);
	if (!header_get(head, "Cache-Control", cl, sizeof cl))
		MHD_add_response_header(r, "Cache-Control", cl);
	MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
	enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
	MHD_destroy_response(r);
	return ok;
}
