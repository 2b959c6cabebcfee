/* test_chat_tools.c: prompts with tools, per tool style, equal the text the family's published
 * template renders for the same conversation (tests/chat_tools/STYLE.txt; how those files were
 * made is in tests/chat_tools/README); the style is recognised from the family and template. */
#include "harness.h"

#include "common/common.h"
#include "infer/chat.h"

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
    "\"Current weather of a city\", \"parameters\": {\"type\": \"object\", \"properties\": "
    "{\"city\": {\"type\": \"string\", \"description\": \"City name\"}, \"unit\": {\"type\": "
    "\"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}]";

/* As an OpenAI client sends it: arguments are a JSON string. */
static const char CALLS[] = "[{\"id\": \"a1B2c3D4e\", \"type\": \"function\", \"function\": "
			    "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": "
			    "\\\"Paris\\\", \\\"unit\\\": \\\"celsius\\\"}\"}}]";

static const eng_msg_t conv[] = {
    {.role = "system", .content = "You are a helpful assistant."},
    {.role = "user", .content = "What is the weather in Paris?"},
    {.role = "assistant", .content = "", .tool_calls = CALLS},
    {.role = "tool", .content = "{\"temperature\": 21}", .tool_call_id = "a1B2c3D4e"},
};

static void expect(const char *family, chat_tool_style_t style, const char *file)
{
	char path[256], *want = NULL, *out = NULL, err[256];
	size_t wlen;
	snprintf(path, sizeof path, "tests/chat_tools/%s.txt", file);
	CHECK_EQ_INT(read_file_all(path, &want, &wlen, err, sizeof err), 0);
	int rc = chat_render_tools(family, style, conv, 4, TOOLS, 0, NULL, &out, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (want && out && strcmp(want, out)) {
		size_t i = 0;
		while (want[i] && want[i] == out[i])
			i++;
		fprintf(stderr, "%s: differs at byte %zu:\n--- want\n%s\n--- got\n%s\n", file, i,
			want + i, out + i);
		CHECK(0);
	}
	free(want);
	free(out);
}

TEST(llama3)
{
	expect("llama3", CHAT_TOOLS_LLAMA3, "llama3");
}
TEST(qwen25)
{
	expect("chatml", CHAT_TOOLS_QWEN25, "qwen2.5");
}
TEST(qwen3)
{
	expect("chatml", CHAT_TOOLS_QWEN3, "qwen3");
}
TEST(hermes)
{
	expect("chatml", CHAT_TOOLS_HERMES, "hermes");
}
TEST(mistral)
{
	expect("mistral-v3-tekken", CHAT_TOOLS_MISTRAL, "mistral");
}
TEST(generic)
{
	expect("zephyr", CHAT_TOOLS_GENERIC, "generic");
}
TEST(glm4)
{
	expect("chatglm4", CHAT_TOOLS_GLM4, "glm4");
}

TEST(qwen35)
{
	expect("qwen3.5", CHAT_TOOLS_QWEN35, "qwen3.5");
}

/* Qwen3.5 beyond the one conversation: reasoning kept only after the last user query,
 * reasoning split out of an earlier reply's text, several results in one user turn, a text
 * before calls, scalars written as the template's "| string" writes them. */
TEST(qwen35_turns)
{
	static const char calls2[] =
	    "[{\"id\": \"x\", \"type\": \"function\", \"function\": {\"name\": \"f\", "
	    "\"arguments\": \"{\\\"n\\\": 3, \\\"ok\\\": true, \\\"l\\\": [1, 2]}\"}}, "
	    "{\"id\": \"y\", \"type\": \"function\", \"function\": {\"name\": \"g\", "
	    "\"arguments\": \"{}\"}}]";
	const eng_msg_t m[] = {
	    {.role = "user", .content = " Hi "},
	    {.role = "assistant", .content = "<think>\nhmm\n</think>\n\nHello!"},
	    {.role = "user", .content = "Do it"},
	    {.role = "assistant", .content = "Sure.", .tool_calls = calls2},
	    {.role = "tool", .content = "1"},
	    {.role = "tool", .content = "2"},
	};
	char *out = NULL, err[256];
	CHECK_EQ_INT(chat_render_tools("qwen3.5", CHAT_TOOLS_QWEN35, m, 6, NULL, 0, NULL, &out, err,
				       sizeof err),
		     0);
	static const char want[] =
	    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
	    "<|im_start|>user\nDo it<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
	    "Sure.\n\n<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n<parameter=ok>"
	    "\nTrue\n</parameter>\n<parameter=l>\n[1, 2]\n</parameter>\n</function>\n</tool_call>"
	    "\n<tool_call>\n<function=g>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n"
	    "<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>"
	    "\n<|im_start|>assistant\n<think>\n";
	if (out && strcmp(out, want))
		fprintf(stderr, "--- want\n%s\n--- got\n%s\n", want, out);
	CHECK(out && !strcmp(out, want));
	free(out);
	/* the template's refusals */
	const eng_msg_t late_sys[] = {{.role = "user", .content = "a"},
				      {.role = "system", .content = "b"}};
	CHECK(chat_render_tools("qwen3.5", CHAT_TOOLS_QWEN35, late_sys, 2, NULL, 0, NULL, &out, err,
				sizeof err) < 0);
	const eng_msg_t no_user[] = {{.role = "system", .content = "b"}};
	CHECK(chat_render("qwen3.5", no_user, 1, 1, NULL, &out, err, sizeof err) < 0);
	CHECK(strstr(err, "No user query") != NULL);
}

TEST(styles)
{
	static const char q25[] =
	    "{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a "
	    "helpful assistant.' }}<|im_start|>";
	CHECK_EQ_INT(chat_tool_style("chatml", q25, sizeof q25 - 1), CHAT_TOOLS_QWEN25);
	CHECK_EQ_INT(chat_tool_style("chatml", "<|im_start|>", 12), CHAT_TOOLS_QWEN3);
	static const char h3[] = "{{- \"You are a function calling AI model. You are provided";
	CHECK_EQ_INT(chat_tool_style("chatml", h3, sizeof h3 - 1), CHAT_TOOLS_HERMES);
	CHECK_EQ_INT(chat_tool_format(CHAT_TOOLS_HERMES), ENG_TOOLS_HERMES);
	CHECK_EQ_INT(chat_tool_style("llama3", NULL, 0), CHAT_TOOLS_LLAMA3);
	CHECK_EQ_INT(chat_tool_style("mistral-v3-tekken", NULL, 0), CHAT_TOOLS_MISTRAL);
	CHECK_EQ_INT(chat_tool_style("gemma", NULL, 0), CHAT_TOOLS_GENERIC);
	CHECK_EQ_INT(chat_tool_format(CHAT_TOOLS_QWEN3), ENG_TOOLS_HERMES);
	CHECK_EQ_INT(chat_tool_format(CHAT_TOOLS_GENERIC), ENG_TOOLS_HERMES);
	CHECK_EQ_INT(chat_tool_format(CHAT_TOOLS_LLAMA3), ENG_TOOLS_LLAMA3);
	CHECK_EQ_INT(chat_tool_format(CHAT_TOOLS_MISTRAL), ENG_TOOLS_MISTRAL);
	CHECK_EQ_INT(chat_tool_style(NULL, NULL, 0), CHAT_TOOLS_GENERIC);
	/* Qwen3.5's template: ChatML turns with XML calls and reasoning */
	static const char q35[] =
	    "<|im_start|>{{- '<tool_call>\\n<function=' + n }}<parameter=<think>";
	CHECK_EQ_STR(chat_detect(q35, sizeof q35 - 1), "qwen3.5");
	CHECK_EQ_INT(chat_tool_style("qwen3.5", q35, sizeof q35 - 1), CHAT_TOOLS_QWEN35);
	CHECK_EQ_INT(chat_tool_format(CHAT_TOOLS_QWEN35), ENG_TOOLS_XML);
	CHECK_EQ_INT(chat_tool_style("chatglm4", NULL, 0), CHAT_TOOLS_GLM4);
	CHECK_EQ_INT(chat_tool_format(CHAT_TOOLS_GLM4), ENG_TOOLS_GLM4);
}

/* A forced call opens its tag in the prompt; no tools and no tool messages is chat_render. */
TEST(open_call_and_plain)
{
	char *a = NULL, *b = NULL, err[256];
	eng_msg_t one[] = {{.role = "user", .content = "Hi"}};
	CHECK_EQ_INT(chat_render_tools("chatml", CHAT_TOOLS_QWEN3, one, 1, TOOLS, 1, NULL, &a, err,
				       sizeof err),
		     0);
	CHECK(a && strlen(a) > 12 && !strcmp(a + strlen(a) - 12, "<tool_call>\n"));
	free(a);
	CHECK_EQ_INT(chat_render_tools("chatml", CHAT_TOOLS_QWEN3, one, 1, NULL, 0, NULL, &a, err,
				       sizeof err),
		     0);
	CHECK_EQ_INT(chat_render("chatml", one, 1, 1, NULL, &b, err, sizeof err), 0);
	CHECK(a && b && !strcmp(a, b));
	free(a);
	free(b);
}

int main(void)
{
	RUN(llama3);
	RUN(qwen25);
	RUN(qwen3);
	RUN(hermes);
	RUN(mistral);
	RUN(generic);
	RUN(qwen35);
	RUN(qwen35_turns);
	RUN(glm4);
	RUN(styles);
	RUN(open_call_and_plain);
	return harness_done();
}
