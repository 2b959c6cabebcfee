/* test_web_api.c: the scheduler side of the non-OpenAI APIs without a model (web/api.c and the
 * protocol hooks of anthropic.c, responses.c, ollama.c): a job's text fed piece by piece, the way
 * tokens arrive, is split into reasoning (a leading <think>, its tags cut anywhere), content and
 * tool calls; each API's stream carries them in its exact event order (Anthropic: a thinking
 * block, then a text block, ping after the first; Responses: a reasoning item, then a message
 * item, sequence_number counting from 0; Ollama: "thinking" then "content" lines and a last
 * done line) and its whole reply holds the same parts. Text that only looks like the start of
 * <think> is content; a call in the model family's tags becomes a tool_use block, a
 * function_call item and Ollama's tool_calls with arguments as an object. The node tests
 * (t_clients.sh) check the same shapes through the official SDKs. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "harness.h"
#include "web/web_int.h"

/* A streaming job of api through proto, with text fed in pieces (NULL-terminated). */
static web_job_t *run(int api, const web_proto_t *proto, int stream, const char *const *pieces,
		      const char *tools)
{
	web_req_t r;
	web_req_init(&r, WEB_CHAT);
	r.api = api;
	r.stream = stream;
	r.thinking = 1;
	if (tools) {
		r.tools = strdup(tools);
		r.tool_format = WEB_TC_HERMES;
		r.tool_choice = WEB_TOOLS_AUTO;
		r.parallel_tool_calls = 1;
	}
	web_job_t *j = web_job_new(&r, NULL, 0, "m", 1000);
	j->proto = proto;
	j->n_ids = 7;
	j->res.prompt_tokens = 7;
	if (stream && proto->start)
		proto->start(j);
	for (int i = 0; pieces[i]; i++) {
		web_buf_add(&j->text, pieces[i], strlen(pieces[i]));
		j->res.completion_tokens++;
		web_api_on_token(j, 100 + i);
	}
	j->res.finish = ENG_FINISH_STOP;
	web_api_finish(j);
	return j;
}

/* The SSE events of out: names and parsed data, in order. */
static int sse(const char *out, char names[][48], json_t **data, int max)
{
	int n = 0;
	const char *p = out;
	while (p && *p && n < max) {
		const char *ev = strstr(p, "event: "), *d = strstr(p, "data: ");
		if (!ev || !d)
			break;
		sscanf(ev + 7, "%47[^\n]", names[n]);
		const char *end = strstr(d, "\n\n");
		data[n] = json_loadb(d + 6, (size_t)(end - d - 6), 0, NULL);
		n++;
		p = end ? end + 2 : NULL;
	}
	return n;
}

static const char *const THINK[] = {"<th",           "ink>\nI think", " so.</th",
				    "ink>\n\nHello", " world",        NULL};
static const char *const CALL[] = {
    "Sure. <tool", "_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}", "</tool_call>", NULL};
static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]";

TEST(anthropic_thinking_then_text)
{
	web_job_t *j = run(WEB_API_MESSAGES, &web_proto_anthropic, 1, THINK, NULL);
	char names[32][48];
	json_t *d[32];
	int n = sse(j->out.p, names, d, 32);
	static const char *const want[] = {
	    "message_start",       "content_block_start", "ping",
	    "content_block_delta", "content_block_delta", "content_block_stop",
	    "content_block_start", "content_block_delta", "content_block_delta",
	    "content_block_stop",  "message_delta",       "message_stop"};
	CHECK_EQ_INT(n, (int)ARRAY_LEN(want));
	for (int i = 0; i < n && i < (int)ARRAY_LEN(want); i++)
		if (strcmp(names[i], want[i]))
			CHECK(!printf("  event %d: %s, want %s\n", i, names[i], want[i]));
	web_buf_t think = {0}, text = {0};
	for (int i = 0; i < n; i++) {
		json_t *delta = json_object_get(d[i], "delta");
		const char *t = json_string_value(json_object_get(delta, "type"));
		if (t && !strcmp(t, "thinking_delta"))
			web_buf_addf(&think, "%s",
				     json_string_value(json_object_get(delta, "thinking")));
		if (t && !strcmp(t, "text_delta"))
			web_buf_addf(&text, "%s",
				     json_string_value(json_object_get(delta, "text")));
	}
	CHECK(think.p && !strcmp(think.p, "I think so."));
	CHECK(text.p && !strcmp(text.p, "Hello world"));
	CHECK(!strcmp(
	    json_string_value(json_object_get(json_object_get(d[1], "content_block"), "type")),
	    "thinking"));
	CHECK_EQ_INT((int)json_integer_value(json_object_get(d[6], "index")), 1);
	json_t *md = json_object_get(d[10], "delta");
	CHECK(!strcmp(json_string_value(json_object_get(md, "stop_reason")), "end_turn"));
	for (int i = 0; i < n; i++)
		json_decref(d[i]);
	web_buf_free(&think);
	web_buf_free(&text);
	/* the whole reply: a thinking block, then the text */
	char *body = web_proto_anthropic.reply(j);
	json_t *m = json_loads(body, 0, NULL);
	json_t *c = json_object_get(m, "content");
	CHECK_EQ_INT((int)json_array_size(c), 2);
	CHECK(!strcmp(json_string_value(json_object_get(json_array_get(c, 0), "thinking")),
		      "I think so."));
	CHECK(!strcmp(json_string_value(json_object_get(json_array_get(c, 1), "text")),
		      "Hello world"));
	json_decref(m);
	free(body);
	web_job_unref(j);
}

TEST(anthropic_tool_use)
{
	web_job_t *j = run(WEB_API_MESSAGES, &web_proto_anthropic, 1, CALL, TOOLS);
	char names[32][48];
	json_t *d[32];
	int n = sse(j->out.p, names, d, 32);
	int tool_at = -1;
	for (int i = 0; i < n; i++)
		if (!strcmp(names[i], "content_block_start") &&
		    !strcmp(json_string_value(
				json_object_get(json_object_get(d[i], "content_block"), "type")),
			    "tool_use"))
			tool_at = i;
	CHECK(tool_at > 0);
	if (tool_at > 0) {
		json_t *b = json_object_get(d[tool_at], "content_block");
		CHECK(!strncmp(json_string_value(json_object_get(b, "id")), "toolu_", 6));
		CHECK(!strcmp(json_string_value(json_object_get(b, "name")), "f"));
		json_t *pj =
		    json_object_get(json_object_get(d[tool_at + 1], "delta"), "partial_json");
		json_t *args = json_loads(json_string_value(pj), 0, NULL);
		CHECK(json_integer_value(json_object_get(args, "a")) == 1);
		json_decref(args);
	}
	json_t *md = json_object_get(d[n - 2], "delta");
	CHECK(!strcmp(json_string_value(json_object_get(md, "stop_reason")), "tool_use"));
	/* the text before the call went out as text, none of the call did */
	for (int i = 0; i < n; i++) {
		const char *t =
		    json_string_value(json_object_get(json_object_get(d[i], "delta"), "text"));
		CHECK(!t || !strstr(t, "tool_call"));
		json_decref(d[i]);
	}
	web_job_unref(j);
}

TEST(responses_reasoning_then_message)
{
	web_job_t *j = run(WEB_API_RESPONSES, web_ep_responses.proto, 1, THINK, NULL);
	char names[48][48];
	json_t *d[48];
	int n = sse(j->out.p, names, d, 48);
	static const char *const want[] = {"response.created",
					   "response.in_progress",
					   "response.output_item.added",
					   "response.content_part.added",
					   "response.reasoning_text.delta",
					   "response.reasoning_text.delta",
					   "response.reasoning_text.done",
					   "response.content_part.done",
					   "response.output_item.done",
					   "response.output_item.added",
					   "response.content_part.added",
					   "response.output_text.delta",
					   "response.output_text.delta",
					   "response.output_text.done",
					   "response.content_part.done",
					   "response.output_item.done",
					   "response.completed"};
	CHECK_EQ_INT(n, (int)ARRAY_LEN(want));
	for (int i = 0; i < n && i < (int)ARRAY_LEN(want); i++) {
		if (strcmp(names[i], want[i]))
			CHECK(!printf("  event %d: %s, want %s\n", i, names[i], want[i]));
		CHECK_EQ_INT((int)json_integer_value(json_object_get(d[i], "sequence_number")), i);
		CHECK(!strcmp(json_string_value(json_object_get(d[i], "type")), names[i]));
	}
	if (n == (int)ARRAY_LEN(want)) {
		CHECK_EQ_INT((int)json_integer_value(json_object_get(d[9], "output_index")), 1);
		json_t *out = json_object_get(json_object_get(d[16], "response"), "output");
		CHECK_EQ_INT((int)json_array_size(out), 2);
		CHECK(!strcmp(json_string_value(json_object_get(json_array_get(out, 0), "type")),
			      "reasoning"));
		json_t *msg = json_array_get(out, 1);
		CHECK(!strcmp(json_string_value(json_object_get(
				  json_array_get(json_object_get(msg, "content"), 0), "text")),
			      "Hello world"));
		/* the items of the final output are the streamed ones (same ids) */
		CHECK(json_equal(json_object_get(msg, "id"),
				 json_object_get(json_object_get(d[9], "item"), "id")));
		CHECK(!strcmp(json_string_value(
				  json_object_get(json_object_get(d[16], "response"), "status")),
			      "completed"));
	}
	for (int i = 0; i < n; i++)
		json_decref(d[i]);
	web_job_unref(j);
}

TEST(responses_function_call)
{
	web_job_t *j = run(WEB_API_RESPONSES, web_ep_responses.proto, 0, CALL, TOOLS);
	char *body = web_ep_responses.proto->reply(j);
	json_t *r = json_loads(body, 0, NULL), *out = json_object_get(r, "output");
	CHECK_EQ_INT((int)json_array_size(out), 2); /* the text before, then the call */
	json_t *fc = json_array_get(out, 1);
	CHECK(!strcmp(json_string_value(json_object_get(fc, "type")), "function_call"));
	CHECK(!strncmp(json_string_value(json_object_get(fc, "call_id")), "call_", 5));
	CHECK(!strcmp(json_string_value(json_object_get(fc, "arguments")), "{\"a\":1}"));
	json_decref(r);
	free(body);
	web_job_unref(j);
}

TEST(ollama_thinking_and_calls)
{
	web_job_t *j = run(WEB_API_OLLAMA_CHAT, &web_proto_ollama, 1, THINK, NULL);
	web_buf_t think = {0}, text = {0};
	int lines = 0, done = 0;
	for (char *p = j->out.p, *e; p && (e = strchr(p, '\n')); p = e + 1, lines++) {
		json_t *o = json_loadb(p, (size_t)(e - p), 0, NULL),
		       *m = json_object_get(o, "message");
		CHECK(o != NULL && !done); /* nothing after the done line */
		done = json_is_true(json_object_get(o, "done"));
		const char *t = json_string_value(json_object_get(m, "thinking"));
		if (t)
			web_buf_addf(&think, "%s", t);
		web_buf_addf(&text, "%s", json_string_value(json_object_get(m, "content")));
		json_decref(o);
	}
	CHECK(done);
	CHECK(think.p && !strcmp(think.p, "I think so."));
	CHECK(text.p && !strcmp(text.p, "Hello world"));
	web_buf_free(&think);
	web_buf_free(&text);
	web_job_unref(j);
	j = run(WEB_API_OLLAMA_CHAT, &web_proto_ollama, 0, CALL, TOOLS);
	char *body = web_proto_ollama.reply(j);
	json_t *r = json_loads(body, 0, NULL);
	json_t *calls = json_object_get(json_object_get(r, "message"), "tool_calls");
	json_t *fn = json_object_get(json_array_get(calls, 0), "function");
	CHECK(json_integer_value(json_object_get(json_object_get(fn, "arguments"), "a")) == 1);
	CHECK(!strcmp(json_string_value(json_object_get(json_object_get(r, "message"), "content")),
		      "Sure."));
	json_decref(r);
	free(body);
	web_job_unref(j);
}

TEST(not_a_think_tag)
{
	static const char *const pieces[] = {"<", "b>hi", NULL};
	web_job_t *j = run(WEB_API_MESSAGES, &web_proto_anthropic, 0, pieces, NULL);
	CHECK_EQ_INT((int)j->ps.r_len, 0);
	CHECK_EQ_INT((int)j->ps.c_len, 5);
	CHECK(!memcmp(j->text.p + j->ps.c0, "<b>hi", 5));
	web_job_unref(j);
	/* a prompt that opened <think> itself (qwen3.5's template): the reply starts inside it */
	web_req_t r;
	web_req_init(&r, WEB_CHAT);
	r.api = WEB_API_OLLAMA_CHAT;
	r.think_open = 1;
	j = web_job_new(&r, NULL, 0, "m", 1000);
	j->proto = &web_proto_ollama;
	static const char *const opened[] = {"I think", " so.</thi", "nk>\n\nHi", NULL};
	for (int i = 0; opened[i]; i++) {
		web_buf_add(&j->text, opened[i], strlen(opened[i]));
		web_api_on_token(j, i);
	}
	web_api_finish(j);
	CHECK(j->ps.r_len == 11 && !memcmp(j->text.p + j->ps.r0, "I think so.", 11));
	CHECK(j->ps.c_len == 2 && !memcmp(j->text.p + j->ps.c0, "Hi", 2));
	web_job_unref(j);
	/* an unclosed <think> that the limit cut: all reasoning, no content */
	static const char *const cut[] = {"<think>", "still thinking", NULL};
	j = run(WEB_API_MESSAGES, &web_proto_anthropic, 0, cut, NULL);
	CHECK_EQ_INT((int)j->ps.c_len, 0);
	CHECK(j->ps.r_len == strlen("still thinking"));
	web_job_unref(j);
}

/* gpt-oss (tool_format WEB_TC_HARMONY): its channels, cut anywhere, become the same parts:
 * analysis the reasoning, final the content, a to=functions.NAME message a call; no harmony token
 * reaches any API's stream or reply (test_gptoss.c checks the parse itself). */
TEST(harmony_channels)
{
	static const char *const pieces[] = {
	    "<|chan",
	    "nel|>analysis<|message|>Need",
	    " it.<|end|><|start|>assistant<|channel|>",
	    "final<|message|>Hi",
	    " there<|end|><|start|>assistant<|channel|>commentary ",
	    "to=functions.f <|constrain|>json<|message|>{\"a\": 1}",
	    "<|call|>",
	    NULL};
	for (int stream = 0; stream < 2; stream++) {
		web_req_t r;
		web_req_init(&r, WEB_CHAT);
		r.api = WEB_API_MESSAGES;
		r.stream = stream;
		r.thinking = 1;
		r.tools = strdup(TOOLS);
		r.tool_format = WEB_TC_HARMONY;
		r.tool_choice = WEB_TOOLS_AUTO;
		web_job_t *j = web_job_new(&r, NULL, 0, "m", 1000);
		j->proto = &web_proto_anthropic;
		if (stream)
			web_proto_anthropic.start(j);
		for (int i = 0; pieces[i]; i++) {
			web_buf_add(&j->text, pieces[i], strlen(pieces[i]));
			j->res.completion_tokens++;
			web_api_on_token(j, 100 + i);
		}
		j->res.finish = ENG_FINISH_STOP;
		web_api_finish(j);
		CHECK_EQ_INT(j->res.finish, WEB_FINISH_TOOL_CALLS);
		CHECK(j->ps.r_len == 8 && !memcmp(j->text.p + j->ps.r0, "Need it.", 8));
		CHECK(j->ps.c_len == 8 && !memcmp(j->text.p + j->ps.c0, "Hi there", 8));
		char *body = stream ? NULL : web_proto_anthropic.reply(j);
		const char *all = stream ? j->out.p : body;
		CHECK(all && !strstr(all, "<|"));
		/* streamed, the parts come in the pieces' deltas */
		CHECK(all && strstr(all, stream ? "\"Need\"" : "\"Need it.\"") &&
		      strstr(all, stream ? "\" there\"" : "\"Hi there\"") &&
		      strstr(all, "tool_use"));
		free(body);
		web_job_unref(j);
	}
}

/* ---- the requests: each API's body as the chat request the engine gets ---------------------- */

static int parse(const web_endpoint_t *ep, web_req_t *r, const char *body, web_err_t *e)
{
	memset(e, 0, sizeof *e);
	return ep->parse(NULL, r, body, strlen(body), e);
}

TEST(anthropic_request)
{
	web_req_t r;
	web_err_t e;
	const char *b =
	    "{\"model\":\"m\",\"max_tokens\":9,\"system\":[{\"type\":\"text\",\"text\":\"Be "
	    "kind.\"}],\"stop_sequences\":[\"END\"],\"thinking\":{\"type\":\"enabled\","
	    "\"budget_tokens\":100},\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},"
	    "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\","
	    "\"signature\":\"x\"},{\"type\":\"text\",\"text\":\"Looking.\"},{\"type\":"
	    "\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{\"a\":1}}]},{\"role\":"
	    "\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
	    "\"content\":[{\"type\":\"text\",\"text\":\"sunny\"}]},{\"type\":\"text\",\"text\":"
	    "\"Thanks\"}]}],\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],"
	    "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true}}";
	CHECK_EQ_INT(parse(&web_ep_messages, &r, b, &e), 0);
	static const char *const roles[] = {"system", "user", "assistant", "tool", "user"};
	CHECK_EQ_INT(r.n_msgs, 5);
	for (int i = 0; i < r.n_msgs && i < 5; i++)
		CHECK(!strcmp(r.msgs[i].role, roles[i]));
	if (r.n_msgs == 5) {
		CHECK(!strcmp(r.msgs[0].content, "Be kind."));
		CHECK(!strcmp(r.msgs[2].content, "Looking.") &&
		      strstr(r.msgs[2].tool_calls, "toolu_1"));
		CHECK(!strcmp(r.msgs[3].tool_call_id, "toolu_1") &&
		      !strcmp(r.msgs[3].content, "sunny"));
	}
	CHECK_EQ_INT(r.samp.max_tokens, 9);
	CHECK(r.n_stop == 1 && !strcmp(r.stop[0], "END"));
	CHECK(r.thinking && r.tool_choice == WEB_TOOLS_REQUIRED && !r.parallel_tool_calls);
	CHECK(r.samp.temperature == 1.0f && r.api == WEB_API_MESSAGES);
	web_req_clear(&r);
	/* refusals, in Anthropic's words */
	CHECK_EQ_INT(parse(&web_ep_messages, &r,
			   "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &e),
		     400);
	CHECK(!strcmp(e.message, "max_tokens: Field required"));
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&web_ep_messages, &r, "{\"max_tokens\":1,\"messages\":[]}", &e), 400);
	web_req_clear(&r);
	CHECK_EQ_INT(
	    parse(&web_ep_messages, &r,
		  "{\"max_tokens\":1,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", &e),
	    400);
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&web_ep_messages, &r,
			   "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
			   "\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"s\"}]}",
			   &e),
		     400);
	CHECK(strstr(e.message, "server tools") != NULL);
	web_req_clear(&r);
	char *err = web_proto_anthropic.error(&e);
	CHECK(
	    !strncmp(err, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\"", 55));
	free(err);
}

TEST(ollama_request)
{
	web_req_t r;
	web_err_t e;
	CHECK_EQ_INT(
	    parse(&web_ep_ollama_chat, &r,
		  "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
		  "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":"
		  "{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},{\"role\":\"tool\","
		  "\"content\":\"ok\",\"tool_name\":\"f\"}],\"format\":\"json\",\"options\":"
		  "{\"num_predict\":7,\"num_ctx\":64,\"seed\":3,\"stop\":[\"x\"]}}",
		  &e),
	    0);
	CHECK(r.stream == 1); /* Ollama streams unless told not to */
	CHECK_EQ_INT(r.samp.max_tokens, 7);
	CHECK_EQ_INT(r.max_ctx, 64);
	CHECK(r.samp.seed == 3 && r.seed_given && r.n_stop == 1 && r.grammar != NULL);
	CHECK(r.samp.temperature > 0.79f && r.samp.temperature < 0.81f && r.samp.top_k == 40);
	CHECK(r.n_msgs == 3 && strstr(r.msgs[1].tool_calls, "call_0") &&
	      !strcmp(r.msgs[2].tool_call_id, "call_0"));
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&web_ep_ollama_generate, &r, "{\"model\":\"m\",\"prompt\":\"\"}", &e),
		     0);
	CHECK(r.no_work); /* a load */
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&web_ep_ollama_generate, &r,
			   "{\"prompt\":\"abc\",\"raw\":true,\"stream\":false,\"context\":[1,2]}",
			   &e),
		     0);
	CHECK(r.kind == WEB_COMPLETION && !r.stream && r.n_ctx_ids == 2);
	web_req_clear(&r);
	CHECK_EQ_INT(
	    parse(&web_ep_ollama_chat, &r,
		  "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"images\":[\"AA==\"]}]}",
		  &e),
	    400);
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&web_ep_ollama_generate, &r,
			   "{\"prompt\":\"x\",\"options\":{\"num_predict\":\"many\"}}", &e),
		     400);
	char *err = web_proto_ollama.error(&e);
	CHECK(!strncmp(err, "{\"error\":\"", 10));
	free(err);
	web_req_clear(&r);
}

TEST(responses_request)
{
	web_req_t r;
	web_err_t e;
	CHECK_EQ_INT(
	    parse(&web_ep_responses, &r,
		  "{\"instructions\":\"Be brief.\",\"max_output_tokens\":5,\"input\":[{"
		  "\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Q\"}]},"
		  "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\","
		  "\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":"
		  "\"call_1\",\"output\":\"42\"},{\"type\":\"reasoning\",\"id\":\"rs_1\","
		  "\"summary\":[]}],\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":"
		  "\"x\",\"schema\":{\"type\":\"integer\"}}},\"store\":false}",
		  &e),
	    0);
	static const char *const roles[] = {"system", "user", "assistant", "tool"};
	CHECK_EQ_INT(r.n_msgs, 4);
	for (int i = 0; i < r.n_msgs && i < 4; i++)
		CHECK(!strcmp(r.msgs[i].role, roles[i]));
	CHECK(r.samp.max_tokens == 5 && r.grammar != NULL && !r.store_reply);
	CHECK(json_is_array(r.history) && json_array_size(r.history) == 4);
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&web_ep_responses, &r,
			   "{\"input\":\"x\",\"previous_response_id\":\"resp_none\"}", &e),
		     400);
	CHECK(!strcmp(e.param, "previous_response_id"));
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&web_ep_responses, &r,
			   "{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", &e),
		     400);
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&web_ep_responses, &r, "{\"model\":\"m\"}", &e), 400);
	web_req_clear(&r);
}

TEST(embeddings_request)
{
	web_req_t r;
	web_err_t e;
	CHECK_EQ_INT(
	    parse(&web_ep_embeddings, &r,
		  "{\"input\":[\"a\",\"b\"],\"encoding_format\":\"base64\",\"dimensions\":8}", &e),
	    0);
	CHECK(r.kind == WEB_EMBED && r.n_inputs == 2 && r.base64 && r.dimensions == 8 &&
	      !r.truncate);
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&web_ep_embeddings, &r, "{\"input\":[[1,2],[3]]}", &e), 0);
	CHECK(r.n_inputs == 2 && r.input_len[0] == 2 && r.input_ids[1][0] == 3);
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&web_ep_embeddings, &r, "{\"input\":[5,6,7]}", &e), 0); /* one input */
	CHECK(r.n_inputs == 1 && r.input_len[0] == 3);
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&web_ep_embeddings, &r, "{\"input\":[]}", &e), 400);
	web_req_clear(&r);
	CHECK_EQ_INT(
	    parse(&web_ep_embeddings, &r, "{\"input\":\"x\",\"encoding_format\":\"int8\"}", &e),
	    400);
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&web_ep_ollama_embed, &r, "{\"input\":\"\"}", &e), 0);
	CHECK(r.no_work && r.truncate);
	web_req_clear(&r);
	CHECK_EQ_INT(parse(&web_ep_ollama_embed, &r, "{\"input\":[1,2]}", &e), 400); /* no ids */
	web_req_clear(&r);
	web_buf_t big = {0};
	web_buf_add(&big, "{\"input\":[", 10);
	for (int i = 0; i <= WEB_EMBED_INPUTS_MAX; i++)
		web_buf_add(&big, i ? ",\"a\"" : "\"a\"", i ? 4 : 3);
	web_buf_add(&big, "]}", 2);
	CHECK_EQ_INT(parse(&web_ep_embeddings, &r, big.p, &e), 400);
	web_req_clear(&r);
	web_buf_free(&big);
}

TEST(response_store_bounds)
{
	web_rstore_t *s = web_rstore_new(40, 3);
	CHECK(s != NULL);
	char id[16];
	for (int i = 0; i < 4; i++) { /* the fourth pushes the first out (3 entries at most) */
		snprintf(id, sizeof id, "r%d", i);
		web_rstore_put(s, id, strdup("[1,2]"));
	}
	json_t *v = web_rstore_get(s, "r0");
	CHECK(v == NULL);
	v = web_rstore_get(s, "r3");
	CHECK(json_is_array(v) && json_array_size(v) == 2);
	json_decref(v);
	web_rstore_put(s, "big",
		       strdup("[\"0123456789012345678901234567890123456789\"]")); /* > 40 */
	CHECK(web_rstore_get(s, "big") == NULL);
	web_rstore_put(s, "r9", strdup("[\"01234567890123456789012345\"]")); /* needs the room */
	v = web_rstore_get(s, "r9");
	CHECK(v != NULL);
	json_decref(v);
	CHECK(web_rstore_get(s, "r1") == NULL); /* the oldest made room */
	v = web_rstore_get(s, "r2");
	CHECK(v != NULL);
	json_decref(v);
	CHECK(web_rstore_get(NULL, "r9") == NULL);
	web_rstore_free(s);
}

int main(void)
{
	RUN(anthropic_thinking_then_text);
	RUN(anthropic_tool_use);
	RUN(responses_reasoning_then_message);
	RUN(responses_function_call);
	RUN(ollama_thinking_and_calls);
	RUN(not_a_think_tag);
	RUN(harmony_channels);
	RUN(anthropic_request);
	RUN(ollama_request);
	RUN(responses_request);
	RUN(embeddings_request);
	RUN(response_store_bounds);
	return harness_done();
}
