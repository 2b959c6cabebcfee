/* test_discovery.c: node identity, TXT items, the sighting table and the backend event queue. */
#include "common/common.h"
#include "discovery/discovery.h"
#include "discovery/mdns_internal.h"
#include "harness.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static void tmpdir(char *out, size_t len)
{
	snprintf(out, len, "/tmp/shoal-test-disc.XXXXXX");
	if (!mkdtemp(out))
		out[0] = 0;
}

static void rmtree(const char *d)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", d);
}

TEST(id_hex_round_trip)
{
	disc_id_t a, b;
	for (int i = 0; i < DISC_ID_LEN; i++)
		a.b[i] = (uint8_t)(i * 17 + 3);
	char h[DISC_ID_HEX];
	disc_id_hex(&a, h);
	CHECK_EQ_INT(strlen(h), 32);
	CHECK_EQ_INT(disc_id_parse(h, &b), 0);
	CHECK_EQ_INT(disc_id_cmp(&a, &b), 0);
	CHECK_EQ_INT(disc_id_parse("abc", &b), SH_EFORMAT);
	CHECK_EQ_INT(disc_id_parse("zz000000000000000000000000000000", &b), SH_EFORMAT);
	CHECK_EQ_INT(disc_id_parse(NULL, &b), SH_EFORMAT);
}

TEST(identity_is_created_once_and_kept)
{
	char d[64], sub[128], err[256];
	tmpdir(d, sizeof d);
	CHECK(d[0]);
	snprintf(sub, sizeof sub, "%s/state/deeper", d);
	disc_id_t a, b;
	int created = 0;
	CHECK_EQ_INT(disc_identity_load(sub, &a, &created, err, sizeof err), 0);
	CHECK_EQ_INT(created, 1);
	CHECK(!disc_id_is_zero(&a));
	CHECK_EQ_INT(disc_identity_load(sub, &b, &created, err, sizeof err), 0);
	CHECK_EQ_INT(created, 0);
	CHECK_EQ_INT(disc_id_cmp(&a, &b), 0);
	/* a damaged file is an error, never silently replaced */
	char path[160];
	snprintf(path, sizeof path, "%s/node_id", sub);
	CHECK_EQ_INT(write_file_atomic(path, "garbage\n", 8, err, sizeof err), 0);
	CHECK_EQ_INT(disc_identity_load(sub, &b, &created, err, sizeof err), SH_EFORMAT);
	CHECK(strstr(err, "node_id") != NULL);
	rmtree(d);
}

TEST(state_dir_default)
{
	char out[4096];
	CHECK_EQ_INT(disc_state_dir_default(out, sizeof out), 0);
	CHECK(strstr(out, "shoal") != NULL);
	CHECK_EQ_INT(disc_state_dir_default(out, 4), SH_EINVAL);
}

TEST(host_facts)
{
	disc_host_facts_t f;
	disc_host_facts_get(&f);
	CHECK(f.cores >= 1);
	CHECK(f.mem_bytes > 0);
	CHECK(f.hostname[0]);
}

TEST(txt_round_trip_never_holds_more_than_published)
{
	disc_publish_t p = {.port = 7411, .mem_bytes = 123456789, .cores = 8, .nonce = 0xabcdef12};
	for (int i = 0; i < DISC_ID_LEN; i++)
		p.id.b[i] = (uint8_t)(0xf0 - i);
	snprintf(p.cid, sizeof p.cid, "0123456789abcdef");
	snprintf(p.rdma, sizeof p.rdma, "rdma_en3:en3,mlx5_0:eth1");
	char items[16][300];
	int n = disc_txt_items(&p, items, 16);
	CHECK_EQ_INT(n, 7);
	disc_sighting_t s;
	memset(&s, 0, sizeof s);
	for (int i = 0; i < n; i++) {
		char *eq = strchr(items[i], '=');
		CHECK(eq != NULL);
		*eq = 0;
		disc_txt_parse_item(&s, items[i], eq + 1, strlen(eq + 1));
	}
	CHECK_EQ_INT(s.version, DISC_PROTO_VERSION);
	CHECK_EQ_INT(disc_id_cmp(&s.id, &p.id), 0);
	CHECK_EQ_STR(s.cid, p.cid);
	CHECK(s.mem_bytes == p.mem_bytes && s.cores == 8 && s.nonce == p.nonce);
	CHECK_EQ_STR(s.rdma, p.rdma);
	/* malformed or odd items are ignored, never overrun */
	disc_sighting_t t;
	memset(&t, 0, sizeof t);
	disc_txt_parse_item(&t, "id", "nothex", 6);
	CHECK(disc_id_is_zero(&t.id));
	disc_txt_parse_item(&t, "cores", NULL, 0);
	CHECK_EQ_INT(t.cores, 0);
	char big[1000];
	memset(big, 'a', sizeof big);
	disc_txt_parse_item(&t, "cid", big, sizeof big);
	CHECK_EQ_INT(strlen(t.cid), DISC_CID_MAX - 1);
	CHECK_EQ_INT(disc_txt_items(&p, items, 2), 2);
}

TEST(info_round_trip_and_bad_input)
{
	disc_info_t in = {.version = 1, .port = 7411, .mem_bytes = 1ull << 40, .cores = 64};
	in.id.b[3] = 7;
	snprintf(in.host, sizeof in.host, "mac-studio");
	snprintf(in.rdma, sizeof in.rdma, "rdma_en3:en3");
	char buf[1024];
	int n = disc_info_encode(&in, buf, sizeof buf);
	CHECK(n > 0);
	disc_info_t out;
	memset(&out, 0, sizeof out);
	disc_info_parse(&out, (const uint8_t *)buf, (size_t)n);
	CHECK(out.version == 1 && out.port == 7411 && out.mem_bytes == in.mem_bytes &&
	      out.cores == 64 && !disc_id_cmp(&out.id, &in.id));
	CHECK_EQ_STR(out.host, "mac-studio");
	CHECK_EQ_STR(out.rdma, "rdma_en3:en3");
	CHECK_EQ_INT(disc_info_encode(&in, buf, 10), SH_EINVAL);
	/* junk: no '=', an overlong key and value, an embedded NUL, no final newline */
	static const char junk[] = "garbage\nverylongkeyname_beyond=1\nhost=ab\0cd\ncores=3";
	char big[2000];
	memset(big, 'x', sizeof big);
	memcpy(big, "host=", 5);
	memset(&out, 0, sizeof out);
	disc_info_parse(&out, (const uint8_t *)junk, sizeof junk - 1);
	CHECK_EQ_STR(out.host, "ab");
	CHECK_EQ_INT(out.cores, 3);
	disc_info_parse(&out, (const uint8_t *)big, sizeof big);
	CHECK(strlen(out.host) < sizeof out.host);
	disc_info_parse(&out, NULL, 0);
}

static disc_sighting_t sighting(int idbyte, const char *name, int ifindex, const char *addr)
{
	disc_sighting_t s;
	memset(&s, 0, sizeof s);
	s.id.b[0] = (uint8_t)idbyte;
	snprintf(s.name, sizeof s.name, "%s", name);
	snprintf(s.addr, sizeof s.addr, "%s", addr);
	snprintf(s.ifname, sizeof s.ifname, "eth%d", ifindex);
	snprintf(s.host, sizeof s.host, "h%d.local", idbyte);
	s.ifindex = ifindex;
	s.port = 7411;
	s.cores = idbyte;
	return s;
}

TEST(table_folds_sightings_by_id)
{
	disc_table_t *t = disc_table_new();
	disc_sighting_t a1 = sighting(1, "shoal-a", 2, "10.0.0.1");
	disc_sighting_t a2 = sighting(1, "shoal-a", 3, "192.168.1.1");
	disc_sighting_t b = sighting(2, "shoal-b", 2, "10.0.0.2");
	CHECK(disc_table_add(t, &a1, 100) != NULL);
	CHECK(disc_table_add(t, &a2, 200) != NULL);
	CHECK(disc_table_add(t, &a1, 300) != NULL); /* again: no second slot */
	CHECK(disc_table_add(t, &b, 300) != NULL);
	CHECK_EQ_INT(disc_table_count(t), 2);
	const disc_peer_t *p = disc_table_find(t, &a1.id);
	CHECK(p && p->naddrs == 2 && p->first_seen_ms == 100);
	CHECK_EQ_STR(p->addrs[1].ifname, "eth3");
	/* a DOWN carries only name + interface */
	disc_sighting_t down = sighting(0, "shoal-a", 2, "");
	CHECK_EQ_INT(disc_table_remove(t, &down), 0);
	p = disc_table_find(t, &a1.id);
	CHECK(p && p->naddrs == 1);
	CHECK_EQ_STR(p->addrs[0].addr, "192.168.1.1");
	down.ifindex = 3;
	CHECK_EQ_INT(disc_table_remove(t, &down), 1);
	CHECK(disc_table_find(t, &a1.id) == NULL);
	CHECK_EQ_INT(disc_table_count(t), 1);
	disc_sighting_t noid = sighting(0, "x", 1, "1.2.3.4");
	CHECK(disc_table_add(t, &noid, 0) == NULL);
	for (int i = 0; i < DISC_MAX_PEERS + 5; i++) {
		disc_sighting_t s = sighting(10, "many", 1, "1.1.1.1");
		s.id.b[1] = (uint8_t)i;
		disc_table_add(t, &s, 0);
	}
	CHECK_EQ_INT(disc_table_count(t), DISC_MAX_PEERS);
	disc_table_clear(t);
	CHECK_EQ_INT(disc_table_count(t), 0);
	disc_table_free(t);
	disc_table_free(NULL);
}

TEST(own_records_are_never_a_duplicate)
{
	disc_publish_t pub;
	memset(&pub, 0, sizeof pub);
	pub.id.b[0] = 1;
	pub.port = 7411;
	pub.nonce = 0x1234;
	disc_sighting_t s = sighting(1, "shoal-01", 2, "10.0.0.1");
	s.nonce = 0x1234;
	CHECK_EQ_INT(disc_sighting_self(&pub, &s, 0), DISC_SELF_OURS); /* this process */
	/* the daemon re-registered us under "#2", or our crashed predecessor's record lingers:
	 * another nonce or name, but our own address and port */
	snprintf(s.name, sizeof s.name, "shoal-01 #2");
	s.nonce = 0x9999;
	CHECK_EQ_INT(disc_sighting_self(&pub, &s, 1), DISC_SELF_OURS);
	/* a copy elsewhere, or a copy on this host (it needs another port) */
	CHECK_EQ_INT(disc_sighting_self(&pub, &s, 0), DISC_SELF_DUPLICATE);
	s.port = 7412;
	CHECK_EQ_INT(disc_sighting_self(&pub, &s, 1), DISC_SELF_DUPLICATE);
	disc_sighting_t other = sighting(2, "shoal-02", 2, "10.0.0.1");
	other.nonce = 0x1234;
	CHECK_EQ_INT(disc_sighting_self(&pub, &other, 1), DISC_SELF_NOT);
}

TEST(queue_fd_readable_while_not_empty)
{
	disc_queue_t *q = disc_queue_new();
	CHECK(q != NULL);
	struct pollfd pf = {.fd = disc_queue_fd(q), .events = POLLIN};
	CHECK_EQ_INT(poll(&pf, 1, 0), 0);
	disc_event_t ev = {.kind = DISC_EV_UP}, out;
	snprintf(ev.s.name, sizeof ev.s.name, "one");
	disc_queue_push(q, &ev);
	snprintf(ev.s.name, sizeof ev.s.name, "two");
	disc_queue_push(q, &ev);
	CHECK_EQ_INT(poll(&pf, 1, 0), 1);
	CHECK_EQ_INT(disc_queue_pop(q, &out), 1);
	CHECK_EQ_STR(out.s.name, "one");
	CHECK_EQ_INT(poll(&pf, 1, 0), 1);
	CHECK_EQ_INT(disc_queue_pop(q, &out), 1);
	CHECK_EQ_STR(out.s.name, "two");
	CHECK_EQ_INT(poll(&pf, 1, 0), 0);
	CHECK_EQ_INT(disc_queue_pop(q, &out), 0);
	disc_queue_push(q, &ev); /* freed with the queue */
	disc_queue_free(q);
	disc_queue_free(NULL);
}

TEST(mdns_backend_starts_without_a_daemon)
{
	/* NO_FAIL: the backend comes up and waits for a daemon instead of failing */
	setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/shoal-test-bus", 1);
	disc_publish_t p = {.port = 1, .cores = 1};
	p.id.b[0] = 1;
	char err[256] = "";
	int saved = log_threshold;
	log_threshold = LOG_ERROR;
	disc_mdns_t *m = disc_mdns_new(&p, err, sizeof err);
	if (!m) {
		log_threshold = saved;
		fprintf(stderr, "backend %s: %s\n", disc_mdns_backend(), err);
		SKIP("this backend needs a daemon to start");
	}
	CHECK(disc_mdns_fd(m) >= 0);
	disc_mdns_free(m);
	log_threshold = saved;
}

int main(void)
{
	RUN(id_hex_round_trip);
	RUN(identity_is_created_once_and_kept);
	RUN(state_dir_default);
	RUN(host_facts);
	RUN(txt_round_trip_never_holds_more_than_published);
	RUN(info_round_trip_and_bad_input);
	RUN(table_folds_sightings_by_id);
	RUN(own_records_are_never_a_duplicate);
	RUN(queue_fd_readable_while_not_empty);
	RUN(mdns_backend_starts_without_a_daemon);
	return harness_done();
}
