/*
 * tools.c: the OpenAI request fields for tool calling and structured output, and the reply side
 * of tool calls.
 *
 *   request   "tools" (function tools), "tool_choice" (auto, none, required, or
 *             {"type": "function", "function": {"name"}}), "parallel_tool_calls", messages'
 *             "tool_calls" and role "tool", "response_format" ({"type": "text" | "json_object" |
 *             "json_schema", "json_schema": {"name", "schema", "strict"}}).
 *   prompt    tools rendered by the model's family (infer/chat.h); for tool_choice required or
 *             a named function the reply is constrained to a call object
 *             {"name": ..., "arguments": {...}} by the same grammar as response_format.
 *   reply     the model's text is scanned for calls in its family's form (hermes <tool_call>
 *             tags, llama3 JSON, mistral [TOOL_CALLS], Qwen3.5's <tool_call><function=NAME>
 *             <parameter=KEY>VALUE</parameter> as llama.cpp's common_chat_params_init_qwen3_coder
 *             parses it); found calls become "tool_calls" with
 *             finish_reason "tool_calls". While streaming, text that may begin a call is held
 *             back, and calls go out as OpenAI sends them: one delta with id, type, name and
 *             empty arguments, then the arguments (the openai SDK's ChatCompletionStream
 *             accumulates exactly these fields).
 *
 * Invariant: a request that reaches the scheduler with tool_format != 0 has every byte of its
 * text in job->text; job->tc_sent of them went out as content, and nothing that the final
 * parse turns into a call was ever sent as content.
 */
#include "web/web_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

/* ---- request fields ------------------------------------------------------------------------- */

int web_msg_parse_tools(eng_msg_t *m, json_t *jm, size_t i, web_err_t *e)
{
	char param[80];
	json_t *calls = json_object_get(jm, "tool_calls");
	if (calls && !json_is_null(calls)) {
		snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
		if (strcmp(m->role, "assistant"))
			return web_err_bad(e, param, "only assistant messages carry 'tool_calls'");
		if (!json_is_array(calls))
			return web_err_bad(e, param, "'tool_calls' must be an array");
		size_t k;
		json_t *c;
		json_array_foreach(calls, k, c)
		{
			json_t *fn = json_object_get(c, "function");
			json_t *args = json_object_get(fn, "arguments");
			if (!json_is_object(c) || !json_is_string(json_object_get(c, "id")) ||
			    !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")) ||
			    !(json_is_string(args) || json_is_object(args)))
				return web_err_set(
				    e, 400, "invalid_request_error", param, "invalid_value",
				    "'%s[%zu]' must be {\"id\", \"type\": \"function\", "
				    "\"function\": {\"name\", \"arguments\"}}",
				    param, k);
		}
		if (json_array_size(calls)) {
			m->tool_calls = json_dumps(calls, JSON_COMPACT);
			if (!m->tool_calls)
				return web_err_oom(e);
		}
	}
	json_t *rs = json_object_get(jm, "reasoning_content"); /* gpt-oss renders it */
	if (json_is_string(rs) && !strcmp(m->role, "assistant") &&
	    !(m->reasoning = strdup(json_string_value(rs))))
		return web_err_oom(e);
	if (!strcmp(m->role, "tool")) {
		json_t *id = json_object_get(jm, "tool_call_id");
		snprintf(param, sizeof param, "messages[%zu].tool_call_id", i);
		if (!json_is_string(id))
			return web_err_set(e, 400, "invalid_request_error", param,
					   "missing_required_parameter",
					   "'%s' is required for a tool message", param);
		m->tool_call_id = strdup(json_string_value(id));
		if (!m->tool_call_id)
			return web_err_oom(e);
	}
	return 0;
}

/* The compiled schema of a call to one function: {"name": NAME, KEY: parameters}. */
static json_t *call_schema(json_t *fn, const char *key)
{
	json_t *params = json_object_get(fn, "parameters");
	json_t *props = json_pack("{s:{s:s}, s:o}", "name", "const",
				  json_string_value(json_object_get(fn, "name")), key,
				  params ? json_incref(params) : json_object());
	return json_pack("{s:s, s:o, s:[s, s], s:b}", "type", "object", "properties", props,
			 "required", "name", key, "additionalProperties", 0);
}

static int parse_response_format(web_req_t *r, json_t *root, web_err_t *e)
{
	json_t *rf = json_object_get(root, "response_format");
	if (!rf || json_is_null(rf))
		return 0;
	const char *type = json_string_value(json_object_get(rf, "type"));
	if (!json_is_object(rf) || !type)
		return web_err_bad(
		    e, "response_format",
		    "'response_format' must be {\"type\": \"text\" | \"json_object\" | "
		    "\"json_schema\"}");
	if (!strcmp(type, "text"))
		return 0;
	char err[300];
	int rc;
	if (!strcmp(type, "json_object")) {
		rc = eng_grammar_new(&r->grammar, NULL, 0, err, sizeof err);
	} else if (!strcmp(type, "json_schema")) {
		json_t *js = json_object_get(rf, "json_schema");
		json_t *schema = json_object_get(js, "schema");
		if (!json_is_object(js) || !json_is_string(json_object_get(js, "name")))
			return web_err_bad(
			    e, "response_format.json_schema",
			    "'response_format.json_schema' must be an object with 'name' and "
			    "'schema'");
		char *text =
		    schema ? json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY) : strdup("{}");
		if (!text)
			return web_err_oom(e);
		rc = eng_grammar_new(&r->grammar, text, strlen(text), err, sizeof err);
		free(text);
	} else {
		return web_err_set(
		    e, 400, "invalid_request_error", "response_format.type", "invalid_value",
		    "'response_format.type' must be text, json_object or json_schema "
		    "(got '%.40s')",
		    type);
	}
	if (rc == SH_ENOMEM)
		return web_err_oom(e);
	if (rc)
		return web_err_set(e, 400, "invalid_request_error", "response_format",
				   rc == SH_EUNSUPP ? "unsupported_schema" : "invalid_schema",
				   "response_format: %s", err);
	r->samp.grammar = r->grammar;
	return 0;
}

int web_req_parse_tools(web_req_t *r, json_t *root, web_err_t *e)
{
	int rc = parse_response_format(r, root, e);
	if (rc)
		return rc;
	json_t *tools = json_object_get(root, "tools");
	json_t *choice = json_object_get(root, "tool_choice");
	json_t *par = json_object_get(root, "parallel_tool_calls");
	r->parallel_tool_calls = 1;
	if (par && !json_is_null(par)) {
		if (!json_is_boolean(par))
			return web_err_bad(e, "parallel_tool_calls",
					   "'parallel_tool_calls' must be a boolean");
		r->parallel_tool_calls = json_is_true(par);
	}
	if (tools && !json_is_null(tools)) {
		if (r->kind != WEB_CHAT)
			return web_err_bad(e, "tools", "'tools' is for /v1/chat/completions");
		if (!json_is_array(tools))
			return web_err_bad(e, "tools",
					   "'tools' must be an array of function tools");
		size_t i;
		json_t *t;
		json_array_foreach(tools, i, t)
		{
			json_t *fn = json_object_get(t, "function");
			json_t *params = json_object_get(fn, "parameters");
			if (!json_is_object(t) || !json_is_string(json_object_get(t, "type")) ||
			    strcmp(json_string_value(json_object_get(t, "type")), "function") ||
			    !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")) ||
			    (params && !json_is_object(params)))
				return web_err_set(e, 400, "invalid_request_error", "tools",
						   "invalid_value",
						   "'tools[%zu]' must be {\"type\": \"function\", "
						   "\"function\": {\"name\", \"description\", "
						   "\"parameters\"}}",
						   i);
		}
		if (json_array_size(tools)) {
			r->tools = json_dumps(tools, JSON_PRESERVE_ORDER);
			if (!r->tools)
				return web_err_oom(e);
		}
	}
	r->tool_choice = r->tools ? WEB_TOOLS_AUTO : WEB_TOOLS_NONE;
	if (choice && !json_is_null(choice)) {
		const char *s = json_string_value(choice);
		const char *name =
		    json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
		if (s && !strcmp(s, "none"))
			r->tool_choice = WEB_TOOLS_NONE;
		else if (s && !strcmp(s, "auto"))
			r->tool_choice = r->tools ? WEB_TOOLS_AUTO : WEB_TOOLS_NONE;
		else if (s && !strcmp(s, "required"))
			r->tool_choice = WEB_TOOLS_REQUIRED;
		else if (name) {
			r->tool_choice = WEB_TOOLS_NAMED;
			snprintf(r->tool_name, sizeof r->tool_name, "%s", name);
		} else
			return web_err_bad(
			    e, "tool_choice",
			    "'tool_choice' must be none, auto, required or {\"type\": "
			    "\"function\", \"function\": {\"name\"}}");
		if (r->tool_choice >= WEB_TOOLS_REQUIRED && !r->tools)
			return web_err_bad(
			    e, "tool_choice",
			    "'tool_choice' asks for a call but no 'tools' were given");
	}
	if (r->tool_choice >= WEB_TOOLS_REQUIRED && r->grammar)
		return web_err_bad(
		    e, "response_format",
		    "'response_format' cannot be combined with a required tool call");
	if (r->tool_choice == WEB_TOOLS_NAMED) {
		size_t i;
		json_t *t, *found = NULL;
		json_array_foreach(tools, i, t)
		{
			json_t *fn = json_object_get(t, "function");
			if (!strcmp(json_string_value(json_object_get(fn, "name")), r->tool_name))
				found = fn;
		}
		if (!found)
			return web_err_set(
			    e, 400, "invalid_request_error", "tool_choice", "invalid_value",
			    "'tool_choice' names '%.80s', which is not in 'tools'", r->tool_name);
	}
	return 0;
}

/* ---- the prompt ----------------------------------------------------------------------------- */

static int format_of(int eng_format)
{
	switch (eng_format) {
	case ENG_TOOLS_LLAMA3: return WEB_TC_LLAMA3;
	case ENG_TOOLS_MISTRAL: return WEB_TC_MISTRAL;
	case ENG_TOOLS_XML: return WEB_TC_XML;
	case ENG_TOOLS_HARMONY: return WEB_TC_HARMONY;
	case ENG_TOOLS_GLM4: return WEB_TC_GLM4;
	default: return WEB_TC_HERMES;
	}
}

/* The grammar for a forced call: the named function, or any of the tools. */
static int forced_grammar(web_req_t *r, const char *key, web_err_t *e)
{
	json_t *tools = json_loads(r->tools, 0, NULL);
	json_t *alts = json_array(), *schema = NULL;
	size_t i;
	json_t *t;
	json_array_foreach(tools, i, t)
	{
		json_t *fn = json_object_get(t, "function");
		if (r->tool_choice == WEB_TOOLS_NAMED &&
		    strcmp(json_string_value(json_object_get(fn, "name")), r->tool_name))
			continue;
		json_array_append_new(alts, call_schema(fn, key));
	}
	if (json_array_size(alts) == 1)
		schema = json_incref(json_array_get(alts, 0));
	else
		schema = json_pack("{s:O}", "anyOf", alts);
	char *text = schema ? json_dumps(schema, JSON_COMPACT) : NULL;
	json_decref(schema);
	json_decref(alts);
	json_decref(tools);
	if (!text)
		return web_err_oom(e);
	char err[300];
	int rc = eng_grammar_new(&r->grammar, text, strlen(text), err, sizeof err);
	free(text);
	if (rc == SH_ENOMEM)
		return web_err_oom(e);
	if (rc)
		return web_err_set(e, 400, "invalid_request_error", "tools",
				   rc == SH_EUNSUPP ? "unsupported_schema" : "invalid_schema",
				   "tools: a function's parameters cannot be enforced: %s", err);
	r->samp.grammar = r->grammar;
	return 0;
}

int web_chat_prompt(eng_t *eng, web_req_t *r, int **ids, int *n_ids, char *msg, size_t msglen,
		    web_err_t *e)
{
	const eng_info_t *in = eng_info(eng);
	const char *tools = r->tool_choice == WEB_TOOLS_NONE ? NULL : r->tools;
	int forced = r->tool_choice >= WEB_TOOLS_REQUIRED;
	if (tools) {
		r->tool_format = forced ? WEB_TC_FORCED : format_of(in->tool_format);
		if (forced) {
			int rc = forced_grammar(r,
						format_of(in->tool_format) == WEB_TC_LLAMA3
						    ? "parameters"
						    : "arguments",
						e);
			if (rc)
				return rc;
		}
		r->mistral_ids = format_of(in->tool_format) == WEB_TC_MISTRAL;
	} else if (r->kind == WEB_CHAT && format_of(in->tool_format) == WEB_TC_HARMONY) {
		r->tool_format = WEB_TC_HARMONY; /* its reasoning is split from its answer */
	}
	return eng_chat_prompt_tools(eng, r->msgs, r->n_msgs, tools, forced, ids, n_ids, msg,
				     msglen);
}

/* ---- the reply ------------------------------------------------------------------------------ */

static size_t skip_ws(const char *s, size_t n, size_t i)
{
	while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r'))
		i++;
	return i;
}

/* Bytes of s[0..n) that are surely content (no call can start in them). */
size_t web_tools_safe(const web_job_t *j, const char *s, size_t n)
{
	switch (j->req.tool_format) {
	case WEB_TC_FORCED: return 0;
	case WEB_TC_HERMES:
	case WEB_TC_GLM4:
	case WEB_TC_XML: { /* the XML form may also open without its <tool_call> */
		const char *tags[2] = {"<tool_call>", "<function="};
		size_t safe = n;
		for (int t = 0; t < (j->req.tool_format == WEB_TC_XML ? 2 : 1); t++) {
			const char *tag = tags[t], *at = web_find(s, n, tag);
			if (at) {
				safe = MIN(safe, (size_t)(at - s));
				continue;
			}
			/* a tail that could still grow into the tag stays */
			for (size_t k = MIN(n, strlen(tag) - 1); k > 0; k--)
				if (!memcmp(s + n - k, tag, k)) {
					safe = MIN(safe, n - k);
					break;
				}
		}
		return safe;
	}
	default: { /* llama3 / mistral: a call is the whole reply */
		size_t i = skip_ws(s, n, 0);
		if (i == n)
			return 0;
		if (s[i] == '{' || s[i] == '[')
			return 0;
		return n;
	}
	}
}

static void new_id(web_job_t *j, char *out, size_t len)
{
	static const char alnum[] =
	    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
	unsigned char rnd[24];
	arc4random_buf(rnd, sizeof rnd);
	if (j->req.mistral_ids) { /* Mistral's template wants 9 alphanumeric characters */
		for (int i = 0; i < 9; i++)
			out[i] = alnum[rnd[i] % 62];
		out[9] = 0;
		return;
	}
	int o = snprintf(out, len, "call_");
	for (int i = 0; i < 12 && (size_t)o + 2 < len; i++)
		o += snprintf(out + o, len - (size_t)o, "%02x", rnd[i]);
}

static int tool_known(const web_job_t *j, const char *name)
{
	json_t *tools = json_loads(j->req.tools, 0, NULL);
	size_t i;
	json_t *t;
	int ok = 0;
	json_array_foreach(tools, i, t)
	{
		const char *n =
		    json_string_value(json_object_get(json_object_get(t, "function"), "name"));
		ok |= n && !strcmp(n, name);
	}
	json_decref(tools);
	return ok;
}

/* Adds the call in v ({"name", "arguments"|"parameters"}) to calls; 0 or -1 when v is not one. */
static int add_call(web_job_t *j, json_t *calls, json_t *v)
{
	const char *name = json_string_value(json_object_get(v, "name"));
	json_t *args = json_object_get(v, "arguments");
	if (!args)
		args = json_object_get(v, "parameters");
	if (!name || !tool_known(j, name))
		return -1;
	char *a = json_is_string(args) ? strdup(json_string_value(args))
				       : json_dumps(args ? args : json_object(), JSON_COMPACT);
	if (!a)
		return -1;
	char id[40];
	new_id(j, id, sizeof id);
	json_array_append_new(calls,
			      json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function",
					"function", "name", name, "arguments", a));
	free(a);
	return 0;
}

/* The JSON Schema type of parameter key of the named tool ("" when unknown). */
static const char *param_type(const web_job_t *j, const char *name, const char *key, char *buf,
			      size_t len)
{
	json_t *tools = json_loads(j->req.tools, 0, NULL);
	size_t i;
	json_t *t;
	buf[0] = 0;
	json_array_foreach(tools, i, t)
	{
		json_t *fn = json_object_get(t, "function");
		const char *n = json_string_value(json_object_get(fn, "name"));
		if (!n || strcmp(n, name))
			continue;
		json_t *p = json_object_get(
		    json_object_get(json_object_get(fn, "parameters"), "properties"), key);
		const char *ty = json_string_value(json_object_get(p, "type"));
		snprintf(buf, len, "%s", ty ? ty : "");
	}
	json_decref(tools);
	return buf;
}

/* A call's argument value v[0..n): JSON unless the tool declares that parameter a string (or it
 * does not parse as JSON), as llama.cpp's parser decides by the schema. */
static json_t *arg_value(const web_job_t *j, const char *name, const char *key, const char *v,
			 size_t n)
{
	char ty[32];
	json_t *val = NULL;
	if (strcmp(param_type(j, name, key, ty, sizeof ty), "string"))
		val = json_loadb(v, n, JSON_DECODE_ANY, NULL);
	return val ? val : json_stringn(v, n);
}

/* One XML call at p[0..n): <function=NAME>\n then <parameter=KEY>\nVALUE\n</parameter>\n
 * each, then </function>. A value is JSON unless its parameter is a string (or it does not
 * parse as JSON), as llama.cpp's parser decides by the schema. 0 or -1 when malformed. */
static int add_xml_call(web_job_t *j, json_t *calls, const char *p, size_t n)
{
	const char *end = p + n, *q = web_find(p, n, "<function=");
	if (!q)
		return -1;
	q += 10;
	const char *gt = memchr(q, '>', (size_t)(end - q));
	if (!gt || gt == q || gt - q > 200)
		return -1;
	char name[256];
	snprintf(name, sizeof name, "%.*s", (int)(gt - q), q);
	json_t *args = json_object();
	for (q = gt + 1; (q = web_find(q, (size_t)(end - q), "<parameter=")) != NULL;) {
		q += 11;
		gt = memchr(q, '>', (size_t)(end - q));
		if (!gt || gt - q > 200)
			break;
		char key[256];
		snprintf(key, sizeof key, "%.*s", (int)(gt - q), q);
		const char *v = gt + 1, *ve = web_find(v, (size_t)(end - v), "</parameter>");
		if (!ve)
			ve = end;
		q = ve;
		if (v < ve && *v == '\n') /* the template's newlines around a value */
			v++;
		if (ve > v && ve[-1] == '\n')
			ve--;
		json_object_set_new(args, key, arg_value(j, name, key, v, (size_t)(ve - v)));
	}
	json_t *c = json_pack("{s:s, s:o}", "name", name, "arguments", args);
	int rc = c ? add_call(j, calls, c) : -1;
	json_decref(c);
	return rc;
}

/* GLM-4.5/4.6's call body (infer/chat_tools.c render_glm4): "NAME\n<arg_key>K</arg_key>\n
 * <arg_value>V</arg_value>\n..." with V written as text when a string, else as JSON; a value is
 * read as add_xml_call reads one. Returns {"name", "arguments"} or NULL when p[0..len) is not
 * such a body. */
static json_t *glm_call(const web_job_t *j, const char *p, size_t len)
{
	const char *end = p + len, *k = web_find(p, len, "<arg_key>");
	const char *ne = k ? k : end;
	while (ne > p && (ne[-1] == '\n' || ne[-1] == ' '))
		ne--;
	size_t i = skip_ws(p, (size_t)(ne - p), 0);
	if (i >= (size_t)(ne - p) || (size_t)(ne - p) - i > 200 ||
	    memchr(p + i, '{', (size_t)(ne - p) - i))
		return NULL;
	char name[256];
	snprintf(name, sizeof name, "%.*s", (int)((size_t)(ne - p) - i), p + i);
	json_t *args = json_object();
	while (k && args) {
		const char *ke = web_find(k, (size_t)(end - k), "</arg_key>");
		const char *v = ke ? web_find(ke, (size_t)(end - ke), "<arg_value>") : NULL;
		const char *ve = v ? web_find(v, (size_t)(end - v), "</arg_value>") : NULL;
		if (!ve || ke - k - 9 > 200)
			break;
		char key[256];
		snprintf(key, sizeof key, "%.*s", (int)(ke - k - 9), k + 9);
		json_object_set_new(args, key,
				    arg_value(j, name, key, v + 11, (size_t)(ve - v - 11)));
		k = web_find(ve, (size_t)(end - ve), "<arg_key>");
	}
	json_t *call = args ? json_pack("{s:s, s:O}", "name", name, "arguments", args) : NULL;
	json_decref(args);
	return call;
}

/* Parses the calls in text; returns them (or NULL: plain content) and the content's length. */
static json_t *parse_calls(web_job_t *j, const char *s, size_t n, size_t *content_len)
{
	json_t *calls = json_array();
	*content_len = n;
	if (!calls)
		return NULL;
	int fmt = j->req.tool_format;
	if (fmt == WEB_TC_XML) {
		const char *p = web_find(s, n, "<tool_call>"), *f = web_find(s, n, "<function=");
		if (!p || (f && f < p)) /* a call may come without its opening tag */
			p = f;
		if (p) {
			*content_len = (size_t)(p - s);
			const char *end = s + n;
			while (p && p < end) {
				const char *close = web_find(p, (size_t)(end - p), "</function>");
				size_t len = close ? (size_t)(close - p) + 11 : (size_t)(end - p);
				add_xml_call(j, calls, p, len);
				p = close ? web_find(close, (size_t)(end - close), "<function=")
					  : NULL;
			}
		}
	} else if (fmt == WEB_TC_HERMES || fmt == WEB_TC_GLM4 || fmt == WEB_TC_FORCED) {
		const char *p = fmt == WEB_TC_FORCED ? s : web_find(s, n, "<tool_call>");
		if (p) {
			*content_len = (size_t)(p - s);
			const char *end = s + n;
			while (p && p < end) {
				if (!strncmp(p, "<tool_call>", 11))
					p += 11;
				const char *close = web_find(p, (size_t)(end - p), "</tool_call>");
				size_t len = close ? (size_t)(close - p) : (size_t)(end - p);
				json_t *v = fmt == WEB_TC_GLM4 ? glm_call(j, p, len)
							       : json_loadb(p, len, 0, NULL);
				if (v)
					add_call(j, calls, v);
				json_decref(v);
				p = close ? web_find(close, (size_t)(end - close), "<tool_call>")
					  : NULL;
			}
		}
	} else {
		size_t i = skip_ws(s, n, 0);
		const char *p = s + i;
		size_t len = n - i;
		if (fmt == WEB_TC_MISTRAL && len >= 12 && !memcmp(p, "[TOOL_CALLS]", 12))
			p += 12, len -= 12;
		json_t *v = json_loadb(p, len, JSON_DISABLE_EOF_CHECK, NULL);
		if (json_is_object(v)) {
			add_call(j, calls, v);
		} else if (json_is_array(v)) {
			size_t k;
			json_t *c;
			json_array_foreach(v, k, c) add_call(j, calls, c);
		}
		json_decref(v);
		if (json_array_size(calls))
			*content_len = 0;
	}
	if (!j->req.parallel_tool_calls)
		while (json_array_size(calls) > 1)
			json_array_remove(calls, json_array_size(calls) - 1);
	if (json_array_size(calls) == 0) {
		json_decref(calls);
		*content_len = n;
		return NULL;
	}
	while (*content_len && (s[*content_len - 1] == ' ' || s[*content_len - 1] == '\n'))
		(*content_len)--;
	return calls;
}

static void emit_content(web_job_t *j, size_t upto)
{
	if (upto <= j->tc_sent)
		return;
	web_sse_add(&j->out,
		    web_json_chunk(&j->rid, NULL, j->text.p + j->tc_sent, upto - j->tc_sent,
				   ENG_FINISH_NONE, j->req.include_usage, NULL));
	j->tc_sent = upto;
	pthread_cond_broadcast(&j->cv);
}

static size_t safe_len(const web_job_t *j)
{
	return web_tools_safe(j, j->text.p ? j->text.p : "", j->text.len);
}

json_t *web_tools_parse(web_job_t *j, const char *s, size_t n, size_t *content_len)
{
	return parse_calls(j, s, n, content_len);
}

void web_grammar_finish(web_job_t *j, const char *s, size_t n)
{
	/* a value that closed on the last token allowed ends as "stop": the grammar had nothing
	 * but the end left */
	json_t *v =
	    j->res.finish == ENG_FINISH_LENGTH ? json_loadb(s, n, JSON_DECODE_ANY, NULL) : NULL;
	if (v)
		j->res.finish = ENG_FINISH_STOP;
	json_decref(v);
}

/* ---- gpt-oss's harmony channels (infer.h eng_harmony_parse) ---- */

static void stream_calls(web_job_t *j, json_t *calls);

/* One streaming chunk whose delta carries key = v (stolen). */
static char *key_chunk(const web_job_t *j, const char *key, json_t *v)
{
	char *base =
	    web_json_chunk(&j->rid, NULL, NULL, 0, ENG_FINISH_NONE, j->req.include_usage, NULL);
	json_t *root = base ? json_loads(base, 0, NULL) : NULL;
	free(base);
	json_t *delta =
	    json_object_get(json_array_get(json_object_get(root, "choices"), 0), "delta");
	char *s = NULL;
	if (delta && v) {
		json_object_set_new(delta, key, v);
		s = json_dumps(root, JSON_COMPACT);
	} else {
		json_decref(v);
	}
	json_decref(root);
	return s;
}

/* One streaming chunk whose delta carries key = text[0..n) (content or reasoning_content). */
static char *delta_chunk(const web_job_t *j, const char *key, const char *text, size_t n)
{
	return key_chunk(j, key, json_stringn_nocheck(text, n));
}

/* The reply's reasoning (kind ENG_H_REASONING) or content pieces, joined, into b. */
static void harmony_join(const eng_harmony_t *h, int kind, web_buf_t *b)
{
	for (int i = 0; i < h->n; i++)
		if (h->piece[i].kind == kind)
			web_buf_add(b, h->piece[i].p, h->piece[i].len);
}

/* The calls of a harmony reply (OpenAI's tool_calls array, new reference; empty without tools). */
static json_t *harmony_calls(web_job_t *j, const eng_harmony_t *h)
{
	json_t *calls = json_array();
	for (int i = 0; calls && i < h->n; i++) {
		const eng_hpiece_t *p = &h->piece[i];
		if (p->kind != ENG_H_CALL || !j->req.tools)
			continue;
		char *name = strndup(p->name, p->name_len);
		json_t *args = json_loadb(p->p, p->len, JSON_DECODE_ANY, NULL);
		json_t *v = name ? json_pack("{s:s, s:o}", "name", name, "arguments",
					     args ? args : json_stringn(p->p, p->len))
				 : NULL;
		if (v)
			add_call(j, calls, v);
		json_decref(v);
		free(name);
	}
	if (!j->req.parallel_tool_calls)
		while (json_array_size(calls) > 1)
			json_array_remove(calls, json_array_size(calls) - 1);
	return calls;
}

void web_harmony_read(web_job_t *j, int final, web_buf_t *reasoning, web_buf_t *content,
		      json_t **calls)
{
	eng_harmony_t h;
	eng_harmony_parse(j->text.p ? j->text.p : "", j->text.len, final, &h);
	harmony_join(&h, ENG_H_REASONING, reasoning);
	harmony_join(&h, ENG_H_CONTENT, content);
	if (calls)
		*calls = harmony_calls(j, &h);
}

/* Streams what the text holds beyond what was sent: new reasoning as reasoning_content deltas,
 * new content as content deltas (calls go out at the end). */
static void harmony_emit(web_job_t *j, int final)
{
	web_buf_t r = {0}, c = {0};
	web_harmony_read(j, final, &r, &c, NULL);
	if (r.len > j->rs_sent) {
		web_sse_add(&j->out, delta_chunk(j, "reasoning_content", r.p + j->rs_sent,
						 r.len - j->rs_sent));
		j->rs_sent = r.len;
	}
	if (c.len > j->tc_sent) {
		web_sse_add(&j->out,
			    delta_chunk(j, "content", c.p + j->tc_sent, c.len - j->tc_sent));
		j->tc_sent = c.len;
	}
	free(r.p);
	free(c.p);
	pthread_cond_broadcast(&j->cv);
}

/* The end of a harmony reply: its channels into reasoning_content, content and tool_calls. */
static void harmony_finish(web_job_t *j)
{
	json_t *calls;
	web_buf_t r = {0}, c = {0};
	web_harmony_read(j, 1, &r, &c, &calls);
	if (j->req.stream) {
		harmony_emit(j, 1);
		free(c.p);
	} else {
		if (r.len)
			j->rid.reasoning = json_stringn_nocheck(r.p, r.len);
		free(j->text.p); /* the message's content: the final channel */
		j->text = c;
	}
	free(r.p);
	if (!json_array_size(calls)) {
		json_decref(calls);
		return;
	}
	j->res.finish = WEB_FINISH_TOOL_CALLS;
	if (!j->req.stream) {
		j->rid.tool_calls = calls;
		return;
	}
	stream_calls(j, calls);
}

void web_tools_on_text(web_job_t *j)
{
	if (j->req.stream && j->req.tool_format == WEB_TC_HARMONY)
		harmony_emit(j, 0);
	else if (j->req.stream)
		emit_content(j, safe_len(j));
}

/* One streaming chunk whose delta is {"tool_calls": [call]}. */
static char *call_chunk(const web_job_t *j, json_t *call)
{
	return key_chunk(j, "tool_calls", json_pack("[O]", call));
}

/* Streams calls (stolen) as OpenAI sends them: per call a delta with its id, type, name and
 * empty arguments, then one with the arguments (the openai SDK's ChatCompletionStream
 * accumulates exactly these fields). */
static void stream_calls(web_job_t *j, json_t *calls)
{
	size_t k;
	json_t *c;
	json_array_foreach(calls, k, c)
	{
		json_t *fn = json_object_get(c, "function");
		json_t *head =
		    json_pack("{s:I, s:O, s:s, s:{s:O, s:s}}", "index", (json_int_t)k, "id",
			      json_object_get(c, "id"), "type", "function", "function", "name",
			      json_object_get(fn, "name"), "arguments", "");
		json_t *args = json_pack("{s:I, s:{s:O}}", "index", (json_int_t)k, "function",
					 "arguments", json_object_get(fn, "arguments"));
		web_sse_add(&j->out, call_chunk(j, head));
		web_sse_add(&j->out, call_chunk(j, args));
		json_decref(head);
		json_decref(args);
	}
	json_decref(calls);
	pthread_cond_broadcast(&j->cv);
}

void web_tools_finish(web_job_t *j)
{
	size_t content_len;
	const char *s = j->text.p ? j->text.p : "";
	if (j->req.tool_format == WEB_TC_HARMONY) {
		harmony_finish(j);
		return;
	}
	if (!j->req.tool_format) { /* response_format alone */
		web_grammar_finish(j, s, j->text.len);
		return;
	}
	json_t *calls = parse_calls(j, s, j->text.len, &content_len);
	if (!calls) {
		if (j->req.stream)
			emit_content(j, j->text.len);
		return;
	}
	j->res.finish = WEB_FINISH_TOOL_CALLS;
	if (!j->req.stream) {
		j->text.len = content_len; /* the message's content: text before the calls */
		if (j->text.p)
			j->text.p[content_len] = 0;
		j->rid.tool_calls = calls;
		return;
	}
	emit_content(j, MAX(content_len, j->tc_sent));
	stream_calls(j, calls);
}
