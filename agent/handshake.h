/*
 * handshake.h (internal to agent/): the control channel's handshakes (HELLO + challenge-response,
 * transport.h), each on a short-lived thread of its own, so the loop never waits for a peer. A
 * finished handshake comes back through a pipe the loop polls.
 *
 * Threads: handshakes_* belong to the loop's thread; the workers touch only their own record and
 * the pipe. Ownership: a record given to handshakes_start is the set's until handshakes_next
 * hands it back (the caller then frees it with free(), and its channel unless it keeps it).
 */
#ifndef SHOAL_AGENT_HANDSHAKE_H
#define SHOAL_AGENT_HANDSHAKE_H

#include "discovery/discovery.h"
#include "transport/transport.h"

#define HANDSHAKE_MS 2000 /* the whole handshake, either direction */

typedef struct handshake {
	int outgoing;             /* 1: connect to host:port; 0: accept on fd */
	char host[DISC_HOST_MAX]; /* incoming: the peer's address, for the log */
	int port;
	int fd;           /* incoming: the accepted socket (closed on failure) */
	int static_index; /* the caller's bookkeeping, handed back as given: --peer i, else -1 */
	disc_id_t target; /* ...: the mDNS peer dialled (zero for static or incoming) */
	/* the result */
	tp_chan_t *ch; /* authenticated channel (rc == 0) */
	int rc;
	char err[256];
} handshake_t;

typedef struct handshakes handshakes_t;

/* keys and self are borrowed for the set's life. Returns 0 or SH_E* with a reason. */
int handshakes_new(handshakes_t **out, const tp_keys_t *keys, const disc_id_t *self, char *err,
		   size_t errlen);
/* Waits for the running handshakes (at most their timeout) and frees every result. NULL-safe. */
void handshakes_free(handshakes_t *h);

/* Starts d (malloc'd; the set's from now on) on a thread. Returns 0, or SH_EIO when no thread
 * could start: then d is freed (and an incoming fd closed). */
int handshakes_start(handshakes_t *h, handshake_t *d);
int handshakes_running(const handshakes_t *h); /* threads still at work */
int handshakes_fd(const handshakes_t *h);      /* readable when a result is ready */
handshake_t *handshakes_next(handshakes_t *h); /* a finished one (the caller's), or NULL */

#endif
