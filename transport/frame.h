/*
 * frame.h (internal to transport/ and its tests): the wire format. Pure encode/decode, no I/O.
 *
 * Framing (every byte on a shoal TCP connection is part of a frame):
 *
 *   frame  = len:u32le body[len]                 1 <= len <= TP_FRAME_MAX_BODY
 *   body   = type:u16le payload                  during the handshake (HELLO, AUTH): plaintext
 *   body   = AEAD(type:u16le payload) tag[16]    afterwards: XChaCha20-Poly1305-IETF under the
 *            sending direction's session key, nonce = frame counter of that direction (u64le,
 *            then 16 zero bytes), additional data = the 4 length bytes.
 *
 * Message types: one number per message, never reused, one struct per message below (sizes are
 * wire sizes, checked by static asserts; integers little-endian). The same table lives in
 * docs/protocol.md. Ranges: 0x0001-0x00ff transport, 0x0100-0x01ff discovery/election,
 * 0x0200-0x02ff lock-step inference, 0x0300-0x03ff agent/API forwarding.
 *
 *   0x0001 TP_MSG_HELLO      tp_hello_t   plaintext, first frame each way
 *   0x0002 TP_MSG_AUTH       tp_auth_t    plaintext, second frame each way
 *   0x0010 TP_MSG_JOIN       tp_join_t    group: connecting rank -> accepting rank (sealed)
 *   0x0011 TP_MSG_COLL       tp_coll_t    group: collective data header + bytes (sealed)
 *   0x0012 TP_MSG_RDMA_QP    rdma qp data (rdma.h) (sealed)
 *   0x0013 TP_MSG_JOIN_OK    tp_join_t    group: accepting rank's answer (sealed)
 *   0x0014 TP_MSG_RDMA_READY u32 ok       group: RDMA pair state after set-up, 1 = ready (sealed)
 *   0x0015 TP_MSG_JOIN_NO    text         group: accepting rank refuses a JOIN; the reason as
 *                                         text (<= 200 bytes, no NUL), then it closes (sealed)
 *   0x0016 TP_MSG_PROBE      tp_probe_hdr_t + padding   link probe (probe.c): echo me (sealed)
 *   0x0017 TP_MSG_PROBE_ECHO tp_probe_hdr_t + zeros     the answer, reply_len bytes (sealed)
 *   0x0018 TP_MSG_PROBE_BURST 16 bytes + data           throughput burst frame (sealed)
 *   0x0019 TP_MSG_PROBE_ACK  32 bytes                   receipt of a burst frame (sealed)
 */
#ifndef SHOAL_TP_FRAME_H
#define SHOAL_TP_FRAME_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "transport/transport.h"

#define TP_FRAME_HDR  4
#define TP_FRAME_TAG  16
#define TP_FRAME_TYPE 2
/* Largest body: type + payload + tag. */
#define TP_FRAME_MAX_BODY ((uint32_t)(TP_FRAME_TYPE + TP_MAX_PAYLOAD + TP_FRAME_TAG))

#define TP_PROTO_MAGIC   0x4c4f4853u /* "SHOL" as little-endian bytes */
#define TP_PROTO_VERSION 1
#define TP_NONCE_BYTES   32
#define TP_MAC_BYTES     32

enum tp_msg_type {
	TP_MSG_HELLO = 0x0001,
	TP_MSG_AUTH = 0x0002,
	TP_MSG_JOIN = 0x0010,
	TP_MSG_COLL = 0x0011,
	TP_MSG_RDMA_QP = 0x0012,
	TP_MSG_JOIN_OK = 0x0013,
	TP_MSG_RDMA_READY = 0x0014,
	TP_MSG_JOIN_NO = 0x0015,
	TP_MSG_PROBE = 0x0016,
	TP_MSG_PROBE_ECHO = 0x0017,
	TP_MSG_PROBE_BURST = 0x0018,
	TP_MSG_PROBE_ACK = 0x0019,
};

/* PROBE / PROBE_ECHO header (16 bytes; the probe pads to its chosen size, 16..65536 bytes; the
 * echo is reply_len bytes, zero after the header). stamp is the prober's clock, echoed as is. */
#define TP_PROBE_HDR 16
#define TP_PROBE_MAX 65536
/* PROBE_BURST: id u32 (burst number), index u32 (frame of the burst, from 0), 8 zero bytes, then
 * data. PROBE_ACK: id u32, index u32, bytes u64 (data bytes of this burst received so far),
 * span_ns u64 (responder's clock from frame 0's arrival to this frame's), 8 zero bytes. */
#define TP_BURST_HDR      16
#define TP_PROBE_ACK_WIRE 32

/* HELLO: who I am and my fresh nonce. 64 bytes. */
typedef struct tp_hello {
	uint32_t magic;                    /* TP_PROTO_MAGIC */
	uint16_t version;                  /* TP_PROTO_VERSION */
	uint16_t flags;                    /* 0; unknown bits ignored (capabilities later) */
	uint8_t node_id[TP_NODE_ID_BYTES]; /* sender's node ID */
	uint8_t cid[TP_CID_BYTES];         /* sender's cluster ID */
	uint8_t nonce[TP_NONCE_BYTES];     /* fresh random per connection */
} tp_hello_t;
#define TP_HELLO_WIRE 64
static_assert(sizeof(tp_hello_t) == TP_HELLO_WIRE, "HELLO wire size");

/* AUTH: crypto_auth(auth key, role byte || HELLO_initiator || HELLO_responder), role 'I' or 'R'.
 * 32 bytes. */
typedef struct tp_auth {
	uint8_t mac[TP_MAC_BYTES];
} tp_auth_t;
#define TP_AUTH_WIRE 32
static_assert(sizeof(tp_auth_t) == TP_AUTH_WIRE, "AUTH wire size");

/* JOIN / JOIN_OK: a rank introduces itself to another rank of a group. 16 bytes. */
typedef struct tp_join {
	uint32_t rank;  /* sender's rank */
	uint32_t world; /* group size as the sender sees it */
	uint64_t group; /* group tag chosen by the caller (e.g. plan epoch); must match */
} tp_join_t;
#define TP_JOIN_WIRE 16
static_assert(sizeof(tp_join_t) == TP_JOIN_WIRE, "JOIN wire size");

/* COLL: header of one piece of a collective; the data follows the header in the same frame.
 * 16 bytes + data. */
typedef struct tp_coll {
	uint32_t seq;    /* collective call number on this group, same on every rank */
	uint16_t op;     /* tp_coll_op */
	uint16_t step;   /* step within the operation (ring step, phase) */
	uint32_t offset; /* byte offset of the data within the operation's buffer */
	uint32_t len;    /* data bytes that follow */
} tp_coll_t;
#define TP_COLL_WIRE 16
static_assert(sizeof(tp_coll_t) == TP_COLL_WIRE, "COLL wire size");

/* ---- little-endian helpers (common.h's, under transport's names) ------------------------- */

static inline void tp_put16(uint8_t *p, uint16_t v)
{
	sh_put_le16(p, v);
}
static inline void tp_put32(uint8_t *p, uint32_t v)
{
	sh_put_le32(p, v);
}
static inline void tp_put64(uint8_t *p, uint64_t v)
{
	sh_put_le64(p, v);
}
static inline uint16_t tp_get16(const uint8_t *p)
{
	return sh_get_le16(p);
}
static inline uint32_t tp_get32(const uint8_t *p)
{
	return sh_get_le32(p);
}
static inline uint64_t tp_get64(const uint8_t *p)
{
	return sh_get_le64(p);
}

/* ---- codec -------------------------------------------------------------------------------- */

/* Checks a frame header: returns the body length (>= 1) or SH_EFORMAT (0 or > max_body). */
int64_t tp_frame_hdr_parse(const uint8_t hdr[TP_FRAME_HDR], uint32_t max_body);

/* Parses one plaintext frame at the start of buf[0..len). Returns the bytes it spans (> 0) with
 * *type, *payload (pointing into buf) and *plen set; 0 when buf holds only part of a frame
 * (need more bytes); SH_EFORMAT for a zero or oversized length or a body shorter than a type. */
int64_t tp_frame_parse(const uint8_t *buf, size_t len, uint16_t *type, const uint8_t **payload,
		       size_t *plen);

/* Writes a plaintext frame (header, type, payload) into out (cap bytes). Returns the bytes
 * written, or SH_EINVAL when the payload is too big or cap too small. */
int64_t tp_frame_build(uint8_t *out, size_t cap, uint16_t type, const void *payload, size_t plen);

void tp_hello_encode(uint8_t out[TP_HELLO_WIRE], const tp_hello_t *h);
/* Returns 0, or SH_EFORMAT (wrong length, magic) / SH_EUNSUPP (version) with a message. */
int tp_hello_decode(tp_hello_t *h, const uint8_t *p, size_t len, char *err, size_t errlen);

void tp_join_encode(uint8_t out[TP_JOIN_WIRE], const tp_join_t *j);
int tp_join_decode(tp_join_t *j, const uint8_t *p, size_t len);

void tp_coll_encode(uint8_t out[TP_COLL_WIRE], const tp_coll_t *c);
/* Checks that len == TP_COLL_WIRE + c->len. */
int tp_coll_decode(tp_coll_t *c, const uint8_t *p, size_t len);

/* Human name of a message type ("HELLO", ..., "0x1234" for unknown ones; buf >= 8 bytes). */
const char *tp_msg_name(uint16_t type, char *buf, size_t buflen);

#endif
