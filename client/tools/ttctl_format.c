/* ttctl's output helpers: binary sizes, short durations, memory bars, aligned tables, JSON. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ttctl.h"

void ttctl_format_size(uint64_t bytes, char *buf, size_t size) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) {
    snprintf(buf, size, "%" PRIu64 " B", bytes);
    return;
  }
  double v = (double)bytes;
  int unit = -1;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    unit++;
  }
  snprintf(buf, size, "%.2f %s", v, units[unit]);
}

void ttctl_format_duration(uint64_t ms, char *buf, size_t size) {
  uint64_t s = ms / 1000;
  if (s < 60) {
    snprintf(buf, size, "%" PRIu64 "s", s);
  } else if (s < 3600) {
    snprintf(buf, size, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
  } else if (s < 86400) {
    snprintf(buf, size, "%" PRIu64 "h%02" PRIu64 "m", s / 3600, s / 60 % 60);
  } else {
    snprintf(buf, size, "%" PRIu64 "d%02" PRIu64 "h", s / 86400, s / 3600 % 24);
  }
}

void ttctl_format_bar(uint64_t used, uint64_t capacity, char *buf, size_t size) {
  enum { CELLS = 20 };
  double fraction = capacity ? (double)used / (double)capacity : 0.0;
  if (fraction > 1.0) fraction = 1.0;
  int filled = (int)(fraction * CELLS + 0.5);
  if (used > 0 && filled == 0) filled = 1;
  char cells[CELLS + 1];
  for (int i = 0; i < CELLS; i++) cells[i] = i < filled ? '#' : '.';
  cells[CELLS] = '\0';
  snprintf(buf, size, "[%s] %5.1f%%", cells, fraction * 100.0);
}

struct ttctl_table {
  int ncols;
  int *right;
  char **cells; /* rows * ncols strings, row 0 the header */
  size_t rows, capacity;
};

ttctl_table *ttctl_table_create(int ncols, const char *const *headers, const int *right) {
  ttctl_table *t = calloc(1, sizeof(*t));
  if (!t) return NULL;
  t->ncols = ncols;
  t->right = calloc((size_t)ncols, sizeof(*t->right));
  if (!t->right || ttctl_table_add(t, headers) != 0) {
    ttctl_table_free(t);
    return NULL;
  }
  memcpy(t->right, right, (size_t)ncols * sizeof(*right));
  return t;
}

int ttctl_table_add(ttctl_table *table, const char *const *cells) {
  if (table->rows == table->capacity) {
    size_t grown = table->capacity ? 2 * table->capacity : 8;
    char **more = realloc(table->cells, grown * (size_t)table->ncols * sizeof(*more));
    if (!more) return -1;
    table->cells = more;
    table->capacity = grown;
  }
  char **row = table->cells + table->rows * (size_t)table->ncols;
  for (int c = 0; c < table->ncols; c++) {
    row[c] = strdup(cells[c]);
    if (!row[c]) {
      while (c-- > 0) free(row[c]);
      return -1;
    }
  }
  table->rows++;
  return 0;
}

void ttctl_table_print(const ttctl_table *table) {
  size_t width[64] = {0};
  int ncols = table->ncols < 64 ? table->ncols : 64;
  for (size_t r = 0; r < table->rows; r++) {
    for (int c = 0; c < ncols; c++) {
      size_t len = strlen(table->cells[r * (size_t)table->ncols + c]);
      if (len > width[c]) width[c] = len;
    }
  }
  for (size_t r = 0; r < table->rows; r++) {
    char line[4096];
    size_t used = 0;
    for (int c = 0; c < ncols && used < sizeof(line); c++) {
      const char *cell = table->cells[r * (size_t)table->ncols + c];
      int n = snprintf(line + used, sizeof(line) - used, "%s%*s", c ? "  " : "", table->right[c] ? (int)width[c] : -(int)width[c], cell);
      if (n < 0) break;
      used += (size_t)n;
    }
    if (used >= sizeof(line)) used = sizeof(line) - 1;
    while (used > 0 && line[used - 1] == ' ') used--;
    printf("%.*s\n", (int)used, line);
  }
}

void ttctl_table_free(ttctl_table *table) {
  if (!table) return;
  for (size_t i = 0; i < table->rows * (size_t)table->ncols; i++) free(table->cells[i]);
  free(table->cells);
  free(table->right);
  free(table);
}

int ttctl_print_json(json_t *value) {
  if (!value) {
    fprintf(stderr, "ttctl: INTERNAL: the answer could not be encoded as JSON (out of memory, or a name "
                    "that is not UTF-8)\n");
    return TTCTL_FAILED;
  }
  int rc = json_dumpf(value, stdout, JSON_INDENT(2)) == 0 ? TTCTL_OK : TTCTL_FAILED;
  json_decref(value);
  if (rc != TTCTL_OK || fputc('\n', stdout) == EOF) {
    fprintf(stderr, "ttctl: cannot write to stdout\n");
    return TTCTL_FAILED;
  }
  return TTCTL_OK;
}
