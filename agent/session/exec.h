/*
 * exec.h: `shoal agent --exec 'CMD ...'`: runs CMD on this node while a plan is in force, with
 * the environment mlx.launch would give this rank (docs/mlx.md), so an MLX program (or anything
 * else) starts on every node with zero configuration.
 *
 * The agent calls exec_sync once per loop turn with the plan in force here (NULL when none: no
 * plan yet, a new one on its way, the group is re-forming) and exec_free at shutdown; everything
 * else (starting, restarting on a new plan, reaping, backoff, output) happens inside.
 *
 * Threads: the agent's loop thread only (the one that owns the plan).
 */
#ifndef SHOAL_EXEC_H
#define SHOAL_EXEC_H

#include "common/common.h"
#include "planner/planner.h"

#include <stdint.h>

typedef struct exec exec_t;

/* What --exec and --exec-port say. Strings are borrowed for the agent's life. */
typedef struct exec_cfg {
	const char *cmd;       /* run with /bin/sh -c in its own process group */
	int port;              /* rank 0's CMD serves the API here (SHOAL_EXEC_PORT); 0 = none */
	const char *state_dir; /* where the plan files are (MLX_HOSTFILE, ...) */
} exec_cfg_t;

#define EXEC_DEFAULT_PORT 8090
#define EXEC_ENV_LEN      (SH_SUBPATH_MAX + 128) /* one "NAME=value"; a value may be a path */

/*
 * Brings CMD in line with plan p (borrowed for the call; NULL = no plan in force): starts it for
 * rank `rank` of p, restarts it when p's hash changes, stops it when p is NULL. A CMD that exits
 * is logged with its status and its last output lines and started again after a backoff that
 * doubles from 1 s to 30 s (reset once a run lasts 30 s). Never blocks: a stopping CMD gets
 * SIGTERM, then SIGKILL for its whole process group 3 s later. *x is created on the first call
 * (NULL-safe to free). now: a monotonic clock in ms.
 */
void exec_sync(exec_t **x, const exec_cfg_t *cfg, const plan_t *p, int rank, int64_t now);

/* Stops CMD (SIGTERM to its process group, SIGKILL after 3 s; waits) and frees. NULL-safe. */
void exec_free(exec_t *x);

/* The environment CMD gets for rank `rank` of p, as "NAME=value" strings written into
 * out[max][len] (MLX_RANK, the backend's files and variables, the plan's envs, SHOAL_*).
 * Returns how many. Pure: the unit tests call it. */
int exec_env(const plan_t *p, int rank, const exec_cfg_t *cfg, char out[][EXEC_ENV_LEN], int max);

#endif
