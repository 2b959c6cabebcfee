/*
 * agent.c: the agent's event loop, the thin I/O shell around the election core.
 *
 * One thread (agent_run) owns the members, the channels, the sighting table and the election core.
 * It polls: the control port, the mDNS event queue, the handshake-result pipe, the status socket,
 * every member's channel, and a 100 ms tick for heartbeats, liveness and the election's clock.
 * Handshakes block (HELLO + challenge-response, bounded by HANDSHAKE_MS), so each runs on its own
 * short-lived thread, which writes a pointer to its result into a pipe; the loop never blocks on a
 * peer for longer than one already-buffered frame.
 *
 * Connection rule: for peers found by mDNS, the node with the smaller ID connects; the larger one
 * connects too only when the smaller has not done so within FALLBACK_MS of being seen (one-sided
 * mDNS). Static peers (--peer) are dialled by whoever names them. When two channels to one peer end
 * up authenticated, both sides keep the one initiated by the smaller ID and close the other.
 *
 * Invariant: a peer is an election member exactly while one live channel to it exists (conns[]
 * holds at most one channel per node ID). What the members mean (plans, sessions, the state and
 * health) is the cluster core's business (core.c); this file feeds it members and the election's
 * leader, and cluster.c carries out what it decides.
 * The status socket's JSON lives in status.c; the structs both share are in agent_int.h.
 */
#include "agent/agent_int.h"
#include "common/common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#ifdef __APPLE__
#include <mach/mach.h>
#include <sys/sysctl.h>
#endif

const char *agent_state_name(agent_state_t s)
{
	switch (s) {
	case AGENT_DISCOVERING: return "discovering";
	case AGENT_SETTLED: return "settled";
	case AGENT_PLANNED: return "planned";
	case AGENT_LOADING: return "loading";
	case AGENT_SERVING: return "serving";
	}
	return "?";
}

int agent_send(agent_t *a, conn_t *c, uint16_t type, const void *p, size_t len)
{
	(void)a;
	int rc = tp_chan_send(c->ch, type, p, len);
	if (rc)
		LOG(LOG_DEBUG, "agent: sending 0x%04x failed: %s", type, sh_strerror(rc));
	else
		c->last_tx_ms = now_ms();
	return rc;
}

int agent_status_path(const char *state_dir, char *out, size_t len)
{
	int n = snprintf(out, len, "%s/agent.sock", state_dir);
	if (n < 0 || (size_t)n >= len || (size_t)n >= sizeof(((struct sockaddr_un *)0)->sun_path))
		return SH_EINVAL;
	return 0;
}

static void short_id(const disc_id_t *id, char out[9])
{
	char h[DISC_ID_HEX];
	disc_id_hex(id, h);
	memcpy(out, h, 8);
	out[8] = 0;
}

/* ---- memory the model may take ------------------------------------------------------------ */

/* What the system can give a new process without swapping: Linux's MemAvailable; on macOS the
 * physical memory minus what is wired, active and compressed (free, inactive and purgeable pages
 * can be reclaimed). 0 when unknown. */
static uint64_t mem_available(void)
{
#ifdef __APPLE__
	uint64_t total = 0;
	size_t len = sizeof total;
	vm_statistics64_data_t vs;
	mach_msg_type_number_t n = HOST_VM_INFO64_COUNT;
	vm_size_t page = 0;
	if (sysctlbyname("hw.memsize", &total, &len, NULL, 0) != 0 ||
	    host_page_size(mach_host_self(), &page) != KERN_SUCCESS ||
	    host_statistics64(mach_host_self(), HOST_VM_INFO64, (host_info64_t)&vs, &n) !=
		KERN_SUCCESS)
		return 0;
	uint64_t used =
	    ((uint64_t)vs.wire_count + vs.active_count + vs.compressor_page_count) * (uint64_t)page;
	return used < total ? total - used : 0;
#else
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	unsigned long long kb = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
#endif
}

int agent_memory_limit_parse(const char *s, uint64_t total, uint64_t *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (end == s || errno || v < 0)
		return SH_EINVAL;
	if (!strcmp(end, "%")) {
		if (v <= 0 || v > 100)
			return SH_EINVAL;
		*out = (uint64_t)((double)total * v / 100);
		return 0;
	}
	static const char units[] = "KMGT";
	const char *u = *end ? strchr(units, *end) : NULL;
	if (*end && (!u || (end[1] && strcmp(end + 1, "B") && strcmp(end + 1, "iB"))))
		return SH_EINVAL;
	for (const char *k = units; u && k <= u; k++)
		v *= 1024;
	if (v < 1 || v > 1e18)
		return SH_EINVAL;
	*out = (uint64_t)v;
	return 0;
}

/* ---- handshakes on their own threads -------------------------------------------------------- */

static void *dial_main(void *arg)
{
	dial_t *d = arg;
	agent_t *a = d->a;
	if (d->outgoing)
		d->rc = tp_chan_connect(&d->ch, d->host, d->port, &a->keys, a->self.b, HANDSHAKE_MS,
					d->err, sizeof d->err);
	else
		d->rc = tp_chan_accept(&d->ch, d->fd, &a->keys, a->self.b, HANDSHAKE_MS, d->err,
				       sizeof d->err);
	if (write(a->result_pipe[1], &d, sizeof d) != sizeof d) {
		tp_chan_free(d->ch); /* the agent is going away */
		free(d);
	}
	atomic_fetch_sub(&a->dials_running, 1);
	return NULL;
}

static int dial_start(agent_t *a, dial_t *d)
{
	pthread_t t;
	pthread_attr_t at;
	d->a = a;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	atomic_fetch_add(&a->dials_running, 1);
	int rc = pthread_create(&t, &at, dial_main, d);
	pthread_attr_destroy(&at);
	if (rc) {
		atomic_fetch_sub(&a->dials_running, 1);
		if (!d->outgoing)
			close(d->fd);
		free(d);
		return SH_EIO;
	}
	return 0;
}

static int is_dialing(const agent_t *a, const disc_id_t *id)
{
	for (int i = 0; i < a->ndialing; i++)
		if (!disc_id_cmp(&a->dialing[i], id))
			return 1;
	return 0;
}

static void dialing_remove(agent_t *a, const disc_id_t *id)
{
	for (int i = 0; i < a->ndialing; i++)
		if (!disc_id_cmp(&a->dialing[i], id)) {
			a->dialing[i] = a->dialing[--a->ndialing];
			return;
		}
}

static void dial_out(agent_t *a, const char *host, int port, const disc_id_t *target, int sidx)
{
	if (target && (is_dialing(a, target) || a->ndialing == MAX_DIALS))
		return;
	dial_t *d = calloc(1, sizeof *d);
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
	if (dial_start(a, d) != 0) {
		if (target)
			dialing_remove(a, target);
		if (sidx >= 0)
			a->static_dialing[sidx] = 0;
	}
}

/* ---- members -------------------------------------------------------------------------------- */

conn_t *agent_conn_find(agent_t *a, const disc_id_t *id)
{
	for (int i = 0; i < a->nconns; i++)
		if (!disc_id_cmp(&a->conns[i].id, id))
			return &a->conns[i];
	return NULL;
}

static void send_info(agent_t *a, conn_t *c)
{
	char buf[1024];
	disc_info_t in = {.version = DISC_PROTO_VERSION,
			  .id = a->self,
			  .port = a->cfg.port,
			  .mem_bytes = a->facts.mem_bytes,
			  .cores = a->facts.cores};
	snprintf(in.host, sizeof in.host, "%s", a->facts.hostname);
	snprintf(in.rdma, sizeof in.rdma, "%s", a->facts.rdma);
	int n = disc_info_encode(&in, buf, sizeof buf);
	if (n > 0 && tp_chan_send(c->ch, DISC_MSG_INFO, buf, (size_t)n))
		LOG(LOG_DEBUG, "agent: sending INFO failed");
	c->last_tx_ms = now_ms();
}

static void log_members(agent_t *a, const char *what, const disc_id_t *id, const char *addr)
{
	char s[9];
	short_id(id, s);
	LOG(LOG_INFO, "members: %d -> %d (%s %s at %s)",
	    elec_member_count(a->elec) + (*what == '+' ? -1 : 1), elec_member_count(a->elec), what,
	    s, addr);
}

/* Drops conns[i]; the peer leaves the view. */
static void conn_drop(agent_t *a, int i, const char *why)
{
	conn_t c = a->conns[i];
	a->conns[i] = a->conns[--a->nconns];
	tp_chan_free(c.ch);
	char h[DISC_ID_HEX];
	disc_id_hex(&c.id, h);
	LOG(LOG_INFO, "agent: member %s (%s) lost: %s", h, c.addr, why);
	web_event(a->web, "leave", "%.8s (%s) left: %s", h, c.addr, why);
	elec_member_down(a->elec, &c.id, now_ms());
	log_members(a, "-", &c.id, c.addr);
	core_event_t ev = {.type = CORE_EV_MEMBER_DOWN, .id = c.id};
	agent_core_feed(a, &ev);
	agent_core_leader(a);
}

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

/* Is addr (numeric) one of this host's own addresses? */
static int is_local_addr(const char *addr)
{
	struct ifaddrs *ifs = NULL;
	int found = 0;
	if (!strncmp(addr, "127.", 4) || !strcmp(addr, "::1"))
		return 1;
	if (getifaddrs(&ifs) != 0)
		return 0;
	for (struct ifaddrs *it = ifs; it && !found; it = it->ifa_next) {
		char buf[INET6_ADDRSTRLEN] = "";
		if (!it->ifa_addr)
			continue;
		if (it->ifa_addr->sa_family == AF_INET)
			inet_ntop(AF_INET, &((struct sockaddr_in *)it->ifa_addr)->sin_addr, buf,
				  sizeof buf);
		else if (it->ifa_addr->sa_family == AF_INET6)
			inet_ntop(AF_INET6, &((struct sockaddr_in6 *)it->ifa_addr)->sin6_addr, buf,
				  sizeof buf);
		found = buf[0] && !strcmp(buf, addr);
	}
	freeifaddrs(ifs);
	return found;
}

/* Records a live node using our ID. When we have no member yet (the newcomer: typically the copy
 * of a state directory), we stand down: no dialing, no accepting, so peers never take us for the
 * node that already holds the ID (they fold both under one ID). */
static void duplicate_found(agent_t *a, const char *where)
{
	a->duplicate = 1;
	snprintf(a->duplicate_where, sizeof a->duplicate_where, "%s", where);
	if (a->nconns == 0 && !a->stood_down) {
		a->stood_down = 1;
		LOG(LOG_ERROR, "agent: not joining the cluster: %s already holds our node ID",
		    where);
	}
}

static void on_dial_result(agent_t *a, dial_t *d)
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
			    a->cfg.peers[d->static_index], d->err, STATIC_RETRY_MS / 1000);
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
	if (!disc_id_cmp(&pid, &a->self) && is_local_addr(addr)) {
		/* a --peer that names this very node (or its other end): not a duplicate */
		if (d->static_index >= 0 && !a->static_self[d->static_index]) {
			a->static_self[d->static_index] = 1;
			LOG(LOG_INFO, "agent: --peer %s is this node; skipping it",
			    a->cfg.peers[d->static_index]);
		}
		tp_chan_free(d->ch);
		free(d);
		return;
	}
	if (!disc_id_cmp(&pid, &a->self)) {
		LOG(LOG_ERROR,
		    "duplicate node ID %s: the node at %s uses it too (a copied state directory?); "
		    "stop one and remove its %s/node_id",
		    ph, addr, a->cfg.state_dir);
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
	conn_t *old = agent_conn_find(a, &pid);
	if (old) {
		/* keep the channel initiated by the smaller ID; a repeat from the same side
		 * replaces the old one (the peer restarted and the old channel is stale) */
		int smaller_is_me = disc_id_cmp(&a->self, &pid) < 0;
		int keep_new = old->initiator_is_me == me_init || me_init == smaller_is_me;
		LOG(LOG_DEBUG, "agent: second channel to %s: keeping the %s one", ph,
		    keep_new ? "new" : "old");
		if (!keep_new) {
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
		agent_send_node(a, old);
		free(d);
		return;
	}
	if (a->nconns == MAX_CONNS) {
		LOG(LOG_WARN, "agent: too many members, refusing %s", ph);
		tp_chan_free(d->ch);
		free(d);
		return;
	}
	conn_t *c = &a->conns[a->nconns++];
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
	web_event(a->web, "join", "%.8s joined from %s", ph, c->addr);
	send_info(a, c);
	agent_send_node(a, c);
	elec_member_up(a->elec, &pid, now_ms());
	log_members(a, "+", &pid, c->addr);
	core_event_t ev = {.type = CORE_EV_MEMBER_UP, .id = pid};
	agent_core_feed(a, &ev);
	agent_core_leader(a);
}

/* ---- messages ------------------------------------------------------------------------------- */

static void send_elec_msgs(agent_t *a)
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
		for (int i = 0; i < a->nconns; i++) {
			conn_t *c = &a->conns[i];
			if (!m.broadcast && disc_id_cmp(&m.to, &c->id))
				continue;
			if (tp_chan_send(c->ch, (uint16_t)m.type, buf, (size_t)len) == 0)
				c->last_tx_ms = now_ms();
		}
	}
}

static int handle_msg(agent_t *a, conn_t *c, uint16_t type, const uint8_t *p, size_t len)
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
		agent_core_leader(a);
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
		agent_core_leader(a);
		return 0;
	}
	case DISC_MSG_SMALLER: {
		disc_id_t s;
		if (len != DISC_ID_LEN)
			return SH_EFORMAT;
		memcpy(s.b, p, DISC_ID_LEN);
		elec_on_smaller(a->elec, &c->id, &s, now);
		agent_core_leader(a);
		return 0;
	}
	default:
		if (type >= 0x0300 && type <= 0x03ff)
			return agent_cluster_msg(a, c, type, p, len);
		LOG(LOG_DEBUG, "agent: ignoring message type 0x%04x", type);
		return 0;
	}
}

/* Reads every buffered frame of conns[i]. Returns 1 when the conn was dropped. */
static int conn_read(agent_t *a, int i)
{
	conn_t *c = &a->conns[i];
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
		rc = handle_msg(a, c, type, p, len);
		if (rc) {
			char why[64];
			snprintf(why, sizeof why, "malformed message type 0x%04x", type);
			conn_drop(a, i, why);
			return 1;
		}
	}
}

/* ---- mDNS ----------------------------------------------------------------------------------- */

static void on_mdns(agent_t *a, const disc_event_t *ev)
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
		if (strcmp(s->cid, a->keys.cid_hex)) {
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
			    .id = a->self, .port = (uint16_t)a->cfg.port, .nonce = a->nonce};
			self = disc_sighting_self(&me, s, is_local_addr(s->addr));
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
static void dial_missing(agent_t *a, int64_t now)
{
	disc_id_t hint;
	int have_hint = elec_hint(a->elec, &hint);
	for (int i = 0; i < disc_table_count(a->table) && !a->stood_down; i++) {
		const disc_peer_t *p = disc_table_at(a->table, i);
		if (agent_conn_find(a, &p->id) || is_dialing(a, &p->id) || !p->naddrs)
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
	for (int i = 0; i < a->cfg.npeers; i++) {
		if (a->static_dialing[i] || a->static_self[i] ||
		    now - a->static_last_ms[i] < STATIC_RETRY_MS)
			continue;
		if (!disc_id_is_zero(&a->static_id[i]) &&
		    (agent_conn_find(a, &a->static_id[i]) ||
		     !disc_id_cmp(&a->static_id[i], &a->self)))
			continue;
		a->static_last_ms[i] = now;
		char host[DISC_HOST_MAX];
		int port;
		if (tp_hostport_parse(a->cfg.peers[i], host, sizeof host, &port, NULL, 0))
			continue; /* checked by cmd_agent */
		dial_out(a, host, port, NULL, i);
	}
}

/* Is every node discovery knows of (mDNS sightings, static peers) a member? Then the view need
 * not wait the whole settle time (election.c's quick_ms). */
static int view_complete(agent_t *a)
{
	int known = 0;
	for (int i = 0; i < disc_table_count(a->table); i++) {
		const disc_peer_t *p = disc_table_at(a->table, i);
		if (!agent_conn_find(a, &p->id))
			return 0;
		known++;
	}
	for (int i = 0; i < a->cfg.npeers; i++) {
		if (a->static_self[i])
			continue;
		if (disc_id_is_zero(&a->static_id[i]) || !agent_conn_find(a, &a->static_id[i]))
			return 0;
		known++;
	}
	return known > 0;
}

/* ---- the loop ------------------------------------------------------------------------------- */

static void heartbeat_and_reap(agent_t *a, int64_t now)
{
	for (int i = a->nconns - 1; i >= 0; i--)
		if (now - a->conns[i].last_rx_ms > AGENT_DEAD_MS) {
			char why[64];
			snprintf(why, sizeof why, "no heartbeat for %lld ms",
				 (long long)(now - a->conns[i].last_rx_ms));
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
	for (int i = a->nconns - 1; i >= 0; i--) {
		int rc = tp_chan_send(a->conns[i].ch, DISC_MSG_HEARTBEAT, &w, sizeof w);
		if (rc)
			conn_drop(a, i, sh_strerror(rc));
		else
			a->conns[i].last_tx_ms = now;
	}
}

/* ---- the term: epochs only grow, across restarts too ---------------------------------------- */

/* The largest election epoch seen before (STATE_DIR/term), 0 when none. */
static uint64_t term_load(const char *state_dir)
{
	char path[4200], *text = NULL, err[128];
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

static void term_save(agent_t *a)
{
	uint64_t t = elec_max_epoch(a->elec);
	if (t <= a->term_saved)
		return;
	char path[4200], text[32], err[256];
	snprintf(path, sizeof path, "%s/term", a->cfg.state_dir);
	int n = snprintf(text, sizeof text, "%llu\n", (unsigned long long)t);
	if (write_file_atomic(path, text, (size_t)n, err, sizeof err))
		LOG(LOG_WARN, "agent: %s", err); /* a restart may then reuse a lower epoch */
	a->term_saved = t;
}

static void track_leader(agent_t *a)
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
		web_event(a->web, strcmp(was, "none") ? "failover" : "leader",
			  "leader %.8s -> %.8s (epoch %llu)", was, now,
			  (unsigned long long)elec_epoch(a->elec));
		a->last_leader = l;
	}
	agent_core_leader(a);
	term_save(a);
}

int agent_run(agent_t *a)
{
	struct pollfd pf[7 + MAX_CONNS];
	for (;;) {
		int n = 0;
		pf[n++] = (struct pollfd){.fd = a->stop_pipe[0], .events = POLLIN};
		pf[n++] = (struct pollfd){.fd = a->listen_fd, .events = POLLIN};
		pf[n++] = (struct pollfd){.fd = a->result_pipe[0], .events = POLLIN};
		pf[n++] = (struct pollfd){.fd = a->status_fd, .events = POLLIN};
		pf[n++] =
		    (struct pollfd){.fd = a->mdns ? disc_mdns_fd(a->mdns) : -1, .events = POLLIN};
		pf[n++] = (struct pollfd){.fd = a->sync_fd, .events = POLLIN};
		/* a session forming or loading is polled more often: its READY is the cluster's
		 * first 200 (formation time) */
		int base = n, nc = a->nconns, timeout = a->sess && !a->sess_ready ? 20 : 100;
		for (int i = 0; i < nc; i++) {
			pf[n++] =
			    (struct pollfd){.fd = tp_chan_fd(a->conns[i].ch), .events = POLLIN};
			if (tp_chan_pending(a->conns[i].ch))
				timeout = 0;
		}
		if (poll(pf, (nfds_t)n, timeout) < 0 && errno != EINTR)
			return SH_EIO;
		if (pf[0].revents)
			return 0;
		if (pf[1].revents & POLLIN) {
			int fd;
			char peer[128];
			int acc = tp_accept(a->listen_fd, &fd, peer, sizeof peer, 0, NULL, 0);
			if (acc == 0 && a->stood_down)
				close(fd); /* peers must not take us for the ID's holder */
			else if (acc == 0) {
				/* handshakes in flight are bounded: a flood of connections costs
				 * closed sockets, not threads */
				dial_t *d = atomic_load(&a->dials_running) < MAX_HANDSHAKES
						? calloc(1, sizeof *d)
						: NULL;
				if (d) {
					d->fd = fd;
					d->static_index = -1;
					snprintf(d->host, sizeof d->host, "%s", peer);
					dial_start(a, d);
				} else
					close(fd);
			}
		}
		if (pf[2].revents & POLLIN) {
			dial_t *d;
			while (read(a->result_pipe[0], &d, sizeof d) == sizeof d)
				on_dial_result(a, d);
		}
		if (pf[3].revents & POLLIN)
			agent_status_serve(a);
		if (pf[4].revents & POLLIN) {
			disc_event_t ev;
			while (disc_mdns_next(a->mdns, &ev))
				on_mdns(a, &ev);
		}
		if (pf[5].revents & POLLIN)
			agent_sync_accept(a);
		/* conns[] may have changed above: read only those still at their slot */
		for (int i = nc - 1; i >= 0; i--) {
			if (i >= a->nconns || tp_chan_fd(a->conns[i].ch) != pf[base + i].fd)
				continue;
			if (pf[base + i].revents || tp_chan_pending(a->conns[i].ch))
				conn_read(a, i);
		}
		int64_t now = now_ms();
		heartbeat_and_reap(a, now);
		elec_set_complete(a->elec, view_complete(a));
		elec_tick(a->elec, now);
		send_elec_msgs(a);
		track_leader(a);
		agent_model_tick(a, now);
		agent_cluster_tick(a, now);
		dial_missing(a, now);
	}
}

void agent_stop(agent_t *a)
{
	char b = 1;
	if (write(a->stop_pipe[1], &b, 1) != 1) {
		/* the pipe is full: a stop is already pending */
	}
}

static int make_pipe(int p[2])
{
	if (pipe(p) != 0)
		return -1;
	for (int i = 0; i < 2; i++) {
		fcntl(p[i], F_SETFL, fcntl(p[i], F_GETFL) | O_NONBLOCK);
		fcntl(p[i], F_SETFD, FD_CLOEXEC);
	}
	return 0;
}

/* Publishes this node over mDNS (not with --no-mdns). */
static int mdns_start(agent_t *a, const tp_keys_t *keys, int port, char *errbuf, size_t errlen)
{
	const agent_config_t *cfg = &a->cfg;
	if (!cfg->no_mdns) {
		disc_publish_t pub = {.id = a->self,
				      .port = (uint16_t)port,
				      .mem_bytes = a->facts.mem_bytes,
				      .cores = a->facts.cores,
				      .nonce = a->nonce};
		snprintf(pub.cid, sizeof pub.cid, "%s", keys->cid_hex);
		snprintf(pub.rdma, sizeof pub.rdma, "%s", a->facts.rdma);
		a->mdns = disc_mdns_new(&pub, errbuf, errlen);
		if (!a->mdns)
			return SH_EIO;
	}
	return 0;
}

agent_t *agent_new(const agent_config_t *cfg, const tp_keys_t *keys, char *errbuf, size_t errlen)
{
	agent_t *a = calloc(1, sizeof *a);
	if (!a) {
		sh_fail(errbuf, errlen, SH_ENOMEM, "out of memory");
		return NULL;
	}
	a->cfg = *cfg;
	a->keys = *keys;
	a->listen_fd = a->status_fd = a->sync_fd = -1;
	a->result_pipe[0] = a->result_pipe[1] = a->stop_pipe[0] = a->stop_pipe[1] = -1;
	pthread_mutex_init(&a->pub_mu, NULL);
	int created = 0, port = 0;
	if (disc_identity_load(cfg->state_dir, &a->self, &created, errbuf, errlen))
		goto err;
	disc_id_hex(&a->self, a->self_hex);
	LOG(LOG_INFO, "node ID %s (%s %s/node_id)", a->self_hex, created ? "created" : "from",
	    cfg->state_dir);
	disc_host_facts_get(&a->facts);
	a->mem_avail = mem_available();
	if (!a->mem_avail || a->mem_avail > a->facts.mem_bytes)
		a->mem_avail = a->facts.mem_bytes;
	if (cfg->memory_limit) {
		uint64_t cap;
		if (agent_memory_limit_parse(cfg->memory_limit, a->facts.mem_bytes, &cap)) {
			sh_fail(errbuf, errlen, SH_EINVAL,
				"bad --memory-limit '%s' (BYTES with K, M, G or T, or PCT%%)",
				cfg->memory_limit);
			goto err;
		}
		if (cap < a->mem_avail)
			a->mem_avail = cap;
	}
	LOG(LOG_INFO, "memory: %.1f GiB of %.1f GiB for the model%s",
	    (double)a->mem_avail / (1 << 30), (double)a->facts.mem_bytes / (1 << 30),
	    cfg->memory_limit ? " (--memory-limit)" : " (available now)");
	randombytes_buf(&a->nonce, sizeof a->nonce);
	if (make_pipe(a->result_pipe) || make_pipe(a->stop_pipe)) {
		sh_fail(errbuf, errlen, SH_EIO, "pipe: %s", strerror(errno));
		goto err;
	}
	if (tp_listen(NULL, cfg->port, &a->listen_fd, &port, errbuf, errlen))
		goto err;
	fcntl(a->listen_fd, F_SETFL, fcntl(a->listen_fd, F_GETFL) | O_NONBLOCK);
	a->cfg.port = port;
	if (agent_status_listen(a, errbuf, errlen))
		goto err;
	/* publish before hashing a small model: mDNS probing (~0.75 s) runs meanwhile (formation
	 * time). A large model's first hash takes long: peers would time out handshaking with a
	 * node that does not answer yet, so it publishes after. */
	struct stat st;
	int early = !cfg->model || (stat(cfg->model, &st) == 0 && st.st_size < (1LL << 30));
	if (early && mdns_start(a, keys, port, errbuf, errlen))
		goto err;
	if (agent_model_init(a, errbuf, errlen))
		goto err;
	if (!early && mdns_start(a, keys, port, errbuf, errlen))
		goto err;
	if (agent_web_start(a, errbuf, errlen))
		goto err;
	a->term_saved = term_load(cfg->state_dir);
	elec_config_t ec = {.settle_ms = cfg->settle_ms,
			    .expect = cfg->expect,
			    .grace_ms = cfg->no_mdns ? 0 : 1000,
			    .hold_ms = 5000,
			    .min_epoch = a->term_saved,
			    .quick_ms = 250};
	a->elec = elec_new(&a->self, &ec, now_ms());
	a->table = disc_table_new();
	core_config_t cc;
	core_config_default(&cc);
	cc.replan_delay_ms = cfg->replan_delay_ms;
	a->core = core_new(&a->self, &cc, now_ms());
	if (!a->elec || !a->table || !a->core) {
		sh_fail(errbuf, errlen, SH_ENOMEM, "out of memory");
		goto err;
	}
	for (int i = 0; i < cfg->npeers; i++)
		a->static_last_ms[i] = INT64_MIN / 2;
	for (int i = 0; i < DISC_MAX_PEERS; i++)
		a->mdns_last_try_ms[i] = INT64_MIN / 2;
	LOG(LOG_INFO,
	    "agent: control port %d, cluster %s, mDNS %s, %d static peers, settle %lld ms%s", port,
	    keys->cid_hex, a->mdns ? disc_mdns_backend() : "off", cfg->npeers,
	    (long long)cfg->settle_ms, cfg->expect ? ", expecting members" : "");
	return a;
err:
	agent_free(a);
	return NULL;
}

void agent_free(agent_t *a)
{
	if (!a)
		return;
	agent_cluster_free(a); /* the session's thread reads the keys and the web server */
	agent_model_free(a);
	web_free(a->web);
	free(a->pub_cluster);
	pthread_mutex_destroy(&a->pub_mu);
	disc_mdns_free(a->mdns);
	/* handshakes still running hold a pointer to us: let them finish (bounded by their
	 * timeout); each writes its result into the pipe, which we drain and free */
	int64_t end = now_ms() + HANDSHAKE_MS + 1000;
	while (atomic_load(&a->dials_running) > 0 && now_ms() < end) {
		dial_t *d;
		while (a->result_pipe[0] >= 0 &&
		       read(a->result_pipe[0], &d, sizeof d) == sizeof d) {
			tp_chan_free(d->ch);
			free(d);
		}
		usleep(10000);
	}
	dial_t *d;
	while (a->result_pipe[0] >= 0 && read(a->result_pipe[0], &d, sizeof d) == sizeof d) {
		tp_chan_free(d->ch);
		free(d);
	}
	for (int i = 0; i < a->nconns; i++)
		tp_chan_free(a->conns[i].ch);
	if (a->listen_fd >= 0)
		close(a->listen_fd);
	if (a->status_fd >= 0) {
		close(a->status_fd);
		unlink(a->status_path);
	}
	for (int i = 0; i < 2; i++) {
		if (a->result_pipe[i] >= 0)
			close(a->result_pipe[i]);
		if (a->stop_pipe[i] >= 0)
			close(a->stop_pipe[i]);
	}
	elec_free(a->elec);
	core_free(a->core);
	disc_table_free(a->table);
	tp_keys_wipe(&a->keys);
	free(a);
}
