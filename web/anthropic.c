/*
 * anthropic.c: Anthropic's Messages API, for Claude Code and the other agents that speak it:
 * POST /v1/messages (whole or streamed) and POST /v1/messages/count_tokens. The key may come as
 * "x-api-key" (server.c); "anthropic-version" and "anthropic-beta" are accepted and ignored.
 *
 * A request becomes an OpenAI-shaped chat request (request.c checks it): system (a string or
 * text blocks) -> a system message; content blocks text -> content, tool_use (assistant) ->
 * tool_calls with the block's id, tool_result (user) -> a tool message answering that id (its
 * text first, as Anthropic orders them); thinking blocks in the history are dropped; images and
 * documents are refused. max_tokens is required; stop_sequences, temperature, top_p, top_k map to
 * their OpenAI names; tools {name, description, input_schema} -> function tools; tool_choice
 * auto / any / tool / none -> auto / required / the named function / none, and
 * disable_parallel_tool_use -> parallel_tool_calls false; output_config.format json_schema -> the
 * grammar. A last assistant message is a prefill: the reply continues it.
 *
 * Replies follow the SDK's types and stream parser (@anthropic-ai/sdk src/resources/messages,
 * src/core/streaming.ts: every event has an "event:" line, "ping" and unnamed events are skipped,
 * "error" throws; lib/MessageStream.ts accumulates message_start's message, content_block_start
 * blocks, text_delta / input_json_delta / thinking_delta, message_delta's stop_reason and
 * usage.output_tokens): message_start, then per block content_block_start (ping after the
 * first), its deltas, content_block_stop, then message_delta and message_stop. Reasoning (a
 * leading <think>) becomes thinking blocks when the request enables thinking, else it is left
 * out. stop_reason: end_turn, max_tokens, stop_sequence (with stop_sequence), tool_use. Errors:
 * {"type": "error", "error": {"type", "message"}}.
 */
#include "web/web_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

/* ---- errors ------------------------------------------------------------------------------- */

static const char *error_type(const web_err_t *e)
{
	switch (e->status) {
	case 400: return "invalid_request_error";
	case 401: return "authentication_error";
	case 403: return "permission_error";
	case 404: return "not_found_error";
	case 405: return "invalid_request_error";
	case 413: return "request_too_large";
	case 429: return "rate_limit_error";
	case 503: return "overloaded_error";
	}
	return "api_error";
}

static json_t *error_obj(const web_err_t *e)
{
	return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", error_type(e),
			 "message", e->message);
}

static char *error_json(const web_err_t *e)
{
	return web_json_dump(error_obj(e));
}

/* ---- the request -------------------------------------------------------------------------- */

/* One Anthropic message -> OpenAI messages appended to out. */
static int map_message(json_t *m, size_t i, json_t *out, web_err_t *e)
{
	char param[64];
	snprintf(param, sizeof param, "messages.%zu", i);
	const char *role = json_string_value(json_object_get(m, "role"));
	json_t *content = json_object_get(m, "content");
	if (!json_is_object(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant")))
		return web_err_set(e, 400, "invalid_request_error", param, "invalid_value",
				   "%s: role must be \"user\" or \"assistant\"", param);
	if (json_is_string(content)) {
		json_array_append_new(out,
				      json_pack("{s:s, s:O}", "role", role, "content", content));
		return 0;
	}
	if (!json_is_array(content))
		return web_err_set(e, 400, "invalid_request_error", param, "invalid_value",
				   "%s.content must be a string or an array of content blocks",
				   param);
	web_buf_t text = {0};
	json_t *calls = json_array(), *results = json_array();
	size_t k;
	json_t *b;
	int rc = 0;
	json_array_foreach(content, k, b)
	{
		const char *t = json_string_value(json_object_get(b, "type"));
		if (t && !strcmp(t, "text") && json_is_string(json_object_get(b, "text"))) {
			json_t *s = json_object_get(b, "text");
			web_buf_add(&text, json_string_value(s), json_string_length(s));
		} else if (t && !strcmp(t, "tool_use") && !strcmp(role, "assistant")) {
			const char *id = json_string_value(json_object_get(b, "id"));
			const char *name = json_string_value(json_object_get(b, "name"));
			json_t *input = json_object_get(b, "input");
			char *args = input ? json_dumps(input, JSON_COMPACT) : strdup("{}");
			if (!id || !name || !args) {
				free(args);
				rc = web_err_set(
				    e, 400, "invalid_request_error", param, "invalid_value",
				    "%s: a tool_use block needs id, name and input", param);
				break;
			}
			json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id,
							       "type", "function", "function",
							       "name", name, "arguments", args));
			free(args);
		} else if (t && !strcmp(t, "tool_result") && !strcmp(role, "user")) {
			const char *id = json_string_value(json_object_get(b, "tool_use_id"));
			json_t *rcont = json_object_get(b, "content"), *s = NULL;
			if (!id) {
				rc = web_err_set(
				    e, 400, "invalid_request_error", param, "invalid_value",
				    "%s: a tool_result block needs tool_use_id", param);
				break;
			}
			if (!rcont || json_is_null(rcont))
				s = json_string("");
			else if ((rc = web_text_parts(rcont, "tool_result.content", "text", &s, e)))
				break;
			json_array_append_new(results, json_pack("{s:s, s:s, s:o}", "role", "tool",
								 "tool_call_id", id, "content", s));
		} else if (t && (!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking"))) {
			continue; /* earlier reasoning is not shown to the model again */
		} else {
			rc = web_err_set(
			    e, 400, "invalid_request_error", param, "unsupported_value",
			    "%s: content blocks of type '%.40s' are not supported (text, "
			    "tool_use, tool_result)",
			    param, t ? t : "?");
			break;
		}
	}
	if (!rc) {
		json_array_extend(out, results); /* tool results come first in a user turn */
		if (json_array_size(calls)) {
			json_array_append_new(
			    out, json_pack("{s:s, s:s%, s:O}", "role", "assistant", "content",
					   text.p ? text.p : "", text.len, "tool_calls", calls));
		} else if (text.len || !json_array_size(results)) {
			json_array_append_new(out, json_pack("{s:s, s:s%}", "role", role, "content",
							     text.p ? text.p : "", text.len));
		}
	}
	web_buf_free(&text);
	json_decref(calls);
	json_decref(results);
	return rc;
}

/* tools and tool_choice -> OpenAI's. */
static int map_tools(json_t *root, json_t *o, web_err_t *e)
{
	json_t *tools = json_object_get(root, "tools"), *tc = json_object_get(root, "tool_choice");
	if (tools && !json_is_null(tools)) {
		if (!json_is_array(tools))
			return web_err_badf(e, "tools", "'tools' must be an array%s", NULL);
		json_t *ot = json_array();
		size_t i;
		json_t *t;
		json_array_foreach(tools, i, t)
		{
			const char *type = json_string_value(json_object_get(t, "type"));
			const char *name = json_string_value(json_object_get(t, "name"));
			json_t *schema = json_object_get(t, "input_schema");
			if (type && strcmp(type, "custom")) {
				json_decref(ot);
				return web_err_set(
				    e, 400, "invalid_request_error", "tools", "unsupported_value",
				    "tools.%zu: server tools ('%.40s') are not supported; "
				    "give custom tools {name, description, input_schema}",
				    i, type);
			}
			if (!name || (schema && !json_is_object(schema))) {
				json_decref(ot);
				return web_err_set(
				    e, 400, "invalid_request_error", "tools", "invalid_value",
				    "tools.%zu must be {name, description, input_schema}", i);
			}
			json_t *fn = json_pack("{s:s, s:o}", "name", name, "parameters",
					       schema ? json_incref(schema) : json_object());
			json_t *d = json_object_get(t, "description");
			if (json_is_string(d))
				json_object_set(fn, "description", d);
			json_array_append_new(
			    ot, json_pack("{s:s, s:o}", "type", "function", "function", fn));
		}
		json_object_set_new(o, "tools", ot);
	}
	if (!tc || json_is_null(tc))
		return 0;
	const char *type = json_string_value(json_object_get(tc, "type"));
	if (!json_is_object(tc) || !type)
		return web_err_badf(e, "tool_choice",
				    "'tool_choice' must be {\"type\": auto | any | tool | "
				    "none}%s",
				    NULL);
	if (!strcmp(type, "auto"))
		json_object_set_new(o, "tool_choice", json_string("auto"));
	else if (!strcmp(type, "any"))
		json_object_set_new(o, "tool_choice", json_string("required"));
	else if (!strcmp(type, "none"))
		json_object_set_new(o, "tool_choice", json_string("none"));
	else if (!strcmp(type, "tool") && json_is_string(json_object_get(tc, "name")))
		json_object_set_new(o, "tool_choice",
				    json_pack("{s:s, s:{s:O}}", "type", "function", "function",
					      "name", json_object_get(tc, "name")));
	else
		return web_err_badf(
		    e, "tool_choice",
		    "'tool_choice' must be auto, any, none or {\"type\": \"tool\", \"name\"}%s",
		    NULL);
	if (json_is_true(json_object_get(tc, "disable_parallel_tool_use")))
		json_object_set_new(o, "parallel_tool_calls", json_false());
	return 0;
}

/* The Messages body -> r. count: /count_tokens (max_tokens is not required there). */
static int parse_body(web_req_t *r, const char *body, size_t len, int count, web_err_t *e)
{
	json_t *root, *o = json_object(), *msgs = json_array();
	web_req_init(r, WEB_CHAT);
	r->api = WEB_API_MESSAGES;
	int rc = web_json_load(body, len, &root, e);
	if (rc)
		goto out;
	json_t *mt = json_object_get(root, "max_tokens"), *m = json_object_get(root, "messages");
	json_t *sys = json_object_get(root, "system"),
	       *stop = json_object_get(root, "stop_sequences");
	json_t *model = json_object_get(root, "model"), *th = json_object_get(root, "thinking");
	if (model && !json_is_null(model) && !json_is_string(model)) {
		rc = web_err_badf(e, "model", "model: must be a string%s", NULL);
		goto out;
	}
	if (!count && (!mt || json_is_null(mt))) {
		rc = web_err_set(e, 400, "invalid_request_error", "max_tokens",
				 "missing_required_parameter", "max_tokens: Field required");
		goto out;
	}
	if (!json_is_array(m) || !json_array_size(m)) {
		rc = web_err_set(e, 400, "invalid_request_error", "messages",
				 "missing_required_parameter",
				 "messages: at least one message is required");
		goto out;
	}
	if (sys && !json_is_null(sys)) {
		json_t *s;
		if ((rc = web_text_parts(sys, "system", "text", &s, e)))
			goto out;
		json_array_append_new(msgs,
				      json_pack("{s:s, s:o}", "role", "system", "content", s));
	}
	size_t i;
	json_t *mm;
	json_array_foreach(m, i, mm)
	{
		if ((rc = map_message(mm, i, msgs, e)))
			goto out;
	}
	json_object_set(o, "messages", msgs);
	if (mt && !json_is_null(mt))
		json_object_set(o, "max_tokens", mt);
	if (stop && !json_is_null(stop)) {
		if (!json_is_array(stop)) {
			rc = web_err_badf(e, "stop_sequences",
					  "stop_sequences: must be an array of strings%s", NULL);
			goto out;
		}
		json_object_set(o, "stop", stop);
	}
	static const char *const same[] = {"temperature", "top_p", "top_k", "stream"};
	for (size_t k = 0; k < ARRAY_LEN(same); k++) {
		json_t *v = json_object_get(root, same[k]);
		if (v && !json_is_null(v))
			json_object_set(o, same[k], v);
	}
	if (!json_object_get(o, "temperature")) /* Anthropic's default */
		json_object_set_new(o, "temperature", json_real(1.0));
	if (json_is_object(th)) {
		const char *t = json_string_value(json_object_get(th, "type"));
		r->thinking = t && (!strcmp(t, "enabled") || !strcmp(t, "adaptive"));
	}
	json_t *fmt = json_object_get(json_object_get(root, "output_config"), "format");
	if (!fmt)
		fmt = json_object_get(root, "output_format");
	if (json_is_object(fmt)) { /* structured output: the schema constrains the reply */
		const char *t = json_string_value(json_object_get(fmt, "type"));
		if (!t || strcmp(t, "json_schema")) {
			rc = web_err_badf(e, "output_config.format",
					  "output_config.format: only json_schema is supported%s",
					  NULL);
			goto out;
		}
		json_object_set_new(o, "response_format",
				    json_pack("{s:s, s:{s:s, s:O?}}", "type", "json_schema",
					      "json_schema", "name", "output", "schema",
					      json_object_get(fmt, "schema")));
	}
	if ((rc = map_tools(root, o, e)))
		goto out;
	rc = web_req_from_json(r, o, e);
out:
	json_decref(root);
	json_decref(o);
	json_decref(msgs);
	return rc;
}

static int parse_messages(web_t *w, web_req_t *r, const char *body, size_t len, web_err_t *e)
{
	(void)w;
	return parse_body(r, body, len, 0, e);
}

/* The chat prompt; a last assistant message (without tool calls) is a prefill: rendered
 * without it, then its text appended, so the reply continues it. */
static int messages_prompt(eng_t *eng, web_req_t *r, int **ids, int *n_ids, web_err_t *e)
{
	char msg[256] = "";
	const eng_msg_t *last = r->n_msgs > 1 ? &r->msgs[r->n_msgs - 1] : NULL;
	int prefill = last && !strcmp(last->role, "assistant") && !last->tool_calls;
	if (prefill)
		r->n_msgs--;
	int rc = web_chat_prompt(eng, r, ids, n_ids, msg, sizeof msg, e);
	if (prefill)
		r->n_msgs++;
	if (rc >= 400)
		return rc;
	if (rc)
		return web_err_set(e, rc == SH_ENOMEM ? 500 : 400, "invalid_request_error",
				   "messages", "invalid_value", "%s",
				   msg[0] ? msg : "the prompt could not be built");
	if (!prefill || !last->content[0])
		return 0;
	int *more = NULL, n_more = 0;
	if (eng_tokenize(eng, last->content, 0, 0, &more, &n_more, msg, sizeof msg))
		return web_err_oom(e);
	int *all = realloc(*ids, (size_t)(*n_ids + n_more) * sizeof *all);
	if (!all) {
		free(more);
		return web_err_oom(e);
	}
	memcpy(all + *n_ids, more, (size_t)n_more * sizeof *all);
	*ids = all;
	*n_ids += n_more;
	free(more);
	return 0;
}

int web_messages_count_tokens(web_t *w, struct MHD_Connection *c, web_conn_t *cn)
{
	web_req_t r;
	web_err_t err;
	memset(&err, 0, sizeof err);
	int rc = parse_body(&r, cn->body.p ? cn->body.p : "", cn->body.len, 1, &err);
	eng_t *e = rc ? NULL : web_engine_get(w, &err);
	int *ids = NULL, n = 0;
	if (e) {
		rc = messages_prompt(e, &r, &ids, &n, &err);
		web_sched_engine_release(web_sched_of(w));
	}
	web_req_clear(&r);
	free(ids);
	if (!e || rc)
		return web_send_error(w, c, &web_proto_anthropic, &err);
	return web_send_json(w, c, 200, json_pack("{s:i}", "input_tokens", n));
}

/* ---- replies ------------------------------------------------------------------------------ */

/* "msg_..." from the job's id; "toolu_..." from a call's. */
static void msg_id(const web_job_t *j, char *out, size_t len)
{
	const char *h = strchr(j->rid.id, '-');
	snprintf(out, len, "msg_%s", h ? h + 1 : j->rid.id);
}

static json_t *tool_id(json_t *call)
{
	const char *id = json_string_value(json_object_get(call, "id"));
	char buf[64];
	snprintf(buf, sizeof buf, "toolu_%s",
		 id && !strncmp(id, "call_", 5) ? id + 5
		 : id                           ? id
						: "");
	return json_string(buf);
}

static const char *stop_reason(const web_job_t *j)
{
	switch (j->res.finish) {
	case WEB_FINISH_TOOL_CALLS: return "tool_use";
	case ENG_FINISH_LENGTH: return "max_tokens";
	}
	return j->res.stop_hit ? "stop_sequence" : "end_turn";
}

static json_t *stop_sequence(const web_job_t *j)
{
	int k = j->res.stop_hit - 1;
	return j->res.finish == ENG_FINISH_STOP && k >= 0 && k < j->req.n_stop
		   ? json_string(j->req.stop[k])
		   : json_null();
}

static json_t *usage(const web_job_t *j, int out_tokens)
{
	return json_pack("{s:i, s:i, s:i, s:i, s:s}", "input_tokens", j->n_ids,
			 "cache_creation_input_tokens", 0, "cache_read_input_tokens", 0,
			 "output_tokens", out_tokens, "service_tier", "standard");
}

static json_t *message(const web_job_t *j, json_t *content, int out_tokens, int done)
{
	char id[64];
	msg_id(j, id, sizeof id);
	return json_pack("{s:s, s:s, s:s, s:o, s:s, s:o, s:o, s:o, s:n, s:n}", "id", id, "type",
			 "message", "role", "assistant", "content", content, "model", j->model,
			 "stop_reason", done ? json_string(stop_reason(j)) : json_null(),
			 "stop_sequence", done ? stop_sequence(j) : json_null(), "usage",
			 usage(j, out_tokens), "stop_details", "container");
}

static json_t *tool_block(json_t *call)
{
	json_t *fn = json_object_get(call, "function");
	json_t *in = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
	if (!json_is_object(in)) { /* the call's arguments are an object (tools.c checked) */
		json_decref(in);
		in = json_object();
	}
	return json_pack("{s:s, s:o, s:O, s:o}", "type", "tool_use", "id", tool_id(call), "name",
			 json_object_get(fn, "name"), "input", in);
}

static char *reply(web_job_t *j)
{
	const char *t = j->text.p ? j->text.p : "";
	json_t *content = json_array();
	if (j->req.thinking && j->ps.r_len)
		json_array_append_new(
		    content, json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
				       web_json_str(t + j->ps.r0, j->ps.r_len), "signature", ""));
	if (j->ps.c_len || !j->rid.tool_calls)
		json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text",
							 web_json_str(t + j->ps.c0, j->ps.c_len)));
	size_t i;
	json_t *c;
	json_array_foreach(j->rid.tool_calls, i, c) json_array_append_new(content, tool_block(c));
	return web_json_dump(message(j, content, j->res.completion_tokens, 1));
}

/* ---- streaming ---------------------------------------------------------------------------- */

/* "event: NAME\ndata: JSON\n\n" (root taken). */
static void event(web_job_t *j, const char *name, json_t *root)
{
	char *s = web_json_dump(root);
	if (!s)
		return;
	web_buf_addf(&j->out, "event: %s\ndata: ", name);
	web_buf_add(&j->out, s, strlen(s));
	web_buf_add(&j->out, "\n\n", 2);
	free(s);
}

static void block_stop(web_job_t *j)
{
	if (!j->ps.open && !j->ps.r_open)
		return;
	event(j, "content_block_stop",
	      json_pack("{s:s, s:i}", "type", "content_block_stop", "index", j->ps.index - 1));
	j->ps.open = j->ps.r_open = 0;
}

/* Opens block `block` (taken) as the next index; the first gets a ping after it. */
static void block_start(web_job_t *j, json_t *block)
{
	block_stop(j);
	event(j, "content_block_start",
	      json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", j->ps.index,
			"content_block", block));
	if (j->ps.index++ == 0)
		event(j, "ping", json_pack("{s:s}", "type", "ping"));
}

static void start(web_job_t *j)
{
	event(j, "message_start",
	      json_pack("{s:s, s:o}", "type", "message_start", "message",
			message(j, json_array(), 1, 0)));
}

static void delta(web_job_t *j, int reasoning, const char *s, size_t n)
{
	if (reasoning && !j->req.thinking)
		return; /* the client did not ask for thinking */
	if (reasoning && !j->ps.r_open) {
		block_start(j, json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "",
					 "signature", ""));
		j->ps.r_open = 1;
	} else if (!reasoning && !j->ps.open) {
		block_start(j, json_pack("{s:s, s:s}", "type", "text", "text", ""));
		j->ps.open = 1;
	}
	json_t *d =
	    reasoning
		? json_pack("{s:s, s:o}", "type", "thinking_delta", "thinking", web_json_str(s, n))
		: json_pack("{s:s, s:o}", "type", "text_delta", "text", web_json_str(s, n));
	event(j, "content_block_delta",
	      json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index", j->ps.index - 1,
			"delta", d));
}

static void finish(web_job_t *j)
{
	if (j->err.status) {
		event(j, "error", error_obj(&j->err));
		return;
	}
	if (!j->ps.index && !j->rid.tool_calls) { /* an empty reply is one empty text block */
		block_start(j, json_pack("{s:s, s:s}", "type", "text", "text", ""));
		j->ps.open = 1;
	}
	block_stop(j);
	size_t i;
	json_t *c;
	json_array_foreach(j->rid.tool_calls, i, c)
	{
		json_t *fn = json_object_get(c, "function");
		block_start(j, json_pack("{s:s, s:o, s:O, s:{}}", "type", "tool_use", "id",
					 tool_id(c), "name", json_object_get(fn, "name"), "input"));
		j->ps.open = 1;
		event(j, "content_block_delta",
		      json_pack("{s:s, s:i, s:{s:s, s:O}}", "type", "content_block_delta", "index",
				j->ps.index - 1, "delta", "type", "input_json_delta",
				"partial_json", json_object_get(fn, "arguments")));
		block_stop(j);
	}
	event(j, "message_delta",
	      json_pack("{s:s, s:{s:s, s:o}, s:{s:i, s:i}}", "type", "message_delta", "delta",
			"stop_reason", stop_reason(j), "stop_sequence", stop_sequence(j), "usage",
			"input_tokens", j->n_ids, "output_tokens", j->res.completion_tokens));
	event(j, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

const web_proto_t web_proto_anthropic = {.api = WEB_API_MESSAGES,
					 .stream_ctype = "text/event-stream",
					 .keepalive = 1,
					 .start = start,
					 .delta = delta,
					 .finish = finish,
					 .reply = reply,
					 .error = error_json};

const web_endpoint_t web_ep_messages = {WEB_CHAT, &web_proto_anthropic, parse_messages,
					messages_prompt};
