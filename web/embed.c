/*
 * embed.c: embeddings through OpenAI's POST /v1/embeddings and Ollama's POST /api/embed (and the
 * older POST /api/embeddings). Every input becomes one embedding sequence of the job (sched.c
 * admits them into free slots as they come, in the same steps as everything else, on every rank
 * of a group); the engine pools the final hidden states as the model's file says and scales the
 * result to unit length (infer.h, eng_embed_start).
 *
 *   OpenAI  {input: string | [string] | [int] | [[int]], encoding_format: "float" | "base64",
 *           dimensions} -> {object: "list", data: [{object: "embedding", index, embedding}],
 *           model, usage: {prompt_tokens, total_tokens}}; base64 is the little-endian float32
 *           bytes (what the openai SDK decodes, lib/embeddings.ts); an input longer than the
 *           context is a 400.
 *   Ollama  {input: string | [string], truncate (default true), dimensions, options} ->
 *           {model, embeddings, total_duration, load_duration, prompt_eval_count} (api/types.go
 *           EmbedResponse, server/routes.go EmbedHandler); /api/embeddings {prompt} ->
 *           {embedding}. Errors {"error": "..."}.
 *
 * dimensions keeps the first values and scales them to unit length again (as Ollama does).
 */
#include "web/web_int.h"

#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"

/* r->inputs from a JSON string or array of strings; or r->input_ids from token id arrays
 * (OpenAI only: ids_ok). */
static int parse_inputs(web_req_t *r, json_t *in, const char *param, int ids_ok, web_err_t *e)
{
	if (!in || json_is_null(in))
		return web_err_set(e, 400, "invalid_request_error", param,
				   "missing_required_parameter", "'%s' is required", param);
	int one = json_is_string(in) || (json_is_array(in) && json_array_size(in) &&
					 json_is_integer(json_array_get(in, 0)));
	size_t n = one ? 1 : json_is_array(in) ? json_array_size(in) : 0;
	if (!json_is_string(in) && !json_is_array(in))
		return web_err_bad(e, param,
				   ids_ok ? "'input' must be a string, an array of strings, or "
					    "token ids"
					  : "'input' must be a string or an array of strings");
	if (n > WEB_EMBED_INPUTS_MAX)
		return web_err_set(e, 400, "invalid_request_error", param, "array_above_max_length",
				   "'%s' has %zu inputs; at most %d are accepted", param, n,
				   WEB_EMBED_INPUTS_MAX);
	r->inputs = calloc(MAX(n, 1), sizeof *r->inputs);
	r->input_ids = calloc(MAX(n, 1), sizeof *r->input_ids);
	r->input_len = calloc(MAX(n, 1), sizeof *r->input_len);
	if (!r->inputs || !r->input_ids || !r->input_len)
		return web_err_oom(e);
	for (size_t i = 0; i < n; i++) {
		json_t *v = one ? in : json_array_get(in, i);
		r->n_inputs = (int)i + 1;
		if (json_is_string(v)) {
			if (!(r->inputs[i] = strndup(json_string_value(v), json_string_length(v))))
				return web_err_oom(e);
			continue;
		}
		if (!ids_ok || !json_is_array(v) || !json_array_size(v))
			return web_err_bad(
			    e, param,
			    ids_ok ? "each input must be a string or a non-empty array of "
				     "token ids"
				   : "each input must be a string");
		size_t k = json_array_size(v);
		if (!(r->input_ids[i] = malloc(k * sizeof(int))))
			return web_err_oom(e);
		for (size_t t = 0; t < k; t++) {
			json_t *id = json_array_get(v, t);
			if (!json_is_integer(id) || json_integer_value(id) < 0 ||
			    json_integer_value(id) > 0x7fffffff)
				return web_err_bad(e, param,
						   "token ids must be non-negative integers");
			r->input_ids[i][t] = (int)json_integer_value(id);
		}
		r->input_len[i] = (int)k;
	}
	return 0;
}

static int parse_common(web_req_t *r, json_t *root, web_err_t *e)
{
	long long v = 0;
	int given = 0, rc;
	json_t *model = json_object_get(root, "model");
	if (model && !json_is_null(model) && !json_is_string(model))
		return web_err_bad(e, "model", "'model' must be a string");
	if ((rc = web_get_int(root, "dimensions", 1, 1 << 20, &v, &given, e)))
		return rc;
	r->dimensions = given ? (int)v : 0;
	return 0;
}

static int parse_openai(web_t *w, web_req_t *r, const char *body, size_t len, web_err_t *e)
{
	(void)w;
	json_t *root;
	web_req_init(r, WEB_EMBED);
	r->api = WEB_API_EMBEDDINGS;
	int rc = web_json_load(body, len, &root, e);
	if (rc)
		return rc;
	if (!(rc = parse_common(r, root, e)) &&
	    !(rc = parse_inputs(r, json_object_get(root, "input"), "input", 1, e))) {
		json_t *f = json_object_get(root, "encoding_format");
		const char *fs = json_string_value(f);
		if (f && !json_is_null(f) && (!fs || (strcmp(fs, "float") && strcmp(fs, "base64"))))
			rc = web_err_bad(e, "encoding_format",
					 "'encoding_format' must be float or base64");
		r->base64 = fs && !strcmp(fs, "base64");
		if (!rc && !r->n_inputs)
			rc = web_err_bad(e, "input", "'input' must not be empty");
	}
	json_decref(root);
	return rc;
}

static int parse_ollama(web_t *w, web_req_t *r, const char *body, size_t len, web_err_t *e)
{
	(void)w;
	json_t *root;
	web_req_init(r, WEB_EMBED);
	r->api = WEB_API_OLLAMA_EMBED;
	r->truncate = 1;
	int rc = web_json_load(body, len, &root, e);
	if (rc)
		return rc;
	if (!(rc = parse_common(r, root, e)) &&
	    !(rc = web_get_bool(root, "truncate", &r->truncate, e))) {
		json_t *in = json_object_get(root, "input");
		if (in && !json_is_null(in) &&
		    !(json_is_string(in) && json_string_length(in) == 0)) /* "": no embeddings */
			rc = parse_inputs(r, in, "input", 0, e);
		r->no_work = !rc && !r->n_inputs;
	}
	json_decref(root);
	return rc;
}

static int parse_ollama_legacy(web_t *w, web_req_t *r, const char *body, size_t len, web_err_t *e)
{
	(void)w;
	json_t *root;
	web_req_init(r, WEB_EMBED);
	r->api = WEB_API_OLLAMA_EMBED;
	r->legacy = 1;
	r->truncate = 1;
	int rc = web_json_load(body, len, &root, e);
	if (rc)
		return rc;
	json_t *p = json_object_get(root, "prompt");
	if (!(rc = parse_common(r, root, e)) && !(json_is_string(p) && !json_string_length(p)))
		rc = parse_inputs(r, p, "prompt", 0, e);
	r->no_work = !rc && !r->n_inputs; /* "": {"embedding": []} */
	json_decref(root);
	return rc;
}

/* Every input as the ids of one embedding sequence, within the context. */
static int embed_prompt(eng_t *eng, web_req_t *r, int **ids, int *n_ids, web_err_t *e)
{
	const eng_info_t *in = eng_info(eng);
	char msg[256];
	*ids = NULL;
	*n_ids = 0;
	if (r->dimensions > in->dim)
		return web_err_set(e, 400, "invalid_request_error", "dimensions", "invalid_value",
				   "'dimensions' is %d; this model's embeddings have %d",
				   r->dimensions, in->dim);
	if (in->pooling == ENG_POOL_RANK)
		return web_err_set(
		    e, 400, "invalid_request_error", "model", "unsupported_value",
		    "this model is a reranker (pooling rank): it gives no embeddings");
	for (int i = 0; i < r->n_inputs; i++) {
		if (r->inputs[i]) {
			if (eng_embed_tokenize(eng, r->inputs[i], &r->input_ids[i],
					       &r->input_len[i], msg, sizeof msg))
				return web_err_set(e, 500, "server_error", "input", NULL, "%s",
						   msg);
		} else {
			for (int t = 0; t < r->input_len[i]; t++)
				if (r->input_ids[i][t] >= in->n_vocab)
					return web_err_set(e, 400, "invalid_request_error", "input",
							   "invalid_value",
							   "'input': token id %d is outside the "
							   "vocabulary (%d tokens)",
							   r->input_ids[i][t], in->n_vocab);
		}
		if (r->input_len[i] == 0)
			return web_err_set(e, 400, "invalid_request_error", "input",
					   "invalid_value", "input %d is empty", i);
		if (r->input_len[i] > in->n_ctx) {
			if (!r->truncate)
				return web_err_set(e, 400, "invalid_request_error", "input",
						   "context_length_exceeded",
						   "input %d has %d tokens; the context holds %d",
						   i, r->input_len[i], in->n_ctx);
			r->input_len[i] = in->n_ctx;
		}
	}
	return 0;
}

/* Embedding i of j as it goes out: the first `dimensions` values, again of unit length. */
static const float *vec(const web_job_t *j, int i, float *tmp, int *n)
{
	const float *v = j->vecs + (size_t)i * j->dim;
	*n = j->dim;
	if (!j->req.dimensions || j->req.dimensions >= j->dim)
		return v;
	*n = j->req.dimensions;
	double s = 0;
	for (int k = 0; k < *n; k++)
		s += (double)v[k] * v[k];
	float f = s > 0 ? (float)(1.0 / sqrt(s)) : 0.0f;
	for (int k = 0; k < *n; k++)
		tmp[k] = v[k] * f;
	return tmp;
}

static json_t *float_array(const float *v, int n)
{
	json_t *a = json_array();
	for (int k = 0; a && k < n; k++)
		json_array_append_new(a, json_real((double)v[k]));
	return a;
}

static json_t *base64_of(const float *v, int n)
{
	size_t bytes = (size_t)n * 4,
	       blen = sodium_base64_encoded_len(bytes, sodium_base64_VARIANT_ORIGINAL);
	unsigned char *raw = malloc(bytes);
	char *b = malloc(blen);
	json_t *s = NULL;
	if (raw && b) {
		for (int k = 0; k < n; k++) { /* little-endian float32, whatever the host */
			uint32_t u;
			memcpy(&u, &v[k], 4);
			raw[4 * k] = (unsigned char)u, raw[4 * k + 1] = (unsigned char)(u >> 8);
			raw[4 * k + 2] = (unsigned char)(u >> 16),
				    raw[4 * k + 3] = (unsigned char)(u >> 24);
		}
		sodium_bin2base64(b, blen, raw, bytes, sodium_base64_VARIANT_ORIGINAL);
		s = json_string(b);
	}
	free(raw);
	free(b);
	return s;
}

/* web_json_dump with 9 significant digits: a float32 round-trips */
static char *dump(json_t *root)
{
	char *s = root ? json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
	json_decref(root);
	return s;
}

static char *reply_openai(web_job_t *j)
{
	float *tmp = malloc((size_t)MAX(j->dim, 1) * sizeof *tmp);
	json_t *data = json_array();
	for (int i = 0; tmp && i < j->n_seq; i++) {
		int n = 0;
		const float *v = vec(j, i, tmp, &n);
		json_array_append_new(
		    data,
		    json_pack("{s:s, s:i, s:o}", "object", "embedding", "index", i, "embedding",
			      j->req.base64 ? base64_of(v, n) : float_array(v, n)));
	}
	free(tmp);
	int pt = j->res.prompt_tokens;
	return dump(json_pack("{s:s, s:o, s:s, s:{s:i, s:i}}", "object", "list", "data", data,
			      "model", j->model, "usage", "prompt_tokens", pt, "total_tokens", pt));
}

static char *reply_ollama(web_job_t *j)
{
	float *tmp = malloc((size_t)MAX(j->dim, 1) * sizeof *tmp);
	json_t *all = json_array();
	for (int i = 0; tmp && i < j->n_seq; i++) {
		int n = 0;
		const float *v = vec(j, i, tmp, &n);
		json_array_append_new(all, float_array(v, n));
	}
	free(tmp);
	if (j->req.legacy) {
		json_t *one = json_incref(json_array_get(all, 0));
		json_decref(all);
		return dump(json_pack("{s:o}", "embedding", one ? one : json_array()));
	}
	long long total = (long long)(now_ns() - j->ps.t0_ns);
	return dump(json_pack("{s:s, s:o, s:I, s:I, s:i}", "model", j->model, "embeddings", all,
			      "total_duration", (json_int_t)total, "load_duration", (json_int_t)0,
			      "prompt_eval_count", j->res.prompt_tokens));
}

static const web_proto_t proto_openai = {.api = WEB_API_EMBEDDINGS, .reply = reply_openai};

static char *error_ollama(const web_err_t *e)
{
	return web_proto_ollama.error(e);
}

static const web_proto_t proto_ollama = {
    .api = WEB_API_OLLAMA_EMBED, .reply = reply_ollama, .error = error_ollama};

const web_endpoint_t web_ep_embeddings = {WEB_EMBED, &proto_openai, parse_openai, embed_prompt};
const web_endpoint_t web_ep_ollama_embed = {WEB_EMBED, &proto_ollama, parse_ollama, embed_prompt};
const web_endpoint_t web_ep_ollama_embeddings = {WEB_EMBED, &proto_ollama, parse_ollama_legacy,
						 embed_prompt};
