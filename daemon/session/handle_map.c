#include "session/handle_map.h"

#include <stdlib.h>

static size_t slot_of(uint64_t key, size_t capacity) {
  /* Handles are random already; the multiply spreads sequential test keys too. */
  return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & (capacity - 1);
}

void ttd_handle_map_clear(ttd_handle_map *map) {
  free(map->keys);
  free(map->values);
  map->keys = NULL;
  map->values = NULL;
  map->capacity = 0;
  map->count = 0;
}

void *ttd_handle_map_get(const ttd_handle_map *map, uint64_t key) {
  if (key == 0 || map->capacity == 0) return NULL;
  for (size_t i = slot_of(key, map->capacity);; i = (i + 1) & (map->capacity - 1)) {
    if (map->keys[i] == key) return map->values[i];
    if (map->keys[i] == 0) return NULL;
  }
}

static void place(ttd_handle_map *map, uint64_t key, void *value) {
  size_t i = slot_of(key, map->capacity);
  while (map->keys[i] != 0) i = (i + 1) & (map->capacity - 1);
  map->keys[i] = key;
  map->values[i] = value;
  map->count++;
}

static int grow(ttd_handle_map *map) {
  size_t capacity = map->capacity ? map->capacity * 2 : 16;
  uint64_t *keys = calloc(capacity, sizeof(*keys));
  void **values = calloc(capacity, sizeof(*values));
  if (!keys || !values) {
    free(keys);
    free(values);
    return -2;
  }
  ttd_handle_map old = *map;
  map->keys = keys;
  map->values = values;
  map->capacity = capacity;
  map->count = 0;
  for (size_t i = 0; i < old.capacity; i++) {
    if (old.keys[i]) place(map, old.keys[i], old.values[i]);
  }
  free(old.keys);
  free(old.values);
  return 0;
}

int ttd_handle_map_put(ttd_handle_map *map, uint64_t key, void *value) {
  if (key == 0 || value == NULL || ttd_handle_map_get(map, key)) return -1;
  if ((map->count + 1) * 4 > map->capacity * 3) {
    int rc = grow(map);
    if (rc) return rc;
  }
  place(map, key, value);
  return 0;
}

void *ttd_handle_map_remove(ttd_handle_map *map, uint64_t key) {
  if (key == 0 || map->capacity == 0) return NULL;
  size_t mask = map->capacity - 1;
  size_t i = slot_of(key, map->capacity);
  while (map->keys[i] != key) {
    if (map->keys[i] == 0) return NULL;
    i = (i + 1) & mask;
  }
  void *value = map->values[i];
  /* Backward shift: move later entries of the probe run into the hole. */
  size_t hole = i;
  for (size_t j = (i + 1) & mask; map->keys[j] != 0; j = (j + 1) & mask) {
    size_t home = slot_of(map->keys[j], map->capacity);
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      map->keys[hole] = map->keys[j];
      map->values[hole] = map->values[j];
      hole = j;
    }
  }
  map->keys[hole] = 0;
  map->values[hole] = NULL;
  map->count--;
  return value;
}
