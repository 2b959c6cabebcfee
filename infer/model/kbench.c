/*
 * kbench.c: the engine's own matrix kernels timed on a synthetic matrix (infer.h's
 * eng_kernel_rate): what the planner's cost model reads as a node's compute rate (docs/view.md
 * section 1.1, "bw" and "prefill_bw").
 *
 * The matrix goes through matmul() exactly as a model's weights do (the interleaved copy made
 * as at load, wmat_repack, when the CPU has a tiled kernel for the type), on a pool of the
 * node's threads. Its rows are a few quantized random rows repeated: the kernels' speed does
 * not depend on the values, only on the type and the bytes streamed.
 *
 * Invariant: everything allocated here is freed before returning; nothing is kept.
 */
#include "common/common.h"
#include "infer/infer.h"
#include "infer/model/model_int.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KB_COLS      4096        /* docs/view.md: 4096 columns */
#define KB_BYTES     (256 << 20) /* decode's matrix: beyond the caches (a large L3 holds 64 MiB) */
#define KB_PF_BYTES  (8 << 20)   /* the 64-row product's: compute-bound, a smaller one will do */
#define KB_ROWS_SEED 64          /* distinct quantized rows, repeated */
#define KB_TIMED     11          /* timed products after one warm-up (the median counts) */
#define KB_ROUNDS    5           /* decode: rounds of KB_TIMED, KB_GAP_MS apart (their median) */
#define KB_GAP_MS    100
#define KB_PF_ROWS   64          /* a prompt pass's rows (MODEL_MAX_BATCH) */

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

/* The median time in ns of KB_TIMED products of w with B input rows. */
static int64_t time_product(model_t *m, const wmat_t *w, float *out, const float *x, int B)
{
	int64_t t[KB_TIMED];
	matmul(m, w, out, x, B); /* warm-up: pages, caches, threads awake */
	for (int i = 0; i < KB_TIMED; i++) {
		int64_t t0 = now_ns();
		matmul(m, w, out, x, B);
		t[i] = now_ns() - t0;
	}
	qsort(t, KB_TIMED, sizeof t[0], cmp_i64);
	return MAX(t[KB_TIMED / 2], 1);
}

/* A matrix of `bytes` (rounded down to whole rows, at least 16 rows) of type t. */
static int make_mat(model_t *m, int t, size_t bytes, wmat_t *w, uint8_t **own)
{
	size_t rb = quant_row_bytes(t, KB_COLS);
	int rows = (int)MAX(QR_ROWS, bytes / rb / QR_ROWS * QR_ROWS);
	uint8_t *d = malloc((size_t)rows * rb);
	float *src = malloc(KB_COLS * sizeof *src);
	if (!d || !src) {
		free(d);
		free(src);
		return SH_ENOMEM;
	}
	uint32_t s = 12345;
	for (int r = 0; r < KB_ROWS_SEED && r < rows; r++) {
		for (int c = 0; c < KB_COLS; c++) {
			s = s * 1664525u + 1013904223u;
			src[c] = ((float)(s >> 8) / (float)(1u << 24) - 0.5f) * 0.1f;
		}
		if (quant_quantize_row(t, src, d + (size_t)r * rb, KB_COLS)) {
			free(d);
			free(src);
			return SH_EUNSUPP;
		}
	}
	free(src);
	for (int r = KB_ROWS_SEED; r < rows; r++)
		memcpy(d + (size_t)r * rb, d + (size_t)(r % KB_ROWS_SEED) * rb, rb);
	memset(w, 0, sizeof *w);
	w->data = w->src = d;
	w->type = t;
	w->rows = rows;
	w->cols = KB_COLS;
	w->row_bytes = w->src_stride = rb;
	w->ops = quant_ops(t);
	w->dequant = w->ops->dequant ? w->ops->dequant : quant_ops_ref(t)->dequant;
	*own = d;
	return wmat_repack(m, w, 1); /* the copy is what the kernels read: drop the rows */
}

int eng_kernel_rate(int wtype, int threads, eng_kernel_rate_t *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	if (!quant_type_supported(wtype) || !quant_ops(wtype) || !quant_row_bytes(wtype, KB_COLS))
		return sh_fail(err, errlen, SH_EUNSUPP, "no kernel for weight type %d", wtype);
	quant_init(getenv("SHOAL_REF_KERNELS") != NULL); /* as eng_open */
	model_t m;
	memset(&m, 0, sizeof m);
	wmat_t w = {0}, wp = {0};
	uint8_t *own = NULL, *own_p = NULL;
	float *x = NULL, *o = NULL;
	int rc = SH_ENOMEM;
	if (!(m.pool = pool_new(threads)))
		goto done;
	int nt = pool_threads(m.pool);
	m.max_b = KB_PF_ROWS;
	m.act_stride = ((size_t)KB_COLS + KB_COLS / 16 * 2 + KB_COLS / 32 * 6 + 63) & ~63u;
	m.act = aligned_alloc(64, (size_t)KB_PF_ROWS * m.act_stride);
	if (!m.act)
		goto done;
	if ((rc = make_mat(&m, wtype, KB_BYTES, &w, &own)) ||
	    (rc = make_mat(&m, wtype, KB_PF_BYTES, &wp, &own_p)))
		goto done;
	rc = SH_ENOMEM;
	x = calloc((size_t)KB_PF_ROWS * KB_COLS, sizeof *x);
	o = calloc((size_t)KB_PF_ROWS * (size_t)MAX(w.rows, wp.rows), sizeof *o);
	if (!x || !o)
		goto done;
	for (size_t i = 0; i < (size_t)KB_PF_ROWS * KB_COLS; i++)
		x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
	double bytes = (double)w.rows * (double)w.row_bytes;
	double pbytes = (double)wp.rows * (double)wp.row_bytes * KB_PF_ROWS;
	/* a shared machine's memory bandwidth drifts over seconds (one core read 19-38 GB/s in
	 * consecutive calls here, while decode held 21-23): rounds spread over half a second,
	 * their median, so one unlucky moment does not set the node's rate for the planner */
	int64_t rounds[KB_ROUNDS];
	for (int i = 0; i < KB_ROUNDS; i++) {
		if (i) {
			struct timespec gap = {0, KB_GAP_MS * 1000000L};
			nanosleep(&gap, NULL);
		}
		rounds[i] = time_product(&m, &w, o, x, 1);
	}
	qsort(rounds, KB_ROUNDS, sizeof rounds[0], cmp_i64);
	int64_t td = rounds[KB_ROUNDS / 2];
	int64_t tp = time_product(&m, &wp, o, x, KB_PF_ROWS);
	out->threads = nt;
	out->decode_mbs = bytes / (double)td * 1e3; /* bytes per ns = GB/s; x 1e3: MB/s */
	out->prefill_mbs = pbytes / (double)tp * 1e3;
	rc = 0;
done:
	if (rc == SH_ENOMEM)
		sh_fail(err, errlen, rc, "out of memory for the kernel benchmark");
	else if (rc)
		sh_fail(err, errlen, rc, "no kernel for weight type %s", quant_type_name(wtype));
	wmat_release(&w);
	wmat_release(&wp);
	free(own);
	free(own_p);
	free(x);
	free(o);
	free(m.act);
	pool_free(m.pool);
	return rc;
}
