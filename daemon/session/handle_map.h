/* A map from 64-bit handles to pointers: open addressing, linear probing, backward-shift
 * deletion. Key 0 is reserved (never a valid handle). Not thread-safe: the owner locks. */
#ifndef TTD_HANDLE_MAP_H
#define TTD_HANDLE_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct ttd_handle_map {
  uint64_t *keys;
  void **values;
  size_t capacity; /* a power of two, or 0 */
  size_t count;
} ttd_handle_map;

/* A zeroed struct is an empty map; ttd_handle_map_clear frees its storage. */
void ttd_handle_map_clear(ttd_handle_map *map);

/* NULL if absent. */
void *ttd_handle_map_get(const ttd_handle_map *map, uint64_t key);

/* Inserts a new key with a non-NULL value (NULL means "absent" to get). Returns 0, -1 if key is 0 or already present, -2 if out of memory. */
int ttd_handle_map_put(ttd_handle_map *map, uint64_t key, void *value);

/* Removes key and returns its value, or NULL if absent. */
void *ttd_handle_map_remove(ttd_handle_map *map, uint64_t key);

/* Iteration: for (size_t i = 0; i < map->capacity; i++) if (map->keys[i]) ... */

#endif
