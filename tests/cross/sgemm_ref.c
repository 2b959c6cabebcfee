/*
 * sgemm_ref.c: a plain C cblas_sgemm for the aarch64 cross builds of tests/t_neon.sh (no arm64
 * BLAS is installed here). C = alpha * op(A) * op(B) + beta * C, row- or column-major, op = the
 * matrix or its transpose. Correctness only: one float sum per element, no blocking.
 */
#include "Accelerate/Accelerate.h"

/* Element (i, j) of op(X) for a row-major X with leading dimension ld. */
static float at(const float *x, int ld, int trans, int i, int j)
{
	return trans ? x[(long)j * ld + i] : x[(long)i * ld + j];
}

void cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE transa,
		 const enum CBLAS_TRANSPOSE transb, const int m, const int n, const int k,
		 const float alpha, const float *a, const int lda, const float *b, const int ldb,
		 const float beta, float *c, const int ldc)
{
	if (order == CblasColMajor) { /* C^T = op(B)^T op(A)^T, all row-major */
		cblas_sgemm(CblasRowMajor, transb, transa, n, m, k, alpha, b, ldb, a, lda, beta, c,
			    ldc);
		return;
	}
	int ta = transa != CblasNoTrans, tb = transb != CblasNoTrans;
	for (int i = 0; i < m; i++)
		for (int j = 0; j < n; j++) {
			float s = 0;
			for (int l = 0; l < k; l++)
				s += at(a, lda, ta, i, l) * at(b, ldb, tb, l, j);
			float *cij = &c[(long)i * ldc + j];
			/* beta 0: C is not read (it may hold garbage, as BLAS allows) */
			*cij = alpha * s + (beta != 0 ? beta * *cij : 0);
		}
}
