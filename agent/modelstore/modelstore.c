/*
 * modelstore.c: which model this node holds (modelstore.h), on top of modelsync.h. A node started
 * with --model hashes its file once (cached by modelsync in the state directory) and announces the
 * hash in its NODE message; it also listens on a second port (any free one, announced as
 * "sync_port") where any member may fetch the file: each accepted connection runs the handshake and
 * modelsync_serve on its own detached thread. A node started without --model fetches the leader's
 * file (the hash the leader announced; when this node is itself the leader, the file of the
 * smallest member that has one): only the file's header at first, into a sparse slice file
 * (modelsync.h), enough to announce the hash and be planned; each session then fetches the bytes of
 * this rank's share before it computes (modelstore_ensure_share), so only the share travels and a
 * re-plan fetches only the difference. A slice node serves no one (it announces no sync port).
 *
 * Every start reads the whole file (the size-and-mtime cache is not trusted then: a disk can rot
 * a byte and keep the mtime), a cached copy in STATE_DIR/models included (modelsync_cached), and
 * a long-running node re-reads it every SHOAL_MODEL_VERIFY_S seconds (default 6 h) on a thread.
 * A fetched copy that no longer matches is deleted and fetched again; the node announces that it
 * has no model meanwhile, so the leader plans without it. A --model file that changed is the
 * user's: its new hash is announced (the leader then decides whether it still fits the plan).
 *
 * Invariant: path and hash change only on the loop's thread, when a fetch has finished and
 * verified the file or a re-check found it changed; the serving threads, the fetch, the re-check
 * and a session's share copy what they need at their start.
 */
#include "agent/modelstore/modelstore.h"
#include "agent/handshake.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SYNC_TIMEOUT_MS  15000 /* a silent peer ends a transfer after this */
#define SYNC_MAX_SERVERS 8
#define FETCH_RETRY_MS   3000
#define VERIFY_DEFAULT_S (6 * 3600)

struct verify {
	pthread_t th;
	char path[SH_SUBPATH_MAX], state_dir[SH_PATH_MAX];
	int slice;                   /* a slice: re-hash its batches (modelsync_slice_verify) */
	uint8_t hash[MS_HASH_BYTES]; /* the slice's model */
	uint64_t dropped;            /* slice bytes that no longer match */
	atomic_int done, cancel;
	int rc;
	uint8_t got[MS_HASH_BYTES];
	char err[256];
};

struct fetch {
	modelstore_t *ms; /* read only: keys, self, state dir */
	pthread_t th;
	char host[DISC_ADDR_MAX];
	int port;
	uint8_t want[MS_HASH_BYTES];
	atomic_int done;
	int rc;
	char path[SH_PATH_MAX];
	char err[256];
};

typedef struct sync_srv {
	modelstore_t *ms;
	int fd;
	char path[SH_SUBPATH_MAX];
	uint8_t hash[MS_HASH_BYTES];
} sync_srv_t;

struct modelstore {
	const char *state_dir;
	const tp_keys_t *keys;
	disc_id_t self;
	const char *path;           /* --model, or path_buf once fetched; NULL: none yet */
	char path_buf[SH_PATH_MAX]; /* a fetched slice's path */
	char hash[MS_HASH_HEX];     /* "" without --model until fetched */
	uint64_t size;
	int slice; /* 1: path is a slice file holding only the bytes of this node's shares
		    * (modelsync.h); it serves no one and fetches each new share's bytes from a
		    * holder of the whole file when a session starts */
	int sync_fd, sync_port;  /* model transfer listener */
	atomic_int sync_running; /* serving threads */
	struct fetch *fetch;     /* the running fetch, or NULL */
	int64_t fetch_retry_ms;
	struct verify *verify;  /* the running periodic re-hash, or NULL */
	int64_t verify_next_ms; /* when the next one starts */
	char news[200];         /* the transfer's news for /health */
	char event[512];        /* what the last tick did, for the dashboard's log ("": nothing) */
};

/* ---- serving the file ----------------------------------------------------------------------- */

static void *sync_srv_main(void *arg)
{
	sync_srv_t *s = arg;
	modelstore_t *ms = s->ms;
	tp_chan_t *c = NULL;
	char err[256];
	if (tp_chan_accept(&c, s->fd, ms->keys, ms->self.b, HANDSHAKE_MS, err, sizeof err) == 0) {
		int64_t t0 = now_ms();
		int rc = modelsync_serve(c, s->path, s->hash, 0, NULL, 0, SYNC_TIMEOUT_MS, err,
					 sizeof err);
		if (rc)
			LOG(LOG_WARN, "model transfer to %s: %s", tp_chan_peer_addr(c), err);
		else
			LOG(LOG_INFO, "model transfer to %s done in %lld ms", tp_chan_peer_addr(c),
			    (long long)(now_ms() - t0));
	}
	tp_chan_free(c);
	free(s);
	atomic_fetch_sub(&ms->sync_running, 1);
	return NULL;
}

void modelstore_accept(modelstore_t *ms)
{
	int fd;
	char peer[128];
	if (tp_accept(ms->sync_fd, &fd, peer, sizeof peer, 0, NULL, 0) != 0)
		return;
	uint8_t h[MS_HASH_BYTES];
	sync_srv_t *s = NULL;
	if (!ms->path || !ms->hash[0] || ms->slice ||
	    atomic_load(&ms->sync_running) >= SYNC_MAX_SERVERS || modelsync_unhex(h, ms->hash) ||
	    !(s = calloc(1, sizeof *s))) {
		close(fd); /* nothing to serve, or busy: the fetcher retries */
		return;
	}
	s->ms = ms;
	s->fd = fd;
	memcpy(s->hash, h, sizeof h);
	snprintf(s->path, sizeof s->path, "%s", ms->path);
	pthread_t t;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	atomic_fetch_add(&ms->sync_running, 1);
	if (pthread_create(&t, &at, sync_srv_main, s)) {
		atomic_fetch_sub(&ms->sync_running, 1);
		close(fd);
		free(s);
	}
	pthread_attr_destroy(&at);
}

/* ---- fetching it ---------------------------------------------------------------------------- */

static void *fetch_main(void *arg)
{
	struct fetch *f = arg;
	modelstore_t *ms = f->ms;
	tp_chan_t *c = NULL;
	/* a slice from an earlier run is re-hashed first: rotten batches are dropped here and
	 * fetched again below or when a share needs them (the size-and-mtime cache proves nothing)
	 */
	uint64_t held = 0, dropped = 0;
	if (modelsync_slice_verify(ms->state_dir, f->want, &held, &dropped, f->err,
				   sizeof f->err) == 0 &&
	    dropped)
		LOG(LOG_ERROR,
		    "model: %llu bytes of the slice changed on disk (they do not match their "
		    "hash): fetched again",
		    (unsigned long long)dropped);
	f->rc = tp_chan_connect(&c, f->host, f->port, ms->keys, ms->self.b, HANDSHAKE_MS, f->err,
				sizeof f->err);
	if (!f->rc) /* the header: enough to be planned; the share follows per session */
		f->rc = modelsync_fetch_slice(c, f->want, ms->state_dir, NULL, 0, f->path,
					      sizeof f->path, NULL, SYNC_TIMEOUT_MS, f->err,
					      sizeof f->err);
	tp_chan_free(c);
	atomic_store(&f->done, 1);
	return NULL;
}

/* A finished fetch: the header is here (the model is known from now on) or it failed. */
static int fetch_done(modelstore_t *ms, struct fetch *f, int64_t now)
{
	struct stat st;
	if (f->rc) {
		LOG(LOG_WARN, "model: fetching from the leader (%s) failed: %s; retrying", f->host,
		    f->err);
		snprintf(ms->event, sizeof ms->event, "fetching the model from %s failed: %.160s",
			 f->host, f->err);
		snprintf(ms->news, sizeof ms->news, "model transfer failed: %.160s", f->err);
		ms->fetch_retry_ms = now + FETCH_RETRY_MS;
		return 0;
	}
	if (stat(f->path, &st) != 0) {
		LOG(LOG_ERROR, "model: %s: %s", f->path, strerror(errno));
		ms->fetch_retry_ms = now + FETCH_RETRY_MS;
		return 0;
	}
	/* the holder's hash: the share's bytes are checked as they come */
	snprintf(ms->path_buf, sizeof ms->path_buf, "%s", f->path);
	modelsync_hex(ms->hash, f->want);
	ms->size = (uint64_t)st.st_size;
	ms->slice = 1;
	ms->path = ms->path_buf;
	LOG(LOG_INFO,
	    "model: %s holds the header of %.16s (%llu bytes in all); each share's bytes are "
	    "fetched when it is planned",
	    ms->path, ms->hash, (unsigned long long)ms->size);
	snprintf(ms->event, sizeof ms->event, "model %.16s header fetched from %s", ms->hash,
		 f->host);
	ms->news[0] = 0;
	return MODELSTORE_ANNOUNCE;
}

static void fetch_start(modelstore_t *ms, const modelstore_holder_t *h, int64_t now)
{
	uint8_t want[MS_HASH_BYTES];
	struct fetch *f;
	if (modelsync_unhex(want, h->hash) || !(f = calloc(1, sizeof *f)))
		return;
	f->ms = ms;
	snprintf(f->host, sizeof f->host, "%s", h->host);
	f->port = h->port;
	memcpy(f->want, want, sizeof want);
	atomic_init(&f->done, 0);
	if (pthread_create(&f->th, NULL, fetch_main, f)) {
		free(f);
		ms->fetch_retry_ms = now + FETCH_RETRY_MS;
		return;
	}
	ms->fetch = f;
	LOG(LOG_INFO, "model: fetching %.16s (%llu bytes) from %s:%d", h->hash,
	    (unsigned long long)h->size, h->host, h->port);
	snprintf(ms->event, sizeof ms->event, "fetching model %.16s from %s", h->hash, h->host);
	snprintf(ms->news, sizeof ms->news, "receiving the model from the leader");
}

/* ---- re-checking it ------------------------------------------------------------------------- */

static int64_t verify_period_ms(void)
{
	const char *s = getenv("SHOAL_MODEL_VERIFY_S");
	long v = s && *s ? strtol(s, NULL, 10) : VERIFY_DEFAULT_S;
	return (int64_t)(v > 0 ? v : VERIFY_DEFAULT_S) * 1000;
}

static void *verify_main(void *arg)
{
	struct verify *v = arg;
	uint64_t held;
	if (v->slice)
		v->rc = modelsync_slice_verify(v->state_dir, v->hash, &held, &v->dropped, v->err,
					       sizeof v->err);
	else
		v->rc = modelsync_verify_file(v->path, v->state_dir, &v->cancel, v->got, v->err,
					      sizeof v->err);
	atomic_store(&v->done, 1);
	return NULL;
}

/* What a finished re-check found. */
static int verify_done(modelstore_t *ms, struct verify *v)
{
	char hex[MS_HASH_HEX];
	modelsync_hex(hex, v->got);
	if (v->rc) {
		LOG(LOG_WARN, "model: re-check of %s failed: %s", v->path, v->err);
		return 0;
	}
	if (v->slice && v->dropped) {
		/* the session computes on the mapped bytes: end it, so that the next plan's session
		 * fetches the dropped batches before it computes again */
		LOG(LOG_ERROR,
		    "model: %llu bytes of the slice %s changed on disk: dropped, fetched again",
		    (unsigned long long)v->dropped, v->path);
		snprintf(ms->event, sizeof ms->event,
			 "%llu bytes of the model slice changed on disk: fetching them again",
			 (unsigned long long)v->dropped);
		return MODELSTORE_ROTTED;
	}
	if (v->slice || !ms->path || strcmp(ms->path, v->path) || !ms->hash[0] ||
	    !strcmp(hex, ms->hash)) {
		LOG(LOG_DEBUG, "model: %s re-checked, unchanged", v->path);
		return 0;
	}
	int fetched = ms->path == ms->path_buf;
	LOG(LOG_ERROR, "model: %s changed on disk (hash %.16s, was %.16s)%s", v->path, hex,
	    ms->hash, fetched ? ": deleted, fetching it again" : "");
	snprintf(ms->event, sizeof ms->event, "the model changed on disk%s",
		 fetched ? ": fetching it again" : "");
	if (fetched) {
		unlink(v->path);
		ms->path = NULL;
		ms->hash[0] = 0;
		snprintf(ms->news, sizeof ms->news,
			 "the model copy rotted on disk: fetching it again");
	} else {
		snprintf(ms->hash, sizeof ms->hash, "%s", hex);
	}
	return MODELSTORE_ANNOUNCE;
}

/* The periodic re-hash: starts one when due, acts on its result when it ends. */
static int verify_tick(modelstore_t *ms, int64_t now)
{
	struct verify *v = ms->verify;
	if (v && atomic_load(&v->done)) {
		pthread_join(v->th, NULL);
		ms->verify = NULL;
		ms->verify_next_ms = now + verify_period_ms();
		int news = verify_done(ms, v);
		free(v);
		return news;
	}
	if (v || !ms->path || !ms->hash[0])
		return 0;
	if (!ms->verify_next_ms) {
		ms->verify_next_ms = now + verify_period_ms();
		return 0;
	}
	if (now < ms->verify_next_ms || !(v = calloc(1, sizeof *v)))
		return 0;
	snprintf(v->path, sizeof v->path, "%s", ms->path);
	snprintf(v->state_dir, sizeof v->state_dir, "%s", ms->state_dir);
	v->slice = ms->slice && modelsync_unhex(v->hash, ms->hash) == 0;
	atomic_init(&v->done, 0);
	atomic_init(&v->cancel, 0);
	if (pthread_create(&v->th, NULL, verify_main, v)) {
		free(v);
		ms->verify_next_ms = now + verify_period_ms();
		return 0;
	}
	ms->verify = v;
	return 0;
}

int modelstore_tick(modelstore_t *ms, const modelstore_holder_t *holder, int64_t now)
{
	ms->event[0] = 0;
	int news = verify_tick(ms, now);
	struct fetch *f = ms->fetch;
	if (f && atomic_load(&f->done)) {
		pthread_join(f->th, NULL);
		ms->fetch = NULL;
		news |= fetch_done(ms, f, now);
		free(f);
	}
	if (!ms->hash[0] && !ms->fetch && now >= ms->fetch_retry_ms && holder)
		fetch_start(ms, holder, now);
	return news;
}

/* ---- a session's share ---------------------------------------------------------------------- */

void modelstore_share_of(const modelstore_t *ms, const modelstore_holder_t *h,
			 modelstore_share_t *sh)
{
	memset(sh, 0, sizeof *sh);
	snprintf(sh->state_dir, sizeof sh->state_dir, "%s", ms->state_dir);
	snprintf(sh->hash, sizeof sh->hash, "%s", ms->hash);
	snprintf(sh->model_path, sizeof sh->model_path, "%s", ms->path ? ms->path : "");
	sh->keys = ms->keys;
	memcpy(sh->node_id, ms->self.b, TP_NODE_ID_BYTES);
	if (h) {
		snprintf(sh->host, sizeof sh->host, "%s", h->host);
		sh->port = h->port;
	}
}

int modelstore_ensure_share(const modelstore_share_t *sh, const eng_dist_t *dist, int rank,
			    char *err, size_t errlen)
{
	eng_range_t *er = NULL;
	int n = 0;
	uint8_t want[MS_HASH_BYTES];
	if (modelsync_unhex(want, sh->hash))
		return sh_fail(err, errlen, SH_EINVAL, "no model hash");
	int rc = eng_shard_ranges(sh->model_path, dist, dist && dist->pipeline ? 0 : rank, &er, &n,
				  err, errlen);
	if (rc)
		return rc;
	ms_range_t *r = calloc((size_t)n + 1, sizeof *r);
	uint64_t share = 0, got = 0;
	for (int i = 0; r && i < n; i++) {
		r[i] = (ms_range_t){er[i].off, er[i].len, er[i].compact, 0};
		share += er[i].len;
	}
	free(er);
	if (!r)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	char path[SH_SUBPATH_MAX];
	/* what the slice already holds needs no peer */
	int64_t t0 = now_ms();
	rc = modelsync_fetch_slice(NULL, want, sh->state_dir, r, n, path, sizeof path, NULL,
				   SYNC_TIMEOUT_MS, err, errlen);
	if (rc == SH_ENOENT) {
		tp_chan_t *c = NULL;
		if (!sh->host[0] || !sh->port)
			rc = sh_fail(err, errlen, SH_ENOENT,
				     "no member holds the whole model to fetch this share from");
		else if (!(rc = tp_chan_connect(&c, sh->host, sh->port, sh->keys, sh->node_id,
						HANDSHAKE_MS, err, errlen)))
			rc = modelsync_fetch_slice(c, want, sh->state_dir, r, n, path, sizeof path,
						   &got, SYNC_TIMEOUT_MS, err, errlen);
		tp_chan_free(c);
	}
	if (!rc)
		LOG(LOG_INFO, "model: share of %.1f MB here; fetched %.1f MB from %s in %lld ms",
		    (double)share / 1e6, (double)got / 1e6, got ? sh->host : "no one",
		    (long long)(now_ms() - t0));
	free(r);
	return rc;
}

/* ---- life and reading ----------------------------------------------------------------------- */

modelstore_t *modelstore_new(const char *path, const char *state_dir, const tp_keys_t *keys,
			     const disc_id_t *self, char *err, size_t errlen)
{
	modelstore_t *ms = calloc(1, sizeof *ms);
	if (!ms) {
		sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		return NULL;
	}
	ms->state_dir = state_dir;
	ms->keys = keys;
	ms->self = *self;
	ms->path = path;
	ms->sync_fd = -1;
	atomic_init(&ms->sync_running, 0);
	if (path) {
		int64_t t0 = now_ms();
		uint8_t h[MS_HASH_BYTES];
		struct stat st;
		/* every byte, every start: the cache would trust a size and mtime a bad disk kept
		 */
		if (modelsync_verify_file(path, state_dir, NULL, h, err, errlen) ||
		    stat(path, &st) != 0)
			goto err;
		modelsync_hex(ms->hash, h);
		ms->size = (uint64_t)st.st_size;
		LOG(LOG_INFO, "model %s: %llu bytes, hash %.16s (%lld ms)", path,
		    (unsigned long long)ms->size, ms->hash, (long long)(now_ms() - t0));
	} else
		LOG(LOG_INFO, "agent: no --model: this node fetches the leader's model once a "
			      "leader is known");
	if (tp_listen(NULL, 0, &ms->sync_fd, &ms->sync_port, err, errlen))
		goto err;
	fcntl(ms->sync_fd, F_SETFL, fcntl(ms->sync_fd, F_GETFL) | O_NONBLOCK);
	return ms;
err:
	modelstore_free(ms);
	return NULL;
}

void modelstore_free(modelstore_t *ms)
{
	if (!ms)
		return;
	if (ms->verify) {
		atomic_store(&ms->verify->cancel, 1); /* ends within one read */
		pthread_join(ms->verify->th, NULL);
		free(ms->verify);
	}
	if (ms->fetch) {
		pthread_join(ms->fetch->th, NULL); /* bounded by the transfer's timeout */
		free(ms->fetch);
	}
	if (ms->sync_fd >= 0)
		close(ms->sync_fd);
	int64_t end = now_ms() + SYNC_TIMEOUT_MS;
	while (atomic_load(&ms->sync_running) > 0 && now_ms() < end)
		usleep(10000);
	free(ms);
}

int modelstore_fd(const modelstore_t *ms)
{
	return ms->sync_fd;
}

const char *modelstore_path(const modelstore_t *ms)
{
	return ms->path;
}

const char *modelstore_hash(const modelstore_t *ms)
{
	return ms->hash;
}

uint64_t modelstore_size(const modelstore_t *ms)
{
	return ms->size;
}

int modelstore_slice(const modelstore_t *ms)
{
	return ms->slice;
}

int modelstore_sync_port(const modelstore_t *ms)
{
	return ms->slice ? 0 : ms->sync_port; /* a slice holds only this node's share */
}

const char *modelstore_event(const modelstore_t *ms)
{
	return ms->event;
}

const char *modelstore_news(const modelstore_t *ms)
{
	return ms->news;
}
