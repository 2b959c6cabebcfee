/* cmd_mkmodel.c: `shoal mkmodel`: writes a GGUF with seeded random weights and a small byte-level
 * tokenizer (infer/mkmodel.c). Same options and seed give the same file. */
#include "agent/cli.h"
#include "common/common.h"
#include "infer/gguf_write.h"
#include "infer/quant/quant.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: shoal mkmodel [--arch llama|qwen2|qwen3] [--dim D] [--layers L] [--heads H]\n"
	    "                     [--kv-heads K] [--ffn F] [--vocab V] [--head-dim N]\n"
	    "                     [--type "
	    "f32|f16|bf16|q8_0|q4_0|q4_k|q6_k|q5_0|q5_1|q5_k|q3_k|\n"
	    "                     q2_k] [--seed S] [--ctx N]\n"
	    "                     [--name NAME] -o FILE.gguf\n"
	    "Writes a model with seeded random weights. Defaults: llama, dim 256, 4 layers,\n"
	    "8 heads, 4 KV heads, ffn 768, vocab 1024, q8_0, seed 1, ctx 2048.\n");
}

static int parse_int(const char *s, int *out)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (*s == 0 || *end || v < 0 || v > (1 << 24))
		return -1;
	*out = (int)v;
	return 0;
}

int cmd_mkmodel(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"arch", required_argument, 0, 'a'},     {"dim", required_argument, 0, 'd'},
	    {"layers", required_argument, 0, 'l'},   {"heads", required_argument, 0, 'H'},
	    {"kv-heads", required_argument, 0, 'k'}, {"ffn", required_argument, 0, 'f'},
	    {"vocab", required_argument, 0, 'v'},    {"type", required_argument, 0, 't'},
	    {"seed", required_argument, 0, 's'},     {"ctx", required_argument, 0, 'c'},
	    {"head-dim", required_argument, 0, 'D'}, {"name", required_argument, 0, 'n'},
	    {"output", required_argument, 0, 'o'},   {"log-level", required_argument, 0, 'L'},
	    {"help", no_argument, 0, 'h'},           {0, 0, 0, 0},
	};
	mkmodel_opts_t o = {.arch = "llama",
			    .dim = 256,
			    .layers = 4,
			    .heads = 8,
			    .kv_heads = 4,
			    .ffn = 768,
			    .vocab = 1024,
			    .ctx = 2048,
			    .type = QT_Q8_0,
			    .seed = 1};
	const char *out = NULL;
	int c, *ip;
	optind = 1;
	while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
		ip = NULL;
		switch (c) {
		case 'a': o.arch = optarg; break;
		case 'd': ip = &o.dim; break;
		case 'l': ip = &o.layers; break;
		case 'H': ip = &o.heads; break;
		case 'k': ip = &o.kv_heads; break;
		case 'f': ip = &o.ffn; break;
		case 'v': ip = &o.vocab; break;
		case 'c': ip = &o.ctx; break;
		case 'D': ip = &o.head_dim; break;
		case 't':
			if ((o.type = quant_type_parse(optarg)) < 0) {
				fprintf(stderr, "shoal mkmodel: unknown type '%s'\n", optarg);
				return 2;
			}
			break;
		case 's': o.seed = strtoull(optarg, NULL, 10); break;
		case 'n': o.name = optarg; break;
		case 'o': out = optarg; break;
		case 'L':
			if (cli_set_log_level(optarg))
				return 2;
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
		if (ip && parse_int(optarg, ip)) {
			fprintf(stderr, "shoal mkmodel: bad number '%s'\n", optarg);
			return 2;
		}
	}
	if (!out || optind != argc) {
		usage(stderr);
		return 2;
	}
	char err[256];
	if (mkmodel_write(&o, out, err, sizeof err)) {
		fprintf(stderr, "shoal mkmodel: %s\n", err);
		return 1;
	}
	return 0;
}
