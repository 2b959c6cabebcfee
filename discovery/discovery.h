/*
 * discovery.h: finding peers on the local network by mDNS/DNS-SD, and the election that makes the
 * member with the smallest node ID the leader.
 *
 * Four parts, each usable alone:
 *   - node identity and host facts (identity.c): the 128-bit node ID kept in the state directory,
 *     memory, cores and RDMA devices advertised to peers;
 *   - the mDNS backend (mdns_avahi.c or mdns_dnssd.c, chosen at build time): publishes this node's
 *     _shoal._tcp service and reports resolved peers as events on a queue the caller polls;
 *   - the sighting table (members.c): what mDNS said about each peer, folded by node ID, with
 *     every address and the interface it was resolved on (pure data, no I/O);
 *   - the election core (election.c): pure, no I/O; membership changes, messages and the time come
 *     in as arguments, messages to send come out of a queue. A thin shell (agent/) does the I/O.
 *
 * mDNS is only a hint: a peer becomes a member after the authenticated handshake on the control
 * channel, and stays one while its heartbeats arrive. Membership and election messages travel as
 * typed frames on that channel; their numbers (0x0100-0x01ff) and layouts are below and in
 * docs/discovery.md.
 */
#ifndef SHOAL_DISCOVERY_H
#define SHOAL_DISCOVERY_H

#include "common/common.h"

#include <net/if.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- node identity ------------------------------------------------------------------------ */

#define DISC_ID_LEN 16
#define DISC_ID_HEX 33 /* 32 hex digits and the NUL */

/* A node ID: 128 random bits, compared as a big-endian number (memcmp order). A value type. */
typedef struct disc_id {
	uint8_t b[DISC_ID_LEN];
} disc_id_t;

/* Value helpers, inline so that the pure cores (election.c, agent/core.c) need nothing of
 * discovery's I/O at link time. */
static inline int disc_id_cmp(const disc_id_t *a, const disc_id_t *b) /* <0, 0, >0 as memcmp */
{
	return memcmp(a->b, b->b, DISC_ID_LEN);
}
static inline int disc_id_is_zero(const disc_id_t *id)
{
	static const disc_id_t zero;
	return !disc_id_cmp(id, &zero);
}
static inline void disc_id_hex(const disc_id_t *id, char out[DISC_ID_HEX])
{
	sh_hex_encode(out, id->b, DISC_ID_LEN);
}
/* Parses exactly 32 hex digits. Returns 0 or SH_EFORMAT. */
static inline int disc_id_parse(const char *hex, disc_id_t *out)
{
	return sh_hex_decode(out->b, DISC_ID_LEN, hex);
}

/* The default state directory: $XDG_STATE_HOME/shoal, else ~/.local/state/shoal, and
 * /var/lib/shoal for root. Returns 0 or SH_EINVAL when it does not fit in len. */
int disc_state_dir_default(char *out, size_t len);

/* Loads STATE_DIR/node_id (32 hex digits and a newline), creating the directory and a fresh random
 * ID (libsodium randombytes) the first time. *created is set to 1 when it was just made.
 * A malformed file is an error (never silently replaced: that would change the node's identity). */
int disc_identity_load(const char *state_dir, disc_id_t *id, int *created, char *errbuf,
		       size_t errlen);

/* What this host advertises about itself. */
typedef struct disc_host_facts {
	char hostname[256];
	uint64_t mem_bytes; /* physical memory */
	int cores;          /* online CPUs */
	char rdma[256];     /* "dev:ifname,dev:ifname" from /sys/class/infiniband, or "" */
} disc_host_facts_t;

/* Fills the facts for this machine (never fails; unknown fields are 0 or ""). */
void disc_host_facts_get(disc_host_facts_t *f);

/* ---- the mDNS backend ----------------------------------------------------------------------- */

#define DISC_SERVICE_TYPE  "_shoal._tcp"
#define DISC_PROTO_VERSION 1
#define DISC_CID_MAX       65 /* cluster ID: hex text from the token's keys, NUL-terminated */
#define DISC_NAME_MAX      64 /* a DNS-SD instance name label (63 bytes) and the NUL */
#define DISC_HOST_MAX      256
#define DISC_ADDR_MAX      64 /* numeric address text, IPv4 or IPv6 */

/* What this node publishes. Never contains the token: cid is the public cluster ID. */
typedef struct disc_publish {
	disc_id_t id;
	char cid[DISC_CID_MAX];
	uint16_t port; /* the control port */
	uint64_t mem_bytes;
	int cores;
	char rdma[256];
	uint64_t nonce; /* random per process: tells a copied state dir from a second sighting */
} disc_publish_t;

/* One resolution of a peer's service on one interface (a peer may have several). */
typedef struct disc_sighting {
	char name[DISC_NAME_MAX]; /* service instance name */
	disc_id_t id;             /* from TXT id= (zero when missing or malformed) */
	char cid[DISC_CID_MAX];   /* from TXT cid= */
	int version;              /* from TXT v= */
	uint64_t mem_bytes;
	int cores;
	char rdma[256];
	uint64_t nonce;
	char host[DISC_HOST_MAX]; /* the SRV target, e.g. lab2.local */
	char addr[DISC_ADDR_MAX]; /* numeric address */
	uint16_t port;
	int ifindex; /* interface the resolution came from */
	char ifname[IF_NAMESIZE];
	int ipv6;
} disc_sighting_t;

typedef enum disc_event_kind {
	DISC_EV_UP,   /* a service was resolved (or re-resolved with new data) */
	DISC_EV_DOWN, /* a service went away on one interface (name + ifindex + ipv6 say which) */
	DISC_EV_PUBLISHED, /* our own service is established under sighting.name */
	DISC_EV_RESTARTED, /* the daemon connection was lost and re-made: every sighting is gone */
} disc_event_kind_t;

typedef struct disc_event {
	disc_event_kind_t kind;
	disc_sighting_t s;
} disc_event_t;

/* The backend. It runs on its own thread (avahi: an AvahiThreadedPoll; dns_sd: a poll thread) and
 * hands events to the caller through a queue whose file descriptor becomes readable when events
 * wait. All functions below are for one caller thread; the callbacks never reach the caller. */
typedef struct disc_mdns disc_mdns_t;

/* Starts publishing and browsing. Works (and keeps retrying) when no daemon runs yet. Returns NULL
 * with a message in errbuf only when the backend cannot start at all. */
disc_mdns_t *disc_mdns_new(const disc_publish_t *pub, char *errbuf, size_t errlen);
void disc_mdns_free(disc_mdns_t *m);    /* stops the thread; NULL is fine */
int disc_mdns_fd(const disc_mdns_t *m); /* poll for POLLIN; never read it yourself */
/* Pops one event into *ev: returns 1, or 0 when the queue is empty. */
int disc_mdns_next(disc_mdns_t *m, disc_event_t *ev);
const char *disc_mdns_backend(void); /* "avahi" or "dnssd" */

/* TXT helpers shared by the backends (and the tests): the key=value items for a publish record,
 * and parsing one item into a sighting. Returns the number of items written (<= max). */
int disc_txt_items(const disc_publish_t *pub, char items[][300], int max);
void disc_txt_parse_item(disc_sighting_t *s, const char *key, const char *val, size_t vlen);

/* How a sighting carrying our own node ID relates to us: DISC_SELF_NOT (another ID),
 * DISC_SELF_OURS (our own record: this process's nonce, or our port on one of our own addresses,
 * i.e. a re-registration by the daemon or the record our predecessor left behind after a crash,
 * with another nonce), or DISC_SELF_DUPLICATE (another node uses our ID: a copied state directory).
 * addr_is_local says whether s->addr is one of this host's addresses (the caller knows them). */
enum { DISC_SELF_NOT = 0, DISC_SELF_OURS = 1, DISC_SELF_DUPLICATE = 2 };
int disc_sighting_self(const disc_publish_t *pub, const disc_sighting_t *s, int addr_is_local);

/* ---- the sighting table (pure) -------------------------------------------------------------- */

#define DISC_MAX_PEERS 64
#define DISC_MAX_ADDRS 8

typedef struct disc_peer_addr {
	char name[DISC_NAME_MAX];
	char addr[DISC_ADDR_MAX];
	uint16_t port;
	int ifindex;
	char ifname[IF_NAMESIZE];
	int ipv6;
} disc_peer_addr_t;

/* Everything mDNS told us about one peer (same node ID). */
typedef struct disc_peer {
	disc_id_t id;
	char host[DISC_HOST_MAX];
	uint64_t mem_bytes;
	int cores;
	char rdma[256];
	uint64_t nonce;
	int naddrs;
	disc_peer_addr_t addrs[DISC_MAX_ADDRS];
	int64_t first_seen_ms;
} disc_peer_t;

typedef struct disc_table disc_table_t;

disc_table_t *disc_table_new(void);
void disc_table_free(disc_table_t *t);
/* Records a sighting (UP). Returns the peer it belongs to, or NULL when the table is full or the
 * sighting has no ID. The pointer lives until the next call that changes the table. */
const disc_peer_t *disc_table_add(disc_table_t *t, const disc_sighting_t *s, int64_t now_ms);
/* Removes one sighting (DOWN); a peer with no address left is dropped. Returns 1 if a peer was
 * dropped, else 0. */
int disc_table_remove(disc_table_t *t, const disc_sighting_t *s);
void disc_table_clear(disc_table_t *t);
const disc_peer_t *disc_table_find(const disc_table_t *t, const disc_id_t *id);
int disc_table_count(const disc_table_t *t);
const disc_peer_t *disc_table_at(const disc_table_t *t, int i);

/* ---- membership and election messages (frame types on the control channel) ----------------- */

/* The transport owns frame types 0x0001-0x00ff; membership and election use 0x0100-0x01ff
 * (transport/frame.h lists every range). Numbers are never reused. Every integer is little-endian;
 * layouts are fixed-size except where stated.
 *
 * (each entry: number, name, then its payload on the following lines)
 *
 *   0x0100 DISC_MSG_INFO
 *          text "key=value\n" lines: v, id, host, port, mem, cores, rdma (<= 1024 bytes);
 *          sent once by both sides right after the handshake
 *   0x0101 DISC_MSG_HEARTBEAT
 *          struct disc_wire_heartbeat (32 bytes), every heartbeat interval
 *   0x0102 DISC_MSG_LEADER
 *          struct disc_wire_leader_head (24 bytes) + n * 16-byte member IDs:
 *          the leader's announcement of itself, its epoch and its view
 *   0x0103 DISC_MSG_SMALLER
 *          16-byte ID: "I know a member smaller than you" (follower -> leader)
 *   0x0104 DISC_MSG_DUPLICATE
 *          text, the address of a live channel (1..DISC_ADDR_MAX-1 bytes, no NUL): "a node with
 *          your ID is connected to me from there"; sent on a channel about to be closed, to a
 *          node that dialled while another process holding its ID has a live channel
 */
enum disc_msg_type {
	DISC_MSG_INFO = 0x0100,
	DISC_MSG_HEARTBEAT = 0x0101,
	DISC_MSG_LEADER = 0x0102,
	DISC_MSG_SMALLER = 0x0103,
	DISC_MSG_DUPLICATE = 0x0104,
};

/* ---- the election core (pure) ------------------------------------------------------------- */

typedef enum elec_state {
	ELEC_UNSETTLED, /* the view is changing or the expected leader has not announced yet */
	ELEC_LEADER,    /* settled, and this node is the smallest member */
	ELEC_FOLLOWER,  /* settled, following an announced leader that is the smallest member */
} elec_state_t;

const char *elec_state_name(elec_state_t s);

typedef struct elec_config {
	int64_t settle_ms; /* a view stable this long is settled (default 1000) */
	int expect; /* settled at once when this many members (self included) are present; 0 = off
		     */
	int64_t grace_ms; /* a node alone waits this much longer after start (mDNS needs ~1 s) */
	int64_t hold_ms;  /* a leader told of a smaller node it cannot see holds back this long */
	uint64_t min_epoch; /* the largest epoch seen before a restart (epochs only grow) */
	int64_t quick_ms;   /* settle this soon while the view is complete (0 = off) */
} elec_config_t;

#define ELEC_MAX_MEMBERS DISC_MAX_PEERS

/* A message the core wants sent. to is the destination, or all members when broadcast is set. */
typedef struct elec_msg {
	int type; /* DISC_MSG_LEADER or DISC_MSG_SMALLER */
	int broadcast;
	disc_id_t to;
	uint64_t epoch;    /* LEADER */
	disc_id_t subject; /* LEADER: the leader; SMALLER: the smaller member */
	int n;             /* LEADER: the view */
	disc_id_t members[ELEC_MAX_MEMBERS];
} elec_msg_t;

typedef struct elec elec_t;

/* Creates the core for node self at time now. Returns NULL when out of memory. */
elec_t *elec_new(const disc_id_t *self, const elec_config_t *cfg, int64_t now_ms);
void elec_free(elec_t *e);

/* Inputs. Each may queue messages (elec_next_msg) and change the state. */
void elec_member_up(elec_t *e, const disc_id_t *id, int64_t now_ms);
void elec_member_down(elec_t *e, const disc_id_t *id, int64_t now_ms);
void elec_on_leader(elec_t *e, const disc_id_t *from, uint64_t epoch, const disc_id_t *members,
		    int n, int64_t now_ms);
void elec_on_smaller(elec_t *e, const disc_id_t *from, const disc_id_t *smaller, int64_t now_ms);
/* A heartbeat's view of the sender: its epoch and who it thinks leads (zero ID: nobody). */
void elec_on_heartbeat(elec_t *e, const disc_id_t *from, uint64_t epoch, const disc_id_t *leader,
		       int sender_is_leader, int64_t now_ms);
void elec_tick(elec_t *e, int64_t now_ms);
/* The shell's word: every node discovery knows of (mDNS sightings, --peer) is a member now. */
void elec_set_complete(elec_t *e, int complete);

/* Outputs. */
int elec_next_msg(elec_t *e, elec_msg_t *out); /* 1 and a message, or 0 when none is queued */
elec_state_t elec_state(const elec_t *e);
/* The leader this node follows or is; returns 0 and a zero ID when there is none. */
int elec_leader(const elec_t *e, disc_id_t *out);
uint64_t elec_epoch(const elec_t *e);
uint64_t elec_max_epoch(const elec_t *e); /* the largest epoch seen (persist it: min_epoch) */
int elec_member_count(const elec_t *e);
const disc_id_t *elec_member_at(const elec_t *e, int i); /* sorted ascending, self included */
int elec_is_member(const elec_t *e, const disc_id_t *id);
/* The smaller node a follower told us about while we hold back (for the shell to connect to);
 * returns 1 and the ID while holding. */
int elec_hint(const elec_t *e, disc_id_t *out);

/* Wire encoding of the fixed messages (little-endian). */
typedef struct disc_wire_heartbeat {
	uint8_t epoch[8];
	uint8_t leader[16];
	uint8_t state; /* elec_state_t of the sender */
	uint8_t pad[3];
	uint8_t nmembers[4];
} disc_wire_heartbeat_t;
_Static_assert(sizeof(disc_wire_heartbeat_t) == 32, "heartbeat wire size");

typedef struct disc_wire_leader_head {
	uint8_t epoch[8];
	uint8_t leader[16];
} disc_wire_leader_head_t;
_Static_assert(sizeof(disc_wire_leader_head_t) == 24, "leader wire size");

/* The INFO message's content (what a peer tells about itself after the handshake). */
typedef struct disc_info {
	int version;
	disc_id_t id;
	char host[DISC_HOST_MAX];
	int port;
	uint64_t mem_bytes;
	int cores;
	char rdma[256];
} disc_info_t;

/* Writes INFO's text into buf (NUL-terminated); returns its length (< cap) or SH_EINVAL. */
int disc_info_encode(const disc_info_t *in, char *buf, size_t cap);
/* Parses INFO's text (any bytes: unknown keys, missing '=' and overlong values are skipped or cut).
 * Fields not present stay as they were in *out. */
void disc_info_parse(disc_info_t *out, const uint8_t *p, size_t len);

/* Encodes a LEADER message into buf; returns the length or SH_EINVAL when cap is too small. */
int disc_leader_encode(const elec_msg_t *m, uint8_t *buf, size_t cap);
/* Decodes a LEADER payload; returns 0 or SH_EFORMAT (bad length, more than ELEC_MAX_MEMBERS). */
int disc_leader_decode(const uint8_t *p, size_t len, uint64_t *epoch, disc_id_t *leader,
		       disc_id_t *members, int *n);
void disc_heartbeat_encode(disc_wire_heartbeat_t *w, uint64_t epoch, const disc_id_t *leader,
			   int state, int nmembers);
int disc_heartbeat_decode(const uint8_t *p, size_t len, uint64_t *epoch, disc_id_t *leader,
			  int *state, int *nmembers);

#endif
