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
 * slot bslot[b]; in a sliding-window layer (kvl[lc].win = W) only [bpos[b] - W + 1, bpos[b]],
 * as llama.cpp masks it (is_masked_swa, standard), which may lie in a ring (swa.c): tiles are
 * whole ATT_TILE-aligned runs of positions, and each token's share of a tile is [s0, nb). The fused
 * loop's token blocks are runs of tokens of one slot at consecutive positions (a prompt chunk), so
 * a tile serves the whole block; a decode batch's tokens are blocks of one.
 *
 * gpt-oss's attention sinks (one learned logit per head, llama.cpp's ggml_soft_max_add_sinks)
 * take part in the softmax's max and sum but add no value: the online softmax starts from them.
 *
 * Invariant: reads only cache rows written before the call; writes only m->att and the calling
 * thread's tile and score scratch.
 */
#include "common/common.h"
#include "infer/model/model_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void attn_cache_put(model_t *m, int lc, int slot, int pos, const float *k, const float *v)
{
	int hd = m->meta.head_dim;
	size_t es = m->kv_hrow / (size_t)hd; /* tiled K: element bytes */
	uint8_t row[1024 * sizeof(float)];
	for (int h = 0; h < m->sh.n_kv_heads; h++) {
		const float *kh = k + (size_t)h * hd;
		quant_quantize_row(m->kv_type, v + (size_t)h * hd,
				   m->vc + kv_at(m, lc, slot, h, pos), hd);
		if (!m->kt_tiled) {
			quant_quantize_row(m->kv_type, kh, m->kc + kv_at(m, lc, slot, h, pos), hd);
			continue;
		}
		/* converted as a row, then written down column pos of the tile */
		uint8_t *c = m->kc + kv_k_at(m, lc, slot, h, pos, 0);
		quant_quantize_row(m->kv_type, kh, row, hd);
		for (int d = 0; d < hd; d++)
			memcpy(c + (size_t)d * ATT_TILE * es, row + (size_t)d * es, es);
	}
}

/* K at position pos of local KV head h as F32 (whichever layout K has). */
static void kv_k_row(const model_t *m, int lc, int slot, int h, int pos, float *out)
{
	int hd = m->meta.head_dim;
	if (!m->kt_tiled) {
		quant_dequant_row(m->kv_type, m->kc + kv_at(m, lc, slot, h, pos), out, hd);
		return;
	}
	for (int d = 0; d < hd; d++)
		quant_dequant_row(m->kv_type, m->kc + kv_k_at(m, lc, slot, h, pos, d), out + d, 1);
}

typedef struct att_job {
	model_t *m;
	int layer, B;
	const int *blk; /* [n_blk + 1]: token block i is [blk[i], blk[i + 1]) */
	int n_blk;
	int hs; /* att_task: parts each KV head's query heads are split into */
} att_job_t;

/* Item it of a job as (token b, local head h) reading local KV head *kvh; T positions are
 * visible. */
static void att_item(const att_job_t *j, int it, int *b, int *h, int *kvh, int *T)
{
	const model_t *m = j->m;
	int nh = m->sh.n_q_heads, grp = m->meta.n_heads / m->meta.n_kv_heads;
	*b = it / nh;
	*h = it % nh;
	*kvh = (m->sh.q_head0 + *h) / grp - m->sh.kv_head0;
	*T = m->bpos[*b] + 1;
}

_Static_assert(ATT_TILE == 64, "quant_qkt_fn works on tiles of 64 keys");

/* Work item it = (local KV head g, tokens [*b0, *b1), part of its query heads): the shard's
 * query heads [*h0, *h1) read that KV head. A head's scores and sums do not depend on which
 * heads share its call, so the parts give the same bits as whole groups. */
static void att_kv_item(const att_job_t *j, int it, int *g, int *b0, int *b1, int *h0, int *h1)
{
	const model_t *m = j->m;
	int grp = m->meta.n_heads / m->meta.n_kv_heads, nkv = m->sh.n_kv_heads, part = it % j->hs;
	it /= j->hs;
	*g = it % nkv;
	*b0 = j->blk[it / nkv];
	*b1 = j->blk[it / nkv + 1];
	int q0 = (m->sh.kv_head0 + *g) * grp; /* its query heads, as global head numbers */
	int a = MAX(q0, m->sh.q_head0) - m->sh.q_head0;
	int b = MIN(q0 + grp, m->sh.q_head0 + m->sh.n_q_heads) - m->sh.q_head0;
	pool_split(b - a, part, j->hs, 1, h0, h1);
	*h0 += a;
	*h1 += a;
}

/* The tile of n positions of one head (k, v: its first bytes) as F32: K transposed,
 * [hd][ATT_TILE], into *kt (the cache itself when K is tiled F32; columns past n hold zeros or
 * an earlier sequence's keys, whose scores are never used), V as n rows of hd into *vt (the
 * cache itself for F32). */
static void att_tile(const model_t *m, const uint8_t *k, const uint8_t *v, int n, float *kbuf,
		     float *vbuf, const float **kt, const float **vt)
{
	int hd = m->meta.head_dim;
	quant_dequant_fn dq =
	    m->kv_ops->dequant ? m->kv_ops->dequant : quant_ops_ref(m->kv_type)->dequant;
	if (m->kv_type == QT_F32) {
		*kt = (const float *)k;
		*vt = (const float *)v;
		return;
	}
	if (m->kt_tiled) {
		dq(k, kbuf, ATT_TILE * hd);
	} else {
		float *tmp = vbuf; /* V is converted after */
		for (int t = 0; t < n; t++) {
			dq(k + (size_t)t * m->kv_hrow, tmp, hd);
			for (int i = 0; i < hd; i++)
				kbuf[i * ATT_TILE + t] = tmp[i];
		}
		for (int i = 0; n < ATT_TILE && i < hd; i++)
			memset(kbuf + i * ATT_TILE + n, 0, (size_t)(ATT_TILE - n) * sizeof *kbuf);
	}
	dq(v, vbuf, n * hd); /* the rows are contiguous */
	*kt = kbuf;
	*vt = vbuf;
}

/* The softmax scale of q . k. */
static float att_scale(const model_t *m)
{
	return m->meta.attn_scale > 0 ? m->meta.attn_scale : 1.0f / sqrtf((float)m->meta.head_dim);
}

/* The first position a query at pos sees in a layer with window win (0: all). */
static int att_lo(int pos, int win)
{
	return win > 0 && pos - win + 1 > 0 ? pos - win + 1 : 0;
}

/* ---- llama.cpp's arithmetic for an F16 cache -------------------------------------------------
 * llama.cpp runs attention through ggml's CPU flash attention (flash_attn auto: on). With an F16
 * cache it takes one of two paths (ggml-cpu/ops.cpp ggml_compute_forward_flash_attn_ext_f16): a
 * ubatch of GGML_FA_TILE_Q (64) or more query tokens goes to the tiled path, F32 throughout as
 * here; a smaller one (decode, short prompts) to ..._f16_one_chunk, which rounds the query to
 * F16 and adds the weighted values into an F16 vector one position after another (rescaled when
 * the running max grows: ggml_vec_scale_f16, ggml_vec_mad_f16), as long as its cache view is
 * under 512 cells (a view is padded to 256, so up to 256 positions; beyond, the cells are split
 * over its threads). Those rounding steps are most of the difference between its logits and a
 * float computation (~1e-3 relative; with them, what is left is float noise that an F16 rounding
 * boundary occasionally turns into one F16 step), so for every token that sees at most 256
 * positions of an F16 cache they are reproduced below; the other tokens keep the tiled F32 loop.
 * The choice depends on the token's position only, never on the batch it is computed in, so
 * a sequence's logits do not depend on what else runs (llama.cpp's prompts of 64 tokens or more
 * take its F32 path instead: there the two differ by that F16 rounding). */
#define ATT_LLAMA_MAX_POS 256

static float f16r(float x) /* rounded to F16 (to nearest even) */
{
	return quant_f16_to_f32(quant_f32_to_f16(x));
}

/* o[i] = f16(o[i] * a) and o[i] = f16(fma(v[i], a, o[i])), n a multiple of 8 on the fast path
 * (ggml's F16 vectors: F32 registers, one conversion back per store). */
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define ATT_TGT __attribute__((target("avx2,fma,f16c")))
ATT_TGT static void scale_f16r_x86(float *o, float a, int n)
{
	__m256 va = _mm256_set1_ps(a);
	for (int i = 0; i < n; i += 8) {
		__m256 r = _mm256_mul_ps(_mm256_loadu_ps(o + i), va);
		_mm256_storeu_ps(o + i,
				 _mm256_cvtph_ps(_mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT)));
	}
}
ATT_TGT static void mad_f16r_x86(float *o, const float *v, float a, int n)
{
	__m256 va = _mm256_set1_ps(a);
	for (int i = 0; i < n; i += 8) {
		__m256 r = _mm256_fmadd_ps(_mm256_loadu_ps(v + i), va, _mm256_loadu_ps(o + i));
		_mm256_storeu_ps(o + i,
				 _mm256_cvtph_ps(_mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT)));
	}
}
static int att_x86(int n)
{
	static int ok = -1;
	if (ok < 0) {
		/* F16C through CPUID leaf 1 (ECX bit 29): clang 14 does not know "f16c" here (as
		 * gemm_x86.c) */
		unsigned a, b, c, d;
		int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
		ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
	}
	return ok && n % 8 == 0;
}
#else
static int att_x86(int n)
{
	(void)n;
	return 0;
}
static void scale_f16r_x86(float *o, float a, int n)
{
	(void)o, (void)a, (void)n;
}
static void mad_f16r_x86(float *o, const float *v, float a, int n)
{
	(void)o, (void)v, (void)a, (void)n;
}
#endif

static void scale_f16r(float *o, float a, int n)
{
	if (att_x86(n)) {
		scale_f16r_x86(o, a, n);
		return;
	}
	for (int i = 0; i < n; i++)
		o[i] = f16r(o[i] * a);
}

static void mad_f16r(float *o, const float *v, float a, int n)
{
	if (att_x86(n)) {
		mad_f16r_x86(o, v, a, n);
		return;
	}
	for (int i = 0; i < n; i++)
		o[i] = f16r(fmaf(v[i], a, o[i]));
}

/* Whether token b of the pass is computed with llama.cpp's one_chunk arithmetic: only when the
 * environment asks for it (SHOAL_ATT_LLAMA=1: comparisons with llama.cpp). Off by default: its
 * F16 rounding steps turn the float noise of another summation order (a verify batch of
 * drafts, tensor-parallel sums, batch-sized kernels) into whole F16 steps, and then a greedy
 * sequence would not keep the same text with drafts, in a batch or on several ranks
 * (test_spec, test_stages, test_repack). Without it the logits stay within ~0.02 of
 * llama.cpp's on the tested files (docs/models.md). */
static int att_llama(const model_t *m, int b)
{
	static int on = -1; /* read once; a benign race sets it to the same value */
	if (on < 0) {
		const char *e = getenv("SHOAL_ATT_LLAMA");
		on = e && !strcmp(e, "1");
	}
	return on && m->kv_type == QT_F16 && m->bpos[b] + 1 <= ATT_LLAMA_MAX_POS;
}

/* Rounds the queries of those tokens to F16 as one_chunk does (after llama.cpp's own scaling
 * when it scales q first: Gemma 3). */
static void att_llama_q(model_t *m, int B)
{
	float sc = att_scale(m);
	for (int b = 0; b < B; b++) {
		if (!att_llama(m, b))
			continue;
		float *q = m->q + (size_t)b * m->qd;
		for (int i = 0; i < m->qd; i++)
			q[i] = m->meta.attn_q_prescaled ? f16r(q[i] * sc) : f16r(q[i]);
	}
}

/* gpt-oss's sink after one_chunk's positions, in F32 (ggml-cpu/ops.cpp
 * ggml_compute_forward_flash_attn_ext_f16_one_chunk: "sinks - apply only on the first kv-chunk",
 * after VKQ16 is converted to F32): o, running max *M and sum *S take the sink logit s. */
static void att_llama_sink(float *o, int hd, float *M, float *S, float s)
{
	if (s > *M) {
		float ms = expf(*M - s);
		for (int i = 0; i < hd; i++)
			o[i] *= ms;
		*S = *S * ms + 1.0f;
		*M = s;
	} else {
		*S += expf(s - *M);
	}
}

static void att_task(void *ctx, int c, int nc, int tid)
{
	att_job_t *j = ctx;
	model_t *m = j->m;
	int hd = m->meta.head_dim, win = m->kvl[j->layer].win;
	const float *sinks = m->layers[m->kvl[j->layer].layer].sinks;
	float scale = att_scale(m);
	/* a query llama.cpp scaled before attention (Gemma 3) was rounded after the scale
	 * (attention()): its scores are not scaled again */
	float llama_scale = m->meta.attn_q_prescaled ? 1.0f : scale;
	float *kbuf = m->att_tiles + (size_t)tid * 2 * ATT_TILE * hd, *vbuf = kbuf + ATT_TILE * hd;
	float s[ATT_GROUP * ATT_TILE], mx[ATT_QB][ATT_GROUP], sum[ATT_QB][ATT_GROUP];
	const float *qp[ATT_GROUP];
	float *op[ATT_GROUP];
	int lo, hi;
	pool_split(j->m->sh.n_kv_heads * j->n_blk * j->hs, c, nc, 1, &lo, &hi);
	for (int it = lo; it < hi; it++) {
		int g, b0, b1, h0, h1;
		att_kv_item(j, it, &g, &b0, &b1, &h0, &h1);
		if (h0 >= h1)
			continue;
		int slot = m->bslot[b0]; /* the block's */
		for (int b = b0; b < b1; b++)
			for (int h = h0; h < h1; h++) {
				memset(m->att + (size_t)b * m->qd + (size_t)h * hd, 0,
				       (size_t)hd * sizeof(float));
				/* a sink is a logit with no value: the softmax starts from it
				 * (llama.cpp's one_chunk path takes it last: att_llama_sink) */
				int first = sinks && !att_llama(m, b);
				mx[b - b0][h - h0] = first ? sinks[h] : -INFINITY;
				sum[b - b0][h - h0] = first ? 1.0f : 0.0f;
			}
		/* the block's first token sees the earliest position, its last the latest; a
		 * sliding window (win) starts each token's share later */
		int tmax = m->bpos[b1 - 1] + 1, tmin = att_lo(m->bpos[b0], win);
		for (int t0 = tmin - tmin % ATT_TILE; t0 < tmax; t0 += ATT_TILE) {
			int n = MIN(ATT_TILE, tmax - t0);
			size_t at =
			    kv_at(m, j->layer, slot, g, t0); /* whole tile, also in a ring */
			const float *kt, *vt;
			att_tile(m, m->kc + at, m->vc + at, n, kbuf, vbuf, &kt, &vt);
			for (int b = b0; b < b1; b++) {
				/* this token's share of the tile: [s0, nb) (causal, window) */
				int nb = MIN(n, m->bpos[b] + 1 - t0);
				int s0 = MAX(0, att_lo(m->bpos[b], win) - t0);
				if (nb <= s0)
					continue;
				for (int h = h0; h < h1; h++) {
					qp[h - h0] = m->q + (size_t)b * m->qd + (size_t)h * hd;
					op[h - h0] = m->att + (size_t)b * m->qd + (size_t)h * hd;
				}
				m->qkt(s, qp, h1 - h0, kt, hd); /* the group's scores at once */
				if (att_llama(m, b)) {          /* position by position, F16 sums */
					for (int h = h0; h < h1; h++) {
						float *o = op[h - h0],
						      *sh = s + (size_t)(h - h0) * ATT_TILE;
						float *M = &mx[b - b0][h - h0],
						      *S = &sum[b - b0][h - h0];
						for (int t = s0; t < nb; t++) {
							float sc = sh[t] * llama_scale, ms = 1.0f,
							      vs = 1.0f;
							if (sc > *M) {
								ms = expf(*M - sc);
								*M = sc;
								scale_f16r(o, ms, hd);
							} else {
								vs = expf(sc - *M);
							}
							mad_f16r(o, vt + (size_t)t * hd, vs, hd);
							*S = *S * ms + vs;
						}
					}
					continue;
				}
				for (int h = h0; h < h1; h++) {
					float *o = op[h - h0],
					      *sh = s + (size_t)(h - h0) * ATT_TILE;
					float *M = &mx[b - b0][h - h0], *S = &sum[b - b0][h - h0];
					float tmx = -INFINITY;
					for (int t = s0; t < nb; t++) {
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
					*S += m->expsum(sh + s0, nb - s0, *M);
				}
				m->av(op, s + s0, h1 - h0, vt + (size_t)s0 * hd, hd, nb - s0, hd);
			}
		}
		for (int b = b0; b < b1; b++)
			for (int h = h0; h < h1; h++) {
				float *o = m->att + (size_t)b * m->qd + (size_t)h * hd;
				if (sinks && att_llama(m, b))
					att_llama_sink(o, hd, &mx[b - b0][h - h0],
						       &sum[b - b0][h - h0], sinks[h]);
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
	/* fewer (block, KV head) items than threads (one sequence's decode with 1-2 KV heads:
	 * Gemma 3 1B, Qwen3.5): each KV head's query heads in parts, so every thread attends;
	 * the parts read the KV head's tiles once each */
	int nt = pool_threads(m->pool), items = n_blk * m->sh.n_kv_heads;
	int grp = m->meta.n_heads / m->meta.n_kv_heads;
	int hs = items >= nt ? 1 : MIN(grp, (nt + items - 1) / items);
	att_job_t aj = {m, lc, B, blk, n_blk, hs};
	items *= hs;
	att_llama_q(m, B);
	pool_run(m->pool, att_task, &aj, MIN(items, 4 * nt));
}

/* ---- the plain version ------------------------------------------------------------------ */

static void att_ref_task(void *ctx, int c, int nc, int tid)
{
	att_job_t *j = ctx;
	model_t *m = j->m;
	int hd = m->meta.head_dim, win = m->kvl[j->layer].win;
	const float *sinks = m->layers[m->kvl[j->layer].layer].sinks;
	float scale = att_scale(m), kv[1024];
	float *sc = m->scores + (size_t)tid * m->n_ctx;
	int lo, hi;
	pool_split(j->B * m->sh.n_q_heads, c, nc, 1, &lo, &hi);
	for (int it = lo; it < hi; it++) {
		int b, h, kvh, T;
		att_item(j, it, &b, &h, &kvh, &T);
		int t_lo = att_lo(T - 1, win); /* positions [t_lo, T) are visible */
		const float *q = m->q + (size_t)b * m->qd + (size_t)h * hd;
		float *o = m->att + (size_t)b * m->qd + (size_t)h * hd, mx = -INFINITY, sum = 0;
		if (att_llama(m, b)) { /* one_chunk: position by position, F16 sums, plainly */
			float lsc = m->meta.attn_q_prescaled ? 1.0f : scale, vr[1024];
			memset(o, 0, (size_t)hd * sizeof *o);
			for (int t = t_lo; t < T; t++) {
				kv_k_row(m, j->layer, m->bslot[b], kvh, t, kv);
				quant_dequant_row(m->kv_type,
						  m->vc + kv_at(m, j->layer, m->bslot[b], kvh, t),
						  vr, hd);
				float d = 0, ms = 1.0f, vs = 1.0f;
				for (int i = 0; i < hd; i++)
					d += q[i] * kv[i];
				d *= lsc;
				if (d > mx) {
					ms = expf(mx - d);
					mx = d;
					for (int i = 0; i < hd; i++)
						o[i] = f16r(o[i] * ms);
				} else {
					vs = expf(d - mx);
				}
				for (int i = 0; i < hd; i++)
					o[i] = f16r(fmaf(vr[i], vs, o[i]));
				sum = sum * ms + vs;
			}
			if (sinks)
				att_llama_sink(o, hd, &mx, &sum, sinks[h]);
			for (int i = 0; i < hd; i++)
				o[i] *= 1.0f / sum;
			continue;
		}
		for (int t = t_lo; t < T; t++) {
			kv_k_row(m, j->layer, m->bslot[b], kvh, t, kv);
			float d = 0;
			for (int i = 0; i < hd; i++)
				d += q[i] * kv[i];
			sc[t] = d * scale;
			mx = fmaxf(mx, sc[t]);
		}
		if (sinks) /* in the max and the sum, as ggml's soft_max with sinks */
			mx = fmaxf(mx, sinks[h]);
		for (int t = t_lo; t < T; t++)
			sum += sc[t] = expf(sc[t] - mx);
		if (sinks)
			sum += expf(sinks[h] - mx);
		memset(o, 0, (size_t)hd * sizeof *o);
		for (int t = t_lo; t < T; t++) {
			quant_dequant_row(m->kv_type,
					  m->vc + kv_at(m, j->layer, m->bslot[b], kvh, t), kv, hd);
			for (int i = 0; i < hd; i++)
				o[i] += sc[t] / sum * kv[i];
		}
	}
}

void attention_ref(model_t *m, int lc, int B)
{
	att_job_t aj = {m, lc, B, NULL, 0, 1};
	int items = B * m->sh.n_q_heads;
	att_llama_q(m, B);
	pool_run(m->pool, att_ref_task, &aj, MIN(items, 4 * pool_threads(m->pool)));
}
