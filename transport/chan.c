/*
 * chan.c: the authenticated, encrypted channel: handshake, sealed frames, blocking send/recv with
 * deadlines on top of the non-blocking progress calls that group.c also drives.
 *
 * Handshake (both roles run the same steps; I = initiator/connect, R = responder/accept):
 *   1. send HELLO (fresh nonce), receive the peer's HELLO; a different cluster ID fails here.
 *   2. T = HELLO_I || HELLO_R (wire bytes). Send AUTH = crypto_auth(auth, my role || T), receive
 *      the peer's AUTH and verify it against the peer's role. The role byte stops a reflected
 *      AUTH from passing; the fresh nonces stop a replayed one.
 *   3. crypto_generichash(key = auth, "shoal-session-v1" || T) -> 64 bytes: [0,32) seals I->R,
 *      [32,64) seals R->I. Counters start at 0.
 * Both AUTHs are sent before either is checked, so a wrong token fails on both sides.
 *
 * Invariants: a channel is usable iff dead == 0; once any error other than a receive timeout
 * happens, dead holds it and every call returns it. Keys are wiped in tp_chan_free.
 */
#include "transport/chan.h"

#include <errno.h>
#include <poll.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "transport/keys.h"

#ifndef MSG_NOSIGNAL /* macOS: SO_NOSIGPIPE is set on the socket instead */
#define MSG_NOSIGNAL 0
#endif

#define TP_HS_MAX_BODY 256 /* largest plaintext frame accepted during the handshake */
#define TP_SEND_TIMEOUT_MS 10000

static const char tp_session_label[] = "shoal-session-v1";

static int tp_chan_kill(tp_chan_t *c, int err)
{
	int none = 0;
	atomic_compare_exchange_strong(&c->dead, &none, err);
	return atomic_load(&c->dead);
}

static int tp_buf_reserve(uint8_t **buf, size_t *cap, size_t need)
{
	if (*cap >= need)
		return 0;
	size_t ncap = *cap ? *cap : 256;
	while (ncap < need)
		ncap *= 2;
	uint8_t *nb = realloc(*buf, ncap);
	if (!nb)
		return SH_ENOMEM;
	*buf = nb;
	*cap = ncap;
	return 0;
}

static void tp_nonce(uint8_t n[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES], uint64_t ctr)
{
	memset(n, 0, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
	tp_put64(n, ctr);
}

int tp_chan_tx_start(tp_chan_t *c, uint16_t type, const void *hdr, size_t hlen, const void *data,
		     size_t dlen)
{
	if (c->dead)
		return c->dead;
	if (hlen + dlen > TP_MAX_PAYLOAD || hlen > TP_MAX_PAYLOAD)
		return SH_EINVAL;
	size_t body = TP_FRAME_TYPE + hlen + dlen + (c->sealed ? TP_FRAME_TAG : 0);
	if (tp_buf_reserve(&c->tx_buf, &c->tx_cap, TP_FRAME_HDR + body))
		return SH_ENOMEM;
	uint8_t *p = c->tx_buf;
	tp_put32(p, (uint32_t)body);
	tp_put16(p + TP_FRAME_HDR, type);
	if (hlen)
		memcpy(p + TP_FRAME_HDR + TP_FRAME_TYPE, hdr, hlen);
	if (dlen)
		memcpy(p + TP_FRAME_HDR + TP_FRAME_TYPE + hlen, data, dlen);
	if (c->sealed) {
		uint8_t nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
		size_t mlen = TP_FRAME_TYPE + hlen + dlen;
		tp_nonce(nonce, c->tx_ctr++);
		crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
			p + TP_FRAME_HDR, p + TP_FRAME_HDR + mlen, NULL, p + TP_FRAME_HDR, mlen,
			p, TP_FRAME_HDR, NULL, nonce, c->tx_key);
	}
	c->tx_len = TP_FRAME_HDR + body;
	c->tx_off = 0;
	return 0;
}

int tp_chan_tx_progress(tp_chan_t *c)
{
	if (c->dead)
		return c->dead;
	while (c->tx_off < c->tx_len) {
		ssize_t n = send(c->fd, c->tx_buf + c->tx_off, c->tx_len - c->tx_off,
				 MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n > 0) {
			c->tx_off += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		return tp_chan_kill(c, (errno == EPIPE || errno == ECONNRESET) ? SH_ECLOSED
									       : SH_EIO);
	}
	return 1;
}

/* Opens the completed frame in place: checks the tag, sets rx_type. */
static int tp_chan_rx_open(tp_chan_t *c)
{
	uint8_t *body = c->rx_buf + TP_FRAME_HDR;
	size_t n = c->rx_body;
	if (c->sealed) {
		uint8_t nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
		if (n < TP_FRAME_TYPE + TP_FRAME_TAG)
			return tp_chan_kill(c, SH_EFORMAT);
		tp_nonce(nonce, c->rx_ctr);
		if (crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
			    body, NULL, body, n - TP_FRAME_TAG, body + n - TP_FRAME_TAG, c->rx_buf,
			    TP_FRAME_HDR, nonce, c->rx_key) != 0)
			return tp_chan_kill(c, SH_EAUTH);
		c->rx_ctr++;
	} else if (n < TP_FRAME_TYPE) {
		return tp_chan_kill(c, SH_EFORMAT);
	}
	c->rx_type = tp_get16(body);
	c->rx_done = 1;
	return 1;
}

int tp_chan_rx_progress(tp_chan_t *c)
{
	if (c->dead)
		return c->dead;
	if (c->rx_done) { /* the caller has the previous frame; start the next one */
		c->rx_done = 0;
		c->rx_got = 0;
		c->rx_body = 0;
	}
	for (;;) {
		/* rx_body == 0: the header is not in yet. With the frame's size known (rx_hint),
		 * header and body come in one recv: a frame of another size is an error anyway */
		size_t want = TP_FRAME_HDR + c->rx_body;
		if (!c->rx_body && c->sealed && c->rx_hint > TP_FRAME_HDR) {
			if (tp_buf_reserve(&c->rx_buf, &c->rx_cap, c->rx_hint))
				return tp_chan_kill(c, SH_ENOMEM);
			want = c->rx_hint;
		}
		if (c->rx_body && c->rx_got == want) {
			c->rx_hint = 0;
			return tp_chan_rx_open(c);
		}
		ssize_t n = recv(c->fd, c->rx_buf + c->rx_got, want - c->rx_got, MSG_DONTWAIT);
		if (n == 0)
			return tp_chan_kill(c, SH_ECLOSED);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return tp_chan_kill(c, errno == ECONNRESET ? SH_ECLOSED : SH_EIO);
		}
		c->rx_got += (size_t)n;
		if (!c->rx_body && c->rx_got >= TP_FRAME_HDR) {
			int64_t body = tp_frame_hdr_parse(
				c->rx_buf, c->sealed ? TP_FRAME_MAX_BODY : TP_HS_MAX_BODY);
			if (body < 0 || c->rx_got > TP_FRAME_HDR + (uint64_t)body)
				return tp_chan_kill(c, SH_EFORMAT); /* read past it: not the frame
								       we were told to expect */
			c->rx_body = (uint32_t)body;
			if (tp_buf_reserve(&c->rx_buf, &c->rx_cap, TP_FRAME_HDR + c->rx_body))
				return tp_chan_kill(c, SH_ENOMEM);
		}
	}
}

void tp_chan_rx_take(tp_chan_t *c, uint16_t *type, uint8_t **payload, size_t *len)
{
	*type = c->rx_type;
	*payload = c->rx_buf + TP_FRAME_HDR + TP_FRAME_TYPE;
	*len = c->rx_body - TP_FRAME_TYPE - (c->sealed ? TP_FRAME_TAG : 0);
}

/* Sends the started frame, waiting for socket space until the deadline. */
static int tp_chan_tx_finish(tp_chan_t *c, int64_t deadline)
{
	for (;;) {
		int rc = tp_chan_tx_progress(c);
		if (rc != 0)
			return rc < 0 ? rc : 0;
		rc = tp_wait_fd(c->fd, POLLOUT, deadline);
		if (rc)
			return tp_chan_kill(c, rc); /* a half-sent frame cannot be resumed */
	}
}

static int tp_chan_recv_until(tp_chan_t *c, uint16_t *type, uint8_t **payload, size_t *len,
			      int64_t deadline)
{
	for (;;) {
		int rc = tp_chan_rx_progress(c);
		if (rc < 0)
			return rc;
		if (rc == 1) {
			tp_chan_rx_take(c, type, payload, len);
			return 0;
		}
		rc = tp_wait_fd(c->fd, POLLIN, deadline);
		if (rc == SH_ETIMEDOUT)
			return rc; /* partial frame kept; the channel lives */
		if (rc)
			return tp_chan_kill(c, rc);
	}
}

int tp_chan_send(tp_chan_t *c, uint16_t type, const void *payload, size_t len)
{
	if (!c)
		return SH_EINVAL;
	if (len > TP_MAX_PAYLOAD || (len && !payload))
		return SH_EINVAL;
	pthread_mutex_lock(&c->tx_lock);
	int rc = tp_chan_tx_start(c, type, NULL, 0, payload, len);
	if (rc == 0)
		rc = tp_chan_tx_finish(c, tp_deadline(c->send_timeout_ms));
	pthread_mutex_unlock(&c->tx_lock);
	return rc;
}

int tp_chan_recv(tp_chan_t *c, uint16_t *type, void **payload, size_t *len, int timeout_ms)
{
	if (!c)
		return SH_EINVAL;
	uint8_t *p = NULL;
	int rc = tp_chan_recv_until(c, type, &p, len, tp_deadline(timeout_ms));
	*payload = p;
	return rc;
}

const uint8_t *tp_chan_peer_id(const tp_chan_t *c) { return c->peer_id; }
const char *tp_chan_peer_addr(const tp_chan_t *c) { return c->peer_addr; }
int tp_chan_fd(const tp_chan_t *c) { return c->fd; }
int tp_chan_pending(const tp_chan_t *c)
{
	(void)c; /* frames are read exactly, never ahead: nothing is ever buffered beyond one */
	return 0;
}
void tp_chan_set_send_timeout(tp_chan_t *c, int timeout_ms) { c->send_timeout_ms = timeout_ms; }

void tp_chan_free(tp_chan_t *c)
{
	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	sodium_memzero(c->tx_key, sizeof c->tx_key);
	sodium_memzero(c->rx_key, sizeof c->rx_key);
	pthread_mutex_destroy(&c->tx_lock);
	free(c->tx_buf);
	free(c->rx_buf);
	free(c);
}

/* ---- handshake ---------------------------------------------------------------------------- */

/* Handshake failures are logged at most once per TP_HS_LOG_MS for the same peer host and
 * reason (a peer with another token retries forever); the error still goes to the caller. */
#define TP_HS_LOG_MS 30000
#define TP_HS_LOG_SLOTS 16

static struct {
	uint64_t key;
	int64_t last_ms;
	int suppressed;
} tp_hs_log[TP_HS_LOG_SLOTS];
static pthread_mutex_t tp_hs_log_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t tp_hash(uint64_t h, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull; /* FNV-1a */
	return h;
}

static void tp_hs_log_failure(const char *addr, const char *why)
{
	/* the host part only: source ports change on every retry */
	const char *colon = strrchr(addr, ':');
	size_t hl = colon ? (size_t)(colon - addr) : strlen(addr);
	uint64_t key = tp_hash(tp_hash(0xcbf29ce484222325ull, addr, hl), why, strlen(why));
	int64_t now = now_ms();
	int suppressed = -1;
	pthread_mutex_lock(&tp_hs_log_lock);
	int slot = 0;
	for (int i = 0; i < TP_HS_LOG_SLOTS; i++) {
		if (tp_hs_log[i].key == key) {
			slot = i;
			break;
		}
		if (tp_hs_log[i].last_ms < tp_hs_log[slot].last_ms)
			slot = i; /* oldest, reused when the key is new */
	}
	if (tp_hs_log[slot].key != key) {
		tp_hs_log[slot].key = key;
		tp_hs_log[slot].last_ms = now;
		tp_hs_log[slot].suppressed = 0;
		suppressed = 0;
	} else if (now - tp_hs_log[slot].last_ms >= TP_HS_LOG_MS) {
		suppressed = tp_hs_log[slot].suppressed;
		tp_hs_log[slot].last_ms = now;
		tp_hs_log[slot].suppressed = 0;
	} else {
		tp_hs_log[slot].suppressed++;
	}
	pthread_mutex_unlock(&tp_hs_log_lock);
	if (suppressed == 0)
		LOG(LOG_WARN, "handshake with %s failed: %s", addr, why);
	else if (suppressed > 0)
		LOG(LOG_WARN, "handshake with %s failed: %s (%d more in the last %d s)", addr, why,
		    suppressed, TP_HS_LOG_MS / 1000);
}

static tp_chan_t *tp_chan_alloc(int fd)
{
	tp_chan_t *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->fd = fd;
	c->send_timeout_ms = TP_SEND_TIMEOUT_MS;
	pthread_mutex_init(&c->tx_lock, NULL);
	if (tp_buf_reserve(&c->rx_buf, &c->rx_cap, TP_FRAME_HDR + TP_HS_MAX_BODY)) {
		free(c);
		return NULL;
	}
	return c;
}

/* Receives one plaintext handshake message of exactly want bytes and type. */
static int tp_hs_recv(tp_chan_t *c, uint16_t want_type, size_t want_len, uint8_t *out,
		      int64_t deadline, const char *what, char *err, size_t errlen)
{
	uint16_t type;
	uint8_t *p;
	size_t n;
	int rc = tp_chan_recv_until(c, &type, &p, &n, deadline);
	if (rc == SH_ETIMEDOUT)
		return sh_fail(err, errlen, rc, "no %s from the peer in time", what);
	if (rc == SH_ECLOSED)
		return sh_fail(err, errlen, rc, "peer closed the connection before its %s", what);
	if (rc == SH_EFORMAT)
		return sh_fail(err, errlen, rc, "peer sent a malformed frame instead of %s", what);
	if (rc)
		return sh_fail(err, errlen, rc, "receiving %s: %s", what, sh_strerror(rc));
	if (type != want_type || n != want_len) {
		char tb[8];
		return sh_fail(err, errlen, SH_EFORMAT, "peer sent %s (%zu bytes) instead of %s",
			       tp_msg_name(type, tb, sizeof tb), n, what);
	}
	memcpy(out, p, n);
	return 0;
}

static int tp_hs_send(tp_chan_t *c, uint16_t type, const uint8_t *p, size_t n, int64_t deadline,
		      const char *what, char *err, size_t errlen)
{
	int rc = tp_chan_tx_start(c, type, NULL, 0, p, n);
	if (rc == 0)
		rc = tp_chan_tx_finish(c, deadline);
	if (rc)
		return sh_fail(err, errlen, rc, "sending %s: %s", what, sh_strerror(rc));
	return 0;
}

static int tp_handshake(tp_chan_t *c, int initiator, const tp_keys_t *k, const uint8_t my_id[16],
			int64_t deadline, char *err, size_t errlen)
{
	tp_hello_t mine = {.magic = TP_PROTO_MAGIC, .version = TP_PROTO_VERSION}, theirs;
	uint8_t transcript[1 + 2 * TP_HELLO_WIRE], peer_wire[TP_HELLO_WIRE];
	uint8_t mac[TP_MAC_BYTES], peer_mac[TP_MAC_BYTES], skeys[64];
	uint8_t *hi = transcript + 1, *hr = transcript + 1 + TP_HELLO_WIRE;
	int rc;

	memcpy(mine.node_id, my_id, TP_NODE_ID_BYTES);
	memcpy(mine.cid, k->cid, TP_CID_BYTES);
	randombytes_buf(mine.nonce, sizeof mine.nonce);
	tp_hello_encode(initiator ? hi : hr, &mine);
	if ((rc = tp_hs_send(c, TP_MSG_HELLO, initiator ? hi : hr, TP_HELLO_WIRE, deadline,
			     "HELLO", err, errlen)))
		return rc;
	if ((rc = tp_hs_recv(c, TP_MSG_HELLO, TP_HELLO_WIRE, peer_wire, deadline, "HELLO", err,
			     errlen)))
		return rc;
	if ((rc = tp_hello_decode(&theirs, peer_wire, sizeof peer_wire, err, errlen)))
		return rc;
	memcpy(initiator ? hr : hi, peer_wire, TP_HELLO_WIRE);
	memcpy(c->peer_id, theirs.node_id, TP_NODE_ID_BYTES);
	if (sodium_memcmp(theirs.cid, k->cid, TP_CID_BYTES) != 0) {
		char hx[2 * TP_CID_BYTES + 1];
		sodium_bin2hex(hx, sizeof hx, theirs.cid, TP_CID_BYTES);
		return sh_fail(err, errlen, SH_EAUTH,
			       "peer does not hold our token (its cluster ID %s, ours %s)", hx,
			       k->cid_hex);
	}
	if (sodium_memcmp(theirs.nonce, mine.nonce, TP_NONCE_BYTES) == 0)
		return sh_fail(err, errlen, SH_EAUTH, "peer echoed our nonce (reflection)");

	transcript[0] = initiator ? 'I' : 'R';
	crypto_auth(mac, transcript, sizeof transcript, k->auth);
	if ((rc = tp_hs_send(c, TP_MSG_AUTH, mac, sizeof mac, deadline, "AUTH", err, errlen)))
		return rc;
	if ((rc = tp_hs_recv(c, TP_MSG_AUTH, TP_AUTH_WIRE, peer_mac, deadline, "AUTH", err,
			     errlen)))
		return rc;
	transcript[0] = initiator ? 'R' : 'I';
	if (crypto_auth_verify(peer_mac, transcript, sizeof transcript, k->auth) != 0)
		return sh_fail(err, errlen, SH_EAUTH,
			       "peer does not hold our token (authentication failed)");

	crypto_generichash_state st;
	crypto_generichash_init(&st, k->auth, TP_KEY_BYTES, sizeof skeys);
	crypto_generichash_update(&st, (const uint8_t *)tp_session_label,
				  sizeof tp_session_label - 1);
	crypto_generichash_update(&st, transcript + 1, sizeof transcript - 1);
	crypto_generichash_final(&st, skeys, sizeof skeys);
	memcpy(c->tx_key, skeys + (initiator ? 0 : 32), 32);
	memcpy(c->rx_key, skeys + (initiator ? 32 : 0), 32);
	sodium_memzero(skeys, sizeof skeys);
	sodium_memzero(&st, sizeof st);
	c->sealed = 1;
	c->tx_ctr = c->rx_ctr = 0;
	return 0;
}

static int tp_chan_start(tp_chan_t **out, int fd, int initiator, const char *addr,
			 const tp_keys_t *k, const uint8_t my_id[16], int64_t deadline, char *err,
			 size_t errlen)
{
	char ebuf[256] = "";
	*out = NULL;
	int rc = tp_sodium_init();
	if (rc) {
		close(fd);
		return sh_fail(err, errlen, rc, "libsodium failed to initialise");
	}
	tp_chan_t *c = tp_chan_alloc(fd);
	if (!c) {
		close(fd);
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	}
	if (addr)
		snprintf(c->peer_addr, sizeof c->peer_addr, "%s", addr);
	else
		tp_fd_peer_addr(fd, c->peer_addr, sizeof c->peer_addr);
	rc = tp_handshake(c, initiator, k, my_id, deadline, ebuf, sizeof ebuf);
	if (rc) {
		tp_hs_log_failure(c->peer_addr, ebuf);
		sh_fail(err, errlen, rc, "handshake with %s failed: %s", c->peer_addr, ebuf);
		tp_chan_free(c);
		return rc;
	}
	/* a frame buffer for ordinary traffic; grows later only for big collectives */
	(void)tp_buf_reserve(&c->tx_buf, &c->tx_cap, 4096);
	(void)tp_buf_reserve(&c->rx_buf, &c->rx_cap, 4096);
	*out = c;
	return 0;
}

int tp_chan_connect(tp_chan_t **out, const char *host, int port, const tp_keys_t *k,
		    const uint8_t my_id[TP_NODE_ID_BYTES], int timeout_ms, char *err,
		    size_t errlen)
{
	int64_t deadline = tp_deadline(timeout_ms);
	char addr[64];
	int fd;
	*out = NULL;
	int rc = tp_tcp_connect(host, port, deadline, &fd, addr, sizeof addr, err, errlen);
	if (rc)
		return rc;
	return tp_chan_start(out, fd, 1, addr, k, my_id, deadline, err, errlen);
}

int tp_chan_accept(tp_chan_t **out, int fd, const tp_keys_t *k,
		   const uint8_t my_id[TP_NODE_ID_BYTES], int timeout_ms, char *err,
		   size_t errlen)
{
	*out = NULL;
	if (fd < 0)
		return sh_fail(err, errlen, SH_EINVAL, "bad socket");
	tp_tcp_tune(fd);
	return tp_chan_start(out, fd, 0, NULL, k, my_id, tp_deadline(timeout_ms), err, errlen);
}

int tp_chan_open_fd(tp_chan_t **out, int fd, int initiator, const tp_keys_t *k,
		    const uint8_t my_id[TP_NODE_ID_BYTES], int timeout_ms, char *err,
		    size_t errlen)
{
	*out = NULL;
	if (fd < 0)
		return sh_fail(err, errlen, SH_EINVAL, "bad socket");
	return tp_chan_start(out, fd, initiator, NULL, k, my_id, tp_deadline(timeout_ms), err,
			     errlen);
}
