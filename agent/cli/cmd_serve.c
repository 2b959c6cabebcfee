/*
 * cmd_serve.c: `shoal serve`: loads one model on this machine and serves the OpenAI-compatible
 * API, the metrics and the dashboard (web/) until SIGINT or SIGTERM.
 *
 * The signals are blocked before any thread starts (so every thread inherits the mask) and taken
 * synchronously with sigwait() on the main thread; shutdown then ends every request cleanly.
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "agent/cli/cli.h"
#include "agent/publish.h"
#include "common/common.h"
#include "infer/infer.h"
#include "web/web.h"

/* What /v1/cluster describes: this node alone (the document the agent builds, publish.h). */
typedef struct one_node {
	const eng_t *eng;
	const char *model, *host;
	atomic_int
	    port; /* the port bound (set once web_new returned; the callback may run before) */
	uint64_t mem_total;
} one_node_t;

static char *one_node_cluster(void *ud)
{
	one_node_t *n = ud;
	const eng_info_t *in = eng_info(n->eng);
	char host[256];
	gethostname(host, sizeof host - 1);
	host[sizeof host - 1] = 0;
	pub_member_t m = {.role = "leader",
			  .rank = 0,
			  .state = "serving",
			  .healthy = 1,
			  .mem_total = n->mem_total,
			  .mem_model = in->weight_bytes};
	/* this node holds every layer, whole (the dashboard's topology says so) */
	plan_rank_t all = {.layer1 = in->n_layers};
	m.holds = &all;
	snprintf(m.id, sizeof m.id, "%s", host);
	snprintf(m.name, sizeof m.name, "%s", host);
	snprintf(m.addr, sizeof m.addr, "%s:%d", n->host, atomic_load(&n->port));
	double share = 1.0;
	pub_cluster_t c = {.state = "serving",
			   .leader = host,
			   .self = host,
			   .n = 1,
			   .members = &m,
			   .strategy = "single",
			   .ranks = 1,
			   .layers = in->n_layers,
			   .n_ctx = in->n_ctx,
			   .shares = &share,
			   .model = n->model};
	return pub_cluster_json(&c);
}

static void usage(FILE *f)
{
	fprintf(
	    f, "usage: shoal serve --model FILE.gguf [OPTIONS]\n\n"
	       "Serves the OpenAI-compatible API (chat and text completions, streaming), /metrics\n"
	       "and a live dashboard at http://HOST:PORT/ from this machine alone.\n\n"
	       "  --model FILE          GGUF model to load (required)\n"
	       "  --host H              address to listen on (default 127.0.0.1; 0.0.0.0 = all)\n"
	       "  --port P              TCP port (default 8080; 0 = any free port, printed)\n"
	       "  --threads N           compute threads (default: number of cores)\n"
	       "  --ctx N               context length of each slot (default: the model's)\n"
	       "  --parallel N          sequences generated together, each with its own KV slot\n"
	       "                        (default 4)\n"
	       "  --kv-type T           KV cache elements: f16 (default), f32 or q8_0\n"
	       "  --queue-max N         requests that may wait; more get 429 (default 16)\n"
	       "  --timeout-ms N        per-request deadline (default 300000)\n"
	       "  --api-key K           require 'Authorization: Bearer K' (or SHOAL_API_KEY)\n"
	       "  --tls-cert F          serve HTTPS with this PEM certificate (chain)\n"
	       "  --tls-key F           and this PEM private key\n"
	       "  --chat-template NAME  chat template family (chatml, llama3, ...) instead of the "
	       "model's\n"
	       "  --model-name NAME     model id reported by the API (default: the file name)\n"
	       "  --dashboard-show-text\n"
	       "                        the dashboard's request table shows prompts and replies\n"
	       "                        (to anyone who can open it; default: tokens and timings)\n"
	       "  --log-level L         error, warn, info, debug (or SHOAL_LOG)\n");
	fputs(CLI_SPEC_USAGE, f);
}

int cmd_serve(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"model", required_argument, NULL, 'm'},
	    {"host", required_argument, NULL, 'H'},
	    {"port", required_argument, NULL, 'p'},
	    {"threads", required_argument, NULL, 't'},
	    {"ctx", required_argument, NULL, 'c'},
	    {"parallel", required_argument, NULL, 'P'},
	    {"kv-type", required_argument, NULL, 1000},
	    {"queue-max", required_argument, NULL, 'q'},
	    {"timeout-ms", required_argument, NULL, 'T'},
	    {"api-key", required_argument, NULL, 'k'},
	    {"chat-template", required_argument, NULL, 'C'},
	    {"model-name", required_argument, NULL, 'n'},
	    {"log-level", required_argument, NULL, 'L'},
	    {"tls-cert", required_argument, NULL, 'E'},
	    {"tls-key", required_argument, NULL, 'Y'},
	    {"dashboard-show-text", no_argument, NULL, 1001},
	    {"help", no_argument, NULL, 'h'},
	    CLI_SPEC_OPTIONS,
	    {NULL, 0, NULL, 0},
	};
	web_opts_t wo;
	web_opts_default(&wo);
	eng_opts_t eo = {0};
	int c, rc;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:H:p:t:c:P:q:T:k:C:n:L:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'm': eo.model_path = optarg; break;
		case 'H': wo.host = optarg; break;
		case 'p':
			if (cli_parse_int(optarg, 0, 65535, &wo.port))
				goto bad;
			break;
		case 't':
			if (cli_parse_int(optarg, 0, 4096, &eo.threads))
				goto bad;
			break;
		case 'c':
			if (cli_parse_int(optarg, 0, 1 << 24, &eo.ctx))
				goto bad;
			break;
		case 'P':
			if (cli_parse_int(optarg, 1, ENG_MAX_PARALLEL, &eo.parallel))
				goto bad;
			break;
		case 'q':
			if (cli_parse_int(optarg, 1, 1 << 20, &wo.queue_max))
				goto bad;
			break;
		case 'T':
			if (cli_parse_int(optarg, 1, 1 << 30, &wo.request_timeout_ms))
				goto bad;
			break;
		case 'k': wo.api_key = optarg; break;
		case 1000: eo.kv_type = optarg; break;
		case 1001: wo.show_text = 1; break;
		case 'C': eo.chat_template = optarg; break;
		case 'n': wo.model_name = optarg; break;
		case 'E': wo.tls_cert = optarg; break;
		case 'Y': wo.tls_key = optarg; break;
		case 'L':
			if ((rc = cli_set_log_level(optarg)) != 0)
				return rc;
			break;
		case 'h': usage(stdout); return 0;
		default: {
			int bad = 0;
			if (!cli_spec_opt(c, optarg, &eo, &bad)) {
				usage(stderr);
				return 2;
			}
			if (bad)
				goto bad;
		}
		}
	}
	if (optind < argc || !eo.model_path) {
		fprintf(stderr, "shoal serve: %s\n",
			optind < argc ? "unexpected argument" : "--model is required");
		usage(stderr);
		return 2;
	}

	/* Before any thread exists, so all of them inherit the mask. */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	/* The model id clients see: --model-name, else the file's name ("stories260K"), which says
	 * more than general.name (often just the architecture). */
	char id[256];
	if (!wo.model_name) {
		const char *base = strrchr(eo.model_path, '/');
		snprintf(id, sizeof id, "%s", base ? base + 1 : eo.model_path);
		size_t n = strlen(id);
		if (n > 5 && !strcasecmp(id + n - 5, ".gguf"))
			id[n - 5] = 0;
		wo.model_name = id;
	}

	char err[256] = "";
	eng_t *eng = NULL;
	web_t *w = NULL;
	if ((rc = eng_open(&eng, &eo, err, sizeof err)) != 0) {
		fprintf(stderr, "shoal serve: %s: %s\n", eo.model_path,
			err[0] ? err : sh_strerror(rc));
		return 1;
	}
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	one_node_t node = {.eng = eng,
			   .model = wo.model_name ? wo.model_name : eng_info(eng)->name,
			   .host = wo.host,
			   .mem_total = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0};
	atomic_init(&node.port, wo.port);
	wo.cluster = one_node_cluster;
	wo.ud = &node;
	if ((rc = web_new(&w, &wo, eng, err, sizeof err)) != 0) {
		fprintf(stderr, "shoal serve: %s\n", err[0] ? err : sh_strerror(rc));
		eng_free(eng);
		return 1;
	}
	atomic_store(&node.port, web_port(w));
	const eng_info_t *in = eng_info(eng);
	fprintf(stderr,
		"shoal serve: model %s (%s, context %d, %d slots, speculative decoding %s%s%s) on "
		"%s://%s:%d/\n",
		wo.model_name ? wo.model_name : in->name, in->arch, in->n_ctx, in->n_slots,
		in->spec, in->draft ? ", draft " : "", in->draft ? in->draft : "",
		wo.tls_cert ? "https" : "http", wo.host, web_port(w));
	fflush(stderr);

	int sig = 0;
	sigwait(&sigs, &sig);
	LOG(LOG_INFO, "serve: signal %d, stopping", sig);
	web_free(w);
	eng_free(eng);
	return 0;
bad:
	fprintf(stderr, "shoal serve: bad value '%s' for an option\n", optarg);
	usage(stderr);
	return 2;
}
