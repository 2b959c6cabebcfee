/*
 * coll_q8.c: the optional 8-bit block-quantized all-reduce (off by default; tp_group_set_q8).
 *
 * Wire block (36 bytes for up to 32 floats, 3.6x smaller than f32): d f32 little-endian, then 32
 * int8 q[i] = round(x[i] * 127 / amax), amax = max |x| over the block; the value is q[i] * d with
 * d = amax / 127. Rounding error per element <= d / 2 = amax / 254 (0.4 % of the block's
 * largest magnitude). A block holding Inf or NaN decodes to NaN (never undefined behaviour).
 * Blocks are per row: a row of cols floats is ceil(cols / 32) blocks (the last one shorter when
 * cols is not a multiple of 32), so a row's quantization never depends on the other rows of a
 * batch.
 *
 * Identical results on every rank, and for a row whatever the batch around it: every
 * contribution enters a sum as dq(q(x)), including a rank's own, added in ascending rank order
 * of the team, y = dq(q(x0)) + dq(q(x1)) + ...; with 3 or more members the result is dq(q(y))
 * (per block), on both paths:
 *   direct  (k = 2, or (k - 1) x wire bytes <= direct_max): one exchange of the whole quantized
 *           vector; every member forms y (and, k >= 3, dq(q(y))) itself.
 *   2-phase (k >= 3, larger): member j gets block chunk j from all, forms dq(q(y)) for it and
 *           sends q(y) to all.
 * Error per element: <= sum_P amaxP / 254 (amaxP = the block's largest |x| on rank P), plus for
 * 3 or more members amax(y) / 254, plus f32 rounding.
 * Large messages are cut into segments of whole blocks so each frame stays under the frame limit.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "transport/frame.h"
#include "transport/group.h"

#define TP_Q8_BLOCK      32
#define TP_Q8_BYTES      36
#define TP_Q8_SEG_BLOCKS ((TP_MAX_PAYLOAD - TP_COLL_WIRE) / TP_Q8_BYTES) /* blocks per frame */

size_t tp_q8_size(size_t n)
{
	return (n + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK * TP_Q8_BYTES;
}

static void tp_q8_encode_block(uint8_t *out, const float *x, size_t m)
{
	/* fixed-length loops over a padded copy: the compiler vectorizes them (~5x faster than a
	 * roundf per element; this runs on the critical path of every all-reduce) */
	float v[TP_Q8_BLOCK] = {0}, amax = 0, nan = 0;
	memcpy(v, x, m * sizeof *v);
	for (int i = 0; i < TP_Q8_BLOCK; i++) {
		float a = fabsf(v[i]);
		amax = a > amax ? a : amax;
		nan += v[i] * 0.0f; /* NaN when any element is Inf or NaN */
	}
	int finite = nan == 0.0f;
	float d = finite ? amax / 127.0f : NAN;
	float id = finite && amax > 0 ? 127.0f / amax : 0.0f;
	memcpy(out, &d, 4); /* host order: little-endian hosts only, as the engine */
	int8_t *q = (int8_t *)(out + 4);
	for (int i = 0; i < TP_Q8_BLOCK; i++) {
		float r = v[i] * id; /* |r| <= 127: round half away from zero */
		q[i] = (int8_t)(int)(r + (r >= 0.0f ? 0.5f : -0.5f));
	}
}

/* acc[0..m) = dq(in) (add = 0) or acc += dq(in) (add = 1). */
static void tp_q8_decode_block(float *acc, const uint8_t *in, size_t m, int add)
{
	float d;
	memcpy(&d, in, 4);
	const int8_t *q = (const int8_t *)(in + 4);
	for (size_t i = 0; i < m; i++) {
		float v = (float)q[i] * d;
		acc[i] = add ? acc[i] + v : v;
	}
}

/* Block b of a vector of rows of cols floats: elements [*start, *start + *len). */
static inline void tp_q8_block(size_t cols, size_t b, size_t *start, size_t *len)
{
	size_t nbr = (cols + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK, j = b % nbr;
	*start = b / nbr * cols + j * TP_Q8_BLOCK;
	*len = MIN((size_t)TP_Q8_BLOCK, cols - j * TP_Q8_BLOCK);
}

/* Blocks [b0, b1) of x -> out (36 bytes each, out points at block b0's place). */
void tp_q8_encode_blocks(uint8_t *out, const float *x, size_t cols, size_t b0, size_t b1)
{
	for (size_t b = b0; b < b1; b++, out += TP_Q8_BYTES) {
		size_t s, m;
		tp_q8_block(cols, b, &s, &m);
		tp_q8_encode_block(out, x + s, m);
	}
}

void tp_q8_decode_blocks(float *x, const uint8_t *in, size_t cols, size_t b0, size_t b1, int add)
{
	for (size_t b = b0; b < b1; b++, in += TP_Q8_BYTES) {
		size_t s, m;
		tp_q8_block(cols, b, &s, &m);
		tp_q8_decode_block(x + s, in, m, add);
	}
}

void tp_q8_encode(uint8_t *out, const float *x, size_t n)
{
	tp_q8_encode_blocks(out, x, n, 0, (n + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK);
}

void tp_q8_decode(float *acc, const uint8_t *in, size_t n, int add)
{
	tp_q8_decode_blocks(acc, in, n, 0, (n + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK, add);
}

/* Chunk c of nb blocks split over w members: blocks [*b0, *b0 + *bl). */
static void tp_q8_chunk(size_t nb, int w, int c, size_t *b0, size_t *bl)
{
	size_t base = nb / (size_t)w, extra = nb % (size_t)w;
	*b0 = (size_t)c * base + MIN((size_t)c, extra);
	*bl = base + ((size_t)c < extra ? 1 : 0);
}

/* buf's blocks [b0, b1) = the sum in team order of the members' quantized blocks (src[j] points
 * at member j's block b0); with 3 or more members quantized once more: *requant (block b0's
 * place) gets q(sum) and buf dq(q(sum)). */
static void tp_q8_sum(float *buf, size_t cols, size_t b0, size_t b1, const uint8_t *const *src,
		      int k, uint8_t *requant)
{
	for (int j = 0; j < k; j++)
		tp_q8_decode_blocks(buf, src[j], cols, b0, b1, j > 0);
	if (k >= 3) {
		tp_q8_encode_blocks(requant, buf, cols, b0, b1);
		tp_q8_decode_blocks(buf, requant, cols, b0, b1, 0);
	}
}

static int tp_q8_direct(tp_group_t *g, const tp_team_t *t, float *buf, size_t cols, size_t nb,
			int64_t deadline, int timeout_ms, char *err, size_t errlen)
{
	const uint8_t *src[TP_MAX_WORLD];
	uint32_t s = 0;
	for (size_t b0 = 0; b0 < nb; b0 += TP_Q8_SEG_BLOCKS, s++) {
		size_t b1 = MIN(nb, b0 + TP_Q8_SEG_BLOCKS);
		uint8_t *q = g->qbuf + b0 * TP_Q8_BYTES;
		tp_xfer_reset(g);
		for (int j = 0; j < t->n; j++)
			if (j != t->me)
				g->xf[t->r[j]] = (tp_xfer_t){.send = 1,
							     .sdata = q,
							     .slen = (b1 - b0) * TP_Q8_BYTES,
							     .recv = 1,
							     .rlen = (b1 - b0) * TP_Q8_BYTES};
		int rc = tp_group_exchange(g, TP_OP_ALLREDUCE_Q8, 0, s, deadline, timeout_ms,
					   "all_reduce", err, errlen);
		if (rc)
			return rc;
		for (int j = 0; j < t->n; j++)
			src[j] = j == t->me ? q : g->xf[t->r[j]].rdata;
		tp_q8_sum(buf, cols, b0, b1, src, t->n, q); /* our blocks are sent: reuse them */
	}
	return 0;
}

static int tp_q8_2phase(tp_group_t *g, const tp_team_t *t, float *buf, size_t cols, size_t nb,
			int64_t deadline, int timeout_ms, char *err, size_t errlen)
{
	const uint8_t *src[TP_MAX_WORLD];
	int k = t->n, me = t->me;
	size_t seg = TP_Q8_SEG_BLOCKS * (size_t)k; /* every chunk of a segment fits a frame */
	uint32_t s = 0;
	for (size_t sb = 0; sb < nb; sb += seg, s++) {
		size_t m = MIN(seg, nb - sb), c0, cl;
		tp_q8_chunk(m, k, me, &c0, &cl);
		c0 += sb;
		uint8_t *mine = g->qbuf + c0 * TP_Q8_BYTES;
		tp_xfer_reset(g);
		for (int j = 0; j < k; j++) {
			if (j == me)
				continue;
			size_t j0, jl;
			tp_q8_chunk(m, k, j, &j0, &jl);
			g->xf[t->r[j]] = (tp_xfer_t){.send = 1,
						     .sdata = g->qbuf + (sb + j0) * TP_Q8_BYTES,
						     .slen = jl * TP_Q8_BYTES,
						     .recv = 1,
						     .rlen = cl * TP_Q8_BYTES};
		}
		int rc = tp_group_exchange(g, TP_OP_ALLREDUCE_Q8, 0, s, deadline, timeout_ms,
					   "all_reduce", err, errlen);
		if (rc)
			return rc;
		for (int j = 0; j < k; j++)
			src[j] = j == me ? mine : g->xf[t->r[j]].rdata;
		tp_q8_sum(buf, cols, c0, c0 + cl, src, k, mine);
		tp_xfer_reset(g);
		for (int j = 0; j < k; j++) {
			if (j == me)
				continue;
			size_t j0, jl;
			tp_q8_chunk(m, k, j, &j0, &jl);
			g->xf[t->r[j]] = (tp_xfer_t){.send = 1,
						     .sdata = mine,
						     .slen = cl * TP_Q8_BYTES,
						     .recv = 1,
						     .rlen = jl * TP_Q8_BYTES};
		}
		rc = tp_group_exchange(g, TP_OP_ALLREDUCE_Q8, 1, s, deadline, timeout_ms,
				       "all_reduce", err, errlen);
		if (rc)
			return rc;
		for (int j = 0; j < k; j++) {
			size_t j0, jl;
			tp_q8_chunk(m, k, j, &j0, &jl);
			if (j != me)
				tp_q8_decode_blocks(buf, g->xf[t->r[j]].rdata, cols, sb + j0,
						    sb + j0 + jl, 0);
		}
	}
	return 0;
}

int tp_q8_reserve(tp_group_t *g, size_t bytes, char *err, size_t errlen)
{
	if (g->qcap >= bytes)
		return 0;
	uint8_t *q = realloc(g->qbuf, bytes);
	if (!q)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory for %zu bytes", bytes);
	g->qbuf = q;
	g->qcap = bytes;
	return 0;
}

int tp_allreduce_q8(tp_group_t *g, const tp_team_t *t, float *buf, size_t rows, size_t cols,
		    int64_t deadline, int timeout_ms, char *err, size_t errlen)
{
	size_t nb = rows * ((cols + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK), bytes = nb * TP_Q8_BYTES;
	int rc = tp_q8_reserve(g, bytes, err, errlen);
	if (rc)
		return rc;
	tp_q8_encode_blocks(g->qbuf, buf, cols, 0, nb);
	if (t->n == 2 || (size_t)(t->n - 1) * bytes <= g->direct_max)
		return tp_q8_direct(g, t, buf, cols, nb, deadline, timeout_ms, err, errlen);
	return tp_q8_2phase(g, t, buf, cols, nb, deadline, timeout_ms, err, errlen);
}

/* Members send their quantized vector to root, which forms y (dq(q(y)) for 3 or more) as the
 * direct all-reduce does: the same bits, without root's sends. */
int tp_reduce_q8(tp_group_t *g, const tp_team_t *t, int root, float *buf, size_t rows,
		 size_t cols, int64_t deadline, int timeout_ms, char *err, size_t errlen)
{
	const uint8_t *src[TP_MAX_WORLD];
	size_t nb = rows * ((cols + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK);
	int rc = tp_q8_reserve(g, nb * TP_Q8_BYTES, err, errlen);
	if (rc)
		return rc;
	tp_q8_encode_blocks(g->qbuf, buf, cols, 0, nb);
	uint32_t s = 0;
	for (size_t b0 = 0; b0 < nb; b0 += TP_Q8_SEG_BLOCKS, s++) {
		size_t b1 = MIN(nb, b0 + TP_Q8_SEG_BLOCKS), len = (b1 - b0) * TP_Q8_BYTES;
		uint8_t *q = g->qbuf + b0 * TP_Q8_BYTES;
		tp_xfer_reset(g);
		for (int j = 0; j < t->n; j++)
			if (t->me != root && j == root)
				g->xf[t->r[j]] = (tp_xfer_t){.send = 1, .sdata = q, .slen = len};
			else if (t->me == root && j != root)
				g->xf[t->r[j]] = (tp_xfer_t){.recv = 1, .rlen = len};
		rc = tp_group_exchange(g, TP_OP_REDUCE_Q8, 0, s, deadline, timeout_ms, "reduce", err,
				       errlen);
		if (rc)
			return rc;
		if (t->me != root)
			continue;
		for (int j = 0; j < t->n; j++)
			src[j] = j == t->me ? q : g->xf[t->r[j]].rdata;
		tp_q8_sum(buf, cols, b0, b1, src, t->n, q);
	}
	return 0;
}

int tp_group_set_q8(tp_group_t *g, int on)
{
	if (!g)
		return SH_EINVAL;
	g->q8 = on ? 1 : 0;
	return 0;
}
