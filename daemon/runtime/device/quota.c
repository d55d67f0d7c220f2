#include "device/quota.h"

#include <stdio.h>
#include <stdlib.h>

ttd_quota *ttd_quota_create(uint64_t limit) {
  ttd_quota *q = calloc(1, sizeof(*q));
  if (!q) return NULL;
  atomic_init(&q->refs, 1);
  atomic_init(&q->used, 0);
  atomic_init(&q->limit, limit);
  return q;
}

ttd_quota *ttd_quota_create_under(uint64_t limit, ttd_quota *parent) {
  ttd_quota *q = ttd_quota_create(limit);
  if (q) q->parent = ttd_quota_retain(parent);
  return q;
}

ttd_quota *ttd_quota_create_tenant(uint64_t limit, const char *tenant) {
  ttd_quota *q = ttd_quota_create(limit);
  if (q) snprintf(q->tenant, sizeof(q->tenant), "%s", tenant);
  return q;
}

ttd_quota *ttd_quota_retain(ttd_quota *quota) {
  if (quota) atomic_fetch_add_explicit(&quota->refs, 1, memory_order_relaxed);
  return quota;
}

void ttd_quota_release(ttd_quota *quota) {
  if (!quota || atomic_fetch_sub_explicit(&quota->refs, 1, memory_order_acq_rel) != 1) return;
  ttd_quota_release(quota->parent);
  free(quota);
}

void ttd_quota_set_limit(ttd_quota *quota, uint64_t limit) {
  atomic_store_explicit(&quota->limit, limit, memory_order_relaxed);
}

const char *ttd_format_bytes(uint64_t bytes, char *buf, size_t size) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) {
    snprintf(buf, size, "%llu B", (unsigned long long)bytes);
    return buf;
  }
  double v = (double)bytes / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, size, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

/* Reserves bytes in quota alone. */
static ttd_status_t charge_one(ttd_quota *quota, uint64_t bytes) {
  uint64_t used = atomic_load_explicit(&quota->used, memory_order_relaxed);
  for (;;) {
    uint64_t limit = atomic_load_explicit(&quota->limit, memory_order_relaxed);
    if (limit && (bytes > limit || used > limit - bytes) && quota->tenant[0]) {
      char q[32], u[32], r[32];
      return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                             "tenant %s's memory quota exceeded: quota %s (%llu bytes) over all its sessions, used "
                             "%s (%llu bytes), requested %s (%llu bytes); free tensors in its sessions, or ask the "
                             "operator for a larger quota= in the tokens file",
                             quota->tenant, ttd_format_bytes(limit, q, sizeof(q)), (unsigned long long)limit,
                             ttd_format_bytes(used, u, sizeof(u)), (unsigned long long)used,
                             ttd_format_bytes(bytes, r, sizeof(r)), (unsigned long long)bytes);
    }
    if (limit && (bytes > limit || used > limit - bytes)) {
      char q[32], u[32], r[32];
      return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                             "session memory quota exceeded: quota %s (%llu bytes), used %s (%llu bytes), "
                             "requested %s (%llu bytes); free tensors, or open the session with a larger quota "
                             "within your tenant's limit",
                             ttd_format_bytes(limit, q, sizeof(q)), (unsigned long long)limit,
                             ttd_format_bytes(used, u, sizeof(u)), (unsigned long long)used,
                             ttd_format_bytes(bytes, r, sizeof(r)), (unsigned long long)bytes);
    }
    if (atomic_compare_exchange_weak_explicit(&quota->used, &used, used + bytes, memory_order_relaxed,
                                              memory_order_relaxed)) {
      return TTD_OK;
    }
  }
}

ttd_status_t ttd_quota_charge(ttd_quota *quota, uint64_t bytes) {
  if (!quota) return TTD_OK;
  TTD_RETURN_IF_ERROR(charge_one(quota, bytes));
  if (quota->parent) {
    ttd_status_t s = charge_one(quota->parent, bytes);
    if (s) {
      atomic_fetch_sub_explicit(&quota->used, bytes, memory_order_relaxed);
      return s;
    }
  }
  return TTD_OK;
}

void ttd_quota_refund(ttd_quota *quota, uint64_t bytes) {
  if (!quota) return;
  atomic_fetch_sub_explicit(&quota->used, bytes, memory_order_relaxed);
  if (quota->parent) atomic_fetch_sub_explicit(&quota->parent->used, bytes, memory_order_relaxed);
}
