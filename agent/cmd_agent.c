/* cmd_agent.c: `shoal agent`. A stub until "Discovery and election" lands. */
#include "agent/cli.h"

int cmd_agent(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return cli_not_yet("agent", "Discovery and election");
}
