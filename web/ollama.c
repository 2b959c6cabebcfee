/*
 * ollama.c: Ollama's API, for Open WebUI, Continue, editors and the `ollama` client libraries:
 * POST /api/chat, POST /api/generate (NDJSON streaming, the default as in Ollama), GET /api/tags,
 * GET /api/ps, POST /api/show, GET /api/version. The embeddings (/api/embed, /api/embeddings) are
 * in embed.c.
 *
 * Shapes follow Ollama's server, read from its source (github.com/ollama/ollama): api/types.go
 * (ChatRequest, ChatResponse, GenerateResponse, Metrics, ListModelResponse, ProcessModelResponse,
 * ShowResponse, ModelDetails, ToolCall) and server/routes.go (ChatHandler / GenerateHandler:
 * "stream" absent means streaming; a stream is one JSON object per line and the last has
 * "done": true, "done_reason" and the counts; streamResponse: an error is {"error": "..."}, as
 * the status when nothing was sent yet, else as one more line). Durations are nanoseconds,
 * times RFC 3339 with nanoseconds in UTC.
 *
 * A request becomes an OpenAI-shaped chat or completion request (request.c checks it): options
 * num_predict -> max_tokens, temperature, top_p, top_k, min_p, seed, stop, repeat_penalty,
 * presence_penalty, frequency_penalty; num_ctx bounds prompt + reply; format "json" or a JSON
 * schema -> the grammar; tools as given (Ollama's are OpenAI's function tools); tool calls in
 * the history get ids, and tool results the id of the call they answer. Unset sampling options
 * take Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9). The model name is accepted and
 * ignored: the loaded model answers (its id + ":latest" in /api/tags).
 */
#include "web/web_int.h"

#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"

#define OLLAMA_VERSION "0.12.0" /* the Ollama API this follows (clients check a minimum) */

/* RFC 3339 with nanoseconds, UTC (Go's time.Time in JSON). */
static void rfc3339(char *out, size_t len, const struct timespec *ts)
{
	struct tm tm;
	char base[32];
	gmtime_r(&ts->tv_sec, &tm);
	strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out, len, "%s.%09ldZ", base, (long)ts->tv_nsec);
}

static void now_rfc3339(char *out, size_t len)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	rfc3339(out, len, &ts);
}

static char *error_json(const web_err_t *e)
{
	return web_json_dump(json_pack("{s:s}", "error", e->message));
}

/* ---- requests ----------------------------------------------------------------------------- */

/* Ollama's options -> OpenAI's fields in o (request.c checks the values). */
static int map_options(json_t *root, json_t *o, web_req_t *r, web_err_t *e)
{
	json_t *opt = json_object_get(root, "options");
	/* Ollama's defaults where the request leaves them */
	json_object_set_new(o, "temperature", json_real(0.8));
	json_object_set_new(o, "top_k", json_integer(40));
	json_object_set_new(o, "top_p", json_real(0.9));
	if (!opt || json_is_null(opt))
		return 0;
	if (!json_is_object(opt))
		return web_err_bad(e, "options", "'options' must be an object");
	static const char *const same[] = {"temperature",
					   "top_p",
					   "top_k",
					   "min_p",
					   "seed",
					   "stop",
					   "repeat_penalty",
					   "presence_penalty",
					   "frequency_penalty"};
	for (size_t i = 0; i < ARRAY_LEN(same); i++) {
		json_t *v = json_object_get(opt, same[i]);
		if (v && !json_is_null(v))
			json_object_set(o, same[i], v);
	}
	long long v = 0;
	int given = 0, rc;
	if ((rc = web_get_int(opt, "num_predict", -2, 1 << 30, &v, &given, e)))
		return rc;
	if (given && v > 0) /* -1: no limit, -2: until the context is full */
		json_object_set_new(o, "max_tokens", json_integer(v));
	given = 0;
	if ((rc = web_get_int(opt, "num_ctx", 1, 1 << 30, &v, &given, e)))
		return rc;
	if (given)
		r->max_ctx = (int)v;
	return 0;
}

/* "format": "json" or a JSON schema -> response_format. */
static int map_format(json_t *root, json_t *o, web_err_t *e)
{
	json_t *f = json_object_get(root, "format");
	if (!f || json_is_null(f) || (json_is_string(f) && !json_string_length(f)))
		return 0;
	if (json_is_string(f)) {
		if (strcmp(json_string_value(f), "json"))
			return web_err_bad(e, "format",
					   "'format' must be \"json\" or a JSON schema");
		json_object_set_new(o, "response_format",
				    json_pack("{s:s}", "type", "json_object"));
		return 0;
	}
	if (!json_is_object(f))
		return web_err_bad(e, "format", "'format' must be \"json\" or a JSON schema");
	json_object_set_new(o, "response_format",
			    json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema",
				      "name", "format", "schema", f));
	return 0;
}

/* Ollama's messages -> OpenAI's: tool calls get ids, a tool result the id of its call. */
static int map_messages(json_t *msgs, json_t *out, web_err_t *e)
{
	if (!json_is_array(msgs))
		return web_err_bad(e, "messages", "'messages' must be an array");
	int n_calls = 0;
	size_t i;
	json_t *m;
	json_array_foreach(msgs, i, m)
	{
		if (!json_is_object(m))
			return web_err_bad(e, "messages", "each message must be an object");
		json_t *imgs = json_object_get(m, "images");
		if (json_is_array(imgs) && json_array_size(imgs))
			return web_err_set(e, 400, "invalid_request_error", "images",
					   "unsupported_value",
					   "images are not supported: this model reads text only");
		json_t *om = json_pack("{s:O?, s:O?}", "role", json_object_get(m, "role"),
				       "content", json_object_get(m, "content"));
		if (!json_object_get(om, "content"))
			json_object_set_new(om, "content", json_string(""));
		json_t *calls = json_object_get(m, "tool_calls");
		if (json_is_array(calls) && json_array_size(calls)) {
			json_t *oc = json_array();
			size_t k;
			json_t *c;
			json_array_foreach(calls, k, c)
			{
				json_t *fn = json_object_get(c, "function");
				json_t *args = json_object_get(fn, "arguments");
				const char *id = json_string_value(json_object_get(c, "id"));
				char gen[32];
				if (!id) {
					snprintf(gen, sizeof gen, "call_%d", n_calls);
					id = gen;
				}
				n_calls++;
				char *a = json_is_string(args) ? strdup(json_string_value(args))
					  : args               ? json_dumps(args, JSON_COMPACT)
							       : strdup("{}");
				json_array_append_new(oc,
						      json_pack("{s:s, s:s, s:{s:O?, s:s}}", "id",
								id, "type", "function", "function",
								"name", json_object_get(fn, "name"),
								"arguments", a ? a : "{}"));
				free(a);
			}
			json_object_set_new(om, "tool_calls", oc);
		}
		const char *role = json_string_value(json_object_get(m, "role"));
		if (role && !strcmp(role, "tool")) {
			const char *id = json_string_value(json_object_get(m, "tool_call_id"));
			char gen[32];
			if (!id) { /* the latest call's id (Ollama answers by tool_name) */
				snprintf(gen, sizeof gen, "call_%d", n_calls ? n_calls - 1 : 0);
				id = gen;
			}
			json_object_set_new(om, "tool_call_id", json_string(id));
		}
		json_array_append_new(out, om);
	}
	return 0;
}

static int parse_chat(web_t *w, web_req_t *r, const char *body, size_t len, web_err_t *e)
{
	(void)w;
	json_t *root, *o = json_object(), *msgs = json_array();
	web_req_init(r, WEB_CHAT);
	r->api = WEB_API_OLLAMA_CHAT;
	int rc = web_json_load(body, len, &root, e);
	if (!rc) {
		json_t *st = json_object_get(root, "stream");
		if (st && !json_is_null(st) && !json_is_boolean(st))
			rc = web_err_bad(e, "stream", "'stream' must be a boolean");
		json_object_set_new(o, "stream", json_boolean(!json_is_false(st)));
		json_t *m = json_object_get(root, "messages");
		if (!rc && (!m || json_is_null(m)))
			rc = web_err_set(e, 400, "invalid_request_error", "messages",
					 "missing_required_parameter", "'messages' is required");
		if (!rc && !(rc = map_messages(m, msgs, e)) && !(rc = map_options(root, o, r, e)) &&
		    !(rc = map_format(root, o, e))) {
			json_object_set(o, "messages", msgs);
			json_t *tools = json_object_get(root, "tools");
			if (tools && !json_is_null(tools))
				json_object_set(o, "tools", tools);
			rc = web_req_from_json(r, o, e);
		}
	}
	json_decref(root);
	json_decref(o);
	json_decref(msgs);
	return rc;
}

static int parse_generate(web_t *w, web_req_t *r, const char *body, size_t len, web_err_t *e)
{
	(void)w;
	json_t *root, *o = json_object();
	web_req_init(r, WEB_CHAT);
	r->api = WEB_API_OLLAMA_GENERATE;
	int rc = web_json_load(body, len, &root, e);
	if (rc) {
		json_decref(o);
		return rc;
	}
	json_t *st = json_object_get(root, "stream"), *p = json_object_get(root, "prompt");
	json_t *sys = json_object_get(root, "system"), *ctx = json_object_get(root, "context");
	json_t *suffix = json_object_get(root, "suffix"), *imgs = json_object_get(root, "images");
	if (st && !json_is_null(st) && !json_is_boolean(st))
		rc = web_err_bad(e, "stream", "'stream' must be a boolean");
	else if (p && !json_is_null(p) && !json_is_string(p))
		rc = web_err_bad(e, "prompt", "'prompt' must be a string");
	else if (sys && !json_is_null(sys) && !json_is_string(sys))
		rc = web_err_bad(e, "system", "'system' must be a string");
	else if (json_is_string(suffix) && json_string_length(suffix))
		rc = web_err_set(e, 400, "invalid_request_error", "suffix", "unsupported_value",
				 "'suffix' (fill in the middle) is not supported");
	else if (json_is_array(imgs) && json_array_size(imgs))
		rc = web_err_set(e, 400, "invalid_request_error", "images", "unsupported_value",
				 "images are not supported: this model reads text only");
	else if (ctx && !json_is_null(ctx) && !json_is_array(ctx))
		rc = web_err_bad(e, "context", "'context' must be an array of token ids");
	if (!rc)
		rc = web_get_bool(root, "raw", &r->raw, e);
	json_object_set_new(o, "stream", json_boolean(!json_is_false(st)));
	const char *prompt = json_string_value(p) ? json_string_value(p) : "";
	if (!rc && !*prompt && !json_array_size(ctx)) { /* a load: Ollama answers "load" */
		r->no_work = 1;
		r->stream = 0;
		goto out;
	}
	if (!rc && json_array_size(ctx)) {
		size_t n = json_array_size(ctx);
		if (!(r->ctx_ids = malloc(n * sizeof *r->ctx_ids))) {
			rc = web_err_oom(e);
			goto out;
		}
		for (size_t i = 0; i < n; i++) {
			json_t *id = json_array_get(ctx, i);
			if (!json_is_integer(id) || json_integer_value(id) < 0 ||
			    json_integer_value(id) > 0x7fffffff) {
				rc = web_err_bad(e, "context",
						 "'context' must be an array of token ids");
				goto out;
			}
			r->ctx_ids[i] = (int)json_integer_value(id);
		}
		r->n_ctx_ids = (int)n;
	}
	if (!rc && !(rc = map_options(root, o, r, e)) && !(rc = map_format(root, o, e))) {
		if (r->raw) { /* the prompt as it is: a completion */
			r->kind = WEB_COMPLETION;
			json_object_set_new(o, "prompt", json_string(prompt));
		} else {
			json_t *msgs = json_array();
			if (json_is_string(sys) && json_string_length(sys))
				json_array_append_new(msgs, json_pack("{s:s, s:O}", "role",
								      "system", "content", sys));
			json_array_append_new(
			    msgs, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
			json_object_set_new(o, "messages", msgs);
		}
		rc = web_req_from_json(r, o, e);
	}
out:
	json_decref(root);
	json_decref(o);
	return rc;
}

/* /api/generate's prompt: the template (or the raw prompt) after the "context" ids. */
static int generate_prompt(eng_t *eng, web_req_t *r, int **ids, int *n_ids, web_err_t *e)
{
	char msg[256] = "";
	int rc;
	const eng_info_t *in = eng_info(eng);
	if (r->kind == WEB_CHAT) {
		rc = web_chat_prompt(eng, r, ids, n_ids, msg, sizeof msg, e);
		if (rc >= 400)
			return rc;
	} else {
		rc = eng_tokenize(eng, r->prompt, !r->n_ctx_ids, 0, ids, n_ids, msg, sizeof msg);
	}
	if (rc)
		return web_err_set(e, rc == SH_ENOMEM ? 500 : 400, "invalid_request_error",
				   "prompt", "invalid_value", "%s", msg[0] ? msg : sh_strerror(rc));
	if (!r->n_ctx_ids)
		return 0;
	for (int i = 0; i < r->n_ctx_ids; i++)
		if (r->ctx_ids[i] >= in->n_vocab)
			return web_err_bad(e, "context",
					   "'context' holds an id outside the vocabulary");
	int skip = *n_ids > 0 && (*ids)[0] == in->bos; /* the context carries its own BOS */
	int n = r->n_ctx_ids + *n_ids - skip;
	int *all = malloc((size_t)MAX(n, 1) * sizeof *all);
	if (!all)
		return web_err_oom(e);
	memcpy(all, r->ctx_ids, (size_t)r->n_ctx_ids * sizeof *all);
	memcpy(all + r->n_ctx_ids, *ids + skip, (size_t)(*n_ids - skip) * sizeof *all);
	free(*ids);
	*ids = all;
	*n_ids = n;
	return 0;
}

/* ---- replies ------------------------------------------------------------------------------ */

static const char *done_reason(const web_job_t *j)
{
	return j->res.finish == ENG_FINISH_LENGTH ? "length" : "stop";
}

/* Ollama's tool_calls from OpenAI's: arguments as objects. */
static json_t *ollama_calls(json_t *calls)
{
	json_t *out = json_array();
	size_t i;
	json_t *c;
	json_array_foreach(calls, i, c)
	{
		json_t *fn = json_object_get(c, "function");
		json_t *args =
		    json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
		json_array_append_new(out, json_pack("{s:O, s:{s:i, s:O, s:o}}", "id",
						     json_object_get(c, "id"), "function", "index",
						     (int)i, "name", json_object_get(fn, "name"),
						     "arguments", args ? args : json_object()));
	}
	return out;
}

/* The fields every chunk and reply carries. */
static json_t *base(const web_job_t *j)
{
	char t[48];
	now_rfc3339(t, sizeof t);
	return json_pack("{s:s, s:s}", "model", j->model, "created_at", t);
}

/* done, done_reason and the counts (Metrics), and generate's context. */
static void add_done(web_job_t *j, json_t *o)
{
	json_object_set_new(o, "done", json_true());
	json_object_set_new(o, "done_reason",
			    json_string(j->req.no_work ? "load" : done_reason(j)));
	if (j->req.no_work)
		return;
	if (j->req.api == WEB_API_OLLAMA_GENERATE) {
		json_t *ctx = json_array();
		for (int i = 0; i < j->n_ids; i++)
			json_array_append_new(ctx, json_integer(j->ids[i]));
		for (int i = 0; i < j->ps.n_ids; i++)
			json_array_append_new(ctx, json_integer(j->ps.ids[i]));
		json_object_set_new(o, "context", ctx);
	}
	json_t *m =
	    json_pack("{s:I, s:I, s:i, s:I, s:i, s:I}", "total_duration",
		      (json_int_t)(now_ns() - j->ps.t0_ns), "load_duration", (json_int_t)0,
		      "prompt_eval_count", j->res.prompt_tokens, "prompt_eval_duration",
		      (json_int_t)(j->res.prompt_ms * 1e6), "eval_count", j->res.completion_tokens,
		      "eval_duration", (json_int_t)(j->res.gen_ms * 1e6));
	json_object_update(o, m);
	json_decref(m);
}

static json_t *message(const char *content, size_t n, const char *thinking, size_t tn)
{
	json_t *m = json_pack("{s:s, s:s%}", "role", "assistant", "content", content ? content : "",
			      content ? n : 0);
	if (thinking && tn)
		json_object_set_new(m, "thinking", json_stringn(thinking, tn));
	return m;
}

/* One NDJSON line. */
static void line(web_job_t *j, json_t *o)
{
	char *s = web_json_dump(o);
	if (s) {
		web_buf_add(&j->out, s, strlen(s));
		web_buf_add(&j->out, "\n", 1);
	}
	free(s);
}

static void delta(web_job_t *j, int reasoning, const char *s, size_t n)
{
	json_t *o = base(j), *text = web_json_str(s, n);
	if (j->req.api == WEB_API_OLLAMA_GENERATE) {
		json_object_set_new(o, "response", reasoning ? json_string("") : json_incref(text));
		if (reasoning)
			json_object_set(o, "thinking", text);
	} else {
		json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
		json_object_set(m, reasoning ? "thinking" : "content", text);
		json_object_set_new(o, "message", m);
	}
	json_decref(text);
	json_object_set_new(o, "done", json_false());
	line(j, o);
}

static void finish(web_job_t *j)
{
	if (j->err.status) {
		line(j, json_pack("{s:s}", "error", j->err.message));
		return;
	}
	int gen = j->req.api == WEB_API_OLLAMA_GENERATE;
	if (j->rid.tool_calls) { /* as Ollama: the calls in a chunk of their own */
		json_t *o = base(j), *m = message("", 0, NULL, 0);
		json_object_set_new(m, "tool_calls", ollama_calls(j->rid.tool_calls));
		json_object_set_new(o, "message", m);
		json_object_set_new(o, "done", json_false());
		line(j, o);
	}
	json_t *o = base(j);
	if (gen)
		json_object_set_new(o, "response", json_string(""));
	else
		json_object_set_new(o, "message", message("", 0, NULL, 0));
	add_done(j, o);
	line(j, o);
}

static char *reply(web_job_t *j)
{
	const char *t = j->text.p ? j->text.p : "";
	const char *content = t + j->ps.c0, *thinking = j->ps.r_len ? t + j->ps.r0 : NULL;
	size_t cn = j->ps.c_len;
	if (j->req.no_work)
		content = "", cn = 0;
	json_t *o = base(j), *c = web_json_str(content, cn);
	if (j->req.api == WEB_API_OLLAMA_GENERATE) {
		json_object_set_new(o, "response", c);
		if (thinking)
			json_object_set_new(o, "thinking", web_json_str(thinking, j->ps.r_len));
	} else {
		json_t *m = message("", 0, NULL, 0);
		json_object_set_new(m, "content", c);
		if (thinking)
			json_object_set_new(m, "thinking", web_json_str(thinking, j->ps.r_len));
		if (j->rid.tool_calls)
			json_object_set_new(m, "tool_calls", ollama_calls(j->rid.tool_calls));
		json_object_set_new(o, "message", m);
	}
	add_done(j, o);
	return web_json_dump(o);
}

const web_proto_t web_proto_ollama = {.api = WEB_API_OLLAMA_CHAT,
				      .stream_ctype = "application/x-ndjson",
				      .keepalive = 0,
				      .delta = delta,
				      .finish = finish,
				      .reply = reply,
				      .error = error_json};

static const web_proto_t proto_generate = {.api = WEB_API_OLLAMA_GENERATE,
					   .stream_ctype = "application/x-ndjson",
					   .keepalive = 0,
					   .delta = delta,
					   .finish = finish,
					   .reply = reply,
					   .error = error_json};

const web_endpoint_t web_ep_ollama_chat = {WEB_CHAT, &web_proto_ollama, parse_chat, NULL};
const web_endpoint_t web_ep_ollama_generate = {WEB_CHAT, &proto_generate, parse_generate,
					       generate_prompt};

/* ---- models ------------------------------------------------------------------------------- */

/* "260K", "1.5B" (Ollama's format.HumanNumber). */
static void human(char *out, size_t len, uint64_t n)
{
	const char *u = "";
	double v = (double)n;
	if (n >= 1000000000ull)
		v /= 1e9, u = "B";
	else if (n >= 1000000ull)
		v /= 1e6, u = "M";
	else if (n >= 1000ull)
		v /= 1e3, u = "K";
	snprintf(out, len, v >= 100 || v == (int)v ? "%.0f%s" : "%.1f%s", v, u);
}

static json_t *details(const eng_info_t *in)
{
	char ps[32];
	human(ps, sizeof ps, in->n_params);
	return json_pack("{s:s, s:s, s:s, s:[s], s:s, s:s}", "parent_model", "", "format", "gguf",
			 "family", in->arch, "families", in->arch, "parameter_size", ps,
			 "quantization_level", in->weight_type ? in->weight_type : "");
}

/* A stable identifier of the loaded model in Ollama's digest form (64 hex digits; not a hash
 * of the file's bytes, which would mean reading all of them). */
static void digest(const char *name, const eng_info_t *in, char out[65])
{
	unsigned char h[32];
	crypto_generichash_state st;
	crypto_generichash_init(&st, NULL, 0, sizeof h);
	crypto_generichash_update(&st, (const unsigned char *)name, strlen(name));
	crypto_generichash_update(&st, (const unsigned char *)in->arch, strlen(in->arch));
	crypto_generichash_update(&st, (const unsigned char *)&in->n_params, sizeof in->n_params);
	crypto_generichash_update(&st, (const unsigned char *)&in->weight_bytes,
				  sizeof in->weight_bytes);
	crypto_generichash_final(&st, h, sizeof h);
	sodium_bin2hex(out, 65, h, sizeof h);
}

/* The one model entry of /api/tags or /api/ps (ps: expires_at, size_vram, context_length). */
static json_t *model_entry(web_t *w, eng_t *e, int ps)
{
	const eng_info_t *in = eng_info(e);
	char id[128], name[160], dg[65], when[48];
	web_model_id(w, e, id, sizeof id);
	snprintf(name, sizeof name, "%s%s", id, strchr(id, ':') ? "" : ":latest");
	digest(id, in, dg);
	struct timespec ts = {(time_t)web_started_of(w), 0};
	rfc3339(when, sizeof when, &ts);
	json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:o}", "name", name, "model", name, "size",
			      (json_int_t)in->weight_bytes, "digest", dg, "details", details(in));
	if (ps) {
		struct timespec far = {(time_t)web_started_of(w) + 10 * 365 * 86400, 0};
		rfc3339(when, sizeof when, &far); /* loaded until the server stops */
		json_object_set_new(m, "expires_at", json_string(when));
		json_object_set_new(m, "size_vram", json_integer(0));
		json_object_set_new(m, "context_length", json_integer(in->n_ctx));
	} else {
		json_object_set_new(m, "modified_at", json_string(when));
	}
	return m;
}

static int list(web_t *w, struct MHD_Connection *c, int ps)
{
	web_err_t err;
	eng_t *e = web_engine_get(w, &err);
	json_t *models = json_array();
	if (e) {
		json_array_append_new(models, model_entry(w, e, ps));
		web_sched_engine_release(web_sched_of(w));
	}
	return web_send_json(w, c, 200, json_pack("{s:o}", "models", models));
}

int web_ollama_tags(web_t *w, struct MHD_Connection *c, web_conn_t *cn)
{
	(void)cn;
	return list(w, c, 0);
}

int web_ollama_ps(web_t *w, struct MHD_Connection *c, web_conn_t *cn)
{
	(void)cn;
	return list(w, c, 1);
}

int web_ollama_version(web_t *w, struct MHD_Connection *c, web_conn_t *cn)
{
	(void)cn;
	return web_send_json(w, c, 200, json_pack("{s:s}", "version", OLLAMA_VERSION));
}

int web_ollama_show(web_t *w, struct MHD_Connection *c, web_conn_t *cn)
{
	web_err_t err;
	memset(&err, 0, sizeof err);
	json_t *root = NULL;
	int rc = web_json_load(cn->body.p ? cn->body.p : "", cn->body.len, &root, &err);
	const char *model = json_string_value(json_object_get(root, "model"));
	if (!model)
		model = json_string_value(json_object_get(root, "name"));
	if (!rc && (!model || !*model))
		rc = web_err_set(&err, 400, "invalid_request_error", "model",
				 "missing_required_parameter", "model is required");
	json_decref(root);
	if (rc)
		return web_send_error(w, c, &web_proto_ollama, &err);
	eng_t *e = web_engine_get(w, &err);
	if (!e)
		return web_send_error(w, c, &web_proto_ollama, &err);
	const eng_info_t *in = eng_info(e);
	char when[48], key[96];
	struct timespec ts = {(time_t)web_started_of(w), 0};
	rfc3339(when, sizeof when, &ts);
	json_t *info = json_pack("{s:s, s:I, s:s}", "general.architecture", in->arch,
				 "general.parameter_count", (json_int_t)in->n_params,
				 "general.name", in->name);
	const struct {
		const char *k;
		int v;
	} kv[] = {
	    {"context_length", in->n_ctx},          {"embedding_length", in->dim},
	    {"block_count", in->n_layers},          {"feed_forward_length", in->ffn},
	    {"attention.head_count", in->n_heads},  {"attention.head_count_kv", in->n_kv_heads},
	    {"attention.key_length", in->head_dim}, {"vocab_size", in->n_vocab},
	    {"pooling_type", in->pooling}};
	for (size_t i = 0; i < ARRAY_LEN(kv); i++) {
		snprintf(key, sizeof key, "%s.%s", in->arch, kv[i].k);
		json_object_set_new(info, key, json_integer(kv[i].v));
	}
	json_t *caps = json_pack("[s, s]", "completion", "embedding");
	if (in->chat_template)
		json_array_append_new(caps, json_string("tools"));
	json_t *body = json_pack(
	    "{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:s}", "license", "", "modelfile",
	    "# served by shoal: the chat template and parameters come from the GGUF file\n",
	    "parameters", "", "template", in->chat_template ? in->chat_template : "", "details",
	    details(in), "model_info", info, "capabilities", caps, "modified_at", when);
	web_sched_engine_release(web_sched_of(w));
	return web_send_json(w, c, 200, body);
}
