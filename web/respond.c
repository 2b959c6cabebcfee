/*
 * respond.c: the JSON a client receives (replies, streaming chunks, errors) and SSE framing, in
 * the shapes OpenAI's API uses (../shared/docs/formats.md section 5, docs/api.md).
 *
 * Pure functions returning malloc'd strings. Invariant: every string put into JSON is valid
 * UTF-8 (invalid bytes become U+FFFD), because jansson refuses anything else and a token's bytes
 * are not guaranteed to be valid on their own.
 */
#include "web/web_int.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

/* ---- buffer --------------------------------------------------------------------------------- */

int web_buf_add(web_buf_t *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return SH_ENOMEM;
		b->p = p;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = 0;
	return 0;
}

int web_buf_addf(web_buf_t *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	if (n < 0)
		return SH_EINVAL;
	if ((size_t)n < sizeof tmp)
		return web_buf_add(b, tmp, (size_t)n);
	char *big = malloc((size_t)n + 1);
	if (!big)
		return SH_ENOMEM;
	va_start(ap, fmt);
	vsnprintf(big, (size_t)n + 1, fmt, ap);
	va_end(ap);
	int rc = web_buf_add(b, big, (size_t)n);
	free(big);
	return rc;
}

void web_buf_free(web_buf_t *b)
{
	free(b->p);
	memset(b, 0, sizeof *b);
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 when invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	size_t len;
	unsigned min;
	if (c < 0x80)
		return c ? 1 : 0; /* NUL is valid UTF-8 but jansson strings stop there */
	if (c >= 0xc2 && c <= 0xdf)
		len = 2, min = 0x80;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3, min = 0x800;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4, min = 0x10000;
	else
		return 0;
	if (n < len)
		return 0;
	unsigned cp = c & (0x7f >> len);
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

int web_utf8_repair(web_buf_t *out, const char *s, size_t n)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t i = 0;
	while (i < n) {
		size_t k = utf8_seq(u + i, n - i);
		int rc = k ? web_buf_add(out, s + i, k) : web_buf_add(out, "\xef\xbf\xbd", 3);
		if (rc)
			return rc;
		i += k ? k : 1;
	}
	return web_buf_add(out, "", 0);
}

const char *web_find(const char *s, size_t n, const char *needle)
{
	size_t k = strlen(needle);
	for (size_t i = 0; i + k <= n; i++)
		if (!memcmp(s + i, needle, k))
			return s + i;
	return NULL;
}

json_t *web_json_str(const char *s, size_t n)
{
	if (!s)
		return json_stringn("", 0);
	json_t *v = json_stringn(s, n);
	if (v)
		return v;
	web_buf_t b = {0};
	if (web_utf8_repair(&b, s, n) != 0) {
		web_buf_free(&b);
		return NULL;
	}
	v = json_stringn(b.p, b.len);
	web_buf_free(&b);
	return v;
}

char *web_json_dump(json_t *root)
{
	if (!root)
		return NULL;
	char *s = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	return s;
}

/* ---- errors --------------------------------------------------------------------------------- */

char *web_json_error(const web_err_t *e)
{
	json_t *err = json_pack("{s:o, s:s, s:o, s:o}", "message",
				web_json_str(e->message, strlen(e->message)), "type",
				e->type ? e->type : "server_error", "param",
				e->param[0] ? json_string(e->param) : json_null(), "code",
				e->code[0] ? json_string(e->code) : json_null());
	return web_json_dump(json_pack("{s:o}", "error", err));
}

const char *web_finish_name(int finish)
{
	switch (finish) {
	case ENG_FINISH_STOP: return "stop";
	case ENG_FINISH_LENGTH: return "length";
	case WEB_FINISH_TOOL_CALLS: return "tool_calls";
	}
	return NULL;
}

static json_t *finish_json(int finish)
{
	const char *f = web_finish_name(finish);
	return f ? json_string(f) : json_null();
}

/* ---- log-probabilities ---------------------------------------------------------------------- */

static json_t *bytes_json(const char *s, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < n; i++)
		json_array_append_new(a, json_integer((unsigned char)s[i]));
	return a;
}

json_t *web_json_logprob(const char *text, size_t text_len, float logprob, const eng_logprob_t *top,
			 int n_top, char *const *top_texts)
{
	json_t *alts = json_array();
	for (int i = 0; alts && i < n_top; i++) {
		const char *t = top_texts && top_texts[i] ? top_texts[i] : "";
		json_array_append_new(alts, json_pack("{s:o, s:f, s:o}", "token",
						      web_json_str(t, strlen(t)), "logprob",
						      (double)top[i].logprob, "bytes",
						      bytes_json(t, strlen(t))));
	}
	return json_pack("{s:o, s:f, s:o, s:o}", "token", web_json_str(text, text_len), "logprob",
			 (double)logprob, "bytes", bytes_json(text, text_len), "top_logprobs",
			 alts ? alts : json_array());
}

/* The legacy completions shape: {tokens, token_logprobs, top_logprobs, text_offset}; consumes
 * entries (chat-shaped). offset is the text offset of the first entry. */
static json_t *legacy_logprobs(json_t *entries, size_t offset)
{
	json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
	       *offs = json_array();
	size_t i;
	json_t *e;
	json_array_foreach(entries, i, e)
	{
		json_t *tok = json_object_get(e, "token");
		json_array_append(tokens, tok);
		json_array_append(lps, json_object_get(e, "logprob"));
		json_t *m = json_object();
		size_t j;
		json_t *alt;
		json_array_foreach(json_object_get(e, "top_logprobs"), j, alt)
		    json_object_set(m, json_string_value(json_object_get(alt, "token")),
				    json_object_get(alt, "logprob"));
		json_array_append_new(tops, m);
		json_array_append_new(offs, json_integer((json_int_t)offset));
		offset += json_string_length(tok);
	}
	json_decref(entries);
	return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
			 "top_logprobs", tops, "text_offset", offs);
}

static json_t *logprobs_for(int kind, json_t *entries)
{
	if (!entries)
		return json_null();
	if (kind == WEB_COMPLETION)
		return legacy_logprobs(entries, 0);
	return json_pack("{s:o}", "content", entries);
}

/* ---- replies -------------------------------------------------------------------------------- */

static json_t *usage_json(const web_usage_t *u)
{
	return json_pack("{s:i, s:i, s:i}", "prompt_tokens", u->prompt_tokens, "completion_tokens",
			 u->completion_tokens, "total_tokens",
			 u->prompt_tokens + u->completion_tokens);
}

static json_t *envelope(const web_reply_id_t *rid, const char *object, json_t *choices)
{
	return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", rid->id, "object", object, "created",
			 (json_int_t)rid->created, "model", rid->model ? rid->model : "", "choices",
			 choices);
}

char *web_json_reply(const web_reply_id_t *rid, const char *text, size_t text_len, int finish,
		     const web_usage_t *u, json_t *logprobs)
{
	json_t *choice;
	if (rid->kind == WEB_CHAT)
		choice = json_pack("{s:i, s:{s:s, s:o}, s:o, s:o}", "index", 0, "message", "role",
				   "assistant", "content", web_json_str(text, text_len), "logprobs",
				   logprobs_for(WEB_CHAT, logprobs), "finish_reason",
				   finish_json(finish));
	else
		choice = json_pack("{s:o, s:i, s:o, s:o}", "text", web_json_str(text, text_len),
				   "index", 0, "logprobs", logprobs_for(WEB_COMPLETION, logprobs),
				   "finish_reason", finish_json(finish));
	if (rid->reasoning && choice) /* gpt-oss: its analysis channel */
		json_object_set(json_object_get(choice, "message"), "reasoning_content",
				rid->reasoning);
	if (rid->tool_calls && choice) { /* content is the text before the calls, or null */
		json_t *msg = json_object_get(choice, "message");
		if (!text_len)
			json_object_set_new(msg, "content", json_null());
		json_object_set(msg, "tool_calls", rid->tool_calls);
	}
	json_t *root = envelope(rid, rid->kind == WEB_CHAT ? "chat.completion" : "text_completion",
				json_pack("[o]", choice));
	if (root)
		json_object_set_new(root, "usage", usage_json(u));
	return web_json_dump(root);
}

char *web_json_chunk(const web_reply_id_t *rid, const char *role, const char *text, size_t text_len,
		     int finish, int with_usage_null, json_t *logprobs)
{
	json_t *choice;
	if (rid->kind == WEB_CHAT) {
		json_t *delta = json_object();
		if (role)
			json_object_set_new(delta, "role", json_string(role));
		if (text)
			json_object_set_new(delta, "content", web_json_str(text, text_len));
		choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", delta, "logprobs",
				   logprobs_for(WEB_CHAT, logprobs), "finish_reason",
				   finish_json(finish));
	} else {
		choice = json_pack("{s:o, s:i, s:o, s:o}", "text",
				   web_json_str(text, text ? text_len : 0), "index", 0, "logprobs",
				   logprobs_for(WEB_COMPLETION, logprobs), "finish_reason",
				   finish_json(finish));
	}
	json_t *root =
	    envelope(rid, rid->kind == WEB_CHAT ? "chat.completion.chunk" : "text_completion",
		     json_pack("[o]", choice));
	if (root && with_usage_null)
		json_object_set_new(root, "usage", json_null());
	return web_json_dump(root);
}

char *web_json_usage_chunk(const web_reply_id_t *rid, const web_usage_t *u)
{
	json_t *root = envelope(
	    rid, rid->kind == WEB_CHAT ? "chat.completion.chunk" : "text_completion", json_array());
	if (root)
		json_object_set_new(root, "usage", usage_json(u));
	return web_json_dump(root);
}

int web_sse_add(web_buf_t *out, char *json)
{
	if (!json)
		return SH_ENOMEM;
	int rc = web_buf_add(out, "data: ", 6);
	if (!rc)
		rc = web_buf_add(out, json, strlen(json));
	if (!rc)
		rc = web_buf_add(out, "\n\n", 2);
	free(json);
	return rc;
}
