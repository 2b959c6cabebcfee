/* cmd_status.c: `shoal status`. A stub until "Discovery and election" lands. */
#include "agent/cli.h"

int cmd_status(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return cli_not_yet("status", "Discovery and election");
}
