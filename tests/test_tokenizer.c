/* test_tokenizer.c: the tokenizers against the shared vectors (every line must match exactly,
 * see formats.md §4), decode(encode(s)) == s, special tokens, end-of-generation, the streaming
 * decoder, and a long prompt. */
#include "harness.h"

#include "common/common.h"
#include "infer/gguf.h"
#include "infer/tok/tok_internal.h"
#include "infer/tok/tokenizer.h"

#define SEP "\n__ggml_vocab_test__\n"

struct vocab {
	gguf_t *g;
	tok_t *t;
};

static int vocab_open(struct vocab *v, const char *name)
{
	char path[512], err[256];
	snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", harness_shared(), name);
	memset(v, 0, sizeof *v);
	if (gguf_open(&v->g, path, err, sizeof err)) {
		fprintf(stderr, "%s\n", err);
		return -1;
	}
	if (tok_load(&v->t, v->g, err, sizeof err)) {
		fprintf(stderr, "%s: %s\n", name, err);
		gguf_free(v->g);
		return -1;
	}
	return 0;
}

static void vocab_close(struct vocab *v)
{
	tok_free(v->t);
	gguf_free(v->g);
}

/* Runs every vector of NAME; returns the number of mismatching lines. */
static int run_vectors(const char *name, int expect_roundtrip)
{
	char path[512], err[256];
	char *inp, *outp;
	size_t ni, no;
	struct vocab v;
	snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf.inp", harness_shared(), name);
	if (read_file_all(path, &inp, &ni, err, sizeof err))
		return -1;
	snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf.out", harness_shared(), name);
	if (read_file_all(path, &outp, &no, err, sizeof err)) {
		free(inp);
		return -1;
	}
	if (vocab_open(&v, name)) {
		free(inp);
		free(outp);
		return -1;
	}
	int bad = 0, lines = 0, rt_bad = 0;
	char *p = inp, *o = outp;
	for (;;) {
		char *e = strstr(p, SEP);
		if (!e)
			break;
		char *oe = strchr(o, '\n');
		if (!oe)
			break;
		*oe = 0;
		int *ids, n;
		CHECK_EQ_INT(tok_encode(v.t, p, (size_t)(e - p), 0, 0, &ids, &n), 0);
		char got[8192];
		size_t k = 0;
		got[0] = 0;
		for (int i = 0; i < n && k + 16 < sizeof got; i++)
			k +=
			    (size_t)snprintf(got + k, sizeof got - k, "%s%d", i ? " " : "", ids[i]);
		/* expected lines may carry spaces around the ids */
		char *want = o;
		while (*want == ' ')
			want++;
		size_t wl = strlen(want);
		while (wl && want[wl - 1] == ' ')
			want[--wl] = 0;
		if (strcmp(got, want)) {
			bad++;
			fprintf(stderr, "%s line %d: %.*s\n  want: %s\n  got:  %s\n", name,
				lines + 1, (int)MIN(e - p, 60), p, want, got);
		}
		char *dec;
		size_t dl;
		CHECK_EQ_INT(tok_decode(v.t, ids, n, TOK_DECODE_STRIP, &dec, &dl), 0);
		if (expect_roundtrip && (dl != (size_t)(e - p) || memcmp(dec, p, dl))) {
			rt_bad++;
			fprintf(stderr, "%s line %d: round trip gives \"%s\"\n", name, lines + 1,
				dec);
		}
		free(dec);
		free(ids);
		lines++;
		p = e + strlen(SEP);
		o = oe + 1;
	}
	CHECK(lines > 20);
	CHECK_EQ_INT(rt_bad, 0);
	fprintf(stderr, "%s: %d lines, %d mismatches, %d round-trip failures\n", name, lines, bad,
		rt_bad);
	vocab_close(&v);
	free(inp);
	free(outp);
	return bad;
}

#define VECTOR_TEST(fn, name, rt)                                                                  \
	TEST(fn)                                                                                   \
	{                                                                                          \
		int bad = run_vectors(name, rt);                                                   \
		if (bad < 0)                                                                       \
			SKIP("vocabulary " name " not available");                                 \
		CHECK_EQ_INT(bad, 0);                                                              \
	}

VECTOR_TEST(llama_spm, "llama-spm", 1)
VECTOR_TEST(phi_3, "phi-3", 1)
VECTOR_TEST(gpt_2, "gpt-2", 1)
VECTOR_TEST(deepseek_llm, "deepseek-llm", 1)
VECTOR_TEST(falcon, "falcon", 1)

TEST(specials_and_eog)
{
	struct vocab v;
	if (vocab_open(&v, "phi-3"))
		SKIP("phi-3 vocabulary not available");
	int *ids, n;
	const char *txt = "<|user|>\nHi<|end|>";
	CHECK_EQ_INT(tok_encode(v.t, txt, strlen(txt), 1, 1, &ids, &n), 0);
	int user = tok_find(v.t, "<|user|>", 8), end = tok_find(v.t, "<|end|>", 7);
	CHECK(user >= 0 && end >= 0);
	CHECK(n >= 4);
	if (n >= 4) {
		CHECK_EQ_INT(ids[0], tok_bos(v.t));
		CHECK_EQ_INT(ids[1], user);
		CHECK_EQ_INT(ids[n - 1], end);
	}
	CHECK(tok_is_eog(v.t, end));
	CHECK(tok_is_eog(v.t, tok_eos(v.t)));
	CHECK(!tok_is_eog(v.t, user));
	char *dec;
	CHECK_EQ_INT(tok_decode(v.t, ids, n, TOK_DECODE_SPECIAL | TOK_DECODE_STRIP, &dec, NULL), 0);
	CHECK(strstr(dec, "<|user|>") != NULL);
	free(dec);
	free(ids);
	/* without parse_special the same text is not one control token */
	CHECK_EQ_INT(tok_encode(v.t, txt, strlen(txt), 0, 0, &ids, &n), 0);
	int found = 0;
	for (int i = 0; i < n; i++)
		found |= ids[i] == end && tok_type(v.t, end) == TOK_T_CONTROL;
	CHECK(!found);
	free(ids);
	vocab_close(&v);
}

TEST(stream_never_splits_chars)
{
	struct vocab v;
	if (vocab_open(&v, "gpt-2"))
		SKIP("gpt-2 vocabulary not available");
	const char *txt = "héllo wörld 🦙🦙 日本語 ok";
	int *ids, n;
	CHECK_EQ_INT(tok_encode(v.t, txt, strlen(txt), 0, 0, &ids, &n), 0);
	tok_stream_t s;
	CHECK_EQ_INT(tok_stream_init(&s, v.t, 0), 0);
	char all[256];
	size_t k = 0;
	for (int i = 0; i < n; i++) {
		size_t l;
		const char *p = tok_stream_push(&s, ids[i], &l);
		/* each chunk is valid UTF-8 on its own */
		for (size_t j = 0; j < l;) {
			int cl = 0;
			unsigned char c = (unsigned char)p[j];
			cl = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
			CHECK(j + (size_t)cl <= l);
			j += (size_t)cl;
		}
		memcpy(all + k, p, l);
		k += l;
	}
	size_t l;
	(void)tok_stream_flush(&s, &l);
	CHECK_EQ_INT(l, 0);
	all[k] = 0;
	CHECK_EQ_STR(all, txt);
	/* a dangling lead byte is flushed as U+FFFD */
	int b = tok_find(v.t, "\xc3\xa3", 2); /* the byte-level character for byte 0xE3 */
	if (b >= 0) {
		(void)tok_stream_push(&s, b, &l);
		CHECK_EQ_INT(l, 0);
		const char *f = tok_stream_flush(&s, &l);
		CHECK(l == 3 && !memcmp(f, "\xef\xbf\xbd", 3));
	}
	tok_stream_free(&s);
	free(ids);
	vocab_close(&v);
}

TEST(invalid_utf8_and_long_prompt)
{
	/* DeepSeek's vocabulary has no base token for bytes such as 0xFF (only an added token
	 * "ÿ" that decodes as that text), so invalid UTF-8 cannot round-trip there. */
	struct vocab v[3];
	const char *names[3] = {"llama-spm", "gpt-2", "deepseek-llm"};
	for (int vi = 0; vi < 3; vi++) {
		if (vocab_open(&v[vi], names[vi]))
			SKIP("vocabulary not available");
		const char bad[] = "ok \xff\xfe \xe2\x82 end \xc3";
		int *ids, n;
		CHECK_EQ_INT(tok_encode(v[vi].t, bad, sizeof bad - 1, 0, 0, &ids, &n), 0);
		char *dec;
		size_t dl;
		CHECK_EQ_INT(tok_decode(v[vi].t, ids, n, TOK_DECODE_STRIP, &dec, &dl), 0);
		if (vi < 2)
			CHECK(dl == sizeof bad - 1 && !memcmp(dec, bad, dl));
		free(dec);
		free(ids);
		/* ~200 KB of text: must finish quickly (no quadratic paths) */
		size_t len = 200000;
		char *big = malloc(len + 1);
		const char *w = "The quick brown fox, jumped over 12345 lazy dogs! ";
		for (size_t i = 0; i < len; i++)
			big[i] = w[i % strlen(w)];
		big[len] = 0;
		int64_t t0 = now_ms();
		CHECK_EQ_INT(tok_encode(v[vi].t, big, len, 1, 0, &ids, &n), 0);
		fprintf(stderr, "%s: %zu bytes -> %d tokens in %lld ms\n", names[vi], len, n,
			(long long)(now_ms() - t0));
		CHECK(n > 10000);
		free(ids);
		/* one long word without spaces */
		memset(big, 'a', len);
		CHECK_EQ_INT(tok_encode(v[vi].t, big, len, 0, 0, &ids, &n), 0);
		CHECK_EQ_INT(tok_decode(v[vi].t, ids, n, TOK_DECODE_STRIP, &dec, &dl), 0);
		CHECK(dl == len && !memcmp(dec, big, len));
		free(dec);
		free(ids);
		free(big);
		vocab_close(&v[vi]);
	}
}

struct words {
	char buf[512];
	size_t n;
};

static void collect(void *ud, const char *w, size_t n)
{
	struct words *o = ud;
	if (o->n + n + 2 < sizeof o->buf) {
		memcpy(o->buf + o->n, w, n);
		o->n += n;
		o->buf[o->n++] = '|';
		o->buf[o->n] = 0;
	}
}

static void expect_split(const char *pre, const char *text, const char *want)
{
	struct tok_pre *p;
	int im;
	char err[256];
	CHECK_EQ_INT(tok_pre_new(&p, pre, &im, err, sizeof err), 0);
	struct words w = {{0}, 0};
	CHECK_EQ_INT(tok_pre_split(p, text, strlen(text), collect, &w), 0);
	if (strcmp(w.buf, want))
		fprintf(stderr, "pre-tokenizer %s\n", pre);
	CHECK_EQ_STR(w.buf, want);
	tok_pre_free(p);
}

TEST(pre_tokenizers)
{
	/* every name compiles */
	const char *names[] = {
	    "default",      "llama3",         "llama-bpe",   "dbrx",       "smaug-bpe",
	    "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon",     "mpt",
	    "starcoder",    "refact",         "command-r",   "gpt-2",      "qwen2",
	    "qwen35",       "stablelm2",      "olmo",        "poro-chat",  "bloom",
	    "chatglm-bpe",  "viking",         "jais",        "tekken",     "smollm",
	    "codeshell",    "exaone",         "chameleon",   "minerva-7b", "gpt-4o",
	    "seed-coder",   "grok-2",         "bailingmoe",  "trillion"};
	for (size_t i = 0; i < ARRAY_LEN(names); i++) {
		struct tok_pre *p;
		int im;
		char err[256];
		int rc = tok_pre_new(&p, names[i], &im, err, sizeof err);
		if (rc)
			fprintf(stderr, "%s\n", err);
		CHECK_EQ_INT(rc, 0);
		tok_pre_free(p);
	}
	struct tok_pre *p;
	int im;
	char err[256];
	CHECK_EQ_INT(tok_pre_new(&p, "no-such-pre", &im, err, sizeof err), SH_EUNSUPP);
	CHECK(strstr(err, "no-such-pre") != NULL);
	/* the characteristic splits of each family */
	expect_split("llama3", "I've 1234567 apples!!\n\n  x",
		     "I|'ve| |123|456|7| apples|!!\n\n| | x|");
	expect_split("qwen2", "I'VE 123", "I|'VE| |1|2|3|");
	/* qwen35 (llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_QWEN35): a combining mark (U+0301) stays in
	 * its letters' word, where qwen2 cuts it off */
	expect_split("qwen35", "cafe\xcc\x81 au", "cafe\xcc\x81| au|");
	expect_split("qwen2", "cafe\xcc\x81 au", "cafe|\xcc\x81| au|");
	expect_split("gpt-2", "Hello  world's 42", "Hello| | world|'s| 42|");
	expect_split("starcoder", "abc 123", "abc| |1|2|3|");
	expect_split("deepseek-coder", "a+b\n12", "a|+|b|\n|1|2|");
	expect_split("tekken", "HelloWorld 42", "Hello|World| |4|2|");
	/* invalid UTF-8 bytes become words of their own and never reach PCRE2 */
	expect_split("llama3",
		     "ab\xff"
		     "cd",
		     "ab|\xff"
		     "|cd|");
}

int main(void)
{
	RUN(llama_spm);
	RUN(phi_3);
	RUN(gpt_2);
	RUN(deepseek_llm);
	RUN(falcon);
	RUN(specials_and_eog);
	RUN(stream_never_splits_chars);
	RUN(invalid_utf8_and_long_prompt);
	RUN(pre_tokenizers);
	return harness_done();
}
