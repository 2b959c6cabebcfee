/* cmd_mkmodel.c: `shoal mkmodel`. A stub until "Single-node inference" lands. */
#include "agent/cli.h"

int cmd_mkmodel(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return cli_not_yet("mkmodel", "Single-node inference");
}
