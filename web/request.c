/*
 * request.c: turns a request body into a web_req_t, checking every field a client may get wrong.
 *
 * Pure: no engine, no I/O, no globals; the fuzz target drives it directly. Invariant: on return
 * r owns only malloc'd copies (never pointers into jansson's tree), so the tree is freed here, and
 * a non-zero return always comes with err filled with an OpenAI-style error (status, type, param).
 * Unknown fields are ignored, null counts as absent, as OpenAI's own server does.
 */
#include "web/web_int.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

int web_err_set(web_err_t *e, int status, const char *type, const char *param, const char *code,
		const char *fmt, ...)
{
	va_list ap;
	e->status = status;
	e->type = type;
	snprintf(e->param, sizeof e->param, "%s", param ? param : "");
	snprintf(e->code, sizeof e->code, "%s", code ? code : "");
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof e->message, fmt, ap);
	va_end(ap);
	return status;
}

static int bad(web_err_t *e, const char *param, const char *fmt, const char *detail)
{
	return web_err_set(e, 400, "invalid_request_error", param, "invalid_value", fmt, param,
			   detail ? detail : "");
}

/* A field that must be a number within [lo, hi]; absent or null leaves *out alone. */
int web_get_num(json_t *o, const char *k, double lo, double hi, float *out, web_err_t *e)
{
	json_t *v = json_object_get(o, k);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v))
		return bad(e, k, "'%s' must be a number%s", NULL);
	double d = json_number_value(v);
	if (!(d >= lo && d <= hi)) {
		char r[64];
		snprintf(r, sizeof r, " between %g and %g", lo, hi);
		return bad(e, k, "'%s' must be a number%s", r);
	}
	*out = (float)d;
	return 0;
}

/* A field that must be an integer within [lo, hi]. *given is set when present. */
int web_get_int(json_t *o, const char *k, long long lo, long long hi, long long *out, int *given,
		web_err_t *e)
{
	json_t *v = json_object_get(o, k);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v)) {
		/* 5.0 is an integer to JavaScript clients */
		if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
		    fabs(json_real_value(v)) < 9e15) {
			*out = (long long)json_real_value(v);
		} else {
			return bad(e, k, "'%s' must be an integer%s", NULL);
		}
	} else {
		*out = json_integer_value(v);
	}
	if (*out < lo || *out > hi) {
		char r[80];
		snprintf(r, sizeof r, " between %lld and %lld", lo, hi);
		return bad(e, k, "'%s' must be an integer%s", r);
	}
	if (given)
		*given = 1;
	return 0;
}

int web_get_bool(json_t *o, const char *k, int *out, web_err_t *e)
{
	json_t *v = json_object_get(o, k);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_boolean(v))
		return bad(e, k, "'%s' must be a boolean%s", NULL);
	*out = json_is_true(v);
	return 0;
}

static char *dup_n(const char *s, size_t n)
{
	char *d = malloc(n + 1);
	if (d) {
		memcpy(d, s, n);
		d[n] = 0;
	}
	return d;
}

int web_err_oom(web_err_t *e)
{
	return web_err_set(e, 500, "server_error", NULL, "out_of_memory", "out of memory");
}

int web_err_bad(web_err_t *e, const char *param, const char *msg)
{
	return web_err_set(e, 400, "invalid_request_error", param, "invalid_value", "%s", msg);
}

int web_err_badf(web_err_t *e, const char *param, const char *fmt, const char *detail)
{
	/* fmt is one of the API parsers' own messages with exactly one %s, never a client's */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
	return web_err_set(e, 400, "invalid_request_error", param, "invalid_value", fmt,
			   detail ? detail : "");
#pragma GCC diagnostic pop
}

int web_text_parts(json_t *v, const char *param, const char *types, json_t **out, web_err_t *e)
{
	*out = NULL;
	if (json_is_string(v)) {
		*out = json_incref(v);
		return 0;
	}
	if (!json_is_array(v))
		return web_err_set(e, 400, "invalid_request_error", param, "invalid_type",
				   "'%s' must be a string or an array of parts (%s)", param, types);
	web_buf_t b = {0};
	size_t i;
	json_t *part;
	json_array_foreach(v, i, part)
	{
		const char *t = json_string_value(json_object_get(part, "type"));
		json_t *text = json_object_get(part, "text");
		size_t k = t ? strlen(t) : 0;
		const char *at = t ? strstr(types, t) : NULL;
		int known = at && (at == types || at[-1] == ' ') && (at[k] == ' ' || !at[k]);
		if (t && !strcmp(t, "refusal"))
			continue;
		if (!known || !json_is_string(text)) {
			web_buf_free(&b);
			return web_err_set(e, 400, "invalid_request_error", param, "invalid_type",
					   "'%s': parts of type '%.40s' are not supported (%s)",
					   param, t ? t : "?", types);
		}
		if (web_buf_add(&b, json_string_value(text), json_string_length(text)) != 0) {
			web_buf_free(&b);
			return web_err_oom(e);
		}
	}
	*out = json_stringn(b.p ? b.p : "", b.len);
	web_buf_free(&b);
	return *out ? 0 : web_err_oom(e);
}

/* Message content: a string, or an array of {"type": "text", "text": "..."} parts joined. */
static int get_content(json_t *v, const char *param, char **out, web_err_t *e)
{
	json_t *s = NULL;
	int rc = json_is_null(v) ? 0 : web_text_parts(v, param, "text", &s, e);
	if (rc)
		return rc;
	*out = dup_n(s ? json_string_value(s) : "", s ? json_string_length(s) : 0);
	json_decref(s);
	return *out ? 0 : web_err_oom(e);
}

static int parse_messages(web_req_t *r, json_t *root, web_err_t *e)
{
	json_t *msgs = json_object_get(root, "messages");
	if (!msgs || json_is_null(msgs))
		return web_err_set(e, 400, "invalid_request_error", "messages",
				   "missing_required_parameter", "'messages' is required");
	if (!json_is_array(msgs))
		return bad(e, "messages", "'%s' must be an array of messages%s", NULL);
	size_t n = json_array_size(msgs);
	if (n == 0)
		return web_err_set(e, 400, "invalid_request_error", "messages", "empty_array",
				   "'messages' must contain at least one message");
	if (n > WEB_MSG_MAX)
		return web_err_set(
		    e, 400, "invalid_request_error", "messages", "array_above_max_length",
		    "'messages' has %zu messages; at most %d are accepted", n, WEB_MSG_MAX);
	r->msgs = calloc(n, sizeof *r->msgs);
	if (!r->msgs)
		return web_err_oom(e);
	for (size_t i = 0; i < n; i++) {
		json_t *m = json_array_get(msgs, i);
		char param[64];
		snprintf(param, sizeof param, "messages[%zu]", i);
		if (!json_is_object(m))
			return web_err_set(e, 400, "invalid_request_error", param, "invalid_type",
					   "'%s' must be an object with 'role' and 'content'",
					   param);
		json_t *role = json_object_get(m, "role");
		snprintf(param, sizeof param, "messages[%zu].role", i);
		if (!json_is_string(role))
			return web_err_set(e, 400, "invalid_request_error", param,
					   "missing_required_parameter", "'%s' must be a string",
					   param);
		const char *rs = json_string_value(role);
		/* "developer" is OpenAI's newer name for the system role. */
		const char *canon = !strcmp(rs, "developer") ? "system" : rs;
		if (strcmp(canon, "system") && strcmp(canon, "user") &&
		    strcmp(canon, "assistant") && strcmp(canon, "tool"))
			return web_err_set(
			    e, 400, "invalid_request_error", param, "invalid_value",
			    "'%s': unknown role '%.40s' (expected system, developer, user, "
			    "assistant or tool)",
			    param, rs);
		r->msgs[i].role = dup_n(canon, strlen(canon));
		r->n_msgs = (int)i + 1;
		if (!r->msgs[i].role)
			return web_err_oom(e);
		json_t *content = json_object_get(m, "content");
		snprintf(param, sizeof param, "messages[%zu].content", i);
		int rc = web_msg_parse_tools(&r->msgs[i], m, i, e); /* tool_calls, tool_call_id */
		if (rc)
			return rc;
		if (!content && r->msgs[i].tool_calls) /* an assistant turn that only calls tools */
			content = json_null();
		if (!content)
			return web_err_set(e, 400, "invalid_request_error", param,
					   "missing_required_parameter", "'%s' is required", param);
		char *c = NULL;
		rc = get_content(content, param, &c, e);
		r->msgs[i].content = c;
		if (rc)
			return rc;
	}
	return 0;
}

static int parse_prompt(web_req_t *r, json_t *root, web_err_t *e)
{
	json_t *p = json_object_get(root, "prompt");
	if (!p || json_is_null(p))
		return web_err_set(e, 400, "invalid_request_error", "prompt",
				   "missing_required_parameter", "'prompt' is required");
	if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
		p = json_array_get(p, 0); /* ["text"] is one prompt */
	if (json_is_string(p)) {
		r->prompt = dup_n(json_string_value(p), json_string_length(p));
		return r->prompt ? 0 : web_err_oom(e);
	}
	if (json_is_array(p) && json_array_size(p) > 0) {
		size_t n = json_array_size(p);
		if (json_is_string(json_array_get(p, 0)))
			return web_err_set(
			    e, 400, "invalid_request_error", "prompt", "unsupported_value",
			    "'prompt' holds %zu prompts; only one prompt per request is "
			    "supported",
			    n);
		if (n > (1u << 20))
			return bad(e, "prompt", "'%s' is too long%s", NULL);
		r->prompt_ids = malloc(n * sizeof *r->prompt_ids);
		if (!r->prompt_ids)
			return web_err_oom(e);
		for (size_t i = 0; i < n; i++) {
			json_t *t = json_array_get(p, i);
			if (!json_is_integer(t) || json_integer_value(t) < 0 ||
			    json_integer_value(t) > 0x7fffffff)
				return web_err_set(
				    e, 400, "invalid_request_error", "prompt", "invalid_type",
				    "'prompt' must be a string, an array with one string, "
				    "or an array of token ids");
			r->prompt_ids[i] = (int)json_integer_value(t);
		}
		r->n_prompt_ids = (int)n;
		return 0;
	}
	return web_err_set(e, 400, "invalid_request_error", "prompt", "invalid_type",
			   "'prompt' must be a string, an array with one string, or an array of "
			   "token ids");
}

static int parse_stop(web_req_t *r, json_t *root, web_err_t *e)
{
	json_t *s = json_object_get(root, "stop");
	if (!s || json_is_null(s))
		return 0;
	if (json_is_string(s)) {
		if (json_string_length(s) == 0)
			return 0;
		r->stop[0] = dup_n(json_string_value(s), json_string_length(s));
		if (!r->stop[0])
			return web_err_oom(e);
		r->n_stop = 1;
		return 0;
	}
	if (!json_is_array(s))
		return bad(e, "stop", "'%s' must be a string or an array of strings%s", NULL);
	if (json_array_size(s) > WEB_STOP_MAX)
		return web_err_set(e, 400, "invalid_request_error", "stop",
				   "array_above_max_length",
				   "'stop' has %zu strings; at most %d are accepted",
				   json_array_size(s), WEB_STOP_MAX);
	size_t i;
	json_t *v;
	json_array_foreach(s, i, v)
	{
		if (!json_is_string(v))
			return bad(e, "stop", "'%s' must be a string or an array of strings%s",
				   NULL);
		if (json_string_length(v) == 0)
			continue;
		r->stop[r->n_stop] = dup_n(json_string_value(v), json_string_length(v));
		if (!r->stop[r->n_stop])
			return web_err_oom(e);
		r->n_stop++;
	}
	return 0;
}

static int parse_fields(web_req_t *r, json_t *root, web_err_t *e)
{
	int rc;
	json_t *model = json_object_get(root, "model");
	if (model && !json_is_null(model)) {
		if (!json_is_string(model))
			return bad(e, "model", "'%s' must be a string%s", NULL);
		r->model = dup_n(json_string_value(model), json_string_length(model));
		if (!r->model)
			return web_err_oom(e);
	}
	if ((rc = r->kind == WEB_CHAT ? parse_messages(r, root, e) : parse_prompt(r, root, e)))
		return rc;

	long long v = 0;
	int given = 0;
	if ((rc = web_get_int(root, "n", 1, 1 << 20, &v, &given, e)))
		return rc;
	if (given && v != 1)
		return web_err_set(e, 400, "invalid_request_error", "n", "unsupported_value",
				   "'n' must be 1: one choice per request is supported (got %lld)",
				   v);
	given = 0;
	if ((rc = web_get_int(root, "max_tokens", 1, 1 << 30, &v, &given, e)))
		return rc;
	if (given)
		r->samp.max_tokens = (int)v;
	given = 0;
	if ((rc = web_get_int(root, "max_completion_tokens", 1, 1 << 30, &v, &given, e)))
		return rc;
	if (given)
		r->samp.max_tokens = (int)v;
	if ((rc = web_get_num(root, "temperature", 0, 2, &r->samp.temperature, e)) ||
	    (rc = web_get_num(root, "top_p", 0, 1, &r->samp.top_p, e)) ||
	    (rc = web_get_num(root, "min_p", 0, 1, &r->samp.min_p, e)) ||
	    (rc = web_get_num(root, "presence_penalty", -2, 2, &r->samp.presence_penalty, e)) ||
	    (rc = web_get_num(root, "frequency_penalty", -2, 2, &r->samp.frequency_penalty, e)) ||
	    (rc = web_get_num(root, "repeat_penalty", 0, 10, &r->samp.repeat_penalty, e)))
		return rc;
	given = 0;
	if ((rc = web_get_int(root, "top_k", -1, 1 << 20, &v, &given, e)))
		return rc;
	if (given)
		r->samp.top_k = v < 0 ? 0 : (int)v;
	given = 0;
	/* Seeds arrive as JSON integers of either sign; keep their bits. */
	if ((rc = web_get_int(root, "seed", INT64_MIN, INT64_MAX, &v, &given, e)))
		return rc;
	if (given) {
		r->samp.seed = (uint64_t)v;
		r->seed_given = 1;
	}
	if ((rc = parse_stop(r, root, e)))
		return rc;
	if ((rc = web_get_bool(root, "stream", &r->stream, e)))
		return rc;
	if ((rc = web_get_bool(root, "ignore_eos", &r->samp.ignore_eos, e)))
		return rc;
	json_t *so = json_object_get(root, "stream_options");
	if (so && !json_is_null(so)) {
		if (!json_is_object(so))
			return bad(e, "stream_options", "'%s' must be an object%s", NULL);
		if ((rc = web_get_bool(so, "include_usage", &r->include_usage, e)))
			return rc;
	}

	/* logprobs: a boolean for chat (with top_logprobs 0..20), an integer 0..5 for completions.
	 */
	json_t *lp = json_object_get(root, "logprobs");
	if (r->kind == WEB_CHAT) {
		if ((rc = web_get_bool(root, "logprobs", &r->logprobs, e)))
			return rc;
		given = 0;
		if ((rc = web_get_int(root, "top_logprobs", 0, 20, &v, &given, e)))
			return rc;
		if (given) {
			if (v > 0 && !r->logprobs)
				return web_err_set(e, 400, "invalid_request_error", "top_logprobs",
						   "invalid_value",
						   "'top_logprobs' needs 'logprobs' set to true");
			r->samp.top_logprobs = (int)v;
		}
	} else if (lp && !json_is_null(lp)) {
		if (json_is_boolean(lp)) {
			r->logprobs = json_is_true(lp);
		} else {
			if ((rc = web_get_int(root, "logprobs", 0, 5, &v, NULL, e)))
				return rc;
			r->logprobs = 1;
			r->samp.top_logprobs = (int)v;
		}
	}
	json_t *user = json_object_get(root, "user");
	if (user && !json_is_null(user) && !json_is_string(user))
		return bad(e, "user", "'%s' must be a string%s", NULL);
	return web_req_parse_tools(r, root, e); /* tools, tool_choice, response_format */
}

/*
 * Bounds the tree jansson would build before it builds it: one linear pass counts containers
 * (objects and arrays, ~250 bytes each once parsed), values (every comma separates two) and the
 * deepest nesting, skipping strings. A 500 KiB body of "{}," would otherwise become a tree of
 * ~40 MB. Whether the text is valid JSON is left to jansson. Returns 0 or 413 with err filled.
 */
static int json_prescan(const char *s, size_t len, web_err_t *err)
{
	size_t containers = 0, values = 1;
	int depth = 0, in_str = 0;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (in_str) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_str = 0;
			continue;
		}
		switch (c) {
		case '"': in_str = 1; break;
		case ',': values++; break;
		case '{':
		case '[':
			containers++;
			if (++depth > WEB_JSON_DEPTH_MAX)
				return web_err_set(err, 413, "invalid_request_error", NULL,
						   "request_too_complex",
						   "the JSON body nests deeper than %d levels",
						   WEB_JSON_DEPTH_MAX);
			break;
		case '}':
		case ']': depth--; break;
		}
		if (containers > WEB_JSON_CONTAINERS_MAX ||
		    values + containers > WEB_JSON_VALUES_MAX)
			return web_err_set(
			    err, 413, "invalid_request_error", NULL, "request_too_complex",
			    "the JSON body has more than %d objects and arrays or %d values",
			    WEB_JSON_CONTAINERS_MAX, WEB_JSON_VALUES_MAX);
	}
	return 0;
}

int web_json_load(const char *body, size_t len, json_t **root, web_err_t *err)
{
	*root = NULL;
	if (len == 0)
		return web_err_set(err, 400, "invalid_request_error", NULL, "invalid_json",
				   "the request body is empty; expected a JSON object");
	json_error_t je;
	int pre = json_prescan(body, len, err);
	if (pre)
		return pre;
	json_t *v = json_loadb(body, len, 0, &je);
	if (!v)
		return web_err_set(err, 400, "invalid_request_error", NULL, "invalid_json",
				   "the body is not valid JSON: %.120s (line %d, column %d)",
				   je.text, je.line, je.column);
	if (!json_is_object(v)) {
		json_decref(v);
		return web_err_set(err, 400, "invalid_request_error", NULL, "invalid_json",
				   "the body must be a JSON object");
	}
	*root = v;
	return 0;
}

void web_req_init(web_req_t *r, int kind)
{
	memset(r, 0, sizeof *r);
	r->kind = kind;
	r->api = kind == WEB_COMPLETION ? WEB_API_COMPLETIONS : WEB_API_CHAT;
	eng_sampling_default(&r->samp);
	/* OpenAI's defaults: temperature 1, nucleus off; the engine's neutral default is greedy. */
	r->samp.temperature = 1.0f;
	r->samp.top_p = 1.0f;
}

int web_req_from_json(web_req_t *r, json_t *root, web_err_t *err)
{
	int rc = parse_fields(r, root, err);
	r->samp.stop = (const char *const *)r->stop;
	r->samp.n_stop = r->n_stop;
	return rc;
}

int web_req_parse(web_req_t *r, int kind, const char *body, size_t len, web_err_t *err)
{
	web_req_init(r, kind);
	memset(err, 0, sizeof *err);
	json_t *root;
	int rc = web_json_load(body, len, &root, err);
	if (!rc)
		rc = web_req_from_json(r, root, err);
	json_decref(root);
	return rc;
}

void web_req_clear(web_req_t *r)
{
	if (!r)
		return;
	free(r->model);
	for (int i = 0; i < r->n_msgs; i++) {
		free((char *)r->msgs[i].role);
		free((char *)r->msgs[i].content);
		free((char *)r->msgs[i].tool_calls);
		free((char *)r->msgs[i].tool_call_id);
		free((char *)r->msgs[i].reasoning);
	}
	free(r->tools);
	eng_grammar_free(r->grammar);
	free(r->msgs);
	free(r->prompt);
	free(r->prompt_ids);
	for (int i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	json_decref(r->echo);
	json_decref(r->history);
	free(r->ctx_ids);
	for (int i = 0; i < r->n_inputs; i++) {
		if (r->inputs)
			free(r->inputs[i]);
		if (r->input_ids)
			free(r->input_ids[i]);
	}
	free(r->inputs);
	free(r->input_ids);
	free(r->input_len);
	memset(r, 0, sizeof *r);
}
