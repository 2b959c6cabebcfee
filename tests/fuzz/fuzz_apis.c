/*
 * fuzz_apis.c: libFuzzer target for the other APIs' request parsers (Anthropic's Messages,
 * OpenAI's Responses, Ollama's chat / generate / embed, OpenAI's embeddings: web/anthropic.c,
 * responses.c, ollama.c, embed.c) and for the scheduler side of their replies (web/api.c and each
 * API's stream and reply builders) fed with the body's own bytes as the model's text, in pieces.
 * The first byte picks the endpoint and how the text is cut; the rest is the body.
 */
#include <stdlib.h>
#include <string.h>

#include "web/web_int.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
	static const web_endpoint_t *const eps[] = {
	    &web_ep_messages,          &web_ep_responses,  &web_ep_ollama_chat,
	    &web_ep_ollama_generate,   &web_ep_embeddings, &web_ep_ollama_embed,
	    &web_ep_ollama_embeddings, &web_ep_chat};
	if (size < 1)
		return 0;
	const web_endpoint_t *ep = eps[data[0] % 8];
	size_t cut = 1 + (data[0] >> 3); /* bytes per "token" */
	web_req_t r;
	web_err_t e;
	memset(&e, 0, sizeof e);
	memset(&r, 0, sizeof r);
	const char *body = (const char *)data + 1;
	size_t len = size - 1;
	int rc = ep->parse(NULL, &r, body, len, &e);
	if (rc) {
		if (e.status < 400 || !e.message[0] || !e.type)
			abort(); /* every refusal carries a status and a message */
		free(ep->proto && ep->proto->error ? ep->proto->error(&e) : web_json_error(&e));
		web_req_clear(&r);
		return 0;
	}
	if (!ep->proto || r.kind == WEB_EMBED) {
		web_req_clear(&r);
		return 0;
	}
	if (r.tools) /* calls in the text are read as the Hermes tags */
		r.tool_format = WEB_TC_HERMES;
	int stream = r.stream;
	web_job_t *j = web_job_new(&r, NULL, 0, "m", 1000);
	if (!j)
		abort();
	j->proto = ep->proto;
	if (stream && j->proto->start)
		j->proto->start(j);
	for (size_t i = 0; i < len; i += cut) {
		web_buf_add(&j->text, body + i, i + cut <= len ? cut : len - i);
		j->res.completion_tokens++;
		web_api_on_token(j, (int)i);
	}
	j->res.finish = data[0] & 1 ? ENG_FINISH_LENGTH : ENG_FINISH_STOP;
	web_api_finish(j);
	if (!stream) {
		char *s = j->proto->reply(j);
		if (!s)
			abort();
		free(s);
	}
	web_job_unref(j);
	return 0;
}
