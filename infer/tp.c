/*
 * tp.c: the lock-step protocol and the model hooks that let several ranks compute one model.
 *
 * Rank 0 owns the requests: it broadcasts each forward pass as a STEP (64 bytes, tokens inline
 * up to DIST_INLINE_TOKENS, else a second broadcast of the ids) or, for a continuous-batching
 * step of several sequences, a BATCH (64 bytes, then n entries of token, slot, position, flags
 * unless they fit inline), then computes. Every rank keeps the same slots of KV cache for its
 * heads or layers, so a BATCH addresses them all alike. Every rank runs
 * the same model_forward on its shard; the model's hooks meet the other ranks mid-pass: the
 * ranks form stages (tp.h), each a tensor group over a range of layers with two all-reduces
 * per layer among its ranks; a stage's root sends the hidden state to every rank of the next
 * stage, and the last stage's root sends the rows that want logits back to rank 0, which
 * computes the head. With several stages rank 0 may have several passes in flight
 * (dist_submit / dist_collect), each tagged with its step number.
 *
 * Invariant: d->seq is the number of STEPs sent (rank 0) or run (others); a STEP whose sequence
 * number is not the next one is a protocol error, so no rank ever computes a pass out of order.
 * d->err holds the first failure; once set every call fails with it.
 */
#include "infer/tp.h"
#include "common/common.h"
#include "infer/quant/quant.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIST_SHARE_WORDS                                                                           \
	16 /* status, version, q0, q1, kv0, kv1, ffn0, ffn1, layer0, layer1,                       \
	    * exp0, exp1, shx0, shx1 (routed experts, shared-expert units), stage0, stage1 */

/* A pass rank 0 submitted whose result has not come back (tp.h, dist_submit). */
typedef struct flight {
	uint64_t seq;
	int n_out; /* rows the last stage returns */
} flight_t;

struct dist {
	tp_group_t *g;
	int rank, world, pipeline, timeout_ms;
	model_t *m;
	uint64_t seq;
	int rc; /* first failure, 0 while healthy */
	char err[320];
	int *tok; /* [tok_cap] receive space for long STEPs */
	int tok_cap;
	uint8_t *ent; /* [ent_cap * DIST_BATCH_ENTRY] BATCH entries (wire form) */
	int *eb;      /* [5 * ent_cap] decoded entries: tokens, slots, positions, outs, keeps */
	int ent_cap;
	dist_stats_t st;
	double pass_comm_ms; /* communication of the pass in progress */
	int n_layers;        /* all-reduces per forward batch: 2 x n_layers (tensor mode) */
	int dim;             /* row length of the all-reduced x[B][dim] */
	int ar_calls;        /* all-reduce hook calls in the pass in progress */
	int st_n, st_chunks; /* the streamed all-reduce in progress: floats, chunks */
	double st_ms;        /* its communication time so far (pushes) */
	int rollback;        /* recurrent-state rollback depth (rank 0's, agreed at SETUP) */
	FILE *trace;        /* SHOAL_TP_TRACE=PREFIX: one line per sync (us) in PREFIX.RANK */
	int64_t trace_mark; /* where the compute before the next traced sync began (ns) */
	pthread_mutex_t shared_mu; /* guards shared: a worker rank's st after its last pass */
	dist_stats_t shared;
	/* stages (tp.h): stage s is ranks [first[s], first[s + 1]); ours is `stage` */
	int stage0_req, stage1_req; /* dist_set_stage's (equal: the mode's layout) */
	int n_stages, stage, first[TP_MAX_WORLD + 1];
	int team[TP_MAX_WORLD], n_team; /* our stage's ranks for the all-reduces; 0: the group */
	/* the pass in progress: its step number (the hidden states' tag), out flags (NULL: the
	 * last row only), rows and rows done (pipe hook) */
	uint64_t pass_seq;
	const int *pass_out;
	int pass_n, pass_row;
	float *ret; /* last stage's root: [ret_cap] the out rows going back to rank 0 */
	size_t ret_cap;
	int ret_rows;
	/* rank 0: passes in flight (oldest first, a ring of fl_cap) and the rows that came back */
	flight_t *fl;
	int fl_head, fl_n, fl_cap;
	float *back;
	size_t back_cap;
};

/* ---- shares ------------------------------------------------------------------------------- */

/* The planner's split (common/), for a worker without a plan: units over n int weights (NULL =
 * equal), at least one each (units >= n). */
static void split_units(int *out, int n, int units, const int *w)
{
	uint64_t uw[TP_MAX_WORLD];
	for (int i = 0; i < n; i++)
		uw[i] = w ? (uint64_t)w[i] : 1;
	sh_split_units(out, n, units, 1, uw);
}

/* Units a rank may hold none of (whole routed experts, shared-expert blocks), as the planner
 * splits them: no minimum. */
static void split_whole(int *out, int n, int units, const int *w)
{
	uint64_t uw[TP_MAX_WORLD];
	for (int i = 0; i < n; i++)
		uw[i] = w ? (uint64_t)w[i] : 1;
	sh_split_units(out, n, units, 0, uw);
}

int dist_split(const model_meta_t *mt, int ffn_block, int pipeline, int world, const int *w,
	       model_shard_t *out, char *err, size_t errlen)
{
	int cnt[TP_MAX_WORLD], pos = 0;
	if (world < 1 || world > TP_MAX_WORLD || ffn_block < 1)
		return sh_fail(err, errlen, SH_EINVAL, "bad world size %d", world);
	for (int r = 0; w && r < world; r++)
		if (w[r] <= 0)
			return sh_fail(err, errlen, SH_EINVAL,
				       "share %d of rank %d is not positive", w[r], r);
	int grp = mt->n_heads / mt->n_kv_heads;
	/* every layer routes (gpt-oss): no dense FFN reads its slice, so a small one may be cut
	 * finer than quant blocks to give every rank a piece */
	int fblk = mt->n_experts > 0 && mt->n_dense_lead == 0 && world > mt->ffn / ffn_block
		       ? 1
		       : ffn_block;
	int blocks = (mt->ffn + fblk - 1) / fblk;
	if (pipeline && world > mt->n_layers)
		return sh_fail(err, errlen, SH_EINVAL, "%d ranks for %d layers", world,
			       mt->n_layers);
	if (!pipeline && (world > mt->n_heads || world > blocks))
		return sh_fail(err, errlen, SH_EINVAL,
			       "%d ranks for %d query heads and %d FFN blocks of %d", world,
			       mt->n_heads, blocks, fblk);
	for (int r = 0; r < world; r++)
		model_shard_full(mt, &out[r]);
	if (pipeline) {
		split_units(cnt, world, mt->n_layers, w);
		for (int r = 0; r < world; pos += cnt[r++])
			out[r].layer0 = pos, out[r].layer1 = pos + cnt[r];
		return 0;
	}
	if (world <= mt->n_kv_heads) { /* whole KV-head groups */
		split_units(cnt, world, mt->n_kv_heads, w);
		for (int r = 0; r < world; pos += cnt[r++]) {
			out[r].kv_head0 = pos, out[r].n_kv_heads = cnt[r];
			out[r].q_head0 = pos * grp, out[r].n_q_heads = cnt[r] * grp;
		}
	} else { /* query heads; KV heads replicated on every rank that uses them */
		split_units(cnt, world, mt->n_heads, w);
		for (int r = 0; r < world; pos += cnt[r++]) {
			int q0 = pos, q1 = pos + cnt[r];
			out[r].q_head0 = q0, out[r].n_q_heads = cnt[r];
			out[r].kv_head0 = q0 / grp,
			out[r].n_kv_heads = (q1 - 1) / grp + 1 - q0 / grp;
		}
	}
	split_units(cnt, world, blocks, w);
	pos = 0;
	for (int r = 0; r < world; pos += cnt[r++]) {
		out[r].ffn0 = pos * fblk;
		out[r].n_ffn = MIN((pos + cnt[r]) * fblk, mt->ffn) - out[r].ffn0;
	}
	/* mixture of experts: whole routed experts by share (expert parallel), the shared block
	 * by columns like the dense FFN; a rank with none starts at the end */
	split_whole(cnt, world, mt->n_experts, w);
	pos = 0;
	for (int r = 0; r < world; pos += cnt[r++])
		out[r].exp0 = cnt[r] ? pos : mt->n_experts, out[r].n_exp = cnt[r];
	int sblocks = (mt->ffn_shexp + ffn_block - 1) / ffn_block;
	split_whole(cnt, world, sblocks, w);
	pos = 0;
	for (int r = 0; r < world; pos += cnt[r++]) {
		int s0 = pos * ffn_block, s1 = MIN((pos + cnt[r]) * ffn_block, mt->ffn_shexp);
		out[r].shx0 = cnt[r] ? s0 : mt->ffn_shexp, out[r].n_shx = cnt[r] ? s1 - s0 : 0;
	}
	return 0;
}

dist_part_t dist_tensor_part(const char *n)
{
	if (!strcmp(n, "token_embd.weight"))
		return DIST_PART_EMBD;
	if (strncmp(n, "blk.", 4))
		return DIST_PART_OUTPUT; /* output, output_norm */
	const char *dot = strchr(n + 4, '.');
	const char *k = dot ? dot + 1 : "";
	if (!strcmp(k, "attn_q.weight") || !strcmp(k, "attn_output.weight") ||
	    /* deepseek2's per-head latent attention matrices split with the query heads
	     * (attn_q_a, attn_kv_a_mqa and their norms are replicated) */
	    !strcmp(k, "attn_q_b.weight") || !strcmp(k, "attn_kv_b.weight") ||
	    !strcmp(k, "attn_k_b.weight") || !strcmp(k, "attn_v_b.weight"))
		return DIST_PART_Q_HEADS;
	if (!strcmp(k, "attn_k.weight") || !strcmp(k, "attn_v.weight"))
		return DIST_PART_KV_HEADS;
	if (strstr(k, "_exps.weight"))
		return DIST_PART_EXPERTS;
	/* a DeltaNet layer's matrices, cut along its key heads and their value heads
	 * (deltanet.c); its vectors and the small conv kernel are read whole like norms */
	if (!strcmp(k, "attn_qkv.weight") || !strcmp(k, "attn_gate.weight") ||
	    !strcmp(k, "ssm_beta.weight") || !strcmp(k, "ssm_alpha.weight") ||
	    !strcmp(k, "ssm_out.weight"))
		return DIST_PART_RECURRENT;
	if (!strncmp(k, "ffn_gate_inp", 12)) /* routers (ffn_gate_inp_shexp too) */
		return DIST_PART_REPLICATED;
	if (strstr(k, "_shexp.weight"))
		return DIST_PART_SHEXP;
	if (!strncmp(k, "ffn_", 4) && strcmp(k, "ffn_norm.weight"))
		return DIST_PART_FFN;
	return DIST_PART_REPLICATED;
}

int dist_ffn_block(const gguf_t *g)
{
	int blk = 32;
	for (int i = 0; i < gguf_n_tensors(g); i++) {
		const gguf_tensor_t *t = gguf_tensor(g, i);
		const char *dot = strncmp(t->name, "blk.", 4) ? NULL : strchr(t->name + 4, '.');
		if (dot && (!strcmp(dot + 1, "ffn_down.weight") ||
			    !strcmp(dot + 1, "ffn_down_shexp.weight")))
			blk = MAX(blk, quant_block_elems(t->type));
	}
	return blk;
}

void dist_even_weights(const gguf_t *g, int world, int *w)
{
	uint64_t layers = 0, head = 0, embd = 0;
	for (int i = 0; i < gguf_n_tensors(g); i++) {
		const gguf_tensor_t *t = gguf_tensor(g, i);
		if (!strncmp(t->name, "blk.", 4))
			layers += t->nbytes;
		else if (!strcmp(t->name, "output.weight"))
			head = t->nbytes;
		else if (!strcmp(t->name, "token_embd.weight"))
			embd = t->nbytes;
	}
	if (!head) /* tied: the head reads the embedding matrix */
		head = embd;
	/* rank 0 also reads the head: s0 * L + H = s * L with s0 + (N - 1) s = 1 */
	double h = layers ? (double)head / (double)layers : 0, s = (1 + h) / world;
	double s0 = MAX(s - h, s / 4);
	for (int r = 0; r < world; r++)
		w[r] = (int)(10000 * (r ? s : s0)) + 1;
}

/* ---- object ------------------------------------------------------------------------------- */

int dist_new(dist_t **out, tp_group_t *g, int pipeline, int step_timeout_ms)
{
	dist_t *d = calloc(1, sizeof *d);
	*out = NULL;
	if (!d)
		return SH_ENOMEM;
	d->g = g;
	d->rank = tp_group_rank(g);
	d->world = tp_group_world(g);
	d->pipeline = pipeline;
	d->timeout_ms = step_timeout_ms > 0 ? step_timeout_ms : 10000;
	pthread_mutex_init(&d->shared_mu, NULL);
	const char *tr = getenv("SHOAL_TP_TRACE");
	if (tr && *tr) { /* a bench aid: pairing ranks' lines separates transfer from skew */
		char path[512];
		snprintf(path, sizeof path, "%s.%d", tr, d->rank);
		if (!(d->trace = fopen(path, "w")))
			LOG(LOG_WARN, "cannot write %s", path);
	}
	*out = d;
	return 0;
}

void dist_free(dist_t *d)
{
	if (!d)
		return;
	free(d->tok);
	free(d->ent);
	free(d->eb);
	free(d->ret);
	free(d->fl);
	free(d->back);
	if (d->trace)
		fclose(d->trace);
	pthread_mutex_destroy(&d->shared_mu);
	free(d);
}

void dist_set_stage(dist_t *d, int stage0, int stage1)
{
	d->stage0_req = stage0;
	d->stage1_req = stage1;
}

int dist_n_stages(const dist_t *d)
{
	return d->n_stages;
}

void dist_set_rollback(dist_t *d, int depth)
{
	d->rollback = depth;
}

int dist_rollback(const dist_t *d)
{
	return d->rollback;
}

int dist_rank(const dist_t *d)
{
	return d->rank;
}
int dist_world(const dist_t *d)
{
	return d->world;
}
const char *dist_error(const dist_t *d)
{
	return d->err;
}

void dist_get_stats(const dist_t *d, dist_stats_t *s)
{
	*s = d->st;
	s->bytes_sent = tp_group_bytes_sent(d->g);
}

void dist_get_stats_shared(dist_t *d, dist_stats_t *s)
{
	pthread_mutex_lock(&d->shared_mu);
	*s = d->shared;
	pthread_mutex_unlock(&d->shared_mu);
}

/* Records the first failure (later ones keep the first message). */
static int dist_fail(dist_t *d, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int dist_fail(dist_t *d, int rc, const char *fmt, ...)
{
	if (d->rc)
		return d->rc;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(d->err, sizeof d->err, fmt, ap);
	va_end(ap);
	d->rc = rc;
	LOG(LOG_WARN, "rank %d: %s", d->rank, d->err);
	return rc;
}

/* ---- setup -------------------------------------------------------------------------------- */

uint64_t dist_model_fingerprint(const gguf_t *g)
{
	uint64_t h = SH_FNV1A64_INIT;
	for (int i = 0; i < gguf_n_tensors(g); i++) {
		const gguf_tensor_t *t = gguf_tensor(g, i);
		uint8_t f[16];
		sh_put_le32(f, (uint32_t)t->type);
		sh_put_le64(f + 4, t->nbytes);
		sh_put_le32(f + 12, (uint32_t)t->n_dims);
		h = sh_fnv1a64(h, t->name, strlen(t->name));
		h = sh_fnv1a64(h, f, sizeof f);
		h = sh_fnv1a64(h, t->ne, sizeof t->ne);
		/* first and last bytes: one page each (a slice holds them too: eng_shard_ranges) */
		size_t k = (size_t)MIN(t->nbytes, 32);
		h = sh_fnv1a64(h, t->data, k);
		h = sh_fnv1a64(h, (const uint8_t *)t->data + t->nbytes - k, k);
	}
	return h;
}

/* SETUP layout (64 bytes): 12 u32 (see setup_encode), the model fingerprint u64 at 48, the KV
 * slot count u32 at 56 (0 from an older rank 0 means 1), the recurrent-state rollback depth
 * u32 at 60 (model_set_rollback; 0 from an older rank 0). */
static void setup_encode(uint8_t *h, const model_meta_t *mt, int ctx, int pipeline, int world,
			 uint64_t fp, int slots)
{
	memset(h, 0, DIST_HDR_BYTES);
	sh_put_le64(h + 48, fp);
	sh_put_le32(h + 56, (uint32_t)slots);
	uint32_t f[] = {DIST_MSG_SETUP,         DIST_VERSION,          (uint32_t)ctx,
			(uint32_t)pipeline,     (uint32_t)world,       (uint32_t)mt->n_layers,
			(uint32_t)mt->dim,      (uint32_t)mt->n_heads, (uint32_t)mt->n_kv_heads,
			(uint32_t)mt->head_dim, (uint32_t)mt->ffn,     (uint32_t)mt->n_vocab};
	for (size_t i = 0; i < ARRAY_LEN(f); i++)
		sh_put_le32(h + 4 * i, f[i]);
}

/* The stage layout from every rank's SHARE words (all: world records of rec bytes): stages
 * tile the ranks in order, the ranks of a stage agree on it and on its layers, stages tile the
 * layers in order, and within a stage the slices tile heads, FFN columns and experts as a
 * tensor group's do. Then sets our stage, its team and its layer count. */
static int layout_check(dist_t *d, const model_meta_t *mt, const uint8_t *all, size_t rec,
			char *err, size_t errlen)
{
	int l = 0, n = 0;
	for (int s0 = 0; s0 < d->world; n++) {
		const uint8_t *a = all + (size_t)s0 * rec;
		int s1 = (int)sh_get_le32(a + 60), l0 = (int)sh_get_le32(a + 32),
		    l1 = (int)sh_get_le32(a + 36);
		if ((int)sh_get_le32(a + 56) != s0 || s1 <= s0 || s1 > d->world)
			return sh_fail(err, errlen, SH_EINVAL,
				       "setup: rank %d's stage is ranks [%d,%d), expected one "
				       "starting at rank %d",
				       s0, (int)sh_get_le32(a + 56), s1, s0);
		if (l0 != l || l1 <= l0)
			return sh_fail(err, errlen, SH_EINVAL,
				       "setup: rank %d starts at layer %d, expected %d", s0, l0, l);
		int q = 0, f = 0, e = 0, x = 0;
		for (int r = s0; r < s1; r++) {
			const uint8_t *p = all + (size_t)r * rec;
			int q0 = (int)sh_get_le32(p + 8), q1 = (int)sh_get_le32(p + 12),
			    f0 = (int)sh_get_le32(p + 24);
			int f1 = (int)sh_get_le32(p + 28), e0 = (int)sh_get_le32(p + 40),
			    e1 = (int)sh_get_le32(p + 44);
			int x0 = (int)sh_get_le32(p + 48), x1 = (int)sh_get_le32(p + 52);
			if ((int)sh_get_le32(p + 56) != s0 || (int)sh_get_le32(p + 60) != s1)
				return sh_fail(err, errlen, SH_EINVAL,
					       "setup: rank %d's stage is ranks [%u,%u), rank %d's "
					       "[%d,%d)",
					       r, sh_get_le32(p + 56), sh_get_le32(p + 60), s0, s0,
					       s1);
			if ((int)sh_get_le32(p + 32) != l0 || (int)sh_get_le32(p + 36) != l1)
				return sh_fail(
				    err, errlen, SH_EINVAL,
				    "setup: rank %d holds layers [%u,%u), rank %d of its "
				    "stage [%d,%d)",
				    r, sh_get_le32(p + 32), sh_get_le32(p + 36), s0, l0, l1);
			if (q0 != q || f0 != f)
				return sh_fail(
				    err, errlen, SH_EINVAL,
				    "setup: rank %d's share (heads %d.., FFN %d..) does not "
				    "follow rank %d's (heads ..%d, FFN ..%d)",
				    r, q0, f0, r - 1, q, f);
			q = q1, f = f1;
			/* experts and shared units: ranks holding some tile them in order */
			if ((e1 > e0 && e0 != e) || (x1 > x0 && x0 != x))
				return sh_fail(err, errlen, SH_EINVAL,
					       "setup: rank %d's experts [%d,%d) / shared units "
					       "[%d,%d) do not follow at %d / %d",
					       r, e0, e1, x0, x1, e, x);
			if (e1 > e0)
				e = e1;
			if (x1 > x0)
				x = x1;
		}
		if (q != mt->n_heads || f != mt->ffn || e != mt->n_experts || x != mt->ffn_shexp)
			return sh_fail(
			    err, errlen, SH_EINVAL,
			    "setup: the ranks' shares do not cover the model (heads, FFN "
			    "columns or experts of ranks [%d,%d))",
			    s0, s1);
		d->first[n] = s0;
		if (d->rank >= s0 && d->rank < s1) {
			d->stage = n;
			d->n_layers = l1 - l0; /* the all-reduces of a pass: 2 per layer */
			d->n_team = s1 - s0 < d->world ? s1 - s0 : 0;
			for (int r = s0; r < s1; r++)
				d->team[r - s0] = r;
		}
		l = l1;
		s0 = s1;
	}
	d->first[n] = d->world;
	d->n_stages = n;
	if (l != mt->n_layers)
		return sh_fail(err, errlen, SH_EINVAL,
			       "setup: the ranks' shares do not cover the model (layers: %d of %d)",
			       l, mt->n_layers);
	return 0;
}

int dist_setup(dist_t *d, const model_meta_t *mt, uint64_t fp, const model_shard_t *mine, int *ctx,
	       int *slots, char *err, size_t errlen)
{
	int one = 1;
	if (!slots)
		slots = &one;
	uint8_t h[DIST_HDR_BYTES], ours[DIST_HDR_BYTES];
	char why[256];
	int rc;
	if (d->rank == 0) {
		setup_encode(h, mt, *ctx, d->pipeline, d->world, fp, *slots);
		sh_put_le32(h + 60, (uint32_t)d->rollback);
	}
	if ((rc = tp_broadcast(d->g, h, sizeof h, 0, d->timeout_ms, why, sizeof why)))
		return sh_fail(err, errlen, rc, "setup: %s", why);
	int status = 0;
	char bad[160] = "";
	if (sh_get_le32(h) != DIST_MSG_SETUP || sh_get_le32(h + 4) != DIST_VERSION) {
		status = SH_EUNSUPP;
		snprintf(bad, sizeof bad,
			 "lock-step message %#x version %u, we speak %#x version %d",
			 sh_get_le32(h), sh_get_le32(h + 4), DIST_MSG_SETUP, DIST_VERSION);
	} else {
		setup_encode(ours, mt, (int)sh_get_le32(h + 8), d->pipeline, d->world, fp,
			     (int)sh_get_le32(h + 56));
		sh_put_le32(ours + 60, sh_get_le32(h + 60));
		if (sh_get_le32(h + 56) > 4096 || sh_get_le32(h + 60) > 64) {
			status = SH_EINVAL;
			snprintf(bad, sizeof bad, "rank 0 asks for %u KV slots, rollback %u",
				 sh_get_le32(h + 56), sh_get_le32(h + 60));
		} else if (!memcmp(h, ours, 48) && sh_get_le64(h + 48) != fp) {
			status = SH_EINVAL;
			snprintf(
			    bad, sizeof bad,
			    "rank 0's model file differs from ours (same shape, other weights: "
			    "fingerprint %016llx, ours %016llx)",
			    (unsigned long long)sh_get_le64(h + 48), (unsigned long long)fp);
		} else if (memcmp(h, ours, sizeof h)) {
			status = SH_EINVAL;
			snprintf(
			    bad, sizeof bad,
			    "rank 0 has %s mode, %u ranks, %u layers, dim %u, %u heads, vocab %u; "
			    "we have %s, %d, %d, %d, %d, %d",
			    sh_get_le32(h + 12) ? "pipeline" : "tensor", sh_get_le32(h + 16),
			    sh_get_le32(h + 20), sh_get_le32(h + 24), sh_get_le32(h + 28),
			    sh_get_le32(h + 44), d->pipeline ? "pipeline" : "tensor", d->world,
			    mt->n_layers, mt->dim, mt->n_heads, mt->n_vocab);
		}
	}
	*ctx = (int)sh_get_le32(h + 8);
	*slots = sh_get_le32(h + 56) ? (int)sh_get_le32(h + 56) : 1;
	d->rollback = (int)sh_get_le32(h + 60);
	d->n_layers = mt->n_layers;
	d->dim = mt->dim;
	/* every rank learns every rank's status, shares and stage */
	int st0 = d->stage0_req, st1 = d->stage1_req;
	if (st0 == st1) /* the mode's layout: one tensor group, or a stage per rank */
		st0 = d->pipeline ? d->rank : 0, st1 = d->pipeline ? d->rank + 1 : d->world;
	uint32_t sh[DIST_SHARE_WORDS] = {(uint32_t)-status,
					 DIST_VERSION,
					 (uint32_t)mine->q_head0,
					 (uint32_t)(mine->q_head0 + mine->n_q_heads),
					 (uint32_t)mine->kv_head0,
					 (uint32_t)(mine->kv_head0 + mine->n_kv_heads),
					 (uint32_t)mine->ffn0,
					 (uint32_t)(mine->ffn0 + mine->n_ffn),
					 (uint32_t)mine->layer0,
					 (uint32_t)(mine->layer1 ? mine->layer1 : mt->n_layers),
					 (uint32_t)mine->exp0,
					 (uint32_t)(mine->exp0 + mine->n_exp),
					 (uint32_t)mine->shx0,
					 (uint32_t)(mine->shx0 + mine->n_shx),
					 (uint32_t)st0,
					 (uint32_t)st1};
	if (!mine->exp0 && !mine->n_exp) /* {0, 0}: all (model.h) */
		sh[11] = (uint32_t)mt->n_experts;
	if (!mine->shx0 && !mine->n_shx)
		sh[13] = (uint32_t)mt->ffn_shexp;
	uint8_t me[4 * DIST_SHARE_WORDS], *all = malloc((size_t)d->world * sizeof me);
	if (!all)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	for (int i = 0; i < DIST_SHARE_WORDS; i++)
		sh_put_le32(me + 4 * i, sh[i]);
	if ((rc = tp_all_gather(d->g, me, sizeof me, all, d->timeout_ms, why, sizeof why))) {
		free(all);
		return sh_fail(err, errlen, rc, "setup: %s", why);
	}
	if (status) {
		free(all);
		return sh_fail(err, errlen, status, "setup: %s", bad);
	}
	rc = 0;
	for (int r = 0; r < d->world && !rc; r++)
		if (sh_get_le32(all + (size_t)r * sizeof me))
			rc = sh_fail(
			    err, errlen, -(int)sh_get_le32(all + (size_t)r * sizeof me),
			    "setup: rank %d rejected rank 0's setup (model or options differ)", r);
	if (!rc)
		rc = layout_check(d, mt, all, sizeof me, err, errlen);
	free(all);
	return rc;
}

/* ---- hooks -------------------------------------------------------------------------------- */

/* Accounts one sync of ms milliseconds. The trace (a bench aid) writes the wait and the compute
 * before it, in microseconds: since the previous sync ended, or since the pass began on a rank
 * that waited idle for the step message. Pairing the ranks' lines then tells what the network
 * adds to a step (the wall time less each segment's slower compute) from skew. */
static void sync_done(dist_t *d, double ms)
{
	d->st.comm_ms += ms;
	d->pass_comm_ms += ms;
	if (d->trace) {
		int64_t end = now_ns(), start = end - (int64_t)(ms * 1e6);
		fprintf(d->trace, "%.1f %.1f\n", ms * 1000,
			d->trace_mark ? (double)(start - d->trace_mark) / 1e3 : 0.0);
		d->trace_mark = end;
	}
}

/* The last sum of a stage's pass (after its last layer's ffn_down) is only needed by the stage's
 * root, which computes the head (rank 0, one stage) or sends the hidden state on: the stage's
 * other ranks send their partial sums to the root only (tp_reduce_team: the bits the all-reduce
 * would give it, in 8-bit blocks with the q8 wire). Saves one send per peer and the root's
 * sends. */
static int hook_allreduce(void *ctx, float *x, int n)
{
	dist_t *d = ctx;
	char why[256];
	int64_t t0 = now_ns();
	int per = 2 * d->n_layers, k = d->ar_calls++;
	/* by rows, so that a row's sum (and its 8-bit blocks) never depend on the batch */
	size_t rows = d->dim > 0 && n % d->dim == 0 ? (size_t)(n / d->dim) : 1;
	int rc = per && k % per == per - 1
		     ? tp_reduce_team(d->g, d->n_team ? d->team : NULL, d->n_team,
				      d->first[d->stage], x, rows, (size_t)n / rows, d->timeout_ms, why,
				      sizeof why)
		     : tp_all_reduce_team(d->g, d->n_team ? d->team : NULL, d->n_team, x, rows,
					  (size_t)n / rows, d->timeout_ms, why, sizeof why);
	sync_done(d, (double)(now_ns() - t0) / 1e6);
	return rc ? dist_fail(d, rc, "%s", why) : 0;
}

/* Streamed all-reduce (model_ar_stream_t): a one-token sum goes out in chunks while the matmul
 * computes the next ones, when the transport says it pays (tp_all_reduce_stream_chunks). The
 * pass's last sum (reduce to rank 0) is never streamed. The same bits as hook_allreduce. */
static int hook_ar_begin(void *ctx, float *x, int n)
{
	dist_t *d = ctx;
	char why[256];
	int per = 2 * d->n_layers, nc = tp_all_reduce_stream_chunks(d->g, 1, (size_t)n);
	if (nc <= 0 || (per && d->ar_calls % per == per - 1))
		return 0;
	d->ar_calls++;
	int64_t t0 = now_ns();
	int rc = tp_all_reduce_begin(d->g, d->n_team ? d->team : NULL, d->n_team, x, 1, (size_t)n,
				     nc, d->timeout_ms, why, sizeof why);
	d->st_ms = (double)(now_ns() - t0) / 1e6;
	d->st_n = n;
	d->st_chunks = nc;
	return rc ? dist_fail(d, rc, "%s", why) : nc;
}

static void hook_ar_chunk(void *ctx, int c, int *r0, int *r1)
{
	dist_t *d = ctx;
	size_t a, b;
	tp_all_reduce_chunk((size_t)d->st_n, d->st_chunks, c, &a, &b);
	*r0 = (int)a;
	*r1 = (int)b;
}

static int hook_ar_push(void *ctx, int c)
{
	dist_t *d = ctx;
	char why[256];
	int64_t t0 = now_ns();
	int rc = tp_all_reduce_push(d->g, c, why, sizeof why);
	d->st_ms += (double)(now_ns() - t0) / 1e6;
	return rc ? dist_fail(d, rc, "%s", why) : 0;
}

static int hook_ar_end(void *ctx)
{
	dist_t *d = ctx;
	char why[256];
	int64_t t0 = now_ns();
	int rc = tp_all_reduce_end(d->g, why, sizeof why);
	sync_done(d, d->st_ms + (double)(now_ns() - t0) / 1e6);
	return rc ? dist_fail(d, rc, "%s", why) : 0;
}

/* The last stage's root keeps the rows of the chunk x[B][dim] that rank 0 wants logits of and,
 * after the pass's last chunk, sends them to rank 0 in one message (none: an empty one, so that
 * rank 0 knows the pass is through the ring). */
static int ret_rows(dist_t *d, const float *x, int B, int dim, char *why, size_t whylen)
{
	size_t row = (size_t)dim;
	if (d->pass_row == 0) { /* the pass's first chunk: room for all its out rows */
		size_t need = 1;
		for (int i = 0; d->pass_out && i < d->pass_n; i++)
			need += d->pass_out[i] != 0;
		if (need * row > d->ret_cap) {
			float *r = realloc(d->ret, need * row * sizeof *r);
			if (!r)
				return sh_fail(why, whylen, SH_ENOMEM, "out of memory");
			d->ret = r;
			d->ret_cap = need * row;
		}
		d->ret_rows = 0;
	}
	for (int b = 0; b < B; b++) {
		int i = d->pass_row + b;
		if (d->pass_out ? d->pass_out[i] != 0 : i == d->pass_n - 1)
			memcpy(d->ret + (size_t)d->ret_rows++ * row, x + (size_t)b * row,
			       row * sizeof *x);
	}
	if (d->pass_row + B < d->pass_n)
		return 0;
	return tp_group_send_msg(d->g, 0, (uint32_t)d->pass_seq, d->ret,
				 (size_t)d->ret_rows * row * sizeof *x, d->timeout_ms, why, whylen);
}

/* Stages (hybrid and pipeline): every rank of a stage after the first receives each chunk's
 * hidden state x[B][dim] from the previous stage's root (instead of embedding); a stage's root
 * sends it to every rank of the next stage, or, from the last stage, the rows that want logits
 * to rank 0 (ret_rows), which computes the head (dist_collect). Messages carry the pass's step
 * number as their tag: a stage never mixes up two micro-batches in flight. */
static int hook_pipe(void *ctx, int dir, float *x, int B, int dim)
{
	dist_t *d = ctx;
	char why[256];
	int rc = 0, s = d->stage;
	size_t all = (size_t)B * dim * sizeof *x, len = 0;
	uint32_t tag = (uint32_t)d->pass_seq, got = 0;
	int64_t t0 = now_ns();
	if (dir == 0) {
		int from = d->first[s - 1];
		rc = tp_group_recv_msg(d->g, from, &got, x, all, &len, d->timeout_ms, why,
				       sizeof why);
		if (!rc && (got != tag || len != all))
			rc = sh_fail(why, sizeof why, SH_EFORMAT,
				     "rank %d sent the hidden state of step %u (%zu bytes), "
				     "expected step %u (%zu bytes)",
				     from, got, len, tag, all);
	} else {
		if (d->rank == d->first[s] && s + 1 < d->n_stages)
			for (int r = d->first[s + 1]; !rc && r < d->first[s + 2]; r++)
				rc = tp_group_send_msg(d->g, r, tag, x, all, d->timeout_ms, why,
						       sizeof why);
		else if (d->rank == d->first[s])
			rc = ret_rows(d, x, B, dim, why, sizeof why);
		d->pass_row += B;
	}
	sync_done(d, (double)(now_ns() - t0) / 1e6);
	return rc ? dist_fail(d, rc, "%s", why) : 0;
}

void dist_attach(dist_t *d, model_t *m)
{
	d->m = m;
	if (d->world == 1)
		return;
	if (d->n_stages > 1)
		model_set_pipe(m, hook_pipe, d);
	if (d->first[d->stage + 1] - d->first[d->stage] > 1) {
		static const model_ar_stream_t st = {hook_ar_begin, hook_ar_chunk, hook_ar_push,
						     hook_ar_end};
		model_set_allreduce(m, hook_allreduce, d);
		model_set_allreduce_stream(m, &st);
	}
}

/* ---- steps -------------------------------------------------------------------------------- */

_Static_assert(28 + 4 * DIST_INLINE_TOKENS <= DIST_HDR_BYTES, "inline tokens fit a STEP");

/* STEP layout (64 bytes): type u32, version u32, seq u64, flags u32, pos u32, n u32, then up
 * to DIST_INLINE_TOKENS token ids (u32); more tokens follow as a second broadcast of n x u32. */
static void step_encode(uint8_t *h, uint32_t type, uint64_t seq, unsigned flags, int pos,
			const int *tokens, int n)
{
	memset(h, 0, DIST_HDR_BYTES);
	sh_put_le32(h, type);
	sh_put_le32(h + 4, DIST_VERSION);
	sh_put_le64(h + 8, seq);
	sh_put_le32(h + 16, flags);
	sh_put_le32(h + 20, (uint32_t)pos);
	sh_put_le32(h + 24, (uint32_t)n);
	for (int i = 0; i < n && i < DIST_INLINE_TOKENS; i++)
		sh_put_le32(h + 28 + 4 * i, (uint32_t)tokens[i]);
}

int dist_step_decode(const uint8_t *h, size_t len, dist_step_t *s, char *err, size_t errlen)
{
	memset(s, 0, sizeof *s);
	if (len != DIST_HDR_BYTES)
		return sh_fail(err, errlen, SH_EFORMAT, "lock-step message of %zu bytes", len);
	s->type = sh_get_le32(h);
	uint32_t ver = sh_get_le32(h + 4);
	if (ver != DIST_VERSION)
		return sh_fail(err, errlen, SH_EUNSUPP, "rank 0 speaks lock-step version %u, we %d",
			       ver, DIST_VERSION);
	s->seq = sh_get_le64(h + 8);
	s->flags = sh_get_le32(h + 16);
	uint32_t pos = sh_get_le32(h + 20), n = sh_get_le32(h + 24);
	if (s->type == DIST_MSG_STOP)
		return 0;
	if (s->type == DIST_MSG_BATCH) { /* n at 20; entries inline from 28 when n <= 2 */
		n = sh_get_le32(h + 20);
		if (n == 0 || n > DIST_MAX_STEP_TOKENS)
			return sh_fail(err, errlen, SH_EFORMAT, "bad batch message (n %u)", n);
		s->n = (int)n;
		if (n <= DIST_INLINE_BATCH)
			memcpy(s->inline_batch, h + 28, n * DIST_BATCH_ENTRY);
		return 0;
	}
	if (s->type != DIST_MSG_STEP || n == 0 || n > DIST_MAX_STEP_TOKENS || pos > INT32_MAX)
		return sh_fail(err, errlen, SH_EFORMAT, "bad lock-step message %#x (n %u, pos %u)",
			       s->type, n, pos);
	s->pos = (int)pos;
	s->n = (int)n;
	for (int i = 0; i < s->n && i < DIST_INLINE_TOKENS; i++)
		s->inline_tokens[i] = (int)sh_get_le32(h + 28 + 4 * i);
	return 0;
}

_Static_assert(28 + DIST_INLINE_BATCH * DIST_BATCH_ENTRY <= DIST_HDR_BYTES, "inline entries fit");

/* BATCH layout (64 bytes): type u32, version u32, seq u64, flags u32, n u32, 4 bytes zero, then
 * n <= DIST_INLINE_BATCH entries inline, else a second broadcast of n entries. An entry is
 * token u32, slot u32, position u32, flags u32 (DIST_ENTRY_OUT, DIST_ENTRY_KEEP). */
static void batch_encode_entries(uint8_t *p, const model_batch_t *b)
{
	for (int i = 0; i < b->n; i++, p += DIST_BATCH_ENTRY) {
		sh_put_le32(p, (uint32_t)b->tokens[i]);
		sh_put_le32(p + 4, (uint32_t)b->slot[i]);
		sh_put_le32(p + 8, (uint32_t)b->pos[i]);
		sh_put_le32(p + 12, (b->out && b->out[i] ? DIST_ENTRY_OUT : 0) |
					(b->keep && b->keep[i] ? DIST_ENTRY_KEEP : 0));
	}
}

/* Room for n entries in both forms. */
static int ent_room(dist_t *d, int n)
{
	if (n <= d->ent_cap)
		return 0;
	uint8_t *e = realloc(d->ent, (size_t)n * DIST_BATCH_ENTRY);
	if (!e)
		return SH_ENOMEM;
	d->ent = e;
	int *eb = realloc(d->eb, (size_t)n * 5 * sizeof *eb);
	if (!eb)
		return SH_ENOMEM;
	d->eb = eb;
	d->ent_cap = n;
	return 0;
}

/* Wire entries -> a batch over d->eb (ids, slots and positions are checked by the model; a
 * value beyond INT_MAX becomes negative and fails there). */
static model_batch_t batch_decode_entries(dist_t *d, const uint8_t *p, int n)
{
	int *t = d->eb, *sl = t + n, *ps = sl + n, *out = ps + n, *keep = out + n;
	for (int i = 0; i < n; i++, p += DIST_BATCH_ENTRY) {
		t[i] = (int)sh_get_le32(p);
		sl[i] = (int)sh_get_le32(p + 4);
		ps[i] = (int)sh_get_le32(p + 8);
		out[i] = (sh_get_le32(p + 12) & DIST_ENTRY_OUT) != 0;
		keep[i] = (sh_get_le32(p + 12) & DIST_ENTRY_KEEP) != 0;
	}
	return (model_batch_t){n, t, sl, ps, out, keep, NULL}; /* embd: rank 0's, as the head */
}

static int tok_room(dist_t *d, int n)
{
	if (n <= d->tok_cap)
		return 0;
	int *t = realloc(d->tok, (size_t)n * sizeof *t);
	if (!t)
		return SH_ENOMEM;
	d->tok = t;
	d->tok_cap = n;
	return 0;
}

/* msg_ms: time of the step message that preceded the pass (rank 0). b != NULL: a batch (then
 * tokens and pos are unused). In a group of several stages rank 0 runs its stage only (logits
 * NULL): the head waits for the last stage's rows (dist_collect). */
static int pass_run(dist_t *d, const model_batch_t *b, const int *tokens, int n, int pos,
		    float *logits, double msg_ms)
{
	int64_t t0 = now_ns();
	if (d->rank)
		d->trace_mark = t0; /* its wait for the step message is no compute */
	d->pass_comm_ms = msg_ms;
	d->ar_calls = 0;
	d->pass_seq = d->seq;
	d->pass_out = b ? b->out : NULL;
	d->pass_n = b ? b->n : n;
	d->pass_row = 0;
	int rc =
	    b ? model_forward_batch(d->m, b, logits) : model_forward(d->m, tokens, n, pos, logits);
	if (b)
		n = b->n, pos = b->pos[0];
	if (!rc && n == 1 && d->world > 1 && d->n_stages == 1 &&
	    (d->st.comm_min_ms == 0 || d->pass_comm_ms < d->st.comm_min_ms))
		d->st.comm_min_ms = d->pass_comm_ms;
	d->st.step_ms += (double)(now_ns() - t0) / 1e6;
	d->st.steps++;
	d->st.tokens += (uint64_t)n;
	if (d->rank) { /* a worker rank's pass is whole here (rank 0 adds its step message) */
		pthread_mutex_lock(&d->shared_mu);
		d->shared = d->st;
		pthread_mutex_unlock(&d->shared_mu);
	}
	if (rc && !d->rc)
		dist_fail(d, rc, "forward pass at position %d failed: %s", pos, sh_strerror(rc));
	return rc;
}

int dist_forward(dist_t *d, const int *tokens, int n, int pos, unsigned flags, float *logits)
{
	uint8_t h[DIST_HDR_BYTES];
	char why[256];
	int rc;
	if (d->rc)
		return d->rc;
	if (d->world == 1)
		return pass_run(d, NULL, tokens, n, pos, logits, 0);
	if (d->n_stages > 1) { /* stages run batches: the last token's logits */
		if (n <= 0 || (rc = ent_room(d, n)))
			return n <= 0 ? SH_EINVAL : dist_fail(d, rc, "out of memory");
		int *sl = d->eb + n, *ps = sl + n, *out = ps + n;
		for (int i = 0; i < n; i++)
			sl[i] = 0, ps[i] = pos + i, out[i] = i == n - 1;
		model_batch_t b = {n, tokens, sl, ps, out, NULL, NULL};
		return dist_forward_batch(d, &b, logits);
	}
	int64_t t0 = now_ns();
	step_encode(h, DIST_MSG_STEP, d->seq + 1, flags, pos, tokens, n);
	rc = tp_broadcast(d->g, h, sizeof h, 0, d->timeout_ms, why, sizeof why);
	if (!rc && n > DIST_INLINE_TOKENS) {
		if ((rc = tok_room(d, n)))
			return dist_fail(d, rc, "out of memory");
		for (int i = 0; i < n; i++) /* ids go out little-endian like every field */
			sh_put_le32((uint8_t *)&d->tok[i], (uint32_t)tokens[i]);
		rc = tp_broadcast(d->g, d->tok, (size_t)n * 4, 0, d->timeout_ms, why, sizeof why);
	}
	double msg_ms = (double)(now_ns() - t0) / 1e6;
	d->st.comm_ms += msg_ms;
	if (rc)
		return dist_fail(d, rc, "step %llu: %s", (unsigned long long)(d->seq + 1), why);
	d->seq++;
	int64_t t1 = now_ns();
	rc = pass_run(d, NULL, tokens, n, pos, logits, msg_ms);
	d->st.step_ms += (double)(t1 - t0) / 1e6; /* the step message is part of the step */
	return rc;
}

/* Rank 0: the BATCH message of b (64 bytes, the entries inline or in a second broadcast). */
static int batch_send(dist_t *d, const model_batch_t *b, double *msg_ms)
{
	uint8_t h[DIST_HDR_BYTES];
	char why[256];
	int rc;
	int64_t t0 = now_ns();
	memset(h, 0, sizeof h);
	sh_put_le32(h, DIST_MSG_BATCH);
	sh_put_le32(h + 4, DIST_VERSION);
	sh_put_le64(h + 8, d->seq + 1);
	sh_put_le32(h + 20, (uint32_t)b->n);
	if ((rc = ent_room(d, b->n)))
		return dist_fail(d, rc, "out of memory");
	if (b->n <= DIST_INLINE_BATCH) {
		batch_encode_entries(h + 28, b);
		rc = tp_broadcast(d->g, h, sizeof h, 0, d->timeout_ms, why, sizeof why);
	} else {
		batch_encode_entries(d->ent, b);
		rc = tp_broadcast(d->g, h, sizeof h, 0, d->timeout_ms, why, sizeof why);
		if (!rc)
			rc = tp_broadcast(d->g, d->ent, (size_t)b->n * DIST_BATCH_ENTRY, 0,
					  d->timeout_ms, why, sizeof why);
	}
	*msg_ms = (double)(now_ns() - t0) / 1e6;
	d->st.comm_ms += *msg_ms;
	d->st.step_ms += *msg_ms; /* the step message is part of the step */
	if (rc)
		return dist_fail(d, rc, "step %llu: %s", (unsigned long long)(d->seq + 1), why);
	d->seq++;
	return 0;
}

int dist_forward_batch(dist_t *d, const model_batch_t *b, float *logits)
{
	double msg_ms;
	int rc;
	if (d->rc)
		return d->rc;
	if (b->n <= 0)
		return SH_EINVAL;
	if (d->world == 1)
		return pass_run(d, b, NULL, 0, 0, logits, 0);
	if (d->n_stages > 1) /* one micro-batch through the ring and back */
		return (rc = dist_submit(d, b)) ? rc : dist_collect(d, b, logits);
	if ((rc = batch_send(d, b, &msg_ms)))
		return rc;
	return pass_run(d, b, NULL, 0, 0, logits, msg_ms);
}

int dist_submit(dist_t *d, const model_batch_t *b)
{
	double msg_ms;
	int rc;
	if (d->rc)
		return d->rc;
	if (d->rank != 0 || d->n_stages < 2 || b->n <= 0)
		return SH_EINVAL;
	if (d->fl_n == d->fl_cap) { /* grow the ring, oldest first */
		int cap = d->fl_cap ? 2 * d->fl_cap : 8;
		flight_t *f = malloc((size_t)cap * sizeof *f);
		if (!f)
			return dist_fail(d, SH_ENOMEM, "out of memory");
		for (int i = 0; i < d->fl_n; i++)
			f[i] = d->fl[(d->fl_head + i) % d->fl_cap];
		free(d->fl);
		d->fl = f, d->fl_cap = cap, d->fl_head = 0;
	}
	int n_out = 0;
	for (int i = 0; i < b->n; i++)
		n_out += b->out && b->out[i];
	model_batch_t first = *b; /* stage 0's rows are not final: no hidden states out */
	first.embd = NULL;
	if ((rc = batch_send(d, b, &msg_ms)) ||
	    (rc = pass_run(d, &first, NULL, 0, 0, NULL, msg_ms)))
		return rc;
	d->fl[(d->fl_head + d->fl_n++) % d->fl_cap] = (flight_t){d->seq, n_out};
	d->st.in_flight_max = MAX(d->st.in_flight_max, d->fl_n);
	return 0;
}

int dist_collect(dist_t *d, const model_batch_t *b, float *logits)
{
	char why[256];
	int rc;
	if (d->rc)
		return d->rc;
	if (d->fl_n == 0)
		return SH_EINVAL;
	flight_t f = d->fl[d->fl_head];
	d->fl_head = (d->fl_head + 1) % d->fl_cap;
	d->fl_n--;
	size_t row = (size_t)d->dim * sizeof(float), len = 0, need = (size_t)f.n_out * d->dim;
	if (need > d->back_cap) {
		float *p = realloc(d->back, need * sizeof *p);
		if (!p)
			return dist_fail(d, SH_ENOMEM, "out of memory");
		d->back = p, d->back_cap = need;
	}
	int last = d->first[d->n_stages - 1];
	uint32_t tag = 0;
	int64_t t0 = now_ns();
	rc = tp_group_recv_msg(d->g, last, &tag, d->back, need * sizeof(float), &len, d->timeout_ms,
			       why, sizeof why);
	double ms = (double)(now_ns() - t0) / 1e6;
	d->st.comm_ms += ms;
	if (rc)
		return dist_fail(d, rc, "step %llu: %s", (unsigned long long)f.seq, why);
	if (tag != (uint32_t)f.seq || len != (size_t)f.n_out * row)
		return dist_fail(d, SH_EFORMAT,
				 "step %llu: rank %d returned step %u's hidden state (%zu bytes), "
				 "expected %zu bytes",
				 (unsigned long long)f.seq, last, tag, len, (size_t)f.n_out * row);
	float *embd = b ? b->embd : NULL;
	if (f.n_out && (logits || embd) &&
	    (rc = model_head(d->m, d->back, b ? b->out : NULL, b ? b->n : f.n_out, logits, embd)))
		return dist_fail(d, rc, "step %llu: output head: %s", (unsigned long long)f.seq,
				 sh_strerror(rc));
	d->st.step_ms += (double)(now_ns() - t0) / 1e6;
	return 0;
}

int dist_in_flight(const dist_t *d)
{
	return d->fl_n;
}

int dist_stop(dist_t *d)
{
	uint8_t h[DIST_HDR_BYTES];
	char why[256];
	if (d->rc || d->world == 1 || d->rank != 0)
		return d->rc;
	step_encode(h, DIST_MSG_STOP, d->seq + 1, 0, 0, NULL, 0);
	int rc = tp_broadcast(d->g, h, sizeof h, 0, d->timeout_ms, why, sizeof why);
	if (rc)
		return dist_fail(d, rc, "stop: %s", why);
	d->seq++;
	return 0;
}

int dist_serve(dist_t *d, char *err, size_t errlen)
{
	uint8_t h[DIST_HDR_BYTES];
	char why[256];
	int rc;
	while (!d->rc) {
		/* idle between requests: no deadline (a lost rank 0 closes the connection) */
		if ((rc = tp_broadcast(d->g, h, sizeof h, 0, -1, why, sizeof why))) {
			dist_fail(d, rc, "waiting for rank 0: %s", why);
			break;
		}
		dist_step_t st;
		char bad[160];
		if ((rc = dist_step_decode(h, sizeof h, &st, bad, sizeof bad))) {
			dist_fail(d, rc, "%s", bad);
			break;
		}
		uint64_t seq = st.seq;
		int pos = st.pos, n = st.n;
		if (seq != d->seq + 1) {
			dist_fail(d, SH_EFORMAT, "step %llu out of order (expected %llu)",
				  (unsigned long long)seq, (unsigned long long)(d->seq + 1));
			break;
		}
		d->seq = seq;
		if (st.type == DIST_MSG_STOP) {
			LOG(LOG_INFO, "rank %d: rank 0 ended the session after %llu steps", d->rank,
			    (unsigned long long)seq - 1);
			return 0;
		}
		if (st.type == DIST_MSG_BATCH) {
			if ((rc = ent_room(d, n))) {
				dist_fail(d, rc, "out of memory for %d entries", n);
				break;
			}
			const uint8_t *src = st.inline_batch;
			if (n > DIST_INLINE_BATCH) {
				int64_t t0 = now_ns();
				rc = tp_broadcast(d->g, d->ent, (size_t)n * DIST_BATCH_ENTRY, 0,
						  d->timeout_ms, why, sizeof why);
				/* the entries are part of the step, as its header: counted in
				 * both, so communication never exceeds the steps' time (the
				 * planner's STEPS check, node_steps_parse) */
				double ms = (double)(now_ns() - t0) / 1e6;
				d->st.comm_ms += ms;
				d->st.step_ms += ms;
				if (rc) {
					dist_fail(d, rc, "step %llu: %s", (unsigned long long)seq,
						  why);
					break;
				}
				src = d->ent;
			}
			model_batch_t b = batch_decode_entries(d, src, n);
			if (pass_run(d, &b, NULL, 0, 0, NULL, 0))
				break;
			continue;
		}
		if (d->n_stages > 1) { /* rank 0 sends stages batches (dist_forward) */
			dist_fail(d, SH_EFORMAT, "step %llu: a STEP to a pipeline stage",
				  (unsigned long long)seq);
			break;
		}
		if (st.flags & DIST_STEP_NEW_REQUEST)
			LOG(LOG_DEBUG, "rank %d: new request at position %d", d->rank, pos);
		if ((rc = tok_room(d, n))) {
			dist_fail(d, rc, "out of memory for %d tokens", n);
			break;
		}
		if (n <= DIST_INLINE_TOKENS) {
			memcpy(d->tok, st.inline_tokens, (size_t)n * sizeof *d->tok);
		} else {
			int64_t t0 = now_ns();
			rc = tp_broadcast(d->g, d->tok, (size_t)n * 4, 0, d->timeout_ms, why,
					  sizeof why);
			d->st.comm_ms += (double)(now_ns() - t0) / 1e6;
			if (rc) {
				dist_fail(d, rc, "step %llu: %s", (unsigned long long)seq, why);
				break;
			}
			for (int i = 0; i < n; i++)
				d->tok[i] = (int)sh_get_le32((const uint8_t *)&d->tok[i]);
		}
		if (pass_run(d, NULL, d->tok, n, pos, NULL, 0))
			break;
	}
	return sh_fail(err, errlen, d->rc, "%s", d->err);
}
