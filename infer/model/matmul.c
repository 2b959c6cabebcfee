/*
 * matmul.c: every matrix product of the forward pass goes through here, the one place that
 * chooses the kernel: types with a batched integer kernel (rows8) use it for any batch; otherwise
 * a batch of fewer than BLAS_MIN tokens uses the integer matvec kernels (weights read once per
 * batch, rows split over the pool) and a larger one dequantizes tiles of rows and calls
 * cblas_sgemm on each pool thread (OpenBLAS itself single-threaded).
 *
 * Invariant: the weights are only read; results are written to caller-owned rows only.
 */
#include "common/common.h"
#include "infer/model/model_int.h"

#ifdef SHOAL_ACCELERATE
#include <Accelerate/Accelerate.h>
#else
#include <cblas.h>
#endif

/* The batched integer kernel costs about as much for 2 inputs as for 8 (measured on AVX-512 VNNI:
 * ~3x a single-input pass at 2, ~3.5x at 4); below this many inputs one pass per input is
 * cheaper (continuous batching decodes 2-3 sequences often). */
#define ROWS8_MIN 4

/* ---- matmul: out[b][r] = W[r, :] . x[b][:] for B inputs and up to MAX_MULTI matrices -------- */

typedef struct mm_job {
	model_t *m;
	int n_mat;
	const wmat_t *w[MAX_MULTI];
	float *out[MAX_MULTI]; /* [B][w->rows] */
	const float *x;        /* [B][cols] (same cols for every matrix) */
	int B, cols;
	int per;              /* chunks per matrix */
	quant_act_t acts[64]; /* per input, integer path */
} mm_job_t;

/* Chunk c of a multi-matrix job: matrix c / per, part c % per of its rows. */
static void mm_chunk_rows(const mm_job_t *j, int c, int align, const wmat_t **w, int *k, int *lo,
			  int *hi)
{
	*k = c / j->per;
	*w = j->w[*k];
	pool_split((*w)->rows, c % j->per, j->per, align, lo, hi);
}

static void mm_matvec_task(void *ctx, int c, int nc, int tid)
{
	mm_job_t *j = ctx;
	const wmat_t *w;
	int k, lo, hi;
	(void)nc;
	(void)tid;
	mm_chunk_rows(j, c, 4, &w, &k, &lo, &hi);
	for (int r = lo; r < hi; r += MV_CHUNK) {
		int nr = MIN(MV_CHUNK, hi - r);
		const uint8_t *wr = w->data + (size_t)r * w->row_bytes;
		if (j->B >= ROWS8_MIN && w->ops->rows8) { /* one pass over these rows per 8 inputs */
			for (int b = 0; b < j->B; b += 8)
				w->ops->rows8(j->out[k] + (size_t)b * w->rows + r, w->rows, wr,
					      w->row_bytes, nr, &j->acts[b], MIN(8, j->B - b),
					      j->cols);
			continue;
		}
		for (int b = 0; b < j->B; b++)
			w->ops->rows(j->out[k] + (size_t)b * w->rows + r, wr, w->row_bytes, nr,
				     &j->acts[b], j->cols);
	}
}

static void mm_sgemm_task(void *ctx, int c, int nc, int tid)
{
	mm_job_t *j = ctx;
	float *tile = j->m->tiles[tid];
	const wmat_t *w;
	int k, lo, hi;
	(void)nc;
	mm_chunk_rows(j, c, 16, &w, &k, &lo, &hi);
	for (int r = lo; r < hi; r += TILE_ROWS) {
		int nr = MIN(TILE_ROWS, hi - r);
		for (int i = 0; i < nr; i++)
			w->dequant(w->data + (size_t)(r + i) * w->row_bytes,
				   tile + (size_t)i * j->cols, j->cols);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->B, nr, j->cols, 1.0f, j->x,
			    j->cols, tile, j->cols, 0.0f, j->out[k] + r, w->rows);
	}
}

/* All matrices must share cols and weight type (true for Q/K/V and gate/up of one file in
 * practice; otherwise call once per matrix). */
static void matmul_multi(model_t *m, int n_mat, const wmat_t **w, float **out, const float *x,
			 int B)
{
	mm_job_t j;
	j.m = m;
	j.n_mat = n_mat;
	j.x = x;
	j.B = B;
	j.cols = w[0]->cols;
	for (int k = 0; k < n_mat; k++) {
		j.w[k] = w[k];
		j.out[k] = out[k];
	}
	int nt = pool_threads(m->pool), rows = w[0]->rows;
	if (B >= BLAS_MIN && !w[0]->ops->rows8) {
		j.per = MAX(1, MIN((rows + TILE_ROWS - 1) / TILE_ROWS, 2 * nt));
		pool_run(m->pool, mm_sgemm_task, &j, n_mat * j.per);
		return;
	}
	for (int b = 0; b < B; b++)
		quant_act_prepare(w[0]->type, x + (size_t)b * j.cols, j.cols,
				  m->act + (size_t)b * m->act_stride, &j.acts[b]);
	j.per = nt == 1 ? 1 : MAX(1, MIN(rows / 64, 4 * nt));
	pool_run(m->pool, mm_matvec_task, &j, n_mat * j.per);
}

void matmul(model_t *m, const wmat_t *w, float *out, const float *x, int B)
{
	matmul_multi(m, 1, &w, &out, x, B);
}

/* Q, K, V (or gate, up) in one dispatch when their types agree. */
void matmul_same_input(model_t *m, int n, const wmat_t **w, float **out, const float *x, int B)
{
	int same = 1;
	for (int k = 1; k < n; k++)
		same &= w[k]->type == w[0]->type && w[k]->cols == w[0]->cols;
	if (same) {
		matmul_multi(m, n, w, out, x, B);
		return;
	}
	for (int k = 0; k < n; k++)
		matmul(m, w[k], out[k], x, B);
}
