/*
 * log.c: one-line, timestamped log records on stderr. The threshold check happens in the LOG
 * macro, so arguments are not even formatted for suppressed levels.
 */
#include "common.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

int log_threshold = LOG_INFO;

static const char *level_names[] = {"error", "warn", "info", "debug"};

void log_write(int level, const char *fmt, ...)
{
	char line[2048];
	struct timeval tv;
	struct tm tm;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03d %-5s ", tm.tm_hour, tm.tm_min,
			 tm.tm_sec, (int)(tv.tv_usec / 1000),
			 level_names[level < 0 ? 0 : level > 3 ? 3 : level]);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = strlen(line);
	line[len++] = '\n';
	fwrite(line, 1, len, stderr); /* one call: lines from threads do not interleave */
}

int log_level_parse(const char *s)
{
	if (!s)
		return -1;
	for (int i = 0; i < 4; i++)
		if (!strcasecmp(s, level_names[i]))
			return i;
	if (!strcasecmp(s, "warning"))
		return LOG_WARN;
	if (s[0] >= '0' && s[0] <= '3' && s[1] == 0)
		return s[0] - '0';
	return -1;
}

void log_init_from_env(void)
{
	int l = log_level_parse(getenv("SHOAL_LOG"));
	if (l >= 0)
		log_threshold = l;
}
