/* cmd_mkmodel.c: `shoal mkmodel`: writes a GGUF with seeded random weights and a small byte-level
 * tokenizer (infer/mkmodel.c). Same options and seed give the same file. With --from, converts a
 * model's weight matrices to --type instead (infer/gguf_convert.c: a draft model's copy). */
#include "agent/cli/cli.h"
#include "common/common.h"
#include "infer/gguf_write.h"
#include "infer/quant/quant.h"

#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: shoal mkmodel [--arch ARCH] [--dim D] [--layers L] [--heads H]\n"
	    "                     [--kv-heads K] [--ffn F] [--vocab V] [--head-dim N]\n"
	    "                     [--experts N --experts-used K [--shared-experts S]\n"
	    "                      [--expert-ffn F] [--dense-lead N]]\n"
	    "                     [--type "
	    "f32|f16|bf16|q8_0|q4_0|q4_k|q6_k|q5_0|q5_1|q5_k|q3_k|\n"
	    "                     q2_k|mxfp4] [--seed S] [--ctx N]\n"
	    "                     [--name NAME] [--pooling none|mean|cls|last] [--add-eos]\n"
	    "                     [--header-only] -o FILE.gguf\n"
	    "       shoal mkmodel --from MODEL.gguf --type TYPE -o FILE.gguf\n"
	    "  deepseek2 (latent attention): [--kv-lora R] [--q-lora R] [--qk-nope D]\n"
	    "                     [--qk-rope D] [--v-head D] [--mla-legacy] [--rope-factor F]\n"
	    "                     [--yarn-log-mul M] [--rope-orig-ctx N]\n"
	    "  qwen35 (Gated DeltaNet): [--ssm-state N] [--ssm-k-heads N] [--ssm-v-heads N]\n"
	    "                     [--ssm-conv N] [--attn-interval N] [--rope-dim N] [--nextn N]\n"
	    "  gemma3: [--sliding-window N] [--rope-factor F (linear)]\n"
	    "  glm4moe: [--nextn N] [--qk-norm 1] and the expert options\n"
	    "  gpt-oss: [--sliding-window N] [--rope-factor F] [--rope-orig-ctx N] [--head-dim N]\n"
	    "ARCH: llama, qwen2, qwen3, deepseek2, qwen35, gemma3, or with experts mixtral,\n"
	    "qwen2moe, qwen3moe, qwen35moe, glm4moe, gpt-oss.\n"
	    "--header-only: metadata and tensor table only, the data a hole of the file's\n"
	    "size (for `shoal plan` on a model too large to generate).\n"
	    "Writes a model with seeded random weights. Defaults: llama, dim 256, 4 layers,\n"
	    "8 heads, 4 KV heads, ffn 768, vocab 1024, q8_0, seed 1, ctx 2048; MoE archs:\n"
	    "8 experts, 2 used, expert ffn = ffn, qwen2moe 1 shared expert. The router\n"
	    "stays F32 whatever the type. deepseek2: kv-lora dim/2, no q-lora (Lite), qk-nope\n"
	    "and v-head dim/heads, qk-rope half that, attn_k_b + attn_v_b (--mla-legacy: one\n"
	    "attn_kv_b), no rope scaling (--rope-factor: YaRN); with --experts, layers from\n"
	    "--dense-lead (default 1) route through experts (1 shared expert by default).\n"
	    "qwen35: DeltaNet state = head size, key heads = heads/2, value heads = 2x key\n"
	    "heads, 4 conv taps, a gated full-attention layer every 4th, rope-dim head/4;\n"
	    "--nextn appends that many MTP blocks (llama.cpp's layout; shoal skips them).\n"
	    "qwen35moe: 1 shared expert (gated) by default.\n"
	    "gemma3: window 512 on layers 0-4 of every 6, SentencePiece vocabulary, tied head.\n"
	    "glm4moe: layers from --dense-lead (default 1) route (sigmoid, selection bias, one\n"
	    "shared expert), biases, partial rotary; --nextn N extra layers are written and\n"
	    "skipped, as llama.cpp does.\n"
	    "gpt-oss: every layer routes, sliding window 128 on layers 0, 2, ..., YaRN factor 32\n"
	    "from 4096 positions; --type mxfp4: MXFP4 experts, F16 elsewhere.\n"
	    "--pooling writes <arch>.pooling_type for embeddings (default: last for qwen3, as\n"
	    "Qwen3-Embedding; none otherwise); --add-eos makes the tokenizer end inputs with "
	    "EOS.\n"
	    "--from: the same model (tokenizer, every key) with its weight matrices converted\n"
	    "to TYPE (norms, biases and routers unchanged), e.g. an F16 draft model.\n");
}

/* The integer options: one row per flag (a new architecture adds its rows here). */
static const struct {
	const char *name;
	size_t off; /* of the int in mkmodel_opts_t */
} int_opts[] = {
    {"dim", offsetof(mkmodel_opts_t, dim)},
    {"layers", offsetof(mkmodel_opts_t, layers)},
    {"heads", offsetof(mkmodel_opts_t, heads)},
    {"kv-heads", offsetof(mkmodel_opts_t, kv_heads)},
    {"ffn", offsetof(mkmodel_opts_t, ffn)},
    {"vocab", offsetof(mkmodel_opts_t, vocab)},
    {"ctx", offsetof(mkmodel_opts_t, ctx)},
    {"head-dim", offsetof(mkmodel_opts_t, head_dim)},
    {"experts", offsetof(mkmodel_opts_t, experts)},
    {"experts-used", offsetof(mkmodel_opts_t, experts_used)},
    {"shared-experts", offsetof(mkmodel_opts_t, shared_experts)},
    {"expert-ffn", offsetof(mkmodel_opts_t, expert_ffn)},
    {"dense-lead", offsetof(mkmodel_opts_t, dense_lead)},
    {"expert-groups", offsetof(mkmodel_opts_t, expert_groups)},
    {"expert-groups-used", offsetof(mkmodel_opts_t, expert_groups_used)},
    /* deepseek2's latent attention */
    {"kv-lora", offsetof(mkmodel_opts_t, kv_lora)},
    {"q-lora", offsetof(mkmodel_opts_t, q_lora)},
    {"qk-nope", offsetof(mkmodel_opts_t, qk_nope)},
    {"qk-rope", offsetof(mkmodel_opts_t, qk_rope)},
    {"v-head", offsetof(mkmodel_opts_t, v_head)},
    {"rope-orig-ctx", offsetof(mkmodel_opts_t, rope_orig_ctx)},
    /* qwen35's Gated DeltaNet */
    {"ssm-state", offsetof(mkmodel_opts_t, ssm_state)},
    {"ssm-k-heads", offsetof(mkmodel_opts_t, ssm_k_heads)},
    {"ssm-v-heads", offsetof(mkmodel_opts_t, ssm_v_heads)},
    {"ssm-conv", offsetof(mkmodel_opts_t, ssm_conv)},
    {"attn-interval", offsetof(mkmodel_opts_t, attn_interval)},
    {"nextn", offsetof(mkmodel_opts_t, nextn)},
    {"rope-dim", offsetof(mkmodel_opts_t, rope_dim)},
    /* gemma3's and gpt-oss's sliding window; glm4moe's q/k norms (its NextN layers: --nextn) */
    {"sliding-window", offsetof(mkmodel_opts_t, swa_window)},
    {"qk-norm", offsetof(mkmodel_opts_t, qk_norm)},
};

enum {
	OPT_INT = 0x100,
	OPT_ARCH = 0x200,
	OPT_TYPE,
	OPT_SEED,
	OPT_NAME,
	OPT_LOG,
	OPT_MLA_LEGACY,
	OPT_ROPE_FACTOR,
	OPT_YARN_MUL,
	OPT_POOLING,
	OPT_ADD_EOS,
	OPT_HEADER_ONLY,
	OPT_FROM
};

int cmd_mkmodel(int argc, char **argv)
{
	struct option opts[ARRAY_LEN(int_opts) + 15];
	size_t n = 0;
	for (size_t i = 0; i < ARRAY_LEN(int_opts); i++)
		opts[n++] =
		    (struct option){int_opts[i].name, required_argument, 0, OPT_INT + (int)i};
	opts[n++] = (struct option){"arch", required_argument, 0, OPT_ARCH};
	opts[n++] = (struct option){"type", required_argument, 0, OPT_TYPE};
	opts[n++] = (struct option){"seed", required_argument, 0, OPT_SEED};
	opts[n++] = (struct option){"name", required_argument, 0, OPT_NAME};
	opts[n++] = (struct option){"output", required_argument, 0, 'o'};
	opts[n++] = (struct option){"log-level", required_argument, 0, OPT_LOG};
	opts[n++] = (struct option){"help", no_argument, 0, 'h'};
	opts[n++] = (struct option){"mla-legacy", no_argument, 0, OPT_MLA_LEGACY};
	opts[n++] = (struct option){"rope-factor", required_argument, 0, OPT_ROPE_FACTOR};
	opts[n++] = (struct option){"yarn-log-mul", required_argument, 0, OPT_YARN_MUL};
	opts[n++] = (struct option){"pooling", required_argument, 0, OPT_POOLING};
	opts[n++] = (struct option){"add-eos", no_argument, 0, OPT_ADD_EOS};
	opts[n++] = (struct option){"header-only", no_argument, 0, OPT_HEADER_ONLY};
	opts[n++] = (struct option){"from", required_argument, 0, OPT_FROM};
	opts[n++] = (struct option){0, 0, 0, 0};
	mkmodel_opts_t o = {.arch = "llama",
			    .dim = 256,
			    .layers = 4,
			    .heads = 8,
			    .kv_heads = 4,
			    .ffn = 768,
			    .vocab = 1024,
			    .ctx = 2048,
			    .type = QT_Q8_0,
			    .seed = 1,
			    .experts = 8,
			    .experts_used = 2};
	const char *out = NULL, *from = NULL;
	int c, type_given = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
		if (c >= OPT_INT && c < OPT_INT + (int)ARRAY_LEN(int_opts)) {
			if (cli_parse_int(optarg, 0, 1 << 24,
					  (int *)((char *)&o + int_opts[c - OPT_INT].off))) {
				fprintf(stderr, "shoal mkmodel: bad number '%s'\n", optarg);
				return 2;
			}
			continue;
		}
		switch (c) {
		case OPT_ARCH: o.arch = optarg; break;
		case OPT_MLA_LEGACY: o.mla_legacy = 1; break;
		case OPT_POOLING: o.pooling = optarg; break;
		case OPT_ADD_EOS: o.add_eos = 1; break;
		case OPT_HEADER_ONLY: o.header_only = 1; break;
		case OPT_ROPE_FACTOR:
		case OPT_YARN_MUL: {
			double f;
			if (cli_parse_num(optarg, 0, 1e6, &f)) {
				fprintf(stderr, "shoal mkmodel: bad number '%s'\n", optarg);
				return 2;
			}
			*(c == OPT_ROPE_FACTOR ? &o.rope_factor : &o.yarn_log_mul) = (float)f;
			break;
		}
		case OPT_TYPE:
			if ((o.type = quant_type_parse(optarg)) < 0) {
				fprintf(stderr, "shoal mkmodel: unknown type '%s'\n", optarg);
				return 2;
			}
			type_given = 1;
			break;
		case OPT_FROM: from = optarg; break;
		case OPT_SEED:
			if (cli_parse_u64(optarg, 0, UINT64_MAX, &o.seed)) {
				fprintf(stderr, "shoal mkmodel: bad seed '%s'\n", optarg);
				return 2;
			}
			break;
		case OPT_NAME: o.name = optarg; break;
		case 'o': out = optarg; break;
		case OPT_LOG:
			if (cli_set_log_level(optarg))
				return 2;
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!out || optind != argc) {
		usage(stderr);
		return 2;
	}
	char err[256];
	if (from && !type_given) {
		fprintf(stderr, "shoal mkmodel: --from needs --type\n");
		return 2;
	}
	if (from ? gguf_convert(from, out, o.type, err, sizeof err)
		 : mkmodel_write(&o, out, err, sizeof err)) {
		fprintf(stderr, "shoal mkmodel: %s\n", err);
		return 1;
	}
	return 0;
}
