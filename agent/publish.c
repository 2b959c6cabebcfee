/*
 * publish.c: the API server's side of the agent and the /v1/cluster document (publish.h).
 *
 * Invariant: the web server's threads read only the copies published here under `mu` (the
 * state, its reason, the cluster JSON) and the group_broken flag; the loop replaces them as a
 * whole, so a reader never sees half of an update.
 */
#include "agent/publish.h"
#include "common/common.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert((int)CORE_HEALTH_SERVING == (int)WEB_SERVING &&
		   (int)CORE_HEALTH_FORMING == (int)WEB_FORMING &&
		   (int)CORE_HEALTH_LOADING == (int)WEB_LOADING &&
		   (int)CORE_HEALTH_REPLANNING == (int)WEB_REPLANNING,
	       "core_health_t and enum web_state name the same states");

/* ---- the document -----------------------------------------------------------------------------
 */

static json_t *member_json(const pub_member_t *m)
{
	json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:s,s:b,s:I}", "id", m->id, "name", m->name, "addr",
			      m->addr, "role", m->role, "state", m->state, "healthy", m->healthy,
			      "mem_total", (json_int_t)m->mem_total);
	json_object_set_new(o, "rank", m->rank >= 0 ? json_integer(m->rank) : json_null());
	json_object_set_new(o, "mem_model", json_integer((json_int_t)m->mem_model));
	if (m->standby_reason)
		json_object_set_new(o, "standby_reason", json_string(m->standby_reason));
	const plan_rank_t *pr = m->holds;
	if (pr) { /* what this rank holds, half-open ranges (the dashboard's topology) */
		json_t *h = json_pack("{s:[i,i]}", "layers", pr->layer0, pr->layer1);
		if (h && pr->q1 > 0) /* a slice of the heads and columns (0: whole layers) */
			json_object_update_new(
			    h, json_pack("{s:[i,i], s:[i,i], s:[i,i]}", "heads", pr->q0, pr->q1,
					 "kv_heads", pr->kv0, pr->kv1, "ffn", pr->ffn0, pr->ffn1));
		if (h && m->holds_experts)
			json_object_set_new(h, "experts", json_pack("[i,i]", pr->exp0, pr->exp1));
		json_object_set_new(o, "holds", h);
	}
	json_t *rd = json_array();
	char tmp[256];
	snprintf(tmp, sizeof tmp, "%s", m->rdma);
	char *save = NULL;
	for (char *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(t, ':'); /* "dev:ifname": the device */
		if (colon)
			*colon = 0;
		json_array_append_new(rd, json_string(t));
	}
	json_object_set_new(o, "rdma", rd);
	return o;
}

static json_t *plan_json(const pub_cluster_t *c)
{
	json_t *shares = json_array();
	for (int r = 0; r < c->ranks; r++)
		json_array_append_new(shares, json_real(c->shares[r]));
	json_t *p = json_pack("{s:s,s:i,s:o,s:s,s:i,s:i}", "strategy", c->strategy, "ranks",
			      c->ranks, "shares", shares, "model", c->model ? c->model : "",
			      "layers", c->layers, "n_ctx", c->n_ctx);
	if (p && c->hash) {
		json_object_set_new(p, "hash", json_string(c->hash));
		json_object_set_new(p, "epoch", json_integer((json_int_t)c->plan_epoch));
	}
	if (p && c->reason)
		json_object_set_new(p, "reason", json_string(c->reason));
	if (p && c->predicted_tok_s > 0)
		json_object_set_new(p, "predicted_decode_tok_s", json_real(c->predicted_tok_s));
	if (p && c->measured_tok_s > 0) /* after serving: the measured figure beside it */
		json_object_set_new(p, "measured_decode_tok_s",
				    json_real(round(c->measured_tok_s * 10) / 10));
	if (p && c->experts) { /* MoE: each rank's routed experts */
		json_t *ex = json_array();
		for (int r = 0; r < c->ranks; r++)
			json_array_append_new(
			    ex, json_pack("[i,i]", c->experts[r][0], c->experts[r][1]));
		json_object_set_new(p, "experts", ex);
	}
	return p;
}

char *pub_cluster_json(const pub_cluster_t *c)
{
	json_t *o = json_object(), *ms = json_array(), *links = json_array();
	json_object_set_new(o, "state", json_string(c->state));
	json_object_set_new(o, "leader", c->leader ? json_string(c->leader) : json_null());
	json_object_set_new(o, "self", json_string(c->self));
	for (int i = 0; i < c->n; i++)
		json_array_append_new(ms, member_json(&c->members[i]));
	json_object_set_new(o, "members", ms);
	if (c->epoch)
		json_object_set_new(o, "epoch", json_integer((json_int_t)c->epoch));
	json_object_set_new(o, "plan", c->strategy ? plan_json(c) : json_null());
	for (int i = 0; i < c->nlinks; i++) {
		const pub_link_t *l = &c->links[i];
		json_t *lk = json_pack("{s:s,s:s,s:s}", "a", l->a, "b", l->b, "kind",
				       l->dev ? "rdma" : "tcp");
		if (l->dev)
			json_object_set_new(lk, "dev", json_string(l->dev));
		if (l->measured) {
			json_object_set_new(lk, "rtt_ms", json_real(l->rtt_ms));
			json_object_set_new(lk, "rtt_p90_ms", json_real(l->rtt_p90_ms));
			json_object_set_new(lk, "mbit_s", json_real(l->mbit_s));
		}
		json_array_append_new(links, lk);
	}
	json_object_set_new(o, "links", links);
	char *s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return s;
}

/* ---- the agent's document -----------------------------------------------------------------------
 */

static void member_fill(pub_member_t *m, const pub_src_t *s, const char *id, const char *name,
			const char *addr, int http_port, const char *leader, const char *state,
			uint64_t mem, const char *rdma)
{
	snprintf(m->id, sizeof m->id, "%s", id);
	snprintf(m->name, sizeof m->name, "%s", name);
	snprintf(m->addr, sizeof m->addr, strchr(addr, ':') ? "[%s]:%d" : "%s:%d", addr, http_port);
	m->role = leader && !strcmp(leader, id) ? "leader" : "follower";
	m->rank = s->plan ? plan_rank_of(s->plan, id) : -1;
	m->standby_reason = NULL; /* left out of the plan on purpose (the cost model's choice) */
	for (int i = 0; s->plan && m->rank < 0 && i < plan_n_standby(s->plan); i++)
		if (!strcmp(plan_standby(s->plan, i)->node_id, id))
			m->standby_reason = plan_standby(s->plan, i)->reason;
	if (m->standby_reason && strcmp(m->role, "leader"))
		m->role = "standby";
	m->state = state;
	m->healthy = 1;
	m->mem_total = mem;
	const plan_rank_t *pr = s->plan && m->rank >= 0 ? plan_rank(s->plan, m->rank) : NULL;
	m->mem_model = pr ? pr->weight_bytes : 0;
	m->holds = pr;
	m->holds_experts = pr && s->pmodel && s->pmodel->n_experts;
	snprintf(m->rdma, sizeof m->rdma, "%s", rdma ? rdma : "");
}

/* The plan in force: its shares (of the FFN columns, or of the layers in a pipeline), its
 * experts and the links between its ranks. */
static void plan_fill(pub_cluster_t *c, const pub_src_t *s, double *shares, int (*experts)[2],
		      pub_link_t *links)
{
	const plan_t *p = s->plan;
	int n = plan_n_ranks(p), ffn = 0, layers = s->pmodel ? s->pmodel->n_layers : 0;
	c->strategy = plan_strategy_name(plan_strategy(p));
	c->ranks = n;
	c->layers = layers;
	c->n_ctx = plan_ctx(p);
	c->hash = plan_hash(p);
	c->plan_epoch = plan_epoch(p);
	c->reason = plan_reason(p);
	const plan_pred_t *pd = plan_predicted(p); /* from measured links only */
	c->predicted_tok_s = pd && pd->decode_dtok ? (double)pd->decode_dtok / 10.0 : 0;
	const char *name = s->model_path ? strrchr(s->model_path, '/') : NULL;
	c->model = name ? name + 1 : s->model_path ? s->model_path : "";
	for (int r = 0; r < n; r++)
		ffn += plan_rank(p, r)->ffn1 - plan_rank(p, r)->ffn0;
	c->shares = shares;
	c->experts = s->pmodel && s->pmodel->n_experts ? experts : NULL;
	c->links = links;
	for (int r = 0; r < n; r++) {
		const plan_rank_t *pr = plan_rank(p, r);
		shares[r] = plan_strategy(p) == PLAN_PIPELINE
				? (double)(pr->layer1 - pr->layer0) / MAX(layers, pr->layer1)
				: (double)(pr->ffn1 - pr->ffn0) / MAX(ffn, 1);
		experts[r][0] = pr->exp0, experts[r][1] = pr->exp1;
		for (int k = r + 1; k < n; k++)
			links[c->nlinks++] =
			    (pub_link_t){.a = pr->node_id,
					 .b = plan_rank(p, k)->node_id,
					 .dev = pr->rdma[k][0] ? pr->rdma[k] : NULL};
	}
}

/* A link measured from node `from` to node `to`: merged into the pair's entry (the worse
 * figures of both ends), or a new entry. from and to must outlive the document's making. */
static void link_measured(pub_cluster_t *c, int max, const char *from, const plan_meas_t *m)
{
	pub_link_t *l = NULL;
	for (int i = 0; i < c->nlinks && !l; i++)
		if ((!strcmp(c->links[i].a, from) && !strcmp(c->links[i].b, m->node_id)) ||
		    (!strcmp(c->links[i].b, from) && !strcmp(c->links[i].a, m->node_id)))
			l = &c->links[i];
	if (!l) {
		if (c->nlinks == max)
			return;
		l = &c->links[c->nlinks++];
		*l = (pub_link_t){.a = from, .b = m->node_id};
	}
	double rtt = m->rtt_us / 1e3, p90 = (m->rtt_p90_us ? m->rtt_p90_us : m->rtt_us) / 1e3;
	if (!l->measured || rtt > l->rtt_ms)
		l->rtt_ms = rtt;
	if (!l->measured || p90 > l->rtt_p90_ms)
		l->rtt_p90_ms = p90;
	if (!l->measured || m->mbps < l->mbit_s)
		l->mbit_s = m->mbps;
	l->measured = 1;
}

char *pub_agent_cluster(const pub_src_t *s)
{
	static pub_member_t ms[1 + MEMBERS_MAX]; /* the loop's thread only */
	static double shares[PLAN_MAX_NODES];
	static int experts[PLAN_MAX_NODES][2];
	static pub_link_t links[(1 + MEMBERS_MAX) * MEMBERS_MAX / 2];
	disc_id_t l; /* the node that plans and serves the API (rank 0) */
	char lh[DISC_ID_HEX] = "";
	int have = core_planner(s->core, &l);
	if (have)
		disc_id_hex(&l, lh);
	pub_cluster_t c = {.state = agent_state_name(core_state(s->core)),
			   .leader = have ? lh : NULL,
			   .self = s->self_hex,
			   .epoch = elec_epoch(members_election(s->members)),
			   .members = ms};
	node_desc_t me = {0};
	node_self_addrs(&me);
	const char *self_addr = me.ip[0];
	for (int i = 0; i < me.naddrs; i++)
		if (strchr(me.ip[i], '.')) {
			self_addr = me.ip[i];
			break;
		}
	member_fill(&ms[c.n++], s, s->self_hex, s->facts->hostname, self_addr, s->http_port,
		    c.leader, c.state, s->facts->mem_bytes, s->facts->rdma);
	for (int i = 0; i < members_count(s->members) && c.n < 1 + MEMBERS_MAX; i++) {
		const member_t *m = members_at(s->members, i);
		char h[DISC_ID_HEX];
		disc_id_hex(&m->id, h);
		const char *ex = core_member_excluded(s->core, &m->id);
		const char *st = ex && ex[0] ? "excluded" : "member";
		core_ack_t ack = core_member_ack(s->core, &m->id);
		if (s->plan && plan_rank_of(s->plan, h) >= 0 && ack != CORE_ACK_NONE)
			st = core_ack_name(ack);
		member_fill(&ms[c.n++], s, h, m->info.host, m->addr, m->desc.http_port, c.leader,
			    st, m->info.mem_bytes, m->info.rdma);
	}
	c.links = links;
	if (s->plan)
		plan_fill(&c, s, shares, experts, links);
	c.measured_tok_s = c.strategy ? s->measured_tok_s : 0;
	int maxl = (int)ARRAY_LEN(links);
	for (int i = 0; i < s->nlinks; i++)
		link_measured(&c, maxl, s->self_hex, &s->links[i]);
	for (int i = 1; i < c.n; i++) { /* ms[i] is member i - 1 */
		const member_t *m = members_at(s->members, i - 1);
		for (int k = 0; m && k < m->desc.nlinks; k++)
			link_measured(&c, maxl, ms[i].id, &m->desc.links[k]);
	}
	return pub_cluster_json(&c);
}

/* ---- the API server -----------------------------------------------------------------------------
 */

struct pub {
	web_t *web;
	atomic_int group_broken;
	char url[128]; /* where followers send the API's clients ("": served here) */
	pthread_mutex_t mu;
	int state;        /* under mu: enum web_state */
	char reason[200]; /* under mu */
	char *cluster;    /* under mu: the /v1/cluster JSON */
};

static int on_health(void *ud, char *reason, size_t len)
{
	pub_t *p = ud;
	pthread_mutex_lock(&p->mu);
	int st = p->state;
	snprintf(reason, len, "%s", p->reason);
	pthread_mutex_unlock(&p->mu);
	return st;
}

static char *on_cluster(void *ud)
{
	pub_t *p = ud;
	pthread_mutex_lock(&p->mu);
	char *s = p->cluster ? strdup(p->cluster) : NULL;
	pthread_mutex_unlock(&p->mu);
	return s;
}

static void on_engine_lost(void *ud)
{
	pub_t *p = ud;
	atomic_store(&p->group_broken, 1);
}

pub_t *pub_new(const agent_config_t *cfg, const char *self_hex)
{
	pub_t *p = calloc(1, sizeof *p);
	if (!p)
		return NULL;
	pthread_mutex_init(&p->mu, NULL);
	atomic_init(&p->group_broken, 0);
	p->state = WEB_FORMING;
	snprintf(p->reason, sizeof p->reason, "waiting for peers");
	web_opts_t o;
	web_opts_default(&o);
	o.host = "0.0.0.0";
	o.port = cfg->http_port;
	o.health = on_health;
	o.cluster = on_cluster;
	o.engine_lost = on_engine_lost;
	o.ud = p;
	if (cfg->api_key && cfg->api_key[0])
		o.api_key = cfg->api_key;
	o.tls_cert = cfg->tls_cert;
	o.tls_key = cfg->tls_key;
	o.show_text = cfg->dashboard_show_text;
	o.node_id = self_hex; /* the history's column of this node's step times */
	char e[256];
	if (!web_new(&p->web, &o, NULL, e, sizeof e))
		LOG(LOG_INFO, "api: listening on port %d", web_port(p->web));
	else /* discovery, planning and computing go on; only the API is missing here */
		LOG(LOG_ERROR, "api: %s: this node serves no API (pick another --http-port)", e);
	if (p->web && cfg->exec_cmd && cfg->exec_port > 0)
		web_set_proxy(p->web, cfg->exec_port); /* --exec: /v1/ goes to rank 0's command */
	return p;
}

void pub_free(pub_t *p)
{
	if (!p)
		return;
	web_free(p->web);
	free(p->cluster);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

web_t *pub_web(pub_t *p)
{
	return p->web;
}

atomic_int *pub_group_broken(pub_t *p)
{
	return &p->group_broken;
}

void pub_set(pub_t *p, int web_state, const char *reason, char *cluster_json)
{
	pthread_mutex_lock(&p->mu);
	p->state = web_state;
	snprintf(p->reason, sizeof p->reason, "%s", reason);
	if (cluster_json) {
		free(p->cluster);
		p->cluster = cluster_json;
	}
	pthread_mutex_unlock(&p->mu);
}

void pub_follow(pub_t *p, const char *url)
{
	if (!url)
		url = "";
	if (!strcmp(url, p->url))
		return;
	snprintf(p->url, sizeof p->url, "%s", url);
	if (p->web)
		web_set_leader(p->web, url[0] ? url : NULL);
	LOG(LOG_INFO, "api: %s", url[0] ? url : "served here (this node leads)");
}
