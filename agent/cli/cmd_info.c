/*
 * cmd_info.c: `shoal info --model M`: what a GGUF file holds and whether this build can run it
 * (architecture and sizes, tensor types, tokenizer, chat template family, weight memory).
 * Exits 1 when the file cannot be read or the model is not supported, after printing what it
 * could.
 */
#include "agent/cli/cli.h"
#include "common/common.h"
#include "infer/chat.h"
#include "infer/gguf.h"
#include "infer/model/meta.h"
#include "infer/model/model.h"
#include "infer/quant/quant.h"
#include "infer/tok/tokenizer.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
	fprintf(f,
		"usage: shoal info --model FILE.gguf [--kv-type f16|f32|q8_0]\n"
		"  Prints the architecture, sizes, tensor types, tokenizer, chat template family\n"
		"  and the memory the weights and the KV cache take (per position and for the\n"
		"  model's context, in the --kv-type given, default f16). Exits 1 when the model\n"
		"  cannot run here.\n");
}

static void human(uint64_t b, char *buf, size_t n)
{
	if (b >= (1ull << 30))
		snprintf(buf, n, "%.2f GiB", (double)b / (1ull << 30));
	else if (b >= (1ull << 20))
		snprintf(buf, n, "%.2f MiB", (double)b / (1ull << 20));
	else
		snprintf(buf, n, "%.1f KiB", (double)b / 1024);
}

int cmd_info(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"model", required_argument, 0, 'm'},
	    {"help", no_argument, 0, 'h'},
	    {"log-level", required_argument, 0, 'L'},
	    {"kv-type", required_argument, 0, 'k'},
	    {0, 0, 0, 0},
	};
	const char *model = NULL, *kv_name = NULL;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 'k': kv_name = optarg; break;
		case 'h': usage(stdout); return 0;
		case 'L':
			if (cli_set_log_level(optarg))
				return 2;
			break;
		default: usage(stderr); return 2;
		}
	}
	if (!model || optind < argc) {
		usage(stderr);
		return 2;
	}
	char err[512], sz[32];
	gguf_t *g = NULL;
	tok_t *t = NULL;
	int rc = 0;
	if (gguf_open(&g, model, err, sizeof err)) {
		fprintf(stderr, "shoal info: %s\n", err);
		return 1;
	}
	human(gguf_file_size(g), sz, sizeof sz);
	printf("file:          %s (%s, GGUF v%u, %d tensors, %d keys)\n", model, sz,
	       gguf_version(g), gguf_n_tensors(g), gguf_n_kv(g));
	model_meta_t m;
	if (meta_load(&m, g, err, sizeof err)) {
		const char *a;
		size_t an;
		if (!gguf_get_str(g, "general.architecture", &a, &an))
			printf("architecture:  %.*s\n", (int)MIN(an, 64), a);
		printf("model:         not supported: %s\n", err);
		rc = 1;
	} else {
		char types[256];
		meta_types_str(&m, types, sizeof types);
		human(m.weight_bytes, sz, sizeof sz);
		if (m.name[0])
			printf("name:          %s\n", m.name);
		printf("architecture:  %s\n", m.arch_name);
		printf("layers:        %d\n", m.n_layers);
		printf("dim:           %d\n", m.dim);
		printf("heads:         %d\n", m.n_heads);
		printf("kv heads:      %d\n", m.n_kv_heads);
		printf("head dim:      %d\n", m.head_dim);
		printf("ffn:           %d\n", m.ffn);
		printf("vocab:         %d\n", m.n_vocab);
		printf("context:       %d\n", m.n_ctx);
		printf("rope:          base %g, %d dims, %s\n", (double)m.rope_base, m.rope_dim,
		       m.is_hybrid                      ? "interleaved M-RoPE (text positions)"
		       : m.rope_style == META_ROPE_NEOX ? "neox (half split)"
							: "adjacent pairs");
		printf("rms eps:       %g\n", (double)m.rms_eps);
		printf("extras:        %s%s%s%s%s%s\n", m.has_qkv_bias ? "qkv bias, " : "",
		       m.has_qk_norm ? "q/k norm, " : "",
		       m.has_post_norm ? "post-attention/FFN norms, " : "",
		       m.ffn_gelu ? "GELU FFN, embeddings x sqrt(dim), " : "",
		       m.has_sinks ? "attention sinks, output bias, post-attention norm, " : "",
		       m.tied_output ? "output tied to token_embd" : "separate output");
		if (m.n_nextn)
			printf("nextn:         %d NextN/MTP layer%s after the %d (not run)\n",
			       m.n_nextn, m.n_nextn > 1 ? "s" : "", m.n_layers);
		if (m.arch == META_GEMMA3 && (m.rope_scale != 1.0f || m.logit_softcap > 0))
			printf("gemma3:        global layers' rope scale %g, logit softcap %g\n",
			       (double)m.rope_scale, (double)m.logit_softcap);
		if (m.n_experts) {
			printf("experts:       %d, %d used per token, expert ffn %d", m.n_experts,
			       m.n_experts_used, m.ffn_exp);
			if (m.ffn_shexp)
				printf(", shared experts ffn %d%s", m.ffn_shexp,
				       m.shexp_gated ? " (gated)" : "");
			if (m.n_dense_lead)
				printf(", %d leading dense layers", m.n_dense_lead);
			printf(
			    "\nexpert weights: %llu bytes routed (a token reads %d/%d of them)\n",
			    (unsigned long long)m.expert_bytes, m.n_experts_used, m.n_experts);
			printf("router:        %s%s, top-k weights %s, scale %g%s",
			       m.gating == META_GATE_SIGMOID ? "sigmoid"
			       : m.gating == META_GATE_SOFTMAX_WEIGHT
				   ? "top k by logit, softmax over them"
				   : "softmax",
			       m.has_moe_bias ? " (biased)" : "",
			       m.exp_norm ? "renormalised" : "as is", (double)m.exp_scale,
			       m.has_exp_bias ? ", selection bias" : "");
			if (m.n_groups)
				printf(", from the best %d of %d expert groups", m.groups_used,
				       m.n_groups);
			if (m.exp_act == META_ACT_SWIGLU_OAI)
				printf(
				    "\nexpert ffn:    clamped SwiGLU (alpha %g, limit %g), biases",
				    (double)m.act_alpha, (double)m.act_limit);
			printf("\n");
		}
		if (m.is_mla)
			printf("mla:           kv_lora %d, q_lora %d%s, qk_nope %d, qk_rope %d, "
			       "v_head %d, "
			       "%s\n",
			       m.mla.kv_lora, m.mla.q_lora, m.mla.q_lora ? "" : " (Lite)",
			       m.mla.qk_nope, m.mla.qk_rope, m.mla.v_head,
			       m.mla.split_kvb ? "attn_k_b + attn_v_b" : "attn_kv_b");
		if (m.is_hybrid) { /* qwen35: the layers without a KV cache */
			char st[32];
			human((uint64_t)m.dn.n_recurrent * meta_dn_state_bytes(&m, m.dn.n_k_heads),
			      st, sizeof st);
			printf("deltanet:      %d of %d layers (the others full attention), %d key "
			       "and %d value heads of %d, conv %d taps; state %s per sequence%s\n",
			       m.dn.n_recurrent, m.n_layers, m.dn.n_k_heads, m.dn.n_v_heads,
			       m.dn.d_state, m.dn.d_conv, st,
			       m.dn.n_nextn ? "; MTP block not loaded" : "");
		}
		if (m.rope_scaling == META_SCALING_YARN)
			printf("rope scaling:  yarn, factor %g, original context %d, log "
			       "multiplier %g\n",
			       (double)m.rope_factor, m.rope_orig_ctx, (double)m.yarn_log_mul);
		printf("tensor types:  %s\n", types);
		printf("weights:       %s (%llu bytes)\n", sz, (unsigned long long)m.weight_bytes);
		int kt = kv_name ? quant_type_parse(kv_name) : MODEL_KV_DEFAULT;
		if (m.is_mla) { /* the latent cache is F32 whatever --kv-type says (mla.c) */
			printf("kv cache:      %zu bytes per token (F32, the compressed latent)\n",
			       model_kv_bytes_per_pos(&m, NULL, QT_F32));
		} else if (kt < 0 || model_kv_type_check(&m, kt, err, sizeof err)) {
			printf("kv cache:      %s\n", kt < 0 ? "unknown --kv-type" : err);
			rc = 1;
		} else {
			uint64_t per = model_kv_bytes_per_pos(&m, NULL, kt);
			human(model_kv_bytes(&m, NULL, kt, m.n_ctx), sz, sizeof sz);
			printf("kv cache:      %s, %llu bytes per position, %s for %d positions\n",
			       quant_type_name(kt), (unsigned long long)per, sz, m.n_ctx);
			if (m.swa_window > 0) { /* sliding-window layers keep a ring (swa.c) */
				int nswa = 0;
				for (int l = 0; l < m.n_layers; l++)
					nswa += meta_layer_swa(&m, l);
				printf(
				    "sliding window: %d positions in %d of %d layers (period %d), "
				    "each keeps %d positions; per position above: the other "
				    "layers\n",
				    m.swa_window, nswa, m.n_layers, m.swa_period,
				    model_swa_ring(&m, m.n_ctx) ? model_swa_ring(&m, m.n_ctx)
								: m.n_ctx);
			}
		}
	}
	if (tok_load(&t, g, err, sizeof err)) {
		printf("tokenizer:     not supported: %s\n", err);
		rc = 1;
	} else {
		printf(
		    "tokenizer:     %s, pre-tokenizer %s, %d tokens, bos %d, eos %d, add bos %s\n",
		    tok_kind_name(t), tok_pre_name(t), tok_n_vocab(t), tok_bos(t), tok_eos(t),
		    tok_add_bos(t) ? "yes" : "no");
	}
	const char *tmpl = NULL, *fam;
	size_t tl = 0;
	int has_tmpl = !gguf_get_str(g, "tokenizer.chat_template", &tmpl, &tl);
	if (chat_pick(NULL, has_tmpl ? tmpl : NULL, tl, &fam, err, sizeof err))
		printf("chat template: unrecognised (use --chat-template NAME)\n");
	else
		printf("chat template: %s%s\n", fam, has_tmpl ? "" : " (the model has none)");
	tok_free(t);
	gguf_free(g);
	return rc;
}
