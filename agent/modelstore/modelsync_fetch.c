/*
 * modelsync_fetch.c: the whole-file transfer, fetching side (protocol in modelsync.h and
 * docs/agent-modelsync.md).
 *
 * Invariant: a file named STATE_DIR/models/HEX.gguf always hashes to HEX. The fetcher writes
 * only to HEX.gguf.part, in order, hashing every byte it writes; it renames the .part into place
 * only after the whole-file hash matched. So a .part is always a prefix as received (resumable),
 * and a crash or a lost peer never leaves a wrong file under the final name.
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

/* Sends ERR with a reason (best effort: the channel may already be dead). */
void ms_send_err(tp_chan_t *c, const char *reason)
{
	size_t n = strlen(reason);
	tp_chan_send(c, MS_MSG_ERR, reason, n > 256 ? 256 : n);
}

/* Copies an ERR payload into a printable string. */
void ms_err_text(char *out, size_t outlen, const void *p, size_t len)
{
	size_t n = MIN(len, outlen - 1);
	memcpy(out, p, n);
	out[n] = 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)out[i] < 32 || (unsigned char)out[i] > 126)
			out[i] = '?';
}

/* Receives one message, within timeout_ms. An ERR from the peer becomes SH_ENOENT with its text. */
int ms_recv_msg(tp_chan_t *c, uint16_t *type, uint8_t **p, size_t *len, int timeout_ms,
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
		ms_err_text(t, sizeof t, pl, *len);
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
	char final_path[SH_PATH_MAX], part[SH_SUBPATH_MAX], dir[SH_SUBPATH_MAX],
	    hex[MS_HASH_HEX];
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
	rc = ms_recv_msg(c, &type, &p, &len, timeout_ms, peer, err, errlen);
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
	uint64_t total = sh_get_le64(p + 32);
	uint32_t chunk = sh_get_le32(p + 40);
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
		rc = ms_hash_fd(fd, have, &st, part, NULL, err, errlen);
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
			sh_put_le64(g, next);
			sh_put_le32(g + 8, n);
			rc = tp_chan_send(c, MS_MSG_GET, g, sizeof g);
			if (rc) {
				rc = sh_fail(err, errlen, rc, "model transfer: sending to %s: %s",
					     peer, sh_strerror(rc));
				goto out;
			}
			next += n;
			outstanding++;
		}
		rc = ms_recv_msg(c, &type, &p, &len, timeout_ms, peer, err, errlen);
		if (rc)
			goto out;
		/* GETs went out in order, each MIN(chunk, rest) long: DATA must match exactly */
		uint64_t want_n = MIN((uint64_t)chunk, total - got);
		if (type != MS_MSG_DATA || len < 12 || sh_get_le64(p) != got ||
		    sh_get_le32(p + 8) != len - 12 || len - 12 != want_n) {
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
		ms_send_err(c, "received file does not match the hash");
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
		ms_cache_store(state_dir, abs, (uint64_t)sb.st_size,
			       (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec, want);
	tp_chan_send(c, MS_MSG_DONE, NULL, 0);
	snprintf(path_out, path_len, "%s", final_path);
	rc = 0;
out:
	close(fd);
	return rc;
}
