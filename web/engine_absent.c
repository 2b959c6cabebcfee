/*
 * engine_absent.c: weak stand-ins for infer/infer.h so web/ links while the engine is still being
 * written on its own branch. Each one reports that no engine is built; the real definitions
 * (strong symbols in infer/) replace them at link time. Delete this file once infer/ has landed.
 */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "infer/infer.h"

#define WEAK __attribute__((weak))

WEAK void eng_sampling_default(eng_sampling_t *s)
{
	memset(s, 0, sizeof *s);
	s->top_p = 1.0f;
	s->repeat_penalty = 1.0f;
}

WEAK int eng_open(eng_t **out, const eng_opts_t *opts, char *err, size_t errlen)
{
	(void)opts;
	*out = NULL;
	return sh_fail(err, errlen, SH_EUNSUPP, "this build has no inference engine yet");
}

WEAK void eng_free(eng_t *e) { (void)e; }

WEAK const eng_info_t *eng_info(const eng_t *e)
{
	static const eng_info_t none = {.name = "none", .arch = "none", .bos = -1, .eos = -1};
	(void)e;
	return &none;
}

WEAK int eng_tokenize(const eng_t *e, const char *text, int add_bos, int special, int **ids,
		      int *n_ids, char *err, size_t errlen)
{
	(void)e, (void)text, (void)add_bos, (void)special, (void)ids, (void)n_ids;
	return sh_fail(err, errlen, SH_EUNSUPP, "no inference engine");
}

WEAK int eng_detokenize(const eng_t *e, const int *ids, int n_ids, char **text)
{
	(void)e, (void)ids, (void)n_ids;
	*text = NULL;
	return SH_EUNSUPP;
}

WEAK int eng_chat_prompt(const eng_t *e, const eng_msg_t *msgs, int n_msgs, int **ids, int *n_ids,
			 char *err, size_t errlen)
{
	(void)e, (void)msgs, (void)n_msgs, (void)ids, (void)n_ids;
	return sh_fail(err, errlen, SH_EUNSUPP, "no inference engine");
}

WEAK int eng_generate(eng_t *e, const int *prompt, int n_prompt, const eng_sampling_t *s,
		      eng_token_cb cb, void *ud, eng_result_t *res)
{
	(void)e, (void)prompt, (void)n_prompt, (void)s, (void)cb, (void)ud;
	memset(res, 0, sizeof *res);
	res->finish = ENG_FINISH_ERROR;
	snprintf(res->error, sizeof res->error, "no inference engine");
	return SH_EUNSUPP;
}
