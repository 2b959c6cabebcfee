/*
 * chat.c: recognising and rendering chat template families (see chat.h). Each family's
 * renderer follows the model's own Jinja template for the plain system/user/assistant case, as
 * llama.cpp's llm_chat_apply_template does. Invariant: rendering never fails except on an
 * unknown role or memory exhaustion, and the output is exactly the concatenation described per
 * family below.
 */
#include "infer/chat.h"

#include "common/common.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *const families[] = {
    "chatml",
    "qwen3.5",
    "llama2",
    "llama2-sys",
    "llama2-sys-bos",
    "llama2-sys-strip",
    "mistral-v1",
    "mistral-v3",
    "mistral-v3-tekken",
    "mistral-v7",
    "mistral-v7-tekken",
    "llama3",
    "gemma",
    "phi3",
    "zephyr",
    "deepseek",
    "deepseek2",
    "deepseek3",
    "command-r",
    "openchat",
    "vicuna",
    "vicuna-orca",
    "chatglm4",
    "gpt-oss",
};

const char *chat_family_names(void)
{
	return "chatml, qwen3.5, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, mistral-v1, "
	       "mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken, llama3, gemma, phi3, "
	       "zephyr, deepseek, deepseek2, deepseek3, command-r, openchat, vicuna, vicuna-orca, "
	       "chatglm4, gpt-oss";
}

int chat_family_known(const char *name)
{
	for (size_t i = 0; i < ARRAY_LEN(families); i++)
		if (!strcmp(families[i], name))
			return 1;
	return 0;
}

/* ---- detection ---- */

struct tmpl {
	const char *s;
	size_t n;
};

static int has(const struct tmpl *t, const char *needle)
{
	size_t k = strlen(needle);
	if (k > t->n)
		return 0;
	for (size_t i = 0; i + k <= t->n; i++)
		if (t->s[i] == needle[0] && !memcmp(t->s + i, needle, k))
			return 1;
	return 0;
}

const char *chat_detect(const char *s, size_t n)
{
	struct tmpl t = {s, n};
	if (!s)
		return NULL;
	/* Qwen3.5: ChatML turns, XML tool calls (as llama.cpp's common_chat_templates_apply_jinja
	 * picks its Qwen3-Coder handling), reasoning in <think> */
	if (has(&t, "<|im_start|>") && has(&t, "<tool_call>") && has(&t, "<function=") &&
	    has(&t, "<parameter=") && has(&t, "<think>"))
		return "qwen3.5";
	if (has(&t, "<|im_start|>"))
		return "chatml";
	/* gpt-oss's harmony (llama-chat.cpp: LLM_CHAT_TEMPLATE_OPENAI_MOE) */
	if (has(&t, "<|start|>") && has(&t, "<|channel|>"))
		return "gpt-oss";
	if ((n >= 7 && !memcmp(s, "mistral", 7)) || has(&t, "[INST]")) {
		if (has(&t, "[SYSTEM_PROMPT]"))
			return has(&t, "[SYSTEM_PROMPT] ") ? "mistral-v7" : "mistral-v7-tekken";
		if (has(&t, "' [INST] ' + system_message") || has(&t, "[AVAILABLE_TOOLS]")) {
			if (has(&t, " [INST]"))
				return "mistral-v1";
			if (has(&t, "\"[INST]\""))
				return "mistral-v3-tekken";
			return "mistral-v3";
		}
		if (has(&t, "content.strip()"))
			return "llama2-sys-strip";
		if (has(&t, "bos_token + '[INST]"))
			return "llama2-sys-bos";
		if (has(&t, "<<SYS>>"))
			return "llama2-sys";
		return "llama2";
	}
	if (has(&t, "<|start_header_id|>") && has(&t, "<|end_header_id|>"))
		return "llama3";
	if (has(&t, "<start_of_turn>"))
		return "gemma";
	if (has(&t, "<|assistant|>") && has(&t, "<|end|>"))
		return "phi3";
	if (has(&t, "[gMASK]<sop>")) /* GLM-4, GLM-4.5/4.6/4.7 (llama.cpp: CHATGLM_4) */
		return "chatglm4";
	if (has(&t, "<|user|>") && has(&t, "<|assistant|>"))
		return "zephyr";
	if (has(&t, "### Instruction:") && has(&t, "<|EOT|>"))
		return "deepseek";
	if (has(&t, "'Assistant: ' + message['content'] + eos_token"))
		return "deepseek2";
	if (has(&t, "<｜Assistant｜>") && has(&t, "<｜User｜>"))
		return "deepseek3";
	if (has(&t, "<|START_OF_TURN_TOKEN|>") && has(&t, "<|USER_TOKEN|>"))
		return "command-r";
	if (has(&t, "GPT4 Correct "))
		return "openchat";
	if (has(&t, "USER: ") && has(&t, "ASSISTANT: "))
		return has(&t, "SYSTEM: ") ? "vicuna-orca" : "vicuna";
	return NULL;
}

int chat_pick(const char *override, const char *tmpl, size_t len, const char **family, char *err,
	      size_t errlen)
{
	*family = NULL;
	if (override && *override) {
		for (size_t i = 0; i < ARRAY_LEN(families); i++)
			if (!strcmp(families[i], override)) {
				*family = families[i];
				return 0;
			}
		return sh_fail(err, errlen, SH_EINVAL, "unknown chat template '%s' (known: %s)",
			       override, chat_family_names());
	}
	if (!tmpl) {
		*family = "chatml";
		return 0;
	}
	*family = chat_detect(tmpl, len);
	if (!*family)
		return sh_fail(err, errlen, SH_EUNSUPP,
			       "the model's chat template is not recognised; choose one with "
			       "--chat-template NAME (%s)",
			       chat_family_names());
	return 0;
}

/* ---- rendering ---- */

struct sb {
	char *s;
	size_t n, cap;
	int oom;
};

static void sb_putn(struct sb *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->n + n + 1 > b->cap) {
		size_t cap = (b->n + n + 1) * 2;
		char *p = realloc(b->s, cap);
		if (!p) {
			b->oom = 1;
			return;
		}
		b->s = p;
		b->cap = cap;
	}
	memcpy(b->s + b->n, s, n);
	b->n += n;
	b->s[b->n] = 0;
}

/* Appends each argument in turn (NULL-terminated list). */
static void sb_cat(struct sb *b, ...)
{
	va_list ap;
	va_start(ap, b);
	for (const char *s; (s = va_arg(ap, const char *));)
		sb_putn(b, s, strlen(s));
	va_end(ap);
}

/* Appends s[0..n) with surrounding whitespace removed (Jinja's trim / Python's strip). */
static void sb_strip(struct sb *b, const char *s, size_t n)
{
	while (n && isspace((unsigned char)*s))
		s++, n--;
	while (n && isspace((unsigned char)s[n - 1]))
		n--;
	sb_putn(b, s, n);
}

static void sb_trim(struct sb *b, const char *s)
{
	sb_strip(b, s, strlen(s));
}

enum role { R_SYSTEM, R_USER, R_ASSISTANT };

static int role_of(const char *r)
{
	if (!r)
		return -1;
	if (!strcmp(r, "system"))
		return R_SYSTEM;
	if (!strcmp(r, "user"))
		return R_USER;
	if (!strcmp(r, "assistant"))
		return R_ASSISTANT;
	return -1;
}

static void render_llama2(struct sb *b, const char *f, const eng_msg_t *m, int n)
{
	int sys = strcmp(f, "llama2") != 0;
	int bos_inside = !strcmp(f, "llama2-sys-bos");
	int strip = !strcmp(f, "llama2-sys-strip");
	int inside = 1;
	sb_cat(b, "[INST] ", NULL);
	for (int i = 0; i < n; i++) {
		int r = role_of(m[i].role);
		if (!inside) {
			inside = 1;
			sb_cat(b, bos_inside ? "<s>[INST] " : "[INST] ", NULL);
		}
		if (r == R_SYSTEM)
			sb_cat(b, sys ? "<<SYS>>\n" : "", NULL);
		if (strip)
			sb_trim(b, m[i].content);
		else
			sb_cat(b, m[i].content, NULL);
		if (r == R_SYSTEM) {
			sb_cat(b, sys ? "\n<</SYS>>\n\n" : "\n", NULL);
		} else if (r == R_USER) {
			sb_cat(b, " [/INST]", NULL);
		} else {
			sb_cat(b, "</s>", NULL);
			inside = 0;
		}
	}
}

static void render_mistral(struct sb *b, const char *f, const eng_msg_t *m, int n)
{
	const char *lead = !strcmp(f, "mistral-v1") ? " " : "";
	const char *trail = !strcmp(f, "mistral-v3-tekken") ? "" : " ";
	int trim_asst = !strcmp(f, "mistral-v3");
	int inside = 0;
	for (int i = 0; i < n; i++) {
		int r = role_of(m[i].role);
		if (!inside) {
			sb_cat(b, lead, "[INST]", trail, NULL);
			inside = 1;
		}
		if (r == R_SYSTEM) {
			sb_cat(b, m[i].content, "\n\n", NULL);
		} else if (r == R_USER) {
			sb_cat(b, m[i].content, lead, "[/INST]", NULL);
		} else {
			sb_cat(b, trail, NULL);
			if (trim_asst)
				sb_trim(b, m[i].content);
			else
				sb_cat(b, m[i].content, NULL);
			sb_cat(b, "</s>", NULL);
			inside = 0;
		}
	}
}

static void render_mistral_v7(struct sb *b, const char *f, const eng_msg_t *m, int n)
{
	const char *sp = !strcmp(f, "mistral-v7") ? " " : "";
	for (int i = 0; i < n; i++) {
		int r = role_of(m[i].role);
		if (r == R_SYSTEM)
			sb_cat(b, "[SYSTEM_PROMPT]", sp, m[i].content, "[/SYSTEM_PROMPT]", NULL);
		else if (r == R_USER)
			sb_cat(b, "[INST]", sp, m[i].content, "[/INST]", NULL);
		else
			sb_cat(b, sp, m[i].content, "</s>", NULL);
	}
}

/* GLM-4.5/4.6's template (llama.cpp models/templates/GLM-4.6.jinja, rendered with trim_blocks
 * and lstrip_blocks as Hugging Face does): "[gMASK]<sop>", then "<|system|>\n" / "<|user|>\n" +
 * text, an assistant turn as "<|assistant|>\n<think>R</think>" (R: the reasoning of a turn after
 * the last user message, else empty) + "\n" + its answer stripped, and the reply opens with
 * "<|assistant|>" (the model writes its own "\n<think>"). llama.cpp's built-in CHATGLM_4 differs:
 * "<|assistant|>\n" and no think block; this follows the model's own template. */
static void render_glm4(struct sb *b, const eng_msg_t *m, int n, int add)
{
	int last_user = -1;
	for (int i = 0; i < n; i++)
		if (role_of(m[i].role) == R_USER)
			last_user = i;
	sb_cat(b, "[gMASK]<sop>", NULL);
	for (int i = 0; i < n; i++) {
		int r = role_of(m[i].role);
		if (r == R_ASSISTANT) {
			sb_cat(b, "<|assistant|>", NULL);
			const char *c = m[i].content, *end = strstr(c, "</think>");
			const char *rs = "", *re = rs;
			if (end) { /* reasoning: between the last <think> before </think> and it */
				rs = c;
				for (const char *q = c; (q = strstr(q, "<think>")) && q < end; q++)
					rs = q + 7;
				re = end;
				while (re > rs && re[-1] == '\n')
					re--;
				while (rs < re && *rs == '\n')
					rs++;
				for (const char *q = end; (q = strstr(q, "</think>")); q += 8)
					c = q + 8;
				while (*c == '\n')
					c++;
			}
			struct sb tmp = {0};
			sb_strip(&tmp, rs, (size_t)(re - rs));
			if (i > last_user && tmp.n)
				sb_cat(b, "\n<think>", tmp.s, "</think>", NULL);
			else
				sb_cat(b, "\n<think></think>", NULL);
			free(tmp.s);
			struct sb ans = {0};
			sb_strip(&ans, c, strlen(c));
			if (ans.n)
				sb_cat(b, "\n", ans.s, NULL);
			free(ans.s);
		} else {
			sb_cat(b, r == R_SYSTEM ? "<|system|>\n" : "<|user|>\n", m[i].content,
			       NULL);
		}
	}
	if (add)
		sb_cat(b, "<|assistant|>", NULL);
}

static void render_gemma(struct sb *b, const eng_msg_t *m, int n, int add)
{
	/* Gemma has no system role: the system text opens the first user turn */
	struct sb sys = {0};
	for (int i = 0; i < n; i++) {
		int r = role_of(m[i].role);
		if (r == R_SYSTEM) {
			sb_trim(&sys, m[i].content);
			continue;
		}
		sb_cat(b, "<start_of_turn>", r == R_ASSISTANT ? "model" : "user", "\n", NULL);
		if (sys.n && r != R_ASSISTANT) {
			sb_cat(b, sys.s, "\n\n", NULL);
			sys.n = 0;
		}
		sb_trim(b, m[i].content);
		sb_cat(b, "<end_of_turn>\n", NULL);
	}
	if (sys.oom)
		b->oom = 1;
	free(sys.s);
	if (add)
		sb_cat(b, "<start_of_turn>model\n", NULL);
}

int chat_render(const char *f, const eng_msg_t *m, int n, int add, const char *eos, char **out,
		char *err, size_t errlen)
{
	*out = NULL;
	if (!f || !chat_family_known(f))
		return sh_fail(err, errlen, SH_EINVAL, "unknown chat template '%s' (known: %s)",
			       f ? f : "(none)", chat_family_names());
	for (int i = 0; i < n; i++) {
		if (role_of(m[i].role) < 0)
			return sh_fail(err, errlen, SH_EINVAL,
				       "unknown role '%s' in message %d (system, user, assistant)",
				       m[i].role ? m[i].role : "(null)", i);
		if (!m[i].content)
			return sh_fail(err, errlen, SH_EINVAL, "message %d has no content", i);
	}
	if (!strcmp(f, "qwen3.5")) /* its own file: tool turns, reasoning */
		return chat_render_qwen35(m, n, NULL, add, out, err, errlen);
	if (!strcmp(f, "gpt-oss")) /* chat_harmony.c: gpt-oss's own template */
		return chat_render_harmony(m, n, NULL, add, out, err, errlen);
	if (!eos)
		eos = "</s>";
	struct sb b = {0};
	sb_putn(&b, "", 0);
	if (!strcmp(f, "chatml")) {
		for (int i = 0; i < n; i++)
			sb_cat(&b, "<|im_start|>", m[i].role, "\n", m[i].content, "<|im_end|>\n",
			       NULL);
		if (add)
			sb_cat(&b, "<|im_start|>assistant\n", NULL);
	} else if (!strncmp(f, "llama2", 6)) {
		render_llama2(&b, f, m, n);
	} else if (!strcmp(f, "mistral-v7") || !strcmp(f, "mistral-v7-tekken")) {
		render_mistral_v7(&b, f, m, n);
	} else if (!strncmp(f, "mistral", 7)) {
		render_mistral(&b, f, m, n);
	} else if (!strcmp(f, "llama3")) {
		for (int i = 0; i < n; i++) {
			sb_cat(&b, "<|start_header_id|>", m[i].role, "<|end_header_id|>\n\n", NULL);
			sb_trim(&b, m[i].content);
			sb_cat(&b, "<|eot_id|>", NULL);
		}
		if (add)
			sb_cat(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n", NULL);
	} else if (!strcmp(f, "gemma")) {
		render_gemma(&b, m, n, add);
	} else if (!strcmp(f, "chatglm4")) {
		render_glm4(&b, m, n, add);
	} else if (!strcmp(f, "phi3")) {
		for (int i = 0; i < n; i++)
			sb_cat(&b, "<|", m[i].role, "|>\n", m[i].content, "<|end|>\n", NULL);
		if (add)
			sb_cat(&b, "<|assistant|>\n", NULL);
	} else if (!strcmp(f, "zephyr")) {
		for (int i = 0; i < n; i++)
			sb_cat(&b, "<|", m[i].role, "|>\n", m[i].content, eos, "\n", NULL);
		if (add)
			sb_cat(&b, "<|assistant|>\n", NULL);
	} else if (!strcmp(f, "deepseek")) {
		for (int i = 0; i < n; i++) {
			int r = role_of(m[i].role);
			if (r == R_SYSTEM)
				sb_cat(&b, m[i].content, NULL);
			else if (r == R_USER)
				sb_cat(&b, "### Instruction:\n", m[i].content, "\n", NULL);
			else
				sb_cat(&b, "### Response:\n", m[i].content, "\n<|EOT|>\n", NULL);
		}
		if (add)
			sb_cat(&b, "### Response:\n", NULL);
	} else if (!strcmp(f, "deepseek2")) {
		for (int i = 0; i < n; i++) {
			int r = role_of(m[i].role);
			if (r == R_SYSTEM)
				sb_cat(&b, m[i].content, "\n\n", NULL);
			else if (r == R_USER)
				sb_cat(&b, "User: ", m[i].content, "\n\n", NULL);
			else
				sb_cat(&b, "Assistant: ", m[i].content, "<｜end▁of▁sentence｜>",
				       NULL);
		}
		if (add)
			sb_cat(&b, "Assistant:", NULL);
	} else if (!strcmp(f, "deepseek3")) {
		for (int i = 0; i < n; i++) {
			int r = role_of(m[i].role);
			if (r == R_SYSTEM)
				sb_cat(&b, m[i].content, "\n\n", NULL);
			else if (r == R_USER)
				sb_cat(&b, "<｜User｜>", m[i].content, NULL);
			else
				sb_cat(&b, "<｜Assistant｜>", m[i].content, "<｜end▁of▁sentence｜>",
				       NULL);
		}
		if (add)
			sb_cat(&b, "<｜Assistant｜>", NULL);
	} else if (!strcmp(f, "command-r")) {
		static const char *const tokrole[] = {"<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>",
						      "<|CHATBOT_TOKEN|>"};
		for (int i = 0; i < n; i++) {
			sb_cat(&b, "<|START_OF_TURN_TOKEN|>", tokrole[role_of(m[i].role)], NULL);
			sb_trim(&b, m[i].content);
			sb_cat(&b, "<|END_OF_TURN_TOKEN|>", NULL);
		}
		if (add)
			sb_cat(&b, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", NULL);
	} else if (!strcmp(f, "openchat")) {
		for (int i = 0; i < n; i++) {
			int r = role_of(m[i].role);
			if (r == R_SYSTEM)
				sb_cat(&b, m[i].content, "<|end_of_turn|>", NULL);
			else
				sb_cat(&b, "GPT4 Correct ", r == R_USER ? "User" : "Assistant",
				       ": ", m[i].content, "<|end_of_turn|>", NULL);
		}
		if (add)
			sb_cat(&b, "GPT4 Correct Assistant:", NULL);
	} else { /* vicuna, vicuna-orca */
		int orca = !strcmp(f, "vicuna-orca");
		for (int i = 0; i < n; i++) {
			int r = role_of(m[i].role);
			if (r == R_SYSTEM)
				sb_cat(&b, orca ? "SYSTEM: " : "", m[i].content,
				       orca ? "\n" : "\n\n", NULL);
			else if (r == R_USER)
				sb_cat(&b, "USER: ", m[i].content, "\n", NULL);
			else
				sb_cat(&b, "ASSISTANT: ", m[i].content, "</s>\n", NULL);
		}
		if (add)
			sb_cat(&b, "ASSISTANT:", NULL);
	}
	if (b.oom) {
		free(b.s);
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory rendering the chat");
	}
	*out = b.s;
	return 0;
}
