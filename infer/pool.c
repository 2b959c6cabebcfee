/*
 * pool.c: persistent worker threads claiming chunks from a ticket.
 *
 * A job is published by writing (fn, ctx), resetting `done`, and then release-storing
 * ticket = n_chunks << 32 | 0; `gen` is bumped to wake the workers. Anyone claims a chunk with
 * fetch_add(ticket, 1): low 32 bits < high 32 bits means chunk `low` is theirs. The caller waits
 * until done == n_chunks. Invariant: fn and ctx are only rewritten after every chunk of the
 * previous job is done, and a late worker can only read them after a successful claim, which
 * synchronises with the publishing store; so no thread ever sees a half-written job.
 */
#include "infer/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_ITERS 20000 /* ~50-100 us of pause before a worker sleeps */

struct worker {
	pool_t *p;
	int tid;
	pthread_t thread;
};

struct pool {
	int n;
	struct worker *w;
	pool_fn fn;
	void *ctx;
	atomic_uint_fast64_t ticket;
	atomic_int done;
	atomic_uint gen;
	atomic_int stop;
	atomic_int sleeping;
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

int pool_cores(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

/* Claims and runs chunks until none is left. */
static void run_chunks(pool_t *p, int tid)
{
	for (;;) {
		uint64_t t = atomic_fetch_add_explicit(&p->ticket, 1, memory_order_acq_rel);
		uint32_t idx = (uint32_t)t, n = (uint32_t)(t >> 32);
		if (idx >= n)
			return;
		p->fn(p->ctx, (int)idx, (int)n, tid);
		atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	pool_t *p = w->p;
	unsigned seen = 0;
	for (;;) {
		unsigned g;
		int spins = 0;
		while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
		       !atomic_load(&p->stop)) {
			if (++spins < SPIN_ITERS) {
				cpu_relax();
				continue;
			}
			pthread_mutex_lock(&p->mu);
			atomic_fetch_add(&p->sleeping, 1);
			while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
				pthread_cond_wait(&p->cv, &p->mu);
			atomic_fetch_sub(&p->sleeping, 1);
			pthread_mutex_unlock(&p->mu);
			spins = 0;
		}
		if (atomic_load(&p->stop))
			return NULL;
		seen = g;
		run_chunks(p, w->tid);
	}
}

pool_t *pool_new(int n_threads)
{
	if (n_threads <= 0)
		n_threads = pool_cores();
	pool_t *p = calloc(1, sizeof *p);
	if (!p)
		return NULL;
	p->n = n_threads;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	p->w = calloc((size_t)n_threads, sizeof *p->w);
	if (!p->w)
		goto err;
	for (int i = 1; i < n_threads; i++) {
		p->w[i].p = p;
		p->w[i].tid = i;
		if (pthread_create(&p->w[i].thread, NULL, worker_main, &p->w[i])) {
			p->n = i; /* join only those started */
			goto err;
		}
	}
	return p;
err:
	pool_free(p);
	return NULL;
}

void pool_free(pool_t *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	atomic_store(&p->stop, 1);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (int i = 1; i < p->n && p->w; i++)
		pthread_join(p->w[i].thread, NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p->w);
	free(p);
}

int pool_threads(const pool_t *p)
{
	return p ? p->n : 1;
}

void pool_run(pool_t *p, pool_fn fn, void *ctx, int n_chunks)
{
	if (n_chunks <= 0)
		return;
	if (!p || p->n == 1 || n_chunks == 1) {
		for (int i = 0; i < n_chunks; i++)
			fn(ctx, i, n_chunks, 0);
		return;
	}
	p->fn = fn;
	p->ctx = ctx;
	atomic_store_explicit(&p->done, 0, memory_order_relaxed);
	atomic_store_explicit(&p->ticket, (uint64_t)n_chunks << 32, memory_order_release);
	atomic_fetch_add(&p->gen, 1); /* seq_cst: pairs with the sleeping count */
	if (atomic_load(&p->sleeping)) {
		pthread_mutex_lock(&p->mu);
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
	}
	run_chunks(p, 0);
	int spins = 0;
	while (atomic_load_explicit(&p->done, memory_order_acquire) < n_chunks) {
		if (++spins < SPIN_ITERS)
			cpu_relax();
		else
			sched_yield();
	}
}

static inline int pool_min(int a, int b)
{
	return a < b ? a : b;
}

void pool_split(int n, int ith, int nth, int align, int *lo, int *hi)
{
	if (align < 1)
		align = 1;
	int units = (n + align - 1) / align;
	int a = (int)((long long)units * ith / nth), b = (int)((long long)units * (ith + 1) / nth);
	*lo = pool_min(a * align, n);
	*hi = pool_min(b * align, n);
}
