/*
 * probe.c: link probes on an authenticated channel (transport.h, "link probes"), both sides.
 *
 * A run has phases, each started only when the previous one is complete, so they do not disturb
 * each other: RTT (probes one at a time), SIZED (optional, 8 probes of a chosen size), TRAIN
 * (3 trains of probes back to back: their echoes come back spaced by the slowest stage's cost
 * per message; the fastest train counts, the others met a busy scheduler),
 * BURST (64 KiB frames, at most 1 MiB unacknowledged, until the byte or time bound; the responder
 * acknowledges every frame with the bytes received so far and its own clock, so throughput is
 * the receive rate, from the acknowledgement of the first quarter of the bytes on, past TCP's
 * slow start). Probes carry the prober's clock and are echoed: no state per probe.
 *
 * Invariant: a probe (tp_probe_t) has at most one probe outstanding in RTT and SIZED, and
 * phase only moves forward; the responder keeps per channel only the burst it is receiving.
 */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "transport/chan.h"
#include "transport/frame.h"

#define TP_SIZED_PROBES 8
#define TP_BURST_FRAME  (64u << 10) /* data bytes per burst frame */
#define TP_BURST_WINDOW (1u << 20)  /* unacknowledged burst bytes at most */
#define TP_TRAINS       3           /* the gap comes from the fastest of these trains */

enum { PH_RTT, PH_SIZED, PH_TRAIN, PH_BURST, PH_DONE };

typedef struct tp_ack {
	uint64_t bytes, span;
} tp_ack_t;

struct tp_probe {
	tp_probe_opts_t o;
	int phase, started, waiting, time_up;
	int64_t deadline;
	uint32_t id, phase_id0; /* next probe id; first id of the current phase */
	double rtt[256];
	int n_rtt;
	double sized[TP_SIZED_PROBES];
	int n_sized;
	int train_got, trains;
	int64_t train_t0, train_best; /* the current train's start; the fastest train's time */
	int64_t b_t0, b_tlast;        /* first burst frame sent, last acknowledgement */
	uint64_t b_sent, b_acked;
	uint32_t b_frames;
	tp_ack_t *acks;
	int n_acks, cap_acks;
	uint8_t *buf; /* outgoing probe / burst frame */
};

void tp_probe_opts_default(tp_probe_opts_t *o)
{
	*o = (tp_probe_opts_t){.probes = 16,
			       .probe_bytes = 64,
			       .train = 16,
			       .burst_bytes = 4u << 20,
			       .burst_ms = 200,
			       .timeout_ms = 5000};
}

int tp_probe_new(tp_probe_t **out, const tp_probe_opts_t *o, char *err, size_t errlen)
{
	*out = NULL;
	tp_probe_opts_t d;
	tp_probe_opts_default(&d);
	if (!o)
		o = &d;
	if (o->probes < 1 || o->probes > 256 || o->probe_bytes < TP_PROBE_HDR ||
	    o->probe_bytes > TP_PROBE_MAX ||
	    (o->sized_bytes && (o->sized_bytes < TP_PROBE_HDR || o->sized_bytes > TP_PROBE_MAX)) ||
	    o->train < 0 || o->train == 1 || o->train > 256 || o->burst_ms < 0 ||
	    o->burst_bytes > (1ull << 32) || o->timeout_ms < 1)
		return sh_fail(err, errlen, SH_EINVAL,
			       "probe options out of range (probes 1..256, sizes 16..65536, "
			       "train 0 or 2..256, burst <= 4 GiB, timeout > 0)");
	tp_probe_t *p = calloc(1, sizeof *p);
	if (!p || !(p->buf = calloc(1, TP_BURST_HDR + TP_BURST_FRAME))) {
		free(p);
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	}
	p->o = *o;
	*out = p;
	return 0;
}

void tp_probe_free(tp_probe_t *p)
{
	if (!p)
		return;
	free(p->acks);
	free(p->buf);
	free(p);
}

static int tp_probe_send(tp_probe_t *p, tp_chan_t *c, int bytes, int64_t stamp)
{
	memset(p->buf, 0, (size_t)bytes);
	tp_put32(p->buf, p->id++);
	tp_put32(p->buf + 4, (uint32_t)bytes); /* echo the same size */
	tp_put64(p->buf + 8, (uint64_t)stamp);
	return tp_chan_send(c, TP_MSG_PROBE, p->buf, (size_t)bytes);
}

/* The phase after `ph` that the options ask for. */
static int tp_probe_next(const tp_probe_t *p, int ph)
{
	if (ph < PH_SIZED && p->o.sized_bytes)
		return PH_SIZED;
	if (ph < PH_TRAIN && p->o.train > 0)
		return PH_TRAIN;
	if (ph < PH_BURST && p->o.burst_bytes > 0)
		return PH_BURST;
	return PH_DONE;
}

int tp_probe_step(tp_probe_t *p, tp_chan_t *c, int64_t now, int *wait_ms)
{
	int rc;
	if (!p->started) {
		p->started = 1;
		p->deadline = now + (int64_t)p->o.timeout_ms * 1000000;
	}
	*wait_ms = 0;
	for (;;) {
		if (p->phase == PH_DONE)
			return 1;
		if (now >= p->deadline)
			return SH_ETIMEDOUT;
		int next = 0;
		switch (p->phase) {
		case PH_RTT:
		case PH_SIZED: {
			int sized = p->phase == PH_SIZED;
			if ((sized ? p->n_sized : p->n_rtt) ==
			    (sized ? TP_SIZED_PROBES : p->o.probes)) {
				next = 1;
				break;
			}
			if (!p->waiting) {
				if ((rc = tp_probe_send(
					 p, c, sized ? p->o.sized_bytes : p->o.probe_bytes, now)))
					return rc;
				p->waiting = 1;
			}
			break;
		}
		case PH_TRAIN:
			if (p->train_got == p->o.train) { /* the current train is back */
				p->trains++;
				p->train_t0 = 0;
				p->train_got = 0;
			}
			if (p->trains == TP_TRAINS) {
				next = 1;
				break;
			}
			if (!p->train_t0) {
				p->train_t0 = now;
				p->phase_id0 = p->id;
				for (int i = 0; i < p->o.train; i++)
					if ((rc = tp_probe_send(p, c, TP_PROBE_HDR, now)))
						return rc;
			}
			break;
		case PH_BURST:
			if (!p->b_t0)
				p->b_t0 = now;
			while (!p->time_up && p->b_sent < p->o.burst_bytes &&
			       p->b_sent - p->b_acked < TP_BURST_WINDOW) {
				if (now_ns() - p->b_t0 >= (int64_t)p->o.burst_ms * 1000000) {
					p->time_up = 1;
					break;
				}
				size_t n = (size_t)MIN((uint64_t)TP_BURST_FRAME,
						       p->o.burst_bytes - p->b_sent);
				memset(p->buf, 0, TP_BURST_HDR);
				tp_put32(p->buf, p->id);
				tp_put32(p->buf + 4, p->b_frames++);
				if ((rc = tp_chan_send(c, TP_MSG_PROBE_BURST, p->buf,
						       TP_BURST_HDR + n)))
					return rc;
				p->b_sent += n;
			}
			if (now_ns() - p->b_t0 >= (int64_t)p->o.burst_ms * 1000000)
				p->time_up = 1;
			next = p->b_acked == p->b_sent &&
			       (p->time_up || p->b_sent >= p->o.burst_bytes);
			break;
		}
		if (!next)
			break;
		p->phase = tp_probe_next(p, p->phase);
		p->phase_id0 = p->id;
		p->waiting = 0;
	}
	int64_t left = (p->deadline - now + 999999) / 1000000;
	if (p->phase == PH_BURST && !p->time_up) /* wake to stop the burst on time */
		left = MIN(left, (p->b_t0 - now) / 1000000 + p->o.burst_ms + 1);
	*wait_ms = (int)MAX(1, MIN(left, 1 << 30));
	return 0;
}

int tp_probe_take(tp_probe_t *p, uint16_t type, const void *payload, size_t len, int64_t now)
{
	const uint8_t *b = payload;
	if (type == TP_MSG_PROBE_ECHO) {
		if (len < TP_PROBE_HDR)
			return 1; /* not ours to judge: a bad echo only spoils our own figures */
		uint32_t id = tp_get32(b);
		double us = (double)(now - (int64_t)tp_get64(b + 8)) / 1e3;
		if (id < p->phase_id0 || id >= p->id)
			return 1; /* stale (an earlier phase) */
		if (p->phase == PH_RTT && p->waiting && p->n_rtt < p->o.probes) {
			p->rtt[p->n_rtt++] = us;
			p->waiting = 0;
		} else if (p->phase == PH_SIZED && p->waiting && p->n_sized < TP_SIZED_PROBES) {
			p->sized[p->n_sized++] = us;
			p->waiting = 0;
		} else if (p->phase == PH_TRAIN && p->train_t0 && p->train_got < p->o.train &&
			   ++p->train_got == p->o.train) {
			if (!p->train_best || now - p->train_t0 < p->train_best)
				p->train_best = now - p->train_t0;
		}
		return 1;
	}
	if (type == TP_MSG_PROBE_ACK) {
		if (len != TP_PROBE_ACK_WIRE || p->phase != PH_BURST)
			return 1;
		if (p->n_acks == p->cap_acks) {
			int cap = p->cap_acks ? 2 * p->cap_acks : 64;
			tp_ack_t *a = realloc(p->acks, (size_t)cap * sizeof *a);
			if (!a)
				return 1;
			p->acks = a;
			p->cap_acks = cap;
		}
		p->acks[p->n_acks++] = (tp_ack_t){tp_get64(b + 8), tp_get64(b + 16)};
		p->b_acked = tp_get64(b + 8);
		p->b_tlast = now;
		return 1;
	}
	return 0;
}

static int tp_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int tp_probe_result(const tp_probe_t *p, tp_link_stats_t *out)
{
	if (p->phase != PH_DONE)
		return SH_EINVAL;
	double r[256], s[TP_SIZED_PROBES];
	memset(out, 0, sizeof *out);
	memcpy(r, p->rtt, sizeof r[0] * (size_t)p->n_rtt);
	qsort(r, (size_t)p->n_rtt, sizeof r[0], tp_cmp_double);
	out->probes = p->n_rtt;
	out->rtt_us_min = r[0];
	out->rtt_us_median = r[p->n_rtt / 2];
	out->rtt_us_p90 = r[MIN(p->n_rtt - 1, (p->n_rtt * 9 + 9) / 10 - 1)];
	if (p->n_sized) {
		memcpy(s, p->sized, sizeof s);
		qsort(s, TP_SIZED_PROBES, sizeof s[0], tp_cmp_double);
		out->sized_bytes = p->o.sized_bytes;
		out->sized_rtt_us_median = s[TP_SIZED_PROBES / 2];
	}
	out->gap_us = -1;
	if (p->o.train > 1 && p->train_best > 0) {
		double g = ((double)p->train_best / 1e3 - out->rtt_us_median) / (p->o.train - 1);
		if (g > 0)
			out->gap_us = g;
	}
	out->tput_mbit = -1;
	if (p->n_acks) {
		/* from the first acknowledgement past a quarter of the bytes: slow start is over */
		const tp_ack_t *last = &p->acks[p->n_acks - 1], *first = &p->acks[0];
		for (int i = 0; i < p->n_acks - 1; i++)
			if (p->acks[i].bytes * 4 >= last->bytes) {
				first = &p->acks[i];
				break;
			}
		out->burst_bytes = last->bytes;
		out->burst_ms = (double)(p->b_tlast - p->b_t0) / 1e6;
		if (last->span > first->span)
			out->tput_mbit = (double)(last->bytes - first->bytes) * 8e3 /
					 (double)(last->span - first->span);
		else if (out->burst_ms > 0) /* one frame only: the prober's view */
			out->tput_mbit = (double)last->bytes * 8e-3 / out->burst_ms;
	}
	return 0;
}

int tp_probe_answer(tp_chan_t *c, uint16_t type, const void *payload, size_t len)
{
	const uint8_t *b = payload;
	if (type == TP_MSG_PROBE) {
		if (len < TP_PROBE_HDR || len > TP_PROBE_MAX)
			return SH_EFORMAT;
		uint32_t reply = tp_get32(b + 4);
		if (reply < TP_PROBE_HDR || reply > TP_PROBE_MAX)
			return SH_EFORMAT;
		uint8_t small[256], *e = reply <= sizeof small ? small : calloc(1, reply);
		if (!e)
			return SH_ENOMEM;
		memset(e, 0, MIN(reply, sizeof small));
		memcpy(e, b, TP_PROBE_HDR);
		int rc = tp_chan_send(c, TP_MSG_PROBE_ECHO, e, reply);
		if (e != small)
			free(e);
		return rc ? rc : 1;
	}
	if (type == TP_MSG_PROBE_BURST) {
		if (len < TP_BURST_HDR)
			return SH_EFORMAT;
		int64_t now = now_ns();
		if (tp_get32(b + 4) == 0) {
			c->burst_t0 = now;
			c->burst_bytes = 0;
		}
		c->burst_bytes += len - TP_BURST_HDR;
		uint8_t a[TP_PROBE_ACK_WIRE] = {0};
		memcpy(a, b, 8);
		tp_put64(a + 8, c->burst_bytes);
		tp_put64(a + 16, (uint64_t)(now - c->burst_t0));
		int rc = tp_chan_send(c, TP_MSG_PROBE_ACK, a, sizeof a);
		return rc ? rc : 1;
	}
	return 0;
}

int tp_link_probe(tp_chan_t *c, const tp_probe_opts_t *o, tp_link_stats_t *out,
		  tp_chan_msg_fn other, void *ctx, char *err, size_t errlen)
{
	tp_probe_t *p;
	int rc = tp_probe_new(&p, o, err, errlen);
	if (rc)
		return rc;
	for (;;) {
		int wait;
		rc = tp_probe_step(p, c, now_ns(), &wait);
		if (rc == 1)
			break;
		if (rc) {
			sh_fail(err, errlen, rc, "link probe to %s: %s", tp_chan_peer_addr(c),
				rc == SH_ETIMEDOUT ? "no answer in time (does the peer answer "
						     "probes?)"
						   : sh_strerror(rc));
			break;
		}
		uint16_t type;
		void *pl;
		size_t len;
		rc = tp_chan_recv(c, &type, &pl, &len, wait);
		if (rc == SH_ETIMEDOUT)
			continue;
		if (rc == 0 && !tp_probe_take(p, type, pl, len, now_ns()) &&
		    (rc = tp_probe_answer(c, type, pl, len)) == 0 && other)
			other(ctx, type, pl, len);
		if (rc < 0) {
			sh_fail(err, errlen, rc, "link probe to %s: %s", tp_chan_peer_addr(c),
				sh_strerror(rc));
			break;
		}
		rc = 0;
	}
	if (rc == 1)
		rc = tp_probe_result(p, out);
	tp_probe_free(p);
	return rc;
}
