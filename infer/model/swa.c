/*
 * swa.c: the KV cache of sliding-window attention layers (Gemma 3, gpt-oss), and its layout.
 *
 * In an SWA layer a query at position p attends to the keys at p0 with p - p0 < W (llama.cpp's
 * swa_type standard, llama_hparams::is_masked_swa). Such a layer needs only the last W positions
 * of each sequence, so its cache is a ring of R positions per (slot, KV head): position p lives
 * in row p % R. One internal pass writes up to MODEL_MAX_BATCH positions of a slot before it
 * attends, and its first token still needs W - 1 positions before it, so R = W - 1 +
 * MODEL_MAX_BATCH rounded up to whole attention tiles (a tile of positions [t0, t0 + ATT_TILE)
 * is then contiguous in the ring too). When R would not be smaller than the context the layer
 * keeps every position like the others (ring 0); the window is applied by attn.c either way.
 *
 * Prefix reuse (a new sequence keeping the first k positions of a slot) needs positions
 * [k - W + 1, k) in every ring: ring_lo[slot] tracks the oldest position the rings still hold,
 * which swa_note moves as positions are written (a restart below it keeps only what is written
 * from there), and model_prefix_usable answers the engine.
 *
 * Invariant: for every slot, positions [ring_lo[slot], last written] are in every ring layer's
 * rows, and every layer's npos is a multiple of ATT_TILE.
 */
#include "common/common.h"
#include "infer/model/model_int.h"

#include <stdlib.h>

int model_swa_ring(const model_meta_t *meta, int n_ctx)
{
	if (meta->swa_window <= 0 || meta->is_mla)
		return 0;
	int64_t r =
	    ((int64_t)meta->swa_window - 1 + MODEL_MAX_BATCH + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
	int64_t all = ((int64_t)n_ctx + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
	return r < all ? (int)r : 0;
}

/* SWA layers in [l0, l1). */
static int swa_layers(const model_meta_t *meta, int l0, int l1)
{
	int n = 0;
	for (int l = l0; l < l1; l++)
		n += meta_layer_swa(meta, l);
	return n;
}

/* Bytes of the full layers' cache for n_full positions plus the sliding-window layers' for n_swa
 * (per slot, shard NULL = the whole model). */
static uint64_t kv_bytes(const model_meta_t *meta, const model_shard_t *shard, int kv_type,
			 int n_full, int n_swa)
{
	model_shard_t full;
	if (!shard) {
		model_shard_full(meta, &full);
		shard = &full;
	}
	uint64_t b = (uint64_t)model_kv_bytes_per_pos(meta, shard, kv_type) * (uint64_t)n_full;
	if (meta->swa_window <= 0 || meta->is_mla || model_kv_type_check(meta, kv_type, NULL, 0))
		return b;
	int l1 = shard->layer1 ? shard->layer1 : meta->n_layers;
	uint64_t row = 2 * quant_row_bytes(kv_type, (int64_t)shard->n_kv_heads * meta->head_dim);
	return b + (uint64_t)swa_layers(meta, shard->layer0, l1) * row * (uint64_t)n_swa;
}

uint64_t model_kv_bytes(const model_meta_t *meta, const model_shard_t *shard, int kv_type,
			int n_ctx)
{
	int ring = model_swa_ring(meta, n_ctx);
	return kv_bytes(meta, shard, kv_type, n_ctx, ring ? ring : n_ctx);
}

uint64_t model_kv_read_bytes(const model_meta_t *meta, const model_shard_t *shard, int kv_type,
			     int pos)
{
	return kv_bytes(meta, shard, kv_type, pos + 1, MIN(pos + 1, meta->swa_window));
}

int swa_layout(model_t *m, size_t *rows)
{
	const model_meta_t *mt = &m->meta;
	int nl = m->n_kv_layers; /* the shard's layers with a KV cache (not qwen35's DeltaNet) */
	m->ring = model_swa_ring(mt, m->n_ctx);
	m->kvl = calloc((size_t)MAX(nl, 1), sizeof *m->kvl);
	m->ring_lo = calloc((size_t)m->n_slots, sizeof *m->ring_lo);
	if (!m->kvl || !m->ring_lo)
		return SH_ENOMEM;
	size_t off = 0, per = (size_t)m->n_slots * (size_t)m->sh.n_kv_heads;
	*rows = 0;
	for (int l = m->sh.layer0, lc = 0; l < m->sh.layer1 && lc < nl; l++) {
		if (meta_layer_recurrent(mt, l))
			continue;
		int swa = meta_layer_swa(mt, l);
		kv_layer_t *k = &m->kvl[lc++];
		k->layer = l;
		k->npos = swa && m->ring ? m->ring : m->kv_npos;
		k->win = swa ? mt->swa_window : 0;
		k->off = off * m->kv_hrow;
		off += per * (size_t)k->npos;
	}
	*rows = off;
	return 0;
}

void swa_free(model_t *m)
{
	free(m->kvl);
	free(m->ring_lo);
	m->kvl = NULL;
	m->ring_lo = NULL;
}

void swa_note(model_t *m, int slot, int pos)
{
	if (!m->ring)
		return;
	int *lo = &m->ring_lo[slot];
	if (pos < *lo) /* a new sequence restarting below what is held: only its rows count */
		*lo = pos;
	if (pos + 1 - m->ring > *lo) /* this row overwrote position pos - ring */
		*lo = pos + 1 - m->ring;
}

int model_prefix_usable(const model_t *m, int slot, int k)
{
	if (!m->ring || k <= 0 || slot < 0 || slot >= m->n_slots)
		return k;
	int need = MAX(0, k - m->meta.swa_window + 1); /* what position k attends to */
	return need >= m->ring_lo[slot] ? k : 0;
}
