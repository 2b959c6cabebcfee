/*
 * deltanet.c: qwen35's Gated DeltaNet layers (linear attention with a recurrent state per
 * sequence instead of a KV cache), called from the one forward() in model.c for every
 * recurrent layer, and the per-slot state those layers keep.
 *
 * Per token of a sequence, as llama.cpp computes it (src/models/qwen35.cpp
 * build_layer_attn_linear, src/models/delta-net-base.cpp, ggml-cpu/ops.cpp
 * ggml_compute_forward_ssm_conv and ggml_compute_forward_gated_delta_net):
 *   [q|k|v] = W_qkv x;  z = W_gate x;  beta = sigmoid(W_beta x);
 *   g = softplus(W_alpha x + dt_bias) * A             (A = -exp(A_log): the converter stores it)
 *   c = silu(depthwise conv over the last d_conv inputs [q|k|v])   (no bias)
 *   q, k = l2-normalised per key head (eps = the RMS eps); v per value head
 *   per value head h, reading key head h % n_k (the converter's tiled order):
 *     S <- exp(g) S;  d = beta (v - S k);  S <- S + d k^T;  o_h = S q / sqrt(d_state)
 *   y_h = rmsnorm(o_h) * w_norm * silu(z_h);  out = W_out y
 * S is d_state x d_state per value head, row j (a value index) holding the key index i
 * contiguously, as ggml keeps it. The recurrence runs token by token for a prompt too (what
 * ggml's fused CPU op does; the chunked form llama.cpp may use instead is the same function up
 * to float rounding).
 *
 * Tensor parallel: a rank holds the key heads [lk0, lk1) (its share of the query heads scaled
 * to n_k, boundaries on W_out's quant blocks) and the value heads that read them: h % n_k in
 * [lk0, lk1), one run of heads per group of n_k. Its conv channels, states, norms and gates
 * are its heads' only; W_out's partial sums go through model.c's all-reduce like attn_output's.
 * Local value head li is global (li / nlk) * n_k + lk0 + li % nlk. Holding every head, the
 * runs merge into one view of each matrix.
 *
 * State: per slot and recurrent layer, n_ring + MODEL_CHECKPOINTS buffers of [conv state
 * (d_conv - 1) x channels | S of the local value heads]. A tag says after how many tokens of
 * the slot a buffer is: the state after tag q is in ring buffer q % n_ring (the last n_ring
 * positions computed: rollback), checkpoint buffers keep states a batch marked (keep). A pass
 * continues a slot at position p from the buffer tagged p (a checkpoint is copied into the
 * ring first) or from zeros at p == 0; every state after p is then forgotten.
 *
 * Invariant: the tags are the same on every rank of a group (they follow the batches, not the
 * layers held; a rank without recurrent layers keeps them too), so rank 0 answers for all; a
 * buffer's tag is cleared while a pass writes it and set only when the pass succeeded.
 */
#include "common/common.h"
#include "infer/model/model_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Row runs of a matrix held by a rank: views in local order, each at a local offset. */
typedef struct dn_mat {
	int n;
	wmat_t w[2 + DN_MAX_GROUPS]; /* row views, or column slices (ssm_out) */
	int off[2 + DN_MAX_GROUPS];  /* first local row (or column) of each */
	uint8_t *own[DN_MAX_GROUPS]; /* column slices copied out (ssm_out) */
} dn_mat_t;

struct dn_layer {
	int rec;                 /* index among the shard's recurrent layers (state) */
	dn_mat_t qkv;            /* attn_qkv rows: local [q | k | v] channels */
	dn_mat_t z;              /* attn_gate rows: local value dims */
	dn_mat_t beta, alpha;    /* ssm_beta / ssm_alpha rows: local value heads */
	dn_mat_t out;            /* ssm_out column slices: local value dims */
	float *conv_w;           /* [d_conv][ch]: tap-major, so a token's channels are contiguous */
	float *dt, *a;           /* [nlv] */
	float *norm;             /* [d_state] */
	const gguf_tensor_t *cv; /* ssm_conv1d (read whole: model_weight_ranges) */
};

struct dn_state {
	int lk0, nlk, nlv, groups; /* local key heads [lk0, lk0 + nlk), value heads, n_v / n_k */
	int ds, ch, vd;            /* d_state, local channels 2 nlk ds + vd, vd = nlv ds */
	int n_rec, n_ring, n_buf;
	size_t conv_n, per_buf; /* floats of a buffer's conv part, of the whole buffer */
	float *st;              /* [n_rec][n_slots][n_buf][per_buf] */
	int *tag;               /* [n_slots][n_buf]: tokens the buffer is after; -1 = none */
	uint64_t *ck_used;      /* [n_slots][MODEL_CHECKPOINTS]: clock of the last keep */
	uint64_t clock;
	/* the pass in progress (deltanet_plan): runs of one slot's tokens in batch order */
	int n_runs;
	int *rslot, *rstart; /* [max_b], [max_b + 1]: run r is order[rstart[r] .. rstart[r+1]) */
	int *order;          /* [max_b] token indices grouped by run */
	int *src, *dst, *ck; /* [max_b] buffers per token (ck -1: no checkpoint) */
	/* scratch */
	float *xin, *xc;   /* [max_b][ch]: projected and convolved channels */
	float *z, *o;      /* [max_b][vd]: output gate, delta-rule output (then gated) */
	float *beta, *g;   /* [max_b][nlv] */
	float *tin, *tout; /* [max_b][max(ch, vd, dim)]: a run's input or output */
	void (*head)(float *, const float *, int, float, float, const float *, const float *,
		     const float *, float, float *); /* delta_head_pick's kernel (delta_head_fn) */
};

typedef void (*delta_head_fn)(float *So, const float *S, int ds, float eg, float bt, const float *k,
			      const float *q, const float *v, float scale, float *o);
static delta_head_fn delta_head_pick(void);

/* ---- binding ------------------------------------------------------------------------------ */

/* The rank's key-head range: its query-head share scaled to n_k, each boundary rounded down to
 * a multiple of `unit` heads (so that W_out's column slices stay on quant blocks), the last at
 * n_k: consecutive ranks' ranges tile [0, n_k) (some may be empty). */
void model_dn_heads(const model_meta_t *mt, const model_shard_t *sh, int unit, int *k0, int *k1)
{
	int nk = mt->dn.n_k_heads, h = mt->n_heads;
	int a = (int)((int64_t)sh->q_head0 * nk / h);
	int b = (int)((int64_t)(sh->q_head0 + sh->n_q_heads) * nk / h);
	a -= a % unit;
	if (b < nk)
		b -= b % unit;
	*k0 = a, *k1 = b;
}

int model_dn_head_unit(const model_meta_t *mt, const gguf_t *g)
{
	const meta_dn_t *x = &mt->dn;
	/* W_out's columns of one head: the key-head boundaries keep slices on its quant blocks */
	const gguf_tensor_t *t = NULL;
	for (int l = 0; l < mt->n_layers && !t; l++)
		if (x->recurrent[l]) {
			char n[64];
			snprintf(n, sizeof n, "blk.%d.ssm_out.weight", l);
			t = gguf_find_tensor(g, n);
		}
	int be = t ? quant_block_elems(t->type) : 1, unit = 1;
	while ((unit * x->d_state) % be && unit < x->n_k_heads)
		unit++;
	if ((unit * x->d_state) % be)
		unit = x->n_k_heads;
	return unit;
}

/* Adds rows [r0, r0 + n) of w as the next run at local offset off, merged with the previous run
 * when they touch. */
static void run_add(dn_mat_t *d, const wmat_t *w, int r0, int n, int off)
{
	if (n <= 0)
		return;
	if (d->n && d->off[d->n - 1] + d->w[d->n - 1].rows == off &&
	    d->w[d->n - 1].data + (size_t)d->w[d->n - 1].rows * w->row_bytes ==
		w->data + (size_t)r0 * w->row_bytes) {
		d->w[d->n - 1].rows += n;
		return;
	}
	d->w[d->n] = mat_rows(*w, r0, n);
	d->off[d->n++] = off;
}

/* Binds matrix name's rows of the local value heads (per rows each, after `base` leading rows,
 * none when base < 0) into d. */
static int bind_vrows(model_t *m, const gguf_t *g, const char *name, int per, dn_mat_t *d,
		      char *err, size_t errlen)
{
	const dn_state_t *s = m->dn;
	wmat_t w;
	int rc = bind_mat(m, g, name, &w, err, errlen);
	if (rc)
		return rc;
	for (int j = 0; j < s->groups; j++)
		run_add(d, &w, (j * m->meta.dn.n_k_heads + s->lk0) * per, s->nlk * per,
			j * s->nlk * per);
	return 0;
}

/* A vector of the value heads (dt bias, A), in local order. */
static int bind_vheads(model_t *m, const gguf_t *g, const char *name, float **out, char *err,
		       size_t errlen)
{
	const dn_state_t *s = m->dn;
	float *all;
	int rc = bind_vec(g, name, 0, m->meta.dn.n_v_heads, &all, err, errlen);
	if (rc)
		return rc;
	for (int j = 0; j < s->groups; j++) /* in place: local heads never move right */
		memmove(all + j * s->nlk, all + j * m->meta.dn.n_k_heads + s->lk0,
			(size_t)s->nlk * sizeof *all);
	*out = all;
	return 0;
}

int deltanet_bind(model_t *m, const gguf_t *g, int l, char *err, size_t errlen)
{
	layer_t *L = &m->layers[l];
	const meta_dn_t *x = &m->meta.dn;
	dn_state_t *s = m->dn;
	int ds = x->d_state, nk = x->n_k_heads, kd = nk * ds, K = x->d_conv, rc;
	char n[96];
	struct dn_layer *d = calloc(1, sizeof *d);
	if (!d)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	L->dn = d;
	d->rec = s->n_rec++;
#define NAME(t) (snprintf(n, sizeof n, "blk.%d.%s", l, t), n)
	/* [q | k | v] rows: this rank's key heads of q and of k, then its value heads */
	wmat_t w;
	if ((rc = bind_mat(m, g, NAME("attn_qkv.weight"), &w, err, errlen)))
		return rc;
	run_add(&d->qkv, &w, s->lk0 * ds, s->nlk * ds, 0);
	run_add(&d->qkv, &w, kd + s->lk0 * ds, s->nlk * ds, s->nlk * ds);
	for (int j = 0; j < s->groups; j++)
		run_add(&d->qkv, &w, 2 * kd + (j * nk + s->lk0) * ds, s->nlk * ds,
			2 * s->nlk * ds + j * s->nlk * ds);
	if ((rc = bind_vrows(m, g, NAME("attn_gate.weight"), ds, &d->z, err, errlen)) ||
	    (rc = bind_vrows(m, g, NAME("ssm_beta.weight"), 1, &d->beta, err, errlen)) ||
	    (rc = bind_vrows(m, g, NAME("ssm_alpha.weight"), 1, &d->alpha, err, errlen)) ||
	    (rc = bind_vheads(m, g, NAME("ssm_dt.bias"), &d->dt, err, errlen)) ||
	    (rc = bind_vheads(m, g, NAME("ssm_a"), &d->a, err, errlen)) ||
	    (rc = bind_vec(g, NAME("ssm_norm.weight"), 0, ds, &d->norm, err, errlen)))
		return rc;
	/* ssm_out by input columns: one slice per run of value heads */
	if ((rc = bind_mat(m, g, NAME("ssm_out.weight"), &w, err, errlen)))
		return rc;
	int full = s->nlk == nk, runs = full ? 1 : s->groups;
	for (int j = 0; j < runs && s->nlk; j++) {
		d->out.w[j] = w;
		d->out.off[j] = j * s->nlk * ds;
		if ((rc = mat_cols(g, &d->out.w[j], full ? 0 : (j * nk + s->lk0) * ds,
				   full ? x->n_v_heads * ds : s->nlk * ds, &d->out.own[j],
				   "ssm_out", err, errlen)))
			return rc;
		d->out.n++;
	}
	/* the depthwise kernel [conv_dim][d_conv], the local channels' rows as F32 */
	const gguf_tensor_t *t = gguf_find_tensor(g, NAME("ssm_conv1d.weight"));
	if (!t || t->ne[0] != K || quant_block_elems(t->type) != 1)
		return sh_fail(err, errlen, SH_EFORMAT, "tensor %s: expected [%d, %d] of floats", n,
			       K, 2 * kd + x->n_v_heads * ds);
	d->cv = t;
	if (!(d->conv_w = malloc((size_t)s->ch * K * sizeof(float))))
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	int c = 0; /* the channels follow attn_qkv's local rows: q, k, then each value run */
	for (int part = 0; part < 2 + s->groups; part++) {
		int r0 =
		    part < 2 ? part * kd + s->lk0 * ds : 2 * kd + ((part - 2) * nk + s->lk0) * ds;
		size_t rb = quant_row_bytes(t->type, K);
		for (int r = 0; r < s->nlk * ds; r++, c++) {
			float row[64]; /* d_conv <= 64 (meta.c) */
			quant_dequant_row(t->type, (const uint8_t *)t->data + (size_t)(r0 + r) * rb,
					  row, K);
			for (int k = 0; k < K; k++)
				d->conv_w[(size_t)k * s->ch + c] = row[k];
		}
	}
#undef NAME
	return 0;
}

int deltanet_repack(model_t *m, layer_t *L)
{
	struct dn_layer *d = L->dn;
	dn_mat_t *all[] = {&d->qkv, &d->z, &d->beta, &d->alpha};
	for (size_t i = 0; i < ARRAY_LEN(all); i++)
		for (int j = 0; j < all[i]->n; j++)
			if (wmat_repack(m, &all[i]->w[j], 1))
				return SH_ENOMEM;
	for (int j = 0; j < d->out.n; j++)
		if (wmat_repack_own(m, &d->out.w[j], &d->out.own[j]))
			return SH_ENOMEM;
	return 0;
}

void deltanet_layer_free(layer_t *L)
{
	struct dn_layer *d = L->dn;
	if (!d)
		return;
	dn_mat_t *all[] = {&d->qkv, &d->z, &d->beta, &d->alpha, &d->out};
	for (size_t i = 0; i < ARRAY_LEN(all); i++)
		for (int j = 0; j < all[i]->n; j++)
			wmat_release(&all[i]->w[j]);
	for (int j = 0; j < d->out.n; j++)
		free(d->out.own[j]);
	free(d->conv_w);
	free(d->dt);
	free(d->a);
	free(d->norm);
	free(d);
	L->dn = NULL;
}

uint64_t deltanet_layer_bytes(const model_t *m, const layer_t *L)
{
	const struct dn_layer *d = L->dn;
	if (!d)
		return 0;
	uint64_t b = 0;
	const dn_mat_t *all[] = {&d->qkv, &d->z, &d->beta, &d->alpha, &d->out};
	for (size_t i = 0; i < ARRAY_LEN(all); i++)
		for (int j = 0; j < all[i]->n; j++)
			b += quant_row_bytes(all[i]->w[j].type, all[i]->w[j].cols) *
			     (uint64_t)all[i]->w[j].rows;
	/* one sequence's state is read and written once per token */
	return b + 2 * m->dn->per_buf * sizeof(float);
}

int deltanet_weight_ranges(const layer_t *L, const uint8_t *base, model_range_t **r, int *n)
{
	const struct dn_layer *d = L->dn;
	int rc = 0;
	const dn_mat_t *all[] = {&d->qkv, &d->z, &d->beta, &d->alpha, &d->out};
	for (size_t i = 0; i < ARRAY_LEN(all) && !rc; i++)
		for (int j = 0; j < all[i]->n && !rc; j++)
			rc = mat_ranges(&all[i]->w[j], base, r, n);
	if (!rc) /* the kernel is small and 2-D: read whole */
		rc = range_push(r, n, (uint64_t)((const uint8_t *)d->cv->data - base),
				d->cv->nbytes, 0);
	return rc;
}

/* ---- state -------------------------------------------------------------------------------- */

int deltanet_init(model_t *m, char *err, size_t errlen)
{
	const model_meta_t *mt = &m->meta;
	const meta_dn_t *x = &mt->dn;
	dn_state_t *s = calloc(1, sizeof *s);
	if (!s)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	m->dn = s;
	int k1;
	model_dn_heads(mt, &m->sh, model_dn_head_unit(mt, m->g), &s->lk0, &k1);
	s->nlk = k1 - s->lk0;
	s->groups = x->n_v_heads / x->n_k_heads;
	if (s->groups > DN_MAX_GROUPS)
		return sh_fail(err, errlen, SH_EUNSUPP, "%d value heads per key head (at most %d)",
			       s->groups, DN_MAX_GROUPS);
	s->nlv = s->nlk * s->groups;
	s->ds = x->d_state;
	s->vd = s->nlv * s->ds;
	s->ch = 2 * s->nlk * s->ds + s->vd;
	s->n_ring = 1;
	s->head = delta_head_pick();
	return 0;
}

/* (Re)allocates the state buffers and the pass's scratch for the bound layers. */
int deltanet_alloc(model_t *m, int n_ring, char *err, size_t errlen)
{
	dn_state_t *s = m->dn;
	const meta_dn_t *x = &m->meta.dn;
	size_t b = (size_t)m->max_b;
	int wide = MAX(MAX(s->ch, s->vd), m->meta.dim);
	free(s->st);
	free(s->tag);
	free(s->ck_used);
	s->n_ring = n_ring;
	s->n_buf = n_ring + MODEL_CHECKPOINTS;
	s->conv_n = (size_t)(x->d_conv - 1) * (size_t)s->ch;
	s->per_buf = s->conv_n + (size_t)s->nlv * s->ds * s->ds;
	size_t all = (size_t)s->n_rec * m->n_slots * s->n_buf * s->per_buf;
	s->st = calloc(MAX(all, 1), sizeof(float));
	s->tag = malloc((size_t)m->n_slots * s->n_buf * sizeof *s->tag);
	s->ck_used = calloc((size_t)m->n_slots * MODEL_CHECKPOINTS, sizeof *s->ck_used);
	if (!s->st || !s->tag || !s->ck_used)
		return sh_fail(err, errlen, SH_ENOMEM,
			       "out of memory for the recurrent state (%d slots x %d buffers)",
			       m->n_slots, s->n_buf);
	for (size_t i = 0; i < (size_t)m->n_slots * s->n_buf; i++)
		s->tag[i] = -1;
	if (s->xin) /* the scratch does not depend on the ring */
		return 0;
	s->rslot = malloc(b * sizeof(int));
	s->rstart = malloc((b + 1) * sizeof(int));
	s->order = malloc(b * sizeof(int));
	s->src = malloc(b * sizeof(int));
	s->dst = malloc(b * sizeof(int));
	s->ck = malloc(b * sizeof(int));
	s->xin = malloc(b * (size_t)MAX(s->ch, 1) * sizeof(float));
	s->xc = malloc(b * (size_t)MAX(s->ch, 1) * sizeof(float));
	s->z = malloc(b * (size_t)MAX(s->vd, 1) * sizeof(float));
	s->o = malloc(b * (size_t)MAX(s->vd, 1) * sizeof(float));
	s->beta = malloc(b * (size_t)MAX(s->nlv, 1) * sizeof(float));
	s->g = malloc(b * (size_t)MAX(s->nlv, 1) * sizeof(float));
	s->tin = malloc(b * (size_t)wide * sizeof(float));
	s->tout = malloc(b * (size_t)wide * sizeof(float));
	if (!s->rslot || !s->rstart || !s->order || !s->src || !s->dst || !s->ck || !s->xin ||
	    !s->xc || !s->z || !s->o || !s->beta || !s->g || !s->tin || !s->tout)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	return 0;
}

void deltanet_free(model_t *m)
{
	dn_state_t *s = m->dn;
	if (!s)
		return;
	free(s->st);
	free(s->tag);
	free(s->ck_used);
	free(s->rslot);
	free(s->rstart);
	free(s->order);
	free(s->src);
	free(s->dst);
	free(s->ck);
	free(s->xin);
	free(s->xc);
	free(s->z);
	free(s->o);
	free(s->beta);
	free(s->g);
	free(s->tin);
	free(s->tout);
	free(s);
	m->dn = NULL;
}

uint64_t deltanet_slot_bytes(const model_t *m)
{
	const dn_state_t *s = m->dn;
	return s ? (uint64_t)s->n_rec * s->n_buf * s->per_buf * sizeof(float) : 0;
}

/* Buffer b of slot sl in recurrent layer rec. */
static float *dn_buf(const dn_state_t *s, int n_slots, int rec, int sl, int b)
{
	return s->st + (((size_t)rec * n_slots + sl) * s->n_buf + b) * s->per_buf;
}

static void dn_copy(model_t *m, int sl, int from, int to)
{
	dn_state_t *s = m->dn;
	for (int r = 0; r < s->n_rec; r++)
		memcpy(dn_buf(s, m->n_slots, r, sl, to), dn_buf(s, m->n_slots, r, sl, from),
		       s->per_buf * sizeof(float));
}

int deltanet_resume_pos(const model_t *m, int sl, int limit)
{
	const dn_state_t *s = m->dn;
	int best = 0;
	for (int b = 0; b < s->n_buf; b++) {
		int t = s->tag[(size_t)sl * s->n_buf + b];
		if (t <= limit && t > best)
			best = t;
	}
	return best;
}

int deltanet_plan(model_t *m, const int *slot, const int *pos, const int *keep, int B)
{
	dn_state_t *s = m->dn;
	int R = s->n_ring, nb = s->n_buf, used = 0;
	unsigned char taken[MODEL_MAX_BATCH] = {0};
	s->n_runs = 0;
	for (int b = 0; b < B; b++) { /* runs: each slot's tokens, in batch order */
		if (taken[b])
			continue;
		s->rslot[s->n_runs] = slot[b];
		s->rstart[s->n_runs++] = used;
		for (int c = b; c < B; c++)
			if (!taken[c] && slot[c] == slot[b]) {
				if (c != b && pos[c] != pos[s->order[used - 1]] + 1)
					return SH_EINVAL; /* a slot's positions run on */
				taken[c] = 1;
				s->order[used++] = c;
			}
	}
	s->rstart[s->n_runs] = used;
	for (int r = 0; r < s->n_runs; r++) {
		int sl = s->rslot[r], first = s->order[s->rstart[r]], p = pos[first];
		int *tg = s->tag + (size_t)sl * nb, start = p % R;
		if (tg[start] != p) {
			int from = -1;
			for (int c = R; c < nb; c++)
				if (tg[c] == p)
					from = c;
			if (from >= 0) {
				dn_copy(m, sl, from, start);
			} else if (p == 0) {
				for (int l = 0; l < s->n_rec; l++)
					memset(dn_buf(s, m->n_slots, l, sl, start), 0,
					       s->per_buf * sizeof(float));
			} else {
				return SH_EINVAL; /* no state after p tokens of this slot */
			}
			tg[start] = p;
		}
		for (int c = 0; c < nb; c++) /* another continuation's states */
			if (tg[c] > p)
				tg[c] = -1;
		int prev = start;
		for (int i = s->rstart[r]; i < s->rstart[r + 1]; i++) {
			int b = s->order[i];
			s->src[b] = prev;
			s->dst[b] = prev = (pos[b] + 1) % R;
			tg[s->dst[b]] = -1; /* being written */
			s->ck[b] = -1;
			if (keep && keep[b]) { /* a free checkpoint buffer, else the oldest kept */
				int best = -1;
				for (int c = 0; c < MODEL_CHECKPOINTS; c++) {
					int cb = R + c;
					int busy = 0;
					for (int i2 = s->rstart[r]; i2 < i; i2++)
						busy |= s->ck[s->order[i2]] == cb;
					if (busy)
						continue;
					if (best < 0 || (tg[cb] < 0 && tg[best] >= 0) ||
					    ((tg[cb] < 0) == (tg[best] < 0) &&
					     s->ck_used[(size_t)sl * MODEL_CHECKPOINTS + c] <
						 s->ck_used[(size_t)sl * MODEL_CHECKPOINTS + best -
							    R]))
						best = cb;
				}
				s->ck[b] = best;
				if (best >= 0)
					tg[best] = -1;
			}
		}
	}
	return 0;
}

void deltanet_commit(model_t *m, const int *pos)
{
	dn_state_t *s = m->dn;
	for (int r = 0; r < s->n_runs; r++) {
		int sl = s->rslot[r], *tg = s->tag + (size_t)sl * s->n_buf;
		for (int i = s->rstart[r]; i < s->rstart[r + 1]; i++) {
			int b = s->order[i];
			tg[s->dst[b]] = pos[b] + 1;
			if (s->ck[b] >= 0) {
				tg[s->ck[b]] = pos[b] + 1;
				s->ck_used[(size_t)sl * MODEL_CHECKPOINTS + s->ck[b] - s->n_ring] =
				    ++s->clock;
			}
		}
	}
}

/* ---- the layer ---------------------------------------------------------------------------- */

/* out[B][ld] (at each run's offset) = the runs of d applied to x[B][cols]. */
static void proj_rows(model_t *m, const dn_mat_t *d, float *out, int ld, const float *x, int B,
		      float *tmp)
{
	if (d->n == 1 && d->w[0].rows == ld) {
		matmul(m, &d->w[0], out, x, B);
		return;
	}
	for (int i = 0; i < d->n; i++) {
		int rows = d->w[i].rows;
		matmul(m, &d->w[i], tmp, x, B);
		for (int b = 0; b < B; b++)
			memcpy(out + (size_t)b * ld + d->off[i], tmp + (size_t)b * rows,
			       (size_t)rows * sizeof *out);
	}
}

/* One token: the four projections' row views in one pool dispatch, each written in place (a
 * row of one token is contiguous), their input prepared once per weight type (the views of one
 * projection share a type: at most 4 of m->act's rows, hence max_b >= 4). Per output the
 * same kernel and sum as proj_rows, so the same bits; four dispatches of a 0.5B file's small
 * matrices had left the threads waiting at each one's end. */
static void proj_one(model_t *m, const struct dn_layer *d, dn_state_t *s)
{
	const dn_mat_t *all[] = {&d->qkv, &d->z, &d->beta, &d->alpha};
	float *dst[] = {s->xin, s->z, s->beta, s->g};
	const wmat_t *w[4 * (2 + DN_MAX_GROUPS)];
	float *o[4 * (2 + DN_MAX_GROUPS)];
	const float *x[4 * (2 + DN_MAX_GROUPS)];
	int n = 0;
	for (int i = 0; i < 4; i++)
		for (int k = 0; k < all[i]->n; k++, n++) {
			w[n] = &all[i]->w[k];
			o[n] = dst[i] + all[i]->off[k];
			x[n] = m->xb;
		}
	matmul_each(m, n, w, o, x, m->act);
}

static float silu(float x)
{
	return x / (1.0f + expf(-x));
}

typedef struct dn_job {
	model_t *m;
	const struct dn_layer *d;
	dn_state_t *s;
} dn_job_t;

/* conv_task for one token, channels [lo, hi): each tap is a contiguous row of the state and of
 * the weights, so the loops run over channels (vectorized; each channel's sum still adds the
 * taps oldest first, then the input: the bits of the general loop). On one core per channel it
 * had been ~3 % of a small qwen35moe's decode, the state's rows read 4 bytes at a time. */
static void conv_one(const dn_job_t *j, int lo, int hi)
{
	dn_state_t *s = j->s;
	const model_t *m = j->m;
	int K = m->meta.dn.d_conv, ch = s->ch, rec = j->d->rec, sl = s->rslot[0], b = s->order[0];
	const float *cs = dn_buf(s, m->n_slots, rec, sl, s->src[b]), *x = s->xin + (size_t)b * ch;
	const float *w = j->d->conv_w;
	float *xc = s->xc + (size_t)b * ch, *d = dn_buf(s, m->n_slots, rec, sl, s->dst[b]);
	size_t n = (size_t)(hi - lo) * sizeof(float);
	for (int c = lo; c < hi; c++) {
		float acc = 0;
		for (int k = 0; k < K - 1; k++) /* ggml's order: oldest tap first */
			acc += cs[(size_t)k * ch + c] * w[(size_t)k * ch + c];
		xc[c] = acc + x[c] * w[(size_t)(K - 1) * ch + c];
	}
	for (int c = lo; c < hi; c++)
		xc[c] = silu(xc[c]);
	/* the window moves on: tap k takes tap k + 1 (ascending, so in place too when the ring has
	 * one buffer), the newest is the input */
	for (int k = 0; k + 1 < K - 1; k++)
		memmove(d + (size_t)k * ch + lo, cs + (size_t)(k + 1) * ch + lo, n);
	if (K > 1)
		memcpy(d + (size_t)(K - 2) * ch + lo, x + lo, n);
	if (s->ck[b] >= 0) { /* a checkpoint of the same state */
		float *ck = dn_buf(s, m->n_slots, rec, sl, s->ck[b]);
		for (int k = 0; k < K - 1; k++)
			memcpy(ck + (size_t)k * ch + lo, d + (size_t)k * ch + lo, n);
	}
}

/* Conv of (run, channel) items: each channel's window slides over its run's tokens. */
static void conv_task(void *ctx, int c, int nc, int tid)
{
	dn_job_t *j = ctx;
	dn_state_t *s = j->s;
	const model_t *m = j->m;
	int K = m->meta.dn.d_conv, ch = s->ch, lo, hi, rec = j->d->rec;
	float hist[64];
	(void)tid;
	pool_split(s->n_runs * ch, c, nc, 1, &lo, &hi);
	if (s->n_runs == 1 && s->rstart[1] == 1) { /* one token (decode) */
		conv_one(j, lo, hi);
		return;
	}
	for (int it = lo; it < hi; it++) {
		int r = it / ch, cc = it % ch, sl = s->rslot[r];
		float w[64];
		for (int k = 0; k < K; k++)
			w[k] = j->d->conv_w[(size_t)k * ch + cc];
		const float *cs = dn_buf(s, m->n_slots, rec, sl, s->src[s->order[s->rstart[r]]]);
		for (int k = 0; k < K - 1; k++)
			hist[k] = cs[(size_t)k * ch + cc];
		/* only the run's last n_ring states stay in the ring (earlier ones are overwritten
		 * within the run): the others need no conv state written */
		int kept = MAX(s->rstart[r], s->rstart[r + 1] - s->n_ring);
		for (int i = s->rstart[r]; i < s->rstart[r + 1]; i++) {
			int b = s->order[i];
			float x = s->xin[(size_t)b * ch + cc], acc = 0;
			for (int k = 0; k < K - 1; k++) /* ggml's order: oldest tap first */
				acc += hist[k] * w[k];
			acc += x * w[K - 1];
			s->xc[(size_t)b * ch + cc] = silu(acc);
			if (K > 1) {
				memmove(hist, hist + 1, (size_t)(K - 2) * sizeof *hist);
				hist[K - 2] = x;
			}
			float *d = dn_buf(s, m->n_slots, rec, sl, s->dst[b]);
			for (int k = 0; i >= kept && k < K - 1; k++)
				d[(size_t)k * ch + cc] = hist[k];
			if (s->ck[b] >= 0) {
				d = dn_buf(s, m->n_slots, rec, sl, s->ck[b]);
				for (int k = 0; k < K - 1; k++)
					d[(size_t)k * ch + cc] = hist[k];
			}
		}
	}
}

/* One value head's step: So = exp(g) S + d k^T row by row (d = beta (v - exp(g) S k)), o = So q
 * scale. So may be S (in place: each row is read before it is written). Eight lanes of
 * vector_size floats (SSE pairs on plain x86-64, one AVX register in the AVX2 build below, NEON
 * on arm64), a scalar tail when d_state is not a multiple of 8. */
typedef float v8f __attribute__((vector_size(32)));

/* macros, not functions: a 32-byte vector passed by value would change the ABI between the
 * builds */
#define V8_LOAD(a, p) memcpy(&(a), (p), sizeof(a))
#define V8_SUM(a)     (((a)[0] + (a)[4]) + ((a)[1] + (a)[5])) + (((a)[2] + (a)[6]) + ((a)[3] + (a)[7]))

#define DELTA_HEAD_BODY                                                                            \
	for (int j = 0; j < ds; j++) {                                                             \
		const float *ri = S + (size_t)j * ds;                                              \
		float *ro = So + (size_t)j * ds;                                                   \
		v8f acc = {0}, e = (v8f){0} + eg, a, b;                                            \
		int i = 0;                                                                         \
		for (; i + 8 <= ds; i += 8) {                                                      \
			V8_LOAD(a, ri + i);                                                        \
			V8_LOAD(b, k + i);                                                         \
			a *= e;                                                                    \
			memcpy(ro + i, &a, sizeof a);                                              \
			acc += a * b;                                                              \
		}                                                                                  \
		float sk = V8_SUM(acc);                                                            \
		for (; i < ds; i++) {                                                              \
			ro[i] = ri[i] * eg;                                                        \
			sk += ro[i] * k[i];                                                        \
		}                                                                                  \
		float d = (v[j] - sk) * bt, oj;                                                    \
		v8f dd = (v8f){0} + d;                                                             \
		acc = (v8f){0};                                                                    \
		for (i = 0; i + 8 <= ds; i += 8) {                                                 \
			V8_LOAD(a, ro + i);                                                        \
			V8_LOAD(b, k + i);                                                         \
			a += dd * b;                                                               \
			memcpy(ro + i, &a, sizeof a);                                              \
			V8_LOAD(b, q + i);                                                         \
			acc += a * b;                                                              \
		}                                                                                  \
		oj = V8_SUM(acc);                                                                  \
		for (; i < ds; i++) {                                                              \
			ro[i] += d * k[i];                                                         \
			oj += ro[i] * q[i];                                                        \
		}                                                                                  \
		o[j] = oj * scale;                                                                 \
	}

static void delta_head(float *So, const float *S, int ds, float eg, float bt, const float *k,
		       const float *q, const float *v, float scale, float *o)
{
	DELTA_HEAD_BODY
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,fma"))) static void delta_head_avx2(float *So, const float *S, int ds,
								float eg, float bt, const float *k,
								const float *q, const float *v,
								float scale, float *o)
{
	DELTA_HEAD_BODY
}
#endif

/* The AVX2 build where the CPU has it (and the reference kernels are not forced). */
static delta_head_fn delta_head_pick(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	__builtin_cpu_init();
	if (!quant_ref_forced() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return delta_head_avx2;
#endif
	return delta_head;
}

/* The delta rule and the gated norm of (run, local value head) items. */
static void delta_task(void *ctx, int c, int nc, int tid)
{
	dn_job_t *j = ctx;
	dn_state_t *s = j->s;
	const model_t *m = j->m;
	int ds = s->ds, ch = s->ch, nlv = s->nlv, nlk = s->nlk, lo, hi, rec = j->d->rec;
	float scale = 1.0f / sqrtf((float)ds), eps = m->meta.rms_eps;
	(void)tid;
	pool_split(s->n_runs * nlv, c, nc, 1, &lo, &hi);
	for (int it = lo; it < hi; it++) {
		int r = it / nlv, h = it % nlv, kl = h % nlk, sl = s->rslot[r];
		size_t hoff = s->conv_n + (size_t)h * ds * ds;
		for (int i = s->rstart[r]; i < s->rstart[r + 1]; i++) {
			int b = s->order[i];
			const float *x = s->xc + (size_t)b * ch;
			const float *q = x + (size_t)kl * ds, *k = x + (size_t)(nlk + kl) * ds;
			const float *v = x + (size_t)2 * nlk * ds + (size_t)h * ds;
			const float *S = dn_buf(s, m->n_slots, rec, sl, s->src[b]) + hoff;
			float *So = dn_buf(s, m->n_slots, rec, sl, s->dst[b]) + hoff;
			float eg = expf(s->g[(size_t)b * nlv + h]),
			      bt = s->beta[(size_t)b * nlv + h];
			float *o = s->o + (size_t)b * s->vd + (size_t)h * ds;
			s->head(So, S, ds, eg, bt, k, q, v, scale, o);
			if (s->ck[b] >= 0)
				memcpy(dn_buf(s, m->n_slots, rec, sl, s->ck[b]) + hoff, So,
				       (size_t)ds * ds * sizeof(float));
			/* y = rmsnorm(o) * w * silu(z) */
			const float *z = s->z + (size_t)b * s->vd + (size_t)h * ds;
			double ss = 0;
			for (int i2 = 0; i2 < ds; i2++)
				ss += (double)o[i2] * o[i2];
			float sc = 1.0f / sqrtf((float)(ss / ds) + eps);
			for (int i2 = 0; i2 < ds; i2++)
				o[i2] = o[i2] * sc * j->d->norm[i2] * silu(z[i2]);
		}
	}
}

void deltanet_forward(model_t *m, layer_t *L, int B)
{
	const struct dn_layer *d = L->dn;
	dn_state_t *s = m->dn;
	int D = m->meta.dim, nlv = s->nlv, nt = pool_threads(m->pool);
	if (!s->nlk) { /* no heads here: this rank adds nothing to the layer */
		memset(m->xb2, 0, (size_t)B * D * sizeof *m->xb2);
		return;
	}
	/* projections of xb[B][D]: channels, output gate, beta and alpha per value head */
	if (B == 1 && m->max_b >= 4)
		proj_one(m, d, s);
	else {
		proj_rows(m, &d->qkv, s->xin, s->ch, m->xb, B, s->tout);
		proj_rows(m, &d->z, s->z, s->vd, m->xb, B, s->tout);
		proj_rows(m, &d->beta, s->beta, nlv, m->xb, B, s->tout);
		proj_rows(m, &d->alpha, s->g, nlv, m->xb, B, s->tout);
	}
	for (int b = 0; b < B; b++)
		for (int h = 0; h < nlv; h++) {
			float *be = s->beta + (size_t)b * nlv + h, *g = s->g + (size_t)b * nlv + h;
			float a = *g + d->dt[h];
			*be = 1.0f / (1.0f + expf(-*be));
			*g = (a > 20.0f ? a : logf(1.0f + expf(a))) * d->a[h]; /* ggml's softplus */
		}
	dn_job_t j = {m, d, s};
	pool_run(m->pool, conv_task, &j, MIN(s->n_runs * s->ch / 64 + 1, 4 * nt));
	/* q and k: unit length per key head (ggml_l2_norm: x / max(|x|, eps)) */
	for (int b = 0; b < B; b++)
		for (int h = 0; h < 2 * s->nlk; h++) {
			float *x = s->xc + (size_t)b * s->ch + (size_t)h * s->ds;
			double ss = 0;
			for (int i = 0; i < s->ds; i++)
				ss += (double)x[i] * x[i];
			float sc = 1.0f / fmaxf(sqrtf((float)ss), m->meta.rms_eps);
			for (int i = 0; i < s->ds; i++)
				x[i] *= sc;
		}
	pool_run(m->pool, delta_task, &j, MIN(s->n_runs * nlv, 4 * nt));
	/* xb2[B][D] = W_out's held columns . y */
	for (int i = 0; i < d->out.n; i++) {
		const wmat_t *w = &d->out.w[i];
		const float *x = s->o;
		if (d->out.n > 1) { /* this run's columns, contiguous */
			for (int b = 0; b < B; b++)
				memcpy(s->tin + (size_t)b * w->cols,
				       s->o + (size_t)b * s->vd + d->out.off[i],
				       (size_t)w->cols * sizeof(float));
			x = s->tin;
		}
		matmul(m, w, i ? s->tout : m->xb2, x, B);
		for (int k = 0; i && k < B * D; k++)
			m->xb2[k] += s->tout[k];
	}
}
