/* gen_model.h: a small generated model opened for a test (test_model.c, test_slices.c): the same
 * shapes in both so their results compare; gen_file writes and opens any generated model
 * (test_kvcache.c, test_moe.c too). Test code only. */
#ifndef SHOAL_TEST_GEN_MODEL_H
#define SHOAL_TEST_GEN_MODEL_H

#include "infer/gguf_write.h"
#include "infer/model/meta.h"
#include "infer/model/model.h"
#include "infer/pool.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A generated model, opened: returns 0 on success. */
typedef struct gen {
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

static inline int gen_open(gen_t *x, const char *arch, int type, int threads, char *path)
{
	char err[256];
	memset(x, 0, sizeof *x);
	mkmodel_opts_t o = gen_opts(arch, type, 7);
	snprintf(path, 256, "/tmp/shoal-test-model-%d-%s-%d.gguf", (int)getpid(), arch, type);
	if (gen_file(&o, path, &x->g, &x->meta, arch))
		return -1;
	if (!(x->pool = pool_new(threads)) ||
	    model_new(&x->m, x->g, &x->meta, NULL, 256, x->pool, err, sizeof err)) {
		fprintf(stderr, "gen_open %s: %s\n", arch, x->pool ? err : "no threads");
		return -1;
	}
	return 0;
}

/* Writes o's model to path and opens it with one slot of ctx positions of kv_type, on a pool of
 * threads: 0, or -1 with the reason printed. */
static inline int gen_open_kv(gen_t *x, const mkmodel_opts_t *o, const char *path, int ctx,
			      int kv_type, int threads)
{
	char err[256];
	memset(x, 0, sizeof *x);
	if (gen_file(o, path, &x->g, &x->meta, o->arch))
		return -1;
	if (!(x->pool = pool_new(threads)) ||
	    model_new_kv(&x->m, x->g, &x->meta, NULL, ctx, kv_type, x->pool, err, sizeof err)) {
		fprintf(stderr, "gen_open_kv %s: %s\n", o->arch, x->pool ? err : "no threads");
		return -1;
	}
	return 0;
}

static inline void gen_close(gen_t *x, const char *path)
{
	model_free(x->m);
	pool_free(x->pool);
	gguf_free(x->g);
	unlink(path);
}

#endif
