/*
 * attn.c: attention over the KV cache, one work item per (token, query head) on the pool.
 *
 * The cache holds K and V rows in the model's KV type (F32, F16 or Q8_0, model_int.h). The fused
 * loop works per (token, KV head), for all the query heads of its group: a tile of ATT_TILE
 * positions of K and V is converted to F32 once (an F32 cache is read in place) and serves every
 * query head of the group: a tile of scores by the F32 matvec kernel, then an online softmax
 * (running max and sum per head; the partial output is rescaled when the max grows) and the
 * tile's values added by the F32 vsum kernel. Only one tile of scores exists at a time, so a
 * long prompt never materialises its score matrix. attention_ref() is the plain version kept as
 * the oracle.
 *
 * Invariant: reads the cache rows [0, pos + b] of its layer, written before the call; writes only
 * m->att and the calling thread's tile and score scratch.
 */
#include "common/common.h"
#include "infer/model/model_int.h"

#include <math.h>
#include <string.h>

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

/* Work item it = (token b, local KV head g): the shard's query heads [*h0, *h1) that read it. */
static void att_kv_item(const att_job_t *j, int it, int *b, int *g, int *h0, int *h1)
{
	const model_t *m = j->m;
	int grp = m->meta.n_heads / m->meta.n_kv_heads, nkv = m->sh.n_kv_heads;
	*b = it / nkv;
	*g = it % nkv;
	int q0 = (m->sh.kv_head0 + *g) * grp; /* its query heads, as global head numbers */
	*h0 = MAX(q0, m->sh.q_head0) - m->sh.q_head0;
	*h1 = MIN(q0 + grp, m->sh.q_head0 + m->sh.n_q_heads) - m->sh.q_head0;
}

/* One tile of n cache rows (row bytes apart, from p) as F32 rows hd apart in dst, or the rows
 * themselves when the cache is F32 (*stride in bytes either way). */
static const float *att_tile(const model_t *m, const uint8_t *p, int n, float *dst, size_t *stride)
{
	int hd = m->meta.head_dim;
	if (m->kv_type == QT_F32) {
		*stride = m->kv_row;
		return (const float *)p;
	}
	quant_dequant_fn dq =
	    m->kv_ops->dequant ? m->kv_ops->dequant : quant_ops_ref(m->kv_type)->dequant;
	for (int t = 0; t < n; t++)
		dq(p + (size_t)t * m->kv_row, dst + (size_t)t * hd, hd);
	*stride = (size_t)hd * sizeof(float);
	return dst;
}

static void att_task(void *ctx, int c, int nc, int tid)
{
	att_job_t *j = ctx;
	model_t *m = j->m;
	int hd = m->meta.head_dim;
	float scale = 1.0f / sqrtf((float)hd);
	size_t row = m->kv_row, layer = (size_t)j->layer * m->n_ctx * row;
	float *kbuf = m->att_tiles + (size_t)tid * 2 * ATT_TILE * hd, *vbuf = kbuf + ATT_TILE * hd;
	float s[ATT_TILE], mx[ATT_GROUP], sum[ATT_GROUP];
	int lo, hi;
	pool_split(j->B * m->sh.n_kv_heads, c, nc, 1, &lo, &hi);
	for (int it = lo; it < hi; it++) {
		int b, g, h0, h1, T = 0;
		att_kv_item(j, it, &b, &g, &h0, &h1);
		T = j->pos + b + 1;
		size_t hoff = quant_row_bytes(m->kv_type, (int64_t)g * hd);
		const uint8_t *kc = m->kc + layer + hoff, *vc = m->vc + layer + hoff;
		for (int h = h0; h < h1; h++) {
			memset(m->att + (size_t)b * m->qd + (size_t)h * hd, 0,
			       (size_t)hd * sizeof(float));
			mx[h - h0] = -INFINITY;
			sum[h - h0] = 0;
		}
		for (int t0 = 0; t0 < T; t0 += ATT_TILE) {
			int n = MIN(ATT_TILE, T - t0);
			size_t ks, vs;
			const float *kt = att_tile(m, kc + (size_t)t0 * row, n, kbuf, &ks);
			const float *vt = att_tile(m, vc + (size_t)t0 * row, n, vbuf, &vs);
			for (int h = h0; h < h1; h++) {
				float *o = m->att + (size_t)b * m->qd + (size_t)h * hd;
				quant_act_t qa = {.type = QT_F32,
						  .f = m->q + (size_t)b * m->qd + (size_t)h * hd};
				m->f32_ops->rows(s, (const uint8_t *)kt, ks, n, &qa, hd);
				float tmx = -INFINITY, *M = &mx[h - h0], *S = &sum[h - h0];
				for (int t = 0; t < n; t++) {
					s[t] *= scale;
					tmx = s[t] > tmx ? s[t] : tmx;
				}
				if (tmx > *M) { /* rescale what was summed under the old max */
					float f = expf(*M - tmx);
					if (*M != -INFINITY)
						for (int i = 0; i < hd; i++)
							o[i] *= f;
					*S *= f;
					*M = tmx;
				}
				*S += m->expsum(s, n, *M);
				m->vsum_f32(o, s, (const uint8_t *)vt, vs, n, hd);
			}
		}
		for (int h = h0; h < h1; h++) {
			float *o = m->att + (size_t)b * m->qd + (size_t)h * hd,
			      inv = 1.0f / sum[h - h0];
			for (int i = 0; i < hd; i++)
				o[i] *= inv;
		}
	}
}

void attention(model_t *m, int lc, int B, int pos)
{
	att_job_t aj = {m, lc, B, pos};
	int items = B * m->sh.n_kv_heads;
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
