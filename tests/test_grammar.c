/* test_grammar.c: JSON Schema -> byte matcher (infer/grammar.c). Valid texts are accepted and
 * end "done", invalid ones are refused at the right byte; unsupported keywords are named; the
 * shortest-completion cost is exact on small cases; and a random walk over bytes that follows
 * only allowed choices, with a shrinking budget, always ends in a complete value. */
#include "harness.h"
#include "infer/grammar.h"

#include "common/common.h"
#include "infer/gguf.h"

#include <jansson.h>
#include <time.h>

static eng_grammar_t *mk(const char *schema)
{
	eng_grammar_t *g = NULL;
	char err[256] = "";
	if (eng_grammar_new(&g, schema, schema ? strlen(schema) : 0, err, sizeof err))
		fprintf(stderr, "schema refused: %s\n", err);
	return g;
}

/* 1 when text is accepted and complete, 0 when refused or incomplete. */
static int full(const eng_grammar_t *g, const char *text)
{
	gram_match_t *m = gram_match_new(g, NULL);
	int ok = gram_match_feed(m, text, strlen(text)) == 0 && gram_match_done(m);
	gram_match_free(m);
	return ok;
}

static int prefix_ok(const eng_grammar_t *g, const char *text)
{
	gram_match_t *m = gram_match_new(g, NULL);
	int ok = gram_match_feed(m, text, strlen(text)) == 0;
	gram_match_free(m);
	return ok;
}

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",3]},\"maxItems\":3},"
    "\"kind\":{\"anyOf\":[{\"type\":\"null\"},{\"const\":\"x\"},"
    "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\"}},\"required\":[\"v\"]}]},"
    "\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"ok\"],\"additionalProperties\":false}";

TEST(object_schema)
{
	eng_grammar_t *g = mk(SCHEMA);
	CHECK(g != NULL);
	if (!g)
		return;
	CHECK(full(g, "{\"name\":\"bo\",\"ok\":true}"));
	CHECK(full(g, "{\"name\": \"bo\", \"age\": -12, \"ok\": false}"));
	CHECK(full(g, "{\"name\":\"\",\"tags\":[\"a\",3,\"b\"],\"kind\":null,\"ok\":true}"));
	CHECK(full(g, "{\"name\":\"\",\"kind\":{\"v\":1.5e3},\"ok\":true}"));
	CHECK(full(g, "{\"name\":\"\",\"kind\":\"x\",\"ok\":true}"));
	CHECK(full(g, "{\"name\":\"\\n\\\"\",\"ok\":true}"));
	CHECK(full(g, "{\"name\":\"h\xc3\xa9\",\"ok\":true}"));
	CHECK(!full(g, "{\"ok\":true}"));                   /* required name missing */
	CHECK(!prefix_ok(g, "{\"name\":\"bo\",\"other\"")); /* no extra keys */
	CHECK(!prefix_ok(g, "{\"name\":\"123456789"));      /* maxLength 8 */
	CHECK(!prefix_ok(g, "{\"name\":\"\",\"age\":1."));  /* integer */
	CHECK(!prefix_ok(g, "{\"name\":\"\",\"tags\":[\"a\",\"a\",\"a\",")); /* maxItems */
	CHECK(!prefix_ok(g, "{\"name\":\"\",\"tags\":[\"c"));                /* enum */
	CHECK(!prefix_ok(g, "{\"name\":\"\",\"kind\":{}"));                  /* v required */
	CHECK(!prefix_ok(g, "{\"name\":\"a\x01"));                           /* control character */
	CHECK(!prefix_ok(g, "{\"name\":\"\xc3("));                           /* broken UTF-8 */
	CHECK(!prefix_ok(g, "{\"name\":\"\",\"ok\":true}x")); /* nothing after the value */
	CHECK(!prefix_ok(g, "{\"name\":  \"\""));             /* one space at most */
	CHECK(!prefix_ok(g, " {"));
	eng_grammar_free(g);
}

TEST(json_object_and_scalars)
{
	eng_grammar_t *g = mk(NULL);
	CHECK(full(g, "{}"));
	CHECK(full(g, "{\"a\":[1,{\"b\":null},\"x\",true,-0.5e+2],\"c\":{}}"));
	CHECK(!prefix_ok(g, "["));
	CHECK(!prefix_ok(g, "{\"a\":tru "));
	eng_grammar_free(g);
	g = mk("{\"type\":\"integer\"}");
	CHECK(full(g, "0") && full(g, "-42") && !full(g, "-") && !prefix_ok(g, "01"));
	eng_grammar_free(g);
	g = mk("{\"type\":[\"string\",\"null\"]}");
	CHECK(full(g, "null") && full(g, "\"q\"") && !prefix_ok(g, "1"));
	eng_grammar_free(g);
	g = mk("{\"enum\":[1,12,\"a\"]}");
	CHECK(full(g, "1") && full(g, "12") && full(g, "\"a\"") && !prefix_ok(g, "13"));
	eng_grammar_free(g);
}

TEST(unsupported_keywords_named)
{
	eng_grammar_t *g = NULL;
	char err[256] = "";
	const char *s =
	    "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"pattern\":\"a+\"}}}";
	CHECK_EQ_INT(eng_grammar_new(&g, s, strlen(s), err, sizeof err), -5 /* SH_EUNSUPP */);
	CHECK(strstr(err, "'pattern'") && strstr(err, "/properties/x"));
	s = "{\"$ref\":\"#/defs/a\"}";
	CHECK(eng_grammar_new(&g, s, strlen(s), err, sizeof err) != 0 && strstr(err, "'$ref'"));
	s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"description\":\"d\","
	    "\"title\":\"t\"}}}";
	CHECK_EQ_INT(eng_grammar_new(&g, s, strlen(s), err, sizeof err), 0);
	eng_grammar_free(g);
	s = "{\"type\":\"wat\"}";
	CHECK(eng_grammar_new(&g, s, strlen(s), err, sizeof err) != 0 && strstr(err, "wat"));
	s = "not json";
	CHECK(eng_grammar_new(&g, s, strlen(s), err, sizeof err) != 0);
}

TEST(min_close_exact)
{
	eng_grammar_t *g = mk(SCHEMA);
	gram_match_t *m = gram_match_new(g, NULL);
	/* {"name":"","ok":true} is 21 bytes */
	CHECK_EQ_INT(gram_match_min_close(m), 21);
	CHECK_EQ_INT(gram_match_feed(m, "{\"name\":\"ab", 11), 0);
	CHECK_EQ_INT(gram_match_min_close(m), 12); /* "," "ok":true } */
	CHECK_EQ_INT(gram_match_feed(m, "\",\"ok\":true}", 12), 0);
	CHECK_EQ_INT(gram_match_min_close(m), 0);
	CHECK(gram_match_done(m));
	gram_match_free(m);
	eng_grammar_free(g);
}

/* A random walk over single bytes: at each step pick among bytes the matcher accepts and whose
 * completion still fits the budget; the result must always be a complete, parseable value. */
TEST(random_walks_always_close)
{
	eng_grammar_t *g = mk(SCHEMA);
	uint64_t x = 12345;
	int complete = 0;
	for (int run = 0; run < 80; run++) {
		gram_match_t *m = gram_match_new(g, NULL);
		char out[512];
		int n = 0, budget = 40 + run % 120;
		while (!gram_match_done(m) || (x >> 60) < 12) {
			int ok[256], k = 0;
			for (int b = 1; b < 256; b++) {
				char c = (char)b;
				gram_match_t *t = gram_match_clone(m);
				if (gram_match_feed(t, &c, 1) == 0 &&
				    gram_match_min_close(t) <= budget - 1)
					ok[k++] = b;
				gram_match_free(t);
			}
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			if (k == 0 || budget == 0)
				break;
			char c = (char)ok[(x >> 33) % (unsigned)k];
			CHECK_EQ_INT(gram_match_feed(m, &c, 1), 0);
			out[n++] = c;
			budget--;
		}
		out[n] = 0;
		json_error_t je;
		json_t *v = json_loads(out, 0, &je);
		if (gram_match_done(m) && v)
			complete++;
		else
			fprintf(stderr, "incomplete walk: %s\n", out);
		json_decref(v);
		gram_match_free(m);
	}
	CHECK_EQ_INT(complete, 80);
	eng_grammar_free(g);
}

/* Token-level masking on a real 32k vocabulary (llama SPM): random logits, the masked draw
 * always yields JSON that parses and ends complete within the budget; the time per masked step
 * is printed (no assertion on speed). */
static void masked_walks(const char *vocab, const char *schema, int runs)
{
	char path[512], err[256];
	snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", harness_shared(), vocab);
	gguf_t *gf = NULL;
	tok_t *t = NULL;
	if (gguf_open(&gf, path, err, sizeof err) || tok_load(&t, gf, err, sizeof err)) {
		gguf_free(gf);
		SKIP("vocabulary missing");
	}
	eng_grammar_t *g = mk(schema);
	gram_vocab_t *v = gram_vocab_new(t);
	int n = tok_n_vocab(t), complete = 0, steps = 0;
	float *l = malloc((size_t)n * sizeof *l);
	uint64_t x = 99;
	int64_t mask_ns = 0;
	for (int run = 0; run < runs; run++) {
		gram_match_t *m = gram_match_new(g, v);
		char out[4096];
		size_t len = 0;
		int budget = 30 + run * 7, ended = 0;
		for (; budget > 0; budget--) {
			for (int i = 0; i < n; i++) {
				x = x * 6364136223846793005ull + 1442695040888963407ull;
				l[i] = (float)(x >> 40) / (float)(1 << 24);
			}
			int64_t m0 = now_ns();
			gram_match_mask(m, l, budget);
			mask_ns += now_ns() - m0;
			steps++;
			if (steps % 16 ==
			    1) /* the mask equals token-by-token acceptance (every 5th) */
				for (int i = 0; i < n; i += 5) {
					gram_match_t *c = gram_match_clone(m);
					size_t pl;
					tok_piece(t, i, 0,
						  &pl); /* empty tokens would loop: never allowed */
					int fits = pl > 0 && gram_match_accept(c, i) == 0 &&
						   !tok_is_eog(t, i) &&
						   gram_match_min_close(c) <= budget - 1;
					if (fits != isfinite(l[i]) && !tok_is_eog(t, i)) {
						fprintf(stderr,
							"%s: token %d: mask %d, accept %d\n", vocab,
							i, isfinite(l[i]), fits);
						CHECK(0);
						i = n;
					}
					gram_match_free(c);
				}
			int best = -1;
			for (int i = 0; i < n; i++)
				if (isfinite(l[i]) && (best < 0 || l[i] > l[best]))
					best = i;
			if (best < 0 || tok_is_eog(t, best)) {
				ended = best >= 0;
				break;
			}
			size_t pl;
			const char *p = tok_piece(t, best, 0, &pl);
			CHECK_EQ_INT(gram_match_accept(m, best), 0);
			if (len + pl < sizeof out) {
				memcpy(out + len, p, pl);
				len += pl;
			}
		}
		out[len] = 0;
		json_error_t je;
		json_t *jv = json_loads(out, 0, &je);
		if (jv && (ended || gram_match_done(m)))
			complete++;
		else
			fprintf(stderr, "%s: incomplete: %s\n", vocab, out);
		json_decref(jv);
		gram_match_free(m);
	}
	double ms = (double)mask_ns / 1e6 / steps;
	printf("# %s (%d tokens): %.3f ms per mask over %d steps\n", vocab, n, ms, steps);
	CHECK_EQ_INT(complete, runs);
	free(l);
	gram_vocab_free(v);
	eng_grammar_free(g);
	tok_free(t);
	gguf_free(gf);
}

TEST(token_masking_spm)
{
	masked_walks("llama-spm", SCHEMA, 8);
}

TEST(token_masking_bpe)
{
	masked_walks("gpt-2", NULL, 5);
}

int main(void)
{
	RUN(object_schema);
	RUN(json_object_and_scalars);
	RUN(unsupported_keywords_named);
	RUN(min_close_exact);
	RUN(random_walks_always_close);
	RUN(token_masking_spm);
	RUN(token_masking_bpe);
	return harness_done();
}
