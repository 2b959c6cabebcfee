/*
 * quant_lowbit.c: the weight types mixture-of-experts files in the wild use besides the seven of
 * quant.c: Q5_0 and Q5_1 (32-element blocks with a fifth bit plane), and the K-quants Q2_K, Q3_K
 * and Q5_K (256-element super-blocks). llama.cpp's Q4_K_M keeps attn_output of 8-expert models in
 * Q5_K; Q2_K/Q3_K are what fits a 235B-class model on a few Macs.
 *
 * Layouts follow ggml's block structs and reference dequantizers (ggml/src/ggml-common.h;
 * ggml/src/ggml-quants.c dequantize_row_q5_0, _q5_1, _q2_K, _q3_K, _q5_K). Each element is
 * addressed by one small function (q2k_at, q3k_at, q5k_at) so the dequantizer, the quantizer and
 * the dot product all read the bit planes the same way. Kernels here are the plain C reference:
 * every type has a dot product against 8-bit activations (Q5_0/Q5_1 take Q8_0 activations with
 * per-block sums; the K-quants take Q8_K with per-16 sums), so the forward pass reads them in
 * place like the others.
 *
 * Invariant: pure functions; nothing here holds state.
 */
#include "common/common.h"
#include "infer/quant/quant.h"

#include <math.h>
#include <string.h>

static inline float absmax_f(float m, float v)
{
	return fabsf(v) > m ? fabsf(v) : m;
}

static inline uint32_t le32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4); /* ggml stores qh as the bytes of a little-endian uint32 */
	return v;
}

/* ---- element accessors (the one place each layout is spelled out) ------------------------- */

/* Q5_0 / Q5_1 element j (0..31): low nibble of qs[j] (j < 16) or high nibble of qs[j-16], with
 * bit j of qh as the fifth bit. Returns 0..31. */
static inline int q5_at(const uint8_t *qs, uint32_t qh, int j)
{
	int lo = j < 16 ? qs[j] & 0xf : qs[j - 16] >> 4;
	return lo | (int)((qh >> j) & 1) << 4;
}

/* Q2_K / Q3_K low two bits of element e (0..255): byte 32*(e/128) + e%32, bit pair (e%128)/32. */
static inline int k2_bits(const uint8_t *qs, int e)
{
	return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

/* Q3_K element e: the two low bits minus 4 unless its bit in hmask (byte e%32, bit e/32) is set. */
static inline int q3k_at(const blk_q3_k *b, int e)
{
	int h = (b->hmask[e % 32] >> (e / 32)) & 1;
	return k2_bits(b->qs, e) - (h ? 0 : 4);
}

/* Q5_K element e: 64-element chunk c = e/64 holds sub-block 2c in the low nibbles of qs[32c..]
 * and 2c+1 in the high ones; the fifth bit is bit 2c (or 2c+1) of qh[e%32]. Returns 0..31. */
static inline int q5k_at(const blk_q5_k *b, int e)
{
	int c = e / 64, s = (e % 64) / 32, l = e % 32;
	int lo = s ? b->qs[32 * c + l] >> 4 : b->qs[32 * c + l] & 0xf;
	return lo | ((b->qh[l] >> (2 * c + s)) & 1) << 4;
}

/* ---- dequantize --------------------------------------------------------------------------- */

void quant_lowbit_dequant(int t, const void *src, float *y, int64_t n)
{
	switch (t) {
	case QT_Q5_0: {
		const blk_q5_0 *b = src;
		for (int64_t i = 0; i < n / 32; i++, y += 32) {
			float d = quant_f16_to_f32(b[i].d);
			uint32_t qh = le32(b[i].qh);
			for (int j = 0; j < 32; j++)
				y[j] = d * (float)(q5_at(b[i].qs, qh, j) - 16);
		}
		break;
	}
	case QT_Q5_1: {
		const blk_q5_1 *b = src;
		for (int64_t i = 0; i < n / 32; i++, y += 32) {
			float d = quant_f16_to_f32(b[i].d), m = quant_f16_to_f32(b[i].m);
			uint32_t qh = le32(b[i].qh);
			for (int j = 0; j < 32; j++)
				y[j] = d * (float)q5_at(b[i].qs, qh, j) + m;
		}
		break;
	}
	case QT_Q2_K: {
		const blk_q2_k *b = src;
		for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
			float d = quant_f16_to_f32(b[i].d), dmin = quant_f16_to_f32(b[i].dmin);
			for (int e = 0; e < QK_K; e++) {
				int sc = b[i].scales[e / 16];
				y[e] = d * (float)(sc & 0xf) * (float)k2_bits(b[i].qs, e) -
				       dmin * (float)(sc >> 4);
			}
		}
		break;
	}
	case QT_Q3_K: {
		const blk_q3_k *b = src;
		for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
			float d = quant_f16_to_f32(b[i].d);
			for (int e = 0; e < QK_K; e++)
				y[e] = d * (float)quant_q3k_scale(b[i].scales, e / 16) *
				       (float)q3k_at(&b[i], e);
		}
		break;
	}
	case QT_Q5_K: {
		const blk_q5_k *b = src;
		for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
			float d = quant_f16_to_f32(b[i].d), dmin = quant_f16_to_f32(b[i].dmin);
			for (int e = 0; e < QK_K; e++) {
				int sc, m;
				quant_k4_scale_min(e / 32, b[i].scales, &sc, &m);
				y[e] = d * (float)sc * (float)q5k_at(&b[i], e) - dmin * (float)m;
			}
		}
		break;
	}
	default: memset(y, 0, (size_t)n * sizeof *y);
	}
}

/* ---- quantize (simple, deterministic; for generated test and benchmark models) ------------ */

static void quantize_q5_0(const float *x, blk_q5_0 *b, int64_t n)
{
	for (int64_t i = 0; i < n / 32; i++, x += 32) {
		float amax = 0, max = 0;
		for (int j = 0; j < 32; j++)
			if (fabsf(x[j]) > amax) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		float d = max / -16.f, id = d ? 1.f / d : 0.f;
		b[i].d = quant_f32_to_f16(d);
		uint32_t qh = 0;
		memset(b[i].qs, 0, sizeof b[i].qs);
		for (int j = 0; j < 32; j++) {
			int q = MIN(31, MAX(0, (int)lrintf(x[j] * id) + 16));
			b[i].qs[j % 16] |= (uint8_t)((q & 0xf) << (j < 16 ? 0 : 4));
			qh |= (uint32_t)(q >> 4) << j;
		}
		memcpy(b[i].qh, &qh, 4);
	}
}

static void quantize_q5_1(const float *x, blk_q5_1 *b, int64_t n)
{
	for (int64_t i = 0; i < n / 32; i++, x += 32) {
		float lo = x[0], hi = x[0];
		for (int j = 1; j < 32; j++) {
			lo = fminf(lo, x[j]);
			hi = fmaxf(hi, x[j]);
		}
		float d = (hi - lo) / 31.f, id = d ? 1.f / d : 0.f;
		b[i].d = quant_f32_to_f16(d);
		b[i].m = quant_f32_to_f16(lo);
		float m = quant_f16_to_f32(b[i].m);
		uint32_t qh = 0;
		memset(b[i].qs, 0, sizeof b[i].qs);
		for (int j = 0; j < 32; j++) {
			int q = MIN(31, MAX(0, (int)lrintf((x[j] - m) * id)));
			b[i].qs[j % 16] |= (uint8_t)((q & 0xf) << (j < 16 ? 0 : 4));
			qh |= (uint32_t)(q >> 4) << j;
		}
		memcpy(b[i].qh, &qh, 4);
	}
}

/* Per 16 elements: min = min(0, min x), scale = (max - min) / 3, both to 4 bits against the
 * super-scales. */
static void quantize_q2_k(const float *x, blk_q2_k *b, int64_t n)
{
	for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float scale[16], minv[16], smax, mmax;
		quant_subblock_ranges(x, 16, 16, 3.f, scale, minv, &smax, &mmax);
		b[i].d = quant_f32_to_f16(smax / 15.f);
		b[i].dmin = quant_f32_to_f16(mmax / 15.f);
		float d = quant_f16_to_f32(b[i].d), dmin = quant_f16_to_f32(b[i].dmin);
		memset(b[i].qs, 0, sizeof b[i].qs);
		for (int g = 0; g < 16; g++) {
			int sc = d ? MIN(15, (int)lrintf(scale[g] / d)) : 0;
			int m = dmin ? MIN(15, (int)lrintf(minv[g] / dmin)) : 0;
			b[i].scales[g] = (uint8_t)(sc | m << 4);
			float ds = d * (float)sc, off = dmin * (float)m;
			for (int l = 0; l < 16; l++) {
				int e = 16 * g + l;
				int q = ds ? (int)lrintf((x[e] + off) / ds) : 0;
				q = MIN(3, MAX(0, q));
				b[i].qs[32 * (e / 128) + e % 32] |=
				    (uint8_t)(q << (2 * ((e % 128) / 32)));
			}
		}
	}
}

/* Per 16 elements a signed 6-bit scale (amax / 4); values -4..3 as 2 low bits + hmask. */
static void quantize_q3_k(const float *x, blk_q3_k *b, int64_t n)
{
	for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float gs[16], gmax = 0;
		for (int g = 0; g < 16; g++) {
			float amax = 0;
			for (int l = 0; l < 16; l++)
				amax = absmax_f(amax, x[16 * g + l]);
			gs[g] = amax / 4.f;
			gmax = fmaxf(gmax, gs[g]);
		}
		b[i].d = quant_f32_to_f16(gmax / 31.f);
		float d = quant_f16_to_f32(b[i].d);
		memset(b[i].scales, 0, sizeof b[i].scales);
		memset(b[i].hmask, 0, sizeof b[i].hmask);
		memset(b[i].qs, 0, sizeof b[i].qs);
		for (int g = 0; g < 16; g++) {
			int s = d ? MIN(31, (int)lrintf(gs[g] / d)) : 0, u = s + 32;
			b[i].scales[g % 8] |= (uint8_t)((u & 0xf) << (g < 8 ? 0 : 4));
			b[i].scales[8 + g % 4] |= (uint8_t)((u >> 4) << (2 * (g / 4)));
			float ds = d * (float)s;
			for (int l = 0; l < 16; l++) {
				int e = 16 * g + l;
				int q = ds ? (int)lrintf(x[e] / ds) : 0;
				q = MIN(3, MAX(-4, q)) + 4; /* 0..7: bit 2 to hmask */
				if (q & 4)
					b[i].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
				b[i].qs[32 * (e / 128) + e % 32] |=
				    (uint8_t)((q & 3) << (2 * ((e % 128) / 32)));
			}
		}
	}
}

/* As quant.c's Q4_K quantizer, with 32 levels. */
static void quantize_q5_k(const float *x, blk_q5_k *b, int64_t n)
{
	for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float scale[8], minv[8], smax, mmax;
		quant_subblock_ranges(x, 8, 32, 31.f, scale, minv, &smax, &mmax);
		b[i].d = quant_f32_to_f16(smax / 63.f);
		b[i].dmin = quant_f32_to_f16(mmax / 63.f);
		float d = quant_f16_to_f32(b[i].d), dmin = quant_f16_to_f32(b[i].dmin);
		int sc[8], m[8];
		for (int j = 0; j < 8; j++) {
			sc[j] = d ? MIN(63, (int)lrintf(scale[j] / d)) : 0;
			m[j] = dmin ? MIN(63, (int)lrintf(minv[j] / dmin)) : 0;
		}
		quant_k4_scales_pack(sc, m, b[i].scales);
		memset(b[i].qh, 0, sizeof b[i].qh);
		memset(b[i].qs, 0, sizeof b[i].qs);
		for (int e = 0; e < QK_K; e++) {
			int j = e / 32, c = e / 64, s = j & 1, l = e % 32;
			float ds = d * (float)sc[j], off = dmin * (float)m[j];
			int q = ds ? (int)lrintf((x[e] + off) / ds) : 0;
			q = MIN(31, MAX(0, q));
			b[i].qs[32 * c + l] |= (uint8_t)((q & 0xf) << (s ? 4 : 0));
			b[i].qh[l] |= (uint8_t)((q >> 4) << (2 * c + s));
		}
	}
}

int quant_lowbit_quantize(int t, const float *src, void *dst, int64_t n)
{
	switch (t) {
	case QT_Q5_0: quantize_q5_0(src, dst, n); return 0;
	case QT_Q5_1: quantize_q5_1(src, dst, n); return 0;
	case QT_Q2_K: quantize_q2_k(src, dst, n); return 0;
	case QT_Q3_K: quantize_q3_k(src, dst, n); return 0;
	case QT_Q5_K: quantize_q5_k(src, dst, n); return 0;
	default: return SH_EUNSUPP;
	}
}

/* ---- reference dot products --------------------------------------------------------------- */

/* Q5_0 x Q8_0: per block d_w * d_x * sum((q - 16) * x). */
static void ref_rows_q5_0(float *out, const uint8_t *w, size_t stride, int nrows,
			  const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const blk_q5_0 *b = (const blk_q5_0 *)(w + (size_t)r * stride);
		float s = 0;
		for (int i = 0; i < n / 32; i++) {
			const int8_t *q = x->q + 32 * i;
			uint32_t qh = le32(b[i].qh);
			int sum = 0;
			for (int j = 0; j < 32; j++)
				sum += (q5_at(b[i].qs, qh, j) - 16) * q[j];
			s += quant_f16_to_f32(b[i].d) * x->d[i] * (float)sum;
		}
		out[r] = s;
	}
}

/* Q5_1 x Q8_0: per block d_x * (d_w * sum(q * x) + m * sum(x)), the last from the block sums. */
static void ref_rows_q5_1(float *out, const uint8_t *w, size_t stride, int nrows,
			  const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const blk_q5_1 *b = (const blk_q5_1 *)(w + (size_t)r * stride);
		float s = 0;
		for (int i = 0; i < n / 32; i++) {
			const int8_t *q = x->q + 32 * i;
			uint32_t qh = le32(b[i].qh);
			int sum = 0;
			for (int j = 0; j < 32; j++)
				sum += q5_at(b[i].qs, qh, j) * q[j];
			s += x->d[i] * (quant_f16_to_f32(b[i].d) * (float)sum +
					quant_f16_to_f32(b[i].m) * (float)x->bsums[i]);
		}
		out[r] = s;
	}
}

/* K-quants x Q8_K: per 16-element group g, scale_g * sum(q * x) - min_g * bsums[g]. */
static void ref_rows_q2_k(float *out, const uint8_t *w, size_t stride, int nrows,
			  const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const blk_q2_k *b = (const blk_q2_k *)(w + (size_t)r * stride);
		float s = 0;
		for (int i = 0; i < n / QK_K; i++) {
			const int8_t *q = x->q + QK_K * i;
			const int16_t *bs = x->bsums + 16 * i;
			int acc = 0, macc = 0;
			for (int g = 0; g < 16; g++) {
				int sum = 0;
				for (int l = 0; l < 16; l++)
					sum += k2_bits(b[i].qs, 16 * g + l) * q[16 * g + l];
				acc += (b[i].scales[g] & 0xf) * sum;
				macc += (b[i].scales[g] >> 4) * bs[g];
			}
			s += x->d[i] * (quant_f16_to_f32(b[i].d) * (float)acc -
					quant_f16_to_f32(b[i].dmin) * (float)macc);
		}
		out[r] = s;
	}
}

static void ref_rows_q3_k(float *out, const uint8_t *w, size_t stride, int nrows,
			  const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const blk_q3_k *b = (const blk_q3_k *)(w + (size_t)r * stride);
		float s = 0;
		for (int i = 0; i < n / QK_K; i++) {
			const int8_t *q = x->q + QK_K * i;
			int acc = 0;
			for (int g = 0; g < 16; g++) {
				int sum = 0;
				for (int l = 0; l < 16; l++)
					sum += q3k_at(&b[i], 16 * g + l) * q[16 * g + l];
				acc += quant_q3k_scale(b[i].scales, g) * sum;
			}
			s += x->d[i] * quant_f16_to_f32(b[i].d) * (float)acc;
		}
		out[r] = s;
	}
}

static void ref_rows_q5_k(float *out, const uint8_t *w, size_t stride, int nrows,
			  const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const blk_q5_k *b = (const blk_q5_k *)(w + (size_t)r * stride);
		float s = 0;
		for (int i = 0; i < n / QK_K; i++) {
			const int8_t *q = x->q + QK_K * i;
			const int16_t *bs = x->bsums + 16 * i;
			int acc = 0, macc = 0;
			for (int j = 0; j < 8; j++) {
				int sc, m, sum = 0;
				quant_k4_scale_min(j, b[i].scales, &sc, &m);
				for (int l = 0; l < 32; l++)
					sum += q5k_at(&b[i], 32 * j + l) * q[32 * j + l];
				acc += sc * sum;
				macc += m * (bs[2 * j] + bs[2 * j + 1]);
			}
			s += x->d[i] * (quant_f16_to_f32(b[i].d) * (float)acc -
					quant_f16_to_f32(b[i].dmin) * (float)macc);
		}
		out[r] = s;
	}
}

#define LOWBIT_DEQUANT(name, t)                                                                    \
	static void name(const void *src, float *dst, int n)                                       \
	{                                                                                          \
		quant_lowbit_dequant(t, src, dst, n);                                              \
	}
LOWBIT_DEQUANT(ref_dq_q5_0, QT_Q5_0)
LOWBIT_DEQUANT(ref_dq_q5_1, QT_Q5_1)
LOWBIT_DEQUANT(ref_dq_q2_k, QT_Q2_K)
LOWBIT_DEQUANT(ref_dq_q3_k, QT_Q3_K)
LOWBIT_DEQUANT(ref_dq_q5_k, QT_Q5_K)

static const quant_ops_t ref_q5_0 = {"ref", QT_Q8_0, ref_rows_q5_0, ref_dq_q5_0, NULL};
static const quant_ops_t ref_q5_1 = {"ref", QT_Q8_0, ref_rows_q5_1, ref_dq_q5_1, NULL};
static const quant_ops_t ref_q2_k = {"ref", QT_Q8_K, ref_rows_q2_k, ref_dq_q2_k, NULL};
static const quant_ops_t ref_q3_k = {"ref", QT_Q8_K, ref_rows_q3_k, ref_dq_q3_k, NULL};
static const quant_ops_t ref_q5_k = {"ref", QT_Q8_K, ref_rows_q5_k, ref_dq_q5_k, NULL};

const quant_ops_t *quant_lowbit_ops_ref(int t)
{
	switch (t) {
	case QT_Q5_0: return &ref_q5_0;
	case QT_Q5_1: return &ref_q5_1;
	case QT_Q2_K: return &ref_q2_k;
	case QT_Q3_K: return &ref_q3_k;
	case QT_Q5_K: return &ref_q5_k;
	default: return NULL;
	}
}
