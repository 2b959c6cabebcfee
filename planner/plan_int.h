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
	char reason[256];
	plan_model_t model; /* shapes only are serialised; byte counts live in the rank figures */
	int ctx, kv_bytes, base_port;
	int rdma_full_mesh;
	/* MLX (docs/mlx.md): the backend the files are for, the JACCL variant the RDMA matrix
	 * allows ("none" when neither), why, and the JACCL coordinator ("" for the ring). */
	char mlx_backend[16]; /* "ring", "jaccl" or "jaccl-ring" */
	char jaccl[16];       /* "jaccl", "jaccl-ring" or "none" */
	char mlx_why[192];
	char coordinator[PLAN_IP_MAX + 8]; /* "ip:port" */
	int n_ranks;
	plan_rank_t *ranks;
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
/* MLX's JACCL rules on the plan's RDMA matrix, our own code after MLX's
 * mlx/distributed/jaccl/lib/jaccl/jaccl.cpp Config::is_valid_mesh / is_valid_ring (ring: also
 * at least one device per neighbour, which MLX's check leaves to the first connection). */
int plan_rdma_is_mesh(const plan_t *p);
int plan_rdma_is_ring(const plan_t *p);
/* Decides p->mlx_backend, jaccl, mlx_why, coordinator and every rank's ips from the matrix and
 * the ring and LAN addresses already in the ranks (lan[r]: rank r's plan_lan_addr). */
void plan_mlx_decide(plan_t *p, char lan[][PLAN_IP_MAX]);

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
