/*
 * spec.c: the drafts of speculative decoding and the controller of their length (spec.h).
 *
 * Invariants: d->toks[slot][0 .. d->n[slot]) are the tokens whose keys and values (or state)
 * slot `slot` of the draft model holds, so a sequence only feeds the draft what it does not
 * hold yet (after a verify: the tokens accepted, the target's own, at most two); t_cnt[n] counts
 * the measured steps of n tokens, t_ring[n] holds the last T_KEEP of them and t_med[n] their
 * median (a step preempted on a busy machine must not move the estimate).
 */
#include "infer/spec.h"

#include "common/common.h"
#include "infer/gguf.h"
#include "infer/grammar.h"
#include "infer/model/meta.h"
#include "infer/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPEC_TB       640 /* step sizes measured one by one (the largest prefill is 512) */
#define SPEC_FEED_MAX 512 /* tokens per draft model pass while catching up */
#define NGRAM_MAX     4   /* prompt lookup: longest and shortest suffix matched */
#define NGRAM_MIN     2
#define ACC_DECAY     0.85 /* per verify, a sequence's acceptance counts */
#define ACC_DECAY_ALL 0.97 /* per verify, the engine's */
#define ACC_PRIOR     2.0  /* weight of the engine's rate in a sequence's */
#define EMA_NEW       0.2  /* weight of a new measurement in a running mean */
#define ALPHA_MAX     0.99
#define SPEC_REBASE   64  /* auto: drafting steps between two measured without drafts */
#define T_KEEP        7   /* step times kept per batch size (their median counts) */
#define T_AGE         256 /* steps after which a step time no longer counts (the context grew) */

/* Acceptance counts, decayed: accepted drafted tokens and first rejections. */
typedef struct acc {
	double succ, fail;
} acc_t;

/* The draft model and its slots. */
typedef struct draft {
	gguf_t *g;
	model_meta_t meta;
	tok_t *tok;
	model_t *m;
	char name[160];
	int **toks;                          /* [n_slots][n_ctx] */
	int *n;                              /* [n_slots] */
	float *logits, *pass;                /* [n_slots][n_vocab]: one row per sequence */
	int *b_tok, *b_slot, *b_pos, *b_out; /* [SPEC_FEED_MAX + n_slots] */
	float *q;                            /* [n_slots][draft_max][n_vocab] */
	int failed;                          /* a pass failed: drafting stopped (logged once) */
} draft_t;

struct spec {
	int mode;   /* as asked: SPEC_AUTO, SPEC_NGRAM, SPEC_MODEL */
	int method; /* what drafts: SPEC_NGRAM or SPEC_MODEL */
	int gate;   /* auto: a draft only where it pays */
	int draft_max, n_vocab, n_slots, n_ctx;
	const tok_t *tok;
	draft_t *d;  /* NULL for prompt lookup */
	acc_t all;   /* the engine's acceptance */
	acc_t *acc;  /* [n_slots] the sequences' */
	int *shadow; /* [n_slots] prompt lookup's guess for the next token while off, or -1 */
	int *idle;   /* [n_slots] steps without a draft (a draft model's probes) */
	double t_med[SPEC_TB + 1];
	float t_ring[SPEC_TB + 1][T_KEEP];
	uint32_t t_when[SPEC_TB + 1][T_KEEP]; /* the step each was measured at */
	uint32_t steps;                       /* steps measured */
	int t_cnt[SPEC_TB + 1];
	double tok_ms;   /* per produced token outside the forward pass (sampling, text) */
	double round_ms; /* one draft model pass of a step's drafting sequences */
	int tok_seen, round_seen;
	int since_base; /* auto: drafting steps since the last one measured without */
	eng_spec_stats_t st;
};

int spec_mode_parse(const char *s)
{
	if (!s || !strcmp(s, "auto"))
		return SPEC_AUTO;
	if (!strcmp(s, "off"))
		return SPEC_OFF;
	if (!strcmp(s, "ngram"))
		return SPEC_NGRAM;
	if (!strcmp(s, "model"))
		return SPEC_MODEL;
	return -1;
}

/* ---- the draft model ------------------------------------------------------------------------ */

/* 0 when the draft's vocabulary is the target's, else SH_EINVAL naming the first difference. */
static int vocab_check(const tok_t *t, int t_vocab, const tok_t *d, int d_vocab, char *err,
		       size_t errlen)
{
	if (tok_n_vocab(t) != tok_n_vocab(d) || t_vocab != d_vocab)
		return sh_fail(err, errlen, SH_EINVAL,
			       "the draft model's vocabulary has %d tokens (%d logits), the "
			       "model's %d (%d logits)",
			       tok_n_vocab(d), d_vocab, tok_n_vocab(t), t_vocab);
	if (tok_bos(t) != tok_bos(d) || tok_eos(t) != tok_eos(d) || tok_eot(t) != tok_eot(d))
		return sh_fail(err, errlen, SH_EINVAL,
			       "the draft model's special tokens differ (bos %d/%d, eos %d/%d, "
			       "end of turn %d/%d: draft/model)",
			       tok_bos(d), tok_bos(t), tok_eos(d), tok_eos(t), tok_eot(d),
			       tok_eot(t));
	for (int i = 0; i < tok_n_vocab(t); i++) {
		size_t la, lb;
		const char *a = tok_text(t, i, &la), *b = tok_text(d, i, &lb);
		if (la != lb || (la && memcmp(a, b, la)) || tok_type(t, i) != tok_type(d, i) ||
		    tok_is_eog(t, i) != tok_is_eog(d, i))
			return sh_fail(err, errlen, SH_EINVAL,
				       "the draft model's token %d is '%.*s', the model's '%.*s'",
				       i, (int)MIN(lb, 40), b, (int)MIN(la, 40), a);
	}
	return 0;
}

static void draft_free(draft_t *d, int n_slots)
{
	if (!d)
		return;
	model_free(d->m);
	tok_free(d->tok);
	gguf_free(d->g);
	for (int i = 0; d->toks && i < n_slots; i++)
		free(d->toks[i]);
	free(d->toks);
	free(d->n);
	free(d->logits);
	free(d->pass);
	free(d->b_tok);
	free(d->b_slot);
	free(d->b_pos);
	free(d->b_out);
	free(d->q);
	free(d);
}

static int draft_open(spec_t *s, const spec_opts_t *o, char *err, size_t errlen)
{
	char why[256];
	int rc;
	draft_t *d = calloc(1, sizeof *d);
	if (!d)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	s->d = d;
	if ((rc = gguf_open(&d->g, o->draft_path, why, sizeof why)))
		return sh_fail(err, errlen, rc, "draft model: %s", why);
	if ((rc = meta_load(&d->meta, d->g, why, sizeof why)) ||
	    (rc = tok_load(&d->tok, d->g, why, sizeof why)))
		return sh_fail(err, errlen, rc, "draft model %s: %s", o->draft_path, why);
	if ((rc = vocab_check(o->tok, o->n_vocab, d->tok, d->meta.n_vocab, why, sizeof why)))
		return sh_fail(err, errlen, rc, "%s: %s", o->draft_path, why);
	if ((rc = model_new_slots(&d->m, d->g, &d->meta, NULL, o->n_ctx, o->n_slots, o->kv_type,
				  o->pool, why, sizeof why)) ||
	    (rc = model_set_rollback(d->m, o->draft_max, why, sizeof why)))
		return sh_fail(err, errlen, rc, "draft model %s: %s", o->draft_path, why);
	const char *b = strrchr(o->draft_path, '/');
	snprintf(d->name, sizeof d->name, "%s",
		 d->meta.name[0] ? d->meta.name
		 : b             ? b + 1
				 : o->draft_path);
	size_t nb = SPEC_FEED_MAX + (size_t)o->n_slots, row = (size_t)o->n_vocab * sizeof(float);
	d->toks = calloc((size_t)o->n_slots, sizeof *d->toks);
	d->n = calloc((size_t)o->n_slots, sizeof *d->n);
	d->logits = malloc((size_t)o->n_slots * row);
	d->pass = malloc((size_t)o->n_slots * row);
	d->b_tok = malloc(nb * sizeof(int));
	d->b_slot = malloc(nb * sizeof(int));
	d->b_pos = malloc(nb * sizeof(int));
	d->b_out = malloc(nb * sizeof(int));
	d->q = malloc((size_t)o->n_slots * (size_t)o->draft_max * row);
	if (!d->toks || !d->n || !d->logits || !d->pass || !d->b_tok || !d->b_slot || !d->b_pos ||
	    !d->b_out || !d->q)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	for (int i = 0; i < o->n_slots; i++)
		if (!(d->toks[i] = malloc((size_t)o->n_ctx * sizeof(int))))
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	LOG(LOG_INFO, "draft model %s: %d layers, dim %d, %s", d->name, d->meta.n_layers,
	    d->meta.dim, o->draft_path);
	return 0;
}

/* One draft model pass over the batch built in d->b_*[0..n) (nr rows of logits asked for, in
 * batch order), rows copied to d->logits at the sequences' indices rows[0..nr). Returns 0 or
 * the pass's error (then drafting stops for good: the draft's caches are unknown). */
static int draft_pass(spec_t *s, int n, const int *rows, int nr)
{
	draft_t *d = s->d;
	model_batch_t b = {n, d->b_tok, d->b_slot, d->b_pos, d->b_out, NULL, NULL};
	int rc = model_forward_batch(d->m, &b, d->pass);
	if (rc) {
		LOG(LOG_ERROR, "draft model: a pass failed (%s); drafting stops", sh_strerror(rc));
		d->failed = 1;
		return rc;
	}
	size_t row = (size_t)s->n_vocab;
	for (int r = 0; r < nr; r++)
		memcpy(d->logits + (size_t)rows[r] * row, d->pass + (size_t)r * row,
		       row * sizeof(float));
	return 0;
}

/* Brings each listed sequence's draft slot to its context and leaves the logits after it in
 * d->logits row i (list index). The slot keeps its longest common prefix with the context (as
 * far back as the draft model can resume: model_seq_resume_pos) and computes the rest, at least
 * the last token. */
static int draft_catch_up(spec_t *s, spec_seq_t **list, int cnt)
{
	draft_t *d = s->d;
	int n = 0, nr = 0, rows[SPEC_FEED_MAX + 1];
	for (int i = 0; i < cnt; i++) {
		spec_seq_t *q = list[i];
		int *have = d->toks[q->slot], c = 0;
		while (c < d->n[q->slot] && c < q->n - 1 && have[c] == q->ctx[c])
			c++;
		c = model_seq_resume_pos(d->m, q->slot, c);
		for (int p = c; p < q->n; p++) {
			if (n == SPEC_FEED_MAX) { /* a full pass: run it, go on with the rest */
				if (draft_pass(s, n, rows, nr))
					return -1;
				n = nr = 0;
			}
			d->b_tok[n] = q->ctx[p], d->b_slot[n] = q->slot, d->b_pos[n] = p;
			d->b_out[n] = p == q->n - 1;
			if (d->b_out[n])
				rows[nr++] = i;
			have[p] = q->ctx[p];
			n++;
		}
		d->n[q->slot] = q->n;
	}
	return n ? draft_pass(s, n, rows, nr) : 0;
}

/* ---- prompt lookup -------------------------------------------------------------------------- */

/* The tokens that followed the latest earlier occurrence of ctx's last NGRAM_MAX .. NGRAM_MIN
 * tokens (the longest suffix that occurs first), at most max of them, into out. */
static int ngram_find(const int *ctx, int n, int max, int *out)
{
	for (int g = NGRAM_MAX; g >= NGRAM_MIN; g--) {
		if (n < g + 1)
			continue;
		const int *suf = ctx + n - g;
		for (int j = n - g - 1; j >= 0; j--) {
			if (ctx[j] != suf[0] || memcmp(ctx + j, suf, (size_t)g * sizeof(int)))
				continue;
			int k = MIN(n - (j + g), max);
			memcpy(out, ctx + j + g, (size_t)k * sizeof(int));
			return k;
		}
	}
	return 0;
}

/* ---- the controller ------------------------------------------------------------------------- */

static double acc_rate(const acc_t *a, double prior, double w)
{
	double r = (a->succ + w * prior) / (a->succ + a->fail + w);
	return MIN(r, ALPHA_MAX);
}

static void acc_add(acc_t *a, double decay, int accepted, int rejected)
{
	a->succ = a->succ * decay + accepted;
	a->fail = a->fail * decay + rejected;
}

/* The predicted time of a forward pass of n tokens: measured, else interpolated between the
 * nearest measured sizes; above the largest measured, extrapolated along the slope from the
 * smallest measured (flat with only one: a longer draft is then tried and measured); below the
 * smallest measured, that size's time (auto measures its baseline before it drafts). 0 with
 * nothing measured. */
static double t_pred(const spec_t *s, int n)
{
	n = MAX(n, 1);
	if (n <= SPEC_TB && s->t_cnt[n])
		return s->t_med[n];
	int lo = MIN(n, SPEC_TB + 1) - 1, hi = n + 1;
	while (lo >= 1 && !s->t_cnt[lo])
		lo--;
	while (hi <= SPEC_TB && !s->t_cnt[hi])
		hi++;
	if (lo >= 1 && hi <= SPEC_TB)
		return s->t_med[lo] +
		       (s->t_med[hi] - s->t_med[lo]) * (double)(n - lo) / (double)(hi - lo);
	if (lo >= 1) { /* the slope from the smallest size measured: the widest base */
		int lo2 = 1;
		while (lo2 < lo && !s->t_cnt[lo2])
			lo2++;
		lo2 = lo2 < lo ? lo2 : 0;
		double slope = lo2 >= 1 ? (s->t_med[lo] - s->t_med[lo2]) / (double)(lo - lo2) : 0;
		return s->t_med[lo] + MAX(slope, 0) * (double)(n - lo);
	}
	if (hi <= SPEC_TB)
		return s->t_med[hi];
	return 0;
}

/* The draft length for one sequence that maximises the step's predicted tokens per second, the
 * sequences already planned counted: e_acc tokens expected in n_acc tokens of batch with
 * `rounds` draft model passes. kmax: at most; forced: at least 1 when kmax allows. */
static int choose_k(const spec_t *s, double a, int kmax, int forced, double e_acc, int n_acc,
		    int rounds)
{
	double e = 0, ap = 1, best_rate = -1, rate0 = 0;
	int best = 0;
	for (int k = 0; k <= kmax; k++) {
		if (k) {
			ap *= a;
			e += ap;
		}
		double tokens = e_acc + e;
		double draft = s->d ? s->round_ms * MAX(rounds, k) : 0;
		double time = t_pred(s, n_acc + k) + draft + tokens * s->tok_ms;
		double rate = time > 0 ? tokens / time : 0;
		if (!k)
			rate0 = rate;
		if (k >= (forced ? 1 : 0) && rate > best_rate) {
			best_rate = rate;
			best = k;
		}
	}
	if (s->gate && best && !(best_rate > rate0 * (1 + SPEC_MARGIN)))
		best = 0;
	return best;
}

/* ---- the interface ----------------------------------------------------------------------------
 */

int spec_new(spec_t **out, const spec_opts_t *o, char *err, size_t errlen)
{
	*out = NULL;
	if (o->mode == SPEC_MODEL && !o->draft_path)
		return sh_fail(err, errlen, SH_EINVAL, "--spec model needs --draft-model FILE");
	if (o->draft_max < 1 || o->draft_max > SPEC_MAX_DRAFT)
		return sh_fail(err, errlen, SH_EINVAL, "draft length %d is not in 1..%d",
			       o->draft_max, SPEC_MAX_DRAFT);
	spec_t *s = calloc(1, sizeof *s);
	if (!s)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	s->mode = o->mode;
	s->gate = o->mode == SPEC_AUTO;
	s->method = o->mode == SPEC_MODEL || (o->mode == SPEC_AUTO && o->draft_path) ? SPEC_MODEL
										     : SPEC_NGRAM;
	s->draft_max = o->draft_max;
	s->n_vocab = o->n_vocab;
	s->n_slots = o->n_slots;
	s->n_ctx = o->n_ctx;
	s->tok = o->tok;
	s->all = (acc_t){1.5, 1.0}; /* a prior of 0.6 until measured */
	s->acc = calloc((size_t)o->n_slots, sizeof *s->acc);
	s->shadow = malloc((size_t)o->n_slots * sizeof *s->shadow);
	s->idle = calloc((size_t)o->n_slots, sizeof *s->idle);
	int rc = 0;
	if (!s->acc || !s->shadow || !s->idle)
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	else if (o->draft_path && o->mode == SPEC_NGRAM)
		LOG(LOG_WARN, "--spec ngram: the draft model %s is not used", o->draft_path);
	else if (s->method == SPEC_MODEL)
		rc = draft_open(s, o, err, errlen);
	if (rc) {
		spec_free(s);
		return rc;
	}
	for (int i = 0; i < o->n_slots; i++)
		s->shadow[i] = -1;
	*out = s;
	return 0;
}

void spec_free(spec_t *s)
{
	if (!s)
		return;
	draft_free(s->d, s->n_slots);
	free(s->acc);
	free(s->shadow);
	free(s->idle);
	free(s);
}

const char *spec_mode_name(const spec_t *s)
{
	return s->mode == SPEC_AUTO ? "auto" : s->mode == SPEC_MODEL ? "model" : "ngram";
}

const char *spec_draft_name(const spec_t *s)
{
	return s->d ? s->d->name : NULL;
}

void spec_seq_start(spec_t *s, int slot)
{
	s->acc[slot] = (acc_t){0, 0};
	s->shadow[slot] = -1;
	s->idle[slot] = 0;
}

/* Cuts q's draft at the first token its grammar does not allow after the ones before it. */
static void grammar_trim(spec_seq_t *q)
{
	gram_match_t *gm = sampler_grammar(q->samp);
	if (!gm || !q->k)
		return;
	gram_match_t *c = gram_match_clone(gm);
	int k = 0;
	while (c && k < q->k && gram_match_accept(c, q->draft[k]) == 0)
		k++;
	q->k = c ? k : 0;
	gram_match_free(c);
}

/* Drafts q->k tokens with the draft model for the listed sequences (q->k set: the lengths
 * planned), in passes shared by all of them. */
static void draft_model_run(spec_t *s, spec_seq_t **list, int cnt)
{
	draft_t *d = s->d;
	size_t row = (size_t)s->n_vocab, qstride = (size_t)s->draft_max * row;
	int64_t t0 = now_ns();
	int want[ENG_MAX_PARALLEL], rounds = 0;
	gram_match_t *gm[ENG_MAX_PARALLEL];
	for (int i = 0; i < cnt; i++) {
		want[i] = list[i]->k;
		list[i]->k = 0;
		gram_match_t *g = sampler_grammar(list[i]->samp);
		gm[i] = g ? gram_match_clone(g) : NULL;
		if (g && !gm[i])
			want[i] = 0; /* no memory for the copy: no draft */
	}
	if (draft_catch_up(s, list, cnt))
		goto out;
	for (int r = 0;; r++) {
		/* each sequence still drafting picks its next token from its row */
		int n = 0, rows[ENG_MAX_PARALLEL], nr = 0;
		for (int i = 0; i < cnt; i++) {
			spec_seq_t *q = list[i];
			if (q->k != r || r >= want[i])
				continue;
			float *lg = d->logits + (size_t)i * row;
			int greedy = !(sampler_params(q->samp)->temperature > 0);
			float *qd =
			    greedy ? NULL : d->q + (size_t)q->slot * qstride + (size_t)r * row;
			if (gm[i])
				gram_match_mask(gm[i], lg, MAX(q->budget - r, 1));
			int t = sampler_draft(q->samp, lg, qd);
			if (gm[i] && gram_match_accept(gm[i], t)) {
				want[i] = r; /* the grammar ends the draft */
				continue;
			}
			q->draft[r] = t;
			q->k = r + 1;
			q->q = greedy ? NULL : d->q + (size_t)q->slot * qstride;
			if (tok_is_eog(s->tok, t) || q->k >= want[i]) {
				want[i] = q->k; /* nothing follows an end; or long enough */
				continue;
			}
			/* feed it for the next token */
			d->b_tok[n] = t, d->b_slot[n] = q->slot, d->b_pos[n] = q->n + r;
			d->b_out[n] = 1;
			d->toks[q->slot][q->n + r] = t;
			d->n[q->slot] = q->n + r + 1;
			rows[nr++] = i;
			n++;
		}
		if (!n || draft_pass(s, n, rows, nr))
			break;
		rounds++;
	}
out:
	for (int i = 0; i < cnt; i++)
		gram_match_free(gm[i]);
	double ms = (double)(now_ns() - t0) / 1e6;
	if (rounds || cnt) { /* the catch-up pass counts as a round */
		double per = ms / (double)(rounds + 1);
		s->round_ms = s->round_seen ? s->round_ms + EMA_NEW * (per - s->round_ms) : per;
		s->round_seen = 1;
	}
}

void spec_draft(spec_t *s, spec_seq_t *seqs, int n, int n_other)
{
	int64_t t0 = now_ns();
	double e_acc = n; /* every sequence makes at least its one token */
	int n_acc = n_other + n, rounds = 0, cnt = 0;
	/* auto: the step without drafts is measured first, and again now and then (the machine's
	 * load changes), so a draft is only ever compared with a measured baseline */
	int base = s->gate && (!s->t_cnt[MIN(n_acc, SPEC_TB)] || s->since_base >= SPEC_REBASE);
	spec_seq_t *list[ENG_MAX_PARALLEL];
	double prior = acc_rate(&s->all, 0.6, 0);
	for (int i = 0; i < n; i++) {
		spec_seq_t *q = &seqs[i];
		int kmax = MIN(q->max_k, s->draft_max);
		q->k = 0;
		q->q = NULL;
		s->shadow[q->slot] = -1;
		if (kmax <= 0 || (s->d && s->d->failed))
			continue;
		if (s->method == SPEC_NGRAM) {
			kmax = ngram_find(q->ctx, q->n, kmax, q->draft);
			if (!kmax)
				continue;
		}
		double a = acc_rate(&s->acc[q->slot], prior, ACC_PRIOR);
		int k = base ? 0 : choose_k(s, a, kmax, !s->gate, e_acc, n_acc, rounds);
		LOG(LOG_DEBUG,
		    "spec: slot %d a %.2f kmax %d -> k %d (t(%d) %.3f, t(+k) %.3f, t(+kmax) %.3f "
		    "ms, "
		    "draft %.3f, per token %.3f)",
		    q->slot, a, kmax, k, n_acc, t_pred(s, n_acc), t_pred(s, n_acc + k),
		    t_pred(s, n_acc + kmax), s->round_ms, s->tok_ms);
		if (!k && s->method == SPEC_NGRAM) {
			s->shadow[q->slot] = q->draft[0]; /* checked against the token sampled */
			continue;
		}
		if (!k && s->method == SPEC_MODEL && ++s->idle[q->slot] >= SPEC_PROBE)
			k = MIN(2, kmax); /* a probe: the acceptance may have changed */
		if (!k)
			continue;
		s->idle[q->slot] = 0;
		double e = 0, ap = 1;
		for (int j = 0; j < k; j++)
			e += (ap *= a);
		e_acc += e;
		n_acc += k;
		rounds = MAX(rounds, k);
		q->k = k;
		if (s->method == SPEC_NGRAM)
			grammar_trim(q);
		else
			list[cnt++] = q;
	}
	if (cnt)
		draft_model_run(s, list, cnt);
	s->since_base = base ? 0 : s->since_base + (rounds > 0);
	s->st.draft_ms += (double)(now_ns() - t0) / 1e6;
}

void spec_step_timed(spec_t *s, int n_tokens, double forward_ms)
{
	if (n_tokens < 1 || n_tokens > SPEC_TB || !(forward_ms > 0))
		return;
	int c = s->t_cnt[n_tokens], k = 0;
	uint32_t now = ++s->steps;
	s->t_ring[n_tokens][c % T_KEEP] = (float)forward_ms;
	s->t_when[n_tokens][c % T_KEEP] = now;
	float v[T_KEEP] = {(float)forward_ms};       /* (the new one is among them) */
	for (int i = 0; i < MIN(c + 1, T_KEEP); i++) /* the recent ones: attention grows */
		if (now - s->t_when[n_tokens][i] <= T_AGE)
			v[k++] = s->t_ring[n_tokens][i];
	for (int i = 1; i < k; i++) /* insertion sort of at most T_KEEP values */
		for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
			float x = v[j];
			v[j] = v[j - 1];
			v[j - 1] = x;
		}
	s->t_med[n_tokens] = v[k / 2];
	s->t_cnt[n_tokens] = c < (1 << 30) ? c + 1 : T_KEEP; /* wraps at a multiple of T_KEEP */
}

void spec_step_done(spec_t *s, double sample_ms, int emitted)
{
	if (emitted <= 0)
		return;
	double per = MAX(sample_ms, 0) / (double)emitted;
	s->tok_ms = s->tok_seen ? s->tok_ms + EMA_NEW * (per - s->tok_ms) : per;
	s->tok_seen = 1;
}

void spec_verified(spec_t *s, int slot, int k, int accepted, int emitted, int first)
{
	if (k <= 0) { /* prompt lookup was off: was its guess right? */
		int guess = s->shadow[slot];
		s->shadow[slot] = -1;
		if (guess < 0)
			return;
		acc_add(&s->acc[slot], ACC_DECAY, guess == first, guess != first);
		acc_add(&s->all, ACC_DECAY_ALL, guess == first, guess != first);
		return;
	}
	acc_add(&s->acc[slot], ACC_DECAY, accepted, accepted < k);
	acc_add(&s->all, ACC_DECAY_ALL, accepted, accepted < k);
	s->st.verifies++;
	s->st.drafted += (uint64_t)k;
	s->st.accepted += (uint64_t)accepted;
	s->st.emitted += (uint64_t)emitted;
	s->st.draft_len =
	    s->st.draft_len > 0 ? s->st.draft_len + EMA_NEW * (k - s->st.draft_len) : k;
}

void spec_stats(const spec_t *s, eng_spec_stats_t *out)
{
	*out = s->st;
}
