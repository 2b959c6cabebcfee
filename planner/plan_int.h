/*
 * plan_int.h: the planner's internal types and helpers, shared by its own files and its tests.
 * Not part of the public API (planner/planner.h is).
 */
#ifndef SHOAL_PLAN_INT_H
#define SHOAL_PLAN_INT_H

#include "planner/planner.h"

#include <jansson.h>

struct plan {
	uint64_t epoch;
	plan_strategy_t strategy;
	char reason[512];
	plan_model_t model; /* shapes only are serialised; byte counts live in the rank figures */
	int ctx, kv_bytes, base_port;
	int slots;    /* sequences the KV cache and recurrent states are sized for (>= 1) */
	int kv_block; /* KV elements per kv_bytes (>= 1) */
	int rdma_full_mesh;
	/* MLX (docs/mlx.md): the backend the files are for, the JACCL variant the RDMA matrix
	 * allows ("none" when neither), why, and the JACCL coordinator ("" for the ring). */
	char mlx_backend[16]; /* "ring", "jaccl" or "jaccl-ring" */
	char jaccl[16];       /* "jaccl", "jaccl-ring" or "none" */
	char mlx_why[192];
	char coordinator[PLAN_IP_MAX + 8]; /* "ip:port" */
	int n_ranks;
	plan_rank_t *ranks;
	int n_stages;
	int q8_wire;
	/* the cost model's (costed = 1): the chosen plan's figures, the candidates, the standby */
	int costed;
	plan_pred_t pred;
	int n_cands;
	plan_pred_t *cands;
	int n_standby;
	plan_standby_t *standby;
	char hash[17];
};

/* a * b, saturating at UINT64_MAX (hostile views and models must not wrap). */
static inline uint64_t plan_mul_sat(uint64_t a, uint64_t b)
{
	if (a && b > UINT64_MAX / a)
		return UINT64_MAX;
	return a * b;
}

static inline uint64_t plan_add_sat(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Splits `units` among n ranks in proportion to weights w (0 weights are treated as 1): floors of
 * the exact quotas, the rest by largest remainder (ties to the lower rank); then a rank below
 * `min_each` takes units from the rank holding the most. Writes counts into out[n].
 * Precondition: units >= n * min_each, 1 <= n <= PLAN_MAX_NODES. */
void plan_split(int *out, int n, int units, int min_each, const uint64_t *w);

/* Link kind between ranks i and j of sorted nodes (best of both directions' seen_on). */
plan_link_t plan_pair_link(const plan_node_t *a, const plan_node_t *b);
/* The active RDMA device on node a whose interface is the one a sees b on; NULL when none. */
const char *plan_pair_rdma(const plan_node_t *a, const plan_node_t *b);
/* Fills r->ip for node a at ring position r->rank, prev = the node before it in the ring (NULL on
 * a single node): the address on the link to prev. "" when a has no IPv4 address. */
void plan_ring_addr(plan_rank_t *r, const plan_node_t *a, const plan_node_t *prev);
/* The address of nodes[i] that the most other nodes reach (a LAN address before a point-to-point
 * Thunderbolt one): what MLX puts first in "ips" for JACCL, where hosts[0].ips[0] is the
 * coordinator every rank dials. Writes "" when the node has no IPv4 address; returns how many
 * of the other n - 1 nodes reach it. */
int plan_lan_addr(char out[PLAN_IP_MAX], const plan_node_t *const *nodes, int n, int i);
/* Orders nodes[1..n-1] so that consecutive ranks (and the last with rank 0) share the best links
 * (order.c). nodes[0] stays. Deterministic. */
void plan_ring_order(const plan_node_t **nodes, int n);
/* The same on indices: idx[0..n) name nodes whose pair kinds are kind[a][b]; idx[0] stays. */
void plan_ring_order_kinds(int *idx, int n, const uint8_t kind[][PLAN_MAX_NODES]);
/* MLX's JACCL rules on the plan's RDMA matrix, our own code after MLX's
 * mlx/distributed/jaccl/lib/jaccl/jaccl.cpp Config::is_valid_mesh / is_valid_ring (ring: also
 * at least one device per neighbour, which MLX's check leaves to the first connection). */
int plan_rdma_is_mesh(const plan_t *p);
int plan_rdma_is_ring(const plan_t *p);
/* Decides p->mlx_backend, jaccl, mlx_why, coordinator and every rank's ips from the matrix and
 * the ring and LAN addresses already in the ranks (lan[r]: rank r's plan_lan_addr). */
void plan_mlx_decide(plan_t *p, char lan[][PLAN_IP_MAX]);

/* ---- shares and fit (plan.c) ---- */

/* Splits the tensor slices (heads, FFN columns, experts) of ranks [r0, r1) in proportion to
 * w[r0..r1) (one tensor group), layers untouched. */
void plan_slices_fill(plan_t *p, int r0, int r1, const uint64_t *w);
/* Sets every rank's layer range from the layer count of each stage (stages from the ranks'
 * stage fields, in rank order). */
void plan_layers_set(plan_t *p, const int *stage_layers);
/* Fills every rank's fit figures (weights, KV cache, activations, headroom); 0 when every rank
 * fits, else SH_ENOFIT with the message in err (may be NULL). */
int plan_fit_check(plan_t *p, const plan_opts_t *o, char *err, size_t errlen);
/* Per layer, averaged over the model's layers, the bytes rank k holds of the token mixer (attention
 * or recurrent block; half the norms) and of the FFN block (dense columns, experts, shared
 * units; the other half): the cost model's figures. read = 1: what one token reads instead (its
 * share of the routed experts, n_expert_used of them). */
void plan_rank_layer_bytes(const plan_t *p, const plan_rank_t *k, int read, uint64_t *att,
			   uint64_t *ffn);

/* Layer kinds as indices: full attention, sliding window, recurrent (plan_model_t.layer_kinds). */
enum { PLAN_KIND_F, PLAN_KIND_S, PLAN_KIND_R, PLAN_KINDS };

/* What rank k keeps for one layer of a kind: weights, KV cache (the plan's context, every slot)
 * and recurrent state (every slot, every copy). */
typedef struct {
	uint64_t w, kv, rs;
} plan_need_t;
void plan_rank_kind_needs(const plan_t *p, const plan_rank_t *k, plan_need_t need[PLAN_KINDS]);
/* Layers of each kind in [l0, l1). */
void plan_kind_counts(const plan_model_t *m, int l0, int l1, int cnt[PLAN_KINDS]);
/* Rank k's needs that do not grow with its layers: embedding, head, activations, headroom; its
 * stage and rank decide the first. */
uint64_t plan_rank_fixed_bytes(const plan_t *p, const plan_opts_t *o, const plan_rank_t *k);
/* The most consecutive layers (at most n_layers) rank k can hold within budget bytes wherever
 * they start: pipeline stages get different mixes of layer kinds, and a stage's start is not
 * known when its cap is. */
int plan_rank_layer_cap(const plan_t *p, const plan_rank_t *k, uint64_t budget);
uint64_t plan_headroom(const plan_opts_t *o, uint64_t mem);
/* Does node a have an IPv4 address (what a ring rank needs)? */
int plan_node_has_ipv4(const plan_node_t *a);

/* ---- the cost model (cost.c) and the search over candidates (search.c) ---- */

typedef struct plan_cost_ctx plan_cost_ctx_t;

/* A candidate arrangement: nodes in rank order and the stages they form. */
typedef struct {
	plan_strategy_t
	    strategy; /* TENSOR (one stage; one rank: a single node), PIPELINE, HYBRID */
	int n, n_stages, q8;
	int fill;                /* layers: 1 = fastest stages first up to memory; 0 = balanced */
	int idx[PLAN_MAX_NODES]; /* rank r -> index of its node in the context's sorted nodes */
	int stage_end[PLAN_MAX_NODES]; /* stage s = ranks [s ? stage_end[s - 1] : 0, stage_end[s])
					*/
} plan_layout_t;

/* Predicted figures of a filled candidate (integers: every machine gets the same). */
typedef struct {
	uint64_t decode_ns;       /* one decode step of one stream */
	uint64_t agg_mtoks;       /* `parallel` streams together: milli-tokens per second */
	uint64_t prefill_mtoks;   /* prompt tokens (passes of 64): milli-tokens per second */
	uint64_t mem_max;         /* largest rank's weights + KV + state + activations */
	int n_syncs, n_hops;      /* per decode step */
	uint64_t sync_ns, hop_ns; /* their total time per decode step */
} plan_cost_t;

/* The context: measured figures of the sorted nodes as matrices. NULL on ENOMEM. */
plan_cost_ctx_t *plan_cost_ctx_new(const plan_node_t *const *nodes, int n, const plan_model_t *m,
				   const plan_opts_t *o);
void plan_cost_ctx_free(plan_cost_ctx_t *c);
/* Is the view measured enough for the cost model (some node's bw; a link when n > 1)? */
int plan_cost_ctx_measured(const plan_cost_ctx_t *c);
/* Node i's measured decode rate (MB/s, 0 = none); is pair (i, j) measured? */
uint32_t plan_cost_bw(const plan_cost_ctx_t *c, int i);
int plan_cost_pair_ok(const plan_cost_ctx_t *c, int i, int j);
/* One-way latency (ns) and a message's transfer time (ns) between nodes i and j. */
uint64_t plan_cost_lat(const plan_cost_ctx_t *c, int i, int j);
uint64_t plan_cost_xfer(const plan_cost_ctx_t *c, int i, int j, uint64_t bytes);
/* A decode step's time per layer of stage [r0, r1) of a filled plan laid out as l (compute of
 * the slowest rank + its two syncs): what balances the layers between stages. */
uint64_t plan_cost_stage_layer_ns(const plan_cost_ctx_t *c, const plan_layout_t *l, const plan_t *p,
				  int r0, int r1);
/* A decode step's time in stage s that does not grow with its layers: rank 0's head and STEP
 * (stage 0), the hop to the next stage. */
uint64_t plan_cost_stage_fixed_ns(const plan_cost_ctx_t *c, const plan_layout_t *l, const plan_t *p,
				  int s);
/* One stream's decode step alone (what plan_cost_predict puts in decode_ns). */
uint64_t plan_cost_decode_ns(const plan_cost_ctx_t *c, const plan_layout_t *l, const plan_t *p);
/* Predicts the figures of plan p (shares and fit filled) laid out as l. */
void plan_cost_predict(const plan_cost_ctx_t *c, const plan_layout_t *l, const plan_t *p,
		       plan_cost_t *out);

/* The search result: the layout to build, its figures, the reason, the candidates, standby. */
typedef struct {
	plan_layout_t layout;
	plan_cost_t cost;
	char reason[512];
	int n_cands;
	plan_pred_t cands[PLAN_MAX_CANDS];
	int n_standby;
	plan_standby_t standby[PLAN_MAX_NODES];
} plan_choice_t;

/* Searches every candidate over the sorted nodes (search.c). 0 with *out filled; SH_ENOFIT
 * when no measured candidate fits (the caller falls back to the kind-based plan); SH_EINVAL
 * with err for an impossible forced strategy; SH_ENOMEM. */
int plan_search(plan_choice_t *out, const plan_cost_ctx_t *c, const plan_node_t *const *nodes,
		int n, const plan_model_t *m, const plan_opts_t *o, char *err, size_t errlen);
/* Fills p's stages, tensor slices and layer ranges for layout l (p->ranks already hold each
 * rank's rank and mem_avail) and checks the fit: 0 or SH_ENOFIT. The search and the final
 * plan both fill through here, so the plan built is the candidate that was costed. */
int plan_layout_fill(const plan_cost_ctx_t *c, const plan_layout_t *l, plan_t *p,
		     const plan_opts_t *o);
/* Fills a prediction's summary of a layout and its figures (nodes: the sorted nodes). */
void plan_pred_fill(plan_pred_t *d, const char *what, const plan_layout_t *l, const plan_cost_t *k,
		    const plan_node_t *const *nodes, int parallel, const plan_model_t *m);

/* Canonical JSON object of the plan; with_hash = 0 leaves "hash" out (the hashed form). */
json_t *plan_json_object(const plan_t *p, int with_hash);
/* Computes p->hash from the canonical form. Returns 0 or SH_ENOMEM. */
int plan_hash_compute(plan_t *p);
/* 0 when the shares cover the model exactly once (planner.c's invariant), else SH_EFORMAT. */
int plan_check_cover(const plan_t *p, char *err, size_t errlen);
/* FNV-1a 64 of a NUL-terminated string. */
uint64_t plan_fnv1a64(const char *s);
/* json_dumps + "\n"; NULL on ENOMEM. */
char *plan_dump(json_t *j);

#endif
