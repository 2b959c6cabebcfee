/*
 * cmd_plan.c: `shoal plan --view view.json --model M [--strategy S] [--ctx N] [--slots N]
 * [--out DIR]`.
 * Reads a membership view and model metadata, prints the plan as a table (with measurements in
 * the view: the cost model's predictions, the other candidates and the standby members) and writes
 * hostfile.json, mlx-hosts.json, rdma-devices.json and plan.json into DIR, each atomically.
 * All the planning is planner/'s; this file only does the I/O around it (planio.c turns a GGUF
 * into the planner's model struct and writes the files, as the agent does).
 */
#include "agent/cli/cli.h"
#include "agent/planio.h"
#include "common/common.h"
#include "infer/infer.h"
#include "planner/planner.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: shoal plan --view VIEW.json --model MODEL [options]\n\n"
	    "Computes the rank order, MLX ring hostfile, mlx.launch hosts, JACCL RDMA device\n"
	    "matrix and shard plan for a membership view, prints it, and writes hostfile.json,\n"
	    "mlx-hosts.json, rdma-devices.json and plan.json (formats: docs/view.md).\n\n"
	    "  --view FILE        membership view JSON (docs/view.md)\n"
	    "  --model FILE       model metadata JSON (docs/view.md) or a .gguf model\n"
	    "  --strategy S       auto (default), tensor, pipeline or hybrid\n"
	    "  --parallel N       streams decoded together, for the aggregate prediction\n"
	    "                     (default 1)\n"
	    "  --slots N          sequences each rank keeps a KV cache and recurrent state for\n"
	    "                     (the engine's --parallel; default 1)\n"
	    "  --hybrid           auto may choose a hybrid plan (the engine runs them)\n"
	    "  --ctx N            context length the KV cache is sized for (default: the model's)\n"
	    "  --kv-bytes N       bytes per KV cache element (default 4: F32)\n"
	    "  --kv-type T        the engine's KV cache type instead: f32, f16 or q8_0 (34 bytes\n"
	    "                     per 32 elements)\n"
	    "  --headroom-mb N    memory kept free per node, at least (default 512)\n"
	    "  --base-port N      ring port of rank 0; rank r uses N + r (default 32323)\n"
	    "  --out DIR          where to write the files (default: the current directory)\n"
	    "  --mlx-list         write mlx-hosts.json in the list form (older mlx.launch) rather\n"
	    "                     than {\"backend\", \"envs\", \"hosts\"} (docs/mlx.md)\n"
	    "  --log-level LEVEL  error, warn, info or debug\n"
	    "  --help             this text\n");
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && !strcmp(s + n - k, suffix);
}

/* Model metadata from a model-metadata JSON file or a .gguf. */
static int load_model(const char *path, plan_model_t *m, char *err, size_t errlen)
{
	if (ends_with(path, ".gguf"))
		return agent_plan_model_gguf(path, m, err, errlen);
	char *text = NULL;
	int rc = read_file_all(path, &text, NULL, err, errlen);
	if (rc)
		return rc;
	char e[256];
	rc = plan_model_from_json(m, text, e, sizeof e);
	if (rc)
		sh_fail(err, errlen, rc, "%s: %s", path, e);
	free(text);
	return rc;
}

static double gb(uint64_t b)
{
	return (double)b / 1e9;
}

static void print_table(const plan_t *p)
{
	printf("plan %s  epoch %llu  %d rank%s  strategy %s (%s)\n", plan_hash(p),
	       (unsigned long long)plan_epoch(p), plan_n_ranks(p), plan_n_ranks(p) == 1 ? "" : "s",
	       plan_strategy_name(plan_strategy(p)), plan_reason(p));
	printf("context %d tokens  RDMA full mesh: %s\n", plan_ctx(p),
	       plan_rdma_full_mesh(p) ? "yes" : "no");
	printf("MLX backend %s (%s)%s%s\n\n", plan_mlx_backend(p), plan_mlx_reason(p),
	       plan_coordinator(p)[0] ? "  coordinator " : "", plan_coordinator(p));
	printf("%-4s %-8s %-18s %-21s %7s %9s %9s %13s %9s %8s\n", "rank", "node", "host",
	       "ring addr", "mem GB", "q heads", "kv heads", "ffn columns", "layers", "need GB");
	for (int r = 0; r < plan_n_ranks(p); r++) {
		const plan_rank_t *k = plan_rank(p, r);
		char addr[64], q[24], kv[24], ffn[32], layers[24];
		snprintf(addr, sizeof addr, "%s:%d", k->ip, k->port);
		snprintf(q, sizeof q, "%d-%d", k->q0, k->q1);
		snprintf(kv, sizeof kv, "%d-%d", k->kv0, k->kv1);
		snprintf(ffn, sizeof ffn, "%d-%d", k->ffn0, k->ffn1);
		snprintf(layers, sizeof layers, "%d-%d", k->layer0, k->layer1);
		uint64_t need = k->weight_bytes + k->kv_cache_bytes + k->rs_bytes + k->act_bytes +
				k->headroom_bytes;
		printf("%-4d %-8.8s %-18.18s %-21s %7.1f %9s %9s %13s %9s %8.1f\n", r, k->node_id,
		       k->host[0] ? k->host : "-", addr, gb(k->mem_avail), q, kv, ffn, layers,
		       gb(need));
	}
	/* what each rank's need is made of (docs/view.md, "Memory") */
	printf("\nmemory per rank, GB: KV cache for %d positions x %d slot%s\n", plan_ctx(p),
	       plan_slots(p), plan_slots(p) == 1 ? "" : "s");
	printf("%-4s %9s %9s %9s %11s %9s %9s\n", "rank", "weights", "KV cache", "state",
	       "activations", "headroom", "need");
	for (int r = 0; r < plan_n_ranks(p); r++) {
		const plan_rank_t *k = plan_rank(p, r);
		printf("%-4d %9.2f %9.2f %9.2f %11.2f %9.2f %9.2f\n", r, gb(k->weight_bytes),
		       gb(k->kv_cache_bytes), gb(k->rs_bytes), gb(k->act_bytes),
		       gb(k->headroom_bytes),
		       gb(k->weight_bytes + k->kv_cache_bytes + k->rs_bytes + k->act_bytes +
			  k->headroom_bytes));
	}
}

static void print_pred(const plan_pred_t *d)
{
	char st[PLAN_MAX_NODES * 4] = "";
	for (int s = 0, o = 0; d->n_stages > 1 && s < d->n_stages && o < (int)sizeof st - 4; s++)
		o += snprintf(st + o, sizeof st - (size_t)o, "%s%d", s ? "+" : " (",
			      d->stage_size[s]);
	if (d->n_stages > 1)
		strcat(st, ")");
	printf("  %-6s %-8s %2d rank%s%-10s %8.1f %10.1f %9.1f %7.2f", d->what, d->strategy,
	       d->n_ranks, d->n_ranks == 1 ? " " : "s", st, d->decode_dtok / 10.0,
	       d->aggregate_dtok / 10.0, d->prefill_dtok / 10.0, gb(d->mem_max_bytes));
	if (d->n_syncs)
		printf("  %d syncs at %.2f ms", d->n_syncs, d->sync_us / 1000.0);
	if (d->n_hops)
		printf("%s%d hops at %.2f ms", d->n_syncs ? ", " : "  ", d->n_hops,
		       d->hop_us / 1000.0);
	printf("%s\n", d->q8_wire ? " (8-bit wire)" : "");
}

/* The cost model's figures, when the view was measured (docs/view.md section 4.1). */
static void print_predictions(const plan_t *p)
{
	const plan_pred_t *d = plan_predicted(p);
	if (!d)
		return;
	printf("\npredicted: decode %.1f tok/s, aggregate %.1f tok/s at %d stream%s, prefill %.1f "
	       "tok/s, largest rank %.2f GB%s\n",
	       d->decode_dtok / 10.0, d->aggregate_dtok / 10.0, d->parallel,
	       d->parallel == 1 ? "" : "s", d->prefill_dtok / 10.0, gb(d->mem_max_bytes),
	       plan_q8_wire(p) ? ", 8-bit wire" : "");
	if (plan_n_stages(p) > 1 && plan_strategy(p) == PLAN_HYBRID)
		for (int r = 0; r < plan_n_ranks(p); r++) {
			const plan_rank_t *k = plan_rank(p, r);
			if (r == k->stage0)
				printf("stage %d: ranks %d-%d, layers %d-%d\n", k->stage, k->stage0,
				       k->stage1 - 1, k->layer0, k->layer1);
		}
	printf("candidates:         ranks            decode  aggregate   prefill  mem GB\n");
	for (int i = 0; i < plan_n_candidates(p); i++)
		print_pred(plan_candidate(p, i));
	for (int i = 0; i < plan_n_standby(p); i++) {
		const plan_standby_t *b = plan_standby(p, i);
		printf("%s %.8s %s: %s\n", i ? "       " : "standby", b->node_id,
		       b->host[0] ? b->host : "-", b->reason);
	}
}

int cmd_plan(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"view", required_argument, 0, 'v'},
	    {"model", required_argument, 0, 'm'},
	    {"strategy", required_argument, 0, 's'},
	    {"parallel", required_argument, 0, 'P'},
	    {"slots", required_argument, 0, 'S'},
	    {"hybrid", no_argument, 0, 'Y'},
	    {"ctx", required_argument, 0, 'c'},
	    {"kv-bytes", required_argument, 0, 'k'},
	    {"kv-type", required_argument, 0, 'K'},
	    {"headroom-mb", required_argument, 0, 'H'},
	    {"base-port", required_argument, 0, 'p'},
	    {"out", required_argument, 0, 'o'},
	    {"mlx-list", no_argument, 0, 'M'},
	    {"log-level", required_argument, 0, 'L'},
	    {"help", no_argument, 0, 'h'},
	    {0, 0, 0, 0},
	};
	const char *view_path = NULL, *model_path = NULL, *out = ".";
	plan_opts_t o;
	plan_opts_default(&o);
	int c, x, mlx_list = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'v': view_path = optarg; break;
		case 'm': model_path = optarg; break;
		case 'o': out = optarg; break;
		case 'M': mlx_list = 1; break;
		case 's':
			if ((x = plan_strategy_parse(optarg)) < 0) {
				fprintf(stderr, "shoal plan: --strategy must be auto, tensor, "
						"pipeline or hybrid\n");
				return 2;
			}
			o.strategy = (plan_strategy_t)x;
			break;
		case 'P':
			if (cli_parse_int(optarg, 1, 65536, &o.parallel)) {
				fprintf(stderr, "shoal plan: --parallel must be from 1 to 65536\n");
				return 2;
			}
			break;
		case 'S':
			if (cli_parse_int(optarg, 1, 65536, &o.slots)) {
				fprintf(stderr, "shoal plan: --slots must be from 1 to 65536\n");
				return 2;
			}
			break;
		case 'Y': o.engine_hybrid = 1; break;
		case 'c':
			if (cli_parse_int(optarg, 1, 1 << 24, &o.ctx)) {
				fprintf(stderr, "shoal plan: --ctx must be from 1 to 16777216\n");
				return 2;
			}
			break;
		case 'k':
			if (cli_parse_int(optarg, 1, 8, &o.kv_bytes)) {
				fprintf(stderr, "shoal plan: --kv-bytes must be from 1 to 8\n");
				return 2;
			}
			o.kv_block = 1;
			break;
		case 'K':
			if ((o.kv_bytes = eng_kv_block_bytes(optarg, &o.kv_block)) < 0) {
				fprintf(stderr, "shoal plan: --kv-type must be f32, f16 or q8_0\n");
				return 2;
			}
			break;
		case 'H':
			if (cli_parse_int(optarg, 0, 1 << 30, &x)) {
				fprintf(stderr,
					"shoal plan: --headroom-mb must be a number of MB\n");
				return 2;
			}
			o.headroom_bytes = (uint64_t)x << 20;
			break;
		case 'p':
			if (cli_parse_int(optarg, 1, 65535, &o.base_port)) {
				fprintf(stderr,
					"shoal plan: --base-port must be from 1 to 65535\n");
				return 2;
			}
			break;
		case 'L':
			if (cli_set_log_level(optarg))
				return 2;
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!view_path || !model_path || optind != argc) {
		usage(stderr);
		return 2;
	}
	char err[1024];
	char *text = NULL;
	plan_view_t *v = NULL;
	plan_t *p = NULL;
	plan_model_t m;
	int ret = 1;
	if (read_file_all(view_path, &text, NULL, err, sizeof err))
		goto fail;
	char e[512];
	if (plan_view_from_json(&v, text, e, sizeof e)) {
		snprintf(err, sizeof err, "%s: %s", view_path, e);
		goto fail;
	}
	if (load_model(model_path, &m, err, sizeof err))
		goto fail;
	if (plan_make(&p, v, &m, &o, err, sizeof err))
		goto fail;
	print_table(p);
	print_predictions(p);
	if (agent_plan_write_files(p, out, mlx_list, err, sizeof err))
		goto fail;
	printf("\nwrote hostfile.json, mlx-hosts.json, rdma-devices.json and plan.json in %s\n",
	       out);
	ret = 0;
	goto done;
fail:
	fprintf(stderr, "shoal plan: %s\n", err);
done:
	plan_free(p);
	plan_view_free(v);
	free(text);
	return ret;
}
