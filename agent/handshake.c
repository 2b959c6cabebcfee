/*
 * handshake.c: handshakes on their own threads (handshake.h).
 *
 * Invariant: every record started is handed back exactly once (through the pipe) or freed here
 * (the pipe is gone: the set is being freed); `running` counts the threads not yet done with it.
 */
#include "agent/handshake.h"
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct handshakes {
	const tp_keys_t *keys;
	disc_id_t self;
	int pipe[2];
	atomic_int running;
};

typedef struct job {
	handshakes_t *h;
	handshake_t *d;
} job_t;

static void *handshake_main(void *arg)
{
	job_t *j = arg;
	handshakes_t *h = j->h;
	handshake_t *d = j->d;
	free(j);
	if (d->outgoing)
		d->rc = tp_chan_connect(&d->ch, d->host, d->port, h->keys, h->self.b, HANDSHAKE_MS,
					d->err, sizeof d->err);
	else
		d->rc = tp_chan_accept(&d->ch, d->fd, h->keys, h->self.b, HANDSHAKE_MS, d->err,
				       sizeof d->err);
	if (write(h->pipe[1], &d, sizeof d) != sizeof d) {
		tp_chan_free(d->ch); /* the agent is going away */
		free(d);
	}
	atomic_fetch_sub(&h->running, 1);
	return NULL;
}

int handshakes_start(handshakes_t *h, handshake_t *d)
{
	pthread_t t;
	pthread_attr_t at;
	job_t *j = malloc(sizeof *j);
	int rc = j ? 0 : -1;
	if (j) {
		*j = (job_t){h, d};
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		atomic_fetch_add(&h->running, 1);
		rc = pthread_create(&t, &at, handshake_main, j);
		pthread_attr_destroy(&at);
	}
	if (rc) {
		if (j)
			atomic_fetch_sub(&h->running, 1);
		free(j);
		if (!d->outgoing)
			close(d->fd);
		free(d);
		return SH_EIO;
	}
	return 0;
}

int handshakes_running(const handshakes_t *h)
{
	return atomic_load(&h->running);
}

int handshakes_fd(const handshakes_t *h)
{
	return h->pipe[0];
}

handshake_t *handshakes_next(handshakes_t *h)
{
	handshake_t *d;
	return read(h->pipe[0], &d, sizeof d) == sizeof d ? d : NULL;
}

int handshakes_new(handshakes_t **out, const tp_keys_t *keys, const disc_id_t *self, char *err,
		   size_t errlen)
{
	handshakes_t *h = calloc(1, sizeof *h);
	*out = NULL;
	if (!h)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	h->keys = keys;
	h->self = *self;
	atomic_init(&h->running, 0);
	if (pipe(h->pipe) != 0) {
		free(h);
		return sh_fail(err, errlen, SH_EIO, "pipe: %s", strerror(errno));
	}
	for (int i = 0; i < 2; i++) {
		fcntl(h->pipe[i], F_SETFL, fcntl(h->pipe[i], F_GETFL) | O_NONBLOCK);
		fcntl(h->pipe[i], F_SETFD, FD_CLOEXEC);
	}
	*out = h;
	return 0;
}

void handshakes_free(handshakes_t *h)
{
	if (!h)
		return;
	/* handshakes still running hold a pointer to us: let them finish (bounded by their
	 * timeout); each writes its result into the pipe, which we drain and free */
	int64_t end = now_ms() + HANDSHAKE_MS + 1000;
	handshake_t *d;
	while (atomic_load(&h->running) > 0 && now_ms() < end) {
		while ((d = handshakes_next(h))) {
			tp_chan_free(d->ch);
			free(d);
		}
		usleep(10000);
	}
	while ((d = handshakes_next(h))) {
		tp_chan_free(d->ch);
		free(d);
	}
	close(h->pipe[0]);
	close(h->pipe[1]);
	free(h);
}
