/* cmd_plan.c: `shoal plan`. A stub until "Planner" lands. */
#include "agent/cli.h"

int cmd_plan(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return cli_not_yet("plan", "Planner");
}
