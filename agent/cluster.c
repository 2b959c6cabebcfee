/*
 * cluster.c: from members to a running plan. Every node describes itself to every member once
 * (AGENT_MSG_NODE: addresses with interface names, API port, model content hash). The leader
 * builds a plan_view_t from itself and the members whose model matches its own, runs plan_make
 * once the set of plannable members has been stable for --replan-delay, and sends the plan JSON
 * to each of them (AGENT_MSG_PLAN); members it leaves out hear why (AGENT_MSG_EXCLUDED). Every
 * node in the plan (the leader too) verifies the hash, writes hostfile.json, mlx-hosts.json,
 * rdma-devices.json and plan.json into its state directory (the same bytes everywhere: they are
 * written from the one plan the leader sent), answers AGENT_MSG_ACK, and starts the plan's
 * session (serve.c) once the previous one has ended.
 *
 * Invariant: at most one session runs; a newer plan waits in a->pending until the old session
 * is DONE. Plans are accepted only from the node this node holds for leader. The state moves
 * only through agent_convert (agent.c), which logs old -> new.
 */
#include "agent/agent_int.h"
#include "agent/cli.h"
#include "common/common.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <jansson.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
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
	if (d.model_hash[0])
		json_object_set_new(
		    o, "model",
		    json_pack("{s:s,s:I}", "hash", d.model_hash, "size", (json_int_t)d.model_size));
	else
		json_object_set_new(o, "model", json_null());
	for (int i = 0; i < d.naddrs; i++)
		json_array_append_new(addrs,
				      json_pack("{s:s,s:s,s:s}", "ip", d.ip[i], "if", d.ifname[i],
						"kind", plan_link_name((plan_link_t)d.kind[i])));
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
			d->naddrs++;
		}
	}
	d->have = 1;
	rc = 0;
done:
	json_decref(o);
	return rc;
}

/* ---- the view (leader) ---------------------------------------------------------------------- */

/* Why member c cannot be planned now ("" = it can). */
static void plannable(agent_t *a, conn_t *c, char *why, size_t len)
{
	why[0] = 0;
	if (!c->desc.have || !c->info.version)
		snprintf(why, len, "its description has not arrived");
	else if (!c->desc.model_hash[0])
		snprintf(why, len, "it has no model yet (receiving it from the leader)");
	else if (strcmp(c->desc.model_hash, a->model_hash) || c->desc.model_size != a->model_size)
		snprintf(why, len,
			 "its model file differs from the leader's (hash %.12s, %llu bytes; the "
			 "leader's %.12s, %llu bytes)",
			 c->desc.model_hash, (unsigned long long)c->desc.model_size, a->model_hash,
			 (unsigned long long)a->model_size);
}

static int cmp_str(const void *x, const void *y)
{
	return strcmp((const char *)x, (const char *)y);
}

/* The sorted IDs of this node and every plannable member, comma-joined; tells excluded
 * members why (once per reason). */
static void members_sig(agent_t *a, char *sig, size_t len)
{
	static char ids[PLAN_MAX_NODES][DISC_ID_HEX];
	int n = 0;
	memcpy(ids[n++], a->self_hex, DISC_ID_HEX);
	for (int i = 0; i < a->nconns && n < PLAN_MAX_NODES; i++) {
		conn_t *c = &a->conns[i];
		char why[160];
		plannable(a, c, why, sizeof why);
		if (!why[0]) {
			disc_id_hex(&c->id, ids[n++]);
			c->excluded[0] = 0;
			continue;
		}
		if (!c->desc.have || !strcmp(c->excluded, why))
			continue; /* not yet described, or already told */
		snprintf(c->excluded, sizeof c->excluded, "%s", why);
		char h[DISC_ID_HEX];
		disc_id_hex(&c->id, h);
		LOG(LOG_WARN, "plan: leaving node %.8s (%s) out: %s", h, c->addr, why);
		agent_send(a, c, AGENT_MSG_EXCLUDED, why, strlen(why));
	}
	qsort(ids, (size_t)n, sizeof ids[0], cmp_str);
	size_t off = 0;
	sig[0] = 0;
	for (int i = 0; i < n && off + DISC_ID_HEX + 1 < len; i++)
		off += (size_t)snprintf(sig + off, len - off, "%s%s", i ? "," : "", ids[i]);
}

static int node_fill(plan_node_t *pn, const char *idhex, const char *host, int port, uint64_t mem,
		     int cores, const char *rdma, const node_desc_t *d)
{
	snprintf(pn->node_id, sizeof pn->node_id, "%s", idhex);
	snprintf(pn->host, sizeof pn->host, "%s", host);
	pn->port = port;
	pn->mem_total = pn->mem_avail = mem;
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

/* The view of this node and its plannable members. */
static plan_view_t *view_build(agent_t *a)
{
	plan_view_t *v = calloc(1, sizeof *v);
	if (!v)
		return NULL;
	v->nodes = calloc(PLAN_MAX_NODES, sizeof *v->nodes);
	if (!v->nodes)
		goto err;
	struct timeval tv;
	gettimeofday(&tv, NULL);
	/* the epoch tags the group: a fresh one per plan, growing across leaders */
	v->epoch = (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
	node_desc_t me;
	self_desc(a, &me);
	if (node_fill(&v->nodes[v->n_nodes++], a->self_hex, a->facts.hostname, a->cfg.port,
		      a->facts.mem_bytes, a->facts.cores, a->facts.rdma, &me))
		goto err;
	for (int i = 0; i < a->nconns && v->n_nodes < PLAN_MAX_NODES; i++) {
		conn_t *c = &a->conns[i];
		char why[160], h[DISC_ID_HEX];
		plannable(a, c, why, sizeof why);
		if (why[0])
			continue;
		disc_id_hex(&c->id, h);
		if (node_fill(&v->nodes[v->n_nodes++], h, c->info.host, c->info.port,
			      c->info.mem_bytes, c->info.cores, c->info.rdma, &c->desc))
			goto err;
	}
	return v;
err:
	plan_view_free(v);
	return NULL;
}

/* ---- plans ---------------------------------------------------------------------------------- */

static void send_ack(agent_t *a, const char *hash, const char *state, const char *error)
{
	if (agent_is_leader(a))
		return;
	conn_t *c = agent_conn_find(a, &a->plan_leader);
	if (!c)
		return;
	json_t *o = json_pack("{s:s,s:s,s:s}", "hash", hash, "state", state, "error", error);
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (s)
		agent_send(a, c, AGENT_MSG_ACK, s, strlen(s));
	free(s);
}

static int write_plan_files(agent_t *a, const plan_t *p, char *err, size_t errlen)
{
	static const char *const names[] = {"hostfile.json", "mlx-hosts.json", "rdma-devices.json",
					    "plan.json"};
	char *(*const fns[])(const plan_t *) = {plan_hostfile_json, plan_mlx_hosts_json,
						plan_rdma_json, plan_to_json};
	int rc = 0;
	for (size_t i = 0; !rc && i < ARRAY_LEN(names); i++) {
		char path[4200];
		snprintf(path, sizeof path, "%s/%s", a->cfg.state_dir, names[i]);
		char *text = fns[i](p);
		if (!text)
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		rc = write_file_atomic(path, text, strlen(text), err, errlen);
		free(text);
	}
	return rc;
}

/* A plan from the leader (or made here): verify, check membership, write the files, queue it. */
static void plan_accept(agent_t *a, const char *text, size_t len)
{
	char err[512];
	plan_t *p = NULL;
	char *s = malloc(len + 1);
	if (!s)
		return;
	memcpy(s, text, len);
	s[len] = 0;
	int rc = plan_from_json(&p, s, err, sizeof err);
	free(s);
	if (rc) {
		LOG(LOG_ERROR, "plan: refused a plan from the leader: %s", err);
		send_ack(a, "", "failed", err);
		return;
	}
	if ((a->plan && a->sess && !strcmp(plan_hash(a->plan), plan_hash(p))) ||
	    (a->pending && !strcmp(plan_hash(a->pending), plan_hash(p)))) {
		plan_free(p); /* a repeat of the plan we run */
		return;
	}
	int rank = plan_rank_of(p, a->self_hex);
	if (rank < 0) {
		LOG(LOG_WARN, "plan %s: this node is not in it (%d ranks)", plan_hash(p),
		    plan_n_ranks(p));
		snprintf(a->why, sizeof a->why, "not in the leader's plan");
		plan_free(p);
		return;
	}
	if (write_plan_files(a, p, err, sizeof err)) {
		LOG(LOG_ERROR, "plan %s: %s", plan_hash(p), err);
		send_ack(a, plan_hash(p), "failed", err);
		plan_free(p);
		return;
	}
	LOG(LOG_INFO, "plan %s: epoch %llu, %d ranks, %s, this node is rank %d; files in %s",
	    plan_hash(p), (unsigned long long)plan_epoch(p), plan_n_ranks(p),
	    plan_strategy_name(plan_strategy(p)), rank, a->cfg.state_dir);
	plan_free(a->pending);
	a->pending = p;
	if (a->sess)
		session_stop(a->sess);
	agent_convert(a, AGENT_PLANNED, "plan received");
	send_ack(a, plan_hash(p), "planned", "");
}

/* The leader: plan the plannable members and send the plan to each. */
static void leader_plan(agent_t *a, int64_t now)
{
	char err[1024];
	if (!a->model_hash[0]) {
		if (now - a->no_plan_log_ms > 10000) {
			a->no_plan_log_ms = now;
			LOG(LOG_WARN, "plan: this node leads but has no model yet: it fetches one "
				      "from a member that has it, then plans");
		}
		snprintf(a->why, sizeof a->why, "the leader has no model");
		return;
	}
	if (!a->have_pmodel) {
		if (cli_plan_model_gguf(a->cfg.model, &a->pmodel, err, sizeof err)) {
			if (now - a->no_plan_log_ms > 10000) {
				a->no_plan_log_ms = now;
				LOG(LOG_ERROR, "plan: %s", err);
			}
			snprintf(a->why, sizeof a->why, "cannot read the model: %.150s", err);
			return;
		}
		a->have_pmodel = 1;
	}
	plan_view_t *v = view_build(a);
	if (!v)
		return;
	plan_opts_t o;
	plan_opts_default(&o);
	o.ctx = a->cfg.ctx;
	o.base_port = a->cfg.port + 1 > 65535 - PLAN_MAX_NODES ? 0 : a->cfg.port + 1;
	plan_t *p = NULL;
	int rc = plan_make(&p, v, &a->pmodel, &o, err, sizeof err);
	plan_view_free(v);
	if (rc) {
		if (now - a->no_plan_log_ms > 5000) {
			a->no_plan_log_ms = now;
			LOG(LOG_ERROR, "plan: %s", err);
		}
		snprintf(a->why, sizeof a->why, "no plan: %.180s", err);
		return;
	}
	char *text = plan_to_json(p);
	if (!text) {
		plan_free(p);
		return;
	}
	snprintf(a->planned_sig, sizeof a->planned_sig, "%s", a->want_sig);
	for (int r = 0; r < plan_n_ranks(p); r++) {
		disc_id_t id;
		conn_t *c;
		if (disc_id_parse(plan_rank(p, r)->node_id, &id) == 0 &&
		    (c = agent_conn_find(a, &id)) != NULL) {
			c->ack_hash[0] = c->ack_state[0] = 0;
			snprintf(c->sent_hash, sizeof c->sent_hash, "%s", plan_hash(p));
			agent_send(a, c, AGENT_MSG_PLAN, text, strlen(text));
		}
	}
	LOG(LOG_INFO, "plan %s made for %d ranks (%s: %s)", plan_hash(p), plan_n_ranks(p),
	    plan_strategy_name(plan_strategy(p)), plan_reason(p));
	plan_accept(a, text, strlen(text));
	free(text);
	plan_free(p);
}

int agent_cluster_msg(agent_t *a, conn_t *c, uint16_t type, const uint8_t *p, size_t len)
{
	char h[DISC_ID_HEX];
	disc_id_hex(&c->id, h);
	switch (type) {
	case AGENT_MSG_NODE:
		if (node_parse(&c->desc, p, len)) {
			LOG(LOG_WARN, "agent: node %.8s sent a malformed description", h);
			return SH_EFORMAT;
		}
		return 0;
	case AGENT_MSG_PLAN: {
		disc_id_t l;
		if (!elec_leader(a->elec, &l) || disc_id_cmp(&l, &c->id)) {
			LOG(LOG_INFO, "plan: ignoring a plan from %.8s, which is not our leader",
			    h);
			return 0;
		}
		a->plan_leader = l;
		plan_accept(a, (const char *)p, len);
		return 0;
	}
	case AGENT_MSG_ACK: {
		json_error_t je;
		json_t *o = json_loadb((const char *)p, len, 0, &je);
		const char *hs = json_string_value(json_object_get(o, "hash"));
		const char *st = json_string_value(json_object_get(o, "state"));
		const char *er = json_string_value(json_object_get(o, "error"));
		if (!hs || !st) {
			json_decref(o);
			return SH_EFORMAT;
		}
		snprintf(c->ack_hash, sizeof c->ack_hash, "%s", hs);
		snprintf(c->ack_state, sizeof c->ack_state, "%s", st);
		if (!strcmp(st, "failed")) {
			LOG(LOG_WARN, "plan %s: node %.8s failed: %s", hs, h, er ? er : "?");
			if (agent_is_leader(a) && a->plan && !strcmp(hs, plan_hash(a->plan))) {
				a->planned_sig[0] = 0; /* plan again, after a pause */
				a->retry_ms = now_ms() + 1000;
			}
		} else
			LOG(LOG_DEBUG, "plan %s: node %.8s %s", hs, h, st);
		json_decref(o);
		return 0;
	}
	case AGENT_MSG_EXCLUDED: {
		char why[200];
		snprintf(why, sizeof why, "%.*s", (int)MIN(len, sizeof why - 1), (const char *)p);
		for (char *q = why; *q; q++)
			if ((unsigned char)*q < 32)
				*q = ' ';
		if (strcmp(a->why, why))
			LOG(LOG_WARN, "plan: the leader leaves this node out: %s", why);
		snprintf(a->why, sizeof a->why, "%s", why);
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
	json_t *m =
	    json_pack("{s:s,s:s,s:s,s:s,s:s,s:b,s:I}", "id", id, "name", name, "addr", ap, "role",
		      role, "state", state, "healthy", 1, "mem_total", (json_int_t)mem);
	json_object_set_new(m, "rank", rank >= 0 ? json_integer(rank) : json_null());
	const plan_rank_t *pr = a->plan && rank >= 0 ? plan_rank(a->plan, rank) : NULL;
	json_object_set_new(m, "mem_model", json_integer(pr ? (json_int_t)pr->weight_bytes : 0));
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
	disc_id_t l;
	char lh[DISC_ID_HEX] = "";
	int have = elec_leader(a->elec, &l);
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
	json_array_append_new(
	    ms, member_obj(a, a->self_hex, a->facts.hostname, self_addr, me.http_port,
			   have && !strcmp(lh, a->self_hex) ? "leader" : "follower", myrank,
			   agent_state_name(a->state), a->facts.mem_bytes, a->facts.rdma));
	for (int i = 0; i < a->nconns; i++) {
		conn_t *c = &a->conns[i];
		char h[DISC_ID_HEX];
		disc_id_hex(&c->id, h);
		int r = a->plan ? plan_rank_of(a->plan, h) : -1;
		const char *st = c->excluded[0] ? "excluded" : "member";
		if (a->plan && r >= 0 && c->ack_state[0] &&
		    !strcmp(c->ack_hash, plan_hash(a->plan)))
			st = c->ack_state;
		json_array_append_new(ms, member_obj(a, h, c->info.host, c->addr, c->desc.http_port,
						     have && !strcmp(lh, h) ? "leader" : "follower",
						     r, st, c->info.mem_bytes, c->info.rdma));
	}
	json_object_set_new(o, "members", ms);
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

static void set_leader_url(agent_t *a)
{
	char url[128] = "";
	disc_id_t l;
	if (elec_leader(a->elec, &l) && disc_id_cmp(&l, &a->self)) {
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

static void sessions_step(agent_t *a, int64_t now)
{
	if (a->sess && session_phase(a->sess) == SESSION_DONE) {
		char e[256], hash[20] = "";
		snprintf(e, sizeof e, "%s",
			 session_error(a->sess)); /* the session is freed below */
		if (a->plan)
			snprintf(hash, sizeof hash, "%s", plan_hash(a->plan));
		if (e[0] && !a->pending) {
			LOG(LOG_WARN, "plan %s: session ended: %s", hash, e);
			snprintf(a->why, sizeof a->why, "%.190s", e);
			send_ack(a, hash, "failed", e);
			if (agent_is_leader(a)) {
				a->planned_sig[0] = 0;
				a->retry_ms = now + 1000;
			}
		}
		session_free(a->sess);
		a->sess = NULL;
		if (!a->pending)
			agent_convert(a, AGENT_SETTLED, e[0] ? "session failed" : "session ended");
	}
	if (a->pending && !a->sess) {
		char err[256];
		plan_free(a->plan);
		a->plan = a->pending;
		a->pending = NULL;
		int rank = plan_rank_of(a->plan, a->self_hex);
		a->sess = session_start(a, a->plan, rank, err, sizeof err);
		if (!a->sess) {
			LOG(LOG_ERROR, "plan %s: %s", plan_hash(a->plan), err);
			send_ack(a, plan_hash(a->plan), "failed", err);
			agent_convert(a, AGENT_SETTLED, "session did not start");
		} else {
			agent_convert(a, AGENT_LOADING, "forming the group");
			send_ack(a, plan_hash(a->plan), "loading", "");
		}
	}
	if (a->sess && a->state == AGENT_LOADING && session_phase(a->sess) == SESSION_READY) {
		agent_convert(a, AGENT_SERVING,
			      agent_is_leader(a) ? "serving the API" : "computing");
		a->served_once = 1;
		a->why[0] = 0;
		send_ack(a, plan_hash(a->plan), "serving", "");
	}
}

void agent_cluster_tick(agent_t *a, int64_t now)
{
	disc_id_t l;
	int have = elec_leader(a->elec, &l);
	/* a new leader: the old plan's session is over (no leader for a moment changes nothing) */
	if (have && disc_id_cmp(&l, &a->plan_leader)) {
		if (a->sess)
			session_stop(a->sess);
		plan_free(a->pending);
		a->pending = NULL;
		a->plan_leader = l;
		a->planned_sig[0] = 0;
		a->want_sig[0] = 0;
		if (a->state > AGENT_SETTLED)
			agent_convert(a, AGENT_SETTLED, "leader changed");
	}
	/* the leader: a member of the current plan that (re)joined gets the plan again (a repeat
	 * of the plan a member runs is ignored there) */
	const plan_t *cur = a->pending ? a->pending : a->plan;
	if (have && agent_is_leader(a) && cur && !strcmp(a->want_sig, a->planned_sig)) {
		char *text = NULL;
		for (int i = 0; i < a->nconns; i++) {
			conn_t *c = &a->conns[i];
			char h[DISC_ID_HEX];
			disc_id_hex(&c->id, h);
			if (plan_rank_of(cur, h) < 0 || !strcmp(c->sent_hash, plan_hash(cur)))
				continue;
			if (!text && !(text = plan_to_json(cur)))
				break;
			snprintf(c->sent_hash, sizeof c->sent_hash, "%s", plan_hash(cur));
			agent_send(a, c, AGENT_MSG_PLAN, text, strlen(text));
		}
		free(text);
	}
	if (have) {
		set_leader_url(a);
		if (agent_is_leader(a)) {
			char sig[sizeof a->want_sig];
			members_sig(a, sig, sizeof sig);
			if (strcmp(sig, a->want_sig)) {
				snprintf(a->want_sig, sizeof a->want_sig, "%s", sig);
				a->change_ms = now;
				if (a->planned_sig[0])
					LOG(LOG_INFO,
					    "plan: members changed; re-planning in %lld ms",
					    (long long)a->cfg.replan_delay_ms);
			}
			int first = !a->planned_sig[0]; /* no plan of this leader yet */
			int64_t delay = first ? 0 : a->cfg.replan_delay_ms;
			/* a member's description follows its handshake at once: wait for it (a
			 * little) rather than plan without the member and re-plan right after */
			int waiting = 0;
			for (int i = 0; i < a->nconns; i++)
				waiting |=
				    !a->conns[i].desc.have && now - a->conns[i].joined_ms < 1000;
			if (!waiting && strcmp(a->want_sig, a->planned_sig) &&
			    now - a->change_ms >= delay && now >= a->retry_ms)
				leader_plan(a, now);
		}
	}
	sessions_step(a, now);
	/* publish health and the cluster document (at most every 250 ms unless the state moved) */
	int ws;
	const char *reason;
	switch (a->state) {
	case AGENT_SERVING: ws = WEB_SERVING, reason = ""; break;
	case AGENT_LOADING: ws = WEB_LOADING, reason = "loading the model share"; break;
	case AGENT_PLANNED:
		ws = a->served_once ? WEB_REPLANNING : WEB_LOADING, reason = "plan received";
		break;
	case AGENT_SETTLED:
		ws = a->served_once ? WEB_REPLANNING : WEB_FORMING;
		reason = a->why[0] ? a->why : "waiting for a plan";
		break;
	default: ws = a->served_once ? WEB_REPLANNING : WEB_FORMING, reason = "waiting for peers";
	}
	if (ws != a->pub_state || now - a->pub_ms >= 250 || strcmp(reason, a->pub_reason)) {
		a->pub_ms = now;
		agent_pub_set(a, ws, reason, cluster_json(a, agent_state_name(a->state)));
	}
}

void agent_cluster_free(agent_t *a)
{
	if (a->sess) {
		session_stop(a->sess);
		session_free(a->sess);
		a->sess = NULL;
	}
	plan_free(a->pending);
	plan_free(a->plan);
	a->pending = a->plan = NULL;
}
