/* ttd_pool: a fixed set of worker threads plus the calling thread.
 *
 * One job at a time: parallel_for holds `call_mu` for its whole run, so concurrent callers
 * queue up (parallel_for_nowait's callers run alone instead). A job is published under `mu`
 * with a new generation number and `tickets` (how many workers may join it); woken workers
 * that get a ticket claim chunks from an atomic counter until none are left, then report
 * back under `mu`. The caller claims chunks too and then waits until every ticket holder
 * has reported, so all of the job's writes happen before parallel_for returns (the last
 * `mu` hand-off orders them).
 *
 * Chunks: [0, n) is cut into n / grain pieces at most (every piece >= grain items), capped
 * at a few per thread so the dynamic claiming still balances uneven work.
 *
 * A parallel_for made from inside a job (a kernel calling a kernel) runs inline on the
 * calling thread: it could never get `call_mu` otherwise.
 *
 * Cancellation: a job carries its caller's flag (ttd_cancel); before claiming each chunk a
 * thread loads it (relaxed) and stops claiming once it is set, and workers make it their own
 * while they run the job's chunks, so a kernel's inner checks see it on every thread.
 *
 * Kernels come in quick succession (a program is a chain of them), so a worker that has just
 * finished, and a caller waiting for helpers, spin for SPIN_NS before sleeping: the next job
 * or the last helper usually arrives within that, and a futex wake-up costs more than the
 * small kernels of a training step. */
#define _GNU_SOURCE /* pthread_setname_np */
#include "thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "kernel_internal.h"

#define CHUNKS_PER_THREAD 4
#define SPIN_NS 40000

struct ttd_pool {
  int threads; /* workers + the caller */
  int nworkers;
  pthread_t *workers;

  pthread_mutex_t call_mu; /* one parallel_for at a time */

  pthread_mutex_t mu;     /* guards everything below but `next` */
  pthread_cond_t work_cv; /* workers: a new job or shutdown */
  pthread_cond_t done_cv; /* caller: the last ticket holder is done */
  _Atomic uint64_t generation; /* written under mu; read unlocked only to spin */
  _Atomic uint64_t pokes;      /* ttd_pool_wake calls; written under mu */
  atomic_int shutdown;
  int tickets; /* workers that may still join the current job */
  atomic_int active;  /* ticket holders that have not reported back; written under mu */

  /* the current job (written under mu by the caller, read under mu by workers) */
  void (*fn)(void *ctx, size_t begin, size_t end);
  void *ctx;
  const ttd_cancel *cancel; /* the caller's flag, or NULL */
  size_t n, nchunks;
  atomic_size_t next; /* next unclaimed chunk */
  int caller_cpu;     /* where the current job's caller ran when it published the job; -1: unknown */
  atomic_ullong nudges; /* workers moved off their caller's CPU (ttd_pool_nudges) */
};

/* Set while this thread runs a job's chunks: nested parallel_for calls run inline. */
static _Thread_local int tls_in_job;

/* The flag of the kernels this thread runs: its own (ttd_pool_cancel_enter), or on a worker
 * the flag of the job whose chunks it runs. */
static _Thread_local const ttd_cancel *tls_cancel;

const ttd_cancel *ttd_pool_cancel_enter(const ttd_cancel *cancel) {
  const ttd_cancel *before = tls_cancel;
  tls_cancel = cancel;
  return before;
}

static int cancel_set(const ttd_cancel *cancel) {
  return cancel && atomic_load_explicit(&((ttd_cancel *)cancel)->code, memory_order_relaxed) != 0;
}

int ttd_pool_cancelled(void) { return cancel_set(tls_cancel); }

static void chunk_bounds(size_t n, size_t nchunks, size_t i, size_t *begin, size_t *end) {
  size_t base = n / nchunks, rem = n % nchunks;
  *begin = i * base + (i < rem ? i : rem);
  *end = *begin + base + (i < rem ? 1 : 0);
}

static void run_chunks(void (*fn)(void *, size_t, size_t), void *ctx, const ttd_cancel *cancel, size_t n,
                       size_t nchunks, atomic_size_t *next) {
  tls_in_job = 1;
  const ttd_cancel *own = tls_cancel;
  tls_cancel = cancel;
  for (;;) {
    if (cancel_set(cancel)) break; /* the remaining chunks are left unclaimed */
    size_t i = atomic_fetch_add_explicit(next, 1, memory_order_relaxed);
    if (i >= nchunks) break;
    size_t begin, end;
    chunk_bounds(n, nchunks, i, &begin, &end);
    fn(ctx, begin, end);
  }
  tls_cancel = own;
  tls_in_job = 0;
}

/* Spins (without the lock) until done(pool, arg) or SPIN_NS pass. */
static void spin(ttd_pool *pool, int (*done)(ttd_pool *, uint64_t), uint64_t arg) {
  int64_t until = ttd_know_ns() + SPIN_NS;
  while (!done(pool, arg)) {
#if defined(__x86_64__) || defined(__i386__)
    for (int i = 0; i < 32; i++) __builtin_ia32_pause();
#endif
    if (ttd_know_ns() > until) return;
  }
}

/* Workers sleeping since `seen_pokes` should wake and spin. */
static int poked(ttd_pool *pool, uint64_t seen_pokes) {
  return atomic_load_explicit(&pool->pokes, memory_order_relaxed) != seen_pokes;
}

static int new_job(ttd_pool *pool, uint64_t seen) {
  return atomic_load_explicit(&pool->generation, memory_order_acquire) != seen ||
         atomic_load_explicit(&pool->shutdown, memory_order_relaxed);
}

static int helpers_done(ttd_pool *pool, uint64_t unused) {
  (void)unused;
  return atomic_load_explicit(&pool->active, memory_order_acquire) == 0;
}

/* A worker that starts a job on the CPU its caller runs on moves to another CPU it may use:
 * the two would take turns on one core while the other idles. Linux puts them there after
 * an idle spell (a woken worker follows its waker; with little recent load the balancer
 * leaves them be), and kept them there for 30-70 ms after each pause of 0.1 s or more: a
 * batch-64 MLP step took 1.4 ms instead of 0.65. Narrowing the worker's CPU set migrates it
 * at once; widening it again right after lets the scheduler place it freely later on. */
static void leave_caller_cpu(ttd_pool *pool, int caller_cpu, const cpu_set_t *allowed) {
  if (caller_cpu < 0 || CPU_COUNT(allowed) < 2 || sched_getcpu() != caller_cpu) return;
  cpu_set_t others = *allowed;
  CPU_CLR(caller_cpu, &others);
  if (CPU_COUNT(&others) == 0) return;
  if (sched_setaffinity(0, sizeof(others), &others) == 0) {
    sched_setaffinity(0, sizeof(*allowed), allowed);
    atomic_fetch_add_explicit(&pool->nudges, 1, memory_order_relaxed);
  }
}

static void *worker_main(void *arg) {
  ttd_pool *pool = arg;
  pthread_setname_np(pthread_self(), "ttd-kernels"); /* in top -H, ps -L, gdb */
  cpu_set_t allowed; /* the CPUs this process may use (taskset, cgroup cpuset) */
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) CPU_ZERO(&allowed);
  uint64_t seen = 0, seen_pokes = 0;
  pthread_mutex_lock(&pool->mu);
  for (;;) {
    if (!new_job(pool, seen)) {
      pthread_mutex_unlock(&pool->mu);
      spin(pool, new_job, seen);
      pthread_mutex_lock(&pool->mu);
    }
    seen_pokes = pool->pokes;
    while (!pool->shutdown && pool->generation == seen && !poked(pool, seen_pokes)) {
      pthread_cond_wait(&pool->work_cv, &pool->mu);
    }
    if (pool->shutdown) break;
    if (pool->generation == seen) continue; /* poked: spin again, a job is coming */
    seen = pool->generation;
    if (pool->tickets == 0) continue; /* enough workers joined this job */
    pool->tickets--;
    void (*fn)(void *, size_t, size_t) = pool->fn;
    void *ctx = pool->ctx;
    const ttd_cancel *cancel = pool->cancel;
    size_t n = pool->n, nchunks = pool->nchunks;
    int caller_cpu = pool->caller_cpu;
    pthread_mutex_unlock(&pool->mu);

    leave_caller_cpu(pool, caller_cpu, &allowed);
    run_chunks(fn, ctx, cancel, n, nchunks, &pool->next);

    pthread_mutex_lock(&pool->mu);
    if (--pool->active == 0) pthread_cond_signal(&pool->done_cv);
  }
  pthread_mutex_unlock(&pool->mu);
  return NULL;
}

static void pool_free(ttd_pool *pool) {
  pthread_cond_destroy(&pool->done_cv);
  pthread_cond_destroy(&pool->work_cv);
  pthread_mutex_destroy(&pool->mu);
  pthread_mutex_destroy(&pool->call_mu);
  free(pool->workers);
  free(pool);
}

/* Stops and joins the first `started` workers. */
static void pool_stop(ttd_pool *pool, int started) {
  pthread_mutex_lock(&pool->mu);
  pool->shutdown = 1;
  pthread_cond_broadcast(&pool->work_cv);
  pthread_mutex_unlock(&pool->mu);
  for (int i = 0; i < started; i++) pthread_join(pool->workers[i], NULL);
}

int ttd_pool_usable_cpus(void) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) > 0) return CPU_COUNT(&allowed);
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? (online > 1024 ? 1024 : (int)online) : 1;
}

ttd_pool *ttd_pool_create(int threads) {
  if (threads <= 0) threads = ttd_pool_usable_cpus();
  ttd_pool *pool = calloc(1, sizeof(*pool));
  if (!pool) return NULL;
  pool->threads = threads;
  pool->nworkers = threads - 1;
  atomic_init(&pool->next, 0);
  if (pool->nworkers > 0) {
    pool->workers = calloc((size_t)pool->nworkers, sizeof(pthread_t));
    if (!pool->workers) {
      free(pool);
      return NULL;
    }
  }
  pthread_mutex_init(&pool->call_mu, NULL);
  pthread_mutex_init(&pool->mu, NULL);
  pthread_cond_init(&pool->work_cv, NULL);
  pthread_cond_init(&pool->done_cv, NULL);

  /* Workers start with asynchronous signals blocked, so the process's signal handling (the
   * daemon's SIGTERM/SIGINT flag) stays on the threads that expect it. */
  sigset_t all, old;
  sigfillset(&all);
  sigdelset(&all, SIGSEGV);
  sigdelset(&all, SIGBUS);
  sigdelset(&all, SIGFPE);
  sigdelset(&all, SIGILL);
  sigdelset(&all, SIGABRT);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  int started = 0;
  for (; started < pool->nworkers; started++) {
    if (pthread_create(&pool->workers[started], NULL, worker_main, pool) != 0) break;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (started < pool->nworkers) {
    pool_stop(pool, started);
    pool_free(pool);
    return NULL;
  }
  return pool;
}

void ttd_pool_destroy(ttd_pool *pool) {
  if (!pool) return;
  pool_stop(pool, pool->nworkers);
  pool_free(pool);
}

int ttd_pool_threads(const ttd_pool *pool) { return pool ? pool->threads : 1; }

unsigned long long ttd_pool_nudges(ttd_pool *pool) {
  return pool ? atomic_load_explicit(&pool->nudges, memory_order_relaxed) : 0;
}

void ttd_pool_wake(ttd_pool *pool) {
  if (!pool || pool->nworkers == 0) return;
  pthread_mutex_lock(&pool->mu);
  atomic_fetch_add_explicit(&pool->pokes, 1, memory_order_relaxed);
  pthread_cond_broadcast(&pool->work_cv);
  pthread_mutex_unlock(&pool->mu);
}

/* Runs the job on the pool (returns 1), or on the caller alone (0): when it is too small,
 * nested, or when `wait` is 0 and another job holds the pool. Nothing runs once the
 * caller's flag is set. */
static int run_job(ttd_pool *pool, size_t n, size_t grain, void (*fn)(void *ctx, size_t begin, size_t end), void *ctx,
                   int wait) {
  if (n == 0 || cancel_set(tls_cancel)) return 0;
  if (grain == 0) grain = 1;
  size_t nchunks = n / grain;
  if (!pool || pool->nworkers == 0 || nchunks <= 1 || tls_in_job ||
      (wait ? pthread_mutex_lock(&pool->call_mu) : pthread_mutex_trylock(&pool->call_mu)) != 0) {
    fn(ctx, 0, n);
    return 0;
  }
  size_t max_chunks = (size_t)pool->threads * CHUNKS_PER_THREAD;
  if (nchunks > max_chunks) nchunks = max_chunks;
  int helpers = nchunks - 1 < (size_t)pool->nworkers ? (int)(nchunks - 1) : pool->nworkers;

  pthread_mutex_lock(&pool->mu);
  pool->fn = fn;
  pool->ctx = ctx;
  pool->cancel = tls_cancel;
  pool->n = n;
  pool->nchunks = nchunks;
  atomic_store_explicit(&pool->next, 0, memory_order_relaxed);
  pool->tickets = helpers;
  pool->active = helpers;
  pool->caller_cpu = sched_getcpu();
  pool->generation++;
  /* Each signal wakes a distinct sleeper; a worker not asleep sees the new generation before
   * it next waits, so at least `helpers` workers look for a ticket. */
  for (int i = 0; i < helpers; i++) pthread_cond_signal(&pool->work_cv);
  pthread_mutex_unlock(&pool->mu);

  run_chunks(fn, ctx, tls_cancel, n, nchunks, &pool->next);

  /* Every chunk is claimed: tickets no worker took yet are withdrawn, so a worker still waking
   * up is not waited for. */
  pthread_mutex_lock(&pool->mu);
  pool->active -= pool->tickets;
  pool->tickets = 0;
  pthread_mutex_unlock(&pool->mu);
  spin(pool, helpers_done, 0);
  pthread_mutex_lock(&pool->mu);
  while (pool->active > 0) pthread_cond_wait(&pool->done_cv, &pool->mu);
  pthread_mutex_unlock(&pool->mu);
  pthread_mutex_unlock(&pool->call_mu);
  return 1;
}

void ttd_pool_parallel_for(ttd_pool *pool, size_t n, size_t grain, void (*fn)(void *ctx, size_t begin, size_t end),
                           void *ctx) {
  run_job(pool, n, grain, fn, ctx, 1);
}

int ttd_pool_parallel_for_nowait(ttd_pool *pool, size_t n, size_t grain,
                                 void (*fn)(void *ctx, size_t begin, size_t end), void *ctx) {
  return run_job(pool, n, grain, fn, ctx, 0);
}
