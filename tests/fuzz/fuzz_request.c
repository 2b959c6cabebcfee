/*
 * fuzz_request.c: libFuzzer target for web/'s request parser (the bytes a client posts to
 * /v1/chat/completions and /v1/completions), and for the reply builders fed with what it parsed.
 * The first byte picks the endpoint; the rest is the body.
 */
#include <stdlib.h>
#include <string.h>

#include "web/web_int.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
	if (size < 1)
		return 0;
	int kind = data[0] & 1 ? WEB_COMPLETION : WEB_CHAT;
	web_req_t r;
	web_err_t e;
	int rc = web_req_parse(&r, kind, (const char *)data + 1, size - 1, &e);
	if (rc) {
		if (e.status < 400 || !e.message[0] || !e.type)
			abort(); /* every refusal carries a status and a message */
		free(web_json_error(&e));
	} else {
		/* Echo the parsed text through the builders: invalid UTF-8 must be repaired. */
		web_reply_id_t rid = {.kind = kind, .id = "x", .model = r.model ? r.model : "m"};
		const char *t = kind == WEB_CHAT ? r.msgs[r.n_msgs - 1].content : r.prompt;
		if (!t)
			t = "";
		web_usage_t u = {1, 2};
		char *s = web_json_reply(&rid, t, strlen(t), ENG_FINISH_STOP, &u, NULL);
		if (!s)
			abort();
		free(s);
		s = web_json_chunk(&rid, NULL, (const char *)data + 1, size - 1, ENG_FINISH_NONE, 1,
				   NULL);
		if (!s)
			abort();
		free(s);
	}
	web_req_clear(&r);
	return 0;
}
