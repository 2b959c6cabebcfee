/*
 * plans.h (internal to agent/): the one store of this node's plans. A plan enters it when the
 * planner makes it here (plans_make) or when one arrives from the planner (plans_receive); it is
 * known by a handle, which the cluster core carries in its core_plan_t (the core decides which
 * plan runs, the store holds the plan_t and the text sent on the wire). After each round of the
 * core the agent keeps exactly the plans the core still refers to (plans_keep): no copy of a
 * plan lives anywhere else, none is looked up by its hash.
 *
 * The store also holds the model's shapes for the planner (read once from the GGUF file).
 *
 * Threads: the loop's thread only. Ownership: plan_t pointers and texts from the store are
 * borrowed until the next plans_keep or plans_free.
 */
#ifndef SHOAL_AGENT_PLANS_H
#define SHOAL_AGENT_PLANS_H

#include "agent/core.h"
#include "planner/planner.h"

#include <stddef.h>
#include <stdint.h>

typedef struct plans plans_t;

plans_t *plans_new(void); /* NULL when out of memory */
void plans_free(plans_t *ps);

/* A PLAN message: parsed and verified (plan_from_json checks its hash), kept; *cp describes it
 * for the core (with its handle). Returns 0 or SH_E* with the reason in err. */
int plans_receive(plans_t *ps, const uint8_t *text, size_t len, core_plan_t *cp, char *err,
		  size_t errlen);

/* The planner: plans view v (borrowed) with the model at model_path (its shapes are read once)
 * and options o; keeps the plan and its text; *cp as plans_receive. Returns 0 or SH_E* with the
 * reason in err. */
int plans_make(plans_t *ps, const plan_view_t *v, const char *model_path, const plan_opts_t *o,
	       core_plan_t *cp, char *err, size_t errlen);

/* The plan of a handle, or NULL when the store does not hold it (handle 0: none). */
const plan_t *plans_get(const plans_t *ps, uint32_t handle);
/* Its JSON as the planner sends it (AGENT_MSG_PLAN), or NULL. */
const char *plans_text(const plans_t *ps, uint32_t handle);

/* Frees every plan but those of handles[0..n) (the ones the core refers to: core_handles). */
void plans_keep(plans_t *ps, const uint32_t *handles, int n);

/* The model's shapes for the planner, or NULL before a plan was made here (then nothing read
 * the file yet). */
const plan_model_t *plans_model(const plans_t *ps);

#endif
