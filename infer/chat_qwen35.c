/*
 * chat_qwen35.c: the "qwen3.5" chat family, rendered as Qwen3.5's Jinja template does (the
 * template Qwen publishes with the models; llama.cpp keeps a copy as
 * models/templates/Qwen3.5-4B.jinja and parses replies to it with
 * common/chat.cpp common_chat_params_init_qwen3_coder):
 *   tools     a system turn "# Tools ... <tools>" with one JSON line per tool (tojson), the
 *             calling instructions, then the system message's trimmed text after a blank line;
 *   system    otherwise its own turn, trimmed;
 *   user      trimmed, in its turn;
 *   assistant its reasoning (the text inside <think>...</think> at its start) is kept only
 *             for turns after the last real user query, as "<think>\n...\n</think>\n\n"; calls
 *             follow the text as <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n
 *             </parameter>\n...</function>\n</tool_call> (VALUE: objects and arrays as JSON,
 *             strings as they are, other scalars as Python's str() writes them);
 *   tool      results in a user turn, each "\n<tool_response>\n...\n</tool_response>";
 *   prompt    "<|im_start|>assistant\n<think>\n" (thinking on, the template's default).
 * JSON is written with ", " and ": " separators, key order kept, UTF-8 unescaped (the
 * template's tojson, as jansson's default output).
 *
 * Invariant: reads only its arguments; a conversation the template would refuse (no user
 * query, a system message after the first) is SH_EINVAL with its message.
 */
#include "infer/chat.h"

#include "common/common.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char TOOLS_HEAD[] =
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
static const char TOOLS_TAIL[] =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- "
    "Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is "
    "no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>";

/* s[0..n) without leading and trailing whitespace (Python's strip). */
static void strip(const char **s, size_t *n)
{
	while (*n && isspace((unsigned char)**s))
		(*s)++, (*n)--;
	while (*n && isspace((unsigned char)(*s)[*n - 1]))
		(*n)--;
}

static int role_is(const eng_msg_t *m, const char *r)
{
	return m->role && !strcmp(m->role, r);
}

/* A user message that only carries tool results (the template does not count it as a query). */
static int tool_response_only(const char *c)
{
	size_t n = strlen(c);
	strip(&c, &n);
	return n >= 31 && !memcmp(c, "<tool_response>", 15) &&
	       !memcmp(c + n - 16, "</tool_response>", 16);
}

static void put_json(FILE *f, json_t *v)
{
	char *s = json_dumps(v, JSON_ENCODE_ANY);
	if (s)
		fputs(s, f);
	free(s);
}

/* One parameter's value: "| tojson" for objects and arrays, "| string" for the rest. */
static void put_value(FILE *f, json_t *v)
{
	if (json_is_string(v))
		fputs(json_string_value(v), f);
	else if (json_is_true(v) || json_is_false(v))
		fputs(json_is_true(v) ? "True" : "False", f);
	else if (json_is_null(v))
		fputs("None", f);
	else
		put_json(f, v);
}

/* The assistant turn i: its reasoning and text split as the template does, then its calls. */
static void put_assistant(FILE *f, const eng_msg_t *m, int keep_reasoning)
{
	const char *c = m->content;
	size_t n = strlen(c);
	strip(&c, &n);
	const char *r = "", *end = NULL;
	size_t rn = 0;
	for (size_t i = 0; i + 8 <= n && !end; i++)
		if (!memcmp(c + i, "</think>", 8))
			end = c + i;
	if (end) { /* reasoning = before </think>, after the last <think>; text after it */
		r = c, rn = (size_t)(end - c);
		for (size_t i = rn; i >= 7; i--)
			if (!memcmp(c + i - 7, "<think>", 7)) {
				r = c + i, rn -= i;
				break;
			}
		const char *after = end + 8;
		/* the last </think> ends it: content.split('</think>')[-1] */
		for (const char *p = after; p + 8 <= c + n; p++)
			if (!memcmp(p, "</think>", 8))
				after = p + 8;
		n -= (size_t)(after - c);
		c = after;
		while (n && *c == '\n')
			c++, n--;
		strip(&r, &rn);
	}
	fputs("<|im_start|>assistant\n", f);
	if (keep_reasoning) {
		fputs("<think>\n", f);
		fwrite(r, 1, rn, f);
		fputs("\n</think>\n\n", f);
	}
	fwrite(c, 1, n, f);
	json_t *calls = m->tool_calls ? json_loads(m->tool_calls, 0, NULL) : NULL;
	size_t k;
	json_t *call;
	json_array_foreach(calls, k, call)
	{
		json_t *fn = json_object_get(call, "function");
		if (!fn)
			fn = call;
		size_t tn = n;
		const char *t = c;
		strip(&t, &tn);
		fputs(k    ? "\n<tool_call>\n<function="
		      : tn ? "\n\n<tool_call>\n<function="
			   : "<tool_call>\n<function=",
		      f);
		const char *name = json_string_value(json_object_get(fn, "name"));
		fprintf(f, "%s>\n", name ? name : "");
		json_t *args = json_object_get(fn, "arguments");
		json_t *parsed = json_is_string(args) ? json_loads(json_string_value(args), 0, NULL)
						      : json_incref(args);
		const char *key;
		json_t *v;
		json_object_foreach(parsed, key, v)
		{
			fprintf(f, "<parameter=%s>\n", key);
			put_value(f, v);
			fputs("\n</parameter>\n", f);
		}
		json_decref(parsed);
		fputs("</function>\n</tool_call>", f);
	}
	json_decref(calls);
	fputs("<|im_end|>\n", f);
}

int chat_render_qwen35(const eng_msg_t *m, int n, const char *tools_json, int add, char **out,
		       char *err, size_t errlen)
{
	*out = NULL;
	for (int i = 0; i < n; i++) {
		if (!m[i].role || !m[i].content)
			return sh_fail(err, errlen, SH_EINVAL, "message %d has no role or content",
				       i);
		if (!role_is(&m[i], "system") && !role_is(&m[i], "user") &&
		    !role_is(&m[i], "assistant") && !role_is(&m[i], "tool"))
			return sh_fail(err, errlen, SH_EINVAL,
				       "unknown role '%s' in message %d (system, user, assistant, "
				       "tool)",
				       m[i].role, i);
		if (i && role_is(&m[i], "system"))
			return sh_fail(err, errlen, SH_EINVAL,
				       "System message must be at the beginning.");
	}
	int last_query = -1;
	for (int i = n - 1; i >= 0 && last_query < 0; i--)
		if (role_is(&m[i], "user") && !tool_response_only(m[i].content))
			last_query = i;
	if (last_query < 0)
		return sh_fail(err, errlen, SH_EINVAL, "No user query found in messages.");
	json_t *tools = tools_json ? json_loads(tools_json, 0, NULL) : NULL;
	if (tools_json && !json_is_array(tools)) {
		json_decref(tools);
		return sh_fail(err, errlen, SH_EINVAL, "'tools' must be an array");
	}
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f) {
		json_decref(tools);
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory rendering the chat");
	}
	int sys = n > 0 && role_is(&m[0], "system");
	const char *s = sys ? m[0].content : "";
	size_t sn = strlen(s);
	strip(&s, &sn);
	if (json_array_size(tools)) {
		fputs(TOOLS_HEAD, f);
		size_t k;
		json_t *t;
		json_array_foreach(tools, k, t)
		{
			fputc('\n', f);
			put_json(f, t);
		}
		fputs(TOOLS_TAIL, f);
		if (sn) {
			fputs("\n\n", f);
			fwrite(s, 1, sn, f);
		}
		fputs("<|im_end|>\n", f);
	} else if (sys) {
		fputs("<|im_start|>system\n", f);
		fwrite(s, 1, sn, f);
		fputs("<|im_end|>\n", f);
	}
	for (int i = sys; i < n; i++) {
		const char *c = m[i].content;
		size_t cn = strlen(c);
		strip(&c, &cn);
		if (role_is(&m[i], "user")) {
			fputs("<|im_start|>user\n", f);
			fwrite(c, 1, cn, f);
			fputs("<|im_end|>\n", f);
		} else if (role_is(&m[i], "assistant")) {
			put_assistant(f, &m[i], i > last_query);
		} else { /* tool: results of one step share a user turn */
			if (i > 0 && !role_is(&m[i - 1], "tool"))
				fputs("<|im_start|>user", f);
			fputs("\n<tool_response>\n", f);
			fwrite(c, 1, cn, f);
			fputs("\n</tool_response>", f);
			if (i == n - 1 || !role_is(&m[i + 1], "tool"))
				fputs("<|im_end|>\n", f);
		}
	}
	if (add)
		fputs("<|im_start|>assistant\n<think>\n", f);
	fclose(f);
	json_decref(tools);
	if (!buf)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory rendering the chat");
	*out = buf;
	return 0;
}
