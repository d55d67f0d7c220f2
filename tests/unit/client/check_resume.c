/* client/conn/resume.c: which failed calls wait for ttd and resume the session, and which
 * answers to the resume's OpenSession are final. A stopping ttd's gRPC server kills the calls
 * it had not taken yet with a bare CANCELLED: those never ran, so they resume too. */
#include <check.h>
#include <stdlib.h>

#include "conn/conn.h"
#include "suites.h"

static tt_client *resumable(void) {
  tt_client *c = calloc(1, sizeof(*c));
  ck_assert_ptr_nonnull(c);
  c->resume_secret_len = sizeof(c->resume_secret);
  return c;
}

/* Unreachable, killed unrun by a stopping ttd, or refused as restarted: resume and run again. */
START_TEST(test_stopping_or_restarted_resumes) {
  tt_client *c = resumable();
  ck_assert(tt_resume_wanted(c, TT_RPC_EXECUTE, TT_UNAVAILABLE, "Socket closed"));
  ck_assert(tt_resume_wanted(c, TT_RPC_EXECUTE, TT_CANCELLED, "CANCELLED"));
  ck_assert(tt_resume_wanted(c, TT_RPC_UPLOAD, TT_CANCELLED, "CANCELLED"));
  ck_assert(tt_resume_wanted(c, TT_RPC_BACKWARD, TT_FAILED_PRECONDITION, "daemon restarted, tensors are gone"));
  ck_assert(tt_resume_wanted(c, TT_RPC_FREE, TT_FAILED_PRECONDITION, "waits for its client to resume it: ..."));
  /* A program closing its session during a restart closes the resumed one (its memory goes now). */
  ck_assert(tt_resume_wanted(c, TT_RPC_CLOSE_SESSION, TT_UNAVAILABLE, "Socket closed"));
  free(c);
}
END_TEST

/* Not for OpenSession, another error, a session without a secret (ttd saves
 * no state) or a closed client. */
START_TEST(test_other_failures_do_not_resume) {
  tt_client *c = resumable();
  ck_assert(!tt_resume_wanted(c, TT_RPC_OPEN_SESSION, TT_CANCELLED, "CANCELLED"));
  ck_assert(!tt_resume_wanted(c, TT_RPC_EXECUTE, TT_INVALID_ARGUMENT, "bad shape"));
  ck_assert(!tt_resume_wanted(c, TT_RPC_EXECUTE, TT_FAILED_PRECONDITION, "session memory quota exceeded"));
  /* Stopped running by a stopping ttd: part of it may have taken effect, so it is not sent again. */
  ck_assert(!tt_resume_wanted(c, TT_RPC_EXECUTE, TT_ABORTED, "ttd is shutting down: its drain timeout passed while"));
  c->resume_secret_len = 0;
  ck_assert(!tt_resume_wanted(c, TT_RPC_EXECUTE, TT_CANCELLED, "CANCELLED"));
  c->resume_secret_len = sizeof(c->resume_secret);
  c->closed = true;
  ck_assert(!tt_resume_wanted(c, TT_RPC_EXECUTE, TT_UNAVAILABLE, "Socket closed"));
  free(c);
}
END_TEST

/* The resume's OpenSession keeps trying while ttd is away or stopping (CANCELLED included);
 * ttd's answer that it cannot resume the session is final. */
START_TEST(test_resume_refusal_is_final_only_when_ttd_answered) {
  ck_assert(!tt_resume_refused(TT_UNAVAILABLE));
  ck_assert(!tt_resume_refused(TT_CANCELLED));
  ck_assert(!tt_resume_refused(TT_DEADLINE_EXCEEDED));
  ck_assert(!tt_resume_refused(TT_INTERNAL));
  ck_assert(tt_resume_refused(TT_NOT_FOUND));
  ck_assert(tt_resume_refused(TT_UNAUTHENTICATED));
  ck_assert(tt_resume_refused(TT_FAILED_PRECONDITION));
}
END_TEST

Suite *resume_suite(void) {
  Suite *s = suite_create("resume");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_stopping_or_restarted_resumes);
  tcase_add_test(tc, test_other_failures_do_not_resume);
  tcase_add_test(tc, test_resume_refusal_is_final_only_when_ttd_answered);
  suite_add_tcase(s, tc);
  return s;
}
