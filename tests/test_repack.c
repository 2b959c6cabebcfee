/* test_repack.c: weights repacked at load (matmul.c's wmat_repack, repack.h's R16 layout).
 * - the model file is byte-for-byte the same after a model repacked from it has run and been
 *   freed (its mapping is only read; releasing pages never writes), and so is its mtime;
 * - on a CPU with a tiled kernel for the type, every layer matrix and the head are repacked,
 *   and the logits of a 12-token prefill and of decoding match those of the original-layout
 *   kernels (SHOAL_NO_REPACK) within NMSE 1e-4, and all but one of the 4 steps within 1e-10:
 *   the same integer block dots, only float rounding order differs (~1e-14 per product), but
 *   such a difference can put one int8 activation of a later matrix on the other side of a
 *   half (ggml's Q8_0 and Q8_K rounding, quant.c): one such flip moved a Q4_K model's decode
 *   logits by NMSE 1.5e-6 and a Q8_0 model's prefill by 2.4e-5 (ggml's Q8_0 activations on the
 *   row kernel's VNNI order), clean steps stay < 1e-12;
 * - an F16 model's matrices of 2 MiB and more (no tiled kernel: the row kernels read them) are
 *   copied into huge pages and the smaller ones stay in the mapping; the logits are the same
 *   bits as without the copies, and the file is unchanged;
 * - a mixture of experts' shared block (qwen2moe, Q8_0) is repacked as its experts are, its
 *   logits within the same bounds. */
#include "common/common.h"
#include "harness.h"
#include "infer/gguf_write.h"
#include "infer/model/model_int.h"

#include <sys/stat.h>

static uint64_t file_hash(const char *path, struct stat *st)
{
	char *buf;
	size_t len;
	if (read_file_all(path, &buf, &len, NULL, 0))
		return 0;
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < len; i++)
		h = (h ^ (uint8_t)buf[i]) * 1099511628211ull;
	free(buf);
	stat(path, st);
	return h;
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

/* 12 tokens: under matmul.c's BLAS_MIN, so the original layout's prefill also uses 8-bit
 * activations (a batch of 16 or more would go through sgemm in float for the K-quants). */
enum { NP = 12 };
static const int prompt[NP] = {3, 99, 120, 7, 400, 401, 55, 56, 57, 300, 10, 11};

/* Counts what a loaded model holds into counts[] (the tests below). */
typedef void (*inspect_fn)(const model_t *m, int *counts);

/* Loads path (repack 0: SHOAL_NO_REPACK set, no copies), inspects it, then a prefill of NP
 * tokens and `steps` decode steps: all logits into out[1 + steps][n_vocab]. */
static int run(const char *path, int repack, int steps, float *out, inspect_fn inspect,
	       int *counts)
{
	char err[256];
	gguf_t *g = NULL;
	model_meta_t meta;
	model_t *m = NULL;
	pool_t *pool = pool_new(2);
	int rc;
	if (repack)
		unsetenv("SHOAL_NO_REPACK");
	else
		setenv("SHOAL_NO_REPACK", "1", 1);
	if ((rc = gguf_open(&g, path, err, sizeof err)) ||
	    (rc = meta_load(&meta, g, err, sizeof err)) ||
	    (rc = model_new(&m, g, &meta, NULL, 64, pool, err, sizeof err))) {
		fprintf(stderr, "%s: %s\n", path, err);
		goto out;
	}
	inspect(m, counts);
	int n = meta.n_vocab;
	if ((rc = model_forward(m, prompt, NP, 0, out)))
		goto out;
	for (int i = 0; i < steps && !rc; i++)
		rc = model_forward(m, &prompt[i], 1, NP + i, out + (size_t)(i + 1) * n);
out:
	unsetenv("SHOAL_NO_REPACK");
	model_free(m);
	pool_free(pool);
	gguf_free(g);
	return rc;
}

/* counts[0]: the head, if repacked, and the layers whose seven matrices all are */
static void count_repacked(const model_t *m, int *counts)
{
	counts[0] = m->out.rp != NULL;
	for (int l = 0; l < m->meta.n_layers; l++) {
		const layer_t *L = &m->layers[l];
		counts[0] += (L->wq.rp && L->wk.rp && L->wv.rp && L->wo.rp && L->w_gate.rp &&
			      L->w_up.rp && L->w_down.rp);
	}
}

/* counts[0]: the head's and layer matrices of 2 MiB and more; counts[1]: those of them that
 * point at their own copy (not a repacked one); a smaller matrix owning a copy fails */
static void count_copies(const model_t *m, int *counts)
{
	counts[0] = counts[1] = 0;
	for (int l = -1; l < m->meta.n_layers; l++) {
		const layer_t *L = l < 0 ? NULL : &m->layers[l];
		const wmat_t *w[] = {l < 0 ? &m->out : &L->wq, L ? &L->wk : NULL, L ? &L->wv : NULL,
				     L ? &L->wo : NULL, L ? &L->w_gate : NULL, L ? &L->w_up : NULL,
				     L ? &L->w_down : NULL};
		for (size_t i = 0; i < ARRAY_LEN(w); i++) {
			if (!w[i])
				continue;
			int b = (size_t)w[i]->rows * w[i]->row_bytes >= ((size_t)2 << 20);
			counts[0] += b;
			counts[1] += b && w[i]->rp_own && w[i]->data == w[i]->rp_own && !w[i]->rp;
			CHECK(b || !w[i]->rp_own);
		}
	}
}

/* Writes o's model, runs it as loaded (logits into a, counts into c1) and with
 * SHOAL_NO_REPACK (b, c0), and checks that the file is byte for byte the same afterwards, mtime
 * included. Returns 0, or -1 when the model could not be written. */
static int run_both(const mkmodel_opts_t *o, int steps, inspect_fn f, float *a, int *c1, float *b,
		    int *c0)
{
	char path[256], err[256];
	snprintf(path, sizeof path, "/tmp/shoal-test-repack-%d-%d-%d.gguf", (int)getpid(), o->type,
		 o->dim);
	if (mkmodel_write(o, path, err, sizeof err)) {
		fprintf(stderr, "mkmodel: %s\n", err);
		CHECK(0);
		return -1;
	}
	struct stat s0, s1;
	uint64_t h0 = file_hash(path, &s0);
	CHECK_EQ_INT(run(path, 1, steps, a, f, c1), 0);
	CHECK_EQ_INT(run(path, 0, steps, b, f, c0), 0);
	uint64_t h1 = file_hash(path, &s1);
	CHECK(h0 != 0 && h0 == h1);
	CHECK(s0.st_mtime == s1.st_mtime && s0.st_size == s1.st_size);
	unlink(path);
	return 0;
}

/* dim 1024: wq, wo and the head (1100 rows) are 2 MiB or more, wk/wv (256 rows) and the FFN
 * (512 wide) are not. */
TEST(huge_page_copy_f16)
{
	mkmodel_opts_t o = {.arch = "llama", .dim = 1024, .layers = 2, .heads = 8, .kv_heads = 2,
			    .ffn = 512, .vocab = 1100, .ctx = 64, .type = QT_F16, .seed = 5};
	int n = o.vocab, c1[2] = {0}, c0[2] = {0};
	float *a = calloc((size_t)2 * n, sizeof *a), *b = calloc((size_t)2 * n, sizeof *b);
	if (!run_both(&o, 1, count_copies, a, c1, b, c0)) {
		CHECK_EQ_INT(c1[0], 1 + 2 * 2); /* the head, wq and wo of both layers */
		CHECK_EQ_INT(c1[1], c1[0]);
		CHECK_EQ_INT(c0[1], 0);
		CHECK(!memcmp(a, b, (size_t)2 * n * sizeof *a));
	}
	free(a);
	free(b);
}

/* counts[0]: the head, if repacked, and the layers whose shared block's three matrices are */
static void count_shared_repacked(const model_t *m, int *counts)
{
	counts[0] = m->out.rp != NULL;
	for (int l = 0; l < m->meta.n_layers; l++) {
		const wmat_t *w[3];
		if (!m->layers[l].moe)
			continue;
		moe_shared_mats(m->layers[l].moe, w);
		counts[0] += w[0] && w[0]->rp && w[1]->rp && w[2]->rp;
	}
}

/* o's model as loaded and with SHOAL_NO_REPACK: the head and both layers repacked (f counts
 * them) where the type has a tiled kernel, and the logits of a prefill and 3 decode steps
 * within the bounds above. */
static void check_model(const mkmodel_opts_t *o, inspect_fn f)
{
	int type = o->type, n = o->vocab, r1 = 0, r0 = 0;
	float *a = calloc((size_t)4 * n, sizeof *a), *b = calloc((size_t)4 * n, sizeof *b);
	if (run_both(o, 3, f, a, &r1, b, &r0))
		goto out;
	CHECK_EQ_INT(r0, 0);
	const char *impl = quant_gemm_impl(type);
	if (impl && strcmp(impl, "ref")) {
		CHECK_EQ_INT(r1, 1 + 2); /* the head and both layers */
		int flips = 0;
		for (int i = 0; i < 4; i++) {
			double e = nmse(a + (size_t)i * n, b + (size_t)i * n, n);
			if (getenv("SHOAL_TEST_VERBOSE") || !(e < 1e-10))
				fprintf(stderr, "%s step %d: repacked vs original nmse %g\n",
					quant_type_name(type), i, e);
			CHECK(e < 1e-4);
			flips += !(e < 1e-10);
		}
		CHECK(flips <= 1);
	} else {
		CHECK_EQ_INT(r1, 0);
	}
out:
	free(a);
	free(b);
}

static void check_type(int type)
{
	mkmodel_opts_t o = {.arch = "llama",
			    .dim = 256,
			    .layers = 2,
			    .heads = 8,
			    .kv_heads = 2,
			    .ffn = 768,
			    .vocab = 520, /* not a multiple of 16: the head has tail rows */
			    .ctx = 64,
			    .type = type,
			    .seed = 3};
	check_model(&o, count_repacked);
}

/* qwen2moe: 8 experts of 64 (2 used) and a gated shared block of 128 */
TEST(repack_moe_shared_block)
{
	mkmodel_opts_t o = {.arch = "qwen2moe", .dim = 128, .layers = 2, .heads = 4,
			    .kv_heads = 2, .ffn = 128, .vocab = 520, .ctx = 64, .type = QT_Q8_0,
			    .seed = 11, .experts = 8, .experts_used = 2, .expert_ffn = 64};
	check_model(&o, count_shared_repacked);
}

TEST(repack_q8_0)
{
	check_type(QT_Q8_0);
}
TEST(repack_q4_0)
{
	check_type(QT_Q4_0);
}
TEST(repack_q4_k)
{
	check_type(QT_Q4_K);
}
TEST(repack_q6_k)
{
	check_type(QT_Q6_K);
}

int main(void)
{
	quant_init(0);
	RUN(repack_q8_0);
	RUN(repack_q4_0);
	RUN(repack_q4_k);
	RUN(repack_q6_k);
	RUN(huge_page_copy_f16);
	RUN(repack_moe_shared_block);
	return harness_done();
}
