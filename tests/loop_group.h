/*
 * loop_group.h: transport groups for tests, on loopback: `world` ranks, a thread each, each
 * with its own listening socket (test_tp, test_batch, test_coll).
 *
 * A rank's record starts with a loop_rank_t; loop_run() fills it, starts fn on every record and
 * joins them; the rank function forms its group with loop_join(). The tests' one engine rank
 * harness (loop_eng_t) runs an engine on such a group: rank 0 leads, the others are workers.
 */
#ifndef SHOAL_TEST_LOOP_GROUP_H
#define SHOAL_TEST_LOOP_GROUP_H

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "infer/infer.h"
#include "transport/transport.h"

#define LOOP_MAX 8

typedef struct loop_rank {
	int rank, world, lfd;
	const char **hosts; /* shared by the ranks of one run */
	int *ports;
} loop_rank_t;

/* Runs fn(record r) for r < world in threads; ctx holds world records of `size` bytes, each
 * starting with its loop_rank_t. Returns when every rank has returned (listening sockets
 * closed). */
static inline void loop_run(void *ctx, size_t size, int world, void *(*fn)(void *))
{
	static const char *hosts[LOOP_MAX];
	static int ports[LOOP_MAX];
	pthread_t th[LOOP_MAX];
	char err[128];
	for (int r = 0; r < world; r++) {
		loop_rank_t *l = (loop_rank_t *)((char *)ctx + (size_t)r * size);
		hosts[r] = "127.0.0.1";
		if (tp_listen("127.0.0.1", 0, &l->lfd, &ports[r], err, sizeof err))
			abort();
		l->rank = r, l->world = world, l->hosts = hosts, l->ports = ports;
	}
	for (int r = 0; r < world; r++)
		pthread_create(&th[r], NULL, fn, (char *)ctx + (size_t)r * size);
	for (int r = 0; r < world; r++) {
		pthread_join(th[r], NULL);
		close(((loop_rank_t *)((char *)ctx + (size_t)r * size))->lfd);
	}
}

/* Forms rank l's group (node ID: id, or rank + 1 in its first byte when id is NULL). */
static inline int loop_join(tp_group_t **g, const loop_rank_t *l, uint64_t tag,
			    const tp_keys_t *keys, const uint8_t *id, int timeout_ms, char *err,
			    size_t len)
{
	uint8_t own[TP_NODE_ID_BYTES] = {(uint8_t)(l->rank + 1)};
	tp_group_cfg_t cfg = {.rank = l->rank,
			      .world = l->world,
			      .hosts = l->hosts,
			      .ports = l->ports,
			      .listen_fd = l->lfd,
			      .tag = tag,
			      .keys = keys,
			      .node_id = id ? id : own,
			      .timeout_ms = timeout_ms};
	return tp_group_new(g, &cfg, err, len);
}

/* ---- engines on those groups (test_batch, test_tp, test_embed) ---- */

/* One rank of an engine group: it joins (tag, keys), opens the model at path with the engine's
 * own split of it (no plan ranges), then rank 0 runs lead() and the others the worker loop; with
 * vanish, rank 1 leaves at once instead (rank 0's step must fail, not hang). A record may extend
 * this one (it comes first). */
typedef struct loop_eng {
	loop_rank_t l; /* first: loop_run fills it */
	const tp_keys_t *keys;
	uint64_t tag;
	const char *path;
	int pipeline, threads, ctx, step_timeout_ms;
	int slots; /* rank 0's KV slots (workers ask for 1: rank 0's count wins); 0 = default */
	int want_slots; /* every rank checks the engine has this many (0: no check) */
	int vanish;
	int rollback;        /* rank 0's rollback depth (the workers ask for none: rank 0's wins) */
	const char *kv_type; /* every rank's KV cache type (NULL: the engine's default) */
	int (*lead)(struct loop_eng *r, eng_t *e); /* rank 0's work: 0, or non-zero with err */
	uint64_t rs_bytes; /* the engine's recurrent state bytes, once opened */
	int rc;
	char err[320];
} loop_eng_t;

static inline void *loop_eng_main(void *arg)
{
	loop_eng_t *c = arg;
	tp_group_t *g = NULL;
	eng_t *e = NULL;
	if ((c->rc = loop_join(&g, &c->l, c->tag, c->keys, NULL, 20000, c->err, sizeof c->err)))
		goto out;
	eng_dist_t d = {.group = g, .pipeline = c->pipeline, .step_timeout_ms = c->step_timeout_ms};
	int lead = c->l.rank == 0;
	eng_opts_t o = {.model_path = c->path,
			.threads = c->threads,
			.ctx = c->ctx,
			.parallel = lead || !c->slots ? c->slots : 1,
			.rollback = lead ? c->rollback : 0,
			.kv_type = c->kv_type,
			.dist = &d};
	if ((c->rc = eng_open(&e, &o, c->err, sizeof c->err)))
		goto out;
	c->rs_bytes = eng_info(e)->rs_bytes;
	if (c->want_slots && eng_info(e)->n_slots != c->want_slots) {
		snprintf(c->err, sizeof c->err, "%d slots", eng_info(e)->n_slots);
		c->rc = -1;
	} else if (c->l.rank == 0) {
		c->rc = c->lead(c, e);
	} else if (c->vanish && c->l.rank == 1) {
		tp_group_abort(g);
	} else {
		c->rc = eng_worker_run(e, c->err, sizeof c->err);
	}
out:
	eng_free(e); /* rank 0: tells the workers to stop */
	tp_group_free(g);
	return NULL;
}

#endif
