/*
 * guard.c: keeps one client from starving the others on libmicrohttpd's small pool of event-loop
 * threads: hard deadlines for a request's headers and body, and parked (suspended) connections
 * whose replies wait for a job or a timer, watched by one thread.
 *
 * Deadlines: each connection gets a context (MHD_OPTION_NOTIFY_CONNECTION) holding its socket
 * and the time by which the current phase must end: headers within header_ms of the connection
 * opening or of the previous reply ending (keep-alive), the body within body_ms of the headers.
 * Bytes arriving do not move it, unlike libmicrohttpd's idle timeout. The watch thread shuts an
 * overdue socket down (both directions); libmicrohttpd's loop then reads end-of-file and closes
 * the connection itself, so the library keeps owning the descriptor.
 *
 * Parks: see web_int.h. The watch thread also checks each suspended connection for a client that
 * hung up (a suspended connection is not polled by libmicrohttpd), a job past its deadline, and a
 * timer that is due, and resumes it once a second as a safety net against a lost wake-up.
 *
 * Invariant: a context or a park is on its list only while libmicrohttpd has not closed its
 * socket (NOTIFY_CLOSED and response/request teardown both run before the close), and the list
 * mutex is held while the watch thread touches a socket, so it never acts on a reused number.
 */
#include "web/web_int.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "common/common.h"

#define WATCH_MS  200  /* watch thread period */
#define SAFETY_MS 1000 /* a parked job is resumed at least this often */

typedef struct cx {
	int fd;
	int64_t deadline; /* now_ms(); 0 = none */
	int closed;       /* shut down by the watch thread already */
	struct cx *prev, *next;
} cx_t;

struct web_guard {
	pthread_mutex_t mu; /* the two lists, stopping */
	pthread_cond_t cv;  /* the watch thread's sleep; signalled at free */
	cx_t *conns;
	web_park_t *parks;
	atomic_int stopping;
	int quit;
	int header_ms, body_ms;
	web_sched_t *sched;
	pthread_t thread;
	int started;
};

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

/* Resumes p (caller holds p->mu). */
static void park_resume_locked(web_park_t *p)
{
	if (p->suspended) {
		p->suspended = 0;
		MHD_resume_connection(p->c);
	}
}

void web_park_wake(void *arg)
{
	web_park_t *p = arg;
	pthread_mutex_lock(&p->mu);
	park_resume_locked(p);
	pthread_mutex_unlock(&p->mu);
}

/* One pass of the watch thread (caller holds g->mu). */
static void watch_pass(web_guard_t *g, int64_t now, int safety)
{
	for (cx_t *x = g->conns; x; x = x->next) {
		if (x->deadline && now > x->deadline && !x->closed) {
			x->closed = 1;
			LOG(LOG_DEBUG, "web: closing a connection that missed its deadline");
			shutdown(x->fd, SHUT_RDWR);
		}
	}
	for (web_park_t *p = g->parks; p; p = p->next) {
		pthread_mutex_lock(&p->mu);
		int susp = p->suspended;
		pthread_mutex_unlock(&p->mu);
		if (!susp)
			continue;
		web_job_t *j = p->job;
		if (j && peer_gone(p->fd)) /* ends the job, whose wake-up resumes p */
			web_sched_cancel(g->sched, j, 1);
		else if (j && now > j->deadline_ms + 1000)
			web_sched_cancel(g->sched, j, 2);
		int64_t at = atomic_load(&p->wake_at);
		if ((at && now >= at) || (j && safety))
			web_park_wake(p);
	}
}

static void *watch_main(void *arg)
{
	web_guard_t *g = arg;
	int64_t last_safety = now_ms();
	pthread_mutex_lock(&g->mu);
	while (!g->quit) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += WATCH_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&g->cv, &g->mu, &ts);
		if (g->quit)
			break;
		int64_t now = now_ms();
		int safety = now - last_safety >= SAFETY_MS;
		if (safety)
			last_safety = now;
		watch_pass(g, now, safety);
	}
	pthread_mutex_unlock(&g->mu);
	return NULL;
}

int web_guard_new(web_guard_t **out, web_sched_t *sched, int header_ms, int body_ms)
{
	*out = NULL;
	web_guard_t *g = calloc(1, sizeof *g);
	if (!g)
		return SH_ENOMEM;
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	g->sched = sched;
	g->header_ms = header_ms > 0 ? header_ms : 15000;
	g->body_ms = body_ms > 0 ? body_ms : 60000;
	if (pthread_create(&g->thread, NULL, watch_main, g) != 0) {
		web_guard_free(g);
		return SH_EIO;
	}
	g->started = 1;
	*out = g;
	return 0;
}

void web_guard_stop(web_guard_t *g)
{
	if (!g)
		return;
	pthread_mutex_lock(&g->mu);
	atomic_store(&g->stopping, 1);
	for (web_park_t *p = g->parks; p; p = p->next)
		web_park_wake(p);
	pthread_mutex_unlock(&g->mu);
}

void web_guard_free(web_guard_t *g)
{
	if (!g)
		return;
	if (g->started) {
		pthread_mutex_lock(&g->mu);
		g->quit = 1;
		pthread_cond_signal(&g->cv);
		pthread_mutex_unlock(&g->mu);
		pthread_join(g->thread, NULL);
	}
	/* libmicrohttpd has closed every connection by now (NOTIFY_CLOSED freed each context) */
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
	free(g);
}

void web_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
		      enum MHD_ConnectionNotificationCode toe)
{
	web_guard_t *g = cls;
	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		cx_t *x = calloc(1, sizeof *x);
		if (!x)
			return; /* this connection just has no deadline */
		const union MHD_ConnectionInfo *ci =
		    MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
		x->fd = ci ? (int)ci->connect_fd : -1;
		x->deadline = now_ms() + g->header_ms;
		pthread_mutex_lock(&g->mu);
		x->next = g->conns;
		if (g->conns)
			g->conns->prev = x;
		g->conns = x;
		pthread_mutex_unlock(&g->mu);
		*socket_context = x;
		return;
	}
	cx_t *x = *socket_context;
	if (!x)
		return;
	pthread_mutex_lock(&g->mu);
	if (x->prev)
		x->prev->next = x->next;
	else
		g->conns = x->next;
	if (x->next)
		x->next->prev = x->prev;
	pthread_mutex_unlock(&g->mu);
	free(x);
	*socket_context = NULL;
}

void web_guard_phase(web_guard_t *g, struct MHD_Connection *c, int phase)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	cx_t *x = ci ? ci->socket_context : NULL;
	if (!x)
		return;
	int64_t now = now_ms();
	pthread_mutex_lock(&g->mu);
	x->deadline = phase == WEB_PHASE_HEADERS ? now + g->header_ms
		      : phase == WEB_PHASE_BODY  ? now + g->body_ms
						 : 0;
	pthread_mutex_unlock(&g->mu);
}

void web_park_attach(web_guard_t *g, web_park_t *p)
{
	pthread_mutex_init(&p->mu, NULL);
	p->suspended = 0;
	pthread_mutex_lock(&g->mu);
	p->prev = NULL;
	p->next = g->parks;
	if (g->parks)
		g->parks->prev = p;
	g->parks = p;
	pthread_mutex_unlock(&g->mu);
}

void web_park_detach(web_guard_t *g, web_park_t *p)
{
	pthread_mutex_lock(&g->mu);
	if (p->prev)
		p->prev->next = p->next;
	else
		g->parks = p->next;
	if (p->next)
		p->next->prev = p->prev;
	p->prev = p->next = NULL;
	pthread_mutex_unlock(&g->mu);
	pthread_mutex_destroy(&p->mu);
}

int web_park_suspend(web_guard_t *g, web_park_t *p)
{
	/* g->stopping is read under p->mu's protection: web_guard_stop sets it under g->mu and then
	 * takes every p->mu, so either we see it here or it sees p suspended and resumes it. */
	pthread_mutex_lock(&p->mu);
	int stopping = atomic_load(&g->stopping);
	if (!stopping && !p->suspended) {
		p->suspended = 1;
		MHD_suspend_connection(p->c);
	}
	pthread_mutex_unlock(&p->mu);
	return !stopping;
}
