/*
 * planner.h: from a membership view and model metadata to one plan (rank order, hostfiles, RDMA
 * device matrix, shards). Pure: no I/O, no clock, no globals, so every node computes the same plan.
 *
 * Invariant: for the same view (whatever the order of its nodes, addresses, devices, seen_on and
 * links entries), model and options, every output of this module is byte-identical on every
 * machine. All arithmetic is integer (bandwidth is carried as whole MB/s, time as ns, the cost
 * model's figures as tenths), JSON keys are written in a fixed order, and the plan hash is a
 * 64-bit FNV-1a over the canonical compact plan JSON.
 *
 * Typical use (the leader):
 *     plan_view_t *v; plan_model_t m; plan_opts_t o; plan_t *p;
 *     plan_view_from_json(&v, text, err, sizeof err);   // or build a plan_view_t by hand
 *     plan_model_from_json(&m, meta, err, sizeof err);  // or fill plan_model_t from a GGUF
 *     plan_opts_default(&o);
 *     plan_make(&p, v, &m, &o, err, sizeof err);       // SH_ENOFIT: err says what is short
 *     char *s = plan_to_json(p);                       // send to followers; free(s)
 * A follower: plan_from_json(&p, s, err, sizeof err) checks the hash; the file writers
 * (plan_hostfile_json, ...) work the same on a parsed plan as on a made one.
 *
 * Threads: no shared state; any thread may call anything on objects it owns.
 * Format reference: docs/view.md (view JSON, model JSON, plan.json, options).
 */
#ifndef SHOAL_PLANNER_H
#define SHOAL_PLANNER_H

#include <stddef.h>
#include <stdint.h>

#define PLAN_MAX_NODES    64  /* nodes in a view (and ranks in a plan) */
#define PLAN_MAX_ADDRS    16  /* addresses per node */
#define PLAN_MAX_RDMA     16  /* RDMA devices per node */
#define PLAN_ID_LEN       32  /* node id: 32 lowercase hex characters (128 bits) */
#define PLAN_HOST_MAX     256 /* host name, NUL included */
#define PLAN_IP_MAX       48  /* textual IPv4/IPv6 address, NUL included */
#define PLAN_IFNAME_MAX   32  /* interface name, NUL included */
#define PLAN_DEV_MAX      64  /* RDMA device name, NUL included */
#define PLAN_DEFAULT_PORT 32323
#define PLAN_MACHINE_MAX  65 /* machine id, NUL included */
#define PLAN_MAX_CANDS    10 /* candidates' predictions kept in a plan (plan_candidate) */
/* A sync among ranks that share a machine whose cores they fill costs at least this much when
 * the view gives no wake_us: a rank woken by its peer waits for a core (docs/parallel.md
 * measured ~0.4 ms per sync, median, two 1-thread ranks unpinned on two busy cores). */
#define PLAN_WAKE_US   400
#define PLAN_MAX_KINDS 512 /* layer kinds in a model's pattern (the engine's META_MAX_LAYERS) */
/* A layer's KV cache holds whole tiles of this many positions (the engine's ATT_TILE,
 * infer/model/model_int.h): the planner counts what the engine allocates. */
#define PLAN_KV_TILE 64

/* Link kinds, best last, so a larger value is a better link. */
typedef enum {
	PLAN_LINK_OTHER = 0, /* unknown, loopback, tunnels */
	PLAN_LINK_WIFI = 1,
	PLAN_LINK_ETHERNET = 2,
	PLAN_LINK_THUNDERBOLT = 3,
	PLAN_LINK_RDMA = 4 /* only for pairs: a wired link whose device has an active RDMA port */
} plan_link_t;

typedef struct {
	char ip[PLAN_IP_MAX];
	char ifname[PLAN_IFNAME_MAX];
	plan_link_t kind; /* OTHER..THUNDERBOLT; guessed from ifname when the view gave none */
	int prefix;       /* IPv4 netmask length (0..32); 0 = unknown: a /24 is assumed */
} plan_addr_t;

typedef struct {
	char name[PLAN_DEV_MAX];      /* e.g. "rdma_en3" (macOS), "mlx5_0" (Linux) */
	char ifname[PLAN_IFNAME_MAX]; /* its network interface; from "rdma_X" when not given */
	int port_active;
} plan_rdma_t;

typedef struct {
	char node_id[PLAN_ID_LEN + 1]; /* the peer */
	char ifname[PLAN_IFNAME_MAX];  /* local interface on which this node sees the peer */
} plan_seen_t;

/* A link as one node measured it towards a peer (docs/view.md, "links"). A pair measured from
 * both ends counts with the worse figures (larger RTTs, smaller throughput). */
typedef struct {
	char node_id[PLAN_ID_LEN + 1]; /* the peer */
	uint32_t rtt_us; /* median round trip of small probes on the authenticated channel, > 0 */
	uint32_t rtt_p90_us; /* the probes' 90th percentile; 0 = rtt_us */
	uint32_t mbps;       /* throughput of a short burst towards the peer, Mbit/s, > 0 */
} plan_meas_t;

typedef struct {
	char node_id[PLAN_ID_LEN + 1];
	char host[PLAN_HOST_MAX];
	int port;                      /* control port, 0 when unknown */
	uint64_t mem_total, mem_avail; /* bytes */
	int cores;
	/* Measured compute (docs/view.md: what to run and how). 0 = not measured. */
	uint32_t bw_mbs;      /* decode: weight bytes/s (in MB/s) the engine's matrix-vector kernels
			       * stream on the model's weight type, one input row, `threads` threads */
	uint32_t prefill_mbs; /* the same kernels on 64 input rows: 64 x matrix bytes per second
			       * (MB/s); 0 = bw_mbs */
	int threads;          /* compute threads its engine runs; 0 = cores */
	uint32_t wake_us;     /* extra cost of one sync when ranks of a plan share this node's
			       * cores (docs/view.md); 0 = PLAN_WAKE_US */
	char machine[PLAN_MACHINE_MAX]; /* nodes with the same non-empty id share one machine's
					 * cores (namespaces, containers); "" = its own */
	plan_meas_t *links;             /* measured links towards peers */
	size_t n_links;
	plan_addr_t *addrs;
	size_t n_addrs;
	plan_rdma_t *rdma;
	size_t n_rdma;
	plan_seen_t *seen;
	size_t n_seen;
} plan_node_t;

/* A membership view. Every array is malloc'd and owned by the view; plan_view_free frees all.
 * Built by hand (the agent) or by plan_view_from_json (sorted canonically). */
typedef struct {
	uint64_t epoch;
	plan_node_t *nodes;
	size_t n_nodes;
} plan_view_t;

/* Model shape and sizes. Byte counts are for the whole tensor(s) named. Per layer means per
 * layer of the kind that has such tensors: attention bytes per attention layer ('f' or 's'),
 * rec_bytes per recurrent layer ('r'), the FFN and norms per layer of any kind. */
typedef struct {
	char arch[32];
	int n_layers, n_heads, n_kv_heads, head_dim, dim, ffn, n_vocab, n_ctx;
	int ffn_block; /* quantization block along the FFN dimension (32; 256 for K-quants) */
	uint64_t attn_qo_bytes; /* per layer: attn_q + attn_output (split by query heads) */
	uint64_t attn_kv_bytes; /* per layer: attn_k + attn_v (split by KV heads) */
	uint64_t ffn_bytes;     /* per layer: ffn_gate + ffn_up + ffn_down (split by columns) */
	uint64_t norm_bytes;    /* per layer: norms and biases (replicated on every rank) */
	uint64_t embd_bytes;    /* token_embd */
	uint64_t output_bytes;  /* output (0 when tied to token_embd) + output_norm */
	/* mixture of experts (n_experts 0: dense). Per layer, averaged over all layers: */
	int n_experts;         /* routed experts, split whole across ranks (expert parallel) */
	int n_expert_used;     /* experts each token uses (cost model); 0 = unknown: all */
	int ffn_shexp;         /* shared-expert hidden units, split by columns (0: none) */
	uint64_t expert_bytes; /* ffn_{gate,up,down}_exps */
	uint64_t shexp_bytes;  /* ffn_{gate,up,down}_shexp */
	/* Layer kinds (docs/view.md, "Memory"): layer l is of kind layer_kinds[l % its length]:
	 * 'f' full attention (a KV cache of every position of the context), 's' sliding window
	 * (a ring of swa_kv_pos positions, or every position when the context is not longer),
	 * 'r' recurrent (no KV cache: rs_copies states per sequence). "" = every layer 'f'. */
	char layer_kinds[PLAN_MAX_KINDS + 1];
	int swa_kv_pos;     /* positions an 's' layer keeps per sequence and KV head (the engine's
			     * model_swa_ring: window - 1 + one internal batch, whole tiles) */
	uint64_t rec_bytes; /* per 'r' layer: its matrices (split with its key heads) */
	uint64_t rs_bytes;  /* per 'r' layer: one state buffer of one sequence, all key heads */
	int rs_k_heads;     /* key heads an 'r' layer's state and matrices split by: a tensor rank
			     * holds its query-head share scaled to them, boundaries on multiples
			     * of rs_unit (infer/model/model.h, model_dn_heads) */
	int rs_unit;
	int rs_copies; /* state buffers per sequence (the state, rollback and checkpoints) */
	uint64_t kv_latent_bytes; /* > 0: an attention layer's cache is a latent of this many
				   * bytes per position, whole on every rank (deepseek2's MLA, F32)
				   * instead of K and V per KV head */
} plan_model_t;

/* Tensor: one stage, every rank holds a slice of every layer. Pipeline: one rank per stage, each
 * stage whole layers. Hybrid: several stages, each a tensor group over its layers. */
typedef enum { PLAN_AUTO = 0, PLAN_TENSOR = 1, PLAN_PIPELINE = 2, PLAN_HYBRID = 3 } plan_strategy_t;

typedef struct {
	plan_strategy_t strategy; /* forced (not AUTO): the best nodes and arrangement for it */
	int ctx;                  /* context length for the KV cache; 0 = the model's n_ctx */
	int kv_bytes; /* bytes per KV element (per block of kv_block elements); 0 = 4 (an F32
		       * cache; the agent passes its --kv-type) */
	int kv_block; /* elements per KV block (q8_0: 32 elements in 34 bytes); 0 = 1 */
	uint64_t
	    headroom_bytes; /* reserve per node: max(headroom_bytes, mem_avail * permille/1000) */
	int headroom_permille;
	int base_port; /* ring port of rank 0 (rank r listens on base + r); 0 = 32323 */
	int parallel; /* sequences decoded together (--parallel): the aggregate prediction; 0 = 1 */
	int slots;    /* sequences every rank keeps a KV cache and recurrent state for (the engine's
		       * slots, --parallel of serve and agent); 0 = 1 */
	/* What the engine can execute (the cost model only chooses what runs):
	 * engine_hybrid: hybrid plans (auto may choose one; forcing works regardless);
	 * engine_inflight: a pipeline runs several sequences' micro-batches at once (issue 26). */
	int engine_hybrid, engine_inflight;
	/* The chosen plan holds the view's first node (the smallest id) as rank 0: the agent's
	 * planner, which serves the API (cost model only; members left out are standby). */
	int keep_first;
} plan_opts_t;

/* One rank's share. Ranges are half-open [a, b). In tensor mode layers = [0, n_layers);
 * in pipeline mode the head and FFN ranges cover the whole model.
 *
 * Stages (every strategy; docs/view.md section 6): ranks [stage0, stage1) form stage `stage`, a
 * tensor group holding layers [layer0, layer1), each rank the slice q/kv/ffn/exp/shx within
 * it (as a tensor plan of stage1 - stage0 ranks splits one model). Stages follow each other in
 * rank order; rank stage0 is the stage's root: it receives the hidden state from the previous
 * stage's root (stage 0: rank 0 embeds the tokens), hands it to the group, gets the stage's
 * last sum (a reduce to the root) and sends it to every rank of the next stage; the last
 * stage's root sends it to rank 0, which computes the head. Tensor: one stage [0, n);
 * pipeline: stage r = [r, r + 1). */
typedef struct {
	int rank;
	char node_id[PLAN_ID_LEN + 1];
	char host[PLAN_HOST_MAX];
	char ip[PLAN_IP_MAX]; /* ring address (IPv4); "127.0.0.1" on a single node */
	int port;             /* ring port: base_port + rank */
	int n_ips;            /* mlx-hosts "ips": ring: ip; JACCL: the LAN address (docs/mlx.md) */
	char ips[PLAN_MAX_ADDRS][PLAN_IP_MAX];
	char rdma[PLAN_MAX_NODES][PLAN_DEV_MAX]; /* row of the JACCL matrix; "" = null */
	uint64_t mem_avail;
	int q0, q1, kv0, kv1, ffn0, ffn1, layer0, layer1;
	int exp0, exp1, shx0, shx1; /* routed experts, shared units; may be empty (a == b) */
	int stage, stage0, stage1;  /* its stage and the stage's ranks [stage0, stage1) */
	/* fit figures: kv_cache_bytes for the plan's context and slots (sliding-window layers
	 * their rings), rs_bytes the recurrent layers' states (every slot, every copy) */
	uint64_t weight_bytes, kv_cache_bytes, rs_bytes, act_bytes, headroom_bytes;
} plan_rank_t;

typedef struct plan plan_t;

/* A plan's predicted figures (plans made from measurements; docs/view.md section 7). */
typedef struct {
	char what[8];      /* "chosen"; "best": its strategy's best on any nodes; "all": its
			    * strategy's best over every usable node */
	char strategy[12]; /* "single" (one node), "tensor", "pipeline" or "hybrid" */
	int n_ranks, n_stages, q8_wire;
	int stage_size[PLAN_MAX_NODES];                 /* ranks of stage s */
	char node_ids[PLAN_MAX_NODES][PLAN_ID_LEN + 1]; /* in rank order */
	int parallel;                                   /* streams of the aggregate figure */
	uint64_t decode_dtok;     /* one stream's decode, tenths of tokens/s */
	uint64_t aggregate_dtok;  /* `parallel` streams decoding together, tenths of tokens/s */
	uint64_t prefill_dtok;    /* one prompt, tenths of tokens/s */
	uint64_t mem_max_bytes;   /* the largest rank's weights + KV cache + recurrent state +
				   * activations */
	int n_syncs, n_hops;      /* per decoded token: all-reduces, stage-to-stage sends */
	uint64_t sync_us, hop_us; /* mean time of one (decode) */
} plan_pred_t;

/* A member the plan does not use, and why (e.g. a plan using it would be slower). */
typedef struct {
	char node_id[PLAN_ID_LEN + 1];
	char host[PLAN_HOST_MAX];
	char reason[256];
} plan_standby_t;

/* ---- view ---- */

/* Parses a view JSON (docs/view.md) into *out, sorted canonically (nodes by id, then addresses,
 * devices, seen_on and links entries). Returns 0, or SH_EFORMAT/SH_EINVAL/SH_ENOMEM with a one-line
 * message in err. The caller frees *out with plan_view_free. */
int plan_view_from_json(plan_view_t **out, const char *json, char *err, size_t errlen);
/* Canonical JSON text of a view (sorted, fixed key order), newline-terminated; caller frees. */
char *plan_view_to_json(const plan_view_t *v);
void plan_view_free(plan_view_t *v);
/* Checks a hand-built view (ids, unique, sizes). 0 or SH_EINVAL with a message. */
int plan_view_check(const plan_view_t *v, char *err, size_t errlen);

/* Link kind guessed from an interface name: en*, eth*, veth*, ib* -> ethernet; wl* -> wifi;
 * thunderbolt*, tb*, bridge* -> thunderbolt; otherwise other. (macOS en* is ambiguous: Wi-Fi,
 * Ethernet or Thunderbolt; the view's "kind" wins whenever given.) */
plan_link_t plan_link_guess(const char *ifname);
const char *plan_link_name(plan_link_t k);
/* "thunderbolt" -> PLAN_LINK_THUNDERBOLT ...; -1 when unknown. */
int plan_link_parse(const char *s);

/* ---- model ---- */

/* Parses model metadata JSON (docs/view.md): shapes plus "wtype" (F32, F16, BF16, Q8_0, Q4_0,
 * Q4_K, Q6_K) from which byte counts are derived unless given explicitly. */
int plan_model_from_json(plan_model_t *out, const char *json, char *err, size_t errlen);
/* Fills byte counts and ffn_block from the shapes for a ggml type id (0 F32, 1 F16, 2 Q4_0,
 * 8 Q8_0, 12 Q4_K, 14 Q6_K, 30 BF16). Returns 0 or SH_EUNSUPP. */
int plan_model_set_type(plan_model_t *m, int ggml_type, int tied_output);
int plan_model_check(const plan_model_t *m, char *err, size_t errlen);
/* Layer l's kind: 'f', 's' or 'r' (layer_kinds). */
char plan_layer_kind(const plan_model_t *m, int l);

/* ---- plan ---- */

void plan_opts_default(plan_opts_t *o);
const char *plan_strategy_name(plan_strategy_t s);
int plan_strategy_parse(const char *s); /* "auto"|"tensor"|"pipeline"|"hybrid" -> value, else -1 */

/* Makes the plan. The view and model are borrowed (only read during the call); o NULL means
 * plan_opts_default. The view need not be sorted (a hand-built one is checked). Returns 0;
 * SH_EINVAL for a bad view/model/options or an impossible forced strategy; SH_ENOFIT when the
 * model does not fit, with err naming the shortfall in GB and the fixes. Caller frees *out.
 *
 * With measurements in the view (docs/view.md: "bw" on a node, "links" between nodes) the
 * cost model (cost.c, search.c) predicts every candidate's speed and picks the fastest single
 * stream decode over every subset of the measured nodes and arrangement; members it does not
 * use are standby (plan_standby). Without any, the choice is by interface kind (section 4). */
int plan_make(plan_t **out, const plan_view_t *v, const plan_model_t *m, const plan_opts_t *o,
	      char *err, size_t errlen);
void plan_free(plan_t *p);

int plan_n_ranks(const plan_t *p);
const plan_rank_t *plan_rank(const plan_t *p, int r);   /* NULL when out of range */
int plan_rank_of(const plan_t *p, const char *node_id); /* -1 when not a member */
plan_strategy_t plan_strategy(const plan_t *p);         /* TENSOR, PIPELINE or HYBRID */
const char *plan_reason(const plan_t *p);               /* why that strategy */
const char *plan_hash(const plan_t *p);                 /* 16 lowercase hex characters */
uint64_t plan_epoch(const plan_t *p);
int plan_rdma_full_mesh(const plan_t *p);
int plan_ctx(const plan_t *p);
int plan_slots(const plan_t *p); /* sequences the KV cache and states are sized for */
int plan_n_stages(const plan_t *p);
int plan_q8_wire(const plan_t *p); /* every tensor group sets tp_group_set_q8 */

/* Predictions (NULL / 0 on a plan made without measurements). The chosen plan's, then the
 * candidates (the chosen one first; the best of each strategy; each over every usable node). */
const plan_pred_t *plan_predicted(const plan_t *p);
int plan_n_candidates(const plan_t *p);
const plan_pred_t *plan_candidate(const plan_t *p, int i); /* NULL when out of range */
/* Members left out of the plan (cost model only), in node id order. */
int plan_n_standby(const plan_t *p);
const plan_standby_t *plan_standby(const plan_t *p, int i); /* NULL when out of range */

/* MLX (docs/mlx.md). Rank 0 is the smallest node ID; ranks 1..N-1 follow the cables (order.c). */
const char *plan_mlx_backend(const plan_t *p); /* "ring", "jaccl" or "jaccl-ring" */
const char *plan_jaccl(const plan_t *p);       /* "jaccl", "jaccl-ring" or "none" */
const char *plan_mlx_reason(const plan_t *p);  /* why */
const char *plan_coordinator(const plan_t *p); /* JACCL "ip:port" ("" for the ring) */
const char *plan_mlx_env(const plan_t *p);     /* "MLX_METAL_FAST_SYNCH=1" for JACCL, else "" */

/* Outputs: malloc'd, newline-terminated JSON text the caller frees; NULL only on ENOMEM. */
char *plan_hostfile_json(const plan_t *p);  /* ring: [["ip:port"], ...], row r = rank r; ""
					     * (empty) for one rank, as mlx.launch writes it */
char *plan_mlx_hosts_json(const plan_t *p); /* {"backend", "envs", "hosts": [{"ssh", "ips",
					     * "rdma"}, ...]}, one host per rank */
char *plan_mlx_list_json(const plan_t *p);  /* the "hosts" list alone (older mlx.launch) */
char *plan_rdma_json(const plan_t *p);      /* N x N, [i][j] device on i towards j, null diag */
char *plan_to_json(const plan_t *p);        /* the whole plan incl. hash (docs/view.md) */

/* Parses plan.json (as written by plan_to_json) and verifies its hash: SH_EFORMAT on any
 * mismatch. Caller frees *out. */
int plan_from_json(plan_t **out, const char *json, char *err, size_t errlen);

#endif
