/* cli.c: helpers shared by the subcommands (common flags, model shapes for the planner). */
#include "agent/cli.h"
#include "common/common.h"

#include <stdio.h>

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
