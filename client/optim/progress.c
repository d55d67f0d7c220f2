/* Training progress output: tt_progress_start, tt_progress_update, tt_progress_finish.
 * A terminal gets one line redrawn in place (throttled to ~10/s); a file or pipe gets a
 * plain line at each further 10%, so logs stay short. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ttclient.h"

#define BAR_WIDTH 24
#define REDRAW_SECONDS 0.1
#define PROGRESS_LINE_MAX 512

struct tt_progress {
  char *label;       /* "" for none */
  int64_t total;     /* <= 0: unknown */
  FILE *out;
  int tty;
  double start;      /* seconds, monotonic */
  double last_draw;  /* terminal: when the line was last drawn; < 0 never */
  int last_decile;   /* plain: the last 10% mark printed */
  size_t drawn_len;  /* terminal: length of the line on screen, to blank leftovers */
  int64_t done;
  double loss;
  int has_loss;
};

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Appends formatted text to line (PROGRESS_LINE_MAX bytes), which stays terminated when full. */
static void append(char *line, size_t *len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void append(char *line, size_t *len, const char *fmt, ...) {
  if (*len >= PROGRESS_LINE_MAX - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line + *len, PROGRESS_LINE_MAX - *len, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  *len += (size_t)n < PROGRESS_LINE_MAX - *len ? (size_t)n : PROGRESS_LINE_MAX - 1 - *len;
}

/* "1.6 s", "2m 05s", "1h 07m". */
static void append_duration(char *line, size_t *len, double seconds) {
  if (!(seconds >= 0)) seconds = 0;
  if (seconds < 59.95) {
    append(line, len, "%.1f s", seconds);
  } else if (seconds < 3600) {
    long s = lround(seconds);
    append(line, len, "%ldm %02lds", s / 60, s % 60);
  } else {
    long m = lround(seconds / 60);
    append(line, len, "%ldh %02ldm", m / 60, m % 60);
  }
}

/* Steps per second with about three significant digits: "412", "37.5", "0.83". */
static void append_rate(char *line, size_t *len, double rate) {
  if (rate >= 99.5) append(line, len, "%.0f steps/s", rate);
  else if (rate >= 9.95) append(line, len, "%.1f steps/s", rate);
  else append(line, len, "%.2f steps/s", rate);
}

static int percent_of(const tt_progress *p) { return (int)((double)p->done * 100.0 / (double)p->total); }

/* The line for the current state; final: the closing line with the total time. */
static size_t format_line(const tt_progress *p, double now, int final, char *line) {
  size_t len = 0;
  line[0] = '\0';
  double elapsed = now - p->start;
  double rate = elapsed > 0 ? (double)p->done / elapsed : 0;
  int known = p->total > 0;
  if (p->tty) {
    if (*p->label) append(line, &len, "%s ", p->label);
    if (known) {
      int filled = (int)((double)p->done * BAR_WIDTH / (double)p->total);
      char bar[BAR_WIDTH + 1];
      for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < filled ? '#' : '.';
      bar[BAR_WIDTH] = '\0';
      append(line, &len, "[%s] %3d%% %lld/%lld", bar, percent_of(p), (long long)p->done, (long long)p->total);
    } else {
      append(line, &len, "%lld steps", (long long)p->done);
    }
  } else {
    if (*p->label) append(line, &len, "%s: ", p->label);
    if (known) append(line, &len, "%d%% %lld/%lld steps", percent_of(p), (long long)p->done, (long long)p->total);
    else append(line, &len, "%lld steps", (long long)p->done);
  }
  if (final) {
    append(line, &len, " in ");
    append_duration(line, &len, elapsed);
  }
  if (rate > 0) {
    append(line, &len, ", ");
    append_rate(line, &len, rate);
  }
  if (p->has_loss) append(line, &len, ", loss %.4f", p->loss);
  if (!final && known && rate > 0) {
    append(line, &len, ", ");
    append_duration(line, &len, (double)(p->total - p->done) / rate);
    append(line, &len, " left");
  }
  return len;
}

/* Terminal: back to the start of the line, the new text, blanks over what is left of the old. */
static void draw_tty(tt_progress *p, const char *line, size_t len, const char *end) {
  int pad = p->drawn_len > len ? (int)(p->drawn_len - len) : 0;
  fprintf(p->out, "\r%s%*s%s", line, pad, "", end);
  p->drawn_len = len;
  fflush(p->out);
}

tt_progress *tt_progress_start(const char *label, int64_t total, FILE *out, int force_tty) {
  tt_progress *p = calloc(1, sizeof(*p));
  if (!p) return NULL;
  p->label = strdup(label ? label : "");
  if (!p->label) {
    free(p);
    return NULL;
  }
  p->out = out ? out : stderr;
  if (force_tty < 0) {
    const char *term = getenv("TERM");
    p->tty = isatty(fileno(p->out)) && !(term && strcmp(term, "dumb") == 0);
  } else {
    p->tty = force_tty != 0;
  }
  p->total = total > 0 ? total : 0;
  p->start = now_seconds();
  p->last_draw = -1;
  if (p->tty) {
    char line[PROGRESS_LINE_MAX];
    size_t len = format_line(p, p->start, 0, line);
    draw_tty(p, line, len, "");
    p->last_draw = p->start;
  }
  return p;
}

void tt_progress_update(tt_progress *p, int64_t done, double loss) {
  if (!p) return;
  if (done < 0) done = 0;
  if (p->total > 0 && done > p->total) done = p->total;
  p->done = done;
  if (!isnan(loss)) {
    p->loss = loss;
    p->has_loss = 1;
  }
  double now = now_seconds();
  char line[PROGRESS_LINE_MAX];
  if (p->tty) {
    if (p->last_draw >= 0 && now - p->last_draw < REDRAW_SECONDS) return;
    size_t len = format_line(p, now, 0, line);
    draw_tty(p, line, len, "");
    p->last_draw = now;
    return;
  }
  if (p->total <= 0) return;
  int decile = (int)((double)done * 10.0 / (double)p->total);
  if (decile <= p->last_decile || decile >= 10) return; /* 100% is the final line's */
  p->last_decile = decile;
  format_line(p, now, 0, line);
  fprintf(p->out, "%s\n", line);
  fflush(p->out);
}

void tt_progress_finish(tt_progress *p) {
  if (!p) return;
  char line[PROGRESS_LINE_MAX];
  size_t len = format_line(p, now_seconds(), 1, line);
  if (p->tty) {
    draw_tty(p, line, len, "\n");
  } else {
    fprintf(p->out, "%s\n", line);
    fflush(p->out);
  }
  free(p->label);
  free(p);
}
