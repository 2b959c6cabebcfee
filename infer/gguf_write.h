/*
 * gguf_write.h: a small GGUF v3 writer (internal to infer/; used by `shoal mkmodel` and tests).
 *
 * Usage: gw_new(); add key/values and declare tensors (name, shape, type) in order; gw_begin()
 * writes the header, key/values and tensor infos to PATH.tmp; then the caller streams each
 * tensor's data in the declared order with gw_data() (exactly its byte size); gw_finish() pads,
 * checks every tensor was written and renames PATH.tmp to PATH. Data never has to be held in
 * memory all at once.
 *
 * Ownership: strings and arrays passed in are copied. One thread per writer.
 */
#ifndef SHOAL_GGUF_WRITE_H
#define SHOAL_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

typedef struct gguf_writer gguf_writer_t;

gguf_writer_t *gw_new(void);
void gw_free(gguf_writer_t *w); /* NULL-safe; removes PATH.tmp if gw_finish() did not run */

/* Key/values (return 0 or SH_ENOMEM). */
int gw_kv_str(gguf_writer_t *w, const char *key, const char *val);
int gw_kv_u32(gguf_writer_t *w, const char *key, uint32_t val);
int gw_kv_i32(gguf_writer_t *w, const char *key, int32_t val);
int gw_kv_f32(gguf_writer_t *w, const char *key, float val);
int gw_kv_bool(gguf_writer_t *w, const char *key, int val);
int gw_kv_arr_str(gguf_writer_t *w, const char *key, const char *const *vals, size_t n);
int gw_kv_arr_f32(gguf_writer_t *w, const char *key, const float *vals, size_t n);
int gw_kv_arr_i32(gguf_writer_t *w, const char *key, const int32_t *vals, size_t n);

/* Copies key/value i of g (any type but nested arrays: SH_EUNSUPP) as it is. */
struct gguf;
int gw_kv_copy(gguf_writer_t *w, const struct gguf *g, int i);

/* Declares a tensor: ne[0] is the row length. Returns 0, SH_EINVAL (row not whole blocks,
 * unknown type) or SH_ENOMEM. */
int gw_tensor(gguf_writer_t *w, const char *name, int n_dims, const int64_t *ne, int type);

int gw_begin(gguf_writer_t *w, const char *path, char *err, size_t errlen);
int gw_data(gguf_writer_t *w, const void *data, size_t len, char *err, size_t errlen);
/* Instead of every gw_data: the file gets its whole size with the data section a hole (zeros,
 * sparse where the file system allows): a header with its tensor table and no data, for
 * planning and for the shard ranges (eng_model_shape, eng_shard_ranges read only the header). */
int gw_skip_data(gguf_writer_t *w, char *err, size_t errlen);
int gw_finish(gguf_writer_t *w, char *err, size_t errlen);

/* ---- the model generator behind `shoal mkmodel` (infer/mkmodel.c) ---- */

typedef struct mkmodel_opts {
	const char *arch; /* "llama", "qwen2", "qwen3", "mixtral", "qwen2moe", "qwen3moe",
			   * "deepseek2", "qwen35", "qwen35moe", "gemma3", "glm4moe", "gpt-oss" */
	int dim, layers, heads, kv_heads, ffn, vocab, ctx;
	int head_dim; /* 0 = dim / heads (qwen3 may differ) */
	/* mixture of experts (the *moe and mixtral archs): routed experts, top-k, shared experts
	 * (qwen2moe: its shared block is shared_experts x expert_ffn wide; default 1), one
	 * expert's width (0 = ffn; mixtral always ffn, as llama.cpp reads it) */
	int experts, experts_used, shared_experts, expert_ffn;
	int dense_lead; /* deepseek2 with experts: leading dense layers (0 = 1) */
	int expert_groups, expert_groups_used; /* deepseek2: V3 group-limited routing (0 = none) */
	int type; /* enum qtype of the 2-D weights; norms and biases are F32 */
	uint64_t seed;
	const char *name; /* general.name, or NULL */
	/* deepseek2 (Multi-head Latent Attention; every layer dense). 0 = defaults: kv_lora dim/2,
	 * q_lora 0 (Lite: plain attn_q), qk_nope and v_head dim/heads, qk_rope half of that. */
	int kv_lora, q_lora, qk_nope, qk_rope, v_head;
	int mla_legacy;     /* 1: one attn_kv_b (older converters), 0: attn_k_b + attn_v_b */
	float rope_factor;  /* > 0: rope.scaling.type yarn with this factor */
	float yarn_log_mul; /* rope.scaling.yarn_log_multiplier (as the converter stores it) */
	int rope_orig_ctx;  /* rope.scaling.original_context_length (0 = ctx; gpt-oss 4096) */
	/* qwen35 / qwen35moe (Gated DeltaNet): 0 = defaults: state = head_dim, k-heads =
	 * heads / 2, v-heads = 2 x k-heads, conv 4 taps, a full-attention layer every 4th,
	 * rope-dim head_dim / 4; nextn MTP blocks appended (default none; shoal skips them) */
	int ssm_state, ssm_k_heads, ssm_v_heads, ssm_conv, attn_interval, nextn, rope_dim;
	/* gemma3: the sliding window (0 = 512; layers 0-4 of every 6 slide) and, with
	 * rope_factor > 0, linear RoPE scaling of the global layers. glm4moe: experts as above
	 * (dense_lead 0 = 1, one shared expert), nextn trailing NextN layers (written, skipped by
	 * the forward pass), qk_norm: q/k norms as the 355B has. gpt-oss: experts as above,
	 * head_dim free (0 = dim / heads), YaRN with rope_factor (0 = 32), the sliding window of
	 * every other layer (0 = 128); --type mxfp4 gives MXFP4 experts and F16 for the other
	 * matrices, as the converter writes gpt-oss */
	int swa_window, qk_norm;
	int header_only; /* 1: the header and tensor table only, the data a hole (gw_skip_data) */
	/* embeddings: <arch>.pooling_type "none" (no key), "mean", "cls" or "last"; NULL = the
	 * default: "last" for qwen3 (as Qwen3-Embedding's files), none otherwise. add_eos writes
	 * tokenizer.ggml.add_eos_token = true (an embedding input then ends with EOS). */
	const char *pooling;
	int add_eos;
} mkmodel_opts_t;

/* Writes a GGUF with seeded random weights (same options + seed = same bytes) and a small
 * byte-level BPE tokenizer (gpt2 model: 256 byte tokens, merges of common English words,
 * <|endoftext|> <|im_start|> <|im_end|>, a chatml template). Returns 0 or SH_E* with a reason. */
int mkmodel_write(const mkmodel_opts_t *o, const char *path, char *err, size_t errlen);

/* ---- conversion behind `shoal mkmodel --from` (infer/gguf_convert.c) ---- */

/* Writes the GGUF at src to dst with its weight matrices in type (a quant.h type the engine
 * reads): every tensor of two or more dimensions whose rows are whole blocks of type, except
 * the ones kept as they are whatever the type (routers, DeltaNet's convolution and decay).
 * Vectors (norms, biases) and every key/value are copied unchanged (general.file_type follows
 * the type). Returns 0 or SH_E* with a reason. */
int gguf_convert(const char *src, const char *dst, int type, char *err, size_t errlen);

#endif
