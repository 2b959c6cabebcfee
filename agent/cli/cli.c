/* cli.c: helpers shared by the subcommands (common flags, one strict number parser). */
#include "agent/cli/cli.h"
#include "common/common.h"
#include "infer/infer.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	uint64_t v = 0;
	if (!s || !*s)
		return -1;
	for (const char *p = s; *p; p++) {
		unsigned d = (unsigned)(*p - '0');
		if (d > 9 || v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	if (v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

int cli_parse_int(const char *s, long lo, long hi, int *out)
{
	uint64_t v;
	if (lo < 0 || hi > INT_MAX || cli_parse_u64(s, (uint64_t)lo, (uint64_t)hi, &v))
		return -1;
	*out = (int)v;
	return 0;
}

int cli_parse_num(const char *s, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double v = s && *s && !isspace((unsigned char)*s) ? strtod(s, &end) : NAN;
	if (isnan(v) || *end || errno || !(v >= lo && v <= hi))
		return -1;
	*out = v;
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
