/*
 * status.c: the agent's status socket (STATE_DIR/agent.sock; publish.h). A client connects, the
 * agent writes one JSON object (this node, the leader, the view epoch, the members with their
 * addresses and interfaces) and closes; `shoal status` is that client.
 *
 * Invariant: answering never blocks the loop for long: the socket is accepted non-blocking and
 * written with a 1 s send timeout; the JSON is small (<= 64 members).
 */
#include "agent/publish.h"
#include "common/common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* This host's first non-loopback IPv4 address and its interface (for the member table). */
static void self_addr(char *addr, size_t alen, char *ifn, size_t ilen)
{
	struct ifaddrs *ifs = NULL, *it;
	snprintf(addr, alen, "-");
	snprintf(ifn, ilen, "-");
	if (getifaddrs(&ifs) != 0)
		return;
	for (it = ifs; it; it = it->ifa_next) {
		if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET ||
		    !strcmp(it->ifa_name, "lo"))
			continue;
		inet_ntop(AF_INET, &((struct sockaddr_in *)it->ifa_addr)->sin_addr, addr,
			  (socklen_t)alen);
		snprintf(ifn, ilen, "%s", it->ifa_name);
		break;
	}
	freeifaddrs(ifs);
}

static const char *role_of(const pub_src_t *a, const disc_id_t *id)
{
	disc_id_t l;
	if (!elec_leader(members_election(a->members), &l))
		return "-";
	return disc_id_cmp(&l, id) ? "follower" : "leader";
}

static json_t *member_json(const pub_src_t *a, const disc_id_t *id)
{
	char h[DISC_ID_HEX];
	disc_id_hex(id, h);
	json_t *o = json_object();
	json_object_set_new(o, "node_id", json_string(h));
	if (!strcmp(h, a->self_hex)) {
		char addr[DISC_ADDR_MAX], ifn[IF_NAMESIZE];
		self_addr(addr, sizeof addr, ifn, sizeof ifn);
		json_object_set_new(o, "host", json_string(a->facts->hostname));
		json_object_set_new(o, "address", json_string(addr));
		json_object_set_new(o, "interface", json_string(ifn));
		json_object_set_new(o, "mem", json_integer((json_int_t)a->facts->mem_bytes));
		json_object_set_new(o, "cores", json_integer(a->facts->cores));
		json_object_set_new(o, "rdma", json_string(a->facts->rdma));
		json_object_set_new(o, "port", json_integer(a->port));
		json_object_set_new(o, "self", json_true());
	} else {
		const member_t *c = members_find(a->members, id);
		const disc_peer_t *p = disc_table_find(members_sightings(a->members), id);
		const char *ifn = "-";
		if (p)
			for (int k = 0; k < p->naddrs; k++)
				if (c && !strcmp(p->addrs[k].addr, c->addr))
					ifn = p->addrs[k].ifname;
		if (p && !strcmp(ifn, "-") && p->naddrs)
			ifn = p->addrs[0].ifname;
		json_object_set_new(o, "host",
				    json_string(c && c->info.host[0] ? c->info.host
						: p                  ? p->host
								     : "-"));
		json_object_set_new(o, "address", json_string(c ? c->addr : "-"));
		json_object_set_new(o, "interface", json_string(ifn));
		json_object_set_new(o, "mem", json_integer(c ? (json_int_t)c->info.mem_bytes : 0));
		json_object_set_new(o, "cores", json_integer(c ? c->info.cores : 0));
		json_object_set_new(o, "rdma", json_string(c ? c->info.rdma : ""));
		json_object_set_new(o, "port", json_integer(c ? c->info.port : 0));
		json_object_set_new(o, "self", json_false());
		/* every address mDNS resolved, with its interface (the planner's RDMA matrix) */
		json_t *addrs = json_array();
		for (int k = 0; p && k < p->naddrs; k++) {
			json_t *ao = json_object();
			json_object_set_new(ao, "address", json_string(p->addrs[k].addr));
			json_object_set_new(ao, "interface", json_string(p->addrs[k].ifname));
			json_object_set_new(ao, "ifindex", json_integer(p->addrs[k].ifindex));
			json_array_append_new(addrs, ao);
		}
		json_object_set_new(o, "addresses", addrs);
	}
	json_object_set_new(o, "role", json_string(role_of(a, id)));
	int r = a->plan ? plan_rank_of(a->plan, h) : -1;
	if (r >= 0 && a->pmodel && a->pmodel->n_experts) { /* this member's routed experts [a, b) */
		const plan_rank_t *pr = plan_rank(a->plan, r);
		json_object_set_new(o, "experts", json_pack("[i,i]", pr->exp0, pr->exp1));
	}
	const char *ex = core_member_excluded(a->core, id); /* known on the planner */
	if (ex && ex[0])
		json_object_set_new(o, "excluded", json_string(ex));
	return o;
}

static char *status_json(const pub_src_t *a)
{
	const elec_t *el = members_election(a->members);
	disc_id_t l;
	char lh[DISC_ID_HEX] = "";
	if (elec_leader(el, &l))
		disc_id_hex(&l, lh);
	json_t *root = json_object();
	json_object_set_new(root, "node_id", json_string(a->self_hex));
	json_object_set_new(root, "state", json_string(agent_state_name(core_state(a->core))));
	json_object_set_new(root, "election", json_string(elec_state_name(elec_state(el))));
	json_object_set_new(root, "leader", lh[0] ? json_string(lh) : json_null());
	json_object_set_new(root, "epoch", json_integer((json_int_t)elec_epoch(el)));
	disc_id_t p;
	char ph[DISC_ID_HEX] = "", reason[200];
	if (core_planner(a->core, &p))
		disc_id_hex(&p, ph);
	json_object_set_new(root, "planner", ph[0] ? json_string(ph) : json_null());
	core_health(a->core, reason, sizeof reason);
	json_object_set_new(root, "reason", json_string(reason));
	const char *mm = core_majority_model(a->core);
	json_object_set_new(root, "majority_model", mm[0] ? json_string(mm) : json_null());
	json_object_set_new(root, "cluster_id", json_string(a->cid_hex));
	json_object_set_new(root, "port", json_integer(a->port));
	json_object_set_new(root, "http_port", json_integer(a->http_port));
	json_object_set_new(root, "model",
			    a->model_path ? json_string(a->model_path) : json_null());
	json_object_set_new(root, "mdns", json_string(members_mdns(a->members)));
	const char *where;
	int dup = members_duplicate(a->members, &where);
	json_object_set_new(root, "duplicate_id", json_boolean(dup));
	if (dup)
		json_object_set_new(root, "duplicate_at", json_string(where));
	/* the plan (its strategy, predictions, standby members) and the links as /v1/cluster
	 * says them (publish.c): `shoal status` prints the link matrix from these */
	char *cs = pub_agent_cluster(a);
	json_error_t je;
	json_t *cl = cs ? json_loads(cs, 0, &je) : NULL;
	free(cs);
	json_t *plan = json_object_get(cl, "plan");
	if (json_is_object(plan)) {
		json_t *sb = json_array(), *m;
		size_t k;
		json_array_foreach(json_object_get(cl, "members"), k,
				   m) if (json_is_string(json_object_get(m, "standby_reason")))
		    json_array_append_new(sb, json_pack("{s:O,s:O}", "node_id",
							json_object_get(m, "id"), "reason",
							json_object_get(m, "standby_reason")));
		json_object_set_new(plan, "standby", sb);
	}
	json_object_set(root, "plan", plan ? plan : json_null());
	json_object_set(root, "links",
			json_is_array(json_object_get(cl, "links")) ? json_object_get(cl, "links")
								    : json_array());
	json_decref(cl);
	json_t *arr = json_array();
	for (int i = 0; i < elec_member_count(el); i++)
		json_array_append_new(arr, member_json(a, elec_member_at(el, i)));
	json_object_set_new(root, "members", arr); /* last: scripts cut the object there */
	char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(root);
	return s;
}

void pub_status_serve(int lfd, const pub_src_t *a)
{
	int fd = accept(lfd, NULL, NULL);
	if (fd < 0)
		return;
	struct timeval tv = {1, 0};
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	char *s = status_json(a);
	if (s) {
		size_t len = strlen(s), off = 0;
		while (off < len) {
			ssize_t w = write(fd, s + off, len - off);
			if (w <= 0)
				break;
			off += (size_t)w;
		}
		if (write(fd, "\n", 1) != 1)
			LOG(LOG_DEBUG, "status: short write");
		free(s);
	}
	close(fd);
}

int pub_status_listen(const char *state_dir, char *path, char *errbuf, size_t errlen)
{
	if (agent_status_path(state_dir, path, SH_SUBPATH_MAX)) {
		sh_fail(errbuf, errlen, SH_EINVAL, "state dir path too long for a socket");
		return -1;
	}
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	memcpy(sa.sun_path, path, strlen(path) + 1); /* length checked by agent_status_path */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		sh_fail(errbuf, errlen, SH_EIO, "status socket: %s", strerror(errno));
		return -1;
	}
	/* a live agent answers on it: refuse to steal its socket */
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 || errno == EAGAIN) {
		close(fd);
		sh_fail(errbuf, errlen, SH_EBUSY,
			"another agent runs with state dir %s (%s answers)", state_dir, path);
		return -1;
	}
	close(fd);
	unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 8) != 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		sh_fail(errbuf, errlen, SH_EIO, "status socket %s: %s", path, strerror(e));
		return -1;
	}
	chmod(path, 0600); /* this user's alone (the agent's umask is 077 too) */
	return fd;
}

int agent_status_path(const char *state_dir, char *out, size_t len)
{
	int n = snprintf(out, len, "%s/agent.sock", state_dir);
	if (n < 0 || (size_t)n >= len || (size_t)n >= sizeof(((struct sockaddr_un *)0)->sun_path))
		return SH_EINVAL;
	return 0;
}
