/* cmd_generate.c: `shoal generate`. A stub until "Single-node inference" lands. */
#include "agent/cli.h"

int cmd_generate(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return cli_not_yet("generate", "Single-node inference");
}
