/*
 * modelsync_slice.c: a slice of the model (modelsync.h): fetching the byte ranges a share reads
 * into the sparse slice file and its sidecar, and re-hashing what the index records.
 *
 * Invariant: the index never names bytes that are not on disk and hashed: a batch enters it only
 * after its bytes were written and fsynced (ms_sidx_store writes the index last).
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

#include "infer/infer.h"

#define SLICE_BATCH   (8u << 20) /* bytes hashed together in one index entry */
#define SLICE_WINDOW  64         /* GETs outstanding: a slice is often thousands of short rows */
#define HEADER_PREFIX (1u << 20) /* first guess of the header's size; grows by 4x */

typedef struct sfetch {
	tp_chan_t *c;
	const uint8_t *want;
	const char *peer;
	int started, timeout_ms;
	uint64_t total;
	uint32_t chunk;
	int fd, side_fd;   /* the slice file and its sidecar */
	uint64_t side_end; /* where the next compact bytes go */
	ms_sidx_t *x;      /* the index, grown batch by batch */
	ms_sbatch_t cur;   /* the batch being written */
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
	if ((rc = ms_recv_msg(s->c, &type, &p, &len, s->timeout_ms, s->peer, s->err, s->errlen)))
		return rc;
	if (type != MS_MSG_INFO || len != 48 || sodium_memcmp(p, s->want, MS_HASH_BYTES) != 0)
		return sh_fail(s->err, s->errlen, SH_EFORMAT,
			       "model transfer: %s did not offer the model asked for", s->peer);
	s->total = sh_get_le64(p + 32);
	s->chunk = sh_get_le32(p + 40);
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
	ms_sbatch_t *nb = realloc(s->x->b, (size_t)(s->x->n + 1) * sizeof *nb);
	if (!nb)
		return sh_fail(s->err, s->errlen, SH_ENOMEM, "out of memory");
	s->x->b = nb;
	s->x->b[s->x->n++] = s->cur;
	s->cur = (ms_sbatch_t){.n = 0, .r = NULL};
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
			sh_put_le64(g, at);
			sh_put_le32(g + 8, len);
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
		if ((rc = ms_recv_msg(s->c, &type, &p, &len, s->timeout_ms, s->peer, s->err,
				      s->errlen)))
			return rc;
		if (type != MS_MSG_DATA || len < 12 || sh_get_le64(p) != q[head].off ||
		    sh_get_le32(p + 8) != q[head].len || len - 12 != q[head].len)
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
		if (ms_range_add(&s->cur.r, &s->cur.n, piece))
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
		char sp[SH_SUBPATH_MAX];
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
	char path[SH_PATH_MAX], idxp[SH_SUBPATH_MAX], dir[SH_SUBPATH_MAX];
	if (modelsync_slice_path(state_dir, want, path, sizeof path))
		return sh_fail(err, errlen, SH_EINVAL, "state directory path too long");
	snprintf(idxp, sizeof idxp, "%s.idx", path);
	snprintf(dir, sizeof dir, "%s/models", state_dir);
	int rc = mkdir_p(dir, err, errlen);
	if (rc)
		return rc;
	ms_sidx_t x;
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
	if (ms_sidx_load(idxp, &x) != 0) { /* none, or unreadable: start afresh */
		char sp[SH_SUBPATH_MAX];
		unlink(path);
		snprintf(sp, sizeof sp, "%s.cols", path);
		unlink(sp);
		memset(&x, 0, sizeof x);
	}
	if ((rc = ms_sidx_held(&x, &held, &nh)))
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
			if (ms_range_add(&need, &nn, (ms_range_t){0, MIN(prefix, s.total), 0, 0}))
				goto nomem;
		} else {
			for (int i = 0; i < n; i++)
				if (ms_range_add(&need, &nn,
						 (ms_range_t){r[i].off, r[i].len, r[i].compact, 0}))
					goto nomem;
			nn = ms_ranges_norm(need, nn);
		}
		free(miss);
		if ((rc = ms_ranges_sub(need, nn, held, nh, &miss, &nm)))
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
				if (ms_range_add(&held, &nh, miss[i]))
					goto nomem;
			nh = ms_ranges_norm(held, nh);
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
		     (rc = ms_sidx_store(path, &x, err, errlen)))) {
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
		ms_sidx_store(path, &x, NULL, 0);
	free(s.cur.r);
	if (s.side_fd >= 0)
		close(s.side_fd);
	if (s.fd >= 0)
		close(s.fd);
	free(held);
	free(need);
	free(miss);
	ms_sidx_free(&x);
	return rc;
}

int modelsync_slice_verify(const char *state_dir, const uint8_t hash[MS_HASH_BYTES], uint64_t *held,
			   uint64_t *dropped, char *err, size_t errlen)
{
	char path[SH_PATH_MAX], idxp[SH_SUBPATH_MAX], sp[SH_SUBPATH_MAX];
	*held = 0;
	if (dropped)
		*dropped = 0;
	if (modelsync_slice_path(state_dir, hash, path, sizeof path))
		return sh_fail(err, errlen, SH_EINVAL, "state directory path too long");
	snprintf(idxp, sizeof idxp, "%s.idx", path);
	snprintf(sp, sizeof sp, "%s.cols", path);
	ms_sidx_t x;
	if (ms_sidx_load(idxp, &x) != 0)
		return sh_fail(err, errlen, SH_ENOENT, "no slice of this model");
	int fd = open(path, O_RDONLY | O_CLOEXEC), sfd = open(sp, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (sfd >= 0)
			close(sfd);
		ms_sidx_free(&x);
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
		rc = ms_sidx_store(path, &x, err, errlen);
	}
end:
	free(buf);
	close(fd);
	if (sfd >= 0)
		close(sfd);
	ms_sidx_free(&x);
	return rc;
}
