/* cmd_tokenize.c: `shoal tokenize`. A stub until "GGUF and tokenizers" lands. */
#include "agent/cli.h"

int cmd_tokenize(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return cli_not_yet("tokenize", "GGUF and tokenizers");
}
