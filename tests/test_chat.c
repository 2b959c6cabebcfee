/* test_chat.c: chat template recognition and the exact text rendered per family. */
#include "harness.h"

#include "common/common.h"
#include "infer/chat.h"
#include "infer/gguf.h"

static const eng_msg_t conv[] = {
    {.role = "system", .content = "You are helpful."},
    {.role = "user", .content = "Hi"},
    {.role = "assistant", .content = "Hello!"},
    {.role = "user", .content = "Name a fruit."},
};

static void expect(const char *family, const char *want)
{
	char *out, err[256];
	int rc = chat_render(family, conv, 4, 1, NULL, &out, err, sizeof err);
	CHECK_EQ_INT(rc, 0);
	if (rc)
		return;
	if (strcmp(out, want))
		fprintf(stderr, "family %s\n", family);
	CHECK_EQ_STR(out, want);
	free(out);
}

TEST(render_families)
{
	expect(
	    "chatml",
	    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
	    "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nName a fruit.<|im_end|>\n"
	    "<|im_start|>assistant\n");
	expect("llama2",
	       "[INST] You are helpful.\nHi [/INST]Hello!</s>[INST] Name a fruit. [/INST]");
	expect("llama2-sys", "[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHi [/INST]Hello!</s>"
			     "[INST] Name a fruit. [/INST]");
	expect("llama2-sys-bos",
	       "[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHi [/INST]Hello!</s>"
	       "<s>[INST] Name a fruit. [/INST]");
	expect("mistral-v1",
	       " [INST] You are helpful.\n\nHi [/INST] Hello!</s> [INST] Name a fruit. [/INST]");
	expect("mistral-v3",
	       "[INST] You are helpful.\n\nHi[/INST] Hello!</s>[INST] Name a fruit.[/INST]");
	expect("mistral-v3-tekken",
	       "[INST]You are helpful.\n\nHi[/INST]Hello!</s>[INST]Name a fruit.[/INST]");
	expect("mistral-v7",
	       "[SYSTEM_PROMPT] You are helpful.[/SYSTEM_PROMPT][INST] Hi[/INST] Hello!</s>"
	       "[INST] Name a fruit.[/INST]");
	expect("llama3", "<|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
			 "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
			 "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
			 "<|start_header_id|>user<|end_header_id|>\n\nName a fruit.<|eot_id|>"
			 "<|start_header_id|>assistant<|end_header_id|>\n\n");
	expect("gemma", "<start_of_turn>user\nYou are helpful.\n\nHi<end_of_turn>\n"
			"<start_of_turn>model\nHello!<end_of_turn>\n"
			"<start_of_turn>user\nName a fruit.<end_of_turn>\n<start_of_turn>model\n");
	expect("phi3", "<|system|>\nYou are "
		       "helpful.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
		       "<|user|>\nName a fruit.<|end|>\n<|assistant|>\n");
	expect("zephyr",
	       "<|system|>\nYou are helpful.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n"
	       "<|user|>\nName a fruit.</s>\n<|assistant|>\n");
	expect("deepseek", "You are helpful.### Instruction:\nHi\n### Response:\nHello!\n<|EOT|>\n"
			   "### Instruction:\nName a fruit.\n### Response:\n");
	expect(
	    "vicuna",
	    "You are helpful.\n\nUSER: Hi\nASSISTANT: Hello!</s>\nUSER: Name a fruit.\nASSISTANT:");
	expect("command-r",
	       "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are helpful.<|END_OF_TURN_TOKEN|>"
	       "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|>"
	       "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hello!<|END_OF_TURN_TOKEN|>"
	       "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Name a fruit.<|END_OF_TURN_TOKEN|>"
	       "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
	/* as Python's jinja2 renders llama.cpp's models/templates/GLM-4.6.jinja (trim_blocks,
	 * lstrip_blocks) */
	expect("chatglm4", "[gMASK]<sop><|system|>\nYou are helpful.<|user|>\nHi<|assistant|>\n"
			   "<think></think>\nHello!<|user|>\nName a fruit.<|assistant|>");
}

/* GLM's reasoning: kept after the last user turn, dropped before it (GLM-4.6.jinja). */
TEST(glm4_reasoning)
{
	static const eng_msg_t m[] = {
	    {.role = "system", .content = "Be brief."},
	    {.role = "user", .content = "Hi"},
	    {.role = "assistant", .content = "<think>greet</think>\n\nHello!"},
	    {.role = "user", .content = "Again"},
	    {.role = "assistant", .content = "<think>\nagain\n</think>Hi again "},
	};
	char *out = NULL, err[256];
	CHECK_EQ_INT(chat_render("chatglm4", m, 5, 1, NULL, &out, err, sizeof err), 0);
	CHECK_EQ_STR(out,
		     "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHi<|assistant|>\n"
		     "<think></think>\nHello!<|user|>\nAgain<|assistant|>\n<think>again</think>\n"
		     "Hi again<|assistant|>");
	free(out);
}

TEST(detect)
{
	struct {
		const char *tmpl, *family;
	} cases[] = {
	    {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
	     "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}",
	     "chatml"},
	    {"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ "
	     "'[INST] ' + message['content'] + ' [/INST]' }}{% endif %}{% endfor %}",
	     "llama2"},
	    {"{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + "
	     "messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}{% endif %}[INST]",
	     "llama2-sys"},
	    {"{% set content = '<|start_header_id|>' + message['role'] + "
	     "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}",
	     "llama3"},
	    {"{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
	     "'<end_of_turn>\\n' }}",
	     "gemma"},
	    {"{{'<|' + message['role'] + '|>' + '\\n' + message['content'] + '<|end|>\\n' }}"
	     "{{ '<|assistant|>\\n' }}",
	     "phi3"},
	    {"{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + eos_token "
	     "}}"
	     "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\\n'  + message['content'] "
	     "+ eos_token }}{% endif %}",
	     "zephyr"},
	    {"{{ '### Instruction:\\n' + message['content'] + '\\n' }}{{ '### Response:\\n' + "
	     "message['content'] + '\\n<|EOT|>\\n' }}",
	     "deepseek"},
	    /* GLM-4.5/4.6 (models/templates/GLM-4.6.jinja) also has <|user|> and <|assistant|>:
	     * [gMASK]<sop> decides before zephyr, as in llama.cpp's llm_chat_detect_template */
	    {"[gMASK]<sop>\n{%- if tools -%}<|system|>{%- if m.role == 'user' -%}<|user|>\n"
	     "{{ visible_text(m.content) }}{%- elif m.role == 'assistant' -%}\n<|assistant|>",
	     "chatglm4"},
	};
	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		const char *f = chat_detect(cases[i].tmpl, strlen(cases[i].tmpl));
		CHECK(f != NULL);
		if (f && strcmp(f, cases[i].family))
			fprintf(stderr, "case %zu: %s\n", i, f);
		if (f)
			CHECK_EQ_STR(f, cases[i].family);
	}
	CHECK(chat_detect("{{ message.content }}", 21) == NULL);
}

TEST(pick_and_errors)
{
	const char *f;
	char err[512];
	CHECK_EQ_INT(chat_pick(NULL, NULL, 0, &f, err, sizeof err), 0);
	CHECK_EQ_STR(f, "chatml");
	CHECK_EQ_INT(chat_pick("llama3", "{{ junk }}", 10, &f, err, sizeof err), 0);
	CHECK_EQ_STR(f, "llama3");
	CHECK_EQ_INT(chat_pick("nope", NULL, 0, &f, err, sizeof err), SH_EINVAL);
	CHECK(strstr(err, "nope") != NULL);
	CHECK_EQ_INT(chat_pick(NULL, "{{ junk }}", 10, &f, err, sizeof err), SH_EUNSUPP);
	CHECK(strstr(err, "--chat-template NAME") != NULL);
	eng_msg_t bad[] = {{.role = "robot", .content = "x"}};
	char *out;
	CHECK_EQ_INT(chat_render("chatml", bad, 1, 1, NULL, &out, err, sizeof err), SH_EINVAL);
	CHECK(strstr(err, "robot") != NULL);
	/* zephyr writes the model's EOS text */
	eng_msg_t one[] = {{.role = "user", .content = "Hi"}};
	CHECK_EQ_INT(chat_render("zephyr", one, 1, 1, "<|endoftext|>", &out, err, sizeof err), 0);
	CHECK_EQ_STR(out, "<|user|>\nHi<|endoftext|>\n<|assistant|>\n");
	free(out);
}

TEST(phi3_vocab_template)
{
	char path[512], err[256];
	gguf_t *g;
	snprintf(path, sizeof path, "%s/vocab/ggml-vocab-phi-3.gguf", harness_shared());
	if (gguf_open(&g, path, err, sizeof err))
		SKIP("phi-3 vocabulary not available");
	const char *s;
	size_t n;
	CHECK_EQ_INT(gguf_get_str(g, "tokenizer.chat_template", &s, &n), 0);
	const char *f = NULL;
	CHECK_EQ_INT(chat_pick(NULL, s, n, &f, err, sizeof err), 0);
	CHECK(f && !strcmp(f, "phi3"));
	gguf_free(g);
}

int main(void)
{
	RUN(render_families);
	RUN(glm4_reasoning);
	RUN(detect);
	RUN(pick_and_errors);
	RUN(phi3_vocab_template);
	return harness_done();
}
