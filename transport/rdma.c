/*
 * rdma.c: the verbs half of the RDMA backend: per pair, a reliable-connected queue pair on the
 * device the JACCL matrix names, one registered send and one registered receive buffer reused by
 * every call, and the set-up handshake over the pair's authenticated channel.
 *
 * Set-up (tp_rdma_group_setup, run by every rank right after the group forms, whether or not it
 * was given a matrix, so mismatched options still agree):
 *   1. for every peer: build an offer (QP in INIT, its address data) or a decline with a reason;
 *      send RDMA_QP to all peers, then receive every peer's RDMA_QP.
 *   2. where both offered: move the QP to RTR (peer's QPN/PSN/LID/GID) and RTS; send RDMA_READY
 *      {1 or 0} to all, receive all. A pair uses RDMA only if both ends said ready.
 * Any failure leaves that pair on TCP with one logged reason (tp_rdma_decide words it).
 *
 * Data over RDMA is authenticated only by the channel that exchanged the queue-pair numbers
 * (a direct cable between two hosts); it is not encrypted. docs/rdma.md says so.
 *
 * Invariant: a link in g->rdma[] is fully connected (RTS) with its receive buffer posted or
 * held by the caller (recv_held); everything else was freed and the pair uses TCP.
 */
#include "transport/rdma.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "transport/frame.h"
#include "transport/group.h"

/* Built with verbs when the headers exist (Linux with libibverbs-dev; macOS usually not).
 * -DTP_NO_VERBS forces the TCP-only build (to check that branch on Linux). */
#if defined(__has_include) && !defined(TP_NO_VERBS)
#if __has_include(<infiniband/verbs.h>)
#define TP_HAVE_VERBS 1
#endif
#endif

#ifdef TP_HAVE_VERBS
#include <infiniband/verbs.h>
#include <sodium.h>

struct tp_rdma_link {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *smr, *rmr;
	uint8_t *sbuf, *rbuf;
	size_t buf_bytes;
	tp_rdma_qp_info_t local;
	int send_busy;  /* a send is posted and not yet completed */
	int recv_ready; /* a receive completed and is not yet consumed */
	int recv_held;  /* the caller reads rbuf; re-post on release */
	uint32_t recv_len;
};

static enum ibv_mtu tp_mtu_enum(uint32_t b)
{
	switch (b) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	default: return IBV_MTU_4096;
	}
}

static uint32_t tp_mtu_bytes(enum ibv_mtu m) { return 128u << m; }

void tp_rdma_link_free(struct tp_rdma_link *l)
{
	if (!l)
		return;
	if (l->qp)
		ibv_destroy_qp(l->qp);
	if (l->smr)
		ibv_dereg_mr(l->smr);
	if (l->rmr)
		ibv_dereg_mr(l->rmr);
	if (l->cq)
		ibv_destroy_cq(l->cq);
	if (l->pd)
		ibv_dealloc_pd(l->pd);
	if (l->ctx)
		ibv_close_device(l->ctx);
	free(l->sbuf);
	free(l->rbuf);
	free(l);
}

int tp_rdma_list_devices(char *buf, size_t buflen)
{
	int n = 0;
	if (buflen)
		buf[0] = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		return 0;
	for (int i = 0; i < n; i++) {
		size_t used = strlen(buf);
		snprintf(buf + used, buflen - used, "%s%s", i ? "," : "",
			 ibv_get_device_name(list[i]));
	}
	ibv_free_device_list(list);
	return n;
}

static int tp_post_recv(struct tp_rdma_link *l)
{
	struct ibv_sge sge = {.addr = (uintptr_t)l->rbuf, .length = (uint32_t)l->buf_bytes,
			      .lkey = l->rmr->lkey};
	struct ibv_recv_wr wr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
	return ibv_post_recv(l->qp, &wr, &bad) ? SH_EIO : 0;
}

/* Finds a usable GID: an IPv4-mapped one (RoCE, what JACCL needs), else any non-zero one. */
static int tp_pick_gid(struct ibv_context *ctx, uint8_t port, int tbl_len, union ibv_gid *gid)
{
	int any = -1;
	for (int i = 0; i < tbl_len && i < 256; i++) {
		union ibv_gid g;
		if (ibv_query_gid(ctx, port, i, &g))
			continue;
		static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
		if (memcmp(g.raw, v4, 12) == 0) {
			*gid = g;
			return i;
		}
		static const uint8_t zero[16];
		if (any < 0 && memcmp(g.raw, zero, 16) != 0) {
			any = i;
			*gid = g;
		}
	}
	return any;
}

/* Opens the device and builds a QP in INIT. Fills f with what it learnt; on failure returns
 * NULL with f->... saying why. */
static struct tp_rdma_link *tp_link_open(const char *dev, tp_rdma_facts_t *f)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct tp_rdma_link *l = NULL;
	f->ndevices = list ? n : (errno == ENOSYS ? 0 : -1);
	if (!list || n == 0)
		goto out;
	struct ibv_device *d = NULL;
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), dev))
			d = list[i];
	if (!d)
		goto out;
	f->dev_found = 1;
	l = calloc(1, sizeof *l);
	if (!l)
		goto fail_alloc;
	l->ctx = ibv_open_device(d);
	if (!l->ctx) {
		f->verbs_failed = "ibv_open_device";
		goto fail;
	}
	struct ibv_port_attr pa;
	uint8_t port = 1;
	if (ibv_query_port(l->ctx, port, &pa)) {
		f->verbs_failed = "ibv_query_port";
		goto fail;
	}
	f->port_state_active = pa.state == IBV_PORT_ACTIVE;
	if (!f->port_state_active)
		goto fail;
	union ibv_gid gid;
	memset(&gid, 0, sizeof gid);
	int gi = tp_pick_gid(l->ctx, port, pa.gid_tbl_len, &gid);
	f->have_addr = pa.lid != 0 || gi >= 0;
	if (!f->have_addr)
		goto fail;
	l->buf_bytes = TP_RDMA_BUF_BYTES;
	l->sbuf = malloc(l->buf_bytes);
	l->rbuf = malloc(l->buf_bytes);
	if (!l->sbuf || !l->rbuf)
		goto fail_alloc;
	if (!(l->pd = ibv_alloc_pd(l->ctx))) {
		f->verbs_failed = "ibv_alloc_pd";
		goto fail;
	}
	if (!(l->cq = ibv_create_cq(l->ctx, 16, NULL, NULL, 0))) {
		f->verbs_failed = "ibv_create_cq";
		goto fail;
	}
	l->smr = ibv_reg_mr(l->pd, l->sbuf, l->buf_bytes, IBV_ACCESS_LOCAL_WRITE);
	l->rmr = ibv_reg_mr(l->pd, l->rbuf, l->buf_bytes, IBV_ACCESS_LOCAL_WRITE);
	if (!l->smr || !l->rmr) {
		f->verbs_failed = "ibv_reg_mr";
		goto fail;
	}
	struct ibv_qp_init_attr qia = {.send_cq = l->cq,
				       .recv_cq = l->cq,
				       .qp_type = IBV_QPT_RC,
				       .cap = {.max_send_wr = 4, .max_recv_wr = 4,
					       .max_send_sge = 1, .max_recv_sge = 1}};
	if (!(l->qp = ibv_create_qp(l->pd, &qia))) {
		f->verbs_failed = "ibv_create_qp"; /* EBUSY after ~10 QPs on some devices */
		goto fail;
	}
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = port,
				.qp_access_flags = IBV_ACCESS_LOCAL_WRITE};
	if (ibv_modify_qp(l->qp, &a,
			  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
		f->verbs_failed = "ibv_modify_qp(INIT)";
		goto fail;
	}
	if (tp_post_recv(l)) {
		f->verbs_failed = "ibv_post_recv";
		goto fail;
	}
	l->local = (tp_rdma_qp_info_t){.status = 0,
				       .lid = pa.lid,
				       .port = port,
				       .gid_index = (uint8_t)(gi < 0 ? 0 : gi),
				       .qpn = l->qp->qp_num,
				       .psn = randombytes_uniform(0xffffff),
				       .mtu = tp_mtu_bytes(pa.active_mtu),
				       .buf_bytes = (uint32_t)l->buf_bytes};
	memcpy(l->local.gid, gid.raw, 16);
	goto out;
fail_alloc:
	f->verbs_failed = "malloc";
fail:
	tp_rdma_link_free(l);
	l = NULL;
out:
	if (list)
		ibv_free_device_list(list);
	return l;
}

/* INIT -> RTR -> RTS towards the peer's address data. Returns NULL or the failing call. */
static const char *tp_link_connect(struct tp_rdma_link *l, const tp_rdma_qp_info_t *r)
{
	static const uint8_t zero[16];
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
				.path_mtu = tp_mtu_enum(MIN(r->mtu, l->local.mtu)),
				.dest_qp_num = r->qpn,
				.rq_psn = r->psn,
				.max_dest_rd_atomic = 1,
				.min_rnr_timer = 1,
				.ah_attr = {.dlid = r->lid, .sl = 0, .port_num = l->local.port}};
	if (memcmp(r->gid, zero, 16) != 0) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
		a.ah_attr.grh.sgid_index = l->local.gid_index;
		a.ah_attr.grh.hop_limit = 1;
	}
	if (ibv_modify_qp(l->qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return "ibv_modify_qp(RTR)";
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7; /* infinite: a peer one exchange behind re-posts its receive soon */
	a.sq_psn = l->local.psn;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(l->qp, &a,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		return "ibv_modify_qp(RTS)";
	return NULL;
}

int tp_rdma_send(struct tp_rdma_link *l, const void *hdr, size_t hlen, const void *data,
		 size_t dlen)
{
	if (l->send_busy || hlen + dlen > l->buf_bytes)
		return SH_EINVAL;
	memcpy(l->sbuf, hdr, hlen);
	if (dlen)
		memcpy(l->sbuf + hlen, data, dlen);
	struct ibv_sge sge = {.addr = (uintptr_t)l->sbuf, .length = (uint32_t)(hlen + dlen),
			      .lkey = l->smr->lkey};
	struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED},
			   *bad = NULL;
	if (ibv_post_send(l->qp, &wr, &bad))
		return SH_EIO;
	l->send_busy = 1;
	return 0;
}

/* Drains the completion queue into the link's flags. */
static int tp_rdma_poll(struct tp_rdma_link *l)
{
	struct ibv_wc wc[4];
	int n;
	while ((n = ibv_poll_cq(l->cq, 4, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				LOG(LOG_ERROR, "rdma: work completion failed: %s",
				    ibv_wc_status_str(wc[i].status));
				return wc[i].status == IBV_WC_RETRY_EXC_ERR ? SH_ECLOSED : SH_EIO;
			}
			if (wc[i].opcode == IBV_WC_SEND) {
				l->send_busy = 0;
			} else if (wc[i].opcode == IBV_WC_RECV) {
				l->recv_ready = 1;
				l->recv_len = wc[i].byte_len;
			}
		}
	}
	return n < 0 ? SH_EIO : 0;
}

int tp_rdma_send_poll(struct tp_rdma_link *l)
{
	int rc = tp_rdma_poll(l);
	return rc ? rc : !l->send_busy;
}

int tp_rdma_recv_poll(struct tp_rdma_link *l, const uint8_t **p, size_t *len)
{
	int rc = tp_rdma_poll(l);
	if (rc)
		return rc;
	if (!l->recv_ready)
		return 0;
	*p = l->rbuf;
	*len = l->recv_len;
	l->recv_ready = 0;
	l->recv_held = 1;
	return 1;
}

int tp_rdma_recv_release(struct tp_rdma_link *l)
{
	if (!l->recv_held)
		return 0;
	l->recv_held = 0;
	return tp_post_recv(l);
}

static const int tp_verbs_built = 1;
#else  /* no libibverbs headers: every pair uses TCP */
struct tp_rdma_link {
	int unused;
};
void tp_rdma_link_free(struct tp_rdma_link *l) { free(l); }
int tp_rdma_list_devices(char *buf, size_t buflen)
{
	if (buflen)
		buf[0] = 0;
	return 0;
}
static struct tp_rdma_link *tp_link_open(const char *dev, tp_rdma_facts_t *f)
{
	(void)dev;
	(void)f;
	return NULL;
}
static const char *tp_link_connect(struct tp_rdma_link *l, const tp_rdma_qp_info_t *r)
{
	(void)l;
	(void)r;
	return "verbs";
}
int tp_rdma_send(struct tp_rdma_link *l, const void *h, size_t hl, const void *d, size_t dl)
{
	(void)l, (void)h, (void)hl, (void)d, (void)dl;
	return SH_EUNSUPP;
}
int tp_rdma_send_poll(struct tp_rdma_link *l)
{
	(void)l;
	return SH_EUNSUPP;
}
int tp_rdma_recv_poll(struct tp_rdma_link *l, const uint8_t **p, size_t *len)
{
	(void)l, (void)p, (void)len;
	return SH_EUNSUPP;
}
int tp_rdma_recv_release(struct tp_rdma_link *l)
{
	(void)l;
	return SH_EUNSUPP;
}
static const int tp_verbs_built = 0;
#endif

/* ---- set-up over the channels ------------------------------------------------------------- */

/* Receives one message of the given type from a peer's channel within the deadline. */
static int tp_setup_recv(tp_chan_t *c, uint16_t type, uint8_t *buf, size_t cap, size_t *len,
			 int64_t deadline)
{
	uint16_t t;
	void *p;
	size_t n;
	int rc = tp_chan_recv(c, &t, &p, &n, tp_left_ms(deadline));
	if (rc)
		return rc;
	if (t != type || n > cap)
		return SH_EFORMAT;
	memcpy(buf, p, n);
	*len = n;
	return 0;
}

void tp_rdma_group_setup(tp_group_t *g, const char *path, int64_t deadline)
{
	tp_rdma_matrix_t *m = NULL;
	char err[256], why[TP_MAX_WORLD][200];
	struct tp_rdma_link *cand[TP_MAX_WORLD] = {0};
	tp_rdma_facts_t facts[TP_MAX_WORLD];
	uint8_t wire[TP_RDMA_QP_WIRE + 200];
	int ready[TP_MAX_WORLD] = {0};

	if (path && tp_rdma_matrix_load(&m, path, g->world, err, sizeof err) != 0) {
		LOG(LOG_WARN, "group rank %d: RDMA device matrix unusable, every pair uses TCP: %s",
		    g->rank, err);
		m = NULL;
	}
	/* 1. offers or declines to every peer */
	for (int p = 0; p < g->world; p++) {
		why[p][0] = 0;
		if (p == g->rank)
			continue;
		tp_rdma_facts_t *f = &facts[p];
		*f = (tp_rdma_facts_t){.verbs_built = tp_verbs_built};
		f->dev = m ? tp_rdma_matrix_dev(m, g->rank, p, 0) : NULL;
		if (f->dev && f->verbs_built)
			cand[p] = tp_link_open(f->dev, f);
		const char *r = tp_rdma_decide(f, why[p], sizeof why[p]);
		size_t len = TP_RDMA_QP_WIRE;
		if (r) {
			tp_rdma_qp_info_t d = {.status = TP_RDMA_DECLINE};
			tp_rdma_qp_encode(wire, &d);
			size_t rl = MIN(strlen(r), 200);
			memcpy(wire + TP_RDMA_QP_WIRE, r, rl);
			len += rl;
			tp_rdma_link_free(cand[p]);
			cand[p] = NULL;
		} else {
#ifdef TP_HAVE_VERBS
			tp_rdma_qp_encode(wire, &cand[p]->local);
#endif
		}
		if (tp_chan_send(g->chan[p], TP_MSG_RDMA_QP, wire, len) != 0)
			snprintf(why[p], sizeof why[p], "could not send queue-pair data");
	}
	/* 2. their answers; connect where both offered */
	for (int p = 0; p < g->world; p++) {
		if (p == g->rank)
			continue;
		size_t len = 0;
		tp_rdma_qp_info_t q;
		const char *r = NULL;
		int rc = tp_setup_recv(g->chan[p], TP_MSG_RDMA_QP, wire, sizeof wire, &len,
				       deadline);
		if (rc)
			r = "no queue-pair data from the peer";
		else if (tp_rdma_qp_decode(&q, wire, len, err, sizeof err) != 0)
			r = "bad queue-pair data from the peer";
		else if (q.status != 0) {
			facts[p].peer_declined = 1;
			char pr[201];
			size_t rl = MIN(len - TP_RDMA_QP_WIRE, 200);
			memcpy(pr, wire + TP_RDMA_QP_WIRE, rl);
			pr[rl] = 0;
			for (size_t i = 0; i < rl; i++)
				if (pr[i] < 32 || pr[i] > 126)
					pr[i] = '?';
			facts[p].peer_reason = pr;
			if (cand[p])
				r = tp_rdma_decide(&facts[p], why[p], sizeof why[p]);
			facts[p].peer_reason = NULL;
		} else if (cand[p]) {
			facts[p].verbs_failed = tp_link_connect(cand[p], &q);
			r = tp_rdma_decide(&facts[p], why[p], sizeof why[p]);
		}
		if (r && r != why[p])
			snprintf(why[p], sizeof why[p], "%s", r);
		if (r || !cand[p]) {
			tp_rdma_link_free(cand[p]);
			cand[p] = NULL;
		}
	}
	/* 3. both ends must be ready */
	for (int p = 0; p < g->world; p++) {
		if (p == g->rank)
			continue;
		uint8_t ok[4];
		tp_put32(ok, cand[p] ? 1 : 0);
		(void)tp_chan_send(g->chan[p], TP_MSG_RDMA_READY, ok, sizeof ok);
	}
	for (int p = 0; p < g->world; p++) {
		if (p == g->rank)
			continue;
		size_t len = 0;
		uint8_t ok[4] = {0};
		int rc = tp_setup_recv(g->chan[p], TP_MSG_RDMA_READY, ok, sizeof ok, &len, deadline);
		ready[p] = rc == 0 && len == 4 && tp_get32(ok) == 1 && cand[p];
		if (cand[p] && !ready[p])
			snprintf(why[p], sizeof why[p], "peer could not finish its RDMA set-up");
		if (ready[p]) {
			g->rdma[p] = cand[p];
			LOG(LOG_INFO, "group rank %d: rank %d over RDMA (%s)", g->rank, p,
			    facts[p].dev);
		} else {
			tp_rdma_link_free(cand[p]);
			if (path)
				LOG(LOG_WARN, "group rank %d: rank %d uses TCP: %s", g->rank, p,
				    why[p]);
			else
				LOG(LOG_DEBUG, "group rank %d: rank %d uses TCP: %s", g->rank, p,
				    why[p]);
		}
	}
	tp_rdma_matrix_free(m);
}
