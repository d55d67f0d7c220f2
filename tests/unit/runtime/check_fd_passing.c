/* daemon/runtime/wire/fd_passing.c: a message and its descriptors across a Unix socket pair,
 * with signals whose handlers do not restart system calls arriving while a side waits: the
 * wait goes on, and the reply read is the one sent (a side that took EINTR for a failure
 * would leave the reply for the next request to read as its own). */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "suites.h"
#include "wire/fd_passing.h"

static volatile sig_atomic_t signals;

static void on_alarm(int sig) {
  (void)sig;
  signals++;
}

/* Sends "late" and a descriptor on the socket after 60 ms, while the main thread waits. */
static void *late_sender(void *arg) {
  int sock = *(int *)arg;
  struct timespec t = {0, 60 * 1000 * 1000};
  nanosleep(&t, NULL);
  int fds[1] = {STDIN_FILENO};
  ck_assert_int_eq(ttd_send_fds(sock, "late", 5, fds, 1), 5);
  return NULL;
}

START_TEST(test_wait_outlasts_signals) {
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  struct sigaction sa = {.sa_handler = on_alarm}, old;
  sigemptyset(&sa.sa_mask); /* no SA_RESTART: recvmsg returns EINTR at each signal */
  ck_assert_int_eq(sigaction(SIGALRM, &sa, &old), 0);
  struct itimerval every_5ms = {{0, 5000}, {0, 5000}}, off = {{0, 0}, {0, 0}};
  signals = 0;
  ck_assert_int_eq(setitimer(ITIMER_REAL, &every_5ms, NULL), 0);
  pthread_t thread;
  ck_assert_int_eq(pthread_create(&thread, NULL, late_sender, &sv[1]), 0);
  char buf[16] = {0};
  int fds[2], nfds = 0;
  bool truncated = true;
  ssize_t n = ttd_recv_fds(sv[0], buf, sizeof(buf), 0, fds, 2, &nfds, &truncated);
  setitimer(ITIMER_REAL, &off, NULL);
  sigaction(SIGALRM, &old, NULL);
  pthread_join(thread, NULL);
  ck_assert_int_gt(signals, 3); /* the wait took signals, and went on */
  ck_assert_int_eq(n, 5);
  ck_assert_str_eq(buf, "late");
  ck_assert_int_eq(nfds, 1);
  ck_assert(!truncated);
  close(fds[0]);
  close(sv[0]);
  close(sv[1]);
}
END_TEST

Suite *fd_passing_suite(void) {
  Suite *s = suite_create("fd_passing");
  TCase *tc = tcase_create("signals");
  tcase_add_test(tc, test_wait_outlasts_signals);
  suite_add_tcase(s, tc);
  return s;
}
