/* Data-parallel training over MPI (libttparallel): `mpirun -np 2` of tests/mpi/dp_worker
 * (beside TTD_BIN) against two ttd daemons on separate sockets, and against one ttd with
 * --devices 2 (a card per rank). Global batch 32 on 2 ranks ends with the parameters of one
 * process at batch 32, for SGD (momentum) and Adam, over 20 steps; all-reduced bytes per step
 * equal the parameter bytes, in one bucket and in several. A rank killed at step 5 ends the
 * job with its rank named; a rank that stops answering makes the other fail with a bounded
 * wait naming itself and the all-reduce; a rank whose ttd is killed fails naming itself and
 * UNAVAILABLE. mpirun runs over loopback TCP, as root if need be,
 * under coreutils' timeout as the last bound. */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "suites.h"
#include "ttd_harness.h"

static ttd_proc daemon_a, daemon_b;
static char worker[512], dir[64];

/* TTD_BIN with its trailing "ttd" replaced by "dp_worker". */
static void find_worker(void) {
  const char *bin = getenv("TTD_BIN");
  if (!bin) bin = "build/bin/ttd";
  size_t len = strlen(bin);
  ck_assert_msg(len >= 3 && strcmp(bin + len - 3, "ttd") == 0, "TTD_BIN %s does not end in ttd", bin);
  snprintf(worker, sizeof(worker), "%.*sdp_worker", (int)(len - 3), bin);
  ck_assert_msg(access(worker, X_OK) == 0, "no dp_worker at %s", worker);
}

/* Whether process pid's network namespace is another than this process's. */
static int differs_from_mine(pid_t pid) {
  char path[64], mine[64] = "", theirs[64] = "";
  snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)pid);
  ck_assert_int_gt(readlink("/proc/self/ns/net", mine, sizeof(mine) - 1), 0);
  ck_assert_int_gt(readlink(path, theirs, sizeof(theirs) - 1), 0);
  return strcmp(mine, theirs) != 0;
}

static void setup(void) {
  find_worker();
  snprintf(dir, sizeof(dir), "/tmp/ttd-dp-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  /* Two daemons as on two hosts: each in a network namespace of its own when the test may
   * make one (root), reached by its rank through its Unix socket only. */
  ttd_proc_start_isolated(&daemon_a, NULL);
  ttd_proc_start_isolated(&daemon_b, NULL);
  ck_assert_msg(daemon_a.own_netns == differs_from_mine(daemon_a.pid), "daemon a's network namespace");
  ck_assert_msg(daemon_b.own_netns == differs_from_mine(daemon_b.pid), "daemon b's network namespace");

}

static void teardown(void) {
  ck_assert_int_eq(ttd_proc_stop(&daemon_b), 0);
  ck_assert_int_eq(ttd_proc_stop(&daemon_a), 0);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

/* Runs `mpirun -np ranks dp_worker ARGS` (bounded by timeout 60); returns the exit status,
 * its stdout and stderr together in *out (free it), and the seconds it took in *out_s. */
static int mpirun(int ranks, char **out, double *out_s, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int mpirun(int ranks, char **out, double *out_s, const char *fmt, ...) {
  char args[1024], cmd[4096], asan[1024] = "";
  /* Under ASan: full stacks for the leak check (Open MPI's plugins have no frame pointers)
   * and tests/lsan_mpi.supp, which suppresses Open MPI's own leaks in these processes alone. */
  const char *asan_options = getenv("ASAN_OPTIONS"), *tests = getenv("TTD_TESTS_DIR");
  if (asan_options)
    snprintf(asan, sizeof(asan), "ASAN_OPTIONS='%s:fast_unwind_on_malloc=0' LSAN_OPTIONS=suppressions='%s/lsan_mpi.supp' ",
             asan_options, tests ? tests : "tests");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof(args), fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof(cmd),
           "%sOMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
           "timeout 60 mpirun -np %d --mca btl self,tcp --mca btl_tcp_if_include lo '%s' %s 2>&1",
           asan, ranks, worker, args);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t cap = 1 << 16, len = 0;
  char *text = malloc(cap);
  for (size_t n; (n = fread(text + len, 1, cap - len - 1, p)) > 0;) {
    len += n;
    if (cap - len < 1024) text = realloc(text, cap *= 2);
  }
  text[len] = '\0';
  int status = pclose(p);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  *out = text;
  *out_s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  ck_assert_msg(status != -1 && WIFEXITED(status), "mpirun did not exit normally (%d): %s", status, text);
  return WEXITSTATUS(status);
}

/* Every parameter of two checkpoints agrees within float tolerance. */
static void assert_same_params(tt_client *c, const char *a_path, const char *b_path, double tol) {
  tt_safetensors *a = NULL, *b = NULL;
  ck_assert_msg(tt_safetensors_open(c, a_path, &a) == TT_OK, "%s", tt_last_error(c));
  ck_assert_msg(tt_safetensors_open(c, b_path, &b) == TT_OK, "%s", tt_last_error(c));
  ck_assert_int_eq(tt_safetensors_count(a), 4);
  ck_assert_int_eq(tt_safetensors_count(b), 4);
  for (int k = 0; k < tt_safetensors_count(a); k++) {
    const char *name = tt_safetensors_name(a, k);
    tt_tensor *x = tt_safetensors_get(a, name), *y = tt_safetensors_get(b, name);
    ck_assert_ptr_nonnull(x);
    ck_assert_msg(y != NULL, "%s lacks %s", b_path, name);
    ck_assert_uint_eq(tt_tensor_numel(x), tt_tensor_numel(y));
    const float *xv = tt_tensor_data(x), *yv = tt_tensor_data(y);
    for (uint64_t i = 0; i < tt_tensor_numel(x); i++)
      ck_assert_msg(fabsf(xv[i] - yv[i]) <= tol * (1 + fabsf(xv[i])), "%s[%llu]: %g in %s, %g in %s", name,
                    (unsigned long long)i, (double)xv[i], a_path, (double)yv[i], b_path);
    tt_tensor_free(x);
    tt_tensor_free(y);
  }
  tt_safetensors_close(a);
  tt_safetensors_close(b);
}

/* Bytes all-reduced per step equal the parameter bytes on each rank; returns buckets a step. */
static int assert_bytes(const char *out, int rank) {
  char key[32];
  snprintf(key, sizeof(key), "rank %d: bytes per step", rank);
  const char *line = strstr(out, key);
  ck_assert_msg(line != NULL, "no stats of rank %d: %s", rank, out);
  unsigned long long per_step = 0, params = 0, buckets = 0;
  ck_assert_int_eq(sscanf(line + strlen(key), " %llu, parameter bytes %llu, buckets per step %llu", &per_step, &params,
                          &buckets), 3);
  ck_assert_uint_eq(per_step, params);
  ck_assert_uint_eq(params, (64 * 32 + 32 + 32 * 10 + 10) * 4);
  return (int)buckets;
}

/* SGD in one bucket (loop 0), Adam in buckets of 1 KiB (loop 1): 2 ranks on two daemons
 * equal 1 process at the same global batch. */
START_TEST(test_two_daemons_match_one_process) {
  if (_i == 0) {
    printf("e2e_parallel: the daemons %s\n", daemon_a.own_netns ? "run in network namespaces of their own"
                                                              : "share this network namespace (no privilege to make one)");
  }
  const char *opt = _i == 0 ? "sgd" : "adam";
  const char *bucket = _i == 0 ? "0" : "1024";
  char *out = NULL;
  double s = 0;
  int rc = mpirun(2, &out, &s, "--target %s,%s --opt %s --bucket-bytes %s --save %s/two", daemon_a.target,
                  daemon_b.target, opt, bucket, dir);
  ck_assert_msg(rc == 0, "mpirun -np 2 exited %d: %s", rc, out);
  ck_assert_ptr_nonnull(strstr(out, "rank 0 of 2: device tt:0 target "));
  ck_assert_ptr_nonnull(strstr(out, daemon_b.target)); /* rank 1 on the second daemon */
  int buckets = assert_bytes(out, 0);
  ck_assert_int_eq(assert_bytes(out, 1), buckets);
  ck_assert_int_eq(buckets, _i == 0 ? 1 : 4); /* 1 KiB buckets: each parameter alone */
  free(out);
  rc = mpirun(1, &out, &s, "--target %s --opt %s --save %s/one", daemon_a.target, opt, dir);
  ck_assert_msg(rc == 0, "mpirun -np 1 exited %d: %s", rc, out);
  free(out);
  char one[128], r0[128], r1[128];
  snprintf(one, sizeof(one), "%s/one.r0.safetensors", dir);
  snprintf(r0, sizeof(r0), "%s/two.r0.safetensors", dir);
  snprintf(r1, sizeof(r1), "%s/two.r1.safetensors", dir);
  tt_client *c = harness_connect(&daemon_a, 1);
  assert_same_params(c, r0, r1, 0);    /* the ranks agree exactly */
  assert_same_params(c, one, r0, 1e-5); /* and with one process, within float rounding */
  tt_disconnect(c);
}
END_TEST

/* One ttd with --devices 2: the ranks take tt:0 and tt:1, and train as on two daemons. */
START_TEST(test_card_per_rank) {
  ttd_proc multi;
  ttd_proc_start(&multi, (const char *const[]){"--devices", "2", NULL});
  char *out = NULL;
  double s = 0;
  int rc = mpirun(2, &out, &s, "--target %s --save %s/cards", multi.target, dir);
  ck_assert_msg(rc == 0, "mpirun exited %d: %s", rc, out);
  ck_assert_msg(strstr(out, "rank 0 of 2: device tt:0") && strstr(out, "rank 1 of 2: device tt:1"), "%s", out);
  assert_bytes(out, 1);
  free(out);
  char r0[128], r1[128];
  snprintf(r0, sizeof(r0), "%s/cards.r0.safetensors", dir);
  snprintf(r1, sizeof(r1), "%s/cards.r1.safetensors", dir);
  tt_client *c = harness_connect(&multi, 1);
  assert_same_params(c, r0, r1, 0);
  tt_disconnect(c);
  ck_assert_int_eq(ttd_proc_stop(&multi), 0);
}
END_TEST

/* Rank 1 killed at step 5: mpirun ends the job at once (no hang) and names rank 1. */
START_TEST(test_rank_dies) {
  char *out = NULL;
  double s = 0;
  int rc = mpirun(2, &out, &s, "--target %s,%s --die-at 5", daemon_a.target, daemon_b.target);
  ck_assert_msg(rc != 0 && rc != 124, "mpirun exited %d: %s", rc, out);
  ck_assert_msg(strstr(out, "process rank 1") && strstr(out, "signal 9"), "rank 1 not named: %s", out);
  ck_assert_msg(s < 20, "the job took %.1f s to end", s);
  free(out);
}
END_TEST

/* Rank 1 stops answering at step 5: rank 0's all-reduce gives up after its 2 s bound with
 * an error naming rank 0 and the collective, and aborts the job. */
START_TEST(test_rank_stalls) {
  char *out = NULL;
  double s = 0;
  int rc = mpirun(2, &out, &s, "--target %s,%s --stall-at 5 --timeout-ms 2000", daemon_a.target, daemon_b.target);
  ck_assert_msg(rc != 0 && rc != 124, "mpirun exited %d: %s", rc, out);
  ck_assert_msg(strstr(out, "rank 0 of 2: MPI_Iallreduce of bucket 0 did not complete within 2000 ms: rank 1 stopped"),
                "%s", out);
  ck_assert_msg(s < 20, "the job took %.1f s to end", s);
  free(out);
}
END_TEST

/* Rank 1's ttd killed at step 5: rank 1's all-reduce fails naming rank 1, its ttd call and
 * UNAVAILABLE, and the job ends. */
START_TEST(test_daemon_dies) {
  ttd_proc doomed;
  ttd_proc_start(&doomed, NULL);
  char *out = NULL;
  double s = 0;
  int rc = mpirun(2, &out, &s, "--target %s,%s --kill-daemon-at 5 --daemon-pid %d", daemon_a.target, doomed.target,
                  (int)doomed.pid);
  ttd_proc_kill(&doomed, SIGKILL); /* reaps it */
  ttd_proc_stop(&doomed);          /* removes its folder */
  ck_assert_msg(rc != 0 && rc != 124, "mpirun exited %d: %s", rc, out);
  ck_assert_msg(strstr(out, "dp_worker: rank 1: averaging the gradients failed: rank 1 of 2: ") &&
                strstr(out, "UNAVAILABLE"), "%s", out);
  ck_assert_msg(s < 20, "the job took %.1f s to end", s);
  free(out);
}
END_TEST

Suite *e2e_parallel_suite(void) {
  Suite *s = suite_create("e2e_parallel");
  TCase *tc = tcase_create("mpirun");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 90);
  tcase_add_loop_test(tc, test_two_daemons_match_one_process, 0, 2);
  tcase_add_test(tc, test_card_per_rank);
  tcase_add_test(tc, test_rank_dies);
  tcase_add_test(tc, test_rank_stalls);
  tcase_add_test(tc, test_daemon_dies);
  suite_add_tcase(s, tc);
  return s;
}
