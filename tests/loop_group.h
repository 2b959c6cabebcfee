/*
 * loop_group.h: transport groups for tests, on loopback: `world` ranks, a thread each, each
 * with its own listening socket (test_tp, test_batch, test_coll).
 *
 * A rank's record starts with a loop_rank_t; loop_run() fills it, starts fn on every record and
 * joins them; the rank function forms its group with loop_join().
 */
#ifndef SHOAL_TEST_LOOP_GROUP_H
#define SHOAL_TEST_LOOP_GROUP_H

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

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

#endif
