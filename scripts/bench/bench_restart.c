/* restart_resume_1GiB: what a graceful restart of ttd costs a session holding 1 GiB on the
 * card, in seconds from SIGTERM to the first answered call of the resumed session (the old
 * ttd drains and writes the state, a new one reads it back, libttclient resumes the
 * session), against writing 1 GiB with `dd conv=fsync` and reading it back with dd, on the
 * same disk. The state folder and dd's file sit in --dir (default: BUILD/bench), not /tmp,
 * which may be memory. Both write over blocks they already hold: ttd's save writes over the
 * resumed session's data file of the restart before, and dd over its file of the untimed
 * first round (conv=notrunc), so that neither lands on blocks the other just freed, whose
 * cost on a disk that trims them depends on how long ago that was. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "ttclient.h"

#define GIB (1ull << 30)
#define TENSORS 4 /* 256 MiB each */

static pid_t start_ttd(const char *bin, const char *sock, const char *state, const char *log) {
  pid_t pid = fork();
  if (pid < 0) bench_die("fork", strerror(errno));
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) dup2(fd, 2);
    char listen[300];
    snprintf(listen, sizeof(listen), "unix:%s", sock);
    execl(bin, "ttd", "--listen", listen, "--admin", "off", "--state-dir", state, "--log-level", "info", (char *)NULL);
    _exit(127);
  }
  return pid;
}

static void stop_ttd(pid_t pid) {
  kill(pid, SIGTERM);
  int status;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    bench_die("ttd stop", "ttd did not exit 0 on SIGTERM");
  }
}

static double run_shell(const char *cmd) {
  double t0 = bench_now();
  if (system(cmd) != 0) bench_die("dd", cmd);
  return bench_now() - t0;
}

int main(int argc, char **argv) {
  const char *bin = "build/bin/ttd", *dir = "build/bench";
  int keep = getenv("BENCH_KEEP") != NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--ttd") == 0) bin = argv[i + 1];
    else if (strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
  }
  char work[256], sock[300], state[300], log[300], ref[300];
  snprintf(work, sizeof(work), "%s/restart-XXXXXX", dir);
  mkdir(dir, 0755);
  if (!mkdtemp(work)) bench_die("mkdtemp", strerror(errno));
  snprintf(sock, sizeof(sock), "%s/ttd.sock", work);
  snprintf(state, sizeof(state), "%s/state", work);
  snprintf(log, sizeof(log), "%s/ttd.log", work);
  snprintf(ref, sizeof(ref), "%s/dd.bin", work);
  pid_t pid = start_ttd(bin, sock, state, log);
  for (int i = 0; i < 500 && access(sock, F_OK) != 0; i++) usleep(10000);

  char target[320];
  snprintf(target, sizeof(target), "unix:%s", sock);
  tt_client *c = NULL;
  if (tt_connect(target, NULL, &c) != TT_OK) bench_die("connect", tt_last_error(c));
  int64_t n = (int64_t)(GIB / TENSORS / sizeof(float));
  tt_tensor *host = tt_tensor_from_host(c, NULL, TT_FLOAT32, &n, 1);
  if (!host) bench_die("host tensor", tt_last_error(c));
  unsigned long long rng = 1;
  bench_fill_random(tt_tensor_data(host), (size_t)n, &rng);
  tt_tensor *dev[TENSORS];
  for (int i = 0; i < TENSORS; i++) {
    dev[i] = tt_to(host, "tt");
    if (!dev[i]) bench_die("upload", tt_last_error(c));
  }
  float probe = 0;
  int64_t one = 1;
  tt_tensor *small_host = tt_tensor_from_host(c, &probe, TT_FLOAT32, &one, 1);
  tt_tensor *small = tt_to(small_host, "tt");

  int reps = bench_reps(7);
  double ours[99], refs[99];
  char cmd[1400];
  /* The same bytes through the disk: written and synced, then read back. */
  snprintf(cmd, sizeof(cmd), "dd if=/dev/zero of='%s' bs=1M count=1024 conv=fsync,notrunc status=none && "
           "dd if='%s' of=/dev/null bs=1M status=none", ref, ref);
  for (int r = -1; r < reps; r++) { /* r = -1: untimed, as the other benches' warm-up steps */
    /* This guest's disk runs in phases: the two take turns going first, and each starts with
     * nothing of the other's left to write back. */
    double took = 0, ref_took = 0;
    for (int turn = 0; turn < 2; turn++) {
      sync();
      if ((turn == 0) == (r % 2 != 0)) {
        ref_took = run_shell(cmd);
        continue;
      }
      double t0 = bench_now();
      stop_ttd(pid);
      pid = start_ttd(bin, sock, state, log);
      tt_tensor *back = tt_to(small, "cpu"); /* waits for ttd, resumes the session, downloads */
      took = bench_now() - t0;
      if (!back) bench_die("resume", tt_last_error(c));
      tt_tensor_free(back);
    }
    bench_log("restart %d%s: %.3f s; dd write+read %.3f s", r, r < 0 ? " (untimed)" : "", took, ref_took);
    if (r < 0) continue;
    ours[r] = took;
    refs[r] = ref_took;
  }
  /* The data came back whole. */
  tt_tensor *check = tt_to(dev[TENSORS - 1], "cpu");
  if (!check || memcmp(tt_tensor_data(check), tt_tensor_data(host), (size_t)n * sizeof(float)) != 0) {
    bench_die("resume", "the tensor read back differs from the one uploaded");
  }
  tt_tensor_free(check);
  unlink(ref);
  bench_record("restart_resume_1GiB", bench_median(ours, reps), bench_median(refs, reps), "s", "lower");
  for (int i = 0; i < TENSORS; i++) tt_tensor_free(dev[i]);
  tt_tensor_free(small);
  tt_tensor_free(small_host);
  tt_tensor_free(host);
  tt_disconnect(c);
  stop_ttd(pid);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", work);
  if (!keep && system(cmd) != 0) bench_log("could not remove %s", work);
  return 0;
}
