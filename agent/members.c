/*
 * members.c: the control port, the members' channels, the peers to dial, and the election over
 * the members (members.h).
 *
 * Handshakes block (HELLO + challenge-response, bounded by HANDSHAKE_MS), so each runs on
 * its own short-lived thread, which writes a pointer to its result into a pipe; the loop never
 * blocks on a peer for longer than one already-buffered frame.
 *
 * Connection rule: for peers found by mDNS, the node with the smaller ID connects; the larger one
 * connects too only when the smaller has not done so within FALLBACK_MS of being seen (one-sided
 * mDNS). Static peers (--peer) are dialled by whoever names them. When two channels to one peer end
 * up authenticated, both sides keep the one initiated by the smaller ID and close the other.
 *
 * Invariant: a peer is an election member exactly while one live channel to it exists (m[]
 * holds at most one channel per node ID).
 */
#include "agent/members.h"
#include "agent/handshake.h"
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FALLBACK_MS     3000
#define RETRY_MS        1000
#define STATIC_RETRY_MS 2000
#define MAX_DIALS       32
#define MAX_HANDSHAKES  64 /* handshake threads at once, both directions */
/* The transport's link probe messages, 0x0016-0x0019 (transport/frame.h, docs/protocol.md):
 * PROBE, PROBE_ECHO, PROBE_BURST, PROBE_ACK. */
#define MEMBERS_MSG_PROBE 0x0016

struct members {
	const agent_config_t *cfg;
	const tp_keys_t *keys;
	const disc_host_facts_t *facts;
	members_hooks_t hooks;
	disc_id_t self;
	char self_hex[DISC_ID_HEX];
	uint64_t nonce; /* tells our own mDNS record from a duplicate's */
	int port;       /* the control port bound */
	int listen_fd;
	handshakes_t *hs;
	elec_t *elec;
	disc_mdns_t *mdns;
	disc_table_t *table;
	member_t m[MEMBERS_MAX];
	int n;
	/* dials in flight, so one target is dialled once at a time */
	disc_id_t dialing[MAX_DIALS];
	int ndialing;
	int static_dialing[AGENT_MAX_STATIC_PEERS];
	int64_t static_last_ms[AGENT_MAX_STATIC_PEERS];
	disc_id_t static_id[AGENT_MAX_STATIC_PEERS]; /* learnt at the first handshake */
	int static_self[AGENT_MAX_STATIC_PEERS];     /* the --peer is this node itself */
	int static_err_logged[AGENT_MAX_STATIC_PEERS];
	int64_t mdns_last_try_ms[DISC_MAX_PEERS]; /* indexed like the table (a rate limit only) */
	unsigned mdns_tries[DISC_MAX_PEERS];
	int64_t last_hb_ms;
	int duplicate; /* another live node uses our ID */
	char duplicate_where[128];
	int stood_down; /* found the duplicate before joining anyone: the other node keeps the ID */
	char foreign_seen[8][DISC_NAME_MAX]; /* other clusters' services, logged once each */
	int nforeign;
	disc_id_t last_leader;
	uint64_t term_saved; /* the election epoch last written to STATE_DIR/term */
};

static void election_moved(members_t *a)
{
	if (a->hooks.election)
		a->hooks.election(a->hooks.ud);
}

/* "a.b.c.d:port" or "[v6]:port" without the port. */
static void addr_only(const char *addrport, char *out, size_t len)
{
	snprintf(out, len, "%s", addrport);
	char *colon = strrchr(out, ':');
	if (colon && strchr(out, '.'))
		*colon = 0;       /* IPv4 a.b.c.d:port */
	else if (out[0] == '[') { /* [v6]:port */
		char *rb = strchr(out, ']');
		if (rb) {
			*rb = 0;
			memmove(out, out + 1, strlen(out));
		}
	}
}

member_t *members_find(members_t *a, const disc_id_t *id)
{
	for (int i = 0; i < a->n; i++)
		if (!disc_id_cmp(&a->m[i].id, id))
			return &a->m[i];
	return NULL;
}

static int is_dialing(const members_t *a, const disc_id_t *id)
{
	for (int i = 0; i < a->ndialing; i++)
		if (!disc_id_cmp(&a->dialing[i], id))
			return 1;
	return 0;
}

static void dialing_remove(members_t *a, const disc_id_t *id)
{
	for (int i = 0; i < a->ndialing; i++)
		if (!disc_id_cmp(&a->dialing[i], id)) {
			a->dialing[i] = a->dialing[--a->ndialing];
			return;
		}
}

static void dial_out(members_t *a, const char *host, int port, const disc_id_t *target, int sidx)
{
	if (target && (is_dialing(a, target) || a->ndialing == MAX_DIALS))
		return;
	handshake_t *d = calloc(1, sizeof *d);
	if (!d)
		return;
	d->outgoing = 1;
	snprintf(d->host, sizeof d->host, "%s", host);
	d->port = port;
	d->static_index = sidx;
	if (target) {
		d->target = *target;
		a->dialing[a->ndialing++] = *target;
	}
	if (sidx >= 0)
		a->static_dialing[sidx] = 1;
	LOG(LOG_DEBUG, "agent: connecting to %s port %d", host, port);
	if (handshakes_start(a->hs, d) != 0) {
		if (target)
			dialing_remove(a, target);
		if (sidx >= 0)
			a->static_dialing[sidx] = 0;
	}
}

static void send_info(members_t *a, member_t *c)
{
	char buf[1024];
	disc_info_t in = {.version = DISC_PROTO_VERSION,
			  .id = a->self,
			  .port = a->port,
			  .mem_bytes = a->facts->mem_bytes,
			  .cores = a->facts->cores};
	snprintf(in.host, sizeof in.host, "%s", a->facts->hostname);
	snprintf(in.rdma, sizeof in.rdma, "%s", a->facts->rdma);
	int n = disc_info_encode(&in, buf, sizeof buf);
	if (n > 0 && tp_chan_send(c->ch, DISC_MSG_INFO, buf, (size_t)n))
		LOG(LOG_DEBUG, "agent: sending INFO failed");
	c->last_tx_ms = now_ms();
}

static void log_members(members_t *a, const char *what, const disc_id_t *id, const char *addr)
{
	char h[DISC_ID_HEX];
	disc_id_hex(id, h);
	LOG(LOG_INFO, "members: %d -> %d (%s %.8s at %s)",
	    elec_member_count(a->elec) + (*what == '+' ? -1 : 1), elec_member_count(a->elec), what,
	    h, addr);
}

/* Drops conns[i]; the peer leaves the view. */
static void conn_drop(members_t *a, int i, const char *why)
{
	member_t c = a->m[i];
	a->m[i] = a->m[--a->n];
	tp_chan_free(c.ch);
	char h[DISC_ID_HEX];
	disc_id_hex(&c.id, h);
	LOG(LOG_INFO, "agent: member %s (%s) lost: %s", h, c.addr, why);
	elec_member_down(a->elec, &c.id, now_ms());
	log_members(a, "-", &c.id, c.addr);
	if (a->hooks.left)
		a->hooks.left(a->hooks.ud, &c.id, c.addr, why);
	election_moved(a);
}

/* Records a live node using our ID. When we have no member yet (the newcomer: typically the copy
 * of a state directory), we stand down: no dialing, no accepting, so peers never take us for the
 * node that already holds the ID (they fold both under one ID). */
static void duplicate_found(members_t *a, const char *where)
{
	a->duplicate = 1;
	snprintf(a->duplicate_where, sizeof a->duplicate_where, "%s", where);
	if (a->n == 0 && !a->stood_down) {
		a->stood_down = 1;
		LOG(LOG_ERROR, "agent: not joining the cluster: %s already holds our node ID",
		    where);
	}
}

/* Waits up to ms for the peer to close FD after our last message, reading and dropping what it
 * sends meanwhile: closing with unread data would reset the connection, and a reset can discard
 * our last message before the peer reads it. Only on a refused channel, which ends at once. */
static void linger_closed(int fd, int ms)
{
	shutdown(fd, SHUT_WR);
	int64_t deadline = now_ms() + ms;
	char buf[4096];
	for (int64_t left = ms; left > 0; left = deadline - now_ms()) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, (int)left) <= 0)
			return;
		ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
		if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
			return;
	}
}

/* Is the channel's peer still there: heard from within two heartbeats, and no end-of-stream
 * waiting unread (a restarted peer's old channel may be closed in a read not yet done)? */
static int channel_alive(const member_t *c, int64_t now)
{
	if (now - c->last_rx_ms > 2 * AGENT_HEARTBEAT_MS)
		return 0;
	char b;
	ssize_t r = recv(tp_chan_fd(c->ch), &b, 1, MSG_PEEK | MSG_DONTWAIT);
	return r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

/* A second channel to a member: which one stays. A dead old one goes (the peer restarted). While
 * it is alive, a repeat from the same side is a double dial or a second process with the member's
 * ID (a copied state directory): replacing the live channel would drop the node that holds the
 * ID, so the old one stays. Two channels from opposite sides (both dialled at once) keep the one
 * the smaller ID initiated, as both ends decide alike. */
static int keep_new_channel(const members_t *a, const member_t *old, const disc_id_t *pid,
			    int me_init)
{
	if (!channel_alive(old, now_ms()))
		return 1;
	if (old->initiator_is_me == me_init)
		return 0;
	int smaller_is_me = disc_id_cmp(&a->self, pid) < 0;
	return me_init == smaller_is_me;
}

static void on_dial_result(members_t *a, handshake_t *d)
{
	if (d->outgoing && !disc_id_is_zero(&d->target))
		dialing_remove(a, &d->target);
	if (d->static_index >= 0)
		a->static_dialing[d->static_index] = 0;
	if (d->rc) {
		/* the transport logged "handshake with ADDR failed: REASON" once at warn; an
		 * unreachable --peer is worth one line too, then quiet until it succeeds */
		if (d->static_index >= 0 && !a->static_err_logged[d->static_index]) {
			a->static_err_logged[d->static_index] = 1;
			LOG(LOG_WARN, "agent: --peer %s: %s (retrying every %d s)",
			    a->cfg->peers[d->static_index], d->err, STATIC_RETRY_MS / 1000);
		}
		LOG(LOG_DEBUG, "agent: %s %s:%d: %s", d->outgoing ? "connect" : "accept", d->host,
		    d->port, d->err);
		free(d);
		return;
	}
	disc_id_t pid;
	memcpy(pid.b, tp_chan_peer_id(d->ch), DISC_ID_LEN);
	char ph[DISC_ID_HEX], addr[DISC_ADDR_MAX];
	disc_id_hex(&pid, ph);
	addr_only(tp_chan_peer_addr(d->ch), addr, sizeof addr);
	if (d->static_index >= 0) {
		a->static_id[d->static_index] = pid;
		a->static_err_logged[d->static_index] = 0;
	}
	if (!disc_id_cmp(&pid, &a->self) && node_is_local_addr(addr)) {
		/* a --peer that names this very node (or its other end): not a duplicate */
		if (d->static_index >= 0 && !a->static_self[d->static_index]) {
			a->static_self[d->static_index] = 1;
			LOG(LOG_INFO, "agent: --peer %s is this node; skipping it",
			    a->cfg->peers[d->static_index]);
		}
		tp_chan_free(d->ch);
		free(d);
		return;
	}
	if (!disc_id_cmp(&pid, &a->self)) {
		LOG(LOG_ERROR,
		    "duplicate node ID %s: the node at %s uses it too (a copied state directory?); "
		    "stop one and remove its %s/node_id",
		    ph, addr, a->cfg->state_dir);
		duplicate_found(a, addr);
		tp_chan_free(d->ch);
		free(d);
		return;
	}
	if (a->stood_down) {
		tp_chan_free(d->ch);
		free(d);
		return;
	}
	int me_init = d->outgoing;
	member_t *old = members_find(a, &pid);
	if (old) {
		int keep_new = keep_new_channel(a, old, &pid, me_init);
		LOG(LOG_DEBUG, "agent: second channel to %s: keeping the %s one", ph,
		    keep_new ? "new" : "old");
		if (!keep_new) {
			if (!me_init) {
				/* the member's address on the live channel: the dialler ignores it
				 * when that is its own address (a double dial, or both sides dialled
				 * at once); a second process with the ID learns of the first */
				LOG(LOG_DEBUG, "agent: %s connected from %s while its channel from %s "
				    "is alive: keeping that one", ph, addr, old->addr);
				if (tp_chan_send(d->ch, DISC_MSG_DUPLICATE, old->addr,
						 strlen(old->addr)) == 0)
					linger_closed(tp_chan_fd(d->ch), 500);
			}
			tp_chan_free(d->ch);
			free(d);
			return;
		}
		tp_chan_free(old->ch);
		old->ch = d->ch;
		old->initiator_is_me = me_init;
		old->last_rx_ms = now_ms();
		snprintf(old->addr, sizeof old->addr, "%s", addr);
		send_info(a, old);
		if (a->hooks.reconnected)
			a->hooks.reconnected(a->hooks.ud, old);
		free(d);
		return;
	}
	if (a->n == MEMBERS_MAX) {
		LOG(LOG_WARN, "agent: too many members, refusing %s", ph);
		tp_chan_free(d->ch);
		free(d);
		return;
	}
	member_t *c = &a->m[a->n++];
	memset(c, 0, sizeof *c);
	c->ch = d->ch;
	c->id = pid;
	c->initiator_is_me = me_init;
	c->last_rx_ms = c->joined_ms = now_ms();
	snprintf(c->addr, sizeof c->addr, "%s", addr);
	free(d);
	tp_chan_set_send_timeout(c->ch, 1000);
	LOG(LOG_INFO, "agent: member %s joined from %s (%s)", ph, c->addr,
	    me_init ? "we connected" : "it connected");
	send_info(a, c);
	elec_member_up(a->elec, &pid, now_ms());
	log_members(a, "+", &pid, c->addr);
	if (a->hooks.joined)
		a->hooks.joined(a->hooks.ud, c);
	election_moved(a);
}

static void send_elec_msgs(members_t *a)
{
	elec_msg_t m;
	static uint8_t buf[sizeof(disc_wire_leader_head_t) + DISC_ID_LEN * ELEC_MAX_MEMBERS];
	while (elec_next_msg(a->elec, &m)) {
		int len = 0;
		if (m.type == DISC_MSG_LEADER)
			len = disc_leader_encode(&m, buf, sizeof buf);
		else {
			memcpy(buf, m.subject.b, DISC_ID_LEN);
			len = DISC_ID_LEN;
		}
		if (len < 0)
			continue;
		for (int i = 0; i < a->n; i++) {
			member_t *c = &a->m[i];
			if (!m.broadcast && disc_id_cmp(&m.to, &c->id))
				continue;
			if (tp_chan_send(c->ch, (uint16_t)m.type, buf, (size_t)len) == 0)
				c->last_tx_ms = now_ms();
		}
	}
}

static int handle_msg(members_t *a, member_t *c, uint16_t type, const uint8_t *p, size_t len)
{
	int64_t now = now_ms();
	switch (type) {
	case DISC_MSG_INFO:
		if (len > 1024)
			return SH_EFORMAT;
		disc_info_parse(&c->info, p, len);
		return 0;
	case DISC_MSG_HEARTBEAT: {
		uint64_t epoch;
		disc_id_t leader;
		int st, nm;
		if (disc_heartbeat_decode(p, len, &epoch, &leader, &st, &nm))
			return SH_EFORMAT;
		elec_on_heartbeat(a->elec, &c->id, epoch, &leader, st == ELEC_LEADER, now);
		election_moved(a);
		return 0;
	}
	case DISC_MSG_LEADER: {
		static disc_id_t members[ELEC_MAX_MEMBERS];
		uint64_t epoch;
		disc_id_t leader;
		int n;
		if (disc_leader_decode(p, len, &epoch, &leader, members, &n) ||
		    disc_id_cmp(&leader, &c->id))
			return SH_EFORMAT; /* a node announces only itself */
		elec_on_leader(a->elec, &c->id, epoch, members, n, now);
		election_moved(a);
		return 0;
	}
	case DISC_MSG_SMALLER: {
		disc_id_t s;
		if (len != DISC_ID_LEN)
			return SH_EFORMAT;
		memcpy(s.b, p, DISC_ID_LEN);
		elec_on_smaller(a->elec, &c->id, &s, now);
		election_moved(a);
		return 0;
	}
	case MEMBERS_MSG_PROBE:
	case MEMBERS_MSG_PROBE + 1:
	case MEMBERS_MSG_PROBE + 2:
	case MEMBERS_MSG_PROBE + 3: { /* link probes: ours to take, or the peer's to answer */
		if (a->hooks.probe && a->hooks.probe(a->hooks.ud, c, type, p, len))
			return 0;
		int rc = tp_probe_answer(c->ch, type, p, len);
		return rc == SH_EFORMAT ? rc : 0; /* a failed send: the heartbeats notice */
	}
	default:
		if (type >= 0x0300 && type <= 0x03ff)
			return a->hooks.message ? a->hooks.message(a->hooks.ud, c, type, p, len)
						: 0;
		LOG(LOG_DEBUG, "agent: ignoring message type 0x%04x", type);
		return 0;
	}
}

/* A member tells us it has a live channel from another node with our ID, at WHERE (p, len). Not
 * a duplicate when WHERE is one of our own addresses (our own second channel, refused). Otherwise
 * the channel ends, and alone we stand down. Returns 1 when the conn was dropped. */
static int duplicate_notice(members_t *a, int i, const uint8_t *p, size_t len)
{
	char where[DISC_ADDR_MAX], ph[DISC_ID_HEX];
	if (len == 0 || len >= sizeof where || memchr(p, 0, len)) {
		conn_drop(a, i, "malformed message type 0x0104");
		return 1;
	}
	memcpy(where, p, len);
	where[len] = 0;
	if (node_is_local_addr(where))
		return 0;
	disc_id_hex(&a->m[i].id, ph);
	LOG(LOG_ERROR,
	    "duplicate node ID %s: member %.8s has a live channel from the node at %s, which uses "
	    "it too (a copied state directory?); stop one and remove its %s/node_id",
	    a->self_hex, ph, where, a->cfg->state_dir);
	conn_drop(a, i, "it knows another node with our ID");
	duplicate_found(a, where);
	return 1;
}

/* Reads every buffered frame of conns[i]. Returns 1 when the conn was dropped. */
static int conn_read(members_t *a, int i)
{
	member_t *c = &a->m[i];
	for (;;) {
		uint16_t type;
		void *p;
		size_t len;
		int rc = tp_chan_recv(c->ch, &type, &p, &len, 0);
		if (rc == SH_ETIMEDOUT)
			return 0;
		if (rc) {
			conn_drop(a, i, sh_strerror(rc));
			return 1;
		}
		c->last_rx_ms = now_ms();
		if (type == DISC_MSG_DUPLICATE) {
			if (duplicate_notice(a, i, p, len))
				return 1;
			continue;
		}
		rc = handle_msg(a, c, type, p, len);
		if (rc) {
			char why[64];
			snprintf(why, sizeof why, "malformed message type 0x%04x", type);
			conn_drop(a, i, why);
			return 1;
		}
	}
}

static void on_mdns(members_t *a, const disc_event_t *ev)
{
	const disc_sighting_t *s = &ev->s;
	switch (ev->kind) {
	case DISC_EV_PUBLISHED: break;
	case DISC_EV_RESTARTED: disc_table_clear(a->table); break;
	case DISC_EV_DOWN:
		if (disc_table_remove(a->table, s))
			LOG(LOG_DEBUG, "mdns: '%s' gone", s->name);
		break;
	case DISC_EV_UP:
		if (strcmp(s->cid, a->keys->cid_hex)) {
			for (int i = 0; i < a->nforeign; i++)
				if (!strcmp(a->foreign_seen[i], s->name))
					return;
			if (a->nforeign < (int)ARRAY_LEN(a->foreign_seen))
				snprintf(a->foreign_seen[a->nforeign++], DISC_NAME_MAX, "%s",
					 s->name);
			LOG(LOG_INFO, "mdns: ignoring '%s' at %s: another cluster (cid %s)",
			    s->name, s->addr, s->cid);
			return;
		}
		int self = DISC_SELF_NOT;
		if (!disc_id_cmp(&s->id, &a->self)) {
			disc_publish_t me = {
			    .id = a->self, .port = (uint16_t)a->port, .nonce = a->nonce};
			self = disc_sighting_self(&me, s, node_is_local_addr(s->addr));
		}
		if (self == DISC_SELF_OURS)
			return; /* re-registered by the daemon, or our crashed predecessor's record
				 */
		if (self == DISC_SELF_DUPLICATE) {
			if (!a->duplicate)
				LOG(LOG_ERROR,
				    "duplicate node ID %s: '%s' at %s advertises it too (a copied "
				    "state "
				    "directory?); stop one and remove its node_id file",
				    a->self_hex, s->name, s->addr);
			duplicate_found(a, s->addr);
			return;
		}
		if (s->version != DISC_PROTO_VERSION) {
			LOG(LOG_WARN, "mdns: '%s' speaks protocol %d, we speak %d: ignored",
			    s->name, s->version, DISC_PROTO_VERSION);
			return;
		}
		if (!disc_table_find(a->table, &s->id))
			LOG(LOG_INFO, "mdns: found %s at %s:%u on %s", s->name, s->addr, s->port,
			    s->ifname);
		disc_table_add(a->table, s, now_ms());
		break;
	}
}

/* Dials mDNS peers that have no channel yet, by the connection rule; and static peers. */
static void dial_missing(members_t *a, int64_t now)
{
	disc_id_t hint;
	int have_hint = elec_hint(a->elec, &hint);
	for (int i = 0; i < disc_table_count(a->table) && !a->stood_down; i++) {
		const disc_peer_t *p = disc_table_at(a->table, i);
		if (members_find(a, &p->id) || is_dialing(a, &p->id) || !p->naddrs)
			continue;
		int me_smaller = disc_id_cmp(&a->self, &p->id) < 0;
		int hinted = have_hint && !disc_id_cmp(&hint, &p->id);
		if (!me_smaller && !hinted && now - p->first_seen_ms < FALLBACK_MS)
			continue;
		if (i < DISC_MAX_PEERS && now - a->mdns_last_try_ms[i] < RETRY_MS)
			continue;
		a->mdns_last_try_ms[i] = now;
		/* IPv4 addresses first, then the others; each retry takes the next one */
		int order[DISC_MAX_ADDRS], no = 0;
		for (int pass = 0; pass < 2; pass++)
			for (int k = 0; k < p->naddrs; k++)
				if (p->addrs[k].ipv6 == pass)
					order[no++] = k;
		const disc_peer_addr_t *pa = &p->addrs[order[a->mdns_tries[i]++ % no]];
		dial_out(a, pa->addr, pa->port, &p->id, -1);
	}
	for (int i = 0; i < a->cfg->npeers && !a->stood_down; i++) {
		if (a->static_dialing[i] || a->static_self[i] ||
		    now - a->static_last_ms[i] < STATIC_RETRY_MS)
			continue;
		if (!disc_id_is_zero(&a->static_id[i]) &&
		    (members_find(a, &a->static_id[i]) || !disc_id_cmp(&a->static_id[i], &a->self)))
			continue;
		a->static_last_ms[i] = now;
		char host[DISC_HOST_MAX];
		int port;
		if (tp_hostport_parse(a->cfg->peers[i], host, sizeof host, &port, NULL, 0))
			continue; /* checked by cmd_agent */
		dial_out(a, host, port, NULL, i);
	}
}

/* Is every node discovery knows of (mDNS sightings, static peers) a member? Then the view need
 * not wait the whole settle time (election.c's quick_ms). */
static int view_complete(members_t *a)
{
	int known = 0;
	for (int i = 0; i < disc_table_count(a->table); i++) {
		const disc_peer_t *p = disc_table_at(a->table, i);
		if (!members_find(a, &p->id))
			return 0;
		known++;
	}
	for (int i = 0; i < a->cfg->npeers; i++) {
		if (a->static_self[i])
			continue;
		if (disc_id_is_zero(&a->static_id[i]) || !members_find(a, &a->static_id[i]))
			return 0;
		known++;
	}
	return known > 0;
}

static void heartbeat_and_reap(members_t *a, int64_t now)
{
	for (int i = a->n - 1; i >= 0; i--)
		if (now - a->m[i].last_rx_ms > AGENT_DEAD_MS) {
			char why[64];
			snprintf(why, sizeof why, "no heartbeat for %lld ms",
				 (long long)(now - a->m[i].last_rx_ms));
			conn_drop(a, i, why);
		}
	if (now - a->last_hb_ms < AGENT_HEARTBEAT_MS)
		return;
	a->last_hb_ms = now;
	disc_id_t l;
	elec_leader(a->elec, &l);
	disc_wire_heartbeat_t w;
	/* a leader says its own epoch (followers follow it); others the largest they have seen,
	 * so a leader that was away learns it has to announce above that */
	uint64_t ep =
	    elec_state(a->elec) == ELEC_LEADER ? elec_epoch(a->elec) : elec_max_epoch(a->elec);
	disc_heartbeat_encode(&w, ep, &l, elec_state(a->elec), elec_member_count(a->elec));
	for (int i = a->n - 1; i >= 0; i--) {
		int rc = tp_chan_send(a->m[i].ch, DISC_MSG_HEARTBEAT, &w, sizeof w);
		if (rc)
			conn_drop(a, i, sh_strerror(rc));
		else
			a->m[i].last_tx_ms = now;
	}
}

/* The largest election epoch seen before (STATE_DIR/term), 0 when none. */
static uint64_t term_load(const char *state_dir)
{
	char path[SH_SUBPATH_MAX], *text = NULL, err[128];
	size_t len;
	snprintf(path, sizeof path, "%s/term", state_dir);
	if (read_file_all(path, &text, &len, err, sizeof err))
		return 0;
	char *end = NULL;
	unsigned long long v = strtoull(text, &end, 10);
	uint64_t t = end != text && (*end == '\n' || !*end) ? (uint64_t)v : 0;
	free(text);
	return t;
}

static void term_save(members_t *a)
{
	uint64_t t = elec_max_epoch(a->elec);
	if (t <= a->term_saved)
		return;
	char path[SH_SUBPATH_MAX], text[32], err[256];
	snprintf(path, sizeof path, "%s/term", a->cfg->state_dir);
	int n = snprintf(text, sizeof text, "%llu\n", (unsigned long long)t);
	if (write_file_atomic(path, text, (size_t)n, err, sizeof err))
		LOG(LOG_WARN, "agent: %s", err); /* a restart may then reuse a lower epoch */
	a->term_saved = t;
}

static void track_leader(members_t *a)
{
	disc_id_t l;
	int have = elec_leader(a->elec, &l);
	if (disc_id_cmp(&l, &a->last_leader)) {
		char was[DISC_ID_HEX] = "none", now[DISC_ID_HEX] = "none";
		if (!disc_id_is_zero(&a->last_leader))
			disc_id_hex(&a->last_leader, was);
		if (have)
			disc_id_hex(&l, now);
		LOG(LOG_INFO, "leader: %s -> %s (epoch %llu, %d members%s)", was, now,
		    (unsigned long long)elec_epoch(a->elec), elec_member_count(a->elec),
		    have && !disc_id_cmp(&l, &a->self) ? ", this node" : "");
		a->last_leader = l;
	}
	election_moved(a);
	term_save(a);
}

/* ---- the loop ------------------------------------------------------------------------------- */

enum { PF_LISTEN, PF_RESULTS, PF_MDNS, PF_FIXED };

int members_pollfds(members_t *a, struct pollfd *pf, int max, int *timeout_ms)
{
	int n = 0;
	if (max < PF_FIXED + a->n)
		return 0;
	pf[n++] = (struct pollfd){.fd = a->listen_fd, .events = POLLIN};
	pf[n++] = (struct pollfd){.fd = handshakes_fd(a->hs), .events = POLLIN};
	pf[n++] = (struct pollfd){.fd = a->mdns ? disc_mdns_fd(a->mdns) : -1, .events = POLLIN};
	for (int i = 0; i < a->n; i++) {
		pf[n++] = (struct pollfd){.fd = tp_chan_fd(a->m[i].ch), .events = POLLIN};
		if (tp_chan_pending(a->m[i].ch))
			*timeout_ms = 0;
	}
	return n;
}

void members_handle(members_t *a, const struct pollfd *pf, int n)
{
	if (n < PF_FIXED)
		return;
	if (pf[PF_LISTEN].revents & POLLIN) {
		int fd;
		char peer[128];
		int acc = tp_accept(a->listen_fd, &fd, peer, sizeof peer, 0, NULL, 0);
		if (acc == 0 && a->stood_down)
			close(fd); /* peers must not take us for the ID's holder */
		else if (acc == 0) {
			/* handshakes in flight are bounded: a flood of connections costs closed
			 * sockets, not threads */
			handshake_t *d = handshakes_running(a->hs) < MAX_HANDSHAKES
					     ? calloc(1, sizeof *d)
					     : NULL;
			if (d) {
				d->fd = fd;
				d->static_index = -1;
				snprintf(d->host, sizeof d->host, "%s", peer);
				handshakes_start(a->hs, d);
			} else
				close(fd);
		}
	}
	if (pf[PF_RESULTS].revents & POLLIN) {
		handshake_t *d;
		while ((d = handshakes_next(a->hs)))
			on_dial_result(a, d);
	}
	if (pf[PF_MDNS].revents & POLLIN) {
		disc_event_t ev;
		while (disc_mdns_next(a->mdns, &ev))
			on_mdns(a, &ev);
	}
	/* m[] may have changed above: read only those still at their slot */
	int nc = n - PF_FIXED;
	for (int i = nc - 1; i >= 0; i--) {
		if (i >= a->n || tp_chan_fd(a->m[i].ch) != pf[PF_FIXED + i].fd)
			continue;
		if (pf[PF_FIXED + i].revents || tp_chan_pending(a->m[i].ch))
			conn_read(a, i);
	}
}

void members_tick(members_t *a, int64_t now)
{
	heartbeat_and_reap(a, now);
	elec_set_complete(a->elec, view_complete(a));
	elec_tick(a->elec, now);
	send_elec_msgs(a);
	track_leader(a);
	dial_missing(a, now);
}

/* ---- life ----------------------------------------------------------------------------------- */

int members_new(members_t **out, const agent_config_t *cfg, const tp_keys_t *keys,
		const disc_id_t *self, const disc_host_facts_t *facts, const members_hooks_t *hooks,
		char *err, size_t errlen)
{
	*out = NULL;
	members_t *a = calloc(1, sizeof *a);
	if (!a)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	a->cfg = cfg;
	a->keys = keys;
	a->facts = facts;
	a->hooks = *hooks;
	a->self = *self;
	disc_id_hex(self, a->self_hex);
	a->listen_fd = -1;
	randombytes_buf(&a->nonce, sizeof a->nonce);
	int rc;
	if ((rc = handshakes_new(&a->hs, keys, self, err, errlen)))
		goto err;
	if ((rc = tp_listen(NULL, cfg->port, &a->listen_fd, &a->port, err, errlen)))
		goto err;
	fcntl(a->listen_fd, F_SETFL, fcntl(a->listen_fd, F_GETFL) | O_NONBLOCK);
	a->table = disc_table_new();
	if (!a->table) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto err;
	}
	for (int i = 0; i < cfg->npeers; i++)
		a->static_last_ms[i] = INT64_MIN / 2;
	for (int i = 0; i < DISC_MAX_PEERS; i++)
		a->mdns_last_try_ms[i] = INT64_MIN / 2;
	*out = a;
	return 0;
err:
	members_free(a);
	return rc;
}

int members_elect(members_t *a, char *err, size_t errlen)
{
	a->term_saved = term_load(a->cfg->state_dir);
	elec_config_t ec = {.settle_ms = a->cfg->settle_ms,
			    .expect = a->cfg->expect,
			    .grace_ms = a->cfg->no_mdns ? 0 : 1000,
			    .hold_ms = 5000,
			    .min_epoch = a->term_saved,
			    .quick_ms = 250};
	a->elec = elec_new(&a->self, &ec, now_ms());
	return a->elec ? 0 : sh_fail(err, errlen, SH_ENOMEM, "out of memory");
}

int members_publish(members_t *a, char *err, size_t errlen)
{
	if (a->cfg->no_mdns || a->mdns)
		return 0;
	disc_publish_t pub = {.id = a->self,
			      .port = (uint16_t)a->port,
			      .mem_bytes = a->facts->mem_bytes,
			      .cores = a->facts->cores,
			      .nonce = a->nonce};
	snprintf(pub.cid, sizeof pub.cid, "%s", a->keys->cid_hex);
	snprintf(pub.rdma, sizeof pub.rdma, "%s", a->facts->rdma);
	a->mdns = disc_mdns_new(&pub, err, errlen);
	return a->mdns ? 0 : SH_EIO;
}

void members_free(members_t *a)
{
	if (!a)
		return;
	disc_mdns_free(a->mdns);
	handshakes_free(a->hs); /* its threads may still hand a channel back: before the rest */
	for (int i = 0; i < a->n; i++)
		tp_chan_free(a->m[i].ch);
	if (a->listen_fd >= 0)
		close(a->listen_fd);
	elec_free(a->elec);
	disc_table_free(a->table);
	free(a);
}

/* ---- reading -------------------------------------------------------------------------------- */

int members_port(const members_t *a)
{
	return a->port;
}

int members_count(const members_t *a)
{
	return a->n;
}

member_t *members_at(members_t *a, int i)
{
	return i >= 0 && i < a->n ? &a->m[i] : NULL;
}

const elec_t *members_election(const members_t *a)
{
	return a->elec;
}

const disc_table_t *members_sightings(const members_t *a)
{
	return a->table;
}

const char *members_mdns(const members_t *a)
{
	return a->mdns ? disc_mdns_backend() : "off";
}

int members_duplicate(const members_t *a, const char **where)
{
	if (where)
		*where = a->duplicate_where;
	return a->duplicate;
}

int members_send(members_t *a, member_t *to, uint16_t type, const void *p, size_t len)
{
	(void)a;
	int rc = tp_chan_send(to->ch, type, p, len);
	if (rc)
		LOG(LOG_DEBUG, "agent: sending 0x%04x failed: %s", type, sh_strerror(rc));
	else
		to->last_tx_ms = now_ms();
	return rc;
}
