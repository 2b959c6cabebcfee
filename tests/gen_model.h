/* gen_model.h: a small generated model opened for a test (test_model.c, test_slices.c): the same
 * shapes in both so their results compare. Test code only; include once per test program, after
 * infer/gguf_write.h. */
#ifndef SHOAL_TEST_GEN_MODEL_H
#define SHOAL_TEST_GEN_MODEL_H

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

static int gen_open(gen_t *x, const char *arch, int type, int threads, char *path)
{
	char err[256];
	memset(x, 0, sizeof *x);
	mkmodel_opts_t o = {.arch = arch,
			    .dim = 256,
			    .layers = 2,
			    .heads = 8,
			    .kv_heads = 2,
			    .ffn = 512,
			    .vocab = 512,
			    .ctx = 256,
			    .type = type,
			    .seed = 7};
	if (!strcmp(arch, "qwen3"))
		o.head_dim = 64; /* heads * head_dim (512) != dim: the explicit head size path */
	snprintf(path, 256, "/tmp/shoal-test-model-%d-%s-%d.gguf", (int)getpid(), arch, type);
	if (mkmodel_write(&o, path, err, sizeof err) || gguf_open(&x->g, path, err, sizeof err) ||
	    meta_load(&x->meta, x->g, err, sizeof err) || !(x->pool = pool_new(threads)) ||
	    model_new(&x->m, x->g, &x->meta, NULL, 256, x->pool, err, sizeof err)) {
		fprintf(stderr, "gen_open %s: %s\n", arch, err);
		return -1;
	}
	return 0;
}

static void gen_close(gen_t *x, const char *path)
{
	model_free(x->m);
	pool_free(x->pool);
	gguf_free(x->g);
	unlink(path);
}

#endif
