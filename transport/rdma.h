/*
 * rdma.h (internal to transport/ and its tests): the RDMA side of a group. See rdma.c.
 */
#ifndef SHOAL_TP_RDMA_H
#define SHOAL_TP_RDMA_H

#include <stdint.h>

#include "transport/transport.h"

struct tp_rdma_link;

/* Tries RDMA for every pair of the group using the JACCL device matrix at path; pairs that
 * cannot use it stay on TCP with one logged reason. Never fails the group. */
void tp_rdma_group_setup(tp_group_t *g, const char *path, int64_t deadline);

/* Frees one pair's RDMA resources (NULL is fine). */
void tp_rdma_link_free(struct tp_rdma_link *l);

#endif
