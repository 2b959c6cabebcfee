/*
 * api.c: the scheduler side every API other than OpenAI's chat/completions shares. A job's text
 * (j->text, all of it) is read as three parts: reasoning (a leading <think>...</think>, as Qwen3
 * and DeepSeek-R1 write it), then content, then tool calls in the model family's form (tools.c
 * finds them). As tokens arrive, each byte goes to the API's delta hook as soon as its part is
 * certain: text that may still be the start of "<think>", of "</think>" or of a call is held
 * back. At the end the calls become OpenAI-shaped tool_calls (j->rid.tool_calls, finish
 * WEB_FINISH_TOOL_CALLS) and the API's finish hook closes its stream; a whole reply reads the
 * same parts from j->api (reasoning r0/r_len, content c0/c_len). gpt-oss's replies are read by
 * their harmony channels instead (tools.c web_harmony_read).
 *
 * Invariant (under the job's mutex): reasoning bytes text[r0 .. r0 + r_sent) and content bytes
 * text[c0 .. c0 + tc_sent) went to the delta hook, and nothing that the final reading puts in
 * another part was ever sent as content.
 */
#include "web/web_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";

const char *web_api_name(int api)
{
	/* at most 15 bytes: the request table's column (web_reqrec_t.api) */
	static const char *const names[WEB_API_N] = {"chat",       "completions", "messages",
						     "responses",  "ollama.chat", "ollama.generate",
						     "embeddings", "ollama.embed"};
	return api >= 0 && api < WEB_API_N ? names[api] : "other";
}

static int is_ws(char c)
{
	return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/* Length of the longest tail of s[0..n) that is a proper prefix of tag. */
static size_t partial_tail(const char *s, size_t n, const char *tag)
{
	for (size_t k = MIN(n, strlen(tag) - 1); k > 0; k--)
		if (!memcmp(s + n - k, tag, k))
			return k;
	return 0;
}

static void emit(web_job_t *j, int reasoning, const char *s, size_t n)
{
	if (n && j->req.stream && j->proto->delta) {
		j->proto->delta(j, reasoning, s, n);
		web_job_wake_locked(j);
	}
}

/* gpt-oss's harmony channels: the reasoning and content seen so far go out beyond what was
 * sent. The final reading leaves j->text = reasoning + content (the parts index it as for
 * <think>) and the calls in j->rid.tool_calls. */
static void split_harmony(web_job_t *j, int final)
{
	web_api_job_t *a = &j->ps;
	web_buf_t r = {0}, c = {0};
	json_t *calls = NULL;
	web_harmony_read(j, final, &r, &c, final ? &calls : NULL);
	if (r.len > a->r_sent) {
		emit(j, 1, r.p + a->r_sent, r.len - a->r_sent);
		a->r_sent = r.len;
	}
	if (c.len > j->tc_sent) {
		emit(j, 0, c.p + j->tc_sent, c.len - j->tc_sent);
		j->tc_sent = c.len;
	}
	a->think = 2;
	if (!final || web_buf_add(&r, c.p ? c.p : "", c.len)) {
		free(r.p);
		free(c.p);
		json_decref(calls);
		return;
	}
	free(j->text.p);
	j->text = r;
	a->r0 = 0, a->r_len = r.len - c.len, a->c0 = a->r_len, a->c_len = c.len;
	free(c.p);
	if (json_array_size(calls)) {
		j->rid.tool_calls = calls;
		j->res.finish = WEB_FINISH_TOOL_CALLS;
	} else {
		json_decref(calls);
	}
}

/* Sorts j->text into its parts as far as it can; final: the text is complete. */
static void split(web_job_t *j, int final)
{
	web_api_job_t *a = &j->ps;
	if (j->req.tool_format == WEB_TC_HARMONY) {
		split_harmony(j, final);
		return;
	}
	const char *s = j->text.p ? j->text.p : "";
	size_t n = j->text.len;
	if (a->think == 0) { /* does the reply open with <think>? */
		size_t i = 0, k = strlen(THINK_OPEN);
		while (i < n && is_ws(s[i]))
			i++;
		if (j->req.grammar || j->req.tool_format == WEB_TC_FORCED) {
			a->think = 2;           /* constrained from the first token: no reasoning */
		} else if (j->req.think_open) { /* the prompt opened <think> (qwen3.5) */
			a->think = 1;
			a->r0 = 0;
		} else if (n - i >= k) {
			a->think = memcmp(s + i, THINK_OPEN, k) ? 2 : 1;
			a->r0 = a->think == 1 ? i + k : 0;
		} else if (memcmp(s + i, THINK_OPEN, n - i) || final) {
			a->think = 2;
		} else {
			return; /* maybe the start of <think> */
		}
		a->c0 = 0;
	}
	if (a->think == 1) {
		if (!a->r_sent) /* the newline after <think> is not reasoning */
			while (a->r0 < n && is_ws(s[a->r0]))
				a->r0++;
		const char *close = web_find(s + a->r0, n - a->r0, THINK_CLOSE);
		size_t end = close ? (size_t)(close - s) : n;
		if (!close && !final)
			end -= partial_tail(s + a->r0, n - a->r0, THINK_CLOSE);
		size_t keep = end; /* trailing whitespace waits: it may end the reasoning */
		while (keep > a->r0 + a->r_sent && is_ws(s[keep - 1]) && !(final && !close))
			keep--;
		if (keep > a->r0 + a->r_sent) {
			emit(j, 1, s + a->r0 + a->r_sent, keep - a->r0 - a->r_sent);
			a->r_sent = keep - a->r0;
		}
		a->r_len = a->r_sent;
		if (!close && !final)
			return;
		a->think = 2;
		a->c0 = close ? end + strlen(THINK_CLOSE) : n;
	}
	if (!j->tc_sent) /* the whitespace between the reasoning and the content is neither */
		while (a->c0 < n && is_ws(s[a->c0]))
			a->c0++;
	size_t cn = n - a->c0,
	       safe = j->req.tool_format && !final ? web_tools_safe(j, s + a->c0, cn) : cn;
	if (!final && safe > j->tc_sent) {
		emit(j, 0, s + a->c0 + j->tc_sent, safe - j->tc_sent);
		j->tc_sent = safe;
	}
}

void web_api_on_token(web_job_t *j, int id)
{
	web_api_job_t *a = &j->ps;
	/* generated ids (not the end-of-generation token a last callback may carry) */
	if (j->req.api == WEB_API_OLLAMA_GENERATE && a->n_ids < j->res.completion_tokens) {
		if (a->n_ids == a->cap_ids) {
			int cap = a->cap_ids ? 2 * a->cap_ids : 64;
			int *p = realloc(a->ids, (size_t)cap * sizeof *p);
			if (p)
				a->ids = p, a->cap_ids = cap;
		}
		if (a->n_ids < a->cap_ids)
			a->ids[a->n_ids++] = id;
	}
	split(j, 0);
}

void web_api_finish(web_job_t *j)
{
	web_api_job_t *a = &j->ps;
	if (!j->err.status && j->req.tool_format == WEB_TC_HARMONY) {
		split_harmony(j, 1);
	} else if (!j->err.status) {
		split(j, 1);
		const char *s = j->text.p ? j->text.p + a->c0 : "";
		size_t n = j->text.len - a->c0, clen = n;
		json_t *calls = j->req.tool_format ? web_tools_parse(j, s, n, &clen) : NULL;
		if (calls) {
			j->rid.tool_calls = calls;
			j->res.finish = WEB_FINISH_TOOL_CALLS;
		} else if (j->req.grammar) {
			web_grammar_finish(j, s, n);
		}
		a->c_len = clen;
		if (clen > j->tc_sent) {
			emit(j, 0, s + j->tc_sent, clen - j->tc_sent);
			j->tc_sent = clen;
		}
	}
	if (j->req.stream && j->proto->finish)
		j->proto->finish(j);
}
