/* A device-memory quota: the bytes a session may hold on the device, counted for every
 * tensor it causes to exist (uploads, allocations, program outputs and the activations a
 * run keeps, gradients, optimizer state). A tensor charges its quota when created and
 * refunds it when its last reference goes, so a tensor outliving its session (a call
 * still reading it) still refunds the right account.
 *
 * Reference counted (the session and every tensor it charged hold one); thread-safe,
 * lock-free. The limit can change while tensors exist (SIGHUP reload): a lowered limit
 * refuses new allocations and keeps what is already held. */
#ifndef TTD_QUOTA_H
#define TTD_QUOTA_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct ttd_quota {
  atomic_int refs;
  _Atomic uint64_t used;
  _Atomic uint64_t limit; /* bytes; 0 = no limit beyond the device's capacity */
  struct ttd_quota *parent; /* charged too, after this one (a session's tenant); one reference */
  char tenant[64];          /* a tenant's quota: its name, for messages; "" for a session's */
  _Atomic uint64_t shm_segments; /* a tenant's quota: shared-memory segments its sessions hold */
} ttd_quota;

/* A new quota with one reference, or NULL when out of memory. */
ttd_quota *ttd_quota_create(uint64_t limit);

/* A session's quota whose charges also go to parent (retained; NULL: none), so that the
 * parent bounds the sum over its children. NULL when out of memory. */
ttd_quota *ttd_quota_create_under(uint64_t limit, ttd_quota *parent);

/* A tenant's quota (a parent), named in its RESOURCE_EXHAUSTED messages. */
ttd_quota *ttd_quota_create_tenant(uint64_t limit, const char *tenant);

ttd_quota *ttd_quota_retain(ttd_quota *quota);   /* accepts NULL */
void ttd_quota_release(ttd_quota *quota);        /* accepts NULL */

void ttd_quota_set_limit(ttd_quota *quota, uint64_t limit);

/* Reserves bytes. RESOURCE_EXHAUSTED naming the quota, the bytes used and the bytes
 * requested when they do not fit. A NULL quota accepts everything. */
ttd_status_t ttd_quota_charge(ttd_quota *quota, uint64_t bytes);

/* Returns bytes charged earlier. Accepts NULL. */
void ttd_quota_refund(ttd_quota *quota, uint64_t bytes);

/* Formats bytes as "512 B", "1.5 KiB", "64.0 MiB", "2.00 GiB" into buf; returns buf. */
const char *ttd_format_bytes(uint64_t bytes, char *buf, size_t size);

#endif
