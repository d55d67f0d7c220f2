/* Calls of one session racing over one tensor, against a real ttd: Uploads rewriting an
 * index tensor in chunks while Executes gather with it. A program never reads a tensor an
 * Upload is writing (the loser of each race gets FAILED_PRECONDITION), so every answered
 * gather saw one whole upload's indices, never a mix; and indices rewritten to values far
 * past the table during the races never take the daemon down. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "raw_rpc.h"
#include "suites.h"
#include "ttd_harness.h"
#include "ttd/v1/ttd.pb-c.h"

enum { N = 1 << 17, VOCAB = 4, DIM = 2, CHUNKS = 32 };

typedef struct race {
  const ttd_proc *proc;
  raw_md md;
  uint64_t handle;
  atomic_int stop;
  atomic_int uploads_ok, uploads_refused;
  int32_t bad; /* the third pattern's value: out of the table's range */
} race;

/* Rewrites the tensor in CHUNKS messages with one value everywhere: 1, 2, then bad, in turn. */
static void *uploader(void *arg) {
  race *r = arg;
  int32_t *values = malloc(sizeof(int32_t) * N);
  size_t chunk = sizeof(int32_t) * N / CHUNKS;
  unsigned char *msgs[CHUNKS];
  size_t lens[CHUNKS];
  for (int round = 0; !atomic_load(&r->stop); round++) {
    int32_t v = round % 3 == 0 ? 1 : round % 3 == 1 ? 2 : r->bad;
    for (int i = 0; i < N; i++) values[i] = v;
    Ttd__V1__UploadHeader header = TTD__V1__UPLOAD_HEADER__INIT;
    header.target_case = TTD__V1__UPLOAD_HEADER__TARGET_HANDLE;
    header.handle = r->handle;
    for (int c = 0; c < CHUNKS; c++) {
      Ttd__V1__UploadRequest req = TTD__V1__UPLOAD_REQUEST__INIT;
      if (c == 0) req.header = &header;
      req.data.data = (uint8_t *)values + c * chunk;
      req.data.len = chunk;
      lens[c] = ttd__v1__upload_request__get_packed_size(&req);
      msgs[c] = malloc(lens[c]);
      ttd__v1__upload_request__pack(&req, msgs[c]);
    }
    raw_result res;
    raw_stream(r->proc->target, "/ttd.v1.Device/Upload", r->md, (const void *const *)msgs, lens, CHUNKS, 0, &res);
    for (int c = 0; c < CHUNKS; c++) free(msgs[c]);
    if (res.code == 0) {
      atomic_fetch_add(&r->uploads_ok, 1);
    } else {
      ck_assert_msg(res.code == 9 && strstr(res.details, "being read by a running Execute"), "upload: %d %s", res.code,
                    res.details);
      atomic_fetch_add(&r->uploads_refused, 1);
    }
    raw_result_free(&res);
  }
  free(values);
  return NULL;
}

/* Executes racing the Uploads: each one answered gathered rows of one index for every
 * position (1's or 2's row), or was refused with INVALID_ARGUMENT (the bad pattern) or
 * FAILED_PRECONDITION (an Upload was writing); none saw two patterns. */
START_TEST(test_upload_and_execute_never_overlap) {
  ttd_proc proc;
  ttd_proc_start(&proc, NULL);
  tt_client *c = harness_connect(&proc, 1);
  float table_values[VOCAB * DIM] = {10, 11, 20, 21, 30, 31, 40, 41};
  int64_t ts[2] = {VOCAB, DIM}, is[1] = {N};
  tt_tensor *table = tt_tensor_from_host(c, table_values, TT_FLOAT32, ts, 2);
  tt_graph *g = tt_graph_create(c, 1);
  tt_value in[2] = {tt_graph_input(g, "i", TT_INT32, is, 1), tt_graph_param_from(g, "table", table)};
  ck_assert_int_eq(tt_graph_output(g, tt_graph_op(g, "embedding", in, 2, NULL)), 0);
  tt_module *m = tt_compile(c, g);
  tt_graph_free(g);
  ck_assert_int_eq(tt_module_to(m, "tt"), TT_OK);
  tt_module_train(m, 0);
  tt_tensor *idx_host = tt_tensor_from_host(c, NULL, TT_INT32, is, 1);
  for (int i = 0; i < N; i++) ((int32_t *)tt_tensor_data(idx_host))[i] = 1;
  tt_tensor *idx = tt_to(idx_host, "tt");
  char session[17];
  snprintf(session, sizeof(session), "%016llx", (unsigned long long)tt_session_id(c));
  race r = {.proc = &proc, .md = {.session = session, .instance = tt_instance_id(c)}, .handle = tt_tensor_handle(idx),
            .bad = 0x3fffffff};
  ck_assert_uint_ne(r.handle, 0);
  pthread_t thread;
  ck_assert_int_eq(pthread_create(&thread, NULL, uploader, &r), 0);
  int answered = 0, bad_index = 0, busy = 0;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  /* 3 s of races (and 10 whole uploads at least, 20 s at most) */
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &t);
    double secs = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9;
    if ((secs > 3 && atomic_load(&r.uploads_ok) >= 10) || secs > 20) break;
    tt_tensor *y = NULL;
    tt_status st = tt_forward(m, &idx, 1, &y);
    if (st == TT_OK) {
      tt_tensor *yh = tt_to(y, "cpu");
      const float *v = tt_tensor_data(yh);
      ck_assert(v[0] == 20 || v[0] == 30);
      for (int i = 0; i < N * DIM; i += 2) ck_assert_msg(v[i] == v[0], "row %d is %g, row 0 %g: a mix", i / 2, v[i], v[0]);
      tt_tensor_free(yh);
      answered++;
    } else if (st == TT_INVALID_ARGUMENT) {
      ck_assert_ptr_nonnull(strstr(tt_last_error(c), "it must lie in [0, 4)"));
      bad_index++;
    } else {
      ck_assert_msg(st == TT_FAILED_PRECONDITION && strstr(tt_last_error(c), "being written by an Upload"), "%s",
                    tt_last_error(c));
      busy++;
    }
    tt_tensor_free(y);
  }
  atomic_store(&r.stop, 1);
  pthread_join(thread, NULL);
  /* The out-of-table pattern is refused, not followed: in the races when one hit it, and at
   * least once here, with nothing racing. */
  for (int i = 0; i < N; i++) ((int32_t *)tt_tensor_data(idx_host))[i] = r.bad;
  tt_tensor *bad = tt_to(idx_host, "tt");
  ck_assert_ptr_nonnull(bad);
  tt_tensor *y = NULL;
  ck_assert_int_eq(tt_forward(m, &bad, 1, &y), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "it must lie in [0, 4)"));
  bad_index++;
  tt_tensor_free(bad);
  printf("e2e_concurrent_writes: %d Executes answered, %d refused the out-of-table pattern, %d found an Upload "
         "writing; %d Uploads done, %d refused\n", answered, bad_index, busy, atomic_load(&r.uploads_ok),
         atomic_load(&r.uploads_refused));
  ck_assert_int_gt(answered, 0);
  ck_assert_int_gt(atomic_load(&r.uploads_ok), 0);
  ck_assert_int_gt(busy + atomic_load(&r.uploads_refused), 0); /* the races happened */
  tt_device_info *devs = NULL;
  size_t n = 0;
  ck_assert_int_eq(tt_list_devices(c, &devs, &n), TT_OK); /* still serving */
  tt_device_list_free(devs);
  tt_tensor_free(idx), tt_tensor_free(idx_host), tt_tensor_free(table);
  tt_module_free(m);
  tt_disconnect(c);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}
END_TEST

Suite *e2e_concurrent_writes_suite(void) {
  Suite *s = suite_create("e2e_concurrent_writes");
  TCase *tc = tcase_create("upload_execute");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_upload_and_execute_never_overlap);
  suite_add_tcase(s, tc);
  return s;
}
