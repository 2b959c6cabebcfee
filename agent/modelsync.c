/*
 * modelsync.c: the model's content hash (with its cache) and the whole-file transfer from a node
 * that has the model to one that does not (protocol in modelsync.h and docs/agent-modelsync.md).
 *
 * Invariant: a file named STATE_DIR/models/HEX.gguf always hashes to HEX. The fetcher writes
 * only to HEX.gguf.part, in order, hashing every byte it writes; it renames the .part into place
 * only after the whole-file hash matched. So a .part is always a prefix as received (resumable),
 * and a crash or a lost peer never leaves a wrong file under the final name.
 */
#define _GNU_SOURCE
#include "agent/modelsync.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"

#define HASH_BUF          (8u << 20)     /* read size while hashing */
#define HASH_LOG_MIN      (256ull << 20) /* files above this log hashing progress */
#define PROGRESS_LOG_MS   2000           /* at most one progress line this often */
#define CACHE_MAX_ENTRIES 64
#define STOP_SLICE_MS     200 /* a serving thread checks its stop flag this often */

/* ---- small helpers ------------------------------------------------------------------------ */

static void put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint64_t get_u64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

int modelsync_is_msg(uint16_t type)
{
	return type >= MS_MSG_FIRST && type <= MS_MSG_LAST;
}

char *modelsync_hex(char out[MS_HASH_HEX], const uint8_t hash[MS_HASH_BYTES])
{
	static const char d[] = "0123456789abcdef";
	for (int i = 0; i < MS_HASH_BYTES; i++) {
		out[2 * i] = d[hash[i] >> 4];
		out[2 * i + 1] = d[hash[i] & 15];
	}
	out[2 * MS_HASH_BYTES] = 0;
	return out;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int modelsync_unhex(uint8_t out[MS_HASH_BYTES], const char *hex)
{
	if (!hex || strlen(hex) != 2 * MS_HASH_BYTES)
		return SH_EINVAL;
	for (int i = 0; i < MS_HASH_BYTES; i++) {
		int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return SH_EINVAL;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

/* Sends ERR with a reason (best effort: the channel may already be dead). */
static void send_err(tp_chan_t *c, const char *reason)
{
	size_t n = strlen(reason);
	tp_chan_send(c, MS_MSG_ERR, reason, n > 256 ? 256 : n);
}

/* Copies an ERR payload into a printable string. */
static void err_text(char *out, size_t outlen, const void *p, size_t len)
{
	size_t n = MIN(len, outlen - 1);
	memcpy(out, p, n);
	out[n] = 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)out[i] < 32 || (unsigned char)out[i] > 126)
			out[i] = '?';
}

/* ---- hash cache: STATE_DIR/model-hashes, lines "HEX SIZE MTIME_NS PATH" ------------------- */

static int cache_path(const char *state_dir, char *out, size_t len)
{
	int n = snprintf(out, len, "%s/model-hashes", state_dir);
	return n > 0 && (size_t)n < len ? 0 : SH_EINVAL;
}

static int cache_lookup(const char *state_dir, const char *abs, uint64_t size, int64_t mtime,
			uint8_t out[MS_HASH_BYTES])
{
	char cp[PATH_MAX + 32], *buf = NULL;
	size_t blen;
	if (cache_path(state_dir, cp, sizeof cp) || read_file_all(cp, &buf, &blen, NULL, 0))
		return 0;
	int found = 0;
	for (char *line = buf, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		char hex[MS_HASH_HEX];
		unsigned long long sz;
		long long mt;
		int off = 0;
		if (sscanf(line, "%64s %llu %lld %n", hex, &sz, &mt, &off) != 3 || !off)
			continue;
		if (sz == size && mt == mtime && strcmp(line + off, abs) == 0 &&
		    modelsync_unhex(out, hex) == 0)
			found = 1;
	}
	free(buf);
	return found;
}

/* Adds (or replaces) the entry for abs; keeps the newest CACHE_MAX_ENTRIES lines. Best effort. */
static void cache_store(const char *state_dir, const char *abs, uint64_t size, int64_t mtime,
			const uint8_t hash[MS_HASH_BYTES])
{
	char cp[PATH_MAX + 32], *old = NULL;
	size_t olen = 0;
	if (cache_path(state_dir, cp, sizeof cp) || mkdir_p(state_dir, NULL, 0))
		return;
	if (read_file_all(cp, &old, &olen, NULL, 0))
		old = NULL;
	/* Lines other than abs's, newest last; then ours. */
	const char *lines[CACHE_MAX_ENTRIES];
	int n = 0;
	for (char *line = old, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		char hex[MS_HASH_HEX];
		unsigned long long sz;
		long long mt;
		int off = 0;
		if (sscanf(line, "%64s %llu %lld %n", hex, &sz, &mt, &off) != 3 || !off ||
		    strcmp(line + off, abs) == 0)
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

/* ---- hashing ------------------------------------------------------------------------------ */

/* Feeds bytes [0, len) of fd into st. cancel (may be NULL) set: SH_ECANCELED. */
static int hash_fd(int fd, uint64_t len, crypto_generichash_state *st, const char *what,
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

/* modelsync_hash_file and modelsync_verify_file: use_cache 0 reads every byte and only updates
 * the cache. */
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
	int rc = hash_fd(fd, size, &st, path, cancel, err, errlen);
	close(fd);
	if (rc)
		return rc;
	crypto_generichash_final(&st, out, MS_HASH_BYTES);
	if (state_dir)
		cache_store(state_dir, abs, size, mtime, out);
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
	char p[PATH_MAX], err[256];
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

/* ---- fetching ----------------------------------------------------------------------------- */

/* Receives one message, within timeout_ms. An ERR from the peer becomes SH_ENOENT with its text. */
static int recv_msg(tp_chan_t *c, uint16_t *type, uint8_t **p, size_t *len, int timeout_ms,
		    const char *peer, char *err, size_t errlen)
{
	void *pl;
	int rc = tp_chan_recv(c, type, &pl, len, timeout_ms);
	if (rc == SH_ETIMEDOUT)
		return sh_fail(err, errlen, rc, "model transfer: %s silent for %d ms", peer,
			       timeout_ms);
	if (rc)
		return sh_fail(err, errlen, rc, "model transfer: %s: %s", peer, sh_strerror(rc));
	*p = pl;
	if (*type == MS_MSG_ERR) {
		char t[260];
		err_text(t, sizeof t, pl, *len);
		return sh_fail(err, errlen, SH_ENOENT, "model transfer: %s says: %s", peer, t);
	}
	return 0;
}

struct progress {
	uint64_t start_off; /* bytes already there when the transfer began (resume) */
	int64_t t0, last;
};

static void progress_log(struct progress *pg, const char *hex, uint64_t done, uint64_t total,
			 int final)
{
	int64_t now = now_ms();
	if (!final && now - pg->last < PROGRESS_LOG_MS)
		return;
	pg->last = now;
	double s = (double)(now - pg->t0) / 1000.0;
	double mbs = s > 0 ? (double)(done - pg->start_off) / 1e6 / s : 0.0;
	LOG(LOG_INFO, "model %.12s: %.1f%% of %.1f MB (%.1f MB/s)", hex,
	    total ? 100.0 * (double)done / (double)total : 100.0, (double)total / 1e6, mbs);
}

int modelsync_fetch(tp_chan_t *c, const uint8_t want[MS_HASH_BYTES], const char *state_dir,
		    char *path_out, size_t path_len, modelsync_progress_fn progress, void *ud,
		    int timeout_ms, char *err, size_t errlen)
{
	if (sodium_init() < 0)
		return sh_fail(err, errlen, SH_EIO, "libsodium failed to initialize");
	char final_path[PATH_MAX], part[PATH_MAX + 8], dir[PATH_MAX], hex[MS_HASH_HEX];
	const char *peer = tp_chan_peer_addr(c);
	modelsync_hex(hex, want);
	if (modelsync_model_path(state_dir, want, final_path, sizeof final_path))
		return sh_fail(err, errlen, SH_EINVAL, "state directory path too long");
	snprintf(part, sizeof part, "%s.part", final_path);
	snprintf(dir, sizeof dir, "%s/models", state_dir);
	if (modelsync_cached(state_dir, want, path_out, path_len))
		return 0; /* the channel is not used */
	int rc = mkdir_p(dir, err, errlen);
	if (rc)
		return rc;

	/* REQ -> INFO */
	rc = tp_chan_send(c, MS_MSG_REQ, want, MS_HASH_BYTES);
	if (rc)
		return sh_fail(err, errlen, rc, "model transfer: sending to %s: %s", peer,
			       sh_strerror(rc));
	uint16_t type;
	uint8_t *p;
	size_t len;
	rc = recv_msg(c, &type, &p, &len, timeout_ms, peer, err, errlen);
	if (rc)
		return rc;
	if (type != MS_MSG_INFO || len != 48)
		return sh_fail(err, errlen, SH_EFORMAT,
			       "model transfer: %s sent message 0x%04x (%zu bytes), not INFO", peer,
			       type, len);
	if (sodium_memcmp(p, want, MS_HASH_BYTES) != 0) {
		char got[MS_HASH_HEX];
		modelsync_hex(got, p);
		return sh_fail(err, errlen, SH_ENOENT,
			       "model transfer: %s offers model %.16s, want %.16s", peer, got, hex);
	}
	uint64_t total = get_u64(p + 32);
	uint32_t chunk = get_u32(p + 40);
	if (chunk == 0 || chunk > MS_CHUNK_MAX)
		chunk = MS_CHUNK_DEFAULT;

	/* Open the .part; its prefix is kept and rehashed (resume). */
	int fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return sh_fail(err, errlen, SH_EIO, "%s: %s", part, strerror(errno));
	struct stat sb;
	if (fstat(fd, &sb) != 0) {
		rc = sh_fail(err, errlen, SH_EIO, "%s: %s", part, strerror(errno));
		goto out;
	}
	uint64_t have = (uint64_t)sb.st_size;
	if (have > total) {
		LOG(LOG_WARN, "%s is larger than the model: starting over", part);
		if (ftruncate(fd, 0) != 0) {
			rc = sh_fail(err, errlen, SH_EIO, "%s: %s", part, strerror(errno));
			goto out;
		}
		have = 0;
	}
	crypto_generichash_state st;
	crypto_generichash_init(&st, NULL, 0, MS_HASH_BYTES);
	if (have) {
		LOG(LOG_INFO, "model %.12s: resuming at %.1f of %.1f MB", hex, (double)have / 1e6,
		    (double)total / 1e6);
		rc = hash_fd(fd, have, &st, part, NULL, err, errlen);
		if (rc)
			goto out;
	} else {
		LOG(LOG_INFO, "model %.12s: fetching %.1f MB from %s", hex, (double)total / 1e6,
		    peer);
	}

	struct progress pg = {.start_off = have, .t0 = now_ms(), .last = now_ms()};
	uint64_t next = have, got = have; /* next offset to request; bytes written */
	int outstanding = 0;
	while (got < total) {
		while (outstanding < MS_WINDOW && next < total) {
			uint8_t g[12];
			uint32_t n = (uint32_t)MIN((uint64_t)chunk, total - next);
			put_u64(g, next);
			put_u32(g + 8, n);
			rc = tp_chan_send(c, MS_MSG_GET, g, sizeof g);
			if (rc) {
				rc = sh_fail(err, errlen, rc, "model transfer: sending to %s: %s",
					     peer, sh_strerror(rc));
				goto out;
			}
			next += n;
			outstanding++;
		}
		rc = recv_msg(c, &type, &p, &len, timeout_ms, peer, err, errlen);
		if (rc)
			goto out;
		/* GETs went out in order, each MIN(chunk, rest) long: DATA must match exactly */
		uint64_t want_n = MIN((uint64_t)chunk, total - got);
		if (type != MS_MSG_DATA || len < 12 || get_u64(p) != got ||
		    get_u32(p + 8) != len - 12 || len - 12 != want_n) {
			rc = sh_fail(err, errlen, SH_EFORMAT,
				     "model transfer: %s sent an unexpected message 0x%04x (%zu "
				     "bytes) at offset %llu",
				     peer, type, len, (unsigned long long)got);
			goto out;
		}
		size_t n = len - 12;
		for (size_t off = 0; off < n;) {
			ssize_t w = pwrite(fd, p + 12 + off, n - off, (off_t)(got + off));
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0) {
				rc = sh_fail(err, errlen, SH_EIO, "writing %s: %s", part,
					     strerror(errno));
				goto out;
			}
			off += (size_t)w;
		}
		crypto_generichash_update(&st, p + 12, n);
		got += n;
		outstanding--;
		if (progress)
			progress(got, total, ud);
		progress_log(&pg, hex, got, total, got == total);
	}

	uint8_t h[MS_HASH_BYTES];
	crypto_generichash_final(&st, h, MS_HASH_BYTES);
	if (sodium_memcmp(h, want, MS_HASH_BYTES) != 0) {
		char gothex[MS_HASH_HEX];
		unlink(part);
		send_err(c, "received file does not match the hash");
		rc =
		    sh_fail(err, errlen, SH_EFORMAT,
			    "model transfer: the file from %s hashes to %.16s, not %.16s: rejected",
			    peer, modelsync_hex(gothex, h), hex);
		goto out;
	}
	if (fsync(fd) != 0 || rename(part, final_path) != 0) {
		rc = sh_fail(err, errlen, SH_EIO, "%s: %s", final_path, strerror(errno));
		goto out;
	}
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
	/* Record the hash so loading it later does not rehash the whole file. */
	char abs[PATH_MAX];
	if (fstat(fd, &sb) == 0 && realpath(final_path, abs))
		cache_store(state_dir, abs, (uint64_t)sb.st_size,
			    (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec, want);
	tp_chan_send(c, MS_MSG_DONE, NULL, 0);
	snprintf(path_out, path_len, "%s", final_path);
	rc = 0;
out:
	close(fd);
	return rc;
}

/* ---- serving ------------------------------------------------------------------------------ */

/* Handles one message from the fetcher. Returns 1 after DONE, 0 to go on, < 0 on error. */
static int serve_one(tp_chan_t *c, int fd, uint64_t size, const uint8_t hash[MS_HASH_BYTES],
		     uint8_t **buf, uint16_t type, const uint8_t *p, size_t len, char *err,
		     size_t errlen)
{
	const char *peer = tp_chan_peer_addr(c);
	switch (type) {
	case MS_MSG_REQ: {
		if (len != MS_HASH_BYTES) {
			send_err(c, "malformed REQ");
			return sh_fail(err, errlen, SH_EFORMAT, "model request from %s: malformed",
				       peer);
		}
		if (sodium_memcmp(p, hash, MS_HASH_BYTES) != 0) {
			char a[MS_HASH_HEX], b[MS_HASH_HEX], m[200];
			snprintf(m, sizeof m, "this node serves model %.16s, not %.16s",
				 modelsync_hex(a, hash), modelsync_hex(b, p));
			send_err(c, m);
			return sh_fail(err, errlen, SH_ENOENT, "model request from %s: %s", peer,
				       m);
		}
		uint8_t info[48];
		memcpy(info, hash, MS_HASH_BYTES);
		put_u64(info + 32, size);
		put_u32(info + 40, MS_CHUNK_DEFAULT);
		put_u32(info + 44, 0);
		int rc = tp_chan_send(c, MS_MSG_INFO, info, sizeof info);
		return rc ? sh_fail(err, errlen, rc, "model transfer to %s: %s", peer,
				    sh_strerror(rc))
			  : 0;
	}
	case MS_MSG_GET: {
		if (len != 12) {
			send_err(c, "malformed GET");
			return sh_fail(err, errlen, SH_EFORMAT, "model GET from %s: malformed",
				       peer);
		}
		uint64_t off = get_u64(p);
		uint32_t n = get_u32(p + 8);
		if (n == 0 || n > MS_CHUNK_MAX || off > size || n > size - off) {
			send_err(c, "GET out of range");
			return sh_fail(err, errlen, SH_EFORMAT,
				       "model GET from %s: %u bytes at %llu out of range", peer, n,
				       (unsigned long long)off);
		}
		if (!*buf && !(*buf = malloc(12 + MS_CHUNK_MAX)))
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory serving the model");
		put_u64(*buf, off);
		put_u32(*buf + 8, n);
		for (uint32_t done = 0; done < n;) {
			ssize_t r = pread(fd, *buf + 12 + done, n - done, (off_t)(off + done));
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				send_err(c, "the model file changed or cannot be read");
				return sh_fail(err, errlen, SH_EIO, "reading the model: %s",
					       r < 0 ? strerror(errno) : "file shrank");
			}
			done += (uint32_t)r;
		}
		int rc = tp_chan_send(c, MS_MSG_DATA, *buf, 12 + (size_t)n);
		return rc ? sh_fail(err, errlen, rc, "model transfer to %s: %s", peer,
				    sh_strerror(rc))
			  : 0;
	}
	case MS_MSG_DONE: return 1;
	case MS_MSG_ERR: {
		char t[260];
		err_text(t, sizeof t, p, len);
		return sh_fail(err, errlen, SH_ECLOSED, "model transfer: %s stopped: %s", peer, t);
	}
	default:
		send_err(c, "unexpected message");
		return sh_fail(err, errlen, SH_EFORMAT, "model transfer: %s sent message 0x%04x",
			       peer, type);
	}
}

static int serve_loop(tp_chan_t *c, const char *path, const uint8_t hash[MS_HASH_BYTES],
		      uint16_t first_type, const void *first, size_t first_len, int timeout_ms,
		      atomic_int *stop, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat sb;
	if (fd < 0 || fstat(fd, &sb) != 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		send_err(c, "the model file cannot be opened");
		return sh_fail(err, errlen, SH_EIO, "%s: %s", path, strerror(e));
	}
	uint64_t size = (uint64_t)sb.st_size;
	uint8_t *buf = NULL;
	int rc = 0;
	if (first_type) {
		rc = serve_one(c, fd, size, hash, &buf, first_type, first, first_len, err, errlen);
	}
	int64_t idle_since = now_ms();
	while (rc == 0) {
		if (stop && atomic_load(stop)) {
			rc = sh_fail(err, errlen, SH_ECANCELED, "model transfer stopped");
			break;
		}
		uint16_t type;
		void *p;
		size_t len;
		int slice = stop ? STOP_SLICE_MS : timeout_ms;
		int r = tp_chan_recv(c, &type, &p, &len, slice);
		if (r == SH_ETIMEDOUT) {
			if (timeout_ms >= 0 && now_ms() - idle_since >= timeout_ms)
				rc = sh_fail(err, errlen, r, "model transfer: %s silent for %d ms",
					     tp_chan_peer_addr(c), timeout_ms);
			continue;
		}
		if (r) {
			rc = sh_fail(err, errlen, r, "model transfer: %s: %s", tp_chan_peer_addr(c),
				     sh_strerror(r));
			break;
		}
		idle_since = now_ms();
		rc = serve_one(c, fd, size, hash, &buf, type, p, len, err, errlen);
	}
	free(buf);
	close(fd);
	return rc == 1 ? 0 : rc;
}

int modelsync_serve(tp_chan_t *c, const char *path, const uint8_t hash[MS_HASH_BYTES],
		    uint16_t first_type, const void *first, size_t first_len, int timeout_ms,
		    char *err, size_t errlen)
{
	return serve_loop(c, path, hash, first_type, first, first_len, timeout_ms, NULL, err,
			  errlen);
}

struct modelsync_server {
	pthread_t thread;
	tp_chan_t *c;
	char *path;
	uint8_t hash[MS_HASH_BYTES];
	uint16_t first_type;
	uint8_t *first;
	size_t first_len;
	int timeout_ms;
	atomic_int stop, done;
	int rc;
	char err[256];
};

static void *server_main(void *arg)
{
	modelsync_server_t *s = arg;
	s->rc = serve_loop(s->c, s->path, s->hash, s->first_type, s->first, s->first_len,
			   s->timeout_ms, &s->stop, s->err, sizeof s->err);
	if (s->rc == 0)
		LOG(LOG_INFO, "model sent to %s", tp_chan_peer_addr(s->c));
	else if (s->rc != SH_ECANCELED)
		LOG(LOG_WARN, "%s", s->err);
	atomic_store(&s->done, 1);
	return NULL;
}

int modelsync_server_start(modelsync_server_t **out, tp_chan_t *c, const char *path,
			   const uint8_t hash[MS_HASH_BYTES], uint16_t first_type,
			   const void *first, size_t first_len, int timeout_ms, char *err,
			   size_t errlen)
{
	*out = NULL;
	modelsync_server_t *s = calloc(1, sizeof *s);
	if (!s)
		goto nomem;
	s->path = strdup(path);
	if (!s->path)
		goto nomem;
	if (first_type && first_len) {
		s->first = malloc(first_len);
		if (!s->first)
			goto nomem;
		memcpy(s->first, first, first_len);
	}
	s->c = c;
	memcpy(s->hash, hash, MS_HASH_BYTES);
	s->first_type = first_type;
	s->first_len = first_len;
	s->timeout_ms = timeout_ms;
	if (pthread_create(&s->thread, NULL, server_main, s) != 0) {
		s->c = NULL;
		free(s->first);
		free(s->path);
		free(s);
		tp_chan_free(c);
		return sh_fail(err, errlen, SH_EIO, "cannot start a thread to serve the model");
	}
	*out = s;
	return 0;
nomem:
	if (s) {
		free(s->first);
		free(s->path);
		free(s);
	}
	tp_chan_free(c);
	return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
}

int modelsync_server_done(modelsync_server_t *s, int *rc)
{
	if (!atomic_load(&s->done))
		return 0;
	if (rc)
		*rc = s->rc;
	return 1;
}

void modelsync_server_free(modelsync_server_t *s)
{
	if (!s)
		return;
	atomic_store(&s->stop, 1);
	pthread_join(s->thread, NULL);
	tp_chan_free(s->c);
	free(s->first);
	free(s->path);
	free(s);
}
