/* test_transport.c: token -> keys, and the authenticated channel on loopback and socketpairs:
 * handshake, wrong token on both sides, tampered/replayed/reordered frames, silent and garbage
 * peers, partial frames across timeouts, and a byte capture that never holds the token. */
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/socket.h>

#include "common/common.h"
#include "harness.h"
#include "transport/chan.h"
#include "transport/keys.h"
#include "transport/transport.h"

static const char TOKEN[] = "correct horse battery staple";
static const char TOKEN2[] = "another cluster's token";
static tp_keys_t K1, K2;
static const uint8_t ID_A[16] = {0xa};
static const uint8_t ID_B[16] = {0xb};

/* ---- helpers: a handshake on a socketpair, the responder in a thread ---------------------- */

struct hs_arg {
	int fd;
	int initiator;
	const tp_keys_t *k;
	const uint8_t *id;
	int timeout_ms;
	tp_chan_t *ch;
	int rc;
	char err[256];
};

static void *hs_thread(void *p)
{
	struct hs_arg *a = p;
	a->rc = tp_chan_open_fd(&a->ch, a->fd, a->initiator, a->k, a->id, a->timeout_ms, a->err,
				sizeof a->err);
	return NULL;
}

/* Handshakes A (initiator, ka) with B (responder, kb) over a socketpair. */
static void pair_open(const tp_keys_t *ka, const tp_keys_t *kb, struct hs_arg *a,
		      struct hs_arg *b)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		abort();
	*a = (struct hs_arg){.fd = sv[0], .initiator = 1, .k = ka, .id = ID_A, .timeout_ms = 3000};
	*b = (struct hs_arg){.fd = sv[1], .initiator = 0, .k = kb, .id = ID_B, .timeout_ms = 3000};
	pthread_t t;
	pthread_create(&t, NULL, hs_thread, b);
	hs_thread(a);
	pthread_join(t, NULL);
}

/* Writes raw bytes to a channel's socket, bypassing the channel. */
static void raw_write(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n) {
		ssize_t w = write(fd, b, n);
		if (w <= 0)
			return;
		b += w;
		n -= (size_t)w;
	}
}

/* ---- keys --------------------------------------------------------------------------------- */

TEST(keys_deterministic_and_distinct)
{
	tp_keys_t a, b;
	char err[128];
	CHECK_EQ_INT(tp_keys_derive(&a, TOKEN, strlen(TOKEN), err, sizeof err), 0);
	CHECK_EQ_INT(tp_keys_derive(&b, TOKEN, strlen(TOKEN), err, sizeof err), 0);
	CHECK(memcmp(&a, &b, sizeof a) == 0);
	CHECK_EQ_INT(strlen(a.cid_hex), 16);
	CHECK(memcmp(a.cid, K2.cid, TP_CID_BYTES) != 0);
	CHECK(memcmp(a.auth, K2.auth, TP_KEY_BYTES) != 0);
	CHECK(memcmp(a.auth, a.cid, TP_CID_BYTES) != 0);
	CHECK_EQ_INT(tp_keys_derive(&b, "", 0, err, sizeof err), SH_EINVAL);
	tp_keys_wipe(&a);
	uint8_t zero[sizeof a] = {0};
	CHECK(memcmp(&a, zero, sizeof a) == 0);
}

TEST(keys_default_cost)
{
	/* the production cost (64 MiB Argon2id) works here and differs from the test cost */
	tp_keys_t a;
	char err[128];
	tp_keys_set_cost_for_tests(0, 0);
	int64_t t0 = now_ms();
	CHECK_EQ_INT(tp_keys_derive(&a, TOKEN, strlen(TOKEN), err, sizeof err), 0);
	fprintf(stderr, "Argon2id at the default cost: %lld ms\n", (long long)(now_ms() - t0));
	CHECK(memcmp(a.cid, K1.cid, TP_CID_BYTES) != 0);
	tp_keys_set_cost_for_tests(1, 8192);
}

TEST(id_hex)
{
	char h[33];
	CHECK_EQ_STR(tp_id_hex(h, ID_A), "0a000000000000000000000000000000");
}

TEST(hostport_parse)
{
	char h[64], err[128];
	int port = 0;
	CHECK_EQ_INT(tp_hostport_parse("10.0.0.2:7000", h, sizeof h, &port, err, sizeof err), 0);
	CHECK_EQ_STR(h, "10.0.0.2");
	CHECK_EQ_INT(port, 7000);
	CHECK_EQ_INT(tp_hostport_parse("[fe80::1]:80", h, sizeof h, &port, err, sizeof err), 0);
	CHECK_EQ_STR(h, "fe80::1");
	CHECK_EQ_INT(tp_hostport_parse("node-a.local:1", h, sizeof h, &port, err, sizeof err), 0);
	const char *bad[] = {"", "host", "host:", ":80", "h:0", "h:65536", "h:8x", "fe80::1:80",
			     "[fe80::1]80", "[::1]:"};
	for (size_t i = 0; i < ARRAY_LEN(bad); i++)
		CHECK_EQ_INT(tp_hostport_parse(bad[i], h, sizeof h, &port, err, sizeof err),
			     SH_EINVAL);
	CHECK_EQ_INT(tp_hostport_parse("abcdef:1", h, 4, &port, err, sizeof err), SH_EINVAL);
}

/* ---- handshake ---------------------------------------------------------------------------- */

TEST(handshake_and_messages)
{
	struct hs_arg a, b;
	pair_open(&K1, &K1, &a, &b);
	CHECK_EQ_INT(a.rc, 0);
	CHECK_EQ_INT(b.rc, 0);
	if (a.rc || b.rc)
		goto out;
	CHECK(memcmp(tp_chan_peer_id(a.ch), ID_B, 16) == 0);
	CHECK(memcmp(tp_chan_peer_id(b.ch), ID_A, 16) == 0);
	CHECK(tp_chan_fd(a.ch) >= 0);
	CHECK_EQ_INT(tp_chan_pending(a.ch), 0);
	for (int i = 0; i < 50; i++) {
		char msg[32];
		int n = snprintf(msg, sizeof msg, "message %d", i);
		CHECK_EQ_INT(tp_chan_send(i % 2 ? b.ch : a.ch, (uint16_t)(0x100 + i), msg, (size_t)n),
			     0);
		uint16_t type;
		void *p;
		size_t len;
		CHECK_EQ_INT(tp_chan_recv(i % 2 ? a.ch : b.ch, &type, &p, &len, 1000), 0);
		CHECK_EQ_INT(type, 0x100 + i);
		CHECK_EQ_INT(len, n);
		CHECK(memcmp(p, msg, (size_t)n) == 0);
	}
	/* empty payload */
	uint16_t type;
	void *p;
	size_t len;
	CHECK_EQ_INT(tp_chan_send(a.ch, 0x200, NULL, 0), 0);
	CHECK_EQ_INT(tp_chan_recv(b.ch, &type, &p, &len, 1000), 0);
	CHECK_EQ_INT(len, 0);
	/* too big to send: clean error, channel still fine */
	CHECK_EQ_INT(tp_chan_send(a.ch, 1, "x", TP_MAX_PAYLOAD + 1), SH_EINVAL);
	CHECK_EQ_INT(tp_chan_send(a.ch, 0x201, "ok", 2), 0);
	CHECK_EQ_INT(tp_chan_recv(b.ch, &type, &p, &len, 1000), 0);
	CHECK_EQ_INT(type, 0x201);
	/* nothing waiting: a timeout that leaves the channel usable */
	CHECK_EQ_INT(tp_chan_recv(b.ch, &type, &p, &len, 20), SH_ETIMEDOUT);
	CHECK_EQ_INT(tp_chan_send(a.ch, 0x202, "ok", 2), 0);
	CHECK_EQ_INT(tp_chan_recv(b.ch, &type, &p, &len, 1000), 0);
	/* peer closes: ECLOSED */
	tp_chan_free(a.ch);
	a.ch = NULL;
	CHECK_EQ_INT(tp_chan_recv(b.ch, &type, &p, &len, 1000), SH_ECLOSED);
	CHECK_EQ_INT(tp_chan_send(b.ch, 1, "x", 1), SH_ECLOSED);
out:
	tp_chan_free(a.ch);
	tp_chan_free(b.ch);
}

struct big_arg {
	tp_chan_t *ch;
	uint8_t *buf;
	size_t len;
	int rc;
};

static void *big_send(void *p)
{
	struct big_arg *a = p;
	a->rc = tp_chan_send(a->ch, 0x300, a->buf, a->len);
	return NULL;
}

TEST(largest_message)
{
	struct hs_arg a, b;
	pair_open(&K1, &K1, &a, &b);
	CHECK(a.rc == 0 && b.rc == 0);
	if (a.rc || b.rc)
		goto out;
	struct big_arg s = {.ch = a.ch, .len = TP_MAX_PAYLOAD};
	s.buf = malloc(s.len);
	for (size_t i = 0; i < s.len; i++)
		s.buf[i] = (uint8_t)(i * 7 + (i >> 12));
	pthread_t t;
	pthread_create(&t, NULL, big_send, &s);
	uint16_t type;
	void *p;
	size_t len;
	CHECK_EQ_INT(tp_chan_recv(b.ch, &type, &p, &len, 10000), 0);
	pthread_join(t, NULL);
	CHECK_EQ_INT(s.rc, 0);
	CHECK_EQ_INT(len, s.len);
	CHECK(p && memcmp(p, s.buf, s.len) == 0);
	free(s.buf);
out:
	tp_chan_free(a.ch);
	tp_chan_free(b.ch);
}

TEST(wrong_token_fails_on_both_sides)
{
	struct hs_arg a, b;
	pair_open(&K1, &K2, &a, &b);
	CHECK_EQ_INT(a.rc, SH_EAUTH);
	CHECK_EQ_INT(b.rc, SH_EAUTH);
	CHECK(strstr(a.err, "peer does not hold our token") != NULL);
	CHECK(strstr(b.err, "peer does not hold our token") != NULL);
	CHECK(a.ch == NULL && b.ch == NULL);
	tp_chan_free(a.ch);
	tp_chan_free(b.ch);
}

TEST(forged_cluster_id_fails_authentication)
{
	/* a peer that copies our public cluster ID but lacks the auth key */
	tp_keys_t forged = K2;
	memcpy(forged.cid, K1.cid, TP_CID_BYTES);
	struct hs_arg a, b;
	pair_open(&K1, &forged, &a, &b);
	CHECK_EQ_INT(a.rc, SH_EAUTH);
	CHECK_EQ_INT(b.rc, SH_EAUTH);
	CHECK(strstr(a.err, "authentication failed") != NULL);
	CHECK(strstr(b.err, "authentication failed") != NULL);
	tp_chan_free(a.ch);
	tp_chan_free(b.ch);
}

TEST(tampered_replayed_reordered_frames_rejected)
{
	uint16_t type;
	void *p;
	size_t len;
	for (int mode = 0; mode < 4; mode++) {
		struct hs_arg a, b;
		pair_open(&K1, &K1, &a, &b);
		CHECK(a.rc == 0 && b.rc == 0);
		if (a.rc || b.rc)
			continue;
		/* frame 1, captured as it goes on the wire */
		CHECK_EQ_INT(tp_chan_tx_start(a.ch, 0x100, NULL, 0, "first", 5), 0);
		size_t n1 = a.ch->tx_len;
		uint8_t *f1 = malloc(n1);
		memcpy(f1, a.ch->tx_buf, n1);
		if (mode == 0) { /* flip one ciphertext bit */
			f1[n1 / 2] ^= 0x10;
			raw_write(a.ch->fd, f1, n1);
		} else if (mode == 1) { /* replay: deliver, then deliver again */
			raw_write(a.ch->fd, f1, n1);
			CHECK_EQ_INT(tp_chan_recv(b.ch, &type, &p, &len, 1000), 0);
			raw_write(a.ch->fd, f1, n1);
		} else if (mode == 2) { /* reorder: frame 2 before frame 1 */
			CHECK_EQ_INT(tp_chan_tx_start(a.ch, 0x100, NULL, 0, "second", 6), 0);
			raw_write(a.ch->fd, a.ch->tx_buf, a.ch->tx_len);
			raw_write(a.ch->fd, f1, n1);
		} else { /* tamper with the length (additional data): one byte longer */
			tp_put32(f1, tp_get32(f1) + 1);
			raw_write(a.ch->fd, f1, n1);
			raw_write(a.ch->fd, "x", 1);
		}
		CHECK_EQ_INT(tp_chan_recv(b.ch, &type, &p, &len, 1000), SH_EAUTH);
		/* dead for good */
		CHECK_EQ_INT(tp_chan_recv(b.ch, &type, &p, &len, 10), SH_EAUTH);
		free(f1);
		tp_chan_free(a.ch);
		tp_chan_free(b.ch);
	}
}

TEST(oversized_frame_after_handshake)
{
	struct hs_arg a, b;
	pair_open(&K1, &K1, &a, &b);
	CHECK(a.rc == 0 && b.rc == 0);
	if (a.rc || b.rc)
		return;
	uint8_t hdr[4];
	tp_put32(hdr, TP_FRAME_MAX_BODY + 1);
	raw_write(a.ch->fd, hdr, 4);
	uint16_t type;
	void *p;
	size_t len;
	CHECK_EQ_INT(tp_chan_recv(b.ch, &type, &p, &len, 1000), SH_EFORMAT);
	tp_chan_free(a.ch);
	tp_chan_free(b.ch);
}

TEST(partial_frame_survives_timeout)
{
	struct hs_arg a, b;
	pair_open(&K1, &K1, &a, &b);
	CHECK(a.rc == 0 && b.rc == 0);
	if (a.rc || b.rc)
		return;
	CHECK_EQ_INT(tp_chan_tx_start(a.ch, 0x150, NULL, 0, "split frame", 11), 0);
	raw_write(a.ch->fd, a.ch->tx_buf, 7);
	uint16_t type;
	void *p;
	size_t len;
	CHECK_EQ_INT(tp_chan_recv(b.ch, &type, &p, &len, 30), SH_ETIMEDOUT);
	raw_write(a.ch->fd, a.ch->tx_buf + 7, a.ch->tx_len - 7);
	CHECK_EQ_INT(tp_chan_recv(b.ch, &type, &p, &len, 1000), 0);
	CHECK_EQ_INT(type, 0x150);
	CHECK(len == 11 && memcmp(p, "split frame", 11) == 0);
	tp_chan_free(a.ch);
	tp_chan_free(b.ch);
}


struct sender {
	tp_chan_t *ch;
	int id, n, rc;
};

static void *sender_thread(void *p)
{
	struct sender *s = p;
	for (int i = 0; i < s->n && s->rc == 0; i++) {
		uint32_t v[2] = {(uint32_t)s->id, (uint32_t)i};
		s->rc = tp_chan_send(s->ch, 0x400, v, sizeof v);
	}
	return NULL;
}

TEST(two_senders_one_receiver)
{
	/* the documented threading: several senders (send is locked) and one receiver */
	struct hs_arg a, b;
	pair_open(&K1, &K1, &a, &b);
	CHECK(a.rc == 0 && b.rc == 0);
	if (a.rc || b.rc)
		return;
	struct sender s[2] = {{.ch = a.ch, .id = 0, .n = 300}, {.ch = a.ch, .id = 1, .n = 300}};
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, sender_thread, &s[i]);
	int next[2] = {0, 0}, bad = 0;
	for (int i = 0; i < 600; i++) {
		uint16_t type;
		void *p;
		size_t len;
		if (tp_chan_recv(b.ch, &type, &p, &len, 5000) != 0 || len != 8) {
			bad++;
			break;
		}
		uint32_t v[2];
		memcpy(v, p, 8);
		if (v[0] > 1 || v[1] != (uint32_t)next[v[0]]++)
			bad++;
	}
	for (int i = 0; i < 2; i++) {
		pthread_join(t[i], NULL);
		CHECK_EQ_INT(s[i].rc, 0);
	}
	CHECK_EQ_INT(bad, 0);
	CHECK(next[0] == 300 && next[1] == 300);
	tp_chan_free(a.ch);
	tp_chan_free(b.ch);
}

/* ---- TCP: silent and garbage peers, connect/accept -------------------------------------- */

struct acc_arg {
	int lfd;
	int timeout_ms;
	tp_chan_t *ch;
	int rc;
	char err[256];
};

static void *acc_thread(void *p)
{
	struct acc_arg *a = p;
	int fd;
	a->rc = tp_accept(a->lfd, &fd, NULL, 0, 3000, a->err, sizeof a->err);
	if (a->rc == 0)
		a->rc = tp_chan_accept(&a->ch, fd, &K1, ID_B, a->timeout_ms, a->err, sizeof a->err);
	return NULL;
}

TEST(tcp_connect_accept)
{
	int lfd, port;
	char err[256];
	CHECK_EQ_INT(tp_listen("127.0.0.1", 0, &lfd, &port, err, sizeof err), 0);
	CHECK(port > 0);
	struct acc_arg aa = {.lfd = lfd, .timeout_ms = 3000};
	pthread_t t;
	pthread_create(&t, NULL, acc_thread, &aa);
	tp_chan_t *c = NULL;
	CHECK_EQ_INT(tp_chan_connect(&c, "127.0.0.1", port, &K1, ID_A, 3000, err, sizeof err), 0);
	pthread_join(t, NULL);
	CHECK_EQ_INT(aa.rc, 0);
	if (c && aa.ch) {
		CHECK(strncmp(tp_chan_peer_addr(c), "127.0.0.1:", 10) == 0);
		CHECK_EQ_INT(tp_chan_send(c, 0x100, "hi", 2), 0);
		uint16_t type;
		void *p;
		size_t len;
		CHECK_EQ_INT(tp_chan_recv(aa.ch, &type, &p, &len, 1000), 0);
		CHECK(len == 2 && memcmp(p, "hi", 2) == 0);
	}
	tp_chan_free(c);
	tp_chan_free(aa.ch);
	/* nobody listening any more: a clean connect error */
	close(lfd);
	CHECK(tp_chan_connect(&c, "127.0.0.1", port, &K1, ID_A, 1000, err, sizeof err) != 0);
	CHECK(c == NULL);
	/* a wildcard listener */
	CHECK_EQ_INT(tp_listen(NULL, 0, &lfd, &port, err, sizeof err), 0);
	close(lfd);
}

TEST(silent_peer_times_out)
{
	int lfd, port;
	char err[256];
	CHECK_EQ_INT(tp_listen("127.0.0.1", 0, &lfd, &port, err, sizeof err), 0);
	/* accept side: a client that connects and says nothing */
	struct acc_arg aa = {.lfd = lfd, .timeout_ms = 200};
	pthread_t t;
	pthread_create(&t, NULL, acc_thread, &aa);
	int fd;
	CHECK_EQ_INT(tp_tcp_connect("127.0.0.1", port, tp_deadline(1000), &fd, NULL, 0, err,
				    sizeof err),
		     0);
	pthread_join(t, NULL);
	CHECK_EQ_INT(aa.rc, SH_ETIMEDOUT);
	CHECK(strstr(aa.err, "no HELLO") != NULL);
	close(fd);
	/* connect side: a server that accepts and says nothing */
	tp_chan_t *c = NULL;
	int64_t t0 = now_ms();
	CHECK_EQ_INT(tp_chan_connect(&c, "127.0.0.1", port, &K1, ID_A, 200, err, sizeof err),
		     SH_ETIMEDOUT);
	CHECK(now_ms() - t0 < 5000); /* bounded, not a timing assertion on speed */
	close(lfd);
}

TEST(garbage_peer_gets_clean_error)
{
	/* HTTP, a HELLO cut short by EOF, a zero length, an AUTH before HELLO */
	const char *garbage[] = {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "\x05\x00\x00\x00\x01\x00zz",
				 "\x00\x00\x00\x00", "\x02\x00\x00\x00\x02\x00"};
	const size_t glen[] = {27, 8, 4, 6};
	for (size_t i = 0; i < ARRAY_LEN(garbage); i++) {
		int sv[2];
		socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
		raw_write(sv[1], garbage[i], glen[i]);
		shutdown(sv[1], SHUT_WR);
		tp_chan_t *c = NULL;
		char err[256];
		int rc = tp_chan_open_fd(&c, sv[0], 0, &K1, ID_B, 1000, err, sizeof err);
		CHECK(rc == SH_EFORMAT || rc == SH_ECLOSED);
		CHECK(c == NULL);
		CHECK(strstr(err, "handshake with") != NULL);
		close(sv[1]);
	}
}

/* ---- the token never crosses the wire ---------------------------------------------------- */

struct proxy {
	int a, b; /* relay between these two sockets until both close */
	uint8_t *cap;
	size_t len, cap_size;
};

static void *proxy_thread(void *p)
{
	struct proxy *x = p;
	int open_a = 1, open_b = 1;
	while (open_a || open_b) {
		struct pollfd f[2] = {{.fd = open_a ? x->a : -1, .events = POLLIN},
				      {.fd = open_b ? x->b : -1, .events = POLLIN}};
		if (poll(f, 2, 5000) <= 0)
			break;
		for (int i = 0; i < 2; i++) {
			if (!(f[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			uint8_t buf[65536];
			ssize_t n = read(f[i].fd, buf, sizeof buf);
			int other = i ? x->a : x->b;
			if (n <= 0) {
				shutdown(other, SHUT_WR);
				if (i)
					open_b = 0;
				else
					open_a = 0;
				continue;
			}
			if (x->len + (size_t)n > x->cap_size) {
				x->cap_size = (x->len + (size_t)n) * 2;
				x->cap = realloc(x->cap, x->cap_size);
			}
			memcpy(x->cap + x->len, buf, (size_t)n);
			x->len += (size_t)n;
			raw_write(other, buf, (size_t)n);
		}
	}
	return NULL;
}

static int contains(const uint8_t *hay, size_t n, const void *needle, size_t m)
{
	for (size_t i = 0; i + m <= n; i++)
		if (memcmp(hay + i, needle, m) == 0)
			return 1;
	return 0;
}

TEST(capture_never_contains_token)
{
	int s1[2], s2[2];
	socketpair(AF_UNIX, SOCK_STREAM, 0, s1);
	socketpair(AF_UNIX, SOCK_STREAM, 0, s2);
	struct proxy x = {.a = s1[1], .b = s2[1]};
	pthread_t pt, ht;
	pthread_create(&pt, NULL, proxy_thread, &x);
	struct hs_arg a = {.fd = s1[0], .initiator = 1, .k = &K1, .id = ID_A, .timeout_ms = 3000};
	struct hs_arg b = {.fd = s2[0], .initiator = 0, .k = &K1, .id = ID_B, .timeout_ms = 3000};
	pthread_create(&ht, NULL, hs_thread, &b);
	hs_thread(&a);
	pthread_join(ht, NULL);
	CHECK(a.rc == 0 && b.rc == 0);
	if (a.rc == 0 && b.rc == 0) {
		/* even a message that quotes the token travels sealed */
		CHECK_EQ_INT(tp_chan_send(a.ch, 0x100, TOKEN, strlen(TOKEN)), 0);
		uint16_t type;
		void *p;
		size_t len;
		CHECK_EQ_INT(tp_chan_recv(b.ch, &type, &p, &len, 1000), 0);
		CHECK(len == strlen(TOKEN) && memcmp(p, TOKEN, len) == 0);
	}
	tp_chan_free(a.ch);
	tp_chan_free(b.ch);
	pthread_join(pt, NULL);
	close(s1[1]);
	close(s2[1]);
	CHECK(x.len > 2 * (4 + 2 + 64));
	CHECK(!contains(x.cap, x.len, TOKEN, strlen(TOKEN)));
	CHECK(!contains(x.cap, x.len, TOKEN, 8)); /* not even a prefix */
	CHECK(!contains(x.cap, x.len, K1.auth, 8));
	CHECK(contains(x.cap, x.len, K1.cid, TP_CID_BYTES)); /* the public ID is there, as meant */
	free(x.cap);
}

int main(void)
{
	char err[128];
	if (sodium_init() < 0)
		return 1;
	tp_keys_set_cost_for_tests(1, 8192);
	if (tp_keys_derive(&K1, TOKEN, strlen(TOKEN), err, sizeof err) ||
	    tp_keys_derive(&K2, TOKEN2, strlen(TOKEN2), err, sizeof err)) {
		fprintf(stderr, "keys: %s\n", err);
		return 1;
	}
	RUN(keys_deterministic_and_distinct);
	RUN(keys_default_cost);
	RUN(id_hex);
	RUN(hostport_parse);
	RUN(handshake_and_messages);
	RUN(largest_message);
	RUN(wrong_token_fails_on_both_sides);
	RUN(forged_cluster_id_fails_authentication);
	RUN(tampered_replayed_reordered_frames_rejected);
	RUN(oversized_frame_after_handshake);
	RUN(partial_frame_survives_timeout);
	RUN(two_senders_one_receiver);
	RUN(tcp_connect_accept);
	RUN(silent_peer_times_out);
	RUN(garbage_peer_gets_clean_error);
	RUN(capture_never_contains_token);
	return harness_done();
}
