/*
 * coll_q8.c: the optional 8-bit block-quantized all-reduce (off by default; tp_group_set_q8).
 *
 * Wire block (36 bytes per 32 floats, 3.6x smaller than f32): d f32 little-endian, then 32 int8
 * q[i] = round(x[i] * 127 / amax), amax = max |x| over the block; the value is q[i] * d with
 * d = amax / 127. Rounding error per element <= d / 2 = amax / 254 (0.4 % of the block's
 * largest magnitude). A block holding Inf or NaN decodes to NaN (never undefined behaviour).
 *
 * Identical results on every rank: every contribution enters a sum as dq(q(x)), including a
 * rank's own one, and every copied chunk is dq(q(sum)) on the owner too, so all ranks add the
 * same numbers in the same (rank) order.
 *   N = 2: one exchange (like the f32 direct path). Error <= amax0/254 + amax1/254 per element
 *          (amaxP = the block's largest |x| on rank P), plus f32 rounding.
 *   N >= 3: the 2-phase scheme on block-aligned chunks. Error <= sum_P amaxP/254 +
 *          amax(sum)/254.
 * Large messages are cut into segments so each frame stays under the frame limit.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "transport/frame.h"
#include "transport/group.h"

#define TP_Q8_BLOCK 32
#define TP_Q8_BYTES 36

size_t tp_q8_size(size_t n) { return (n + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK * TP_Q8_BYTES; }

void tp_q8_encode(uint8_t *out, const float *x, size_t n)
{
	for (size_t b = 0; b < n; b += TP_Q8_BLOCK, out += TP_Q8_BYTES) {
		size_t m = MIN((size_t)TP_Q8_BLOCK, n - b);
		float amax = 0;
		int finite = 1;
		for (size_t i = 0; i < m; i++) {
			float a = fabsf(x[b + i]);
			finite &= isfinite(a) != 0;
			if (a > amax)
				amax = a;
		}
		float d = finite ? amax / 127.0f : NAN;
		int ok = finite && amax > 0;
		float id = ok ? 127.0f / amax : 0.0f;
		memcpy(out, &d, 4); /* host order: little-endian hosts only, as the engine */
		int8_t *q = (int8_t *)(out + 4);
		for (size_t i = 0; i < TP_Q8_BLOCK; i++) {
			float v = i < m && ok ? roundf(x[b + i] * id) : 0.0f;
			q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
		}
	}
}

/* acc = dq(in) (add = 0) or acc += dq(in) (add = 1), n floats. */
void tp_q8_decode(float *acc, const uint8_t *in, size_t n, int add)
{
	for (size_t b = 0; b < n; b += TP_Q8_BLOCK, in += TP_Q8_BYTES) {
		size_t m = MIN((size_t)TP_Q8_BLOCK, n - b);
		float d;
		memcpy(&d, in, 4);
		const int8_t *q = (const int8_t *)(in + 4);
		for (size_t i = 0; i < m; i++) {
			float v = (float)q[i] * d;
			acc[b + i] = add ? acc[b + i] + v : v;
		}
	}
}

static int tp_q8_reserve(tp_group_t *g, size_t qbytes, size_t nacc, char *err, size_t errlen)
{
	if (g->qcap < qbytes) {
		uint8_t *q = realloc(g->qbuf, qbytes);
		if (!q)
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		g->qbuf = q;
		g->qcap = qbytes;
	}
	if (g->scratch_cap < nacc) {
		float *s = realloc(g->scratch, nacc * sizeof *s);
		if (!s)
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		g->scratch = s;
		g->scratch_cap = nacc;
	}
	return 0;
}

/* Chunk c in whole blocks: elements [*start, *start + *len) of n. */
static void tp_q8_chunk(size_t n, int w, int c, size_t *start, size_t *len)
{
	size_t nb = (n + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK;
	size_t base = nb / (size_t)w, extra = nb % (size_t)w;
	size_t b0 = (size_t)c * base + MIN((size_t)c, extra);
	size_t bl = base + ((size_t)c < extra ? 1 : 0);
	*start = MIN(b0 * TP_Q8_BLOCK, n);
	*len = MIN((b0 + bl) * TP_Q8_BLOCK, n) - *start;
}

/* One segment of n floats. */
static int tp_q8_segment(tp_group_t *g, float *buf, size_t n, uint32_t seg, int64_t deadline,
			 int timeout_ms, char *err, size_t errlen)
{
	int w = g->world, r = g->rank, rc;
	uint8_t *q = g->qbuf; /* our own vector, quantized, block-aligned everywhere */
	tp_q8_encode(q, buf, n);
	if (w == 2) {
		int p = 1 - r;
		tp_xfer_reset(g);
		g->xf[p] = (tp_xfer_t){.send = 1, .sdata = q, .slen = tp_q8_size(n), .recv = 1,
				       .rlen = tp_q8_size(n)};
		rc = tp_group_exchange(g, TP_OP_ALLREDUCE_Q8, 0, seg, deadline, timeout_ms,
				       "all_reduce", err, errlen);
		if (rc)
			return rc;
		tp_q8_decode(buf, r == 0 ? q : g->xf[p].rdata, n, 0);
		tp_q8_decode(buf, r == 0 ? g->xf[p].rdata : q, n, 1);
		return 0;
	}
	size_t m0, ml;
	tp_q8_chunk(n, w, r, &m0, &ml);
	tp_xfer_reset(g);
	for (int p = 0; p < w; p++) {
		if (p == r)
			continue;
		size_t s0, sl;
		tp_q8_chunk(n, w, p, &s0, &sl);
		g->xf[p] = (tp_xfer_t){.send = 1, .sdata = q + s0 / TP_Q8_BLOCK * TP_Q8_BYTES,
				       .slen = tp_q8_size(sl), .recv = 1, .rlen = tp_q8_size(ml)};
	}
	rc = tp_group_exchange(g, TP_OP_ALLREDUCE_Q8, 0, seg, deadline, timeout_ms, "all_reduce",
			       err, errlen);
	if (rc)
		return rc;
	float *acc = g->scratch;
	const uint8_t *mine = q + m0 / TP_Q8_BLOCK * TP_Q8_BYTES;
	for (int p = 0; p < w; p++)
		tp_q8_decode(acc, p == r ? mine : g->xf[p].rdata, ml, p != 0);
	/* our summed chunk, quantized in place of our own chunk's blocks (already sent) */
	uint8_t *sum_q = q + m0 / TP_Q8_BLOCK * TP_Q8_BYTES;
	tp_q8_encode(sum_q, acc, ml);
	tp_q8_decode(buf + m0, sum_q, ml, 0);
	tp_xfer_reset(g);
	for (int p = 0; p < w; p++) {
		if (p == r)
			continue;
		size_t r0, rl;
		tp_q8_chunk(n, w, p, &r0, &rl);
		g->xf[p] = (tp_xfer_t){.send = 1, .sdata = sum_q, .slen = tp_q8_size(ml),
				       .recv = 1, .rlen = tp_q8_size(rl)};
	}
	rc = tp_group_exchange(g, TP_OP_ALLREDUCE_Q8, 1, seg, deadline, timeout_ms, "all_reduce",
			       err, errlen);
	if (rc)
		return rc;
	for (int p = 0; p < w; p++) {
		if (p == r)
			continue;
		size_t r0, rl;
		tp_q8_chunk(n, w, p, &r0, &rl);
		tp_q8_decode(buf + r0, g->xf[p].rdata, rl, 0);
	}
	return 0;
}

int tp_allreduce_q8(tp_group_t *g, float *buf, size_t n, int64_t deadline, int timeout_ms,
		    char *err, size_t errlen)
{
	/* a segment's largest frame: the whole vector (N = 2) or one chunk (N >= 3) */
	size_t blocks = (TP_MAX_PAYLOAD - TP_COLL_WIRE) / TP_Q8_BYTES;
	size_t seg_floats = blocks * TP_Q8_BLOCK * (size_t)(g->world == 2 ? 1 : g->world);
	size_t first = MIN(n, seg_floats);
	int rc = tp_q8_reserve(g, tp_q8_size(first), first, err, errlen);
	if (rc)
		return rc;
	uint32_t seg = 0;
	for (size_t off = 0; off < n; off += seg_floats, seg++)
		if ((rc = tp_q8_segment(g, buf + off, MIN(seg_floats, n - off), seg, deadline,
					timeout_ms, err, errlen)))
			return rc;
	return 0;
}

int tp_group_set_q8(tp_group_t *g, int on)
{
	if (!g)
		return SH_EINVAL;
	g->q8 = on ? 1 : 0;
	return 0;
}
