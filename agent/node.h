/*
 * node.h (internal to agent/): what a node says about itself and the agent's messages on the
 * control channel (0x0300-0x037f; docs/agent.md): NODE (a node's description: addresses with
 * their interfaces, API and transfer ports, model hash and size, the memory it gives the
 * model), ACK and EXCLUDED, as codecs; this host's side of a description; a description turned
 * into the planner's node.
 *
 * Threads: any; nothing here keeps state. Bad bytes from a peer are an error value, never a crash.
 */
#ifndef SHOAL_AGENT_NODE_H
#define SHOAL_AGENT_NODE_H

#include "agent/core.h"
#include "planner/planner.h"

#include <stddef.h>
#include <stdint.h>

/* Agent messages on the control channel (range 0x0300-0x03ff, docs/agent.md; never reused;
 * 0x0380-0x038f are the model transfer's: agent/modelstore/modelsync.h). */
enum agent_msg {
	AGENT_MSG_NODE = 0x0300, /* JSON: this node's addresses, API port, model hash (on join) */
	AGENT_MSG_PLAN = 0x0301, /* planner -> member: the plan JSON (plan_to_json) */
	AGENT_MSG_ACK = 0x0302,  /* member -> planner: JSON {"hash","state","error","epoch"} */
	AGENT_MSG_EXCLUDED = 0x0303, /* planner -> member: text, why it is left out of the plan */
	AGENT_MSG_STEPS = 0x0304,    /* worker rank -> planner: JSON node_steps_t, about once a
					second while it computes (the dashboard's per-node series) */
};

#define AGENT_MAX_ADDRS 16
#define AGENT_HASH_HEX  65 /* model content hash: 64 hex characters + NUL */

#define AGENT_MAX_LINKS PLAN_MAX_NODES

/* Bounds of a peer's measurements (node_desc_parse rejects figures outside them). */
#define NODE_MAX_MBS  100000000u /* compute: 100 TB/s */
#define NODE_MAX_RTT  60000000u  /* a round trip: 60 s */
#define NODE_MAX_MBPS 10000000u  /* a link: 10 Tbit/s */

/* A node's measured compute (docs/view.md section 1.1). A value type. */
typedef struct node_compute {
	uint32_t bw_mbs;      /* decode rate on the model's weight type, MB/s; 0 = not measured */
	uint32_t prefill_mbs; /* the 64-row rate, MB/s; 0 = bw_mbs */
	int threads;          /* the engine's compute threads; 0 = not said */
	char machine[PLAN_MACHINE_MAX]; /* boot id of the kernel whose cores it uses; "" = own */
} node_compute_t;

/* This node's compute for the model at model_path with `threads` threads (0 = the cores):
 * measured with the engine's kernels (eng_kernel_rate) one node of the machine at a time (a
 * lock in the temporary directory), or read from STATE_DIR/compute.json where an earlier run
 * of the same weight type, threads and CPU left it. machine is this kernel's boot id. Returns 0
 * or SH_E* with a reason (then *c holds what is known: threads and machine). */
int node_compute_get(node_compute_t *c, const char *state_dir, const char *model_path, int threads,
		     char *err, size_t errlen);

/* What a node says about itself in AGENT_MSG_NODE. A value type. */
typedef struct node_desc {
	int have; /* the message arrived */
	int http_port;
	int sync_port;                   /* where its model file may be fetched (0 = none) */
	char model_hash[AGENT_HASH_HEX]; /* "" = no model (yet) */
	uint64_t model_size;
	uint64_t mem_avail; /* memory it can give the model (0 = not said) */
	int naddrs;
	char ip[AGENT_MAX_ADDRS][PLAN_IP_MAX];
	char ifname[AGENT_MAX_ADDRS][PLAN_IFNAME_MAX];
	int kind[AGENT_MAX_ADDRS];   /* plan_link_t, as the node itself sees its interface */
	int prefix[AGENT_MAX_ADDRS]; /* IPv4 netmask length, 0 = unknown (the planner's /24) */
	/* Measurements (docs/view.md section 1.1; 0 / "" / none = not measured). */
	node_compute_t compute;
	int nlinks;
	plan_meas_t links[AGENT_MAX_LINKS]; /* towards its peers, sorted by node_id */
} node_desc_t;

/* This host's addresses into d (IPv4 and global IPv6, no loopback; loopback only when there is
 * nothing else), each with its interface, kind and netmask length. Other fields untouched. */
void node_self_addrs(node_desc_t *d);

/* 1 when the numeric address addr is one of this host's own (loopback included). */
int node_is_local_addr(const char *addr);

/* What the system can give a new process without swapping (Linux MemAvailable; macOS physical
 * memory minus wired, active and compressed pages); 0 when unknown. */
uint64_t node_mem_available(void);

/* NODE's payload for d: malloc'd JSON text (caller frees), NULL when out of memory. */
char *node_desc_json(const node_desc_t *d);
/* Parses a NODE payload into d; fields out of bounds make it malformed. Returns 0 or SH_EFORMAT. */
int node_desc_parse(node_desc_t *d, const uint8_t *p, size_t len);

/* What an ACK says. */
typedef struct node_ack {
	char hash[CORE_HASH_MAX];
	core_ack_t ack;
	char error[CORE_WHY_MAX];
	uint64_t epoch; /* the largest plan epoch the sender ran (0: not said) */
} node_ack_t;

/* ACK's payload: malloc'd JSON text (caller frees), NULL when out of memory. */
char *node_ack_json(const char *hash, core_ack_t ack, const char *error, uint64_t epoch);
/* Parses an ACK payload. Returns 0 or SH_EFORMAT. */
int node_ack_parse(node_ack_t *a, const uint8_t *p, size_t len);

/* An EXCLUDED payload as one printable line in out (controls become spaces). */
void node_excluded_text(char *out, size_t outlen, const uint8_t *p, size_t len);

/* What a STEPS message says: a worker rank's totals since its session began. A value type. */
typedef struct node_steps {
	uint64_t steps;          /* forward passes */
	double step_ms, comm_ms; /* their time, and the part of it communicating */
} node_steps_t;

/* STEPS' payload: malloc'd JSON text (caller frees), NULL when out of memory. */
char *node_steps_json(const node_steps_t *s);
/* 0, or SH_EFORMAT (not JSON, a field missing or negative, comm above step). */
int node_steps_parse(node_steps_t *s, const uint8_t *p, size_t len);

/* Fills the planner's node pn (allocating its address, RDMA and link arrays: plan_view_free
 * frees them) from a node's ID, control host and port, memory (total, and what it gives: 0 =
 * its total), cores, RDMA devices ("dev:ifname,..." as discovery reports them) and description
 * with its measurements (a link naming the node itself is left out; links to nodes the view
 * does not hold are the planner's to ignore). Returns 0 or SH_ENOMEM. */
int node_to_plan(plan_node_t *pn, const char *idhex, const char *host, int port, uint64_t mem,
		 uint64_t avail, int cores, const char *rdma, const node_desc_t *d);

#endif
