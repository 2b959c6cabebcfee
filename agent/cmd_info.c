/* cmd_info.c: `shoal info`. A stub until "GGUF and tokenizers" lands. */
#include "agent/cli.h"

int cmd_info(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return cli_not_yet("info", "GGUF and tokenizers");
}
