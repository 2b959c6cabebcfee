/*
 * pool.h: the persistent compute thread pool (internal to infer/).
 *
 * Threads are created once by pool_new() and live until pool_free(); pool_run() hands every
 * thread (the caller counts as thread 0) the same function with its index, and returns when all
 * have finished. Work is split by the callee (usually by row range, pool_split()). Workers spin
 * briefly between jobs (decode issues hundreds of jobs per token) and then sleep on a condition
 * variable, so an idle engine costs no CPU.
 *
 * Threads: pool_run() must be called from one thread at a time (the engine's generate thread);
 * the job function runs concurrently on every pool thread and must not call pool_run().
 */
#ifndef SHOAL_POOL_H
#define SHOAL_POOL_H

typedef struct pool pool_t;

/* fn(ctx, ith, nth): ith in [0, nth). */
typedef void (*pool_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0 means the number of online cores. Returns NULL on failure. */
pool_t *pool_new(int n_threads);
void pool_free(pool_t *p); /* NULL-safe; joins the threads */
int pool_threads(const pool_t *p);

/* Runs fn on every thread and waits for all. With one thread it is a plain call. */
void pool_run(pool_t *p, pool_fn fn, void *ctx);

/* Thread ith's share [*lo, *hi) of n items, split into nth near-equal parts whose boundaries are
 * multiples of `align` (except the end). */
void pool_split(int n, int ith, int nth, int align, int *lo, int *hi);

/* Number of online cores (at least 1). */
int pool_cores(void);

#endif
