/* The fixture of the suites that drive the daemon's method handlers: one call of one open
 * session over a simulated backend of one device (16 MiB of DRAM, 2 cores). */
#ifndef TTD_TESTS_CALL_FIXTURE_H
#define TTD_TESTS_CALL_FIXTURE_H

#include <check.h>

#include "core/core.h"
#include "rpc/call.h"
#include "session/session.h"

typedef struct call_fixture {
  ttd_backend *backend;
  ttd_core core; /* only its backend set */
  ttd_session *session;
  ttd_call call; /* of session, on core */
} call_fixture;

void cf_setup(call_fixture *f);
/* Closes the session and destroys the backend (give back any vtable wrapped first). */
void cf_teardown(call_fixture *f);

/* For suites with nothing to add to it: cf, set up before and torn down after each test of
 * the TCase cf_tcase makes. */
extern call_fixture cf;
TCase *cf_tcase(const char *name);

#endif
