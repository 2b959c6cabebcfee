/*
 * mdns_internal.h: what the mDNS backends (mdns_avahi.c, mdns_dnssd.c) share: the event queue
 * that carries their callbacks' results to the agent's thread.
 */
#ifndef SHOAL_MDNS_INTERNAL_H
#define SHOAL_MDNS_INTERNAL_H

#include "discovery/discovery.h"

/* A FIFO of events, safe to push from the backend's thread and pop from the caller's. Its file
 * descriptor (a pipe's read end) is readable exactly while the queue is not empty. */
typedef struct disc_queue disc_queue_t;

disc_queue_t *disc_queue_new(void);
void disc_queue_free(disc_queue_t *q);
int disc_queue_fd(const disc_queue_t *q);
/* Copies ev in; drops it (with a log line) only when out of memory. */
void disc_queue_push(disc_queue_t *q, const disc_event_t *ev);
int disc_queue_pop(disc_queue_t *q, disc_event_t *ev); /* 1 and an event, or 0 */

#endif
