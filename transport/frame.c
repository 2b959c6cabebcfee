/*
 * frame.c: the frame codec and the fixed-size message structs of frame.h. Pure functions over
 * byte buffers: no I/O, no allocation, no global state, so the fuzzer can drive them directly.
 *
 * Invariant: a decoder never reads outside [p, p+len) and never accepts a length that it has not
 * bounded first; every rejection is an error code, never an assert.
 */
#include "transport/frame.h"

#include <stdio.h>
#include <string.h>

#include "common/common.h"

int64_t tp_frame_hdr_parse(const uint8_t hdr[TP_FRAME_HDR], uint32_t max_body)
{
	uint32_t n = tp_get32(hdr);
	if (n == 0 || n > max_body)
		return SH_EFORMAT;
	return n;
}

int64_t tp_frame_parse(const uint8_t *buf, size_t len, uint16_t *type, const uint8_t **payload,
		       size_t *plen)
{
	if (len < TP_FRAME_HDR)
		return 0;
	int64_t n = tp_frame_hdr_parse(buf, TP_FRAME_MAX_BODY);
	if (n < 0)
		return n;
	if (n < TP_FRAME_TYPE)
		return SH_EFORMAT;
	if ((uint64_t)len - TP_FRAME_HDR < (uint64_t)n)
		return 0;
	*type = tp_get16(buf + TP_FRAME_HDR);
	*payload = buf + TP_FRAME_HDR + TP_FRAME_TYPE;
	*plen = (size_t)n - TP_FRAME_TYPE;
	return TP_FRAME_HDR + n;
}

int64_t tp_frame_build(uint8_t *out, size_t cap, uint16_t type, const void *payload,
		       size_t plen)
{
	if (plen > TP_MAX_PAYLOAD || cap < TP_FRAME_HDR + TP_FRAME_TYPE + plen)
		return SH_EINVAL;
	tp_put32(out, (uint32_t)(TP_FRAME_TYPE + plen));
	tp_put16(out + TP_FRAME_HDR, type);
	if (plen)
		memcpy(out + TP_FRAME_HDR + TP_FRAME_TYPE, payload, plen);
	return (int64_t)(TP_FRAME_HDR + TP_FRAME_TYPE + plen);
}

void tp_hello_encode(uint8_t out[TP_HELLO_WIRE], const tp_hello_t *h)
{
	tp_put32(out, h->magic);
	tp_put16(out + 4, h->version);
	tp_put16(out + 6, h->flags);
	memcpy(out + 8, h->node_id, TP_NODE_ID_BYTES);
	memcpy(out + 24, h->cid, TP_CID_BYTES);
	memcpy(out + 32, h->nonce, TP_NONCE_BYTES);
}

int tp_hello_decode(tp_hello_t *h, const uint8_t *p, size_t len, char *err, size_t errlen)
{
	if (len != TP_HELLO_WIRE)
		return sh_fail(err, errlen, SH_EFORMAT, "HELLO of %zu bytes (want %d)", len,
			       TP_HELLO_WIRE);
	h->magic = tp_get32(p);
	h->version = tp_get16(p + 4);
	h->flags = tp_get16(p + 6);
	memcpy(h->node_id, p + 8, TP_NODE_ID_BYTES);
	memcpy(h->cid, p + 24, TP_CID_BYTES);
	memcpy(h->nonce, p + 32, TP_NONCE_BYTES);
	if (h->magic != TP_PROTO_MAGIC)
		return sh_fail(err, errlen, SH_EFORMAT, "not a shoal peer (bad magic 0x%08x)",
			       h->magic);
	if (h->version != TP_PROTO_VERSION)
		return sh_fail(err, errlen, SH_EUNSUPP, "protocol version %u (we speak %u)",
			       h->version, TP_PROTO_VERSION);
	return 0;
}

void tp_join_encode(uint8_t out[TP_JOIN_WIRE], const tp_join_t *j)
{
	tp_put32(out, j->rank);
	tp_put32(out + 4, j->world);
	tp_put64(out + 8, j->group);
}

int tp_join_decode(tp_join_t *j, const uint8_t *p, size_t len)
{
	if (len != TP_JOIN_WIRE)
		return SH_EFORMAT;
	j->rank = tp_get32(p);
	j->world = tp_get32(p + 4);
	j->group = tp_get64(p + 8);
	return 0;
}

void tp_coll_encode(uint8_t out[TP_COLL_WIRE], const tp_coll_t *c)
{
	tp_put32(out, c->seq);
	tp_put16(out + 4, c->op);
	tp_put16(out + 6, c->step);
	tp_put32(out + 8, c->offset);
	tp_put32(out + 12, c->len);
}

int tp_coll_decode(tp_coll_t *c, const uint8_t *p, size_t len)
{
	if (len < TP_COLL_WIRE)
		return SH_EFORMAT;
	c->seq = tp_get32(p);
	c->op = tp_get16(p + 4);
	c->step = tp_get16(p + 6);
	c->offset = tp_get32(p + 8);
	c->len = tp_get32(p + 12);
	if ((uint64_t)c->len != (uint64_t)len - TP_COLL_WIRE)
		return SH_EFORMAT;
	return 0;
}

const char *tp_msg_name(uint16_t type, char *buf, size_t buflen)
{
	switch (type) {
	case TP_MSG_HELLO: return "HELLO";
	case TP_MSG_AUTH: return "AUTH";
	case TP_MSG_JOIN: return "JOIN";
	case TP_MSG_COLL: return "COLL";
	case TP_MSG_RDMA_QP: return "RDMA_QP";
	case TP_MSG_JOIN_OK: return "JOIN_OK";
	case TP_MSG_RDMA_READY: return "RDMA_READY";
	case TP_MSG_JOIN_NO: return "JOIN_NO";
	case TP_MSG_PROBE: return "PROBE";
	case TP_MSG_PROBE_ECHO: return "PROBE_ECHO";
	case TP_MSG_PROBE_BURST: return "PROBE_BURST";
	case TP_MSG_PROBE_ACK: return "PROBE_ACK";
	}
	snprintf(buf, buflen, "0x%04x", type);
	return buf;
}
