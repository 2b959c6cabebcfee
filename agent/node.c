/*
 * node.c: a node's description and the agent's messages (node.h).
 *
 * Invariant: a parsed description holds only bounded, NUL-terminated strings and ports within
 * 0..65535; anything else in a peer's message makes it malformed (the member is dropped).
 */
#include "agent/node.h"
#include "common/common.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <jansson.h>
#include <math.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __APPLE__
#include <mach/mach.h>
#include <sys/sysctl.h>
#endif

/* ---- this host ------------------------------------------------------------------------------ */

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

void node_self_addrs(node_desc_t *d)
{
	d->naddrs = 0;
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

/* macOS: free, inactive and purgeable pages can be reclaimed, so what is neither wired, active
 * nor compressed is available. */
uint64_t node_mem_available(void)
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

/* Is addr (numeric) one of this host's own addresses? */
int node_is_local_addr(const char *addr)
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

/* ---- NODE ------------------------------------------------------------------------------------ */

char *node_desc_json(const node_desc_t *d)
{
	json_t *o = json_object(), *addrs = json_array();
	json_object_set_new(o, "v", json_integer(1));
	json_object_set_new(o, "http_port", json_integer(d->http_port));
	json_object_set_new(o, "sync_port", json_integer(d->sync_port));
	json_object_set_new(o, "mem_avail", json_integer((json_int_t)d->mem_avail));
	if (d->model_hash[0])
		json_object_set_new(o, "model",
				    json_pack("{s:s,s:I}", "hash", d->model_hash, "size",
					      (json_int_t)d->model_size));
	else
		json_object_set_new(o, "model", json_null());
	for (int i = 0; i < d->naddrs; i++)
		json_array_append_new(addrs, json_pack("{s:s,s:s,s:s,s:i}", "ip", d->ip[i], "if",
						       d->ifname[i], "kind",
						       plan_link_name((plan_link_t)d->kind[i]),
						       "prefix", d->prefix[i]));
	json_object_set_new(o, "addrs", addrs);
	const node_compute_t *c = &d->compute; /* measurements: docs/view.md section 1.1 */
	if (c->bw_mbs)
		json_object_set_new(o, "bw_mbs", json_integer(c->bw_mbs));
	if (c->prefill_mbs)
		json_object_set_new(o, "prefill_mbs", json_integer(c->prefill_mbs));
	if (c->threads)
		json_object_set_new(o, "threads", json_integer(c->threads));
	if (c->machine[0])
		json_object_set_new(o, "machine", json_string(c->machine));
	if (d->nlinks) {
		json_t *ls = json_array();
		for (int i = 0; i < d->nlinks; i++)
			json_array_append_new(
			    ls, json_pack("{s:s,s:I,s:I,s:I}", "id", d->links[i].node_id, "rtt_us",
					  (json_int_t)d->links[i].rtt_us, "rtt_p90_us",
					  (json_int_t)d->links[i].rtt_p90_us, "mbps",
					  (json_int_t)d->links[i].mbps));
		json_object_set_new(o, "links", ls);
	}
	char *s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return s;
}

/* An optional integer member in [lo, hi] into *v (absent: untouched). 0, or -1 when present and
 * not such an integer. */
static int get_u32(json_t *o, const char *key, uint32_t lo, uint32_t hi, uint32_t *v)
{
	json_t *x = json_object_get(o, key);
	if (!x)
		return 0;
	if (!json_is_integer(x) || json_integer_value(x) < (json_int_t)lo ||
	    json_integer_value(x) > (json_int_t)hi)
		return -1;
	*v = (uint32_t)json_integer_value(x);
	return 0;
}

/* A machine id: printable, no quotes or spaces (a boot id is a UUID). */
static int machine_ok(const char *s)
{
	if (strlen(s) >= PLAN_MACHINE_MAX)
		return 0;
	for (; *s; s++)
		if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'z') ||
		      (*s >= 'A' && *s <= 'Z') || *s == '-' || *s == '_' || *s == '.' || *s == ':'))
			return 0;
	return 1;
}

static int hex_id_ok(const char *s)
{
	if (!s || strlen(s) != PLAN_ID_LEN)
		return 0;
	for (; *s; s++)
		if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
			return 0;
	return 1;
}

static int meas_cmp(const void *a, const void *b)
{
	return strcmp(((const plan_meas_t *)a)->node_id, ((const plan_meas_t *)b)->node_id);
}

/* The measurements of a NODE (all optional). A peer's figures are bounded: a round trip of 0 or
 * beyond a minute, a p90 below the median, a link to one peer twice, or a compute rate of 0 or
 * beyond NODE_MAX_MBS make the description malformed rather than steer the planner. */
static int meas_parse(node_desc_t *d, json_t *o)
{
	node_compute_t *c = &d->compute;
	uint32_t th = 0;
	if (get_u32(o, "bw_mbs", 1, NODE_MAX_MBS, &c->bw_mbs) ||
	    get_u32(o, "prefill_mbs", 1, NODE_MAX_MBS, &c->prefill_mbs) ||
	    get_u32(o, "threads", 1, 4096, &th))
		return -1;
	c->threads = (int)th;
	json_t *mc = json_object_get(o, "machine");
	if (mc) {
		if (!json_is_string(mc) || !machine_ok(json_string_value(mc)))
			return -1;
		snprintf(c->machine, sizeof c->machine, "%s", json_string_value(mc));
	}
	json_t *ls = json_object_get(o, "links");
	if (!ls)
		return 0;
	if (!json_is_array(ls) || json_array_size(ls) > AGENT_MAX_LINKS)
		return -1;
	size_t i;
	json_t *x;
	json_array_foreach(ls, i, x)
	{
		plan_meas_t *m = &d->links[d->nlinks];
		const char *id = json_string_value(json_object_get(x, "id"));
		if (!json_is_object(x) || !hex_id_ok(id) ||
		    get_u32(x, "rtt_us", 1, NODE_MAX_RTT, &m->rtt_us) || !m->rtt_us ||
		    get_u32(x, "rtt_p90_us", m->rtt_us, NODE_MAX_RTT, &m->rtt_p90_us) ||
		    get_u32(x, "mbps", 1, NODE_MAX_MBPS, &m->mbps) || !m->mbps)
			return -1;
		snprintf(m->node_id, sizeof m->node_id, "%s", id);
		for (int k = 0; k < d->nlinks; k++)
			if (!strcmp(d->links[k].node_id, id))
				return -1;
		d->nlinks++;
	}
	qsort(d->links, (size_t)d->nlinks, sizeof d->links[0], meas_cmp);
	return 0;
}

int node_desc_parse(node_desc_t *d, const uint8_t *p, size_t len)
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
	if (meas_parse(d, o))
		goto done;
	d->have = 1;
	rc = 0;
done:
	json_decref(o);
	return rc;
}

/* ---- ACK and EXCLUDED ------------------------------------------------------------------------ */

/* o as compact text (malloc'd; NULL when o is NULL or out of memory); o is released. */
static char *dump_owned(json_t *o)
{
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return s;
}

char *node_ack_json(const char *hash, core_ack_t ack, const char *error, uint64_t epoch)
{
	return dump_owned(json_pack("{s:s,s:s,s:s,s:I}", "hash", hash, "state", core_ack_name(ack),
				    "error", error ? error : "", "epoch", (json_int_t)epoch));
}

int node_ack_parse(node_ack_t *a, const uint8_t *p, size_t len)
{
	memset(a, 0, sizeof *a);
	json_error_t je;
	json_t *o = json_loadb((const char *)p, len, 0, &je);
	const char *hs = json_string_value(json_object_get(o, "hash"));
	const char *st = json_string_value(json_object_get(o, "state"));
	const char *er = json_string_value(json_object_get(o, "error"));
	int rc = SH_EFORMAT;
	if (hs && st && strlen(hs) < CORE_HASH_MAX) {
		snprintf(a->hash, sizeof a->hash, "%s", hs);
		a->ack = core_ack_parse(st);
		snprintf(a->error, sizeof a->error, "%s", er ? er : "");
		json_t *ep = json_object_get(o, "epoch"); /* optional: older nodes do not say */
		if (json_is_integer(ep) && json_integer_value(ep) > 0)
			a->epoch = (uint64_t)json_integer_value(ep);
		rc = 0;
	}
	json_decref(o);
	return rc;
}

char *node_steps_json(const node_steps_t *s)
{
	return dump_owned(json_pack("{s:I,s:f,s:f}", "steps", (json_int_t)s->steps, "step_ms",
				    s->step_ms, "comm_ms", s->comm_ms));
}

int node_steps_parse(node_steps_t *s, const uint8_t *p, size_t len)
{
	memset(s, 0, sizeof *s);
	json_error_t je;
	json_t *o = json_loadb((const char *)p, len, 0, &je);
	json_t *n = json_object_get(o, "steps"), *st = json_object_get(o, "step_ms"),
	       *cm = json_object_get(o, "comm_ms");
	int rc = SH_EFORMAT;
	if (json_is_integer(n) && json_is_number(st) && json_is_number(cm) &&
	    json_integer_value(n) >= 0 && json_number_value(st) >= 0 &&
	    json_number_value(cm) >= 0 && json_number_value(cm) <= json_number_value(st) &&
	    isfinite(json_number_value(st))) {
		s->steps = (uint64_t)json_integer_value(n);
		s->step_ms = json_number_value(st);
		s->comm_ms = json_number_value(cm);
		rc = 0;
	}
	json_decref(o);
	return rc;
}

void node_excluded_text(char *out, size_t outlen, const uint8_t *p, size_t len)
{
	snprintf(out, outlen, "%.*s", (int)MIN(len, outlen - 1), (const char *)p);
	for (char *q = out; *q; q++)
		if ((unsigned char)*q < 32)
			*q = ' ';
}

/* ---- the planner's view ---------------------------------------------------------------------- */

/* avail: what the node says it can give (0 = unknown: its total). */
int node_to_plan(plan_node_t *pn, const char *idhex, const char *host, int port, uint64_t mem,
		 uint64_t avail, int cores, const char *rdma, const node_desc_t *d)
{
	snprintf(pn->node_id, sizeof pn->node_id, "%s", idhex);
	snprintf(pn->host, sizeof pn->host, "%s", host);
	pn->port = port;
	pn->mem_total = mem;
	pn->mem_avail = avail && avail < mem ? avail : mem;
	pn->cores = cores;
	pn->bw_mbs = d->compute.bw_mbs;
	pn->prefill_mbs = d->compute.prefill_mbs;
	pn->threads = d->compute.threads;
	snprintf(pn->machine, sizeof pn->machine, "%s", d->compute.machine);
	if (d->nlinks && !(pn->links = calloc((size_t)d->nlinks, sizeof *pn->links)))
		return SH_ENOMEM;
	for (int i = 0; i < d->nlinks; i++)
		if (strcmp(d->links[i].node_id, idhex))
			pn->links[pn->n_links++] = d->links[i];
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
