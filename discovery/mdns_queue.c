/*
 * mdns_queue.c: the event queue between an mDNS backend's thread and the agent's loop.
 *
 * Invariant (under the mutex): the pipe holds one byte exactly when the list is not empty, so a
 * poll() on the read end wakes the consumer once per batch and never spins.
 */
#include "common/common.h"
#include "discovery/mdns_internal.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct item {
	struct item *next;
	disc_event_t ev;
};

struct disc_queue {
	pthread_mutex_t lock;
	struct item *head, *tail;
	int rfd, wfd;
};

disc_queue_t *disc_queue_new(void)
{
	disc_queue_t *q = calloc(1, sizeof *q);
	int p[2];
	if (!q)
		return NULL;
	if (pipe(p) != 0) {
		free(q);
		return NULL;
	}
	for (int i = 0; i < 2; i++) {
		fcntl(p[i], F_SETFL, fcntl(p[i], F_GETFL) | O_NONBLOCK);
		fcntl(p[i], F_SETFD, FD_CLOEXEC);
	}
	q->rfd = p[0];
	q->wfd = p[1];
	pthread_mutex_init(&q->lock, NULL);
	return q;
}

void disc_queue_free(disc_queue_t *q)
{
	if (!q)
		return;
	for (struct item *it = q->head, *nx; it; it = nx) {
		nx = it->next;
		free(it);
	}
	close(q->rfd);
	close(q->wfd);
	pthread_mutex_destroy(&q->lock);
	free(q);
}

int disc_queue_fd(const disc_queue_t *q)
{
	return q->rfd;
}

void disc_queue_push(disc_queue_t *q, const disc_event_t *ev)
{
	struct item *it = malloc(sizeof *it);
	if (!it) {
		LOG(LOG_ERROR, "mdns: out of memory, event dropped");
		return;
	}
	it->ev = *ev;
	it->next = NULL;
	pthread_mutex_lock(&q->lock);
	if (q->tail)
		q->tail->next = it;
	else {
		q->head = it;
		char b = 1;
		if (write(q->wfd, &b, 1) != 1)
			LOG(LOG_ERROR, "mdns: event pipe write failed");
	}
	q->tail = it;
	pthread_mutex_unlock(&q->lock);
}

int disc_queue_pop(disc_queue_t *q, disc_event_t *ev)
{
	pthread_mutex_lock(&q->lock);
	struct item *it = q->head;
	if (it) {
		q->head = it->next;
		if (!q->head) {
			q->tail = NULL;
			char b[16];
			while (read(q->rfd, b, sizeof b) > 0)
				;
		}
	}
	pthread_mutex_unlock(&q->lock);
	if (!it)
		return 0;
	*ev = it->ev;
	free(it);
	return 1;
}
