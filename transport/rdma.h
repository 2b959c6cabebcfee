/*
 * rdma.h (internal to transport/ and its tests): the RDMA side of a group.
 *
 * Pure parts (rdma_matrix.c, no verbs, unit-tested): the JACCL device matrix, the queue-pair
 * address data exchanged over the authenticated channel, and the per-pair fallback decision.
 * Verbs parts (rdma.c): opening devices, RC queue pairs, registered buffers, the data path.
 */
#ifndef SHOAL_TP_RDMA_H
#define SHOAL_TP_RDMA_H

#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

/* ---- device matrix (docs/formats.md section 2) -------------------------------------------- */

/* N x N; entry [i][j] = device(s) on host i whose link goes to host j; diagonal null. */
typedef struct tp_rdma_matrix tp_rdma_matrix_t;

#define TP_RDMA_DEV_MAX 64 /* longest device name kept */

/* Parses the JSON text (len bytes). expect_n > 0 also checks the size. Errors (SH_EFORMAT):
 * not JSON, not a square array of arrays, a non-null diagonal, an entry that is neither null,
 * a non-empty string nor a non-empty list of non-empty strings. Caller frees. */
int tp_rdma_matrix_parse(tp_rdma_matrix_t **out, const char *json, size_t len, int expect_n,
			 char *err, size_t errlen);
int tp_rdma_matrix_load(tp_rdma_matrix_t **out, const char *path, int expect_n, char *err,
			size_t errlen);
void tp_rdma_matrix_free(tp_rdma_matrix_t *m);
int tp_rdma_matrix_size(const tp_rdma_matrix_t *m);
/* Number of devices listed for [i][j] (0 for null). */
int tp_rdma_matrix_count(const tp_rdma_matrix_t *m, int i, int j);
/* Device k of [i][j], or NULL. */
const char *tp_rdma_matrix_dev(const tp_rdma_matrix_t *m, int i, int j, int k);

/* ---- queue-pair address data (payload of TP_MSG_RDMA_QP) ---------------------------------- */

/* What one side of a pair tells the other. Wire: 52 bytes, little-endian, in this order; a
 * decline (status != 0) may be followed by its reason as text (up to 200 bytes, no NUL). */
typedef struct tp_rdma_qp_info {
	uint32_t status;   /* 0 = offer (fields below valid); else a decline (TP_RDMA_DECLINE) */
	uint16_t lid;      /* port LID (InfiniBand; 0 on RoCE) */
	uint8_t port;      /* port number used (1-based) */
	uint8_t gid_index; /* GID table index used (RoCE) */
	uint32_t qpn;      /* queue pair number (24 bits) */
	uint32_t psn;      /* first packet sequence number (24 bits) */
	uint32_t mtu;      /* path MTU in bytes: 256, 512, 1024, 2048 or 4096 */
	uint8_t gid[16];   /* port GID (RoCE: IPv4-mapped ::ffff:a.b.c.d preferred) */
	uint32_t buf_bytes; /* size of each registered receive buffer */
	uint32_t rkey;     /* of the receive buffer (reserved for RDMA write; 0 with send/recv) */
	uint64_t addr;     /* of the receive buffer (idem) */
} tp_rdma_qp_info_t;
#define TP_RDMA_QP_WIRE 52
#define TP_RDMA_DECLINE 1

void tp_rdma_qp_encode(uint8_t out[TP_RDMA_QP_WIRE], const tp_rdma_qp_info_t *q);
/* Returns 0, or SH_EFORMAT with a message (length, 24-bit fields, MTU, no LID and no GID). A
 * decline decodes fine (only status is meaningful; its reason text is at p + 52). */
int tp_rdma_qp_decode(tp_rdma_qp_info_t *q, const uint8_t *p, size_t len, char *err,
		      size_t errlen);

/* ---- fallback decision (pure) ------------------------------------------------------------- */

/* Everything known about one pair when deciding; filled by rdma.c from the matrix, the verbs
 * calls and the peer's answer. */
typedef struct tp_rdma_facts {
	const char *dev;      /* matrix entry for [me][peer] (NULL: none listed) */
	int verbs_built;      /* 1 if built with libibverbs */
	int ndevices;         /* devices ibv_get_device_list found (-1: the call failed) */
	int dev_found;        /* dev is among them */
	int port_state_active; /* its port is IBV_PORT_ACTIVE */
	int have_addr;        /* a LID (IB) or a usable GID (RoCE) */
	const char *verbs_failed; /* name of the verbs call that failed, or NULL */
	int peer_declined;    /* the peer said it cannot use RDMA for this pair */
	const char *peer_reason; /* its reason when it declined (may be NULL) */
} tp_rdma_facts_t;

/* NULL when the pair can use RDMA; else the one-line reason it falls back to TCP (written into
 * buf, which is returned). Checked in the order of the fields above. */
const char *tp_rdma_decide(const tp_rdma_facts_t *f, char *buf, size_t buflen);

/* ---- verbs (rdma.c) ----------------------------------------------------------------------- */

struct tp_rdma_link;

/* Tries RDMA for every pair of the group using the JACCL device matrix at path; pairs that
 * cannot use it stay on TCP with one logged reason per pair. Never fails the group; both ends of
 * a pair always agree (they exchange offers and a ready flag over their channel). */
void tp_rdma_group_setup(tp_group_t *g, const char *path, int64_t deadline);

/* Frees one pair's RDMA resources (NULL is fine). */
void tp_rdma_link_free(struct tp_rdma_link *l);

/* Device names ibv_get_device_list reports, comma-separated into buf (empty when none or when
 * built without verbs). Returns the count (0 when none, never crashes without devices). */
int tp_rdma_list_devices(char *buf, size_t buflen);

/* Largest frame (COLL header + data) an RDMA pair carries; bigger ones take the TCP channel. */
#define TP_RDMA_BUF_BYTES (1u << 20)

/* Data path for the exchange engine: post the receive for the next frame (done at set-up and
 * after each received frame), send one frame, poll for completions. */
int tp_rdma_send(struct tp_rdma_link *l, const void *hdr, size_t hlen, const void *data,
		 size_t dlen);
/* Returns 1 when the send completed, 0 if not yet, < 0 on error. */
int tp_rdma_send_poll(struct tp_rdma_link *l);
/* Returns 1 with *p and *len set when a frame arrived, 0 if not yet, < 0 on error. The frame stays
 * valid until tp_rdma_recv_release. */
int tp_rdma_recv_poll(struct tp_rdma_link *l, const uint8_t **p, size_t *len);
/* Gives the receive buffer back (re-posts it). */
int tp_rdma_recv_release(struct tp_rdma_link *l);

#endif
