/*
 * chat_harmony.c: gpt-oss's chat format, OpenAI's "harmony": rendering a conversation as the
 * model's own Jinja template does, and reading a reply back into its channels.
 *
 * Rendering follows openai/gpt-oss's chat template as llama.cpp runs it
 * (models/templates/openai-gpt-oss-120b.jinja with common/jinja's lstrip_blocks and
 * trim_blocks; common/chat.cpp common_chat_params_init_gpt_oss copies a message's
 * reasoning_content to the template's "thinking" and turns string tool arguments into objects,
 * since the template passes them through tojson): a system message with the model identity,
 * knowledge cutoff, today's date, "Reasoning: medium" and the valid channels; the first system
 * or developer message as "# Instructions" in a developer message, followed by the tools as a
 * TypeScript namespace "functions"; user turns; earlier assistant turns by their final channel
 * only; an assistant tool call as "<|start|>assistant to=functions.NAME<|channel|>commentary
 * json<|message|>ARGS<|call|>" (its reasoning kept as an analysis message unless a later
 * assistant message answers without calls); tool results as "<|start|>functions.NAME
 * to=assistant<|channel|>commentary<|message|>"JSON string"<|end|>"; then "<|start|>assistant".
 * Built-in tools (browser, python) are not offered.
 *
 * Parsing follows the same handler's grammar: a reply is a run of messages, each an optional
 * "<|start|>assistant" header (the first comes from the prompt), a channel, an optional
 * recipient " to=functions.NAME" (in the header or after the channel) and constraint, then
 * "<|message|>" and a body closed by <|end|> (or <|call|>, <|return|>, the end of the text).
 * The analysis channel is reasoning, commentary without a recipient and final are content, a
 * message to functions.NAME is a tool call whose body holds the arguments. Text with no
 * channel at all is content as it stands.
 *
 * Invariant: pure functions of their arguments (and the clock, for the date).
 */
#include "infer/chat.h"

#include "common/common.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- rendering ------------------------------------------------------------------------------ */

static int is_role(const eng_msg_t *m, const char *r)
{
	return m->role && !strcmp(m->role, r);
}

/* v as the template's tojson writes it: ", " and ": " separators, key order kept, UTF-8 as is. */
static void put_json(FILE *f, json_t *v)
{
	char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
	if (s)
		fputs(s, f);
	free(s);
}

static const char *str_of(json_t *o, const char *k)
{
	return json_string_value(json_object_get(o, k));
}

static int in_required(json_t *req, const char *name)
{
	size_t i;
	json_t *r;
	json_array_foreach(req, i, r) if (json_is_string(r) &&
					  !strcmp(json_string_value(r), name)) return 1;
	return 0;
}

/* The template's render_typescript_type. NEST is the text its object branch leaves before a
 * property's type ({{ ... }} without whitespace control after a newline and 16 spaces). */
#define NEST "\n                "
static void ts_type(FILE *f, json_t *spec)
{
	const char *type = str_of(spec, "type");
	json_t *items = json_object_get(spec, "items"), *one = json_object_get(spec, "oneOf");
	int nullable = json_is_true(json_object_get(spec, "nullable"));
	if (type && !strcmp(type, "array")) {
		const char *it = items ? str_of(items, "type") : NULL;
		if (!items || !json_is_object(items) || !json_object_size(items)) {
			fputs("any[]", f);
		} else if (it && !strcmp(it, "string")) {
			fputs("string[]", f);
		} else if (it && (!strcmp(it, "number") || !strcmp(it, "integer"))) {
			fputs("number[]", f);
		} else if (it && !strcmp(it, "boolean")) {
			fputs("boolean[]", f);
		} else {
			char *inner = NULL;
			size_t len = 0;
			FILE *g = open_memstream(&inner, &len);
			if (g) {
				ts_type(g, items);
				fclose(g);
			}
			if (!inner || !strcmp(inner, "object | object") || len > 50)
				fputs("any[]", f);
			else
				fprintf(f, "%s[]", inner);
			free(inner);
		}
		if (nullable)
			fputs(" | null", f);
	} else if (json_is_array(json_object_get(spec, "type")) &&
		   json_array_size(json_object_get(spec, "type"))) {
		json_t *ts = json_object_get(spec, "type");
		for (size_t i = 0; i < json_array_size(ts); i++)
			fprintf(f, "%s%s", i ? " | " : "",
				json_string_value(json_array_get(ts, i))
				    ? json_string_value(json_array_get(ts, i))
				    : "");
	} else if (json_is_array(one) && json_array_size(one)) {
		int objects = 0;
		size_t i;
		json_t *v;
		json_array_foreach(one, i, v) objects |=
		    str_of(v, "type") && !strcmp(str_of(v, "type"), "object");
		if (objects && json_array_size(one) > 1) {
			fputs("any", f);
		} else {
			json_array_foreach(one, i, v)
			{
				ts_type(f, v);
				if (str_of(v, "description"))
					fprintf(f, "// %s", str_of(v, "description"));
				if (json_object_get(v, "default")) {
					fputs("\n                    // default: ", f);
					put_json(f, json_object_get(v, "default"));
				}
				if (i + 1 < json_array_size(one))
					fputs(" | \n", f);
			}
		}
	} else if (type && !strcmp(type, "string")) {
		json_t *en = json_object_get(spec, "enum");
		if (json_is_array(en) && json_array_size(en)) {
			size_t i;
			json_t *v;
			fputc('"', f);
			json_array_foreach(en, i, v)
			    fprintf(f, "%s%s", i ? "\" | \"" : "",
				    json_string_value(v) ? json_string_value(v) : "");
			fputc('"', f);
		} else {
			fputs(nullable ? "string | null" : "string", f);
		}
	} else if (type && (!strcmp(type, "number") || !strcmp(type, "integer"))) {
		fputs("number", f);
	} else if (type && !strcmp(type, "boolean")) {
		fputs("boolean", f);
	} else if (type && !strcmp(type, "object")) {
		json_t *props = json_object_get(spec, "properties"),
		       *req = json_object_get(spec, "required");
		if (json_is_object(props) && json_object_size(props)) {
			const char *k;
			json_t *p;
			size_t i = 0, n = json_object_size(props);
			fputs("{\n", f);
			json_object_foreach(props, k, p)
			{
				fprintf(f, "%s%s: " NEST, k, in_required(req, k) ? "" : "?");
				ts_type(f, p);
				if (++i < n)
					fputs(", ", f);
			}
			fputc('}', f);
		} else {
			fputs("object", f);
		}
	} else {
		fputs("any", f);
	}
}

/* The template's render_tool_namespace("functions", tools). */
static void ts_namespace(FILE *f, json_t *tools)
{
	size_t i;
	json_t *t;
	fputs("## functions\n\nnamespace functions {\n\n", f);
	json_array_foreach(tools, i, t)
	{
		json_t *fn = json_object_get(t, "function"),
		       *params = json_object_get(fn, "parameters");
		json_t *props = json_object_get(params, "properties"),
		       *req = json_object_get(params, "required");
		const char *desc = str_of(fn, "description"), *name = str_of(fn, "name");
		fprintf(f, "// %s\ntype %s = ", desc ? desc : "", name ? name : "");
		if (!json_is_object(props) || !json_object_size(props)) {
			fputs("() => any;\n\n", f);
			continue;
		}
		fputs("(_: {\n", f);
		const char *k;
		json_t *p;
		json_object_foreach(props, k, p)
		{
			if (str_of(p, "description"))
				fprintf(f, "// %s\n", str_of(p, "description"));
			fprintf(f, "%s%s: ", k, in_required(req, k) ? "" : "?");
			ts_type(f, p);
			json_t *def = json_object_get(p, "default");
			if (def) {
				if (json_object_get(p, "enum") && json_is_string(def))
					fprintf(f, ", // default: %s", json_string_value(def));
				else if (json_object_get(p, "oneOf") && json_is_string(def))
					fprintf(f, "// default: %s", json_string_value(def));
				else {
					fputs(", // default: ", f);
					put_json(f, def);
				}
			}
			fputs(",\n", f);
		}
		fputs("}) => any;\n\n", f);
	}
	fputs("} // namespace functions", f);
}

/* The first call of an assistant message: its function object (borrowed from *calls, which the
 * caller frees), or NULL. */
static json_t *first_call(const eng_msg_t *m, json_t **calls)
{
	*calls = m->tool_calls ? json_loads(m->tool_calls, 0, NULL) : NULL;
	json_t *c = json_array_get(*calls, 0);
	if (!c)
		return NULL;
	json_t *fn = json_object_get(c, "function");
	return fn ? fn : c;
}

int chat_render_harmony(const eng_msg_t *m, int n, const char *tools_json, int add, char **out,
			char *err, size_t errlen)
{
	*out = NULL;
	json_t *tools = tools_json ? json_loads(tools_json, 0, NULL) : NULL;
	if (tools && (!json_is_array(tools) || !json_array_size(tools))) {
		json_decref(tools);
		tools = NULL;
	}
	char *buf = NULL, date[16];
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f) {
		json_decref(tools);
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory rendering the chat");
	}
	time_t now = time(NULL);
	struct tm tm;
	localtime_r(&now, &tm); /* the template's strftime_now("%Y-%m-%d") */
	strftime(date, sizeof date, "%Y-%m-%d", &tm);
	fprintf(f,
		"<|start|>system<|message|>You are ChatGPT, a large language model trained by "
		"OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: %s\n\nReasoning: medium\n\n# "
		"Valid channels: analysis, commentary, final. Channel must be included for every "
		"message.%s<|end|>",
		date,
		tools ? "\nCalls to these tools must go to the commentary channel: 'functions'."
		      : "");
	int i = 0;
	const char *dev = "";
	if (n > 0 && (is_role(&m[0], "system") || is_role(&m[0], "developer")))
		dev = m[i++].content ? m[0].content : "";
	if (*dev || tools) {
		fputs("<|start|>developer<|message|>", f);
		if (*dev)
			fprintf(f, "# Instructions\n\n%s\n\n", dev);
		if (tools) {
			fputs("# Tools\n\n", f);
			ts_namespace(f, tools);
		}
		fputs("<|end|>", f);
	}
	const char *last_call = NULL; /* the name a tool message answers */
	json_t *held = NULL;          /* the calls array last_call points into */
	for (int k = i; k < n; k++) {
		const char *content = m[k].content ? m[k].content : "";
		if (is_role(&m[k], "assistant")) {
			json_t *calls, *fn = first_call(&m[k], &calls);
			if (fn) {
				int later_final =
				    0; /* a later answer drops this call's reasoning */
				for (int j = k + 1; j < n; j++)
					later_final |=
					    is_role(&m[j], "assistant") && !m[j].tool_calls;
				const char *think = *content ? content : m[k].reasoning;
				if (think && *think && !later_final)
					fprintf(f,
						"<|start|>assistant<|channel|>analysis<|message|>%"
						"s<|end|>",
						think);
				const char *name = str_of(fn, "name");
				fprintf(f,
					"<|start|>assistant to=functions.%s<|channel|>commentary "
					"json<|message|>",
					name ? name : "");
				json_t *a = json_object_get(fn, "arguments");
				json_t *p = json_is_string(a) ? json_loads(json_string_value(a),
									   JSON_DECODE_ANY, NULL)
							      : json_incref(a);
				put_json(f, p ? p : a ? a : json_object());
				json_decref(p);
				fputs("<|call|>", f);
				json_decref(held);
				held = calls;
				last_call = name;
				continue;
			}
			json_decref(calls);
			if (k == n - 1 &&
			    !add) { /* training layout: the reasoning and <|return|> */
				if (m[k].reasoning)
					fprintf(f,
						"<|start|>assistant<|channel|>analysis<|message|>%"
						"s<|end|>",
						m[k].reasoning);
				fprintf(f,
					"<|start|>assistant<|channel|>final<|message|>%s<|return|>",
					content);
			} else {
				fprintf(f, "<|start|>assistant<|channel|>final<|message|>%s<|end|>",
					content);
				last_call = NULL;
			}
		} else if (is_role(&m[k], "tool")) {
			json_t *s = json_string(content);
			fprintf(
			    f, "<|start|>functions.%s to=assistant<|channel|>commentary<|message|>",
			    last_call ? last_call : "");
			if (s)
				put_json(f, s);
			json_decref(s);
			fputs("<|end|>", f);
		} else if (is_role(&m[k], "user")) {
			fprintf(f, "<|start|>user<|message|>%s<|end|>", content);
		}
	}
	if (add)
		fputs("<|start|>assistant", f);
	int bad = ferror(f);
	fclose(f);
	json_decref(held);
	json_decref(tools);
	if (bad || !buf) {
		free(buf);
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory rendering the chat");
	}
	*out = buf;
	return 0;
}

/* ---- parsing a reply ------------------------------------------------------------------------ */

static const char *find(const char *s, const char *end, const char *needle)
{
	size_t k = strlen(needle);
	for (const char *p = s; p + k <= end; p++)
		if (!memcmp(p, needle, k))
			return p;
	return NULL;
}

/* The function name after "to=functions." in [p, end), or NULL; *nlen its length. */
static const char *recipient(const char *p, const char *end, size_t *nlen)
{
	const char *r = find(p, end, "to=functions.");
	if (!r)
		return NULL;
	r += 13;
	const char *e = r;
	while (e < end && *e != ' ' && *e != '<')
		e++;
	*nlen = (size_t)(e - r);
	return *nlen ? r : NULL;
}

/* Bytes at the end of [p, end) that could be the start of a harmony token ("<|e" of <|end|>):
 * held back from an open message until the next token says what they are. */
static size_t partial_tail(const char *p, const char *end)
{
	static const char *const toks[] = {"<|end|>",      "<|call|>",    "<|return|>",
					   "<|start|>",    "<|channel|>", "<|message|>",
					   "<|constrain|>"};
	size_t best = 0, n = (size_t)(end - p);
	for (size_t t = 0; t < ARRAY_LEN(toks); t++)
		for (size_t k = MIN(n, strlen(toks[t]) - 1); k > best; k--)
			if (!memcmp(end - k, toks[t], k)) {
				best = k;
				break;
			}
	return best;
}

static void piece_add(eng_harmony_t *h, int kind, const char *body, const char *e, int open,
		      const char *name, size_t nlen)
{
	if (h->n == ENG_HARMONY_MAX)
		return;
	eng_hpiece_t *pc = &h->piece[h->n++];
	pc->kind = kind;
	pc->p = body;
	pc->len = (size_t)(e - body) - (open ? partial_tail(body, e) : 0);
	pc->name = name;
	pc->name_len = nlen;
	pc->done = !open;
}

void eng_harmony_parse(const char *text, size_t len, int final, eng_harmony_t *h)
{
	memset(h, 0, sizeof *h);
	const char *s = text, *end = text + len;
	if (!find(s, end, "<|channel|>")) { /* no channel: the text is the content */
		piece_add(h, ENG_H_CONTENT, s, end, !final, NULL, 0);
		h->piece[0].done = final;
		return;
	}
	while (s < end) {
		const char *head = s, *ch = find(s, end, "<|channel|>");
		const char *msg = ch ? find(ch, end, "<|message|>") : NULL;
		if (!msg) /* an unfinished header: nothing to report from it yet */
			break;
		const char *body = msg + 11, *e = end;
		static const char *const closers[] = {"<|end|>", "<|call|>", "<|return|>",
						      "<|start|>"};
		size_t clen = 0;
		for (size_t k = 0; k < ARRAY_LEN(closers); k++) {
			const char *c = find(body, e, closers[k]);
			if (c && c < e)
				e = c, clen = strlen(closers[k]);
		}
		if (e != end && !strncmp(e, "<|start|>", 9))
			clen = 0; /* a new message without a closing token: read its header next */
		size_t nlen = 0;
		const char *to = recipient(head, msg, &nlen);
		int open = e == end && !final;
		if (to)
			piece_add(h, ENG_H_CALL, body, e, open, to, nlen);
		else if (!strncmp(ch + 11, "analysis", 8))
			piece_add(h, ENG_H_REASONING, body, e, open, NULL, 0);
		else /* final, or commentary addressed to no one (a preamble) */
			piece_add(h, ENG_H_CONTENT, body, e, open, NULL, 0);
		s = e + clen;
		if ((size_t)(end - s) >= 9 && !memcmp(s, "<|start|>", 9))
			s += 9;
	}
}
