/*
 * core_view.c: reading the cluster core (core.h's readers): the state, /health and its reason,
 * the plans and their handles, what each member said. Pure as core.c; it only reads.
 */
#include "agent/core.h"
#include "agent/core_int.h"
#include "common/common.h"

#include <stdio.h>
#include <string.h>


agent_state_t core_state(const core_t *c)
{
	return c->state;
}

const core_plan_t *core_plan(const core_t *c)
{
	return c->have_cur ? &c->cur : NULL;
}

const core_plan_t *core_pending(const core_t *c)
{
	return c->have_pending ? &c->pending : NULL;
}

core_health_t core_health(const core_t *c, char *reason, size_t len)
{
	core_health_t later = c->served_once ? CORE_HEALTH_REPLANNING : CORE_HEALTH_FORMING;
	const char *why = c->why[0] ? c->why : "waiting for a plan";
	switch (c->state) {
	case AGENT_SERVING:
		if (core_is_planner(c) && c->broken[0]) {
			snprintf(reason, len, "re-planning: %s", c->broken);
			return CORE_HEALTH_REPLANNING;
		}
		if (c->sess != SESS_READY) {
			snprintf(reason, len, "the session is ending");
			return CORE_HEALTH_REPLANNING;
		}
		snprintf(reason, len, "%s", "");
		return CORE_HEALTH_SERVING;
	case AGENT_LOADING:
		snprintf(reason, len, "loading the model share");
		return c->served_once ? CORE_HEALTH_REPLANNING : CORE_HEALTH_LOADING;
	case AGENT_PLANNED:
		snprintf(reason, len, "plan received");
		return c->served_once ? CORE_HEALTH_REPLANNING : CORE_HEALTH_LOADING;
	case AGENT_SETTLED: snprintf(reason, len, "%s", why); return later;
	case AGENT_DISCOVERING: snprintf(reason, len, "waiting for peers"); return later;
	}
	return later;
}

int core_handles(const core_t *c, uint32_t out[3])
{
	int n = 0;
	if (c->have_cur)
		out[n++] = c->cur.handle;
	if (c->have_pending)
		out[n++] = c->pending.handle;
	if (c->have_made)
		out[n++] = c->made.handle;
	return n;
}

int core_rank_up(const core_t *c, int r)
{
	if (!c->have_cur || r < 0 || r >= c->cur.n)
		return 0;
	const disc_id_t *id = &c->cur.ranks[r];
	if (!disc_id_cmp(&c->self, id))
		return c->sess == SESS_READY;
	/* only the planner hears the ranks' acknowledgements */
	const core_member_t *m = core_member_get(c, id);
	if (!core_is_planner(c))
		return m != NULL;
	return core_member_answers(c, m, &c->cur, c->now);
}

const char *core_member_excluded(const core_t *c, const disc_id_t *id)
{
	const core_member_t *m = core_member_get(c, id);
	return m ? m->excluded : NULL;
}

core_ack_t core_member_ack(const core_t *c, const disc_id_t *id)
{
	const core_member_t *m = core_member_get(c, id);
	if (!m || !c->have_cur || strcmp(m->ack_hash, c->cur.hash))
		return CORE_ACK_NONE;
	return m->ack;
}
