#include "call_fixture.h"

#include <check.h>
#include <string.h>

void cf_setup(call_fixture *f) {
  memset(f, 0, sizeof(*f));
  ttd_backend_options options = {.devices = 1, .dram_bytes = 16u << 20, .l1_bytes = 1u << 20, .cores = 2};
  ttd_status_t s = ttd_backend_create("sim", &options, &f->backend);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  f->core.backend = f->backend;
  f->session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  ck_assert_ptr_nonnull(f->session);
  f->call.core = &f->core;
  f->call.session = f->session;
}

void cf_teardown(call_fixture *f) {
  uint64_t tensors, bytes;
  ttd_session_close(f->session, &tensors, &bytes);
  ttd_session_release(f->session);
  ttd_backend_destroy(f->backend);
}

call_fixture cf;

static void cf_setup_global(void) { cf_setup(&cf); }

static void cf_teardown_global(void) { cf_teardown(&cf); }

TCase *cf_tcase(const char *name) {
  TCase *tc = tcase_create(name);
  tcase_add_checked_fixture(tc, cf_setup_global, cf_teardown_global);
  return tc;
}
