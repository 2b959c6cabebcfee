/*
 * embed.c: the pooling arithmetic of embeddings (embed.h). Sums are taken in the order of the
 * positions, the mean divides once at the end, and the length is computed in double, so one
 * sequence gives the same bits however its prompt was cut into steps.
 */
#include "infer/embed.h"

#include <math.h>
#include <string.h>

#include "infer/infer.h"

int embed_pool_wants(int kind, int pos, int n)
{
	switch (kind) {
	case ENG_POOL_MEAN: return 1;
	case ENG_POOL_CLS: return pos == 0;
	default: return pos == n - 1; /* LAST (and the default for decoders) */
	}
}

void embed_pool_add(float *acc, const float *h, int dim, int kind, int pos, int n)
{
	if (!embed_pool_wants(kind, pos, n))
		return;
	if (kind == ENG_POOL_MEAN)
		for (int i = 0; i < dim; i++)
			acc[i] += h[i];
	else
		memcpy(acc, h, (size_t)dim * sizeof *acc);
}

double embed_l2_normalize(float *v, int n)
{
	double sum = 0;
	for (int i = 0; i < n; i++)
		sum += (double)v[i] * v[i];
	sum = sqrt(sum);
	float k = sum > 0 ? (float)(1.0 / sum) : 0.0f;
	for (int i = 0; i < n; i++)
		v[i] *= k;
	return sum;
}

void embed_pool_finish(float *acc, int dim, int kind, int n)
{
	if (kind == ENG_POOL_MEAN && n > 0)
		for (int i = 0; i < dim; i++)
			acc[i] /= (float)n;
	embed_l2_normalize(acc, dim);
}
