/*
 * attn.c: attention over the KV cache, one work item per (token, query head) on the pool.
 *
 * Invariant: token b reads the cache rows [0, bpos[b]] of its own slot bslot[b] (a batch mixes
 * sequences), written before the call; writes only m->att and the per-thread score rows.
 */
#include "common/common.h"
#include "infer/model/model_int.h"

#include <math.h>

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct att_job {
	model_t *m;
	int layer, B;
} att_job_t;

/* Work item i = (token b, local head h): att[b][h] = softmax(q . K^T / sqrt(hd)) V over
 * positions [0, bpos[b]] of slot bslot[b]. */
static void att_task(void *ctx, int c, int nc, int tid)
{
	att_job_t *j = ctx;
	model_t *m = j->m;
	int hd = m->meta.head_dim, nh = m->sh.n_q_heads;
	int grp = m->meta.n_heads / m->meta.n_kv_heads;
	float scale = 1.0f / sqrtf((float)hd);
	float *sc = m->scores + (size_t)tid * m->n_ctx;
	int lo, hi;
	pool_split(j->B * nh, c, nc, 1, &lo, &hi);
	for (int it = lo; it < hi; it++) {
		int b = it / nh, h = it % nh;
		int kvh = (m->sh.q_head0 + h) / grp - m->sh.kv_head0;
		int T = m->bpos[b] + 1;
		const float *kc = m->kc + kv_at(m, j->layer, m->bslot[b], 0);
		const float *vc = m->vc + kv_at(m, j->layer, m->bslot[b], 0);
		const float *q = m->q + (size_t)b * m->qd + (size_t)h * hd;
		/* sc[t] = q . k_t: the F32 matvec kernel over the cache rows of this KV head */
		quant_act_t qa = {.type = QT_F32, .f = q};
		m->f32->rows(sc, (const uint8_t *)(kc + (size_t)kvh * hd),
			     (size_t)m->kvd * sizeof(float), T, &qa, hd);
		float mx = -INFINITY;
		for (int t = 0; t < T; t++) {
			sc[t] *= scale;
			mx = fmaxf(mx, sc[t]);
		}
		float sum = m->expsum(sc, T, mx);
		float inv = 1.0f / sum;
		for (int t = 0; t < T; t++)
			sc[t] *= inv;
		/* att[b][h] = sum_t sc[t] * v_t */
		m->wsum(m->att + (size_t)b * m->qd + (size_t)h * hd, sc, vc + (size_t)kvh * hd,
			(size_t)m->kvd, T, hd);
	}
}

void attention(model_t *m, int lc, int B)
{
	att_job_t aj = {m, lc, B};
	int items = B * m->sh.n_q_heads;
	pool_run(m->pool, att_task, &aj, MIN(items, 4 * pool_threads(m->pool)));
}
