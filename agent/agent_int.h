/*
 * agent_int.h: the agent's internals shared by its files (agent.c: the loop, members and
 * handshakes; status.c: the status socket and its JSON). Not for other modules.
 *
 * Everything here is owned by the thread that runs agent_run (see agent.h).
 */
#ifndef SHOAL_AGENT_INT_H
#define SHOAL_AGENT_INT_H

#include "agent/agent.h"

#include <stdatomic.h>

#define HANDSHAKE_MS    2000
#define FALLBACK_MS     3000
#define RETRY_MS        1000
#define STATIC_RETRY_MS 2000
#define MAX_CONNS       DISC_MAX_PEERS
#define MAX_DIALS       32
#define MAX_HANDSHAKES  64 /* handshake threads at once, both directions */

typedef struct conn {
	tp_chan_t *ch;
	disc_id_t id;
	int initiator_is_me;
	int64_t last_rx_ms, last_tx_ms;
	char addr[DISC_ADDR_MAX]; /* peer address without port */
	disc_info_t info;         /* from the peer's INFO */
} conn_t;

/* A handshake on its own thread; the result comes back through result_pipe. */
typedef struct dial {
	agent_t *a;
	int outgoing;
	char host[DISC_HOST_MAX];
	int port;
	int fd;           /* incoming: the accepted socket */
	int static_index; /* outgoing to --peer i, else -1 */
	disc_id_t target; /* outgoing to an mDNS peer (zero for static) */
	/* result */
	tp_chan_t *ch;
	int rc;
	char err[256];
} dial_t;

struct agent {
	agent_config_t cfg;
	tp_keys_t keys;
	disc_id_t self;
	char self_hex[DISC_ID_HEX];
	disc_host_facts_t facts;
	uint64_t nonce;
	agent_state_t state;
	elec_t *elec;
	disc_mdns_t *mdns;
	disc_table_t *table;
	int listen_fd, status_fd;
	char status_path[4096];
	int result_pipe[2], stop_pipe[2];
	atomic_int dials_running;
	conn_t conns[MAX_CONNS];
	int nconns;
	/* dials in flight, so one target is dialled once at a time */
	disc_id_t dialing[MAX_DIALS];
	int ndialing;
	int static_dialing[AGENT_MAX_STATIC_PEERS];
	int64_t static_last_ms[AGENT_MAX_STATIC_PEERS];
	disc_id_t static_id[AGENT_MAX_STATIC_PEERS]; /* learnt at the first handshake */
	int static_self[AGENT_MAX_STATIC_PEERS];     /* the --peer is this node itself */
	int static_err_logged[AGENT_MAX_STATIC_PEERS];
	int64_t mdns_last_try_ms[DISC_MAX_PEERS]; /* indexed like the table (a rate limit only) */
	unsigned mdns_tries[DISC_MAX_PEERS];
	int64_t last_hb_ms;
	int duplicate; /* another live node uses our ID */
	char duplicate_where[128];
	int stood_down; /* found the duplicate before joining anyone: the other node keeps the ID */
	char foreign_seen[8][DISC_NAME_MAX]; /* other clusters' services, logged once each */
	int nforeign;
	disc_id_t last_leader;
};

/* The member with this node ID, or NULL. */
conn_t *agent_conn_find(agent_t *a, const disc_id_t *id);

/* Opens STATE_DIR/agent.sock (refusing when a live agent answers on it). */
int agent_status_listen(agent_t *a, char *errbuf, size_t errlen);

/* Answers one client waiting on the status socket with the status JSON. */
void agent_status_serve(agent_t *a);

#endif
