/* cli.c: helpers shared by the subcommands (common flags, model shapes for the planner). */
#include "agent/cli.h"
#include "common/common.h"
#include "infer/infer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_parse_int(const char *s, long lo, long hi, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (!*s || *end || errno || v < lo || v > hi)
		return -1;
	*out = (int)v;
	return 0;
}

int cli_set_log_level(const char *arg)
{
	int l = log_level_parse(arg);
	if (l < 0) {
		fprintf(stderr, "shoal: bad log level '%s' (error, warn, info, debug)\n", arg);
		return 2;
	}
	log_threshold = l;
	return 0;
}

int cli_spec_opt(int c, const char *arg, struct eng_opts *eo, int *bad)
{
	switch (c) {
	case CLI_OPT_SPEC:
		*bad = strcmp(arg, "auto") && strcmp(arg, "off") && strcmp(arg, "ngram") &&
		       strcmp(arg, "model");
		eo->spec = arg;
		return 1;
	case CLI_OPT_DRAFT_MODEL: eo->draft_model = arg; return 1;
	case CLI_OPT_DRAFT_MAX: *bad = cli_parse_int(arg, 1, 16, &eo->draft_max) != 0; return 1;
	}
	return 0;
}
