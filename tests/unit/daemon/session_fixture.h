/* The fixture of the session, session-table and device-tensor suites: a simulated backend
 * of two devices with small memories, made and destroyed around each test, and helpers that
 * make tensors and read what the devices hold. */
#ifndef TTD_TESTS_SESSION_FIXTURE_H
#define TTD_TESTS_SESSION_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "device/tensor.h"
#include "session/session.h"

#define DRAM_BYTES (1u << 20)
#define L1_BYTES (64u << 10)

extern ttd_backend *sf_backend; /* the test's backend, between sf_setup and sf_teardown */

void sf_setup(void);
void sf_teardown(void);

/* Bytes used on device's loc, and on every device and location. */
uint64_t sf_used(int device, ttd_memloc loc);
uint64_t sf_used_total(void);

int sf_tensor_refs(ttd_tensor *t);
int sf_session_refs(ttd_session *s);
int64_t sf_last_seen(ttd_session *s);

/* A new int32 tensor of n elements (1-d) on device/loc, charged to quota (may be NULL);
 * one reference owned by the caller. */
ttd_tensor *sf_new_charged_tensor(ttd_quota *quota, int64_t n, int device, ttd_memloc loc);
ttd_tensor *sf_new_tensor(int64_t n, int device, ttd_memloc loc);

/* Adds a new tensor of n int32 elements to session and drops the creator's reference. */
uint64_t sf_add_new(ttd_session *session, int64_t n, int device, ttd_memloc loc);

/* The message of status with the handle's 16-digit hex replaced by "<H>"; frees status. */
void sf_message_without_handle(ttd_status_t status, uint64_t handle, char *out, size_t len);

/* Asserts that looking handle up in session is NOT_FOUND, and returns the normalised message. */
void sf_expect_not_found(ttd_session *session, uint64_t handle, char *out, size_t len);

#endif
