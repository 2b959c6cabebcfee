/* test_sample.c: the sampler. Greedy picks the argmax; a seed fixes the draws; top-k/top-p/min-p
 * restrict the support; penalties change the ranking; log-probabilities are normalised. The
 * speculative-sampling rule keeps the distribution (chi-square over 200000 draws against the
 * exact truncated softmax, for a draft distribution overlapping p, one mostly outside it and
 * one equal to it; the acceptance frequency is sum min(p, q)); a deterministic draft changes no
 * draw; greedy accepts exactly the argmax. */
#include "common/common.h"
#include "harness.h"
#include "infer/sample.h"

enum { V = 50 };

static void make_logits(float *l)
{
	for (int i = 0; i < V; i++)
		l[i] = (float)(i % 10) * 0.5f - (float)i * 0.01f; /* best: 9, then 19, 29... */
}

TEST(greedy_and_logprobs)
{
	sampler_t *s = sampler_new(V);
	eng_sampling_t p;
	eng_sampling_default(&p);
	sampler_reset(s, &p, NULL, 0);
	float l[V], lp;
	eng_logprob_t top[5];
	make_logits(l);
	int t = sampler_sample(s, l, &lp, top, 5);
	CHECK_EQ_INT(t, 9);
	CHECK_EQ_INT(top[0].token, 9);
	CHECK_EQ_INT(top[1].token, 19);
	CHECK_NEAR(top[0].logprob, lp, 1e-6);
	CHECK(top[1].logprob < top[0].logprob);
	make_logits(l);
	double z = 0;
	for (int i = 0; i < V; i++)
		z += exp(l[i]);
	CHECK_NEAR(lp, l[9] - log(z), 1e-4);
	sampler_free(s);
	sampler_free(NULL);
}

static void draw(uint64_t seed, const eng_sampling_t *base, int *out, int n)
{
	sampler_t *s = sampler_new(V);
	eng_sampling_t p = *base;
	p.seed = seed;
	sampler_reset(s, &p, NULL, 0);
	float l[V];
	for (int i = 0; i < n; i++) {
		make_logits(l);
		out[i] = sampler_sample(s, l, NULL, NULL, 0);
	}
	sampler_free(s);
}

TEST(seed_reproducible)
{
	eng_sampling_t p;
	eng_sampling_default(&p);
	p.temperature = 1.5f;
	int a[200], b[200], c[200];
	draw(42, &p, a, 200);
	draw(42, &p, b, 200);
	draw(43, &p, c, 200);
	CHECK(!memcmp(a, b, sizeof a));
	CHECK(memcmp(a, c, sizeof a) != 0);
	int distinct = 0, seen[V] = {0};
	for (int i = 0; i < 200; i++)
		distinct += !seen[a[i]]++;
	CHECK(distinct > 5); /* temperature 1.5 over these logits spreads the draws */
}

TEST(truncations)
{
	eng_sampling_t p;
	eng_sampling_default(&p);
	p.temperature = 5.0f;
	int a[300];
	p.top_k = 3; /* 9, 19, 29 */
	draw(1, &p, a, 300);
	for (int i = 0; i < 300; i++)
		CHECK(a[i] == 9 || a[i] == 19 || a[i] == 29);
	p.top_k = 0;
	p.temperature = 0.2f;
	p.top_p = 0.3f; /* 9 alone holds ~40% of the mass at this temperature */
	draw(1, &p, a, 100);
	for (int i = 0; i < 100; i++)
		CHECK_EQ_INT(a[i], 9);
	p.top_p = 1;
	p.temperature = 1;
	p.min_p = 0.9f; /* only tokens within 10% of the best: 9 (19 is e^-0.1 = 0.905 of it) */
	draw(1, &p, a, 100);
	for (int i = 0; i < 100; i++)
		CHECK(a[i] == 9 || a[i] == 19);
}

TEST(penalties)
{
	sampler_t *s = sampler_new(V);
	eng_sampling_t p;
	eng_sampling_default(&p);
	float l[V];
	int hist[3] = {9, 9, 9};
	p.frequency_penalty = 1.0f; /* 9 loses 3.0: 19 wins */
	sampler_reset(s, &p, hist, 3);
	make_logits(l);
	CHECK_EQ_INT(sampler_sample(s, l, NULL, NULL, 0), 19);
	eng_sampling_default(&p);
	p.presence_penalty = 0.2f; /* 9 loses 0.2, still ahead of 19 by 0.1-0.2 < 0 -> 19 */
	sampler_reset(s, &p, hist, 1);
	make_logits(l);
	CHECK_EQ_INT(sampler_sample(s, l, NULL, NULL, 0), 19);
	eng_sampling_default(&p);
	p.repeat_penalty = 1.1f; /* 4.41 / 1.1 = 4.01 < 4.31 */
	sampler_reset(s, &p, hist, 1);
	make_logits(l);
	CHECK_EQ_INT(sampler_sample(s, l, NULL, NULL, 0), 19);
	eng_sampling_default(&p); /* a reset clears the history */
	sampler_reset(s, &p, NULL, 0);
	make_logits(l);
	CHECK_EQ_INT(sampler_sample(s, l, NULL, NULL, 0), 9);
	sampler_free(s);
}

/* The request's distribution at temperature 1.5, top-k 10 over make_logits: p[V]. */
static void exact_p(double *p)
{
	float l[V];
	make_logits(l);
	int idx[V];
	for (int i = 0; i < V; i++)
		idx[i] = i;
	for (int i = 0; i < V; i++) /* sort by logit, descending (ties by id) */
		for (int j = i + 1; j < V; j++)
			if (l[idx[j]] > l[idx[i]] || (l[idx[j]] == l[idx[i]] && idx[j] < idx[i])) {
				int t = idx[i];
				idx[i] = idx[j];
				idx[j] = t;
			}
	double z = 0;
	memset(p, 0, V * sizeof *p);
	for (int i = 0; i < 10; i++)
		z += p[idx[i]] = exp(l[idx[i]] / 1.5);
	for (int i = 0; i < V; i++)
		p[i] /= z;
}

static uint64_t test_rng(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Draws n tokens by the rule with drafts from q; returns the chi-square of the counts against
 * p (cells with p > 0; a draw outside p's support counts 1e9) and the acceptance frequency. */
static double spec_chi2(const double *p, const float *q, int n, double *acc)
{
	sampler_t *s = sampler_new(V);
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.temperature = 1.5f;
	sp.top_k = 10;
	sp.seed = 99;
	sampler_reset(s, &sp, NULL, 0);
	static int cnt[V];
	memset(cnt, 0, sizeof cnt);
	uint64_t x = 7;
	int ok_n = 0;
	for (int i = 0; i < n; i++) {
		double u = (double)(test_rng(&x) >> 11) / 9007199254740992.0, c = 0;
		int d = V - 1;
		for (int k = 0; k < V; k++)
			if ((c += q[k]) > u) {
				d = k;
				break;
			}
		float l[V];
		make_logits(l);
		int ok = 0, t = sampler_sample_spec(s, l, d, q, NULL, NULL, 0, &ok);
		cnt[t]++;
		ok_n += ok;
		if (ok != (t == d))
			ok_n = -n; /* accepted must mean "the draft's token" */
	}
	sampler_free(s);
	double chi = 0;
	for (int k = 0; k < V; k++) {
		if (p[k] > 0)
			chi += (cnt[k] - n * p[k]) * (cnt[k] - n * p[k]) / (n * p[k]);
		else if (cnt[k])
			chi += 1e9;
	}
	*acc = (double)ok_n / n;
	return chi;
}

TEST(spec_rule_keeps_distribution)
{
	enum { N = 200000 };
	double p[V];
	exact_p(p);
	static float q[3][V];
	for (int k = 0; k < V; k++) {
		q[0][k] = k < 30 ? (float)(1.0 / 30) : 0; /* overlaps p's support, flatter */
		q[1][k] = k >= 40 ? 0.1f : 0;             /* 40..49: two of p's top 10 */
		q[2][k] = (float)p[k];                    /* the draft is the model */
	}
	/* chi-square with 9 degrees of freedom: 40.0 is its 1e-6 upper quantile (Wilson-Hilferty
	 * gives 39.7) */
	for (int i = 0; i < 3; i++) {
		double acc, chi = spec_chi2(p, q[i], N, &acc), want = 0;
		for (int k = 0; k < V; k++)
			want += MIN(p[k], (double)q[i][k]);
		printf("  q%d: chi2 %.1f (df 9), accepted %.4f, expected %.4f\n", i, chi, acc,
		       want);
		CHECK(chi < 40.0);
		/* the acceptance frequency: 5 standard deviations of N Bernoulli draws */
		CHECK(fabs(acc - want) <= 5 * sqrt(want * (1 - want) / N) + 1e-3);
	}
}

/* A deterministic draft (q one-hot: NULL) takes the same draws as no draft: the same tokens for a
 * seed; greedy accepts exactly the argmax. */
TEST(spec_deterministic_draft)
{
	eng_sampling_t p;
	eng_sampling_default(&p);
	p.temperature = 1.2f;
	p.seed = 5;
	sampler_t *a = sampler_new(V), *b = sampler_new(V);
	sampler_reset(a, &p, NULL, 0);
	sampler_reset(b, &p, NULL, 0);
	int same = 1, hits = 0;
	for (int i = 0; i < 500; i++) {
		float l1[V], l2[V];
		make_logits(l1);
		make_logits(l2);
		int ok, want = sampler_sample(a, l1, NULL, NULL, 0);
		int got = sampler_sample_spec(b, l2, i % 2 ? 9 : 19, NULL, NULL, NULL, 0, &ok);
		same &= want == got && ok == (got == (i % 2 ? 9 : 19));
		hits += ok;
	}
	CHECK(same);
	CHECK(hits > 5); /* the drafts are sometimes drawn */
	eng_sampling_default(&p);
	sampler_reset(a, &p, NULL, 0);
	float l[V];
	int ok;
	make_logits(l);
	CHECK_EQ_INT(sampler_sample_spec(a, l, 19, NULL, NULL, NULL, 0, &ok), 9);
	CHECK_EQ_INT(ok, 0);
	make_logits(l);
	CHECK_EQ_INT(sampler_sample_spec(a, l, 9, NULL, NULL, NULL, 0, &ok), 9);
	CHECK_EQ_INT(ok, 1);
	sampler_free(a);
	sampler_free(b);
}

int main(void)
{
	RUN(greedy_and_logprobs);
	RUN(seed_reproducible);
	RUN(truncations);
	RUN(penalties);
	RUN(spec_rule_keeps_distribution);
	RUN(spec_deterministic_draft);
	return harness_done();
}
