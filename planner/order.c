/*
 * order.c: the rank order. Rank 0 is the node with the smallest ID (the leader); ranks 1..N-1 are
 * ordered so that consecutive ranks, and rank N-1 with rank 0, share the best links the view
 * offers: a Hamiltonian ring through the cables where one exists. MLX's ring connects rank r to
 * rank r+1 (mlx/distributed/ring/ring.cpp, RingGroup) and JACCL's ring uses the devices towards
 * the left and right neighbours (jaccl/lib/jaccl/jaccl.cpp, is_valid_ring), so this order is what
 * makes a partially cabled cluster usable at all (docs/mlx.md).
 *
 * A link of kind k costs B^(4-k) with B = n + 1 > the number of ring edges, so the sum compares
 * two rings by how many "other" links they use first, then Wi-Fi, Ethernet, Thunderbolt links
 * (fewer is better): the worst link of the ring is as good as possible, then the next worst...
 * The search is a depth-first branch and bound that tries the best link first (ties: the lower
 * index, so a uniform network keeps ascending IDs) and stops at a fixed number of steps.
 *
 * Invariant: deterministic. The same sorted nodes give the same order on every machine: no
 * clock, no randomness, a step budget rather than a time limit.
 */
#include "planner/plan_int.h"

#include <stdlib.h>
#include <string.h>

#define ORDER_STEPS 4000 /* search steps before the best ring so far is taken */

typedef struct {
	int n;
	uint64_t w[PLAN_MAX_NODES][PLAN_MAX_NODES];
	uint64_t minw[PLAN_MAX_NODES];            /* cheapest link of each node */
	int cand[PLAN_MAX_NODES][PLAN_MAX_NODES]; /* per node: the others, best link first */
	int path[PLAN_MAX_NODES], best[PLAN_MAX_NODES];
	int used[PLAN_MAX_NODES];
	uint64_t best_cost, floor; /* floor: no ring can cost less */
	long steps;
} order_t;

static void search(order_t *s, int depth, uint64_t cost)
{
	int last = s->path[depth - 1];
	if (depth == s->n) {
		uint64_t total = cost + s->w[last][s->path[0]];
		if (total < s->best_cost) {
			s->best_cost = total;
			memcpy(s->best, s->path, sizeof(int) * (size_t)s->n);
		}
		return;
	}
	if (++s->steps > ORDER_STEPS || s->best_cost == s->floor)
		return;
	/* every node still to place is entered by one link, and the ring closes into rank 0 */
	uint64_t lb = cost + s->minw[0];
	for (int v = 0; v < s->n; v++)
		lb += s->used[v] ? 0 : s->minw[v];
	if (lb >= s->best_cost)
		return;
	for (int k = 0; k < s->n - 1; k++) {
		int v = s->cand[last][k];
		if (s->used[v])
			continue;
		s->used[v] = 1;
		s->path[depth] = v;
		search(s, depth + 1, cost + s->w[last][v]);
		s->used[v] = 0;
	}
}

void plan_ring_order_kinds(int *idx, int n, const uint8_t kind[][PLAN_MAX_NODES])
{
	if (n <= 3)
		return; /* two or three ranks: every order is the same ring */
	order_t s;      /* about 50 KB: the caller's stack, no state kept between calls */
	memset(&s, 0, sizeof s);
	s.n = n;
	uint64_t pw[5];
	pw[4] = 1;
	for (int k = 3; k >= 0; k--)
		pw[k] = pw[k + 1] * (uint64_t)(n + 1);
	for (int i = 0; i < n; i++) {
		s.minw[i] = UINT64_MAX;
		for (int j = 0; j < n; j++) {
			if (i == j)
				continue;
			s.w[i][j] = pw[kind[idx[i]][idx[j]]];
			if (s.w[i][j] < s.minw[i])
				s.minw[i] = s.w[i][j];
		}
	}
	for (int i = 0; i < n; i++) {
		s.floor += s.minw[i];
		int m = 0;
		for (int j = 0; j < n; j++)
			if (j != i)
				s.cand[i][m++] = j;
		for (int a = 1; a < m; a++) /* insertion sort: by weight, then index */
			for (int b = a; b > 0 && s.w[i][s.cand[i][b]] < s.w[i][s.cand[i][b - 1]];
			     b--) {
				int t = s.cand[i][b];
				s.cand[i][b] = s.cand[i][b - 1];
				s.cand[i][b - 1] = t;
			}
	}
	s.best_cost = UINT64_MAX;
	s.used[0] = 1;
	s.path[0] = 0;
	search(&s, 1, 0);
	if (s.best_cost == UINT64_MAX)
		return; /* cannot happen: the first descent always completes a ring */
	int tmp[PLAN_MAX_NODES];
	for (int r = 0; r < n; r++)
		tmp[r] = idx[s.best[r]];
	memcpy(idx, tmp, sizeof tmp[0] * (size_t)n);
}

void plan_ring_order(const plan_node_t **nodes, int n)
{
	if (n <= 3)
		return;
	uint8_t(*kind)[PLAN_MAX_NODES] = calloc(PLAN_MAX_NODES, sizeof *kind);
	int idx[PLAN_MAX_NODES];
	if (!kind)
		return; /* out of memory: the order stays ascending, still a valid ring */
	for (int i = 0; i < n; i++) {
		idx[i] = i;
		for (int j = 0; j < n; j++)
			kind[i][j] = i == j ? 0 : (uint8_t)plan_pair_link(nodes[i], nodes[j]);
	}
	plan_ring_order_kinds(idx, n, (const uint8_t(*)[PLAN_MAX_NODES])kind);
	const plan_node_t *tmp[PLAN_MAX_NODES];
	for (int r = 0; r < n; r++)
		tmp[r] = nodes[idx[r]];
	memcpy(nodes, tmp, sizeof tmp[0] * (size_t)n);
	free(kind);
}
