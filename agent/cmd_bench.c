/* cmd_bench.c: `shoal bench`. A stub until "Single-node inference" lands. */
#include "agent/cli.h"

int cmd_bench(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return cli_not_yet("bench", "Single-node inference");
}
