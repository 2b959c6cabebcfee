/* test_sample.c: the sampler. Greedy picks the argmax; a seed fixes the draws; top-k/top-p/min-p
 * restrict the support; penalties change the ranking; log-probabilities are normalised. */
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

int main(void)
{
	RUN(greedy_and_logprobs);
	RUN(seed_reproducible);
	RUN(truncations);
	RUN(penalties);
	return harness_done();
}
