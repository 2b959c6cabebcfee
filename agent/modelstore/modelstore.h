/*
 * modelstore.h (internal to agent/): which model file this node holds, on top of the transfer
 * protocol (modelsync.h). A node started with --model hashes its file (every byte, each start)
 * and serves it to members that lack it on a port of its own (any free one, announced in NODE
 * as sync_port), each transfer on a thread. A node started without --model fetches the planner's
 * file: its header at first, into a sparse slice file (enough to be planned), then each
 * session's share (modelstore_ensure_share, from the session's thread). A long-running node
 * re-reads its file every SHOAL_MODEL_VERIFY_S seconds (default 6 h) on a thread. docs/agent.md
 * and docs/agent-modelsync.md.
 *
 * Threads: modelstore_* belong to the loop's thread, except modelstore_ensure_share (any thread:
 * it reads only its request). Ownership: modelstore_new returns an object modelstore_free frees
 * (NULL-safe; it waits for the transfers and the re-check, at most their timeout); strings
 * returned are borrowed until the next modelstore_tick.
 */
#ifndef SHOAL_AGENT_MODELSTORE_H
#define SHOAL_AGENT_MODELSTORE_H

#include "agent/modelstore/modelsync.h"
#include "common/common.h"
#include "discovery/discovery.h"
#include "infer/infer.h"
#include "transport/transport.h"

#include <stdint.h>

typedef struct modelstore modelstore_t;

/* path: --model (NULL: fetched). state_dir, keys and self are borrowed for the object's life.
 * Hashes the file (every byte) and opens the transfer listener. NULL with a reason on failure. */
modelstore_t *modelstore_new(const char *path, const char *state_dir, const tp_keys_t *keys,
			     const disc_id_t *self, char *err, size_t errlen);
void modelstore_free(modelstore_t *ms);

int modelstore_fd(const modelstore_t *ms); /* the transfer listener, to poll */
void modelstore_accept(modelstore_t *ms);  /* it is readable: serve one fetcher on a thread */

/* Where to fetch the model from: a member holding the whole file. */
typedef struct modelstore_holder {
	char host[DISC_ADDR_MAX];
	int port; /* its sync_port */
	char hash[MS_HASH_HEX];
	uint64_t size;
} modelstore_holder_t;

/* What a tick changed, for the agent (bits). */
enum {
	MODELSTORE_ANNOUNCE = 1, /* the hash, size or sync port changed: send NODE again */
	MODELSTORE_ROTTED = 2,   /* bytes of the slice in use changed on disk: end the session */
};

/* Once per loop turn: a node without a model fetches the header from holder (NULL: none known
 * yet); the periodic re-check starts and ends. Returns MODELSTORE_* bits. */
int modelstore_tick(modelstore_t *ms, const modelstore_holder_t *holder, int64_t now);

const char *modelstore_path(const modelstore_t *ms); /* the model or slice file, or NULL */
const char *modelstore_hash(const modelstore_t *ms); /* hex content hash, "" = none yet */
uint64_t modelstore_size(const modelstore_t *ms);
int modelstore_slice(const modelstore_t *ms);        /* 1: the file holds only this node's shares */
int modelstore_sync_port(const modelstore_t *ms);    /* what NODE announces (0: serves no one) */
const char *modelstore_news(const modelstore_t *ms); /* the transfer's news for /health, or "" */
/* What the last modelstore_tick did (a fetch started, ended or failed; the file changed on
 * disk), one line for the dashboard's event log, or "". */
const char *modelstore_event(const modelstore_t *ms);

/* A share to make present in the slice: copied into a session at its start. */
typedef struct modelstore_share {
	char state_dir[SH_PATH_MAX];
	char hash[MS_HASH_HEX];
	char model_path[SH_PATH_MAX]; /* the slice file (the shape of the model comes from it) */
	const tp_keys_t *keys;        /* borrowed: outlives the session */
	uint8_t node_id[TP_NODE_ID_BYTES];
	char host[DISC_ADDR_MAX]; /* a holder of the whole file ("": none known) */
	int port;
} modelstore_share_t;

/* Fills sh for this node's slice and holder h (NULL: none known). */
void modelstore_share_of(const modelstore_t *ms, const modelstore_holder_t *h,
			 modelstore_share_t *sh);

/* Makes the slice file hold the bytes of rank `rank`'s share (dist NULL: the whole model),
 * fetching what it lacks from sh's holder. Blocking; any thread. Returns 0 or SH_E* with a
 * reason. */
int modelstore_ensure_share(const modelstore_share_t *sh, const eng_dist_t *dist, int rank,
			    char *err, size_t errlen);

#endif
