#include "telemetry/metrics.h"

#include <stdio.h>
#include <string.h>

const double ttd_latency_bounds[TTD_LATENCY_BUCKETS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                        0.025,  0.05,    0.1,    0.25,  1.0,    2.5};

void ttd_metrics_record(ttd_metrics *metrics, int m, grpc_status_code code, int64_t duration_ns) {
  if (m < 0 || m >= TTD_METRICS_MAX_METHODS) return;
  ttd_method_metrics *mm = &metrics->methods[m];
  unsigned c = (unsigned)code < TTD_METRICS_CODES ? (unsigned)code : GRPC_STATUS_UNKNOWN;
  atomic_fetch_add_explicit(&mm->by_code[c], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&metrics->calls_total, 1, memory_order_relaxed);
  double seconds = (double)duration_ns / 1e9;
  int b = 0;
  while (b < TTD_LATENCY_BUCKETS && seconds > ttd_latency_bounds[b]) b++;
  atomic_fetch_add_explicit(&mm->latency[b], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&mm->latency_sum_ns, (unsigned long long)(duration_ns > 0 ? duration_ns : 0),
                            memory_order_relaxed);
}

static ttd_tenant_metrics *tenant_slot(ttd_metrics *metrics, const char *tenant) {
  int n = atomic_load_explicit(&metrics->n_tenants, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    if (strcmp(metrics->tenants[i].name, tenant) == 0) return &metrics->tenants[i];
  }
  pthread_mutex_lock(&metrics->tenants_lock);
  n = atomic_load_explicit(&metrics->n_tenants, memory_order_relaxed);
  ttd_tenant_metrics *slot = NULL;
  for (int i = 0; i < n && !slot; i++) {
    if (strcmp(metrics->tenants[i].name, tenant) == 0) slot = &metrics->tenants[i];
  }
  if (!slot) {
    slot = &metrics->tenants[n < TTD_METRICS_MAX_TENANTS ? n : TTD_METRICS_MAX_TENANTS - 1];
    if (n < TTD_METRICS_MAX_TENANTS) {
      snprintf(slot->name, sizeof(slot->name), "%s", n == TTD_METRICS_MAX_TENANTS - 1 ? "other" : tenant);
      atomic_store_explicit(&metrics->n_tenants, n + 1, memory_order_release);
    }
  }
  pthread_mutex_unlock(&metrics->tenants_lock);
  return slot;
}

void ttd_metrics_record_card(ttd_metrics *metrics, const char *tenant, int64_t duration_ns) {
  ttd_tenant_metrics *slot = tenant_slot(metrics, tenant ? tenant : "");
  atomic_fetch_add_explicit(&slot->card_ns, (unsigned long long)(duration_ns > 0 ? duration_ns : 0),
                            memory_order_relaxed);
  atomic_fetch_add_explicit(&slot->programs, 1, memory_order_relaxed);
}

static void add_ns(atomic_ullong *to, int64_t ns) {
  atomic_fetch_add_explicit(to, (unsigned long long)(ns > 0 ? ns : 0), memory_order_relaxed);
}

void ttd_metrics_record_node(void *metrics, int op, bool backward, int64_t ns) {
  if (op < 0 || op >= TTD_OP_COUNT) return;
  ttd_op_metrics *om = &((ttd_metrics *)metrics)->ops[op];
  add_ns(&om->ns[backward], ns);
  atomic_fetch_add_explicit(&om->runs[backward], 1, memory_order_relaxed);
}

void ttd_metrics_record_optimizer(ttd_metrics *metrics, int64_t ns) {
  add_ns(&metrics->optimizer_ns, ns);
  atomic_fetch_add_explicit(&metrics->optimizer_steps, 1, memory_order_relaxed);
}

void ttd_metrics_record_phases(ttd_metrics *metrics, const int64_t ns[TTD_PHASE_COUNT]) {
  for (int p = 0; p < TTD_PHASE_COUNT; p++) add_ns(&metrics->phase_ns[p], ns[p]);
  atomic_fetch_add_explicit(&metrics->device_calls, 1, memory_order_relaxed);
}

int ttd_metrics_tenant_count(ttd_metrics *metrics) {
  return atomic_load_explicit(&metrics->n_tenants, memory_order_acquire);
}
