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
	uint64_t rng;
	int hist[SAMPLE_PENALTY_WINDOW];
	int n_hist, head;
	int *count;   /* [n_vocab] occurrences in the history window */
	cand_t *cand; /* [n_vocab] */
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
	if (!s->count || !s->cand) {
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

static int cand_cmp(const void *a, const void *b)
{
	const cand_t *x = a, *y = b;
	if (x->logit != y->logit)
		return x->logit < y->logit ? 1 : -1;
	return x->id - y->id; /* deterministic order for ties */
}

int sampler_sample(sampler_t *s, float *logits, float *logprob, eng_logprob_t *top, int n_top)
{
	const eng_sampling_t *p = &s->p;
	int n = s->n_vocab;
	/* penalties over the distinct tokens of the window */
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
	float temp = p->temperature > 0 ? p->temperature : 1.0f;
	/* log-softmax of logits / temp */
	float mx = -INFINITY;
	int best = 0;
	for (int i = 0; i < n; i++)
		if (logits[i] > mx) {
			mx = logits[i];
			best = i;
		}
	double z = 0;
	for (int i = 0; i < n; i++)
		z += exp((double)(logits[i] - mx) / temp);
	float lz = (float)log(z);
#define LOGP(i) ((logits[i] - mx) / temp - lz)

	int chosen = best;
	int need_sort = p->temperature > 0 || n_top > 0;
	int nc = n, ns = 0; /* kept candidates, sorted candidates */
	if (need_sort) {
		/* Tokens more than e^-30 less likely than the best cannot matter to any of the
		 * truncations or to a draw; leaving them out makes the sort cheap. */
		float cut = mx - 30.0f * temp;
		nc = 0;
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
		ns = nc;
	}
	if (p->temperature > 0) {
		if (p->top_k > 0 && p->top_k < nc)
			nc = p->top_k;
		/* probabilities of the candidates, unnormalised */
		double sum = 0;
		double *pr = malloc((size_t)nc * sizeof *pr);
		if (!pr)
			goto done; /* out of memory: fall back to greedy */
		for (int i = 0; i < nc; i++) {
			pr[i] = exp((double)(s->cand[i].logit - mx) / temp);
			sum += pr[i];
		}
		if (p->top_p > 0 && p->top_p < 1) {
			double c = 0;
			for (int i = 0; i < nc; i++) {
				c += pr[i] / sum;
				if (c >= p->top_p) {
					nc = i + 1;
					break;
				}
			}
		}
		if (p->min_p > 0 && p->min_p <= 1) {
			double thr = pr[0] * p->min_p;
			int k = 1;
			while (k < nc && pr[k] >= thr)
				k++;
			nc = k;
		}
		sum = 0;
		for (int i = 0; i < nc; i++)
			sum += pr[i];
		double r =
		    (double)(sh_splitmix64(&s->rng) >> 11) * (1.0 / 9007199254740992.0) * sum;
		chosen = s->cand[nc - 1].id;
		for (int i = 0; i < nc; i++) {
			r -= pr[i];
			if (r < 0) {
				chosen = s->cand[i].id;
				break;
			}
		}
		free(pr);
	}
done:
	if (logprob)
		*logprob = LOGP(chosen);
	for (int i = 0; i < n_top && i < ns; i++) {
		top[i].token = s->cand[i].id;
		top[i].logprob = LOGP(s->cand[i].id);
	}
#undef LOGP
	return chosen;
}
