#define _GNU_SOURCE /* F_GET_SEALS, F_SEAL_SHRINK */
#include "session/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <linux/magic.h>

static atomic_uint_fast64_t mapped, limit;

static uint64_t default_limit(void) {
  FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
  unsigned long long max = 0;
  if (f) {
    if (fscanf(f, "%llu", &max) != 1) max = 0;
    fclose(f);
  }
  return max >= 4096 ? max / 4 : 16384;
}

uint64_t ttd_shm_segments_mapped(void) { return atomic_load(&mapped); }

uint64_t ttd_shm_segment_limit(void) {
  uint64_t l = atomic_load(&limit);
  if (!l) {
    uint64_t unset = 0;
    atomic_compare_exchange_strong(&limit, &unset, default_limit());
    l = atomic_load(&limit);
  }
  return l;
}

void ttd_shm_segment_set_limit(uint64_t l) { atomic_store(&limit, l ? l : default_limit()); }

uint64_t ttd_shm_segment_tenant_limit(void) {
  uint64_t share = ttd_shm_segment_limit() / TTD_SHM_TENANT_SHARE;
  return share ? share : 1;
}

ttd_status_t ttd_shm_segment_map(int fd, uint64_t size, ttd_shm_segment **out_segment) {
  *out_segment = NULL;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "the segment's fd is not a memfd or regular file");
  }
  /* A huge-page memfd's pages can be taken back from under a mapping (a hole punched, the
   * pool used up elsewhere) and fault (SIGBUS) the daemon's copy: only ordinary ones. */
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0 || fs.f_type == HUGETLBFS_MAGIC) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "the segment must be an ordinary memfd: one of huge pages (MFD_HUGETLB) is refused");
  }
  /* A segment that could shrink under a mapping would fault (SIGBUS) the daemon's copy: only
   * memfds sealed against shrinking are taken (files on disk or FUSE cannot be sealed). */
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "the segment must be a memfd sealed against shrinking: memfd_create with "
                           "MFD_ALLOW_SEALING, then fcntl(F_ADD_SEALS, F_SEAL_SHRINK)");
  }
  if (size == 0 || (uint64_t)st.st_size < size) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "the segment is %" PRIu64 " bytes but registration asked for %" PRIu64
                           "; ftruncate the memfd first", (uint64_t)st.st_size, size);
  }
  uint64_t cap = ttd_shm_segment_limit();
  if (atomic_fetch_add(&mapped, 1) >= cap) {
    atomic_fetch_sub(&mapped, 1);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "the daemon maps %" PRIu64 " shared-memory segments, its limit (a quarter of the kernel's "
                           "vm.max_map_count): release segments, or register fewer and larger ones",
                           cap);
  }
  void *addr = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    atomic_fetch_sub(&mapped, 1);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot map a %" PRIu64 "-byte segment: %s", size,
                           strerror(errno));
  }
  ttd_shm_segment *s = calloc(1, sizeof(*s));
  if (!s) {
    munmap(addr, (size_t)size);
    atomic_fetch_sub(&mapped, 1);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  atomic_init(&s->refs, 1);
  s->addr = addr;
  s->size = size;
  *out_segment = s;
  return TTD_OK;
}

ttd_shm_segment *ttd_shm_segment_retain(ttd_shm_segment *segment) {
  atomic_fetch_add_explicit(&segment->refs, 1, memory_order_relaxed);
  return segment;
}

void ttd_shm_segment_release(ttd_shm_segment *segment) {
  if (!segment || atomic_fetch_sub_explicit(&segment->refs, 1, memory_order_acq_rel) != 1) return;
  munmap(segment->addr, (size_t)segment->size);
  atomic_fetch_sub(&mapped, 1);
  free(segment);
}

ttd_status_t ttd_shm_segment_check_range(const ttd_shm_segment *segment, uint64_t offset, uint64_t length,
                                         uint64_t want) {
  if (length != want) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "the shared-memory range holds %" PRIu64 " bytes but the transfer moves %" PRIu64, length,
                           want);
  }
  if (offset > segment->size || length > segment->size - offset) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "the range [%" PRIu64 ", +%" PRIu64 ") lies outside the %" PRIu64 "-byte segment", offset,
                           length, segment->size);
  }
  return TTD_OK;
}
