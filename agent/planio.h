/*
 * planio.h (internal to agent/): the planner's I/O that `shoal plan` and the agent's planner share:
 * a model file turned into the planner's model struct (through infer.h: planner/ may not depend on
 * infer/), and a plan's four files written atomically.
 *
 * Threads: any; nothing here keeps state.
 */
#ifndef SHOAL_AGENT_PLANIO_H
#define SHOAL_AGENT_PLANIO_H

#include "planner/planner.h"

#include <stddef.h>

/* Model shapes and exact tensor sizes from a GGUF file, bucketed as the planner splits them.
 * Returns 0 or an error with "PATH: reason" in err. */
int agent_plan_model_gguf(const char *path, plan_model_t *m, char *err, size_t errlen);

/* Writes hostfile.json, mlx-hosts.json (the list form when mlx_list), rdma-devices.json and
 * plan.json into dir (created 0700 if missing), each atomically. Returns 0 or SH_E* with err. */
int agent_plan_write_files(const plan_t *p, const char *dir, int mlx_list, char *err,
			   size_t errlen);

#endif
