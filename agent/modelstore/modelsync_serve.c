/*
 * modelsync_serve.c: the whole-file transfer, serving side (modelsync.h): answers REQ with INFO,
 * each GET with DATA read from the file, until DONE; and the serving thread.
 *
 * Invariant: a GET outside the file is answered with ERR and ends the transfer; the server never
 * reads past the size it announced.
 */
#define _GNU_SOURCE
#include "agent/modelstore/modelsync_int.h"
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STOP_SLICE_MS 200 /* a serving thread checks its stop flag this often */

/* Handles one message from the fetcher. Returns 1 after DONE, 0 to go on, < 0 on error. */
static int serve_one(tp_chan_t *c, int fd, uint64_t size, const uint8_t hash[MS_HASH_BYTES],
		     uint8_t **buf, uint16_t type, const uint8_t *p, size_t len, char *err,
		     size_t errlen)
{
	const char *peer = tp_chan_peer_addr(c);
	switch (type) {
	case MS_MSG_REQ: {
		if (len != MS_HASH_BYTES) {
			ms_send_err(c, "malformed REQ");
			return sh_fail(err, errlen, SH_EFORMAT, "model request from %s: malformed",
				       peer);
		}
		if (sodium_memcmp(p, hash, MS_HASH_BYTES) != 0) {
			char a[MS_HASH_HEX], b[MS_HASH_HEX], m[200];
			snprintf(m, sizeof m, "this node serves model %.16s, not %.16s",
				 modelsync_hex(a, hash), modelsync_hex(b, p));
			ms_send_err(c, m);
			return sh_fail(err, errlen, SH_ENOENT, "model request from %s: %s", peer,
				       m);
		}
		uint8_t info[48];
		memcpy(info, hash, MS_HASH_BYTES);
		sh_put_le64(info + 32, size);
		sh_put_le32(info + 40, MS_CHUNK_DEFAULT);
		sh_put_le32(info + 44, 0);
		int rc = tp_chan_send(c, MS_MSG_INFO, info, sizeof info);
		return rc ? sh_fail(err, errlen, rc, "model transfer to %s: %s", peer,
				    sh_strerror(rc))
			  : 0;
	}
	case MS_MSG_GET: {
		if (len != 12) {
			ms_send_err(c, "malformed GET");
			return sh_fail(err, errlen, SH_EFORMAT, "model GET from %s: malformed",
				       peer);
		}
		uint64_t off = sh_get_le64(p);
		uint32_t n = sh_get_le32(p + 8);
		if (n == 0 || n > MS_CHUNK_MAX || off > size || n > size - off) {
			ms_send_err(c, "GET out of range");
			return sh_fail(err, errlen, SH_EFORMAT,
				       "model GET from %s: %u bytes at %llu out of range", peer, n,
				       (unsigned long long)off);
		}
		if (!*buf && !(*buf = malloc(12 + MS_CHUNK_MAX)))
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory serving the model");
		sh_put_le64(*buf, off);
		sh_put_le32(*buf + 8, n);
		for (uint32_t done = 0; done < n;) {
			ssize_t r = pread(fd, *buf + 12 + done, n - done, (off_t)(off + done));
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				ms_send_err(c, "the model file changed or cannot be read");
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
		ms_err_text(t, sizeof t, p, len);
		return sh_fail(err, errlen, SH_ECLOSED, "model transfer: %s stopped: %s", peer, t);
	}
	default:
		ms_send_err(c, "unexpected message");
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
		ms_send_err(c, "the model file cannot be opened");
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
