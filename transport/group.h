/*
 * group.h (internal to transport/): the group's struct and the exchange engine that collectives
 * are built from. One exchange = at most one frame sent to and one frame received from each
 * peer, all progressed together from one poll() loop until done or the deadline passes, so no
 * pattern of sends and receives can deadlock on full socket buffers.
 */
#ifndef SHOAL_TP_GROUP_H
#define SHOAL_TP_GROUP_H

#include <stddef.h>
#include <stdint.h>

#include "transport/chan.h"
#include "transport/transport.h"

/* Collective ops: the `op` field of COLL frames (never reused). */
enum tp_coll_op {
	TP_OP_ALLREDUCE_DIRECT = 1,
	TP_OP_REDUCE_SCATTER = 2,
	TP_OP_ALL_GATHER_RING = 3,
	TP_OP_BROADCAST = 4,
	TP_OP_ALL_GATHER = 5,
	TP_OP_BARRIER = 6,
	TP_OP_P2P = 7,
	TP_OP_ALLREDUCE_2PHASE = 8,
	TP_OP_ALLREDUCE_Q8 = 9,
	TP_OP_MSG = 10,              /* tagged point-to-point message of any length (p2p.c) */
	TP_OP_ALLREDUCE_STREAM = 11, /* streamed all-reduce, step = chunk (stream.c) */
	TP_OP_REDUCE = 12,           /* the team's sum to one member (coll.c tp_reduce_team) */
	TP_OP_REDUCE_Q8 = 13,        /* ... with the q8 wire */
};
/* Retired: 2 (ring reduce-scatter) and 3 (ring all-gather), replaced by the 2-phase path whose
 * sums do not depend on the message size. */

/* All-reduce path threshold: direct (one exchange) while (team - 1) x bytes <= this. */
#define TP_DIRECT_MAX_DEFAULT (32u << 10)
/* How long an exchange polls without sleeping before it sleeps in poll() (tp_group_set_spin). */
#define TP_SPIN_US_DEFAULT 100
/* Streamed all-reduce: chunks of at least this many bytes, each within one TCP segment (1448
 * bytes at MTU 1500, less our 38 bytes of framing), at most TP_STREAM_MAX_CHUNKS. 32 q8 blocks:
 * a 2048-wide sum on the q8 wire (2304 bytes) goes in 2 chunks; in the latency lab (40 us one
 * way) that cut the all-reduce from 117 to 85 us (median, after 300 us of work) and the
 * network's share of the 0.85B model's decode step from 27.8 to 25.3 % (1200 bytes had left it
 * in one piece). */
#define TP_STREAM_CHUNK_BYTES 1152
#define TP_STREAM_MAX_CHUNKS  8

/* Per-peer slot of one exchange. */
typedef struct tp_xfer {
	const void *sdata; /* bytes to send (NULL with slen 0 is an empty frame) */
	size_t slen;
	int send;          /* 1: send a frame to this peer */
	int recv;          /* 1: expect a frame from this peer */
	size_t rlen;       /* expected data bytes (rany: the most accepted; set to the received) */
	int rany;          /* 1: accept any length up to rlen */
	int tcp;           /* 1: never over RDMA (tagged messages: their length is not known
			      ahead, so the receiver could not tell which path they take) */
	uint8_t spre[8];   /* spre_len bytes sent between the COLL header and sdata (TCP only) */
	int spre_len;
	const uint8_t *rdata; /* out: the received data, in the channel's buffer (valid until the
				 next exchange involving this peer) */
	int sdone, rdone;  /* progress */
	int srdma, rrdma;  /* this frame goes over the pair's RDMA link (set by the exchange) */
} tp_xfer_t;

struct tp_rdma_link;

/* The ranks taking part in one collective: ascending ranks of the group, ours at index me. */
typedef struct tp_team {
	int n, me;
	int r[TP_MAX_WORLD];
} tp_team_t;

/* A streamed all-reduce in progress (stream.c). */
typedef struct tp_stream {
	int active, nchunks, next; /* chunks pushed so far */
	tp_team_t t;
	float *buf;
	size_t rows, cols;
	int64_t deadline;
	int timeout_ms;
	float *stage; /* chunk columns of every row, gathered (rows > 1) */
	size_t stage_cap;
} tp_stream_t;

struct tp_group {
	int rank, world;
	uint64_t tag;
	int broken;          /* 0, or the sticky error of a failed call */
	char broken_msg[256];
	int stalled; /* the rank that did not answer in time when that broke it, or -1 */
	uint32_t tx_seq[TP_MAX_WORLD], rx_seq[TP_MAX_WORLD]; /* COLL frames sent to / received
								  from each rank: the `seq` field */
	uint64_t bytes_sent;
	size_t direct_max; /* all-reduce: the direct path when (team - 1) x bytes <= this */
	int64_t spin_ns;   /* exchanges poll without sleeping this long before poll() sleeps */
	int stream;        /* tp_group_set_stream: -1 auto (with the q8 wire), 0 never, 1 also
			      f32, 2..8 forced chunks */
	tp_chan_t *chan[TP_MAX_WORLD];          /* NULL for our own rank */
	struct tp_rdma_link *rdma[TP_MAX_WORLD]; /* NULL: the pair uses TCP */
	char addr[TP_MAX_WORLD][64];
	tp_xfer_t xf[TP_MAX_WORLD];
	int q8;              /* all-reduce with 8-bit blocks on the wire (coll_q8.c) */
	uint8_t *qbuf;       /* our vector, quantized */
	size_t qcap;
	tp_stream_t st;
};

/* Runs one exchange described by g->xf[] (slots of peers not involved must be zeroed: use
 * tp_xfer_reset first). op/step/offset label the frames; a received frame with another seq, op,
 * step, offset or length is an error. Returns 0 or an error (the group is then broken and err
 * names the rank). */
int tp_group_exchange(tp_group_t *g, uint16_t op, uint16_t step, uint32_t offset,
		      int64_t deadline, int timeout_ms, const char *what, char *err,
		      size_t errlen);

/* Breaks the group for good with rc and the formatted reason (logged once), which also goes to
 * err; returns rc. */
int tp_group_break(tp_group_t *g, int rc, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Clears every slot of g->xf. */
void tp_xfer_reset(tp_group_t *g);

/* coll.c: a team from the caller's list (NULL = every rank). Returns 0 or SH_EINVAL (not
 * ascending, out of range, or without our rank) with a message. */
int tp_team_make(const tp_group_t *g, const int *ranks, int nranks, tp_team_t *t, char *err,
		 size_t errlen);

/* coll_q8.c: the quantized all-reduce, and its pure block codec (tests use them). Blocks are
 * per row: a row of cols floats is ceil(cols / 32) blocks, the last one short when cols is not a
 * multiple of 32, so a row's bytes never depend on the rows around it. */
int tp_allreduce_q8(tp_group_t *g, const tp_team_t *t, float *buf, size_t rows, size_t cols,
		    int64_t deadline, int timeout_ms, char *err, size_t errlen);
/* ... and its reduce to one member, team index root: the bits the all-reduce gives it. */
int tp_reduce_q8(tp_group_t *g, const tp_team_t *t, int root, float *buf, size_t rows,
		 size_t cols, int64_t deadline, int timeout_ms, char *err, size_t errlen);
size_t tp_q8_size(size_t n);
/* Quantized blocks [b0, b1) of x (rows of cols floats, blocks per row) to out / back. */
void tp_q8_encode_blocks(uint8_t *out, const float *x, size_t cols, size_t b0, size_t b1);
void tp_q8_decode_blocks(float *x, const uint8_t *in, size_t cols, size_t b0, size_t b1, int add);
/* The q8 buffer for n bytes (g->qbuf). */
int tp_q8_reserve(tp_group_t *g, size_t bytes, char *err, size_t errlen);
/* coll.c: dst[i] = src[0][i] + ... + src[k-1][i] in that order (a source may be dst). */
void tp_sum_ordered(float *dst, const uint8_t *const *src, int k, size_t n);
void tp_q8_encode(uint8_t *out, const float *x, size_t n);
void tp_q8_decode(float *acc, const uint8_t *in, size_t n, int add);

/* Fails fast when the group is broken (returns its error with the first failure's message). */
int tp_group_check(tp_group_t *g, char *err, size_t errlen);

#endif
