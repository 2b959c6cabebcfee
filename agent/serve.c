/*
 * serve.c: a plan's session on this node, and the glue to the web server.
 *
 * A session runs on its own thread: it forms the tensor-parallel group of the plan (rank order,
 * ring addresses and ports from the plan; one rank alone needs no group), opens the engine with
 * this rank's share, and then on rank 0 attaches the engine to the web server until it is told to
 * stop, or on the other ranks runs the worker loop until rank 0 stops it or the group fails.
 * session_stop (from the agent's thread) sets the stop flag and aborts the group
 * (tp_group_abort: shuts its sockets down), so every wait inside the session ends at once; the
 * thread then detaches the engine from the web server (which ends queued requests with 503 and
 * lets the running one fail), frees the engine and the group, and sets the phase to DONE.
 *
 * Invariant: only the session's thread touches its engine and group pointers' contents; the
 * agent's thread reads only `phase` (atomic) and, once DONE, `err`; the group pointer is
 * published under `mu` so that session_stop can abort it.
 *
 * The web server runs on every node from the start (health, cluster view, follower redirects);
 * its callbacks read what the agent's loop publishes under pub_mu.
 */
#include "agent/agent_int.h"
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
	agent_t *a; /* read only: cfg, keys, self, web (thread-safe calls) */
	pthread_t th;
	int started;
	int rank, world, ctx;
	uint64_t tag;
	char hosts[TP_MAX_WORLD][PLAN_IP_MAX];
	const char *host_ptrs[TP_MAX_WORLD];
	int ports[TP_MAX_WORLD];
	uint8_t peer_ids[TP_MAX_WORLD][TP_NODE_ID_BYTES];
	eng_dist_t dist;
	char rdma_path[4200];
	char hash[20];
	int slice;                      /* this node holds a slice: fetch the share's bytes first */
	char slice_host[DISC_ADDR_MAX]; /* from this holder of the whole file */
	int slice_port;
	atomic_int phase;
	atomic_int cancel; /* set by session_stop: forming gives up */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stop;          /* under mu */
	char fail[160];    /* under mu: why session_fail ended it ("" = a plain stop) */
	tp_group_t *group; /* under mu (published for session_stop) */
	char err[256];
};

static int stopping(session_t *s)
{
	pthread_mutex_lock(&s->mu);
	int st = s->stop;
	pthread_mutex_unlock(&s->mu);
	return st;
}

static void *session_main(void *arg)
{
	session_t *s = arg;
	agent_t *a = s->a;
	tp_group_t *g = NULL;
	eng_t *e = NULL;
	char err[256] = "";
	int64_t t0 = now_ms();
	if (a->cfg.exec_cmd) { /* --exec: the command is the engine (exec.c); nothing to load */
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
	if (s->slice && agent_model_ensure_share(a, s->world > 1 ? &s->dist : NULL, s->rank,
						 s->slice_host, s->slice_port, err, sizeof err))
		goto done;
	if (s->world > 1) {
		tp_group_cfg_t gc = {.rank = s->rank,
				     .world = s->world,
				     .hosts = s->host_ptrs,
				     .ports = s->ports,
				     .listen_fd = -1,
				     .tag = s->tag,
				     .keys = &a->keys,
				     .node_id = a->self.b,
				     .peer_ids = (const uint8_t(*)[TP_NODE_ID_BYTES])s->peer_ids,
				     .timeout_ms = GROUP_FORM_MS,
				     .rdma_devices = s->rdma_path,
				     .cancel = &s->cancel};
		/* a peer whose previous plan's group still holds its port refuses us as "another
		 * group" for a moment: try again while the forming window lasts */
		while (tp_group_new(&g, &gc, err, sizeof err)) {
			if (!strstr(err, "another group") || atomic_load(&s->cancel) ||
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
		s->dist.group = g;
	}
	atomic_store(&s->phase, SESSION_LOADING);
	eng_opts_t o = {.model_path = a->cfg.model,
			.threads = a->cfg.threads,
			.ctx = s->ctx,
			.kv_type = a->cfg.kv_type,
			.dist = s->world > 1 ? &s->dist : NULL,
			.parallel = a->cfg.parallel};
	if (eng_open(&e, &o, err, sizeof err))
		goto done;
	LOG(LOG_INFO, "plan %s: rank %d of %d loaded in %lld ms", s->hash, s->rank, s->world,
	    (long long)(now_ms() - t0));
	if (stopping(s))
		goto done;
	if (s->rank == 0) {
		if (a->web) { /* NULL when the API port could not be opened (logged) */
			web_set_rank_count(a->web, s->world);
			for (int r = 0; r < s->world; r++)
				web_set_rank_health(a->web, r, 1);
			web_set_engine(a->web, e);
		}
		atomic_store(&a->group_broken, 0); /* a late word about an older group */
		atomic_store(&s->phase, SESSION_READY);
		/* until told to stop, or until a request meets a broken group (a rank lost or
		 * silent while its node still answers the control channel): the session then ends
		 * with an error, which makes the leader re-plan (cluster.c) instead of serving 503s
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
			if (s->world > 1 && atomic_exchange(&a->group_broken, 0)) {
				snprintf(err, sizeof err,
					 "the group broke: a rank stopped answering");
				break;
			}
		}
		pthread_mutex_unlock(&s->mu);
		/* the group is aborted: a running request fails at its next step */
		if (a->web)
			web_set_engine(a->web, NULL);
	} else {
		atomic_store(&s->phase, SESSION_READY);
		if (eng_worker_run(e, err, sizeof err) == 0)
			err[0] = 0;
		else if (stopping(s))
			err[0] = 0; /* our own abort */
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
	tp_group_free(g);
	snprintf(s->err, sizeof s->err, "%s", err);
	atomic_store(&s->phase, SESSION_DONE);
	return NULL;
}

session_t *session_start(agent_t *a, const plan_t *p, int rank, char *err, size_t errlen)
{
	int n = plan_n_ranks(p);
	if (rank < 0 || rank >= n || n > TP_MAX_WORLD) {
		sh_fail(err, errlen, SH_EINVAL, "rank %d of %d", rank, n);
		return NULL;
	}
	if (!a->cfg.model) {
		sh_fail(err, errlen, SH_EINVAL, "no model file on this node");
		return NULL;
	}
	session_t *s = calloc(1, sizeof *s);
	if (!s) {
		sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		return NULL;
	}
	s->a = a;
	s->rank = rank;
	s->world = n;
	s->ctx = plan_ctx(p);
	s->tag = plan_epoch(p);
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
			       .step_timeout_ms = a->cfg.step_timeout_ms,
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
	snprintf(s->rdma_path, sizeof s->rdma_path, "%s/rdma-devices.json", a->cfg.state_dir);
	if (a->model_slice) {
		conn_t *h = agent_model_holder(a);
		s->slice = 1;
		if (h) {
			snprintf(s->slice_host, sizeof s->slice_host, "%s", h->addr);
			s->slice_port = h->desc.sync_port;
		}
	}
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

int session_phase(session_t *s)
{
	return atomic_load(&s->phase);
}

const char *session_error(session_t *s)
{
	return atomic_load(&s->phase) == SESSION_DONE ? s->err : "";
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

/* ---- web glue ------------------------------------------------------------------------------- */

static int on_health(void *ud, char *reason, size_t len)
{
	agent_t *a = ud;
	pthread_mutex_lock(&a->pub_mu);
	int st = a->pub_state;
	snprintf(reason, len, "%s", a->pub_reason);
	pthread_mutex_unlock(&a->pub_mu);
	return st;
}

static void on_engine_lost(void *ud)
{
	agent_t *a = ud;
	atomic_store(&a->group_broken, 1);
}

static char *on_cluster(void *ud)
{
	agent_t *a = ud;
	pthread_mutex_lock(&a->pub_mu);
	char *s = a->pub_cluster ? strdup(a->pub_cluster) : NULL;
	pthread_mutex_unlock(&a->pub_mu);
	return s;
}

void agent_pub_set(agent_t *a, int web_state, const char *reason, char *cluster_json)
{
	pthread_mutex_lock(&a->pub_mu);
	a->pub_state = web_state;
	snprintf(a->pub_reason, sizeof a->pub_reason, "%s", reason);
	if (cluster_json) {
		free(a->pub_cluster);
		a->pub_cluster = cluster_json;
	}
	pthread_mutex_unlock(&a->pub_mu);
}

int agent_web_start(agent_t *a, char *err, size_t errlen)
{
	web_opts_t o;
	web_opts_default(&o);
	o.host = "0.0.0.0";
	o.port = a->cfg.http_port;
	o.health = on_health;
	o.cluster = on_cluster;
	o.engine_lost = on_engine_lost;
	o.ud = a;
	if (a->cfg.api_key && a->cfg.api_key[0])
		o.api_key = a->cfg.api_key;
	o.tls_cert = a->cfg.tls_cert;
	o.tls_key = a->cfg.tls_key;
	o.show_text = a->cfg.dashboard_show_text;
	o.node_id = a->self_hex; /* the history's column of this node's step times */
	a->pub_state = WEB_FORMING;
	snprintf(a->pub_reason, sizeof a->pub_reason, "waiting for peers");
	char e[256];
	int rc = web_new(&a->web, &o, NULL, e, sizeof e);
	if (!rc)
		LOG(LOG_INFO, "api: listening on port %d", web_port(a->web));
	else /* discovery, planning and computing go on; only the API is missing here */
		LOG(LOG_ERROR, "api: %s: this node serves no API (pick another --http-port)", e);
	if (!rc && a->cfg.exec_cmd && a->cfg.exec_port > 0)
		web_set_proxy(a->web, a->cfg.exec_port); /* --exec: /v1/ goes to rank 0's command */
	(void)err, (void)errlen;
	return 0;
}
