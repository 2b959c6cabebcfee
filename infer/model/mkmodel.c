/*
 * mkmodel.c: generated models for tests, benchmarks and the demo. Weights are uniform random
 * with a seeded PRNG, scaled by 1/sqrt(fan_in) so activations keep unit scale through the layers,
 * and the head scaled so the logits spread over a few units (greedy text is not one repeated
 * token). Rows are generated, quantized and streamed one at a time: a 1B model needs no more
 * memory than one row.
 *
 * The tokenizer is byte-level BPE in GPT-2's convention (each byte spelled as a printable code
 * point): ids 0-255 are the bytes, then for each word of a fixed list the left-growing merges
 * that build it (" t" + "h" -> " th", " th" + "e" -> " the"), then the special tokens, then
 * unreachable filler tokens up to the vocabulary size.
 *
 * deepseek2 models carry Multi-head Latent Attention with the keys and tensors today's
 * llama.cpp converter writes (attn_k_b / attn_v_b split from kv_b, key_length_mla, MQA with one
 * KV head), or the older single attn_kv_b form; both forms of one seed hold the same kv_b values.
 */
#include "common/common.h"
#include "infer/gguf_write.h"
#include "infer/quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const words[] = {
    "the",   "and",     "to",    "of",     "a",      "in",   "is",    "it",    "you",    "that",
    "he",    "was",     "for",   "on",     "are",    "with", "as",    "I",     "his",    "they",
    "be",    "at",      "one",   "have",   "this",   "from", "or",    "had",   "by",     "not",
    "but",   "what",    "some",  "we",     "can",    "out",  "other", "were",  "all",    "there",
    "when",  "up",      "use",   "your",   "how",    "said", "an",    "each",  "she",    "which",
    "do",    "their",   "time",  "if",     "will",   "way",  "about", "many",  "then",   "them",
    "would", "write",   "like",  "so",     "these",  "her",  "long",  "make",  "thing",  "see",
    "him",   "two",     "has",   "look",   "more",   "day",  "could", "go",    "come",   "did",
    "my",    "sound",   "no",    "most",   "people", "over", "know",  "water", "than",   "call",
    "first", "who",     "may",   "down",   "side",   "been", "now",   "find",  "hello",  "world",
    "story", "once",    "upon",  "little", "girl",   "boy",  "happy", "play",  "friend", "model",
    "token", "cluster", "shoal", "fish",   "sea",    "swim",
};

/* The first N_CONTROL are control tokens; qwen35 files also get Qwen's reasoning and tool tags
 * (user-defined tokens, as its converter marks added tokens that are not special). */
static const char *const specials[] = {"<|endoftext|>", "<|im_start|>",    "<|im_end|>",
				       "<think>",       "</think>",        "<tool_call>",
				       "</tool_call>",  "<tool_response>", "</tool_response>"};
#define N_CONTROL 3
/* gpt-oss (o200k_harmony): BOS, padding, EOS (<|return|>) and the harmony format's markers, all
 * control tokens as the converter marks them; llama.cpp's vocabulary loader then renders
 * <|channel|>, <|message|>, <|start|> and <|constrain|> as text and ends generation on
 * <|return|> and <|call|> but not <|end|> (llama-vocab.cpp, the o200k_harmony workarounds). */
static const char *const harmony[] = {"<|startoftext|>", "<|endoftext|>", "<|return|>",
				      "<|constrain|>",   "<|channel|>",   "<|start|>",
				      "<|end|>",         "<|message|>",   "<|call|>"};

/* gpt-oss files: a short template in the harmony layout of gpt-oss's own (system message with
 * the reasoning effort and channels, the first system/developer message as developer
 * instructions, earlier assistant turns as their final channel, "<|start|>assistant" to
 * answer); it carries <|start|> and <|channel|>, which is how llama.cpp recognises the family.
 * Tools are rendered by infer/chat_harmony.c, not by this text. */
static const char harmony_tmpl[] =
    "{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: ' + strftime_now('%Y-%m-%d') + '\n\nReasoning: "
    "' + (reasoning_effort if reasoning_effort is defined else 'medium') + '\n\n# Valid "
    "channels: analysis, commentary, final. Channel must be included for every message."
    "<|end|>' }}{%- set ns = namespace(first=0) %}{%- if messages[0].role == 'system' or "
    "messages[0].role == 'developer' %}{{- '<|start|>developer<|message|># Instructions\n\n' + "
    "messages[0].content + '\n\n<|end|>' }}{%- set ns.first = 1 %}{%- endif %}{%- for m in "
    "messages[ns.first:] %}{%- if m.role == 'assistant' %}{{- '<|start|>assistant<|channel|>"
    "final<|message|>' + m.content + '<|end|>' }}{%- else %}{{- '<|start|>' + m.role + "
    "'<|message|>' + m.content + '<|end|>' }}{%- endif %}{%- endfor %}{%- if "
    "add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}";

/* GLM-4.5's control tokens (as its tokenizer has them, by text), then the plain-text tags its
 * template and tool calls use (user-defined tokens, matched in any text). */
static const char *const glm_tokens[] = {
    "<|endoftext|>", "[MASK]",          "[gMASK]",         "[sMASK]",
    "<sop>",         "<eop>",           "<|system|>",      "<|user|>",
    "<|assistant|>", "<|observation|>", "<think>",         "</think>",
    "<tool_call>",   "</tool_call>",    "<tool_response>", "</tool_response>",
    "<arg_key>",     "</arg_key>",      "<arg_value>",     "</arg_value>"};
#define GLM_N_CONTROL 10

/* Templates trimmed to what identifies them (chat.c detects families by telltale text, as
 * llama.cpp's llm_chat_detect_template): GLM-4.5's and Gemma 3's. */
static const char glm_template[] =
    "[gMASK]<sop>{%- if tools -%}<|system|>\n# Tools\n{%- endif -%}{% for m in messages %}"
    "{% if m.role == 'user' %}<|user|>\n{{ m.content }}{% elif m.role == 'assistant' %}"
    "<|assistant|>\n<think></think>\n{{ m.content }}{% elif m.role == 'tool' %}"
    "<|observation|><tool_response>\n{{ m.content }}\n</tool_response>{% elif m.role == "
    "'system' %}<|system|>\n{{ m.content }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}";
static const char gemma_template[] =
    "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == "
    "'assistant' else message['role'] %}{{ '<start_of_turn>' + role + '\n' + "
    "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt "
    "%}{{'<start_of_turn>model\n'}}{% endif %}";

/* Gemma 3's SentencePiece control tokens first, in its order of ids (<pad> 0, <eos> 1, <bos> 2,
 * <unk> 3), then the turn markers. */
static const char *const gemma_specials[] = {"<pad>", "<eos>",           "<bos>",
					     "<unk>", "<start_of_turn>", "<end_of_turn>"};

static const char chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* qwen35 files: a template in the layout of Qwen3.5's (tools as JSON lines in <tools>, calls as
 * <tool_call><function=NAME><parameter=K>, results in <tool_response> user turns, reasoning
 * kept only after the last user query, "<think>\n" opening the reply), written here. */
static const char qwen35_tmpl[] =
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n\\nYou have access to the following fun"
    "ctions:\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %"
    "}{{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format"
    " with NO suffix:\\n\\n<tool_call>\\n<function=example_function_name>\\n<parameter=example_"
    "parameter_1>\\nvalue_1\\n</parameter>\\n<parameter=example_parameter_2>\\nThis is the valu"
    "e for the second parameter\\nthat can span\\nmultiple lines\\n</parameter>\\n</function>\\n"
    "</tool_call>\\n\\n<IMPORTANT>\\nReminder:\\n- Function calls MUST follow the specified for"
    "mat: an inner <function=...></function> block must be nested within <tool_call></tool_call"
    "> XML tags\\n- Required parameters MUST be specified\\n- You may provide optional reasonin"
    "g for your function call in natural language BEFORE the function call, but NOT after\\n- I"
    "f there is no function call available, answer the question like normal with your current k"
    "nowledge and do not tell the user about function calls\\n</IMPORTANT>' }}{%- if messages[0"
    "].role == 'system' and messages[0].content | trim %}{{- '\\n\\n' + messages[0].content | t"
    "rim }}{%- endif %}{{- '<|im_end|>\\n' }}{%- elif messages[0].role == 'system' %}{{- '<|im_"
    "start|>system\\n' + messages[0].content | trim + '<|im_end|>\\n' }}{%- endif %}{%- set ns "
    "= namespace(last=-1) %}{%- for m in messages %}{%- set c = m.content | trim if m.content i"
    "s string else '' %}{%- if m.role == 'user' and not (c.startswith('<tool_response>') and c."
    "endswith('</tool_response>')) %}{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}{"
    "%- for m in messages %}{%- set content = m.content | trim if m.content is string else '' %"
    "}{%- if m.role == 'user' %}{{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' }}{%- eli"
    "f m.role == 'assistant' %}{%- set reasoning = '' %}{%- if m.reasoning_content is string %}"
    "{%- set reasoning = m.reasoning_content %}{%- elif '</think>' in content %}{%- set reasoni"
    "ng = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}{%- s"
    "et content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}{%- if loop.index0 "
    "> ns.last %}{{- '<|im_start|>assistant\\n<think>\\n' + reasoning | trim + '\\n</think>\\n\\n"
    "' + content }}{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}{%- if m.t"
    "ool_calls %}{%- for tc in m.tool_calls %}{%- set f = tc.function if tc.function is defined"
    " else tc %}{%- if not loop.first %}{{- '\\n' }}{%- elif content | trim %}{{- '\\n\\n' }}{%"
    "- endif %}{{- '<tool_call>\\n<function=' + f.name + '>\\n' }}{%- if f.arguments is defined"
    " %}{%- for k, v in f.arguments | items %}{{- '<parameter=' + k + '>\\n' }}{{- v | tojson i"
    "f v is mapping or (v is sequence and v is not string) else v | string }}{{- '\\n</paramete"
    "r>\\n' }}{%- endfor %}{%- endif %}{{- '</function>\\n</tool_call>' }}{%- endfor %}{%- endi"
    "f %}{{- '<|im_end|>\\n' }}{%- elif m.role == 'tool' %}{%- if not loop.first and messages[l"
    "oop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}{{- '\\n<tool_respon"
    "se>\\n' + content + '\\n</tool_response>' }}{%- if loop.last or messages[loop.index0 + 1]."
    "role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}{%- if add_gen"
    "eration_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and en"
    "able_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }"
    "}{%- endif %}{%- endif %}";

/* GPT-2's byte -> code point map, as UTF-8 into out (at most 3 bytes + NUL). */
static void byte_spelling(int b, char *out)
{
	int cp;
	if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
		cp = b;
	} else {
		int n = 0; /* rank of b among the bytes that are remapped */
		for (int c = 0; c < b; c++)
			if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) ||
			      (c >= 174 && c <= 255)))
				n++;
		cp = 256 + n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = 0;
	}
}

typedef struct vocab {
	char **tok;
	int32_t *type;
	float *score;
	char **merges;
	int n, cap, n_merges, cap_merges;
} vocab_t;

static int vocab_find(const vocab_t *v, const char *s)
{
	for (int i = 0; i < v->n; i++)
		if (!strcmp(v->tok[i], s))
			return i;
	return -1;
}

static int vocab_add(vocab_t *v, const char *s, int type)
{
	if (v->n == v->cap)
		return SH_ENOMEM; /* capacity is the target vocabulary size */
	if (!(v->tok[v->n] = strdup(s)))
		return SH_ENOMEM;
	v->type[v->n] = type;
	v->score[v->n] = -(float)v->n;
	v->n++;
	return 0;
}

/* Builds the vocabulary with the special tokens spec[n_spec], the first n_control of them control
 * tokens (the others user-defined); n_vocab must leave room for bytes and specials. */
static int vocab_build(vocab_t *v, int n_vocab, const char *const *spec, int n_spec, int n_control)
{
	v->cap = n_vocab;
	v->tok = calloc((size_t)n_vocab, sizeof *v->tok);
	v->type = calloc((size_t)n_vocab, sizeof *v->type);
	v->score = calloc((size_t)n_vocab, sizeof *v->score);
	v->cap_merges = 4096;
	v->merges = calloc((size_t)v->cap_merges, sizeof *v->merges);
	if (!v->tok || !v->type || !v->score || !v->merges)
		return SH_ENOMEM;
	char sp[4];
	for (int b = 0; b < 256; b++) {
		byte_spelling(b, sp);
		if (vocab_add(v, sp, 1))
			return SH_ENOMEM;
	}
	int room = n_vocab - 256 - n_spec;
	char space[4];
	byte_spelling(' ', space); /* "Ġ" */
	for (size_t w = 0; w < ARRAY_LEN(words) && room > 0; w++) {
		char cur[64], m[160];
		size_t len = strlen(space);
		memcpy(cur, space, len + 1);
		for (const char *c = words[w]; *c && room > 0 && len + 2 < sizeof cur; c++) {
			snprintf(m, sizeof m, "%s %c", cur, *c); /* the merge "left right" */
			cur[len++] = *c;
			cur[len] = 0;
			if (vocab_find(v, cur) >= 0)
				continue;
			if (vocab_add(v, cur, 1) || v->n_merges == v->cap_merges)
				return SH_ENOMEM;
			if (!(v->merges[v->n_merges++] = strdup(m)))
				return SH_ENOMEM;
			room--;
		}
	}
	for (int i = 0; i < n_spec; i++)
		if (vocab_add(v, spec[i], i < n_control ? 3 : 4))
			return SH_ENOMEM;
	char f[32];
	for (int i = 0; v->n < n_vocab; i++) { /* no merge produces these: never emitted by BPE */
		snprintf(f, sizeof f, "%s<filler%d>", space, i);
		if (vocab_add(v, f, 1))
			return SH_ENOMEM;
	}
	return 0;
}

/* A SentencePiece vocabulary as llama.cpp's converter writes Gemma's (tokenizer.ggml.model
 * "llama"; _set_vocab_sentencepiece): the control tokens of gemma_specials, the 256 byte tokens
 * <0xNN> (type byte, for byte fallback), printable ASCII, newline and tab as single pieces, then
 * for each word the pieces "\u2581w", "\u2581wo", ... that build it; scores fall with the id
 * (SentencePiece's log probabilities: earlier pieces merge first), fillers make up the size. */
static int vocab_build_spm(vocab_t *v, int n_vocab)
{
	static const char sp_mark[] = "\xe2\x96\x81"; /* U+2581, SentencePiece's space */
	v->cap = n_vocab;
	v->tok = calloc((size_t)n_vocab, sizeof *v->tok);
	v->type = calloc((size_t)n_vocab, sizeof *v->type);
	v->score = calloc((size_t)n_vocab, sizeof *v->score);
	if (!v->tok || !v->type || !v->score)
		return SH_ENOMEM;
	for (size_t i = 0; i < ARRAY_LEN(gemma_specials); i++)
		if (vocab_add(v, gemma_specials[i], i == 3 ? 2 : 3))
			return SH_ENOMEM;
	char piece[64];
	for (int b = 0; b < 256; b++) {
		snprintf(piece, sizeof piece, "<0x%02X>", b);
		if (vocab_add(v, piece, 6))
			return SH_ENOMEM;
		v->score[v->n - 1] = 0;
	}
	if (vocab_add(v, sp_mark, 1) || vocab_add(v, "\n", 1) || vocab_add(v, "\t", 1))
		return SH_ENOMEM;
	for (int c = 33; c < 127; c++) {
		piece[0] = (char)c, piece[1] = 0;
		if (vocab_add(v, piece, 1))
			return SH_ENOMEM;
	}
	for (size_t w = 0; w < ARRAY_LEN(words); w++) {
		size_t len = strlen(sp_mark);
		memcpy(piece, sp_mark, len + 1);
		for (const char *c = words[w]; *c && len + 2 < sizeof piece; c++) {
			piece[len++] = *c;
			piece[len] = 0;
			if (vocab_find(v, piece) >= 0)
				continue;
			if (v->n == n_vocab)
				return 0;
			if (vocab_add(v, piece, 1))
				return SH_ENOMEM;
		}
	}
	for (int i = 0; v->n < n_vocab; i++) { /* never produced: no shorter piece builds them */
		snprintf(piece, sizeof piece, "<unused%d>", i);
		if (vocab_add(v, piece, 5))
			return SH_ENOMEM;
	}
	return 0;
}

static void vocab_free(vocab_t *v)
{
	for (int i = 0; i < v->n; i++)
		free(v->tok[i]);
	for (int i = 0; i < v->n_merges; i++)
		free(v->merges[i]);
	free(v->tok);
	free(v->type);
	free(v->score);
	free(v->merges);
}

/* ---- weights ------------------------------------------------------------------------------ */

static float rng_uniform(uint64_t *s) /* [-1, 1) */
{
	return (float)((sh_splitmix64(s) >> 40) * (1.0 / (1 << 23))) - 1.0f;
}

typedef struct tspec {
	char name[64];
	int64_t rows, cols; /* rows = 0: a vector of cols */
	int64_t ne2;        /* > 0: a 3-D tensor [cols, rows / ne2, ne2] (experts) */
	int type;
	float scale;    /* uniform in [-scale, scale); for norms, around 1 */
	int is_norm;    /* a norm: values around is_norm (1; Gemma's post norms 10, so that each
			 * branch moves the residual that the tied head reads) */
	int64_t planes; /* 3-D tensors: ne[2] (per-head matrices of rows x cols), else 0 */
	int kind;       /* TS_PLAIN, or deepseek2's split kv_b (see mkmodel_write) */
} tspec_t;

enum { TS_PLAIN = 0, TS_KB, TS_VB, TS_NEG };

/* The type llama.cpp's quantizer writes for a row of n elements that is not whole blocks of t
 * (llama-quant.cpp, llama_tensor_get_type's fallback; IQ4_NL, its choice for Q2_K/Q3_K, is not
 * a type shoal reads, so those take Q4_0): deepseek2's attn_k_b rows are qk_nope (128) long. */
static int fallback_type(int t, int64_t n)
{
	if (n % quant_block_elems(t) == 0)
		return t;
	int f = t == QT_Q4_K ? QT_Q5_0 : t == QT_Q5_K ? QT_Q5_1 : t == QT_Q6_K ? QT_Q8_0 : QT_Q4_0;
	return n % quant_block_elems(f) == 0 ? f : QT_F16;
}

/* Quantizes one row of t and appends it to the file. */
static int emit_row(gguf_writer_t *w, const tspec_t *t, const float *row, uint8_t *qrow, char *err,
		    size_t errlen)
{
	quant_quantize_row(t->type, row, qrow, t->cols);
	return gw_data(w, qrow, quant_row_bytes(t->type, t->cols), err, errlen);
}

int mkmodel_write(const mkmodel_opts_t *o, const char *path, char *err, size_t errlen)
{
	int mixtral = !strcmp(o->arch, "mixtral"), q2moe = !strcmp(o->arch, "qwen2moe"),
	    q3moe = !strcmp(o->arch, "qwen3moe"), ds2 = !strcmp(o->arch, "deepseek2");
	int qwen2 = !strcmp(o->arch, "qwen2") || q2moe, qwen3 = !strcmp(o->arch, "qwen3") || q3moe;
	int q35moe = !strcmp(o->arch, "qwen35moe"), q35 = !strcmp(o->arch, "qwen35") || q35moe;
	int gemma = !strcmp(o->arch, "gemma3"), glm = !strcmp(o->arch, "glm4moe");
	int goss = !strcmp(o->arch, "gpt-oss"); /* meta_gptoss.c's tensors and keys */
	/* deepseek2 routes when given --experts: layers from dense_lead on */
	int ds2moe = ds2 && o->experts > 0,
	    moe = mixtral || q2moe || q3moe || ds2moe || q35moe || glm || goss;
	if (o->pooling && strcmp(o->pooling, "none") && strcmp(o->pooling, "mean") &&
	    strcmp(o->pooling, "cls") && strcmp(o->pooling, "last"))
		return sh_fail(err, errlen, SH_EINVAL,
			       "unknown pooling '%s' (none, mean, cls, last)", o->pooling);
	if (!qwen2 && !qwen3 && !mixtral && !ds2 && !q35 && !gemma && !glm && !goss &&
	    strcmp(o->arch, "llama"))
		return sh_fail(err, errlen, SH_EUNSUPP,
			       "unsupported architecture '%s' (llama, qwen2, qwen3, deepseek2, "
			       "qwen35, gemma3, gpt-oss, mixtral, qwen2moe, qwen3moe, qwen35moe, "
			       "glm4moe)",
			       o->arch);
	const char *const *spec = goss ? harmony : glm ? glm_tokens : specials;
	int n_spec = goss  ? (int)ARRAY_LEN(harmony)
		     : glm ? (int)ARRAY_LEN(glm_tokens)
		     : q35 ? (int)ARRAY_LEN(specials)
			   : N_CONTROL;
	int n_control = goss ? n_spec : glm ? GLM_N_CONTROL : N_CONTROL;
	/* gpt-oss as its converter writes it: the experts in the file's type (MXFP4 as shipped),
	 * the other matrices F16 when that type is MXFP4 */
	int wtype = goss && o->type == QT_MXFP4 ? QT_F16 : o->type;
	int E = moe ? o->experts : 0, K = o->experts_used;
	int FE = mixtral || !o->expert_ffn ? o->ffn : o->expert_ffn;
	int n_sh =
	    q2moe || ds2moe || q35moe || glm ? (o->shared_experts ? o->shared_experts : 1) : 0;
	int lead = ds2moe || glm ? (o->dense_lead ? o->dense_lead : 1) : 0; /* leading dense */
	int swa = gemma ? (o->swa_window ? o->swa_window : 512) : 0;        /* gemma3's window */
	if (moe &&
	    (E <= 0 || E > 512 || K <= 0 || K > E || FE <= 0 || n_sh < 0 || lead > o->layers))
		return sh_fail(
		    err, errlen, SH_EINVAL,
		    "need 1 <= experts-used <= experts <= 512, a positive expert ffn and "
		    "dense-lead <= layers");
	int64_t SF = (int64_t)n_sh * FE; /* the shared block (qwen2moe gated, deepseek2 not) */
	int hd = o->head_dim ? o->head_dim : (o->heads ? o->dim / o->heads : 0);
	int kvh = ds2 ? 1 : o->kv_heads; /* deepseek2: one latent, --kv-heads unused */
	if (o->dim <= 0 || o->layers <= 0 || o->heads <= 0 || kvh <= 0 || o->ffn <= 0 || hd <= 0 ||
	    hd % 2 || o->heads % kvh || (!o->head_dim && o->dim % o->heads))
		return sh_fail(err, errlen, SH_EINVAL, "inconsistent shape (dim, heads, kv-heads)");
	int min_vocab = gemma ? 400 : 256 + n_spec + 1;
	if (o->vocab < min_vocab || swa < 0)
		return sh_fail(err, errlen, SH_EINVAL, "vocabulary must be at least %d", min_vocab);
	if (!quant_type_supported(o->type))
		return sh_fail(err, errlen, SH_EUNSUPP, "unsupported type");
	int be = quant_block_elems(o->type);
	if (o->dim % be || o->ffn % be || (o->heads * hd) % be || FE % be)
		return sh_fail(err, errlen, SH_EINVAL,
			       "dim, ffn and heads*head_dim must be multiples of %d for %s", be,
			       quant_type_name(o->type));
	/* deepseek2's latent attention shape */
	int kvl = o->kv_lora ? o->kv_lora : o->dim / 2, ql = o->q_lora;
	int nope = o->qk_nope ? o->qk_nope : hd, rd = o->qk_rope ? o->qk_rope : hd / 2;
	int dv = o->v_head ? o->v_head : hd, legacy = o->mla_legacy;
	if (ds2) {
		if (kvl <= 0 || ql < 0 || nope <= 0 || rd <= 0 || rd % 2 || dv <= 0 ||
		    (int64_t)kvl > (int64_t)o->heads * (nope + dv) || o->rope_factor < 0)
			return sh_fail(err, errlen, SH_EINVAL,
				       "inconsistent latent attention shape (kv-lora, q-lora, "
				       "qk-nope, qk-rope, v-head)");
		if (kvl % be || ql % be || (o->heads * dv) % be)
			return sh_fail(
			    err, errlen, SH_EINVAL,
			    "kv-lora, q-lora and heads*v-head must be multiples of %d for %s", be,
			    quant_type_name(o->type));
		hd = nope + rd;
	}
	/* qwen35: DeltaNet sizes (state = key/value head size), a full-attention layer every
	 * attn_interval-th, `nextn` MTP blocks after the stack, partial interleaved M-RoPE */
	int ds = o->ssm_state ? o->ssm_state : hd,
	    nk = o->ssm_k_heads ? o->ssm_k_heads : MAX(o->heads / 2, 1);
	int nv = o->ssm_v_heads ? o->ssm_v_heads : 2 * nk, kc = o->ssm_conv ? o->ssm_conv : 4;
	int every = o->attn_interval ? o->attn_interval : 4, mtp = q35 || glm ? o->nextn : 0;
	int rdim = o->rope_dim ? o->rope_dim : MAX(hd / 4 / 2 * 2, 2);
	int64_t KDn = (int64_t)nk * ds, VDn = (int64_t)nv * ds, CONV = 2 * KDn + VDn;
	if (q35 && (ds <= 0 || nk <= 0 || nv % nk || kc < 1 || kc > 64 || every < 1 || mtp < 0 ||
		    rdim % 2 || rdim > hd || VDn % be || nv / nk > 16))
		return sh_fail(
		    err, errlen, SH_EINVAL,
		    "inconsistent DeltaNet shape (ssm-state a multiple of %d, ssm-v-heads a "
		    "multiple of ssm-k-heads, rope-dim even and <= head_dim)",
		    be);

	int L = o->layers, n_t = 0, cap = 3 + (L + mtp) * 24;
	tspec_t *ts = calloc((size_t)cap, sizeof *ts);
	vocab_t v;
	memset(&v, 0, sizeof v);
	gguf_writer_t *w = gw_new();
	float *row = NULL, *kvb = NULL;
	uint8_t *qrow = NULL;
	int rc = SH_ENOMEM;
	int vrc = gemma ? vocab_build_spm(&v, o->vocab)
			: vocab_build(&v, o->vocab, spec, n_spec, n_control);
	if (!ts || !w || vrc || (glm && (mtp < 0 || mtp > 4))) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto out;
	}
	int64_t D = o->dim, QD = (int64_t)o->heads * hd, KD = (int64_t)o->kv_heads * hd, F = o->ffn;
	int64_t H = o->heads, VD = H * dv;
#define T(nm, r, c, ty, sc, nrm)                                                                   \
	do {                                                                                       \
		tspec_t *t_ = &ts[n_t++];                                                          \
		snprintf(t_->name, sizeof t_->name, "%s", nm);                                     \
		t_->rows = (r), t_->cols = (c), t_->type = (ty), t_->scale = (sc),                 \
		t_->is_norm = (nrm);                                                               \
	} while (0)
#define T3(nm, r, c, p, ty, sc, k)                                                                 \
	do {                                                                                       \
		T(nm, r, c, ty, sc, 0);                                                            \
		ts[n_t - 1].planes = (p), ts[n_t - 1].kind = (k);                                  \
	} while (0)
#define TE(nm, e, r, c, ty, sc) /* e experts of [r x c], generated as e * r rows */                \
	do {                                                                                       \
		T(nm, (int64_t)(e) * (r), c, ty, sc, 0);                                           \
		ts[n_t - 1].ne2 = (e);                                                             \
	} while (0)
	char nm[64];
	/* gemma3 ties the head to the embedding (no output.weight, as its converter writes it):
	 * the embedding then has the head's scale */
	T("token_embd.weight", o->vocab, D, wtype, gemma ? 5.0f / sqrtf((float)D) : 1.0f, 0);
	for (int l = 0; l < L + mtp; l++) {
		float sd = 1.0f / sqrtf((float)D), sq = 1.0f / sqrtf((float)QD),
		      sf = 1.0f / sqrtf((float)F);
#define BLK(s) (snprintf(nm, sizeof nm, "blk.%d.%s", l, s), nm)
		T(BLK("attn_norm.weight"), 0, D, QT_F32, 0.1f, 1);
		if (q35) { /* as llama_model_qwen35(moe)::load_arch_tensors */
			T(BLK("post_attention_norm.weight"), 0, D, QT_F32, 0.1f, 1);
			if ((l + 1) % every && l < L) { /* Gated DeltaNet */
				T(BLK("attn_qkv.weight"), CONV, D, o->type, 1.7f * sd, 0);
				T(BLK("attn_gate.weight"), VDn, D, o->type, 1.7f * sd, 0);
				T(BLK("ssm_conv1d.weight"), CONV, kc, QT_F32, 0.6f, 0);
				T(BLK("ssm_dt.bias"), 0, nv, QT_F32, 0.5f, 0);
				T(BLK("ssm_a"), 0, nv, QT_F32, 0.5f, 0);
				ts[n_t - 1].kind =
				    TS_NEG; /* -exp(A_log), as the converter stores it */
				T(BLK("ssm_beta.weight"), nv, D, o->type, 1.7f * sd, 0);
				T(BLK("ssm_alpha.weight"), nv, D, o->type, 1.7f * sd, 0);
				T(BLK("ssm_norm.weight"), 0, ds, QT_F32, 0.1f, 1);
				T(BLK("ssm_out.weight"), D, VDn, o->type, 0.8f / sqrtf((float)VDn),
				  0);
			} else { /* gated full attention: [query | gate] rows per head */
				T(BLK("attn_q.weight"), 2 * QD, D, o->type, 1.7f * sd, 0);
				T(BLK("attn_k.weight"), KD, D, o->type, 1.7f * sd, 0);
				T(BLK("attn_v.weight"), KD, D, o->type, 1.7f * sd, 0);
				T(BLK("attn_output.weight"), D, QD, o->type, 0.8f * sq, 0);
				T(BLK("attn_q_norm.weight"), 0, hd, QT_F32, 0.1f, 1);
				T(BLK("attn_k_norm.weight"), 0, hd, QT_F32, 0.1f, 1);
			}
			if (l >= L) { /* the MTP block's own tensors (not read by shoal) */
				T(BLK("nextn.eh_proj.weight"), D, 2 * D, o->type, sd, 0);
				T(BLK("nextn.enorm.weight"), 0, D, QT_F32, 0.1f, 1);
				T(BLK("nextn.hnorm.weight"), 0, D, QT_F32, 0.1f, 1);
				T(BLK("nextn.shared_head_norm.weight"), 0, D, QT_F32, 0.1f, 1);
			}
			goto ffn;
		}
		if (ds2) { /* latent attention, as llama_model_deepseek2::load_arch_tensors */
			float skv = 1.7f / sqrtf((float)kvl);
			if (ql) {
				T(BLK("attn_q_a.weight"), ql, D, o->type, 1.7f * sd, 0);
				T(BLK("attn_q_a_norm.weight"), 0, ql, QT_F32, 0.1f, 1);
				T(BLK("attn_q_b.weight"), QD, ql, o->type, 1.7f / sqrtf((float)ql),
				  0);
			} else {
				T(BLK("attn_q.weight"), QD, D, o->type, 1.7f * sd, 0);
			}
			T(BLK("attn_kv_a_mqa.weight"), kvl + rd, D, o->type, 1.7f * sd, 0);
			T(BLK("attn_kv_a_norm.weight"), 0, kvl, QT_F32, 0.1f, 1);
			if (legacy) {
				T(BLK("attn_kv_b.weight"), H * (nope + dv), kvl, o->type, skv, 0);
			} else { /* kv_b's values, split per head and k_b transposed */
				T3(BLK("attn_k_b.weight"), kvl, nope, H,
				   fallback_type(o->type, nope), skv, TS_KB);
				T3(BLK("attn_v_b.weight"), dv, kvl, H, o->type, skv, TS_VB);
			}
			T(BLK("attn_output.weight"), D, VD, o->type, 0.8f / sqrtf((float)VD), 0);
			goto ffn;
		}
		T(BLK("attn_q.weight"), QD, D, wtype, 1.7f * sd, 0);
		T(BLK("attn_k.weight"), KD, D, wtype, 1.7f * sd, 0);
		T(BLK("attn_v.weight"), KD, D, wtype, 1.7f * sd, 0);
		if (qwen2 || glm || goss) {
			T(BLK("attn_q.bias"), 0, QD, QT_F32, 0.1f, 0);
			T(BLK("attn_k.bias"), 0, KD, QT_F32, 0.1f, 0);
			T(BLK("attn_v.bias"), 0, KD, QT_F32, 0.1f, 0);
		}
		if (qwen3 || gemma || (glm && o->qk_norm)) {
			T(BLK("attn_q_norm.weight"), 0, hd, QT_F32, 0.1f, 1);
			T(BLK("attn_k_norm.weight"), 0, hd, QT_F32, 0.1f, 1);
		}
		T(BLK("attn_output.weight"), D, QD, wtype, 0.8f * sq, 0);
		if (gemma) /* the attention output's own norm (gemma3) */
			T(BLK("post_attention_norm.weight"), 0, D, QT_F32, 1.0f, 10);
		if (goss) { /* output bias, one sink logit per head */
			T(BLK("attn_output.bias"), 0, D, QT_F32, 0.1f, 0);
			T(BLK("attn_sinks.weight"), 0, H, QT_F32, 2.0f, 0);
		}
	ffn:
		if (!q35) /* qwen35: its post_attention_norm; glm4moe's and gpt-oss's FFN norm has
			   * that name */
			T(BLK(glm || goss ? "post_attention_norm.weight" : "ffn_norm.weight"), 0, D,
			  QT_F32, 0.1f, 1);
		if (moe && l >= lead) { /* router F32, as llama.cpp's converter leaves it */
			float se = 1.0f / sqrtf((float)FE);
			T(BLK("ffn_gate_inp.weight"), E, D, QT_F32, 2.0f * sd, 0);
			TE(BLK("ffn_gate_exps.weight"), E, FE, D, o->type, 1.7f * sd);
			TE(BLK("ffn_up_exps.weight"), E, FE, D, o->type, 1.7f * sd);
			TE(BLK("ffn_down_exps.weight"), E, D, FE, o->type, 0.8f * se);
			if (ds2moe || glm) /* DeepSeek-V3's and GLM's selection bias */
				T(BLK("exp_probs_b.bias"), 0, E, QT_F32, 0.3f, 0);
			if (goss) { /* router and expert biases: [E], [FE, E], [FE, E], [D, E] */
				T(BLK("ffn_gate_inp.bias"), 0, E, QT_F32, 0.5f, 0);
				T(BLK("ffn_gate_exps.bias"), E, FE, QT_F32, 0.3f, 0);
				T(BLK("ffn_up_exps.bias"), E, FE, QT_F32, 0.3f, 0);
				T(BLK("ffn_down_exps.bias"), E, D, QT_F32, 0.1f, 0);
			}
			if (SF && (q2moe || q35moe))
				T(BLK("ffn_gate_inp_shexp.weight"), 0, D, QT_F32, 2.0f * sd, 0);
			if (SF) {
				T(BLK("ffn_gate_shexp.weight"), SF, D, o->type, 1.7f * sd, 0);
				T(BLK("ffn_up_shexp.weight"), SF, D, o->type, 1.7f * sd, 0);
				T(BLK("ffn_down_shexp.weight"), D, SF, o->type,
				  0.8f / sqrtf((float)SF), 0);
			}
		} else {
			T(BLK("ffn_gate.weight"), F, D, o->type, 1.7f * sd, 0);
			T(BLK("ffn_up.weight"), F, D, o->type, 1.7f * sd, 0);
			T(BLK("ffn_down.weight"), D, F, o->type, 0.8f * sf, 0);
		}
		if (gemma)
			T(BLK("post_ffw_norm.weight"), 0, D, QT_F32, 1.0f, 10);
		if (glm &&
		    l >= L) { /* glm4moe's NextN/MTP layer: its own projections (never run) */
			T(BLK("nextn.eh_proj.weight"), D, 2 * D, o->type, sd, 0);
			T(BLK("nextn.enorm.weight"), 0, D, QT_F32, 0.1f, 1);
			T(BLK("nextn.hnorm.weight"), 0, D, QT_F32, 0.1f, 1);
			T(BLK("nextn.shared_head_norm.weight"), 0, D, QT_F32, 0.1f, 1);
		}
#undef BLK
	}
	T("output_norm.weight", 0, D, QT_F32, 0.1f, 1);
	if (!gemma)
		T("output.weight", o->vocab, D, wtype, 5.0f / sqrtf((float)D), 0);
#undef T
#undef T3
#undef TE
	/* per-architecture attention keys (deepseek2: as today's converter, MQA over the latent) */
	uint32_t kv_heads_key = (uint32_t)o->kv_heads, key_len = (uint32_t)hd,
		 val_len = (uint32_t)hd;
	uint32_t rope_n = (uint32_t)(q35 ? rdim : glm ? hd / 2 : hd); /* glm4moe: partial, 0.5 */
	if (ds2) {
		kv_heads_key = legacy ? (uint32_t)H : 1;
		key_len = (uint32_t)(legacy ? nope + rd : kvl + rd);
		val_len = (uint32_t)(legacy ? dv : kvl);
		rope_n = (uint32_t)rd;
	}

	char key[96];
	const char *a = mixtral ? "llama" : o->arch; /* Mixtral is a llama file with experts */
#define K(s) (snprintf(key, sizeof key, "%s.%s", a, s), key)
	int krc = gw_kv_str(w, "general.architecture", a) |
		  gw_kv_str(w, "general.name", o->name ? o->name : "shoal-generated") |
		  gw_kv_u32(w, "general.alignment", 32) |
		  gw_kv_u32(w, K("context_length"), (uint32_t)(o->ctx ? o->ctx : 2048)) |
		  gw_kv_u32(w, K("embedding_length"), (uint32_t)D) |
		  gw_kv_u32(w, K("block_count"), (uint32_t)(L + mtp)) |
		  gw_kv_u32(w, K("attention.head_count"), (uint32_t)o->heads) |
		  gw_kv_u32(w, K("attention.head_count_kv"), kv_heads_key) |
		  gw_kv_u32(w, K("attention.key_length"), key_len) |
		  gw_kv_u32(w, K("attention.value_length"), val_len) |
		  gw_kv_f32(w, K("attention.layer_norm_rms_epsilon"), goss ? 1e-5f : 1e-6f) |
		  gw_kv_f32(w, K("rope.freq_base"),
			    q35                              ? 10000000.0f
			    : qwen2 || qwen3 || gemma || glm ? 1000000.0f
			    : goss                           ? 150000.0f
							     : 10000.0f);
	if (!gemma) /* Gemma 3's converter writes no rope.dimension_count */
		krc |= gw_kv_u32(w, K("rope.dimension_count"), rope_n);
	/* the tokenizer: SentencePiece for gemma3 (Gemma3Model.set_vocab: scores, BOS, no space
	 * prefix), byte-level BPE for the others (glm4moe: _set_vocab_glm's ids, glm4 pre) */
	const char *bos = glm ? "[gMASK]" : spec[0], *eos = glm ? "<|endoftext|>" : spec[2];
	krc |= gw_kv_str(w, "tokenizer.ggml.model", gemma ? "llama" : "gpt2");
	if (!gemma)
		krc |= gw_kv_str(w, "tokenizer.ggml.pre",
				 q35    ? "qwen35"
				 : glm  ? "glm4"
				 : goss ? "gpt-4o"
					: "gpt-2");
	krc |= gw_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tok, (size_t)v.n) |
	       gw_kv_arr_i32(w, "tokenizer.ggml.token_type", v.type, (size_t)v.n);
	if (gemma)
		krc |= gw_kv_arr_f32(w, "tokenizer.ggml.scores", v.score, (size_t)v.n) |
		       gw_kv_u32(w, "tokenizer.ggml.bos_token_id", 2) |
		       gw_kv_u32(w, "tokenizer.ggml.eos_token_id", 1) |
		       gw_kv_u32(w, "tokenizer.ggml.unknown_token_id", 3) |
		       gw_kv_u32(w, "tokenizer.ggml.padding_token_id", 0) |
		       gw_kv_bool(w, "tokenizer.ggml.add_bos_token", 1) |
		       gw_kv_bool(w, "tokenizer.ggml.add_eos_token", 0) |
		       gw_kv_bool(w, "tokenizer.ggml.add_space_prefix", 0);
	else
		krc |= gw_kv_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v.merges,
				     (size_t)v.n_merges) |
		       gw_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)vocab_find(&v, bos)) |
		       gw_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)vocab_find(&v, eos)) |
		       gw_kv_u32(w, "tokenizer.ggml.padding_token_id",
				 (uint32_t)vocab_find(&v, spec[goss ? 1 : 0]));
	if (glm)
		krc |= gw_kv_u32(w, "tokenizer.ggml.eot_token_id",
				 (uint32_t)vocab_find(&v, "<|user|>")) |
		       gw_kv_u32(w, "tokenizer.ggml.eom_token_id",
				 (uint32_t)vocab_find(&v, "<|observation|>")) |
		       gw_kv_u32(w, "tokenizer.ggml.unknown_token_id",
				 (uint32_t)vocab_find(&v, "<|endoftext|>"));
	else if (!gemma)
		krc |= gw_kv_bool(w, "tokenizer.ggml.add_bos_token", 0);
	krc |= gw_kv_str(w, "tokenizer.chat_template",
			 q35     ? qwen35_tmpl
			 : gemma ? gemma_template
			 : glm   ? glm_template
			 : goss  ? harmony_tmpl
				 : chatml);
	if (gemma)
		krc |= gw_kv_f32(w, K("rope.freq_base_swa"), 10000.0f) |
		       gw_kv_u32(w, K("attention.sliding_window"), (uint32_t)swa);
	if (gemma && o->rope_factor > 0)
		krc |= gw_kv_str(w, K("rope.scaling.type"), "linear") |
		       gw_kv_f32(w, K("rope.scaling.factor"), o->rope_factor);
	if (glm) /* Glm4MoeModel.set_gguf_parameters */
		krc |= gw_kv_u32(w, K("nextn_predict_layers"), (uint32_t)mtp) |
		       gw_kv_u32(w, K("leading_dense_block_count"), (uint32_t)lead) |
		       gw_kv_u32(w, K("expert_shared_count"), (uint32_t)n_sh) |
		       gw_kv_f32(w, K("expert_weights_scale"), 2.5f) |
		       gw_kv_bool(w, K("expert_weights_norm"), 1) |
		       gw_kv_u32(w, K("expert_gating_func"), 2) |
		       gw_kv_u32(w, K("expert_group_count"), 1) |
		       gw_kv_u32(w, K("expert_group_used_count"), 1);
	if (!q35moe) /* qwen35moe's converter writes none when the config has none */
		krc |= gw_kv_u32(w, K("feed_forward_length"), (uint32_t)F);
	if (q35) {
		int half = rdim / 2, s0 = (half * 11 + 16) / 32;
		int32_t sec[4] = {s0, s0, half - 2 * s0, 0}; /* Qwen3.5's [11, 11, 10, 0] scaled */
		if (sec[2] < 0)
			sec[0] = half, sec[1] = sec[2] = 0;
		krc |= gw_kv_arr_i32(w, K("rope.dimension_sections"), sec, 4) |
		       gw_kv_u32(w, K("ssm.conv_kernel"), (uint32_t)kc) |
		       gw_kv_u32(w, K("ssm.state_size"), (uint32_t)ds) |
		       gw_kv_u32(w, K("ssm.group_count"), (uint32_t)nk) |
		       gw_kv_u32(w, K("ssm.time_step_rank"), (uint32_t)nv) |
		       gw_kv_u32(w, K("ssm.inner_size"), (uint32_t)VDn) |
		       gw_kv_u32(w, K("full_attention_interval"), (uint32_t)every);
		if (mtp)
			krc |= gw_kv_u32(w, K("nextn_predict_layers"), (uint32_t)mtp);
	}
	if (goss) /* the converter's keys: sliding window, YaRN as gpt-oss's config has it */
		krc |= gw_kv_u32(w, K("attention.sliding_window"),
				 (uint32_t)(o->swa_window ? o->swa_window : 128)) |
		       gw_kv_str(w, K("rope.scaling.type"), "yarn") |
		       gw_kv_f32(w, K("rope.scaling.factor"),
				 o->rope_factor > 0 ? o->rope_factor : 32.0f) |
		       gw_kv_u32(w, K("rope.scaling.original_context_length"),
				 (uint32_t)(o->rope_orig_ctx ? o->rope_orig_ctx : 4096)) |
		       gw_kv_f32(w, K("rope.scaling.yarn_beta_fast"), 32.0f) |
		       gw_kv_f32(w, K("rope.scaling.yarn_beta_slow"), 1.0f);
	if (ds2) {
		krc |= gw_kv_u32(w, K("attention.kv_lora_rank"), (uint32_t)kvl) |
		       gw_kv_u32(w, K("leading_dense_block_count"), (uint32_t)(ds2moe ? lead : L)) |
		       /* llama.cpp requires these two even when every layer is dense */
		       gw_kv_u32(w, K("expert_feed_forward_length"), (uint32_t)(ds2moe ? FE : F)) |
		       gw_kv_u32(w, K("expert_shared_count"), (uint32_t)n_sh);
		if (ql)
			krc |= gw_kv_u32(w, K("attention.q_lora_rank"), (uint32_t)ql);
		if (!legacy)
			krc |= gw_kv_u32(w, K("attention.key_length_mla"), (uint32_t)(nope + rd)) |
			       gw_kv_u32(w, K("attention.value_length_mla"), (uint32_t)dv);
		if (o->rope_factor > 0)
			krc |= gw_kv_str(w, K("rope.scaling.type"), "yarn") |
			       gw_kv_f32(w, K("rope.scaling.factor"), o->rope_factor) |
			       gw_kv_u32(w, K("rope.scaling.original_context_length"),
					 (uint32_t)(o->rope_orig_ctx ? o->rope_orig_ctx
								     : (o->ctx ? o->ctx : 2048))) |
			       gw_kv_f32(w, K("rope.scaling.yarn_log_multiplier"), o->yarn_log_mul);
	}
	const char *pool = o->pooling ? o->pooling : !strcmp(o->arch, "qwen3") ? "last" : "none";
	int pool_type = !strcmp(pool, "mean")   ? 1
			: !strcmp(pool, "cls")  ? 2
			: !strcmp(pool, "last") ? 3
						: 0;
	if (pool_type) /* llama.cpp's LLM_KV_POOLING_TYPE, a u32 */
		krc |= gw_kv_u32(w, K("pooling_type"), (uint32_t)pool_type);
	if (o->add_eos)
		krc |= gw_kv_bool(w, "tokenizer.ggml.add_eos_token", 1);
	if (moe)
		krc |= gw_kv_u32(w, K("expert_count"), (uint32_t)E) |
		       gw_kv_u32(w, K("expert_used_count"), (uint32_t)K);
	if (moe && !mixtral && !ds2)
		krc |= gw_kv_u32(w, K("expert_feed_forward_length"), (uint32_t)FE);
	if (SF && (q2moe || q35moe))
		krc |= gw_kv_u32(w, K("expert_shared_feed_forward_length"), (uint32_t)SF);
	if (ds2moe)
		krc |= gw_kv_f32(w, K("expert_weights_scale"), 2.5f) |
		       gw_kv_bool(w, K("expert_weights_norm"), 1) |
		       gw_kv_u32(w, K("expert_gating_func"), 2); /* DeepSeek-V3: sigmoid + bias */
	if (ds2moe && o->expert_groups > 1)
		krc |= gw_kv_u32(w, K("expert_group_count"), (uint32_t)o->expert_groups) |
		       gw_kv_u32(w, K("expert_group_used_count"), (uint32_t)o->expert_groups_used);
#undef K
	for (int i = 0; i < n_t && !krc; i++) {
		int64_t ne[3] = {ts[i].cols, ts[i].rows, ts[i].planes};
		if (ts[i].ne2)
			ne[1] = ts[i].rows / ts[i].ne2, ne[2] = ts[i].ne2;
		krc |= gw_tensor(w, ts[i].name,
				 ts[i].ne2 || ts[i].planes ? 3
				 : ts[i].rows              ? 2
							   : 1,
				 ne, ts[i].type);
	}
	if (krc) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = gw_begin(w, path, err, errlen)))
		goto out;
	if (o->header_only) { /* shapes for the planner: no weights drawn */
		if (!(rc = gw_skip_data(w, err, errlen)))
			rc = gw_finish(w, err, errlen);
		goto out;
	}
	int64_t maxc = MAX(MAX(MAX(D, F), 2 * QD), MAX(MAX(kvl, ql), VD));
	maxc = MAX(maxc, MAX(MAX(FE, SF), MAX(2 * D, VDn)));
	row = malloc((size_t)maxc * sizeof *row);
	qrow = malloc((size_t)maxc * 4);
	if (ds2 && !legacy) /* one layer's kv_b: [H * (nope + dv)][kvl] */
		kvb = malloc((size_t)H * (nope + dv) * kvl * sizeof *kvb);
	if (!row || !qrow || (ds2 && !legacy && !kvb)) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto out;
	}
	uint64_t s = o->seed * 0x2545f4914f6cdd1dull + 1;
	int n_real = gemma ? v.n : vocab_find(&v, spec[n_spec - 1]) + 1;
	for (int i = 0; i < n_t; i++) {
		const tspec_t *t = &ts[i];
		int64_t rows = t->rows ? t->rows : 1;
		if (t->kind == TS_KB) { /* draw kv_b as the legacy form would, write W_kb,h^T */
			for (int64_t e = 0; e < H * (nope + dv) * kvl; e++)
				kvb[e] = t->scale * rng_uniform(&s);
			for (int64_t h = 0; h < H; h++)
				for (int c = 0; c < kvl; c++) {
					for (int j = 0; j < nope; j++)
						row[j] = kvb[((h * (nope + dv)) + j) * kvl + c];
					if ((rc = emit_row(w, t, row, qrow, err, errlen)))
						goto out;
				}
			continue;
		}
		if (t->kind == TS_VB) { /* W_vb,h: kv_b's v rows of each head */
			for (int64_t h = 0; h < H; h++)
				for (int i2 = 0; i2 < dv; i2++)
					if ((rc = emit_row(
						 w, t, kvb + (h * (nope + dv) + nope + i2) * kvl,
						 qrow, err, errlen)))
						goto out;
			continue;
		}
		int head = !strcmp(t->name, gemma ? "token_embd.weight" : "output.weight");
		for (int64_t r = 0; r < rows; r++) {
			/* filler tokens, non-ASCII bytes and control bytes get small head rows:
			 * generated text favours real words and stays valid UTF-8 */
			/* (SentencePiece: the byte and unused tokens) */
			int rare =
			    gemma ? v.type[r] == 6 || v.type[r] == 5
				  : r >= n_real || (r < 256 && (r >= 127 || (r < 32 && r != 10)));
			float sc = head && rare ? 0.1f * t->scale : t->scale;
			for (int64_t c = 0; c < t->cols; c++)
				row[c] = (float)t->is_norm + sc * rng_uniform(&s);
			for (int64_t c = 0; t->kind == TS_NEG && c < t->cols; c++)
				row[c] = -expf(row[c]); /* qwen35's A = -exp(A_log) */
			if ((rc = emit_row(w, t, row, qrow, err, errlen)))
				goto out;
		}
	}
	rc = gw_finish(w, err, errlen);
out:
	free(kvb);
	free(row);
	free(qrow);
	free(ts);
	vocab_free(&v);
	gw_free(w);
	return rc;
}
