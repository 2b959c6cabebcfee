/*
 * plans.c: the store of this node's plans (plans.h).
 *
 * Invariant: handles are never reused (a counter that starts at 1), so a handle the core still
 * carries after its plan was dropped finds nothing instead of another plan.
 */
#include "agent/plans.h"
#include "agent/planio.h"
#include "common/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
	uint32_t handle;
	plan_t *plan;
	char *text; /* plan_to_json: what goes out as AGENT_MSG_PLAN */
} entry_t;

struct plans {
	entry_t *e;
	int n, cap;
	uint32_t next;
	plan_model_t model; /* the planner's shapes of the model (have_model) */
	int have_model;
};

plans_t *plans_new(void)
{
	plans_t *ps = calloc(1, sizeof *ps);
	if (ps)
		ps->next = 1;
	return ps;
}

static void entry_free(entry_t *e)
{
	plan_free(e->plan);
	free(e->text);
}

void plans_free(plans_t *ps)
{
	if (!ps)
		return;
	for (int i = 0; i < ps->n; i++)
		entry_free(&ps->e[i]);
	free(ps->e);
	free(ps);
}

static const entry_t *find(const plans_t *ps, uint32_t handle)
{
	for (int i = 0; handle && i < ps->n; i++)
		if (ps->e[i].handle == handle)
			return &ps->e[i];
	return NULL;
}

/* Keeps p (and its text: made here when NULL) under a new handle; cp describes it. On failure p
 * is freed. */
static int keep(plans_t *ps, plan_t *p, char *text, core_plan_t *cp, char *err, size_t errlen)
{
	if (!text)
		text = plan_to_json(p);
	if (ps->n == ps->cap) {
		int cap = ps->cap ? 2 * ps->cap : 4;
		entry_t *ne = realloc(ps->e, (size_t)cap * sizeof *ne);
		if (ne) {
			ps->e = ne;
			ps->cap = cap;
		}
	}
	if (!text || ps->n == ps->cap) {
		plan_free(p);
		free(text);
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	}
	entry_t *e = &ps->e[ps->n++];
	*e = (entry_t){ps->next++, p, text};
	memset(cp, 0, sizeof *cp);
	snprintf(cp->hash, sizeof cp->hash, "%s", plan_hash(p));
	cp->epoch = plan_epoch(p);
	cp->handle = e->handle;
	for (int r = 0; r < plan_n_ranks(p) && r < CORE_MAX_RANKS; r++)
		if (disc_id_parse(plan_rank(p, r)->node_id, &cp->ranks[cp->n]) == 0)
			cp->n++;
	return 0;
}

int plans_receive(plans_t *ps, const uint8_t *text, size_t len, core_plan_t *cp, char *err,
		  size_t errlen)
{
	char *s = malloc(len + 1);
	plan_t *p = NULL;
	if (!s)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	memcpy(s, text, len);
	s[len] = 0;
	int rc = plan_from_json(&p, s, err, errlen);
	if (rc) {
		free(s);
		return rc;
	}
	return keep(ps, p, s, cp, err, errlen); /* the text as received: the one the hash covers */
}

int plans_make(plans_t *ps, const plan_view_t *v, const char *model_path, const plan_opts_t *o,
	       core_plan_t *cp, char *err, size_t errlen)
{
	if (!ps->have_model) {
		if (!model_path)
			return sh_fail(err, errlen, SH_ENOENT, "this node has no model file yet");
		int rc = agent_plan_model_gguf(model_path, &ps->model, err, errlen);
		if (rc)
			return rc;
		ps->have_model = 1;
	}
	plan_t *p = NULL;
	int rc = plan_make(&p, v, &ps->model, o, err, errlen);
	if (rc)
		return rc;
	LOG(LOG_INFO, "plan %s made for %d ranks (%s: %s)", plan_hash(p), plan_n_ranks(p),
	    plan_strategy_name(plan_strategy(p)), plan_reason(p));
	return keep(ps, p, NULL, cp, err, errlen);
}

const plan_t *plans_get(const plans_t *ps, uint32_t handle)
{
	const entry_t *e = find(ps, handle);
	return e ? e->plan : NULL;
}

const char *plans_text(const plans_t *ps, uint32_t handle)
{
	const entry_t *e = find(ps, handle);
	return e ? e->text : NULL;
}

void plans_keep(plans_t *ps, const uint32_t *handles, int n)
{
	int k = 0;
	for (int i = 0; i < ps->n; i++) {
		int wanted = 0;
		for (int j = 0; j < n && !wanted; j++)
			wanted = handles[j] && handles[j] == ps->e[i].handle;
		if (wanted)
			ps->e[k++] = ps->e[i];
		else
			entry_free(&ps->e[i]);
	}
	ps->n = k;
}

const plan_model_t *plans_model(const plans_t *ps)
{
	return ps->have_model ? &ps->model : NULL;
}
