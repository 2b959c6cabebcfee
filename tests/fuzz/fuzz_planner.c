/*
 * fuzz_planner.c: random or hostile bytes as a view JSON (and as plan.json and model JSON):
 * parsing never crashes, and a view that parses is planned with two models under every strategy;
 * each plan must cover the model exactly once and survive a plan.json round trip unchanged.
 */
#include "common/common.h"
#include "planner/plan_int.h"

#include <stdlib.h>
#include <string.h>

static const char *const MODELS[] = {
    "{\"n_layers\":32,\"n_heads\":32,\"n_kv_heads\":8,\"head_dim\":128,\"dim\":4096,"
    "\"ffn\":14336,\"n_vocab\":128256,\"n_ctx\":8192,\"wtype\":\"Q8_0\"}",
    "{\"n_layers\":5,\"n_heads\":8,\"n_kv_heads\":4,\"dim\":64,\"ffn\":172,\"n_vocab\":512,"
    "\"n_ctx\":512}",
};

static void check_plan(const plan_t *p)
{
	char err[256];
	if (plan_check_cover(p, err, sizeof err))
		abort();
	char *s = plan_to_json(p), *h = plan_hostfile_json(p), *m = plan_mlx_hosts_json(p);
	char *r = plan_rdma_json(p);
	plan_t *q = NULL;
	if (s && plan_from_json(&q, s, err, sizeof err))
		abort(); /* our own output must parse and verify */
	if (q) {
		char *s2 = plan_to_json(q);
		if (s2 && strcmp(s, s2))
			abort();
		free(s2);
		plan_free(q);
	}
	free(s), free(h), free(m), free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);
	if (!s)
		return 0;
	memcpy(s, data, size);
	s[size] = 0;
	char err[512];
	plan_view_t *v = NULL;
	if (plan_view_from_json(&v, s, err, sizeof err) == 0) {
		char *vj = plan_view_to_json(v);
		free(vj);
		for (size_t mi = 0; mi < ARRAY_LEN(MODELS); mi++) {
			plan_model_t m;
			if (plan_model_from_json(&m, MODELS[mi], err, sizeof err))
				abort();
			for (int st = 0; st < 3; st++) {
				plan_opts_t o;
				plan_opts_default(&o);
				o.strategy = (plan_strategy_t)st;
				plan_t *p = NULL;
				if (plan_make(&p, v, &m, &o, err, sizeof err) == 0)
					check_plan(p);
				plan_free(p);
			}
		}
		plan_view_free(v);
	}
	plan_t *p = NULL;
	if (plan_from_json(&p, s, err, sizeof err) == 0)
		check_plan(p);
	plan_free(p);
	plan_model_t m;
	(void)plan_model_from_json(&m, s, err, sizeof err);
	free(s);
	return 0;
}
