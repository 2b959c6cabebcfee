/* test_engine.c: the engine interface (infer.h) on stories260K: streamed text equals the
 * detokenized ids, stop strings (never emitted, held text released when they do not complete),
 * max_tokens, cancellation, KV prefix reuse, seeds, and errors as values. */
#include "common/common.h"
#include "harness.h"
#include "infer/infer.h"

typedef struct sink {
	char text[4096];
	size_t len;
	int ids[256], n;
	int cancel_after;
} sink_t;

static int on_tok(void *ud, const eng_token_t *t)
{
	sink_t *s = ud;
	if (s->len + t->text_len < sizeof s->text) {
		memcpy(s->text + s->len, t->text, t->text_len);
		s->len += t->text_len;
		s->text[s->len] = 0;
	}
	if (s->n < 256)
		s->ids[s->n++] = t->id;
	return s->cancel_after && s->n >= s->cancel_after;
}

static eng_t *open_stories(int ctx)
{
	char err[256];
	const char *path = harness_stories();
	if (!path)
		return NULL;
	eng_opts_t o = {.model_path = path, .threads = 2, .ctx = ctx};
	eng_t *e = NULL;
	if (eng_open(&e, &o, err, sizeof err))
		fprintf(stderr, "eng_open: %s\n", err);
	return e;
}

static int run(eng_t *e, const char *prompt, eng_sampling_t *sp, sink_t *s, eng_result_t *res)
{
	int *ids, n;
	char err[256];
	memset(s->text, 0, sizeof s->text);
	s->len = 0;
	s->n = 0;
	if (eng_tokenize(e, prompt, 1, 0, &ids, &n, err, sizeof err))
		return -1;
	int rc = eng_generate(e, ids, n, sp, on_tok, s, res);
	free(ids);
	return rc;
}

TEST(text_stops_and_limits)
{
	eng_t *e = open_stories(0);
	if (!e)
		SKIP("stories260K not found");
	const eng_info_t *in = eng_info(e);
	CHECK_EQ_STR(in->arch, "llama");
	CHECK_EQ_INT(in->n_vocab, 512);
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.max_tokens = 64;
	sink_t s = {0};
	eng_result_t res;
	CHECK_EQ_INT(run(e, "Once upon a time", &sp, &s, &res), 0);
	CHECK_EQ_INT(res.finish, ENG_FINISH_LENGTH);
	CHECK_EQ_INT(res.completion_tokens, 64);
	CHECK_EQ_INT(res.prompt_tokens, 5);
	CHECK_EQ_INT(s.ids[0], 432);
	char *whole = NULL;
	CHECK_EQ_INT(eng_detokenize(e, s.ids, s.n, &whole), 0);
	CHECK_EQ_STR(s.text, whole); /* streamed pieces add up to the detokenized ids */
	char full[4096];
	snprintf(full, sizeof full, "%s", s.text);
	free(whole);

	const char *stop1[] = {"Lily"};
	sp.stop = stop1;
	sp.n_stop = 1;
	CHECK_EQ_INT(run(e, "Once upon a time", &sp, &s, &res), 0);
	CHECK_EQ_INT(res.finish, ENG_FINISH_STOP);
	CHECK_EQ_STR(s.text, ", there was a little girl named ");

	/* "mom said" ends the 64 tokens; "said nothing" never completes: all text comes out */
	const char *stop2[] = {"said nothing", "zzz"};
	sp.stop = stop2;
	sp.n_stop = 2;
	CHECK_EQ_INT(run(e, "Once upon a time", &sp, &s, &res), 0);
	CHECK_EQ_INT(res.finish, ENG_FINISH_LENGTH);
	CHECK_EQ_STR(s.text, full);

	sp.n_stop = 0;
	sp.max_tokens = 0;
	s.cancel_after = 3;
	CHECK_EQ_INT(run(e, "Once upon a time", &sp, &s, &res), 0);
	CHECK_EQ_INT(res.finish, ENG_FINISH_CANCELED);
	CHECK_EQ_INT(res.completion_tokens, 3);
	s.cancel_after = 0;

	/* the same prompt again reuses the cached prefix and gives the same ids */
	sp.max_tokens = 64;
	CHECK_EQ_INT(run(e, "Once upon a time", &sp, &s, &res), 0);
	CHECK_EQ_STR(s.text, full);
	eng_free(e);
	eng_free(NULL);
}

TEST(seeds_and_errors)
{
	eng_t *e = open_stories(16);
	if (!e)
		SKIP("stories260K not found");
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.temperature = 1.0f;
	sp.top_k = 40;
	sp.seed = 11;
	sp.max_tokens = 8;
	sink_t a = {0}, b = {0};
	eng_result_t res;
	CHECK_EQ_INT(run(e, "Once", &sp, &a, &res), 0);
	CHECK_EQ_INT(run(e, "Once", &sp, &b, &res), 0);
	CHECK(a.n == b.n && !memcmp(a.ids, b.ids, sizeof(int) * a.n));
	CHECK_EQ_INT(eng_info(e)->n_ctx, 16);
	/* the context of 16 ends generation */
	sp.max_tokens = 0;
	CHECK_EQ_INT(run(e, "Once", &sp, &a, &res), 0);
	CHECK_EQ_INT(res.finish, a.n + 2 == 16 ? ENG_FINISH_LENGTH : ENG_FINISH_STOP);
	/* a prompt longer than the context is an error value */
	CHECK_EQ_INT(
	    run(e, "Once upon a time there was a big dog who liked to run and play", &sp, &a, &res),
	    SH_EINVAL);
	CHECK_EQ_INT(res.finish, ENG_FINISH_ERROR);
	CHECK(strstr(res.error, "context") != NULL);
	int bad = 9999;
	CHECK_EQ_INT(eng_generate(e, &bad, 1, &sp, NULL, NULL, &res), SH_EINVAL);
	eng_msg_t m[1] = {{.role = "robot", .content = "hi"}};
	int *ids = NULL, n = 0;
	char err[256];
	CHECK(eng_chat_prompt(e, m, 1, &ids, &n, err, sizeof err) < 0);
	free(ids);
	eng_free(e);

	eng_opts_t o = {.model_path = "/nonexistent.gguf"};
	CHECK(eng_open(&e, &o, err, sizeof err) < 0);
	CHECK(strstr(err, "nonexistent") != NULL);
}

int main(void)
{
	RUN(text_stops_and_limits);
	RUN(seeds_and_errors);
	return harness_done();
}
