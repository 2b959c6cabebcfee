/* gen_model.h: the tests' one model fixture: a generated model written to a temporary file and
 * opened (gen_open_opts for any shapes: test_mla.c, test_moe.c, test_kvcache.c; gen_open_slots
 * with several sequences and adjusted metadata: test_swa.c, test_gemma.c, test_glm.c), and the
 * shared small shapes of test_model.c and test_slices.c (gen_open) so their results compare. Test
 * code only. */
#ifndef SHOAL_TEST_GEN_MODEL_H
#define SHOAL_TEST_GEN_MODEL_H

#include "infer/gguf_write.h"
#include "infer/model/meta.h"
#include "infer/model/model.h"
#include "infer/pool.h"
#include "infer/quant/quant.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A generated model: its file (removed by gen_close), metadata, threads, and the model opened
 * on them (NULL when the test makes its own). */
typedef struct gen {
	char path[256];
	gguf_t *g;
	model_meta_t meta;
	model_t *m;
	pool_t *pool;
} gen_t;

/* Writes the model o describes to path and opens it (file and metadata): 0 on success, else -1
 * with the reason printed after what. */
static inline int gen_file(const mkmodel_opts_t *o, const char *path, gguf_t **g,
			   model_meta_t *meta, const char *what)
{
	char err[256];
	if (mkmodel_write(o, path, err, sizeof err) || gguf_open(g, path, err, sizeof err) ||
	    meta_load(meta, *g, err, sizeof err)) {
		fprintf(stderr, "%s: %s\n", what, err);
		return -1;
	}
	return 0;
}

/* Writes the model o describes to /tmp/shoal-test-PID-TAG.gguf, its path into path (256
 * bytes): a file a test opens itself (engines, ranks). Returns 0, or -1 with the reason printed.
 * The caller removes the file. */
static inline int gen_write(char path[256], const mkmodel_opts_t *o, const char *tag)
{
	char err[256];
	snprintf(path, 256, "/tmp/shoal-test-%d-%s.gguf", (int)getpid(), tag);
	if (mkmodel_write(o, path, err, sizeof err)) {
		fprintf(stderr, "mkmodel %s: %s\n", tag, err);
		return -1;
	}
	return 0;
}

/* The fixture's shapes in arch, weight type and seed. */
static inline mkmodel_opts_t gen_opts(const char *arch, int type, int seed)
{
	mkmodel_opts_t o = {.arch = arch,
			    .dim = 256,
			    .layers = 2,
			    .heads = 8,
			    .kv_heads = 2,
			    .ffn = 512,
			    .vocab = 512,
			    .ctx = 256,
			    .type = type,
			    .seed = seed};
	if (!strcmp(arch, "qwen3"))
		o.head_dim = 64; /* heads * head_dim (512) != dim: the explicit head size path */
	return o;
}

/* A small hybrid model (qwen35: Gated DeltaNet layers and a gated full-attention layer every
 * 4th) in F32 with ctx positions: the shape of the tests that roll recurrent state back
 * (test_batch, test_spec). */
static inline mkmodel_opts_t gen_hybrid_opts(int ctx, int seed)
{
	return (mkmodel_opts_t){.arch = "qwen35",
				.dim = 128,
				.layers = 4,
				.heads = 4,
				.kv_heads = 2,
				.head_dim = 32,
				.ffn = 256,
				.vocab = 512,
				.ctx = ctx,
				.type = QT_F32,
				.seed = seed,
				.ssm_state = 32,
				.ssm_k_heads = 2,
				.ssm_v_heads = 4};
}

/* The one fixture: writes the model o describes (its file named after tag and a serial, so
 * fixtures open at once never share a file), opens it with `threads` threads, lets tweak adjust
 * the metadata (NULL: none) and, when ctx > 0, makes the model with n_slots sequences of ctx
 * positions in kv_type (-1: model_new's default). Returns 0, else -1 with the reason printed;
 * gen_close either way. */
static inline int gen_open_slots(gen_t *x, const mkmodel_opts_t *o, const char *tag, int threads,
				 int ctx, int n_slots, int kv_type, void (*tweak)(model_meta_t *))
{
	static int serial;
	char err[256] = "no threads";
	memset(x, 0, sizeof *x);
	snprintf(x->path, sizeof x->path, "/tmp/shoal-test-%d-%s-%s-%d-%d.gguf", (int)getpid(), tag,
		 o->arch, o->type, serial++);
	if (gen_file(o, x->path, &x->g, &x->meta, tag))
		return -1;
	if (tweak)
		tweak(&x->meta);
	if (!(x->pool = pool_new(threads)) ||
	    (ctx > 0 &&
	     model_new_slots(&x->m, x->g, &x->meta, NULL, ctx, n_slots,
			     kv_type < 0 ? MODEL_KV_DEFAULT : kv_type, x->pool, err, sizeof err))) {
		fprintf(stderr, "gen_open %s: %s\n", tag, err);
		return -1;
	}
	return 0;
}

/* gen_open_slots with one sequence and the metadata as written. */
static inline int gen_open_opts(gen_t *x, const mkmodel_opts_t *o, const char *tag, int threads,
				int ctx, int kv_type)
{
	return gen_open_slots(x, o, tag, threads, ctx, 1, kv_type, NULL);
}

/* The shared shapes (gen_opts, seed 7) with a context of 256 in the default cache. */
static inline int gen_open(gen_t *x, const char *arch, int type, int threads)
{
	mkmodel_opts_t o = gen_opts(arch, type, 7);
	return gen_open_opts(x, &o, "model", threads, 256, -1);
}

/* Frees what gen_open* opened and removes the file it wrote (none when path is ""). */
static inline void gen_close(gen_t *x)
{
	model_free(x->m);
	pool_free(x->pool);
	gguf_free(x->g);
	if (x->path[0])
		unlink(x->path);
	memset(x, 0, sizeof *x);
}

#endif
