/* client/optim/progress.c: plain lines at each 10% with percent, steps, rate, loss and time left,
 * and a final 100% line; terminal style redraws one line with '\r' and a bar, throttled;
 * NULL handling, clamping and an unknown total. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ttclient.h"
#include "suites.h"

#define MAX_LINES 64

/* All that was written to f, as a string (free it). */
static char *read_all(FILE *f) {
  ck_assert_int_eq(fflush(f), 0);
  long n = ftell(f);
  ck_assert_int_ge(n, 0);
  rewind(f);
  char *s = calloc((size_t)n + 1, 1);
  ck_assert_ptr_nonnull(s);
  ck_assert_uint_eq(fread(s, 1, (size_t)n, f), (size_t)n);
  return s;
}

/* Splits text at '\n' in place; every line must end with one. Returns the line count. */
static int split_lines(char *text, char **lines) {
  int n = 0;
  char *p = text;
  while (*p) {
    char *nl = strchr(p, '\n');
    ck_assert_msg(nl != NULL, "unterminated line \"%s\"", p);
    ck_assert_int_lt(n, MAX_LINES);
    *nl = '\0';
    lines[n++] = p;
    p = nl + 1;
  }
  return n;
}

static int count_char(const char *s, char c) {
  int n = 0;
  for (; *s; s++) n += *s == c;
  return n;
}

static double seconds_since(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* 100 steps in plain mode: exactly 9 lines at 10%..90% with matching steps, rate, loss and
 * time left, then "100% 100/100 steps in ..." with the last loss; no '\r'. */
START_TEST(test_plain_lines) {
  FILE *f = tmpfile();
  ck_assert_ptr_nonnull(f);
  tt_progress *p = tt_progress_start("epoch 1/5", 100, f, 0);
  ck_assert_ptr_nonnull(p);
  for (int i = 1; i <= 100; i++) tt_progress_update(p, i, 1.0 / i);
  tt_progress_finish(p);
  char *text = read_all(f);
  ck_assert_ptr_null(strchr(text, '\r'));
  char *lines[MAX_LINES];
  int n = split_lines(text, lines);
  ck_assert_int_eq(n, 10);
  for (int k = 0; k < 9; k++) {
    int pct = 0;
    long long done = 0, total = 0;
    double rate = 0, loss = 0, left = 0;
    int got = sscanf(lines[k], "epoch 1/5: %d%% %lld/%lld steps, %lf steps/s, loss %lf, %lf s left", &pct, &done,
                     &total, &rate, &loss, &left);
    ck_assert_msg(got == 6, "line \"%s\" parsed %d fields", lines[k], got);
    ck_assert_int_eq(pct, (k + 1) * 10);
    ck_assert_int_eq(done, (k + 1) * 10);
    ck_assert_int_eq(total, 100);
    ck_assert_double_gt(rate, 0);
    ck_assert_double_eq_tol(loss, 1.0 / done, 0.00005);
    ck_assert_double_ge(left, 0);
  }
  int pct = 0;
  long long done = 0, total = 0;
  double secs = -1, loss = 0;
  int got = sscanf(lines[9], "epoch 1/5: %d%% %lld/%lld steps in %lf s, %*f steps/s, loss %lf", &pct, &done, &total,
                   &secs, &loss);
  ck_assert_msg(got == 5, "final line \"%s\" parsed %d fields", lines[9], got);
  ck_assert_int_eq(pct, 100);
  ck_assert_int_eq(done, 100);
  ck_assert_int_eq(total, 100);
  ck_assert_double_ge(secs, 0);
  ck_assert_double_lt(secs, 10);
  ck_assert_double_eq_tol(loss, 0.01, 0.00005);
  ck_assert_ptr_nonnull(strstr(lines[9], "loss 0.0100"));
  ck_assert_ptr_null(strstr(lines[9], "left"));
  free(text);
  fclose(f);
}
END_TEST

/* The brief's shape, 938 steps: 9 to 10 lines, percents rising, each the floor of done/total,
 * the first at or past 10%, and the last 100%. */
START_TEST(test_plain_938) {
  FILE *f = tmpfile();
  ck_assert_ptr_nonnull(f);
  tt_progress *p = tt_progress_start("train", 938, f, 0);
  for (int i = 1; i <= 938; i++) tt_progress_update(p, i, 0.5);
  tt_progress_finish(p);
  char *text = read_all(f);
  char *lines[MAX_LINES];
  int n = split_lines(text, lines);
  ck_assert_int_ge(n, 9);
  ck_assert_int_le(n, 11);
  int prev = 0;
  for (int k = 0; k < n; k++) {
    int pct = 0;
    long long done = 0, total = 0;
    ck_assert_int_eq(sscanf(lines[k], "train: %d%% %lld/%lld steps", &pct, &done, &total), 3);
    ck_assert_int_eq(total, 938);
    ck_assert_int_eq(pct, (int)(done * 100 / 938));
    ck_assert_int_gt(pct, prev);
    ck_assert_ptr_nonnull(strstr(lines[k], "loss 0.5000"));
    prev = pct;
  }
  ck_assert_int_ge(atoi(lines[0] + strlen("train: ")), 10);
  ck_assert_int_eq(prev, 100);
  ck_assert_ptr_nonnull(strstr(lines[n - 1], "100% 938/938 steps in "));
  free(text);
  fclose(f);
}
END_TEST

/* Jumps print one line per update that passes a new 10% mark, not one per mark skipped;
 * an update at 100% prints nothing (the final line does). */
START_TEST(test_plain_jumps) {
  FILE *f = tmpfile();
  tt_progress *p = tt_progress_start("job", 1000, f, 0);
  tt_progress_update(p, 0, 2.0);
  tt_progress_update(p, 350, 1.5);
  tt_progress_update(p, 351, 1.4);
  tt_progress_update(p, 999, 1.0);
  tt_progress_update(p, 1000, 0.9);
  tt_progress_finish(p);
  char *text = read_all(f);
  char *lines[MAX_LINES];
  ck_assert_int_eq(split_lines(text, lines), 3);
  ck_assert_ptr_nonnull(strstr(lines[0], "job: 35% 350/1000 steps, "));
  ck_assert_ptr_nonnull(strstr(lines[0], "loss 1.5000"));
  ck_assert_ptr_nonnull(strstr(lines[1], "job: 99% 999/1000 steps, "));
  ck_assert_ptr_nonnull(strstr(lines[1], "loss 1.0000"));
  ck_assert_ptr_nonnull(strstr(lines[2], "job: 100% 1000/1000 steps in "));
  ck_assert_ptr_nonnull(strstr(lines[2], "loss 0.9000"));
  free(text);
  fclose(f);
}
END_TEST

/* NAN means no loss: none is shown until one is given, then the last one stays. */
START_TEST(test_plain_nan_loss) {
  FILE *f = tmpfile();
  tt_progress *p = tt_progress_start("x", 10, f, 0);
  tt_progress_update(p, 1, NAN);
  tt_progress_update(p, 2, 0.25);
  tt_progress_update(p, 3, NAN);
  tt_progress_update(p, 10, NAN);
  tt_progress_finish(p);
  char *text = read_all(f);
  char *lines[MAX_LINES];
  ck_assert_int_eq(split_lines(text, lines), 4);
  ck_assert_ptr_null(strstr(lines[0], "loss"));
  ck_assert_ptr_nonnull(strstr(lines[1], "x: 20% 2/10 steps"));
  ck_assert_ptr_nonnull(strstr(lines[1], "loss 0.2500"));
  ck_assert_ptr_nonnull(strstr(lines[2], "loss 0.2500"));
  ck_assert_ptr_nonnull(strstr(lines[3], "loss 0.2500"));
  ck_assert_ptr_null(strstr(text, "nan"));
  free(text);
  fclose(f);
}
END_TEST

/* Steps/s and time left follow the real pace: at 10 of 20 steps taken ~10 ms apart, the
 * rate is 10 / elapsed and the time left the elapsed time again, within rounding, with
 * elapsed bracketed by clock readings around start and update. */
START_TEST(test_plain_rate_and_left) {
  FILE *f = tmpfile();
  struct timespec before_start, after_start;
  clock_gettime(CLOCK_MONOTONIC, &before_start);
  tt_progress *p = tt_progress_start("r", 20, f, 0);
  clock_gettime(CLOCK_MONOTONIC, &after_start);
  double lo = 0, hi = 0; /* bounds of the elapsed time the 10th update sees */
  for (int i = 1; i <= 10; i++) {
    sleep_ms(10);
    if (i == 10) lo = seconds_since(&after_start);
    tt_progress_update(p, i, 1.0);
    if (i == 10) hi = seconds_since(&before_start);
  }
  tt_progress_finish(p);
  char *text = read_all(f);
  char *lines[MAX_LINES];
  int n = split_lines(text, lines);
  ck_assert_int_eq(n, 6); /* 10% .. 50% and the final line */
  double rate = 0, left = 0;
  ck_assert_int_eq(sscanf(lines[4], "r: 50%% 10/20 steps, %lf steps/s, loss 1.0000, %lf s left", &rate, &left), 2);
  ck_assert_double_ge(lo, 0.1);
  ck_assert_double_ge(rate, 10.0 / hi * 0.99 - 0.01);
  ck_assert_double_le(rate, 10.0 / lo * 1.01 + 0.01);
  ck_assert_double_ge(left, lo - 0.06);
  ck_assert_double_le(left, hi + 0.06);
  ck_assert_ptr_nonnull(strstr(lines[5], "r: 50% 10/20 steps in "));
  free(text);
  fclose(f);
}
END_TEST

/* Forced terminal style: '\r' redraws, a bar "[####....]" matching the percent, no newline
 * until the final line, which shows a full bar and 100%. */
START_TEST(test_tty_forced) {
  FILE *f = tmpfile();
  tt_progress *p = tt_progress_start("epoch 2/5", 100, f, 1);
  ck_assert_ptr_nonnull(p);
  sleep_ms(120);
  tt_progress_update(p, 50, 0.75);
  sleep_ms(120);
  tt_progress_update(p, 100, 0.5);
  tt_progress_finish(p);
  char *text = read_all(f);
  ck_assert_int_ge(count_char(text, '\r'), 3);
  ck_assert_int_eq(count_char(text, '\n'), 1);
  ck_assert_int_eq(text[strlen(text) - 1], '\n');
  ck_assert_int_eq(text[0], '\r');
  ck_assert_ptr_nonnull(strstr(text, "\repoch 2/5 [........................]   0% 0/100"));
  ck_assert_ptr_nonnull(strstr(text, "\repoch 2/5 [############............]  50% 50/100, "));
  ck_assert_ptr_nonnull(strstr(text, "loss 0.7500"));
  ck_assert_ptr_nonnull(strstr(text, " left"));
  const char *last = strrchr(text, '\r');
  ck_assert_ptr_nonnull(strstr(last, "[########################] 100% 100/100 in "));
  ck_assert_ptr_nonnull(strstr(last, "loss 0.5000"));
  free(text);
  fclose(f);
}
END_TEST

/* Terminal redraws are throttled to about 10/s however often update is called. */
START_TEST(test_tty_throttled) {
  FILE *f = tmpfile();
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  tt_progress *p = tt_progress_start("fast", 300000, f, 1);
  for (int i = 1; i <= 300000; i++) tt_progress_update(p, i, 1.0);
  tt_progress_finish(p);
  double elapsed = seconds_since(&t0);
  char *text = read_all(f);
  int redraws = count_char(text, '\r');
  ck_assert_int_ge(redraws, 2); /* the first draw and the final line */
  ck_assert_int_le(redraws, 3 + (int)(elapsed * 10));
  free(text);
  fclose(f);
}
END_TEST

/* A shorter redraw blanks what is left of the longer line before it. */
START_TEST(test_tty_blanks_leftovers) {
  FILE *f = tmpfile();
  tt_progress *p = tt_progress_start("b", 10, f, 1);
  sleep_ms(120);
  tt_progress_update(p, 1, 1e30); /* a very long loss */
  sleep_ms(120);
  tt_progress_update(p, 2, 1.0);
  char *text = read_all(f);
  char *first = strchr(text + 1, '\r');
  ck_assert_ptr_nonnull(first);
  char *second = strchr(first + 1, '\r');
  ck_assert_ptr_nonnull(second);
  ck_assert_uint_ge(strlen(second), (size_t)(second - first));
  ck_assert_ptr_nonnull(strstr(second, "loss 1.0000"));
  ck_assert_int_eq(second[strlen(second) - 1], ' ');
  tt_progress_finish(p);
  free(text);
  fclose(f);
}
END_TEST

/* Auto mode on a file that is no terminal writes plain lines. */
START_TEST(test_auto_on_file_is_plain) {
  FILE *f = tmpfile();
  tt_progress *p = tt_progress_start("auto", 10, f, -1);
  for (int i = 1; i <= 10; i++) tt_progress_update(p, i, 0.1);
  tt_progress_finish(p);
  char *text = read_all(f);
  ck_assert_ptr_null(strchr(text, '\r'));
  ck_assert_ptr_null(strchr(text, '['));
  char *lines[MAX_LINES];
  ck_assert_int_eq(split_lines(text, lines), 10);
  ck_assert_ptr_nonnull(strstr(lines[9], "auto: 100% 10/10 steps in "));
  free(text);
  fclose(f);
}
END_TEST

/* done is clamped to 0..total; a finish before total reports the real percent; NULL label
 * drops the prefix. */
START_TEST(test_clamp_and_early_finish) {
  FILE *f = tmpfile();
  tt_progress *p = tt_progress_start(NULL, 50, f, 0);
  tt_progress_update(p, -5, 1.0);
  tt_progress_update(p, 500, 1.0);
  tt_progress_finish(p);
  char *text = read_all(f);
  char *lines[MAX_LINES];
  ck_assert_int_eq(split_lines(text, lines), 1);
  ck_assert_ptr_eq(strstr(lines[0], "100% 50/50 steps in "), lines[0]);
  free(text);
  fclose(f);

  f = tmpfile();
  p = tt_progress_start("stop", 50, f, 0);
  tt_progress_update(p, 20, 1.0);
  tt_progress_finish(p);
  text = read_all(f);
  ck_assert_int_eq(split_lines(text, lines), 2);
  ck_assert_ptr_nonnull(strstr(lines[0], "stop: 40% 20/50 steps, "));
  ck_assert_ptr_nonnull(strstr(lines[1], "stop: 40% 20/50 steps in "));
  free(text);
  fclose(f);
}
END_TEST

/* An unknown total (0) shows steps without percent or time left: no plain lines until the
 * final one. */
START_TEST(test_unknown_total) {
  FILE *f = tmpfile();
  tt_progress *p = tt_progress_start("n", 0, f, 0);
  for (int i = 1; i <= 7; i++) tt_progress_update(p, i, 0.125);
  tt_progress_finish(p);
  char *text = read_all(f);
  char *lines[MAX_LINES];
  ck_assert_int_eq(split_lines(text, lines), 1);
  ck_assert_ptr_nonnull(strstr(lines[0], "n: 7 steps in "));
  ck_assert_ptr_nonnull(strstr(lines[0], "loss 0.1250"));
  ck_assert_ptr_null(strchr(lines[0], '%'));
  ck_assert_ptr_null(strstr(lines[0], "left"));
  free(text);
  fclose(f);
}
END_TEST

/* update and finish accept NULL. */
START_TEST(test_null_progress) {
  tt_progress_update(NULL, 3, 1.0);
  tt_progress_finish(NULL);
  ck_assert_int_eq(1, 1);
}
END_TEST

Suite *progress_suite(void) {
  Suite *s = suite_create("progress");
  TCase *tc = tcase_create("plain");
  tcase_add_test(tc, test_plain_lines);
  tcase_add_test(tc, test_plain_938);
  tcase_add_test(tc, test_plain_jumps);
  tcase_add_test(tc, test_plain_nan_loss);
  tcase_add_test(tc, test_plain_rate_and_left);
  tcase_add_test(tc, test_auto_on_file_is_plain);
  tcase_add_test(tc, test_clamp_and_early_finish);
  tcase_add_test(tc, test_unknown_total);
  tcase_add_test(tc, test_null_progress);
  suite_add_tcase(s, tc);

  tc = tcase_create("terminal");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_tty_forced);
  tcase_add_test(tc, test_tty_throttled);
  tcase_add_test(tc, test_tty_blanks_leftovers);
  suite_add_tcase(s, tc);
  return s;
}
