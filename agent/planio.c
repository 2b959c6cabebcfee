/*
 * planio.c: a GGUF model as the planner's model struct, and a plan's files (planio.h).
 *
 * Invariant: the buckets follow how the engine splits each tensor (rows or columns with the
 * query heads, KV heads, FFN columns, whole experts; replicated otherwise), so the planner's
 * per-rank bytes are what a rank maps.
 */
#include "agent/planio.h"
#include "common/common.h"
#include "infer/infer.h"

#include <stdlib.h>
#include <string.h>

typedef struct shape_acc {
	plan_model_t *m;
	int ffn_block; /* elements per block of the FFN column split (its largest type) */
} shape_acc_t;

/* Adds a tensor's bytes to the planner bucket its name says (per-layer buckets are summed over
 * all layers and averaged by the caller). */
static void add_tensor(void *ud, const char *n, int block, uint64_t nbytes)
{
	shape_acc_t *a = ud;
	plan_model_t *m = a->m;
	if (!strncmp(n, "blk.", 4)) {
		const char *dot = strchr(n + 4, '.');
		const char *k = dot ? dot + 1 : "";
		if (!strcmp(k, "attn_q.weight") || !strcmp(k, "attn_output.weight") ||
		    /* deepseek2's per-head latent attention matrices split with the query heads
		     * (attn_q_a, attn_kv_a_mqa and their norms are replicated: norm_bytes) */
		    !strcmp(k, "attn_q_b.weight") || !strcmp(k, "attn_kv_b.weight") ||
		    !strcmp(k, "attn_k_b.weight") || !strcmp(k, "attn_v_b.weight"))
			m->attn_qo_bytes += nbytes;
		else if (!strcmp(k, "attn_k.weight") || !strcmp(k, "attn_v.weight"))
			m->attn_kv_bytes += nbytes;
		else if (strstr(k, "_exps.weight")) /* routed experts: split whole */
			m->expert_bytes += nbytes;
		else if (strstr(k, "_shexp.weight") && strncmp(k, "ffn_gate_inp", 12)) {
			m->shexp_bytes += nbytes; /* the shared block: split by columns */
			if (!strcmp(k, "ffn_down_shexp.weight") && block > a->ffn_block)
				a->ffn_block = block;         /* the larger block bounds both */
		} else if (!strncmp(k, "ffn_gate_inp", 12)) { /* routers: replicated */
			m->norm_bytes += nbytes;
		} else if (!strncmp(k, "ffn_", 4) && strcmp(k, "ffn_norm.weight")) {
			m->ffn_bytes += nbytes;
			if (!strcmp(k, "ffn_down.weight"))
				a->ffn_block = block; /* its rows run along the FFN dimension */
		} else {
			m->norm_bytes += nbytes; /* norms and biases: replicated */
		}
	} else if (!strcmp(n, "token_embd.weight")) {
		m->embd_bytes += nbytes;
	} else {
		m->output_bytes += nbytes; /* output, output_norm */
	}
}

int agent_plan_model_gguf(const char *path, plan_model_t *m, char *err, size_t errlen)
{
	eng_model_shape_t s;
	memset(m, 0, sizeof *m);
	shape_acc_t a = {m, 1};
	int rc = eng_model_shape(path, &s, add_tensor, &a, err, errlen);
	if (rc)
		return rc;
	snprintf(m->arch, sizeof m->arch, "%s", s.arch);
	m->n_layers = s.n_layers, m->n_heads = s.n_heads, m->n_kv_heads = s.n_kv_heads;
	m->head_dim = s.head_dim, m->dim = s.dim, m->ffn = s.ffn, m->n_vocab = s.n_vocab;
	m->n_ctx = s.n_ctx;
	m->n_experts = s.n_experts, m->ffn_shexp = s.ffn_shexp;
	uint64_t l = (uint64_t)MAX(m->n_layers, 1);
	m->attn_qo_bytes = (m->attn_qo_bytes + l - 1) / l; /* per layer, rounded up */
	m->attn_kv_bytes = (m->attn_kv_bytes + l - 1) / l;
	m->ffn_bytes = (m->ffn_bytes + l - 1) / l;
	m->norm_bytes = (m->norm_bytes + l - 1) / l;
	m->expert_bytes = (m->expert_bytes + l - 1) / l;
	m->shexp_bytes = (m->shexp_bytes + l - 1) / l;
	m->ffn_block = MAX(a.ffn_block, 32);
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
