/*
 * main.c: the shoal binary's entry point. It only dispatches to a subcommand; every subcommand
 * lives in agent/cli/cmd_NAME.c so modules grow without touching this table.
 */
#include "agent/cli/cli.h"
#include "common/common.h"

#include <stdio.h>
#include <string.h>

static const struct command {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *help;
} commands[] = {
	{"agent", cmd_agent, "join (or form) a cluster on the local network and serve the model"},
	{"status", cmd_status, "show the local agent's members, leader and plan"},
	{"serve", cmd_serve, "serve the OpenAI-compatible API from this machine alone"},
	{"generate", cmd_generate, "generate text from a prompt on this machine"},
	{"worker", cmd_worker, "run one rank of a manually started group (like mlx.launch)"},
	{"plan", cmd_plan, "compute rank order, hostfiles, RDMA matrix and shards from a view"},
	{"info", cmd_info, "describe a GGUF model file"},
	{"tokenize", cmd_tokenize, "turn text into token ids (or back, with --decode)"},
	{"mkmodel", cmd_mkmodel, "write a GGUF model with seeded random weights"},
	{"bench", cmd_bench, "print speed figures for a model"},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: shoal COMMAND [OPTIONS]\n"
		   "       shoal --help | --version\n\n"
		   "Runs a language model across the machines of a local network.\n"
		   "Every machine runs: shoal agent --token SECRET --model model.gguf\n\n"
		   "commands:\n");
	for (size_t i = 0; i < ARRAY_LEN(commands); i++)
		fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
	fprintf(f, "\n'shoal COMMAND --help' describes a command's options.\n"
		   "The log level comes from --log-level or SHOAL_LOG (error, warn, info, debug).\n");
}

int main(int argc, char **argv)
{
	log_init_from_env();
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
		printf("shoal %s\n", SHOAL_VERSION);
		return 0;
	}
	for (size_t i = 0; i < ARRAY_LEN(commands); i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].run(argc - 1, argv + 1);
	fprintf(stderr, "shoal: unknown command '%s'\n\n", argv[1]);
	usage(stderr);
	return 2;
}
