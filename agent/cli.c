/* cli.c: helpers shared by the subcommands (stubs, common flags). */
#include "agent/cli.h"
#include "common/common.h"

#include <stdio.h>

int cli_not_yet(const char *name, const char *issue)
{
	fprintf(stderr, "shoal %s: not built yet (arrives with \"%s\")\n", name, issue);
	return 1;
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
