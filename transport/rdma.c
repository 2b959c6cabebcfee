/*
 * rdma.c: placeholder until the verbs backend lands; every pair uses TCP.
 */
#include "transport/rdma.h"

#include "common/common.h"
#include "transport/group.h"

void tp_rdma_group_setup(tp_group_t *g, const char *path, int64_t deadline)
{
	(void)deadline;
	LOG(LOG_WARN, "group rank %d: RDMA not available (%s ignored): every pair uses TCP",
	    tp_group_rank(g), path);
}

void tp_rdma_link_free(struct tp_rdma_link *l)
{
	(void)l;
}
