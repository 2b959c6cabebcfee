/*
 * chat_tools.c: chat prompts with tools (OpenAI's "tools", assistant "tool_calls", role "tool"),
 * rendered the way each family's published Jinja template does (see chat.h for the styles and
 * the sources). Plain conversations without tools go to chat_render unchanged.
 *
 * Sources, read from the templates as llama.cpp keeps them (models/templates/NAME.jinja) and as
 * the model cards publish them:
 *   llama3   meta-llama-Llama-3.2-3B-Instruct.jinja: tools in the first user message
 *            (tools_in_user_message defaults to true), one JSON call {"name", "parameters"},
 *            results as role "ipython"; date_string is the template's fallback "26 Jul 2024"
 *            so that a prompt does not change with the day.
 *   qwen2.5  Qwen2.5-Instruct's template: default system text, <tools> in the system turn,
 *            <tool_call> tags, arguments rendered as an object (tojson), results in a user
 *            turn inside <tool_response> tags.
 *   qwen3    Qwen3's template: no default system text, arguments written as sent when they are
 *            a string; the same tags.
 *   hermes   NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja (llama.cpp's copy): its own
 *            system text with Python-style signatures, the same tags, results in a "tool" turn
 *            (without tools, its history renders in the Qwen 3 layout).
 *   mistral  mistralai-Mistral-Nemo-Instruct-2407.jinja: [AVAILABLE_TOOLS] before the last
 *            user message, [TOOL_CALLS][...] with 9-character ids, [TOOL_RESULTS].
 *   generic  every other family: the Qwen/Hermes tool text is appended to the system message
 *            (one is added when there is none), calls are written into the assistant text
 *            as <tool_call> blocks and results become user messages in <tool_response> tags,
 *            then the family renders the conversation as usual.
 * JSON is written as Python's json.dumps does for these templates' tojson (", " and ": "
 * separators, key order kept, UTF-8 unescaped), which jansson's default output matches.
 *
 * Invariant: rendering reads only its arguments; malformed tool JSON is rendered as text
 * rather than failing (the web layer validates the request before it gets here).
 */
#include "infer/chat.h"

#include "common/common.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char TOOLS_INTRO[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char TOOLS_OUTRO[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

chat_tool_style_t chat_tool_style(const char *family, const char *tmpl, size_t len)
{
	if (!family)
		return CHAT_TOOLS_GENERIC;
	if (!strcmp(family, "chatglm4"))
		return CHAT_TOOLS_GLM4;
	if (!strcmp(family, "llama3"))
		return CHAT_TOOLS_LLAMA3;
	if (!strcmp(family, "mistral-v3-tekken"))
		return CHAT_TOOLS_MISTRAL;
	if (!strcmp(family, "qwen3.5"))
		return CHAT_TOOLS_QWEN35;
	if (!strcmp(family, "gpt-oss"))
		return CHAT_TOOLS_HARMONY;
	if (!strcmp(family, "chatml")) {
		static const char qwen25[] = "You are Qwen, created by Alibaba Cloud";
		static const char hermes[] = "You are a function calling AI model";
		for (size_t i = 0; tmpl && i + sizeof hermes - 1 <= len; i++)
			if (!memcmp(tmpl + i, hermes, sizeof hermes - 1))
				return CHAT_TOOLS_HERMES;
		for (size_t i = 0; tmpl && i + sizeof qwen25 - 1 <= len; i++)
			if (!memcmp(tmpl + i, qwen25, sizeof qwen25 - 1))
				return CHAT_TOOLS_QWEN25;
		return CHAT_TOOLS_QWEN3;
	}
	return CHAT_TOOLS_GENERIC;
}

enum eng_tool_format chat_tool_format(chat_tool_style_t style)
{
	switch (style) {
	case CHAT_TOOLS_LLAMA3: return ENG_TOOLS_LLAMA3;
	case CHAT_TOOLS_MISTRAL: return ENG_TOOLS_MISTRAL;
	case CHAT_TOOLS_QWEN35: return ENG_TOOLS_XML;
	case CHAT_TOOLS_HARMONY: return ENG_TOOLS_HARMONY;
	case CHAT_TOOLS_GLM4: return ENG_TOOLS_GLM4;
	default: return ENG_TOOLS_HERMES;
	}
}

/* Writes v as Python's json.dumps(v, ensure_ascii=False[, indent=4]). */
static void put_json(FILE *f, json_t *v, int indent)
{
	char *s = json_dumps(v, JSON_ENCODE_ANY | (indent ? JSON_INDENT(indent) : 0));
	if (s)
		fputs(s, f);
	free(s);
}

/* Every tool of tools as JSON (indent as put_json), each between before and after. */
static void put_tools(FILE *f, json_t *tools, int indent, const char *before, const char *after)
{
	size_t k;
	json_t *t;
	json_array_foreach(tools, k, t)
	{
		fputs(before, f);
		put_json(f, t, indent);
		fputs(after, f);
	}
}

static void put_trim(FILE *f, const char *s)
{
	size_t n = strlen(s);
	while (n && isspace((unsigned char)*s))
		s++, n--;
	while (n && isspace((unsigned char)s[n - 1]))
		n--;
	fwrite(s, 1, n, f);
}

/* A call's arguments as an object: the string parsed, or kept as a string when it is not JSON. */
static json_t *args_value(json_t *fn)
{
	json_t *a = json_object_get(fn, "arguments");
	if (json_is_string(a)) {
		json_t *p = json_loads(json_string_value(a), JSON_DECODE_ANY, NULL);
		return p ? p : json_incref(a);
	}
	return a ? json_incref(a) : json_object();
}

static const char *str_of(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));
	return s ? s : "";
}

static int is_role(const eng_msg_t *m, const char *r)
{
	return m->role && !strcmp(m->role, r);
}

static json_t *calls_of(const eng_msg_t *m)
{
	if (!m->tool_calls)
		return NULL;
	json_t *c = json_loads(m->tool_calls, 0, NULL);
	if (!json_is_array(c) || json_array_size(c) == 0) {
		json_decref(c);
		return NULL;
	}
	return c;
}

static void render_llama3(FILE *f, const eng_msg_t *m, int n, json_t *tools)
{
	int i = 0;
	const char *sys = "";
	if (n > 0 && is_role(&m[0], "system"))
		sys = m[i++].content;
	fputs("<|start_header_id|>system<|end_header_id|>\n\n", f);
	if (tools)
		fputs("Environment: ipython\n", f);
	fputs("Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n", f);
	put_trim(f, sys);
	fputs("<|eot_id|>", f);
	if (tools && i < n) {
		fputs(
		    "<|start_header_id|>user<|end_header_id|>\n\n"
		    "Given the following functions, please respond with a JSON for a function call "
		    "with its proper arguments that best answers the given prompt.\n\n"
		    "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
		    "argument name and its value}.Do not use variables.\n\n",
		    f);
		put_tools(f, tools, 4, "", "\n\n");
		put_trim(f, m[i++].content);
		fputs("<|eot_id|>", f);
	}
	for (; i < n; i++) {
		json_t *calls = calls_of(&m[i]);
		if (calls) {
			/* the template takes exactly one call; the first is the one it renders */
			json_t *fn = json_object_get(json_array_get(calls, 0), "function");
			json_t *args = args_value(fn);
			fprintf(
			    f,
			    "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"%s\", "
			    "\"parameters\": ",
			    str_of(fn, "name"));
			put_json(f, args, 0);
			fputs("}<|eot_id|>", f);
			json_decref(args);
			json_decref(calls);
		} else if (is_role(&m[i], "tool")) {
			/* a string is iterable to Jinja, so the template writes it through tojson
			 */
			json_t *s = json_string(m[i].content);
			fputs("<|start_header_id|>ipython<|end_header_id|>\n\n", f);
			if (s)
				put_json(f, s, 0);
			else
				fputs(m[i].content, f);
			json_decref(s);
			fputs("<|eot_id|>", f);
		} else {
			fprintf(f, "<|start_header_id|>%s<|end_header_id|>\n\n", m[i].role);
			put_trim(f, m[i].content);
			fputs("<|eot_id|>", f);
		}
	}
	fputs("<|start_header_id|>assistant<|end_header_id|>\n\n", f);
}

static void render_qwen(FILE *f, const eng_msg_t *m, int n, json_t *tools, int qwen3)
{
	int i = 0;
	if (tools) {
		fputs("<|im_start|>system\n", f);
		if (n > 0 && is_role(&m[0], "system"))
			fprintf(f, qwen3 ? "%s\n\n" : "%s", m[i++].content);
		else if (!qwen3)
			fputs(
			    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
			    f);
		fputs(qwen3 ? "" : "\n\n", f);
		fputs(TOOLS_INTRO, f);
		put_tools(f, tools, 0, "\n", "");
		fputs(TOOLS_OUTRO, f);
		fputs("<|im_end|>\n", f);
	} else if (n > 0 && is_role(&m[0], "system")) {
		fprintf(f, "<|im_start|>system\n%s<|im_end|>\n", m[i++].content);
	} else if (!qwen3) {
		fputs(
		    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
		    "assistant.<|im_end|>\n",
		    f);
	}
	int last_query = n - 1; /* Qwen3: the last user message that is not a tool response */
	for (int j = n - 1; j >= 0; j--)
		if (is_role(&m[j], "user")) {
			last_query = j;
			break;
		}
	for (; i < n; i++) {
		json_t *calls = calls_of(&m[i]);
		if (is_role(&m[i], "tool")) {
			if (i == 0 || !is_role(&m[i - 1], "tool"))
				fputs("<|im_start|>user", f);
			fprintf(f, "\n<tool_response>\n%s\n</tool_response>", m[i].content);
			if (i == n - 1 || !is_role(&m[i + 1], "tool"))
				fputs("<|im_end|>\n", f);
		} else if (is_role(&m[i], "assistant") && (calls || qwen3)) {
			const char *c = m[i].content;
			if (qwen3) {
				fputs("<|im_start|>assistant\n", f);
				if (i == n - 1 && i > last_query)
					fputs("<think>\n\n</think>\n\n", f);
				fputs(c, f);
			} else {
				fputs("<|im_start|>assistant", f);
				if (c[0])
					fprintf(f, "\n%s", c);
			}
			size_t k;
			json_t *call;
			json_array_foreach(calls, k, call)
			{
				json_t *fn = json_object_get(call, "function");
				json_t *a = json_object_get(fn, "arguments");
				if (!qwen3 || k > 0 || c[0])
					fputc('\n', f);
				fprintf(f, "<tool_call>\n{\"name\": \"%s\", \"arguments\": ",
					str_of(fn, "name"));
				if (qwen3 && json_is_string(a)) {
					fputs(json_string_value(a), f);
				} else {
					json_t *v = args_value(fn);
					put_json(f, v, 0);
					json_decref(v);
				}
				fputs("}\n</tool_call>", f);
			}
			fputs("<|im_end|>\n", f);
		} else {
			fprintf(f, "<|im_start|>%s\n%s<|im_end|>\n", m[i].role, m[i].content);
		}
		json_decref(calls);
	}
	fputs("<|im_start|>assistant\n", f);
}

static void render_mistral_tools(FILE *f, const eng_msg_t *m, int n, json_t *tools, const char *eos)
{
	int i = 0, last_user = -1;
	const char *sys = NULL;
	if (n > 0 && is_role(&m[0], "system"))
		sys = m[i++].content;
	for (int j = i; j < n; j++)
		if (is_role(&m[j], "user"))
			last_user = j;
	for (; i < n; i++) {
		json_t *calls = calls_of(&m[i]);
		if (is_role(&m[i], "user")) {
			if (tools && i == last_user) {
				fputs("[AVAILABLE_TOOLS][", f);
				size_t k;
				json_t *t;
				json_array_foreach(tools, k, t)
				{
					json_t *fn = json_object_get(t, "function");
					const char *key;
					json_t *val;
					int first = 1;
					fputs("{\"type\": \"function\", \"function\": {", f);
					json_object_foreach(fn, key, val)
					{
						if (!strcmp(key, "return"))
							continue;
						fputs(first ? "" : ", ", f);
						first = 0;
						if (json_is_string(val)) { /* written raw, as the
									      template does */
							fprintf(f, "\"%s\": \"%s\"", key,
								json_string_value(val));
						} else {
							fprintf(f, "\"%s\": ", key);
							put_json(f, val, 0);
						}
					}
					fputs("}}", f);
					fputs(k + 1 < json_array_size(tools) ? ", " : "]", f);
				}
				fputs("[/AVAILABLE_TOOLS]", f);
			}
			if (i == n - 1 && sys)
				fprintf(f, "[INST]%s\n\n%s[/INST]", sys, m[i].content);
			else
				fprintf(f, "[INST]%s[/INST]", m[i].content);
		} else if (calls) {
			fputs("[TOOL_CALLS][", f);
			size_t k;
			json_t *call;
			json_array_foreach(calls, k, call)
			{
				json_t *fn = json_object_get(call, "function");
				json_t *obj = json_pack("{s:s, s:o}", "name", str_of(fn, "name"),
							"arguments", args_value(fn));
				char *s = obj ? json_dumps(obj, 0) : NULL;
				if (s) { /* the template drops the closing brace to add the id */
					fwrite(s, 1, strlen(s) - 1, f);
					free(s);
				}
				json_decref(obj);
				fprintf(f, ", \"id\": \"%s\"}", str_of(call, "id"));
				if (k + 1 < json_array_size(calls))
					fputs(", ", f);
				else
					fprintf(f, "]%s", eos);
			}
		} else if (is_role(&m[i], "assistant")) {
			fprintf(f, "%s%s", m[i].content, eos);
		} else if (is_role(&m[i], "tool")) {
			fprintf(
			    f,
			    "[TOOL_RESULTS]{\"content\": %s, \"call_id\": \"%s\"}[/TOOL_RESULTS]",
			    m[i].content, m[i].tool_call_id ? m[i].tool_call_id : "");
		}
		json_decref(calls);
	}
}

/* Hermes 3's json_to_python_type macro, quirks included: an array is "list[Union[]]" (its
 * items filter yields pairs, which have no type) and a schema without a type is "Union[]". A
 * type the macro does not map (e.g. "null") recurses without end in Jinja; "Any" here. */
static void put_pytype(FILE *f, json_t *spec)
{
	json_t *t = json_object_get(spec, "type");
	const char *ts = json_string_value(t);
	if (ts) {
		if (!strcmp(ts, "string"))
			fputs("str", f);
		else if (!strcmp(ts, "number"))
			fputs("float", f);
		else if (!strcmp(ts, "integer"))
			fputs("int", f);
		else if (!strcmp(ts, "boolean"))
			fputs("bool", f);
		else if (!strcmp(ts, "array"))
			fputs("list[Union[]]", f);
		else if (!strcmp(ts, "object")) {
			json_t *addl = json_object_get(spec, "additionalProperties");
			if (addl) {
				fputs("dict[str, ", f);
				put_pytype(f, addl);
				fputs("]", f);
			} else {
				fputs("dict", f);
			}
		} else
			fputs("Any", f);
		return;
	}
	fputs("Union[", f);
	size_t i;
	json_t *x;
	json_array_foreach(t, i, x)
	{
		json_t *one = json_pack("{s:O}", "type", x);
		if (i)
			fputc(',', f);
		put_pytype(f, one);
		json_decref(one);
	}
	fputs("]", f);
}

/* NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja (Hermes 2 Pro's is the same layout). */
static void render_hermes(FILE *f, const eng_msg_t *m, int n, json_t *tools)
{
	fputs("<|im_start|>system\nYou are a function calling AI model. You are provided with "
	      "function signatures within <tools></tools> XML tags. You may call one or more "
	      "functions to assist with the user query. Don't make assumptions about what values "
	      "to plug into functions. Here are the available tools: <tools> ",
	      f);
	size_t k;
	json_t *t;
	json_array_foreach(tools, k, t)
	{
		json_t *fn = json_object_get(t, "function");
		json_t *params = json_object_get(fn, "parameters");
		json_t *props = json_object_get(params, "properties");
		const char *name = str_of(fn, "name"), *pname;
		json_t *ps;
		int i = 0;
		fprintf(f,
			"{\"type\": \"function\", \"function\": {\"name\": \"%s\", "
			"\"description\": \"%s(",
			name, name);
		json_object_foreach(props, pname, ps)
		{
			fprintf(f, "%s%s: ", i++ ? ", " : "", pname);
			put_pytype(f, ps);
		}
		fprintf(f, ") - %s\n\n", str_of(fn, "description"));
		i = 0;
		json_object_foreach(props, pname, ps)
		{
			fprintf(f, "%s        %s(", i++ ? "" : "    Args:\n", pname);
			put_pytype(f, ps);
			fputs("): ", f);
			put_trim(f, str_of(ps, "description"));
		}
		fputs("\", \"parameters\": ", f);
		if (json_object_size(props) == 0)
			fputs("{}", f);
		else
			put_json(f, params, 0);
		fputs("}", f);
		if (k + 1 < json_array_size(tools))
			fputc('\n', f);
	}
	fputs(" </tools>Use the following pydantic model json schema for each tool call you will "
	      "make: {\"properties\": {\"name\": {\"title\": \"Name\", \"type\": \"string\"}, "
	      "\"arguments\": {\"title\": \"Arguments\", \"type\": \"object\"}}, \"required\": "
	      "[\"name\", \"arguments\"], \"title\": \"FunctionCall\", \"type\": \"object\"}}\n"
	      "For each function call return a json object with function name and arguments "
	      "within <tool_call></tool_call> XML tags as follows:\n<tool_call>\n{\"name\": "
	      "<function-name>, \"arguments\": <args-dict>}\n</tool_call><|im_end|>\n",
	      f);
	for (int i = 0; i < n; i++) {
		json_t *calls = calls_of(&m[i]);
		if (is_role(&m[i], "tool")) {
			/* the template's own spacing: no newline after a tool turn's <|im_end|> */
			if (i > 0 && !is_role(&m[i - 1], "tool"))
				fputs("<|im_start|>tool\n", f);
			fprintf(f, "<tool_response>\n%s\n</tool_response>%s", m[i].content,
				i < n - 1 ? "\n" : "");
			if (i == n - 1 || !is_role(&m[i + 1], "tool"))
				fputs("<|im_end|>", f);
		} else if (calls) {
			fputs("<|im_start|>assistant", f);
			size_t j;
			json_t *call;
			json_array_foreach(calls, j, call)
			{
				json_t *fn = json_object_get(call, "function");
				json_t *a = json_object_get(fn, "arguments");
				fprintf(f, "\n<tool_call>\n{\"name\": \"%s\", \"arguments\": ",
					str_of(fn, "name"));
				if (json_is_string(a))
					fputs(json_string_value(a), f);
				else
					put_json(f, a ? a : json_object(), 0);
				fputs("}\n</tool_call>", f);
			}
			fputs("<|im_end|>\n", f);
		} else {
			fprintf(f, "<|im_start|>%s\n%s<|im_end|>\n", m[i].role, m[i].content);
		}
		json_decref(calls);
	}
	fputs("<|im_start|>assistant\n", f);
}

/* GLM-4.5/4.6 (models/templates/GLM-4.6.jinja, with Hugging Face's trim_blocks and
 * lstrip_blocks): the tools in a system turn, one JSON object per line; a call as
 * "\n<tool_call>NAME\n" + "<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n" per argument (V as
 * written when a string, else JSON) + "</tool_call>"; results after one "<|observation|>" per
 * run of tool messages, each "\n<tool_response>\nTEXT\n</tool_response>". The turns without
 * tools are chat.c's chatglm4 (the same text). */
static void render_glm4(FILE *f, const eng_msg_t *m, int n, json_t *tools)
{
	int last_user = -1;
	for (int i = 0; i < n; i++)
		if (is_role(&m[i], "user"))
			last_user = i;
	fputs("[gMASK]<sop>", f);
	if (tools) {
		fputs(
		    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the "
		    "user query.\n\nYou are provided with function signatures within "
		    "<tools></tools> XML tags:\n<tools>\n",
		    f);
		put_tools(f, tools, 0, "", "\n");
		fputs("</tools>\n\nFor each function call, output the function name and arguments "
		      "within the following XML format:\n<tool_call>{function-name}\n<arg_key>"
		      "{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n<arg_key>"
		      "{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n"
		      "</tool_call>",
		      f);
	}
	for (int i = 0; i < n; i++) {
		if (is_role(&m[i], "tool")) {
			if (i == 0 || !is_role(&m[i - 1], "tool"))
				fputs("<|observation|>", f);
			fprintf(f, "\n<tool_response>\n%s\n</tool_response>", m[i].content);
			continue;
		}
		if (!is_role(&m[i], "assistant")) {
			fprintf(f, "<|%s|>\n%s", is_role(&m[i], "system") ? "system" : "user",
				m[i].content);
			continue;
		}
		/* the plain part as chat.c renders it (the think block, the stripped answer) */
		char *plain = NULL, e[64];
		eng_msg_t one = {.role = "assistant", .content = m[i].content};
		if (!chat_render("chatglm4", &one, 1, 0, NULL, &plain, e, sizeof e)) {
			/* after "[gMASK]<sop>"; a reasoning part is kept after the last user turn
			 */
			const char *p = plain + strlen("[gMASK]<sop>");
			if (i < last_user && strncmp(p, "<|assistant|>\n<think></think>", 29)) {
				const char *c = strstr(p, "</think>");
				fprintf(f, "<|assistant|>\n<think></think>%s", c ? c + 8 : "");
			} else {
				fputs(p, f);
			}
		}
		free(plain);
		json_t *calls = calls_of(&m[i]);
		size_t j;
		json_t *call;
		json_array_foreach(calls, j, call)
		{
			json_t *fn = json_object_get(call, "function");
			json_t *args = args_value(fn);
			fprintf(f, "\n<tool_call>%s\n", str_of(fn, "name"));
			const char *k;
			json_t *v;
			json_object_foreach(args, k, v)
			{
				fprintf(f, "<arg_key>%s</arg_key>\n<arg_value>", k);
				if (json_is_string(v))
					fputs(json_string_value(v), f);
				else
					put_json(f, v, 0);
				fputs("</arg_value>\n", f);
			}
			fputs("</tool_call>", f);
			json_decref(args);
		}
		json_decref(calls);
	}
	fputs("<|assistant|>", f);
}

/* Other families: tools and calls become ordinary text in the family's own turns. */
static int render_generic(const char *family, const eng_msg_t *m, int n, json_t *tools,
			  const char *eos, char **out, char *err, size_t errlen)
{
	eng_msg_t *mm = calloc((size_t)n + 1, sizeof *mm);
	char **owned = calloc((size_t)n + 1, sizeof *owned); /* texts written here */
	int k = 0, i = 0, rc;
	char *buf;
	size_t len;
	FILE *f;
	if (!mm || !owned) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory rendering the chat");
		goto out;
	}
	if (tools && (f = open_memstream(&buf, &len))) {
		if (n > 0 && is_role(&m[0], "system"))
			fprintf(f, "%s\n\n", m[i++].content);
		fputs(TOOLS_INTRO, f);
		put_tools(f, tools, 0, "\n", "");
		fputs(TOOLS_OUTRO, f);
		fclose(f);
		owned[k] = buf;
		mm[k++] = (eng_msg_t){.role = "system", .content = buf};
	}
	for (; i < n; i++) {
		json_t *calls = calls_of(&m[i]);
		if (!is_role(&m[i], "tool") && !calls) {
			mm[k++] = m[i];
			continue;
		}
		if (!(f = open_memstream(&buf, &len))) {
			json_decref(calls);
			continue;
		}
		if (calls) {
			fputs(m[i].content, f);
			size_t j;
			json_t *call;
			json_array_foreach(calls, j, call)
			{
				json_t *fn = json_object_get(call, "function");
				json_t *args = args_value(fn);
				fprintf(f, "%s<tool_call>\n{\"name\": \"%s\", \"arguments\": ",
					m[i].content[0] || j ? "\n" : "", str_of(fn, "name"));
				put_json(f, args, 0);
				fputs("}\n</tool_call>", f);
				json_decref(args);
			}
		} else {
			fprintf(f, "<tool_response>\n%s\n</tool_response>", m[i].content);
		}
		fclose(f);
		owned[k] = buf;
		mm[k++] = (eng_msg_t){.role = calls ? "assistant" : "user", .content = buf};
		json_decref(calls);
	}
	rc = chat_render(family, mm, k, 1, eos, out, err, errlen);
out:
	for (int j = 0; owned && j <= n; j++)
		free(owned[j]);
	free(owned);
	free(mm);
	return rc;
}

int chat_render_tools(const char *family, chat_tool_style_t style, const eng_msg_t *m, int n,
		      const char *tools_json, int open_call, const char *eos, char **out, char *err,
		      size_t errlen)
{
	*out = NULL;
	if (family && !strcmp(family, "qwen3.5")) {
		int rc = chat_render_qwen35(m, n, tools_json, 1, out, err, errlen);
		if (rc || !open_call)
			return rc;
		style = CHAT_TOOLS_HERMES; /* a forced call opens with its tag too (below) */
		goto open;
	}
	if (family && !strcmp(family, "gpt-oss")) /* chat_harmony.c (a forced call: the grammar) */
		return chat_render_harmony(m, n, tools_json, 1, out, err, errlen);
	int any = tools_json != NULL;
	for (int i = 0; i < n && !any; i++)
		any = m[i].tool_calls || is_role(&m[i], "tool");
	if (!any)
		return chat_render(family, m, n, 1, eos, out, err, errlen);
	if (!family || !chat_family_known(family))
		return sh_fail(err, errlen, SH_EINVAL, "unknown chat template '%s'",
			       family ? family : "(none)");
	for (int i = 0; i < n; i++)
		if (!m[i].role || !m[i].content)
			return sh_fail(err, errlen, SH_EINVAL, "message %d has no role or content",
				       i);
	json_t *tools = NULL;
	if (tools_json) {
		tools = json_loads(tools_json, 0, NULL);
		if (!json_is_array(tools)) {
			json_decref(tools);
			return sh_fail(err, errlen, SH_EINVAL, "'tools' must be an array");
		}
	}
	if (!eos)
		eos = "</s>";
	if (style == CHAT_TOOLS_FAMILY)
		style = chat_tool_style(family, NULL, 0);
	int rc = 0;
	if (style == CHAT_TOOLS_GENERIC) {
		rc = render_generic(family, m, n, tools, eos, out, err, errlen);
	} else {
		char *buf = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&buf, &len);
		if (!f) {
			json_decref(tools);
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory rendering the chat");
		}
		if (style == CHAT_TOOLS_LLAMA3)
			render_llama3(f, m, n, tools);
		else if (style == CHAT_TOOLS_MISTRAL)
			render_mistral_tools(f, m, n, tools, eos);
		else if (style == CHAT_TOOLS_GLM4)
			render_glm4(f, m, n, tools);
		else if (style == CHAT_TOOLS_HERMES && tools)
			render_hermes(f, m, n, tools);
		else
			render_qwen(f, m, n, tools, style != CHAT_TOOLS_QWEN25);
		fclose(f);
		*out = buf;
	}
	json_decref(tools);
	if (rc || !*out)
		return rc ? rc
			  : sh_fail(err, errlen, SH_ENOMEM, "out of memory rendering the chat");
open:
	if (open_call && (chat_tool_format(style) == ENG_TOOLS_HERMES ||
			  chat_tool_format(style) == ENG_TOOLS_GLM4)) {
		/* the reply must be a call: its opening tag is part of the prompt */
		size_t l = strlen(*out);
		char *p = realloc(*out, l + sizeof "<tool_call>\n");
		if (!p)
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory rendering the chat");
		memcpy(p + l, "<tool_call>\n", sizeof "<tool_call>\n");
		*out = p;
	}
	return 0;
}
