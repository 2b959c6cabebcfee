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
	    "usage: shoal mkmodel [--arch llama|qwen2|qwen3|deepseek2] [--dim D] [--layers L]\n"
	    "                     [--heads H] [--kv-heads K] [--ffn F] [--vocab V] [--head-dim N]\n"
	    "                     [--type "
	    "f32|f16|bf16|q8_0|q4_0|q4_k|q6_k|q5_0|q5_1|q5_k|q3_k|\n"
	    "                     q2_k] [--seed S] [--ctx N]\n"
	    "                     [--name NAME] -o FILE.gguf\n"
	    "  deepseek2 (latent attention): [--kv-lora R] [--q-lora R] [--qk-nope D]\n"
	    "                     [--qk-rope D] [--v-head D] [--mla-legacy] [--rope-factor F]\n"
	    "                     [--yarn-log-mul M] [--rope-orig-ctx N]\n"
	    "Writes a model with seeded random weights. Defaults: llama, dim 256, 4 layers,\n"
	    "8 heads, 4 KV heads, ffn 768, vocab 1024, q8_0, seed 1, ctx 2048; deepseek2: kv-lora\n"
	    "dim/2, no q-lora (Lite), qk-nope and v-head dim/heads, qk-rope half that, attn_k_b +\n"
	    "attn_v_b (--mla-legacy: one attn_kv_b), no rope scaling (--rope-factor: YaRN).\n");
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
	    {"arch", required_argument, 0, 'a'},
	    {"dim", required_argument, 0, 'd'},
	    {"layers", required_argument, 0, 'l'},
	    {"heads", required_argument, 0, 'H'},
	    {"kv-heads", required_argument, 0, 'k'},
	    {"ffn", required_argument, 0, 'f'},
	    {"vocab", required_argument, 0, 'v'},
	    {"type", required_argument, 0, 't'},
	    {"seed", required_argument, 0, 's'},
	    {"ctx", required_argument, 0, 'c'},
	    {"head-dim", required_argument, 0, 'D'},
	    {"name", required_argument, 0, 'n'},
	    {"output", required_argument, 0, 'o'},
	    {"log-level", required_argument, 0, 'L'},
	    {"help", no_argument, 0, 'h'},
	    /* deepseek2 */
	    {"kv-lora", required_argument, 0, 1000},
	    {"q-lora", required_argument, 0, 1001},
	    {"qk-nope", required_argument, 0, 1002},
	    {"qk-rope", required_argument, 0, 1003},
	    {"v-head", required_argument, 0, 1004},
	    {"rope-orig-ctx", required_argument, 0, 1005},
	    {"mla-legacy", no_argument, 0, 1006},
	    {"rope-factor", required_argument, 0, 1007},
	    {"yarn-log-mul", required_argument, 0, 1008},
	    {0, 0, 0, 0},
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
		case 1000: ip = &o.kv_lora; break;
		case 1001: ip = &o.q_lora; break;
		case 1002: ip = &o.qk_nope; break;
		case 1003: ip = &o.qk_rope; break;
		case 1004: ip = &o.v_head; break;
		case 1005: ip = &o.rope_orig_ctx; break;
		case 1006: o.mla_legacy = 1; break;
		case 1007:
		case 1008: {
			char *end;
			float f = strtof(optarg, &end);
			if (!*optarg || *end || !(f >= 0 && f <= 1e6f)) {
				fprintf(stderr, "shoal mkmodel: bad number '%s'\n", optarg);
				return 2;
			}
			*(c == 1007 ? &o.rope_factor : &o.yarn_log_mul) = f;
			break;
		}
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
