/*
 * cmd_agent.c: `shoal agent`, the command every machine runs. Parses the flags, reads the token
 * (flag, file or SHOAL_TOKEN: the latter two keep it out of `ps`), derives the keys once, wipes
 * its copies of the token, and runs the agent until SIGINT/SIGTERM.
 */
#include "agent/agent.h"
#include "agent/cli/cli.h"
#include "agent/session/exec.h"
#include "common/common.h"
#include "infer/infer.h"
#include "planner/planner.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static agent_t *running;

static void on_signal(int sig)
{
	(void)sig;
	if (running)
		agent_stop(running);
}

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: shoal agent --token T | --token-file F [OPTIONS]\n\n"
	    "Joins (or forms) the cluster of every agent on the local network with the same "
	    "token:\n"
	    "finds peers by mDNS, authenticates them with the token, elects the node with the\n"
	    "smallest ID as leader. The token may also come from SHOAL_TOKEN.\n\n"
	    "options:\n"
	    "  --token T          the cluster's shared secret (visible in ps: prefer the others)\n"
	    "  --token-file F     read the token from F (first line)\n"
	    "  --port P           control port (default %d; 0 = any)\n"
	    "  --http-port P      API port (default %d)\n"
	    "  --state-dir D      node ID and sockets (default $XDG_STATE_HOME/shoal,\n"
	    "                     ~/.local/state/shoal, /var/lib/shoal for root)\n"
	    "  --expect N         the view is settled as soon as N members are present\n"
	    "  --settle S         seconds a view must stay unchanged to be settled (default 1)\n"
	    "  --peer HOST:PORT   also connect to this agent (repeatable; for networks without "
	    "mDNS)\n"
	    "  --no-mdns          static peers only\n"
	    "  --model M          the GGUF model to serve (checked against the leader's by hash)\n"
	    "  --replan-delay MS  wait this long after a membership change before re-planning\n"
	    "                     (default 500)\n"
	    "  --step-timeout MS  bound on one tensor-parallel step (default 10000)\n"
	    "  --threads N        compute threads (default: the number of cores)\n"
	    "  --ctx N            context length of each slot (default: the model's)\n"
	    "  --parallel N       sequences generated together, each with its own KV slot\n"
	    "                     (default 4; the leader's value holds for the cluster)\n"
	    "  --kv-type T        KV cache elements: f16 (default), f32 or q8_0\n" CLI_SPEC_USAGE
	    "                        (these act where the node is rank 0: the others verify)\n"
	    "  --strategy S       auto (default: the fastest plan predicted from the measured\n"
	    "                     links and compute), tensor, pipeline or hybrid (forced; the\n"
	    "                     leader's value holds for the cluster)\n"
	    "  --memory-limit L   memory the model may take here: BYTES (K, M, G, T) or PCT%%\n"
	    "                     (default: what the system has available at start)\n"
	    "  --api-key K        require 'Authorization: Bearer K' on the API (or SHOAL_API_KEY)\n"
	    "  --api-key-file F   read that key from F (first line): keeps it out of ps\n"
	    "  --tls-cert F       serve the API over HTTPS with this PEM certificate (chain)\n"
	    "  --tls-key F        and this PEM private key\n"
	    "  --exec 'CMD ...'   run CMD (sh -c) on every node while a plan is in force, with "
	    "the\n"
	    "                     environment mlx.launch gives its rank (MLX_RANK, MLX_HOSTFILE\n"
	    "                     or MLX_IBV_DEVICES + MLX_JACCL_COORDINATOR, ...; docs/mlx.md);\n"
	    "                     restarted on a new plan. shoal then loads no model share (the\n"
	    "                     model still sizes the plan) and the leader's /v1/ goes to CMD\n"
	    "  --exec-port P      port rank 0's CMD serves the API on (default %d; 0 = no proxy)\n"
	    "  --dashboard-show-text\n"
	    "                     the dashboard's request table shows prompts and replies (to\n"
	    "                     anyone who can open it; default: tokens and timings only)\n"
	    "  --log-level L      error, warn, info (default), debug\n",
	    AGENT_DEFAULT_PORT, AGENT_DEFAULT_HTTP_PORT, EXEC_DEFAULT_PORT);
}

/* An existing state directory that others may write to lets them swap the node's key, plans or
 * model copies: warn, and narrow it to 0700 when it is ours. */
static void state_dir_check(const char *dir)
{
	struct stat st;
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || !(st.st_mode & 077))
		return;
	if (st.st_mode & S_IWOTH)
		LOG(LOG_WARN, "agent: state directory %s is world-writable (mode %03o)", dir,
		    (unsigned)(st.st_mode & 0777));
	if (st.st_uid == geteuid() && chmod(dir, 0700) == 0)
		LOG(LOG_WARN, "agent: state directory %s: mode %03o -> 700", dir,
		    (unsigned)(st.st_mode & 0777));
}

static int read_token_file(const char *path, char *out, size_t cap)
{
	char *text = NULL, err[256];
	size_t n = 0;
	if (read_file_all(path, &text, &n, err, sizeof err)) {
		fprintf(stderr, "shoal agent: %s\n", err);
		return -1;
	}
	size_t len = strcspn(text, "\r\n");
	if (len >= cap) {
		fprintf(stderr, "shoal agent: token in %s is too long\n", path);
		sodium_memzero(text, n);
		free(text);
		return -1;
	}
	memcpy(out, text, len);
	out[len] = 0;
	sodium_memzero(text, n);
	free(text);
	return 0;
}

int cmd_agent(int argc, char **argv)
{
	static const struct option opts[] = {{"token", required_argument, 0, 't'},
					     {"token-file", required_argument, 0, 'f'},
					     {"port", required_argument, 0, 'p'},
					     {"http-port", required_argument, 0, 'H'},
					     {"state-dir", required_argument, 0, 'd'},
					     {"expect", required_argument, 0, 'e'},
					     {"settle", required_argument, 0, 's'},
					     {"peer", required_argument, 0, 'P'},
					     {"model", required_argument, 0, 'm'},
					     {"log-level", required_argument, 0, 'l'},
					     {"no-mdns", no_argument, 0, 'N'},
					     {"replan-delay", required_argument, 0, 'R'},
					     {"step-timeout", required_argument, 0, 'S'},
					     {"threads", required_argument, 0, 'T'},
					     {"ctx", required_argument, 0, 'C'},
					     {"memory-limit", required_argument, 0, 'M'},
					     {"api-key", required_argument, 0, 'k'},
					     {"api-key-file", required_argument, 0, 'K'},
					     {"tls-cert", required_argument, 0, 'c'},
					     {"tls-key", required_argument, 0, 'y'},
					     {"exec", required_argument, 0, 'X'},
					     {"exec-port", required_argument, 0, 'Y'},
					     {"parallel", required_argument, 0, 'J'},
					     {"kv-type", required_argument, 0, 'V'},
					     {"dashboard-show-text", no_argument, 0, 'D'},
					     {"strategy", required_argument, 0, 'G'},
					     {"help", no_argument, 0, 'h'},
					     CLI_SPEC_OPTIONS,
					     {0, 0, 0, 0}};
	agent_config_t cfg = {.port = AGENT_DEFAULT_PORT,
			      .http_port = AGENT_DEFAULT_HTTP_PORT,
			      .settle_ms = 1000,
			      .replan_delay_ms = 500,
			      .step_timeout_ms = 10000,
			      .exec_port = EXEC_DEFAULT_PORT};
	eng_opts_t spec = {0}; /* --spec, --draft-model, --draft-max (cli_spec_opt) */
	char token[1024] = "", state_dir[SH_PATH_MAX] = "", err[512], api_key[1024] = "";
	int c, rc = 1;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 't': snprintf(token, sizeof token, "%s", optarg); break;
		case 'f':
			if (read_token_file(optarg, token, sizeof token))
				return 1;
			break;
		case 'p':
		case 'H':
			if (cli_parse_int(optarg, 0, 65535,
					  c == 'p' ? &cfg.port : &cfg.http_port)) {
				fprintf(stderr, "shoal agent: bad port '%s'\n", optarg);
				return 2;
			}
			break;
		case 'd': snprintf(state_dir, sizeof state_dir, "%s", optarg); break;
		case 'X':
			if (!*optarg) {
				fprintf(stderr, "shoal agent: --exec wants a command\n");
				return 2;
			}
			cfg.exec_cmd = optarg;
			break;
		case 'Y':
			if (cli_parse_int(optarg, 0, 65535, &cfg.exec_port)) {
				fprintf(stderr, "shoal agent: bad --exec-port '%s'\n", optarg);
				return 2;
			}
			break;
		case 'e':
			if (cli_parse_int(optarg, 0, DISC_MAX_PEERS, &cfg.expect)) {
				fprintf(stderr, "shoal agent: bad --expect '%s'\n", optarg);
				return 2;
			}
			break;
		case 's': {
			double sec;
			if (cli_parse_num(optarg, 0, 3600, &sec)) {
				fprintf(stderr, "shoal agent: bad --settle '%s' (seconds)\n",
					optarg);
				return 2;
			}
			cfg.settle_ms = (int64_t)(sec * 1000);
			break;
		}
		case 'P':
			if (cfg.npeers == AGENT_MAX_STATIC_PEERS) {
				fprintf(stderr, "shoal agent: at most %d --peer\n",
					AGENT_MAX_STATIC_PEERS);
				return 2;
			}
			{
				char h[256], perr[128];
				int pp;
				if (tp_hostport_parse(optarg, h, sizeof h, &pp, perr,
						      sizeof perr)) {
					fprintf(stderr, "shoal agent: --peer wants HOST:PORT: %s\n",
						perr);
					return 2;
				}
			}
			cfg.peers[cfg.npeers++] = optarg;
			break;
		case 'm': cfg.model = optarg; break;
		case 'M': cfg.memory_limit = optarg; break;
		case 'k': snprintf(api_key, sizeof api_key, "%s", optarg); break;
		case 'K':
			if (read_token_file(optarg, api_key, sizeof api_key))
				return 1;
			break;
		case 'c': cfg.tls_cert = optarg; break;
		case 'y': cfg.tls_key = optarg; break;
		case 'D': cfg.dashboard_show_text = 1; break;
		case 'G':
			if ((cfg.strategy = plan_strategy_parse(optarg)) < 0) {
				fprintf(stderr,
					"shoal agent: bad --strategy '%s' (auto, tensor, pipeline, "
					"hybrid)\n",
					optarg);
				return 2;
			}
			break;
		case 'V':
			if (eng_kv_elem_bytes(optarg) < 0) {
				fprintf(stderr,
					"shoal agent: bad --kv-type '%s' (f16, f32, q8_0)\n",
					optarg);
				return 2;
			}
			cfg.kv_type = optarg;
			break;
		case 'N': cfg.no_mdns = 1; break;
		case 'R':
		case 'S':
		case 'T':
		case 'J':
		case 'C': {
			static const struct {
				int opt;
				const char *name;
				long lo, hi;
			} lim[] = {{'R', "--replan-delay", 0, 600000},
				   {'S', "--step-timeout", 100, 3600000},
				   {'T', "--threads", 0, 1024},
				   {'C', "--ctx", 0, 1 << 24},
				   {'J', "--parallel", 1, ENG_MAX_PARALLEL}};
			/* durations may say their unit: "500ms" */
			char num[32];
			size_t len = strlen(optarg);
			snprintf(num, sizeof num, "%s", len < sizeof num ? optarg : "-");
			if ((c == 'R' || c == 'S') && len > 2 && len < sizeof num &&
			    !strcmp(optarg + len - 2, "ms"))
				num[len - 2] = 0;
			int v = 0;
			for (size_t i = 0; i < ARRAY_LEN(lim); i++)
				if (lim[i].opt == c &&
				    cli_parse_int(num, lim[i].lo, lim[i].hi, &v)) {
					fprintf(stderr, "shoal agent: bad %s '%s' (%ld to %ld)\n",
						lim[i].name, optarg, lim[i].lo, lim[i].hi);
					return 2;
				}
			if (c == 'R')
				cfg.replan_delay_ms = v;
			else if (c == 'S')
				cfg.step_timeout_ms = v;
			else if (c == 'T')
				cfg.threads = v;
			else if (c == 'J')
				cfg.parallel = v;
			else
				cfg.ctx = v;
			break;
		}
		case 'l':
			if (cli_set_log_level(optarg))
				return 2;
			break;
		case 'h': usage(stdout); return 0;
		default: {
			int bad = 0;
			if (!cli_spec_opt(c, optarg, &spec, &bad)) {
				usage(stderr);
				return 2;
			}
			if (bad) {
				fprintf(stderr, "shoal agent: bad value '%s' for an option\n",
					optarg);
				return 2;
			}
		}
		}
	}
	if (optind < argc) {
		fprintf(stderr, "shoal agent: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	/* the engine opens the draft only once a plan makes this node rank 0: a file it cannot
	 * read, or --spec model without one, would then fail every plan; say so now instead */
	if (spec.draft_model) {
		struct stat st;
		int fd = open(spec.draft_model, O_RDONLY | O_CLOEXEC), e = errno;
		if (fd >= 0)
			e = fstat(fd, &st) ? errno : S_ISREG(st.st_mode) ? 0 : EISDIR;
		if (fd >= 0)
			close(fd);
		if (fd < 0 || e) {
			fprintf(stderr, "shoal agent: --draft-model %s: %s\n", spec.draft_model,
				strerror(e));
			return 1;
		}
	}
	if (spec.spec && !strcmp(spec.spec, "model") && !spec.draft_model) {
		fprintf(stderr, "shoal agent: --spec model needs --draft-model\n");
		return 2;
	}
	cfg.spec = spec.spec;
	cfg.draft_model = spec.draft_model;
	cfg.draft_max = spec.draft_max;
	if (!token[0] && getenv("SHOAL_TOKEN"))
		snprintf(token, sizeof token, "%s", getenv("SHOAL_TOKEN"));
	if (!token[0]) {
		fprintf(
		    stderr,
		    "shoal agent: a token is required (--token, --token-file or SHOAL_TOKEN)\n");
		return 2;
	}
	if (!state_dir[0] && disc_state_dir_default(state_dir, sizeof state_dir)) {
		fprintf(stderr,
			"shoal agent: cannot work out a state directory; pass --state-dir\n");
		return 2;
	}
	cfg.state_dir = state_dir;
	if (!cfg.tls_cert != !cfg.tls_key) {
		fprintf(stderr, "shoal agent: --tls-cert and --tls-key go together\n");
		return 2;
	}
	cfg.api_key = api_key[0] ? api_key : NULL;
	/* Node key, plans, model copies, agent.sock: this user's alone, whatever the umask. */
	umask(077);
	state_dir_check(state_dir);

	tp_keys_t keys;
	int64_t t0 = now_ms();
	int krc = tp_keys_derive(&keys, token, strlen(token), err, sizeof err);
	sodium_memzero(token, sizeof token);
	if (krc) {
		fprintf(stderr, "shoal agent: %s\n", err);
		return 1;
	}
	LOG(LOG_INFO, "agent: keys derived in %lld ms (Argon2id)", (long long)(now_ms() - t0));
	agent_t *a = agent_new(&cfg, &keys, err, sizeof err);
	tp_keys_wipe(&keys);
	if (!a) {
		fprintf(stderr, "shoal agent: %s\n", err);
		return 1;
	}
	running = a;
	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	int r = agent_run(a);
	if (r)
		fprintf(stderr, "shoal agent: %s\n", sh_strerror(r));
	else
		rc = 0;
	running = NULL;
	LOG(LOG_INFO, "agent: stopping");
	agent_free(a);
	sodium_memzero(api_key, sizeof api_key);
	return rc;
}
