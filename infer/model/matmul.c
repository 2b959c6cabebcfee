/*
 * matmul.c: every matrix product of the forward pass goes through here, the one place that
 * chooses the kernel: a matrix with an interleaved copy (wmat_repack, repack.h) goes through the
 * tiled integer kernel for any batch (decode included): the activations are quantized once per
 * row, the pool threads claim chunks of GEMM_GROUPS row groups and run every token tile over
 * each (one dispatch per product, no barrier per tile; the chunk's weights stay in L2 across
 * the token tiles); one token's chunks shrink towards the end of the product (MM_MIN_GROUPS).
 * Otherwise the row kernels (rows split over the pool, weights read once per batch; types with a
 * batched kernel, rows8, use it for 4 inputs and more), for any batch.
 *
 * Every kernel gives a token's row the same bits whatever else is in the batch and wherever the
 * token is in it (issue 28: a greedy request's text does not depend on the load). So no BLAS:
 * sgemm (OpenBLAS) rounds a row differently with the batch's size (its small-matrix paths and
 * edge tiles), which made F32 and F16 models answer differently under load (test_detbatch); the
 * row kernels cost F16 prefill: 78-92 tok/s against sgemm's 200 (a 1024-dim F16 model, 1122
 * prompt tokens, 2 threads on a loaded 2-core machine), half of which the batched float kernel
 * won back with its accumulators in registers (a 0.85B F16 model: 7.1 -> 16.6 tok/s, llama.cpp
 * 20.8); types with a batched or repacked kernel never used sgemm.
 *
 * Invariant: the weights are only read; results are written to caller-owned rows only.
 */
#include "common/common.h"
#include "infer/model/model_int.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The batched kernels (rows8, for matrices that are not repacked) share a block's load and
 * unpack among the inputs of a pass; below this many inputs one pass per input is as cheap
 * (continuous batching decodes 2-3 sequences often). Either gives the same bits. */
#define ROWS8_MIN 4
#define GEMM_GROUPS                                                                                \
	4 /* row groups (x16 rows) per chunk of the tiled kernel for a batch (the                  \
	   * chunk's weights stay in L2 across the token tiles) */
/* One token (decode): the job's row groups, matrix after matrix, are cut into chunks that each
 * take 1 / (2 x threads) of what is left, down to MM_MIN_GROUPS: the first chunks are long runs
 * of contiguous weights (the prefetchers keep streaming) and the last ones short, so the threads
 * finish a product within microseconds of each other rather than one waiting on the other's
 * last long chunk (64 products per token). */
#define MM_MIN_GROUPS 4
#define MM_PF_HEAD 32768
#define MM_MAX_CHUNKS 1024 /* ~500 for a 150k-row head on 64 threads */

/* ---- repacking ---------------------------------------------------------------------------- */

typedef struct rp_job {
	wmat_t *w;
	uint8_t *dst;
	size_t gbytes;
} rp_job_t;

static void rp_task(void *ctx, int c, int nc, int tid)
{
	rp_job_t *j = ctx;
	int lo, hi;
	(void)tid;
	pool_split(j->w->rp_groups, c, nc, 1, &lo, &hi);
	quant_repack(j->w->type, j->w->data + (size_t)lo * QR_ROWS * j->w->row_bytes,
		     j->w->row_bytes, hi - lo, j->w->cols, j->dst + (size_t)lo * j->gbytes);
}

/* The copy is read once per token, start to end: in 2 MiB pages (transparent huge pages, which
 * many kernels grant only on request) a token's read takes ~400x fewer TLB misses than in 4 KiB
 * ones. The mapping starts on a huge-page boundary and ends on a small page one: the last part
 * (under 2 MiB) stays in small pages rather than a whole huge page touched for it (~1 MiB per
 * matrix, 100 MB on the 0.85B model). Where huge pages are not granted it works the same. */
#define RP_HUGE ((size_t)2 << 20)

static size_t rp_round(size_t bytes)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	return (bytes + pg - 1) / pg * pg;
}

static uint8_t *rp_alloc(size_t bytes)
{
	size_t want = rp_round(bytes), len = want + RP_HUGE; /* room to align the start */
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	uintptr_t a = ((uintptr_t)p + RP_HUGE - 1) & ~(uintptr_t)(RP_HUGE - 1);
	if (a > (uintptr_t)p)
		munmap(p, a - (uintptr_t)p);
	size_t tail = (uintptr_t)p + len - (a + want);
	if (tail)
		munmap((uint8_t *)a + want, tail);
#ifdef MADV_HUGEPAGE
	madvise((void *)a, want, MADV_HUGEPAGE);
#endif
	return (uint8_t *)a;
}

/* Drops the mapping's pages of [p, p + bytes) from this process (whole pages inside only). */
static void release_range(const uint8_t *p, size_t bytes)
{
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1);
	uintptr_t b = ((uintptr_t)p + bytes) & ~(pg - 1);
	if (b > a)
		madvise((void *)a, b - a, MADV_DONTNEED);
}

typedef struct cp_job {
	const uint8_t *src;
	uint8_t *dst;
	size_t bytes;
} cp_job_t;

static void cp_task(void *ctx, int c, int nc, int tid)
{
	cp_job_t *j = ctx;
	size_t lo = j->bytes / (size_t)nc * (size_t)c;
	size_t hi = c == nc - 1 ? j->bytes : lo + j->bytes / (size_t)nc;
	(void)tid;
	memcpy(j->dst + lo, j->src + lo, hi - lo);
}

/* A matrix the row kernels read (no tiled kernel for its type: F16, F32, BF16 and the types
 * without one) is moved from the file's mapping, in 4 KiB pages, to a copy in huge pages, as the
 * tiled kernels' copies are: the row kernels then stream without a TLB miss and a stop of the
 * hardware prefetchers every 4 KiB. One core's F16 rows went from 28-31 to 30-40 GB/s
 * (alternating runs; a 230 MB matrix). Only with release (nothing else reads these pages, e.g.
 * a tied embedding) and from one huge page up (smaller ones would waste most of one). */
static int wmat_rehome(model_t *m, wmat_t *w, int release)
{
	size_t bytes = (size_t)w->rows * w->row_bytes;
	if (!release || bytes < RP_HUGE || w->rp_own || getenv("SHOAL_NO_REPACK"))
		return 0;
	uint8_t *dst = rp_alloc(bytes);
	if (!dst)
		return SH_ENOMEM;
	/* a slice at a time, its pages dropped at once: the process never holds both whole */
	for (size_t off = 0; off < bytes; off += RP_HUGE * 8) {
		cp_job_t j = {w->data + off, dst + off, MIN(RP_HUGE * 8, bytes - off)};
		pool_run(m->pool, cp_task, &j, 2 * pool_threads(m->pool));
		release_range(j.src, j.bytes);
	}
	release_range(w->data, bytes); /* the pages that straddled two slices */
	w->data = w->rp_own = dst;
	w->rp_bytes = bytes;
	return 0;
}

int wmat_repack(model_t *m, wmat_t *w, int release)
{
	const char *impl = quant_gemm_impl(w->type);
	if (!quant_repack_supported(w->type) || !impl || !strcmp(impl, "ref") ||
	    w->rows < QR_ROWS || w->cols > QR_MAX_N || getenv("SHOAL_NO_REPACK"))
		return wmat_rehome(m, w, release);
	int ng = w->rows / QR_ROWS;
	size_t gb = quant_repack_group_bytes(w->type, w->cols);
	size_t bytes = (size_t)ng * gb;
	uint8_t *dst = rp_alloc(bytes);
	if (!dst)
		return SH_ENOMEM;
	w->rp_groups = ng;
	/* every type's tiled kernel is at least as fast for one token as its matvec kernel
	 * (measured, with the K-quants' prefetch); a type where it is not would set 2 here and
	 * keep its original rows mapped for decode */
	w->rp_min_b = 1;
	if (w->rp_min_b > 1)
		release = 0;
	rp_job_t j = {w, dst, gb};
	pool_run(m->pool, rp_task, &j, MIN(ng, 8 * pool_threads(m->pool)));
	w->rp = w->rp_own = dst;
	w->rp_bytes = bytes;
	w->rp_of = w->data;
	w->gemm = quant_gemm(w->type);
	if (release) /* the repacked rows only */
		release_range(w->data, (size_t)ng * QR_ROWS * w->row_bytes);
	return 0;
}

int wmat_repack_own(model_t *m, wmat_t *w, uint8_t **own)
{
	int rc = wmat_repack(m, w, !*own);
	if (rc)
		return rc;
	if (*own && w->rp && w->rp_groups * QR_ROWS == w->rows && w->rp_min_b <= 1) {
		free(*own);
		*own = NULL;
		w->data = w->rp_of = NULL;
	}
	return 0;
}

void wmat_release(wmat_t *w)
{
	if (w->rp_own)
		munmap(w->rp_own, rp_round(w->rp_bytes));
	w->rp = w->rp_own = NULL;
	w->rp_groups = 0;
}

static int mm_repacked(const wmat_t *w, int B)
{
	return w->rp && w->rp_of == w->data && w->rows >= w->rp_groups * QR_ROWS &&
	       B >= w->rp_min_b;
}

/* ---- matmul: out[b][r] = W[r, :] . x[b][:] for B inputs and up to MAX_MULTI matrices -------- */

/* Matrices in one job: MAX_MULTI sharing an input (matmul_same_input), or a MoE layer's chosen
 * experts and shared block with an input each (matmul_each: 2 x 10 + 2 gate/up for the largest
 * routers of 2026). */
#define MM_MAX_MAT 32

typedef struct mm_job {
	model_t *m;
	int n_mat;
	const wmat_t *w[MM_MAX_MAT];
	float *out[MM_MAX_MAT];            /* [B][w->rows] */
	const quant_act_t *xa[MM_MAX_MAT]; /* matrix k's nb[k] prepared inputs */
	int nb[MM_MAX_MAT];                /* ... their number (B, or matmul_each's) */
	int B;
	int per;                    /* row-kernel chunks per matrix */
	int cum[MM_MAX_MAT + 1];    /* tiled path: chunks of matrices before k */
	int gper;                   /* tiled path, a batch: row groups per chunk */
	int n_mv, mv[MM_MAX_MAT];   /* one token: the matrices on the row kernel (n_mv x per chunks
				     * first), then the tiled ones: */
	int n_seq;                  /* ... chunks of row groups; then the tails */
	int gcum[MM_MAX_MAT + 1];   /* ... tiled groups of matrices before k */
	int seq[MM_MAX_CHUNKS + 1]; /* ... chunk i is groups [seq[i], seq[i + 1]) of them all */
	int tail[MM_MAX_MAT];       /* ... chunk n_seq + i: the rows past the last group of
				     * matrix tail[i] */
	quant_act_t acts[64];       /* per input, integer path */
} mm_job_t;

/* Part `part` of j->per of matrix k's rows by the row kernel (or its batched one, rows8). */
static void mm_matvec_part(const mm_job_t *j, int k, int part)
{
	const wmat_t *w = j->w[k];
	int lo, hi;
	pool_split(w->rows, part, j->per, 4, &lo, &hi);
	/* rows8 gives rows' bits (quant.h): the choice is speed only */
	int rows8 = w->ops->rows8 && j->nb[k] >= ROWS8_MIN;
	for (int r = lo; r < hi; r += MV_CHUNK) {
		int nr = MIN(MV_CHUNK, hi - r);
		const uint8_t *wr = w->data + (size_t)r * w->row_bytes;
		if (rows8) { /* one pass over these rows per 8 inputs */
			for (int b = 0; b < j->nb[k]; b += 8)
				w->ops->rows8(j->out[k] + (size_t)b * w->rows + r, w->rows, wr,
					      w->row_bytes, nr, &j->xa[k][b], MIN(8, j->nb[k] - b),
					      w->cols);
			continue;
		}
		for (int b = 0; b < j->nb[k]; b++)
			w->ops->rows(j->out[k] + (size_t)b * w->rows + r, wr, w->row_bytes, nr,
				     &j->xa[k][b], w->cols);
	}
}

/* Chunk c of a multi-matrix job: matrix c / per, part c % per of its rows. */
static void mm_matvec_task(void *ctx, int c, int nc, int tid)
{
	mm_job_t *j = ctx;
	(void)nc;
	(void)tid;
	mm_matvec_part(j, c / j->per, c % j->per);
}

/* The first MM_PF_HEAD bytes of groups [g0, ...) of w into L2. The kernels prefetch ahead
 * within a matrix (gemm_x86.c PF_L2_AHEAD), so a chunk that moves on to another matrix (an
 * expert: elsewhere in memory) would start it with nothing in flight. */
static void mm_prefetch_head(const wmat_t *w, int g0)
{
	size_t gb = quant_repack_group_bytes(w->type, w->cols),
	       n = MIN((size_t)MM_PF_HEAD, gb * (size_t)(w->rp_groups - g0));
	const char *p = (const char *)w->rp + (size_t)g0 * gb;
	for (size_t o = 0; o < n; o += 64)
		__builtin_prefetch(p + o, 0, 2);
}

/* Row groups [g0, g0 + ng) of matrix k, all B tokens in tiles of QR_NT. */
static void mm_gemm_groups(const mm_job_t *j, int k, int g0, int ng)
{
	const wmat_t *w = j->w[k];
	const uint8_t *wp = w->rp + (size_t)g0 * quant_repack_group_bytes(w->type, w->cols);
	for (int b = 0; b < j->nb[k]; b += QR_NT)
		w->gemm(j->out[k] + (size_t)b * w->rows + g0 * QR_ROWS, w->rows, wp, ng,
			&j->xa[k][b], MIN(QR_NT, j->nb[k] - b), w->cols);
}

/* Matrix k's rows past its last whole group, by the row kernel. */
static void mm_gemm_tail(const mm_job_t *j, int k)
{
	const wmat_t *w = j->w[k];
	int r0 = w->rp_groups * QR_ROWS;
	for (int b = 0; b < j->nb[k]; b++)
		w->ops->rows(j->out[k] + (size_t)b * w->rows + r0,
			     w->data + (size_t)r0 * w->row_bytes, w->row_bytes, w->rows - r0,
			     &j->xa[k][b], w->cols);
}

/* Tiled path, a batch: chunk c is GEMM_GROUPS row groups of one matrix, or that matrix's rows
 * past its last whole group. */
static void mm_gemm_task(void *ctx, int c, int nc, int tid)
{
	mm_job_t *j = ctx;
	int k = 0;
	(void)nc;
	(void)tid;
	while (c >= j->cum[k + 1])
		k++;
	int g0 = (c - j->cum[k]) * j->gper;
	if (g0 >= j->w[k]->rp_groups)
		mm_gemm_tail(j, k);
	else
		mm_gemm_groups(j, k, g0, MIN(j->gper, j->w[k]->rp_groups - g0));
}

/* One token: chunk c is a part of a row-kernel matrix (the first n_mv x per), groups
 * [seq[c], seq[c + 1]) of the tiled matrices' groups back to back (a chunk may end one matrix
 * and start the next), or a tail. */
static void mm_seq_task(void *ctx, int c, int nc, int tid)
{
	mm_job_t *j = ctx;
	(void)nc;
	(void)tid;
	if (c < j->n_mv * j->per) {
		mm_matvec_part(j, j->mv[c / j->per], c % j->per);
		return;
	}
	c -= j->n_mv * j->per;
	if (c >= j->n_seq) {
		mm_gemm_tail(j, j->tail[c - j->n_seq]);
		return;
	}
	for (int g = j->seq[c], k = 0; g < j->seq[c + 1];) {
		while (g >= j->gcum[k + 1])
			k++;
		int g1 = MIN(j->seq[c + 1], j->gcum[k + 1]);
		if (g1 < j->seq[c + 1]) { /* the next tiled matrix's start, while this one is read */
			int k2 = k + 1;
			while (g1 >= j->gcum[k2 + 1])
				k2++;
			mm_prefetch_head(j->w[k2], 0);
		}
		mm_gemm_groups(j, k, g - j->gcum[k], g1 - g);
		g = g1;
	}
}

/* The one-token job's chunks (mm_seq_task); returns their number, row-kernel parts and tails
 * included. */
static int mm_seq_plan(mm_job_t *j, int nt)
{
	int n_tail = 0, rows = 0;
	j->gcum[0] = 0;
	j->n_mv = 0;
	for (int k = 0; k < j->n_mat; k++) {
		int tiled = mm_repacked(j->w[k], 1);
		j->gcum[k + 1] = j->gcum[k] + (tiled ? j->w[k]->rp_groups : 0);
		if (!tiled) {
			j->mv[j->n_mv++] = k;
			rows = MAX(rows, j->w[k]->rows);
		} else if (j->w[k]->rows > j->w[k]->rp_groups * QR_ROWS) {
			j->tail[n_tail++] = k;
		}
	}
	j->per = nt == 1 ? 1 : MAX(1, MIN(rows / 64, 4 * nt));
	int total = j->gcum[j->n_mat], n = 0;
	j->seq[0] = 0;
	for (int g = 0; g < total; n++) {
		int left = total - g, sz = MAX(MM_MIN_GROUPS, (left + 2 * nt - 1) / (2 * nt));
		if (n == MM_MAX_CHUNKS - 1) /* hundreds of threads: the last chunk takes the rest */
			sz = left;
		g += MIN(sz, left);
		j->seq[n + 1] = g;
	}
	j->n_seq = n;
	return j->n_mv * j->per + n + n_tail;
}

typedef struct act_job {
	model_t *m;
	int type, cols;
	const float *x;
	quant_act_t *acts;
} act_job_t;

static void act_task(void *ctx, int b, int nb, int tid)
{
	act_job_t *j = ctx;
	(void)nb;
	(void)tid;
	quant_act_prepare(j->type, j->x + (size_t)b * j->cols, j->cols,
			  j->m->act + (size_t)b * j->m->act_stride, &j->acts[b]);
}

/* All matrices must share cols and weight type (true for Q/K/V and gate/up of one file in
 * practice; otherwise call once per matrix). */
static void matmul_multi(model_t *m, int n_mat, const wmat_t **w, float **out, const float *x,
			 int B)
{
	mm_job_t j;
	j.m = m;
	j.n_mat = n_mat;
	j.B = B;
	int cols = w[0]->cols;
	for (int k = 0; k < n_mat; k++) {
		j.w[k] = w[k];
		j.out[k] = out[k];
		j.xa[k] = j.acts;
		j.nb[k] = B;
	}
	int nt = pool_threads(m->pool), rows = w[0]->rows, tiled = 1;
	for (int k = 0; k < n_mat; k++)
		tiled &= mm_repacked(w[k], B);
	if (tiled) { /* activations quantized once, on the pool when there are several */
		act_job_t aj = {m, w[0]->type, cols, x, j.acts};
		pool_run(m->pool, act_task, &aj, B);
		if (B == 1) {
			pool_run(m->pool, mm_seq_task, &j, mm_seq_plan(&j, nt));
			return;
		}
		j.cum[0] = 0;
		j.gper = GEMM_GROUPS;
		for (int k = 0; k < n_mat; k++)
			j.cum[k + 1] = j.cum[k] + (w[k]->rp_groups + j.gper - 1) / j.gper +
				       (w[k]->rows > w[k]->rp_groups * QR_ROWS);
		pool_run(m->pool, mm_gemm_task, &j, j.cum[n_mat]);
		return;
	}
	for (int b = 0; b < B; b++)
		quant_act_prepare(w[0]->type, x + (size_t)b * cols, cols,
				  m->act + (size_t)b * m->act_stride, &j.acts[b]);
	j.per = nt == 1 ? 1 : MAX(1, MIN(rows / 64, 4 * nt));
	pool_run(m->pool, mm_matvec_task, &j, n_mat * j.per);
}

/* n <= MM_MAX_MAT matrices with their prepared inputs: the one-token plan (row-kernel parts,
 * then the tiled groups back to back, then the tails) whatever nb[k] (<= QR_NT: one tile). */
static void mm_each_run(model_t *m, int n, const wmat_t **w, float **out, const int *nb,
			const quant_act_t *const *xa)
{
	mm_job_t j;
	j.m = m;
	j.n_mat = n;
	j.B = 1;
	for (int k = 0; k < n; k++) {
		j.w[k] = w[k];
		j.out[k] = out[k];
		j.xa[k] = xa[k];
		j.nb[k] = nb[k];
	}
	pool_run(m->pool, mm_seq_task, &j, mm_seq_plan(&j, pool_threads(m->pool)));
}

void matmul_each_acts(model_t *m, int n, const wmat_t **w, float **out, const int *nb,
		      const quant_act_t *const *xa)
{
	for (; n > 0; n -= MM_MAX_MAT, w += MM_MAX_MAT, out += MM_MAX_MAT, nb += MM_MAX_MAT,
		      xa += MM_MAX_MAT)
		mm_each_run(m, MIN(n, MM_MAX_MAT), w, out, nb, xa);
}

void matmul_each(model_t *m, int n, const wmat_t **w, float **out, const float **x, uint8_t *act)
{
	for (; n > MM_MAX_MAT; n -= MM_MAX_MAT, w += MM_MAX_MAT, out += MM_MAX_MAT, x += MM_MAX_MAT,
			       act += MM_MAX_MAT * m->act_stride)
		matmul_each(m, MM_MAX_MAT, w, out, x, act);
	quant_act_t acts[MM_MAX_MAT];
	const quant_act_t *xa[MM_MAX_MAT];
	int na = 0, from[MM_MAX_MAT], nb[MM_MAX_MAT]; /* input a was prepared for matrix from[a] */
	for (int k = 0; k < n; k++) {
		int a = 0; /* the same input for the same type is prepared once */
		while (a < na && (x[from[a]] != x[k] || w[from[a]]->type != w[k]->type ||
				  w[from[a]]->cols != w[k]->cols))
			a++;
		if (a == na) {
			quant_act_prepare(w[k]->type, x[k], w[k]->cols,
					  act + (size_t)a * m->act_stride, &acts[a]);
			from[na++] = k;
		}
		xa[k] = &acts[a];
		nb[k] = 1;
	}
	mm_each_run(m, n, w, out, nb, xa);
}

void matmul(model_t *m, const wmat_t *w, float *out, const float *x, int B)
{
	matmul_multi(m, 1, &w, &out, x, B);
}

void matmul_rows(model_t *m, const wmat_t *w, float *out, const float *x, int r0, int r1)
{
	wmat_t v = *w; /* a view of rows [r0, r1) */
	v.rows = r1 - r0;
	v.data = w->data + (size_t)r0 * w->row_bytes;
	v.src = w->src + (size_t)r0 * w->src_stride;
	v.rp = NULL;
	v.rp_groups = 0;
	if (mm_repacked(w, 1) && r0 % QR_ROWS == 0) { /* released rows are only in the copy */
		int g0 = r0 / QR_ROWS;
		v.rp = w->rp + (size_t)g0 * quant_repack_group_bytes(w->type, w->cols);
		v.rp_of = v.data;
		v.rp_groups = MAX(0, MIN(w->rp_groups - g0, v.rows / QR_ROWS));
	}
	matmul(m, &v, out + r0, x, 1);
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
