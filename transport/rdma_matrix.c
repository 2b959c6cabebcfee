/*
 * rdma_matrix.c: the pure half of the RDMA backend: the JACCL device matrix (jansson), the
 * queue-pair address data on the wire, and the per-pair fallback decision. No verbs calls here,
 * so all of it is unit-tested on machines without RDMA.
 *
 * Invariant: a parsed matrix is square, its diagonal is empty, and every listed device name is a
 * non-empty string shorter than TP_RDMA_DEV_MAX.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "transport/frame.h"
#include "transport/rdma.h"

struct tp_rdma_matrix {
	int n;
	int *count;   /* n * n */
	char ***devs; /* n * n arrays of count names */
};

void tp_rdma_matrix_free(tp_rdma_matrix_t *m)
{
	if (!m)
		return;
	for (int i = 0; m->devs && i < m->n * m->n; i++) {
		for (int k = 0; m->devs[i] && k < m->count[i]; k++)
			free(m->devs[i][k]);
		free(m->devs[i]);
	}
	free(m->devs);
	free(m->count);
	free(m);
}

static int tp_dev_ok(const json_t *s)
{
	return json_is_string(s) && json_string_length(s) > 0 &&
	       json_string_length(s) < TP_RDMA_DEV_MAX && !strchr(json_string_value(s), '/');
}

/* Fills cell (i, j) from its JSON entry. */
static int tp_cell_set(tp_rdma_matrix_t *m, int i, int j, const json_t *e, char *err,
		       size_t errlen)
{
	int idx = i * m->n + j;
	if (json_is_null(e))
		return 0;
	if (i == j)
		return sh_fail(err, errlen, SH_EFORMAT, "entry [%d][%d] (diagonal) must be null", i,
			       j);
	size_t cnt = json_is_array(e) ? json_array_size(e) : 1;
	if (json_is_array(e) && cnt == 0)
		return sh_fail(err, errlen, SH_EFORMAT, "entry [%d][%d] is an empty list", i, j);
	if (!json_is_array(e) && !tp_dev_ok(e))
		return sh_fail(err, errlen, SH_EFORMAT,
			       "entry [%d][%d] must be null, a device name or a list of names", i,
			       j);
	if (cnt > 16)
		return sh_fail(err, errlen, SH_EFORMAT, "entry [%d][%d] lists %zu devices", i, j,
			       cnt);
	m->devs[idx] = calloc(cnt, sizeof(char *));
	if (!m->devs[idx])
		return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
	for (size_t k = 0; k < cnt; k++) {
		const json_t *s = json_is_array(e) ? json_array_get(e, k) : e;
		if (!tp_dev_ok(s))
			return sh_fail(err, errlen, SH_EFORMAT,
				       "entry [%d][%d] item %zu is not a device name", i, j, k);
		m->devs[idx][k] = strdup(json_string_value(s));
		if (!m->devs[idx][k])
			return sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		m->count[idx] = (int)k + 1;
	}
	return 0;
}

int tp_rdma_matrix_parse(tp_rdma_matrix_t **out, const char *json, size_t len, int expect_n,
			 char *err, size_t errlen)
{
	json_error_t je;
	tp_rdma_matrix_t *m = NULL;
	int rc = 0;
	*out = NULL;
	json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return sh_fail(err, errlen, SH_EFORMAT, "not JSON (line %d: %s)", je.line, je.text);
	if (!json_is_array(root) || json_array_size(root) == 0 ||
	    json_array_size(root) > TP_MAX_WORLD) {
		rc = sh_fail(err, errlen, SH_EFORMAT, "the device matrix must be a list of rows");
		goto out;
	}
	int n = (int)json_array_size(root);
	if (expect_n > 0 && n != expect_n) {
		rc = sh_fail(err, errlen, SH_EFORMAT, "the device matrix has %d rows for %d ranks",
			     n, expect_n);
		goto out;
	}
	m = calloc(1, sizeof *m);
	if (m) {
		m->n = n;
		m->count = calloc((size_t)(n * n), sizeof *m->count);
		m->devs = calloc((size_t)(n * n), sizeof *m->devs);
	}
	if (!m || !m->count || !m->devs) {
		rc = sh_fail(err, errlen, SH_ENOMEM, "out of memory");
		goto out;
	}
	for (int i = 0; i < n; i++) {
		const json_t *row = json_array_get(root, (size_t)i);
		if (!json_is_array(row) || json_array_size(row) != (size_t)n) {
			rc = sh_fail(err, errlen, SH_EFORMAT,
				     "row %d must be a list of %d entries (the matrix is N x N)", i,
				     n);
			goto out;
		}
		for (int j = 0; j < n; j++)
			if ((rc = tp_cell_set(m, i, j, json_array_get(row, (size_t)j), err,
					      errlen)))
				goto out;
	}
	*out = m;
	m = NULL;
out:
	tp_rdma_matrix_free(m);
	json_decref(root);
	return rc;
}

int tp_rdma_matrix_load(tp_rdma_matrix_t **out, const char *path, int expect_n, char *err,
			size_t errlen)
{
	char *text = NULL, e[200];
	size_t len = 0;
	*out = NULL;
	int rc = read_file_all(path, &text, &len, err, errlen);
	if (rc)
		return rc;
	rc = tp_rdma_matrix_parse(out, text, len, expect_n, e, sizeof e);
	free(text);
	if (rc)
		return sh_fail(err, errlen, rc, "%s: %s", path, e);
	return 0;
}

int tp_rdma_matrix_size(const tp_rdma_matrix_t *m) { return m->n; }

int tp_rdma_matrix_count(const tp_rdma_matrix_t *m, int i, int j)
{
	if (i < 0 || j < 0 || i >= m->n || j >= m->n)
		return 0;
	return m->count[i * m->n + j];
}

const char *tp_rdma_matrix_dev(const tp_rdma_matrix_t *m, int i, int j, int k)
{
	if (k < 0 || k >= tp_rdma_matrix_count(m, i, j))
		return NULL;
	return m->devs[i * m->n + j][k];
}

/* ---- queue-pair data ---------------------------------------------------------------------- */

void tp_rdma_qp_encode(uint8_t out[TP_RDMA_QP_WIRE], const tp_rdma_qp_info_t *q)
{
	tp_put32(out, q->status);
	tp_put16(out + 4, q->lid);
	out[6] = q->port;
	out[7] = q->gid_index;
	tp_put32(out + 8, q->qpn);
	tp_put32(out + 12, q->psn);
	tp_put32(out + 16, q->mtu);
	memcpy(out + 20, q->gid, 16);
	tp_put32(out + 36, q->buf_bytes);
	tp_put32(out + 40, q->rkey);
	tp_put64(out + 44, q->addr);
}

int tp_rdma_qp_decode(tp_rdma_qp_info_t *q, const uint8_t *p, size_t len, char *err,
		      size_t errlen)
{
	static const uint8_t zero[16];
	if (len < TP_RDMA_QP_WIRE || (tp_get32(p) == 0 && len != TP_RDMA_QP_WIRE))
		return sh_fail(err, errlen, SH_EFORMAT, "queue-pair data of %zu bytes (want %d)",
			       len, TP_RDMA_QP_WIRE);
	q->status = tp_get32(p);
	q->lid = tp_get16(p + 4);
	q->port = p[6];
	q->gid_index = p[7];
	q->qpn = tp_get32(p + 8);
	q->psn = tp_get32(p + 12);
	q->mtu = tp_get32(p + 16);
	memcpy(q->gid, p + 20, 16);
	q->buf_bytes = tp_get32(p + 36);
	q->rkey = tp_get32(p + 40);
	q->addr = tp_get64(p + 44);
	if (q->status != 0)
		return 0;
	if (q->qpn == 0 || q->qpn > 0xffffff || q->psn > 0xffffff)
		return sh_fail(err, errlen, SH_EFORMAT, "bad queue pair number %u or PSN %u",
			       q->qpn, q->psn);
	if (q->mtu != 256 && q->mtu != 512 && q->mtu != 1024 && q->mtu != 2048 && q->mtu != 4096)
		return sh_fail(err, errlen, SH_EFORMAT, "bad path MTU %u", q->mtu);
	if (q->port == 0)
		return sh_fail(err, errlen, SH_EFORMAT, "port 0");
	if (q->lid == 0 && memcmp(q->gid, zero, 16) == 0)
		return sh_fail(err, errlen, SH_EFORMAT, "neither a LID nor a GID");
	if (q->buf_bytes < 64 || q->buf_bytes > (1u << 30))
		return sh_fail(err, errlen, SH_EFORMAT, "bad buffer size %u", q->buf_bytes);
	return 0;
}

/* ---- the decision ------------------------------------------------------------------------- */

const char *tp_rdma_decide(const tp_rdma_facts_t *f, char *buf, size_t buflen)
{
	if (!f->dev)
		snprintf(buf, buflen, "no RDMA device listed for this pair");
	else if (!f->verbs_built)
		snprintf(buf, buflen, "built without libibverbs");
	else if (f->ndevices < 0)
		snprintf(buf, buflen, "cannot list RDMA devices");
	else if (f->ndevices == 0)
		snprintf(buf, buflen, "no RDMA devices on this host (wanted %s)", f->dev);
	else if (!f->dev_found)
		snprintf(buf, buflen, "device %s not found", f->dev);
	else if (!f->port_state_active)
		snprintf(buf, buflen, "device %s: port not ACTIVE", f->dev);
	else if (!f->have_addr)
		snprintf(buf, buflen, "device %s: no LID and no IPv4 GID (give its interface an "
				      "IPv4 address)",
			 f->dev);
	else if (f->verbs_failed)
		snprintf(buf, buflen, "device %s: %s failed", f->dev, f->verbs_failed);
	else if (f->peer_declined)
		snprintf(buf, buflen, "peer cannot use RDMA (%s)",
			 f->peer_reason ? f->peer_reason : "no reason given");
	else
		return NULL;
	return buf;
}
