/*
 * stream.c: the streamed all-reduce. The caller computes its contribution in column chunks
 * (e.g. the output rows of a matmul) and pushes each chunk as soon as it is final: its bytes
 * cross the link while the next chunk is computed, and at the end only the last chunk's
 * transfer is left to wait for (plus whatever the link had not yet delivered).
 *
 * Wire: per chunk, one COLL frame (op ALLREDUCE_STREAM, step = chunk) from every member to
 * every other member, holding the chunk's columns of every row: f32, or with the q8 wire the
 * chunk's blocks of every row (chunks are whole blocks: multiples of 32 columns).
 *
 * Invariant: the result is the same bits as tp_all_reduce_team on the same data: every element
 * is summed in team order; with the q8 wire every contribution enters as dq(q(x)) with the same
 * per-row blocks, and for 3+ members the sum is quantized once more, as on the other paths.
 */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "transport/frame.h"
#include "transport/group.h"

#define TP_Q8_BLOCK 32
#define TP_Q8_BYTES 36

void tp_all_reduce_chunk(size_t cols, int nchunks, int c, size_t *c0, size_t *c1)
{
	size_t blocks = (cols + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK;
	size_t b0 = blocks * (size_t)c / (size_t)nchunks,
	       b1 = blocks * (size_t)(c + 1) / (size_t)nchunks;
	*c0 = MIN(b0 * TP_Q8_BLOCK, cols);
	*c1 = MIN(b1 * TP_Q8_BLOCK, cols);
}

int tp_all_reduce_stream_chunks(const tp_group_t *g, size_t rows, size_t cols)
{
	if (!g || g->stream == 0 || (g->stream < 0 && !g->q8))
		return 0;
	if (g->stream >= 2) /* forced (tests) */
		return (int)MIN((size_t)g->stream, (cols + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK);
	size_t bytes =
	    rows * (g->q8 ? (cols + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK * TP_Q8_BYTES : cols * 4);
	size_t n = MIN(bytes / TP_STREAM_CHUNK_BYTES, (size_t)TP_STREAM_MAX_CHUNKS);
	n = MIN(n, (cols + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK);
	return n >= 2 ? (int)n : 0;
}

int tp_group_set_stream(tp_group_t *g, int mode)
{
	if (!g || mode < -1 || mode > TP_STREAM_MAX_CHUNKS)
		return SH_EINVAL;
	g->stream = mode;
	return 0;
}

/* Bytes of chunk [c0, c1) of one row on the wire. */
static size_t tp_stream_row_bytes(const tp_group_t *g, size_t c0, size_t c1)
{
	return g->q8 ? (c1 - c0 + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK * TP_Q8_BYTES : (c1 - c0) * 4;
}

int tp_all_reduce_begin(tp_group_t *g, const int *ranks, int nranks, float *buf, size_t rows,
			size_t cols, int nchunks, int timeout_ms, char *err, size_t errlen)
{
	tp_stream_t *s = &g->st;
	int rc = tp_group_check(g, err, errlen);
	if (rc)
		return rc;
	if (s->active)
		return sh_fail(err, errlen, SH_EINVAL, "a streamed all-reduce is already running");
	if ((rc = tp_team_make(g, ranks, nranks, &s->t, err, errlen)))
		return rc;
	size_t blocks = (cols + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK;
	if (nchunks < 1 || (size_t)nchunks > blocks || !rows || rows > SIZE_MAX / 4 / cols ||
	    rows * tp_stream_row_bytes(g, 0, cols) > TP_MAX_PAYLOAD - TP_COLL_WIRE)
		return sh_fail(err, errlen, SH_EINVAL,
			       "streamed all-reduce of %zu x %zu floats in %d chunks", rows, cols,
			       nchunks);
	size_t stage = rows > 1 && !g->q8 ? rows * cols : 0;
	if (s->stage_cap < stage) {
		float *p = realloc(s->stage, stage * sizeof *p);
		if (!p)
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		s->stage = p;
		s->stage_cap = stage;
	}
	if (g->q8 && (rc = tp_q8_reserve(g, 2 * rows * blocks * TP_Q8_BYTES, err, errlen)))
		return rc;
	s->buf = buf;
	s->rows = rows;
	s->cols = cols;
	s->nchunks = nchunks;
	s->next = 0;
	s->timeout_ms = timeout_ms;
	s->deadline = tp_deadline(timeout_ms);
	s->active = 1;
	return 0;
}

int tp_all_reduce_push(tp_group_t *g, int c, char *err, size_t errlen)
{
	tp_stream_t *s = &g->st;
	int rc = tp_group_check(g, err, errlen);
	if (rc)
		return rc;
	if (!s->active || c != s->next)
		return sh_fail(err, errlen, SH_EINVAL, "chunk %d pushed out of order", c);
	size_t c0, c1, nbr = (s->cols + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK;
	tp_all_reduce_chunk(s->cols, s->nchunks, c, &c0, &c1);
	size_t rb = tp_stream_row_bytes(g, c0, c1);
	const void *data = s->buf + c0;
	if (g->q8) { /* every row's blocks of the chunk, packed after the whole quantized rows */
		uint8_t *q = g->qbuf + s->rows * nbr * TP_Q8_BYTES;
		for (size_t r = 0; r < s->rows; r++) {
			uint8_t *own = g->qbuf + (r * nbr + c0 / TP_Q8_BLOCK) * TP_Q8_BYTES;
			tp_q8_encode_blocks(own, s->buf + r * s->cols, s->cols, c0 / TP_Q8_BLOCK,
					    (c1 + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK);
			memcpy(q + r * rb, own, rb);
		}
		data = q;
	} else if (s->rows > 1) {
		for (size_t r = 0; r < s->rows; r++)
			memcpy(s->stage + r * (c1 - c0), s->buf + r * s->cols + c0, rb);
		data = s->stage;
	}
	tp_xfer_reset(g);
	for (int j = 0; j < s->t.n; j++)
		if (j != s->t.me)
			g->xf[s->t.r[j]] =
			    (tp_xfer_t){.send = 1, .sdata = data, .slen = s->rows * rb};
	rc = tp_group_exchange(g, TP_OP_ALLREDUCE_STREAM, (uint16_t)c, 0, s->deadline,
			       s->timeout_ms, "all_reduce", err, errlen);
	if (rc)
		s->active = 0;
	else
		s->next++;
	return rc;
}

int tp_all_reduce_end(tp_group_t *g, char *err, size_t errlen)
{
	tp_stream_t *s = &g->st;
	const uint8_t *src[TP_MAX_WORLD];
	int rc = tp_group_check(g, err, errlen);
	if (rc)
		return rc;
	if (!s->active || s->next != s->nchunks) {
		s->active = 0;
		return sh_fail(err, errlen, SH_EINVAL, "all-reduce ended after %d of %d chunks",
			       s->next, s->nchunks);
	}
	s->active = 0;
	size_t nbr = (s->cols + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK;
	for (int c = 0; c < s->nchunks; c++) {
		size_t c0, c1;
		tp_all_reduce_chunk(s->cols, s->nchunks, c, &c0, &c1);
		size_t rb = tp_stream_row_bytes(g, c0, c1), b0 = c0 / TP_Q8_BLOCK;
		size_t b1 = (c1 + TP_Q8_BLOCK - 1) / TP_Q8_BLOCK;
		tp_xfer_reset(g);
		for (int j = 0; j < s->t.n; j++)
			if (j != s->t.me)
				g->xf[s->t.r[j]] = (tp_xfer_t){.recv = 1, .rlen = s->rows * rb};
		rc = tp_group_exchange(g, TP_OP_ALLREDUCE_STREAM, (uint16_t)c, 0, s->deadline,
				       s->timeout_ms, "all_reduce", err, errlen);
		if (rc)
			return rc;
		for (size_t r = 0; r < s->rows; r++) {
			float *row = s->buf + r * s->cols;
			for (int j = 0; j < s->t.n; j++)
				src[j] = j == s->t.me
					     ? (g->q8 ? g->qbuf + (r * nbr + b0) * TP_Q8_BYTES
						      : (const uint8_t *)(row + c0))
					     : g->xf[s->t.r[j]].rdata + r * rb;
			if (!g->q8) {
				tp_sum_ordered(row + c0, src, s->t.n, c1 - c0);
				continue;
			}
			for (int j = 0; j < s->t.n; j++) /* row r's blocks [b0, b1) */
				tp_q8_decode_blocks(row, src[j], s->cols, b0, b1, j > 0);
			if (s->t.n >= 3) {
				uint8_t *q = g->qbuf + (r * nbr + b0) * TP_Q8_BYTES;
				tp_q8_encode_blocks(q, row, s->cols, b0, b1);
				tp_q8_decode_blocks(row, q, s->cols, b0, b1, 0);
			}
		}
	}
	return 0;
}
