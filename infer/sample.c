/*
 * sample.c: the sampling chain described in sample.h. Invariant: the history ring holds the last
 * min(total, SAMPLE_PENALTY_WINDOW) tokens and `count` their multiplicities, so penalties cost
 * O(window) per step, not O(vocabulary).
 */
#include "infer/sample.h"

#include "common/common.h"
#include "infer/grammar.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
	int id;
	float logit;
} cand_t;

struct sampler {
	int n_vocab;
	eng_sampling_t p;
	uint64_t rng;  /* the draws of the output: one per position (temperature > 0) */
	uint64_t rng2; /* speculative decoding: acceptance tests and the draft model's draws */
	int hist[SAMPLE_PENALTY_WINDOW];
	int n_hist, head;
	int *count;   /* [n_vocab] occurrences in the history window */
	cand_t *cand; /* [n_vocab] */
	double *pr;   /* [n_vocab] probabilities of the kept candidates (dist_build) */
	const tok_t *tok;
	gram_vocab_t *gv; /* shared table (grammar.c), taken on the first constrained request */
	gram_match_t *gm; /* this request's grammar state, or NULL */
};

void eng_sampling_default(eng_sampling_t *s)
{
	memset(s, 0, sizeof *s);
	s->temperature = 0;
	s->top_p = 1;
	s->repeat_penalty = 1;
}

sampler_t *sampler_new(int n_vocab)
{
	sampler_t *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->n_vocab = n_vocab;
	s->count = calloc((size_t)n_vocab, sizeof *s->count);
	s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
	s->pr = malloc((size_t)n_vocab * sizeof *s->pr);
	if (!s->count || !s->cand || !s->pr) {
		sampler_free(s);
		return NULL;
	}
	eng_sampling_default(&s->p);
	return s;
}

void sampler_free(sampler_t *s)
{
	if (!s)
		return;
	free(s->count);
	free(s->cand);
	free(s->pr);
	gram_match_free(s->gm);
	gram_vocab_release(s->gv);
	free(s);
}

void sampler_set_tok(sampler_t *s, const tok_t *t)
{
	s->tok = t;
}

void sampler_mask(sampler_t *s, float *logits, int budget)
{
	if (s->gm)
		gram_match_mask(s->gm, logits, budget < 1 ? 1 : budget);
}

void sampler_accept(sampler_t *s, int token)
{
	if (token < 0 || token >= s->n_vocab)
		return;
	if (s->gm)
		gram_match_accept(s->gm, token);
	if (s->n_hist == SAMPLE_PENALTY_WINDOW) {
		s->count[s->hist[s->head]]--;
		s->hist[s->head] = token;
		s->head = (s->head + 1) % SAMPLE_PENALTY_WINDOW;
	} else {
		s->hist[(s->head + s->n_hist) % SAMPLE_PENALTY_WINDOW] = token;
		s->n_hist++;
	}
	s->count[token]++;
}

void sampler_reset(sampler_t *s, const eng_sampling_t *p, const int *prompt, int n_prompt)
{
	s->p = *p;
	s->p.stop =
	    NULL; /* stop strings are the engine's business; do not keep borrowed pointers */
	s->p.n_stop = 0;
	s->p.grammar = NULL;
	gram_match_free(s->gm);
	s->gm = NULL;
	s->rng = p->seed ^ 0x9e3779b97f4a7c15ull;
	s->rng2 = p->seed ^ 0x5851f42d4c957f2dull;
	for (int i = 0; i < s->n_hist; i++)
		s->count[s->hist[(s->head + i) % SAMPLE_PENALTY_WINDOW]] = 0;
	s->n_hist = s->head = 0;
	for (int i = n_prompt > SAMPLE_PENALTY_WINDOW ? n_prompt - SAMPLE_PENALTY_WINDOW : 0;
	     i < n_prompt; i++)
		sampler_accept(s, prompt[i]);
	if (p->grammar) { /* after the prompt: its tokens are history, not output */
		if (!s->gv && s->tok)
			s->gv = gram_vocab_shared(s->tok);
		if (s->gv)
			s->gm = gram_match_new(p->grammar, s->gv);
		if (!s->gm)
			LOG(LOG_ERROR,
			    "sample: no memory for the grammar; the reply is unconstrained");
	}
}

/* A uniform double in [0, 1) from the generator x. */
static double rng_unit(uint64_t *x)
{
	return (double)(sh_splitmix64(x) >> 11) * (1.0 / 9007199254740992.0);
}

static int cand_cmp(const void *a, const void *b)
{
	const cand_t *x = a, *y = b;
	if (x->logit != y->logit)
		return x->logit < y->logit ? 1 : -1;
	return x->id - y->id; /* deterministic order for ties */
}

/* The repetition, presence and frequency penalties over the distinct tokens of the window. */
static void penalize(sampler_t *s, float *logits)
{
	const eng_sampling_t *p = &s->p;
	for (int i = 0; i < s->n_hist; i++) {
		int t = s->hist[(s->head + i) % SAMPLE_PENALTY_WINDOW], c = s->count[t];
		if (c <= 0)
			continue;
		int first = 1; /* apply once per distinct token: only at its first occurrence */
		for (int j = 0; j < i; j++)
			if (s->hist[(s->head + j) % SAMPLE_PENALTY_WINDOW] == t)
				first = 0;
		if (!first)
			continue;
		float *l = &logits[t];
		if (p->repeat_penalty > 0 && p->repeat_penalty != 1.0f)
			*l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
		*l -= p->presence_penalty + p->frequency_penalty * (float)c;
	}
}

/* The distribution a request's parameters make of logits (penalties already applied): the
 * log-softmax figures (LOGP below), the argmax, and when sorting is asked (temperature > 0 or
 * alternatives wanted) the candidates sorted in s->cand[0..ns); with temperature > 0 the ones
 * top-k, top-p and min-p keep, s->cand[0..nc), with unnormalised probabilities s->pr[0..nc)
 * summing to sum. */
typedef struct dist {
	float mx, lz, temp;
	int best, ns, nc;
	double sum;
} dist_t;

#define LOGP(d, logits, i) (((logits)[i] - (d)->mx) / (d)->temp - (d)->lz)

static void dist_build(sampler_t *s, const float *logits, int n_top, dist_t *d)
{
	const eng_sampling_t *p = &s->p;
	int n = s->n_vocab;
	d->temp = p->temperature > 0 ? p->temperature : 1.0f;
	d->mx = -INFINITY;
	d->best = 0;
	for (int i = 0; i < n; i++)
		if (logits[i] > d->mx) {
			d->mx = logits[i];
			d->best = i;
		}
	double z = 0;
	for (int i = 0; i < n; i++)
		z += exp((double)(logits[i] - d->mx) / d->temp);
	d->lz = (float)log(z);
	d->ns = d->nc = 0;
	d->sum = 0;
	if (!(p->temperature > 0 || n_top > 0))
		return;
	/* Tokens more than e^-30 less likely than the best cannot matter to any of the
	 * truncations or to a draw; leaving them out makes the sort cheap. */
	float cut = d->mx - 30.0f * d->temp;
	int nc = 0;
	for (int i = 0; i < n; i++)
		if (logits[i] >= cut) {
			s->cand[nc].id = i;
			s->cand[nc++].logit = logits[i];
		}
	if (nc < n_top) { /* alternatives were asked for beyond the cut: take everything */
		for (int i = 0; i < n; i++) {
			s->cand[i].id = i;
			s->cand[i].logit = logits[i];
		}
		nc = n;
	}
	qsort(s->cand, (size_t)nc, sizeof *s->cand, cand_cmp);
	d->ns = nc;
	if (!(p->temperature > 0))
		return;
	if (p->top_k > 0 && p->top_k < nc)
		nc = p->top_k;
	double sum = 0;
	for (int i = 0; i < nc; i++) {
		s->pr[i] = exp((double)(s->cand[i].logit - d->mx) / d->temp);
		sum += s->pr[i];
	}
	if (p->top_p > 0 && p->top_p < 1) {
		double c = 0;
		for (int i = 0; i < nc; i++) {
			c += s->pr[i] / sum;
			if (c >= p->top_p) {
				nc = i + 1;
				break;
			}
		}
	}
	if (p->min_p > 0 && p->min_p <= 1) {
		double thr = s->pr[0] * p->min_p;
		int k = 1;
		while (k < nc && s->pr[k] >= thr)
			k++;
		nc = k;
	}
	sum = 0;
	for (int i = 0; i < nc; i++)
		sum += s->pr[i];
	d->nc = nc;
	d->sum = sum;
}

/* The candidate that the uniform u in [0, 1) picks by the cumulative weights w[0..nc) (total
 * sum): the inverse of the distribution function, in candidate order. */
static int dist_pick(const sampler_t *s, const double *w, int nc, double sum, double u)
{
	double r = u * sum;
	for (int i = 0; i < nc; i++) {
		r -= w[i];
		if (r < 0)
			return s->cand[i].id;
	}
	return s->cand[nc - 1].id;
}

int sampler_sample(sampler_t *s, float *logits, float *logprob, eng_logprob_t *top, int n_top)
{
	return sampler_sample_spec(s, logits, -1, NULL, logprob, top, n_top, NULL);
}

int sampler_sample_spec(sampler_t *s, float *logits, int draft, const float *q, float *logprob,
			eng_logprob_t *top, int n_top, int *accepted)
{
	dist_t d;
	penalize(s, logits);
	dist_build(s, logits, n_top, &d);
	int chosen = d.best, ok = 0;
	if (d.nc > 0) {
		/* one draw of the main generator per position, whatever happens: the draws of a
		 * sequence do not depend on where drafts were verified */
		double u = rng_unit(&s->rng);
		chosen = -1;
		if (q && draft >= 0 && draft < s->n_vocab && q[draft] > 0) {
			/* accept x with probability min(1, p(x) / q(x)) */
			double px = 0;
			for (int i = 0; i < d.nc; i++)
				if (s->cand[i].id == draft) {
					px = s->pr[i] / d.sum;
					break;
				}
			if (rng_unit(&s->rng2) * (double)q[draft] < px) {
				chosen = draft;
			} else { /* else a draw from norm(max(p - q, 0)) */
				double rest = 0;
				for (int i = 0; i < d.nc; i++) {
					double w = s->pr[i] / d.sum - (double)q[s->cand[i].id];
					s->pr[i] = w > 0 ? w : 0;
					rest += s->pr[i];
				}
				if (rest > 0)
					chosen = dist_pick(s, s->pr, d.nc, rest, u);
				else /* p == q up to rounding: p itself */
					dist_build(s, logits, n_top, &d);
			}
		}
		/* without a draft distribution (none, or a deterministic draft: q one-hot) the
		 * rule is a draw from p that accepts the draft when it draws it */
		if (chosen < 0)
			chosen = dist_pick(s, s->pr, d.nc, d.sum, u);
	}
	ok = chosen == draft;
	if (accepted)
		*accepted = ok;
	if (logprob)
		*logprob = LOGP(&d, logits, chosen);
	for (int i = 0; i < n_top && i < d.ns; i++) {
		top[i].token = s->cand[i].id;
		top[i].logprob = LOGP(&d, logits, s->cand[i].id);
	}
	return chosen;
}

int sampler_draft(sampler_t *s, float *logits, float *q)
{
	dist_t d;
	dist_build(s, logits, 0, &d);
	if (d.nc <= 0)
		return d.best;
	int t = dist_pick(s, s->pr, d.nc, d.sum, rng_unit(&s->rng2));
	if (q) {
		memset(q, 0, (size_t)s->n_vocab * sizeof *q);
		for (int i = 0; i < d.nc; i++)
			q[s->cand[i].id] = (float)(s->pr[i] / d.sum);
	}
	return t;
}

const eng_sampling_t *sampler_params(const sampler_t *s)
{
	return &s->p;
}

gram_match_t *sampler_grammar(const sampler_t *s)
{
	return s->gm;
}
