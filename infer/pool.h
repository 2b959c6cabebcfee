/*
 * pool.h: the persistent compute thread pool (internal to infer/).
 *
 * Threads are created once by pool_new() and live until pool_free(). pool_run() splits a job
 * into n_chunks pieces that the threads (the caller included) claim one at a time from an
 * atomic ticket, and returns when every chunk is done. Claiming (rather than a fixed split)
 * keeps a step fast when a worker is descheduled on a busy machine: the others take its share.
 * Workers spin briefly between jobs (decode issues hundreds of jobs per token) and then sleep on
 * a condition variable, so an idle engine costs no CPU.
 *
 * Threads: pool_run() must be called from one thread at a time (the engine's generate thread);
 * the job function runs concurrently on every pool thread and must not call pool_run().
 */
#ifndef SHOAL_POOL_H
#define SHOAL_POOL_H

typedef struct pool pool_t;

/* fn(ctx, chunk, n_chunks, tid): do piece `chunk` of n_chunks; tid in [0, pool_threads) names
 * the executing thread (for per-thread scratch). */
typedef void (*pool_fn)(void *ctx, int chunk, int n_chunks, int tid);

/* n_threads <= 0 means the number of online cores. Returns NULL on failure. */
pool_t *pool_new(int n_threads);
void pool_free(pool_t *p);         /* NULL-safe; joins the threads */
int pool_threads(const pool_t *p); /* 1 for NULL */

/* Runs fn over chunks [0, n_chunks) on the pool and waits for all. With one thread (or a NULL
 * pool) it is a plain loop on the caller. */
void pool_run(pool_t *p, pool_fn fn, void *ctx, int n_chunks);

/* Chunk ith's share [*lo, *hi) of n items split into nth near-equal parts whose boundaries are
 * multiples of `align` (except the end). */
void pool_split(int n, int ith, int nth, int align, int *lo, int *hi);

/* Number of online cores (at least 1). */
int pool_cores(void);

#endif
