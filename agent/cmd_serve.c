/* cmd_serve.c: `shoal serve`. A stub until "API and dashboard" lands. */
#include "agent/cli.h"

int cmd_serve(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return cli_not_yet("serve", "API and dashboard");
}
