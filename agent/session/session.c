/*
 * session.c: a plan's session on this node (session.h).
 *
 * A session runs on its own thread: it forms the tensor-parallel group of the plan (rank order,
 * ring addresses and ports from the plan; one rank alone needs no group), opens the engine with
 * this rank's share, and then on rank 0 attaches the engine to the web server until it is told to
 * stop, or on the other ranks runs the worker loop until rank 0 stops it or the group fails.
 * session_stop (from the agent's thread) sets the stop flag and aborts the group
 * (tp_group_abort: shuts its sockets down), so every wait inside the session ends at once; the
 * thread then detaches the engine from the web server (which keeps every accepted request,
 * running ones with their state, for the next plan's engine: web_set_engine), frees the engine
 * and the group, and sets the phase to DONE.
 *
 * Invariant: only the session's thread touches its engine and group pointers' contents; the
 * agent's thread reads only `phase` (atomic) and, once DONE, `err` and `stalled`; the group
 * pointer is published under `mu` so that session_stop can abort it.
 */
#include "agent/session/session.h"
#include "common/common.h"
#include "infer/infer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GROUP_FORM_MS 10000 /* every rank must show up within this after a plan */

struct session {
	session_cfg_t cfg; /* its strings copied below */
	char model_path[SH_PATH_MAX];
	char kv_type[16];
	char spec[16];
	char draft_model[SH_PATH_MAX];
	pthread_t th;
	int started;
	int rank, world, ctx;
	int q8_wire; /* the plan's 8-bit all-reduces (plan_q8_wire) */
	uint64_t tag;
	char hosts[TP_MAX_WORLD][PLAN_IP_MAX];
	const char *host_ptrs[TP_MAX_WORLD];
	int ports[TP_MAX_WORLD];
	uint8_t peer_ids[TP_MAX_WORLD][TP_NODE_ID_BYTES];
	eng_dist_t dist;
	char rdma_path[SH_SUBPATH_MAX];
	char hash[20];
	atomic_int phase;
	atomic_int cancel; /* set by session_stop: forming gives up */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stop;          /* under mu */
	char fail[160];    /* under mu: why session_fail ended it ("" = a plain stop) */
	tp_group_t *group; /* under mu (published for session_stop) */
	eng_t *worker;     /* under mu: a worker rank's engine while eng_worker_run runs */
	char err[256];
	int stalled; /* once DONE: the rank whose silence broke the group, or -1 */
};

static int stopping(session_t *s)
{
	pthread_mutex_lock(&s->mu);
	int st = s->stop;
	pthread_mutex_unlock(&s->mu);
	return st;
}

/* Rank 0's engine serves the API from now on (the web server may be missing: no API here). The
 * requests the previous plan's engine left (suspended with their state, or queued) go on on this
 * one first: the clients saw a pause (web_set_engine). */
static void session_attach(session_t *s, eng_t *e)
{
	web_t *w = s->cfg.web;
	if (w) {
		web_set_rank_count(w, s->world);
		for (int r = 0; r < s->world; r++)
			web_set_rank_health(w, r, 1);
		web_set_engine(w, e);
	}
	if (s->cfg.group_broken)
		atomic_store(s->cfg.group_broken, 0); /* a late word about an older group */
}

/* The group is aborted: a step in flight fails and hands back its sequences' state, and the web
 * server keeps them (and the queued requests) for the next plan's engine; only the engine is
 * freed. */
static void session_detach(session_t *s)
{
	if (s->cfg.web)
		web_set_engine(s->cfg.web, NULL);
}

static void *session_main(void *arg)
{
	session_t *s = arg;
	const session_cfg_t *c = &s->cfg;
	tp_group_t *g = NULL;
	eng_t *e = NULL;
	char err[256] = "";
	int64_t t0 = now_ms();
	if (c->exec) { /* --exec: the command is the engine (exec.c); nothing to load */
		atomic_store(&s->phase, SESSION_READY);
		pthread_mutex_lock(&s->mu);
		while (!s->stop)
			pthread_cond_wait(&s->cv, &s->mu);
		pthread_mutex_unlock(&s->mu);
		goto done;
	}
	/* a slice node brings its share's bytes in before it joins the group (the others wait for
	 * it up to GROUP_FORM_MS: a share that takes longer to arrive fails this plan, and the next
	 * plan finds the bytes already here) */
	if (c->slice && modelstore_ensure_share(&c->share, s->world > 1 ? &s->dist : NULL, s->rank,
						err, sizeof err))
		goto done;
	if (s->world > 1) {
		tp_group_cfg_t gc = {.rank = s->rank,
				     .world = s->world,
				     .hosts = s->host_ptrs,
				     .ports = s->ports,
				     .listen_fd = -1,
				     .tag = s->tag,
				     .keys = c->keys,
				     .node_id = c->node_id,
				     .peer_ids = (const uint8_t(*)[TP_NODE_ID_BYTES])s->peer_ids,
				     .timeout_ms = GROUP_FORM_MS,
				     .rdma_devices = s->rdma_path,
				     .cancel = &s->cancel};
		/* a peer whose previous plan's group still holds its port says so (SH_EBUSY): try
		 * again while the forming window lasts */
		int rc;
		while ((rc = tp_group_new(&g, &gc, err, sizeof err))) {
			if (rc != SH_EBUSY || atomic_load(&s->cancel) ||
			    now_ms() - t0 > GROUP_FORM_MS - 500)
				goto done;
			usleep(100 * 1000);
		}
		pthread_mutex_lock(&s->mu);
		s->group = g;
		int st = s->stop;
		pthread_mutex_unlock(&s->mu);
		if (st)
			goto done;
		LOG(LOG_INFO, "plan %s: group of %d formed in %lld ms (rank %d)", s->hash, s->world,
		    (long long)(now_ms() - t0), s->rank);
		if (s->q8_wire && tp_group_set_q8(g, 1) == 0)
			LOG(LOG_INFO, "plan %s: 8-bit all-reduces (the plan's q8 wire)", s->hash);
		s->dist.group = g;
	}
	atomic_store(&s->phase, SESSION_LOADING);
	eng_opts_t o = {.model_path = s->model_path,
			.threads = c->threads,
			.ctx = s->ctx,
			.kv_type = s->kv_type[0] ? s->kv_type : NULL,
			.dist = s->world > 1 ? &s->dist : NULL,
			.parallel = c->parallel};
	if (s->rank == 0) { /* the draft runs where tokens are sampled; the others verify */
		o.spec = s->spec[0] ? s->spec : NULL;
		o.draft_model = s->draft_model[0] ? s->draft_model : NULL;
		o.draft_max = c->draft_max;
	}
	if (eng_open(&e, &o, err, sizeof err))
		goto done;
	LOG(LOG_INFO, "plan %s: rank %d of %d loaded in %lld ms", s->hash, s->rank, s->world,
	    (long long)(now_ms() - t0));
	if (stopping(s))
		goto done;
	if (s->rank == 0) {
		session_attach(s, e);
		atomic_store(&s->phase, SESSION_READY);
		/* until told to stop, or until a request meets a broken group (a rank lost or
		 * silent while its node still answers the control channel): the session then ends
		 * with an error, which makes the leader re-plan (the core) instead of serving 503s
		 */
		pthread_mutex_lock(&s->mu);
		while (!s->stop) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 200 * 1000000L;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&s->cv, &s->mu, &ts);
			if (g && tp_group_check(g, err, sizeof err))
				break;
			if (s->world > 1 && c->group_broken &&
			    atomic_exchange(c->group_broken, 0)) {
				snprintf(err, sizeof err,
					 "the group broke: a rank stopped answering");
				break;
			}
		}
		pthread_mutex_unlock(&s->mu);
		session_detach(s);
	} else {
		pthread_mutex_lock(&s->mu);
		s->worker = e;
		pthread_mutex_unlock(&s->mu);
		atomic_store(&s->phase, SESSION_READY);
		if (eng_worker_run(e, err, sizeof err) == 0)
			err[0] = 0;
		else if (stopping(s))
			err[0] = 0; /* our own abort */
		pthread_mutex_lock(&s->mu);
		s->worker = NULL;
		pthread_mutex_unlock(&s->mu);
	}
done:
	if (err[0] && stopping(s))
		err[0] = 0;
	pthread_mutex_lock(&s->mu);
	if (s->fail[0]) /* ended on purpose, but as a failure the core must re-plan around */
		snprintf(err, sizeof err, "%s", s->fail);
	pthread_mutex_unlock(&s->mu);
	eng_free(e);
	pthread_mutex_lock(&s->mu);
	s->group = NULL;
	pthread_mutex_unlock(&s->mu);
	s->stalled = err[0] ? tp_group_stalled_rank(g) : -1; /* transport.h: a value, not text */
	tp_group_free(g);
	snprintf(s->err, sizeof s->err, "%s", err);
	atomic_store(&s->phase, SESSION_DONE);
	return NULL;
}

session_t *session_start(const session_cfg_t *cfg, const plan_t *p, int rank, char *err,
			 size_t errlen)
{
	int n = plan_n_ranks(p);
	if (rank < 0 || rank >= n || n > TP_MAX_WORLD) {
		sh_fail(err, errlen, SH_EINVAL, "rank %d of %d", rank, n);
		return NULL;
	}
	if (!cfg->model_path) {
		sh_fail(err, errlen, SH_EINVAL, "no model file on this node");
		return NULL;
	}
	session_t *s = calloc(1, sizeof *s);
	if (!s) {
		sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		return NULL;
	}
	s->cfg = *cfg;
	snprintf(s->model_path, sizeof s->model_path, "%s", cfg->model_path);
	snprintf(s->kv_type, sizeof s->kv_type, "%s", cfg->kv_type ? cfg->kv_type : "");
	s->cfg.model_path = s->model_path;
	s->cfg.kv_type = NULL;
	snprintf(s->spec, sizeof s->spec, "%s", cfg->spec ? cfg->spec : "");
	snprintf(s->draft_model, sizeof s->draft_model, "%s",
		 cfg->draft_model ? cfg->draft_model : "");
	s->cfg.spec = s->cfg.draft_model = NULL;
	s->cfg.state_dir = NULL; /* used below only */
	s->stalled = -1;
	s->rank = rank;
	s->world = n;
	s->ctx = plan_ctx(p);
	s->tag = plan_epoch(p);
	s->q8_wire = plan_q8_wire(p);
	snprintf(s->hash, sizeof s->hash, "%s", plan_hash(p));
	for (int r = 0; r < n; r++) {
		const plan_rank_t *pr = plan_rank(p, r);
		snprintf(s->hosts[r], PLAN_IP_MAX, "%s", pr->ip);
		s->host_ptrs[r] = s->hosts[r];
		s->ports[r] = pr->port;
		disc_id_t id;
		if (disc_id_parse(pr->node_id, &id) == 0)
			memcpy(s->peer_ids[r], id.b, TP_NODE_ID_BYTES);
	}
	const plan_rank_t *me = plan_rank(p, rank);
	s->dist = (eng_dist_t){.pipeline = plan_strategy(p) == PLAN_PIPELINE,
			       .step_timeout_ms = cfg->step_timeout_ms,
			       .has_ranges = 1,
			       .q0 = me->q0,
			       .q1 = me->q1,
			       .kv0 = me->kv0,
			       .kv1 = me->kv1,
			       .ffn0 = me->ffn0,
			       .ffn1 = me->ffn1,
			       .layer0 = me->layer0,
			       .layer1 = me->layer1,
			       .exp0 = me->exp0,
			       .exp1 = me->exp1,
			       .shx0 = me->shx0,
			       .shx1 = me->shx1,
			       .stage0 = me->stage0,
			       .stage1 = me->stage1};
	snprintf(s->rdma_path, sizeof s->rdma_path, "%s/rdma-devices.json", cfg->state_dir);
	atomic_init(&s->phase, SESSION_FORMING);
	atomic_init(&s->cancel, 0);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	if (pthread_create(&s->th, NULL, session_main, s)) {
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->cv);
		free(s);
		sh_fail(err, errlen, SH_EIO, "cannot start the session thread");
		return NULL;
	}
	s->started = 1;
	return s;
}

int session_worker_stats(session_t *s, eng_comm_t *out)
{
	int rc = -1;
	pthread_mutex_lock(&s->mu);
	if (s->worker) {
		eng_worker_comm_stats(s->worker, out);
		rc = 0;
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int session_phase(session_t *s)
{
	return atomic_load(&s->phase);
}

const char *session_error(session_t *s)
{
	return atomic_load(&s->phase) == SESSION_DONE ? s->err : "";
}

int session_stalled_rank(session_t *s)
{
	return atomic_load(&s->phase) == SESSION_DONE ? s->stalled : -1;
}

void session_stop(session_t *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	if (!s->stop)
		LOG(LOG_INFO, "plan %s: stopping this node's session", s->hash);
	s->stop = 1;
	atomic_store(&s->cancel, 1);
	tp_group_abort(s->group);
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

void session_fail(session_t *s, const char *why)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	snprintf(s->fail, sizeof s->fail, "%s", why);
	pthread_mutex_unlock(&s->mu);
	session_stop(s);
}

void session_free(session_t *s)
{
	if (!s)
		return;
	if (s->started)
		pthread_join(s->th, NULL);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s);
}
