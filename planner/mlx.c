/*
 * mlx.c: the MLX-facing side of a plan: which backend the cabling allows (MLX's TCP ring, a JACCL
 * mesh or a JACCL ring), and the files MLX reads: the ring hostfile (MLX_HOSTFILE), mlx.launch's
 * hosts file (object and list forms) and the JACCL device matrix (MLX_IBV_DEVICES).
 *
 * The rules are MLX's, as its source states them (checked against ml-explore/mlx, docs/mlx.md
 * names the commit); this file is our own code for them:
 * - ring hostfile (mlx/distributed/ring/ring.cpp load_nodes, RingGroup): a list with one list of
 *   "ip:port" per rank; rank r listens on its row and connects to row (r+1) % N, with as many
 *   connections to the left as to the right. One rank: mlx.launch writes an empty file
 *   (python/mlx/_distributed_utils/launch.py launch_ring).
 * - hosts file (launch.py, common.py Hostfile.from_file): {"backend", "envs", "hosts"} or the bare
 *   hosts list; for the ring every entry of "ips" becomes a connection (config.py configure_ring
 *   lists only the address of the link to the left neighbour); for JACCL hosts[0].ips[0] is the
 *   coordinator (launch_jaccl), so it must be an address every rank reaches.
 * - device matrix (jaccl/lib/jaccl/jaccl.cpp parse_devices_json, is_valid_mesh, is_valid_ring).
 *
 * Invariant: a function of the plan alone (the same bytes on every node); a plan parsed from
 * plan.json writes the same files as the plan that was made.
 */
#include "planner/plan_int.h"

#include "common/common.h"

#include <stdlib.h>
#include <string.h>

/* Number of devices on rank i towards rank j: the matrix holds at most one per pair. */
static int devs(const plan_t *p, int i, int j)
{
	return p->ranks[i].rdma[j][0] != 0;
}

int plan_rdma_is_mesh(const plan_t *p)
{
	int n = p->n_ranks;
	if (n < 2)
		return 0;
	for (int i = 0; i < n; i++)
		for (int j = 0; j < n; j++)
			if ((i == j) != (devs(p, i, j) == 0))
				return 0;
	return 1;
}

int plan_rdma_is_ring(const plan_t *p)
{
	int n = p->n_ranks;
	if (n < 2 || devs(p, 0, 1) == 0)
		return 0;
	int want = devs(p, 0, 1);
	for (int i = 0; i < n; i++)
		if (devs(p, i, (i + n - 1) % n) != want || devs(p, i, (i + 1) % n) != want)
			return 0;
	return 1;
}

void plan_mlx_decide(plan_t *p, char lan[][PLAN_IP_MAX])
{
	int n = p->n_ranks;
	p->coordinator[0] = 0;
	snprintf(p->jaccl, sizeof p->jaccl, "none");
	snprintf(p->mlx_backend, sizeof p->mlx_backend, "ring");
	if (n == 1) {
		snprintf(p->mlx_why, sizeof p->mlx_why,
			 "a single rank: no group to form (the hostfile is empty, as mlx.launch "
			 "writes it for one host)");
	} else if (plan_rdma_is_mesh(p)) {
		snprintf(p->jaccl, sizeof p->jaccl, "jaccl");
		snprintf(p->mlx_why, sizeof p->mlx_why,
			 "every rank has an RDMA device towards every other: a JACCL mesh");
	} else if (plan_rdma_is_ring(p)) {
		snprintf(p->jaccl, sizeof p->jaccl, "jaccl-ring");
		snprintf(p->mlx_why, sizeof p->mlx_why,
			 "RDMA joins every rank to its ring neighbours but not every pair: a JACCL "
			 "ring");
	} else {
		int any = 0, gap = -1;
		for (int i = 0; i < n; i++)
			for (int j = 0; j < n; j++)
				any |= devs(p, i, j);
		for (int i = 0; i < n && gap < 0; i++)
			if (!devs(p, i, (i + 1) % n) || !devs(p, (i + 1) % n, i))
				gap = i;
		if (!any)
			snprintf(p->mlx_why, sizeof p->mlx_why,
				 "no RDMA device links any two ranks: MLX's TCP ring");
		else
			snprintf(
			    p->mlx_why, sizeof p->mlx_why,
			    "ranks %d and %d have no RDMA link and no ring order avoids such a "
			    "pair: MLX's TCP ring",
			    gap, (gap + 1) % n);
	}
	if (strcmp(p->jaccl, "none"))
		snprintf(p->mlx_backend, sizeof p->mlx_backend, "%s", p->jaccl);
	int jaccl = strcmp(p->mlx_backend, "ring") != 0;
	for (int r = 0; r < n; r++) {
		plan_rank_t *k = &p->ranks[r];
		/* ring: the address of the link to the left neighbour only; JACCL: the LAN one */
		const char *ip = jaccl && lan[r][0] ? lan[r] : k->ip;
		snprintf(k->ips[0], sizeof k->ips[0], "%s", ip);
		k->n_ips = 1;
	}
	if (jaccl)
		snprintf(p->coordinator, sizeof p->coordinator, "%s:%d", p->ranks[0].ips[0],
			 p->base_port);
}

const char *plan_mlx_backend(const plan_t *p)
{
	return p->mlx_backend;
}
const char *plan_jaccl(const plan_t *p)
{
	return p->jaccl;
}
const char *plan_mlx_reason(const plan_t *p)
{
	return p->mlx_why;
}
const char *plan_coordinator(const plan_t *p)
{
	return p->coordinator;
}
const char *plan_mlx_env(const plan_t *p)
{
	/* config.py's hostfile example for JACCL carries it: Metal's fast synchronisation */
	return strcmp(p->mlx_backend, "ring") ? "MLX_METAL_FAST_SYNCH=1" : "";
}

/* ---- the files ---- */

char *plan_hostfile_json(const plan_t *p)
{
	if (p->n_ranks == 1)
		return strdup(""); /* one row would make rank 0 dial itself before it listens */
	json_t *a = json_array();
	char *out = NULL;
	for (int r = 0; a && r < p->n_ranks; r++) {
		char addr[PLAN_IP_MAX + 8];
		snprintf(addr, sizeof addr, "%s:%d", p->ranks[r].ip, p->ranks[r].port);
		json_t *row = json_pack("[s]", addr);
		if (!row || json_array_append_new(a, row))
			goto done;
	}
	out = a ? plan_dump(a) : NULL;
done:
	json_decref(a);
	return out;
}

static json_t *rdma_row(const plan_t *p, int r)
{
	json_t *row = json_array();
	for (int j = 0; row && j < p->n_ranks; j++) {
		const char *d = p->ranks[r].rdma[j];
		json_array_append_new(row, d[0] && j != r ? json_string(d) : json_null());
	}
	return row;
}

static json_t *hosts_list(const plan_t *p)
{
	json_t *a = json_array();
	for (int r = 0; a && r < p->n_ranks; r++) {
		const plan_rank_t *k = &p->ranks[r];
		json_t *ips = json_array();
		for (int i = 0; ips && i < k->n_ips; i++)
			json_array_append_new(ips, json_string(k->ips[i]));
		/* A single node runs locally: mlx.launch treats only "127.0.0.1" as local. */
		const char *ssh = p->n_ranks == 1 || !k->host[0] ? k->ip : k->host;
		json_t *h =
		    json_pack("{s:s, s:o, s:o}", "ssh", ssh, "ips", ips, "rdma", rdma_row(p, r));
		if (!h || json_array_append_new(a, h)) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

char *plan_mlx_hosts_json(const plan_t *p)
{
	json_t *hosts = hosts_list(p), *envs = json_array();
	const char *e = plan_mlx_env(p);
	if (envs && e[0])
		json_array_append_new(envs, json_string(e));
	json_t *o = hosts && envs ? json_pack("{s:s, s:O, s:O}", "backend", p->mlx_backend, "envs",
					      envs, "hosts", hosts)
				  : NULL;
	char *out = o ? plan_dump(o) : NULL;
	json_decref(o), json_decref(hosts), json_decref(envs);
	return out;
}

char *plan_mlx_list_json(const plan_t *p)
{
	json_t *hosts = hosts_list(p);
	char *out = hosts ? plan_dump(hosts) : NULL;
	json_decref(hosts);
	return out;
}

char *plan_rdma_json(const plan_t *p)
{
	/* One row per line so the file reads as a matrix: "[[...],\n [...]]\n". */
	char *rows[PLAN_MAX_NODES] = {0};
	char *out = NULL;
	size_t cap = 4;
	int n = 0;
	for (; n < p->n_ranks; n++) {
		json_t *row = rdma_row(p, n);
		rows[n] = row ? json_dumps(row, JSON_COMPACT) : NULL;
		json_decref(row);
		if (!rows[n])
			goto done;
		cap += strlen(rows[n]) + 3;
	}
	out = malloc(cap);
	if (!out)
		goto done;
	size_t len = 0;
	out[len++] = '[';
	for (int r = 0; r < n; r++) {
		if (r) {
			memcpy(out + len, ",\n ", 3);
			len += 3;
		}
		size_t k = strlen(rows[r]);
		memcpy(out + len, rows[r], k);
		len += k;
	}
	memcpy(out + len, "]\n", 3); /* with the NUL */
done:
	for (int r = 0; r < n; r++)
		free(rows[r]);
	return out;
}
