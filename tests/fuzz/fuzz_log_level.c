/* fuzz_log_level.c: the log-level parser never crashes on any bytes (also proves the fuzz build). */
#include "common/common.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);
	if (!s)
		return 0;
	memcpy(s, data, size);
	s[size] = 0;
	(void)log_level_parse(s);
	free(s);
	return 0;
}
