/* test_quant.c: block formats and matvec kernels. Every type's optimized kernel is compared with
 * the plain reference on generated tensors (NMSE bound 1e-10: they differ only in summation
 * order), and the reference with the exact float dot of the dequantized weights and activations
 * (NMSE bounds: 1e-10 for float activations, 1e-4 for Q8_0 ones, 5e-4 for Q8_K).
 * Quantize/dequantize round trips are checked against the format's expected error. */
#include "common/common.h"
#include "harness.h"
#include "infer/pool.h"
#include "infer/quant/quant.h"
#include "infer/quant/repack.h"

#include <stdatomic.h>
#include <stdint.h>

static uint64_t rng = 88172645463325252ull;
static float frand(void) /* uniform in [-1, 1) */
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 40) / (double)(1 << 24)) * 2.f - 1.f;
}

static double nmse(const float *a, const float *ref, int n)
{
	double num = 0, den = 0;
	for (int i = 0; i < n; i++) {
		num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
		den += (double)ref[i] * ref[i];
	}
	return den > 0 ? num / den : num;
}

static const int types[] = {QT_F32,  QT_F16,  QT_BF16, QT_Q8_0, QT_Q4_0, QT_Q4_K, QT_Q6_K,
			    QT_Q5_0, QT_Q5_1, QT_Q2_K, QT_Q3_K, QT_Q5_K, QT_MXFP4};

TEST(f16_conversion)
{
	CHECK_EQ_INT(quant_f32_to_f16(1.0f), 0x3c00);
	CHECK_EQ_INT(quant_f32_to_f16(-2.0f), 0xc000);
	CHECK_EQ_INT(quant_f32_to_f16(65504.f), 0x7bff);
	CHECK(quant_f16_to_f32(0x3555) > 0.333f && quant_f16_to_f32(0x3555) < 0.3334f);
	CHECK(quant_f16_to_f32(0x0001) > 0 && quant_f16_to_f32(0x0001) < 1e-7f);
	for (uint32_t h = 0; h < 0x7c00; h++) /* every finite positive half survives a round trip */
		if (quant_f32_to_f16(quant_f16_to_f32((uint16_t)h)) != h) {
			CHECK(0);
			break;
		}
	CHECK(quant_bf16_to_f32(quant_f32_to_bf16(1.5f)) == 1.5f);
}

/* Round trip error bound per type (NMSE of uniform data). */
static double roundtrip_bound(int t)
{
	switch (t) {
	case QT_F32: return 0;
	case QT_F16: return 1e-6;
	case QT_BF16: return 3e-5;
	case QT_Q8_0: return 1e-4;
	case QT_Q6_K: return 2e-3;
	case QT_Q5_0:
	case QT_Q5_1:
	case QT_Q5_K: return 5e-3;
	case QT_Q3_K: return 4e-2;
	case QT_Q2_K: return 0.15;
	case QT_MXFP4: return 2.5e-2; /* E2M1: 1 mantissa bit, power-of-two block scale */
	default: /* 4-bit */ return 1.5e-2;
	}
}

TEST(quantize_roundtrip)
{
	enum { N = 4096 };
	static float x[N], y[N];
	static uint8_t buf[N * 4];
	for (int i = 0; i < N; i++)
		x[i] = frand();
	for (size_t k = 0; k < ARRAY_LEN(types); k++) {
		int t = types[k];
		CHECK_EQ_INT(quant_quantize_row(t, x, buf, N), 0);
		quant_dequant_row(t, buf, y, N);
		double e = nmse(y, x, N);
		if (!(e <= roundtrip_bound(t)))
			fprintf(stderr, "%s: round trip nmse %g > %g\n", quant_type_name(t), e,
				roundtrip_bound(t));
		CHECK(e <= roundtrip_bound(t));
	}
}

/* Hand-built blocks pin the bit layouts independently of our quantizers. */
TEST(block_layouts)
{
	blk_q4_0 b4 = {quant_f32_to_f16(0.5f), {0}};
	b4.qs[0] = 0x1f; /* element 0 = (15-8)*0.5, element 16 = (1-8)*0.5 */
	float y[QK_K];
	quant_dequant_row(QT_Q4_0, &b4, y, 32);
	CHECK_NEAR(y[0], 3.5, 0);
	CHECK_NEAR(y[16], -3.5, 0);
	CHECK_NEAR(y[1], -4.0, 0);

	blk_q4_k k4;
	memset(&k4, 0, sizeof k4);
	k4.d = quant_f32_to_f16(1.f);
	k4.dmin = quant_f32_to_f16(1.f);
	k4.scales[0] = 2;        /* sub-block 0: scale 2 */
	k4.scales[4] = 1;        /* sub-block 0: min 1 */
	k4.scales[8] = 0x53;     /* sub-block 4: scale 3 | 16*? , min 5 (low nibbles) */
	k4.scales[0] |= 1u << 6; /* sub-block 4 scale high bits: 1 -> scale 3 + 16 = 19 */
	k4.qs[0] = 0x73;         /* element 0 = 3, element 32 = 7 */
	k4.qs[64] = 0x02;        /* element 128 (sub-block 4) = 2 */
	quant_dequant_row(QT_Q4_K, &k4, y, QK_K);
	CHECK_NEAR(y[0], 2 * 3 - 1, 0);
	CHECK_NEAR(y[32], 0 * 7 - 0, 0);
	CHECK_NEAR(y[128], 19 * 2 - 5, 0);

	blk_q6_k k6;
	memset(&k6, 0, sizeof k6);
	k6.d = quant_f32_to_f16(1.f);
	for (int g = 0; g < 16; g++)
		k6.scales[g] = (int8_t)(g + 1);
	k6.ql[0] = 0x21;  /* element 0 low = 1, element 64 low = 2 */
	k6.qh[0] = 0x0e;  /* element 0 high = 2 (-> 33), element 32 high = 3 (-> 48) */
	k6.ql[32] = 0x05; /* element 32 low = 5 */
	quant_dequant_row(QT_Q6_K, &k6, y, QK_K);
	CHECK_NEAR(y[0], 1 * (33 - 32), 0);
	CHECK_NEAR(y[32], 3 * (53 - 32), 0);
	CHECK_NEAR(y[64], 5 * (2 - 32), 0);
	CHECK_NEAR(y[1], 1 * (0 - 32), 0);
}

/* The low-bit types' layouts, by hand from ggml's reference dequantizers (ggml/src/ggml-quants.c:
 * dequantize_row_q5_0, dequantize_row_q5_1, dequantize_row_q2_K, dequantize_row_q3_K,
 * dequantize_row_q5_K), so a wrong bit plane in quant_lowbit.c cannot hide behind its own
 * quantizer. */
TEST(lowbit_layouts)
{
	float y[QK_K];
	blk_q5_0 a;
	memset(&a, 0, sizeof a);
	a.d = quant_f32_to_f16(0.5f);
	a.qs[0] = 0x1f; /* element 0 low nibble 15, element 16 low nibble 1 */
	a.qs[1] = 0x20; /* element 17 low nibble 2 */
	a.qh[0] = 0x01; /* bit 0: element 0's fifth bit */
	a.qh[2] = 0x02; /* bit 17: element 17's fifth bit */
	quant_dequant_row(QT_Q5_0, &a, y, 32);
	CHECK_NEAR(y[0], (31 - 16) * 0.5, 0);
	CHECK_NEAR(y[16], (1 - 16) * 0.5, 0);
	CHECK_NEAR(y[17], (18 - 16) * 0.5, 0);
	CHECK_NEAR(y[1], -16 * 0.5, 0);

	blk_q5_1 b;
	memset(&b, 0, sizeof b);
	b.d = quant_f32_to_f16(1.f);
	b.m = quant_f32_to_f16(-2.f);
	b.qs[0] = 0x03;
	b.qh[0] = 0x01;
	quant_dequant_row(QT_Q5_1, &b, y, 32);
	CHECK_NEAR(y[0], 19 - 2, 0);
	CHECK_NEAR(y[1], -2, 0);

	blk_q2_k c;
	memset(&c, 0, sizeof c);
	c.d = quant_f32_to_f16(1.f);
	c.dmin = quant_f32_to_f16(1.f);
	c.scales[0] = 0x21; /* elements 0-15: scale 1, min 2 */
	c.scales[8] = 0x13; /* elements 128-143: scale 3, min 1 */
	c.qs[1] = 0x03;     /* element 1 = 3 (shift 0) */
	c.qs[32] = 0x02;    /* element 128 = 2: second 128-half starts at byte 32 */
	c.qs[0] = 0x0c;     /* element 32 = 3 (shift 2), group 2: scale 0 */
	quant_dequant_row(QT_Q2_K, &c, y, QK_K);
	CHECK_NEAR(y[0], 1 * 0 - 2, 0);
	CHECK_NEAR(y[1], 1 * 3 - 2, 0);
	CHECK_NEAR(y[128], 3 * 2 - 1, 0);
	CHECK_NEAR(y[32], 0, 0);

	blk_q3_k d3;
	memset(&d3, 0, sizeof d3);
	d3.d = quant_f32_to_f16(1.f);
	d3.scales[0] = 0x02; /* group 0: low 4 bits 2 */
	d3.scales[8] = 0x02; /* group 0: high 2 bits 2 -> 34, minus 32 = 2 */
	d3.hmask[0] = 0x01;  /* element 0: high bit set, no -4 */
	d3.qs[0] = 0x03;
	d3.qs[1] = 0x01; /* element 1: 1 - 4 */
	quant_dequant_row(QT_Q3_K, &d3, y, QK_K);
	CHECK_NEAR(y[0], 2 * 3, 0);
	CHECK_NEAR(y[1], 2 * (1 - 4), 0);
	CHECK_NEAR(y[255], -32 * -4, 0); /* scale 0 - 32, value 0 - 4 */

	blk_q5_k e;
	memset(&e, 0, sizeof e);
	e.d = quant_f32_to_f16(1.f);
	e.dmin = quant_f32_to_f16(1.f);
	e.scales[0] = 2; /* sub-block 0: scale 2 */
	e.scales[4] = 1; /* sub-block 0: min 1 */
	e.scales[1] = 1; /* sub-block 1: scale 1 */
	e.scales[2] = 1; /* sub-block 2: scale 1 */
	e.qs[0] = 0x73;  /* element 0 low 3, element 32 low 7 */
	e.qh[0] = 0x03;  /* fifth bits of element 0 (bit 0) and element 32 (bit 1) */
	e.qs[32] = 0x05; /* element 64 low 5, its fifth bit (qh[0] bit 2) clear */
	quant_dequant_row(QT_Q5_K, &e, y, QK_K);
	CHECK_NEAR(y[0], 2 * 19 - 1, 0);
	CHECK_NEAR(y[32], 1 * 23, 0);
	CHECK_NEAR(y[64], 5, 0);
}

/* MXFP4 by hand from ggml (ggml/src/ggml-common.h block_mxfp4 and kvalues_mxfp4, the E2M1
 * values doubled; ggml/src/ggml-quants.c dequantize_row_mxfp4, quantize_row_mxfp4_ref and its
 * best_index_mxfp4; ggml/src/ggml-impl.h ggml_e8m0_to_fp32_half): element j in the low nibble of
 * qs[j], j + 16 in the high nibble, value = kvalue[code] * 2^(e - 128). */
TEST(mxfp4_layout)
{
	float y[64];
	blk_mxfp4 b[2];
	memset(b, 0, sizeof b);
	b[0].e = 128;       /* half scale 2^0: the doubled values themselves */
	b[0].qs[0] = 0x79;  /* element 0: code 9 = -1; element 16: code 7 = 12 */
	b[0].qs[15] = 0xd5; /* element 15: code 5 = 6; element 31: code 13 = -6 */
	b[1].e = 127;       /* half scale 0.5: the real E2M1 values */
	b[1].qs[3] = 0x6f;  /* element 3: code 15 = -12 -> -6; element 19: code 6 = 8 -> 4 */
	quant_dequant_row(QT_MXFP4, b, y, 64);
	CHECK_NEAR(y[0], -1, 0);
	CHECK_NEAR(y[16], 12, 0);
	CHECK_NEAR(y[15], 6, 0);
	CHECK_NEAR(y[31], -6, 0);
	CHECK_NEAR(y[1], 0, 0);
	CHECK_NEAR(y[32 + 3], -6, 0);
	CHECK_NEAR(y[32 + 19], 4, 0);
	/* the scale's ends: e = 0 and 1 are the subnormals 2^-128, 2^-127; e = 254 is 2^126 */
	CHECK(quant_e8m0_half(0) == ldexpf(1, -128));
	CHECK(quant_e8m0_half(1) == ldexpf(1, -127));
	CHECK(quant_e8m0_half(2) == ldexpf(1, -126));
	CHECK(quant_e8m0_half(254) == ldexpf(1, 126));

	/* quantize_row_mxfp4_ref: amax 6 -> e = floor(log2 6) - 2 + 127 = 127 (scale 0.5), then
	 * the nearest code, the lower one on a tie (strict <) */
	float x[32] = {0};
	x[0] = 6.f;     /* 12 x 0.5: code 7 */
	x[1] = -0.5f;   /* code 9 */
	x[2] = 3.f;     /* 6 x 0.5: code 5 */
	x[3] = 0.1f;    /* nearer 0 than 0.5: code 0 */
	x[4] = 0.25f;   /* tie between 0 (code 0) and 0.5 (code 1): code 0 */
	x[5] = 5.f;     /* tie between 4 (code 6) and 6 (code 7): code 6 */
	x[16] = -2.9f;  /* -3 = -6 x 0.5: code 13, high nibble of qs[0] */
	x[17] = -0.25f; /* tie between 0 (code 0) and -0.5 (code 9): code 0 */
	blk_mxfp4 q;
	quant_quantize_row(QT_MXFP4, x, &q, 32);
	CHECK_EQ_INT(q.e, 127);
	CHECK_EQ_INT(q.qs[0], 0xd7);
	CHECK_EQ_INT(q.qs[1], 0x09);
	CHECK_EQ_INT(q.qs[2], 0x05);
	CHECK_EQ_INT(q.qs[3], 0x00);
	CHECK_EQ_INT(q.qs[4], 0x00);
	CHECK_EQ_INT(q.qs[5], 0x06);
	memset(x, 0, sizeof x); /* all zero: e = 0, every code 0 */
	quant_quantize_row(QT_MXFP4, x, &q, 32);
	CHECK_EQ_INT(q.e, 0);
	CHECK_EQ_INT(q.qs[7], 0);
	x[9] = 1e-3f; /* floor(log2 1e-3) = -10: e = 115 */
	quant_quantize_row(QT_MXFP4, x, &q, 32);
	CHECK_EQ_INT(q.e, 115);

	/* every kernel on hand-built blocks: 4 rows of 3 blocks with every code and several
	 * exponents, against the exact integer sum the reference's per-block expression gives */
	enum { R = 4, NB = 3 };
	blk_mxfp4 w[R * NB];
	for (int i = 0; i < R * NB; i++) {
		w[i].e = (uint8_t)(120 + (i * 5) % 13);
		for (int j = 0; j < 16; j++)
			w[i].qs[j] = (uint8_t)(((j + i) & 15) | (((j * 7 + i) & 15) << 4));
	}
	float xa[32 * NB], out[R], want[R];
	uint8_t act[32 * NB * 2];
	for (int i = 0; i < 32 * NB; i++)
		xa[i] = (float)((i * 37) % 255 - 127) / 127.f;
	quant_init(0);
	quant_act_t a;
	quant_act_prepare(QT_MXFP4, xa, 32 * NB, act, &a);
	for (int r = 0; r < R; r++) {
		double s = 0;
		for (int i = 0; i < NB; i++) {
			const blk_mxfp4 *bb = &w[r * NB + i];
			long sum = 0;
			for (int j = 0; j < 32; j++) {
				int code = j < 16 ? bb->qs[j] & 15 : bb->qs[j - 16] >> 4;
				sum += quant_mxfp4_values[code] * a.q[32 * i + j];
			}
			s += (double)ldexpf(1, bb->e - 128) * a.d[i] * (double)sum;
		}
		want[r] = (float)s;
	}
	const quant_ops_t *tabs[2] = {quant_ops_ref(QT_MXFP4), quant_ops_opt(QT_MXFP4)};
	for (int k = 0; k < 2; k++) {
		tabs[k]->rows(out, (const uint8_t *)w, NB * sizeof(blk_mxfp4), R, &a, 32 * NB);
		for (int r = 0; r < R; r++)
			CHECK_NEAR(out[r], want[r], 1e-5 * fabs(want[r]) + 1e-6);
	}
	fprintf(stderr, "mxfp4 kernel: %s\n", tabs[1]->impl);
}

/* Rows x n weights; the reference and optimized kernels on every type, whole and column-sliced. */
TEST(kernels_vs_reference)
{
	enum { ROWS = 37, N = 1024 };
	static float w[ROWS * N], x[N], wd[N], exact[ROWS], ref[ROWS], opt[ROWS];
	static uint8_t wq[ROWS * N * 4], act[N * 2];
	for (int i = 0; i < ROWS * N; i++)
		w[i] = frand() * (1 + (i % 7));
	for (int i = 0; i < N; i++)
		x[i] = frand() * (i % 13 == 0 ? 4.f : 1.f);
	quant_init(0);
	for (size_t k = 0; k < ARRAY_LEN(types); k++) {
		int t = types[k];
		size_t rb = quant_row_bytes(t, N);
		for (int r = 0; r < ROWS; r++)
			quant_quantize_row(t, w + r * N, wq + r * rb, N);
		for (int r = 0; r < ROWS; r++) {
			quant_dequant_row(t, wq + r * rb, wd, N);
			double s = 0;
			for (int i = 0; i < N; i++)
				s += (double)wd[i] * x[i];
			exact[r] = (float)s;
		}
		const quant_ops_t *ro = quant_ops_ref(t), *oo = quant_ops_opt(t);
		CHECK(ro && oo);
		if (!ro || !oo)
			continue;
/* every AArch64 CPU has NEON: the tables must not fall back (t_neon.sh); the low-bit types
 * have only the plain C kernels so far */
#if defined(__aarch64__)
		CHECK(quant_lowbit_ops_ref(t) || !strncmp(oo->impl, "neon", 4));
#endif
		quant_act_t a;
		quant_act_prepare(t, x, N, act, &a);
		ro->rows(ref, wq, rb, ROWS, &a, N);
		oo->rows(opt, wq, rb, ROWS, &a, N);
		/* Against the exact dot: float activations ~1e-12; 8-bit activations in blocks of
		 * 32 (Q8_0) ~3e-5, in blocks of 256 (Q8_K, coarser scale) ~2e-4 on this data. */
		double bound_exact = a.type == QT_F32 ? 1e-10 : a.type == QT_Q8_0 ? 1e-4 : 5e-4;
		double e1 = nmse(ref, exact, ROWS), e2 = nmse(opt, ref, ROWS);
		if (e1 > bound_exact || e2 > 1e-10)
			fprintf(stderr, "%s (%s): ref vs exact %g, opt vs ref %g\n",
				quant_type_name(t), oo->impl, e1, e2);
		CHECK(e1 <= bound_exact);
		CHECK(e2 <= 1e-10);
		if (oo->dequant) { /* optimized dequantize: equal up to FMA contraction */
			static float d1[N], d2[N];
			oo->dequant(wq + 3 * rb, d1, N);
			ro->dequant(wq + 3 * rb, d2, N);
			CHECK(nmse(d1, d2, N) <= 1e-12);
		}

		/* A column slice [256, 768): each row's slice is a contiguous run of blocks. */
		int c0 = 256, nc = 512;
		size_t off = quant_row_bytes(t, c0);
		quant_act_t s = quant_act_slice(&a, c0);
		oo->rows(opt, wq + off, rb, ROWS, &s, nc);
		ro->rows(ref, wq + off, rb, ROWS, &s, nc);
		for (int r = 0; r < ROWS; r++) {
			quant_dequant_row(t, wq + r * rb, wd, N);
			double sum = 0;
			for (int i = c0; i < c0 + nc; i++)
				sum += (double)wd[i] * x[i];
			exact[r] = (float)sum;
		}
		CHECK(nmse(opt, ref, ROWS) <= 1e-10);
		CHECK(nmse(ref, exact, ROWS) <= bound_exact);

		/* An odd length reaches the kernels' tail loops: 53 floats (3 x 16 + 5), 3 blocks
		 * of 32 (one unpaired block), 1 block of 256. */
		int be = quant_block_elems(t), no = be == 1 ? 53 : be == QK_K ? QK_K : 3 * be;
		oo->rows(opt, wq + off, rb, ROWS, &s, no);
		ro->rows(ref, wq + off, rb, ROWS, &s, no);
		CHECK(nmse(opt, ref, ROWS) <= 1e-10);
	}
}

/* F32 -> F16 rows (the KV cache) by the CPU's conversion: bit-identical to quant_f32_to_f16 on
 * every non-NaN input sampled across all 2^32 patterns (subnormal results, overflow to infinity,
 * ties included), NaN stays NaN; tails of every length. */
TEST(f16_row_exact)
{
	enum { N = 4099 };
	static float x[N];
	static uint16_t y[N];
	quant_init(0);
	int bad = 0, nan_ok = 1;
	for (uint64_t base = 0; base < (1ull << 32); base += (uint64_t)N * 1021) {
		for (int i = 0; i < N; i++) {
			uint32_t u = (uint32_t)(base + (uint64_t)i * 1021);
			memcpy(&x[i], &u, 4);
		}
		quant_quantize_row(QT_F16, x, y, N);
		for (int i = 0; i < N; i++) {
			if (x[i] != x[i])
				nan_ok &= (y[i] & 0x7c00) == 0x7c00 && (y[i] & 0x3ff);
			else if (y[i] != quant_f32_to_f16(x[i]) && bad++ < 5)
				fprintf(stderr, "f16 of %a: %04x, want %04x\n", (double)x[i], y[i],
					quant_f32_to_f16(x[i]));
		}
	}
	CHECK_EQ_INT(bad, 0);
	CHECK(nan_ok);
	for (int n = 1; n < 20; n++) { /* ties to even at every tail position */
		for (int i = 0; i < n; i++)
			x[i] =
			    1.0f + (float)(2 * i + 1) / 2048; /* halfway between two F16 values */
		quant_quantize_row(QT_F16, x, y, n);
		for (int i = 0; i < n; i++)
			bad += y[i] != quant_f32_to_f16(x[i]);
	}
	CHECK_EQ_INT(bad, 0);
}

/* The softmax exponential against expf: relative error under 1e-6 over [-100, 0]. */
TEST(expsum_accuracy)
{
	enum { N = 1003 };
	static float x[N], y[N];
	for (int i = 0; i < N; i++)
		x[i] = y[i] = -100.0f * (float)i / N + 3.0f;
	quant_init(0);
	float s = quant_expsum()(x, N, 3.0f);
	double ref = 0, worst = 0;
	for (int i = 0; i < N; i++) {
		double e = exp((double)y[i] - 3.0);
		ref += e;
		if (e > 1e-30)
			worst = fmax(worst, fabs(x[i] - e) / e);
	}
	CHECK(worst < 1e-6);
	CHECK(fabs(s - ref) / ref < 1e-6);
}

/* Attention's weighted sum of strided value rows: optimized vs plain loops, several widths. */
TEST(wsum_vs_reference)
{
	enum { T = 37, STRIDE = 200 };
	static float v[T * STRIDE], a[T], o1[STRIDE], o2[STRIDE];
	for (int i = 0; i < T * STRIDE; i++)
		v[i] = frand();
	for (int t = 0; t < T; t++)
		a[t] = frand();
	quant_init(0);
	const int widths[] = {64, 128, 72, 5, 136};
	for (size_t k = 0; k < ARRAY_LEN(widths); k++) {
		int n = widths[k];
		quant_wsum()(o1, a, v + 3, STRIDE, T, n);
		for (int i = 0; i < n; i++) {
			double c = 0;
			for (int t = 0; t < T; t++)
				c += (double)a[t] * v[t * STRIDE + 3 + i];
			o2[i] = (float)c;
		}
		CHECK(nmse(o1, o2, n) < 1e-12);
	}
}

static atomic_int pool_hits[8];
static void pool_job(void *ctx, int chunk, int n_chunks, int tid)
{
	(void)ctx;
	(void)n_chunks;
	(void)tid;
	atomic_fetch_add(&pool_hits[chunk], 1);
}

/* Batched kernels (rows8) against the reference one vector at a time, for 1..8 vectors, on rows
 * of whole groups of 8 blocks and with a tail (544 = 17 blocks of 32); for the float types also
 * rows that end in a 16-wide step (560) and in single elements (571). */
TEST(batched_kernels_vs_reference)
{
	enum { ROWS = 19, NMAX = 576 };
	static float w[ROWS * NMAX], x[8][NMAX], ref[8][ROWS], opt[8][ROWS];
	static uint8_t wq[ROWS * NMAX * 4], act[8][NMAX * 2];
	static const int ns[] = {512, 544, 560, 571};
	int tested = 0;
	for (size_t in = 0; in < ARRAY_LEN(ns); in++) {
		const int N = ns[in];
		for (int i = 0; i < ROWS * N; i++)
			w[i] = frand();
		for (int t = 0; t < 8; t++)
			for (int i = 0; i < N; i++)
				x[t][i] = frand() * (float)(t + 1);
		for (size_t k = 0; k < ARRAY_LEN(types); k++) {
			int t = types[k];
			const quant_ops_t *ro = quant_ops_ref(t), *oo = quant_ops_opt(t);
			size_t rb = quant_row_bytes(t, N);
			if (!oo->rows8 || !rb)
				continue;
			tested++;
			for (int r = 0; r < ROWS; r++)
				quant_quantize_row(t, w + r * N, wq + r * rb, N);
			quant_act_t a[8];
			for (int v = 0; v < 8; v++) {
				quant_act_prepare(t, x[v], N, act[v], &a[v]);
				ro->rows(ref[v], wq, rb, ROWS, &a[v], N);
			}
			static float one[8][ROWS], alone[8][ROWS];
			for (int v = 0; v < 8; v++) {
				oo->rows(one[v], wq, rb, ROWS, &a[v], N);
				oo->rows8(alone[v], ROWS, wq, rb, ROWS, &a[v], 1, N);
			}
			for (int nt = 1; nt <= 8; nt++) {
				memset(opt, 0, sizeof opt);
				oo->rows8(&opt[0][0], ROWS, wq, rb, ROWS, a, nt, N);
				for (int v = 0; v < nt; v++) {
					CHECK(nmse(opt[v], ref[v], ROWS) <= 1e-10);
					/* a token's bits do not depend on the batch (matmul.c,
					 * issue 28): every batched kernel equals rows, and
					 * itself alone */
					CHECK(!memcmp(opt[v], one[v], sizeof one[v]));
					CHECK(!memcmp(opt[v], alone[v], sizeof one[v]));
				}
				for (int v = nt; v < 8; v++) /* nothing written past nt */
					CHECK(opt[v][0] == 0);
			}
		}
	}
	if (!tested)
		SKIP("no batched kernel on this CPU");
}

/* The interleaved R16 layout (repack.h): repack then unpack gives the rows back byte for byte;
 * the reference tiled kernel equals the plain matvec kernel on the original rows exactly (the
 * same integer block dots and float expression); the optimized one is within NMSE 1e-10 of it
 * (float rounding order only), for 1..8 vectors, several groups, whole and column-sliced rows.
 * The KV cache's weighted-sum kernels (vsum) against the plain ones, NMSE 1e-12. */
TEST(repacked_kernels_vs_reference)
{
	enum { G = 3, ROWS = G * QR_ROWS, N = 1024, LDO = ROWS + 5 };
	static float w[ROWS * N], x[8][N], ref[8][ROWS], got[8][LDO];
	static uint8_t wq[ROWS * N * 2], rp[ROWS * N * 2], back[ROWS * N * 2], act[8][N * 2];
	for (int i = 0; i < ROWS * N; i++)
		w[i] = frand() * (1 + (i % 5));
	for (int t = 0; t < 8; t++)
		for (int i = 0; i < N; i++)
			x[t][i] = frand() * (float)(t + 1);
	quant_init(0);
	const int rtypes[] = {QT_Q8_0, QT_Q4_0, QT_Q4_K, QT_Q6_K, QT_MXFP4};
	for (size_t k = 0; k < ARRAY_LEN(rtypes); k++) {
		int t = rtypes[k];
		CHECK(quant_repack_supported(t));
		size_t rb = quant_row_bytes(t, N), gb = quant_repack_group_bytes(t, N);
		CHECK_EQ_INT(gb, QR_ROWS * rb);
		for (int r = 0; r < ROWS; r++)
			quant_quantize_row(t, w + r * N, wq + r * rb, N);
		quant_repack(t, wq, rb, G, N, rp);
		quant_unpack(t, rp, G, N, back);
		CHECK(!memcmp(back, wq, (size_t)ROWS * rb));
		quant_act_t a[8];
		for (int v = 0; v < 8; v++) {
			quant_act_prepare(t, x[v], N, act[v], &a[v]);
			quant_ops_ref(t)->rows(ref[v], wq, rb, ROWS, &a[v], N);
		}
		quant_gemm_fn fr = quant_gemm_ref(t), fo = quant_gemm(t);
		CHECK(fr && fo);
		if (!fr || !fo)
			continue;
		fprintf(stderr, "%s tiled kernel: %s\n", quant_type_name(t), quant_gemm_impl(t));
		for (int nt = 1; nt <= 8; nt++) {
			memset(got, 0, sizeof got);
			fr(&got[0][0], LDO, rp, G, a, nt, N);
			for (int v = 0; v < nt; v++)
				CHECK(!memcmp(got[v], ref[v], sizeof ref[v]));
			memset(got, 0, sizeof got);
			fo(&got[0][0], LDO, rp, G, a, nt, N);
			for (int v = 0; v < nt; v++) {
				double e = nmse(got[v], ref[v], ROWS);
				if (!(e <= 1e-10))
					fprintf(stderr, "%s %s nt %d v %d: nmse %g\n",
						quant_type_name(t), quant_gemm_impl(t), nt, v, e);
				CHECK(e <= 1e-10);
				CHECK(got[v][ROWS] == 0); /* nothing past the groups */
			}
			for (int v = nt; v < 8; v++)
				CHECK(got[v][0] == 0);
		}
		/* one group from the middle, a column slice [256, 768) repacked on its own */
		static uint8_t rs[QR_ROWS * N * 2];
		quant_repack(t, wq + QR_ROWS * rb + quant_row_bytes(t, 256), rb, 1, 512, rs);
		quant_act_t s[8];
		for (int v = 0; v < 8; v++) {
			s[v] = quant_act_slice(&a[v], 256);
			quant_ops_ref(t)->rows(ref[v], wq + QR_ROWS * rb + quant_row_bytes(t, 256),
					       rb, QR_ROWS, &s[v], 512);
		}
		fo(&got[0][0], LDO, rs, 1, s, 8, 512);
		for (int v = 0; v < 8; v++)
			CHECK(nmse(got[v], ref[v], QR_ROWS) <= 1e-10);
	}
	/* vsum over F32, F16 and Q8_0 rows of 64..160 elements, strided as a KV cache */
	enum { T = 45, W = 160, STRIDE = 4 * 512 };
	static uint8_t vrows[T * STRIDE];
	static float av[T], o1[W], o2[W], vals[W];
	for (int i = 0; i < T; i++)
		av[i] = frand();
	const int vt[] = {QT_F32, QT_F16, QT_Q8_0};
	for (size_t k = 0; k < ARRAY_LEN(vt); k++)
		for (int n = 64; n <= W; n += 32) {
			for (int r = 0; r < T; r++) {
				for (int i = 0; i < n; i++)
					vals[i] = frand();
				quant_quantize_row(vt[k], vals, vrows + (size_t)r * STRIDE, n);
			}
			for (int i = 0; i < n; i++)
				o1[i] = o2[i] = frand(); /* vsum adds to what is there */
			quant_vsum(vt[k])(o1, av, vrows, STRIDE, T, n);
			quant_vsum_ref(vt[k])(o2, av, vrows, STRIDE, T, n);
			CHECK(nmse(o1, o2, n) <= 1e-12);
		}
}

/* Attention tile kernels (quant_qkt, quant_av) against the plain loops for 1..6 queries,
 * head sizes 64, 128 and 96 (64 + a 32-column rest), partial tiles: NMSE 1e-12. */
TEST(attention_tile_kernels)
{
	enum { HD = 128, NQ = 6 };
	static float kt[HD * 64], v[64 * 200], q[NQ][HD], s1[NQ * 64], s2[NQ * 64];
	static float o1[NQ][HD], o2[NQ][HD];
	for (int i = 0; i < HD * 64; i++)
		kt[i] = frand();
	for (int i = 0; i < 64 * 200; i++)
		v[i] = frand();
	for (int j = 0; j < NQ; j++)
		for (int i = 0; i < HD; i++)
			q[j][i] = frand();
	for (int i = 0; i < NQ * 64; i++)
		s1[i] = frand();
	quant_init(0);
	const int hds[] = {64, 128, 96};
	for (size_t k = 0; k < ARRAY_LEN(hds); k++)
		for (int nq = 1; nq <= NQ; nq++) {
			int hd = hds[k];
			const float *qp[NQ];
			float *p1[NQ], *p2[NQ];
			for (int j = 0; j < nq; j++) {
				qp[j] = q[j];
				p1[j] = o1[j];
				p2[j] = o2[j];
				for (int i = 0; i < hd; i++)
					o1[j][i] = o2[j][i] = frand();
			}
			quant_qkt()(s1, qp, nq, kt, hd);
			quant_qkt_ref()(s2, qp, nq, kt, hd);
			CHECK(nmse(s1, s2, nq * 64) <= 1e-12);
			int T = 37 + nq; /* a partial tile */
			quant_av()(p1, s2, nq, v + 3, 200, T, hd);
			quant_av_ref()(p2, s2, nq, v + 3, 200, T, hd);
			for (int j = 0; j < nq; j++)
				CHECK(nmse(o1[j], o2[j], hd) <= 1e-12);
		}
}

/* The optimized Q8_K activation quantizer is bit-identical to the plain one (an all-zero block
 * and ties at .5 included). */
TEST(act_prepare_fast_equals_plain)
{
	enum { N = 2048 };
	static float x[N];
	static uint8_t b1[N * 2], b2[N * 2];
	for (int i = 0; i < N; i++)
		x[i] = i < 256 ? 0.f : i % 97 == 0 ? 127.f * 0.5f : frand() * (1 + i % 11);
	quant_act_t a1, a2;
	quant_init(1);
	quant_act_prepare(QT_Q4_K, x, N, b1, &a1);
	quant_init(0);
	quant_act_prepare(QT_Q4_K, x, N, b2, &a2);
	CHECK(!memcmp(a1.q, a2.q, N));
	CHECK(!memcmp(a1.d, a2.d, N / 256 * sizeof(float)));
	CHECK(!memcmp(a1.bsums, a2.bsums, N / 16 * sizeof(int16_t)));
}

/* How ggml quantizes a Q8_0 activation block on each target; d is block_q8_0.d, an F16.
 * GGML_REF: quantize_row_q8_0_ref (ggml/src/ggml-quants.c): q = roundf(x * (1 / d)).
 * GGML_X86: quantize_row_q8_0 (ggml-cpu/arch/x86/quants.c): _mm256_round_ps(x * (127 / amax),
 *           _MM_ROUND_NEAREST), ties to even.
 * GGML_NEON: quantize_row_q8_0 (ggml-cpu/arch/arm/quants.c): vcvtnq_s32_f32(x * (1 / d)), ties
 *           to even. */
enum { GGML_REF, GGML_X86, GGML_NEON };
static void ggml_q8_0_block(int how, const float *x, int8_t *q, float *d, int16_t *sum)
{
	float amax = 0;
	for (int j = 0; j < 32; j++)
		amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
	float s = amax / 127.f, id = s != 0.f ? 1.f / s : 0.f;
	if (how == GGML_X86)
		id = amax != 0.f ? 127.f / amax : 0.f;
	*d = quant_f16_to_f32(quant_f32_to_f16(s));
	int t = 0;
	for (int j = 0; j < 32; j++) {
		float v = x[j] * id;
		q[j] = (int8_t)(how == GGML_REF ? roundf(v) : rintf(v));
		t += q[j];
	}
	*sum = (int16_t)t;
}

/* Q8_0 activations bit for bit as ggml's quantizer for the same target (so Q8_0/Q4_0
 * log-probabilities can equal llama.cpp's): the plain path (quant_init(1), and any target
 * without a SIMD version) as ggml's reference, the optimized one as ggml's AVX2 or NEON code. */
TEST(act_q8_0_as_ggml)
{
	enum { N = 4096 };
	static float x[N];
	static uint8_t buf[N * 2];
	for (int i = 0; i < N; i++)
		x[i] = i < 32 ? 0.f : frand() * (1 + i % 11) * (i < 2048 ? 1.f : 1e-3f);
	/* a block with amax 127 (d = 1, both multipliers exactly 1): halves show the rounding */
	static const float halves[8] = {127.f, 2.5f, -2.5f, 0.5f, -0.5f, 1.5f, 126.5f, -3.5f};
	static const int8_t ref_q[8] = {127, 3, -3, 1, -1, 2, 127, -4},
			    even_q[8] = {127, 2, -2, 0, 0, 2, 126, -4};
	memset(x + 64, 0, 32 * sizeof(float));
	memcpy(x + 64, halves, sizeof halves);
	int fast = GGML_REF;
#if defined(__aarch64__)
	fast = GGML_NEON;
#elif defined(__x86_64__)
	if (quant_x86_act_q8_0())
		fast = GGML_X86;
#endif
	for (int pass = 0; pass < 2; pass++) {
		int how = pass == 0 ? GGML_REF : fast;
		quant_init(pass == 0);
		quant_act_t a;
		quant_act_prepare(QT_Q8_0, x, N, buf, &a);
		int bad = 0;
		for (int b = 0; b < N / 32; b++) {
			int8_t q[32];
			float d;
			int16_t sum;
			ggml_q8_0_block(how, x + 32 * b, q, &d, &sum);
			bad += memcmp(q, a.q + 32 * b, 32) != 0 || d != a.d[b] || sum != a.bsums[b];
		}
		CHECK_EQ_INT(bad, 0);
		CHECK(!memcmp(a.q + 64, how == GGML_REF ? ref_q : even_q, 8));
	}
	quant_init(0);
}

/* How ggml quantizes a Q8_K activation block on every CPU target: quantize_row_q8_K_ref
 * (ggml/src/ggml-quants.c; ggml-cpu/arch/x86/quants.c and arm/quants.c call it): the signed value
 * of largest magnitude, the first of equal ones (`ax > amax`), iscale = -127 / max, q =
 * nearest_int(iscale * x) (the 1.5 * 2^23 addition: ties to even) capped at 127, bsums of the
 * capped q, d = 1 / iscale as F32; an all-zero block d = 0. */
static void ggml_q8_k_block(const float *x, int8_t *q, float *d, int16_t *bsums)
{
	float max = 0, amax = 0;
	for (int j = 0; j < 256; j++)
		if (fabsf(x[j]) > amax)
			amax = fabsf(x[j]), max = x[j];
	memset(q, 0, 256);
	memset(bsums, 0, 16 * sizeof *bsums);
	*d = 0;
	if (!amax)
		return;
	float iscale = -127.f / max;
	for (int j = 0; j < 256; j++) {
		float v = iscale * x[j] + 12582912.f;
		int32_t i;
		memcpy(&i, &v, 4);
		int n = (i & 0x007fffff) - 0x00400000;
		q[j] = (int8_t)(n < 127 ? n : 127);
		bsums[j / 16] = (int16_t)(bsums[j / 16] + q[j]);
	}
	*d = 1 / iscale;
}

/* Q8_K activations (Q2_K..Q6_K weights) bit for bit as ggml's, on both paths: a block whose
 * largest magnitude is negative, blocks with +m and -m (the first sets the sign of d), halves,
 * zeros. */
TEST(act_q8_k_as_ggml)
{
	enum { N = 2048 };
	static float x[N];
	static uint8_t buf[N * 2];
	for (int i = 0; i < N; i++)
		x[i] = i < 256 ? 0.f : frand() * (1 + i % 13);
	x[256 + 7] = -50.f;                    /* block 1: max negative */
	x[512 + 3] = 40.f, x[512 + 9] = -40.f; /* block 2: + first */
	x[768 + 1] = -30.f, x[768 + 2] = 30.f; /* block 3: - first */
	for (int j = 0; j < 8; j++)            /* block 4: amax 127, iscale -1: halves */
		x[1024 + 10 + j] = (float)j - 3.5f;
	x[1024] = 127.f;
	for (int pass = 0; pass < 2; pass++) {
		quant_init(pass == 0);
		quant_act_t a;
		quant_act_prepare(QT_Q4_K, x, N, buf, &a);
		int bad = 0;
		for (int b = 0; b < N / 256; b++) {
			int8_t q[256];
			float d;
			int16_t bs[16];
			ggml_q8_k_block(x + 256 * b, q, &d, bs);
			bad += memcmp(q, a.q + 256 * b, 256) != 0 || d != a.d[b] ||
			       memcmp(bs, a.bsums + 16 * b, sizeof bs) != 0;
		}
		CHECK_EQ_INT(bad, 0);
		CHECK(a.q[512 + 9] == 127 && a.d[2] < 0 && a.d[3] > 0);
	}
	quant_init(0);
}

/* The AVX2 tables again where the CPU would pick AVX512-VNNI ones for Q8_0/Q4_0. */
TEST(kernels_vs_reference_avx2)
{
	setenv("SHOAL_NO_VNNI", "1", 1);
	test_kernels_vs_reference();
	test_repacked_kernels_vs_reference();
	unsetenv("SHOAL_NO_VNNI");
}

TEST(pool_runs_every_thread)
{
	pool_t *p = pool_new(3);
	CHECK(p != NULL);
	for (int i = 0; i < 1000; i++)
		pool_run(p, pool_job, NULL, 3);
	for (int i = 0; i < 3; i++) /* every chunk ran exactly once per job */
		CHECK_EQ_INT(atomic_load(&pool_hits[i]), 1000);
	pool_free(p);
	pool_free(NULL);
	int lo, hi, total = 0;
	for (int i = 0; i < 3; i++) {
		pool_split(100, i, 3, 32, &lo, &hi);
		CHECK(lo % 32 == 0);
		total += hi - lo;
	}
	CHECK_EQ_INT(total, 100);
}

int main(void)
{
	RUN(f16_conversion);
	RUN(quantize_roundtrip);
	RUN(block_layouts);
	RUN(lowbit_layouts);
	RUN(mxfp4_layout);
	RUN(kernels_vs_reference);
	RUN(kernels_vs_reference_avx2);
	RUN(batched_kernels_vs_reference);
	RUN(repacked_kernels_vs_reference);
	RUN(act_prepare_fast_equals_plain);
	RUN(act_q8_0_as_ggml);
	RUN(act_q8_k_as_ggml);
	RUN(attention_tile_kernels);
	RUN(expsum_accuracy);
	RUN(f16_row_exact);
	RUN(wsum_vs_reference);
	RUN(pool_runs_every_thread);
	return harness_done();
}
