/* Whole-buffer file I/O for the daemon and libttclient alike: writes and positioned reads
 * that loop over short transfers and EINTR, and the folder sync that makes a rename
 * durable. Thread-safe as far as the caller's descriptors are.
 *
 * Errors are UNAVAILABLE whose message is strerror(errno) alone, with errno kept, so that
 * the caller prefixes what it was doing and to which file ("cannot write 'x.tmp': ..."). */
#ifndef TTD_FILE_IO_H
#define TTD_FILE_IO_H

#include <stdint.h>

#include "base/status.h"

/* Writes len bytes of buf to fd at its position, in chunks below Linux's 2 GiB cap. */
ttd_status_t ttd_write_all(int fd, const void *buf, uint64_t len);

/* Reads len bytes at offset of fd into buf with pread (fd's position is untouched, so
 * several threads may read one fd at once). OUT_OF_RANGE, with errno 0, when the file
 * ends first; buf then holds what was read. */
ttd_status_t ttd_read_all_at(int fd, void *buf, uint64_t len, uint64_t offset);

/* fsyncs the folder that holds path ("." for a bare name), which makes a rename into it
 * durable. A filesystem that cannot sync folders (EINVAL) counts as success.
 * RESOURCE_EXHAUSTED when host memory runs out. */
ttd_status_t ttd_sync_parent_dir(const char *path);

#endif
