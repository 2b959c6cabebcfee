/*
 * members.h (internal to agent/): who is in the cluster. The control port and its handshakes,
 * the channels to the members (one per node ID), heartbeats and liveness, the peers mDNS and
 * --peer name and the dials to them, a copied node ID found on the network, and the election
 * over the members (its messages, its clock, the epoch kept in STATE_DIR/term).
 *
 * What the members mean (plans, sessions, health) is not known here: the agent (agent.c) hears
 * of joins, departures, election moves and its own messages (0x0300-0x03ff) through hooks, and
 * sends through members_send. A member record carries the node's description (NODE), which the
 * agent fills in.
 *
 * Threads: everything belongs to the thread that runs agent_run, except the handshakes, which
 * run on short-lived threads of their own and hand each finished channel back through a pipe
 * the loop polls. Hooks are called on the loop's thread, from members_handle and members_tick.
 * Ownership: members_new returns an object members_free frees (NULL-safe; it waits for running
 * handshakes, at most their timeout). member_t pointers are valid until the next
 * members_handle or members_tick (a departure moves the records).
 */
#ifndef SHOAL_AGENT_MEMBERS_H
#define SHOAL_AGENT_MEMBERS_H

#include "agent/agent.h"
#include "agent/node.h"
#include "discovery/discovery.h"
#include "transport/transport.h"

#include <poll.h>
#include <stdint.h>

#define MEMBERS_MAX DISC_MAX_PEERS

typedef struct member {
	tp_chan_t *ch;
	disc_id_t id;
	int initiator_is_me;
	int64_t last_rx_ms, last_tx_ms, joined_ms;
	char addr[DISC_ADDR_MAX]; /* the peer's address, without port */
	disc_info_t info;         /* from its INFO */
	node_desc_t desc;         /* from its NODE (the agent's: members.c only clears it) */
	node_steps_t steps;       /* from its last STEPS (the agent's, likewise) */
} member_t;

/* What the agent hears. Any may be NULL. */
typedef struct members_hooks {
	void (*joined)(void *ud, member_t *m);      /* a channel to a new member is up */
	void (*reconnected)(void *ud, member_t *m); /* its channel was replaced by a newer one */
	/* a member is gone: its address and why (borrowed for the call) */
	void (*left)(void *ud, const disc_id_t *id, const char *addr, const char *why);
	void (*election)(void *ud); /* an election input: the leader may move */
	/* An agent message (0x0300-0x03ff) from m: 0, or non-zero to drop the member (malformed).
	 */
	int (*message)(void *ud, member_t *m, uint16_t type, const uint8_t *p, size_t len);
	/* A link probe's answer (transport.h's probe messages) from m: 1 when this node's prober
	 * took it; otherwise members.c answers the peer's probes itself (tp_probe_answer). */
	int (*probe)(void *ud, member_t *m, uint16_t type, const uint8_t *p, size_t len);
	void *ud;
} members_hooks_t;

typedef struct members members_t;

/* Opens the control port (cfg->port; 0 = any) and the sighting table; mDNS starts with
 * members_publish, the election with members_elect (both before the loop runs). keys, self and
 * facts are borrowed for the object's life; cfg's strings too. Returns 0 or SH_E* with a
 * reason. */
int members_new(members_t **out, const agent_config_t *cfg, const tp_keys_t *keys,
		const disc_id_t *self, const disc_host_facts_t *facts, const members_hooks_t *hooks,
		char *err, size_t errlen);
void members_free(members_t *m);

/* Starts the election (its clock starts now; its epoch above STATE_DIR/term's). */
int members_elect(members_t *m, char *err, size_t errlen);
/* Publishes this node over mDNS and starts browsing (not with --no-mdns). */
int members_publish(members_t *m, char *err, size_t errlen);

/* The control port actually bound. */
int members_port(const members_t *m);

/* ---- the loop ---- */

/* Adds the descriptors to poll (at most max) and lowers *timeout_ms to 0 when a channel holds
 * frames already read. Returns how many were added. */
int members_pollfds(members_t *m, struct pollfd *pf, int max, int *timeout_ms);
/* After poll: pf and n as members_pollfds filled them. Accepts, finishes handshakes, reads. */
void members_handle(members_t *m, const struct pollfd *pf, int n);
/* Once per loop turn: drops the silent, sends heartbeats, steps the election and sends its
 * messages, logs a new leader and keeps the epoch, dials the peers not yet members. */
void members_tick(members_t *m, int64_t now);

/* ---- reading ---- */

int members_count(const members_t *m);
member_t *members_at(members_t *m, int i);
member_t *members_find(members_t *m, const disc_id_t *id); /* NULL when not a member */
const elec_t *members_election(const members_t *m);
const disc_table_t *members_sightings(const members_t *m);
const char *members_mdns(const members_t *m); /* the mDNS backend's name, or "off" */
/* 1 when another live node uses our ID (where: its address). */
int members_duplicate(const members_t *m, const char **where);

/* Sends one message to a member; a failure drops nothing here (heartbeats notice). Returns 0 or
 * the transport's code. */
int members_send(members_t *m, member_t *to, uint16_t type, const void *p, size_t len);

#endif
