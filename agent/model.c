/*
 * model.c: the agent's model availability, on top of modelsync.h. A node started with --model
 * hashes its file once (cached by modelsync in the state directory) and announces the hash in its
 * NODE message; it also listens on a second port (any free one, announced as "sync_port") where
 * any member may fetch the file: each accepted connection runs the handshake and modelsync_serve
 * on its own detached thread. A node started without --model fetches the leader's file (the hash
 * the leader announced; when this node is itself the leader, the file of the smallest member that
 * has one): only the file's header at first, into a sparse slice file (modelsync.h), enough to
 * announce the hash and be planned; each session then fetches the bytes of this rank's share
 * before it computes (agent_model_ensure_share), so only the share travels and a re-plan fetches
 * only the difference. A slice node serves no one (it announces no sync port).
 *
 * Every start reads the whole file (the size-and-mtime cache is not trusted then: a disk can rot
 * a byte and keep the mtime), a cached copy in STATE_DIR/models included (modelsync_cached), and
 * a long-running node re-reads it every SHOAL_MODEL_VERIFY_S seconds (default 6 h) on a thread.
 * A fetched copy that no longer matches is deleted and fetched again; the node announces that it
 * has no model meanwhile, so the leader plans without it. A --model file that changed is the
 * user's: its new hash is announced (the leader then decides whether it still fits the plan).
 *
 * Invariant: a->cfg.model and a->model_hash change only on the agent's thread, when a fetch
 * has finished and verified the file or a re-check found it changed; the serving threads copy
 * what they need at their start.
 */
#include "agent/agent_int.h"
#include "agent/modelsync.h"
#include "common/common.h"
#include "infer/infer.h"

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
	char path[4200], state_dir[4096];
	int slice;                   /* a slice: re-hash its batches (modelsync_slice_verify) */
	uint8_t hash[MS_HASH_BYTES]; /* the slice's model */
	uint64_t dropped;            /* slice bytes that no longer match */
	atomic_int done, cancel;
	int rc;
	uint8_t got[MS_HASH_BYTES];
	char err[256];
};

struct fetch {
	agent_t *a; /* read only: keys, self, state dir */
	pthread_t th;
	char host[DISC_ADDR_MAX];
	int port;
	uint8_t want[MS_HASH_BYTES];
	atomic_int done;
	int rc;
	char path[4200];
	char err[256];
};

typedef struct sync_srv {
	agent_t *a;
	int fd;
	char path[4096];
	uint8_t hash[MS_HASH_BYTES];
} sync_srv_t;

int agent_model_hash(const char *path, const char *state_dir, char hex[AGENT_HASH_HEX],
		     uint64_t *size, char *err, size_t errlen)
{
	uint8_t h[MS_HASH_BYTES];
	struct stat st;
	if (stat(path, &st) != 0)
		return sh_fail(err, errlen, SH_ENOENT, "%s: %s", path, strerror(errno));
	int rc = modelsync_hash_file(path, state_dir, h, err, errlen);
	if (rc)
		return rc;
	modelsync_hex(hex, h);
	*size = (uint64_t)st.st_size;
	return 0;
}

/* ---- serving the file ----------------------------------------------------------------------- */

static void *sync_srv_main(void *arg)
{
	sync_srv_t *s = arg;
	agent_t *a = s->a;
	tp_chan_t *c = NULL;
	char err[256];
	if (tp_chan_accept(&c, s->fd, &a->keys, a->self.b, HANDSHAKE_MS, err, sizeof err) == 0) {
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
	atomic_fetch_sub(&a->sync_running, 1);
	return NULL;
}

void agent_sync_accept(agent_t *a)
{
	int fd;
	char peer[128];
	if (tp_accept(a->sync_fd, &fd, peer, sizeof peer, 0, NULL, 0) != 0)
		return;
	uint8_t h[MS_HASH_BYTES];
	sync_srv_t *s = NULL;
	if (!a->model_hash[0] || a->model_slice ||
	    atomic_load(&a->sync_running) >= SYNC_MAX_SERVERS ||
	    modelsync_unhex(h, a->model_hash) || !(s = calloc(1, sizeof *s))) {
		close(fd); /* nothing to serve, or busy: the fetcher retries */
		return;
	}
	s->a = a;
	s->fd = fd;
	memcpy(s->hash, h, sizeof h);
	snprintf(s->path, sizeof s->path, "%s", a->cfg.model);
	pthread_t t;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	atomic_fetch_add(&a->sync_running, 1);
	if (pthread_create(&t, &at, sync_srv_main, s)) {
		atomic_fetch_sub(&a->sync_running, 1);
		close(fd);
		free(s);
	}
	pthread_attr_destroy(&at);
}

/* ---- fetching it ---------------------------------------------------------------------------- */

static void *fetch_main(void *arg)
{
	struct fetch *f = arg;
	tp_chan_t *c = NULL;
	/* a slice from an earlier run is re-hashed first: rotten batches are dropped here and
	 * fetched again below or when a share needs them (the size-and-mtime cache proves nothing)
	 */
	uint64_t held = 0, dropped = 0;
	if (modelsync_slice_verify(f->a->cfg.state_dir, f->want, &held, &dropped, f->err,
				   sizeof f->err) == 0 &&
	    dropped)
		LOG(LOG_ERROR,
		    "model: %llu bytes of the slice changed on disk (they do not match their "
		    "hash): "
		    "fetched again",
		    (unsigned long long)dropped);
	f->rc = tp_chan_connect(&c, f->host, f->port, &f->a->keys, f->a->self.b, HANDSHAKE_MS,
				f->err, sizeof f->err);
	if (!f->rc) /* the header: enough to be planned; the share follows per session */
		f->rc = modelsync_fetch_slice(c, f->want, f->a->cfg.state_dir, NULL, 0, f->path,
					      sizeof f->path, NULL, SYNC_TIMEOUT_MS, f->err,
					      sizeof f->err);
	tp_chan_free(c);
	atomic_store(&f->done, 1);
	return NULL;
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

/* The periodic re-hash: starts one when due, acts on its result when it ends. */
static void verify_tick(agent_t *a, int64_t now)
{
	struct verify *v = a->verify;
	if (v && atomic_load(&v->done)) {
		pthread_join(v->th, NULL);
		a->verify = NULL;
		a->verify_next_ms = now + verify_period_ms();
		char hex[MS_HASH_HEX];
		modelsync_hex(hex, v->got);
		if (v->rc) {
			LOG(LOG_WARN, "model: re-check of %s failed: %s", v->path, v->err);
		} else if (v->slice && v->dropped) {
			/* the session computes on the mapped bytes: end it, so that the next plan's
			 * session fetches the dropped batches before it computes again */
			LOG(LOG_ERROR,
			    "model: %llu bytes of the slice %s changed on disk: dropped, fetched "
			    "again",
			    (unsigned long long)v->dropped, v->path);
			web_event(a->web, "model",
				  "%llu bytes of the model slice changed on disk: "
				  "fetching them again",
				  (unsigned long long)v->dropped);
			if (a->sess)
				session_fail(a->sess, "the model's slice changed on disk");
		} else if (!v->slice && a->cfg.model && !strcmp(a->cfg.model, v->path) &&
			   a->model_hash[0] && strcmp(hex, a->model_hash)) {
			int fetched = a->cfg.model == a->model_path;
			LOG(LOG_ERROR, "model: %s changed on disk (hash %.16s, was %.16s)%s",
			    v->path, hex, a->model_hash,
			    fetched ? ": deleted, fetching it again" : "");
			web_event(a->web, "model", "the model changed on disk%s",
				  fetched ? ": fetching it again" : "");
			if (fetched) {
				unlink(v->path);
				a->cfg.model = NULL;
				a->model_hash[0] = 0;
				snprintf(a->why, sizeof a->why,
					 "the model copy rotted on disk: "
					 "fetching it again");
			} else {
				snprintf(a->model_hash, sizeof a->model_hash, "%s", hex);
			}
			for (int i = 0; i < a->nconns; i++)
				agent_send_node(a, &a->conns[i]);
		} else {
			LOG(LOG_DEBUG, "model: %s re-checked, unchanged", v->path);
		}
		free(v);
		return;
	}
	if (v || !a->cfg.model || !a->model_hash[0])
		return;
	if (!a->verify_next_ms) {
		a->verify_next_ms = now + verify_period_ms();
		return;
	}
	if (now < a->verify_next_ms || !(v = calloc(1, sizeof *v)))
		return;
	snprintf(v->path, sizeof v->path, "%s", a->cfg.model);
	snprintf(v->state_dir, sizeof v->state_dir, "%s", a->cfg.state_dir);
	v->slice = a->model_slice && modelsync_unhex(v->hash, a->model_hash) == 0;
	atomic_init(&v->done, 0);
	atomic_init(&v->cancel, 0);
	if (pthread_create(&v->th, NULL, verify_main, v)) {
		free(v);
		a->verify_next_ms = now + verify_period_ms();
		return;
	}
	a->verify = v;
}

/* Once per loop turn: a node without a model fetches the leader's; the file is re-checked. */
void agent_model_tick(agent_t *a, int64_t now)
{
	verify_tick(a, now);
	struct fetch *f = a->fetch;
	if (f && atomic_load(&f->done)) {
		pthread_join(f->th, NULL);
		a->fetch = NULL;
		if (f->rc) {
			LOG(LOG_WARN, "model: fetching from the leader (%s) failed: %s; retrying",
			    f->host, f->err);
			web_event(a->web, "model", "fetching the model from %s failed: %s", f->host,
				  f->err);
			snprintf(a->why, sizeof a->why, "model transfer failed: %.160s", f->err);
			a->fetch_retry_ms = now + FETCH_RETRY_MS;
		} else {
			struct stat st;
			snprintf(a->model_path, sizeof a->model_path, "%s", f->path);
			if (stat(a->model_path, &st) != 0) {
				LOG(LOG_ERROR, "model: %s: %s", f->path, strerror(errno));
				a->fetch_retry_ms = now + FETCH_RETRY_MS;
			} else {
				/* the holder's hash: the share's bytes are checked as they come */
				modelsync_hex(a->model_hash, f->want);
				a->model_size = (uint64_t)st.st_size;
				a->model_slice = 1;
				a->cfg.model = a->model_path;
				LOG(LOG_INFO,
				    "model: %s holds the header of %.16s (%llu bytes in all); each "
				    "share's bytes are fetched when it is planned",
				    a->model_path, a->model_hash,
				    (unsigned long long)a->model_size);
				a->why[0] = 0;
				web_event(a->web, "model", "model %.16s header fetched from %s",
					  a->model_hash, f->host);
				for (int i = 0; i < a->nconns; i++)
					agent_send_node(a, &a->conns[i]);
			}
		}
		free(f);
	}
	if (a->model_hash[0] || a->fetch || now < a->fetch_retry_ms)
		return;
	conn_t *c = agent_model_holder(a);
	uint8_t want[MS_HASH_BYTES];
	if (!c || modelsync_unhex(want, c->desc.model_hash))
		return;
	f = calloc(1, sizeof *f);
	if (!f)
		return;
	f->a = a;
	snprintf(f->host, sizeof f->host, "%s", c->addr);
	f->port = c->desc.sync_port;
	memcpy(f->want, want, sizeof want);
	atomic_init(&f->done, 0);
	if (pthread_create(&f->th, NULL, fetch_main, f)) {
		free(f);
		a->fetch_retry_ms = now + FETCH_RETRY_MS;
		return;
	}
	a->fetch = f;
	LOG(LOG_INFO, "model: fetching %.16s (%llu bytes) from %s:%d", c->desc.model_hash,
	    (unsigned long long)c->desc.model_size, c->addr, c->desc.sync_port);
	web_event(a->web, "model", "fetching model %.16s from %s", c->desc.model_hash, c->addr);
	snprintf(a->why, sizeof a->why, "receiving the model from the leader");
}

conn_t *agent_model_holder(agent_t *a)
{
	disc_id_t l;
	conn_t *c = NULL;
	if (!core_planner(a->core, &l)) /* the majority model's smallest holder (core.c) */
		return NULL;
	/* the planner's model is the one served; a holder of it that is not a slice serves it */
	const char *want = a->model_hash;
	if (disc_id_cmp(&l, &a->self)) {
		conn_t *lc = agent_conn_find(a, &l);
		if (!lc || !lc->desc.have || !lc->desc.model_hash[0])
			return NULL;
		if (lc->desc.sync_port)
			return lc;
		want = lc->desc.model_hash;
	}
	for (int i = 0; i < a->nconns; i++) {
		conn_t *x = &a->conns[i];
		if (x->desc.have && x->desc.model_hash[0] && x->desc.sync_port &&
		    (!want[0] || !strcmp(x->desc.model_hash, want)) &&
		    (!c || disc_id_cmp(&x->id, &c->id) < 0))
			c = x;
	}
	return c;
}

int agent_model_ensure_share(agent_t *a, const eng_dist_t *dist, int rank, const char *host,
			     int port, char *err, size_t errlen)
{
	eng_range_t *er = NULL;
	int n = 0;
	uint8_t want[MS_HASH_BYTES];
	if (modelsync_unhex(want, a->model_hash))
		return sh_fail(err, errlen, SH_EINVAL, "no model hash");
	int rc = eng_shard_ranges(a->cfg.model, dist, dist && dist->pipeline ? 0 : rank, &er, &n,
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
	char path[4200];
	/* what the slice already holds needs no peer */
	int64_t t0 = now_ms();
	rc = modelsync_fetch_slice(NULL, want, a->cfg.state_dir, r, n, path, sizeof path, NULL,
				   SYNC_TIMEOUT_MS, err, errlen);
	if (rc == SH_ENOENT) {
		tp_chan_t *c = NULL;
		if (!host || !port)
			rc = sh_fail(err, errlen, SH_ENOENT,
				     "no member holds the whole model to fetch this share from");
		else if (!(rc = tp_chan_connect(&c, host, port, &a->keys, a->self.b, HANDSHAKE_MS,
						err, errlen)))
			rc = modelsync_fetch_slice(c, want, a->cfg.state_dir, r, n, path,
						   sizeof path, &got, SYNC_TIMEOUT_MS, err, errlen);
		tp_chan_free(c);
	}
	if (!rc)
		LOG(LOG_INFO, "model: share of %.1f MB here; fetched %.1f MB from %s in %lld ms",
		    (double)share / 1e6, (double)got / 1e6, got ? host : "no one",
		    (long long)(now_ms() - t0));
	free(r);
	return rc;
}

int agent_model_init(agent_t *a, char *err, size_t errlen)
{
	atomic_init(&a->sync_running, 0);
	atomic_init(&a->fetch_permille, 0);
	a->sync_fd = -1;
	if (a->cfg.model) {
		int64_t t0 = now_ms();
		uint8_t h[MS_HASH_BYTES];
		struct stat st;
		/* every byte, every start: the cache would trust a size and mtime a bad disk kept
		 */
		if (modelsync_verify_file(a->cfg.model, a->cfg.state_dir, NULL, h, err, errlen) ||
		    stat(a->cfg.model, &st) != 0)
			return SH_EIO;
		modelsync_hex(a->model_hash, h);
		a->model_size = (uint64_t)st.st_size;
		LOG(LOG_INFO, "model %s: %llu bytes, hash %.16s (%lld ms)", a->cfg.model,
		    (unsigned long long)a->model_size, a->model_hash, (long long)(now_ms() - t0));
	} else
		LOG(LOG_INFO, "agent: no --model: this node fetches the leader's model once a "
			      "leader is known");
	int rc = tp_listen(NULL, 0, &a->sync_fd, &a->sync_port, err, errlen);
	if (!rc)
		fcntl(a->sync_fd, F_SETFL, fcntl(a->sync_fd, F_GETFL) | O_NONBLOCK);
	return rc;
}

void agent_model_free(agent_t *a)
{
	if (a->verify) {
		atomic_store(&a->verify->cancel, 1); /* ends within one read */
		pthread_join(a->verify->th, NULL);
		free(a->verify);
		a->verify = NULL;
	}
	if (a->fetch) {
		pthread_join(a->fetch->th, NULL); /* bounded by the transfer's timeout */
		free(a->fetch);
		a->fetch = NULL;
	}
	if (a->sync_fd >= 0)
		close(a->sync_fd);
	a->sync_fd = -1;
	int64_t end = now_ms() + SYNC_TIMEOUT_MS;
	while (atomic_load(&a->sync_running) > 0 && now_ms() < end)
		usleep(10000);
}
