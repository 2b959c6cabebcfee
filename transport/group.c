/*
 * group.c: forming a group of ranks (a full mesh of authenticated channels), the exchange engine
 * every collective is made of, and point-to-point send/recv.
 *
 * Forming: rank r listens, connects to every rank < r (retrying until the deadline while that
 * rank is not up yet) and accepts from every rank > r. After the channel handshake the connecting
 * rank sends JOIN {rank, world, tag}; the accepting rank checks it (rank in range and above its
 * own, not yet connected, same world and tag, expected node ID when given) and answers JOIN_OK,
 * which the connecting rank checks the same way, or JOIN_NO with the reason (the refused rank
 * then fails at once). Strangers holding the token but sending a bad JOIN are dropped with a log
 * line; the accept loop goes on until the deadline. Then every pair negotiates RDMA (rdma.c).
 *
 * Invariant: g->chan[p] is a live, authenticated channel to rank p for every p != rank, or the
 * group is broken (g->broken != 0) and every call returns that error.
 */
#include "transport/group.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "transport/frame.h"
#include "transport/rdma.h"

#define TP_JOIN_STEP_MS 5000 /* per-connection handshake + JOIN budget while forming */

int tp_group_break(tp_group_t *g, int rc, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(g->broken_msg, sizeof g->broken_msg, fmt, ap);
	va_end(ap);
	if (!g->broken) {
		g->broken = rc;
		LOG(LOG_ERROR, "group rank %d: %s", g->rank, g->broken_msg);
	}
	return sh_fail(err, errlen, rc, "%s", g->broken_msg);
}

int tp_group_stalled_rank(const tp_group_t *g)
{
	return g && g->broken == SH_ETIMEDOUT ? g->stalled : -1;
}

int tp_group_check(tp_group_t *g, char *err, size_t errlen)
{
	if (!g)
		return sh_fail(err, errlen, SH_EINVAL, "no group");
	if (g->broken)
		return sh_fail(err, errlen, g->broken, "group is broken: %s", g->broken_msg);
	return 0;
}

void tp_xfer_reset(tp_group_t *g)
{
	memset(g->xf, 0, sizeof(g->xf[0]) * (size_t)g->world);
}

/* Checks a received COLL frame (type, payload) against what this exchange expects from p. */
static int tp_xfer_accept(tp_group_t *g, int p, uint16_t type, const uint8_t *payload,
			  size_t len, uint16_t op, uint16_t step, uint32_t offset, char *why,
			  size_t whylen)
{
	tp_coll_t c;
	if (type != TP_MSG_COLL) {
		char tb[8];
		snprintf(why, whylen, "sent %s during a collective", tp_msg_name(type, tb, sizeof tb));
		return SH_EFORMAT;
	}
	if (tp_coll_decode(&c, payload, len) != 0) {
		snprintf(why, whylen, "sent a malformed collective frame");
		return SH_EFORMAT;
	}
	if (c.seq != g->rx_seq[p] || c.op != op || c.step != step || c.offset != offset ||
	    (g->xf[p].rany ? c.len > g->xf[p].rlen : c.len != g->xf[p].rlen)) {
		snprintf(why, whylen,
			 "is out of step (got seq %u op %u step %u offset %u len %u, want %u %u %u "
			 "%u %zu)",
			 c.seq, c.op, c.step, c.offset, c.len, g->rx_seq[p], op, step, offset,
			 g->xf[p].rlen);
		return SH_EFORMAT;
	}
	g->rx_seq[p]++;
	g->xf[p].rlen = c.len;
	g->xf[p].rdata = payload + TP_COLL_WIRE;
	return 0;
}

int tp_group_exchange(tp_group_t *g, uint16_t op, uint16_t step, uint32_t offset,
		      int64_t deadline, int timeout_ms, const char *what, char *err, size_t errlen)
{
	uint8_t hdr[TP_COLL_WIRE + sizeof g->xf[0].spre];
	char why[160];
	int rc;
	for (int p = 0; p < g->world; p++) {
		tp_xfer_t *x = &g->xf[p];
		/* an RDMA pair carries frames that fit its registered buffer; both ends decide
		 * from the same length, so they always agree on the path */
		x->srdma = x->send && !x->tcp && !x->spre_len && g->rdma[p] &&
			   TP_COLL_WIRE + x->slen <= TP_RDMA_BUF_BYTES;
		x->rrdma = x->recv && !x->tcp && !x->rany && g->rdma[p] &&
			   TP_COLL_WIRE + x->rlen <= TP_RDMA_BUF_BYTES;
		if (x->rrdma && (rc = tp_rdma_recv_release(g->rdma[p])))
			return tp_group_break(g, rc, err, errlen, "%s: rank %d (%s): RDMA receive "
					      "failed", what, p, g->addr[p]);
		if (!x->send)
			continue;
		tp_coll_t c = {.seq = g->tx_seq[p],
			       .op = op,
			       .step = step,
			       .offset = offset,
			       .len = (uint32_t)(x->spre_len + x->slen)};
		tp_coll_encode(hdr, &c);
		memcpy(hdr + TP_COLL_WIRE, x->spre, (size_t)x->spre_len);
		if (x->srdma)
			rc = tp_rdma_send(g->rdma[p], hdr, TP_COLL_WIRE, x->sdata, x->slen);
		else
			rc =
			    tp_chan_tx_start(g->chan[p], TP_MSG_COLL, hdr,
					     TP_COLL_WIRE + (size_t)x->spre_len, x->sdata, x->slen);
		if (rc)
			return tp_group_break(g, rc, err, errlen, "%s: rank %d (%s): %s", what, p,
					      g->addr[p], sh_strerror(rc));
		g->tx_seq[p]++;
	}
	struct pollfd pfd[TP_MAX_WORLD];
	int who[TP_MAX_WORLD];
	int64_t spin_until = g->spin_ns ? now_ns() + g->spin_ns : 0;
	for (;;) {
		int n = 0, spin = 0;
		for (int p = 0; p < g->world; p++) {
			tp_xfer_t *x = &g->xf[p];
			short ev = 0;
			if (x->send && !x->sdone && x->srdma) {
				rc = tp_rdma_send_poll(g->rdma[p]);
				if (rc < 0)
					goto peer_failed;
				if (rc == 1) {
					x->sdone = 1;
					g->bytes_sent += x->slen;
				} else {
					spin = 1;
				}
			}
			if (x->recv && !x->rdone && x->rrdma) {
				const uint8_t *rp;
				size_t rl;
				rc = tp_rdma_recv_poll(g->rdma[p], &rp, &rl);
				if (rc < 0)
					goto peer_failed;
				if (rc == 1) {
					rc = tp_xfer_accept(g, p, TP_MSG_COLL, rp, rl, op, step,
							    offset, why, sizeof why);
					if (rc)
						return tp_group_break(g, rc, err, errlen,
								      "%s: rank %d (%s) %s", what,
								      p, g->addr[p], why);
					x->rdone = 1;
				} else {
					spin = 1;
				}
			}
			if (x->send && !x->sdone && !x->srdma) {
				rc = tp_chan_tx_progress(g->chan[p]);
				if (rc < 0)
					goto peer_failed;
				if (rc == 1) {
					x->sdone = 1;
					g->bytes_sent += (size_t)x->spre_len + x->slen;
				} else {
					ev |= POLLOUT;
				}
			}
			if (x->recv && !x->rdone && !x->rrdma) {
				tp_chan_t *c = g->chan[p];
				if (!x->rany && (c->rx_done || !c->rx_got)) /* one recv per frame */
					c->rx_hint = TP_FRAME_HDR + TP_FRAME_TYPE + TP_COLL_WIRE +
						     x->rlen + TP_FRAME_TAG;
				rc = tp_chan_rx_progress(g->chan[p]);
				if (rc < 0)
					goto peer_failed;
				if (rc == 1) {
					uint16_t type;
					uint8_t *pl;
					size_t pn;
					tp_chan_rx_take(g->chan[p], &type, &pl, &pn);
					rc = tp_xfer_accept(g, p, type, pl, pn, op, step, offset,
							    why, sizeof why);
					if (rc)
						return tp_group_break(g, rc, err, errlen,
								      "%s: rank %d (%s) %s", what,
								      p, g->addr[p], why);
					x->rdone = 1;
				} else {
					ev |= POLLIN;
				}
			}
			if (ev) {
				pfd[n] = (struct pollfd){.fd = tp_chan_fd(g->chan[p]), .events = ev};
				who[n++] = p;
			}
			continue;
		peer_failed:
			return tp_group_break(g, rc, err, errlen, "%s: rank %d (%s): %s", what, p,
					      g->addr[p],
					      rc == SH_ECLOSED ? "connection lost" : sh_strerror(rc));
		}
		if (n == 0 && !spin)
			return 0;
		/* RDMA completions are polled: spin (poll without waiting) while any is pending.
		 * TCP: poll without sleeping for a short while first: the answer of a peer that is
		 * in step arrives within about one link latency, and sleeping until it does costs a
		 * wake-up (tens of us on a VM, a scheduler slice on a busy core) */
		int r = poll(pfd, (nfds_t)n, spin || spin_until ? 0 : tp_left_ms(deadline));
		while (r == 0 && !spin && spin_until) {
			if (now_ns() >= spin_until) {
				spin_until = 0;
				r = poll(pfd, (nfds_t)n, tp_left_ms(deadline));
			} else {
				r = poll(pfd, (nfds_t)n, 0);
			}
		}
		if (r == 0 && spin && tp_left_ms(deadline) != 0)
			continue;
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return tp_group_break(g, SH_EIO, err, errlen, "%s: poll: %s", what,
					      strerror(errno));
		if (r == 0) {
			int p = n ? who[0] : 0;
			for (int q = 0; !n && q < g->world; q++)
				if ((g->xf[q].send && !g->xf[q].sdone) ||
				    (g->xf[q].recv && !g->xf[q].rdone))
					p = q;
			if (!g->broken)
				g->stalled = p;
			return tp_group_break(g, SH_ETIMEDOUT, err, errlen,
					      "%s: rank %d (%s) did not %s within %d ms", what, p,
					      g->addr[p],
					      (n && (pfd[0].events & POLLOUT)) ? "take our data" : "answer",
					      timeout_ms);
		}
	}
}

/* ---- point to point ----------------------------------------------------------------------- */

static int tp_peer_ok(tp_group_t *g, int peer, char *err, size_t errlen)
{
	if (peer < 0 || peer >= g->world || peer == g->rank)
		return sh_fail(err, errlen, SH_EINVAL, "bad peer rank %d", peer);
	return 0;
}

int tp_group_send(tp_group_t *g, int to, const void *buf, size_t len, int timeout_ms, char *err,
		  size_t errlen)
{
	int rc = tp_group_check(g, err, errlen);
	if (rc || (rc = tp_peer_ok(g, to, err, errlen)))
		return rc;
	int64_t deadline = tp_deadline(timeout_ms);
	const uint8_t *p = buf;
	size_t seg = TP_MAX_PAYLOAD - TP_COLL_WIRE;
	for (size_t off = 0; off == 0 || off < len; off += seg) {
		tp_xfer_reset(g);
		g->xf[to].send = 1;
		g->xf[to].sdata = p + off;
		g->xf[to].slen = MIN(seg, len - off);
		rc = tp_group_exchange(g, TP_OP_P2P, 0, (uint32_t)(off / seg), deadline,
				       timeout_ms, "send", err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

int tp_group_recv(tp_group_t *g, int from, void *buf, size_t len, int timeout_ms, char *err,
		  size_t errlen)
{
	int rc = tp_group_check(g, err, errlen);
	if (rc || (rc = tp_peer_ok(g, from, err, errlen)))
		return rc;
	int64_t deadline = tp_deadline(timeout_ms);
	uint8_t *p = buf;
	size_t seg = TP_MAX_PAYLOAD - TP_COLL_WIRE;
	for (size_t off = 0; off == 0 || off < len; off += seg) {
		tp_xfer_reset(g);
		g->xf[from].recv = 1;
		g->xf[from].rlen = MIN(seg, len - off);
		rc = tp_group_exchange(g, TP_OP_P2P, 0, (uint32_t)(off / seg), deadline,
				       timeout_ms, "recv", err, errlen);
		if (rc)
			return rc;
		if (g->xf[from].rlen)
			memcpy(p + off, g->xf[from].rdata, g->xf[from].rlen);
	}
	return 0;
}

/* ---- forming ------------------------------------------------------------------------------ */

static int tp_join_check(const tp_group_t *g, const tp_group_cfg_t *cfg, const tp_join_t *j,
			 int want_rank, const tp_chan_t *c, char *why, size_t whylen)
{
	if (j->world != (uint32_t)g->world || j->group != g->tag) {
		snprintf(why, whylen, "belongs to another group (world %u tag %llx, ours %d %llx)",
			 j->world, (unsigned long long)j->group, g->world,
			 (unsigned long long)g->tag);
		return SH_EBUSY; /* a group of an older or newer plan holds the port: it may pass */
	}
	if (want_rank >= 0 ? j->rank != (uint32_t)want_rank
			   : (j->rank <= (uint32_t)g->rank || j->rank >= (uint32_t)g->world)) {
		snprintf(why, whylen, "claims rank %u", j->rank);
		return SH_EINVAL;
	}
	if (want_rank < 0 && g->chan[j->rank]) {
		snprintf(why, whylen, "claims rank %u, which is already connected", j->rank);
		return SH_EINVAL;
	}
	if (cfg->peer_ids && memcmp(tp_chan_peer_id(c), cfg->peer_ids[j->rank], 16) != 0) {
		char a[33], b[33];
		snprintf(why, whylen, "claims rank %u but is node %s, not %s", j->rank,
			 tp_id_hex(a, tp_chan_peer_id(c)), tp_id_hex(b, cfg->peer_ids[j->rank]));
		return SH_EAUTH;
	}
	return 0;
}

/* Sends our JOIN (or JOIN_OK) and receives the peer's answer within the deadline. */
static int tp_join_recv(tp_chan_t *c, uint16_t want_type, tp_join_t *j, int64_t deadline,
			char *why, size_t whylen)
{
	uint16_t type;
	void *p;
	size_t len;
	int rc = tp_chan_recv(c, &type, &p, &len, tp_left_ms(deadline));
	if (rc) {
		snprintf(why, whylen, "no JOIN: %s", sh_strerror(rc));
		return rc;
	}
	if (type == TP_MSG_JOIN_NO && want_type == TP_MSG_JOIN_OK) {
		char r[201];
		size_t n = MIN(len, sizeof r - 1);
		memcpy(r, p, n);
		r[n] = 0;
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)r[i] < 32 || (unsigned char)r[i] > 126)
				r[i] = '?';
		snprintf(why, whylen, "refused us (from its side: %.150s)", r);
		return SH_EAUTH;
	}
	if (type != want_type || tp_join_decode(j, p, len) != 0) {
		snprintf(why, whylen, "sent a bad JOIN");
		return SH_EFORMAT;
	}
	return 0;
}

static int tp_group_connect_lower(tp_group_t *g, const tp_group_cfg_t *cfg, int p,
				  int64_t deadline, char *err, size_t errlen)
{
	char e[256] = "", why[200];
	uint8_t w[TP_JOIN_WIRE];
	tp_join_t mine = {.rank = (uint32_t)g->rank, .world = (uint32_t)g->world, .group = g->tag};
	tp_join_t theirs;
	for (int attempt = 0;; attempt++) {
		tp_chan_t *c = NULL;
		int left = tp_left_ms(deadline);
		if (cfg->cancel && atomic_load(cfg->cancel))
			return sh_fail(err, errlen, SH_ECANCELED, "forming canceled");
		if (left == 0)
			return sh_fail(err, errlen, SH_ETIMEDOUT, "rank %d (%s:%d) not reachable: %s",
				       p, cfg->hosts[p], cfg->ports[p], e);
		int rc = tp_chan_connect(&c, cfg->hosts[p], cfg->ports[p], cfg->keys, cfg->node_id,
					 MIN(left, TP_JOIN_STEP_MS), e, sizeof e);
		if (rc == SH_EAUTH || rc == SH_EUNSUPP)
			return sh_fail(err, errlen, rc, "rank %d: %s", p, e);
		if (rc) { /* not up yet: retry */
			struct timespec ts = {0, 50 * 1000000L};
			nanosleep(&ts, NULL);
			continue;
		}
		tp_join_encode(w, &mine);
		rc = tp_chan_send(c, TP_MSG_JOIN, w, sizeof w);
		if (rc == 0)
			rc = tp_join_recv(c, TP_MSG_JOIN_OK, &theirs, deadline, why, sizeof why);
		else
			snprintf(why, sizeof why, "JOIN not sent: %s", sh_strerror(rc));
		if (rc == 0)
			rc = tp_join_check(g, cfg, &theirs, p, c, why, sizeof why);
		if (rc) {
			tp_chan_free(c);
			if (rc == SH_ECLOSED && tp_left_ms(deadline) > 0)
				continue; /* it dropped us (e.g. a restart): try again */
			return sh_fail(err, errlen, rc, "rank %d (%s:%d) %s", p, cfg->hosts[p],
				       cfg->ports[p], why);
		}
		g->chan[p] = c;
		snprintf(g->addr[p], sizeof g->addr[p], "%s", tp_chan_peer_addr(c));
		return 0;
	}
}

static int tp_group_accept_higher(tp_group_t *g, const tp_group_cfg_t *cfg, int lfd,
				  int64_t deadline, char *err, size_t errlen)
{
	int missing = g->world - 1 - g->rank;
	char e[256], why[200], peer[64];
	uint8_t w[TP_JOIN_WIRE];
	tp_join_t mine = {.rank = (uint32_t)g->rank, .world = (uint32_t)g->world, .group = g->tag};
	while (missing > 0) {
		int fd, left = tp_left_ms(deadline);
		if (cfg->cancel && atomic_load(cfg->cancel))
			return sh_fail(err, errlen, SH_ECANCELED, "forming canceled");
		/* with a cancel flag, wait in slices so that the flag is seen soon */
		int slice = cfg->cancel && (left < 0 || left > 100) ? 100 : left;
		int rc = left == 0 ? SH_ETIMEDOUT : tp_accept(lfd, &fd, peer, sizeof peer, slice, e,
							      sizeof e);
		if (rc == SH_ETIMEDOUT && slice != left)
			continue;
		if (rc) {
			char lst[128] = "";
			for (int p = g->rank + 1; p < g->world; p++)
				if (!g->chan[p] && strlen(lst) < sizeof lst - 8)
					snprintf(lst + strlen(lst), sizeof lst - strlen(lst), " %d",
						 p);
			return sh_fail(err, errlen, rc, "ranks%s did not join: %s", lst,
				       rc == SH_ETIMEDOUT ? "timed out" : e);
		}
		tp_chan_t *c = NULL;
		tp_join_t theirs;
		rc = tp_chan_accept(&c, fd, cfg->keys, cfg->node_id, MIN(left, TP_JOIN_STEP_MS), e,
				    sizeof e);
		if (rc)
			continue; /* logged by the channel; a stranger does not stop the group */
		int64_t jd = tp_deadline(MIN(left, TP_JOIN_STEP_MS));
		rc = tp_join_recv(c, TP_MSG_JOIN, &theirs, jd, why, sizeof why);
		if (rc == 0)
			rc = tp_join_check(g, cfg, &theirs, -1, c, why, sizeof why);
		if (rc == 0) {
			tp_join_encode(w, &mine);
			rc = tp_chan_send(c, TP_MSG_JOIN_OK, w, sizeof w);
			if (rc)
				snprintf(why, sizeof why, "JOIN_OK not sent: %s", sh_strerror(rc));
		}
		if (rc == SH_EBUSY) { /* another group's rank: our JOIN_OK says which, it retries */
			tp_join_encode(w, &mine);
			(void)tp_chan_send(c, TP_MSG_JOIN_OK, w, sizeof w);
		} else if (rc == SH_EINVAL || rc == SH_EAUTH) { /* say why: it fails at once too */
			(void)tp_chan_send(c, TP_MSG_JOIN_NO, why, MIN(strlen(why), 200));
		}
		if (rc) {
			LOG(LOG_WARN, "group rank %d: dropping %s: %s", g->rank, peer, why);
			tp_chan_free(c);
			continue;
		}
		g->chan[theirs.rank] = c;
		snprintf(g->addr[theirs.rank], sizeof g->addr[0], "%s", tp_chan_peer_addr(c));
		missing--;
	}
	return 0;
}

int tp_group_new(tp_group_t **out, const tp_group_cfg_t *cfg, char *err, size_t errlen)
{
	*out = NULL;
	if (!cfg || cfg->world < 1 || cfg->world > TP_MAX_WORLD || cfg->rank < 0 ||
	    cfg->rank >= cfg->world || !cfg->keys || !cfg->node_id ||
	    (cfg->world > 1 && (!cfg->hosts || !cfg->ports)))
		return sh_fail(err, errlen, SH_EINVAL, "bad group configuration");
	tp_group_t *g = calloc(1, sizeof *g);
	if (!g)
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	g->rank = cfg->rank;
	g->world = cfg->world;
	g->tag = cfg->tag;
	g->stalled = -1;
	g->direct_max = TP_DIRECT_MAX_DEFAULT;
	g->spin_ns = (int64_t)TP_SPIN_US_DEFAULT * 1000;
	const char *spin = getenv("SHOAL_TP_SPIN_US"), *stream = getenv("SHOAL_TP_STREAM");
	if (spin && *spin) /* for measurements */
		g->spin_ns = (int64_t)atoi(spin) * 1000;
	g->stream = stream && *stream ? atoi(stream) : -1;
	snprintf(g->addr[g->rank], sizeof g->addr[0], "self");
	int64_t deadline = tp_deadline(cfg->timeout_ms);
	int lfd = cfg->listen_fd, own_lfd = 0, rc = 0;
	char e[256] = "";
	if (g->world > 1 && g->rank < g->world - 1 && lfd < 0) {
		rc = tp_listen(NULL, cfg->ports[g->rank], &lfd, NULL, e, sizeof e);
		if (rc)
			goto fail;
		own_lfd = 1;
	}
	for (int p = 0; p < g->rank; p++)
		if ((rc = tp_group_connect_lower(g, cfg, p, deadline, e, sizeof e)))
			goto fail;
	if (g->rank < g->world - 1 &&
	    (rc = tp_group_accept_higher(g, cfg, lfd, deadline, e, sizeof e)))
		goto fail;
	if (own_lfd)
		close(lfd);
	own_lfd = 0;
	/* always negotiated (declines when no matrix), so ranks started with and without a
	 * matrix still agree pair by pair; a short extra budget when forming used it all */
	if (g->world > 1)
		tp_rdma_group_setup(g, cfg->rdma_devices,
				    deadline < 0 ? -1 : MAX(deadline, now_ms() + 2000));
	LOG(LOG_INFO, "group rank %d/%d formed (tag %llx)", g->rank, g->world,
	    (unsigned long long)g->tag);
	*out = g;
	return 0;
fail:
	if (own_lfd)
		close(lfd);
	LOG(LOG_ERROR, "group rank %d: %s", cfg->rank, e);
	sh_fail(err, errlen, rc, "%s", e);
	tp_group_free(g);
	return rc;
}

void tp_group_abort(tp_group_t *g)
{
	if (!g)
		return;
	/* shutdown keeps the descriptors valid for the thread using them; its next wait or
	 * read sees end-of-file or an error at once */
	for (int p = 0; p < g->world; p++)
		if (g->chan[p] && g->chan[p]->fd >= 0)
			shutdown(g->chan[p]->fd, SHUT_RDWR);
}

void tp_group_free(tp_group_t *g)
{
	if (!g)
		return;
	for (int p = 0; p < g->world; p++) {
		tp_rdma_link_free(g->rdma[p]);
		tp_chan_free(g->chan[p]);
	}
	free(g->qbuf);
	free(g->st.stage);
	free(g);
}

int tp_group_rank(const tp_group_t *g) { return g->rank; }
int tp_group_world(const tp_group_t *g) { return g->world; }
uint64_t tp_group_bytes_sent(const tp_group_t *g) { return g->bytes_sent; }

int tp_group_set_spin(tp_group_t *g, int us)
{
	if (!g || us < 0)
		return SH_EINVAL;
	g->spin_ns = (int64_t)us * 1000;
	return 0;
}

const char *tp_group_link(const tp_group_t *g, int peer)
{
	if (peer == g->rank)
		return "self";
	if (peer < 0 || peer >= g->world)
		return "none";
	return g->rdma[peer] ? "rdma" : "tcp";
}
