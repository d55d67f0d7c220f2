/* The fixture of the session, session-table and device-tensor suites (session_fixture.h). */
#include "session_fixture.h"

#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "telemetry/log.h"

ttd_backend *sf_backend;

void sf_setup(void) {
  ttd_log_threshold = TTD_LOG_ERROR; /* lease expiry logs at info */
  ttd_backend_options options = {.devices = 2, .dram_bytes = DRAM_BYTES, .l1_bytes = L1_BYTES, .cores = 1};
  ttd_status_t s = ttd_backend_create("sim", &options, &sf_backend);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
}

void sf_teardown(void) {
  ttd_backend_destroy(sf_backend);
  sf_backend = NULL;
}

uint64_t sf_used(int device, ttd_memloc loc) {
  ttd_device_info info;
  sf_backend->vtable->device_info(sf_backend, device, &info);
  return info.memory[loc == TTD_MEM_L1 ? 1 : 0].used_bytes;
}

uint64_t sf_used_total(void) {
  return sf_used(0, TTD_MEM_DRAM) + sf_used(0, TTD_MEM_L1) + sf_used(1, TTD_MEM_DRAM) + sf_used(1, TTD_MEM_L1);
}

int sf_tensor_refs(ttd_tensor *t) { return atomic_load(&t->refs); }
int sf_session_refs(ttd_session *s) { return atomic_load(&s->refs); }
int64_t sf_last_seen(ttd_session *s) { return atomic_load(&s->last_seen_ms); }

/* A new int32 tensor of n elements (1-d) on device/loc, charged to quota (may be NULL);
 * one reference owned by the caller. */
ttd_tensor *sf_new_charged_tensor(ttd_quota *quota, int64_t n, int device, ttd_memloc loc) {
  ttd_tensor_spec spec = {.dtype = TTD_DTYPE_INT32, .ndim = 1, .shape = {n}, .device = device, .location = loc};
  ttd_status_t s = ttd_tensor_spec_finish(&spec);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ttd_tensor *t = NULL;
  s = ttd_tensor_create(sf_backend, quota, &spec, &t);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_int_eq(sf_tensor_refs(t), 1);
  return t;
}

ttd_tensor *sf_new_tensor(int64_t n, int device, ttd_memloc loc) { return sf_new_charged_tensor(NULL, n, device, loc); }

/* Adds a new tensor of n int32 elements to session and drops the creator's reference. */
uint64_t sf_add_new(ttd_session *session, int64_t n, int device, ttd_memloc loc) {
  ttd_tensor *t = sf_new_charged_tensor(session->quota, n, device, loc);
  uint64_t h = 0;
  ttd_status_t s = ttd_session_tensor_add(session, t, &h);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_uint_ne(h, 0);
  ttd_tensor_release(t);
  return h;
}

/* The message of status with the handle's 16-digit hex replaced by "<H>"; frees status. */
void sf_message_without_handle(ttd_status_t status, uint64_t handle, char *out, size_t len) {
  char hex[24];
  snprintf(hex, sizeof(hex), "%016" PRIx64, handle);
  size_t hex_len = strlen(hex);
  const char *m = ttd_status_message(status);
  size_t o = 0;
  while (*m && o + 4 < len) {
    if (strncasecmp(m, hex, hex_len) == 0) {
      memcpy(out + o, "<H>", 3);
      o += 3;
      m += hex_len;
    } else {
      out[o++] = *m++;
    }
  }
  out[o] = '\0';
  ttd_status_free(status);
}

/* Asserts that looking handle up in session is NOT_FOUND, and returns the normalised message. */
void sf_expect_not_found(ttd_session *session, uint64_t handle, char *out, size_t len) {
  ttd_tensor *t = (ttd_tensor *)&t; /* must be cleared */
  ttd_status_t s = ttd_session_tensor_lookup(session, handle, &t);
  ck_assert_msg(ttd_status_code(s) == GRPC_STATUS_NOT_FOUND, "handle %016" PRIx64 ": %s", handle,
                ttd_code_name(ttd_status_code(s)));
  ck_assert_ptr_null(t);
  sf_message_without_handle(s, handle, out, len);
}
