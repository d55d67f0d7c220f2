/* kernels/thread_pool.c: parallel_for covers every index once, a NULL pool and nested calls
 * run inline, concurrent callers serialise (parallel_for_nowait's run alone instead), no
 * kernel's result depends on the pool, a worker that starts a job on its caller's CPU
 * moves to another, and a set cancellation flag stops jobs and long kernels. */
#define _GNU_SOURCE /* sched_getcpu, CPU_SET */

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"
#include "kernel_testing.h"
#include "suites.h"

typedef struct cover_ctx {
  atomic_int *hits;
  atomic_size_t min_chunk;
  atomic_int calls;
} cover_ctx;

static void cover_fn(void *ctx, size_t begin, size_t end) {
  cover_ctx *c = ctx;
  atomic_fetch_add(&c->calls, 1);
  size_t len = end - begin, cur = atomic_load(&c->min_chunk);
  while (len < cur && !atomic_compare_exchange_weak(&c->min_chunk, &cur, len)) {
  }
  for (size_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
}

/* parallel_for covers every index exactly once in chunks >= min(grain, n), for many threads/n/grain. */
START_TEST(test_pool_covers_each_index_once) {
  static const int threads[] = {1, 2, 3, 4, 7};
  static const size_t sizes[] = {0, 1, 2, 7, 33, 100, 1023, 4096, 12345};
  static const size_t grains[] = {0, 1, 3, 64, 1000, 100000};
  atomic_int *hits = kt_alloc(12345 * sizeof(atomic_int));
  for (size_t t = 0; t < sizeof(threads) / sizeof(*threads); t++) {
    ttd_pool *pool = ttd_pool_create(threads[t]);
    ck_assert_ptr_nonnull(pool);
    ck_assert_int_eq(ttd_pool_threads(pool), threads[t]);
    for (size_t si = 0; si < sizeof(sizes) / sizeof(*sizes); si++) {
      for (size_t gi = 0; gi < sizeof(grains) / sizeof(*grains); gi++) {
        size_t n = sizes[si], grain = grains[gi];
        for (size_t i = 0; i < n; i++) atomic_init(&hits[i], 0);
        cover_ctx c = {.hits = hits};
        atomic_init(&c.min_chunk, SIZE_MAX);
        atomic_init(&c.calls, 0);
        ttd_pool_parallel_for(pool, n, grain, cover_fn, &c);
        for (size_t i = 0; i < n; i++)
          if (atomic_load(&hits[i]) != 1)
            ck_abort_msg("threads %d n %zu grain %zu: index %zu hit %d times", threads[t], n, grain, i,
                         atomic_load(&hits[i]));
        if (n == 0) {
          ck_assert_int_eq(atomic_load(&c.calls), 0);
        } else {
          size_t want = grain == 0 ? 1 : (grain < n ? grain : n);
          ck_assert_msg(atomic_load(&c.min_chunk) >= want, "threads %d n %zu grain %zu: a chunk of %zu", threads[t], n,
                        grain, atomic_load(&c.min_chunk));
        }
      }
    }
    ttd_pool_destroy(pool);
  }
}
END_TEST

typedef struct range_ctx {
  int calls;
  size_t begin, end;
} range_ctx;

static void record_range(void *ctx, size_t begin, size_t end) {
  range_ctx *r = ctx;
  r->calls++;
  r->begin = begin;
  r->end = end;
}

/* A NULL pool runs fn(ctx, 0, n) once on the caller, counts as 1 thread, and destroy accepts NULL. */
START_TEST(test_pool_null_runs_inline) {
  range_ctx r = {0};
  ttd_pool_parallel_for(NULL, 1000, 1, record_range, &r);
  ck_assert_int_eq(r.calls, 1);
  ck_assert_uint_eq(r.begin, 0);
  ck_assert_uint_eq(r.end, 1000);
  ck_assert_int_eq(ttd_pool_threads(NULL), 1);
  ttd_pool_destroy(NULL);
}
END_TEST

/* parallel_for_nowait on a free pool shares the job (returns 1, every index once, in more
 * than one chunk); with nothing to share (a NULL pool, one chunk) it runs alone (0). */
START_TEST(test_pool_nowait_uses_a_free_pool) {
  enum { N = 1000 };
  atomic_int *hits = kt_alloc(N * sizeof(atomic_int));
  for (int round = 0; round < 50; round++) {
    for (size_t i = 0; i < N; i++) atomic_init(&hits[i], 0);
    cover_ctx c = {.hits = hits};
    atomic_init(&c.min_chunk, SIZE_MAX);
    atomic_init(&c.calls, 0);
    ck_assert_int_eq(ttd_pool_parallel_for_nowait(kt_pool, N, 10, cover_fn, &c), 1);
    for (size_t i = 0; i < N; i++)
      if (atomic_load(&hits[i]) != 1) ck_abort_msg("round %d: index %zu hit %d times", round, i, atomic_load(&hits[i]));
    ck_assert_int_gt(atomic_load(&c.calls), 1);
  }
  range_ctx r = {0};
  ck_assert_int_eq(ttd_pool_parallel_for_nowait(NULL, 1000, 1, record_range, &r), 0);
  ck_assert_int_eq(r.calls, 1);
  r = (range_ctx){0};
  ck_assert_int_eq(ttd_pool_parallel_for_nowait(kt_pool, 1000, 1000, record_range, &r), 0);
  ck_assert_int_eq(r.calls, 1);
  ck_assert_uint_eq(r.end, 1000);
  ck_assert_int_eq(ttd_pool_parallel_for_nowait(kt_pool, 0, 1, record_range, &r), 0);
  ck_assert_int_eq(r.calls, 1);
}
END_TEST

/* While another thread's job holds the pool, parallel_for_nowait does not wait for it: it
 * runs fn(ctx, 0, n) once on its own thread and returns 0. */
typedef struct holder {
  ttd_pool *pool;
  atomic_int inside, release;
} holder;

static void hold_fn(void *ctx, size_t begin, size_t end) {
  holder *h = ctx;
  (void)begin, (void)end;
  atomic_fetch_add(&h->inside, 1);
  while (!atomic_load(&h->release)) usleep(100);
}

static void *hold_main(void *arg) {
  holder *h = arg;
  ttd_pool_parallel_for(h->pool, 8, 1, hold_fn, h);
  return NULL;
}

typedef struct alone_ctx {
  pthread_t caller;
  int calls, on_caller;
  size_t begin, end;
} alone_ctx;

static void alone_fn(void *ctx, size_t begin, size_t end) {
  alone_ctx *a = ctx;
  a->calls++;
  a->on_caller += pthread_equal(pthread_self(), a->caller) != 0;
  a->begin = begin;
  a->end = end;
}

START_TEST(test_pool_nowait_runs_alone_beside_a_job) {
  holder h = {.pool = kt_pool};
  atomic_init(&h.inside, 0);
  atomic_init(&h.release, 0);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, hold_main, &h), 0);
  while (atomic_load(&h.inside) == 0) usleep(100);
  alone_ctx a = {.caller = pthread_self()};
  ck_assert_int_eq(ttd_pool_parallel_for_nowait(kt_pool, 1 << 20, 1, alone_fn, &a), 0);
  ck_assert_int_eq(a.calls, 1);
  ck_assert_int_eq(a.on_caller, 1);
  ck_assert_uint_eq(a.begin, 0);
  ck_assert_uint_eq(a.end, 1 << 20);
  atomic_store(&h.release, 1);
  pthread_join(t, NULL);
  /* the pool is free again: the next one is shared */
  atomic_int *hits = kt_alloc(64 * sizeof(atomic_int));
  for (int i = 0; i < 64; i++) atomic_init(&hits[i], 0);
  cover_ctx c = {.hits = hits};
  atomic_init(&c.min_chunk, SIZE_MAX);
  atomic_init(&c.calls, 0);
  ck_assert_int_eq(ttd_pool_parallel_for_nowait(kt_pool, 64, 1, cover_fn, &c), 1);
  for (int i = 0; i < 64; i++) ck_assert_int_eq(atomic_load(&hits[i]), 1);
}
END_TEST

/* ttd_pool_wake between jobs (from the caller and from another thread, with the workers
 * asleep, spinning or busy) never loses, repeats or blocks work; NULL is accepted. */
typedef struct waker {
  ttd_pool *pool;
  atomic_int stop;
} waker;

static void *wake_often(void *arg) {
  waker *w = arg;
  while (!atomic_load(&w->stop)) {
    ttd_pool_wake(w->pool);
    usleep(50);
  }
  return NULL;
}

START_TEST(test_pool_wake_keeps_jobs_whole) {
  ttd_pool_wake(NULL);
  ttd_pool *pool = ttd_pool_create(3);
  ck_assert_ptr_nonnull(pool);
  waker w = {.pool = pool};
  atomic_init(&w.stop, 0);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, wake_often, &w), 0);
  enum { N = 1000 };
  atomic_int *hits = kt_alloc(N * sizeof(atomic_int));
  for (int round = 0; round < 300; round++) {
    if (round % 50 == 0) usleep(2000); /* workers fall asleep now and then */
    if (round % 3 == 0) ttd_pool_wake(pool);
    for (size_t i = 0; i < N; i++) atomic_init(&hits[i], 0);
    cover_ctx c = {.hits = hits};
    atomic_init(&c.min_chunk, SIZE_MAX);
    atomic_init(&c.calls, 0);
    ttd_pool_parallel_for(pool, N, 1 + (size_t)round % 7, cover_fn, &c);
    for (size_t i = 0; i < N; i++)
      if (atomic_load(&hits[i]) != 1) ck_abort_msg("round %d: index %zu hit %d times", round, i, atomic_load(&hits[i]));
  }
  atomic_store(&w.stop, 1);
  pthread_join(t, NULL);
  ttd_pool_destroy(pool);
}
END_TEST

/* threads <= 0 gives one thread per CPU the caller may use (all of them here, then one
 * under a narrowed affinity, as taskset -c 0 gives); an explicit count is kept. */
START_TEST(test_pool_thread_count) {
  cpu_set_t all;
  ck_assert_int_eq(sched_getaffinity(0, sizeof(all), &all), 0);
  int usable = CPU_COUNT(&all);
  ck_assert_int_eq(ttd_pool_usable_cpus(), usable);
  ttd_pool *pool = ttd_pool_create(0);
  ck_assert_ptr_nonnull(pool);
  ck_assert_int_eq(ttd_pool_threads(pool), usable);
  ttd_pool_destroy(pool);
  pool = ttd_pool_create(-3);
  ck_assert_ptr_nonnull(pool);
  ck_assert_int_eq(ttd_pool_threads(pool), usable);
  ttd_pool_destroy(pool);
  int first = -1;
  for (int i = 0; i < CPU_SETSIZE && first < 0; i++)
    if (CPU_ISSET(i, &all)) first = i;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0);
  pool = ttd_pool_create(0);
  ck_assert_int_eq(sched_setaffinity(0, sizeof(all), &all), 0);
  ck_assert_int_eq(ttd_pool_threads(pool), 1);
  ttd_pool_destroy(pool);
  pool = ttd_pool_create(5);
  ck_assert_int_eq(ttd_pool_threads(pool), 5);
  ttd_pool_destroy(pool);
}
END_TEST

typedef struct serial_shared {
  ttd_pool *pool;
  atomic_int inside[2]; /* chunks of caller k running now */
  atomic_int overlap;   /* a chunk of one caller ran while the other's job was live */
} serial_shared;

typedef struct serial_caller {
  serial_shared *sh;
  int id;
  uint64_t *out;
  int bad; /* a job whose output came back wrong */
} serial_caller;

static void serial_fn(void *ctx, size_t begin, size_t end) {
  serial_caller *c = ctx;
  atomic_fetch_add(&c->sh->inside[c->id], 1);
  for (size_t i = begin; i < end; i++) {
    uint64_t v = i;
    for (int k = 0; k < 20; k++) v = v * 31 + (uint64_t)k; /* some work, so jobs overlap in time */
    c->out[i] = v + (uint64_t)c->id;
  }
  if (atomic_load(&c->sh->inside[1 - c->id]) != 0) atomic_store(&c->sh->overlap, 1);
  atomic_fetch_sub(&c->sh->inside[c->id], 1);
}

#define SERIAL_N 20000

static void *serial_main(void *arg) {
  serial_caller *c = arg;
  for (int job = 0; job < 100; job++) {
    for (size_t i = 0; i < SERIAL_N; i++) c->out[i] = 0;
    ttd_pool_parallel_for(c->sh->pool, SERIAL_N, 100, serial_fn, c);
    for (size_t i = 0; i < SERIAL_N; i++) {
      uint64_t v = i;
      for (int k = 0; k < 20; k++) v = v * 31 + (uint64_t)k;
      if (c->out[i] != v + (uint64_t)c->id) c->bad = 1;
    }
  }
  return NULL;
}

/* Two threads sharing a pool: every job completes and no chunk of one runs during the other's job. */
START_TEST(test_pool_concurrent_callers_serialise) {
  serial_shared sh = {.pool = kt_pool};
  atomic_init(&sh.inside[0], 0);
  atomic_init(&sh.inside[1], 0);
  atomic_init(&sh.overlap, 0);
  serial_caller c[2] = {{&sh, 0, kt_alloc(SERIAL_N * sizeof(uint64_t)), 0},
                        {&sh, 1, kt_alloc(SERIAL_N * sizeof(uint64_t)), 0}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, serial_main, &c[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  ck_assert_int_eq(c[0].bad, 0);
  ck_assert_int_eq(c[1].bad, 0);
  ck_assert_int_eq(atomic_load(&sh.overlap), 0);
}
END_TEST

typedef struct nested_ctx {
  ttd_pool *pool;
  atomic_int *hits;
} nested_ctx;

static void nested_inner(void *ctx, size_t begin, size_t end) {
  nested_ctx *c = ctx;
  for (size_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void nested_outer(void *ctx, size_t begin, size_t end) {
  nested_ctx *c = ctx;
  for (size_t i = begin; i < end; i++) ttd_pool_parallel_for(c->pool, 64, 1, nested_inner, c);
}

/* A parallel_for made from inside a job runs inline instead of deadlocking. */
START_TEST(test_pool_nested_call_runs_inline) {
  atomic_int *hits = kt_alloc(64 * sizeof(atomic_int));
  for (int i = 0; i < 64; i++) atomic_init(&hits[i], 0);
  nested_ctx c = {kt_pool, hits};
  ttd_pool_parallel_for(kt_pool, 16, 1, nested_outer, &c);
  for (int i = 0; i < 64; i++) ck_assert_int_eq(atomic_load(&hits[i]), 16);
}
END_TEST

/* Runs a batch of kernels on big inputs with `pool` and writes every result to out. */
static void run_kernel_batch(ttd_pool *pool, float *out, int64_t *len) {
  uint64_t st = 99;
  const int rows = 300, cols = 1000;
  const int64_t n = (int64_t)rows * cols;
  float *a = kt_random_floats(&st, n, -2, 2), *b = kt_random_floats(&st, cols, 0.5, 2);
  ttd_kshape as = kt_shp(2, rows, cols), bs = kt_shp(1, cols), scalar = kt_shp(0);
  int32_t *labels = kt_alloc((size_t)rows * sizeof(int32_t));
  for (int i = 0; i < rows; i++) labels[i] = (int32_t)(kt_next_random(&st) % (uint64_t)cols);
  float *dy = kt_random_floats(&st, n, -1, 1);
  int64_t o = 0, bad;
  ttd_k_binary(pool, TTD_BIN_DIV, a, &as, b, &bs, out + o, &as), o += n;
  ttd_k_binary(pool, TTD_BIN_MUL, a, &as, b, &scalar, out + o, &as), o += n;
  ttd_k_binary_backward(pool, TTD_BIN_DIV, a, &as, b, &bs, dy, &as, out + o, out + o + n), o += n + cols;
  ttd_k_unary(pool, TTD_UN_GELU, a, out + o, n), o += n;
  ttd_k_reduce(pool, TTD_RED_SUM, a, &as, 3, out + o), o += 1;
  ttd_k_reduce(pool, TTD_RED_MEAN, a, &as, 1, out + o), o += cols;
  ttd_k_reduce(pool, TTD_RED_SUM, a, &as, 2, out + o), o += rows;
  ttd_k_softmax(pool, a, rows, cols, out + o), o += n;
  ttd_k_log_softmax_backward(pool, a, dy, rows, cols, out + o), o += n;
  ck_assert_int_eq(ttd_k_cross_entropy(pool, a, labels, rows, cols, out + o, &bad), 0);
  o += 1;
  ttd_k_cross_entropy_backward(pool, a, labels, rows, cols, 0.7f, out + o), o += n;
  ttd_k_mse_loss(pool, a, dy, n, out + o), o += 1;
  ttd_k_l1_loss(pool, a, dy, n, out + o), o += 1;
  float *param = out + o;
  memcpy(param, a, (size_t)n * sizeof(float)), o += n;
  float *m = out + o, *v = out + o + n;
  memset(m, 0, 2 * (size_t)n * sizeof(float)), o += 2 * n;
  ttd_adam_params ap = {
      .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f, .decoupled = 1};
  for (int step = 1; step <= 3; step++) ttd_k_adam_step(pool, &ap, step, param, dy, m, v, n, false);
  int perm[2] = {1, 0};
  ttd_k_permute(pool, a, &as, perm, out + o), o += n;
  *len = o;
}

/* Every kernel gives bit-identical results with no pool, a 1-thread pool and a 4-thread pool. */
START_TEST(test_pool_same_results_any_thread_count) {
  const int64_t cap = 16 * 300 * 1000;
  float *r0 = kt_fbuf(cap), *r1 = kt_fbuf(cap), *r4 = kt_fbuf(cap);
  ttd_pool *one = ttd_pool_create(1);
  ck_assert_ptr_nonnull(one);
  int64_t n0, n1, n4;
  run_kernel_batch(NULL, r0, &n0);
  run_kernel_batch(one, r1, &n1);
  run_kernel_batch(kt_pool, r4, &n4);
  ttd_pool_destroy(one);
  ck_assert_int_le(n0, cap);
  ck_assert_int_eq(n0, n1);
  ck_assert_int_eq(n0, n4);
  ck_assert_int_eq(memcmp(r0, r1, (size_t)n0 * sizeof(float)), 0);
  ck_assert_int_eq(memcmp(r0, r4, (size_t)n0 * sizeof(float)), 0);
}
END_TEST

/* The id of a thread of this process named `name`; 0 if none. */
static pid_t thread_named(const char *name) {
  DIR *dir = opendir("/proc/self/task");
  if (!dir) return 0;
  pid_t found = 0;
  struct dirent *e;
  while (!found && (e = readdir(dir)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[300], comm[32] = "";
    snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    pid_t tid = (pid_t)strtol(e->d_name, NULL, 10);
    if (f && fgets(comm, sizeof(comm), f) && strncmp(comm, name, strlen(name)) == 0) found = tid;
    if (f) fclose(f);
  }
  closedir(dir);
  return found;
}

typedef struct cpu_ctx {
  pthread_t caller;
  atomic_int worker_cpu; /* -1 until the worker's chunk ran */
} cpu_ctx;

/* Two chunks: the caller's waits (yielding its CPU) until the worker's has run and recorded
 * its CPU. */
static void cpu_fn(void *ctx, size_t begin, size_t end) {
  (void)begin, (void)end;
  cpu_ctx *c = ctx;
  if (!pthread_equal(pthread_self(), c->caller)) {
    atomic_store(&c->worker_cpu, sched_getcpu());
    return;
  }
  for (int i = 0; i < 2000 && atomic_load(&c->worker_cpu) < 0; i++) usleep(1000);
}

/* The worker is put on the caller's CPU (as Linux does after an idle spell): when the job
 * comes it moves off that CPU before running its chunk, and the move is counted; its own
 * CPU set is wide again afterwards. Needs two CPUs. */
START_TEST(test_pool_worker_leaves_caller_cpu) {
  cpu_set_t all;
  ck_assert_int_eq(sched_getaffinity(0, sizeof(all), &all), 0);
  if (CPU_COUNT(&all) < 2) return; /* one CPU: nothing to move to */
  int first = -1;
  for (int i = 0; i < CPU_SETSIZE && first < 0; i++)
    if (CPU_ISSET(i, &all)) first = i;
  ttd_pool_destroy(kt_pool); /* its workers share the name */
  kt_pool = NULL;
  /* A joined thread can stay listed in /proc/self/task a moment longer on a busy host. */
  for (int i = 0; i < 200 && thread_named("ttd-kernels"); i++) usleep(1000);
  ck_assert_int_eq(thread_named("ttd-kernels"), 0);
  ttd_pool *pool = ttd_pool_create(2);
  ck_assert_ptr_nonnull(pool);
  pid_t worker = 0;
  for (int i = 0; i < 200 && !worker; i++) {
    worker = thread_named("ttd-kernels");
    if (!worker) usleep(1000);
  }
  ck_assert_int_ne(worker, 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ck_assert_int_eq(sched_setaffinity(worker, sizeof(one), &one), 0);
  ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0); /* the caller */

  cpu_ctx c = {.caller = pthread_self()};
  atomic_init(&c.worker_cpu, -1);
  ttd_pool_parallel_for(pool, 2, 1, cpu_fn, &c);
  ck_assert_int_ge(atomic_load(&c.worker_cpu), 0);
  ck_assert_int_ne(atomic_load(&c.worker_cpu), first);
  ck_assert_uint_eq(ttd_pool_nudges(pool), 1);
  cpu_set_t after;
  ck_assert_int_eq(sched_getaffinity(worker, sizeof(after), &after), 0);
  ck_assert(CPU_EQUAL(&after, &all));

  ck_assert_int_eq(sched_setaffinity(0, sizeof(all), &all), 0);
  ttd_pool_destroy(pool);
}
END_TEST

typedef struct cancel_ctx {
  ttd_cancel *cancel;
  atomic_int chunks, saw_flag;
  int set_at; /* the chunk that sets the flag */
} cancel_ctx;

static void cancel_fn(void *ctx, size_t begin, size_t end) {
  (void)begin, (void)end;
  cancel_ctx *c = ctx;
  if (atomic_fetch_add(&c->chunks, 1) + 1 == c->set_at) atomic_store(&c->cancel->code, 4);
  usleep(200);
  if (ttd_pool_cancelled()) atomic_fetch_add(&c->saw_flag, 1);
}

/* Once the caller's flag is set no chunk begins, on the caller or a worker, workers see the
 * flag inside the job, a set flag runs nothing (pool or inline), and clearing it restores all. */
START_TEST(test_pool_cancel_stops_claiming_chunks) {
  ttd_pool *pool = ttd_pool_create(4);
  ttd_cancel cancel = {0};
  ck_assert_ptr_null(ttd_pool_cancel_enter(&cancel));
  cancel_ctx c = {.cancel = &cancel, .set_at = 3};
  ttd_pool_parallel_for(pool, 16, 1, cancel_fn, &c); /* 16 chunks on 4 threads */
  int ran = atomic_load(&c.chunks);
  ck_assert_msg(ran >= 3 && ran <= 3 + 3, "%d chunks ran; at most those begun when the flag was set may", ran);
  ck_assert_int_ge(atomic_load(&c.saw_flag), 1);

  atomic_store(&c.chunks, 0);
  ttd_pool_parallel_for(pool, 16, 1, cancel_fn, &c);
  ttd_pool_parallel_for(NULL, 16, 1, cancel_fn, &c);
  ck_assert_int_eq(atomic_load(&c.chunks), 0);

  atomic_store(&cancel.code, 0);
  c.set_at = -1;
  ttd_pool_parallel_for(pool, 16, 1, cancel_fn, &c);
  ck_assert_int_eq(atomic_load(&c.chunks), 16);
  ck_assert_ptr_eq(ttd_pool_cancel_enter(NULL), &cancel);
  ck_assert_int_eq(ttd_pool_cancelled(), 0);
  ttd_pool_destroy(pool);
}
END_TEST

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct setter {
  ttd_cancel *cancel;
  int after_ms;
  double set_ms;
} setter;

static void *set_later(void *arg) {
  setter *s = arg;
  usleep((useconds_t)s->after_ms * 1000);
  s->set_ms = now_ms();
  atomic_store(&s->cancel->code, 1);
  return NULL;
}

/* Kernels whose one chunk holds seconds of work (an avg_pool2d of one plane with a huge
 * window, a matmul with a long K, forward and backward) return soon after the flag is set. */
START_TEST(test_kernels_stop_inside_a_chunk) {
  ttd_pool *pool = ttd_pool_create(2);
  enum { H = 1024, K = 512 };
  float *x = calloc((size_t)H * H, sizeof(float)), *y = calloc((size_t)H * H, sizeof(float));
  float *big = calloc((size_t)128 << 16, sizeof(float));
  ttd_pool2d_params p = {.n = 1, .c = 1, .h = H, .w = H, .kh = K, .kw = K, .stride_h = 1, .stride_w = 1};
  ck_assert_int_eq(ttd_pool2d_params_finish(&p), 0); /* 1.4e11 operations: minutes, unstopped */
  for (int which = 0; which < 3; which++) {
    ttd_cancel cancel = {0};
    setter s = {.cancel = &cancel, .after_ms = 50};
    pthread_t t;
    ttd_pool_cancel_enter(&cancel);
    pthread_create(&t, NULL, set_later, &s);
    if (which == 0) ttd_k_avg_pool2d(pool, &p, x, y);
    else if (which == 1) ttd_k_avg_pool2d_backward(pool, &p, x, y);
    else ttd_k_matmul(pool, big, big, y, 64, 128, 128, 1 << 16, 0, 0, 0, 0); /* 64 x 128x128x65536: 7e10 flops */
    double stopped = now_ms();
    pthread_join(t, NULL);
    ttd_pool_cancel_enter(NULL);
    printf("thread_pool: kernel %d stopped %.2f ms after its flag was set\n", which, stopped - s.set_ms);
    ck_assert_msg(stopped - s.set_ms < 500, "kernel %d took %.0f ms to stop", which, stopped - s.set_ms);
  }
  free(big);
  free(x);
  free(y);
  ttd_pool_destroy(pool);
}
END_TEST

Suite *thread_pool_suite(void) {
  Suite *s = suite_create("thread_pool");
  TCase *tc = tcase_create("thread_pool");
  tcase_add_checked_fixture(tc, kt_setup, kt_teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_pool_covers_each_index_once);
  tcase_add_test(tc, test_pool_null_runs_inline);
  tcase_add_test(tc, test_pool_nowait_uses_a_free_pool);
  tcase_add_test(tc, test_pool_nowait_runs_alone_beside_a_job);
  tcase_add_test(tc, test_pool_wake_keeps_jobs_whole);
  tcase_add_test(tc, test_pool_thread_count);
  tcase_add_test(tc, test_pool_concurrent_callers_serialise);
  tcase_add_test(tc, test_pool_nested_call_runs_inline);
  tcase_add_test(tc, test_pool_same_results_any_thread_count);
  tcase_add_test(tc, test_pool_worker_leaves_caller_cpu);
  tcase_add_test(tc, test_pool_cancel_stops_claiming_chunks);
  tcase_add_test(tc, test_kernels_stop_inside_a_chunk);
  suite_add_tcase(s, tc);
  return s;
}
