/*
 * repack.c: the interleaved R16 layout (repack.h) in plain C: rearranging rows into groups and
 * back, the reference kernel over groups, and the choice of kernel.
 *
 * Invariant: the reference kernel computes, for every row and vector, exactly what the plain
 * matvec kernel of quant.c computes from the original rows (the same integer block dots, the
 * same float expression per block, blocks added in order), so the optimized kernels are checked
 * against it with the same NMSE bound as the matvec kernels.
 */
#include "infer/quant/repack.h"
#include "common/common.h"

#include <string.h>

int quant_repack_supported(int t)
{
	return t == QT_Q8_0 || t == QT_Q4_0 || t == QT_Q4_K || t == QT_Q6_K || t == QT_MXFP4;
}

size_t quant_repack_group_bytes(int t, int n)
{
	return QR_ROWS * quant_row_bytes(t, n);
}

/* Bytes of one block index of a group: 16 scales, then the quants. */
static size_t grp_block_bytes(int t)
{
	return QR_ROWS * quant_block_bytes(t);
}

/* Q4_K: one block index of a group from 16 rows' blocks b[r] (layout in repack.h). */
static void repack_q4_k(const blk_q4_k *const *b, uint8_t *d)
{
	for (int r = 0; r < QR_ROWS; r++) {
		memcpy(d + 2 * r, &b[r]->d, 2);
		memcpy(d + 32 + 2 * r, &b[r]->dmin, 2);
		for (int w = 0; w < 3; w++)
			memcpy(d + 64 + 64 * w + 4 * r, b[r]->scales + 4 * w, 4);
		for (int c = 0; c < 4; c++)
			for (int s = 0; s < 8; s++)
				memcpy(d + 256 + 512 * c + 64 * s + 4 * r,
				       b[r]->qs + 32 * c + 4 * s, 4);
	}
}

static void unpack_q4_k(const uint8_t *d, blk_q4_k **b)
{
	for (int r = 0; r < QR_ROWS; r++) {
		memcpy(&b[r]->d, d + 2 * r, 2);
		memcpy(&b[r]->dmin, d + 32 + 2 * r, 2);
		for (int w = 0; w < 3; w++)
			memcpy(b[r]->scales + 4 * w, d + 64 + 64 * w + 4 * r, 4);
		for (int c = 0; c < 4; c++)
			for (int s = 0; s < 8; s++)
				memcpy(b[r]->qs + 32 * c + 4 * s,
				       d + 256 + 512 * c + 64 * s + 4 * r, 4);
	}
}

/* Q6_K: offsets inside one block index of a group (layout in repack.h). */
#define K6_SC 32
#define K6_L  288
#define K6_H  2336

static void repack_q6_k(const blk_q6_k *const *b, uint8_t *d)
{
	for (int r = 0; r < QR_ROWS; r++) {
		memcpy(d + 2 * r, &b[r]->d, 2);
		for (int g = 0; g < 16; g++)
			d[K6_SC + 16 * g + r] = (uint8_t)b[r]->scales[g];
		for (int h = 0; h < 2; h++)
			for (int s = 0; s < 8; s++) {
				for (int kk = 0; kk < 2; kk++)
					memcpy(d + K6_L + ((h * 2 + kk) * 8 + s) * 64 + 4 * r,
					       b[r]->ql + 64 * h + 32 * kk + 4 * s, 4);
				memcpy(d + K6_H + (h * 8 + s) * 64 + 4 * r,
				       b[r]->qh + 32 * h + 4 * s, 4);
			}
	}
}

static void unpack_q6_k(const uint8_t *d, blk_q6_k **b)
{
	for (int r = 0; r < QR_ROWS; r++) {
		memcpy(&b[r]->d, d + 2 * r, 2);
		for (int g = 0; g < 16; g++)
			b[r]->scales[g] = (int8_t)d[K6_SC + 16 * g + r];
		for (int h = 0; h < 2; h++)
			for (int s = 0; s < 8; s++) {
				for (int kk = 0; kk < 2; kk++)
					memcpy(b[r]->ql + 64 * h + 32 * kk + 4 * s,
					       d + K6_L + ((h * 2 + kk) * 8 + s) * 64 + 4 * r, 4);
				memcpy(b[r]->qh + 32 * h + 4 * s,
				       d + K6_H + (h * 8 + s) * 64 + 4 * r, 4);
			}
	}
}

void quant_repack(int t, const uint8_t *src, size_t stride, int ngroups, int n, uint8_t *dst)
{
	int nb = n / quant_block_elems(t);
	if (t == QT_Q6_K) {
		for (int g = 0; g < ngroups; g++)
			for (int i = 0; i < nb; i++) {
				const blk_q6_k *b[QR_ROWS];
				for (int r = 0; r < QR_ROWS; r++)
					b[r] = (const blk_q6_k *)(src + (size_t)(g * QR_ROWS + r) *
									    stride) +
					       i;
				repack_q6_k(b, dst + ((size_t)g * nb + i) * grp_block_bytes(t));
			}
		return;
	}
	if (t == QT_Q4_K) {
		for (int g = 0; g < ngroups; g++)
			for (int i = 0; i < nb; i++) {
				const blk_q4_k *b[QR_ROWS];
				for (int r = 0; r < QR_ROWS; r++)
					b[r] = (const blk_q4_k *)(src + (size_t)(g * QR_ROWS + r) *
									    stride) +
					       i;
				repack_q4_k(b, dst + ((size_t)g * nb + i) * grp_block_bytes(t));
			}
		return;
	}
	size_t gb = grp_block_bytes(t);
	if (t == QT_MXFP4) { /* 16 exponent bytes, then the codes as Q4_0's */
		for (int g = 0; g < ngroups; g++)
			for (int i = 0; i < nb; i++) {
				uint8_t *d = dst + ((size_t)g * nb + i) * gb;
				for (int r = 0; r < QR_ROWS; r++) {
					const blk_mxfp4 *b =
					    (const blk_mxfp4 *)(src + (size_t)(g * QR_ROWS + r) *
									  stride) +
					    i;
					d[r] = b->e;
					for (int s = 0; s < 4; s++)
						memcpy(d + QR_ROWS + 64 * s + 4 * r, b->qs + 4 * s,
						       4);
				}
			}
		return;
	}
	for (int g = 0; g < ngroups; g++)
		for (int i = 0; i < nb; i++) {
			uint8_t *d = dst + ((size_t)g * nb + i) * gb;
			uint16_t *sc = (uint16_t *)d;
			uint8_t *q = d + 2 * QR_ROWS;
			for (int r = 0; r < QR_ROWS; r++) {
				const uint8_t *row = src + (size_t)(g * QR_ROWS + r) * stride;
				if (t == QT_Q8_0) {
					const blk_q8_0 *b = (const blk_q8_0 *)row + i;
					memcpy(&sc[r], &b->d, 2);
					for (int s = 0; s < 8; s++)
						for (int j = 0; j < 4; j++)
							q[64 * s + 4 * r + j] =
							    (uint8_t)(b->q[4 * s + j] + 128);
				} else {
					const blk_q4_0 *b = (const blk_q4_0 *)row + i;
					memcpy(&sc[r], &b->d, 2);
					for (int s = 0; s < 4; s++)
						memcpy(q + 64 * s + 4 * r, b->qs + 4 * s, 4);
				}
			}
		}
}

void quant_unpack(int t, const uint8_t *src, int ngroups, int n, uint8_t *dst)
{
	int nb = n / quant_block_elems(t);
	size_t gb = grp_block_bytes(t), rb = quant_row_bytes(t, n);
	if (t == QT_Q6_K) {
		for (int g = 0; g < ngroups; g++)
			for (int i = 0; i < nb; i++) {
				blk_q6_k *b[QR_ROWS];
				for (int r = 0; r < QR_ROWS; r++)
					b[r] =
					    (blk_q6_k *)(dst + (size_t)(g * QR_ROWS + r) * rb) + i;
				unpack_q6_k(src + ((size_t)g * nb + i) * gb, b);
			}
		return;
	}
	if (t == QT_Q4_K) {
		for (int g = 0; g < ngroups; g++)
			for (int i = 0; i < nb; i++) {
				blk_q4_k *b[QR_ROWS];
				for (int r = 0; r < QR_ROWS; r++)
					b[r] =
					    (blk_q4_k *)(dst + (size_t)(g * QR_ROWS + r) * rb) + i;
				unpack_q4_k(src + ((size_t)g * nb + i) * gb, b);
			}
		return;
	}
	if (t == QT_MXFP4) {
		for (int g = 0; g < ngroups; g++)
			for (int i = 0; i < nb; i++) {
				const uint8_t *d = src + ((size_t)g * nb + i) * gb;
				for (int r = 0; r < QR_ROWS; r++) {
					blk_mxfp4 *b =
					    (blk_mxfp4 *)(dst + (size_t)(g * QR_ROWS + r) * rb) + i;
					b->e = d[r];
					for (int s = 0; s < 4; s++)
						memcpy(b->qs + 4 * s, d + QR_ROWS + 64 * s + 4 * r,
						       4);
				}
			}
		return;
	}
	for (int g = 0; g < ngroups; g++)
		for (int i = 0; i < nb; i++) {
			const uint8_t *d = src + ((size_t)g * nb + i) * gb;
			const uint8_t *q = d + 2 * QR_ROWS;
			for (int r = 0; r < QR_ROWS; r++) {
				uint8_t *row = dst + (size_t)(g * QR_ROWS + r) * rb;
				if (t == QT_Q8_0) {
					blk_q8_0 *b = (blk_q8_0 *)row + i;
					memcpy(&b->d, d + 2 * r, 2);
					for (int s = 0; s < 8; s++)
						for (int j = 0; j < 4; j++)
							b->q[4 * s + j] =
							    (int8_t)(q[64 * s + 4 * r + j] - 128);
				} else {
					blk_q4_0 *b = (blk_q4_0 *)row + i;
					memcpy(&b->d, d + 2 * r, 2);
					for (int s = 0; s < 4; s++)
						memcpy(b->qs + 4 * s, q + 64 * s + 4 * r, 4);
				}
			}
		}
}

/* Reference: per row, vector and block the integer dot of the stored bytes minus the offset
 * times the activation's block sum (= the plain kernel's signed dot), then the same float
 * expression as quant.c's ref_rows_q8_0 / ref_rows_q4_0. */
static void ref_gemm(int t, float *out, int ldo, const uint8_t *w, int ngroups,
		     const quant_act_t *x, int nt, int n)
{
	int nb = n / QK8_0;
	size_t gb = grp_block_bytes(t);
	for (int g = 0; g < ngroups; g++)
		for (int v = 0; v < nt; v++)
			for (int r = 0; r < QR_ROWS; r++) {
				float s = 0;
				for (int i = 0; i < nb; i++) {
					const uint8_t *d = w + ((size_t)g * nb + i) * gb;
					const uint8_t *q = d + 2 * QR_ROWS;
					const int8_t *xq = x[v].q + i * QK8_0;
					uint16_t h;
					memcpy(&h, d + 2 * r, 2);
					int sum;
					if (t == QT_Q8_0) {
						sum = -128 * x[v].bsums[i];
						for (int k = 0; k < 8; k++)
							for (int j = 0; j < 4; j++)
								sum += q[64 * k + 4 * r + j] *
								       xq[4 * k + j];
					} else {
						sum = -8 * x[v].bsums[i];
						for (int k = 0; k < 4; k++)
							for (int j = 0; j < 4; j++) {
								int b = q[64 * k + 4 * r + j];
								sum +=
								    (b & 15) * xq[4 * k + j] +
								    (b >> 4) * xq[16 + 4 * k + j];
							}
					}
					s += quant_f16_to_f32(h) * x[v].d[i] * (float)sum;
				}
				out[(size_t)v * ldo + g * QR_ROWS + r] = s;
			}
}

/* Q4_K: the same integer sums and float expression as quant.c's ref_rows_q4_k. */
static void ref_gemm_q4_k(float *out, int ldo, const uint8_t *w, int ngroups, const quant_act_t *x,
			  int nt, int n)
{
	int nb = n / QK_K;
	for (int g = 0; g < ngroups; g++)
		for (int v = 0; v < nt; v++)
			for (int r = 0; r < QR_ROWS; r++) {
				float s = 0;
				for (int i = 0; i < nb; i++) {
					const uint8_t *d = w + ((size_t)g * nb + i) * 2304;
					const int8_t *q = x[v].q + i * QK_K;
					const int16_t *bs = x[v].bsums + i * 16;
					uint8_t sc[12];
					uint16_t hd, hm;
					memcpy(&hd, d + 2 * r, 2);
					memcpy(&hm, d + 32 + 2 * r, 2);
					for (int k = 0; k < 3; k++)
						memcpy(sc + 4 * k, d + 64 + 64 * k + 4 * r, 4);
					int acc = 0, macc = 0;
					for (int c = 0; c < 4; c++) {
						int sc0, m0, sc1, m1, s0 = 0, s1 = 0;
						quant_k4_scale_min(2 * c, sc, &sc0, &m0);
						quant_k4_scale_min(2 * c + 1, sc, &sc1, &m1);
						for (int l = 0; l < 32; l++) {
							int b = d[256 + 512 * c + 64 * (l / 4) +
								  4 * r + l % 4];
							s0 += (b & 0xf) * q[64 * c + l];
							s1 += (b >> 4) * q[64 * c + 32 + l];
						}
						acc += sc0 * s0 + sc1 * s1;
						macc += m0 * (bs[4 * c] + bs[4 * c + 1]) +
							m1 * (bs[4 * c + 2] + bs[4 * c + 3]);
					}
					s += x[v].d[i] * (quant_f16_to_f32(hd) * (float)acc -
							  quant_f16_to_f32(hm) * (float)macc);
				}
				out[(size_t)v * ldo + g * QR_ROWS + r] = s;
			}
}

/* Q6_K: the same integer sums and float expression as quant.c's ref_rows_q6_k. */
static void ref_gemm_q6_k(float *out, int ldo, const uint8_t *w, int ngroups, const quant_act_t *x,
			  int nt, int n)
{
	int nb = n / QK_K;
	for (int g = 0; g < ngroups; g++)
		for (int v = 0; v < nt; v++)
			for (int r = 0; r < QR_ROWS; r++) {
				float s = 0;
				for (int i = 0; i < nb; i++) {
					const uint8_t *d = w + ((size_t)g * nb + i) * 3360;
					const int8_t *q = x[v].q + i * QK_K;
					uint16_t hd;
					memcpy(&hd, d + 2 * r, 2);
					int acc = 0;
					for (int sb = 0; sb < 16; sb++) {
						int sum = 0;
						for (int l = 0; l < 16; l++) {
							int e = 16 * sb + l, h = e / 128,
							    k = e % 128 / 32, st = e % 32 / 4,
							    j = e % 4;
							int lo = d[K6_L +
								   ((h * 2 + k % 2) * 8 + st) * 64 +
								   4 * r + j],
							    hi = d[K6_H + (h * 8 + st) * 64 +
								   4 * r + j];
							lo = k >= 2 ? lo >> 4 : lo & 15;
							int q6 = lo | ((hi >> (2 * k)) & 3) << 4;
							sum += (q6 - 32) * q[e];
						}
						acc += (int8_t)d[K6_SC + 16 * sb + r] * sum;
					}
					s += x[v].d[i] * quant_f16_to_f32(hd) * (float)acc;
				}
				out[(size_t)v * ldo + g * QR_ROWS + r] = s;
			}
}

/* MXFP4: the same integer sums and float expression as quant_mxfp4.c's ref_rows_mxfp4. */
static void ref_gemm_mxfp4(float *out, int ldo, const uint8_t *w, int ngroups, const quant_act_t *x,
			   int nt, int n)
{
	int nb = n / 32;
	for (int g = 0; g < ngroups; g++)
		for (int v = 0; v < nt; v++)
			for (int r = 0; r < QR_ROWS; r++) {
				float s = 0;
				for (int i = 0; i < nb; i++) {
					const uint8_t *d = w + ((size_t)g * nb + i) * 272;
					const int8_t *xq = x[v].q + i * 32;
					int sum = 0;
					for (int k = 0; k < 4; k++)
						for (int j = 0; j < 4; j++) {
							int b = d[QR_ROWS + 64 * k + 4 * r + j];
							sum += quant_mxfp4_values[b & 15] *
								   xq[4 * k + j] +
							       quant_mxfp4_values[b >> 4] *
								   xq[16 + 4 * k + j];
						}
					s += quant_e8m0_half(d[r]) * x[v].d[i] * (float)sum;
				}
				out[(size_t)v * ldo + g * QR_ROWS + r] = s;
			}
}

static void ref_gemm_q8_0(float *out, int ldo, const uint8_t *w, int ngroups, const quant_act_t *x,
			  int nt, int n)
{
	ref_gemm(QT_Q8_0, out, ldo, w, ngroups, x, nt, n);
}

static void ref_gemm_q4_0(float *out, int ldo, const uint8_t *w, int ngroups, const quant_act_t *x,
			  int nt, int n)
{
	ref_gemm(QT_Q4_0, out, ldo, w, ngroups, x, nt, n);
}

quant_gemm_fn quant_gemm_ref(int t)
{
	switch (t) {
	case QT_Q8_0: return ref_gemm_q8_0;
	case QT_Q4_0: return ref_gemm_q4_0;
	case QT_Q4_K: return ref_gemm_q4_k;
	case QT_Q6_K: return ref_gemm_q6_k;
	case QT_MXFP4: return ref_gemm_mxfp4;
	default: return NULL;
	}
}

static quant_gemm_fn pick(int t, const char **impl)
{
	quant_gemm_fn f = NULL;
	*impl = NULL;
	if (!quant_ref_forced()) {
		f = quant_x86_gemm(t, impl);
		if (!f)
			f = quant_neon_gemm(t, impl);
	}
	if (!f && (f = quant_gemm_ref(t)))
		*impl = "ref";
	return f;
}

quant_gemm_fn quant_gemm(int t)
{
	const char *impl;
	return pick(t, &impl);
}

const char *quant_gemm_impl(int t)
{
	const char *impl;
	pick(t, &impl);
	return impl;
}
