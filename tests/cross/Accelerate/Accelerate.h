/*
 * Accelerate/Accelerate.h (stand-in): the part of Apple's Accelerate framework shoal uses, the
 * CBLAS single-precision gemm, declared as Accelerate (and every CBLAS) declares it. Only for
 * tests/t_neon.sh, which cross-compiles infer/model.c's -DSHOAL_ACCELERATE branch for aarch64
 * on Linux, where neither Accelerate nor an arm64 BLAS is installed; sgemm_ref.c defines it.
 */
#ifndef SHOAL_TEST_ACCELERATE_H
#define SHOAL_TEST_ACCELERATE_H

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };

void cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE transa,
		 const enum CBLAS_TRANSPOSE transb, const int m, const int n, const int k,
		 const float alpha, const float *a, const int lda, const float *b, const int ldb,
		 const float beta, float *c, const int ldc);

#endif
