/*
 * net.c: TCP plumbing under the channel: listen, accept, connect with a deadline, socket options,
 * address formatting, and the one poll() wait every blocking path goes through.
 *
 * Invariant: nothing here blocks past the deadline it was given; every socket it returns is
 * close-on-exec, and connected sockets have TCP_NODELAY and keepalive.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "transport/chan.h"

int64_t tp_deadline(int timeout_ms)
{
	return timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
}

int tp_left_ms(int64_t deadline)
{
	if (deadline < 0)
		return -1;
	int64_t left = deadline - now_ms();
	return left <= 0 ? 0 : (int)MIN(left, 1 << 30);
}

int tp_wait_fd(int fd, short events, int64_t deadline)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = events};
		int n = poll(&p, 1, tp_left_ms(deadline));
		if (n > 0)
			return 0; /* readable/writable, or an error the next read/write reports */
		if (n == 0)
			return SH_ETIMEDOUT;
		if (errno != EINTR)
			return SH_EIO;
	}
}

static void tp_sa_format(const struct sockaddr *sa, char *out, size_t outlen)
{
	char host[INET6_ADDRSTRLEN] = "?";
	int port = 0;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
		inet_ntop(AF_INET, &s4->sin_addr, host, sizeof host);
		port = ntohs(s4->sin_port);
		snprintf(out, outlen, "%s:%d", host, port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
		port = ntohs(s6->sin6_port);
		if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
			inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], host, sizeof host);
			snprintf(out, outlen, "%s:%d", host, port);
		} else {
			inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof host);
			snprintf(out, outlen, "[%s]:%d", host, port);
		}
	} else {
		snprintf(out, outlen, "(local)");
	}
}

void tp_fd_peer_addr(int fd, char *out, size_t outlen)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) {
		snprintf(out, outlen, "(unknown)");
		return;
	}
	tp_sa_format((struct sockaddr *)&ss, out, outlen);
}

void tp_tcp_tune(int fd)
{
	int one = 1;
	/* Options fail harmlessly on a socketpair (tests): ignore the results. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	(void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
#ifdef SO_NOSIGPIPE /* macOS: no MSG_NOSIGNAL */
	(void)setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
#ifdef TCP_KEEPIDLE
	int idle = 10, intvl = 5, cnt = 3; /* a vanished host is noticed within ~25 s when idle */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
#endif
	int fl = fcntl(fd, F_GETFD);
	if (fl >= 0)
		(void)fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
}

int tp_listen(const char *host, int port, int *fd_out, int *bound_port, char *err, size_t errlen)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
	struct addrinfo *res = NULL;
	char ports[16];
	if (port < 0 || port > 65535)
		return sh_fail(err, errlen, SH_EINVAL, "bad port %d", port);
	snprintf(ports, sizeof ports, "%d", port);
	const char *h = (host && *host) ? host : NULL;
	int rc = getaddrinfo(h, ports, &hints, &res);
	if (rc != 0)
		return sh_fail(err, errlen, SH_EINVAL, "listen address %s: %s", h ? h : "*",
			       gai_strerror(rc));
	/* Wildcard: prefer one dual-stack IPv6 socket, which also takes IPv4. */
	int fd = -1, last_errno = 0;
	for (int pass = 0; pass < 2 && fd < 0; pass++) {
		for (struct addrinfo *a = res; a; a = a->ai_next) {
			if (!h && pass == 0 && a->ai_family != AF_INET6)
				continue;
			fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
			if (fd < 0) {
				last_errno = errno;
				continue;
			}
			int one = 1, zero = 0;
			(void)fcntl(fd, F_SETFD, FD_CLOEXEC);
			(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
			if (a->ai_family == AF_INET6 && !h)
				(void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
			if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0)
				break;
			last_errno = errno;
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	if (fd < 0)
		return sh_fail(err, errlen, SH_EIO, "listen on %s:%d: %s", h ? h : "*", port,
			       strerror(last_errno));
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	int bp = port;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
		bp = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
					      : ntohs(((struct sockaddr_in *)&ss)->sin_port);
	*fd_out = fd;
	if (bound_port)
		*bound_port = bp;
	return 0;
}

int tp_accept(int listen_fd, int *fd_out, char *peer, size_t peerlen, int timeout_ms, char *err,
	      size_t errlen)
{
	int64_t deadline = tp_deadline(timeout_ms);
	for (;;) {
		int rc = tp_wait_fd(listen_fd, POLLIN, deadline);
		if (rc == SH_ETIMEDOUT)
			return sh_fail(err, errlen, rc, "no connection within %d ms", timeout_ms);
		if (rc)
			return sh_fail(err, errlen, rc, "poll: %s", strerror(errno));
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		int fd = accept(listen_fd, (struct sockaddr *)&ss, &sl);
		if (fd < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK ||
			    errno == ECONNABORTED)
				continue;
			return sh_fail(err, errlen, SH_EIO, "accept: %s", strerror(errno));
		}
		tp_tcp_tune(fd);
		if (peer)
			tp_sa_format((struct sockaddr *)&ss, peer, peerlen);
		*fd_out = fd;
		return 0;
	}
}

/* One non-blocking connect attempt to one address, finished within the deadline. */
static int tp_connect_one(const struct addrinfo *a, int64_t deadline, int *fd_out, int *err_no)
{
	int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
	if (fd < 0) {
		*err_no = errno;
		return SH_EIO;
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		(void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
		if (errno != EINPROGRESS) {
			*err_no = errno;
			close(fd);
			return SH_EIO;
		}
		int rc = tp_wait_fd(fd, POLLOUT, deadline);
		if (rc) {
			*err_no = rc == SH_ETIMEDOUT ? ETIMEDOUT : errno;
			close(fd);
			return rc;
		}
		int soerr = 0;
		socklen_t sl = sizeof soerr;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr) {
			*err_no = soerr ? soerr : errno;
			close(fd);
			return SH_EIO;
		}
	}
	/* Back to blocking mode: the channel uses MSG_DONTWAIT per call instead. */
	fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		(void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	tp_tcp_tune(fd);
	*fd_out = fd;
	return 0;
}

int tp_tcp_connect(const char *host, int port, int64_t deadline, int *fd_out, char *addr,
		   size_t addrlen, char *err, size_t errlen)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_ADDRCONFIG};
	struct addrinfo *res = NULL;
	char ports[16];
	if (!host || !*host || port <= 0 || port > 65535)
		return sh_fail(err, errlen, SH_EINVAL, "bad address %s:%d", host ? host : "",
			       port);
	snprintf(ports, sizeof ports, "%d", port);
	int rc = getaddrinfo(host, ports, &hints, &res);
	if (rc != 0 && rc != EAI_AGAIN && rc != EAI_MEMORY) {
		hints.ai_flags = 0; /* AI_ADDRCONFIG hides loopback-only setups (netns) */
		rc = getaddrinfo(host, ports, &hints, &res);
	}
	if (rc != 0)
		return sh_fail(err, errlen, SH_ENOENT, "%s: %s", host, gai_strerror(rc));
	int fd = -1, err_no = 0;
	rc = SH_EIO;
	for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
		rc = tp_connect_one(a, deadline, &fd, &err_no);
		if (rc == SH_ETIMEDOUT)
			break;
	}
	freeaddrinfo(res);
	if (fd < 0)
		return sh_fail(err, errlen, rc == SH_ETIMEDOUT ? SH_ETIMEDOUT : SH_EIO,
			       "connect to %s:%d: %s", host, port, strerror(err_no));
	if (addr)
		tp_fd_peer_addr(fd, addr, addrlen);
	*fd_out = fd;
	return 0;
}

int tp_hostport_parse(const char *s, char *host, size_t hostlen, int *port, char *err,
		      size_t errlen)
{
	const char *h = s, *colon;
	size_t hl;
	if (!s || !*s)
		return sh_fail(err, errlen, SH_EINVAL, "empty address (want HOST:PORT)");
	if (*s == '[') {
		const char *close = strchr(s, ']');
		if (!close || close[1] != ':')
			return sh_fail(err, errlen, SH_EINVAL, "bad address %s (want [IPV6]:PORT)",
				       s);
		h = s + 1;
		hl = (size_t)(close - h);
		colon = close + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon || strchr(s, ':') != colon)
			return sh_fail(err, errlen, SH_EINVAL, "bad address %s (want HOST:PORT)", s);
		hl = (size_t)(colon - s);
	}
	char *end = NULL;
	long p = strtol(colon + 1, &end, 10);
	if (hl == 0 || colon[1] == 0 || *end || p < 1 || p > 65535)
		return sh_fail(err, errlen, SH_EINVAL, "bad address %s (want HOST:PORT)", s);
	if (hl >= hostlen)
		return sh_fail(err, errlen, SH_EINVAL, "host name too long in %s", s);
	memcpy(host, h, hl);
	host[hl] = 0;
	*port = (int)p;
	return 0;
}
