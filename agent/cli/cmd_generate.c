/* cmd_generate.c: `shoal generate`: one request on this machine through the engine (infer.h).
 * Streams text to stdout as it is produced; --ids prints only the generated ids, --top-logprobs
 * one JSON line per step; --stats adds speed figures on stderr. Errors are one line on stderr and
 * exit code 1 (2 for usage errors). */
#include "agent/cli/cli.h"
#include "common/common.h"
#include "infer/infer.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STOPS 16

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: shoal generate --model FILE.gguf (--prompt TEXT | --chat MESSAGE) [options]\n"
	    "  --max-tokens N        stop after N tokens (default 256; 0 = until EOS/context end)\n"
	    "  --ignore-eos          never sample end-of-generation tokens (benchmarks)\n"
	    "  --temperature T       0 = greedy (default)\n"
	    "  --top-k K, --top-p P, --min-p P\n"
	    "  --repeat-penalty R, --presence-penalty P, --frequency-penalty F\n"
	    "  --seed S              sampling seed (default: from the clock)\n"
	    "  --stop TEXT           stop string (repeatable, up to %d)\n"
	    "  --threads N           compute threads (default: all cores)\n"
	    "  --ctx N               context length (default: the model's, capped by memory)\n"
	    "  --kv-type T           KV cache elements: f16 (default), f32 or q8_0\n" CLI_SPEC_USAGE
	    "  --system TEXT         system message for --chat\n"
	    "  --chat-template NAME  template family override (chatml, llama3, ...)\n"
	    "  --ids                 print the generated token ids on one line instead of text\n"
	    "  --top-logprobs K      print one JSON line per token with the top K alternatives\n"
	    "  --stats               print prompt and generation speed to stderr\n",
	    MAX_STOPS);
}

typedef struct gen_out {
	int ids_only;
	int json;
	int n;
} gen_out_t;

static void json_str(FILE *f, const char *s, size_t n)
{
	fputc('"', f);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", f);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

static int on_token(void *ud, const eng_token_t *t)
{
	gen_out_t *o = ud;
	if (o->json) {
		printf("{\"id\":%d,\"text\":", t->id);
		json_str(stdout, t->text, t->text_len);
		printf(",\"logprob\":%.6f,\"top\":[", t->logprob);
		for (int i = 0; i < t->n_top; i++)
			printf("%s{\"id\":%d,\"logprob\":%.6f}", i ? "," : "", t->top[i].token,
			       t->top[i].logprob);
		printf("]}\n");
	} else if (o->ids_only) {
		printf("%s%d", o->n ? " " : "", t->id);
	} else {
		fwrite(t->text, 1, t->text_len, stdout);
	}
	o->n++;
	fflush(stdout);
	return 0;
}

void cli_spec_stats(const eng_t *e)
{
	eng_spec_stats_t s;
	eng_spec_stats(e, &s);
	const eng_info_t *i = eng_info(e);
	if (!strcmp(i->spec, "off"))
		return;
	fprintf(stderr,
		"speculative decoding %s%s%s: %llu verifies, %llu of %llu drafted tokens accepted "
		"(%.1f%%), %.2f tokens per verify, drafting %.1f ms\n",
		i->spec, i->draft ? ", draft " : "", i->draft ? i->draft : "",
		(unsigned long long)s.verifies, (unsigned long long)s.accepted,
		(unsigned long long)s.drafted, s.drafted ? 100.0 * s.accepted / s.drafted : 0.0,
		s.verifies ? (double)s.emitted / s.verifies : 0.0, s.draft_ms);
}

void cli_comm_stats(const eng_t *e)
{
	eng_comm_t c;
	eng_comm_stats(e, &c);
	const eng_info_t *i = eng_info(e);
	double per = c.steps ? 1.0 / (double)c.steps : 0;
	fprintf(stderr,
		"rank %d/%d: %llu steps, %llu tokens; communication %.3f ms per step (%.1f%% of "
		"%.3f ms), least %.3f ms; %.0f bytes sent per token\n",
		i->rank, i->world, (unsigned long long)c.steps, (unsigned long long)c.tokens,
		c.comm_ms * per, c.step_ms > 0 ? 100.0 * c.comm_ms / c.step_ms : 0.0,
		c.step_ms * per, c.comm_min_ms,
		c.tokens ? (double)c.bytes_sent / (double)c.tokens : 0.0);
}

int cmd_generate(int argc, char **argv)
{
	return cli_generate(argc, argv, "generate", NULL);
}

int cli_generate(int argc, char **argv, const char *name, const eng_dist_t *dist)
{
	static const struct option opts[] = {
	    {"model", required_argument, 0, 'm'},
	    {"prompt", required_argument, 0, 'p'},
	    {"chat", required_argument, 0, 'c'},
	    {"system", required_argument, 0, 'S'},
	    {"max-tokens", required_argument, 0, 'n'},
	    {"temperature", required_argument, 0, 'T'},
	    {"top-k", required_argument, 0, 'k'},
	    {"top-p", required_argument, 0, 'P'},
	    {"min-p", required_argument, 0, 'M'},
	    {"repeat-penalty", required_argument, 0, 'r'},
	    {"presence-penalty", required_argument, 0, 'e'},
	    {"frequency-penalty", required_argument, 0, 'f'},
	    {"seed", required_argument, 0, 's'},
	    {"stop", required_argument, 0, 'x'},
	    {"threads", required_argument, 0, 't'},
	    {"ctx", required_argument, 0, 'C'},
	    {"kv-type", required_argument, 0, 1000},
	    CLI_SPEC_OPTIONS,
	    {"chat-template", required_argument, 0, 'y'},
	    {"ids", no_argument, 0, 'i'},
	    {"top-logprobs", required_argument, 0, 'l'},
	    {"stats", no_argument, 0, 'z'},
	    {"ignore-eos", no_argument, 0, 1001},
	    {"log-level", required_argument, 0, 'L'},
	    {"help", no_argument, 0, 'h'},
	    {0, 0, 0, 0},
	};
	eng_opts_t eo = {.parallel = 1}; /* one request: one KV slot */
	eo.dist = dist;
	eng_sampling_t sp;
	eng_sampling_default(&sp);
	sp.max_tokens = 256;
	sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)now_ns() << 16);
	const char *prompt = NULL, *chat = NULL, *system = NULL, *stops[MAX_STOPS];
	int n_stop = 0, stats = 0, c;
	gen_out_t out = {0};
	double v = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:p:h", opts, NULL)) != -1) {
		int bad = 0;
		switch (c) {
		case 'm': eo.model_path = optarg; break;
		case 'p': prompt = optarg; break;
		case 'c': chat = optarg; break;
		case 'S': system = optarg; break;
		case 'n': bad = cli_parse_int(optarg, 0, 1 << 24, &sp.max_tokens); break;
		case 'T':
			bad = cli_parse_num(optarg, 0, 100, &v);
			sp.temperature = (float)v;
			break;
		case 'k': bad = cli_parse_int(optarg, 0, 1 << 24, &sp.top_k); break;
		case 'P':
			bad = cli_parse_num(optarg, 0, 1, &v);
			sp.top_p = (float)v;
			break;
		case 'M':
			bad = cli_parse_num(optarg, 0, 1, &v);
			sp.min_p = (float)v;
			break;
		case 'r':
			bad = cli_parse_num(optarg, 0.01, 100, &v);
			sp.repeat_penalty = (float)v;
			break;
		case 'e':
			bad = cli_parse_num(optarg, -10, 10, &v);
			sp.presence_penalty = (float)v;
			break;
		case 'f':
			bad = cli_parse_num(optarg, -10, 10, &v);
			sp.frequency_penalty = (float)v;
			break;
		case 's': bad = cli_parse_u64(optarg, 0, UINT64_MAX, &sp.seed); break;
		case 'x':
			if (n_stop == MAX_STOPS)
				bad = 1;
			else
				stops[n_stop++] = optarg;
			break;
		case 't': bad = cli_parse_int(optarg, 0, 1024, &eo.threads); break;
		case 'C': bad = cli_parse_int(optarg, 0, 1 << 24, &eo.ctx); break;
		case 'y': eo.chat_template = optarg; break;
		case 1000: eo.kv_type = optarg; break;
		case 1001: sp.ignore_eos = 1; break;
		case 'i': out.ids_only = 1; break;
		case 'l':
			bad = cli_parse_int(optarg, 0, 20, &sp.top_logprobs);
			out.json = sp.top_logprobs > 0;
			break;
		case 'z': stats = 1; break;
		case 'L':
			if (cli_set_log_level(optarg))
				return 2;
			break;
		case 'h': usage(stdout); return 0;
		default:
			if (cli_spec_opt(c, optarg, &eo, &bad))
				break;
			usage(stderr);
			return 2;
		}
		if (bad) {
			fprintf(stderr, "shoal %s: bad value '%s'\n", name, optarg);
			return 2;
		}
	}
	if (!eo.model_path || !prompt == !chat || optind != argc) {
		usage(stderr);
		return 2;
	}
	sp.stop = stops;
	sp.n_stop = n_stop;

	char err[256];
	eng_t *e = NULL;
	int *ids = NULL, n_ids = 0, rc = 1;
	if (eng_open(&e, &eo, err, sizeof err)) {
		fprintf(stderr, "shoal %s: %s\n", name, err);
		return 1;
	}
	if (prompt) {
		/* special tokens written in the prompt are parsed, as llama.cpp's llama-completion
		 * and llama-simple do (common_tokenize(ctx, prompt, true, true)): the same text,
		 * the same ids */
		if (eng_tokenize(e, prompt, 1, 1, &ids, &n_ids, err, sizeof err)) {
			fprintf(stderr, "shoal %s: %s\n", name, err);
			goto out;
		}
	} else {
		eng_msg_t msgs[2];
		int nm = 0;
		if (system)
			msgs[nm++] = (eng_msg_t){.role = "system", .content = system};
		msgs[nm++] = (eng_msg_t){.role = "user", .content = chat};
		if (eng_chat_prompt(e, msgs, nm, &ids, &n_ids, err, sizeof err)) {
			fprintf(stderr, "shoal %s: %s\n", name, err);
			goto out;
		}
	}
	eng_result_t res;
	if (eng_generate(e, ids, n_ids, &sp, on_token, &out, &res)) {
		if (out.n)
			printf("\n");
		fprintf(stderr, "shoal %s: %s\n", name, res.error);
		goto out;
	}
	if (!out.json)
		printf("\n");
	fflush(stdout);
	if (stats) {
		const char *why = res.finish == ENG_FINISH_STOP ? "stop" : "length";
		fprintf(
		    stderr,
		    "prompt: %d tokens in %.1f ms (%.1f tok/s); generation: %d tokens in %.1f ms "
		    "(%.2f tok/s); finish: %s\n",
		    res.prompt_tokens, res.prompt_ms,
		    res.prompt_ms > 0 ? res.prompt_tokens * 1000.0 / res.prompt_ms : 0.0,
		    res.completion_tokens, res.gen_ms,
		    res.gen_ms > 0 ? res.completion_tokens * 1000.0 / res.gen_ms : 0.0, why);
		if (dist)
			cli_comm_stats(e);
		cli_spec_stats(e);
	}
	rc = 0;
out:
	free(ids);
	eng_free(e);
	return rc;
}
