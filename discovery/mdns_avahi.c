/*
 * mdns_avahi.c: the mDNS backend on avahi-client (Linux). It publishes this node's _shoal._tcp
 * service, browses and resolves the same type, and pushes every result as an event on the queue
 * the agent polls (mdns_queue.c).
 *
 * Threads: avahi-client runs in its own AvahiThreadedPoll thread; every callback below runs there
 * and touches only this struct and the queue. The caller's thread only calls disc_mdns_next/fd and,
 * after stopping the poll thread, disc_mdns_free.
 *
 * Daemon restarts: the client is created with AVAHI_CLIENT_NO_FAIL, so it waits for a daemon that
 * is not there yet; a client that fails later (daemon stopped) is freed and recreated from a
 * zero-delay timeout (never inside its own callback), which re-publishes and re-browses. Name
 * collisions take avahi's alternative name ("shoal-ID #2").
 *
 * Invariant: group and browser are NULL or belong to the current client.
 */
#include "common/common.h"
#include "discovery/mdns_internal.h"

#include <avahi-client/client.h>
#include <avahi-client/lookup.h>
#include <avahi-client/publish.h>
#include <avahi-common/alternative.h>
#include <avahi-common/error.h>
#include <avahi-common/malloc.h>
#include <avahi-common/strlst.h>
#include <avahi-common/thread-watch.h>
#include <avahi-common/timeval.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct disc_mdns {
	disc_publish_t pub;
	disc_queue_t *q;
	AvahiThreadedPoll *tp;
	const AvahiPoll *api;
	AvahiClient *client;
	AvahiEntryGroup *group;
	AvahiServiceBrowser *browser;
	AvahiTimeout *restart;
	char *name; /* avahi_malloc'd service name, changed on collisions */
	int last_err; /* of the last failed avahi_client_new, to log each new reason once */
};

const char *disc_mdns_backend(void) { return "avahi"; }

static void client_cb(AvahiClient *c, AvahiClientState state, void *ud);

static void push(disc_mdns_t *m, disc_event_kind_t kind, const disc_sighting_t *s)
{
	disc_event_t ev;
	memset(&ev, 0, sizeof ev);
	ev.kind = kind;
	if (s)
		ev.s = *s;
	disc_queue_push(m->q, &ev);
}

/* Schedules a fresh client from the poll thread's next iteration. */
static void schedule_restart(disc_mdns_t *m, int delay_ms)
{
	struct timeval tv;
	avahi_elapse_time(&tv, (unsigned)delay_ms, 0);
	m->api->timeout_update(m->restart, &tv);
}

static int publish(disc_mdns_t *m);

static void group_cb(AvahiEntryGroup *g, AvahiEntryGroupState state, void *ud)
{
	disc_mdns_t *m = ud;
	if (g != m->group && m->group)
		return;
	switch (state) {
	case AVAHI_ENTRY_GROUP_ESTABLISHED: {
		disc_sighting_t s;
		memset(&s, 0, sizeof s);
		snprintf(s.name, sizeof s.name, "%s", m->name);
		s.port = m->pub.port;
		LOG(LOG_INFO, "mdns: published '%s' (%s) on port %u", m->name, DISC_SERVICE_TYPE,
		    m->pub.port);
		push(m, DISC_EV_PUBLISHED, &s);
		break;
	}
	case AVAHI_ENTRY_GROUP_COLLISION: {
		char *alt = avahi_alternative_service_name(m->name);
		LOG(LOG_WARN, "mdns: service name '%s' is taken, renaming to '%s'", m->name, alt);
		avahi_free(m->name);
		m->name = alt;
		avahi_entry_group_reset(g);
		publish(m);
		break;
	}
	case AVAHI_ENTRY_GROUP_FAILURE:
		LOG(LOG_WARN, "mdns: publishing failed: %s",
		    avahi_strerror(avahi_client_errno(avahi_entry_group_get_client(g))));
		schedule_restart(m, 1000);
		break;
	default:
		break;
	}
}

static int publish(disc_mdns_t *m)
{
	if (!m->group) {
		m->group = avahi_entry_group_new(m->client, group_cb, m);
		if (!m->group) {
			LOG(LOG_WARN, "mdns: entry group: %s",
			    avahi_strerror(avahi_client_errno(m->client)));
			return -1;
		}
	}
	if (!avahi_entry_group_is_empty(m->group))
		return 0;
	char items[16][300];
	int n = disc_txt_items(&m->pub, items, 16);
	AvahiStringList *txt = NULL;
	for (int i = n - 1; i >= 0; i--)
		txt = avahi_string_list_add(txt, items[i]);
	for (;;) {
		int rc = avahi_entry_group_add_service_strlst(m->group, AVAHI_IF_UNSPEC,
							     AVAHI_PROTO_UNSPEC, 0, m->name,
							     DISC_SERVICE_TYPE, NULL, NULL,
							     m->pub.port, txt);
		if (rc == AVAHI_ERR_COLLISION) {
			char *alt = avahi_alternative_service_name(m->name);
			LOG(LOG_WARN, "mdns: service name '%s' is taken, renaming to '%s'", m->name,
			    alt);
			avahi_free(m->name);
			m->name = alt;
			continue;
		}
		if (rc >= 0)
			rc = avahi_entry_group_commit(m->group);
		if (rc < 0) {
			LOG(LOG_WARN, "mdns: publishing '%s': %s", m->name, avahi_strerror(rc));
			avahi_string_list_free(txt);
			return -1;
		}
		break;
	}
	avahi_string_list_free(txt);
	return 0;
}

static void resolve_cb(AvahiServiceResolver *r, AvahiIfIndex iface, AvahiProtocol proto,
		       AvahiResolverEvent event, const char *name, const char *type,
		       const char *domain, const char *host, const AvahiAddress *a, uint16_t port,
		       AvahiStringList *txt, AvahiLookupResultFlags flags, void *ud)
{
	disc_mdns_t *m = ud;
	(void)type;
	(void)domain;
	(void)flags;
	if (event != AVAHI_RESOLVER_FOUND) {
		LOG(LOG_DEBUG, "mdns: resolving '%s' failed: %s", name,
		    avahi_strerror(avahi_client_errno(avahi_service_resolver_get_client(r))));
		avahi_service_resolver_free(r);
		return;
	}
	disc_sighting_t s;
	memset(&s, 0, sizeof s);
	snprintf(s.name, sizeof s.name, "%s", name);
	snprintf(s.host, sizeof s.host, "%s", host ? host : "");
	if (a)
		avahi_address_snprint(s.addr, sizeof s.addr, a);
	s.port = port;
	s.ifindex = iface;
	s.ipv6 = proto == AVAHI_PROTO_INET6;
	if (!if_indextoname((unsigned)iface, s.ifname))
		snprintf(s.ifname, sizeof s.ifname, "if%d", iface);
	for (AvahiStringList *l = txt; l; l = avahi_string_list_get_next(l)) {
		char *k = NULL, *v = NULL;
		size_t vlen = 0;
		if (avahi_string_list_get_pair(l, &k, &v, &vlen) == 0) {
			disc_txt_parse_item(&s, k, v, vlen);
			avahi_free(k);
			avahi_free(v);
		}
	}
	avahi_service_resolver_free(r);
	if (!disc_id_cmp(&s.id, &m->pub.id) && s.nonce == m->pub.nonce)
		return; /* ourselves */
	push(m, DISC_EV_UP, &s);
}

static void browse_cb(AvahiServiceBrowser *b, AvahiIfIndex iface, AvahiProtocol proto,
		      AvahiBrowserEvent event, const char *name, const char *type,
		      const char *domain, AvahiLookupResultFlags flags, void *ud)
{
	disc_mdns_t *m = ud;
	(void)flags;
	switch (event) {
	case AVAHI_BROWSER_NEW:
		if (!avahi_service_resolver_new(m->client, iface, proto, name, type, domain,
						AVAHI_PROTO_UNSPEC, 0, resolve_cb, m))
			LOG(LOG_WARN, "mdns: resolver for '%s': %s", name,
			    avahi_strerror(avahi_client_errno(m->client)));
		break;
	case AVAHI_BROWSER_REMOVE: {
		disc_sighting_t s;
		memset(&s, 0, sizeof s);
		snprintf(s.name, sizeof s.name, "%s", name);
		s.ifindex = iface;
		s.ipv6 = proto == AVAHI_PROTO_INET6;
		if (!if_indextoname((unsigned)iface, s.ifname))
			snprintf(s.ifname, sizeof s.ifname, "if%d", iface);
		push(m, DISC_EV_DOWN, &s);
		break;
	}
	case AVAHI_BROWSER_FAILURE:
		LOG(LOG_WARN, "mdns: browsing failed: %s",
		    avahi_strerror(avahi_client_errno(avahi_service_browser_get_client(b))));
		schedule_restart(m, 1000);
		break;
	default:
		break;
	}
}

static void start_browsing(disc_mdns_t *m)
{
	if (m->browser)
		return;
	m->browser = avahi_service_browser_new(m->client, AVAHI_IF_UNSPEC, AVAHI_PROTO_UNSPEC,
					       DISC_SERVICE_TYPE, NULL, 0, browse_cb, m);
	if (!m->browser)
		LOG(LOG_WARN, "mdns: browser: %s", avahi_strerror(avahi_client_errno(m->client)));
}

static void client_cb(AvahiClient *c, AvahiClientState state, void *ud)
{
	disc_mdns_t *m = ud;
	m->client = c; /* the first callback can come before avahi_client_new returns */
	switch (state) {
	case AVAHI_CLIENT_S_RUNNING:
		LOG(LOG_INFO, "mdns: avahi-daemon running");
		publish(m);
		start_browsing(m);
		break;
	case AVAHI_CLIENT_S_COLLISION:
	case AVAHI_CLIENT_S_REGISTERING:
		/* the host name changed or collided: withdraw, re-publish once RUNNING */
		if (m->group)
			avahi_entry_group_reset(m->group);
		break;
	case AVAHI_CLIENT_CONNECTING:
		LOG(LOG_WARN, "mdns: waiting for avahi-daemon");
		break;
	case AVAHI_CLIENT_FAILURE:
		LOG(LOG_WARN, "mdns: lost avahi-daemon (%s); reconnecting",
		    avahi_strerror(avahi_client_errno(c)));
		schedule_restart(m, 0);
		break;
	}
}

/* Frees the failed client (and with it the group, browser and resolvers) and makes a new one. */
static void restart_cb(AvahiTimeout *t, void *ud)
{
	disc_mdns_t *m = ud;
	m->api->timeout_update(t, NULL);
	if (m->client) {
		avahi_client_free(m->client);
		push(m, DISC_EV_RESTARTED, NULL);
	}
	m->client = NULL;
	m->group = NULL;
	m->browser = NULL;
	int err = 0;
	AvahiClient *c = avahi_client_new(m->api, AVAHI_CLIENT_NO_FAIL, client_cb, m, &err);
	if (!c) {
		/* no system bus at all (NO_FAIL only covers a missing avahi-daemon): keep trying,
		 * quietly after the first report */
		if (err != m->last_err)
			LOG(LOG_WARN, "mdns: avahi client: %s; retrying every 2 s", avahi_strerror(err));
		m->last_err = err;
		schedule_restart(m, 2000);
		return;
	}
	m->last_err = 0;
	m->client = c;
}

disc_mdns_t *disc_mdns_new(const disc_publish_t *pub, char *errbuf, size_t errlen)
{
	disc_mdns_t *m = calloc(1, sizeof *m);
	char idhex[DISC_ID_HEX], name[DISC_NAME_MAX];
	int err = 0;
	if (!m) {
		sh_fail(errbuf, errlen, SH_ENOMEM, "mdns: out of memory");
		return NULL;
	}
	m->pub = *pub;
	disc_id_hex(&pub->id, idhex);
	snprintf(name, sizeof name, "shoal-%s", idhex);
	m->name = avahi_strdup(name);
	m->q = disc_queue_new();
	m->tp = avahi_threaded_poll_new();
	if (!m->name || !m->q || !m->tp)
		goto nomem;
	m->api = avahi_threaded_poll_get(m->tp);
	m->restart = m->api->timeout_new(m->api, NULL, restart_cb, m);
	if (!m->restart)
		goto nomem;
	m->client = avahi_client_new(m->api, AVAHI_CLIENT_NO_FAIL, client_cb, m, &err);
	if (!m->client) {
		LOG(LOG_WARN, "mdns: avahi client: %s; retrying every 2 s", avahi_strerror(err));
		m->last_err = err;
		schedule_restart(m, 2000); /* runs once the poll thread starts */
	}
	if (avahi_threaded_poll_start(m->tp) < 0) {
		sh_fail(errbuf, errlen, SH_EIO, "avahi: cannot start its thread");
		goto err;
	}
	return m;
nomem:
	sh_fail(errbuf, errlen, SH_ENOMEM, "mdns: out of memory");
err:
	disc_mdns_free(m);
	return NULL;
}

void disc_mdns_free(disc_mdns_t *m)
{
	if (!m)
		return;
	if (m->tp)
		avahi_threaded_poll_stop(m->tp); /* no-op when not running; afterwards we own it all */
	if (m->client)
		avahi_client_free(m->client);
	if (m->restart)
		m->api->timeout_free(m->restart);
	if (m->tp)
		avahi_threaded_poll_free(m->tp);
	disc_queue_free(m->q);
	avahi_free(m->name);
	free(m);
}

int disc_mdns_fd(const disc_mdns_t *m) { return disc_queue_fd(m->q); }

int disc_mdns_next(disc_mdns_t *m, disc_event_t *ev) { return disc_queue_pop(m->q, ev); }
