/* test_web_tools.c: the request fields of tool calling and structured output (web/tools.c), and
 * the reply side: a model's text in each family's form becomes OpenAI tool_calls; while
 * streaming, nothing that turns into a call is sent as content. */
#include "harness.h"

#include "common/common.h"
#include "web/web_int.h"

#include <jansson.h>

static const char BODY[] =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]%s}";

static web_job_t *job(const char *extra, int format, int stream)
{
	char body[1024];
	web_req_t r;
	web_err_t e;
	snprintf(body, sizeof body, BODY, extra);
	if (web_req_parse(&r, WEB_CHAT, body, strlen(body), &e)) {
		fprintf(stderr, "parse: %s\n", e.message);
		web_req_clear(&r);
		return NULL;
	}
	r.tool_format = format;
	r.stream = stream;
	return web_job_new(&r, NULL, 0, "m", 1000);
}

/* Runs text through a job of that format; returns the tool_calls (new reference) or NULL. */
static json_t *calls_of(const char *text, int format, const char *extra, char **content)
{
	web_job_t *j = job(extra ? extra : "", format, 0);
	if (!j)
		return NULL;
	web_buf_add(&j->text, text, strlen(text));
	web_tools_finish(j);
	json_t *c = j->rid.tool_calls ? json_incref(j->rid.tool_calls) : NULL;
	CHECK(!c || j->res.finish == WEB_FINISH_TOOL_CALLS);
	if (content)
		*content = strdup(j->text.p ? j->text.p : "");
	web_job_unref(j);
	return c;
}

static const char *name_of(json_t *calls, size_t i)
{
	return json_string_value(
	    json_object_get(json_object_get(json_array_get(calls, i), "function"), "name"));
}

static const char *args_of(json_t *calls, size_t i)
{
	return json_string_value(
	    json_object_get(json_object_get(json_array_get(calls, i), "function"), "arguments"));
}

TEST(hermes_tags)
{
	char *content = NULL;
	json_t *c =
	    calls_of("Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
		     "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
		     "\"get_time\", \"arguments\": {}}\n</tool_call>",
		     WEB_TC_HERMES, NULL, &content);
	CHECK(c && json_array_size(c) == 2);
	CHECK_EQ_STR(name_of(c, 0), "get_weather");
	CHECK_EQ_STR(args_of(c, 0), "{\"city\":\"Paris\"}");
	CHECK_EQ_STR(name_of(c, 1), "get_time");
	CHECK_EQ_STR(content, "Let me look.");
	const char *id = json_string_value(json_object_get(json_array_get(c, 0), "id"));
	CHECK(id && !strncmp(id, "call_", 5));
	json_decref(c);
	free(content);
	/* parallel_tool_calls false keeps the first */
	c = calls_of("<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call><tool_call>"
		     "{\"name\":\"get_time\",\"arguments\":{}}</tool_call>",
		     WEB_TC_HERMES, ",\"parallel_tool_calls\":false", NULL);
	CHECK(c && json_array_size(c) == 1);
	json_decref(c);
	/* an unknown function or broken JSON is plain content */
	CHECK(!calls_of("<tool_call>{\"name\":\"rm_rf\",\"arguments\":{}}</tool_call>",
			WEB_TC_HERMES, NULL, NULL));
	CHECK(!calls_of("<tool_call>{\"name\":", WEB_TC_HERMES, NULL, NULL));
	CHECK(!calls_of("Just text.", WEB_TC_HERMES, NULL, NULL));
}

/* GLM-4.5/4.6's calls (models/templates/GLM-4.6.jinja): NAME then <arg_key>/<arg_value> pairs
 * inside the same <tool_call> tags; a value is JSON unless the tool says it is a string. */
TEST(glm4_calls)
{
	char *content = NULL;
	json_t *c = calls_of("<think></think>\nLooking.\n<tool_call>get_weather\n<arg_key>city"
			     "</arg_key>\n<arg_value>42</arg_value>\n<arg_key>days</arg_key>\n"
			     "<arg_value>3</arg_value>\n</tool_call><tool_call>get_time\n"
			     "</tool_call>",
			     WEB_TC_GLM4, NULL, &content);
	CHECK(c && json_array_size(c) == 2);
	CHECK_EQ_STR(name_of(c, 0), "get_weather");
	CHECK_EQ_STR(args_of(c, 0), "{\"city\":\"42\",\"days\":3}");
	CHECK_EQ_STR(name_of(c, 1), "get_time");
	CHECK_EQ_STR(args_of(c, 1), "{}");
	CHECK_EQ_STR(content, "<think></think>\nLooking.");
	json_decref(c);
	free(content);
	CHECK(!calls_of("<tool_call>rm_rf\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n"
			"</tool_call>",
			WEB_TC_GLM4, NULL, NULL));
	/* the form is GLM's own (ENG_TOOLS_GLM4): a Hermes model's text is not read so */
	CHECK(!calls_of("<tool_call>get_time\n</tool_call>", WEB_TC_HERMES, NULL, NULL));
}

TEST(llama3_and_mistral)
{
	json_t *c = calls_of(" {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
			     WEB_TC_LLAMA3, NULL, NULL);
	CHECK(c && json_array_size(c) == 1);
	CHECK_EQ_STR(args_of(c, 0), "{\"city\":\"Oslo\"}");
	json_decref(c);
	c = calls_of(
	    "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}, "
	    "\"id\": \"abcdefghi\"}, {\"name\": \"get_time\", \"arguments\": {}}]",
	    WEB_TC_MISTRAL, NULL, NULL);
	CHECK(c && json_array_size(c) == 2);
	CHECK_EQ_STR(name_of(c, 1), "get_time");
	json_decref(c);
	CHECK(!calls_of("{\"not\": \"a call\"}", WEB_TC_LLAMA3, NULL, NULL));
}

/* Qwen3.5's XML calls (llama.cpp common_chat_params_init_qwen3_coder): values are JSON unless
 * the parameter is a string; a call may come without its <tool_call>. */
TEST(qwen35_xml)
{
	char *content = NULL;
	json_t *c =
	    calls_of("I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>"
		     "\n123\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
		     "<function=get_time>\n<parameter=tz>\n{\"a\": [1, 2]}\n</parameter>\n"
		     "</function>\n</tool_call>",
		     WEB_TC_XML, NULL, &content);
	CHECK(c && json_array_size(c) == 2);
	CHECK_EQ_STR(name_of(c, 0), "get_weather");
	CHECK_EQ_STR(args_of(c, 0), "{\"city\":\"123\"}"); /* a string parameter stays one */
	CHECK_EQ_STR(name_of(c, 1), "get_time");
	CHECK_EQ_STR(args_of(c, 1), "{\"tz\":{\"a\":[1,2]}}");
	CHECK_EQ_STR(content, "I will check.");
	json_decref(c);
	free(content);
	c = calls_of("<function=get_time>\n</function>", WEB_TC_XML, NULL, NULL);
	CHECK(c && json_array_size(c) == 1);
	json_decref(c);
	CHECK(!calls_of("<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>", WEB_TC_XML,
			NULL, NULL));
	/* streaming holds back what may open a call in either form */
	web_job_t *j = job("", WEB_TC_XML, 1);
	const char *pieces[] = {"Ok", " then <func", "tion=get_time>\n</function>"};
	for (size_t i = 0; i < ARRAY_LEN(pieces); i++) {
		web_buf_add(&j->text, pieces[i], strlen(pieces[i]));
		web_tools_on_text(j);
		CHECK(!strstr(j->out.p ? j->out.p : "", "<func"));
	}
	web_tools_finish(j);
	CHECK(strstr(j->out.p, "\"name\":\"get_time\"") != NULL);
	web_job_unref(j);
}

/* Streaming: content before the tag goes out, the tag and the call never do as content. */
TEST(stream_holds_back_calls)
{
	web_job_t *j = job("", WEB_TC_HERMES, 1);
	const char *pieces[] = {"Sure", ", checking", ".\n<tool",
				"_call>\n{\"name\": \"get_time\", ",
				"\"arguments\": {}}\n</tool_call>"};
	for (size_t i = 0; i < ARRAY_LEN(pieces); i++) {
		web_buf_add(&j->text, pieces[i], strlen(pieces[i]));
		web_tools_on_text(j);
		CHECK(!strstr(j->out.p ? j->out.p : "", "<tool"));
	}
	CHECK(strstr(j->out.p, "Sure") && strstr(j->out.p, ", checking"));
	web_tools_finish(j);
	CHECK(!strstr(j->out.p, "<tool"));
	CHECK(strstr(j->out.p, "\"tool_calls\":[{\"index\":0,\"id\":\"call_"));
	CHECK(strstr(j->out.p, "\"arguments\":\"{}\""));
	CHECK_EQ_INT(j->res.finish, WEB_FINISH_TOOL_CALLS);
	web_job_unref(j);
}

/* gpt-oss (harmony): the analysis channel becomes reasoning_content, the final channel the
 * content, a message to functions.NAME a call (common/chat.cpp's gpt-oss parser); streamed as
 * reasoning_content and content deltas without any harmony token in them. */
TEST(harmony_channels)
{
	const char *reply = "<|channel|>analysis<|message|>The user wants Paris.<|end|><|start|>"
			    "assistant<|channel|>commentary to=functions.get_weather <|constrain|>"
			    "json<|message|>{\"city\": \"Paris\"}";
	char *content = NULL;
	json_t *c = calls_of(reply, WEB_TC_HARMONY, NULL, &content);
	CHECK(c && json_array_size(c) == 1);
	CHECK_EQ_STR(name_of(c, 0), "get_weather");
	CHECK_EQ_STR(args_of(c, 0), "{\"city\":\"Paris\"}");
	CHECK_EQ_STR(content, "");
	json_decref(c);
	free(content);
	/* a plain answer: reasoning_content in the reply's message */
	web_job_t *j = job("", WEB_TC_HARMONY, 0);
	const char *ans = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>"
			  "final<|message|>4";
	web_buf_add(&j->text, ans, strlen(ans));
	web_tools_finish(j);
	web_usage_t u = {1, 2};
	char *body = web_json_reply(&j->rid, j->text.p, j->text.len, j->res.finish, &u, NULL);
	json_t *root = json_loads(body, 0, NULL);
	json_t *msg =
	    json_object_get(json_array_get(json_object_get(root, "choices"), 0), "message");
	CHECK_EQ_STR(json_string_value(json_object_get(msg, "content")), "4");
	CHECK_EQ_STR(json_string_value(json_object_get(msg, "reasoning_content")), "Easy.");
	json_decref(root);
	free(body);
	web_job_unref(j);
	/* streaming, token by token */
	j = job("", WEB_TC_HARMONY, 1);
	const char *toks[] = {"<|channel|>", "analysis", "<|message|>", "Eas",
			      "y.",          "<|end|>",  "<|start|>",   "assistant",
			      "<|channel|>", "final",    "<|message|>", "4"};
	for (size_t i = 0; i < ARRAY_LEN(toks); i++) {
		web_buf_add(&j->text, toks[i], strlen(toks[i]));
		web_tools_on_text(j);
	}
	web_tools_finish(j);
	CHECK(!strstr(j->out.p, "<|"));
	CHECK(strstr(j->out.p, "\"reasoning_content\":\"Eas\"") &&
	      strstr(j->out.p, "\"reasoning_content\":\"y.\""));
	CHECK(strstr(j->out.p, "\"content\":\"4\""));
	web_job_unref(j);
}

TEST(request_errors)
{
	web_req_t r;
	web_err_t e;
	char body[1024];
	struct {
		const char *extra, *param;
	} bad[] = {
	    {",\"tool_choice\":\"sometimes\"", "tool_choice"},
	    {",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}",
	     "tool_choice"},
	    {",\"parallel_tool_calls\":3", "parallel_tool_calls"},
	    {",\"response_format\":{\"type\":\"xml\"}", "response_format.type"},
	    {",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
	     "\"schema\":{\"type\":\"string\",\"format\":\"date\"}}}",
	     "response_format"},
	};
	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		snprintf(body, sizeof body, BODY, bad[i].extra);
		CHECK_EQ_INT(web_req_parse(&r, WEB_CHAT, body, strlen(body), &e), 400);
		CHECK_EQ_STR(e.param, bad[i].param);
		web_req_clear(&r);
	}
	snprintf(body, sizeof body, BODY,
		 ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
		 "\"schema\":{\"type\":\"string\",\"format\":\"date\"}}}");
	web_req_parse(&r, WEB_CHAT, body, strlen(body), &e);
	CHECK(strstr(e.message, "'format'") != NULL);
	web_req_clear(&r);
	/* tool messages and assistant calls parse; a tool message needs its id */
	const char *ok =
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
	    "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
	    "\"f\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\","
	    "\"content\":\"r\"}]}";
	CHECK_EQ_INT(web_req_parse(&r, WEB_CHAT, ok, strlen(ok), &e), 0);
	CHECK(r.n_msgs == 3 && r.msgs[1].tool_calls && !strcmp(r.msgs[1].content, "") &&
	      !strcmp(r.msgs[2].tool_call_id, "c1"));
	web_req_clear(&r);
	const char *noid = "{\"messages\":[{\"role\":\"tool\",\"content\":\"r\"}]}";
	CHECK_EQ_INT(web_req_parse(&r, WEB_CHAT, noid, strlen(noid), &e), 400);
	web_req_clear(&r);
	const char *fmt = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
			  "\"response_format\":{\"type\":\"json_object\"}}";
	CHECK_EQ_INT(web_req_parse(&r, WEB_CHAT, fmt, strlen(fmt), &e), 0);
	CHECK(r.grammar && r.samp.grammar == r.grammar);
	web_req_clear(&r);
}

int main(void)
{
	RUN(hermes_tags);
	RUN(qwen35_xml);
	RUN(glm4_calls);
	RUN(llama3_and_mistral);
	RUN(stream_holds_back_calls);
	RUN(harmony_channels);
	RUN(request_errors);
	return harness_done();
}
