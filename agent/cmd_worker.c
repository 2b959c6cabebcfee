/* cmd_worker.c: `shoal worker`. A stub until "Transport and tensor parallel" lands. */
#include "agent/cli.h"

int cmd_worker(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return cli_not_yet("worker", "Transport and tensor parallel");
}
