/*
 * model.c: weights bound to the GGUF mapping and the forward pass (llama, qwen2, qwen3,
 * deepseek2's latent attention from mla.c, and with moe.c's expert block Mixtral, qwen2moe,
 * qwen3moe and deepseek2's routed layers).
 *
 * forward() reads like llama2.c's: embedding, then per layer RMSNorm -> Q/K/V (+bias, +q/k norm)
 * -> RoPE -> cache -> attention (or mla.c's latent attention) -> output projection -> residual,
 * RMSNorm -> gate/up -> SwiGLU ->
 * down -> residual; final norm and the head. Every matrix product goes through matmul()
 * (matmul.c, the one place that chooses the kernel); attention is attn.c's.
 *
 * qwen35 (hybrid): most layers are deltanet.c's Gated DeltaNet instead of attention (a state
 * per slot, no KV cache); its full-attention layers gate their output by sigmoid of a second
 * half of the query rows and rotate with interleaved M-RoPE; the FFN's norm is the file's
 * post_attention_norm.
 *
 * Invariant: each slot of the KV cache holds positions [0, pos) of its sequence for this shard's
 * KV heads; a forward pass only writes the (slot, position) rows of its own tokens (and, with
 * DeltaNet layers, the state buffers deltanet_plan gave them).
 */
#include "common/common.h"
#include "infer/model/model_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- binding ------------------------------------------------------------------------------ */

int bind_mat(model_t *m, const gguf_t *g, const char *name, wmat_t *w, char *err, size_t errlen)
{
	const gguf_tensor_t *t = gguf_find_tensor(g, name);
	if (!t)
		return sh_fail(err, errlen, SH_EFORMAT, "missing tensor %s", name);
	if (!quant_type_supported(t->type))
		return sh_fail(err, errlen, SH_EUNSUPP, "unsupported tensor type %s for %s",
			       quant_type_ggml_name(t->type), name);
	memset(w, 0, sizeof *w);
	if (t->ne[0] % quant_block_elems(t->type))
		return sh_fail(err, errlen, SH_EFORMAT,
			       "tensor %s: row of %lld is not whole blocks", name,
			       (long long)t->ne[0]);
	w->data = t->data;
	w->type = t->type;
	w->cols = (int)t->ne[0];
	w->rows = (int)t->ne[1];
	w->row_bytes = quant_row_bytes(t->type, t->ne[0]);
	w->ops = quant_ops(t->type);
	w->dequant = w->ops->dequant ? w->ops->dequant : quant_ops_ref(t->type)->dequant;
	w->src = w->data;
	w->src_stride = w->row_bytes;
	(void)m;
	if ((uint64_t)w->row_bytes * (uint64_t)w->rows > t->nbytes)
		return sh_fail(err, errlen, SH_EFORMAT, "tensor %s is truncated", name);
	return 0;
}

/* A norm or bias vector as F32 (a small copy): n elements starting at element off. */
int bind_vec(const gguf_t *g, const char *name, int off, int n, float **out, char *err,
	     size_t errlen)
{
	const gguf_tensor_t *t = gguf_find_tensor(g, name);
	if (!t)
		return sh_fail(err, errlen, SH_EFORMAT, "missing tensor %s", name);
	if (t->ne[0] < off + n)
		return sh_fail(err, errlen, SH_EFORMAT, "tensor %s is too short", name);
	float *v = malloc((size_t)t->ne[0] * sizeof *v);
	if (!v)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	quant_dequant_row(t->type, t->data, v, t->ne[0]);
	if (off)
		memmove(v, v + off, (size_t)n * sizeof *v);
	*out = v;
	return 0;
}

void model_shard_full(const model_meta_t *meta, model_shard_t *s)
{
	s->q_head0 = 0;
	s->n_q_heads = meta->n_heads;
	s->kv_head0 = 0;
	s->n_kv_heads = meta->n_kv_heads;
	s->ffn0 = 0;
	s->n_ffn = meta->ffn;
	s->layer0 = 0;
	s->layer1 = meta->n_layers;
	s->exp0 = 0;
	s->n_exp = meta->n_experts;
	s->shx0 = 0;
	s->n_shx = meta->ffn_shexp;
}

int model_kv_type_check(const model_meta_t *meta, int kv_type, char *err, size_t errlen)
{
	if (kv_type != QT_F32 && kv_type != QT_F16 && kv_type != QT_Q8_0)
		return sh_fail(err, errlen, SH_EINVAL, "KV cache type %s is not f32, f16 or q8_0",
			       quant_type_name(kv_type));
	if (meta->head_dim > 1024) /* attn.c's per-item buffers */
		return sh_fail(err, errlen, SH_EINVAL, "head_dim %d is over 1024", meta->head_dim);
	if (meta->n_heads / meta->n_kv_heads > ATT_GROUP)
		return sh_fail(err, errlen, SH_EINVAL, "more than %d query heads per KV head",
			       ATT_GROUP);
	if (meta->head_dim % quant_block_elems(kv_type))
		return sh_fail(err, errlen, SH_EINVAL,
			       "a %s KV cache needs head_dim a multiple of %d (it is %d)",
			       quant_type_name(kv_type), quant_block_elems(kv_type),
			       meta->head_dim);
	return 0;
}

size_t model_kv_bytes_per_pos(const model_meta_t *meta, const model_shard_t *shard, int kv_type)
{
	model_shard_t full;
	if (!shard) {
		model_shard_full(meta, &full);
		shard = &full;
	}
	if (model_kv_type_check(meta, kv_type, NULL, 0))
		return 0;
	int l0 = shard->layer1 ? shard->layer0 : 0,
	    l1 = shard->layer1 ? shard->layer1 : meta->n_layers;
	int nl = 0;
	for (int l = l0; l < l1; l++)
		nl += !meta_layer_recurrent(meta, l); /* DeltaNet layers keep no KV cache */
	if (meta->is_mla) /* the latent (F32), replicated on every rank (mla.c) */
		return mla_kv_bytes_per_pos(meta, nl);
	for (int l = l0; l < l1; l++) /* sliding-window layers: model_kv_bytes */
		nl -= meta_layer_swa(meta, l);
	return (size_t)nl * 2 *
	       quant_row_bytes(kv_type, (int64_t)shard->n_kv_heads * meta->head_dim);
}

static int shard_check(const model_meta_t *mt, const model_shard_t *s, char *err, size_t errlen)
{
	int grp = mt->n_heads / mt->n_kv_heads;
	if (s->n_q_heads <= 0 || s->q_head0 < 0 || s->q_head0 + s->n_q_heads > mt->n_heads ||
	    s->n_kv_heads <= 0 || s->kv_head0 < 0 || s->kv_head0 + s->n_kv_heads > mt->n_kv_heads ||
	    s->n_ffn <= 0 || s->ffn0 < 0 || s->ffn0 + s->n_ffn > mt->ffn || s->layer0 < 0 ||
	    s->layer0 >= s->layer1 || s->layer1 > mt->n_layers)
		return sh_fail(err, errlen, SH_EINVAL, "shard out of range");
	if (s->exp0 < 0 || s->n_exp < 0 || s->exp0 + s->n_exp > mt->n_experts || s->shx0 < 0 ||
	    s->n_shx < 0 || s->shx0 + s->n_shx > mt->ffn_shexp)
		return sh_fail(err, errlen, SH_EINVAL, "shard's expert range out of range");
	if (s->q_head0 / grp < s->kv_head0 ||
	    (s->q_head0 + s->n_q_heads - 1) / grp >= s->kv_head0 + s->n_kv_heads)
		return sh_fail(err, errlen, SH_EINVAL,
			       "shard's KV heads do not cover its query heads");
	return 0;
}

/* A row slice [r0, r0+n) of w, as its own matrix. An interleaved copy comes along when the slice
 * starts on a group (one expert of a repacked expert tensor); the view owns none of it. */
wmat_t mat_rows(wmat_t w, int r0, int n)
{
	w.data += (size_t)r0 * w.row_bytes;
	w.src += (size_t)r0 * w.src_stride;
	w.rows = n;
	if (w.rp && w.rp_of == w.data - (size_t)r0 * w.row_bytes && r0 % QR_ROWS == 0 &&
	    r0 / QR_ROWS < w.rp_groups) {
		w.rp += (size_t)(r0 / QR_ROWS) * quant_repack_group_bytes(w.type, w.cols);
		w.rp_groups = MIN(w.rp_groups - r0 / QR_ROWS, n / QR_ROWS);
		w.rp_of = w.data;
	} else {
		w.rp = w.rp_of = NULL;
		w.rp_groups = 0;
	}
	w.rp_own = NULL;
	w.rp_bytes = 0;
	return w;
}

/* A column slice [c0, c0+n) of w. A partial slice is copied into private memory (*own, freed
 * with the model) and the mapping's pages of the whole matrix are released from this process:
 * each row's slice is only part of a page, so reading it in place would keep every page of the
 * matrix resident on every rank. */
int mat_cols(const gguf_t *g, wmat_t *w, int c0, int n, uint8_t **own, const char *name, char *err,
	     size_t errlen)
{
	int be = quant_block_elems(w->type);
	if (c0 % be || n % be)
		return sh_fail(err, errlen, SH_EINVAL, "shard splits %s inside a %d-element block",
			       name, be);
	if (n == w->cols)
		return 0;
	size_t off = quant_row_bytes(w->type, c0), sb = quant_row_bytes(w->type, n);
	uint8_t *buf = malloc((size_t)w->rows * sb);
	if (!buf)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory for %s", name);
	for (int r = 0; r < w->rows; r++) /* a slice node may keep these pieces in a sidecar */
		gguf_copy(g, buf + (size_t)r * sb, w->data + (size_t)r * w->row_bytes + off, sb);
	/* whole pages inside the matrix only (its neighbours may be someone's rows) */
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t a = ((uintptr_t)w->data + pg - 1) & ~(pg - 1);
	uintptr_t b = ((uintptr_t)w->data + (size_t)w->rows * w->row_bytes) & ~(pg - 1);
	if (b > a)
		madvise((void *)a, b - a, MADV_DONTNEED);
	*own = buf;
	w->src = w->data + off; /* the slice's bytes in the file, row_bytes apart */
	w->data = buf;
	w->row_bytes = sb;
	w->cols = n;
	return 0;
}

/* The interleaved copies of a layer's matrices (matmul.c). A private column slice wholly
 * repacked is freed: nothing reads its rows any more. */
static int repack_layer(model_t *m, layer_t *L)
{
	wmat_t *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
	uint8_t *none = NULL, **own[] = {&none, &none, &none, &L->wo_own, &none, &none, &L->down_own};
	for (size_t i = 0; i < ARRAY_LEN(w); i++) {
		int rc = wmat_repack_own(m, w[i], own[i]);
		if (rc)
			return rc;
	}
	return 0;
}

int model_n_ctx(const model_t *m)
{
	return m->n_ctx;
}

int model_n_slots(const model_t *m)
{
	return m->n_slots;
}

void model_set_allreduce(model_t *m, model_allreduce_fn fn, void *ctx)
{
	m->ar = fn;
	m->ar_ctx = ctx;
}

void model_set_allreduce_stream(model_t *m, const model_ar_stream_t *s)
{
	m->ars = s ? *s : (model_ar_stream_t){0};
}

void model_set_pipe(model_t *m, model_pipe_fn fn, void *ctx)
{
	m->pipe = fn;
	m->pipe_ctx = ctx;
}

/* qwen35's interleaved M-RoPE for text (ggml-cpu ops.cpp ggml_mrope_cache_init, is_imrope):
 * rotated pair i takes the position of section (i mod sum) % 3 while that stays within 3 x the
 * section's size, else the fourth position, which text tokens keep at 0 (llama-graph.cpp
 * llm_graph_input_pos::set_input): those pairs do not turn, a frequency of 0. A linear rope
 * scaling factor divides every frequency (llama.cpp's freq_scale). */
static void rope_imrope(const model_meta_t *mt, float *inv_freq)
{
	const int *sec = mt->dn.sections;
	int sum = sec[0] + sec[1] + sec[2] + sec[3];
	for (int i = 0; i < mt->rope_dim / 2; i++) {
		int k = i % sum;
		int used = (k % 3 == 1 && k < 3 * sec[1]) || (k % 3 == 2 && k < 3 * sec[2]) ||
			   (k % 3 == 0 && k < 3 * sec[0]);
		if (!used)
			inv_freq[i] = 0;
		else if (mt->rope_scaling == META_SCALING_LINEAR && mt->rope_factor > 0)
			inv_freq[i] /= mt->rope_factor;
	}
}

static int alloc_scratch(model_t *m, int max_b)
{
	const model_meta_t *mt = &m->meta;
	int nt = pool_threads(m->pool);
	int maxc = MAX(MAX(MAX(mt->dim, m->qd), m->sh.n_ffn), mt->mla.q_lora);
	maxc = MAX(maxc, MAX(mt->ffn_exp, m->sh.n_shx));     /* the experts' inputs */
	maxc = MAX(maxc, mt->dn.n_v_heads * mt->dn.d_state); /* DeltaNet's W_out */
	size_t b = (size_t)max_b;
	m->max_b = max_b;
	m->x = calloc(b * mt->dim, sizeof(float));
	m->xb = calloc(b * mt->dim, sizeof(float));
	m->xb2 = calloc(b * mt->dim, sizeof(float));
	m->q = calloc(b * m->qd, sizeof(float));
	m->k = calloc(b * m->kvd + 1, sizeof(float)); /* kvd is 0 with latent attention */
	m->v = calloc(b * m->kvd + 1, sizeof(float));
	m->att = calloc(b * m->qd, sizeof(float));
	m->hb = calloc(b * m->sh.n_ffn, sizeof(float));
	m->hb2 = calloc(b * m->sh.n_ffn, sizeof(float));
	m->rope_cs = malloc(b * (size_t)MAX(mt->rope_dim / 2, 1) * 2 * sizeof(float));
	if (mt->is_hybrid) { /* gated query rows, split into the query and its output gate */
		m->qfull = calloc(b * 2 * m->qd, sizeof(float));
		m->qgate = calloc(b * m->qd, sizeof(float));
		if (!m->qfull || !m->qgate)
			return SH_ENOMEM;
	}
	m->scores = calloc((size_t)nt * m->n_ctx, sizeof(float));
	m->att_tiles = aligned_alloc(64, (size_t)nt * 2 * ATT_TILE * mt->head_dim * sizeof(float));
	/* activation scratch: the largest input width, 8-bit blocks + scales (+ bsums) */
	m->act_stride = ((size_t)maxc + (size_t)maxc / 16 * 2 + (size_t)maxc / 32 * 6 + 63) & ~63u;
	m->act = aligned_alloc(64, b * m->act_stride);
	if (!m->x || !m->xb || !m->xb2 || !m->q || !m->k || !m->v || !m->att || !m->hb || !m->hb2 ||
	    !m->scores || !m->act || !m->att_tiles || !m->rope_cs)
		return SH_ENOMEM;
	return 0;
}

int model_new(model_t **out, const gguf_t *g, const model_meta_t *meta, const model_shard_t *shard,
	      int n_ctx, pool_t *pool, char *err, size_t errlen)
{
	return model_new_slots(out, g, meta, shard, n_ctx, 1, MODEL_KV_DEFAULT, pool, err, errlen);
}

int model_new_kv(model_t **out, const gguf_t *g, const model_meta_t *meta,
		 const model_shard_t *shard, int n_ctx, int kv_type, pool_t *pool, char *err,
		 size_t errlen)
{
	return model_new_slots(out, g, meta, shard, n_ctx, 1, kv_type, pool, err, errlen);
}

int model_new_slots(model_t **out, const gguf_t *g, const model_meta_t *meta,
		    const model_shard_t *shard, int n_ctx, int n_slots, int kv_type, pool_t *pool,
		    char *err, size_t errlen)
{
	*out = NULL;
	if (n_slots < 1 || n_ctx < 1)
		return sh_fail(err, errlen, SH_EINVAL, "bad context %d or slot count %d", n_ctx,
			       n_slots);
	int bind_only = kv_type == MODEL_KV_NONE;
	if (!bind_only && model_kv_type_check(meta, kv_type, err, errlen))
		return SH_EINVAL;
	model_t *m = calloc(1, sizeof *m);
	if (!m)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	int rc;
	m->meta = *meta;
	m->g = g;
	if (shard)
		m->sh = *shard;
	else
		model_shard_full(meta, &m->sh);
	if (m->sh.layer1 == 0 && m->sh.layer0 == 0)
		m->sh.layer1 = meta->n_layers;
	if (m->sh.exp0 == 0 && m->sh.n_exp == 0)
		m->sh.n_exp = meta->n_experts;
	if (m->sh.shx0 == 0 && m->sh.n_shx == 0)
		m->sh.n_shx = meta->ffn_shexp;
	if ((rc = shard_check(meta, &m->sh, err, errlen)))
		goto err;
	m->pool = pool;
	m->n_ctx = n_ctx;
	m->n_slots = n_slots;
	int hd = meta->head_dim;
	m->qd = m->sh.n_q_heads * hd;
	m->kvd = m->sh.n_kv_heads * hd;
	if (meta->is_mla) { /* q holds [qk_nope|qk_rope] per head, att v_head; mla.c's cache */
		m->qd = m->sh.n_q_heads * MAX(hd, meta->mla.v_head);
		m->kvd = 0;
	}

	if (meta->is_hybrid && (rc = deltanet_init(m, err, errlen)))
		goto err;
	if ((rc = bind_mat(m, g, "token_embd.weight", &m->embd, err, errlen)) ||
	    (rc = bind_vec(g, "output_norm.weight", 0, meta->dim, &m->out_norm, err, errlen)))
		goto err;
	if (meta->tied_output)
		m->out = m->embd;
	else if ((rc = bind_mat(m, g, "output.weight", &m->out, err, errlen)))
		goto err;

	m->layers = calloc((size_t)meta->n_layers, sizeof *m->layers);
	if (!m->layers) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto err;
	}
	int q0 = m->sh.q_head0 * hd, k0 = m->sh.kv_head0 * hd;
	for (int l = m->sh.layer0; l < m->sh.layer1; l++) {
		layer_t *L = &m->layers[l];
		char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
		const char *fnorm =
		    meta->is_hybrid || meta->ffn_norm_post
			? "post_attention_norm.weight" /* qwen35, glm4moe, gpt-oss */
			: "ffn_norm.weight";
		if ((rc = bind_vec(g, NAME("attn_norm.weight"), 0, meta->dim, &L->attn_norm, err,
				   errlen)) ||
		    (rc = bind_vec(g, NAME(fnorm), 0, meta->dim, &L->ffn_norm, err, errlen)))
			goto err;
		if (meta->has_post_norm &&
		    ((rc = bind_vec(g, NAME("post_attention_norm.weight"), 0, meta->dim,
				    &L->post_attn, err, errlen)) ||
		     (rc = bind_vec(g, NAME("post_ffw_norm.weight"), 0, meta->dim, &L->post_ffn,
				    err, errlen))))
			goto err;
		if (meta_layer_moe(meta, l)) { /* experts instead of the dense FFN (moe.c) */
			if ((rc = moe_layer_new(m, g, l, &L->moe, err, errlen)))
				goto err;
		} else {
			if ((rc = bind_mat(m, g, NAME("ffn_gate.weight"), &L->w_gate, err,
					   errlen)) ||
			    (rc = bind_mat(m, g, NAME("ffn_up.weight"), &L->w_up, err, errlen)) ||
			    (rc = bind_mat(m, g, NAME("ffn_down.weight"), &L->w_down, err, errlen)))
				goto err;
			L->w_gate = mat_rows(L->w_gate, m->sh.ffn0, m->sh.n_ffn);
			L->w_up = mat_rows(L->w_up, m->sh.ffn0, m->sh.n_ffn);
			if ((rc = mat_cols(g, &L->w_down, m->sh.ffn0, m->sh.n_ffn, &L->down_own,
					   "ffn_down", err, errlen)))
				goto err;
		}
		if (meta_layer_recurrent(meta, l)) { /* qwen35: a DeltaNet layer (deltanet.c) */
			if ((rc = deltanet_bind(m, g, l, err, errlen)))
				goto err;
			continue;
		}
		L->kv_lc = m->n_kv_layers++;
		if (meta->is_mla) { /* deepseek2: latent attention's weights and attn_output */
			if ((rc = mla_bind(m, g, l, err, errlen)))
				goto err;
			continue;
		}
		if ((rc = bind_mat(m, g, NAME("attn_q.weight"), &L->wq, err, errlen)) ||
		    (rc = bind_mat(m, g, NAME("attn_k.weight"), &L->wk, err, errlen)) ||
		    (rc = bind_mat(m, g, NAME("attn_v.weight"), &L->wv, err, errlen)) ||
		    (rc = bind_mat(m, g, NAME("attn_output.weight"), &L->wo, err, errlen)))
			goto err;
		if (meta->has_qkv_bias &&
		    ((rc = bind_vec(g, NAME("attn_q.bias"), q0, m->qd, &L->bq, err, errlen)) ||
		     (rc = bind_vec(g, NAME("attn_k.bias"), k0, m->kvd, &L->bk, err, errlen)) ||
		     (rc = bind_vec(g, NAME("attn_v.bias"), k0, m->kvd, &L->bv, err, errlen))))
			goto err;
		if (meta->has_qk_norm && ((rc = bind_vec(g, NAME("attn_q_norm.weight"), 0, hd,
							 &L->q_norm, err, errlen)) ||
					  (rc = bind_vec(g, NAME("attn_k_norm.weight"), 0, hd,
							 &L->k_norm, err, errlen))))
			goto err;
		/* gpt-oss: the shard's heads' sink logits; the output bias (added after the sum) */
		if ((meta->has_sinks && (rc = bind_vec(g, NAME("attn_sinks.weight"), m->sh.q_head0,
						       m->sh.n_q_heads, &L->sinks, err, errlen))) ||
		    (meta->has_out_bias && (rc = bind_vec(g, NAME("attn_output.bias"), 0, meta->dim,
							  &L->bo, err, errlen))))
			goto err;
#undef NAME
		/* this shard's slices: Q/K/V by rows, O by input columns (gate/up/down above); a
		 * gated query (qwen35) has [query | gate] rows per head */
		L->q_gated = meta->is_hybrid;
		L->wq = mat_rows(L->wq, q0 * (1 + L->q_gated), m->qd * (1 + L->q_gated));
		L->wk = mat_rows(L->wk, k0, m->kvd);
		L->wv = mat_rows(L->wv, k0, m->kvd);
		if ((rc = mat_cols(g, &L->wo, q0, m->qd, &L->wo_own, "attn_output", err, errlen)))
			goto err;
	}

	for (int l = m->sh.layer0; !bind_only && l < m->sh.layer1; l++)
		if (repack_layer(m, &m->layers[l]) ||
		    (m->layers[l].moe && moe_repack(m, m->layers[l].moe)) ||
		    (m->layers[l].dn && deltanet_repack(m, &m->layers[l]))) {
			rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory for repacked weights");
			goto err;
		}
	/* the head (its pages stay when it is the tied embedding: rows are looked up there) */
	if (!bind_only && wmat_repack(m, &m->out, !meta->tied_output)) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory for repacked weights");
		goto err;
	}

	int half = meta->rope_dim / 2;
	m->inv_freq = malloc((size_t)MAX(half, 1) * sizeof(float));
	m->kv_type = bind_only ? QT_F32 : kv_type;
	m->kv_hrow = bind_only ? 0 : quant_row_bytes(kv_type, meta->head_dim);
	m->kv_ops = quant_ops(m->kv_type);
	m->kv_npos = (n_ctx + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
	m->kt_tiled = m->kv_type == QT_F16 || m->kv_type == QT_F32;
	size_t kv_rows =
	    0; /* the attention layers' positions (sliding-window ones: a ring, swa.c) */
	if (swa_layout(m, &kv_rows)) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto err;
	}
	/* zeroed: a tiled K's columns past the last position are read (and their scores
	 * ignored) */
	m->kc = calloc(MAX(kv_rows, 1), MAX(m->kv_hrow, 1));
	m->vc = calloc(MAX(kv_rows, 1), MAX(m->kv_hrow, 1));
	if (!m->inv_freq || !m->kc || !m->vc || alloc_scratch(m, MODEL_MAX_BATCH) ||
	    (meta->n_experts && moe_scratch_new(m))) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory for a context of %d x %d slots",
			     n_ctx, n_slots);
		goto err;
	}
	if (m->dn && (rc = deltanet_alloc(m, 1, err, errlen)))
		goto err;
	m->qkt = quant_qkt();
	m->av = quant_av();
	m->expsum = quant_expsum();
	m->f32 = quant_ops(QT_F32);
	m->wsum = quant_wsum();
	/* linear scaling multiplies every angle by the scale; YaRN ramps between interpolation and
	 * extrapolation and scales cos and sin (rope_freqs; deepseek2's YaRN is mla_new's) */
	int yarn = meta->rope_scaling == META_SCALING_YARN && !meta->is_mla;
	float fs = yarn && meta->rope_factor > 0 ? 1.0f / meta->rope_factor : meta->rope_scale;
	rope_freqs(meta, meta->rope_base, fs, yarn, m->inv_freq);
	m->rope_mag = yarn ? rope_yarn_mag(meta) : 1.0f;
	if (meta->is_hybrid)
		rope_imrope(meta, m->inv_freq);
	if (meta->swa_window > 0 && !meta->is_mla &&
	    (meta->rope_base_swa != meta->rope_base || meta->rope_scale_swa != meta->rope_scale)) {
		/* sliding-window layers with their own base (Gemma 3: 10000 vs 1e6, unscaled) */
		m->inv_freq_swa = malloc((size_t)MAX(half, 1) * sizeof(float));
		m->rope_cs_swa = malloc((size_t)m->max_b * MAX(half, 1) * 2 * sizeof(float));
		if (!m->inv_freq_swa || !m->rope_cs_swa) {
			rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
			goto err;
		}
		rope_freqs(meta, meta->rope_base_swa, yarn ? fs : meta->rope_scale_swa, yarn,
			   m->inv_freq_swa);
	}
	if (meta->is_mla && (rc = mla_new(m, err, errlen)))
		goto err;
	*out = m;
	return 0;
err:
	model_free(m);
	return rc;
}

void model_free(model_t *m)
{
	if (!m)
		return;
	mla_free(m);
	deltanet_free(m);
	if (m->layers)
		for (int l = 0; l < m->meta.n_layers; l++) {
			layer_t *L = &m->layers[l];
			free(L->attn_norm);
			free(L->ffn_norm);
			free(L->post_attn);
			free(L->post_ffn);
			free(L->bq);
			free(L->bk);
			free(L->bv);
			free(L->q_norm);
			free(L->k_norm);
			free(L->sinks);
			free(L->bo);
			free(L->wo_own);
			free(L->down_own);
			wmat_t *w[] = {&L->wq,     &L->wk,   &L->wv,    &L->wo,
				       &L->w_gate, &L->w_up, &L->w_down};
			for (size_t i = 0; i < ARRAY_LEN(w); i++)
				wmat_release(w[i]);
			moe_layer_free(L->moe);
			deltanet_layer_free(L);
		}
	moe_scratch_free(m->moe);
	wmat_release(&m->out);
	free(m->layers);
	free(m->out_norm);
	free(m->inv_freq);
	free(m->rope_cs);
	free(m->inv_freq_swa);
	free(m->rope_cs_swa);
	free(m->qfull);
	free(m->qgate);
	free(m->kc);
	free(m->vc);
	swa_free(m);
	free(m->x);
	free(m->xb);
	free(m->xb2);
	free(m->q);
	free(m->k);
	free(m->v);
	free(m->att);
	free(m->hb);
	free(m->hb2);
	free(m->scores);
	free(m->att_tiles);
	free(m->act);
	free(m);
}

uint64_t model_bytes_per_token(const model_t *m)
{
	uint64_t b = m->out.row_bytes * (uint64_t)m->out.rows + m->embd.row_bytes;
	for (int l = m->sh.layer0; l < m->sh.layer1; l++) {
		const layer_t *L = &m->layers[l];
		const wmat_t *w[] = {&L->wq, &L->wk, &L->wv, &L->w_gate, &L->w_up};
		for (size_t i = 0; i < ARRAY_LEN(w) - (L->moe ? 2 : 0); i++)
			b += w[i]->row_bytes * (uint64_t)w[i]->rows;
		b += quant_row_bytes(L->wo.type, L->wo.cols) * (uint64_t)L->wo.rows;
		if (L->moe)
			b += moe_bytes_per_token(m, L->moe);
		else
			b += quant_row_bytes(L->w_down.type, L->w_down.cols) *
			     (uint64_t)L->w_down.rows;
		b += mla_layer_bytes(L) + deltanet_layer_bytes(m, L);
	}
	return b;
}

/* ---- small kernels ------------------------------------------------------------------------ */

void rmsnorm(float *o, const float *x, const float *w, int n, float eps)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	float s = (float)(1.0 / sqrt(ss / n + eps));
	for (int i = 0; i < n; i++)
		o[i] = x[i] * s * w[i];
}

/* YaRN's correction dimension for n_rot rotations (ggml.c: ggml_rope_yarn_corr_dim). */
static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base)
{
	return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2 * (float)M_PI)) /
	       (2 * logf(base));
}

void rope_freqs(const model_meta_t *mt, float base, float fs, int yarn, float *inv_freq)
{
	int rd = mt->rope_dim;
	float lo = 0, hi = 0;
	if (yarn) { /* ggml_rope_yarn_corr_dims, llama.cpp's beta_fast 32 and beta_slow 1 */
		lo = MAX(0.0f, floorf(yarn_corr_dim(rd, mt->rope_orig_ctx, 32.0f, base)));
		hi = MIN((float)(rd - 1), ceilf(yarn_corr_dim(rd, mt->rope_orig_ctx, 1.0f, base)));
	}
	for (int i = 0; i < rd / 2; i++) {
		/* theta = pos * base^(-2i/rd) * (fs (1 - r) + r), r = YaRN's ramp for pair i
		 * (ggml-cpu's rope_yarn with ext_factor 1; r = 0 without YaRN) */
		float r = 0;
		if (yarn)
			r = 1.0f - MIN(1.0f, MAX(0.0f, ((float)i - lo) / MAX(0.001f, hi - lo)));
		inv_freq[i] = (float)pow(base, -2.0 * i / rd) * (fs * (1 - r) + r);
	}
}

float rope_yarn_mag(const model_meta_t *mt)
{
	/* llama-context.cpp sets yarn_attn_factor = mscale(f, 1) / mscale(f, L) / (1 + 0.1 ln f)
	 * (L = yarn_log_multiplier; mscale(f, s) = 1 + 0.1 s ln f, 1 without L or for f <= 1)
	 * and ggml's rope_yarn multiplies it by 1 + 0.1 ln f */
	float f = mt->rope_factor, L = mt->yarn_log_mul;
	if (!(f > 1.0f))
		return 1.0f;
	float lnf = logf(f);
	return L != 0 ? (1.0f + 0.1f * lnf) / (1.0f + 0.1f * L * lnf) : 1.0f + 0.1f * lnf;
}

/* cs[b][i] = cos, sin of pos[b] * inv_freq[i], times mag. */
static void rope_fill(float *cs, const float *inv_freq, int half, float mag, const int *pos, int B)
{
	for (int b = 0; b < B; b++)
		for (int i = 0; i < half; i++) {
			float a = (float)pos[b] * inv_freq[i];
			cs[((size_t)b * half + i) * 2] = cosf(a) * mag;
			cs[((size_t)b * half + i) * 2 + 1] = sinf(a) * mag;
		}
}

void rope_table(model_t *m, const int *pos, int B)
{
	int half = m->meta.rope_dim / 2;
	rope_fill(m->rope_cs, m->inv_freq, half, m->rope_mag, pos, B);
	if (m->rope_cs_swa)
		rope_fill(m->rope_cs_swa, m->inv_freq_swa, half, m->rope_mag, pos, B);
}

void rope_layer(const model_t *m, float *h, int b, int swa)
{
	int half = m->meta.rope_dim / 2;
	const float *cs =
	    (swa && m->rope_cs_swa ? m->rope_cs_swa : m->rope_cs) + (size_t)b * half * 2;
	for (int i = 0; i < half; i++) {
		float c = cs[2 * i], s = cs[2 * i + 1];
		int i0, i1;
		if (m->meta.rope_style == META_ROPE_NEOX)
			i0 = i, i1 = i + half;
		else
			i0 = 2 * i, i1 = 2 * i + 1;
		float x0 = h[i0], x1 = h[i1];
		h[i0] = x0 * c - x1 * s;
		h[i1] = x0 * s + x1 * c;
	}
}

void rope(const model_t *m, float *h, int b)
{
	rope_layer(m, h, b, 0);
}

/* ---- the file's bytes a shard reads -------------------------------------------------------- */

int range_push(model_range_t **r, int *n, uint64_t off, uint64_t len, int compact)
{
	if (*n && (*r)[*n - 1].off + (*r)[*n - 1].len == off &&
	    (*r)[*n - 1].compact == compact) { /* rows back to back: one range */
		(*r)[*n - 1].len += len;
		return 0;
	}
	if ((*n & (*n - 1)) == 0) { /* grow at powers of two */
		model_range_t *nr = realloc(*r, (size_t)(*n ? 2 * *n : 16) * sizeof *nr);
		if (!nr)
			return SH_ENOMEM;
		*r = nr;
	}
	(*r)[(*n)++] = (model_range_t){off, len, compact};
	return 0;
}

int mat_ranges(const wmat_t *w, const uint8_t *base, model_range_t **r, int *n)
{
	size_t len = quant_row_bytes(w->type, w->cols);
	/* a column slice (its rows are pieces of the file's rows): by the widths, not by where data
	 * points (a whole matrix may be a copy too: wmat_repack's huge-page copies) */
	int compact = len < w->src_stride;
	for (int i = 0; i < w->rows; i++) {
		int rc = range_push(r, n, (uint64_t)(w->src + (size_t)i * w->src_stride - base),
				    len, compact);
		if (rc)
			return rc;
	}
	return 0;
}

int model_weight_ranges(const model_t *m, const gguf_t *g, int with_head, model_range_t **r, int *n)
{
	/* the mapping's first byte, from any tensor's address and offset */
	const gguf_tensor_t *t = gguf_find_tensor(g, "token_embd.weight");
	if (!t)
		return SH_EINVAL;
	const uint8_t *base = (const uint8_t *)t->data - gguf_data_offset(g) - t->offset;
	int rc = mat_ranges(&m->embd, base, r, n);
	if (!rc && with_head && !m->meta.tied_output)
		rc = mat_ranges(&m->out, base, r, n);
	for (int l = m->sh.layer0; !rc && l < m->sh.layer1; l++) {
		const layer_t *L = &m->layers[l];
		const wmat_t *w[] = {&L->wq,     &L->wk,   &L->wv,    &L->wo,
				     &L->w_gate, &L->w_up, &L->w_down};
		for (size_t i = 0; !rc && i < ARRAY_LEN(w); i++)
			rc = mat_ranges(w[i], base, r, n);
		if (!rc && L->moe)
			rc = moe_weight_ranges(m, L->moe, base, r, n);
		if (!rc && L->mla)
			rc = mla_weight_ranges(L, base, r, n);
		if (!rc && L->dn)
			rc = deltanet_weight_ranges(L, base, r, n);
	}
	return rc;
}

/* ---- forward ------------------------------------------------------------------------------ */

/* out[B][w->rows] = w . x, summed over the ranks by the all-reduce hook (none on one node); one
 * token's sums are streamed out chunk by chunk as they are computed when the hook asks. */
static int matmul_reduce(model_t *m, const wmat_t *w, float *out, const float *x, int B)
{
	int n = m->ars.begin && B == 1 ? m->ars.begin(m->ar_ctx, out, w->rows) : 0;
	if (n <= 0) {
		if (n < 0)
			return n;
		matmul(m, w, out, x, B);
		return m->ar ? m->ar(m->ar_ctx, out, B * w->rows) : 0;
	}
	for (int c = 0; c < n; c++) {
		int r0, r1, rc;
		m->ars.chunk(m->ar_ctx, c, &r0, &r1);
		matmul_rows(m, w, out, x, r0, r1);
		if ((rc = m->ars.push(m->ar_ctx, c)))
			return rc;
	}
	return m->ars.end(m->ar_ctx);
}

/* The output head of the B <= max_b entries out[B] (NULL: every entry MODEL_OUT_LOGITS) whose
 * rows are in x: x[b] for entry b, or (packed) only the rows of the entries that want an
 * output, in order. Rows that want logits are normed into xb and go through one head matmul
 * into logits (when given); those that want the hidden state are normed into embd (when
 * given). *n_out, *n_embd, *n_rows: the logits rows, embd rows and rows of x used. */
static void head_rows(model_t *m, const float *x, const int *out, int B, int packed, float *logits,
		      float *embd, int *n_out, int *n_embd, int *n_rows)
{
	int D = m->meta.dim, no = 0, ne = 0, r = 0;
	for (int b = 0; b < B; b++) {
		int kind = out ? out[b] : MODEL_OUT_LOGITS;
		if (!kind)
			continue;
		const float *row = x + (size_t)(packed ? r++ : b) * D;
		if (kind == MODEL_OUT_LOGITS && logits)
			rmsnorm(m->xb + (size_t)no++ * D, row, m->out_norm, D, m->meta.rms_eps);
		else if (kind == MODEL_OUT_EMBD && embd)
			rmsnorm(embd + (size_t)ne++ * D, row, m->out_norm, D, m->meta.rms_eps);
	}
	if (no)
		matmul(m, &m->out, logits, m->xb, no);
	*n_out = no, *n_embd = ne, *n_rows = r;
	float c = m->meta.logit_softcap; /* gemma3's optional final_logit_softcapping */
	for (size_t i = 0; c > 0 && i < (size_t)no * m->meta.n_vocab; i++)
		logits[i] = c * tanhf(logits[i] / c);
}

/* One pass of B <= max_b tokens (slot[b], pos[b] each); logits of the tokens with out[b] ==
 * MODEL_OUT_LOGITS, in order, when logits != NULL; the normed hidden state of those with
 * MODEL_OUT_EMBD, in order, when embd != NULL. */
static int forward_batch(model_t *m, const int *tokens, const int *slot, const int *pos,
			 const int *out, const int *keep, int B, float *logits, float *embd)
{
	const model_meta_t *p = &m->meta;
	int D = p->dim, hd = p->head_dim, F = m->sh.n_ffn;
	int rc;
	m->bslot = slot;
	m->bpos = pos;
	/* DeltaNet layers: every slot resumes from a held state (deltanet.c) */
	if (m->dn && (rc = deltanet_plan(m, slot, pos, keep, B)))
		return rc;

	/* x[B][D] = token_embd[tokens], or the previous pipeline stage's output */
	if (m->sh.layer0 > 0) {
		if (!m->pipe)
			return SH_EINVAL;
		if ((rc = m->pipe(m->pipe_ctx, 0, m->x, B, D)))
			return rc;
	} else {
		for (int b = 0; b < B; b++)
			quant_dequant_row(m->embd.type,
					  m->embd.data + (size_t)tokens[b] * m->embd.row_bytes,
					  m->x + (size_t)b * D, D);
		if (p->embd_scale > 0) /* gemma3: times sqrt(dim) */
			for (int i = 0; i < B * D; i++)
				m->x[i] *= p->embd_scale;
	}

	rope_table(m, pos, B);
	for (int b = 0; b < B; b++) /* what the sliding-window rings will hold (swa.c) */
		swa_note(m, slot[b], pos[b]);
	for (int l = m->sh.layer0; l < m->sh.layer1; l++) {
		layer_t *L = &m->layers[l];
		int lc = l - m->sh.layer0;      /* index into the KV cache */
		int swa = meta_layer_swa(p, l); /* a sliding-window layer (its own RoPE, swa.c) */
		/* attention block: xb[B][D] = rmsnorm(x); q[B][qd], k,v[B][kvd] -> att[B][qd] */
		for (int b = 0; b < B; b++)
			rmsnorm(m->xb + (size_t)b * D, m->x + (size_t)b * D, L->attn_norm, D,
				p->rms_eps);
		if (L->dn) { /* qwen35: a DeltaNet layer, its output projection included */
			deltanet_forward(m, L, B);
		} else if (L->mla) { /* deepseek2: latent attention (mla.c) */
			mla_attention(m, L, lc, B);
		} else {
			const wmat_t *qkv[3] = {&L->wq, &L->wk, &L->wv};
			float *qkv_out[3] = {L->q_gated ? m->qfull : m->q, m->k, m->v};
			matmul_same_input(m, 3, qkv, qkv_out, m->xb, B);
			for (int b = 0; b < B; b++) {
				float *q = m->q + (size_t)b * m->qd, *k = m->k + (size_t)b * m->kvd;
				for (int h = 0; L->q_gated && h < m->sh.n_q_heads; h++) {
					const float *f =
					    m->qfull + ((size_t)b * m->qd + (size_t)h * hd) * 2;
					memcpy(q + h * hd, f, (size_t)hd * sizeof *q);
					memcpy(m->qgate + (size_t)b * m->qd + (size_t)h * hd,
					       f + hd, (size_t)hd * sizeof *q);
				}
				float *v = m->v + (size_t)b * m->kvd;
				if (L->bq) {
					for (int i = 0; i < m->qd; i++)
						q[i] += L->bq[i];
					for (int i = 0; i < m->kvd; i++) {
						k[i] += L->bk[i];
						v[i] += L->bv[i];
					}
				}
				for (int h = 0; h < m->sh.n_q_heads; h++) {
					if (L->q_norm)
						rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd,
							p->rms_eps);
					rope_layer(m, q + h * hd, b, swa);
				}
				for (int h = 0; h < m->sh.n_kv_heads; h++) {
					if (L->k_norm)
						rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd,
							p->rms_eps);
					rope_layer(m, k + h * hd, b, swa);
				}
				attn_cache_put(m, L->kv_lc, slot[b], pos[b], k, v);
			}
			if (m->attn_ref)
				attention_ref(m, L->kv_lc, B);
			else
				attention(m, L->kv_lc, B);
			for (int i = 0; L->q_gated && i < B * m->qd; i++) /* qwen35's output gate */
				m->att[i] *= 1.0f / (1.0f + expf(-m->qgate[i]));
		}
		/* xb2[B][D] = W_o[:, shard cols] . att (partial over ranks), summed; + the output
		 * bias (gpt-oss: every rank holds it and adds it to the sum) */
		if (L->dn) /* the Gated DeltaNet block left its output in xb2 */
			rc = m->ar ? m->ar(m->ar_ctx, m->xb2, B * D) : 0;
		else
			rc = matmul_reduce(m, &L->wo, m->xb2, m->att, B);
		for (int b = 0; !rc && L->bo && b < B; b++)
			for (int i = 0; i < D; i++)
				m->xb2[(size_t)b * D + i] += L->bo[i];
		if (rc)
			return rc;
		for (int b = 0; L->post_attn && b < B; b++) /* gemma3: norm the whole sum */
			rmsnorm(m->xb2 + (size_t)b * D, m->xb2 + (size_t)b * D, L->post_attn, D,
				p->rms_eps);
		for (int i = 0; i < B * D; i++)
			m->x[i] += m->xb2[i];

		/* FFN block, dense: hb[B][F] = silu(gate(xb)) * up(xb); xb2 = down(hb); or the
		 * mixture of experts (moe.c): xb2 = this rank's experts and shared slice */
		for (int b = 0; b < B; b++)
			rmsnorm(m->xb + (size_t)b * D, m->x + (size_t)b * D, L->ffn_norm, D,
				p->rms_eps);
		if (L->moe) {
			moe_ffn(m, L->moe, B);
			if (m->ar && (rc = m->ar(m->ar_ctx, m->xb2, B * D)))
				return rc;
		} else {
			const wmat_t *gu[2] = {&L->w_gate, &L->w_up};
			float *gu_out[2] = {m->hb, m->hb2};
			matmul_same_input(m, 2, gu, gu_out, m->xb, B);
			if (p->ffn_gelu) {
				gelu_gate(m->hb, m->hb2, B * F);
			} else {
				for (int i = 0; i < B * F; i++) {
					float g = m->hb[i];
					m->hb[i] = g / (1.0f + expf(-g)) * m->hb2[i];
				}
			}
			if ((rc = matmul_reduce(m, &L->w_down, m->xb2, m->hb, B)))
				return rc;
		}
		for (int b = 0; L->post_ffn && b < B; b++) /* gemma3: norm the whole sum */
			rmsnorm(m->xb2 + (size_t)b * D, m->xb2 + (size_t)b * D, L->post_ffn, D,
				p->rms_eps);
		for (int i = 0; i < B * D; i++)
			m->x[i] += m->xb2[i];
	}

	if (m->dn) /* the states these tokens wrote are now whole */
		deltanet_commit(m, pos);
	if (m->pipe && (m->sh.layer0 > 0 || m->sh.layer1 < p->n_layers) &&
	    (rc = m->pipe(m->pipe_ctx, 1, m->x, B, D)))
		return rc;
	if (logits || embd) { /* the rows that want an output */
		int n_out, n_embd, n_rows;
		head_rows(m, m->x, out, B, 0, logits, embd, &n_out, &n_embd, &n_rows);
	}
	return 0;
}

int model_head(model_t *m, const float *x, const int *out, int n, float *logits, float *embd)
{
	if (n < 0)
		return SH_EINVAL;
	for (int done = 0; done < n;) { /* the scratch holds max_b rows */
		int B = MIN(m->max_b, n - done), n_out, n_embd, n_rows;
		head_rows(m, x, out ? out + done : NULL, B, 1, logits, embd, &n_out, &n_embd,
			  &n_rows);
		x += (size_t)n_rows * m->meta.dim;
		if (logits)
			logits += (size_t)n_out * m->meta.n_vocab;
		if (embd)
			embd += (size_t)n_embd * m->meta.dim;
		done += B;
	}
	return 0;
}

int model_forward_batch(model_t *m, const model_batch_t *bt, float *logits)
{
	static const int zeros[MODEL_MAX_BATCH];
	if (bt->n <= 0)
		return SH_EINVAL;
	for (int i = 0; i < bt->n; i++)
		if (bt->tokens[i] < 0 || bt->tokens[i] >= m->meta.n_vocab || bt->slot[i] < 0 ||
		    bt->slot[i] >= m->n_slots || bt->pos[i] < 0 || bt->pos[i] >= m->n_ctx)
			return SH_EINVAL;
	float *embd = bt->embd;
	for (int done = 0; done < bt->n;) {
		int B = MIN(m->max_b, bt->n - done), n_out = 0, n_embd = 0, rc;
		const int *outs = zeros;
		if (bt->out) {
			outs = bt->out + done;
			for (int b = 0; b < B; b++) {
				n_out += outs[b] == MODEL_OUT_LOGITS;
				n_embd += outs[b] == MODEL_OUT_EMBD;
			}
		}
		rc = forward_batch(m, bt->tokens + done, bt->slot + done, bt->pos + done, outs,
				   bt->keep ? bt->keep + done : NULL, B,
				   logits && n_out ? logits : NULL, embd && n_embd ? embd : NULL);
		if (rc)
			return rc;
		if (logits)
			logits += (size_t)n_out * m->meta.n_vocab;
		if (embd)
			embd += (size_t)n_embd * m->meta.dim;
		done += B;
	}
	return 0;
}

int model_forward(model_t *m, const int *tokens, int n, int pos, float *logits)
{
	if (n <= 0 || pos < 0 || pos + n > m->n_ctx)
		return SH_EINVAL;
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= m->meta.n_vocab)
			return SH_EINVAL;
	int slot[MODEL_MAX_BATCH], ps[MODEL_MAX_BATCH], out[MODEL_MAX_BATCH];
	for (int done = 0; done < n;) {
		int B = MIN(m->max_b, n - done);
		int last = done + B == n;
		for (int b = 0; b < B; b++) {
			slot[b] = 0;
			ps[b] = pos + done + b;
			out[b] = last && b == B - 1 ? MODEL_OUT_LOGITS : 0;
		}
		int rc = forward_batch(m, tokens + done, slot, ps, out, NULL, B,
				       last ? logits : NULL, NULL);
		if (rc)
			return rc;
		done += B;
	}
	return 0;
}

/* ---- recurrent state ------------------------------------------------------------------------ */

int model_seq_resume_pos(const model_t *m, int slot, int limit)
{
	if (!m->dn || slot < 0 || slot >= m->n_slots)
		return limit;
	return deltanet_resume_pos(m, slot, limit);
}

int model_set_rollback(model_t *m, int depth, char *err, size_t errlen)
{
	if (depth < 0 || depth > MODEL_MAX_BATCH)
		return sh_fail(err, errlen, SH_EINVAL, "rollback depth %d is not in 0..%d", depth,
			       MODEL_MAX_BATCH);
	return m->dn ? deltanet_alloc(m, depth + 1, err, errlen) : 0;
}

uint64_t model_rs_bytes_per_slot(const model_t *m)
{
	return m->dn ? deltanet_slot_bytes(m) : 0;
}
