/*
 * chat.h: chat templates by family, recognised from tokenizer.chat_template the way llama.cpp
 * does it (by telltale substrings, not by running Jinja), and rendered in C. Internal to infer/.
 *
 * Families: chatml, qwen3.5, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, mistral-v1,
 * mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken, llama3, gemma, phi3, zephyr,
 * deepseek, deepseek2, deepseek3, command-r, openchat, vicuna, vicuna-orca, chatglm4, gpt-oss
 * (harmony, chat_harmony.c).
 *
 * Choice (chat_pick): an explicit name wins (an unknown name is an error listing the families);
 * else the model's template is recognised (an unrecognised one is an error that names
 * `--chat-template NAME`); a model without any template gets chatml, as llama.cpp does, since
 * that is what most instruction-tuned models without metadata were trained on.
 *
 * The rendered text contains the family's special tokens written out ("<|im_start|>"); it must be
 * tokenized with special-token parsing on, and with BOS added as the model wants (the templates
 * here never write BOS at the start).
 *
 * Pure functions; any thread.
 */
#ifndef SHOAL_CHAT_H
#define SHOAL_CHAT_H

#include "infer/infer.h"

#include <stddef.h>

/* 1 when name is a family above. */
int chat_family_known(const char *name);
/* "chatml, llama2, ..." (static). */
const char *chat_family_names(void);
/* Family recognised in a template's text, or NULL. */
const char *chat_detect(const char *tmpl, size_t len);
/* Picks the family (see above): override may be NULL; tmpl may be NULL (no template in the
 * model). *family is a static string. Returns 0 or SH_EINVAL / SH_EUNSUPP with a message. */
int chat_pick(const char *override, const char *tmpl, size_t len, const char **family, char *err,
	      size_t errlen);
/* Renders msgs (roles "system", "user", "assistant"; anything else is SH_EINVAL naming it),
 * then the assistant prompt when add_assistant. eos: the model's end-of-sequence text, used by
 * families that write it (zephyr); NULL means "</s>". *out is malloc'd, NUL-terminated, the
 * caller frees it. */
int chat_render(const char *family, const eng_msg_t *msgs, int n_msgs, int add_assistant,
		const char *eos, char **out, char *err, size_t errlen);

/* The qwen3.5 family (chat_qwen35.c): msgs may carry tool calls and role "tool"; tools_json
 * NULL or OpenAI's tools array; add: the assistant prompt (with "<think>\n"). */
int chat_render_qwen35(const eng_msg_t *m, int n, const char *tools_json, int add, char **out,
		       char *err, size_t errlen);

/* ---- tools (chat_tools.c) ---- */

/* How tools are rendered into the prompt. */
typedef enum chat_tool_style {
	CHAT_TOOLS_FAMILY = 0, /* the family's own: chat_tool_style(family, NULL, 0) */
	CHAT_TOOLS_GENERIC,    /* every other family: the <tool_call> text folded into its turns */
	CHAT_TOOLS_LLAMA3,     /* Llama 3.1/3.2 JSON calls */
	CHAT_TOOLS_QWEN25,     /* Qwen 2.5 (<tool_call> tags) */
	CHAT_TOOLS_QWEN3,      /* Qwen 3 (<tool_call> tags) */
	CHAT_TOOLS_HERMES,     /* Hermes 2 Pro / 3 tool_use (<tool_call> tags) */
	CHAT_TOOLS_MISTRAL,    /* Mistral Nemo's [AVAILABLE_TOOLS] / [TOOL_CALLS] */
	CHAT_TOOLS_QWEN35,     /* Qwen3.5: XML calls <tool_call><function=...><parameter=...> */
	CHAT_TOOLS_HARMONY, /* gpt-oss: tools as a TypeScript namespace, calls to=functions.NAME */
	CHAT_TOOLS_GLM4,    /* GLM-4.5/4.6: <tool_call>NAME then <arg_key>/<arg_value> pairs,
			       results after <|observation|> */
} chat_tool_style_t;

/* The style for a family and the model's template text (tmpl may be NULL). */
chat_tool_style_t chat_tool_style(const char *family, const char *tmpl, size_t len);
/* How calls look in the model's output for a style (enum eng_tool_format). */
enum eng_tool_format chat_tool_format(chat_tool_style_t style);
/* As chat_render (always with the assistant prompt), with tools: tools_json is the request's
 * "tools" array as JSON text or NULL; messages may carry tool_calls and role "tool".
 * open_call: the reply must be a call, so a style whose calls open with a tag gets that tag at
 * the end of the prompt. Without tools and tool messages this is chat_render. */
int chat_render_tools(const char *family, chat_tool_style_t style, const eng_msg_t *msgs,
		      int n_msgs, const char *tools_json, int open_call, const char *eos,
		      char **out, char *err, size_t errlen);

/* gpt-oss's template (chat_harmony.c; the family "gpt-oss"): msgs may carry tool calls, role
 * "tool" and reasoning; tools_json NULL or OpenAI's tools array; add: "<|start|>assistant" for
 * the reply. The reply's channels are read back by eng_harmony_parse (infer.h). */
int chat_render_harmony(const eng_msg_t *msgs, int n_msgs, const char *tools_json, int add,
			char **out, char *err, size_t errlen);

#endif
