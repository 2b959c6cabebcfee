/*
 * coll.c: the collectives (all-reduce, broadcast, all-gather, barrier) built from exchanges.
 *
 * All-reduce runs over a team: every rank of the group, or a subset (a pipeline stage's tensor
 * group in a hybrid plan). Two paths, picked from the team size k and the bytes S of one rank's
 * contribution only, so every member picks the same:
 *   direct  (k = 2, or (k - 1) x S <= direct_max): every member sends its vector to every other
 *           member in one exchange (one message per peer, no acknowledgement, no second round)
 *           and sums the k vectors in place. One link latency; (k - 1) x S bytes out per member
 *           (S for 2 ranks, the minimum).
 *   2-phase (k >= 3 and larger S): member j receives everyone's chunk j and sums it, then sends
 *           its summed chunk to all. Two latencies; 2 (k - 1)/k x S bytes out per member (the
 *           minimum for an all-reduce), never the O(k^2) total of direct at large S.
 * Messages larger than a frame are cut into segments (the `offset` field of COLL frames).
 *
 * Determinism: on both paths every element is summed in ascending rank order of the team, in
 * f32: x(r0) + x(r1) + ... + x(r(k-1)). The path, the chunk and segment boundaries and the number
 * of rows never change an element's sum, so a row reduced alone or inside a batch of any size
 * gives the same bits, and every member holds the same bits (one fixed order everywhere).
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

/* dst[i] = src[0][i] + src[1][i] + ... + src[k-1][i], added in that order, for i < n. A source
 * may be dst itself (our own contribution: element i is read before it is written). */
void tp_sum_ordered(float *dst, const uint8_t *const *src, int k, size_t n)
{
	if (k == 2) {
		const uint8_t *a = src[0], *b = src[1];
		for (size_t i = 0; i < n; i++)
			dst[i] = tp_ldf(a + 4 * i) + tp_ldf(b + 4 * i);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		float s = tp_ldf(src[0] + 4 * i);
		for (int j = 1; j < k; j++)
			s += tp_ldf(src[j] + 4 * i);
		dst[i] = s;
	}
}

int tp_team_make(const tp_group_t *g, const int *ranks, int nranks, tp_team_t *t, char *err,
		 size_t errlen)
{
	t->me = -1;
	if (!ranks) {
		t->n = g->world;
		for (int r = 0; r < g->world; r++)
			t->r[r] = r;
		t->me = g->rank;
		return 0;
	}
	if (nranks < 1 || nranks > g->world)
		return sh_fail(err, errlen, SH_EINVAL, "a team of %d ranks in a group of %d",
			       nranks, g->world);
	for (int i = 0; i < nranks; i++) {
		if (ranks[i] < 0 || ranks[i] >= g->world || (i && ranks[i] <= ranks[i - 1]))
			return sh_fail(err, errlen, SH_EINVAL,
				       "team ranks must be ascending ranks of the group (entry %d "
				       "is %d)",
				       i, ranks[i]);
		t->r[i] = ranks[i];
		if (ranks[i] == g->rank)
			t->me = i;
	}
	t->n = nranks;
	if (t->me < 0)
		return sh_fail(err, errlen, SH_EINVAL, "rank %d is not in the team", g->rank);
	return 0;
}

static int tp_allreduce_direct(tp_group_t *g, const tp_team_t *t, float *buf, size_t n,
			       int64_t deadline, int timeout_ms, char *err, size_t errlen)
{
	const uint8_t *src[TP_MAX_WORLD];
	size_t seg = TP_SEG_BYTES / 4;
	uint32_t s = 0;
	for (size_t off = 0; off < n; off += seg, s++) {
		size_t len = MIN(seg, n - off);
		tp_xfer_reset(g);
		for (int j = 0; j < t->n; j++)
			if (j != t->me)
				g->xf[t->r[j]] = (tp_xfer_t){.send = 1,
							     .sdata = buf + off,
							     .slen = len * 4,
							     .recv = 1,
							     .rlen = len * 4};
		int rc = tp_group_exchange(g, TP_OP_ALLREDUCE_DIRECT, 0, s, deadline, timeout_ms,
					   "all_reduce", err, errlen);
		if (rc)
			return rc;
		for (int j = 0; j < t->n; j++)
			src[j] = j == t->me ? (const uint8_t *)(buf + off) : g->xf[t->r[j]].rdata;
		tp_sum_ordered(buf + off, src, t->n, len);
	}
	return 0;
}

/* Chunk c of m floats split into w nearly equal chunks: [*start, *start + *len). */
static void tp_chunk(size_t m, int w, int c, size_t *start, size_t *len)
{
	size_t base = m / (size_t)w, extra = m % (size_t)w;
	*start = (size_t)c * base + MIN((size_t)c, extra);
	*len = base + ((size_t)c < extra ? 1 : 0);
}

/* Per segment two exchanges: member j gets chunk j of everyone's vector and sums it in rank
 * order; then every member sends its summed chunk to all. */
static int tp_allreduce_2phase(tp_group_t *g, const tp_team_t *t, float *buf, size_t n,
			       int64_t deadline, int timeout_ms, char *err, size_t errlen)
{
	const uint8_t *src[TP_MAX_WORLD];
	int k = t->n, me = t->me;
	size_t seg = (TP_SEG_BYTES / 4) * (size_t)k; /* every chunk of a segment fits a frame */
	uint32_t s = 0;
	for (size_t off = 0; off < n; off += seg, s++) {
		float *v = buf + off;
		size_t m = MIN(seg, n - off), m0, ml;
		tp_chunk(m, k, me, &m0, &ml);
		tp_xfer_reset(g);
		for (int j = 0; j < k; j++) {
			if (j == me)
				continue;
			size_t s0, sl;
			tp_chunk(m, k, j, &s0, &sl);
			g->xf[t->r[j]] = (tp_xfer_t){
			    .send = 1, .sdata = v + s0, .slen = sl * 4, .recv = 1, .rlen = ml * 4};
		}
		int rc = tp_group_exchange(g, TP_OP_ALLREDUCE_2PHASE, 0, s, deadline, timeout_ms,
					   "all_reduce", err, errlen);
		if (rc)
			return rc;
		for (int j = 0; j < k; j++)
			src[j] = j == me ? (const uint8_t *)(v + m0) : g->xf[t->r[j]].rdata;
		tp_sum_ordered(v + m0, src, k, ml);
		tp_xfer_reset(g);
		for (int j = 0; j < k; j++) {
			if (j == me)
				continue;
			size_t r0, rl;
			tp_chunk(m, k, j, &r0, &rl);
			g->xf[t->r[j]] = (tp_xfer_t){
			    .send = 1, .sdata = v + m0, .slen = ml * 4, .recv = 1, .rlen = rl * 4};
		}
		rc = tp_group_exchange(g, TP_OP_ALLREDUCE_2PHASE, 1, s, deadline, timeout_ms,
				       "all_reduce", err, errlen);
		if (rc)
			return rc;
		for (int j = 0; j < k; j++) {
			size_t r0, rl;
			tp_chunk(m, k, j, &r0, &rl);
			if (j != me && rl)
				memcpy(v + r0, g->xf[t->r[j]].rdata, rl * 4);
		}
	}
	return 0;
}

int tp_all_reduce_team(tp_group_t *g, const int *ranks, int nranks, float *buf, size_t rows,
		       size_t cols, int timeout_ms, char *err, size_t errlen)
{
	tp_team_t t;
	int rc = tp_group_check(g, err, errlen);
	if (rc || (rc = tp_team_make(g, ranks, nranks, &t, err, errlen)))
		return rc;
	if (cols && rows > SIZE_MAX / 4 / cols)
		return sh_fail(err, errlen, SH_EINVAL, "all-reduce of %zu x %zu floats", rows,
			       cols);
	size_t n = rows * cols;
	if (t.n == 1 || n == 0)
		return 0;
	int64_t deadline = tp_deadline(timeout_ms);
	if (g->q8)
		return tp_allreduce_q8(g, &t, buf, rows, cols, deadline, timeout_ms, err, errlen);
	if (t.n == 2 || (size_t)(t.n - 1) * n * 4 <= g->direct_max)
		return tp_allreduce_direct(g, &t, buf, n, deadline, timeout_ms, err, errlen);
	return tp_allreduce_2phase(g, &t, buf, n, deadline, timeout_ms, err, errlen);
}

int tp_reduce_team(tp_group_t *g, const int *ranks, int nranks, int root, float *buf, size_t rows,
		   size_t cols, int timeout_ms, char *err, size_t errlen)
{
	const uint8_t *src[TP_MAX_WORLD];
	tp_team_t t;
	int rc = tp_group_check(g, err, errlen), ri = -1;
	if (rc || (rc = tp_team_make(g, ranks, nranks, &t, err, errlen)))
		return rc;
	for (int j = 0; j < t.n; j++)
		if (t.r[j] == root)
			ri = j;
	if (ri < 0)
		return sh_fail(err, errlen, SH_EINVAL, "reduce: root %d is not in the team", root);
	if (cols && rows > SIZE_MAX / 4 / cols)
		return sh_fail(err, errlen, SH_EINVAL, "reduce of %zu x %zu floats", rows, cols);
	size_t n = rows * cols, seg = TP_SEG_BYTES / 4;
	if (t.n == 1 || n == 0)
		return 0;
	int64_t deadline = tp_deadline(timeout_ms);
	if (g->q8)
		return tp_reduce_q8(g, &t, ri, buf, rows, cols, deadline, timeout_ms, err, errlen);
	uint32_t s = 0;
	for (size_t off = 0; off < n; off += seg, s++) {
		size_t len = MIN(seg, n - off);
		tp_xfer_reset(g);
		for (int j = 0; j < t.n; j++)
			if (t.me != ri && j == ri)
				g->xf[root] =
				    (tp_xfer_t){.send = 1, .sdata = buf + off, .slen = len * 4};
			else if (t.me == ri && j != ri)
				g->xf[t.r[j]] = (tp_xfer_t){.recv = 1, .rlen = len * 4};
		rc = tp_group_exchange(g, TP_OP_REDUCE, 0, s, deadline, timeout_ms, "reduce", err,
				       errlen);
		if (rc)
			return rc;
		if (t.me != ri)
			continue;
		for (int j = 0; j < t.n; j++)
			src[j] = j == ri ? (const uint8_t *)(buf + off) : g->xf[t.r[j]].rdata;
		tp_sum_ordered(buf + off, src, t.n, len);
	}
	return 0;
}

int tp_all_reduce_f32(tp_group_t *g, float *buf, size_t n, int timeout_ms, char *err, size_t errlen)
{
	return tp_all_reduce_team(g, NULL, 0, buf, 1, n, timeout_ms, err, errlen);
}

int tp_group_set_direct_max(tp_group_t *g, size_t bytes)
{
	if (!g)
		return SH_EINVAL;
	g->direct_max = bytes;
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
					g->xf[p] =
					    (tp_xfer_t){.send = 1, .sdata = b + off, .slen = l};
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

int tp_all_gather(tp_group_t *g, const void *in, size_t len, void *out, int timeout_ms, char *err,
		  size_t errlen)
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
				g->xf[p] = (tp_xfer_t){
				    .send = 1, .sdata = src + off, .slen = l, .recv = 1, .rlen = l};
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
