/*
 * cluster.c: the shell around the cluster core (core.c) for plans. Every node describes itself to
 * every member once (AGENT_MSG_NODE: addresses with interface names, API port, model content hash
 * and size, the memory it gives the model). What those descriptions mean (who plans, who is left
 * out, when to plan again, when a session starts or stops, what /health says) is the core's
 * decision; this file feeds it events (agent_core_feed) and carries out its actions: it builds
 * the plan_view_t of the nodes the core names and runs plan_make (CORE_ACT_MAKE_PLAN), sends the
 * plan JSON (AGENT_MSG_PLAN), acknowledgements (AGENT_MSG_ACK) and reasons for leaving a member
 * out (AGENT_MSG_EXCLUDED), parses and verifies received plans, writes hostfile.json,
 * mlx-hosts.json, rdma-devices.json and plan.json into the state directory when a session starts
 * (the same bytes everywhere: written from the one plan text), starts and stops sessions
 * (serve.c), calls agent_plan_hook, and publishes health and the /v1/cluster document.
 *
 * Invariant: a->plan is the plan of the running (or last) session, a->pending the plan the core
 * accepted until its session starts, a->made the planner's last plan; at most one session runs.
 */
#include "agent/agent_int.h"
#include "agent/exec.h"
#include "agent/planio.h"
#include "common/common.h"
#include "infer/infer.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <jansson.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- node descriptions ---------------------------------------------------------------------- */

/* The kind of a local interface: its name when that says (en*, wl*, thunderbolt*, ...); else, on
 * Linux, what the kernel says (a wireless directory: Wi-Fi; link type 1, Ethernet: veth pairs,
 * bridges' ports and renamed NICs). */
static int if_kind(const char *ifname)
{
	plan_link_t k = plan_link_guess(ifname);
	if (k != PLAN_LINK_OTHER)
		return k;
	char path[128], buf[16] = "";
	snprintf(path, sizeof path, "/sys/class/net/%s/wireless", ifname);
	if (access(path, F_OK) == 0)
		return PLAN_LINK_WIFI;
	snprintf(path, sizeof path, "/sys/class/net/%s/type", ifname);
	FILE *f = fopen(path, "r");
	if (f) {
		if (!fgets(buf, sizeof buf, f))
			buf[0] = 0;
		fclose(f);
	}
	return atoi(buf) == 1 ? PLAN_LINK_ETHERNET : PLAN_LINK_OTHER;
}

/* This host's addresses (IPv4 and global IPv6, no loopback; loopback only when nothing else). */
static void self_desc(agent_t *a, node_desc_t *d)
{
	memset(d, 0, sizeof *d);
	d->have = 1;
	d->http_port = a->web ? web_port(a->web) : a->cfg.http_port;
	snprintf(d->model_hash, sizeof d->model_hash, "%s", a->model_hash);
	d->model_size = a->model_size;
	struct ifaddrs *ifs = NULL;
	if (getifaddrs(&ifs) == 0) {
		for (struct ifaddrs *it = ifs; it && d->naddrs < AGENT_MAX_ADDRS;
		     it = it->ifa_next) {
			char buf[INET6_ADDRSTRLEN] = "";
			if (!it->ifa_addr || (it->ifa_flags & IFF_LOOPBACK) ||
			    !(it->ifa_flags & IFF_UP))
				continue;
			if (it->ifa_addr->sa_family == AF_INET)
				inet_ntop(AF_INET, &((struct sockaddr_in *)it->ifa_addr)->sin_addr,
					  buf, sizeof buf);
			else if (it->ifa_addr->sa_family == AF_INET6) {
				struct in6_addr *x =
				    &((struct sockaddr_in6 *)it->ifa_addr)->sin6_addr;
				if (IN6_IS_ADDR_LINKLOCAL(x))
					continue; /* needs a scope: useless in a hostfile */
				inet_ntop(AF_INET6, x, buf, sizeof buf);
			}
			if (!buf[0] || strlen(buf) >= PLAN_IP_MAX)
				continue;
			snprintf(d->ip[d->naddrs], PLAN_IP_MAX, "%s", buf);
			snprintf(d->ifname[d->naddrs], PLAN_IFNAME_MAX, "%s", it->ifa_name);
			d->kind[d->naddrs] = if_kind(it->ifa_name);
			if (it->ifa_addr->sa_family == AF_INET && it->ifa_netmask) /* docs/mlx.md */
				d->prefix[d->naddrs] = __builtin_popcount(
				    ((struct sockaddr_in *)it->ifa_netmask)->sin_addr.s_addr);
			d->naddrs++;
		}
		freeifaddrs(ifs);
	}
	if (!d->naddrs) {
		snprintf(d->ip[0], PLAN_IP_MAX, "127.0.0.1");
		snprintf(d->ifname[0], PLAN_IFNAME_MAX, "lo");
		d->naddrs = 1;
	}
}

void agent_send_node(agent_t *a, conn_t *c)
{
	node_desc_t d;
	self_desc(a, &d);
	json_t *o = json_object(), *addrs = json_array();
	json_object_set_new(o, "v", json_integer(1));
	json_object_set_new(o, "http_port", json_integer(d.http_port));
	/* a slice holds only this node's share: it serves no one */
	json_object_set_new(o, "sync_port", json_integer(a->model_slice ? 0 : a->sync_port));
	json_object_set_new(o, "mem_avail", json_integer((json_int_t)a->mem_avail));
	if (d.model_hash[0])
		json_object_set_new(
		    o, "model",
		    json_pack("{s:s,s:I}", "hash", d.model_hash, "size", (json_int_t)d.model_size));
	else
		json_object_set_new(o, "model", json_null());
	for (int i = 0; i < d.naddrs; i++)
		json_array_append_new(addrs, json_pack("{s:s,s:s,s:s,s:i}", "ip", d.ip[i], "if",
						       d.ifname[i], "kind",
						       plan_link_name((plan_link_t)d.kind[i]),
						       "prefix", d.prefix[i]));
	json_object_set_new(o, "addrs", addrs);
	char *s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (s)
		agent_send(a, c, AGENT_MSG_NODE, s, strlen(s));
	free(s);
}

/* Parses a NODE message; fields out of bounds make it malformed. */
static int node_parse(node_desc_t *d, const uint8_t *p, size_t len)
{
	memset(d, 0, sizeof *d);
	json_error_t je;
	json_t *o = json_loadb((const char *)p, len, 0, &je);
	if (!json_is_object(o)) {
		json_decref(o);
		return SH_EFORMAT;
	}
	int rc = SH_EFORMAT;
	json_t *hp = json_object_get(o, "http_port"), *m = json_object_get(o, "model");
	json_t *addrs = json_object_get(o, "addrs");
	if (!json_is_integer(hp) || json_integer_value(hp) < 0 || json_integer_value(hp) > 65535 ||
	    !json_is_array(addrs))
		goto done;
	d->http_port = (int)json_integer_value(hp);
	json_t *sp = json_object_get(o, "sync_port");
	if (json_is_integer(sp) && json_integer_value(sp) > 0 && json_integer_value(sp) <= 65535)
		d->sync_port = (int)json_integer_value(sp);
	json_t *ma = json_object_get(o, "mem_avail"); /* optional: older nodes do not say */
	if (json_is_integer(ma) && json_integer_value(ma) > 0)
		d->mem_avail = (uint64_t)json_integer_value(ma);
	if (json_is_object(m)) {
		const char *h = json_string_value(json_object_get(m, "hash"));
		json_t *sz = json_object_get(m, "size");
		if (!h || strlen(h) != AGENT_HASH_HEX - 1 || !json_is_integer(sz) ||
		    json_integer_value(sz) < 0)
			goto done;
		snprintf(d->model_hash, sizeof d->model_hash, "%s", h);
		d->model_size = (uint64_t)json_integer_value(sz);
	}
	size_t i;
	json_t *x;
	json_array_foreach(addrs, i, x)
	{
		const char *ip = json_string_value(json_object_get(x, "ip"));
		const char *ifn = json_string_value(json_object_get(x, "if"));
		if (!ip || !ifn || strlen(ip) >= PLAN_IP_MAX || strlen(ifn) >= PLAN_IFNAME_MAX)
			goto done;
		const char *ks = json_string_value(json_object_get(x, "kind"));
		int k = ks ? plan_link_parse(ks) : -1;
		if (d->naddrs < AGENT_MAX_ADDRS) {
			d->kind[d->naddrs] =
			    k >= 0 && k <= PLAN_LINK_THUNDERBOLT ? k : (int)plan_link_guess(ifn);
			snprintf(d->ip[d->naddrs], PLAN_IP_MAX, "%s", ip);
			snprintf(d->ifname[d->naddrs], PLAN_IFNAME_MAX, "%s", ifn);
			json_t *px = json_object_get(x, "prefix"); /* absent from older agents */
			if (json_is_integer(px) && json_integer_value(px) >= 0 &&
			    json_integer_value(px) <= 32)
				d->prefix[d->naddrs] = (int)json_integer_value(px);
			d->naddrs++;
		}
	}
	d->have = 1;
	rc = 0;
done:
	json_decref(o);
	return rc;
}

/* ---- the view (planner) -------------------------------------------------------------------- */

/* avail: what the node says it can give (0 = unknown: its total). */
static int node_fill(plan_node_t *pn, const char *idhex, const char *host, int port, uint64_t mem,
		     uint64_t avail, int cores, const char *rdma, const node_desc_t *d)
{
	snprintf(pn->node_id, sizeof pn->node_id, "%s", idhex);
	snprintf(pn->host, sizeof pn->host, "%s", host);
	pn->port = port;
	pn->mem_total = mem;
	pn->mem_avail = avail && avail < mem ? avail : mem;
	pn->cores = cores;
	pn->addrs = calloc((size_t)MAX(d->naddrs, 1), sizeof *pn->addrs);
	pn->rdma = calloc(PLAN_MAX_RDMA, sizeof *pn->rdma);
	if (!pn->addrs || !pn->rdma)
		return SH_ENOMEM;
	for (int i = 0; i < d->naddrs; i++) {
		plan_addr_t *ad = &pn->addrs[pn->n_addrs++];
		snprintf(ad->ip, sizeof ad->ip, "%s", d->ip[i]);
		snprintf(ad->ifname, sizeof ad->ifname, "%s", d->ifname[i]);
		ad->kind = (plan_link_t)d->kind[i];
		ad->prefix = d->prefix[i];
	}
	/* "dev:ifname,dev:ifname": devices discovery found with an active port */
	char tmp[256];
	snprintf(tmp, sizeof tmp, "%s", rdma ? rdma : "");
	char *save = NULL;
	for (char *t = strtok_r(tmp, ",", &save); t && pn->n_rdma < PLAN_MAX_RDMA;
	     t = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(t, ':');
		plan_rdma_t *r = &pn->rdma[pn->n_rdma];
		if (colon)
			*colon = 0;
		if (!*t || strlen(t) >= PLAN_DEV_MAX)
			continue;
		snprintf(r->name, sizeof r->name, "%s", t);
		if (colon && strlen(colon + 1) < PLAN_IFNAME_MAX)
			snprintf(r->ifname, sizeof r->ifname, "%s", colon + 1);
		r->port_active = 1;
		pn->n_rdma++;
	}
	return 0;
}

/* The view of the nodes the core asked to plan (self and members, by ID). */
static plan_view_t *view_build(agent_t *a, const core_action_t *x)
{
	plan_view_t *v = calloc(1, sizeof *v);
	if (!v)
		return NULL;
	v->nodes = calloc(PLAN_MAX_NODES, sizeof *v->nodes);
	if (!v->nodes)
		goto err;
	v->epoch = x->epoch; /* the group's tag: grows with the election's term */
	for (int i = 0; i < x->n && v->n_nodes < PLAN_MAX_NODES; i++) {
		char h[DISC_ID_HEX];
		disc_id_hex(&x->ids[i], h);
		if (!disc_id_cmp(&x->ids[i], &a->self)) {
			node_desc_t me;
			self_desc(a, &me);
			if (node_fill(&v->nodes[v->n_nodes++], h, a->facts.hostname, a->cfg.port,
				      a->facts.mem_bytes, a->mem_avail, a->facts.cores,
				      a->facts.rdma, &me))
				goto err;
			continue;
		}
		conn_t *c = agent_conn_find(a, &x->ids[i]);
		if (!c || !c->desc.have)
			continue;
		if (node_fill(&v->nodes[v->n_nodes++], h, c->info.host, c->info.port,
			      c->info.mem_bytes, c->desc.mem_avail, c->info.cores, c->info.rdma,
			      &c->desc))
			goto err;
	}
	return v;
err:
	plan_view_free(v);
	return NULL;
}

/* ---- plans: the core's actions ------------------------------------------------------------- */

static void core_plan_of(const plan_t *p, core_plan_t *cp)
{
	memset(cp, 0, sizeof *cp);
	snprintf(cp->hash, sizeof cp->hash, "%s", plan_hash(p));
	cp->epoch = plan_epoch(p);
	for (int r = 0; r < plan_n_ranks(p) && r < CORE_MAX_RANKS; r++)
		if (disc_id_parse(plan_rank(p, r)->node_id, &cp->ranks[cp->n]) == 0)
			cp->n++;
}

/* The planner: plan the nodes the core names (x->ids, epoch x->epoch). */
static void make_plan(agent_t *a, const core_action_t *x)
{
	char err[1024];
	core_event_t ev = {.type = CORE_EV_PLAN_FAILED, .text = err};
	plan_t *p = NULL;
	plan_view_t *v = NULL;
	if (!a->have_pmodel) {
		snprintf(err, sizeof err, "this node has no model file yet");
		if (!a->cfg.model ||
		    agent_plan_model_gguf(a->cfg.model, &a->pmodel, err, sizeof err))
			goto out;
		a->have_pmodel = 1;
	}
	if (!(v = view_build(a, x))) {
		snprintf(err, sizeof err, "out of memory");
		goto out;
	}
	plan_opts_t o;
	plan_opts_default(&o);
	o.ctx = a->cfg.ctx;
	o.kv_bytes = eng_kv_elem_bytes(a->cfg.kv_type); /* checked when the flag was parsed */
	o.base_port = a->cfg.port + 1 > 65535 - PLAN_MAX_NODES ? 0 : a->cfg.port + 1;
	if (plan_make(&p, v, &a->pmodel, &o, err, sizeof err))
		goto out;
	char *text = plan_to_json(p);
	if (!text) {
		snprintf(err, sizeof err, "out of memory");
		goto out;
	}
	free(a->made_text);
	a->made_text = text;
	plan_free(a->made);
	a->made = p;
	p = NULL;
	LOG(LOG_INFO, "plan %s made for %d ranks (%s: %s)", plan_hash(a->made),
	    plan_n_ranks(a->made), plan_strategy_name(plan_strategy(a->made)),
	    plan_reason(a->made));
	core_plan_t cp;
	core_plan_of(a->made, &cp);
	ev = (core_event_t){.type = CORE_EV_PLAN_MADE, .plan = &cp};
	agent_core_feed(a, &ev);
	plan_view_free(v);
	return;
out:
	plan_view_free(v);
	plan_free(p);
	LOG(LOG_ERROR, "plan: %s", err);
	agent_core_feed(a, &ev);
}

/* Takes a copy of the plan the core just accepted (received, or made here). */
static void pending_sync(agent_t *a, const plan_t *cand)
{
	const core_plan_t *cp = core_pending(a->core);
	if (!cp) /* accepted and already moved on to start (START_SESSION is queued) */
		cp = core_plan(a->core);
	if (!cp || (a->pending && !strcmp(plan_hash(a->pending), cp->hash)) ||
	    (a->plan && !strcmp(plan_hash(a->plan), cp->hash)))
		return;
	if (!cand && a->made && !strcmp(plan_hash(a->made), cp->hash))
		cand = a->made;
	if (!cand || strcmp(plan_hash(cand), cp->hash))
		return;
	char *text = plan_to_json(cand), err[256];
	plan_t *copy = NULL;
	if (text && plan_from_json(&copy, text, err, sizeof err) == 0) {
		plan_free(a->pending);
		a->pending = copy;
	}
	free(text);
}

static void send_ack(agent_t *a, const core_action_t *x)
{
	conn_t *c = agent_conn_find(a, &x->to);
	if (!c)
		return;
	json_t *o = json_pack("{s:s,s:s,s:s,s:I}", "hash", x->hash, "state", core_ack_name(x->ack),
			      "error", x->text, "epoch", (json_int_t)x->epoch);
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (s)
		agent_send(a, c, AGENT_MSG_ACK, s, strlen(s));
	free(s);
}

static void start_session(agent_t *a, const core_action_t *x)
{
	char err[512] = "";
	if (!a->pending || strcmp(plan_hash(a->pending), x->hash)) {
		snprintf(err, sizeof err, "plan %s is not at hand", x->hash);
	} else {
		plan_free(a->plan);
		a->plan = a->pending;
		a->pending = NULL;
		a->sess_ready = 0;
		LOG(LOG_INFO,
		    "plan %s: epoch %llu, %d ranks, %s, this node is rank %d; files in %s",
		    plan_hash(a->plan), (unsigned long long)plan_epoch(a->plan),
		    plan_n_ranks(a->plan), plan_strategy_name(plan_strategy(a->plan)), x->rank,
		    a->cfg.state_dir);
		web_event(a->web, "replan", "plan %s: %d ranks, %s; this node is rank %d",
			  plan_hash(a->plan), plan_n_ranks(a->plan),
			  plan_strategy_name(plan_strategy(a->plan)), x->rank);
		if (agent_plan_write_files(a->plan, a->cfg.state_dir, 0, err, sizeof err) == 0)
			a->sess = session_start(a, a->plan, x->rank, err, sizeof err);
	}
	if (!a->sess) {
		LOG(LOG_ERROR, "plan %s: %s", x->hash, err);
		core_event_t ev = {.type = CORE_EV_SESSION_DONE, .text = err};
		agent_core_feed(a, &ev);
	}
}

void agent_plan_hook(agent_t *a, const char *hash, int in_force)
{
	LOG(LOG_INFO, "plan %s: %s", hash, in_force ? "in force" : "no longer in force");
	(void)a;
}

void agent_core_feed(agent_t *a, const core_event_t *ev)
{
	core_step(a->core, now_ms(), ev);
	core_action_t x;
	while (core_next_action(a->core, &x)) {
		conn_t *c = NULL;
		pending_sync(a, NULL);
		switch (x.type) {
		case CORE_ACT_MAKE_PLAN: make_plan(a, &x); break;
		case CORE_ACT_SEND_PLAN:
			if (a->made_text && !strcmp(plan_hash(a->made), x.hash) &&
			    (c = agent_conn_find(a, &x.to)))
				agent_send(a, c, AGENT_MSG_PLAN, a->made_text,
					   strlen(a->made_text));
			break;
		case CORE_ACT_EXCLUDE:
			if ((c = agent_conn_find(a, &x.to)))
				agent_send(a, c, AGENT_MSG_EXCLUDED, x.text, strlen(x.text));
			break;
		case CORE_ACT_ACK: send_ack(a, &x); break;
		case CORE_ACT_START_SESSION: start_session(a, &x); break;
		case CORE_ACT_STOP_SESSION: session_stop(a->sess); break;
		case CORE_ACT_PLAN_IN_FORCE: agent_plan_hook(a, x.hash, 1); break;
		case CORE_ACT_PLAN_GONE: agent_plan_hook(a, x.hash, 0); break;
		}
	}
}

/* The election's leader and epoch, when they moved (called after every election input). */
void agent_core_leader(agent_t *a)
{
	disc_id_t l;
	if (!elec_leader(a->elec, &l))
		memset(&l, 0, sizeof l);
	uint64_t e = elec_epoch(a->elec);
	if (!disc_id_cmp(&l, &a->core_leader) && e == a->core_epoch &&
	    elec_max_epoch(a->elec) == a->core_max_epoch)
		return;
	a->core_max_epoch = elec_max_epoch(a->elec);
	a->core_leader = l;
	a->core_epoch = e;
	core_event_t ev = {
	    .type = CORE_EV_LEADER, .id = l, .epoch = e, .max_epoch = elec_max_epoch(a->elec)};
	agent_core_feed(a, &ev);
}

static void on_plan(agent_t *a, conn_t *c, const uint8_t *p, size_t len)
{
	char err[512];
	plan_t *pl = NULL;
	char *s = malloc(len + 1);
	if (!s)
		return;
	memcpy(s, p, len);
	s[len] = 0;
	int rc = plan_from_json(&pl, s, err, sizeof err);
	free(s);
	core_event_t ev = {.type = CORE_EV_PLAN_BAD, .id = c->id, .text = err};
	core_plan_t cp;
	if (!rc) {
		core_plan_of(pl, &cp);
		ev = (core_event_t){.type = CORE_EV_PLAN, .id = c->id, .plan = &cp};
	}
	core_step(a->core, now_ms(), &ev);
	pending_sync(a, pl); /* before the actions: START_SESSION takes a->pending */
	ev = (core_event_t){.type = CORE_EV_TICK};
	agent_core_feed(a, &ev);
	plan_free(pl);
}

int agent_cluster_msg(agent_t *a, conn_t *c, uint16_t type, const uint8_t *p, size_t len)
{
	char h[DISC_ID_HEX];
	disc_id_hex(&c->id, h);
	core_event_t ev = {.id = c->id};
	switch (type) {
	case AGENT_MSG_NODE:
		if (node_parse(&c->desc, p, len)) {
			LOG(LOG_WARN, "agent: node %.8s sent a malformed description", h);
			return SH_EFORMAT;
		}
		ev.type = CORE_EV_MEMBER_DESC;
		ev.model = c->desc.model_hash;
		ev.model_size = c->desc.model_size;
		agent_core_feed(a, &ev);
		return 0;
	case AGENT_MSG_PLAN: on_plan(a, c, p, len); return 0;
	case AGENT_MSG_ACK: {
		json_error_t je;
		json_t *o = json_loadb((const char *)p, len, 0, &je);
		const char *hs = json_string_value(json_object_get(o, "hash"));
		const char *st = json_string_value(json_object_get(o, "state"));
		const char *er = json_string_value(json_object_get(o, "error"));
		if (!hs || !st || strlen(hs) >= CORE_HASH_MAX) {
			json_decref(o);
			return SH_EFORMAT;
		}
		LOG(LOG_DEBUG, "plan %s: node %.8s %s", hs, h, st);
		ev.type = CORE_EV_ACK;
		ev.hash = hs;
		ev.ack = core_ack_parse(st);
		ev.text = er ? er : "";
		json_t *ep = json_object_get(o, "epoch"); /* optional: older nodes do not say */
		if (json_is_integer(ep) && json_integer_value(ep) > 0)
			ev.epoch = (uint64_t)json_integer_value(ep);
		agent_core_feed(a, &ev);
		json_decref(o);
		return 0;
	}
	case AGENT_MSG_EXCLUDED: {
		char why[200];
		snprintf(why, sizeof why, "%.*s", (int)MIN(len, sizeof why - 1), (const char *)p);
		for (char *q = why; *q; q++)
			if ((unsigned char)*q < 32)
				*q = ' ';
		ev.type = CORE_EV_EXCLUDED;
		ev.text = why;
		agent_core_feed(a, &ev);
		return 0;
	}
	}
	return 0;
}

/* ---- the published state -------------------------------------------------------------------- */

static json_t *member_obj(agent_t *a, const char *id, const char *name, const char *addr,
			  int http_port, const char *role, int rank, const char *state,
			  uint64_t mem, const char *rdma)
{
	char ap[96];
	snprintf(ap, sizeof ap, strchr(addr, ':') ? "[%s]:%d" : "%s:%d", addr, http_port);
	const char *standby = NULL; /* left out of the plan on purpose (the cost model's choice) */
	for (int i = 0; a->plan && rank < 0 && i < plan_n_standby(a->plan); i++)
		if (!strcmp(plan_standby(a->plan, i)->node_id, id))
			standby = plan_standby(a->plan, i)->reason;
	if (standby && strcmp(role, "leader"))
		role = "standby";
	json_t *m =
	    json_pack("{s:s,s:s,s:s,s:s,s:s,s:b,s:I}", "id", id, "name", name, "addr", ap, "role",
		      role, "state", state, "healthy", 1, "mem_total", (json_int_t)mem);
	json_object_set_new(m, "rank", rank >= 0 ? json_integer(rank) : json_null());
	if (standby)
		json_object_set_new(m, "standby_reason", json_string(standby));
	const plan_rank_t *pr = a->plan && rank >= 0 ? plan_rank(a->plan, rank) : NULL;
	json_object_set_new(m, "mem_model", json_integer(pr ? (json_int_t)pr->weight_bytes : 0));
	if (pr) { /* what this rank holds, half-open ranges (the dashboard's topology) */
		json_t *h = json_pack("{s:[i,i], s:[i,i], s:[i,i], s:[i,i]}", "layers", pr->layer0,
				      pr->layer1, "heads", pr->q0, pr->q1, "kv_heads", pr->kv0,
				      pr->kv1, "ffn", pr->ffn0, pr->ffn1);
		if (h && a->pmodel.n_experts)
			json_object_set_new(h, "experts", json_pack("[i,i]", pr->exp0, pr->exp1));
		json_object_set_new(m, "holds", h);
	}
	json_t *rd = json_array();
	char tmp[256];
	snprintf(tmp, sizeof tmp, "%s", rdma ? rdma : "");
	char *save = NULL;
	for (char *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(t, ':');
		if (colon)
			*colon = 0;
		json_array_append_new(rd, json_string(t));
	}
	json_object_set_new(m, "rdma", rd);
	return m;
}

/* The /v1/cluster document (docs/api.md), as this node sees it. */
static char *cluster_json(agent_t *a, const char *state)
{
	disc_id_t l; /* the node that plans and serves the API (rank 0) */
	char lh[DISC_ID_HEX] = "";
	int have = core_planner(a->core, &l);
	if (have)
		disc_id_hex(&l, lh);
	json_t *o = json_object(), *ms = json_array(), *links = json_array();
	json_object_set_new(o, "state", json_string(state));
	json_object_set_new(o, "leader", have ? json_string(lh) : json_null());
	json_object_set_new(o, "self", json_string(a->self_hex));
	node_desc_t me;
	self_desc(a, &me);
	const char *self_addr = me.ip[0];
	for (int i = 0; i < me.naddrs; i++)
		if (strchr(me.ip[i], '.')) {
			self_addr = me.ip[i];
			break;
		}
	int myrank = a->plan ? plan_rank_of(a->plan, a->self_hex) : -1;
	json_array_append_new(ms,
			      member_obj(a, a->self_hex, a->facts.hostname, self_addr, me.http_port,
					 have && !strcmp(lh, a->self_hex) ? "leader" : "follower",
					 myrank, agent_state_name(core_state(a->core)),
					 a->facts.mem_bytes, a->facts.rdma));
	for (int i = 0; i < a->nconns; i++) {
		conn_t *c = &a->conns[i];
		char h[DISC_ID_HEX];
		disc_id_hex(&c->id, h);
		int r = a->plan ? plan_rank_of(a->plan, h) : -1;
		const char *ex = core_member_excluded(a->core, &c->id);
		const char *st = ex && ex[0] ? "excluded" : "member";
		core_ack_t ack = core_member_ack(a->core, &c->id);
		if (a->plan && r >= 0 && ack != CORE_ACK_NONE)
			st = core_ack_name(ack);
		json_array_append_new(ms, member_obj(a, h, c->info.host, c->addr, c->desc.http_port,
						     have && !strcmp(lh, h) ? "leader" : "follower",
						     r, st, c->info.mem_bytes, c->info.rdma));
	}
	json_object_set_new(o, "members", ms);
	json_object_set_new(o, "epoch", json_integer((json_int_t)elec_epoch(a->elec)));
	if (a->plan) {
		int n = plan_n_ranks(a->plan);
		json_t *shares = json_array(), *experts = json_array();
		int ffn = 0;
		for (int r = 0; r < n; r++)
			ffn += plan_rank(a->plan, r)->ffn1 - plan_rank(a->plan, r)->ffn0;
		for (int r = 0; r < n; r++) {
			const plan_rank_t *pr = plan_rank(a->plan, r);
			int pipe = plan_strategy(a->plan) == PLAN_PIPELINE;
			double sh = pipe ? (double)(pr->layer1 - pr->layer0) /
					       MAX(a->pmodel.n_layers, pr->layer1)
					 : (double)(pr->ffn1 - pr->ffn0) / MAX(ffn, 1);
			json_array_append_new(shares, json_real(sh));
			if (a->pmodel.n_experts && experts) /* MoE: each rank's routed experts */
				json_array_append_new(experts,
						      json_pack("[i,i]", pr->exp0, pr->exp1));
			for (int k = r + 1; k < n; k++) {
				const plan_rank_t *pk = plan_rank(a->plan, k);
				const char *dev = pr->rdma[k];
				json_t *lk =
				    json_pack("{s:s,s:s,s:s}", "a", pr->node_id, "b", pk->node_id,
					      "kind", dev[0] ? "rdma" : "tcp");
				if (dev[0])
					json_object_set_new(lk, "dev", json_string(dev));
				json_array_append_new(links, lk);
			}
		}
		const char *name = a->cfg.model ? strrchr(a->cfg.model, '/') : NULL;
		name = name ? name + 1 : a->cfg.model ? a->cfg.model : "";
		json_object_set_new(o, "plan",
				    json_pack("{s:s,s:i,s:o,s:s,s:i,s:i,s:s,s:I}", "strategy",
					      plan_strategy_name(plan_strategy(a->plan)), "ranks",
					      n, "shares", shares, "model", name, "layers",
					      a->pmodel.n_layers, "n_ctx", plan_ctx(a->plan),
					      "hash", plan_hash(a->plan), "epoch",
					      (json_int_t)plan_epoch(a->plan)));
		json_t *po = json_object_get(o, "plan");
		if (po)
			json_object_set_new(po, "reason", json_string(plan_reason(a->plan)));
		const plan_pred_t *pd = plan_predicted(a->plan); /* from measured links only */
		if (po && pd && pd->decode_dtok)
			json_object_set_new(po, "predicted_decode_tok_s",
					    json_real((double)pd->decode_dtok / 10.0));
		if (po && json_array_size(experts))
			json_object_set(po, "experts", experts);
		json_decref(experts);
	} else
		json_object_set_new(o, "plan", json_null());
	json_object_set_new(o, "links", links);
	char *s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return s;
}

/* ---- the tick ------------------------------------------------------------------------------- */

_Static_assert((int)CORE_HEALTH_SERVING == (int)WEB_SERVING &&
		   (int)CORE_HEALTH_FORMING == (int)WEB_FORMING &&
		   (int)CORE_HEALTH_LOADING == (int)WEB_LOADING &&
		   (int)CORE_HEALTH_REPLANNING == (int)WEB_REPLANNING,
	       "core_health_t and enum web_state name the same states");

/* Followers (and the excluded) send API clients to the planner, which serves as rank 0. */
static void set_leader_url(agent_t *a)
{
	char url[128] = "";
	disc_id_t l;
	if (core_planner(a->core, &l) && disc_id_cmp(&l, &a->self)) {
		conn_t *c = agent_conn_find(a, &l);
		if (c && c->desc.have)
			snprintf(url, sizeof url,
				 strchr(c->addr, ':') ? "http://[%s]:%d" : "http://%s:%d", c->addr,
				 c->desc.http_port);
	}
	if (strcmp(url, a->leader_url)) {
		snprintf(a->leader_url, sizeof a->leader_url, "%s", url);
		if (a->web)
			web_set_leader(a->web, url[0] ? url : NULL);
		LOG(LOG_INFO, "api: %s", url[0] ? url : "served here (this node leads)");
	}
}

/* The session's phase, as events for the core. */
static void session_poll(agent_t *a)
{
	if (!a->sess)
		return;
	int ph = session_phase(a->sess);
	if (ph == SESSION_READY && !a->sess_ready) {
		a->sess_ready = 1;
		core_event_t ev = {.type = CORE_EV_SESSION_READY};
		agent_core_feed(a, &ev);
	} else if (ph == SESSION_DONE) {
		char e[256];
		snprintf(e, sizeof e, "%s", session_error(a->sess));
		session_free(a->sess);
		a->sess = NULL;
		if (e[0])
			web_event(a->web, "error", "session ended: %s", e);
		/* "STEP: rank N (ADDR) did not answer within MS ms": a rank that stalled while its
		 * channel stayed up (transport/group.c says it so) */
		const char *r = strstr(e, "rank ");
		int rank;
		if (r && strstr(e, " did not ") && sscanf(r, "rank %d (", &rank) == 1 && a->plan &&
		    rank > 0 && rank < plan_n_ranks(a->plan)) {
			core_event_t st = {.type = CORE_EV_RANK_STALLED};
			if (disc_id_parse(plan_rank(a->plan, rank)->node_id, &st.id) == 0)
				agent_core_feed(a, &st);
		}
		core_event_t ev = {.type = CORE_EV_SESSION_DONE, .text = e};
		agent_core_feed(a, &ev);
	}
}

void agent_cluster_tick(agent_t *a, int64_t now)
{
	if (strcmp(a->core_model, a->model_hash)) { /* a model arrived (model.c) */
		snprintf(a->core_model, sizeof a->core_model, "%s", a->model_hash);
		core_event_t ev = {
		    .type = CORE_EV_MODEL, .model = a->model_hash, .model_size = a->model_size};
		agent_core_feed(a, &ev);
	}
	session_poll(a);
	core_event_t ev = {.type = CORE_EV_TICK};
	agent_core_feed(a, &ev);
	set_leader_url(a);
	if (a->cfg.exec_cmd) { /* --exec (exec.c): the command runs while this node serves a plan */
		exec_cfg_t ec = {a->cfg.exec_cmd, a->cfg.exec_port, a->cfg.state_dir};
		int live = a->plan && core_state(a->core) == AGENT_SERVING;
		exec_sync(&a->exec, &ec, live ? a->plan : NULL,
			  live ? plan_rank_of(a->plan, a->self_hex) : -1, now);
	}
	/* publish health and the cluster document (at most every 250 ms unless the state moved) */
	char reason[200];
	int ws = (int)core_health(a->core, reason, sizeof reason);
	if (ws != WEB_SERVING && core_state(a->core) == AGENT_SETTLED && a->why[0])
		snprintf(reason, sizeof reason, "%s", a->why); /* the model transfer's news */
	if (a->web && a->plan && core_is_planner(a->core)) {
		web_set_rank_count(a->web, plan_n_ranks(a->plan));
		for (int r = 0; r < plan_n_ranks(a->plan); r++)
			web_set_rank_health(a->web, r, core_rank_up(a->core, r));
	}
	if (ws != a->pub_state || now - a->pub_ms >= 250 || strcmp(reason, a->pub_reason)) {
		a->pub_ms = now;
		agent_pub_set(a, ws, reason,
			      cluster_json(a, agent_state_name(core_state(a->core))));
	}
}

void agent_cluster_free(agent_t *a)
{
	exec_free(a->exec); /* --exec: the command's process group goes first */
	a->exec = NULL;
	if (a->sess) {
		session_stop(a->sess);
		session_free(a->sess);
		a->sess = NULL;
	}
	plan_free(a->pending);
	plan_free(a->plan);
	plan_free(a->made);
	free(a->made_text);
	a->pending = a->plan = a->made = NULL;
	a->made_text = NULL;
}
