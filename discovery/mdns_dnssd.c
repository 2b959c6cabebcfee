/*
 * mdns_dnssd.c: the mDNS backend on Bonjour's dns_sd API (macOS; on Linux it builds against
 * avahi's compatibility library: `make DISC_BACKEND=dnssd`). Same contract as mdns_avahi.c:
 * publish _shoal._tcp with the TXT items, browse, resolve, and push events onto the queue.
 *
 * Only the portable subset is used (../shared/docs/macos-portability.md): Register, Browse,
 * Resolve, and QueryRecord for the A record of the resolved host (no GetAddrInfo, no shared
 * connection, flags 0 everywhere). Hence IPv4 addresses only.
 *
 * Threads: one thread of ours polls every DNSServiceRef's socket and calls ProcessResult; every
 * callback runs there. The caller's thread only pops events, and stops the thread in free.
 *
 * Errors: a failing register or browse ref (the daemon went away) tears everything down, pushes
 * RESTARTED, and starts again after 2 s, like the avahi backend's client recreation.
 *
 * Invariant: a ref is deallocated only between ProcessResult calls (never inside its callback);
 * a lookup (resolve, then A query) lives at most LOOKUP_MS.
 */
#include "common/common.h"
#include "discovery/mdns_internal.h"

#include <arpa/inet.h>
#include <dns_sd.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LOOKUP_MS 5000
#define RETRY_MS 2000
#define MAX_FDS 128

typedef struct lookup {
	struct lookup *next;
	disc_mdns_t *m;
	DNSServiceRef rref, qref; /* resolve, then the A query of its host */
	int resolved, done;
	int64_t started_ms;
	disc_sighting_t s;
} lookup_t;

struct disc_mdns {
	disc_publish_t pub;
	disc_queue_t *q;
	pthread_t thread;
	int thread_started;
	int wake[2];
	atomic_int stop;
	DNSServiceRef reg, browse;
	int failed; /* a ref reported an error: reset at the end of this iteration */
	int last_err;
	int64_t retry_at_ms;
	lookup_t *lookups;
	char name[DISC_NAME_MAX];
};

const char *disc_mdns_backend(void) { return "dnssd"; }

static void push(disc_mdns_t *m, disc_event_kind_t kind, const disc_sighting_t *s)
{
	disc_event_t ev;
	memset(&ev, 0, sizeof ev);
	ev.kind = kind;
	if (s)
		ev.s = *s;
	disc_queue_push(m->q, &ev);
}

static void ifname_of(uint32_t ifindex, char out[IF_NAMESIZE])
{
	if (!if_indextoname(ifindex, out))
		snprintf(out, IF_NAMESIZE, "if%u", ifindex);
}

static void DNSSD_API query_cb(DNSServiceRef ref, DNSServiceFlags flags, uint32_t ifindex,
			       DNSServiceErrorType err, const char *fullname, uint16_t rrtype,
			       uint16_t rrclass, uint16_t rdlen, const void *rdata, uint32_t ttl,
			       void *ctx)
{
	lookup_t *l = ctx;
	(void)ref;
	(void)ifindex;
	(void)fullname;
	(void)rrclass;
	(void)ttl;
	if (err != kDNSServiceErr_NoError) {
		l->done = 1;
		return;
	}
	if (!(flags & kDNSServiceFlagsAdd) || rrtype != kDNSServiceType_A || rdlen != 4 || l->done)
		return;
	inet_ntop(AF_INET, rdata, l->s.addr, sizeof l->s.addr);
	l->done = 1;
	if (!disc_id_cmp(&l->s.id, &l->m->pub.id) && l->s.nonce == l->m->pub.nonce)
		return; /* ourselves */
	push(l->m, DISC_EV_UP, &l->s);
}

static void DNSSD_API resolve_cb(DNSServiceRef ref, DNSServiceFlags flags, uint32_t ifindex,
				 DNSServiceErrorType err, const char *fullname,
				 const char *hosttarget, uint16_t port, uint16_t txtlen,
				 const unsigned char *txt, void *ctx)
{
	lookup_t *l = ctx;
	(void)ref;
	(void)flags;
	(void)fullname;
	l->resolved = 1;
	if (err != kDNSServiceErr_NoError || !hosttarget) {
		l->done = 1;
		return;
	}
	snprintf(l->s.host, sizeof l->s.host, "%s", hosttarget);
	l->s.port = ntohs(port);
	int n = TXTRecordGetCount(txtlen, txt);
	for (int i = 0; i < n; i++) {
		char key[256];
		uint8_t vlen = 0;
		const void *val = NULL;
		if (TXTRecordGetItemAtIndex(txtlen, txt, (uint16_t)i, sizeof key, key, &vlen, &val) ==
		    kDNSServiceErr_NoError)
			disc_txt_parse_item(&l->s, key, val, vlen);
	}
	if (DNSServiceQueryRecord(&l->qref, 0, ifindex, hosttarget, kDNSServiceType_A,
				  kDNSServiceClass_IN, query_cb, l) != kDNSServiceErr_NoError) {
		l->qref = NULL;
		l->done = 1;
	}
}

static void DNSSD_API browse_cb(DNSServiceRef ref, DNSServiceFlags flags, uint32_t ifindex,
				DNSServiceErrorType err, const char *name, const char *type,
				const char *domain, void *ctx)
{
	disc_mdns_t *m = ctx;
	(void)ref;
	if (err != kDNSServiceErr_NoError) {
		LOG(LOG_WARN, "mdns: browsing failed (dns_sd error %d)", err);
		m->failed = 1;
		return;
	}
	if (!(flags & kDNSServiceFlagsAdd)) {
		disc_sighting_t s;
		memset(&s, 0, sizeof s);
		snprintf(s.name, sizeof s.name, "%s", name);
		s.ifindex = (int)ifindex;
		ifname_of(ifindex, s.ifname);
		push(m, DISC_EV_DOWN, &s);
		return;
	}
	lookup_t *l = calloc(1, sizeof *l);
	if (!l)
		return;
	l->m = m;
	l->started_ms = now_ms();
	snprintf(l->s.name, sizeof l->s.name, "%s", name);
	l->s.ifindex = (int)ifindex;
	ifname_of(ifindex, l->s.ifname);
	if (DNSServiceResolve(&l->rref, 0, ifindex, name, type, domain, resolve_cb, l) !=
	    kDNSServiceErr_NoError) {
		LOG(LOG_DEBUG, "mdns: cannot resolve '%s'", name);
		free(l);
		return;
	}
	l->next = m->lookups;
	m->lookups = l;
}

static void DNSSD_API register_cb(DNSServiceRef ref, DNSServiceFlags flags,
				  DNSServiceErrorType err, const char *name, const char *type,
				  const char *domain, void *ctx)
{
	disc_mdns_t *m = ctx;
	(void)ref;
	(void)flags;
	(void)type;
	(void)domain;
	if (err != kDNSServiceErr_NoError) {
		LOG(LOG_WARN, "mdns: publishing failed (dns_sd error %d)", err);
		m->failed = 1;
		return;
	}
	if (strcmp(name, m->name))
		LOG(LOG_WARN, "mdns: service name '%s' is taken, published as '%s'", m->name, name);
	disc_sighting_t s;
	memset(&s, 0, sizeof s);
	snprintf(s.name, sizeof s.name, "%s", name);
	s.port = m->pub.port;
	LOG(LOG_INFO, "mdns: published '%s' (%s) on port %u", name, DISC_SERVICE_TYPE, m->pub.port);
	push(m, DISC_EV_PUBLISHED, &s);
}

static void lookup_free(lookup_t *l)
{
	if (l->rref)
		DNSServiceRefDeallocate(l->rref);
	if (l->qref)
		DNSServiceRefDeallocate(l->qref);
	free(l);
}

static void teardown(disc_mdns_t *m)
{
	while (m->lookups) {
		lookup_t *l = m->lookups;
		m->lookups = l->next;
		lookup_free(l);
	}
	if (m->reg)
		DNSServiceRefDeallocate(m->reg);
	if (m->browse)
		DNSServiceRefDeallocate(m->browse);
	m->reg = m->browse = NULL;
}

static int start(disc_mdns_t *m)
{
	TXTRecordRef txt;
	char items[16][300];
	int n = disc_txt_items(&m->pub, items, 16);
	TXTRecordCreate(&txt, 0, NULL);
	for (int i = 0; i < n; i++) {
		char *eq = strchr(items[i], '=');
		if (!eq)
			continue;
		*eq = 0;
		TXTRecordSetValue(&txt, items[i], (uint8_t)strlen(eq + 1), eq + 1);
	}
	DNSServiceErrorType e = DNSServiceRegister(
		&m->reg, 0, 0, m->name, DISC_SERVICE_TYPE, NULL, NULL, htons(m->pub.port),
		TXTRecordGetLength(&txt), TXTRecordGetBytesPtr(&txt), register_cb, m);
	TXTRecordDeallocate(&txt);
	if (e != kDNSServiceErr_NoError) {
		m->reg = NULL;
		goto fail;
	}
	e = DNSServiceBrowse(&m->browse, 0, 0, DISC_SERVICE_TYPE, NULL, browse_cb, m);
	if (e != kDNSServiceErr_NoError) {
		m->browse = NULL;
		goto fail;
	}
	if (m->last_err)
		LOG(LOG_INFO, "mdns: dns_sd daemon reachable again");
	m->last_err = 0;
	return 0;
fail:
	if (e != m->last_err)
		LOG(LOG_WARN, "mdns: dns_sd error %d (is the mDNS daemon running?); retrying every %d s",
		    e, RETRY_MS / 1000);
	m->last_err = e;
	teardown(m);
	return -1;
}

static void *thread_main(void *arg)
{
	disc_mdns_t *m = arg;
	struct pollfd pf[MAX_FDS];
	DNSServiceRef refs[MAX_FDS];
	int had_refs = 0;
	while (!atomic_load(&m->stop)) {
		int64_t now = now_ms();
		if (!m->reg && now >= m->retry_at_ms) {
			if (start(m) != 0)
				m->retry_at_ms = now + RETRY_MS;
			else
				had_refs = 1;
		}
		int n = 0;
		pf[n] = (struct pollfd){.fd = m->wake[0], .events = POLLIN};
		refs[n++] = NULL;
		if (m->reg) {
			pf[n] = (struct pollfd){.fd = DNSServiceRefSockFD(m->reg), .events = POLLIN};
			refs[n++] = m->reg;
		}
		if (m->browse) {
			pf[n] = (struct pollfd){.fd = DNSServiceRefSockFD(m->browse), .events = POLLIN};
			refs[n++] = m->browse;
		}
		for (lookup_t *l = m->lookups; l && n < MAX_FDS - 1; l = l->next) {
			if (l->rref && !l->resolved) {
				pf[n] = (struct pollfd){.fd = DNSServiceRefSockFD(l->rref), .events = POLLIN};
				refs[n++] = l->rref;
			} else if (l->qref && !l->done) {
				pf[n] = (struct pollfd){.fd = DNSServiceRefSockFD(l->qref), .events = POLLIN};
				refs[n++] = l->qref;
			}
		}
		if (poll(pf, (nfds_t)n, 200) < 0)
			continue;
		for (int i = 1; i < n; i++) {
			if (!pf[i].revents)
				continue;
			DNSServiceErrorType e = DNSServiceProcessResult(refs[i]);
			if (e == kDNSServiceErr_NoError)
				continue;
			if (refs[i] == m->reg || refs[i] == m->browse)
				m->failed = 1;
			else
				for (lookup_t *l = m->lookups; l; l = l->next)
					if (l->rref == refs[i] || l->qref == refs[i])
						l->done = 1;
		}
		/* reap finished or stale lookups, outside every callback */
		now = now_ms();
		for (lookup_t **pp = &m->lookups; *pp;) {
			lookup_t *l = *pp;
			if (l->done || now - l->started_ms > LOOKUP_MS) {
				*pp = l->next;
				lookup_free(l);
				continue;
			}
			if (l->resolved && l->rref) {
				DNSServiceRefDeallocate(l->rref);
				l->rref = NULL;
			}
			pp = &l->next;
		}
		if (m->failed) {
			LOG(LOG_WARN, "mdns: lost the dns_sd daemon; reconnecting");
			teardown(m);
			m->failed = 0;
			m->retry_at_ms = now + RETRY_MS;
			if (had_refs)
				push(m, DISC_EV_RESTARTED, NULL);
		}
	}
	teardown(m);
	return NULL;
}

disc_mdns_t *disc_mdns_new(const disc_publish_t *pub, char *errbuf, size_t errlen)
{
	disc_mdns_t *m = calloc(1, sizeof *m);
	char idhex[DISC_ID_HEX];
	if (!m) {
		sh_fail(errbuf, errlen, SH_ENOMEM, "mdns: out of memory");
		return NULL;
	}
	m->wake[0] = m->wake[1] = -1;
	m->pub = *pub;
	disc_id_hex(&pub->id, idhex);
	snprintf(m->name, sizeof m->name, "shoal-%s", idhex);
	/* avahi's compatibility layer warns on stderr at first use; we know. (Set before any
	 * thread of ours exists; harmless on macOS.) */
	setenv("AVAHI_COMPAT_NOWARN", "1", 0);
	m->q = disc_queue_new();
	if (!m->q || pipe(m->wake) != 0) {
		sh_fail(errbuf, errlen, SH_EIO, "mdns: cannot create its queue");
		goto err;
	}
	if (pthread_create(&m->thread, NULL, thread_main, m) != 0) {
		sh_fail(errbuf, errlen, SH_EIO, "mdns: cannot start its thread");
		goto err;
	}
	m->thread_started = 1;
	return m;
err:
	disc_mdns_free(m);
	return NULL;
}

void disc_mdns_free(disc_mdns_t *m)
{
	if (!m)
		return;
	if (m->thread_started) {
		atomic_store(&m->stop, 1);
		char b = 1;
		if (write(m->wake[1], &b, 1) != 1)
			LOG(LOG_DEBUG, "mdns: wake write failed");
		pthread_join(m->thread, NULL);
	}
	for (int i = 0; i < 2; i++)
		if (m->wake[i] >= 0)
			close(m->wake[i]);
	disc_queue_free(m->q);
	free(m);
}

int disc_mdns_fd(const disc_mdns_t *m) { return disc_queue_fd(m->q); }

int disc_mdns_next(disc_mdns_t *m, disc_event_t *ev) { return disc_queue_pop(m->q, ev); }
