/*
 * meta.h: a model's hyperparameters and tensor layout, read and checked from a GGUF file.
 * Internal to infer/.
 *
 * meta_load() accepts architectures llama (Llama 2/3, Mistral, TinyLlama), qwen2, qwen3,
 * deepseek2 (Multi-head Latent Attention, `mla` below) and the hybrid qwen35 (Gated DeltaNet
 * layers, `dn` below), with experts also Mixtral, qwen2moe, qwen3moe and qwen35moe (and
 * deepseek2's routed experts, the n_experts fields), checks
 * that every tensor the forward pass needs exists with the expected shape and a supported type,
 * and fills a plain struct (no pointers into the file except `name`, which is copied). Anything
 * else is a one-line error naming what is wrong.
 */
#ifndef SHOAL_META_H
#define SHOAL_META_H

#include "infer/gguf.h"

#include <stdint.h>

enum meta_arch {
	META_LLAMA = 0,
	META_QWEN2,
	META_QWEN3,
	META_QWEN2MOE,
	META_QWEN3MOE,
	META_DEEPSEEK2,
	META_QWEN35,
	META_QWEN35MOE,
	META_GEMMA3,
	META_GLM4MOE,
	META_GPTOSS /* "gpt-oss": llama.cpp's LLM_ARCH_OPENAI_MOE (meta_gptoss.c) */
};
/* llama.cpp's llama_expert_gating_func_type: how router logits become expert probabilities;
 * SOFTMAX_WEIGHT: the top k by raw logit, weighted by the softmax over those k (gpt-oss) */
enum meta_gating { META_GATE_SOFTMAX = 1, META_GATE_SIGMOID = 2, META_GATE_SOFTMAX_WEIGHT = 3 };
/* The experts' gated activation: SiLU(gate) * up, or gpt-oss's clamped SwiGLU
 * (llama.cpp's ggml_swiglu_oai: x = min(gate, limit), y = clamp(up, -limit, limit),
 * x * sigmoid(alpha x) * (y + 1)) */
enum meta_act { META_ACT_SILU = 0, META_ACT_SWIGLU_OAI };
#define META_MAX_EXPERTS 512 /* llama.cpp's LLAMA_MAX_EXPERTS */
#define META_ARCHS                                                                                 \
	"llama, qwen2, qwen3, qwen2moe, qwen3moe, deepseek2, qwen35, qwen35moe, gemma3, glm4moe, "     \
	"gpt-oss" /* errors */
#define META_MAX_LAYERS 512                                /* llama.cpp's LLAMA_MAX_LAYERS */
enum meta_rope { META_ROPE_ADJACENT = 0, META_ROPE_NEOX }; /* (x[2i],x[2i+1]) vs (x[i],x[i+n/2]) */

enum meta_rope_scaling { META_SCALING_NONE = 0, META_SCALING_LINEAR, META_SCALING_YARN };

/* deepseek2's Multi-head Latent Attention, as llama.cpp reads it (src/models/deepseek2.cpp and
 * llama_model_deepseek2::load_arch_hparams / load_arch_tensors). Per head the query is
 * [qk_nope | qk_rope]; a token's key and value come from one shared latent of kv_lora floats
 * (plus a shared qk_rope key part), expanded per head by attn_kv_b (or its split form). */
typedef struct meta_mla {
	int q_lora;     /* attention.q_lora_rank; 0 = Lite (plain attn_q) */
	int kv_lora;    /* attention.kv_lora_rank */
	int qk_nope;    /* per head: key length - qk_rope */
	int qk_rope;    /* rope.dimension_count: the rotated part of each head (= rope_dim) */
	int v_head;     /* value_length_mla, else value_length */
	int split_kvb;  /* 1: attn_k_b + attn_v_b (today's converter, key_length_mla present);
			 * 0: the legacy unsplit attn_kv_b */
	int dense_lead; /* leading_dense_block_count: layers [0, dense_lead) have a dense FFN */
} meta_mla_t;

/* qwen35's Gated DeltaNet (linear attention) layers, as llama.cpp reads them
 * (llama_model_qwen35::load_arch_hparams / load_arch_tensors, src/models/qwen35.cpp). A layer is
 * recurrent unless it is a full-attention layer (every full_attention_interval-th, or the
 * attention.recurrent_layers array); a recurrent layer keeps per sequence a conv state of
 * (d_conv - 1) x conv_dim and a delta-rule state of n_v_heads x d_state x d_state floats. */
typedef struct meta_dn {
	int d_conv;      /* ssm.conv_kernel: taps of the short causal convolution */
	int d_state;     /* ssm.state_size: one key head's (and one value head's) size */
	int n_k_heads;   /* ssm.group_count: query/key heads */
	int n_v_heads;   /* ssm.time_step_rank: value heads, a multiple of n_k_heads; value head
			  * h reads key head h % n_k_heads (the converter's tiled order) */
	int n_nextn;     /* nextn_predict_layers: MTP blocks after the main stack, not loaded */
	int sections[4]; /* rope.dimension_sections (interleaved M-RoPE) */
	int n_recurrent; /* recurrent layers among n_layers */
	uint8_t recurrent[META_MAX_LAYERS]; /* 1: layer l is a DeltaNet layer */
} meta_dn_t;

typedef struct model_meta {
	int arch;           /* enum meta_arch */
	char arch_name[16]; /* "llama", "qwen2", "qwen3", "deepseek2" */
	char name[128];     /* general.name, or "" */
	int n_layers;
	int dim; /* embedding length */
	int n_heads, n_kv_heads;
	int head_dim;     /* qwen3: attention.key_length; deepseek2: qk_nope + qk_rope;
			   * else dim / n_heads */
	int ffn;          /* feed-forward hidden size */
	int n_vocab;      /* rows of token_embd */
	int n_ctx;        /* training context length */
	float rms_eps;    /* default 1e-5 */
	float rope_base;  /* default 10000 */
	int rope_dim;     /* rotated dims per head; default head_dim */
	int rope_style;   /* enum meta_rope */
	int has_qkv_bias; /* qwen2; gpt-oss when its files have them (llama.cpp: optional) */
	int has_qk_norm;  /* qwen3 */
	int tied_output;  /* no output.weight: the head reuses token_embd */
	/* mixture of experts (n_experts == 0: every layer is dense). Layers [0, n_dense_lead) are
	 * dense SwiGLU of width ffn; the others route each token to n_experts_used of n_experts
	 * SwiGLU experts of width ffn_exp (+ an always-on shared block of width ffn_shexp). */
	int n_experts, n_experts_used;
	int ffn_exp;           /* one routed expert's hidden size */
	int ffn_shexp;         /* shared-expert hidden size (0: none) */
	int n_dense_lead;      /* deepseek2 leading_dense_block_count */
	int gating;            /* enum meta_gating */
	int exp_norm;          /* renormalise the top-k weights to sum 1 */
	float exp_scale;       /* routed weights multiplied by this (1: none) */
	int has_exp_bias;      /* exp_probs_b: selection-only bias (DeepSeek-V3) */
	int n_groups;          /* DeepSeek-V3 group-limited routing: experts in n_groups groups, */
	int groups_used;       /* choices only from the groups_used best (0: no groups) */
	int shexp_gated;       /* qwen2moe: shared output x sigmoid(ffn_gate_inp_shexp . x) */
	uint64_t expert_bytes; /* bytes of the routed expert tensors, all layers */
	int is_mla;            /* deepseek2: attention is mla (n_kv_heads is then 1: the latent) */
	meta_mla_t mla;
	int is_hybrid; /* qwen35: DeltaNet layers (dn) and gated full-attention layers whose
			* attn_q rows hold [query | gate] per head, post_attention_norm before
			* the FFN, interleaved M-RoPE */
	meta_dn_t dn;
	/* rope.scaling.* (read for deepseek2 and gpt-oss): type, factor (freq scale = 1/factor),
	 * original_context_length (default n_ctx), yarn_log_multiplier as stored in the file */
	int rope_scaling; /* enum meta_rope_scaling */
	float rope_factor;
	int rope_orig_ctx;
	float yarn_log_mul;
	/* sliding-window attention (llama.cpp's swa_type standard, llama_hparams::is_masked_swa):
	 * in an SWA layer a query at position p sees the keys at p0 with p - p0 < swa_window. */
	int swa_window;       /* attention.sliding_window; 0 = no SWA layer */
	int swa_period;       /* layer l is SWA when l % swa_period < swa_period - 1 (llama.cpp's
			       * set_swa_pattern, dense last); 0 = every layer */
	float rope_base_swa;  /* RoPE base of the SWA layers */
	float rope_scale_swa; /* their frequency scale (1 = none) */
	float rope_scale; /* frequency scale of the other layers (1 / linear factor; 1 = none) */
	float attn_scale; /* softmax scale of q . k; 0 = 1 / sqrt(head_dim) */
	int attn_q_prescaled; /* llama.cpp multiplies q by attn_scale before attention (gemma3),
			       * which matters where it rounds q to F16 (attn.c) */
	/* the llama layer's variations in Gemma 3 (src/models/gemma3.cpp) and GLM-4.x MoE
	 * (src/models/glm4-moe.cpp) */
	float embd_scale;    /* token embeddings times this (gemma3: sqrt(dim)); 0 = 1 */
	int has_post_norm;   /* gemma3: post_attention_norm on the attention output and
			      * post_ffw_norm on the FFN output, each before its residual add */
	int ffn_gelu;        /* gemma3: GELU (tanh form) on the gate instead of SiLU */
	float logit_softcap; /* final_logit_softcapping: logits = c tanh(logits / c); 0 none */
	int n_nextn;         /* glm4moe: NextN/MTP layers stored after the n_layers run
			      * (nextn_predict_layers; block_count = n_layers + n_nextn), skipped */
	/* gpt-oss (meta_gptoss.c); ffn_norm_post also glm4moe */
	int ffn_norm_post; /* the FFN's input norm is post_attention_norm.weight, not ffn_norm */
	int has_sinks;     /* attn_sinks.weight [n_heads]: one more logit per head in the softmax */
	int has_out_bias;  /* attn_output.bias [dim] */
	int has_moe_bias;  /* ffn_gate_inp.bias [E], ffn_{gate,up}_exps.bias [F, E],
			    * ffn_down_exps.bias [dim, E] */
	int exp_act;       /* enum meta_act: the routed experts' activation */
	float act_alpha, act_limit; /* META_ACT_SWIGLU_OAI's alpha and limit */
	uint64_t weight_bytes;      /* sum of all tensor data */
	uint64_t types_used;        /* bit t set when some tensor has ggml type t */
} model_meta_t;

/* Fills m from g. Returns 0, or SH_EUNSUPP (architecture, tensor type), SH_EFORMAT (missing key,
 * missing tensor, wrong shape) with the reason in err. */
int meta_load(model_meta_t *m, const gguf_t *g, char *err, size_t errlen);

/* Whether layer l routes through experts. */
static inline int meta_layer_moe(const model_meta_t *m, int l)
{
	return m->n_experts > 0 && l >= m->n_dense_lead;
}

/* Reads the sliding-window keys into m (after meta_load's common keys, for an architecture with
 * SWA layers), as llama.cpp's gemma3 / openai-moe load_arch_hparams do:
 * [arch].attention.sliding_window (absent or 0: no SWA layer), .attention.sliding_window_pattern
 * (a scalar period, default period; an array leaves the default, as get_key_or_arr into a
 * scalar does) and .rope.freq_base_swa (default base_swa). Returns 0 or SH_EFORMAT. */
int meta_swa_keys(model_meta_t *m, const gguf_t *g, int period, float base_swa, char *err,
		  size_t errlen);

/* gpt-oss (meta_gptoss.c), as llama.cpp's llama_model_openai_moe::load_arch_hparams and
 * load_arch_tensors: meta_gptoss_keys after the common and MoE keys (sliding window, its
 * pattern, YaRN, routing and activation); meta_gptoss_tensors for layer l's tensors beyond the
 * common ones (sinks, output bias, router and expert biases; its post-attention norm is
 * ffn_norm_post's, checked with the common ones). */
int meta_gptoss_keys(model_meta_t *m, const gguf_t *g, char *err, size_t errlen);
int meta_gptoss_tensors(model_meta_t *m, const gguf_t *g, int l, char *err, size_t errlen);

/* For the architecture files: tensor name with shape (ne0, ne1) (ne1 = 0: a vector, which must
 * be a float type) or, with ne2, a 3-D (ne0, ne1, ne2) one, of a type the engine computes with;
 * its type is added to m->types_used. The rope.scaling.* keys (type none / linear / yarn,
 * factor, original context, yarn_log_multiplier) as llama_model::load_hparams reads them. */
int meta_check_tensor(model_meta_t *m, const gguf_t *g, const char *name, int64_t ne0, int64_t ne1,
		      int64_t ne2, char *err, size_t errlen);
int meta_rope_scaling_keys(model_meta_t *m, const gguf_t *g, char *err, size_t errlen);

/* Whether layer l is a sliding-window layer (llama_hparams::set_swa_pattern(period)). */
static inline int meta_layer_swa(const model_meta_t *m, int l)
{
	return m->swa_window > 0 && (m->swa_period <= 0 || l % m->swa_period < m->swa_period - 1);
}

/* Whether layer l is a recurrent (DeltaNet) layer: no KV cache, a state per sequence. */
static inline int meta_layer_recurrent(const model_meta_t *m, int l)
{
	return m->is_hybrid && m->dn.recurrent[l];
}

/* Bytes of one recurrent layer's state per sequence (F32 conv + delta-rule state) for n_k of
 * the n_k_heads key heads (with their value heads): 0 for a model without such layers. */
uint64_t meta_dn_state_bytes(const model_meta_t *m, int n_k);

/* Writes the names of the types in m->types_used, e.g. "F32 Q8_0", into buf. */
void meta_types_str(const model_meta_t *m, char *buf, size_t len);

#endif
