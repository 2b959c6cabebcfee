/*
 * modelsync.h (internal to agent/): model availability. A content hash of a GGUF file (BLAKE2b-256
 * over the whole file, cached in the state directory by path, size and mtime so a restart does
 * not rehash a multi-GB file), and the transfer of the whole file from a node that has it (the
 * leader) to one that does not, over an authenticated channel (transport/transport.h).
 *
 * Wire: message types 0x0380-0x038f, documented in docs/agent-modelsync.md. The fetching side
 * sends REQ(want hash); the serving side answers INFO(hash, size) or ERR(reason); then the
 * fetcher keeps a few GET(offset, len) outstanding and the server answers each with DATA in
 * order; the fetcher writes STATE_DIR/models/HASH.gguf.part, hashes as it writes, and renames it
 * to HASH.gguf only when the hash matches; it sends DONE and both sides return. A partial .part
 * is resumed by the next fetch (its prefix is rehashed, then only the rest is requested).
 *
 * Errors are SH_E* codes with a one-line message in the caller's buffer; a peer that vanishes or
 * stalls makes a call fail within its timeout, never hang or abort.
 *
 * Threads: every function is blocking and may run on any thread; two fetches of the same hash
 * into the same state directory at once are not supported (the agent runs one at a time).
 */
#ifndef SHOAL_AGENT_MODELSYNC_H
#define SHOAL_AGENT_MODELSYNC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

#define MS_HASH_BYTES 32
#define MS_HASH_HEX   (2 * MS_HASH_BYTES + 1)

/* Message types (fields little-endian; docs/agent-modelsync.md). Numbers are never reused. */
enum {
	MS_MSG_REQ = 0x0380, /* fetcher -> server, 32: want_hash[32] */
	MS_MSG_INFO =
	    0x0381, /* server -> fetcher, 48: hash[32], size u64, chunk u32, flags u32 (0) */
	MS_MSG_GET = 0x0382,  /* fetcher -> server, 12: offset u64, len u32 (1 .. MS_CHUNK_MAX) */
	MS_MSG_DATA = 0x0383, /* server -> fetcher, 12 + len: offset u64, len u32, data[len] */
	MS_MSG_ERR =
	    0x0384, /* either way, <= 256: reason as text (no NUL); the sender then stops */
	MS_MSG_DONE = 0x0385 /* fetcher -> server, 0: file received and verified */
};
#define MS_MSG_FIRST 0x0380
#define MS_MSG_LAST  0x038f

#define MS_CHUNK_DEFAULT (1u << 20) /* bytes per GET */
#define MS_CHUNK_MAX     (4u << 20)
#define MS_WINDOW        4 /* GETs the fetcher keeps outstanding */

/* 1 when type is one of ours (a dispatcher hands such a channel to modelsync_serve). */
int modelsync_is_msg(uint16_t type);

/* Lowercase hex of a hash; out must hold MS_HASH_HEX bytes. Returns out. */
char *modelsync_hex(char out[MS_HASH_HEX], const uint8_t hash[MS_HASH_BYTES]);

/* Parses 64 hex chars. Returns 0 or SH_EINVAL. */
int modelsync_unhex(uint8_t out[MS_HASH_BYTES], const char *hex);

/* BLAKE2b-256 of the whole file at path into out. With state_dir (may be NULL: no cache) the
 * result is cached in STATE_DIR/model-hashes keyed by the absolute path, size and mtime, so
 * the same unchanged file is hashed once. Files over 256 MiB log progress every few seconds.
 * Returns 0, SH_ENOENT (no such file), SH_EIO. */
int modelsync_hash_file(const char *path, const char *state_dir, uint8_t out[MS_HASH_BYTES],
			char *err, size_t errlen);

/* As modelsync_hash_file, but reads every byte whatever the cache says (and then updates it):
 * for the checks that must see the content, not its size and mtime (each start, the periodic
 * re-check of a long-running node). cancel (may be NULL): once set, returns SH_ECANCELED within
 * one read. */
int modelsync_verify_file(const char *path, const char *state_dir, const atomic_int *cancel,
			  uint8_t out[MS_HASH_BYTES], char *err, size_t errlen);

/* Where a fetched model lives: STATE_DIR/models/HEX.gguf (path_out of path_len bytes). */
int modelsync_model_path(const char *state_dir, const uint8_t hash[MS_HASH_BYTES], char *path_out,
			 size_t path_len);

/* 1 when STATE_DIR/models/HEX.gguf exists and hashes to hash (every byte is read: a copy that
 * rotted with its mtime kept is caught), with its path in path_out; 0 otherwise (a file there
 * with another content is deleted, so the caller fetches it again). */
int modelsync_cached(const char *state_dir, const uint8_t hash[MS_HASH_BYTES], char *path_out,
		     size_t path_len);

/* Called from modelsync_fetch after every chunk: done and total bytes. */
typedef void (*modelsync_progress_fn)(uint64_t done, uint64_t total, void *ud);

/* Fetches the file with content hash want over c (connected and authenticated to a node running
 * modelsync_serve; borrowed, left open) into STATE_DIR/models/HEX.gguf; path_out gets its path.
 * Returns at once, without using c, when that file is already there. Resumes a .part left by an
 * earlier attempt. Logs progress (percent, MB/s) at most every 2 s, and calls progress (may be
 * NULL) per chunk. timeout_ms bounds every wait for the peer (the whole transfer may take longer).
 * Returns 0; SH_ENOENT (the peer has another model or none: its reason is in err);
 * SH_EFORMAT (the received file does not hash to want: .part deleted; or a malformed reply);
 * SH_ETIMEDOUT (the peer went silent); SH_ECLOSED (the peer closed); SH_EIO (disk). After an
 * error the .part is kept for a later resume except on SH_EFORMAT. */
int modelsync_fetch(tp_chan_t *c, const uint8_t want[MS_HASH_BYTES], const char *state_dir,
		    char *path_out, size_t path_len, modelsync_progress_fn progress, void *ud,
		    int timeout_ms, char *err, size_t errlen);

/* ---- slices: a node that computes part of the model fetches only the bytes it reads --------
 * The slice file STATE_DIR/models/HEX.slice is sparse and as long as the model: the bytes the
 * node holds are at their offsets, the rest is a hole (so it opens like the model itself, and
 * bytes on disk follow the share). The short per-row pieces of column slices (compact ranges)
 * go to the sidecar HEX.slice.cols instead, listed in HEX.slice.cols.map, which the engine reads
 * through (infer/gguf.h), so they do not cost whole file-system blocks.
 * STATE_DIR/models/HEX.slice.idx records what it holds, as batches of byte ranges each with the
 * BLAKE2b-256 of its bytes, taken as they were written; a batch whose bytes no longer hash the same
 * (modelsync_slice_verify) is dropped and fetched again. The bytes come over the same
 * REQ/INFO/GET/DATA exchange as a whole file, from a member whose whole file hashed to the model
 * hash; the authenticated channel vouches for them. */

typedef struct ms_range {
	uint64_t off, len; /* bytes [off, off + len) of the model */
	int compact;       /* 1: kept in the sidecar HEX.slice.cols (eng_range_t.compact; gguf.h) */
	uint64_t side;     /* where a compact range sits in the sidecar (filled in by modelsync) */
} ms_range_t;

/* Where the slice file lives: STATE_DIR/models/HEX.slice. */
int modelsync_slice_path(const char *state_dir, const uint8_t hash[MS_HASH_BYTES], char *path_out,
			 size_t path_len);

/* Makes the slice file hold the ranges r[0..n) (n == 0: the GGUF header only, found by reading
 * a growing prefix), fetching over c (as modelsync_fetch) only the bytes its index lacks; c is
 * not used when nothing is missing. path_out gets the slice file's path; *fetched (may be NULL)
 * the bytes transferred. Returns as modelsync_fetch. */
int modelsync_fetch_slice(tp_chan_t *c, const uint8_t want[MS_HASH_BYTES], const char *state_dir,
			  const ms_range_t *r, int n, char *path_out, size_t path_len,
			  uint64_t *fetched, int timeout_ms, char *err, size_t errlen);

/* Re-hashes every batch the slice file's index records; drops the batches whose bytes changed
 * (the next fetch brings them again). *held gets the bytes that remain verified, *dropped (may be
 * NULL) those dropped. Returns 0, SH_ENOENT (no slice of that model), SH_EIO. */
int modelsync_slice_verify(const char *state_dir, const uint8_t hash[MS_HASH_BYTES], uint64_t *held,
			   uint64_t *dropped, char *err, size_t errlen);

/* Serves the file at path (content hash `hash`, from modelsync_hash_file) to one fetcher over c
 * (borrowed) until it sends DONE, closes, or stays silent for timeout_ms. A dispatcher that has
 * already received the fetcher's first message passes it as first_type/first/first_len
 * (first_type 0: none). Answers a REQ for another hash with ERR. Returns 0 after DONE, SH_ECLOSED
 * when the fetcher left early, SH_ETIMEDOUT, SH_EFORMAT (bad request), SH_EIO. */
int modelsync_serve(tp_chan_t *c, const char *path, const uint8_t hash[MS_HASH_BYTES],
		    uint16_t first_type, const void *first, size_t first_len, int timeout_ms,
		    char *err, size_t errlen);

/* A serving thread, so the agent's loop does not block: takes ownership of c (freed by
 * modelsync_server_free), copies path, hash and the first message. */
typedef struct modelsync_server modelsync_server_t;

int modelsync_server_start(modelsync_server_t **out, tp_chan_t *c, const char *path,
			   const uint8_t hash[MS_HASH_BYTES], uint16_t first_type,
			   const void *first, size_t first_len, int timeout_ms, char *err,
			   size_t errlen);

/* 1 once the thread has finished (then *rc, if not NULL, is modelsync_serve's result). */
int modelsync_server_done(modelsync_server_t *s, int *rc);

/* Stops the thread (within ~200 ms), joins it, frees the channel. NULL is fine. */
void modelsync_server_free(modelsync_server_t *s);

#endif
