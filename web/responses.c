/*
 * responses.c: OpenAI's Responses API (POST /v1/responses), what Codex CLI and the newer OpenAI
 * SDKs call, and the bounded in-memory store behind previous_response_id.
 *
 * A request becomes an OpenAI-shaped chat request (request.c checks it): instructions -> a
 * system message; input as a string (one user message) or items: messages (role user, assistant,
 * system, developer; content a string or input_text / output_text parts), function_call items ->
 * an assistant message's tool_calls, function_call_output -> a tool message answering call_id;
 * reasoning items are skipped; images, files and other item types are refused.
 * max_output_tokens -> max_tokens; text.format (text, json_object, json_schema) -> the grammar;
 * function tools {type: "function", name, description, parameters} -> chat tools; tool_choice
 * auto / none / required / {type: "function", name}; previous_response_id puts the stored
 * conversation (its input and output items) before the input; store (default true) keeps this
 * one. The store holds at most WEB_RSTORE_ITEMS responses and WEB_RSTORE_BYTES of their items;
 * the oldest go first; it lives in memory and is lost at restart.
 *
 * The reply is a response object; a stream is "event: TYPE\ndata: JSON\n\n" events, each with
 * its sequence_number: response.created, response.in_progress, then per output item
 * response.output_item.added, its parts (content_part.added, output_text.delta ...,
 * output_text.done, content_part.done; reasoning_text.* for reasoning; function_call_arguments
 * .delta / .done for a call), response.output_item.done, and at the end response.completed with
 * the whole response (usage included). The openai SDK checks all of it (7.x,
 * src/internal/responses/response-accumulator.ts: every item-scoped event names an item id and an
 * output index that exist, items are appended in order, response.completed's output holds every
 * item that was opened, with the same ids); the order and fields follow OpenAI's streaming
 * reference and Ollama's converter (openai/responses.go, ResponsesStreamConverter). A reply cut by
 * max_output_tokens is reported with incomplete_details {reason: "max_output_tokens"} and still
 * ends with response.completed, as Ollama's does, so clients waiting for it finish. A failure
 * mid-stream is response.failed.
 */
#include "web/web_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"

/* ---- the store ---------------------------------------------------------------------------- */

typedef struct rs_entry {
	char id[80];
	char *items; /* the conversation: input and output items, JSON text */
	size_t bytes;
} rs_entry_t;

struct web_rstore {
	pthread_mutex_t mu;
	rs_entry_t *e; /* ring of max_items; oldest at head */
	int head, n, max_items;
	size_t bytes, max_bytes;
};

web_rstore_t *web_rstore_new(size_t max_bytes, int max_items)
{
	web_rstore_t *s = calloc(1, sizeof *s);
	if (!s || !(s->e = calloc((size_t)max_items, sizeof *s->e))) {
		free(s);
		return NULL;
	}
	pthread_mutex_init(&s->mu, NULL);
	s->max_items = max_items;
	s->max_bytes = max_bytes;
	return s;
}

void web_rstore_free(web_rstore_t *s)
{
	if (!s)
		return;
	for (int i = 0; i < s->max_items; i++)
		free(s->e[i].items);
	pthread_mutex_destroy(&s->mu);
	free(s->e);
	free(s);
}

static void drop_oldest(web_rstore_t *s)
{
	rs_entry_t *o = &s->e[s->head];
	s->bytes -= o->bytes;
	free(o->items);
	memset(o, 0, sizeof *o);
	s->head = (s->head + 1) % s->max_items;
	s->n--;
}

void web_rstore_put(web_rstore_t *s, const char *id, char *items)
{
	size_t b = items ? strlen(items) : 0;
	if (!s || !items || b > s->max_bytes) {
		free(items);
		return;
	}
	pthread_mutex_lock(&s->mu);
	while (s->n && (s->n == s->max_items || s->bytes + b > s->max_bytes))
		drop_oldest(s);
	rs_entry_t *e = &s->e[(s->head + s->n) % s->max_items];
	snprintf(e->id, sizeof e->id, "%s", id);
	e->items = items;
	e->bytes = b;
	s->bytes += b;
	s->n++;
	pthread_mutex_unlock(&s->mu);
}

json_t *web_rstore_get(web_rstore_t *s, const char *id)
{
	json_t *v = NULL;
	if (!s)
		return NULL;
	pthread_mutex_lock(&s->mu);
	for (int i = 0; i < s->n; i++) {
		rs_entry_t *e = &s->e[(s->head + i) % s->max_items];
		if (!strcmp(e->id, id)) {
			v = json_loads(e->items, 0, NULL);
			break;
		}
	}
	pthread_mutex_unlock(&s->mu);
	return v;
}

/* ---- the request -------------------------------------------------------------------------- */

/* Input items -> OpenAI chat messages appended to out. */
static int map_items(json_t *items, json_t *out, web_err_t *e)
{
	size_t i;
	json_t *it;
	json_array_foreach(items, i, it)
	{
		char param[48];
		snprintf(param, sizeof param, "input[%zu]", i);
		if (!json_is_object(it))
			return web_err_badf(e, param, "'%s' must be an object", param);
		const char *type = json_string_value(json_object_get(it, "type"));
		const char *role = json_string_value(json_object_get(it, "role"));
		json_t *last = json_array_get(out, json_array_size(out) - 1);
		int rc;
		if (!type || !strcmp(type, "message")) {
			json_t *text;
			if (!role)
				return web_err_badf(e, param, "'%s' needs a role", param);
			if ((rc = web_text_parts(json_object_get(it, "content"), param,
						 "input_text output_text text", &text, e)))
				return rc;
			json_array_append_new(
			    out, json_pack("{s:s, s:o}", "role", role, "content", text));
		} else if (!strcmp(type, "function_call")) {
			json_t *id = json_object_get(it, "call_id"),
			       *name = json_object_get(it, "name");
			json_t *args = json_object_get(it, "arguments");
			if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args))
				return web_err_badf(
				    e, param,
				    "'%s': a function_call needs call_id, name and arguments",
				    param);
			json_t *call =
			    json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function",
				      "function", "name", name, "arguments", args);
			const char *lr = json_string_value(json_object_get(last, "role"));
			if (lr && !strcmp(lr, "assistant")) { /* calls of one turn join it */
				json_t *tc = json_object_get(last, "tool_calls");
				if (!tc)
					json_object_set_new(last, "tool_calls", tc = json_array());
				json_array_append_new(tc, call);
			} else {
				json_array_append_new(out, json_pack("{s:s, s:s, s:[o]}", "role",
								     "assistant", "content", "",
								     "tool_calls", call));
			}
		} else if (!strcmp(type, "function_call_output")) {
			json_t *id = json_object_get(it, "call_id"), *text;
			if (!json_is_string(id))
				return web_err_badf(
				    e, param, "'%s': a function_call_output needs call_id", param);
			if ((rc = web_text_parts(json_object_get(it, "output"), param,
						 "input_text output_text text", &text, e)))
				return rc;
			json_array_append_new(out, json_pack("{s:s, s:O, s:o}", "role", "tool",
							     "tool_call_id", id, "content", text));
		} else if (!strcmp(type, "reasoning")) {
			continue; /* earlier reasoning is not shown to the model again */
		} else {
			return web_err_set(
			    e, 400, "invalid_request_error", param, "unsupported_value",
			    "'%s': items of type '%.40s' are not supported (message, "
			    "function_call, function_call_output, reasoning)",
			    param, type);
		}
	}
	return 0;
}

/* tools, tool_choice and text.format -> OpenAI chat's. */
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
			json_t *name = json_object_get(t, "name"),
			       *params = json_object_get(t, "parameters");
			if (!type || strcmp(type, "function") || !json_is_string(name)) {
				json_decref(ot);
				return web_err_set(
				    e, 400, "invalid_request_error", "tools", "unsupported_value",
				    "tools[%zu]: only function tools {type: \"function\", "
				    "name, description, parameters} are supported",
				    i);
			}
			json_t *fn = json_pack("{s:O}", "name", name);
			if (params && !json_is_null(params))
				json_object_set(fn, "parameters", params);
			if (json_is_string(json_object_get(t, "description")))
				json_object_set(fn, "description",
						json_object_get(t, "description"));
			json_array_append_new(
			    ot, json_pack("{s:s, s:o}", "type", "function", "function", fn));
		}
		json_object_set_new(o, "tools", ot);
	}
	if (tc && !json_is_null(tc)) {
		if (json_is_string(tc))
			json_object_set(o, "tool_choice", tc);
		else if (json_is_object(tc) && json_is_string(json_object_get(tc, "name")))
			json_object_set_new(o, "tool_choice",
					    json_pack("{s:s, s:{s:O}}", "type", "function",
						      "function", "name",
						      json_object_get(tc, "name")));
		else
			return web_err_badf(
			    e, "tool_choice",
			    "'tool_choice' must be auto, none, required or {\"type\": "
			    "\"function\", \"name\"}%s",
			    NULL);
	}
	json_t *fmt = json_object_get(json_object_get(root, "text"), "format");
	if (json_is_object(fmt)) {
		const char *type = json_string_value(json_object_get(fmt, "type"));
		if (type && !strcmp(type, "json_schema"))
			json_object_set_new(o, "response_format",
					    json_pack("{s:s, s:{s:O?, s:O?, s:O?}}", "type",
						      "json_schema", "json_schema", "name",
						      json_object_get(fmt, "name"), "schema",
						      json_object_get(fmt, "schema"), "strict",
						      json_object_get(fmt, "strict")));
		else if (type && (!strcmp(type, "json_object") || !strcmp(type, "text")))
			json_object_set_new(o, "response_format", json_pack("{s:s}", "type", type));
		else
			return web_err_badf(
			    e, "text.format",
			    "'text.format.type' must be text, json_object or json_schema%s", NULL);
	}
	return 0;
}

/* The request's fields a response object repeats. */
static json_t *echo_of(json_t *root)
{
	json_t *ec = json_object();
	static const char *const keys[] = {"instructions",
					   "max_output_tokens",
					   "previous_response_id",
					   "metadata",
					   "reasoning",
					   "tools",
					   "tool_choice",
					   "temperature",
					   "top_p",
					   "parallel_tool_calls",
					   "text",
					   "truncation",
					   "user",
					   "store"};
	for (size_t i = 0; i < ARRAY_LEN(keys); i++) {
		json_t *v = json_object_get(root, keys[i]);
		json_object_set(ec, keys[i], v ? v : json_null());
	}
	/* OpenAI's defaults where the request says nothing */
	if (json_is_null(json_object_get(ec, "tools")))
		json_object_set_new(ec, "tools", json_array());
	if (json_is_null(json_object_get(ec, "tool_choice")))
		json_object_set_new(ec, "tool_choice", json_string("auto"));
	if (json_is_null(json_object_get(ec, "temperature")))
		json_object_set_new(ec, "temperature", json_real(1.0));
	if (json_is_null(json_object_get(ec, "top_p")))
		json_object_set_new(ec, "top_p", json_real(1.0));
	if (json_is_null(json_object_get(ec, "parallel_tool_calls")))
		json_object_set_new(ec, "parallel_tool_calls", json_true());
	if (json_is_null(json_object_get(ec, "text")))
		json_object_set_new(ec, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
	if (json_is_null(json_object_get(ec, "truncation")))
		json_object_set_new(ec, "truncation", json_string("disabled"));
	if (json_is_null(json_object_get(ec, "metadata")))
		json_object_set_new(ec, "metadata", json_object());
	if (json_is_null(json_object_get(ec, "reasoning")))
		json_object_set_new(ec, "reasoning", json_pack("{s:n, s:n}", "effort", "summary"));
	if (json_is_null(json_object_get(ec, "store")))
		json_object_set_new(ec, "store", json_true());
	return ec;
}

static int parse_responses(web_t *w, web_req_t *r, const char *body, size_t len, web_err_t *e)
{
	json_t *root, *o = json_object(), *msgs = json_array(), *hist = NULL;
	web_req_init(r, WEB_CHAT);
	r->api = WEB_API_RESPONSES;
	r->store = web_rstore_of(w);
	int rc = web_json_load(body, len, &root, e);
	if (rc)
		goto out;
	json_t *input = json_object_get(root, "input"),
	       *ins = json_object_get(root, "instructions");
	json_t *prev = json_object_get(root, "previous_response_id");
	if (ins && !json_is_null(ins) && !json_is_string(ins)) {
		rc = web_err_badf(e, "instructions", "'instructions' must be a string%s", NULL);
		goto out;
	}
	if (!input || json_is_null(input) || (!json_is_string(input) && !json_is_array(input))) {
		rc = web_err_set(e, 400, "invalid_request_error", "input",
				 "missing_required_parameter",
				 "'input' must be a string or an array of items");
		goto out;
	}
	if (prev && !json_is_null(prev)) {
		if (!json_is_string(prev)) {
			rc = web_err_badf(e, "previous_response_id",
					  "'previous_response_id' must be a string%s", NULL);
			goto out;
		}
		if (!(hist = web_rstore_get(r->store, json_string_value(prev)))) {
			rc = web_err_set(e, 400, "invalid_request_error", "previous_response_id",
					 "previous_response_not_found",
					 "Previous response with id '%.80s' not found (shoal keeps "
					 "the last %d stored responses in memory).",
					 json_string_value(prev), WEB_RSTORE_ITEMS);
			goto out;
		}
	}
	if (!hist)
		hist = json_array();
	if (json_is_string(input))
		json_array_append_new(hist, json_pack("{s:s, s:s, s:O}", "type", "message", "role",
						      "user", "content", input));
	else
		json_array_extend(hist, input);
	if (json_is_string(ins) && json_string_length(ins))
		json_array_append_new(msgs,
				      json_pack("{s:s, s:O}", "role", "system", "content", ins));
	if ((rc = map_items(hist, msgs, e)) || (rc = map_tools(root, o, e)))
		goto out;
	if (!json_array_size(msgs)) {
		rc = web_err_badf(e, "input", "'input' holds no message%s", NULL);
		goto out;
	}
	json_object_set(o, "messages", msgs);
	static const char *const same[] = {"temperature",         "top_p",        "stream",
					   "parallel_tool_calls", "top_logprobs", "user"};
	for (size_t k = 0; k < ARRAY_LEN(same); k++) {
		json_t *v = json_object_get(root, same[k]);
		if (v && !json_is_null(v) && strcmp(same[k], "top_logprobs"))
			json_object_set(o, same[k], v);
	}
	json_t *mot = json_object_get(root, "max_output_tokens");
	if (mot && !json_is_null(mot))
		json_object_set(o, "max_tokens", mot);
	if ((rc = web_req_from_json(r, o, e)))
		goto out;
	r->store_reply = !json_is_false(json_object_get(root, "store"));
	r->echo = echo_of(root);
	r->history = json_incref(hist);
out:
	json_decref(hist);
	json_decref(root);
	json_decref(o);
	json_decref(msgs);
	return rc;
}

/* ---- the response ------------------------------------------------------------------------- */

/* "resp_<hex>", "msg_<hex>", "rs_<hex>" from the job's id. */
static void ident(const web_job_t *j, const char *prefix, char *out, size_t len)
{
	const char *h = strchr(j->rid.id, '-');
	snprintf(out, len, "%s_%s", prefix, h ? h + 1 : j->rid.id);
}

static json_t *usage(const web_job_t *j)
{
	int in = j->n_ids, out = j->res.completion_tokens;
	return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", in,
			 "input_tokens_details", "cached_tokens", 0, "output_tokens", out,
			 "output_tokens_details", "reasoning_tokens", 0, "total_tokens", in + out);
}

/* The response object; output (taken) NULL = []. */
static json_t *response(const web_job_t *j, const char *status, json_t *output, int done)
{
	char id[80];
	ident(j, "resp", id, sizeof id);
	json_t *r = json_pack("{s:s, s:s, s:I, s:s, s:n, s:s, s:o}", "id", id, "object", "response",
			      "created_at", (json_int_t)j->rid.created, "status", status, "error",
			      "model", j->model, "output", output ? output : json_array());
	json_object_update(r, j->req.echo);
	json_object_set_new(r, "incomplete_details",
			    done && j->res.finish == ENG_FINISH_LENGTH
				? json_pack("{s:s}", "reason", "max_output_tokens")
				: json_null());
	json_object_set_new(r, "usage", done ? usage(j) : json_null());
	json_object_set_new(r, "completed_at",
			    done ? json_integer((json_int_t)time(NULL)) : json_null());
	return r;
}

static json_t *reasoning_item(const web_job_t *j, const char *text, size_t n)
{
	char id[80];
	ident(j, "rs", id, sizeof id);
	return json_pack("{s:s, s:s, s:[], s:[{s:s, s:o}]}", "id", id, "type", "reasoning",
			 "summary", "content", "type", "reasoning_text", "text",
			 web_json_str(text, n));
}

static json_t *output_text(const char *text, size_t n)
{
	return json_pack("{s:s, s:o, s:[], s:[]}", "type", "output_text", "text",
			 web_json_str(text, n), "annotations", "logprobs");
}

static json_t *message_item(const web_job_t *j, const char *text, size_t n, const char *status)
{
	char id[80];
	ident(j, "msg", id, sizeof id);
	return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "status", status,
			 "role", "assistant", "content",
			 text ? json_pack("[o]", output_text(text, n)) : json_array());
}

static json_t *call_item(const web_job_t *j, json_t *call, size_t k, int done)
{
	char id[96], base[80];
	ident(j, "fc", base, sizeof base);
	snprintf(id, sizeof id, "%s_%zu", base, k);
	json_t *fn = json_object_get(call, "function");
	/* a reference of our own either way: "o" takes it (and frees it when the pack fails) */
	json_t *args = done ? json_incref(json_object_get(fn, "arguments")) : json_string("");
	return json_pack("{s:s, s:s, s:s, s:O, s:O, s:o}", "id", id, "type", "function_call",
			 "status", done ? "completed" : "in_progress", "call_id",
			 json_object_get(call, "id"), "name", json_object_get(fn, "name"),
			 "arguments", args);
}

/* Every output item of a finished job, in order: reasoning, the message, the calls. */
static json_t *outputs(const web_job_t *j)
{
	const char *t = j->text.p ? j->text.p : "";
	json_t *out = json_array();
	if (j->ps.r_len)
		json_array_append_new(out, reasoning_item(j, t + j->ps.r0, j->ps.r_len));
	if (j->ps.c_len || j->tc_sent || !j->rid.tool_calls) /* as streamed */
		json_array_append_new(out, message_item(j, t + j->ps.c0, j->ps.c_len, "completed"));
	size_t k;
	json_t *c;
	json_array_foreach(j->rid.tool_calls, k, c)
	    json_array_append_new(out, call_item(j, c, k, 1));
	return out;
}

/* Keeps the conversation (input items, then output) for a later previous_response_id. */
static void remember(const web_job_t *j, json_t *out)
{
	if (!j->req.store_reply || !j->req.store || !j->req.history)
		return;
	json_t *all = json_copy(j->req.history);
	json_array_extend(all, out);
	char id[80];
	ident(j, "resp", id, sizeof id);
	web_rstore_put(j->req.store, id, web_json_dump(all));
}

static char *reply(web_job_t *j)
{
	json_t *out = outputs(j);
	remember(j, out);
	return web_json_dump(response(j, "completed", out, 1));
}

/* ---- streaming ---------------------------------------------------------------------------- */

/* "event: TYPE\ndata: {...}\n\n" with type and the next sequence_number added (root taken). */
static void event(web_job_t *j, const char *type, json_t *root)
{
	if (!root)
		return;
	json_object_set_new(root, "type", json_string(type));
	json_object_set_new(root, "sequence_number", json_integer(j->ps.seq_no++));
	char *s = web_json_dump(root);
	if (!s)
		return;
	web_buf_addf(&j->out, "event: %s\ndata: ", type);
	web_buf_add(&j->out, s, strlen(s));
	web_buf_add(&j->out, "\n\n", 2);
	free(s);
}

static void item_added(web_job_t *j, json_t *item)
{
	event(j, "response.output_item.added",
	      json_pack("{s:i, s:o}", "output_index", j->ps.index, "item", item));
}

static void item_done(web_job_t *j, json_t *item)
{
	event(j, "response.output_item.done",
	      json_pack("{s:i, s:o}", "output_index", j->ps.index++, "item", item));
}

/* The part events of the open reasoning or message item: "added" or "done". */
static void part(web_job_t *j, int reasoning, const char *what, const char *text, size_t n)
{
	char type[48];
	snprintf(type, sizeof type, "response.content_part.%s", what);
	json_t *p = reasoning ? json_pack("{s:s, s:o}", "type", "reasoning_text", "text",
					  web_json_str(text, n))
			      : output_text(text, n);
	event(j, type,
	      json_pack("{s:s, s:i, s:i, s:o}", "item_id",
			reasoning ? j->ps.r_item_id : j->ps.item_id, "output_index", j->ps.index,
			"content_index", 0, "part", p));
}

static void close_reasoning(web_job_t *j)
{
	if (!j->ps.r_open)
		return;
	const char *t = j->text.p + j->ps.r0;
	size_t n = j->ps.r_sent;
	event(j, "response.reasoning_text.done",
	      json_pack("{s:s, s:i, s:i, s:o}", "item_id", j->ps.r_item_id, "output_index",
			j->ps.index, "content_index", 0, "text", web_json_str(t, n)));
	part(j, 1, "done", t, n);
	item_done(j, reasoning_item(j, t, n));
	j->ps.r_open = 0;
}

static void open_message(web_job_t *j)
{
	close_reasoning(j);
	ident(j, "msg", j->ps.item_id, sizeof j->ps.item_id);
	item_added(j, message_item(j, NULL, 0, "in_progress"));
	part(j, 0, "added", "", 0);
	j->ps.open = 1;
}

static void start(web_job_t *j)
{
	event(j, "response.created",
	      json_pack("{s:o}", "response", response(j, "in_progress", NULL, 0)));
	event(j, "response.in_progress",
	      json_pack("{s:o}", "response", response(j, "in_progress", NULL, 0)));
}

static void delta(web_job_t *j, int reasoning, const char *s, size_t n)
{
	if (reasoning) {
		if (!j->ps.r_open) {
			char id[80];
			ident(j, "rs", id, sizeof id);
			snprintf(j->ps.r_item_id, sizeof j->ps.r_item_id, "%s", id);
			item_added(j, json_pack("{s:s, s:s, s:[], s:[]}", "id", id, "type",
						"reasoning", "summary", "content"));
			part(j, 1, "added", "", 0);
			j->ps.r_open = 1;
		}
		event(j, "response.reasoning_text.delta",
		      json_pack("{s:s, s:i, s:i, s:o}", "item_id", j->ps.r_item_id, "output_index",
				j->ps.index, "content_index", 0, "delta", web_json_str(s, n)));
		return;
	}
	if (!j->ps.open)
		open_message(j);
	event(j, "response.output_text.delta",
	      json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", j->ps.item_id, "output_index",
			j->ps.index, "content_index", 0, "delta", web_json_str(s, n), "logprobs"));
}

static void finish(web_job_t *j)
{
	if (j->err.status) {
		json_t *r = response(j, "failed", NULL, 0);
		json_object_set_new(r, "error",
				    json_pack("{s:s, s:s}", "code",
					      j->err.code[0] ? j->err.code : "server_error",
					      "message", j->err.message));
		event(j, "response.failed", json_pack("{s:o}", "response", r));
		return;
	}
	close_reasoning(j);
	const char *t = j->text.p ? j->text.p + j->ps.c0 : "";
	if (!j->ps.open && !j->rid.tool_calls) /* an empty reply is one empty message */
		open_message(j);
	if (j->ps.open) {
		size_t n = j->tc_sent; /* what went out as deltas */
		event(j, "response.output_text.done",
		      json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", j->ps.item_id,
				"output_index", j->ps.index, "content_index", 0, "text",
				web_json_str(t, n), "logprobs"));
		part(j, 0, "done", t, n);
		item_done(j, message_item(j, t, n, "completed"));
		j->ps.open = 0;
	}
	size_t k;
	json_t *c;
	json_array_foreach(j->rid.tool_calls, k, c)
	{
		json_t *item = call_item(j, c, k, 1);
		json_t *args = json_object_get(item, "arguments");
		const char *id = json_string_value(json_object_get(item, "id"));
		item_added(j, call_item(j, c, k, 0));
		event(j, "response.function_call_arguments.delta",
		      json_pack("{s:s, s:i, s:O}", "item_id", id, "output_index", j->ps.index,
				"delta", args));
		event(j, "response.function_call_arguments.done",
		      json_pack("{s:s, s:i, s:O, s:O}", "item_id", id, "output_index", j->ps.index,
				"arguments", args, "name", json_object_get(item, "name")));
		item_done(j, item);
	}
	/* the final output, exactly the items streamed (the SDK checks their ids) */
	json_t *out = outputs(j);
	remember(j, out);
	event(j, "response.completed",
	      json_pack("{s:o}", "response", response(j, "completed", out, 1)));
}

static const web_proto_t proto = {.api = WEB_API_RESPONSES,
				  .stream_ctype = "text/event-stream",
				  .keepalive = 1,
				  .start = start,
				  .delta = delta,
				  .finish = finish,
				  .reply = reply,
				  .error = NULL};

const web_endpoint_t web_ep_responses = {WEB_CHAT, &proto, parse_responses, NULL};
