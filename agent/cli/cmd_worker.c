/*
 * cmd_worker.c: `shoal worker`, one rank of a manually started group (like mlx.launch's manual
 * ranks). Every rank is started with the same --world, --peers, token and model; the ranks form
 * the authenticated group (transport.h), agree on the setup, and then rank 0 runs exactly what
 * `shoal generate` runs (same flags, same output) while the others compute their shares of each
 * step until rank 0 is done or the group fails.
 *
 * Shares: a --plan's ranges for this rank (and its stage: a hybrid plan's tensor group); else
 * split by --shares weights (even by default) as the planner splits (infer/tp.c dist_split).
 */
#include "agent/cli/cli.h"
#include "common/common.h"
#include "infer/infer.h"
#include "planner/planner.h"
#include "transport/transport.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: shoal worker --rank R --world N --peers H0:P0,H1:P1,... --model FILE.gguf\n"
	    "                    [--token T | --token-file F | SHOAL_TOKEN] [options]\n"
	    "  --plan plan.json        shares, strategy and (without --peers) addresses from a "
	    "plan\n"
	    "  --rdma-devices FILE     JACCL device matrix (docs/rdma.md); TCP where it fails\n"
	    "  --strategy S            tensor (default) or pipeline; a hybrid comes from a "
	    "--plan\n"
	    "  --shares A:B:...        relative shares without a plan (default even)\n"
	    "  --step-timeout MS       bound on every wait inside a step (default 10000)\n"
	    "  --q8-wire               all-reduce 8-bit blocks on the wire (slow links; every "
	    "rank\n"
	    "                          must say so; results then differ slightly from one rank)\n"
	    "  --join-timeout MS       time for all ranks to connect (default 60000)\n"
	    "  --threads N, --ctx N, --kv-type T, --log-level L, --stats\n"
	    "rank 0 also takes the `shoal generate` flags (--prompt/--chat, --max-tokens, ...) "
	    "and\n"
	    "prints its output exactly as `shoal generate` does.\n");
}

typedef struct wopts {
	int rank, world, step_timeout, join_timeout, pipeline, hybrid, stats, q8_wire;
	const char *peers, *token, *token_file, *plan, *rdma, *model, *kv_type;
	int threads, ctx;
	int weights[TP_MAX_WORLD], n_weights;
} wopts_t;

/* "--name value" or "--name=value": returns the value and advances *i, or NULL. */
static const char *flag_val(int argc, char **argv, int *i, const char *name, int *bad)
{
	const char *a = argv[*i];
	size_t n = strlen(name);
	if (strncmp(a, name, n))
		return NULL;
	if (a[n] == '=')
		return a + n + 1;
	if (a[n])
		return NULL;
	if (*i + 1 >= argc) {
		*bad = 1;
		return NULL;
	}
	return argv[++*i];
}

/* Splits worker flags from the rest (which go to cli_generate on rank 0). rest gets argv[0] then
 * the other arguments; *n_rest their count. Returns 0, or 2 on a usage error. */
static int parse(int argc, char **argv, wopts_t *o, char **rest, int *n_rest)
{
	*n_rest = 0;
	rest[(*n_rest)++] = argv[0];
	for (int i = 1; i < argc; i++) {
		int bad = 0;
		const char *v;
		if ((v = flag_val(argc, argv, &i, "--rank", &bad)))
			bad = cli_parse_int(v, 0, TP_MAX_WORLD - 1, &o->rank);
		else if ((v = flag_val(argc, argv, &i, "--world", &bad)))
			bad = cli_parse_int(v, 1, TP_MAX_WORLD, &o->world);
		else if ((v = flag_val(argc, argv, &i, "--peers", &bad)))
			o->peers = v;
		else if ((v = flag_val(argc, argv, &i, "--token-file", &bad)))
			o->token_file = v;
		else if ((v = flag_val(argc, argv, &i, "--token", &bad)))
			o->token = v;
		else if ((v = flag_val(argc, argv, &i, "--plan", &bad)))
			o->plan = v;
		else if (!strcmp(argv[i], "--q8-wire"))
			o->q8_wire = 1;
		else if ((v = flag_val(argc, argv, &i, "--rdma-devices", &bad)))
			o->rdma = v;
		else if ((v = flag_val(argc, argv, &i, "--step-timeout", &bad)))
			bad = cli_parse_int(v, 1, 3600000, &o->step_timeout);
		else if ((v = flag_val(argc, argv, &i, "--join-timeout", &bad)))
			bad = cli_parse_int(v, 1, 3600000, &o->join_timeout);
		else if ((v = flag_val(argc, argv, &i, "--strategy", &bad))) {
			if (!strcmp(v, "pipeline"))
				o->pipeline = 1;
			else if (!strcmp(v, "hybrid"))
				o->hybrid = 1;
			else if (strcmp(v, "tensor"))
				bad = 1;
		} else if ((v = flag_val(argc, argv, &i, "--shares", &bad))) {
			/* A:B:C, each a whole number */
			o->n_weights = 0;
			for (const char *p = v;; p += strcspn(p, ":") + 1) {
				char num[16];
				size_t k = strcspn(p, ":");
				bad = k >= sizeof num || o->n_weights == TP_MAX_WORLD;
				if (!bad) {
					memcpy(num, p, k);
					num[k] = 0;
					bad = cli_parse_int(num, 1, 1000000,
							    &o->weights[o->n_weights++]);
				}
				if (bad || !p[k])
					break;
			}
		} else {
			/* shared with generate: remember what the other ranks need too */
			const char *a = argv[i];
			rest[(*n_rest)++] = argv[i];
			if ((v = flag_val(argc, argv, &i, "--model", &bad)))
				o->model = v;
			else if ((v = flag_val(argc, argv, &i, "--threads", &bad)))
				bad = cli_parse_int(v, 0, 1024, &o->threads);
			else if ((v = flag_val(argc, argv, &i, "--ctx", &bad)))
				bad = cli_parse_int(v, 0, 1 << 24, &o->ctx);
			else if ((v = flag_val(argc, argv, &i, "--kv-type", &bad)))
				o->kv_type = v;
			else if ((v = flag_val(argc, argv, &i, "--log-level", &bad)))
				bad = cli_set_log_level(v) != 0;
			else if (!strcmp(a, "--stats"))
				o->stats = 1;
			else if (!strcmp(a, "--help") || !strcmp(a, "-h"))
				return 3;
			if (v && argv[i] != a) /* "--name value": keep the value too */
				rest[(*n_rest)++] = argv[i];
		}
		if (bad) {
			fprintf(stderr, "shoal worker: bad or missing value for %s\n", argv[i]);
			return 2;
		}
	}
	rest[*n_rest] = NULL;
	return 0;
}

/* "h0:p0,h1:p1" (IPv6 as [addr]:port) into hosts/ports; returns the count or -1. */
static int parse_peers(char *s, const char **hosts, int *ports, int max)
{
	int n = 0;
	char *save = NULL;
	for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n == max)
			return -1;
		char *colon = strrchr(tok, ':');
		if (!colon || colon == tok || cli_parse_int(colon + 1, 1, 65535, &ports[n]))
			return -1;
		*colon = 0;
		if (tok[0] == '[' && colon[-1] == ']') {
			colon[-1] = 0;
			tok++;
		}
		hosts[n++] = tok;
	}
	return n;
}

/* The token from --token, SHOAL_TOKEN or --token-file (first line), into a malloc'd string. */
static char *token_get(const wopts_t *o)
{
	if (o->token)
		return strdup(o->token);
	const char *env = getenv("SHOAL_TOKEN");
	if (env && *env)
		return strdup(env);
	if (!o->token_file)
		return NULL;
	char *t = NULL;
	size_t len = 0;
	char why[256];
	if (read_file_all(o->token_file, &t, &len, why, sizeof why)) {
		fprintf(stderr, "shoal worker: %s\n", why);
		return NULL;
	}
	t[strcspn(t, "\r\n")] = 0;
	return t;
}

static int load_plan(const char *path, plan_t **out, char *err, size_t errlen)
{
	char *text = NULL, why[256];
	size_t len = 0;
	int rc = read_file_all(path, &text, &len, why, sizeof why);
	if (rc)
		return sh_fail(err, errlen, rc, "%s", why);
	rc = plan_from_json(out, text, why, sizeof why);
	free(text);
	return rc ? sh_fail(err, errlen, rc, "%s: %s", path, why) : 0;
}

int cmd_worker(int argc, char **argv)
{
	wopts_t o = {.rank = -1, .world = 0, .step_timeout = 10000, .join_timeout = 60000};
	char **rest = calloc((size_t)argc + 1, sizeof *rest);
	char *peers = NULL, *token = NULL, err[320];
	const char *hosts[TP_MAX_WORLD];
	int ports[TP_MAX_WORLD], n_rest, ret = 1, rc;
	plan_t *plan = NULL;
	tp_group_t *group = NULL;
	eng_t *e = NULL;
	tp_keys_t keys;
	memset(&keys, 0, sizeof keys);
	if (!rest)
		return 1;
	if ((rc = parse(argc, argv, &o, rest, &n_rest))) {
		if (rc == 3) {
			usage(stdout);
			ret = 0;
		} else {
			usage(stderr);
			ret = 2;
		}
		goto out;
	}
	eng_dist_t dist = {0};
	dist.pipeline = o.pipeline;
	dist.step_timeout_ms = o.step_timeout;
	if (o.plan) {
		if (load_plan(o.plan, &plan, err, sizeof err)) {
			fprintf(stderr, "shoal worker: %s\n", err);
			goto out;
		}
		if (!o.world)
			o.world = plan_n_ranks(plan);
		dist.pipeline = plan_strategy(plan) == PLAN_PIPELINE;
		o.q8_wire |= plan_q8_wire(plan);
	}
	if (o.hybrid && !plan) {
		fprintf(stderr, "shoal worker: --strategy hybrid takes its stages from a plan: "
				"--plan plan.json (shoal plan --strategy hybrid)\n");
		ret = 2;
		goto out;
	}
	if (o.rank < 0 || o.world < 1 || o.rank >= o.world || !o.model || (!o.peers && !plan) ||
	    (o.n_weights && o.n_weights != o.world)) {
		fprintf(stderr, "shoal worker: need --rank R < --world N, --model, --peers (or "
				"--plan), and N --shares if any\n");
		usage(stderr);
		ret = 2;
		goto out;
	}
	if (plan) {
		const plan_rank_t *pr = plan_rank(plan, o.rank);
		if (plan_n_ranks(plan) != o.world || !pr) {
			fprintf(stderr, "shoal worker: the plan has %d ranks, not %d\n",
				plan_n_ranks(plan), o.world);
			ret = 2;
			goto out;
		}
		dist.has_ranges = 1;
		dist.q0 = pr->q0, dist.q1 = pr->q1, dist.kv0 = pr->kv0, dist.kv1 = pr->kv1;
		dist.ffn0 = pr->ffn0, dist.ffn1 = pr->ffn1;
		dist.layer0 = pr->layer0, dist.layer1 = pr->layer1;
		dist.exp0 = pr->exp0, dist.exp1 = pr->exp1, dist.shx0 = pr->shx0,
		dist.shx1 = pr->shx1;
		dist.stage0 = pr->stage0, dist.stage1 = pr->stage1; /* hybrid: its tensor group */
		for (int r = 0; !o.peers && r < o.world; r++) {
			hosts[r] = plan_rank(plan, r)->ip;
			ports[r] = plan_rank(plan, r)->port;
		}
	}
	if (o.peers) {
		peers = strdup(o.peers);
		if (!peers || parse_peers(peers, hosts, ports, TP_MAX_WORLD) != o.world) {
			fprintf(stderr, "shoal worker: --peers needs %d HOST:PORT entries\n",
				o.world);
			ret = 2;
			goto out;
		}
	}
	if (o.n_weights)
		dist.weights = o.weights;
	if (!(token = token_get(&o)) || !*token) {
		fprintf(stderr, "shoal worker: no token (--token, SHOAL_TOKEN or --token-file)\n");
		ret = 2;
		goto out;
	}
	if (sodium_init() < 0 || tp_keys_derive(&keys, token, strlen(token), err, sizeof err)) {
		fprintf(stderr, "shoal worker: %s\n", err);
		goto out;
	}
	sodium_memzero(token, strlen(token));

	uint8_t id[TP_NODE_ID_BYTES];
	randombytes_buf(id, sizeof id);
	tp_group_cfg_t gc = {
	    .rank = o.rank,
	    .world = o.world,
	    .hosts = hosts,
	    .ports = ports,
	    .listen_fd = -1,
	    .tag = plan ? plan_epoch(plan) : 0x73686f616c776b31ull, /* "shoalwk1" */
	    .keys = &keys,
	    .node_id = id,
	    .timeout_ms = o.join_timeout,
	    .rdma_devices = o.rdma,
	};
	LOG(LOG_INFO, "rank %d/%d: forming the group (listening on port %d)", o.rank, o.world,
	    ports[o.rank]);
	if (tp_group_new(&group, &gc, err, sizeof err)) {
		fprintf(stderr, "shoal worker: rank %d: cannot form the group: %s\n", o.rank, err);
		goto out;
	}
	tp_keys_wipe(&keys);
	if (o.q8_wire)
		tp_group_set_q8(group, 1);
	for (int r = 0; r < o.world; r++)
		if (r != o.rank)
			LOG(LOG_INFO, "rank %d: link to rank %d: %s", o.rank, r,
			    tp_group_link(group, r));
	dist.group = group;
	if (o.rank == 0) {
		ret = cli_generate(n_rest, rest, "worker", &dist);
		goto out;
	}
	eng_opts_t eo = {.model_path = o.model,
			 .threads = o.threads,
			 .ctx = o.ctx,
			 .dist = &dist,
			 .kv_type = o.kv_type,
			 .parallel = 1}; /* rank 0 runs one prompt */
	if (eng_open(&e, &eo, err, sizeof err)) {
		fprintf(stderr, "shoal worker: rank %d: %s\n", o.rank, err);
		goto out;
	}
	rc = eng_worker_run(e, err, sizeof err);
	if (o.stats)
		cli_comm_stats(e);
	if (rc) {
		fprintf(stderr, "shoal worker: rank %d: %s\n", o.rank, err);
		goto out;
	}
	ret = 0;
out:
	eng_free(e);
	tp_group_free(group);
	tp_keys_wipe(&keys);
	if (token) {
		sodium_memzero(token, strlen(token));
		free(token);
	}
	plan_free(plan);
	free(peers);
	free(rest);
	return ret;
}
