/*
 * wire.c: the bytes discovery puts on the network: DNS-SD TXT items and the membership/election
 * frames (types 100-199) carried by the authenticated control channel.
 *
 * Invariant: every decoder checks lengths before reading and turns anything malformed into
 * SH_EFORMAT (or an ignored TXT item); a peer's bytes never crash or overrun us.
 */
#include "common/common.h"
#include "discovery/discovery.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int disc_txt_items(const disc_publish_t *pub, char items[][300], int max)
{
	char idhex[DISC_ID_HEX];
	disc_id_hex(&pub->id, idhex);
	int n = 0;
#define ITEM(...)                                                                                  \
	do {                                                                                       \
		if (n < max)                                                                       \
			snprintf(items[n++], 300, __VA_ARGS__);                                    \
	} while (0)
	ITEM("v=%d", DISC_PROTO_VERSION);
	ITEM("id=%s", idhex);
	ITEM("cid=%s", pub->cid);
	ITEM("mem=%llu", (unsigned long long)pub->mem_bytes);
	ITEM("cores=%d", pub->cores);
	ITEM("nonce=%016llx", (unsigned long long)pub->nonce);
	if (pub->rdma[0])
		ITEM("rdma=%s", pub->rdma);
#undef ITEM
	return n;
}

/* Copies a counted TXT value into a fixed field, NUL-terminated, cut at cap-1. */
static void copy_val(char *dst, size_t cap, const char *val, size_t vlen)
{
	size_t n = MIN(vlen, cap - 1);
	memcpy(dst, val, n);
	dst[n] = 0;
}

void disc_txt_parse_item(disc_sighting_t *s, const char *key, const char *val, size_t vlen)
{
	char tmp[300];
	if (!val)
		return; /* key-only items carry nothing we use */
	copy_val(tmp, sizeof tmp, val, vlen);
	if (!strcmp(key, "v"))
		s->version = atoi(tmp);
	else if (!strcmp(key, "id")) {
		if (disc_id_parse(tmp, &s->id))
			memset(&s->id, 0, sizeof s->id);
	} else if (!strcmp(key, "cid"))
		copy_val(s->cid, sizeof s->cid, val, vlen);
	else if (!strcmp(key, "mem"))
		s->mem_bytes = strtoull(tmp, NULL, 10);
	else if (!strcmp(key, "cores"))
		s->cores = atoi(tmp);
	else if (!strcmp(key, "nonce"))
		s->nonce = strtoull(tmp, NULL, 16);
	else if (!strcmp(key, "rdma"))
		copy_val(s->rdma, sizeof s->rdma, val, vlen);
}

int disc_sighting_self(const disc_publish_t *pub, const disc_sighting_t *s, int addr_is_local)
{
	if (disc_id_cmp(&s->id, &pub->id))
		return DISC_SELF_NOT;
	/* A copy on this very host needs a port of its own (the control port is bound by us), so
	 * our address with our port is always us, whatever the nonce or instance name says. */
	if (s->nonce == pub->nonce || (addr_is_local && s->port == pub->port))
		return DISC_SELF_OURS;
	return DISC_SELF_DUPLICATE;
}

int disc_leader_encode(const elec_msg_t *m, uint8_t *buf, size_t cap)
{
	if (m->n < 0 || m->n > ELEC_MAX_MEMBERS)
		return SH_EINVAL;
	size_t need = sizeof(disc_wire_leader_head_t) + (size_t)m->n * DISC_ID_LEN;
	if (cap < need)
		return SH_EINVAL;
	sh_put_le64(buf, m->epoch);
	memcpy(buf + 8, m->subject.b, DISC_ID_LEN);
	for (int i = 0; i < m->n; i++)
		memcpy(buf + 24 + (size_t)i * DISC_ID_LEN, m->members[i].b, DISC_ID_LEN);
	return (int)need;
}

int disc_leader_decode(const uint8_t *p, size_t len, uint64_t *epoch, disc_id_t *leader,
		       disc_id_t *members, int *n)
{
	if (len < sizeof(disc_wire_leader_head_t))
		return SH_EFORMAT;
	size_t rest = len - sizeof(disc_wire_leader_head_t);
	if (rest % DISC_ID_LEN || rest / DISC_ID_LEN > ELEC_MAX_MEMBERS)
		return SH_EFORMAT;
	*epoch = sh_get_le64(p);
	memcpy(leader->b, p + 8, DISC_ID_LEN);
	*n = (int)(rest / DISC_ID_LEN);
	for (int i = 0; i < *n; i++)
		memcpy(members[i].b, p + 24 + (size_t)i * DISC_ID_LEN, DISC_ID_LEN);
	return 0;
}

void disc_heartbeat_encode(disc_wire_heartbeat_t *w, uint64_t epoch, const disc_id_t *leader,
			   int state, int nmembers)
{
	memset(w, 0, sizeof *w);
	sh_put_le64(w->epoch, epoch);
	memcpy(w->leader, leader->b, DISC_ID_LEN);
	w->state = (uint8_t)state;
	for (int i = 0; i < 4; i++)
		w->nmembers[i] = (uint8_t)((uint32_t)nmembers >> (8 * i));
}

int disc_heartbeat_decode(const uint8_t *p, size_t len, uint64_t *epoch, disc_id_t *leader,
			  int *state, int *nmembers)
{
	if (len != sizeof(disc_wire_heartbeat_t))
		return SH_EFORMAT;
	const disc_wire_heartbeat_t *w = (const disc_wire_heartbeat_t *)p;
	*epoch = sh_get_le64(w->epoch);
	memcpy(leader->b, w->leader, DISC_ID_LEN);
	if (w->state > ELEC_FOLLOWER)
		return SH_EFORMAT;
	*state = w->state;
	uint32_t nm = 0;
	for (int i = 0; i < 4; i++)
		nm |= (uint32_t)w->nmembers[i] << (8 * i);
	*nmembers = (int)MIN(nm, 1u << 20);
	return 0;
}

int disc_info_encode(const disc_info_t *in, char *buf, size_t cap)
{
	char idhex[DISC_ID_HEX];
	disc_id_hex(&in->id, idhex);
	int n = snprintf(buf, cap, "v=%d\nid=%s\nhost=%s\nport=%d\nmem=%llu\ncores=%d\nrdma=%s\n",
			 in->version, idhex, in->host, in->port, (unsigned long long)in->mem_bytes,
			 in->cores, in->rdma);
	return n < 0 || (size_t)n >= cap ? SH_EINVAL : n;
}

void disc_info_parse(disc_info_t *out, const uint8_t *p, size_t len)
{
	size_t i = 0;
	while (i < len) {
		size_t end = i;
		while (end < len && p[end] != '\n')
			end++;
		const char *line = (const char *)p + i;
		size_t llen = end - i;
		const char *eq = memchr(line, '=', llen);
		i = end + 1;
		if (!eq)
			continue;
		size_t klen = (size_t)(eq - line), vlen = llen - klen - 1;
		char key[16], val[300];
		if (klen >= sizeof key)
			continue;
		memcpy(key, line, klen);
		key[klen] = 0;
		copy_val(val, sizeof val, eq + 1, vlen); /* an embedded NUL just ends the value */
		if (!strcmp(key, "v"))
			out->version = atoi(val);
		else if (!strcmp(key, "id")) {
			if (disc_id_parse(val, &out->id))
				memset(&out->id, 0, sizeof out->id);
		} else if (!strcmp(key, "host"))
			snprintf(out->host, sizeof out->host, "%s", val);
		else if (!strcmp(key, "port"))
			out->port = atoi(val);
		else if (!strcmp(key, "mem"))
			out->mem_bytes = strtoull(val, NULL, 10);
		else if (!strcmp(key, "cores"))
			out->cores = atoi(val);
		else if (!strcmp(key, "rdma"))
			copy_val(out->rdma, sizeof out->rdma, val, strlen(val));
	}
}
