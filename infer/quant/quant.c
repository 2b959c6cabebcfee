/*
 * quant.c: block formats in plain C: fp16/bf16 conversion, reference dequantize and quantize for
 * every supported type, the reference matvec kernels, activation preparation and the dispatch
 * tables. The optimized kernels (quant_x86.c) are checked against these in tests/test_quant.c.
 *
 * Invariant: the reference kernels compute exactly sum_i w_i * x_i with w dequantized as ggml
 * does and x as prepared by quant_act_prepare(); an optimized kernel may only differ in the order
 * of float additions.
 */
#include "infer/quant/quant.h"
#include "common/common.h"

#include <math.h>
#include <string.h>

/* ---- scalar conversions ------------------------------------------------------------------- */

float quant_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
	if (exp == 0) {
		if (man == 0) {
			bits = sign;
		} else { /* subnormal: normalise */
			int e = -1;
			do {
				e++;
				man <<= 1;
			} while (!(man & 0x400));
			man &= 0x3ff;
			bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
		}
	} else if (exp == 31) {
		bits = sign | 0x7f800000u | (man << 13);
	} else {
		bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
	}
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t quant_f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint32_t sign = (x >> 16) & 0x8000;
	int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
	uint32_t man = x & 0x7fffff;
	if (((x >> 23) & 0xff) == 0xff) /* inf / nan */
		return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
	if (exp >= 31)
		return (uint16_t)(sign | 0x7c00);
	if (exp <= 0) { /* subnormal or zero, round to nearest even */
		if (exp < -10)
			return (uint16_t)sign;
		man |= 0x800000;
		int shift = 14 - exp;
		uint32_t h = man >> shift, rem = man & ((1u << shift) - 1),
			 half = 1u << (shift - 1);
		if (rem > half || (rem == half && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	uint32_t h = ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
		h++; /* may carry into the exponent, which is the right result */
	return (uint16_t)(sign | h);
}

float quant_bf16_to_f32(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t quant_f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	if ((x & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((x >> 16) | 0x40);
	x += 0x7fff + ((x >> 16) & 1);
	return (uint16_t)(x >> 16);
}

/* ---- K-quant scale packing ---------------------------------------------------------------- */

void quant_k4_scales_pack(const int *sc, const int *m, uint8_t *s)
{
	for (int j = 0; j < 4; j++) {
		s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
		s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
		s[j + 8] = (uint8_t)((sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4));
	}
}

/* ---- reference dequantize ----------------------------------------------------------------- */

static void dequant_q4k_block(const blk_q4_k *b, float *y)
{
	float d = quant_f16_to_f32(b->d), dmin = quant_f16_to_f32(b->dmin);
	const uint8_t *q = b->qs;
	for (int c = 0; c < 4; c++, q += 32, y += 64) {
		int sc0, m0, sc1, m1;
		quant_k4_scale_min(2 * c, b->scales, &sc0, &m0);
		quant_k4_scale_min(2 * c + 1, b->scales, &sc1, &m1);
		for (int l = 0; l < 32; l++) {
			y[l] = d * (float)sc0 * (float)(q[l] & 0xf) - dmin * (float)m0;
			y[l + 32] = d * (float)sc1 * (float)(q[l] >> 4) - dmin * (float)m1;
		}
	}
}

/* Q6_K element e (0..255) of a block: half h = e/128, l = e%32, k = (e%128)/32 selects the
 * nibble (k&2: high nibble; k&1: ql[l+32]) and the 2-bit group k of qh[l]. */
static inline int q6k_get(const blk_q6_k *b, int e)
{
	int h = e / 128, r = e % 128, k = r / 32, l = r % 32;
	const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
	int lo = (k & 1) ? ql[l + 32] : ql[l];
	lo = (k & 2) ? lo >> 4 : lo & 0xf;
	int hi = (qh[l] >> (2 * k)) & 3;
	return (lo | (hi << 4)) - 32;
}

static void dequant_q6k_block(const blk_q6_k *b, float *y)
{
	float d = quant_f16_to_f32(b->d);
	for (int e = 0; e < QK_K; e++)
		y[e] = d * (float)b->scales[e / 16] * (float)q6k_get(b, e);
}

void quant_dequant_row(int t, const void *src, float *dst, int64_t n)
{
	switch (t) {
	case QT_F32: memcpy(dst, src, (size_t)n * 4); break;
	case QT_F16: {
		const uint16_t *s = src;
		for (int64_t i = 0; i < n; i++)
			dst[i] = quant_f16_to_f32(s[i]);
		break;
	}
	case QT_BF16: {
		const uint16_t *s = src;
		for (int64_t i = 0; i < n; i++)
			dst[i] = quant_bf16_to_f32(s[i]);
		break;
	}
	case QT_Q8_0: {
		const blk_q8_0 *b = src;
		for (int64_t i = 0; i < n / QK8_0; i++) {
			float d = quant_f16_to_f32(b[i].d);
			for (int j = 0; j < QK8_0; j++)
				dst[i * QK8_0 + j] = d * (float)b[i].q[j];
		}
		break;
	}
	case QT_Q4_0: {
		const blk_q4_0 *b = src;
		for (int64_t i = 0; i < n / QK4_0; i++) {
			float d = quant_f16_to_f32(b[i].d);
			for (int j = 0; j < 16; j++) {
				dst[i * 32 + j] = d * (float)((b[i].qs[j] & 0xf) - 8);
				dst[i * 32 + j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
			}
		}
		break;
	}
	case QT_Q4_K: {
		const blk_q4_k *b = src;
		for (int64_t i = 0; i < n / QK_K; i++)
			dequant_q4k_block(&b[i], dst + i * QK_K);
		break;
	}
	case QT_Q6_K: {
		const blk_q6_k *b = src;
		for (int64_t i = 0; i < n / QK_K; i++)
			dequant_q6k_block(&b[i], dst + i * QK_K);
		break;
	}
	case QT_MXFP4: quant_mxfp4_dequant(src, dst, n); break;
	default: quant_lowbit_dequant(t, src, dst, n);
	}
}

/* ---- quantize ----------------------------------------------------------------------------- */

static inline int nearest(float x)
{
	return (int)lrintf(x);
}

/* max(m, |v|) without a libm call (the activation quantizer runs for every matvec) */
static inline float absmax(float m, float v)
{
	float a = v < 0 ? -v : v;
	return a > m ? a : m;
}

static void quantize_q8_0(const float *x, blk_q8_0 *b, int64_t n)
{
	for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
		float amax = 0;
		for (int j = 0; j < QK8_0; j++)
			amax = absmax(amax, x[j]);
		float d = amax / 127.f, id = d ? 1.f / d : 0.f;
		b[i].d = quant_f32_to_f16(d);
		for (int j = 0; j < QK8_0; j++)
			b[i].q[j] = (int8_t)nearest(x[j] * id);
	}
}

static void quantize_q4_0(const float *x, blk_q4_0 *b, int64_t n)
{
	for (int64_t i = 0; i < n / QK4_0; i++, x += QK4_0) {
		float amax = 0, max = 0; /* the value of largest magnitude maps to -8 */
		for (int j = 0; j < QK4_0; j++)
			if (fabsf(x[j]) > amax) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		float d = max / -8.f, id = d ? 1.f / d : 0.f;
		b[i].d = quant_f32_to_f16(d);
		for (int j = 0; j < 16; j++) {
			int a = MIN(15, MAX(0, nearest(x[j] * id) + 8));
			int c = MIN(15, MAX(0, nearest(x[j + 16] * id) + 8));
			b[i].qs[j] = (uint8_t)(a | (c << 4));
		}
	}
}

void quant_subblock_ranges(const float *x, int nsub, int len, float levels, float *scale,
			   float *minv, float *smax, float *mmax)
{
	*smax = *mmax = 0;
	for (int j = 0; j < nsub; j++) {
		float lo = 0, hi = 0;
		for (int l = 0; l < len; l++) {
			lo = fminf(lo, x[len * j + l]);
			hi = fmaxf(hi, x[len * j + l]);
		}
		scale[j] = (hi - lo) / levels;
		minv[j] = -lo;
		*smax = fmaxf(*smax, scale[j]);
		*mmax = fmaxf(*mmax, minv[j]);
	}
}

/* A simple (not ggml's optimal-search) Q4_K quantizer: per 32-element sub-block, min = min(0,
 * min x) and scale = (max - min) / 15, both then quantized to 6 bits against the super-scales. */
static void quantize_q4_k(const float *x, blk_q4_k *b, int64_t n)
{
	for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float scale[8], minv[8], smax, mmax;
		quant_subblock_ranges(x, 8, 32, 15.f, scale, minv, &smax, &mmax);
		float d = smax / 63.f, dmin = mmax / 63.f;
		b[i].d = quant_f32_to_f16(d);
		b[i].dmin = quant_f32_to_f16(dmin);
		d = quant_f16_to_f32(b[i].d);
		dmin = quant_f16_to_f32(b[i].dmin);
		int sc[8], m[8];
		for (int j = 0; j < 8; j++) {
			sc[j] = d ? MIN(63, nearest(scale[j] / d)) : 0;
			m[j] = dmin ? MIN(63, nearest(minv[j] / dmin)) : 0;
		}
		quant_k4_scales_pack(sc, m, b[i].scales);
		for (int c = 0; c < 4; c++) {
			for (int l = 0; l < 32; l++) {
				int qv[2];
				for (int s = 0; s < 2; s++) {
					int j = 2 * c + s;
					float ds = d * (float)sc[j], off = dmin * (float)m[j];
					int q = ds ? nearest((x[32 * j + l] + off) / ds) : 0;
					qv[s] = MIN(15, MAX(0, q));
				}
				b[i].qs[32 * c + l] = (uint8_t)(qv[0] | (qv[1] << 4));
			}
		}
	}
}

static void quantize_q6_k(const float *x, blk_q6_k *b, int64_t n)
{
	for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float gs[16], gmax = 0;
		for (int g = 0; g < 16; g++) {
			float amax = 0;
			for (int l = 0; l < 16; l++)
				amax = absmax(amax, x[16 * g + l]);
			gs[g] = amax / 31.f;
			gmax = fmaxf(gmax, gs[g]);
		}
		float d = gmax / 127.f;
		b[i].d = quant_f32_to_f16(d);
		d = quant_f16_to_f32(b[i].d);
		int q[QK_K];
		for (int g = 0; g < 16; g++) {
			int s = d ? MIN(127, nearest(gs[g] / d)) : 0;
			b[i].scales[g] = (int8_t)s;
			float ds = d * (float)s;
			for (int l = 0; l < 16; l++) {
				int v = ds ? nearest(x[16 * g + l] / ds) : 0;
				q[16 * g + l] = MIN(31, MAX(-32, v)) + 32;
			}
		}
		memset(b[i].ql, 0, sizeof b[i].ql);
		memset(b[i].qh, 0, sizeof b[i].qh);
		for (int e = 0; e < QK_K; e++) { /* the inverse of q6k_get() */
			int h = e / 128, r = e % 128, k = r / 32, l = r % 32;
			uint8_t *ql = b[i].ql + 64 * h + ((k & 1) ? l + 32 : l);
			*ql |= (uint8_t)((q[e] & 0xf) << ((k & 2) ? 4 : 0));
			b[i].qh[32 * h + l] |= (uint8_t)((q[e] >> 4) << (2 * k));
		}
	}
}

/* Q8_K activation layout: q[n] int8, d[n/256] float, bsums[n/16] int16. */
/* As ggml's quantize_row_q8_K_ref (ggml-quants.c), which every CPU target of ggml runs for the
 * K-quants' activations: the signed value of largest magnitude (the first of equal ones) sets
 * iscale = -127 / max, each value is nearest(iscale * x) (ties to even) capped at 127, and
 * d = 1 / iscale stays F32 (negative when max is: q * d has x's sign), so the integer dots are
 * llama.cpp's. An all-zero block is d = 0, q = 0. */
static void quantize_q8_k(const float *x, int8_t *q, float *d, int16_t *bsums, int64_t n)
{
	for (int64_t i = 0; i < n / QK_K; i++) {
		const float *xb = x + i * QK_K;
		float amax = 0, max = 0;
		for (int j = 0; j < QK_K; j++)
			if (fabsf(xb[j]) > amax)
				amax = fabsf(xb[j]), max = xb[j];
		float is = amax ? -127.f / max : 0.f;
		d[i] = amax ? 1.f / is : 0.f;
		for (int j = 0; j < QK_K; j++)
			q[i * QK_K + j] = (int8_t)MIN(127, nearest(xb[j] * is));
		for (int g = 0; g < 16; g++) {
			int sum = 0;
			for (int l = 0; l < 16; l++)
				sum += q[i * QK_K + 16 * g + l];
			bsums[i * 16 + g] = (int16_t)sum;
		}
	}
}

static int quant_use_ref; /* set once by quant_init before threads start */

int quant_quantize_row(int t, const float *src, void *dst, int64_t n)
{
	switch (t) {
	case QT_F32: memcpy(dst, src, (size_t)n * 4); return 0;
	case QT_F16:
		if (!quant_use_ref && quant_x86_f16_row()) {
			quant_x86_f16_row()(src, dst, n);
			return 0;
		}
		for (int64_t i = 0; i < n; i++)
			((uint16_t *)dst)[i] = quant_f32_to_f16(src[i]);
		return 0;
	case QT_BF16:
		for (int64_t i = 0; i < n; i++)
			((uint16_t *)dst)[i] = quant_f32_to_bf16(src[i]);
		return 0;
	case QT_Q8_0: quantize_q8_0(src, dst, n); return 0;
	case QT_Q4_0: quantize_q4_0(src, dst, n); return 0;
	case QT_Q4_K: quantize_q4_k(src, dst, n); return 0;
	case QT_Q6_K: quantize_q6_k(src, dst, n); return 0;
	case QT_MXFP4: quant_mxfp4_quantize(src, dst, n); return 0;
	default: return quant_lowbit_quantize(t, src, dst, n);
	}
}

/* ---- activations -------------------------------------------------------------------------- */

static int act_type_of(int wtype)
{
	switch (wtype) {
	case QT_Q8_0:
	case QT_Q4_0:
	case QT_Q5_0:
	case QT_Q5_1:
	case QT_MXFP4: return QT_Q8_0;
	case QT_Q2_K:
	case QT_Q3_K:
	case QT_Q4_K:
	case QT_Q5_K:
	case QT_Q6_K: return QT_Q8_K;
	default: return QT_F32;
	}
}

size_t quant_act_bytes(int wtype, int n)
{
	switch (act_type_of(wtype)) {
	case QT_Q8_0: return (size_t)n + (size_t)(n / QK8_0) * 6;
	case QT_Q8_K: return (size_t)n + (size_t)(n / QK_K) * 4 + (size_t)(n / 16) * 2;
	default: return 0;
	}
}

void quant_act_prepare(int wtype, const float *x, int n, void *buf, quant_act_t *a)
{
	memset(a, 0, sizeof *a);
	a->type = act_type_of(wtype);
	uint8_t *p = buf;
	quant_act_q8_0_fn fast = quant_use_ref ? NULL : quant_x86_act_q8_0();
	if (!fast && !quant_use_ref)
		fast = quant_neon_act_q8_0();
	if (a->type == QT_Q8_0 && fast) {
		a->q = (int8_t *)p;
		a->d = (float *)(p + n);
		a->bsums = (int16_t *)(p + n + (n / QK8_0) * 4);
		fast(x, n, (int8_t *)a->q, (float *)a->d, (int16_t *)a->bsums);
	} else if (a->type == QT_Q8_0) {
		/* as ggml's quantize_row_q8_0_ref (ggml-quants.c), which its CPU backend runs where
		 * it has no SIMD version: the scale kept as F16 (block_q8_0.d), the values
		 * multiplied by 1 / d and rounded half away from zero (roundf) */
		int8_t *q = (int8_t *)p;
		float *d = (float *)(p + n);
		int16_t *bs = (int16_t *)(p + n + (n / QK8_0) * 4);
		for (int i = 0; i < n / QK8_0; i++) {
			const float *xb = x + i * QK8_0;
			float amax = 0;
			for (int j = 0; j < QK8_0; j++)
				amax = absmax(amax, xb[j]);
			float s = amax / 127.f, is = s ? 1.f / s : 0.f;
			d[i] = quant_f16_to_f32(quant_f32_to_f16(s));
			int sum = 0;
			for (int j = 0; j < QK8_0; j++) {
				q[i * QK8_0 + j] = (int8_t)roundf(xb[j] * is);
				sum += q[i * QK8_0 + j];
			}
			bs[i] = (int16_t)sum;
		}
		a->q = q;
		a->d = d;
		a->bsums = bs;
	} else if (a->type == QT_Q8_K) {
		int8_t *q = (int8_t *)p;
		float *d = (float *)(p + n);
		int16_t *bs = (int16_t *)(p + n + (n / QK_K) * 4);
		quant_act_q8_0_fn fast_k = quant_use_ref ? NULL : quant_x86_act_q8_k();
		if (fast_k)
			fast_k(x, n, q, d, bs);
		else
			quantize_q8_k(x, q, d, bs, n);
		a->q = q;
		a->d = d;
		a->bsums = bs;
	} else {
		a->f = x;
	}
}

quant_act_t quant_act_slice(const quant_act_t *a, int col0)
{
	quant_act_t s = *a;
	if (a->type == QT_Q8_0) {
		s.q += col0;
		s.d += col0 / QK8_0;
		s.bsums += col0 / QK8_0;
	} else if (a->type == QT_Q8_K) {
		s.q += col0;
		s.d += col0 / QK_K;
		s.bsums += col0 / 16;
	} else {
		s.f += col0;
	}
	return s;
}

/* ---- reference kernels -------------------------------------------------------------------- */

static void ref_rows_f32(float *out, const uint8_t *w, size_t stride, int nrows,
			 const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const float *row = (const float *)(w + r * stride);
		float s = 0;
		for (int i = 0; i < n; i++)
			s += row[i] * x->f[i];
		out[r] = s;
	}
}

static void ref_rows_f16(float *out, const uint8_t *w, size_t stride, int nrows,
			 const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const uint16_t *row = (const uint16_t *)(w + r * stride);
		float s = 0;
		for (int i = 0; i < n; i++)
			s += quant_f16_to_f32(row[i]) * x->f[i];
		out[r] = s;
	}
}

static void ref_rows_bf16(float *out, const uint8_t *w, size_t stride, int nrows,
			  const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const uint16_t *row = (const uint16_t *)(w + r * stride);
		float s = 0;
		for (int i = 0; i < n; i++)
			s += quant_bf16_to_f32(row[i]) * x->f[i];
		out[r] = s;
	}
}

static void ref_rows_q8_0(float *out, const uint8_t *w, size_t stride, int nrows,
			  const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const blk_q8_0 *b = (const blk_q8_0 *)(w + r * stride);
		float s = 0;
		for (int i = 0; i < n / QK8_0; i++) {
			int sum = 0;
			for (int j = 0; j < QK8_0; j++)
				sum += b[i].q[j] * x->q[i * QK8_0 + j];
			s += quant_f16_to_f32(b[i].d) * x->d[i] * (float)sum;
		}
		out[r] = s;
	}
}

static void ref_rows_q4_0(float *out, const uint8_t *w, size_t stride, int nrows,
			  const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const blk_q4_0 *b = (const blk_q4_0 *)(w + r * stride);
		float s = 0;
		for (int i = 0; i < n / QK4_0; i++) {
			const int8_t *q = x->q + i * QK4_0;
			int sum = 0;
			for (int j = 0; j < 16; j++)
				sum += ((b[i].qs[j] & 0xf) - 8) * q[j] +
				       ((b[i].qs[j] >> 4) - 8) * q[j + 16];
			s += quant_f16_to_f32(b[i].d) * x->d[i] * (float)sum;
		}
		out[r] = s;
	}
}

static void ref_rows_q4_k(float *out, const uint8_t *w, size_t stride, int nrows,
			  const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const blk_q4_k *b = (const blk_q4_k *)(w + r * stride);
		float s = 0;
		for (int i = 0; i < n / QK_K; i++) {
			const int8_t *q = x->q + i * QK_K;
			const int16_t *bs = x->bsums + i * 16;
			int acc = 0, macc = 0;
			for (int c = 0; c < 4; c++) {
				int sc0, m0, sc1, m1, s0 = 0, s1 = 0;
				quant_k4_scale_min(2 * c, b[i].scales, &sc0, &m0);
				quant_k4_scale_min(2 * c + 1, b[i].scales, &sc1, &m1);
				for (int l = 0; l < 32; l++) {
					s0 += (b[i].qs[32 * c + l] & 0xf) * q[64 * c + l];
					s1 += (b[i].qs[32 * c + l] >> 4) * q[64 * c + 32 + l];
				}
				acc += sc0 * s0 + sc1 * s1;
				macc += m0 * (bs[4 * c] + bs[4 * c + 1]) +
					m1 * (bs[4 * c + 2] + bs[4 * c + 3]);
			}
			s += x->d[i] * (quant_f16_to_f32(b[i].d) * (float)acc -
					quant_f16_to_f32(b[i].dmin) * (float)macc);
		}
		out[r] = s;
	}
}

static void ref_rows_q6_k(float *out, const uint8_t *w, size_t stride, int nrows,
			  const quant_act_t *x, int n)
{
	for (int r = 0; r < nrows; r++) {
		const blk_q6_k *b = (const blk_q6_k *)(w + r * stride);
		float s = 0;
		for (int i = 0; i < n / QK_K; i++) {
			const int8_t *q = x->q + i * QK_K;
			int acc = 0;
			for (int g = 0; g < 16; g++) {
				int sum = 0;
				for (int l = 0; l < 16; l++)
					sum += q6k_get(&b[i], 16 * g + l) * q[16 * g + l];
				acc += b[i].scales[g] * sum;
			}
			s += x->d[i] * quant_f16_to_f32(b[i].d) * (float)acc;
		}
		out[r] = s;
	}
}

/* vsum: every row dequantized exactly as quant_dequant_row() does, then added in t order. */
static void ref_vsum_f32(float *o, const float *a, const uint8_t *v, size_t stride, int T, int n)
{
	for (int t = 0; t < T; t++) {
		const float *row = (const float *)(v + (size_t)t * stride);
		for (int i = 0; i < n; i++)
			o[i] += a[t] * row[i];
	}
}

static void ref_vsum_f16(float *o, const float *a, const uint8_t *v, size_t stride, int T, int n)
{
	for (int t = 0; t < T; t++) {
		const uint16_t *row = (const uint16_t *)(v + (size_t)t * stride);
		for (int i = 0; i < n; i++)
			o[i] += a[t] * quant_f16_to_f32(row[i]);
	}
}

static void ref_vsum_q8_0(float *o, const float *a, const uint8_t *v, size_t stride, int T, int n)
{
	for (int t = 0; t < T; t++) {
		const blk_q8_0 *b = (const blk_q8_0 *)(v + (size_t)t * stride);
		for (int i = 0; i < n / QK8_0; i++) {
			float s = a[t] * quant_f16_to_f32(b[i].d);
			for (int j = 0; j < QK8_0; j++)
				o[i * QK8_0 + j] += s * (float)b[i].q[j];
		}
	}
}

#define REF_DEQUANT(name, t)                                                                       \
	static void name(const void *src, float *dst, int n)                                       \
	{                                                                                          \
		quant_dequant_row(t, src, dst, n);                                                 \
	}
REF_DEQUANT(ref_dq_f32, QT_F32)
REF_DEQUANT(ref_dq_f16, QT_F16)
REF_DEQUANT(ref_dq_bf16, QT_BF16)
REF_DEQUANT(ref_dq_q8_0, QT_Q8_0)
REF_DEQUANT(ref_dq_q4_0, QT_Q4_0)
REF_DEQUANT(ref_dq_q4_k, QT_Q4_K)
REF_DEQUANT(ref_dq_q6_k, QT_Q6_K)

static const quant_ops_t ref_f32 = {"ref", QT_F32, ref_rows_f32, ref_dq_f32, NULL};
static const quant_ops_t ref_f16 = {"ref", QT_F32, ref_rows_f16, ref_dq_f16, NULL};
static const quant_ops_t ref_bf16 = {"ref", QT_F32, ref_rows_bf16, ref_dq_bf16, NULL};
static const quant_ops_t ref_q8_0 = {"ref", QT_Q8_0, ref_rows_q8_0, ref_dq_q8_0, NULL};
static const quant_ops_t ref_q4_0 = {"ref", QT_Q8_0, ref_rows_q4_0, ref_dq_q4_0, NULL};
static const quant_ops_t ref_q4_k = {"ref", QT_Q8_K, ref_rows_q4_k, ref_dq_q4_k, NULL};
static const quant_ops_t ref_q6_k = {"ref", QT_Q8_K, ref_rows_q6_k, ref_dq_q6_k, NULL};

const quant_ops_t *quant_ops_ref(int wtype)
{
	switch (wtype) {
	case QT_F32: return &ref_f32;
	case QT_F16: return &ref_f16;
	case QT_BF16: return &ref_bf16;
	case QT_Q8_0: return &ref_q8_0;
	case QT_Q4_0: return &ref_q4_0;
	case QT_Q4_K: return &ref_q4_k;
	case QT_Q6_K: return &ref_q6_k;
	case QT_MXFP4: return quant_mxfp4_ops_ref();
	default: return quant_lowbit_ops_ref(wtype);
	}
}

const quant_ops_t *quant_ops_opt(int wtype)
{
	const quant_ops_t *o = quant_x86_ops(wtype);
	if (!o)
		o = quant_lowbit_x86_ops(wtype);
	if (!o)
		o = quant_neon_ops(wtype);
	if (!o && wtype == QT_MXFP4)
		o = quant_mxfp4_x86_ops();
	return o ? o : quant_ops_ref(wtype);
}

static void ref_wsum(float *o, const float *a, const float *v, size_t stride, int T, int n)
{
	memset(o, 0, (size_t)n * sizeof *o);
	for (int t = 0; t < T; t++)
		for (int i = 0; i < n; i++)
			o[i] += a[t] * v[(size_t)t * stride + i];
}

quant_wsum_fn quant_wsum(void)
{
	quant_wsum_fn f = quant_use_ref ? NULL : quant_x86_wsum();
	return f ? f : ref_wsum;
}

quant_vsum_fn quant_vsum_ref(int type)
{
	switch (type) {
	case QT_F32: return ref_vsum_f32;
	case QT_F16: return ref_vsum_f16;
	case QT_Q8_0: return ref_vsum_q8_0;
	default: return NULL;
	}
}

quant_vsum_fn quant_vsum(int type)
{
	quant_vsum_fn f = quant_use_ref ? NULL : quant_x86_vsum(type);
	return f ? f : quant_vsum_ref(type);
}

static void ref_qkt(float *s, const float *const *q, int nq, const float *kt, int hd)
{
	for (int j = 0; j < nq; j++) {
		for (int t = 0; t < 64; t++)
			s[64 * j + t] = 0;
		for (int i = 0; i < hd; i++)
			for (int t = 0; t < 64; t++)
				s[64 * j + t] += q[j][i] * kt[i * 64 + t];
	}
}

quant_qkt_fn quant_qkt_ref(void)
{
	return ref_qkt;
}

quant_qkt_fn quant_qkt(void)
{
	quant_qkt_fn f = quant_use_ref ? NULL : quant_x86_qkt();
	return f ? f : ref_qkt;
}

static void ref_av(float *const *o, const float *a, int nq, const float *v, size_t stride, int T,
		   int n)
{
	for (int j = 0; j < nq; j++)
		for (int t = 0; t < T; t++)
			for (int i = 0; i < n; i++)
				o[j][i] += a[64 * j + t] * v[(size_t)t * stride + i];
}

quant_av_fn quant_av_ref(void)
{
	return ref_av;
}

quant_av_fn quant_av(void)
{
	quant_av_fn f = quant_use_ref ? NULL : quant_x86_av();
	return f ? f : ref_av;
}

static float ref_expsum(float *x, int n, float mx)
{
	float sum = 0;
	for (int i = 0; i < n; i++) {
		x[i] = expf(x[i] - mx);
		sum += x[i];
	}
	return sum;
}

quant_expsum_fn quant_expsum(void)
{
	quant_expsum_fn f = quant_use_ref ? NULL : quant_x86_expsum();
	return f ? f : ref_expsum;
}

const char *quant_init(int force_ref)
{
	quant_use_ref = force_ref;
	const quant_ops_t *o = quant_ops(QT_Q8_0);
	return o->impl;
}

int quant_ref_forced(void)
{
	return quant_use_ref;
}

const quant_ops_t *quant_ops(int wtype)
{
	return quant_use_ref ? quant_ops_ref(wtype) : quant_ops_opt(wtype);
}
