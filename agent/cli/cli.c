/* cli.c: helpers shared by the subcommands (common flags, one strict number parser). */
#include "agent/cli/cli.h"
#include "common/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

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
