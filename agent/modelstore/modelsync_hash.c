/*
 * modelsync_hash.c: a model file's content hash (BLAKE2b-256 of every byte) and its cache in
 * STATE_DIR/model-hashes, the hex form of hashes, and where a fetched model lives (modelsync.h).
 *
 * Invariant: a cache line is trusted only for the same absolute path, size and mtime; the checks
 * that must see the content (modelsync_verify_file, modelsync_cached) read every byte anyway.
 */
#define _GNU_SOURCE
#include "agent/modelstore/modelsync_int.h"
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HASH_BUF          (8u << 20)     /* read size while hashing */
#define HASH_LOG_MIN      (256ull << 20) /* files above this log hashing progress */
#define CACHE_MAX_ENTRIES 64

int modelsync_is_msg(uint16_t type)
{
	return type >= MS_MSG_FIRST && type <= MS_MSG_LAST;
}

char *modelsync_hex(char out[MS_HASH_HEX], const uint8_t hash[MS_HASH_BYTES])
{
	sh_hex_encode(out, hash, MS_HASH_BYTES);
	return out;
}

int modelsync_unhex(uint8_t out[MS_HASH_BYTES], const char *hex)
{
	return sh_hex_decode(out, MS_HASH_BYTES, hex) ? SH_EINVAL : 0;
}

/* ---- hash cache: STATE_DIR/model-hashes, lines "HEX SIZE MTIME_NS PATH" ------------------- */

static int cache_path(const char *state_dir, char *out, size_t len)
{
	int n = snprintf(out, len, "%s/model-hashes", state_dir);
	return n > 0 && (size_t)n < len ? 0 : SH_EINVAL;
}

/* One cache line: the hash's hex, size, mtime and path (a pointer into line). 0, or -1 when
 * the line does not parse. */
static int cache_line(const char *line, char hex[MS_HASH_HEX], unsigned long long *size,
		      long long *mtime, const char **path)
{
	int off = 0;
	if (sscanf(line, "%64s %llu %lld %n", hex, size, mtime, &off) != 3 || !off)
		return -1;
	*path = line + off;
	return 0;
}

/* The next line of a NUL-terminated buffer, cut in place; NULL at the end. */
static char *next_line(char **cursor)
{
	char *line = *cursor, *nl;
	if (!line || !*line)
		return NULL;
	nl = strchr(line, '\n');
	if (nl)
		*nl++ = 0;
	*cursor = nl;
	return line;
}

static int cache_lookup(const char *state_dir, const char *abs, uint64_t size, int64_t mtime,
			uint8_t out[MS_HASH_BYTES])
{
	char cp[SH_SUBPATH_MAX], *buf = NULL, *cur, *line, hex[MS_HASH_HEX];
	size_t blen;
	unsigned long long sz;
	long long mt;
	const char *path;
	if (cache_path(state_dir, cp, sizeof cp) || read_file_all(cp, &buf, &blen, NULL, 0))
		return 0;
	int found = 0;
	for (cur = buf; (line = next_line(&cur));)
		if (!cache_line(line, hex, &sz, &mt, &path) && sz == size && mt == mtime &&
		    !strcmp(path, abs) && modelsync_unhex(out, hex) == 0)
			found = 1;
	free(buf);
	return found;
}

/* Adds (or replaces) the entry for abs; keeps the newest CACHE_MAX_ENTRIES lines. Best
 * effort. */
void ms_cache_store(const char *state_dir, const char *abs, uint64_t size, int64_t mtime,
		    const uint8_t hash[MS_HASH_BYTES])
{
	char cp[SH_SUBPATH_MAX], *old = NULL;
	size_t olen = 0;
	if (cache_path(state_dir, cp, sizeof cp) || mkdir_p(state_dir, NULL, 0))
		return;
	if (read_file_all(cp, &old, &olen, NULL, 0))
		old = NULL;
	/* Lines other than abs's, newest last; then ours. */
	const char *lines[CACHE_MAX_ENTRIES], *path;
	char *cur = old, *line, hex[MS_HASH_HEX];
	unsigned long long sz;
	long long mt;
	int n = 0;
	while ((line = next_line(&cur))) {
		if (cache_line(line, hex, &sz, &mt, &path) || !strcmp(path, abs))
			continue;
		if (n == CACHE_MAX_ENTRIES - 1) {
			memmove(lines, lines + 1, (size_t)(n - 1) * sizeof lines[0]);
			n--;
		}
		lines[n++] = line;
	}
	size_t cap = olen + strlen(abs) + 128, len = 0;
	char *out = malloc(cap);
	if (out) {
		for (int i = 0; i < n; i++)
			len += (size_t)snprintf(out + len, cap - len, "%s\n", lines[i]);
		char hex[MS_HASH_HEX];
		len += (size_t)snprintf(out + len, cap - len, "%s %llu %lld %s\n",
					modelsync_hex(hex, hash), (unsigned long long)size,
					(long long)mtime, abs);
		write_file_atomic(cp, out, len, NULL, 0);
	}
	free(out);
	free(old);
}

/* ---- hashing
 * ------------------------------------------------------------------------------ */

/* Feeds bytes [0, len) of fd into st. cancel (may be NULL) set: SH_ECANCELED. */
int ms_hash_fd(int fd, uint64_t len, crypto_generichash_state *st, const char *what,
	       const atomic_int *cancel, char *err, size_t errlen)
{
	uint8_t *buf = malloc(HASH_BUF);
	if (!buf)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory hashing %s", what);
	uint64_t done = 0;
	int64_t t0 = now_ms(), last = t0;
	int rc = 0;
	while (done < len) {
		if (cancel && atomic_load(cancel)) {
			rc = sh_fail(err, errlen, SH_ECANCELED, "hashing %s: canceled", what);
			break;
		}
		size_t want = (size_t)MIN((uint64_t)HASH_BUF, len - done);
		ssize_t r = pread(fd, buf, want, (off_t)done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rc = sh_fail(err, errlen, SH_EIO, "reading %s: %s", what,
				     r < 0 ? strerror(errno) : "file shrank");
			break;
		}
		crypto_generichash_update(st, buf, (size_t)r);
		done += (uint64_t)r;
		int64_t now = now_ms();
		if (len >= HASH_LOG_MIN && (now - last >= PROGRESS_LOG_MS || done == len)) {
			double s = (double)(now - t0) / 1000.0;
			LOG(LOG_INFO, "hashing %s: %.0f%% (%.0f MB/s)", what,
			    100.0 * (double)done / (double)len,
			    s > 0 ? (double)done / 1e6 / s : 0.0);
			last = now;
		}
	}
	free(buf);
	return rc;
}

/* modelsync_hash_file and modelsync_verify_file: use_cache 0 reads every byte and only
 * updates the cache. */
static int hash_file(const char *path, const char *state_dir, int use_cache,
		     const atomic_int *cancel, uint8_t out[MS_HASH_BYTES], char *err, size_t errlen)
{
	if (sodium_init() < 0)
		return sh_fail(err, errlen, SH_EIO, "libsodium failed to initialize");
	char abs[PATH_MAX];
	if (!realpath(path, abs))
		return sh_fail(err, errlen, errno == ENOENT ? SH_ENOENT : SH_EIO, "%s: %s", path,
			       strerror(errno));
	int fd = open(abs, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return sh_fail(err, errlen, errno == ENOENT ? SH_ENOENT : SH_EIO, "%s: %s", path,
			       strerror(errno));
	struct stat sb;
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		close(fd);
		return sh_fail(err, errlen, SH_EIO, "%s: not a regular file", path);
	}
	int64_t mtime = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
	uint64_t size = (uint64_t)sb.st_size;
	if (state_dir && use_cache && cache_lookup(state_dir, abs, size, mtime, out)) {
		close(fd);
		return 0;
	}
	crypto_generichash_state st;
	crypto_generichash_init(&st, NULL, 0, MS_HASH_BYTES);
	int rc = ms_hash_fd(fd, size, &st, path, cancel, err, errlen);
	close(fd);
	if (rc)
		return rc;
	crypto_generichash_final(&st, out, MS_HASH_BYTES);
	if (state_dir)
		ms_cache_store(state_dir, abs, size, mtime, out);
	return 0;
}

int modelsync_hash_file(const char *path, const char *state_dir, uint8_t out[MS_HASH_BYTES],
			char *err, size_t errlen)
{
	return hash_file(path, state_dir, 1, NULL, out, err, errlen);
}

int modelsync_verify_file(const char *path, const char *state_dir, const atomic_int *cancel,
			  uint8_t out[MS_HASH_BYTES], char *err, size_t errlen)
{
	return hash_file(path, state_dir, 0, cancel, out, err, errlen);
}

int modelsync_model_path(const char *state_dir, const uint8_t hash[MS_HASH_BYTES], char *path_out,
			 size_t path_len)
{
	char hex[MS_HASH_HEX];
	int n =
	    snprintf(path_out, path_len, "%s/models/%s.gguf", state_dir, modelsync_hex(hex, hash));
	return n > 0 && (size_t)n < path_len ? 0 : SH_EINVAL;
}

int modelsync_cached(const char *state_dir, const uint8_t hash[MS_HASH_BYTES], char *path_out,
		     size_t path_len)
{
	char p[SH_SUBPATH_MAX], err[256];
	uint8_t got[MS_HASH_BYTES];
	if (modelsync_model_path(state_dir, hash, p, sizeof p) || access(p, F_OK) != 0)
		return 0;
	/* every byte: a copy whose size and mtime were kept can still have rotted */
	if (modelsync_verify_file(p, state_dir, NULL, got, err, sizeof err) != 0)
		return 0;
	if (sodium_memcmp(got, hash, MS_HASH_BYTES) != 0) {
		LOG(LOG_WARN, "%s does not match its name: deleted", p);
		unlink(p);
		return 0;
	}
	snprintf(path_out, path_len, "%s", p);
	return 1;
}
