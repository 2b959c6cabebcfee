/*
 * planio.c: a GGUF model as the planner's model struct, and a plan's files (planio.h).
 *
 * Invariant: the buckets are the engine's own parts (eng_model_shape sums each tensor into the part
 * infer/tp.c's dist_tensor_part says it is cut along), so the planner's per-rank bytes are what a
 * rank maps.
 */
#include "agent/planio.h"
#include "common/common.h"
#include "infer/infer.h"

#include <stdlib.h>
#include <string.h>

int agent_plan_model_gguf(const char *path, plan_model_t *m, char *err, size_t errlen)
{
	eng_model_shape_t s;
	memset(m, 0, sizeof *m);
	int rc = eng_model_shape(path, &s, err, errlen);
	if (rc)
		return rc;
	snprintf(m->arch, sizeof m->arch, "%s", s.arch);
	m->n_layers = s.n_layers, m->n_heads = s.n_heads, m->n_kv_heads = s.n_kv_heads;
	m->head_dim = s.head_dim, m->dim = s.dim, m->ffn = s.ffn, m->n_vocab = s.n_vocab;
	m->n_ctx = s.n_ctx;
	m->n_experts = s.n_experts, m->ffn_shexp = s.ffn_shexp;
	uint64_t l = (uint64_t)MAX(m->n_layers, 1), la = (uint64_t)MAX(s.n_kv_layers, 1);
	uint64_t lr = (uint64_t)MAX(s.n_layers - s.n_kv_layers, 1);
	/* the planner counts per layer (rounded up), the embedding and the head whole; attention
	 * per attention layer, a recurrent block per recurrent layer */
	m->attn_qo_bytes = (s.q_heads_bytes + la - 1) / la;
	m->attn_kv_bytes = (s.kv_heads_bytes + la - 1) / la;
	m->rec_bytes = (s.recurrent_bytes + lr - 1) / lr;
	m->ffn_bytes = (s.ffn_bytes + l - 1) / l;
	m->norm_bytes = (s.replicated_bytes + l - 1) / l;
	m->expert_bytes = (s.expert_bytes + l - 1) / l;
	m->shexp_bytes = (s.shexp_bytes + l - 1) / l;
	m->embd_bytes = s.embd_bytes;
	m->output_bytes = s.output_bytes;
	m->ffn_block = s.ffn_block;
	/* what each layer keeps: the engine's kinds, the sliding-window ring, the states */
	char kinds[PLAN_MAX_KINDS + 1];
	int n = MIN(s.n_layers, PLAN_MAX_KINDS);
	for (int i = 0; i < n; i++)
		kinds[i] = s.recurrent[i / 8] >> (i % 8) & 1 ? 'r'
			   : s.swa[i / 8] >> (i % 8) & 1     ? 's'
							     : 'f';
	kinds[n] = 0;
	/* the shortest period that repeats (the planner reads layer l as kinds[l % period]) */
	int per = 1;
	while (per < n && memcmp(kinds, kinds + per, (size_t)(n - per)))
		per++;
	kinds[per] = 0;
	if (strcmp(kinds, "f")) /* "" = every layer keeps the whole context */
		memcpy(m->layer_kinds, kinds, (size_t)per + 1);
	m->swa_kv_pos = s.swa_kv_pos;
	m->rs_bytes = s.rs_layer_bytes, m->rs_copies = s.rs_copies;
	m->rs_k_heads = s.rs_k_heads, m->rs_unit = s.rs_unit;
	m->kv_latent_bytes = s.kv_latent_bytes;
	char e[256];
	rc = plan_model_check(m, e, sizeof e);
	return rc ? sh_fail(err, errlen, rc, "%s: %s", path, e) : 0;
}

int agent_plan_write_files(const plan_t *p, const char *dir, int mlx_list, char *err, size_t errlen)
{
	static const char *const names[] = {"hostfile.json", "mlx-hosts.json", "rdma-devices.json",
					    "plan.json"};
	char *(*const fns[])(const plan_t *) = {plan_hostfile_json,
						mlx_list ? plan_mlx_list_json : plan_mlx_hosts_json,
						plan_rdma_json, plan_to_json};
	int rc = mkdir_p(dir, err, errlen);
	for (size_t i = 0; !rc && i < ARRAY_LEN(names); i++) {
		char path[SH_SUBPATH_MAX];
		if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) >= (int)sizeof path)
			return sh_fail(err, errlen, SH_EINVAL, "output path too long");
		char *text = fns[i](p);
		if (!text)
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		rc = write_file_atomic(path, text, strlen(text), err, errlen);
		free(text);
	}
	return rc;
}
