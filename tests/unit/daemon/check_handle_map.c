/* daemon/handle_map.h: put/get/remove, the reserved key 0, duplicates, growth, backward-shift
 * deletion with colliding keys (checked against a reference array), count and clear. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "session/handle_map.h"
#include "suites.h"

static void *value_of(uint64_t key) { return (void *)(uintptr_t)(key * 2 + 1); } /* never NULL */

/* splitmix64: a deterministic stream for the randomised tests. */
static uint64_t next_random(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Leaves map empty with at least `capacity` slots, growing it through puts. */
static void make_empty_with_capacity(ttd_handle_map *map, size_t capacity) {
  uint64_t key = 1;
  while (map->capacity < capacity) {
    ck_assert_int_eq(ttd_handle_map_put(map, key, value_of(key)), 0);
    key++;
  }
  for (uint64_t k = 1; k < key; k++) ck_assert_ptr_eq(ttd_handle_map_remove(map, k), value_of(k));
  ck_assert_uint_eq(map->count, 0);
  for (size_t i = 0; i < map->capacity; i++) ck_assert_uint_eq(map->keys[i], 0);
}

/* The slot key lands in when it is alone in the (empty) map: its home slot. */
static size_t home_slot(ttd_handle_map *empty, uint64_t key) {
  ck_assert_int_eq(ttd_handle_map_put(empty, key, value_of(key)), 0);
  size_t slot = SIZE_MAX;
  for (size_t i = 0; i < empty->capacity; i++) {
    if (empty->keys[i] == key) slot = i;
  }
  ck_assert_ptr_eq(ttd_handle_map_remove(empty, key), value_of(key));
  ck_assert_uint_ne(slot, SIZE_MAX);
  return slot;
}

/* Finds n keys (searching sequentially from *next) whose home slot is in [first, first+width)
 * modulo the capacity of the empty map. */
static void find_keys_near(ttd_handle_map *empty, size_t first, size_t width, uint64_t *next, uint64_t *out,
                           size_t n) {
  size_t found = 0;
  for (; found < n; (*next)++) {
    size_t slot = home_slot(empty, *next);
    if (((slot - first) & (empty->capacity - 1)) < width) out[found++] = *next;
  }
}

/* Checks that exactly the keys marked present are in the map, with their values. */
static void check_against_reference(const ttd_handle_map *map, const uint64_t *keys, const int *present, size_t n) {
  size_t want = 0;
  for (size_t i = 0; i < n; i++) {
    if (present[i]) {
      want++;
      ck_assert_msg(ttd_handle_map_get(map, keys[i]) == value_of(keys[i]), "key %llu lost",
                    (unsigned long long)keys[i]);
    } else {
      ck_assert_msg(ttd_handle_map_get(map, keys[i]) == NULL, "key %llu still found",
                    (unsigned long long)keys[i]);
    }
  }
  ck_assert_uint_eq(map->count, want);
  size_t seen = 0;
  for (size_t i = 0; i < map->capacity; i++) {
    if (map->keys[i]) seen++;
  }
  ck_assert_uint_eq(seen, want);
}

/* A zeroed map is empty: get and remove find nothing, clear is harmless. */
START_TEST(test_empty_map) {
  ttd_handle_map map = {0};
  ck_assert_ptr_null(ttd_handle_map_get(&map, 1));
  ck_assert_ptr_null(ttd_handle_map_get(&map, UINT64_MAX));
  ck_assert_ptr_null(ttd_handle_map_remove(&map, 1));
  ck_assert_uint_eq(map.count, 0);
  ttd_handle_map_clear(&map);
  ttd_handle_map_clear(&map);
  ck_assert_uint_eq(map.capacity, 0);
}
END_TEST

/* Keys put can be got and removed (returning their value), after which they are gone. */
START_TEST(test_put_get_remove) {
  ttd_handle_map map = {0};
  uint64_t keys[] = {1, 42, UINT64_MAX, 0x8000000000000000ull, 0x123456789abcdef0ull};
  for (size_t i = 0; i < 5; i++) ck_assert_int_eq(ttd_handle_map_put(&map, keys[i], value_of(keys[i])), 0);
  ck_assert_uint_eq(map.count, 5);
  for (size_t i = 0; i < 5; i++) ck_assert_ptr_eq(ttd_handle_map_get(&map, keys[i]), value_of(keys[i]));
  ck_assert_ptr_null(ttd_handle_map_get(&map, 2));
  ck_assert_ptr_eq(ttd_handle_map_remove(&map, 42), value_of(42));
  ck_assert_ptr_null(ttd_handle_map_get(&map, 42));
  ck_assert_ptr_null(ttd_handle_map_remove(&map, 42));
  ck_assert_uint_eq(map.count, 4);
  for (size_t i = 0; i < 5; i++) {
    if (keys[i] != 42) ck_assert_ptr_eq(ttd_handle_map_get(&map, keys[i]), value_of(keys[i]));
  }
  ttd_handle_map_clear(&map);
}
END_TEST

/* Key 0 is refused by put (-1) and never found by get or remove. */
START_TEST(test_key_zero_refused) {
  ttd_handle_map map = {0};
  ck_assert_int_eq(ttd_handle_map_put(&map, 0, value_of(0)), -1);
  ck_assert_uint_eq(map.count, 0);
  ck_assert_int_eq(ttd_handle_map_put(&map, 7, value_of(7)), 0);
  ck_assert_int_eq(ttd_handle_map_put(&map, 0, value_of(0)), -1);
  ck_assert_ptr_null(ttd_handle_map_get(&map, 0));
  ck_assert_ptr_null(ttd_handle_map_remove(&map, 0));
  ck_assert_uint_eq(map.count, 1);
  ck_assert_ptr_eq(ttd_handle_map_get(&map, 7), value_of(7));
  ttd_handle_map_clear(&map);
}
END_TEST

/* A duplicate put is refused (-1) and keeps the first value; after remove the key is free again. */
START_TEST(test_duplicate_refused) {
  ttd_handle_map map = {0};
  int other;
  ck_assert_int_eq(ttd_handle_map_put(&map, 99, value_of(99)), 0);
  ck_assert_int_eq(ttd_handle_map_put(&map, 99, &other), -1);
  ck_assert_ptr_eq(ttd_handle_map_get(&map, 99), value_of(99));
  ck_assert_uint_eq(map.count, 1);
  ck_assert_ptr_eq(ttd_handle_map_remove(&map, 99), value_of(99));
  ck_assert_int_eq(ttd_handle_map_put(&map, 99, &other), 0);
  ck_assert_ptr_eq(ttd_handle_map_get(&map, 99), &other);
  ck_assert_uint_eq(map.count, 1);
  ttd_handle_map_clear(&map);
}
END_TEST

/* Count follows successful puts and removes only. */
START_TEST(test_count_tracking) {
  ttd_handle_map map = {0};
  for (uint64_t k = 1; k <= 100; k++) {
    ck_assert_int_eq(ttd_handle_map_put(&map, k, value_of(k)), 0);
    ck_assert_uint_eq(map.count, k);
  }
  ck_assert_int_eq(ttd_handle_map_put(&map, 50, value_of(50)), -1);
  ck_assert_int_eq(ttd_handle_map_put(&map, 0, value_of(0)), -1);
  ck_assert_uint_eq(map.count, 100);
  ck_assert_ptr_null(ttd_handle_map_remove(&map, 1000));
  ck_assert_uint_eq(map.count, 100);
  for (uint64_t k = 2; k <= 100; k += 2) ck_assert_ptr_nonnull(ttd_handle_map_remove(&map, k));
  ck_assert_uint_eq(map.count, 50);
  ck_assert_ptr_null(ttd_handle_map_remove(&map, 2));
  ck_assert_uint_eq(map.count, 50);
  ttd_handle_map_clear(&map);
}
END_TEST

/* The map grows past 100000 sequential and random keys, all reachable, load at most 3/4. */
START_TEST(test_growth) {
  ttd_handle_map map = {0};
  enum { N = 60000 };
  static uint64_t randoms[N];
  uint64_t state = 0xC0FFEE;
  for (uint64_t k = 1; k <= N; k++) ck_assert_int_eq(ttd_handle_map_put(&map, k, value_of(k)), 0);
  for (size_t i = 0; i < N; i++) {
    do randoms[i] = next_random(&state) | (1ull << 63); /* disjoint from the sequential keys */
    while (ttd_handle_map_get(&map, randoms[i]));
    ck_assert_int_eq(ttd_handle_map_put(&map, randoms[i], value_of(randoms[i])), 0);
  }
  ck_assert_uint_eq(map.count, 2 * N);
  ck_assert_uint_eq(map.capacity & (map.capacity - 1), 0); /* a power of two */
  ck_assert_uint_le(map.count * 4, map.capacity * 3);
  for (uint64_t k = 1; k <= N; k++) ck_assert_ptr_eq(ttd_handle_map_get(&map, k), value_of(k));
  for (size_t i = 0; i < N; i++) ck_assert_ptr_eq(ttd_handle_map_get(&map, randoms[i]), value_of(randoms[i]));
  ck_assert_ptr_null(ttd_handle_map_get(&map, N + 1));
  ttd_handle_map_clear(&map);
}
END_TEST

/* Keys sharing one home slot: removing any of them (first, middle, last) keeps the rest reachable. */
START_TEST(test_same_slot_remove) {
  ttd_handle_map map = {0};
  make_empty_with_capacity(&map, 16);
  ck_assert_uint_eq(map.capacity, 16);
  uint64_t next = 1000, keys[8];
  find_keys_near(&map, 5, 1, &next, keys, 8);
  for (int order = 0; order < 3; order++) {
    int present[8];
    for (int i = 0; i < 8; i++) {
      ck_assert_int_eq(ttd_handle_map_put(&map, keys[i], value_of(keys[i])), 0);
      present[i] = 1;
    }
    ck_assert_uint_eq(map.capacity, 16);
    ck_assert_uint_eq(map.keys[5], keys[0]); /* the first one sits at home, the rest probe on */
    check_against_reference(&map, keys, present, 8);
    /* Remove the one at home first, then from the middle, then from the end. */
    int sequence[3][8] = {{0, 1, 2, 3, 4, 5, 6, 7}, {4, 2, 6, 0, 7, 1, 5, 3}, {7, 6, 5, 4, 3, 2, 1, 0}};
    for (int i = 0; i < 8; i++) {
      int victim = sequence[order][i];
      ck_assert_ptr_eq(ttd_handle_map_remove(&map, keys[victim]), value_of(keys[victim]));
      present[victim] = 0;
      check_against_reference(&map, keys, present, 8);
    }
  }
  ttd_handle_map_clear(&map);
}
END_TEST

/* A probe run that wraps from the last slot to slot 0 survives random removals and re-inserts. */
START_TEST(test_wraparound_cluster) {
  ttd_handle_map map = {0};
  make_empty_with_capacity(&map, 16);
  uint64_t next = 5000, keys[12];
  find_keys_near(&map, 13, 3, &next, keys, 6);     /* homes 13, 14, 15 */
  find_keys_near(&map, 0, 2, &next, keys + 6, 6);  /* homes 0, 1: pushed on by the wrapped run */
  int present[12] = {0};
  uint64_t state = 0xAB;
  for (int round = 0; round < 20000; round++) {
    size_t i = next_random(&state) % 12;
    if (present[i]) {
      ck_assert_ptr_eq(ttd_handle_map_remove(&map, keys[i]), value_of(keys[i]));
      present[i] = 0;
    } else {
      ck_assert_int_eq(ttd_handle_map_put(&map, keys[i], value_of(keys[i])), 0);
      present[i] = 1;
    }
    ck_assert_uint_eq(map.capacity, 16); /* 12 keys never make a 16-slot map grow */
    check_against_reference(&map, keys, present, 12);
  }
  ttd_handle_map_clear(&map);
}
END_TEST

/* Random puts, removes and gets on heavily colliding keys match a reference array throughout. */
START_TEST(test_randomised_collisions) {
  enum { CLUSTERED = 400, SPREAD = 150, POOL = CLUSTERED + SPREAD };
  ttd_handle_map map = {0};
  make_empty_with_capacity(&map, 1024);
  ck_assert_uint_eq(map.capacity, 1024);
  static uint64_t keys[POOL];
  static int present[POOL];
  memset(present, 0, sizeof(present));
  uint64_t next = 1;
  find_keys_near(&map, 1020, 8, &next, keys, CLUSTERED); /* homes 1020..1023, 0..3 */
  uint64_t state = 0x1234;
  for (size_t i = CLUSTERED; i < POOL; i++) keys[i] = next_random(&state) | 1ull << 62;
  for (int op = 0; op < 60000; op++) {
    size_t i = next_random(&state) % POOL;
    switch (next_random(&state) % 3) {
      case 0:
        ck_assert_int_eq(ttd_handle_map_put(&map, keys[i], value_of(keys[i])), (present[i] ? -1 : 0));
        present[i] = 1;
        break;
      case 1:
        ck_assert_ptr_eq(ttd_handle_map_remove(&map, keys[i]), (present[i] ? value_of(keys[i]) : NULL));
        present[i] = 0;
        break;
      default:
        ck_assert_ptr_eq(ttd_handle_map_get(&map, keys[i]), (present[i] ? value_of(keys[i]) : NULL));
        break;
    }
    if (op % 500 == 0) check_against_reference(&map, keys, present, POOL);
  }
  ck_assert_uint_eq(map.capacity, 1024); /* at most 550 keys: never grew, clusters stayed */
  check_against_reference(&map, keys, present, POOL);
  for (size_t i = 0; i < POOL; i++) {
    if (present[i]) ck_assert_ptr_eq(ttd_handle_map_remove(&map, keys[i]), value_of(keys[i]));
  }
  ck_assert_uint_eq(map.count, 0);
  ttd_handle_map_clear(&map);
}
END_TEST

/* Random operations with growth on a mix of sequential and random keys match a reference. */
START_TEST(test_randomised_with_growth) {
  enum { POOL = 6000 };
  static uint64_t keys[POOL];
  static int present[POOL];
  memset(present, 0, sizeof(present));
  uint64_t state = 0x77;
  for (size_t i = 0; i < POOL; i++) keys[i] = i % 2 ? (uint64_t)i + 1 : next_random(&state) | 1ull << 63;
  ttd_handle_map map = {0};
  for (int op = 0; op < 100000; op++) {
    size_t i = next_random(&state) % POOL;
    /* Bias towards puts early on so the map grows through several sizes. */
    int put = (int)(next_random(&state) % 100) < (op < 50000 ? 70 : 40);
    if (put) {
      ck_assert_int_eq(ttd_handle_map_put(&map, keys[i], value_of(keys[i])), (present[i] ? -1 : 0));
      present[i] = 1;
    } else {
      ck_assert_ptr_eq(ttd_handle_map_remove(&map, keys[i]), (present[i] ? value_of(keys[i]) : NULL));
      present[i] = 0;
    }
    if (op % 5000 == 0) check_against_reference(&map, keys, present, POOL);
  }
  check_against_reference(&map, keys, present, POOL);
  ck_assert_uint_ge(map.capacity, 4096);
  ttd_handle_map_clear(&map);
}
END_TEST

/* The documented iteration over keys/values visits every entry exactly once. */
START_TEST(test_iteration) {
  ttd_handle_map map = {0};
  for (uint64_t k = 10; k < 510; k++) ck_assert_int_eq(ttd_handle_map_put(&map, k, value_of(k)), 0);
  static int visits[510];
  memset(visits, 0, sizeof(visits));
  for (size_t i = 0; i < map.capacity; i++) {
    if (!map.keys[i]) continue;
    ck_assert_uint_ge(map.keys[i], 10);
    ck_assert_uint_lt(map.keys[i], 510);
    ck_assert_ptr_eq(map.values[i], value_of(map.keys[i]));
    visits[map.keys[i]]++;
  }
  for (int k = 10; k < 510; k++) ck_assert_int_eq(visits[k], 1);
  ttd_handle_map_clear(&map);
}
END_TEST

/* clear frees storage and empties the map, which then works again from scratch. */
START_TEST(test_clear) {
  ttd_handle_map map = {0};
  for (uint64_t k = 1; k <= 5000; k++) ck_assert_int_eq(ttd_handle_map_put(&map, k, value_of(k)), 0);
  ttd_handle_map_clear(&map);
  ck_assert_ptr_null(map.keys);
  ck_assert_ptr_null(map.values);
  ck_assert_uint_eq(map.capacity, 0);
  ck_assert_uint_eq(map.count, 0);
  ck_assert_ptr_null(ttd_handle_map_get(&map, 1));
  ck_assert_ptr_null(ttd_handle_map_remove(&map, 1));
  ck_assert_int_eq(ttd_handle_map_put(&map, 1, value_of(1)), 0);
  ck_assert_ptr_eq(ttd_handle_map_get(&map, 1), value_of(1));
  ck_assert_uint_eq(map.count, 1);
  ttd_handle_map_clear(&map);
}
END_TEST

Suite *handle_map_suite(void) {
  Suite *s = suite_create("handle_map");
  TCase *tc = tcase_create("basics");
  tcase_add_test(tc, test_empty_map);
  tcase_add_test(tc, test_put_get_remove);
  tcase_add_test(tc, test_key_zero_refused);
  tcase_add_test(tc, test_duplicate_refused);
  tcase_add_test(tc, test_count_tracking);
  tcase_add_test(tc, test_iteration);
  tcase_add_test(tc, test_clear);
  suite_add_tcase(s, tc);

  tc = tcase_create("growth_and_removal");
  tcase_add_test(tc, test_growth);
  tcase_add_test(tc, test_same_slot_remove);
  tcase_add_test(tc, test_wraparound_cluster);
  tcase_add_test(tc, test_randomised_collisions);
  tcase_add_test(tc, test_randomised_with_growth);
  suite_add_tcase(s, tc);
  return s;
}
