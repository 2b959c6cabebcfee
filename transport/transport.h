/*
 * transport.h: the token's keys, the authenticated control channel, and the collectives that
 * ranks use to compute together (TCP, or RDMA through libibverbs).
 *
 * Layers, bottom up:
 *   keys   token -> Argon2id master key -> public cluster ID + authentication key (keys.c)
 *   frame  length-prefixed frames, the message numbers and structs (frame.c, docs/protocol.md)
 *   chan   one TCP connection: HELLO, mutual challenge-response, then every frame encrypted and
 *          authenticated with per-direction keys and counter nonces (chan.c)
 *   group  ranks 0..N-1 in a full mesh of channels; collectives with a deadline (group.c, coll.c)
 *   rdma   libibverbs pairs, the JACCL device matrix, and the per-pair fallback to TCP (rdma*.c)
 *
 * Errors are the SH_E* codes of common/common.h; a one-line message goes to the caller's buffer.
 * The token never leaves tp_keys_derive: it is not sent, not stored, not logged.
 *
 * A rank of a group, start to end:
 *   tp_keys_t k;
 *   tp_keys_derive(&k, token, strlen(token), err, sizeof err);   (then wipe the token)
 *   tp_group_cfg_t gc = {.rank = r, .world = n, .hosts = hosts, .ports = ports,
 *                        .listen_fd = -1, .tag = epoch, .keys = &k, .node_id = id,
 *                        .timeout_ms = 30000};
 *   tp_group_t *g;
 *   if (tp_group_new(&g, &gc, err, sizeof err)) ... (err names the rank that failed)
 *   tp_all_reduce_f32(g, x, len, step_timeout_ms, err, sizeof err);
 *   tp_group_free(g);
 *   tp_keys_wipe(&k);
 * A control connection: tp_listen + tp_accept + tp_chan_accept on one side, tp_chan_connect on
 * the other, then tp_chan_send / tp_chan_recv. Wire format: docs/protocol.md; RDMA: docs/rdma.md.
 */
#ifndef SHOAL_TRANSPORT_H
#define SHOAL_TRANSPORT_H

#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

/* ---- keys --------------------------------------------------------------------------------- */

#define TP_NODE_ID_BYTES 16
#define TP_CID_BYTES 8
#define TP_KEY_BYTES 32

/* What a process keeps from the token. Plain data: copy freely; wipe with tp_keys_wipe. */
typedef struct tp_keys {
	uint8_t auth[TP_KEY_BYTES];  /* secret: authenticates handshakes, keys the sessions */
	uint8_t cid[TP_CID_BYTES];   /* public cluster ID (a keyed hash of the master key) */
	char cid_hex[2 * TP_CID_BYTES + 1]; /* cid as 16 lowercase hex chars, for mDNS TXT cid= */
} tp_keys_t;

/* Derives the keys from a token of len bytes (Argon2id, fixed protocol salt, ~64 MiB and a few
 * hundred ms: call once at start and share the result). The token is only read; the caller
 * should sodium_memzero its own copy when done. Returns 0, SH_EINVAL (empty token) or
 * SH_ENOMEM (Argon2id could not get its memory). Thread-safe. */
int tp_keys_derive(tp_keys_t *out, const char *token, size_t len, char *err, size_t errlen);

/* Overwrites the keys with zeros. */
void tp_keys_wipe(tp_keys_t *k);

/* Node IDs as 32 lowercase hex chars (out must hold 33 bytes); returns out. */
char *tp_id_hex(char out[2 * TP_NODE_ID_BYTES + 1], const uint8_t id[TP_NODE_ID_BYTES]);

/* ---- listening sockets -------------------------------------------------------------------- */

/* Opens a TCP listening socket on host:port (host NULL or "" = all IPv4 and IPv6 addresses when
 * the system allows, else IPv4; port 0 = ephemeral), SO_REUSEADDR, close-on-exec. On success
 * *fd is the socket (caller closes) and *bound_port the actual port. */
int tp_listen(const char *host, int port, int *fd, int *bound_port, char *err, size_t errlen);

/* Accepts one connection within timeout_ms (-1 = wait forever). *fd is the new socket, owned by
 * the caller until handed to tp_chan_accept; peer (may be NULL) gets "addr:port". Returns 0,
 * SH_ETIMEDOUT or SH_EIO. */
int tp_accept(int listen_fd, int *fd, char *peer, size_t peerlen, int timeout_ms, char *err,
	      size_t errlen);

/* Splits "host:port" or "[ipv6]:port" (port 1..65535) into host (hostlen bytes) and *port.
 * Returns 0 or SH_EINVAL with a message. */
int tp_hostport_parse(const char *s, char *host, size_t hostlen, int *port, char *err,
		      size_t errlen);

/* ---- authenticated channel ---------------------------------------------------------------- */

/* One authenticated, encrypted TCP connection to a peer holding the same token.
 *
 * Handshake (both sides, bounded by timeout_ms overall): HELLO each way (magic, version, node
 * ID, cluster ID, fresh 32-byte nonce); a cluster ID mismatch fails at once; then each side
 * sends crypto_auth(auth key, role || both HELLOs) and checks the peer's. Session keys, one per
 * direction, are derived from both HELLOs under the auth key; afterwards every frame is
 * XChaCha20-Poly1305 with a per-direction counter nonce, so a tampered, replayed, reordered or
 * dropped frame fails authentication and the channel is dead (every later call fails).
 * A handshake failure is logged at LOG_WARN ("handshake with ADDR failed: REASON"; repeats from
 * the same host with the same reason at most every 30 s, with a count) and returned in err. Two peers with the same node ID do complete the handshake: compare
 * tp_chan_peer_id() with your own to detect a copied state directory.
 *
 * Threads: one thread may send while another receives (send is guarded by a mutex, so several
 * senders are fine too); only one thread at a time may receive. tp_chan_free when neither is
 * running. */
typedef struct tp_chan tp_chan_t;

/* Largest payload of one message (16 MiB). Bigger sends fail with SH_EINVAL; a peer announcing a
 * bigger frame kills the channel with SH_EFORMAT. */
#define TP_MAX_PAYLOAD (16u << 20)

/* Message types 0..0x00ff are the transport's own (handshake, group); discovery, the lock-step
 * protocol and others take ranges above (see frame.h and docs/protocol.md). Any uint16 can be
 * sent through a channel; the channel does not interpret types >= TP_MSG_USER. */
#define TP_MSG_USER 0x0100

/* Connects to host:port (name or address, IPv4/IPv6) and runs the handshake as initiator. On
 * success *out is the channel (caller frees with tp_chan_free). */
int tp_chan_connect(tp_chan_t **out, const char *host, int port, const tp_keys_t *k,
		    const uint8_t my_id[TP_NODE_ID_BYTES], int timeout_ms, char *err,
		    size_t errlen);

/* Runs the handshake as responder on an accepted socket. Takes ownership of fd in every case
 * (closed on failure). */
int tp_chan_accept(tp_chan_t **out, int fd, const tp_keys_t *k,
		   const uint8_t my_id[TP_NODE_ID_BYTES], int timeout_ms, char *err,
		   size_t errlen);

/* Sends one message (len <= TP_MAX_PAYLOAD; payload may be NULL when len is 0). Waits at most
 * the channel's send timeout (default 10 s, tp_chan_set_send_timeout) for socket space.
 * Returns 0, SH_EINVAL, SH_ETIMEDOUT, SH_ECLOSED or SH_EIO; any error but SH_EINVAL leaves the
 * channel dead. */
int tp_chan_send(tp_chan_t *c, uint16_t type, const void *payload, size_t len);

/* Receives one message within timeout_ms (-1 = forever, 0 = only what is already buffered).
 * *payload points into the channel's buffer, valid until the next tp_chan_recv or tp_chan_free.
 * Returns 0; SH_ETIMEDOUT (the channel stays usable: a partly received frame is kept and the next
 * call continues it); SH_ECLOSED (peer closed); SH_EAUTH (tampered, replayed or reordered frame);
 * SH_EFORMAT (oversized or malformed frame); SH_EIO. All but SH_ETIMEDOUT leave it dead. */
int tp_chan_recv(tp_chan_t *c, uint16_t *type, void **payload, size_t *len, int timeout_ms);

/* The peer's node ID (valid while the channel lives). */
const uint8_t *tp_chan_peer_id(const tp_chan_t *c);

/* The peer's address as "addr:port" (for logs). */
const char *tp_chan_peer_addr(const tp_chan_t *c);

/* The socket, for poll() in an event loop (readable = tp_chan_recv may have data; frames may
 * also be buffered already: see tp_chan_pending). Do not read or write it directly. */
int tp_chan_fd(const tp_chan_t *c);

/* 1 when a complete frame is already buffered (so poll() on the fd would not report it). */
int tp_chan_pending(const tp_chan_t *c);

/* Send timeout in ms (-1 = forever). */
void tp_chan_set_send_timeout(tp_chan_t *c, int timeout_ms);

/* Closes the socket and wipes the session keys. NULL is fine. */
void tp_chan_free(tp_chan_t *c);

/* ---- link probes -------------------------------------------------------------------------- */

/* Measures the link under an authenticated channel: round-trip time of small probes (median,
 * p90, min), optionally of probes of a chosen size, the per-message gap of back-to-back probes,
 * and payload throughput from a short burst. Every byte is a sealed frame (message types
 * 0x0016-0x0019, docs/protocol.md), so the figures include the channel's own costs (crypto,
 * system calls, wake-ups): what a collective on that link sees. With the defaults one run sends
 * ~2 KB of probes and a burst of at most 4 MiB or 200 ms (of which at most 1 MiB unacknowledged),
 * and is over in about K x RTT + 200 ms: cheap enough to repeat in the background.
 *
 * Who calls what:
 *  - The peer answers: whoever receives on the channel passes every received message to
 *    tp_probe_answer (the agent's event loop, for types below TP_MSG_USER), which echoes probes
 *    and acknowledges burst frames from that thread (tp_chan_send is thread-safe). A peer that
 *    does not answer makes the prober time out.
 *  - The prober measures one channel at a time, either
 *    (a) blocking, tp_link_probe, on a thread that is the channel's only receiver for the time
 *        of the run (messages of other types go to the caller's callback, on that thread), or
 *    (b) from an event loop that receives on the channel: tp_probe_new, then tp_probe_step
 *        whenever the loop wakes (it sends what is due and says how long to wait at most),
 *        tp_probe_take for every received message (it consumes the answers), until step
 *        returns 1; tp_probe_result; tp_probe_free. Both sides may probe each other at once.
 * Times are now_ns() (common.h, monotonic); RTTs use the prober's clock only, throughput the
 * responder's (its receive rate). */
typedef struct tp_probe_opts {
	int probes;         /* RTT probes, one at a time (default 16, 1..256) */
	int probe_bytes;    /* size of a probe and of its echo (default 64; 16..65536) */
	int sized_bytes;    /* 0, or also 8 probes of this size each way (16..65536), e.g. an
			       all-reduce's message: sized_rtt_us_median */
	int train;          /* probes per train (3 trains, each back to back) for gap_us
			       (default 16; 0 = skip) */
	size_t burst_bytes; /* throughput burst: at most this many bytes (default 4 MiB; use
			       tp_probe_opts_default and set 0 to skip) */
	int burst_ms;       /* and at most this long (default 200) */
	int timeout_ms;     /* the whole run (default 5000) */
} tp_probe_opts_t;

/* The defaults above. */
void tp_probe_opts_default(tp_probe_opts_t *o);

typedef struct tp_link_stats {
	int probes; /* RTT samples taken */
	double rtt_us_median, rtt_us_p90, rtt_us_min;
	int sized_bytes;            /* 0 when not measured */
	double sized_rtt_us_median; /* RTT of sized_bytes each way */
	double gap_us;    /* per-message overhead: spacing of back-to-back small messages through
			     both ends (the slowest stage's cost per message; LogP's g); -1 when
			     not measured or not separable from the RTT's noise */
	double tput_mbit; /* payload Mbit/s of the burst at the receiver; -1 when skipped */
	uint64_t burst_bytes; /* payload bytes the burst carried */
	double burst_ms;      /* first burst frame sent to last acknowledgement, at the prober */
} tp_link_stats_t;

typedef struct tp_probe tp_probe_t;

/* o NULL = defaults. Returns 0, SH_EINVAL (an option out of range, with a message) or SH_ENOMEM.
 * The run's deadline starts at the first tp_probe_step. */
int tp_probe_new(tp_probe_t **out, const tp_probe_opts_t *o, char *err, size_t errlen);
void tp_probe_free(tp_probe_t *p);

/* Sends what is due at time now (ns) on c. Returns 1 when the run is complete, 0 while it waits
 * for answers (*wait_ms: call again after at most this long, or when a message came), or an
 * error: SH_ETIMEDOUT (no answer within the run's timeout: the peer does not answer probes, or
 * the link is that slow), or the channel's send errors. */
int tp_probe_step(tp_probe_t *p, tp_chan_t *c, int64_t now, int *wait_ms);

/* Offers a message received on the probed channel at time now. Returns 1 when it was an answer
 * to this prober (consumed), 0 when not (pass it to tp_probe_answer, then to your own handler). */
int tp_probe_take(tp_probe_t *p, uint16_t type, const void *payload, size_t len, int64_t now);

/* The figures of a complete run (SH_EINVAL before step returned 1). */
int tp_probe_result(const tp_probe_t *p, tp_link_stats_t *out);

/* The answering side: for a message received on c, echoes a PROBE, acknowledges a PROBE_BURST
 * frame. Returns 1 when the message was one of those (answered), 0 when it is not a probe
 * message, SH_EFORMAT for a malformed one (the caller drops the peer as for any malformed
 * message) or tp_chan_send's error. Call it from the channel's receiving thread. */
int tp_probe_answer(tp_chan_t *c, uint16_t type, const void *payload, size_t len);

/* A message that arrived during tp_link_probe and is not a probe message. payload is valid only
 * during the call. */
typedef void (*tp_chan_msg_fn)(void *ctx, uint16_t type, const void *payload, size_t len);

/* Runs a whole probe on c from the calling thread, which must be c's only receiver meanwhile;
 * answers the peer's probes too; other messages go to other(ctx, ...) (NULL: dropped). Returns 0
 * with *out filled, or an error as tp_probe_step (message in err). */
int tp_link_probe(tp_chan_t *c, const tp_probe_opts_t *o, tp_link_stats_t *out,
		  tp_chan_msg_fn other, void *ctx, char *err, size_t errlen);

/* ---- group of ranks and collectives ------------------------------------------------------- */

/* Ranks 0..world-1 in a full mesh of authenticated channels (rank r connects to every rank < r
 * and accepts from every rank > r; each connection then proves its rank with a JOIN message that
 * must carry the same world size and group tag). Every pair uses TCP unless an RDMA device
 * matrix is given and the pair's RDMA set-up works (see rdma section below).
 *
 * Collectives: every call has a deadline; a rank that died, stalled, or sent something out of
 * step makes the call fail within the timeout on the ranks that wait for it, with a message
 * naming the rank. After any failure the group is broken: every later call returns the same
 * error (free it and form a new one). Results are bit-identical on every rank (sums are added in
 * one fixed order on all ranks, or computed on one rank and copied).
 *
 * Threads: a group is used by one thread at a time (the caller's compute driver). Buffers are
 * the caller's; the group's own buffers grow to the largest message once and are then reused. */
typedef struct tp_group tp_group_t;

typedef struct tp_group_cfg {
	int rank, world;          /* 0 <= rank < world <= TP_MAX_WORLD */
	const char *const *hosts; /* world entries: where each rank listens (hosts[rank] unused) */
	const int *ports;         /* world entries; ports[rank] is ours (when listen_fd < 0) */
	int listen_fd;            /* >= 0: an open listening socket to use (borrowed; stays open),
				     < 0: listen on all addresses at ports[rank] */
	uint64_t tag;             /* group tag that every rank must share (e.g. a plan epoch) */
	const tp_keys_t *keys;    /* borrowed for the call */
	const uint8_t *node_id;   /* our node ID (16 bytes) */
	const uint8_t (*peer_ids)[TP_NODE_ID_BYTES]; /* NULL, or world expected node IDs */
	int timeout_ms;           /* for forming the whole group (peers may start later) */
	const char *rdma_devices; /* NULL, or a JACCL device matrix file (docs/rdma.md) */
	const atomic_int *cancel; /* NULL, or a flag another thread may set: forming then gives
				     up within ~100 ms with SH_ECANCELED */
} tp_group_cfg_t;

#define TP_MAX_WORLD 64

/* Forms the group. Returns 0, or SH_ETIMEDOUT (a rank never showed up), SH_EBUSY (a lower rank's
 * port belongs to another group: another tag or world, e.g. the previous plan's group still
 * ending there; the caller may try again), SH_EAUTH, SH_EIO, SH_EINVAL with a message naming the
 * rank. */
int tp_group_new(tp_group_t **out, const tp_group_cfg_t *cfg, char *err, size_t errlen);
void tp_group_free(tp_group_t *g);

/* Makes every pending and later call on the group fail soon (its sockets are shut down, not
 * closed): the one call that may come from another thread than the group's user, e.g. an agent
 * stopping a worker loop that waits for the next step. Free the group afterwards as usual. */
void tp_group_abort(tp_group_t *g);

/* 0 while the group works, else the code of its first failure with its message in err (it names
 * the rank: "STEP: rank N (ADDR) did not answer within MS ms"). An agent polls it from another
 * thread than the group's user to learn that a request broke the group. */
int tp_group_check(tp_group_t *g, char *err, size_t errlen);
/* The rank whose silence broke the group (tp_group_check returns SH_ETIMEDOUT: it did not answer
 * or take our data within the step's timeout, while its connection stayed up), else -1. A
 * signal for the agent (leave that rank out a while), given as a value, not in the message. */
int tp_group_stalled_rank(const tp_group_t *g);

int tp_group_rank(const tp_group_t *g);
int tp_group_world(const tp_group_t *g);
/* "tcp" or "rdma" for the link to a peer rank ("self" for our own rank). */
const char *tp_group_link(const tp_group_t *g, int peer);

/* Sum of f32 over the ranks of a team, in place: buf holds rows x cols floats (the same shape on
 * every member). The team is ranks[0..nranks), ascending ranks of the group including ours (a
 * pipeline stage's tensor group in a hybrid plan), or every rank when ranks is NULL; ranks
 * outside it do not take part, and teams on disjoint ranks may run at the same time.
 * Every element is summed in ascending rank order of the team (x(r0) + x(r1) + ...), whatever
 * the path, segmenting or number of rows: a row gives the same bits alone or inside a batch of
 * any size, on every member. Paths (S = 4 x rows x cols bytes, k members):
 *   direct  (k = 2, or (k - 1) x S <= direct_max, default 32 KiB): one message to each member,
 *           one link latency, (k - 1) x S bytes out per member;
 *   2-phase (otherwise): two latencies, 2 (k - 1)/k x S bytes out per member.
 * Returns 0, SH_EINVAL (bad team or shape), or the group's errors. */
int tp_all_reduce_team(tp_group_t *g, const int *ranks, int nranks, float *buf, size_t rows,
		       size_t cols, int timeout_ms, char *err, size_t errlen);

/* The team's sum of buf (rows x cols floats) at one member only, root (a rank of the team): the
 * others send theirs to it, one message per segment (8-bit blocks with the q8 wire), and keep
 * their buf as it was. root's buf gets the bits tp_all_reduce_team would give it, on either
 * wire and for any team size. For a sum only one rank reads (a pass's last, which feeds the
 * head): root sends nothing, the others only to root. Returns 0, SH_EINVAL (bad team, root or
 * shape) or the group's errors. */
int tp_reduce_team(tp_group_t *g, const int *ranks, int nranks, int root, float *buf, size_t rows,
		   size_t cols, int timeout_ms, char *err, size_t errlen);

/* Streamed all-reduce, to overlap the transfer with the compute that produces buf: begin, then
 * for c = 0..nchunks-1 compute columns [c0, c1) of every row (tp_all_reduce_chunk; whole blocks
 * of 32 columns) and push(c), which sends them at once; end waits for the other members' chunks
 * and sums. Same team rules and the same result bits as tp_all_reduce_team (direct path: one
 * message per chunk per peer; meant for decode-sized rows x cols). Every member must stream the
 * same shape with the same nchunks (1 <= nchunks <= ceil(cols / 32)). buf must not be written
 * between a chunk's push and end except in later chunks. One stream per group at a time;
 * another collective between begin and end is a protocol error. Returns 0, SH_EINVAL (bad
 * shape, order) or the group's errors. */
int tp_all_reduce_begin(tp_group_t *g, const int *ranks, int nranks, float *buf, size_t rows,
			size_t cols, int nchunks, int timeout_ms, char *err, size_t errlen);
int tp_all_reduce_push(tp_group_t *g, int chunk, char *err, size_t errlen);
int tp_all_reduce_end(tp_group_t *g, char *err, size_t errlen);
/* Columns [*c0, *c1) of chunk c of nchunks over rows of cols floats (pure). */
void tp_all_reduce_chunk(size_t cols, int nchunks, int c, size_t *c0, size_t *c1);
/* How many chunks to stream rows x cols in on this group (0: do not stream): chunks of about
 * one TCP segment (~1200 bytes), 2..8 of them. By default only with the q8 wire: on the latency
 * lab (a userspace switch with a cost per packet) streaming f32 frames added frames and was
 * slower, while the q8 wire's two one-packet chunks cut the wait at the end by about a third.
 * Every rank must answer the same (same settings). */
int tp_all_reduce_stream_chunks(const tp_group_t *g, size_t rows, size_t cols);
/* -1 = auto (streams with the q8 wire, the default; SHOAL_TP_STREAM overrides), 0 = never,
 * 1 = also f32, 2..8 = always that many chunks whatever the size (tests). Returns 0 or
 * SH_EINVAL. */
int tp_group_set_stream(tp_group_t *g, int mode);

/* The whole group, one row of n floats: tp_all_reduce_team(g, NULL, 0, buf, 1, n, ...). */
int tp_all_reduce_f32(tp_group_t *g, float *buf, size_t n, int timeout_ms, char *err,
		      size_t errlen);

/* Optional: all-reduce sends 8-bit blocks (up to 32 floats of one row -> 36 bytes: an f32 scale
 * and 32 int8) instead of f32, for slow links. Off by default; every rank must set the same (a
 * mismatch fails the next all-reduce as "out of step"). Results stay bit-identical on every rank
 * and independent of the batch (blocks are per row); the error per element is at most (sum over
 * ranks of the block's max |x|) / 254, plus (for 3+ members) the block's max |sum| / 254.
 * Returns 0 or SH_EINVAL. */
int tp_group_set_q8(tp_group_t *g, int on);

/* The direct path's threshold in bytes (see tp_all_reduce_team): every rank must set the same,
 * else the next all-reduce fails as "out of step" (results never differ between the paths). A
 * planner that measured the links can pick it: direct costs L + (k-1) S / B, 2-phase
 * 2 L + 2 (k-1)/k S / B (L one-way latency, B bandwidth; docs/protocol.md). */
int tp_group_set_direct_max(tp_group_t *g, size_t bytes);

/* How long (us) a collective polls its sockets without sleeping before it sleeps in poll()
 * (default 100; 0 = never spin; SHOAL_TP_SPIN_US overrides the default). Spinning saves a
 * wake-up per message when the peer answers within that time (a rank in step on a fast link)
 * and costs CPU time the rank would spend waiting anyway. Per rank; ranks may differ. */
int tp_group_set_spin(tp_group_t *g, int us);

/* Copies root's len bytes of buf to every rank's buf. */
int tp_broadcast(tp_group_t *g, void *buf, size_t len, int root, int timeout_ms, char *err,
		 size_t errlen);

/* out (world * len bytes) gets every rank's in (len bytes) at offset rank * len. in may point to
 * out + rank * len. */
int tp_all_gather(tp_group_t *g, const void *in, size_t len, void *out, int timeout_ms,
		  char *err, size_t errlen);

/* Returns once every rank has entered the barrier. */
int tp_barrier(tp_group_t *g, int timeout_ms, char *err, size_t errlen);

/* Point-to-point (pipeline mode): sends len bytes to rank `to`; the receiver must call
 * tp_group_recv with the same len. Sends are buffered by the kernel up to its socket buffer
 * and then wait for the receiver within the timeout. */
int tp_group_send(tp_group_t *g, int to, const void *buf, size_t len, int timeout_ms, char *err,
		  size_t errlen);
int tp_group_recv(tp_group_t *g, int from, void *buf, size_t len, int timeout_ms, char *err,
		  size_t errlen);

/* Tagged messages of any length between two ranks (pipeline micro-batches: hidden states of
 * several sequences in flight between stages). Messages from one rank to another arrive in the
 * order sent; the tag (the caller's, e.g. a micro-batch number) and the length travel with the
 * message, so the receiver needs neither in advance. Always over TCP (never RDMA).
 * tp_group_send_msg returns once the message is in the kernel's socket buffers: a sender runs
 * ahead of a busy receiver by up to what those hold (a few MB), then waits within timeout_ms.
 * Keep the data in flight around a ring of stages below that, or stages that all send at once
 * wait for each other until the timeout.
 * tp_group_recv_msg receives the next message from `from` into buf (cap bytes): *tag and *len
 * are the sender's; a message longer than cap is an error (SH_EINVAL, the group breaks). */
int tp_group_send_msg(tp_group_t *g, int to, uint32_t tag, const void *buf, size_t len,
		      int timeout_ms, char *err, size_t errlen);
int tp_group_recv_msg(tp_group_t *g, int from, uint32_t *tag, void *buf, size_t cap, size_t *len,
		      int timeout_ms, char *err, size_t errlen);
/* Waits until one of from[0..nfrom) has started to send us a message (or its link failed: the
 * next receive from it reports that) and sets *ready to that rank; returns SH_ETIMEDOUT (the
 * group stays usable) when none did within timeout_ms (0 = just look). A stage with several
 * micro-batches in flight uses it to take whichever comes first. */
int tp_group_wait_msg(tp_group_t *g, const int *from, int nfrom, int *ready, int timeout_ms,
		      char *err, size_t errlen);

/* Bytes this rank has sent through the group's collectives (payload, for accounting). */
uint64_t tp_group_bytes_sent(const tp_group_t *g);

#endif
