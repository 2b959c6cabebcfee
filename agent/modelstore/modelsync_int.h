/*
 * modelsync_int.h: what the files of the model transfer (modelsync_*.c) share and nothing else
 * includes: the ERR message helpers, the hashing loop and the hash cache, the slice index with
 * its range algebra. The public side is modelsync.h.
 *
 * Threads: as modelsync.h (blocking, any thread, no shared state).
 */
#ifndef SHOAL_AGENT_MODELSYNC_INT_H
#define SHOAL_AGENT_MODELSYNC_INT_H

#include "agent/modelstore/modelsync.h"

#include <sodium.h>

#define PROGRESS_LOG_MS 2000 /* at most one progress line this often */

/* ---- messages (modelsync_fetch.c) ---- */

/* Sends ERR with a reason (best effort: the channel may already be dead). */
void ms_send_err(tp_chan_t *c, const char *reason);
/* Copies an ERR payload into a printable string of outlen bytes. */
void ms_err_text(char *out, size_t outlen, const void *p, size_t len);
/* Receives one message, within timeout_ms. An ERR from the peer becomes SH_ENOENT with its text;
 * *p points into the channel's buffer until the next receive. */
int ms_recv_msg(tp_chan_t *c, uint16_t *type, uint8_t **p, size_t *len, int timeout_ms,
		const char *peer, char *err, size_t errlen);

/* ---- hashing (modelsync_hash.c) ---- */

/* Feeds bytes [0, len) of fd into st, logging progress for large files under the name what.
 * cancel (may be NULL) set: SH_ECANCELED. */
int ms_hash_fd(int fd, uint64_t len, crypto_generichash_state *st, const char *what,
	       const atomic_int *cancel, char *err, size_t errlen);
/* Adds (or replaces) the cache entry of the absolute path abs. Best effort. */
void ms_cache_store(const char *state_dir, const char *abs, uint64_t size, int64_t mtime,
		    const uint8_t hash[MS_HASH_BYTES]);

/* ---- the slice index (modelsync_sidx.c) ---- */

/* One index entry: ranges written together and the hash of their bytes in that order (each
 * read from the slice file, or from the sidecar for a compact range). */
typedef struct ms_sbatch {
	uint8_t hash[MS_HASH_BYTES];
	int n;
	ms_range_t *r; /* malloc'd, owned by the batch */
} ms_sbatch_t;

typedef struct ms_sidx {
	uint64_t total; /* the model's size */
	int n;
	ms_sbatch_t *b; /* malloc'd */
} ms_sidx_t;

void ms_sidx_free(ms_sidx_t *x); /* frees the batches and zeroes x */
/* Reads the index at path (0, SH_ENOENT or SH_EFORMAT); a torn last line ends it. */
int ms_sidx_load(const char *path, ms_sidx_t *x);
/* Rewrites SLICE.idx and SLICE.cols.map (what the engine reads) from x, atomically. */
int ms_sidx_store(const char *slice_path, const ms_sidx_t *x, char *err, size_t errlen);
/* All ranges x holds, normalised (ms_ranges_norm); *out malloc'd. */
int ms_sidx_held(const ms_sidx_t *x, ms_range_t **out, int *n_out);

/* Appends a range to the malloc'd list (*r, *n), joining it to the last one when both are of one
 * kind and touch. Returns 0 or SH_ENOMEM. */
int ms_range_add(ms_range_t **r, int *n, ms_range_t a);
/* Sorts by (kind, offset) and merges overlapping or touching ranges of one kind in place (the
 * sidecar positions are dropped: for sets of bytes held or needed). Returns the count. */
int ms_ranges_norm(ms_range_t *r, int n);
/* *out = need minus have (both normalised), kind by kind. */
int ms_ranges_sub(const ms_range_t *need, int nn, const ms_range_t *have, int nh, ms_range_t **out,
		  int *n_out);

#endif
