/*
 * util.c: error messages, clocks and file helpers shared by every module.
 */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *sh_strerror(int err)
{
	switch (err) {
	case SH_OK: return "ok";
	case SH_EINVAL: return "invalid argument";
	case SH_ENOMEM: return "out of memory";
	case SH_EIO: return "input/output error";
	case SH_EFORMAT: return "bad format";
	case SH_EUNSUPP: return "not supported";
	case SH_ETIMEDOUT: return "timed out";
	case SH_EAUTH: return "authentication failed";
	case SH_ECLOSED: return "connection closed";
	case SH_ENOFIT: return "does not fit";
	case SH_ENOENT: return "not found";
	case SH_EBUSY: return "busy";
	case SH_ECANCELED: return "canceled";
	}
	return "unknown error";
}

int sh_fail(char *errbuf, size_t errlen, int err, const char *fmt, ...)
{
	if (errbuf && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(errbuf, errlen, fmt, ap);
		va_end(ap);
	}
	return err;
}

int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t now_ms(void)
{
	return now_ns() / 1000000;
}

int write_file_atomic(const char *path, const void *data, size_t len, char *errbuf, size_t errlen)
{
	char tmp[SH_SUBPATH_MAX];
	if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
		return sh_fail(errbuf, errlen, SH_EINVAL, "path too long: %s", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return sh_fail(errbuf, errlen, SH_EIO, "%s: %s", tmp, strerror(errno));
	const char *p = data;
	size_t left = len;
	while (left) {
		ssize_t w = write(fd, p, left);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			goto err;
		p += w;
		left -= (size_t)w;
	}
	if (fsync(fd) != 0)
		goto err;
	close(fd);
	if (rename(tmp, path) != 0) {
		int e = errno;
		unlink(tmp);
		return sh_fail(errbuf, errlen, SH_EIO, "rename %s: %s", path, strerror(e));
	}
	return 0;
err:;
	int e = errno;
	close(fd);
	unlink(tmp);
	return sh_fail(errbuf, errlen, SH_EIO, "write %s: %s", tmp, strerror(e));
}

int read_file_all(const char *path, char **out, size_t *outlen, char *errbuf, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return sh_fail(errbuf, errlen, errno == ENOENT ? SH_ENOENT : SH_EIO, "%s: %s", path,
			       strerror(errno));
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	while (buf) {
		size_t n = fread(buf + len, 1, cap - len - 1, f);
		len += n;
		if (len + 1 < cap)
			break;
		char *nb = realloc(buf, cap * 2);
		if (!nb) {
			free(buf);
			buf = NULL;
			break;
		}
		buf = nb;
		cap *= 2;
	}
	int bad = ferror(f);
	fclose(f);
	if (!buf)
		return sh_fail(errbuf, errlen, SH_ENOMEM, "%s: out of memory", path);
	if (bad) {
		free(buf);
		return sh_fail(errbuf, errlen, SH_EIO, "%s: read error", path);
	}
	buf[len] = 0;
	*out = buf;
	if (outlen)
		*outlen = len;
	return 0;
}

int mkdir_p(const char *path, char *errbuf, size_t errlen)
{
	char tmp[SH_PATH_MAX];
	if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
		return sh_fail(errbuf, errlen, SH_EINVAL, "path too long: %s", path);
	for (char *p = tmp + 1;; p++) {
		if (*p == '/' || *p == 0) {
			char c = *p;
			*p = 0;
			if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
				return sh_fail(errbuf, errlen, SH_EIO, "mkdir %s: %s", tmp,
					       strerror(errno));
			*p = c;
			if (!c)
				break;
		}
	}
	return 0;
}

uint64_t sh_fnv1a64(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

void sh_split_units(int *out, int n, int units, int min_each, const uint64_t *w)
{
	unsigned __int128 total = 0, rem[SH_SPLIT_MAX];
	for (int i = 0; i < n; i++)
		total += w[i] ? w[i] : 1;
	int given = 0;
	for (int i = 0; i < n; i++) {
		unsigned __int128 q = (unsigned __int128)(unsigned)units * (w[i] ? w[i] : 1);
		out[i] = (int)(q / total);
		rem[i] = q % total;
		given += out[i];
	}
	/* Largest remainder; equal remainders go to the lower index. At most n - 1 left over. */
	for (; given < units; given++) {
		int best = 0;
		for (int i = 1; i < n; i++)
			if (rem[i] > rem[best])
				best = i;
		out[best]++;
		rem[best] = 0;
	}
	/* Minimums: a share below takes a unit from the share holding the most (ties: the higher
	 * index), which stays at or above the minimum because units >= n * min_each. */
	for (int i = 0; i < n; i++)
		while (out[i] < min_each) {
			int top = 0;
			for (int j = 1; j < n; j++)
				if (out[j] >= out[top])
					top = j;
			out[top]--;
			out[i]++;
		}
}

void sh_hex_encode(char *out, const uint8_t *p, size_t n)
{
	static const char hx[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = hx[p[i] >> 4];
		out[2 * i + 1] = hx[p[i] & 15];
	}
	out[2 * n] = 0;
}

static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int sh_hex_decode(uint8_t *out, size_t n, const char *hex)
{
	if (!hex || strlen(hex) != 2 * n)
		return SH_EFORMAT;
	for (size_t i = 0; i < n; i++) {
		int h = hex_digit(hex[2 * i]), l = hex_digit(hex[2 * i + 1]);
		if (h < 0 || l < 0)
			return SH_EFORMAT;
		out[i] = (uint8_t)(h << 4 | l);
	}
	return 0;
}

int sh_size_parse(const char *s, uint64_t total, uint64_t *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (end == s || errno || v < 0)
		return SH_EINVAL;
	if (!strcmp(end, "%")) {
		if (v <= 0 || v > 100)
			return SH_EINVAL;
		*out = (uint64_t)((double)total * v / 100);
		return 0;
	}
	static const char units[] = "KMGT";
	const char *u = *end ? strchr(units, *end) : NULL;
	if (*end && (!u || (end[1] && strcmp(end + 1, "B") && strcmp(end + 1, "iB"))))
		return SH_EINVAL;
	for (const char *k = units; u && k <= u; k++)
		v *= 1024;
	if (v < 1 || v > 1e18)
		return SH_EINVAL;
	*out = (uint64_t)v;
	return 0;
}

int sh_cpu_jiffies(unsigned long long *busy, unsigned long long *total)
{
	unsigned long long v[8] = {0};
	FILE *f = fopen("/proc/stat", "r");
	int n = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
			   &v[3], &v[4], &v[5], &v[6], &v[7])
		  : 0;
	if (f)
		fclose(f);
	if (n < 5)
		return -1;
	*total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
	*busy = *total - v[3] - v[4]; /* less idle and iowait */
	return 0;
}
