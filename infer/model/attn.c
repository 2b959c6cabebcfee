/*
 * attn.c: attention over the KV cache, one work item per (token, query head) on the pool.
 *
 * The cache holds K and V rows in the model's KV type (F32, F16 or Q8_0, model_int.h); the
 * fused loop reads them in place through that type's kernels: a tile of scores by the matvec
 * kernel (the query prepared once per item as that kernel's activation), then an online softmax
 * (running max and sum; the partial output is rescaled when the max grows) and the tile's values
 * added by the type's vsum kernel. Per item only one tile of scores exists, so a long prompt
 * never materialises its score matrix. attention_ref() is the plain version kept as the oracle.
 *
 * Invariant: reads the cache rows [0, pos + b] of its layer, written before the call; writes only
 * m->att (and, for the reference, the per-thread score rows).
 */
#include "common/common.h"
#include "infer/model/model_int.h"

#include <math.h>
#include <string.h>

#define ATT_TILE 64 /* positions per score tile (stays in L1 with its values) */

void attn_cache_put(model_t *m, int lc, int pos, const float *k, const float *v)
{
	size_t at = ((size_t)lc * m->n_ctx + (size_t)pos) * m->kv_row;
	quant_quantize_row(m->kv_type, k, m->kc + at, m->kvd);
	quant_quantize_row(m->kv_type, v, m->vc + at, m->kvd);
}

typedef struct att_job {
	model_t *m;
	int layer, B, pos;
} att_job_t;

/* Item it of a job as (token b, local head h): its KV head's cache columns start hoff bytes
 * into each row; T positions are visible. */
static void att_item(const att_job_t *j, int it, int *b, int *h, size_t *hoff, int *T)
{
	const model_t *m = j->m;
	int nh = m->sh.n_q_heads, grp = m->meta.n_heads / m->meta.n_kv_heads;
	*b = it / nh;
	*h = it % nh;
	int kvh = (m->sh.q_head0 + *h) / grp - m->sh.kv_head0;
	*hoff = quant_row_bytes(m->kv_type, (int64_t)kvh * m->meta.head_dim);
	*T = j->pos + *b + 1;
}

static void att_task(void *ctx, int c, int nc, int tid)
{
	att_job_t *j = ctx;
	model_t *m = j->m;
	int hd = m->meta.head_dim;
	float scale = 1.0f / sqrtf((float)hd);
	size_t row = m->kv_row, layer = (size_t)j->layer * m->n_ctx * row;
	_Alignas(64) uint8_t qbuf[2048]; /* the query as the score kernel's activation */
	float s[ATT_TILE];
	int lo, hi;
	(void)tid;
	pool_split(j->B * m->sh.n_q_heads, c, nc, 1, &lo, &hi);
	for (int it = lo; it < hi; it++) {
		int b, h, T;
		size_t hoff;
		att_item(j, it, &b, &h, &hoff, &T);
		const uint8_t *kc = m->kc + layer + hoff, *vc = m->vc + layer + hoff;
		float *o = m->att + (size_t)b * m->qd + (size_t)h * hd;
		quant_act_t qa;
		quant_act_prepare(m->kv_type, m->q + (size_t)b * m->qd + (size_t)h * hd, hd, qbuf,
				  &qa);
		memset(o, 0, (size_t)hd * sizeof *o);
		float mx = -INFINITY, sum = 0;
		for (int t0 = 0; t0 < T; t0 += ATT_TILE) {
			int n = MIN(ATT_TILE, T - t0);
			m->kv_ops->rows(s, kc + (size_t)t0 * row, row, n, &qa, hd);
			float tmx = -INFINITY;
			for (int t = 0; t < n; t++) {
				s[t] *= scale;
				tmx = fmaxf(tmx, s[t]);
			}
			if (tmx > mx) { /* rescale what was summed under the old max */
				float f = expf(mx - tmx);
				if (mx != -INFINITY)
					for (int i = 0; i < hd; i++)
						o[i] *= f;
				sum *= f;
				mx = tmx;
			}
			sum += m->expsum(s, n, mx);
			m->vsum(o, s, vc + (size_t)t0 * row, row, n, hd);
		}
		float inv = 1.0f / sum;
		for (int i = 0; i < hd; i++)
			o[i] *= inv;
	}
}

void attention(model_t *m, int lc, int B, int pos)
{
	att_job_t aj = {m, lc, B, pos};
	int items = B * m->sh.n_q_heads;
	pool_run(m->pool, att_task, &aj, MIN(items, 4 * pool_threads(m->pool)));
}

/* ---- the plain version ------------------------------------------------------------------ */

static void att_ref_task(void *ctx, int c, int nc, int tid)
{
	att_job_t *j = ctx;
	model_t *m = j->m;
	int hd = m->meta.head_dim;
	float scale = 1.0f / sqrtf((float)hd), kv[1024];
	float *sc = m->scores + (size_t)tid * m->n_ctx;
	size_t row = m->kv_row, layer = (size_t)j->layer * m->n_ctx * row;
	int lo, hi;
	pool_split(j->B * m->sh.n_q_heads, c, nc, 1, &lo, &hi);
	for (int it = lo; it < hi; it++) {
		int b, h, T;
		size_t hoff;
		att_item(j, it, &b, &h, &hoff, &T);
		const float *q = m->q + (size_t)b * m->qd + (size_t)h * hd;
		float *o = m->att + (size_t)b * m->qd + (size_t)h * hd, mx = -INFINITY, sum = 0;
		for (int t = 0; t < T; t++) {
			quant_dequant_row(m->kv_type, m->kc + layer + (size_t)t * row + hoff, kv,
					  hd);
			float d = 0;
			for (int i = 0; i < hd; i++)
				d += q[i] * kv[i];
			sc[t] = d * scale;
			mx = fmaxf(mx, sc[t]);
		}
		for (int t = 0; t < T; t++)
			sum += sc[t] = expf(sc[t] - mx);
		memset(o, 0, (size_t)hd * sizeof *o);
		for (int t = 0; t < T; t++) {
			quant_dequant_row(m->kv_type, m->vc + layer + (size_t)t * row + hoff, kv,
					  hd);
			for (int i = 0; i < hd; i++)
				o[i] += sc[t] / sum * kv[i];
		}
	}
}

void attention_ref(model_t *m, int lc, int B, int pos)
{
	att_job_t aj = {m, lc, B, pos};
	int items = B * m->sh.n_q_heads;
	pool_run(m->pool, att_ref_task, &aj, MIN(items, 4 * pool_threads(m->pool)));
}
