/*
 * coll.c: the collectives (all-reduce, broadcast, all-gather, barrier) built from exchanges.
 *
 * All-reduce has three paths, picked from the message size S and N alone (so every rank picks
 * the same one):
 *   direct (S <= direct_max = 64 KiB, N = 2): both ranks swap vectors in one exchange (one round
 *     trip) and add them in rank order. S bytes per rank, the minimum for N = 2.
 *   2-phase (S <= 64 KiB, N >= 3): rank p receives everyone's chunk p and adds them in rank
 *     order, then sends its summed chunk to all. 2 round trips, 2 (N-1)/N x S bytes per rank
 *     (bandwidth-optimal; never the O(N^2) total of everyone sending everything to everyone).
 *   ring (larger): reduce-scatter then all-gather around the ring r -> r+1, 2(N-1) steps, the
 *     same 2 (N-1)/N x S bytes, one neighbour at a time (for prefill-sized messages).
 * Every rank ends with the same bytes: each sum is formed in one fixed order by one rank (or by
 * every rank identically, direct) and copied. The paths may differ from each other in the last
 * bit, which is why the choice depends only on (S, N).
 *
 * Invariant: a received payload is read in place from the channel's buffer (no copy) and only
 * until the next exchange with that peer; payload pointers are not 4-aligned, so floats are
 * loaded with memcpy.
 */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "transport/frame.h"
#include "transport/group.h"

/* Largest data bytes in one COLL frame. */
#define TP_SEG_BYTES ((size_t)(TP_MAX_PAYLOAD - TP_COLL_WIRE))

static inline float tp_ldf(const uint8_t *p)
{
	float f;
	memcpy(&f, p, sizeof f);
	return f;
}

static void tp_add_f32(float *dst, const uint8_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] += tp_ldf(src + 4 * i);
}

/* acc[0..len) = the ranks' contributions summed in rank order: this rank's is mine, every
 * other's the bytes received from it. The fixed order makes every rank's sum bit-identical. */
static void tp_sum_rank_order(tp_group_t *g, float *acc, const float *mine, size_t len)
{
	for (int p = 0; p < g->world; p++) {
		if (p == 0 && g->rank == 0)
			memcpy(acc, mine, len * 4);
		else if (p == 0)
			memcpy(acc, g->xf[0].rdata, len * 4);
		else if (p == g->rank)
			for (size_t i = 0; i < len; i++)
				acc[i] += mine[i];
		else
			tp_add_f32(acc, g->xf[p].rdata, len);
	}
}

static int tp_scratch(tp_group_t *g, size_t n, char *err, size_t errlen)
{
	if (g->scratch_cap >= n)
		return 0;
	float *s = realloc(g->scratch, n * sizeof *s);
	if (!s)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory for %zu floats", n);
	g->scratch = s;
	g->scratch_cap = n;
	return 0;
}

static int tp_allreduce_direct(tp_group_t *g, float *buf, size_t n, int64_t deadline,
			       int timeout_ms, char *err, size_t errlen)
{
	int rc = tp_scratch(g, n, err, errlen);
	if (rc)
		return rc;
	tp_xfer_reset(g);
	for (int p = 0; p < g->world; p++) {
		if (p == g->rank)
			continue;
		g->xf[p] = (tp_xfer_t){.send = 1, .sdata = buf, .slen = n * 4, .recv = 1,
				       .rlen = n * 4};
	}
	rc = tp_group_exchange(g, TP_OP_ALLREDUCE_DIRECT, 0, 0, deadline, timeout_ms,
			       "all_reduce", err, errlen);
	if (rc)
		return rc;
	tp_sum_rank_order(g, g->scratch, buf, n);
	memcpy(buf, g->scratch, n * 4);
	return 0;
}

/* Chunk c of m floats split into w nearly equal chunks: [*start, *start + *len). */
static void tp_chunk(size_t m, int w, int c, size_t *start, size_t *len)
{
	size_t base = m / (size_t)w, extra = m % (size_t)w;
	*start = (size_t)c * base + MIN((size_t)c, extra);
	*len = base + ((size_t)c < extra ? 1 : 0);
}

/* Two exchanges: every rank sends chunk p of its vector to rank p and adds the N copies of its
 * own chunk in rank order; then every rank sends its summed chunk to all. 2 (N-1)/N x S bytes
 * per rank (the minimum for an all-reduce) in 2 round trips. */
static int tp_allreduce_2phase(tp_group_t *g, float *buf, size_t n, int64_t deadline,
			       int timeout_ms, char *err, size_t errlen)
{
	size_t m0, ml;
	tp_chunk(n, g->world, g->rank, &m0, &ml);
	int rc = tp_scratch(g, ml ? ml : 1, err, errlen);
	if (rc)
		return rc;
	tp_xfer_reset(g);
	for (int p = 0; p < g->world; p++) {
		if (p == g->rank)
			continue;
		size_t s0, sl;
		tp_chunk(n, g->world, p, &s0, &sl);
		g->xf[p] = (tp_xfer_t){.send = 1, .sdata = buf + s0, .slen = sl * 4, .recv = 1,
				       .rlen = ml * 4};
	}
	rc = tp_group_exchange(g, TP_OP_ALLREDUCE_2PHASE, 0, 0, deadline, timeout_ms,
			       "all_reduce", err, errlen);
	if (rc)
		return rc;
	tp_sum_rank_order(g, g->scratch, buf + m0, ml);
	memcpy(buf + m0, g->scratch, ml * 4);
	tp_xfer_reset(g);
	for (int p = 0; p < g->world; p++) {
		if (p == g->rank)
			continue;
		size_t r0, rl;
		tp_chunk(n, g->world, p, &r0, &rl);
		g->xf[p] = (tp_xfer_t){.send = 1, .sdata = buf + m0, .slen = ml * 4, .recv = 1,
				       .rlen = rl * 4};
	}
	rc = tp_group_exchange(g, TP_OP_ALLREDUCE_2PHASE, 1, 0, deadline, timeout_ms,
			       "all_reduce", err, errlen);
	if (rc)
		return rc;
	for (int p = 0; p < g->world; p++) {
		if (p == g->rank)
			continue;
		size_t r0, rl;
		tp_chunk(n, g->world, p, &r0, &rl);
		if (rl)
			memcpy(buf + r0, g->xf[p].rdata, rl * 4);
	}
	return 0;
}

static int tp_allreduce_ring(tp_group_t *g, float *buf, size_t m, uint32_t seg,
			     int64_t deadline, int timeout_ms, char *err, size_t errlen)
{
	int w = g->world, r = g->rank;
	int right = (r + 1) % w, left = (r + w - 1) % w;
	for (int phase = 0; phase < 2; phase++) {
		for (int s = 0; s < w - 1; s++) {
			/* reduce-scatter: send chunk r-s, receive r-s-1 and add;
			 * all-gather: send chunk r+1-s (complete), receive r-s and copy */
			int sc = phase == 0 ? (r - s + 2 * w) % w : (r + 1 - s + 2 * w) % w;
			int rcv = phase == 0 ? (r - s - 1 + 2 * w) % w : (r - s + 2 * w) % w;
			size_t s0, sl, r0, rl;
			tp_chunk(m, w, sc, &s0, &sl);
			tp_chunk(m, w, rcv, &r0, &rl);
			tp_xfer_reset(g);
			g->xf[right].send = 1;
			g->xf[right].sdata = buf + s0;
			g->xf[right].slen = sl * 4;
			g->xf[left].recv = 1;
			g->xf[left].rlen = rl * 4;
			int rc = tp_group_exchange(
				g, phase == 0 ? TP_OP_REDUCE_SCATTER : TP_OP_ALL_GATHER_RING,
				(uint16_t)s, seg, deadline, timeout_ms, "all_reduce", err, errlen);
			if (rc)
				return rc;
			if (phase == 0)
				tp_add_f32(buf + r0, g->xf[left].rdata, rl);
			else if (rl)
				memcpy(buf + r0, g->xf[left].rdata, rl * 4);
		}
	}
	return 0;
}

int tp_all_reduce_f32(tp_group_t *g, float *buf, size_t n, int timeout_ms, char *err,
		      size_t errlen)
{
	int rc = tp_group_check(g, err, errlen);
	if (rc || g->world == 1 || n == 0)
		return rc;
	int64_t deadline = tp_deadline(timeout_ms);
	if (g->q8)
		return tp_allreduce_q8(g, buf, n, deadline, timeout_ms, err, errlen);
	if (n * 4 <= g->direct_max && g->world == 2)
		return tp_allreduce_direct(g, buf, n, deadline, timeout_ms, err, errlen);
	if (n * 4 <= g->direct_max)
		return tp_allreduce_2phase(g, buf, n, deadline, timeout_ms, err, errlen);
	/* segments small enough that every ring chunk fits one frame */
	size_t seg_floats = (TP_SEG_BYTES / 4) * (size_t)(g->world);
	uint32_t seg = 0;
	for (size_t off = 0; off < n; off += seg_floats, seg++) {
		rc = tp_allreduce_ring(g, buf + off, MIN(seg_floats, n - off), seg, deadline,
				       timeout_ms, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

int tp_broadcast(tp_group_t *g, void *buf, size_t len, int root, int timeout_ms, char *err,
		 size_t errlen)
{
	int rc = tp_group_check(g, err, errlen);
	if (rc)
		return rc;
	if (root < 0 || root >= g->world)
		return sh_fail(err, errlen, SH_EINVAL, "bad root rank %d", root);
	if (g->world == 1)
		return 0;
	int64_t deadline = tp_deadline(timeout_ms);
	uint8_t *b = buf;
	uint32_t seg = 0;
	for (size_t off = 0; off == 0 || off < len; off += TP_SEG_BYTES, seg++) {
		size_t l = MIN(TP_SEG_BYTES, len - off);
		tp_xfer_reset(g);
		if (g->rank == root) {
			for (int p = 0; p < g->world; p++)
				if (p != root)
					g->xf[p] = (tp_xfer_t){.send = 1, .sdata = b + off,
							       .slen = l};
		} else {
			g->xf[root] = (tp_xfer_t){.recv = 1, .rlen = l};
		}
		rc = tp_group_exchange(g, TP_OP_BROADCAST, (uint16_t)root, seg, deadline,
				       timeout_ms, "broadcast", err, errlen);
		if (rc)
			return rc;
		if (g->rank != root && l)
			memcpy(b + off, g->xf[root].rdata, l);
	}
	return 0;
}

int tp_all_gather(tp_group_t *g, const void *in, size_t len, void *out, int timeout_ms,
		  char *err, size_t errlen)
{
	int rc = tp_group_check(g, err, errlen);
	if (rc)
		return rc;
	uint8_t *o = out;
	const uint8_t *src = in;
	if (src != o + (size_t)g->rank * len)
		memmove(o + (size_t)g->rank * len, src, len);
	src = o + (size_t)g->rank * len;
	if (g->world == 1)
		return 0;
	int64_t deadline = tp_deadline(timeout_ms);
	uint32_t seg = 0;
	for (size_t off = 0; off == 0 || off < len; off += TP_SEG_BYTES, seg++) {
		size_t l = MIN(TP_SEG_BYTES, len - off);
		tp_xfer_reset(g);
		for (int p = 0; p < g->world; p++)
			if (p != g->rank)
				g->xf[p] = (tp_xfer_t){.send = 1, .sdata = src + off, .slen = l,
						       .recv = 1, .rlen = l};
		rc = tp_group_exchange(g, TP_OP_ALL_GATHER, 0, seg, deadline, timeout_ms,
				       "all_gather", err, errlen);
		if (rc)
			return rc;
		for (int p = 0; p < g->world; p++)
			if (p != g->rank && l)
				memcpy(o + (size_t)p * len + off, g->xf[p].rdata, l);
	}
	return 0;
}

int tp_barrier(tp_group_t *g, int timeout_ms, char *err, size_t errlen)
{
	int rc = tp_group_check(g, err, errlen);
	if (rc || g->world == 1)
		return rc;
	tp_xfer_reset(g);
	for (int p = 0; p < g->world; p++)
		if (p != g->rank)
			g->xf[p] = (tp_xfer_t){.send = 1, .recv = 1};
	return tp_group_exchange(g, TP_OP_BARRIER, 0, 0, tp_deadline(timeout_ms), timeout_ms,
				 "barrier", err, errlen);
}
