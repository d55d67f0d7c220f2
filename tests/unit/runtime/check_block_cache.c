/* runtime/base/block_cache.h: which freed blocks are kept and handed out again (bytes up to
 * 2 * bytes, the smallest that fits), the bounds (8 blocks, none under 1 MiB), what is
 * freed when (eviction of the smallest, refusal, destroy), alignment, and many threads at
 * once. What is freed is measured on the heap itself (glibc's mallinfo2, or ASan's
 * allocator under SAN=1), so a block dropped without free shows up here and under LSan. */
#include <check.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <string.h>

#include "base/block_cache.h"
#include "suites.h"

#if defined(__SANITIZE_ADDRESS__)
size_t __sanitizer_get_current_allocated_bytes(void); /* libasan's (sanitizer/allocator_interface.h) */
static size_t heap_bytes(void) { return __sanitizer_get_current_allocated_bytes(); }
#else
#include <malloc.h>
static size_t heap_bytes(void) {
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}
#endif

#define MIB TTD_BLOCK_CACHE_MIN_BYTES
#define KIB ((size_t)1 << 10)
/* A block's heap cost beyond its size (malloc's header, alignment, page rounding), and what
 * else the heap may hold meanwhile (Check's messages, a thread's arena): far under the
 * 1 MiB a block left behind would show. */
#define SLACK (8 * KIB)
#define NOISE (64 * KIB)

static ttd_block_cache cache;
static size_t baseline;

static void setup(void) {
  ttd_block_cache_init(&cache);
  baseline = heap_bytes();
}

static void teardown(void) { ttd_block_cache_destroy(&cache); }

/* The heap holds want bytes more than at setup (each of blocks blocks within SLACK). */
static void expect_heap(size_t want, int blocks, const char *when) {
  size_t now = heap_bytes();
  size_t most = want + (size_t)blocks * SLACK + NOISE;
  ck_assert_msg(now + NOISE >= baseline + want && now <= baseline + most,
                "%s: the heap holds %zd bytes more than at the start, want %zu (up to %zu)", when,
                (ssize_t)(now - baseline), want, most);
}

static int kept(void) {
  int n = 0;
  for (int k = 0; k < TTD_BLOCK_CACHE_SLOTS; k++) n += cache.blocks[k] != NULL;
  return n;
}

/* The kept block of size, or NULL. */
static void *kept_block(size_t size) {
  for (int k = 0; k < TTD_BLOCK_CACHE_SLOTS; k++) {
    if (cache.blocks[k] && cache.sizes[k] == size) return cache.blocks[k];
  }
  return NULL;
}

static bool keeps(size_t size) { return kept_block(size) != NULL; }

/* A block of at least bytes, 64-byte aligned; *out_size its real size. */
static void *alloc_ok(size_t bytes, size_t *out_size) {
  *out_size = (size_t)-1;
  void *p = ttd_block_cache_alloc(&cache, bytes, out_size);
  ck_assert_msg(p != NULL, "alloc of %zu bytes", bytes);
  ck_assert_uint_eq((uintptr_t)p % 64, 0);
  ck_assert_uint_ge(*out_size, bytes);
  memset(p, 0xa5, bytes); /* all of it is usable */
  return p;
}

/* Gives the cache a fresh block of size (not one of its own: any malloc'd block will do). */
static void *put(size_t size) {
  void *p = NULL;
  ck_assert_int_eq(posix_memalign(&p, 64, size), 0);
  memset(p, 0x5a, size);
  ttd_block_cache_free(&cache, p, size);
  return p;
}

/* Destroys the cache (checking that the heap is back where it started) and makes it anew. */
static void destroy_expect_empty_heap(void) {
  ttd_block_cache_destroy(&cache);
  expect_heap(0, 0, "after destroy");
  ttd_block_cache_init(&cache);
}

/* Blocks under 1 MiB (0 bytes included) are fresh, exactly their size, and freed at once. */
START_TEST(test_small_blocks_not_kept) {
  static const size_t sizes[] = {0, 1, 63, 4095, 100 * KIB, MIB - 1};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    size_t got;
    void *p = alloc_ok(sizes[i], &got);
    ck_assert_uint_eq(got, sizes[i]);
    ttd_block_cache_free(&cache, p, got);
    ck_assert_int_eq(kept(), 0);
    expect_heap(0, 0, "after freeing a small block");
  }
  ttd_block_cache_free(&cache, NULL, 4 * MIB); /* NULL is nothing */
  ck_assert_int_eq(kept(), 0);
}
END_TEST

/* A freed large block stays on the heap, kept, and the next alloc of its size gets it back. */
START_TEST(test_freed_block_reused) {
  void *p = put(MIB);
  ck_assert_int_eq(kept(), 1);
  expect_heap(MIB, 1, "with one block kept");
  size_t got;
  ck_assert_ptr_eq(alloc_ok(MIB, &got), p);
  ck_assert_uint_eq(got, MIB);
  ck_assert_int_eq(kept(), 0);
  ttd_block_cache_free(&cache, p, got);
  destroy_expect_empty_heap();
}
END_TEST

/* A kept block serves a request of kept/2 .. kept bytes (not under 1 MiB) and reports its
 * real size; outside that window a fresh block of the asked size comes. */
static const struct window_row {
  size_t kept, asked;
  bool reused;
} window_rows[] = {
    {2 * MIB, 2 * MIB, true},          /* the same size */
    {2 * MIB, MIB, true},              /* exactly twice the request */
    {2 * MIB + 2, MIB, false},         /* more than twice */
    {3 * MIB, 3 * MIB / 2, true},      /* twice */
    {3 * MIB, 3 * MIB / 2 - 1, false}, /* a byte under half */
    {2 * MIB, 2 * MIB + 1, false},     /* too small */
    {MIB + 4 * KIB, MIB - 1, false},   /* a small request never takes a kept block */
};

START_TEST(test_reuse_window) {
  const struct window_row *row = &window_rows[_i];
  void *kept_block = put(row->kept);
  size_t got;
  void *p = alloc_ok(row->asked, &got);
  ck_assert_msg((p == kept_block) == row->reused, "a kept block of %zu for %zu bytes: %s", row->kept, row->asked,
                p == kept_block ? "reused" : "not reused");
  ck_assert_uint_eq(got, row->reused ? row->kept : row->asked);
  ck_assert_int_eq(kept(), row->reused ? 0 : 1);
  ttd_block_cache_free(&cache, p, got);
  destroy_expect_empty_heap();
}
END_TEST

/* Of several kept blocks that fit, the smallest is handed out first. */
START_TEST(test_best_fit) {
  void *b4 = put(4 * MIB), *b2 = put(2 * MIB), *b3 = put(3 * MIB);
  void *want[] = {b2, b3, b4};
  size_t sizes[] = {2 * MIB, 3 * MIB, 4 * MIB};
  void *got[4];
  size_t got_size[4];
  for (int i = 0; i < 3; i++) {
    got[i] = alloc_ok(2 * MIB, &got_size[i]);
    ck_assert_ptr_eq(got[i], want[i]);
    ck_assert_uint_eq(got_size[i], sizes[i]);
  }
  got[3] = alloc_ok(2 * MIB, &got_size[3]); /* none left */
  ck_assert_uint_eq(got_size[3], 2 * MIB);
  ck_assert_int_eq(kept(), 0);
  for (int i = 0; i < 4; i++) ttd_block_cache_free(&cache, got[i], got_size[i]);
  destroy_expect_empty_heap();
}
END_TEST

/* Size of the k-th test block: just over 1 MiB, each a little larger. */
static size_t size_k(int k) { return MIB + (size_t)k * 64 * KIB; }

/* Fills the cache with blocks of size_k(1..8), in mixed order. */
static void fill_cache(void) {
  static const int order[TTD_BLOCK_CACHE_SLOTS] = {5, 1, 8, 3, 2, 7, 4, 6};
  size_t total = 0;
  for (int i = 0; i < TTD_BLOCK_CACHE_SLOTS; i++) {
    put(size_k(order[i]));
    total += size_k(order[i]);
  }
  ck_assert_int_eq(kept(), TTD_BLOCK_CACHE_SLOTS);
  expect_heap(total, TTD_BLOCK_CACHE_SLOTS, "with the cache full");
}

/* At most 8 blocks are kept: a larger one evicts (frees) the smallest kept; one no larger
 * than every kept block (equal included) is freed at once. */
START_TEST(test_count_bound_evicts_smallest) {
  fill_cache();
  size_t total = 0;
  for (int k = 1; k <= 8; k++) total += size_k(k);

  put(size_k(9)); /* evicts size_k(1) */
  total += size_k(9) - size_k(1);
  ck_assert_int_eq(kept(), TTD_BLOCK_CACHE_SLOTS);
  ck_assert(!keeps(size_k(1)));
  ck_assert(keeps(size_k(9)));
  expect_heap(total, TTD_BLOCK_CACHE_SLOTS, "after a larger block evicted the smallest");

  void *smallest = kept_block(size_k(2));
  put(size_k(0)); /* smaller than every kept block: freed */
  put(size_k(2)); /* equal to the smallest kept: freed, the kept one stays */
  ck_assert_ptr_eq(kept_block(size_k(2)), smallest);
  for (int k = 2; k <= 9; k++) ck_assert_msg(keeps(size_k(k)), "size_k(%d) kept", k);
  expect_heap(total, TTD_BLOCK_CACHE_SLOTS, "after blocks no larger than the smallest kept");
  destroy_expect_empty_heap();
}
END_TEST

/* A slot emptied by an alloc takes the next freed block, however small (its old size does
 * not count). */
START_TEST(test_emptied_slot_refilled) {
  fill_cache();
  size_t got;
  void *p = alloc_ok(size_k(8), &got);
  ck_assert_uint_eq(got, size_k(8));
  ck_assert_int_eq(kept(), TTD_BLOCK_CACHE_SLOTS - 1);
  put(size_k(0)); /* smaller than every kept block, but a slot is free */
  ck_assert_int_eq(kept(), TTD_BLOCK_CACHE_SLOTS);
  ck_assert(keeps(size_k(0)));
  ttd_block_cache_free(&cache, p, got); /* evicts size_k(0) */
  ck_assert(!keeps(size_k(0)));
  ck_assert(keeps(size_k(8)));
  destroy_expect_empty_heap();
}
END_TEST

/* A reused block goes back under its real size, not the size asked for. */
START_TEST(test_real_size_round_trip) {
  void *b = put(2 * MIB);
  size_t got;
  ck_assert_ptr_eq(alloc_ok(MIB + 1, &got), b);
  ck_assert_uint_eq(got, 2 * MIB);
  ttd_block_cache_free(&cache, b, got);
  ck_assert(keeps(2 * MIB));
  ck_assert_ptr_eq(alloc_ok(2 * MIB, &got), b); /* whole again */
  ttd_block_cache_free(&cache, b, got);
  destroy_expect_empty_heap();
}
END_TEST

/* destroy frees every kept block. */
START_TEST(test_destroy_frees_kept) {
  fill_cache();
  destroy_expect_empty_heap();
}
END_TEST

#if !defined(__SANITIZE_ADDRESS__) /* ASan aborts on an impossible size instead of failing it */
/* An impossible size is NULL, and the kept blocks stay. */
START_TEST(test_out_of_memory) {
  put(2 * MIB);
  size_t got;
  ck_assert_ptr_null(ttd_block_cache_alloc(&cache, SIZE_MAX / 2, &got));
  ck_assert_int_eq(kept(), 1);
}
END_TEST
#endif

/* ---- threads ---- */

enum { THREADS = 4, ROUNDS = 1500 };

/* Allocates blocks of varied sizes, stamps them with the thread's mark, checks the stamp is
 * intact (no other thread got the same block meanwhile) and gives them back. */
static void *churn(void *arg) {
  unsigned char mark = (unsigned char)(uintptr_t)arg;
  uint64_t rng = 0x9e3779b97f4a7c15ull * (mark + 1);
  void *held[2] = {NULL, NULL};
  size_t held_size[2] = {0, 0}, held_bytes[2] = {0, 0};
  for (int round = 0; round < ROUNDS; round++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    int slot = (int)(rng >> 63);
    if (held[slot]) {
      unsigned char *b = held[slot];
      if (b[0] != mark || b[held_bytes[slot] / 2] != mark || b[held_bytes[slot] - 1] != mark) return (void *)1;
      ttd_block_cache_free(&cache, held[slot], held_size[slot]);
    }
    held_bytes[slot] = MIB / 2 + (size_t)(rng >> 40) % (3 * MIB); /* small ones too */
    held[slot] = ttd_block_cache_alloc(&cache, held_bytes[slot], &held_size[slot]);
    if (!held[slot] || held_size[slot] < held_bytes[slot]) return (void *)1;
    unsigned char *b = held[slot];
    b[0] = b[held_bytes[slot] / 2] = b[held_bytes[slot] - 1] = mark;
  }
  for (int slot = 0; slot < 2; slot++) ttd_block_cache_free(&cache, held[slot], held_size[slot]);
  return NULL;
}

/* Threads allocating and freeing at once never share a block, and nothing leaks. */
START_TEST(test_threads) {
  pthread_t threads[THREADS];
  for (int i = 0; i < THREADS; i++) ck_assert_int_eq(pthread_create(&threads[i], NULL, churn, (void *)(uintptr_t)(i + 1)), 0);
  for (int i = 0; i < THREADS; i++) {
    void *result;
    ck_assert_int_eq(pthread_join(threads[i], &result), 0);
    ck_assert_msg(result == NULL, "thread %d saw a block it did not own", i);
  }
  ck_assert_int_le(kept(), TTD_BLOCK_CACHE_SLOTS);
  destroy_expect_empty_heap();
}
END_TEST

Suite *block_cache_suite(void) {
  Suite *s = suite_create("block_cache");
  TCase *tc = tcase_create("block_cache");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_small_blocks_not_kept);
  tcase_add_test(tc, test_freed_block_reused);
  tcase_add_loop_test(tc, test_reuse_window, 0, (int)(sizeof(window_rows) / sizeof(window_rows[0])));
  tcase_add_test(tc, test_best_fit);
  tcase_add_test(tc, test_count_bound_evicts_smallest);
  tcase_add_test(tc, test_emptied_slot_refilled);
  tcase_add_test(tc, test_real_size_round_trip);
  tcase_add_test(tc, test_destroy_frees_kept);
#if !defined(__SANITIZE_ADDRESS__)
  tcase_add_test(tc, test_out_of_memory);
#endif
  tcase_add_test(tc, test_threads);
  tcase_set_timeout(tc, 30);
  suite_add_tcase(s, tc);
  return s;
}
