/*
 * infer.h: the inference engine's public interface, used by web/ and agent/.
 *
 * An engine owns one loaded model (memory-mapped GGUF, tokenizer, chat template, KV cache, a
 * persistent compute thread pool). The KV cache has n_slots slots (eng_opts_t.parallel): up to
 * that many sequences run together, one forward pass (eng_step) computing a token of every
 * decoding sequence and a chunk of prompt of the admitted ones (continuous batching). Each slot
 * keeps the tokens of its last sequence, so a request that starts with them (a chat's earlier
 * turns) only computes the rest; a new sequence goes to the free slot sharing the longest prefix.
 * eng_generate() is the one-request special case. How many ranks compute a step is hidden behind
 * this interface: a tensor-parallel engine looks the same.
 *
 * Threads: eng_generate(), eng_seq_start(), eng_step(), eng_seq_cancel() and eng_spec_stats()
 * are called from one thread at a time (web/'s scheduler, the CLI). eng_info(), eng_tokenize(),
 * eng_detokenize() and eng_chat_prompt() are read-only and may be called from any thread at any
 * time once eng_open() has returned.
 */
#ifndef SHOAL_INFER_H
#define SHOAL_INFER_H

#include <stddef.h>
#include <stdint.h>

typedef struct eng eng_t;

struct tp_group;

/* One rank of a group computing the model together (docs/parallel.md). */
typedef struct eng_dist {
	struct tp_group *group; /* formed group (transport.h), borrowed: outlives the engine and is
				   used only by the engine's generate / worker thread */
	int pipeline;           /* 0 = tensor parallel, 1 = pipeline (contiguous layers per rank) */
	int step_timeout_ms;    /* bound on every wait inside a step; 0 = 10000 */
	int has_ranges;         /* 1: this rank's share is the ranges below (a plan's), 0: computed
				   from weights */
	const int *weights;     /* world relative shares when !has_ranges (NULL = even) */
	int q0, q1, kv0, kv1, ffn0, ffn1, layer0,
	    layer1;                 /* half-open, as planner.h's plan_rank_t */
	int exp0, exp1, shx0, shx1; /* routed experts and shared-expert units (MoE); an empty
				       range = none of them */
	int stage0, stage1; /* its stage: ranks [stage0, stage1), a tensor group over the layers
			       above (planner.h's plan_rank_t; hybrid plans: tensor parallel
			       inside a stage, pipeline between stages); equal (0, 0): the
			       pipeline flag's layout (one stage, or a stage per rank) */
	int inflight; /* several stages, rank 0: passes (micro-batches of the active sequences)
			 kept in flight round the stages at most; 0 = one per stage, 1 = one
			 at a time (lock-step) */
} eng_dist_t;

typedef struct eng_opts {
	const char *model_path;    /* GGUF file (borrowed for the call) */
	int threads;               /* compute threads; 0 = number of cores */
	int ctx;                   /* context length; 0 = model's, capped to what memory allows */
	const char *chat_template; /* family name override ("chatml", "llama3", ...) or NULL */
	const eng_dist_t *dist;    /* NULL = this node alone; else read during eng_open only (the
				      group it names is kept) */
	int parallel;              /* KV slots: sequences run together; 0 = ENG_DEFAULT_PARALLEL
				      (on several ranks rank 0's value wins) */
	const char *kv_type;       /* KV cache elements: "f32", "f16" or "q8_0"; NULL = "f16" */
	int rollback;              /* hybrid models (recurrent layers): positions of a step that can
				      be taken back (speculative decoding verifies k + 1 tokens:
				      k); 0 = none. On several ranks rank 0's value wins. */
	/* Speculative decoding (docs/speculative.md), rank 0 only: "auto" (NULL: the draft model
	 * when one is given, else prompt lookup, each only where it pays), "off", "ngram" (prompt
	 * lookup) or "model" (needs draft_model). */
	const char *spec;
	const char *draft_model; /* GGUF with the same vocabulary, run on rank 0 alone, or NULL */
	int draft_max;           /* longest draft; 0 = 8 (at most 16) */
} eng_opts_t;

#define ENG_DEFAULT_PARALLEL 4
#define ENG_MAX_PARALLEL     256

typedef struct eng_info {
	const char *name;    /* general.name or the file's base name */
	const char *arch;    /* "llama", "qwen2", "qwen3" */
	int n_ctx;           /* context length in use */
	const char *kv_type; /* KV cache element type in use ("f16", ...) */
	uint64_t kv_bytes;   /* bytes of this rank's KV cache */
	uint64_t rs_bytes;   /* bytes of this rank's recurrent state, all slots (hybrid models:
				a state per slot instead of a KV cache in most layers; 0 else) */
	int n_vocab;
	int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn;
	int bos, eos;              /* token ids, -1 when absent */
	uint64_t weight_bytes;     /* bytes of tensor data */
	const char *chat_template; /* family in use, or NULL when none */
	int tool_format;           /* how tool calls look in the output: enum eng_tool_format */
	int rank, world;           /* 0 and 1 on one node */
	int n_slots;               /* sequences run together (each has n_ctx positions) */
	int n_stages;              /* pipeline stages of the group (1: one node or tensor) */
	int pooling;               /* enum eng_pooling of embeddings (eng_embed_start) */
	int pooling_given;         /* 1: the file's <arch>.pooling_type; 0: the default (LAST) */
	uint64_t n_params;         /* weights (elements of every tensor) */
	const char *weight_type;   /* type of most of the weight bytes ("Q8_0", "F32", ...) */
	int think_open;            /* the chat prompt ends inside an opened <think> (qwen3.5's
				      template): a reply starts with its reasoning */
	const char *spec;          /* speculative decoding: "off", "auto", "ngram" or "model" */
	const char *draft;         /* the draft model's name, or NULL */
} eng_info_t;

/* How an embedding pools the final hidden states of its tokens: the GGUF's
 * `<arch>.pooling_type` (llama.cpp's numbers). A file that names none, or NONE, gets LAST: what
 * decoder embedding models (Qwen3-Embedding, e5-mistral, gte-Qwen2) use, and the only token of
 * a causal model that has seen the whole input. RANK (rerankers) is refused. */
enum eng_pooling {
	ENG_POOL_NONE = 0,
	ENG_POOL_MEAN = 1,
	ENG_POOL_CLS = 2,
	ENG_POOL_LAST = 3,
	ENG_POOL_RANK = 4
};

/* How a model writes tool calls in its output (eng_info_t.tool_format): <tool_call> tags around
 * JSON (Hermes, Qwen, and the generic style), Llama 3.1's bare JSON, Mistral's [TOOL_CALLS],
 * Qwen3.5's XML, gpt-oss's harmony channels, GLM-4.5's argument pairs. */
enum eng_tool_format {
	ENG_TOOLS_HERMES = 0,
	ENG_TOOLS_LLAMA3,
	ENG_TOOLS_MISTRAL,
	ENG_TOOLS_XML,     /* Qwen3.5's <tool_call><function=...><parameter=...> (llama.cpp's
			      qwen3-coder) */
	ENG_TOOLS_HARMONY, /* gpt-oss: the reply's channels (eng_harmony_parse) */
	ENG_TOOLS_GLM4     /* GLM-4.5/4.6: <tool_call>NAME then <arg_key>/<arg_value> pairs */
};

typedef struct eng_msg {
	const char *role;         /* "system", "user", "assistant", "tool" */
	const char *content;      /* UTF-8 ("" for an assistant message that only calls tools) */
	const char *tool_calls;   /* assistant: OpenAI's tool_calls array as JSON text, or NULL */
	const char *tool_call_id; /* tool: the id of the call this answers, or NULL */
	const char *reasoning;    /* assistant: its reasoning_content, or NULL (gpt-oss renders it
				   * before a tool call) */
} eng_msg_t;

/* gpt-oss's replies (infer/chat_harmony.c): the messages of a reply in OpenAI's harmony format
 * as pieces pointing into text: reasoning (the analysis channel), content (final, or commentary
 * to no one) and tool calls (to=functions.NAME, the body holding the arguments), in order. The
 * last piece may be open (no closing token yet); its length then leaves out a tail that could
 * still become a harmony token, unless final (the whole reply), so a longer text parses to the
 * same pieces, each as long or longer (a stream can send what a parse shows). Text without any
 * channel is one content piece. At most ENG_HARMONY_MAX pieces (the rest is dropped). Pure. */
enum { ENG_H_CONTENT = 0, ENG_H_REASONING, ENG_H_CALL };
#define ENG_HARMONY_MAX 32
typedef struct eng_hpiece {
	int kind;         /* ENG_H_* */
	const char *p;    /* into the parsed text */
	size_t len;       /* the body */
	const char *name; /* ENG_H_CALL: the function's name (name_len bytes) */
	size_t name_len;
	int done; /* closed by a harmony token */
} eng_hpiece_t;
typedef struct eng_harmony {
	eng_hpiece_t piece[ENG_HARMONY_MAX];
	int n;
} eng_harmony_t;
void eng_harmony_parse(const char *text, size_t len, int final, eng_harmony_t *h);

/* A compiled JSON Schema for structured output (infer/grammar.h): the reply is then one JSON
 * value that validates against it, and generation ends when the value is complete. Immutable
 * once built; any thread may share it. */
typedef struct eng_grammar eng_grammar_t;

/* Compiles schema[0..len) (JSON text of a JSON Schema), or any JSON object when schema is NULL.
 * Returns 0, SH_EUNSUPP (a keyword outside the supported set, named in err) or SH_EINVAL (not a
 * valid schema, or no value satisfies it). */
int eng_grammar_new(eng_grammar_t **out, const char *schema, size_t len, char *err, size_t errlen);
void eng_grammar_free(eng_grammar_t *g); /* NULL-safe */

typedef struct eng_sampling {
	float temperature;       /* 0 = greedy */
	int top_k;               /* 0 = off */
	float top_p;             /* 1 = off */
	float min_p;             /* 0 = off */
	float repeat_penalty;    /* 1 = off */
	float presence_penalty;  /* 0 = off */
	float frequency_penalty; /* 0 = off */
	uint64_t seed;           /* same seed, same text */
	int max_tokens;          /* 0 = until EOS or the context is full */
	const char *const *stop; /* stop strings (borrowed), n_stop of them */
	int n_stop;
	int top_logprobs;             /* 0 = none; else report this many alternatives per token */
	const eng_grammar_t *grammar; /* structured output (borrowed for the request) or NULL */
	int ignore_eos; /* 1: end-of-generation tokens are never sampled (benchmarks, tests) */
} eng_sampling_t;

/* Fills s with the neutral defaults documented above (greedy, nothing off). */
void eng_sampling_default(eng_sampling_t *s);

enum eng_finish {
	ENG_FINISH_NONE = 0,
	ENG_FINISH_STOP,
	ENG_FINISH_LENGTH,
	ENG_FINISH_ERROR,
	ENG_FINISH_CANCELED
};

typedef struct eng_logprob {
	int token;
	float logprob;
} eng_logprob_t;

/* One generated token, handed to the callback. text holds the bytes this token completes
 * (UTF-8, never half a character; may be empty while a character is incomplete or while text
 * could still turn into a stop string). When generation ends at an end-of-generation token while
 * text is still held back, one last callback carries that text with the end token's id (it is
 * not counted in completion_tokens). Pointers are valid during the callback only. */
typedef struct eng_token {
	int id;
	const char *text;
	size_t text_len;
	float logprob;            /* log-probability of id under the sampling distribution */
	const eng_logprob_t *top; /* top_logprobs alternatives, best first */
	int n_top;
} eng_token_t;

/* Called for each token. Return non-zero to cancel the request (a client went away). */
typedef int (*eng_token_cb)(void *ud, const eng_token_t *tok);

typedef struct eng_seq_state eng_seq_state_t; /* below: resuming a sequence elsewhere */

typedef struct eng_result {
	int finish; /* enum eng_finish */
	int prompt_tokens;
	int completion_tokens;
	double prompt_ms, gen_ms; /* wall time of prefill and of generation */
	int stop_hit;             /* 1 + the index of the stop string that ended it; 0: none */
	char error[256];          /* set when finish == ENG_FINISH_ERROR */
	/* set when the sequence ended because a step's forward pass failed (eng_step's error, a
	 * rank lost): its state before that step, to continue it on another engine
	 * (eng_seq_start_resume). Owned by the caller (eng_seq_state_free); NULL otherwise, when
	 * out of memory, and always after eng_generate. */
	eng_seq_state_t *resume;
} eng_result_t;

/* Whole bytes per KV cache element of kv_type (NULL = the default, f16), rounded up (q8_0's 34
 * bytes per 32 elements count as 2): the planner's kv_bytes. -1 for an unknown name. */
int eng_kv_elem_bytes(const char *kv_type);
/* The exact figure: bytes per block of *elems elements (f32 4/1, f16 2/1, q8_0 34/32): the
 * planner's kv_bytes and kv_block. -1 for an unknown name. */
int eng_kv_block_bytes(const char *kv_type, int *elems);

/* Loads the model. Returns 0 or a negative SH_E* code with a one-line reason in err. */
int eng_open(eng_t **out, const eng_opts_t *opts, char *err, size_t errlen);
void eng_free(eng_t *e); /* NULL-safe */

const eng_info_t *eng_info(const eng_t *e); /* lives as long as e */

/* Text -> ids. add_bos: prepend BOS when the model wants it; special: parse special tokens
 * written in the text. *ids is malloc'd, the caller frees it. */
int eng_tokenize(const eng_t *e, const char *text, int add_bos, int special, int **ids, int *n_ids,
		 char *err, size_t errlen);

/* Ids -> text, malloc'd and NUL-terminated; the caller frees it. */
int eng_detokenize(const eng_t *e, const int *ids, int n_ids, char **text);

/* Applies the chat template to msgs and tokenizes the result (with BOS as the model wants), ready
 * for eng_generate. An unknown role is SH_EINVAL with a message. *ids is malloc'd. */
int eng_chat_prompt(const eng_t *e, const eng_msg_t *msgs, int n_msgs, int **ids, int *n_ids,
		    char *err, size_t errlen);
/* The same with tools offered (tools_json: OpenAI's "tools" array as JSON text, or NULL) and
 * tool calls and results in the history, rendered as the model's family expects (infer/chat.h).
 * open_call: the reply must be a tool call (tool_choice "required" or a named function). */
int eng_chat_prompt_tools(const eng_t *e, const eng_msg_t *msgs, int n_msgs, const char *tools_json,
			  int open_call, int **ids, int *n_ids, char *err, size_t errlen);

/* Runs one request to completion on the calling thread: prefill prompt, then sample until EOS, a
 * stop string, max_tokens, the end of the context, cancellation, or an error. cb may be NULL.
 * It is eng_seq_start + eng_step until the request ends: call it only while no other sequence
 * is active (their endings would not be reported).
 * Always fills res. Returns 0, or a negative code (then res->finish is ENG_FINISH_ERROR and
 * res->error says why; a prompt longer than the context is SH_EINVAL). */
int eng_generate(eng_t *e, const int *prompt, int n_prompt, const eng_sampling_t *s,
		 eng_token_cb cb, void *ud, eng_result_t *res);

/* ---- continuous batching -----------------------------------------------------------------
 * A sequence is one request in one slot; its id is the slot number. The caller admits requests
 * between steps and calls eng_step while any sequence is active. Each step computes one token
 * of every decoding sequence plus prompt chunks of prefilling ones (admission order; while
 * others decode, at most ENG_PREFILL_CHUNK prompt tokens per step so their next token is not held
 * up long), then samples each sequence with its own sampler and calls its callback. */

#define ENG_PREFILL_CHUNK 32  /* prompt tokens per step while other sequences decode */
#define ENG_PREFILL_MAX   512 /* prompt tokens per step when nothing decodes */

/* Admits a request into the free slot whose cached tokens share the longest prefix with prompt
 * (ties: least recently used). prompt is copied; s is copied but its stop strings (and any
 * pointer it holds) are borrowed, as are ud and res, until the sequence ends. Returns the
 * sequence id (>= 0), or SH_EBUSY when every slot is busy, or SH_EINVAL for a bad prompt (then
 * res->finish is ENG_FINISH_ERROR and res->error says why). */
int eng_seq_start(eng_t *e, const int *prompt, int n_prompt, const eng_sampling_t *s,
		  eng_token_cb cb, void *ud, eng_result_t *res);

/* A sequence that ended in a step: its res is final and its slot free again. rc is 0 or the
 * negative code of its error (res->error says why). */
typedef struct eng_done {
	int id;
	int rc;
} eng_done_t;

/* One forward pass over every active sequence (nothing when none). done (n_slots entries) gets
 * the sequences that ended, *n_done their count. Returns 0, or the forward pass's error: then
 * every active sequence ended with ENG_FINISH_ERROR and is in done, with its state before this
 * step in res->resume (to go on elsewhere: a rank was lost).
 * On rank 0 of a pipeline with passes in flight (eng_dist_t.inflight) a step instead submits
 * passes of the sequences that are ready (up to one per stage in flight) and takes the oldest
 * one back: only that pass's sequences get their token in the step (each sequence still gets
 * one per pass of its own). A sequence canceled while its pass is out frees its slot at once. */
int eng_step(eng_t *e, eng_done_t *done, int *n_done);

/* Ends sequence id at once with ENG_FINISH_CANCELED (no-op for a free slot); its slot keeps the
 * tokens computed so far for prefix reuse. */
void eng_seq_cancel(eng_t *e, int id);

/* ---- resuming a sequence elsewhere (a re-plan) ---------------------------------------------
 * A sequence's state is what its output depends on besides the model and its parameters: its
 * tokens (the request's prompt and every token handed out so far), its sampler's generator
 * position (the penalty window and the structured-output matcher follow from the tokens), the
 * text held back (a stop string's possible start, an unfinished UTF-8 character) and its counts.
 * The engine keeps it current as it samples (bookkeeping only: the tokens are appended), so a
 * snapshot costs one copy. eng_seq_start_resume continues it on any engine of the same model
 * (another group, other ranks): it prefills the tokens (reusing a slot's cached prefix, like
 * eng_seq_start) and samples on from where the state left off, so the callbacks go on with the
 * next token (nothing repeated or missing) and res counts the whole request. On an engine whose
 * pass gives the same bits (the same plan shape; batches do not change them) the text is the
 * one an undisturbed run gives, greedy or seeded. A state is independent of the engine it came
 * from (it may outlive it) and immutable; any thread may hold it. */

/* A copy of active sequence id's state, between steps; NULL for a free slot or when out of
 * memory. Free with eng_seq_state_free. */
eng_seq_state_t *eng_seq_snapshot(const eng_t *e, int id);
void eng_seq_state_free(eng_seq_state_t *st); /* NULL-safe */
/* Tokens in the state (prompt + generated); *n_generated (may be NULL) the generated ones. */
int eng_seq_state_tokens(const eng_seq_state_t *st, int *n_generated);

/* Admits st as eng_seq_start admits a prompt (same returns; s, cb, ud and res as there: s
 * should be the request's parameters, its stop strings and grammar again). res starts with the
 * state's counts (prompt_tokens the request's, completion_tokens those handed out). A state
 * that does not fit this engine's context is SH_EINVAL. st is only read. */
int eng_seq_start_resume(eng_t *e, const eng_seq_state_t *st, const eng_sampling_t *s,
			 eng_token_cb cb, void *ud, eng_result_t *res);

/* Speculative decoding's figures since eng_open (zeros when off). A verify is one sequence's
 * drafted positions checked in a step. */
typedef struct eng_spec_stats {
	uint64_t verifies; /* sequence-steps that verified a draft */
	uint64_t drafted;  /* drafted tokens verified */
	uint64_t accepted; /* of them, accepted */
	uint64_t emitted;  /* tokens the verifies produced (accepted + the target's own) */
	double draft_ms;   /* time spent drafting */
	double draft_len;  /* mean length of the recent drafts (0 while none) */
} eng_spec_stats_t;
void eng_spec_stats(const eng_t *e, eng_spec_stats_t *out);

/* Sequences in progress. */
int eng_active(const eng_t *e);

/* State of slot i for metrics: 0 free, 1 prefill, 2 decode. */
int eng_slot_state(const eng_t *e, int i);

/* ---- embeddings ---------------------------------------------------------------------------
 * An embedding sequence computes its input in a slot like a prompt (chunks mixed into the same
 * steps as generation, on every rank of a group) and, instead of sampling, pools the final
 * hidden states (after the output norm) of its tokens as eng_info()->pooling says, scaled to unit
 * length. It always starts at position 0 (the result never depends on what a slot held). */

/* Text -> the ids of one embedding input: BOS and EOS as the tokenizer's add_bos / add_eos say
 * (llama.cpp's add_special), special tokens written in the text parsed. *ids is malloc'd. */
int eng_embed_tokenize(const eng_t *e, const char *text, int **ids, int *n_ids, char *err,
		       size_t errlen);

/* Admits an embedding of ids[0..n) (copied) into the least recently used free slot. out (dim
 * floats, borrowed with res until the sequence ends) receives the embedding; the sequence ends
 * in a step's done list with res->finish ENG_FINISH_STOP and res->prompt_tokens n. Returns the
 * sequence id, SH_EBUSY when every slot is busy, SH_EINVAL for bad ids, a length outside
 * 1..n_ctx or a reranker's pooling (res->error says why). */
int eng_embed_start(eng_t *e, const int *ids, int n, float *out, eng_result_t *res);

/* ---- several ranks (eng_opts_t.dist) ------------------------------------------------------
 * eng_open with a dist is collective: every rank of the group calls it (it agrees on the
 * context, checks the model and the shares). On rank 0 the engine is used as on one node:
 * eng_generate drives the group step by step, and a rank that dies or stalls makes the request
 * fail within the step timeout (the engine is then unusable: every later request fails; form a
 * new group). eng_free on rank 0 tells the workers to stop. Every other rank calls
 * eng_worker_run, which computes the steps rank 0 sends until rank 0 stops the group (returns 0)
 * or the group fails (returns the error, reason in err). */
int eng_worker_run(eng_t *e, char *err, size_t errlen);

/* ---- a node that holds only its slice of the file -------------------------------------- */

typedef struct eng_range {
	uint64_t off, len; /* bytes [off, off + len) of the file */
	int compact;       /* 1: one row's piece of a column slice: keep it in the sidecar PATH.cols
			    * (listed in PATH.cols.map, "OFF LEN SIDE" lines) so that it does not
			    * cost whole file-system blocks in a sparse copy; read through it by
			    * eng_open */
} eng_range_t;

/* The byte ranges of the GGUF file at path that a rank computing dist's share reads: the header
 * (metadata, tokenizer, tensor table), every one-dimensional tensor (norms, biases), the
 * embedding, the share's rows and column slices of each matrix, and the output head when rank is
 * 0. dist NULL: the whole model; otherwise dist->has_ranges must be set (no group is used).
 * Sorted by (compact, off) and merged within each kind. Only the file's header needs to be present
 * (the rest may be a hole of a sparse file). *out is malloc'd (caller frees). Returns 0 or SH_E*
 * with a reason in err. */
int eng_shard_ranges(const char *path, const eng_dist_t *dist, int rank, eng_range_t **out, int *n,
		     char *err, size_t errlen);

/* The bytes a GGUF file's header takes (metadata, tokenizer, tensor table: the start of its data
 * section), from its first len bytes; SH_EFORMAT when they hold no whole valid header (a longer
 * prefix may). For a node that fetches the header before its slice. */
int eng_header_bytes(const void *prefix, size_t len, uint64_t *need, char *err, size_t errlen);

/* A model file's shape, for planning without loading it: the metadata the engine reads (with
 * its checks), and the tensors' bytes summed by how tensor parallelism cuts them (infer/tp.h's
 * dist_tensor_part: the same function the engine's split follows). */
typedef struct eng_model_shape {
	char arch[32];
	int n_layers, n_heads, n_kv_heads, head_dim, dim, ffn, n_vocab, n_ctx;
	int n_experts, ffn_shexp; /* mixture of experts (0: dense) */
	/* sliding-window attention (swa_window 0: none): layer l is an SWA layer when swa_period
	 * is 0 or l % swa_period < swa_period - 1; such a layer keeps min(context, swa_kv_pos)
	 * positions per slot and KV head instead of the whole context (a ring, infer/model/swa.c);
	 * n_swa_layers of the n_layers are. */
	int swa_window, swa_period, swa_kv_pos, n_swa_layers;
	uint8_t swa[64]; /* bit l % 8 of byte l / 8: layer l is a sliding-window layer */
	/* Hybrid models (qwen35): the layers marked in recurrent (bit l % 8 of byte l / 8) keep no
	 * KV cache but a recurrent state per sequence (slot), rs_layer_bytes each for all their
	 * heads (F32; a tensor-parallel rank holds its share of the heads, a pipeline stage its
	 * layers'), rs_copies times (the state and the engine's checkpoints of it). n_kv_layers
	 * layers keep a KV cache (n_layers for other models, with no bit set). */
	int n_kv_layers;
	uint64_t rs_layer_bytes;
	int rs_copies;
	uint8_t recurrent[64]; /* 512 layers */
	/* how a recurrent layer's state and matrices split over tensor ranks: by its rs_k_heads
	 * key heads, a rank holding model_dn_heads' share (boundaries on multiples of rs_unit) */
	int rs_k_heads, rs_unit;
	int ffn_block; /* elements per block of the FFN column split (dist_ffn_block) */
	/* bytes over all layers: */
	uint64_t q_heads_bytes, kv_heads_bytes, ffn_bytes, expert_bytes, shexp_bytes;
	uint64_t recurrent_bytes; /* DeltaNet matrices (DIST_PART_RECURRENT) */
	/* deepseek2's latent attention: its cache per layer and position (F32 whatever the KV
	 * type, whole on every rank: mla.c); 0 for a per-KV-head cache */
	uint64_t kv_latent_bytes;
	uint64_t replicated_bytes; /* norms, biases, routers */
	uint64_t embd_bytes, output_bytes;
	int wtype; /* the ggml type of most of the matrices' bytes (eng_kernel_rate) */
} eng_model_shape_t;
int eng_model_shape(const char *path, eng_model_shape_t *s, char *err, size_t errlen);

/* The engine's matrix kernels timed on a synthetic matrix of weight type wtype (4096 columns)
 * on a pool of `threads` threads (0 = the cores): what the planner reads as a node's compute
 * rate (docs/view.md section 1.1). Takes ~2 s (mostly making the matrix) and ~300 MB for a
 * moment. */
typedef struct eng_kernel_rate {
	int threads;        /* the pool's threads */
	double decode_mbs;  /* one input row: matrix bytes per second, in MB/s (the median of 11) */
	double prefill_mbs; /* 64 input rows: 64 x matrix bytes per second, in MB/s */
} eng_kernel_rate_t;
int eng_kernel_rate(int wtype, int threads, eng_kernel_rate_t *out, char *err, size_t errlen);

/* Communication figures of this rank (zeros on one node). */
typedef struct eng_comm {
	uint64_t steps, tokens; /* forward passes and the tokens in them */
	uint64_t bytes_sent;    /* payload bytes this rank sent to other ranks */
	double comm_ms;         /* time inside collectives and step messages */
	double step_ms;         /* time of the passes, communication included */
	double comm_min_ms;     /* least communication of one decode step (~ the network's share
				   without waiting for a slower rank) */
	int in_flight_max;      /* rank 0 of a pipeline: most passes in flight round the stages
				   at once (1: lock-step) */
} eng_comm_t;
void eng_comm_stats(const eng_t *e, eng_comm_t *out);
/* A worker rank's (eng_worker_run) figures as of its last pass, from any thread while the
 * worker runs (bytes_sent and in_flight_max are 0). */
void eng_worker_comm_stats(eng_t *e, eng_comm_t *out);

#endif
