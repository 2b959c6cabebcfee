/*
 * quant.h: ggml weight block formats and the matrix-vector kernels that read them (internal to
 * infer/).
 *
 * Weights stay in their file format (memory-mapped); kernels take a row of blocks and an
 * activation vector prepared once per matvec by quant_act_prepare(): 8-bit blocks for the
 * quantized types (so the inner loops are integer dot products), plain F32 for F32/F16/BF16.
 * Every weight type has one table of function pointers (quant_ops_t); the table in use is chosen
 * once at start (AVX2/FMA when the CPU has them, NEON on aarch64, else the plain C reference), and
 * the reference table stays reachable for tests.
 *
 * Invariant: a row of n elements of type t is quant_row_bytes(t, n) bytes of whole blocks; a
 * column range used for sharding starts and ends on a block boundary, so each row's slice is a
 * contiguous run of blocks (quant_act_t pointers are advanced by quant_act_slice()).
 *
 * Threads: everything here is pure or read-only after quant_init(); call quant_init() once
 * before starting threads (eng_open does).
 */
#ifndef SHOAL_QUANT_H
#define SHOAL_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* ggml type numbers (as stored in GGUF). QT_Q8_K is only an activation format here. */
enum qtype {
	QT_F32 = 0,
	QT_F16 = 1,
	QT_Q4_0 = 2,
	QT_Q5_0 = 6,
	QT_Q5_1 = 7,
	QT_Q8_0 = 8,
	QT_Q2_K = 10,
	QT_Q3_K = 11,
	QT_Q4_K = 12,
	QT_Q5_K = 13,
	QT_Q6_K = 14,
	QT_Q8_K = 15,
	QT_BF16 = 30,
	QT_MXFP4 = 39,
	QT_NTYPES = 40 /* ggml's numbers stop below this (qtype.c's table) */
};

#define QK8_0 32
#define QK4_0 32
#define QK_K  256

typedef struct {
	uint16_t d; /* f16 scale */
	int8_t q[QK8_0];
} blk_q8_0;

typedef struct {
	uint16_t d;            /* f16 scale */
	uint8_t qs[QK4_0 / 2]; /* element j in the low nibble of qs[j], j+16 in the high nibble */
} blk_q4_0;

typedef struct {
	uint16_t d;           /* f16 super-scale of the 6-bit scales */
	uint16_t dmin;        /* f16 super-scale of the 6-bit mins */
	uint8_t scales[12];   /* 8 x (6-bit scale, 6-bit min), packed (see quant.c) */
	uint8_t qs[QK_K / 2]; /* 64-element chunk c: low nibbles = sub-block 2c, high = 2c+1 */
} blk_q4_k;

typedef struct {
	uint8_t ql[QK_K / 2];     /* low 4 bits */
	uint8_t qh[QK_K / 4];     /* high 2 bits */
	int8_t scales[QK_K / 16]; /* one 8-bit scale per 16 elements */
	uint16_t d;               /* f16 super-scale */
} blk_q6_k;

/* The low-bit types (quant_lowbit.c), as ggml/src/ggml-common.h lays them out. */
typedef struct {
	uint16_t d;     /* f16 scale */
	uint8_t qh[4];  /* fifth bits, element j at bit j of the little-endian uint32 */
	uint8_t qs[16]; /* element j in the low nibble of qs[j], j+16 in the high nibble */
} blk_q5_0;

typedef struct {
	uint16_t d, m; /* f16 scale and offset: x = d * q + m */
	uint8_t qh[4];
	uint8_t qs[16];
} blk_q5_1;

typedef struct {
	uint8_t scales[QK_K / 16]; /* per 16 elements: 4-bit scale (low), 4-bit min (high) */
	uint8_t qs[QK_K / 4];      /* 2-bit values, four per byte (see quant_lowbit.c) */
	uint16_t d, dmin;          /* f16 super-scales of the scales and mins */
} blk_q2_k;

typedef struct {
	uint8_t hmask[QK_K / 8]; /* high bit of each 3-bit value (set = no -4) */
	uint8_t qs[QK_K / 4];    /* low 2 bits, as Q2_K */
	uint8_t scales[12];      /* 16 6-bit scales, stored + 32 */
	uint16_t d;              /* f16 super-scale */
} blk_q3_k;

typedef struct {
	uint16_t d, dmin;     /* f16 super-scales */
	uint8_t scales[12];   /* 8 x (6-bit scale, 6-bit min), packed as Q4_K's */
	uint8_t qh[QK_K / 8]; /* fifth bits */
	uint8_t qs[QK_K / 2]; /* low nibbles, as Q4_K */
} blk_q5_k;

/* MXFP4 (quant_mxfp4.c), as ggml/src/ggml-common.h block_mxfp4: 32 E2M1 values sharing one
 * power-of-two scale. Element j is value[qs[j] & 0xf] (j < 16) or value[qs[j - 16] >> 4], times
 * 2^(e - 128): quant_mxfp4_values holds the E2M1 values doubled (ggml's kvalues_mxfp4) and
 * quant_e8m0_half the scale halved (ggml_e8m0_to_fp32_half), so their product is the value. */
typedef struct {
	uint8_t e;      /* E8M0 exponent: 2^(e - 127) */
	uint8_t qs[16]; /* E2M1 codes: sign bit 3, magnitude index bits 0-2 */
} blk_mxfp4;

extern const int8_t quant_mxfp4_values[16]; /* 0 1 2 3 4 6 8 12, then the same negated */

/* 2^(e - 128) as ggml_e8m0_to_fp32_half computes it (e < 2: the subnormals 2^-128, 2^-127). */
static inline float quant_e8m0_half(uint8_t e)
{
	union {
		uint32_t u;
		float f;
	} v = {e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23};
	return v.f;
}

_Static_assert(sizeof(blk_mxfp4) == 17, "mxfp4 block");
_Static_assert(sizeof(blk_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(blk_q5_1) == 24, "q5_1 block");
_Static_assert(sizeof(blk_q2_k) == 84, "q2_k block");
_Static_assert(sizeof(blk_q3_k) == 110, "q3_k block");
_Static_assert(sizeof(blk_q5_k) == 176, "q5_k block");
_Static_assert(sizeof(blk_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(blk_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(blk_q4_k) == 144, "q4_k block");
_Static_assert(sizeof(blk_q6_k) == 210, "q6_k block");

/* An activation vector prepared for one weight type. For QT_Q8_0 activations: q[n], d[n/32]
 * and bsums[n/32] (sum of each block's q); for QT_Q8_K: q[n], d[n/256], bsums[n/16] (sum of
 * each 16 q's); for QT_F32: f[n]. */
typedef struct quant_act {
	int type;
	const int8_t *q;
	const float *d;
	const int16_t *bsums;
	const float *f;
} quant_act_t;

/* out[r] = dot(row r of w, x) for r in [0, nrows); rows are `stride` bytes apart, n elements
 * each (a whole number of blocks). */
typedef void (*quant_rows_fn)(float *out, const uint8_t *w, size_t stride, int nrows,
			      const quant_act_t *x, int n);

/* out[t * ldo + r] = dot(row r of w, x[t]) for r in [0, nrows), t in [0, nt) (nt <= 8): one
 * pass over the weights serves up to 8 activation vectors (prompt processing). */
typedef void (*quant_rows8_fn)(float *out, int ldo, const uint8_t *w, size_t stride, int nrows,
			       const quant_act_t *x, int nt, int n);

/* dst[n] = the n elements of one row (n a whole number of blocks). */
typedef void (*quant_dequant_fn)(const void *src, float *dst, int n);

typedef struct quant_ops {
	const char *impl;         /* "ref", "avx2", ... */
	int act_type;             /* activation format this type's kernels take */
	quant_rows_fn rows;       /* matvec over a row range */
	quant_dequant_fn dequant; /* row to F32; optional in optimized tables (NULL: use
				   * quant_ops_ref(t)->dequant) */
	quant_rows8_fn rows8;     /* optional: batched kernel, NULL = rows once per input. It
				   * sums in rows' order: an input's outputs are rows' bits,
				   * whatever else is in the call */
} quant_ops_t;

/* Q4_K / Q5_K scale packing: sub-block j's 6-bit scale and min. Bytes 0-3 hold scales 0-3 (low 6
 * bits) and the top 2 bits of scales 4-7; bytes 4-7 likewise for the mins; bytes 8-11 hold the
 * low 4 bits of scale 4+j (low nibble) and min 4+j (high nibble). */
static inline void quant_k4_scale_min(int j, const uint8_t *s, int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
		*m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
	}
}
/* Q3_K's 6-bit scale of group g (0..15), minus 32: low 4 bits in the nibbles of s[0..7], top 2
 * bits in s[8 + g%4] at bit 2*(g/4). */
static inline int quant_q3k_scale(const uint8_t *s, int g)
{
	int lo = g < 8 ? s[g] & 0xf : s[g - 8] >> 4;
	int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
	return (lo | hi << 4) - 32;
}
/* The inverse of quant_k4_scale_min: 8 scales and 8 mins (each 0..63) into the 12 bytes. */
void quant_k4_scales_pack(const int *sc, const int *m, uint8_t *s);

/* The low-bit types (quant_lowbit.c): reference dequantize, quantize and kernel tables for
 * Q5_0, Q5_1, Q2_K, Q3_K and Q5_K (quant.c's generic entry points route to them). */
void quant_lowbit_dequant(int t, const void *src, float *dst, int64_t n);
int quant_lowbit_quantize(int t, const float *src, void *dst, int64_t n);
const quant_ops_t *quant_lowbit_ops_ref(int t);
/* Their AVX2 tables (quant_lowbit_x86.c); NULL when the CPU lacks AVX2/FMA or off x86. */
const quant_ops_t *quant_lowbit_x86_ops(int t);

/* MXFP4 (quant_mxfp4.c): reference dequantize, quantize (ggml's quantize_row_mxfp4_ref, byte
 * for byte) and the plain C kernel table (Q8_0 activations); the x86 table (quant_mxfp4_x86.c:
 * AVX-512 VNNI, AVX2), NULL where not available (NEON: quant_neon_ops). */
void quant_mxfp4_dequant(const void *src, float *dst, int64_t n);
void quant_mxfp4_quantize(const float *src, void *dst, int64_t n);
const quant_ops_t *quant_mxfp4_ops_ref(void);
const quant_ops_t *quant_mxfp4_x86_ops(void);

/* fp16 / bf16 helpers (plain C, exact). */
float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f);
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);

/* Type facts, from the one table (qtype.c) of every ggml type number. */
int quant_type_known(int t);              /* 1 when its block size is known (a file's tensors
					   * of it can be sized and described) */
int quant_type_supported(int t);          /* 1 when the engine computes with it (weights) */
const char *quant_type_name(int t);       /* "q8_0", ...; "?" when unknown */
const char *quant_type_ggml_name(int t);  /* ggml's spelling, "Q8_0"; "?" when unknown */
int quant_type_parse(const char *s);      /* a supported type's name (any case) -> type, or -1 */
int quant_block_elems(int t);             /* elements per block (1 for float types); 0 unknown */
size_t quant_block_bytes(int t);          /* bytes per block; 0 unknown */
size_t quant_row_bytes(int t, int64_t n); /* 0 unless n is a whole number of known blocks */

/* Reference dequantize of n elements (a multiple of the block size). */
void quant_dequant_row(int t, const void *src, float *dst, int64_t n);
/* Quantize n elements; every weight type above plus QT_Q8_K is supported. Returns 0, or
 * SH_EUNSUPP for a type that cannot be written. */
int quant_quantize_row(int t, const float *src, void *dst, int64_t n);

/* Picks the kernel tables (best the CPU supports). force_ref=1 keeps the plain C ones.
 * Returns the implementation name. Call once, before threads start. */
const char *quant_init(int force_ref);
int quant_ref_forced(void);                  /* 1 when quant_init(1) asked for plain C only */
const quant_ops_t *quant_ops(int wtype);     /* chosen table, NULL for unsupported types */
const quant_ops_t *quant_ops_ref(int wtype); /* plain C table */
const quant_ops_t *quant_ops_opt(int wtype); /* optimized table when the CPU has one, else ref */

/* Activation scratch: bytes needed to prepare n floats for weights of type wtype. */
size_t quant_act_bytes(int wtype, int n);
/* Prepares x[n] into buf (quant_act_bytes long, 32-byte aligned is best); a is filled with
 * pointers into buf (or to x itself for F32 activations, so x must outlive a). */
void quant_act_prepare(int wtype, const float *x, int n, void *buf, quant_act_t *a);
/* The activation restricted to columns [col0, ...) (col0 a multiple of the block size). */
quant_act_t quant_act_slice(const quant_act_t *a, int col0);

/* o[i] = sum over t < T of a[t] * v[t * stride + i], i < n (attention's weighted sum of values;
 * stride in floats). Best available version. */
typedef void (*quant_wsum_fn)(float *o, const float *a, const float *v, size_t stride, int T,
			      int n);
quant_wsum_fn quant_wsum(void);
quant_wsum_fn quant_x86_wsum(void); /* NULL when unavailable */

/* o[i] += sum over t < T of a[t] * v_t[i] for i < n, where v_t is the row of n elements of type
 * t at v + t * stride bytes (attention's weighted sum of values read straight from a KV cache of
 * that type; n whole blocks). quant_vsum(): best available for QT_F32, QT_F16, QT_Q8_0, NULL for
 * other types; quant_vsum_ref(): the plain C one. */
typedef void (*quant_vsum_fn)(float *o, const float *a, const uint8_t *v, size_t stride, int T,
			      int n);
quant_vsum_fn quant_vsum(int type);
quant_vsum_fn quant_vsum_ref(int type);
quant_vsum_fn quant_x86_vsum(int type); /* NULL when unavailable */

/* Attention over one tile of 64 keys for nq <= 4 queries sharing it (the query heads of one KV
 * head): qkt: s[j * 64 + t] = sum over i < hd of q[j][i] * kt[i * 64 + t] (the keys stored
 * transposed, [hd][64]: no horizontal sum per key); av: o[j][i] += sum over t < T of
 * a[j * 64 + t] * v[t * stride + i] for i < n (T <= 64, stride in floats). Each tile element
 * loaded serves all nq queries. */
typedef void (*quant_qkt_fn)(float *s, const float *const *q, int nq, const float *kt, int hd);
typedef void (*quant_av_fn)(float *const *o, const float *a, int nq, const float *v, size_t stride,
			    int T, int n);
quant_qkt_fn quant_qkt(void);
quant_qkt_fn quant_qkt_ref(void);
quant_qkt_fn quant_x86_qkt(void); /* NULL when unavailable */
quant_av_fn quant_av(void);
quant_av_fn quant_av_ref(void);
quant_av_fn quant_x86_av(void); /* NULL when unavailable */

/* x[i] = exp(x[i] - mx) for i < n, returns the sum (softmax numerators; relative error of the
 * optimized version < 2e-7). */
typedef float (*quant_expsum_fn)(float *x, int n, float mx);
quant_expsum_fn quant_expsum(void);
quant_expsum_fn quant_x86_expsum(void); /* NULL when unavailable */

/* F32 -> F16 of x[n] by the CPU's conversion (round to nearest even, as quant_f32_to_f16; NaNs
 * stay NaNs), or NULL. quant_quantize_row(QT_F16) uses it. */
typedef void (*quant_f16_row_fn)(const float *x, uint16_t *y, int64_t n);
quant_f16_row_fn quant_x86_f16_row(void);

/* Q8_0 activation blocks of x[n]: q[n], d[n/32] (each an F16 value: ggml's block_q8_0.d),
 * bsums[n/32], bit for bit what llama.cpp's CPU backend computes on the same machine, so that
 * Q8_0/Q4_0/MXFP4 log-probabilities can equal its. Each path follows ggml's own for that target,
 * and they differ from each other at halves and where the multipliers round apart:
 *   plain C (quant.c; also under quant_init(1)): quantize_row_q8_0_ref (ggml-quants.c):
 *     q = roundf(x * (1 / d)), halves away from zero;
 *   x86 (AVX2): quantize_row_q8_0 (ggml-cpu/arch/x86/quants.c): q = round-to-nearest-even(x *
 *     (127 / amax));
 *   NEON: quantize_row_q8_0 (ggml-cpu/arch/arm/quants.c): q = round-to-nearest-even(x * (1 / d)).
 * NULL when unavailable. */
typedef void (*quant_act_q8_0_fn)(const float *x, int n, int8_t *q, float *d, int16_t *bsums);
quant_act_q8_0_fn quant_x86_act_q8_0(void);
quant_act_q8_0_fn quant_neon_act_q8_0(void);
/* The same for Q8_K blocks (d[n/256], bsums[n/16]), bit-identical to the plain one. */
quant_act_q8_0_fn quant_x86_act_q8_k(void);

/* For the K-quant quantizers (quant.c, quant_lowbit.c): per sub-block j < nsub of len values
 * of x, with lo = min(0, min) and hi = max(0, max): scale[j] = (hi - lo) / levels and
 * minv[j] = -lo; *smax and *mmax get the largest of each (the super-block's scales' range). */
void quant_subblock_ranges(const float *x, int nsub, int len, float levels, float *scale,
			   float *minv, float *smax, float *mmax);

/* x86 tables (quant_x86.c); NULL when not compiled in or the CPU lacks the features. */
const quant_ops_t *quant_x86_ops(int wtype);
/* NEON tables (quant_neon.c); NULL when not built for aarch64. */
const quant_ops_t *quant_neon_ops(int wtype);

#endif
