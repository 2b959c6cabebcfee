/*
 * model_fix.h: the small helpers test_swa, test_gemma and test_glm compare with, next to the one
 * fixture (gen_model.h's gen_open_slots): a relative logit error, pseudo-random prompts, and a
 * generated file made bad in one place. Test code only.
 */
#ifndef SHOAL_TEST_MODEL_FIX_H
#define SHOAL_TEST_MODEL_FIX_H

#include "common/common.h"
#include "gen_model.h"

#include <math.h>

/* max |a - b| / max |b| over n values. */
static inline double rel_err(const float *a, const float *b, int n)
{
	double num = 0, den = 0;
	for (int i = 0; i < n; i++) {
		num = fmax(num, fabs((double)a[i] - b[i]));
		den = fmax(den, fabs((double)b[i]));
	}
	return num / fmax(den, 1e-30);
}

/* n pseudo-random token ids below vocab from seed. */
static inline void rand_tokens(int *t, int n, uint32_t seed, int vocab)
{
	for (int i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		t[i] = (int)((seed >> 8) % (uint32_t)vocab);
	}
}

/* Overwrites the first occurrence of from in the file at path with to (as long): a key or a
 * tensor renamed in a valid file. 0, or -1 when from is not there. */
static inline int file_replace(const char *path, const char *from, const char *to)
{
	char *buf, err[128];
	size_t len, n = strlen(from);
	if (read_file_all(path, &buf, &len, err, sizeof err))
		return -1;
	int rc = -1;
	for (size_t i = 0; i + n <= len; i++)
		if (!memcmp(buf + i, from, n)) {
			memcpy(buf + i, to, n);
			rc = 0;
			break;
		}
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(buf, 1, len, f) != len)
		rc = -1;
	if (f)
		fclose(f);
	free(buf);
	return rc;
}

/* Writes o's file at path, overwrites from with to in it (file_replace) and loads its metadata:
 * meta_load's result with the reason in err, or 1 when the file could not be made so. */
static inline int model_fix_bad(const mkmodel_opts_t *o, const char *path, const char *from,
				const char *to, char *err, size_t errlen)
{
	gguf_t *g = NULL;
	model_meta_t m;
	err[0] = 0;
	if (mkmodel_write(o, path, err, errlen) || file_replace(path, from, to) ||
	    gguf_open(&g, path, err, errlen))
		return 1;
	int rc = meta_load(&m, g, err, errlen);
	gguf_free(g);
	return rc;
}

#endif
