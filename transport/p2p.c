/*
 * p2p.c: tagged point-to-point messages of any length between two ranks of a group (pipeline
 * micro-batches: the hidden states of several sequences in flight between stages).
 *
 * Wire: COLL frames with op MSG (docs/protocol.md), step 0, offset = segment index. Segment 0's
 * data starts with tag u32 and the message's total length u32, then the first bytes; later
 * segments (messages over one frame) carry only data. Per pair and direction, messages keep the
 * order they were sent in (the COLL sequence number checks it), and share that order with the
 * pair's other collectives: both ends must agree on what comes next.
 *
 * Invariant: a message is taken whole or the group breaks; no partial message stays behind.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>

#include "common/common.h"
#include "transport/frame.h"
#include "transport/group.h"

#define TP_MSG_PRE 8 /* tag, total length */
#define TP_MSG_SEG ((size_t)(TP_MAX_PAYLOAD - TP_COLL_WIRE))

static int tp_msg_peer(tp_group_t *g, int peer, char *err, size_t errlen)
{
	int rc = tp_group_check(g, err, errlen);
	if (rc)
		return rc;
	if (peer < 0 || peer >= g->world || peer == g->rank)
		return sh_fail(err, errlen, SH_EINVAL, "bad peer rank %d", peer);
	return 0;
}

int tp_group_send_msg(tp_group_t *g, int to, uint32_t tag, const void *buf, size_t len,
		      int timeout_ms, char *err, size_t errlen)
{
	int rc = tp_msg_peer(g, to, err, errlen);
	if (rc)
		return rc;
	if (len > UINT32_MAX || (len && !buf))
		return sh_fail(err, errlen, SH_EINVAL, "message of %zu bytes", len);
	int64_t deadline = tp_deadline(timeout_ms);
	const uint8_t *p = buf;
	size_t off = 0;
	for (uint32_t s = 0; s == 0 || off < len; s++) {
		tp_xfer_t *x = &g->xf[to];
		tp_xfer_reset(g);
		x->send = 1;
		x->tcp = 1;
		x->sdata = p + off;
		x->slen = MIN(s == 0 ? TP_MSG_SEG - TP_MSG_PRE : TP_MSG_SEG, len - off);
		if (s == 0) {
			tp_put32(x->spre, tag);
			tp_put32(x->spre + 4, (uint32_t)len);
			x->spre_len = TP_MSG_PRE;
		}
		off += x->slen;
		rc = tp_group_exchange(g, TP_OP_MSG, 0, s, deadline, timeout_ms, "send", err,
				       errlen);
		if (rc)
			return rc;
	}
	return 0;
}

int tp_group_recv_msg(tp_group_t *g, int from, uint32_t *tag, void *buf, size_t cap, size_t *len,
		      int timeout_ms, char *err, size_t errlen)
{
	int rc = tp_msg_peer(g, from, err, errlen);
	if (rc)
		return rc;
	int64_t deadline = tp_deadline(timeout_ms);
	uint8_t *p = buf;
	size_t total = 0, off = 0;
	for (uint32_t s = 0; s == 0 || off < total; s++) {
		tp_xfer_t *x = &g->xf[from];
		tp_xfer_reset(g);
		x->recv = 1;
		x->tcp = 1;
		x->rany = 1;
		x->rlen = s == 0 ? TP_MSG_SEG : MIN(TP_MSG_SEG, total - off);
		rc = tp_group_exchange(g, TP_OP_MSG, 0, s, deadline, timeout_ms, "receive", err,
				       errlen);
		if (rc)
			return rc;
		const uint8_t *d = x->rdata;
		size_t n = x->rlen;
		if (s == 0) {
			if (n < TP_MSG_PRE)
				return tp_group_break(g, SH_EFORMAT, err, errlen,
						      "receive: rank %d sent a short message",
						      from);
			*tag = tp_get32(d);
			total = tp_get32(d + 4);
			d += TP_MSG_PRE;
			n -= TP_MSG_PRE;
			if (total > cap) /* the rest of it is still coming: the pair is lost */
				return tp_group_break(g, SH_EINVAL, err, errlen,
						      "receive: rank %d sent a message of %zu "
						      "bytes, room for %zu",
						      from, total, cap);
		}
		if (n != MIN(s == 0 ? TP_MSG_SEG - TP_MSG_PRE : TP_MSG_SEG, total - off))
			return tp_group_break(g, SH_EFORMAT, err, errlen,
					      "receive: rank %d's message (%zu bytes) has %zu in "
					      "segment %u",
					      from, total, n, s);
		memcpy(p + off, d, n);
		off += n;
	}
	*len = total;
	return 0;
}

int tp_group_wait_msg(tp_group_t *g, const int *from, int nfrom, int *ready, int timeout_ms,
		      char *err, size_t errlen)
{
	struct pollfd pf[TP_MAX_WORLD];
	int rc = tp_group_check(g, err, errlen);
	if (rc)
		return rc;
	if (nfrom < 1 || nfrom > TP_MAX_WORLD)
		return sh_fail(err, errlen, SH_EINVAL, "waiting for %d ranks", nfrom);
	for (int i = 0; i < nfrom; i++) {
		if ((rc = tp_msg_peer(g, from[i], err, errlen)))
			return rc;
		const tp_chan_t *c = g->chan[from[i]];
		if (!c->rx_done && c->rx_got > 0) { /* a frame is already half read */
			*ready = from[i];
			return 0;
		}
		pf[i] = (struct pollfd){.fd = c->fd, .events = POLLIN};
	}
	int64_t deadline = tp_deadline(timeout_ms);
	for (;;) {
		int n = poll(pf, (nfds_t)nfrom, tp_left_ms(deadline));
		if (n > 0)
			break;
		if (n == 0)
			return sh_fail(err, errlen, SH_ETIMEDOUT, "no message within %d ms",
				       timeout_ms);
		if (errno != EINTR)
			return sh_fail(err, errlen, SH_EIO, "poll: %s", strerror(errno));
	}
	for (int i = 0; i < nfrom; i++)
		if (pf[i].revents) {
			*ready = from[i];
			break;
		}
	return 0;
}
