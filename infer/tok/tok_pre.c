/*
 * tok_pre.c: the pre-tokenizers of byte-level BPE vocabularies, chosen by tokenizer.ggml.pre.
 * Each is a list of regexes (PCRE2 with UTF and UCP, so \p{L}, \p{N} and \s follow Unicode)
 * applied in order: every regex cuts each current piece into its matches and the gaps between
 * them, both kept, which is what Hugging Face's Split(..., Isolated) and llama.cpp do.
 * `$` means the end of the piece only (DOLLAR_ENDONLY), as in those implementations.
 *
 * Invariant: the words handed to the callback, concatenated, are exactly the input. Bytes that
 * are not valid UTF-8 never reach PCRE2: each becomes a word of its own.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "infer/tok/tok_internal.h"

#include "common/common.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define GPT2_RE      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define LLAMA3_RE                                                                                  \
	CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"  \
		     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_RE                                                                                   \
	CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"       \
		     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_QWEN35: qwen2's with combining marks (\p{M}) joining
 * letter runs */
#define QWEN35_RE                                                                                  \
	CONTRACTIONS                                                                               \
	"|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"      \
	"\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define CJK_RE   "[一-龥ࠀ-一가-퟿]+"
#define UPPER    "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define O200K_UP "(?:(?=\\p{L})[^a-z])"
#define O200K_LO "(?:(?=\\p{L})[^A-Z])"
#define LOWER    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"

/* Letters of the DeepSeek LLM tokenizer (its own explicit class rather than \p{L}). */
#define DEEPSEEK_LETTERS                                                                           \
	"[\\x{41}-\\x{5a}\\x{61}-\\x{7a}\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}"     \
	"\\x{1bc}-\\x{1bf}\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}"     \
	"\\x{37b}-\\x{37d}\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}"              \
	"\\x{3a3}-\\x{3f5}\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}"  \
	"\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}"             \
	"\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}"             \
	"\\x{1f18}-\\x{1f1d}\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}\\x{1f59}"    \
	"\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}"     \
	"\\x{1fc2}-\\x{1fc4}\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}"             \
	"\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}"              \
	"\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}"               \
	"\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}"    \
	"\\x{214e}\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}"     \
	"\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}"              \
	"\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}"             \
	"\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}"           \
	"\\x{104b0}-\\x{104d3}\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}"     \
	"\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}]"

struct pre_def {
	const char *names; /* space-separated tokenizer.ggml.pre values */
	int ignore_merges; /* a word that is itself a token is not merged (llama3, tekken) */
	const char *re[7];
};

static const struct pre_def defs[] = {
    {"default", 0, {"[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2_RE, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2", 1, {LLAMA3_RE}},
    {"dbrx smaug-bpe chatglm-bpe glm4", 0, {LLAMA3_RE}}, /* glm4: llama.cpp's CHATGLM4 */
    {"deepseek-llm",
     0,
     {"[\r\n]", "\\s?" DEEPSEEK_LETTERS "+", "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", CJK_RE,
      "\\p{N}+"}},
    {"deepseek-coder", 0, {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", CJK_RE, "\\p{N}"}},
    {"deepseek-v3 hunyuan-dense",
     0,
     {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}"
      "\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
    {"falcon", 0, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2_RE, "[0-9][0-9][0-9]"}},
    {"starcoder refact command-r smollm codeshell exaone minerva-7b", 0, {"\\p{N}", GPT2_RE}},
    {"gpt-2 phi-2 mpt olmo jais trillion granite-docling roberta-bpe gigachat jina-es jina-de "
     "jina-v1-en jina-v2-es jina-v2-de jina-v2-code",
     0,
     {GPT2_RE}},
    {"qwen2 stablelm2 deepseek-r1-qwen hunyuan megrez grok-2", 0, {QWEN2_RE}},
    {"qwen35", 0, {QWEN35_RE}},
    {"poro-chat bloom gpt3-finnish", 0, {" ?[^(\\s|.,!?…。，、।۔،)]+"}},
    {"viking", 0, {" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}"}},
    {"tekken",
     1,
     {"[^\\r\\n\\p{L}\\p{N}]?" UPPER "*" LOWER "+|[^\\r\\n\\p{L}\\p{N}]?" UPPER "+" LOWER
      "*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    /* o200k (gpt-4o, gpt-oss): llama.cpp's form of the tokenizer.json regex
     * (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_GPT4O), which its unicode_regex_split runs over
     * text where every non-ASCII letter is one "letter" class: a word's capitals are letters
     * other than a-z, its small letters letters other than A-Z (so a non-ASCII letter is both,
     * and marks are not letters), not the Unicode case classes of the original */
    {"gpt-4o minimax-m2",
     0,
     {"[^\\r\\n\\p{L}\\p{N}]?" O200K_UP "*" O200K_LO "+" CONTRACTIONS
      "?|[^\\r\\n\\p{L}\\p{N}]?" O200K_UP "+" O200K_LO "*" CONTRACTIONS
      "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|"
      "\\s+(?!\\S)|\\s+"}},
    {"seed-coder",
     0,
     {CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"
		   "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"bailingmoe llada-moe",
     0,
     {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
    {"chameleon",
     0,
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
      "[\\p{P}!-/:-@\\[-`{-~]", GPT2_RE}},
};

struct tok_pre {
	pcre2_code *re[7];
	int n;
};

static int name_in(const char *names, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = names; *p;) {
		const char *e = strchr(p, ' ');
		size_t l = e ? (size_t)(e - p) : strlen(p);
		if (l == n && !memcmp(p, name, n))
			return 1;
		if (!e)
			break;
		p = e + 1;
	}
	return 0;
}

void tok_pre_free(struct tok_pre *p)
{
	if (!p)
		return;
	for (int i = 0; i < p->n; i++)
		pcre2_code_free(p->re[i]);
	free(p);
}

int tok_pre_new(struct tok_pre **out, const char *name, int *ignore_merges, char *err,
		size_t errlen)
{
	*out = NULL;
	const struct pre_def *d = NULL;
	for (size_t i = 0; i < ARRAY_LEN(defs) && !d; i++)
		if (name_in(defs[i].names, name))
			d = &defs[i];
	if (!d)
		return sh_fail(err, errlen, SH_EUNSUPP,
			       "unsupported pre-tokenizer '%s' (tokenizer.ggml.pre)", name);
	struct tok_pre *p = calloc(1, sizeof *p);
	if (!p)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	for (int i = 0; i < 7 && d->re[i]; i++) {
		int ec;
		PCRE2_SIZE eo;
		p->re[i] =
		    pcre2_compile((PCRE2_SPTR)d->re[i], PCRE2_ZERO_TERMINATED,
				  PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
		if (!p->re[i]) {
			PCRE2_UCHAR msg[128];
			pcre2_get_error_message(ec, msg, sizeof msg);
			tok_pre_free(p);
			return sh_fail(err, errlen, SH_EUNSUPP, "pre-tokenizer %s: regex %d: %s",
				       name, i, (const char *)msg);
		}
		p->n = i + 1;
		(void)pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE); /* optional speed-up */
	}
	*ignore_merges = d->ignore_merges;
	*out = p;
	return 0;
}

struct seg {
	size_t off, len;
	int raw; /* an invalid byte: never matched against regexes */
};

struct segs {
	struct seg *v;
	size_t n, cap;
};

static int segs_push(struct segs *s, size_t off, size_t len, int raw)
{
	if (!len)
		return 0;
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 64;
		struct seg *v = realloc(s->v, cap * sizeof *v);
		if (!v)
			return -1;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = (struct seg){off, len, raw};
	return 0;
}

int tok_pre_split(const struct tok_pre *p, const char *s, size_t n, tok_word_fn fn, void *ud)
{
	struct segs a = {0}, b = {0};
	pcre2_match_data *md = pcre2_match_data_create(16, NULL);
	int rc = -1;
	if (!md)
		goto done;
	/* valid UTF-8 runs, and invalid bytes one by one */
	size_t run = 0;
	for (size_t i = 0; i < n;) {
		int l = tok_utf8_valid((const unsigned char *)s + i, n - i);
		if (l) {
			i += (size_t)l;
			continue;
		}
		if (segs_push(&a, run, i - run, 0) || segs_push(&a, i, 1, 1))
			goto done;
		run = ++i;
	}
	if (segs_push(&a, run, n - run, 0))
		goto done;
	for (int r = 0; r < p->n; r++) {
		b.n = 0;
		for (size_t k = 0; k < a.n; k++) {
			struct seg g = a.v[k];
			if (g.raw) {
				if (segs_push(&b, g.off, g.len, 1))
					goto done;
				continue;
			}
			const char *sub = s + g.off;
			size_t pos = 0, last = 0;
			while (pos <= g.len) {
				int m = pcre2_match(p->re[r], (PCRE2_SPTR)sub, g.len, pos,
						    PCRE2_NO_UTF_CHECK, md, NULL);
				if (m < 0 && m != PCRE2_ERROR_NOMATCH) /* e.g. JIT stack limit */
					m = pcre2_match(p->re[r], (PCRE2_SPTR)sub, g.len, pos,
							PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
							NULL);
				if (m < 0) {
					if (m != PCRE2_ERROR_NOMATCH)
						LOG(LOG_WARN,
						    "pre-tokenizer: regex error %d on a "
						    "%zu-byte piece",
						    m, g.len);
					break;
				}
				PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
				size_t ms = ov[0], me = ov[1];
				if (me == ms) { /* empty match: step over one character */
					if (ms >= g.len)
						break;
					pos = ms + (size_t)tok_utf8_len((uint8_t)sub[ms]);
					continue;
				}
				if (segs_push(&b, g.off + last, ms - last, 0) ||
				    segs_push(&b, g.off + ms, me - ms, 0))
					goto done;
				last = pos = me;
			}
			if (segs_push(&b, g.off + last, g.len - last, 0))
				goto done;
		}
		struct segs t = a;
		a = b;
		b = t;
	}
	for (size_t k = 0; k < a.n; k++)
		fn(ud, s + a.v[k].off, a.v[k].len);
	rc = 0;
done:
	pcre2_match_data_free(md);
	free(a.v);
	free(b.v);
	return rc;
}
