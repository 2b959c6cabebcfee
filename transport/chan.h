/*
 * chan.h (internal to transport/ and its tests): the channel's struct and the non-blocking
 * progress calls that the group uses to drive many channels from one poll() loop.
 *
 * A channel has one outgoing frame slot (tx) and one incoming frame slot (rx), each in a buffer
 * that grows to the largest frame seen and is then reused: no allocation per frame in steady
 * state.
 */
#ifndef SHOAL_TP_CHAN_H
#define SHOAL_TP_CHAN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "transport/frame.h"
#include "transport/transport.h"

struct tp_chan {
	int fd;
	atomic_int dead; /* 0, or the error that killed the channel (sticky; the sending and the
			    receiving thread may both set it) */
	int sealed;     /* 0 during the handshake (plaintext frames), 1 afterwards */
	int send_timeout_ms;
	char peer_addr[64];
	uint8_t peer_id[TP_NODE_ID_BYTES];
	uint8_t tx_key[32], rx_key[32];
	uint64_t tx_ctr, rx_ctr; /* frames sent / received since the handshake: the AEAD nonces */
	pthread_mutex_t tx_lock;
	/* tx: a built frame tx_buf[0..tx_len) of which tx_off bytes are on the wire */
	uint8_t *tx_buf;
	size_t tx_cap, tx_len, tx_off;
	/* rx: rx_got bytes of the current frame in rx_buf; rx_done once decrypted and not yet
	 * consumed by the caller (reset on the next receive) */
	uint8_t *rx_buf;
	size_t rx_cap, rx_got;
	uint32_t rx_body; /* the frame's body length; 0 until its header is in */
	size_t rx_hint;   /* the next frame's total size when the caller knows it (0: not known):
			     read in one go; cleared when the frame completes */
	int rx_done;
	uint16_t rx_type;
	/* link-probe responder (probe.c): the burst being received */
	int64_t burst_t0;     /* arrival of its frame 0 (now_ns) */
	uint64_t burst_bytes; /* data bytes received so far */
};

/* Starts a frame: type, then hdr[0..hlen) and data[0..dlen) as its payload (hlen + dlen <=
 * TP_MAX_PAYLOAD), sealed when the channel is. The previous frame must be fully sent. Caller
 * holds tx_lock when other threads may send. Returns 0, SH_EINVAL, SH_ENOMEM or the dead code. */
int tp_chan_tx_start(tp_chan_t *c, uint16_t type, const void *hdr, size_t hlen, const void *data,
		     size_t dlen);

/* Writes what the socket takes without blocking. 1 = frame fully sent, 0 = more to send,
 * < 0 = error (channel dead). */
int tp_chan_tx_progress(tp_chan_t *c);

/* Reads what is available without blocking. 1 = a frame is complete (see tp_chan_rx_take),
 * 0 = need more bytes, < 0 = error (channel dead). */
int tp_chan_rx_progress(tp_chan_t *c);

/* The completed frame (after rx_progress returned 1); the next rx_progress starts a new one. */
void tp_chan_rx_take(tp_chan_t *c, uint16_t *type, uint8_t **payload, size_t *len);

/* Runs the handshake on any connected stream socket (tests use socketpairs): initiator 1 plays
 * the connecting side. Takes ownership of fd. */
int tp_chan_open_fd(tp_chan_t **out, int fd, int initiator, const tp_keys_t *k,
		    const uint8_t my_id[TP_NODE_ID_BYTES], int timeout_ms, char *err,
		    size_t errlen);

/* Waits until fd is readable (events POLLIN) or writable (POLLOUT) or the deadline (now_ms()
 * clock; -1 = none) passes. Returns 0, SH_ETIMEDOUT or SH_EIO. */
int tp_wait_fd(int fd, short events, int64_t deadline);

/* Deadline from a timeout (-1 stays -1 = forever). */
int64_t tp_deadline(int timeout_ms);
/* Milliseconds left until a deadline, for poll() (-1 = forever, 0 when passed). */
int tp_left_ms(int64_t deadline);

/* Connects a TCP socket to host:port within the deadline. *fd gets the connected socket with
 * TCP_NODELAY and keepalive set; addr (may be NULL) gets "addr:port". */
int tp_tcp_connect(const char *host, int port, int64_t deadline, int *fd, char *addr,
		   size_t addrlen, char *err, size_t errlen);

/* Sets TCP_NODELAY, keepalive and close-on-exec on a connected socket. */
void tp_tcp_tune(int fd);

/* "addr:port" of the socket's peer. */
void tp_fd_peer_addr(int fd, char *out, size_t outlen);

#endif
