/* A shared-memory segment a local client registered: its mapping in the daemon, reference
 * counted so that a segment released (or its session closed) during an Upload or
 * Download stays mapped until that call is done with it. Thread-safe refcount. */
#ifndef TTD_SHM_SEGMENT_H
#define TTD_SHM_SEGMENT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/status.h"

typedef struct ttd_shm_segment {
  atomic_int refs;
  unsigned char *addr;
  uint64_t size;
} ttd_shm_segment;

/* Maps size bytes of the memfd fd (shared, read-write). INVALID_ARGUMENT when fd is not a
 * memfd sealed with F_SEAL_SHRINK of at least size bytes; RESOURCE_EXHAUSTED when the
 * process already holds ttd_shm_segment_limit() segments. The fd stays the caller's. */
ttd_status_t ttd_shm_segment_map(int fd, uint64_t size, ttd_shm_segment **out_segment);

/* Segments mapped in the process now, and the most it maps at once: every mapping counts
 * against the kernel's vm.max_map_count, which, once reached, makes the daemon's own
 * allocations fail. The limit is a quarter of vm.max_map_count (read at the first map; 16384
 * if unreadable) unless set; set_limit(0) restores that. */
uint64_t ttd_shm_segments_mapped(void);
uint64_t ttd_shm_segment_limit(void);
void ttd_shm_segment_set_limit(uint64_t limit);

/* The segments one tenant's sessions hold at once, together: a TTD_SHM_TENANT_SHARE-th of
 * ttd_shm_segment_limit(), so that one tenant cannot take the whole of it. */
#define TTD_SHM_TENANT_SHARE 4
uint64_t ttd_shm_segment_tenant_limit(void);

ttd_shm_segment *ttd_shm_segment_retain(ttd_shm_segment *segment);
void ttd_shm_segment_release(ttd_shm_segment *segment); /* the last one unmaps; NULL ok */

/* Checks that [offset, offset + length) lies inside the segment and that length is what
 * the transfer moves. INVALID_ARGUMENT saying which bound is wrong. */
ttd_status_t ttd_shm_segment_check_range(const ttd_shm_segment *segment, uint64_t offset, uint64_t length,
                                         uint64_t want);

#endif
