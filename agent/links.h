/*
 * links.h (internal to agent/): this node's measured links towards its members (issue 26,
 * docs/view.md section 1.1). Of each pair of members the node with the smaller ID measures the
 * link, over the authenticated member channel, from the agent's loop (transport.h's
 * tp_probe_new/step/take: never blocking): the median and p90 round trip of small probes and
 * a short throughput burst, when a member joins (after a pause that staggers the nodes, so
 * their probes do not disturb each other), twice more a few seconds later, and then every
 * LINKS_PERIOD_MS; those later ones wait while the machine's CPUs are busy (serving: a burst
 * would slow the tokens it meets), for at most a few minutes. The figures this node publishes
 * in its NODE description (links_published) change only when a link is first measured, when a
 * round trip is LINKS_FACTOR times shorter than the published one (that one met a busy node),
 * or when LINKS_SUSTAIN measurements in a row differ from the published one by LINKS_FACTOR or
 * more (round trip or throughput): a change the planner should act on, not noise.
 *
 * Threads: the loop's thread only. Ownership: links_new's object, freed by links_free
 * (NULL-safe); member_t pointers are borrowed for each call.
 */
#ifndef SHOAL_AGENT_LINKS_H
#define SHOAL_AGENT_LINKS_H

#include "agent/members.h"
#include "planner/planner.h"

#include <stdint.h>

#define LINKS_PERIOD_MS 60000 /* background re-measurement of each link */
#define LINKS_FACTOR    2     /* a published figure moves when a new one is this far off ... */
#define LINKS_SUSTAIN   2     /* ... this many measurements in a row */

typedef struct links links_t;

/* self: this node's ID (borrowed for the object's life). NULL when out of memory. */
links_t *links_new(const disc_id_t *self);
void links_free(links_t *l);

/* Member m is up (joined, or its channel replaced): measure it soon when this node is the
 * smaller of the pair. */
void links_member_up(links_t *l, const member_t *m, int64_t now_ms);
/* Member id is gone: its probe stops, its figures are forgotten. */
void links_member_down(links_t *l, const disc_id_t *id);

/* Once per loop turn: steps the running probe, starts the next one due. *timeout_ms is lowered
 * to when the probe wants to run again. Returns 1 when the published figures changed (the
 * agent sends its NODE again), else 0. */
int links_tick(links_t *l, members_t *ms, int64_t now_ms, int *timeout_ms);

/* A probe message from m (members.h's probe hook): 1 when the running probe took it. */
int links_take(links_t *l, const member_t *m, uint16_t type, const void *p, size_t len);

/* The published figures (sorted by peer ID): at most max into out; returns how many. */
int links_published(const links_t *l, plan_meas_t *out, int max);

#endif
