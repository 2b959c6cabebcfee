/*
 * attn.c: attention over the KV cache, one work item per (token, query head) on the pool.
 *
 * The cache holds K and V rows in the model's KV type (F32, F16 or Q8_0, model_int.h). The fused
 * loop works per (KV head, block of ATT_QB tokens), for all the query heads of its group: a tile
 * of ATT_TILE positions of K (transposed) and V is converted to F32 once and serves every token
 * and query head of the item: 64 scores per query by the transposed-tile kernel (quant_qkt),
 * causally cut per token, then an online softmax (running max and sum per token and head; the
 * partial output is rescaled when the max grows) and the tile's values added by the F32 vsum
 * kernel. Only one tile of scores exists at a time, so a
 * long prompt never materialises its score matrix. attention_ref() is the plain version kept as
 * the oracle.
 *
 * A batch mixes sequences (continuous batching): token b reads the rows [0, bpos[b]] of its own
 * slot bslot[b]. The fused loop's token blocks are runs of tokens of one slot at consecutive
 * positions (a prompt chunk), so a tile serves the whole block; a decode batch's tokens are blocks
 * of one.
 *
 * Invariant: reads only cache rows written before the call; writes only m->att and the calling
 * thread's tile and score scratch.
 */
#include "common/common.h"
#include "infer/model/model_int.h"

#include <math.h>
#include <string.h>

void attn_cache_put(model_t *m, int lc, int slot, int pos, const float *k, const float *v)
{
	size_t at = kv_at(m, lc, slot, pos);
	quant_quantize_row(m->kv_type, k, m->kc + at, m->kvd);
	quant_quantize_row(m->kv_type, v, m->vc + at, m->kvd);
}

typedef struct att_job {
	model_t *m;
	int layer, B;
	const int *blk; /* [n_blk + 1]: token block i is [blk[i], blk[i + 1]) */
	int n_blk;
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
	*T = m->bpos[*b] + 1;
}

_Static_assert(ATT_TILE == 64, "quant_qkt_fn works on tiles of 64 keys");

/* Work item it = (local KV head g, tokens [*b0, *b1)): the shard's query heads [*h0, *h1) read
 * that KV head. */
static void att_kv_item(const att_job_t *j, int it, int *g, int *b0, int *b1, int *h0, int *h1)
{
	const model_t *m = j->m;
	int grp = m->meta.n_heads / m->meta.n_kv_heads, nkv = m->sh.n_kv_heads;
	*g = it % nkv;
	*b0 = j->blk[it / nkv];
	*b1 = j->blk[it / nkv + 1];
	int q0 = (m->sh.kv_head0 + *g) * grp; /* its query heads, as global head numbers */
	*h0 = MAX(q0, m->sh.q_head0) - m->sh.q_head0;
	*h1 = MIN(q0 + grp, m->sh.q_head0 + m->sh.n_q_heads) - m->sh.q_head0;
}

/* n cache rows (kv_row bytes apart, from k and v) as F32: K transposed into kt[hd][64] (columns
 * past n zeroed), V as rows hd apart in vt, or the V rows in place for an F32 cache (*vs: the
 * stride in bytes either way). */
static const float *att_tile(const model_t *m, const uint8_t *k, const uint8_t *v, int n, float *kt,
			     float *vt, size_t *vs)
{
	int hd = m->meta.head_dim;
	quant_dequant_fn dq =
	    m->kv_ops->dequant ? m->kv_ops->dequant : quant_ops_ref(m->kv_type)->dequant;
	if (m->kv_type == QT_F16) {
		m->kt_f16(kt, k, m->kv_row, n, hd);
	} else {
		float *tmp = vt; /* the first V row is written last */
		for (int t = 0; t < n; t++) {
			dq(k + (size_t)t * m->kv_row, tmp, hd);
			for (int i = 0; i < hd; i++)
				kt[i * ATT_TILE + t] = tmp[i];
		}
		for (int i = 0; n < ATT_TILE && i < hd; i++)
			memset(kt + i * ATT_TILE + n, 0, (size_t)(ATT_TILE - n) * sizeof *kt);
	}
	if (m->kv_type == QT_F32) {
		*vs = m->kv_row;
		return (const float *)v;
	}
	for (int t = 0; t < n; t++)
		dq(v + (size_t)t * m->kv_row, vt + (size_t)t * hd, hd);
	*vs = (size_t)hd * sizeof(float);
	return vt;
}

/* The next tile's K and V rows (one head's bytes of each, hb) are asked for while this one is
 * worked on: the rows are a whole cache row apart (all heads), a stride that reaches memory on
 * every row once the context outgrows the caches, and the tile waited on each (measured at
 * 1,024 positions, Q4_0, F16 cache, 1 thread: decode 40 -> 45 tok/s). */
static void att_prefetch(const uint8_t *k, const uint8_t *v, size_t row, int n, size_t hb)
{
	for (int t = 0; t < n; t++)
		for (size_t o = 0; o < hb; o += 64) {
			__builtin_prefetch(k + (size_t)t * row + o);
			__builtin_prefetch(v + (size_t)t * row + o);
		}
}

static void att_task(void *ctx, int c, int nc, int tid)
{
	att_job_t *j = ctx;
	model_t *m = j->m;
	int hd = m->meta.head_dim;
	float scale = 1.0f / sqrtf((float)hd);
	size_t row = m->kv_row;
	float *kt = m->att_tiles + (size_t)tid * 2 * ATT_TILE * hd, *vbuf = kt + ATT_TILE * hd;
	float s[ATT_GROUP * ATT_TILE], mx[ATT_QB][ATT_GROUP], sum[ATT_QB][ATT_GROUP];
	const float *qp[ATT_GROUP];
	float *op[ATT_GROUP];
	int lo, hi;
	pool_split(j->m->sh.n_kv_heads * j->n_blk, c, nc, 1, &lo, &hi);
	for (int it = lo; it < hi; it++) {
		int g, b0, b1, h0, h1;
		att_kv_item(j, it, &g, &b0, &b1, &h0, &h1);
		size_t hoff = quant_row_bytes(m->kv_type, (int64_t)g * hd);
		size_t base = kv_at(m, j->layer, m->bslot[b0], 0) + hoff; /* the block's slot */
		const uint8_t *kc = m->kc + base, *vc = m->vc + base;
		for (int b = b0; b < b1; b++)
			for (int h = h0; h < h1; h++) {
				memset(m->att + (size_t)b * m->qd + (size_t)h * hd, 0,
				       (size_t)hd * sizeof(float));
				mx[b - b0][h - h0] = -INFINITY;
				sum[b - b0][h - h0] = 0;
			}
		int tmax = m->bpos[b1 - 1] + 1; /* the block's last token sees the most */
		for (int t0 = 0; t0 < tmax; t0 += ATT_TILE) {
			int n = MIN(ATT_TILE, tmax - t0);
			size_t vs;
			if (t0 + ATT_TILE < tmax)
				att_prefetch(kc + (size_t)(t0 + ATT_TILE) * row,
					     vc + (size_t)(t0 + ATT_TILE) * row, row,
					     MIN(ATT_TILE, tmax - t0 - ATT_TILE),
					     quant_row_bytes(m->kv_type, hd));
			const float *vt = att_tile(m, kc + (size_t)t0 * row, vc + (size_t)t0 * row,
						   n, kt, vbuf, &vs);
			for (int b = b0; b < b1; b++) {
				int nb =
				    MIN(n, m->bpos[b] + 1 - t0); /* causal: this token's share */
				if (nb <= 0)
					continue;
				for (int h = h0; h < h1; h++) {
					qp[h - h0] = m->q + (size_t)b * m->qd + (size_t)h * hd;
					op[h - h0] = m->att + (size_t)b * m->qd + (size_t)h * hd;
				}
				m->qkt(s, qp, h1 - h0, kt, hd); /* the group's scores at once */
				for (int h = h0; h < h1; h++) {
					float *o = op[h - h0],
					      *sh = s + (size_t)(h - h0) * ATT_TILE;
					float *M = &mx[b - b0][h - h0], *S = &sum[b - b0][h - h0];
					float tmx = -INFINITY;
					for (int t = 0; t < nb; t++) {
						sh[t] *= scale;
						tmx = sh[t] > tmx ? sh[t] : tmx;
					}
					/* a new max rescales what was summed so far */
					if (tmx > *M) {
						float f = expf(*M - tmx);
						if (*M != -INFINITY)
							for (int i = 0; i < hd; i++)
								o[i] *= f;
						*S *= f;
						*M = tmx;
					}
					*S += m->expsum(sh, nb, *M);
				}
				m->av(op, s, h1 - h0, vt, vs / sizeof(float), nb, hd);
			}
		}
		for (int b = b0; b < b1; b++)
			for (int h = h0; h < h1; h++) {
				float *o = m->att + (size_t)b * m->qd + (size_t)h * hd;
				float inv = 1.0f / sum[b - b0][h - h0];
				for (int i = 0; i < hd; i++)
					o[i] *= inv;
			}
	}
}

void attention(model_t *m, int lc, int B)
{
	int blk[B + 1], n_blk = 0; /* runs of one slot at consecutive positions, ATT_QB at most */
	for (int b = 0; b < B; b++)
		if (!n_blk || b - blk[n_blk - 1] >= ATT_QB || m->bslot[b] != m->bslot[b - 1] ||
		    m->bpos[b] != m->bpos[b - 1] + 1)
			blk[n_blk++] = b;
	blk[n_blk] = B;
	att_job_t aj = {m, lc, B, blk, n_blk};
	int items = n_blk * m->sh.n_kv_heads;
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
	size_t row = m->kv_row;
	int lo, hi;
	pool_split(j->B * m->sh.n_q_heads, c, nc, 1, &lo, &hi);
	for (int it = lo; it < hi; it++) {
		int b, h, T;
		size_t hoff;
		att_item(j, it, &b, &h, &hoff, &T);
		size_t layer = kv_at(m, j->layer, m->bslot[b], 0);
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

void attention_ref(model_t *m, int lc, int B)
{
	att_job_t aj = {m, lc, B, NULL, 0};
	int items = B * m->sh.n_q_heads;
	pool_run(m->pool, att_ref_task, &aj, MIN(items, 4 * pool_threads(m->pool)));
}
