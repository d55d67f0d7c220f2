/* A pool of host threads standing for a card's cores. parallel_for splits [0, n) into
 * chunks of at least `grain` items across the threads (the caller's thread takes part) and
 * returns when all are done. One parallel_for at a time per pool; calls from several
 * threads are serialised. A NULL pool runs fn(ctx, 0, n) on the caller. */
#ifndef TTD_KERNELS_THREAD_POOL_H
#define TTD_KERNELS_THREAD_POOL_H

#include <stdatomic.h>
#include <stddef.h>

typedef struct ttd_pool ttd_pool;

/* A cancellation flag for the kernels a thread runs: 0 while they may go on; any thread may
 * set it (a relaxed store will do) to a non-zero code, which stays until its owner clears it
 * between runs. Once it is set, parallel_for hands out no more chunks (a job's workers carry
 * their caller's flag) and the kernels' long loops return early: their outputs are then
 * partly written, for the caller to throw away. The kernels only test it for non-zero; the
 * daemon stores a gRPC status code (DEADLINE_EXCEEDED, ...) in it. */
typedef struct ttd_cancel {
  atomic_int code;
} ttd_cancel;

/* Makes cancel (NULL: none) the flag of the kernels the calling thread runs from now on, and
 * returns the one before, which the caller puts back when its kernels are done. */
const ttd_cancel *ttd_pool_cancel_enter(const ttd_cancel *cancel);

/* Whether the kernel running on this thread should stop: one relaxed load of the flag of
 * the thread (or, on a worker, of the job it runs); 0 without one. */
int ttd_pool_cancelled(void);

/* The CPUs the calling thread may run on (its affinity: taskset, systemd's CPUAffinity=, a
 * cgroup cpuset), as nproc counts them; the online CPUs where that cannot be read. */
int ttd_pool_usable_cpus(void);

/* threads <= 0: one per usable CPU (ttd_pool_usable_cpus): threads beyond them would take
 * turns on a CPU, each waiting on the others' chunks. NULL if out of memory. */
ttd_pool *ttd_pool_create(int threads);
void ttd_pool_destroy(ttd_pool *pool); /* accepts NULL */
int ttd_pool_threads(const ttd_pool *pool); /* 1 for NULL */

/* How many times a worker that began a job on its caller's CPU moved to another one
 * (thread_pool.c: leave_caller_cpu). */
unsigned long long ttd_pool_nudges(ttd_pool *pool);

/* Work is coming: sleeping workers wake now and spin a while for it, so that the next
 * parallel_for does not wait for a wake-up. Accepts NULL. */
void ttd_pool_wake(ttd_pool *pool);

/* With the calling thread's flag set (ttd_pool_cancel_enter), chunks not yet begun are
 * skipped, and nothing runs when it is set on entry. */
void ttd_pool_parallel_for(ttd_pool *pool, size_t n, size_t grain, void (*fn)(void *ctx, size_t begin, size_t end),
                           void *ctx);

/* parallel_for for work that should not wait behind another caller's job (a transfer
 * beside a kernel): when the pool is busy, fn(ctx, 0, n) runs on the caller alone.
 * Returns 1 when the pool's threads took part, 0 when the caller ran it alone. */
int ttd_pool_parallel_for_nowait(ttd_pool *pool, size_t n, size_t grain,
                                 void (*fn)(void *ctx, size_t begin, size_t end), void *ctx);

#endif
