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
#include "infer/infer.h"

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
	return sodium_bin2hex(out, MS_HASH_HEX, hash, MS_HASH_BYTES);
}

int modelsync_unhex(uint8_t out[MS_HASH_BYTES], const char *hex)
{
	size_t n = 0;
	const char *end;
	if (!hex || strlen(hex) != 2 * MS_HASH_BYTES ||
	    sodium_hex2bin(out, MS_HASH_BYTES, hex, 2 * MS_HASH_BYTES, NULL, &n, &end) != 0 ||
	    n != MS_HASH_BYTES || *end)
		return SH_EINVAL;
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

/* ---- slices ------------------------------------------------------------------------------- */

#define SLICE_BATCH   (8u << 20) /* bytes hashed together in one index entry */
#define SLICE_WINDOW  64         /* GETs outstanding: a slice is often thousands of short rows */
#define HEADER_PREFIX (1u << 20) /* first guess of the header's size; grows by 4x */

/* One index entry: ranges written together and the hash of their bytes in that order (each
 * read from the slice file, or from the sidecar for a compact range). */
typedef struct sbatch {
	uint8_t hash[MS_HASH_BYTES];
	int n;
	ms_range_t *r;
} sbatch_t;

typedef struct sidx {
	uint64_t total;
	int n;
	sbatch_t *b;
} sidx_t;

static void sidx_free(sidx_t *x)
{
	for (int i = 0; i < x->n; i++)
		free(x->b[i].r);
	free(x->b);
	memset(x, 0, sizeof *x);
}

int modelsync_slice_path(const char *state_dir, const uint8_t hash[MS_HASH_BYTES], char *path_out,
			 size_t path_len)
{
	char hex[MS_HASH_HEX];
	int n =
	    snprintf(path_out, path_len, "%s/models/%s.slice", state_dir, modelsync_hex(hex, hash));
	return n > 0 && (size_t)n + 12 < path_len ? 0 : SH_EINVAL;
}

/* Appends a range, joining it to the last one when both are of one kind and touch (in the
 * model, and for compact ranges in the sidecar too). */
static int range_add(ms_range_t **r, int *n, ms_range_t a)
{
	ms_range_t *l = *n ? &(*r)[*n - 1] : NULL;
	if (l && l->compact == a.compact && l->off + l->len == a.off &&
	    (!a.compact || l->side + l->len == a.side)) {
		l->len += a.len;
		return 0;
	}
	if ((*n & (*n - 1)) == 0) {
		ms_range_t *nr = realloc(*r, (size_t)(*n ? 2 * *n : 8) * sizeof *nr);
		if (!nr)
			return SH_ENOMEM;
		*r = nr;
	}
	(*r)[(*n)++] = a;
	return 0;
}

static int range_cmp(const void *a, const void *b)
{
	const ms_range_t *x = a, *y = b;
	if (x->compact != y->compact)
		return x->compact - y->compact;
	return x->off < y->off ? -1 : x->off > y->off;
}

/* Sorts r by (kind, offset) and merges overlapping or touching ranges of one kind in place
 * (the sidecar positions are dropped: for sets of bytes held or needed). Returns the count. */
static int ranges_norm(ms_range_t *r, int n)
{
	if (!n)
		return 0;
	qsort(r, (size_t)n, sizeof *r, range_cmp);
	int k = 0;
	for (int i = 0; i < n; i++) {
		if (!r[i].len)
			continue;
		r[i].side = 0;
		if (k && r[i].compact == r[k - 1].compact &&
		    r[i].off <= r[k - 1].off + r[k - 1].len) {
			uint64_t end = MAX(r[k - 1].off + r[k - 1].len, r[i].off + r[i].len);
			r[k - 1].len = end - r[k - 1].off;
		} else {
			r[k++] = r[i];
		}
	}
	return k;
}

/* *out = need minus have (both from ranges_norm), kind by kind. */
static int ranges_sub(const ms_range_t *need, int nn, const ms_range_t *have, int nh,
		      ms_range_t **out, int *n_out)
{
	*out = NULL;
	*n_out = 0;
	for (int i = 0; i < nn; i++) {
		uint64_t a = need[i].off, end = need[i].off + need[i].len;
		int kind = need[i].compact;
		for (int k = 0; a < end && k < nh; k++) {
			if (have[k].compact != kind || have[k].off + have[k].len <= a)
				continue;
			if (have[k].off >= end)
				break;
			if (have[k].off > a &&
			    range_add(out, n_out, (ms_range_t){a, have[k].off - a, kind, 0}))
				return SH_ENOMEM;
			a = MAX(a, have[k].off + have[k].len);
		}
		if (a < end && range_add(out, n_out, (ms_range_t){a, end - a, kind, 0}))
			return SH_ENOMEM;
	}
	return 0;
}

/* Index: "shoal-slice 1 TOTAL", then one line per batch: "HEX N OFF:LEN ..." (a compact range
 * written OFF:LEN@SIDE). A line that does not parse ends the index (a torn last line from a
 * crash costs one refetch of that batch). */
static int sidx_load(const char *path, sidx_t *x)
{
	memset(x, 0, sizeof *x);
	FILE *f = fopen(path, "r");
	if (!f)
		return SH_ENOENT;
	unsigned long long total;
	int ver;
	if (fscanf(f, "shoal-slice %d %llu\n", &ver, &total) != 2 || ver != 1) {
		fclose(f);
		return SH_EFORMAT;
	}
	x->total = total;
	char hex[MS_HASH_HEX];
	int n;
	while (fscanf(f, "%64s %d", hex, &n) == 2 && n > 0 && n < (1 << 24)) {
		sbatch_t b = {.n = 0, .r = NULL};
		int ok = modelsync_unhex(b.hash, hex) == 0;
		for (int i = 0; ok && i < n; i++) {
			unsigned long long o, l, sd = 0;
			int c;
			ok = fscanf(f, " %llu:%llu", &o, &l) == 2 && o + l <= total && l;
			c = ok ? fgetc(f) : EOF;
			if (c == '@')
				ok = fscanf(f, "%llu", &sd) == 1;
			else if (c != EOF)
				ungetc(c, f);
			ok = ok && range_add(&b.r, &b.n, (ms_range_t){o, l, c == '@', sd}) == 0;
		}
		sbatch_t *nb = ok ? realloc(x->b, (size_t)(x->n + 1) * sizeof *nb) : NULL;
		if (!nb) {
			free(b.r);
			break;
		}
		x->b = nb;
		x->b[x->n++] = b;
	}
	fclose(f);
	return 0;
}

static void sidx_write_batch(FILE *f, const sbatch_t *b)
{
	char hex[MS_HASH_HEX];
	fprintf(f, "%s %d", modelsync_hex(hex, b->hash), b->n);
	for (int i = 0; i < b->n; i++) {
		fprintf(f, " %llu:%llu", (unsigned long long)b->r[i].off,
			(unsigned long long)b->r[i].len);
		if (b->r[i].compact)
			fprintf(f, "@%llu", (unsigned long long)b->r[i].side);
	}
	fputc('\n', f);
}

/* Rewrites the index (and the sidecar's map the engine reads) from x, atomically. */
static int sidx_store(const char *slice_path, const sidx_t *x, char *err, size_t errlen)
{
	char *a = NULL, *m = NULL, p[PATH_MAX + 16];
	size_t al = 0, ml = 0;
	FILE *fa = open_memstream(&a, &al), *fm = open_memstream(&m, &ml);
	int rc = fa && fm ? 0 : SH_ENOMEM;
	if (!rc) {
		fprintf(fa, "shoal-slice 1 %llu\n", (unsigned long long)x->total);
		for (int i = 0; i < x->n; i++) {
			sidx_write_batch(fa, &x->b[i]);
			for (int k = 0; k < x->b[i].n; k++)
				if (x->b[i].r[k].compact)
					fprintf(fm, "%llu %llu %llu\n",
						(unsigned long long)x->b[i].r[k].off,
						(unsigned long long)x->b[i].r[k].len,
						(unsigned long long)x->b[i].r[k].side);
		}
	}
	if (fa)
		fclose(fa);
	if (fm)
		fclose(fm);
	if (!rc) {
		snprintf(p, sizeof p, "%s.cols.map", slice_path);
		rc = write_file_atomic(p, m, ml, err, errlen);
	}
	if (!rc) { /* the index last: it never names bytes the map does not */
		snprintf(p, sizeof p, "%s.idx", slice_path);
		rc = write_file_atomic(p, a, al, err, errlen);
	}
	free(a);
	free(m);
	return rc ? sh_fail(err, errlen, rc, "writing the slice index") : 0;
}

/* All ranges the index holds, normalised (ranges_norm). */
static int sidx_held(const sidx_t *x, ms_range_t **out, int *n_out)
{
	*out = NULL;
	*n_out = 0;
	for (int i = 0; i < x->n; i++)
		for (int k = 0; k < x->b[i].n; k++)
			if (range_add(out, n_out, x->b[i].r[k]))
				return SH_ENOMEM;
	*n_out = ranges_norm(*out, *n_out);
	return 0;
}

/* One fetch of missing bytes: a REQ/INFO exchange made once (lazily), then GETs. */
typedef struct sfetch {
	tp_chan_t *c;
	const uint8_t *want;
	const char *peer;
	int started, timeout_ms;
	uint64_t total;
	uint32_t chunk;
	int fd, side_fd;   /* the slice file and its sidecar */
	uint64_t side_end; /* where the next compact bytes go */
	sidx_t *x;         /* the index, grown batch by batch */
	sbatch_t cur;      /* the batch being written */
	uint64_t cur_bytes;
	crypto_generichash_state st;
	uint64_t fetched;
	char *err;
	size_t errlen;
} sfetch_t;

static int sfetch_begin(sfetch_t *s)
{
	if (s->started)
		return 0;
	if (!s->c)
		return sh_fail(s->err, s->errlen, SH_ENOENT,
			       "the slice lacks bytes and no peer was given");
	int rc = tp_chan_send(s->c, MS_MSG_REQ, s->want, MS_HASH_BYTES);
	if (rc)
		return sh_fail(s->err, s->errlen, rc, "model transfer: sending to %s: %s", s->peer,
			       sh_strerror(rc));
	uint16_t type;
	uint8_t *p;
	size_t len;
	if ((rc = recv_msg(s->c, &type, &p, &len, s->timeout_ms, s->peer, s->err, s->errlen)))
		return rc;
	if (type != MS_MSG_INFO || len != 48 || sodium_memcmp(p, s->want, MS_HASH_BYTES) != 0)
		return sh_fail(s->err, s->errlen, SH_EFORMAT,
			       "model transfer: %s did not offer the model asked for", s->peer);
	s->total = get_u64(p + 32);
	s->chunk = get_u32(p + 40);
	if (s->chunk == 0 || s->chunk > MS_CHUNK_MAX)
		s->chunk = MS_CHUNK_DEFAULT;
	s->started = 1;
	return 0;
}

static int sfetch_flush(sfetch_t *s)
{
	if (!s->cur.n)
		return 0;
	crypto_generichash_final(&s->st, s->cur.hash, MS_HASH_BYTES);
	sbatch_t *nb = realloc(s->x->b, (size_t)(s->x->n + 1) * sizeof *nb);
	if (!nb)
		return sh_fail(s->err, s->errlen, SH_ENOMEM, "out of memory");
	s->x->b = nb;
	s->x->b[s->x->n++] = s->cur;
	s->cur = (sbatch_t){.n = 0, .r = NULL};
	s->cur_bytes = 0;
	return 0;
}

static int write_all(int fd, const uint8_t *p, size_t n, uint64_t off)
{
	for (size_t w = 0; w < n;) {
		ssize_t r = pwrite(fd, p + w, n - w, (off_t)(off + w));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return SH_EIO;
		w += (size_t)r;
	}
	return 0;
}

/* Fetches the ranges miss[0..n) (one kind, within the model): into the slice file at their
 * offsets, or appended to the sidecar when compact. */
static int sfetch_get(sfetch_t *s, const ms_range_t *miss, int n)
{
	struct {
		uint64_t off;
		uint32_t len;
	} q[SLICE_WINDOW]; /* GETs in flight, in order */
	int head = 0, inflight = 0, i = 0, rc;
	uint64_t at = n ? miss[0].off : 0;
	while (i < n || inflight) {
		while (inflight < SLICE_WINDOW && i < n) {
			uint64_t end = miss[i].off + miss[i].len;
			uint32_t len = (uint32_t)MIN((uint64_t)s->chunk, end - at);
			uint8_t g[12];
			put_u64(g, at);
			put_u32(g + 8, len);
			if ((rc = tp_chan_send(s->c, MS_MSG_GET, g, sizeof g)))
				return sh_fail(s->err, s->errlen, rc,
					       "model transfer: sending to %s: %s", s->peer,
					       sh_strerror(rc));
			int slot = (head + inflight) % SLICE_WINDOW;
			q[slot].off = at;
			q[slot].len = len;
			inflight++;
			at += len;
			if (at == end && ++i < n)
				at = miss[i].off;
		}
		uint16_t type;
		uint8_t *p;
		size_t len;
		if ((rc = recv_msg(s->c, &type, &p, &len, s->timeout_ms, s->peer, s->err,
				   s->errlen)))
			return rc;
		if (type != MS_MSG_DATA || len < 12 || get_u64(p) != q[head].off ||
		    get_u32(p + 8) != q[head].len || len - 12 != q[head].len)
			return sh_fail(s->err, s->errlen, SH_EFORMAT,
				       "model transfer: %s sent an unexpected message 0x%04x (%zu "
				       "bytes)",
				       s->peer, type, len);
		uint64_t off = q[head].off;
		size_t k = len - 12;
		int compact = miss[0].compact;
		ms_range_t piece = {off, k, compact, compact ? s->side_end : 0};
		if (write_all(compact ? s->side_fd : s->fd, p + 12, k, compact ? s->side_end : off))
			return sh_fail(s->err, s->errlen, SH_EIO, "writing the slice: %s",
				       strerror(errno));
		if (compact)
			s->side_end += k;
		if (!s->cur.n)
			crypto_generichash_init(&s->st, NULL, 0, MS_HASH_BYTES);
		crypto_generichash_update(&s->st, p + 12, k);
		if (range_add(&s->cur.r, &s->cur.n, piece))
			return sh_fail(s->err, s->errlen, SH_ENOMEM, "out of memory");
		s->cur_bytes += k;
		s->fetched += k;
		head = (head + 1) % SLICE_WINDOW;
		inflight--;
		if (s->cur_bytes >= SLICE_BATCH && (rc = sfetch_flush(s)))
			return rc;
	}
	return sfetch_flush(s);
}

/* 0 when the slice file holds a whole GGUF header at its start (the first held range). */
static int header_held(int fd, const ms_range_t *held, int n, uint64_t *hlen)
{
	if (!n || held[0].compact || held[0].off != 0)
		return -1;
	size_t len = (size_t)MIN(held[0].len, (uint64_t)64 << 20);
	uint8_t *buf = malloc(len);
	int rc = -1;
	char e[128];
	if (buf && pread(fd, buf, len, 0) == (ssize_t)len &&
	    eng_header_bytes(buf, len, hlen, e, sizeof e) == 0)
		rc = 0;
	free(buf);
	return rc;
}

/* Opens the slice file (sized to the model) and, when compact ranges come, its sidecar. */
static int sfetch_files(sfetch_t *s, const char *path, int want_side)
{
	struct stat sb;
	if (fstat(s->fd, &sb) != 0 ||
	    ((uint64_t)sb.st_size != s->total && ftruncate(s->fd, (off_t)s->total) != 0))
		return sh_fail(s->err, s->errlen, SH_EIO, "%s: %s", path, strerror(errno));
	if (want_side && s->side_fd < 0) {
		char sp[PATH_MAX + 8];
		snprintf(sp, sizeof sp, "%s.cols", path);
		s->side_fd = open(sp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (s->side_fd < 0 || fstat(s->side_fd, &sb) != 0)
			return sh_fail(s->err, s->errlen, SH_EIO, "%s: %s", sp, strerror(errno));
		s->side_end = (uint64_t)sb.st_size; /* appended: what the index names stays put */
	}
	return 0;
}

int modelsync_fetch_slice(tp_chan_t *c, const uint8_t want[MS_HASH_BYTES], const char *state_dir,
			  const ms_range_t *r, int n, char *path_out, size_t path_len,
			  uint64_t *fetched, int timeout_ms, char *err, size_t errlen)
{
	if (sodium_init() < 0)
		return sh_fail(err, errlen, SH_EIO, "libsodium failed to initialize");
	char path[PATH_MAX], idxp[PATH_MAX + 8], dir[PATH_MAX];
	if (modelsync_slice_path(state_dir, want, path, sizeof path))
		return sh_fail(err, errlen, SH_EINVAL, "state directory path too long");
	snprintf(idxp, sizeof idxp, "%s.idx", path);
	snprintf(dir, sizeof dir, "%s/models", state_dir);
	int rc = mkdir_p(dir, err, errlen);
	if (rc)
		return rc;
	sidx_t x;
	sfetch_t s = {.c = c,
		      .want = want,
		      .peer = c ? tp_chan_peer_addr(c) : "?",
		      .timeout_ms = timeout_ms,
		      .fd = -1,
		      .side_fd = -1,
		      .x = &x,
		      .err = err,
		      .errlen = errlen};
	ms_range_t *held = NULL, *need = NULL, *miss = NULL;
	int nh = 0, nm = 0, grew = 0;
	if (sidx_load(idxp, &x) != 0) { /* none, or unreadable: start afresh */
		char sp[PATH_MAX + 8];
		unlink(path);
		snprintf(sp, sizeof sp, "%s.cols", path);
		unlink(sp);
		memset(&x, 0, sizeof x);
	}
	if ((rc = sidx_held(&x, &held, &nh)))
		goto nomem;
	s.fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (s.fd < 0) {
		rc = sh_fail(err, errlen, SH_EIO, "%s: %s", path, strerror(errno));
		goto out;
	}
	uint64_t hlen = 0;
	int header_mode = n == 0;
	if (header_mode && header_held(s.fd, held, nh, &hlen) == 0)
		goto done; /* the header is here already */
	for (uint64_t prefix = HEADER_PREFIX;; prefix *= 4) {
		free(need);
		need = NULL;
		int nn = 0;
		if (header_mode) {
			if ((rc = sfetch_begin(&s)))
				goto out;
			if (range_add(&need, &nn, (ms_range_t){0, MIN(prefix, s.total), 0, 0}))
				goto nomem;
		} else {
			for (int i = 0; i < n; i++)
				if (range_add(&need, &nn,
					      (ms_range_t){r[i].off, r[i].len, r[i].compact, 0}))
					goto nomem;
			nn = ranges_norm(need, nn);
		}
		free(miss);
		if ((rc = ranges_sub(need, nn, held, nh, &miss, &nm)))
			goto nomem;
		if (nm) {
			if ((rc = sfetch_begin(&s)))
				goto out;
			if (x.total && x.total != s.total) {
				rc = sh_fail(err, errlen, SH_EFORMAT,
					     "%s: the slice index is for another size", path);
				goto out;
			}
			x.total = s.total;
			for (int i = 0; i < nm; i++)
				if (miss[i].off + miss[i].len > s.total) {
					rc = sh_fail(err, errlen, SH_EINVAL,
						     "slice range past the end of the model");
					goto out;
				}
			int first_compact = nm;
			for (int i = 0; i < nm && first_compact == nm; i++)
				if (miss[i].compact)
					first_compact = i;
			if ((rc = sfetch_files(&s, path, first_compact < nm)) ||
			    (rc = sfetch_get(&s, miss, first_compact)) ||
			    (rc = sfetch_get(&s, miss + first_compact, nm - first_compact)))
				goto out;
			grew = 1;
			for (int i = 0; i < nm; i++)
				if (range_add(&held, &nh, miss[i]))
					goto nomem;
			nh = ranges_norm(held, nh);
		}
		if (!header_mode || header_held(s.fd, held, nh, &hlen) == 0)
			break;
		if (prefix >= s.total) {
			rc = sh_fail(err, errlen, SH_EFORMAT, "the model has no valid GGUF header");
			goto out;
		}
	}
done:
	if (grew && (fsync(s.fd) != 0 || (s.side_fd >= 0 && fsync(s.side_fd) != 0) ||
		     (rc = sidx_store(path, &x, err, errlen)))) {
		if (!rc)
			rc = sh_fail(err, errlen, SH_EIO, "%s: %s", path, strerror(errno));
		goto out;
	}
	if (s.started)
		tp_chan_send(c, MS_MSG_DONE, NULL, 0);
	if (fetched)
		*fetched = s.fetched;
	snprintf(path_out, path_len, "%s", path);
	rc = 0;
	goto out;
nomem:
	rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
out:
	if (rc && s.x->n && grew == 0 && s.fetched) /* keep what arrived intact for a resume */
		sidx_store(path, &x, NULL, 0);
	free(s.cur.r);
	if (s.side_fd >= 0)
		close(s.side_fd);
	if (s.fd >= 0)
		close(s.fd);
	free(held);
	free(need);
	free(miss);
	sidx_free(&x);
	return rc;
}

int modelsync_slice_verify(const char *state_dir, const uint8_t hash[MS_HASH_BYTES], uint64_t *held,
			   uint64_t *dropped, char *err, size_t errlen)
{
	char path[PATH_MAX], idxp[PATH_MAX + 8], sp[PATH_MAX + 8];
	*held = 0;
	if (dropped)
		*dropped = 0;
	if (modelsync_slice_path(state_dir, hash, path, sizeof path))
		return sh_fail(err, errlen, SH_EINVAL, "state directory path too long");
	snprintf(idxp, sizeof idxp, "%s.idx", path);
	snprintf(sp, sizeof sp, "%s.cols", path);
	sidx_t x;
	if (sidx_load(idxp, &x) != 0)
		return sh_fail(err, errlen, SH_ENOENT, "no slice of this model");
	int fd = open(path, O_RDONLY | O_CLOEXEC), sfd = open(sp, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (sfd >= 0)
			close(sfd);
		sidx_free(&x);
		return sh_fail(err, errlen, SH_EIO, "%s: %s", path, strerror(errno));
	}
	int rc = 0, bad = 0, keep = 0;
	size_t cap = 1 << 20;
	uint8_t *buf = malloc(cap);
	if (!buf) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto end;
	}
	for (int i = 0; i < x.n; i++) {
		crypto_generichash_state st;
		crypto_generichash_init(&st, NULL, 0, MS_HASH_BYTES);
		uint64_t bytes = 0;
		int ok = 1;
		for (int k = 0; ok && k < x.b[i].n; k++) {
			const ms_range_t *p = &x.b[i].r[k];
			int from = p->compact ? sfd : fd;
			for (uint64_t d = 0; ok && d < p->len;) {
				size_t want = (size_t)MIN((uint64_t)cap, p->len - d);
				uint64_t at = (p->compact ? p->side : p->off) + d;
				ok =
				    from >= 0 && pread(from, buf, want, (off_t)at) == (ssize_t)want;
				if (ok)
					crypto_generichash_update(&st, buf, want);
				d += want;
				bytes += want;
			}
		}
		uint8_t h[MS_HASH_BYTES];
		crypto_generichash_final(&st, h, MS_HASH_BYTES);
		if (ok && sodium_memcmp(h, x.b[i].hash, MS_HASH_BYTES) == 0) {
			*held += bytes;
			x.b[keep++] = x.b[i];
		} else {
			bad++;
			if (dropped)
				*dropped += bytes;
			free(x.b[i].r);
		}
	}
	x.n = keep;
	if (bad) {
		char hex[MS_HASH_HEX];
		LOG(LOG_WARN, "model %.12s: %d slice batch(es) changed on disk: fetched again",
		    modelsync_hex(hex, hash), bad);
		rc = sidx_store(path, &x, err, errlen);
	}
end:
	free(buf);
	close(fd);
	if (sfd >= 0)
		close(sfd);
	sidx_free(&x);
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
