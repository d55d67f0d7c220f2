/* ttctl's commands that talk to a daemon: status, sessions, kill, ping.
 *
 * Session lists leave out ttctl's own session (the one it opened to ask): an operator wants
 * to see the training processes, not the tool looking at them. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ttctl.h"

/* key: value into object, stealing value (NULL is out of memory). json_object_set_new frees
 * value on any failure, a NULL object included, so calls chain with | and leak nothing. */
static int set(json_t *object, const char *key, json_t *value) { return json_object_set_new(object, key, value) != 0; }

/* object, or NULL (freeing it) when failed. */
static json_t *built(json_t *object, int failed) {
  if (!failed && object) return object;
  json_decref(object);
  return NULL;
}

/* ---- sessions ---- */

static json_t *session_json(const tt_session_info *s) {
  char id[17];
  snprintf(id, sizeof(id), "%016" PRIx64, s->session_id);
  return json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I}", "session", id, "tenant", s->tenant, "client",
                   s->client_name, "peer", s->peer, "age_ms", (json_int_t)s->age_ms, "idle_ms",
                   (json_int_t)s->idle_ms, "tensors", (json_int_t)s->tensors, "used_bytes",
                   (json_int_t)s->used_bytes, "quota_bytes", (json_int_t)s->quota_bytes);
}

/* The sessions other than own as a JSON array; NULL if out of memory. */
static json_t *sessions_json(const tt_session_info *sessions, size_t n, uint64_t own) {
  json_t *array = json_array();
  for (size_t i = 0; array && i < n; i++) {
    if (sessions[i].session_id == own) continue;
    if (json_array_append_new(array, session_json(&sessions[i])) != 0) {
      json_decref(array);
      array = NULL;
    }
  }
  return array;
}

/* Adds a row to *table; on failure the table is freed and *table NULL. */
static void add_row(ttctl_table **table, const char *const *row) {
  if (*table && ttctl_table_add(*table, row) != 0) {
    ttctl_table_free(*table);
    *table = NULL;
  }
}

/* Prints and frees table; TTCTL_FAILED (out of memory) for NULL. */
static int print_table(ttctl_table *table) {
  if (!table) {
    fprintf(stderr, "ttctl: out of memory\n");
    return TTCTL_FAILED;
  }
  ttctl_table_print(table);
  ttctl_table_free(table);
  return TTCTL_OK;
}

/* Prints the table of sessions other than own; returns TTCTL_OK or TTCTL_FAILED. */
static int sessions_print(const tt_session_info *sessions, size_t n, uint64_t own) {
  static const char *const headers[] = {"SESSION", "TENANT", "CLIENT", "PEER", "AGE",
                                        "IDLE",    "TENSORS", "MEMORY", "QUOTA"};
  static const int right[] = {0, 0, 0, 0, 1, 1, 1, 1, 1};
  ttctl_table *table = ttctl_table_create(9, headers, right);
  size_t shown = 0;
  for (size_t i = 0; table && i < n; i++) {
    const tt_session_info *s = &sessions[i];
    if (s->session_id == own) continue;
    char id[17], age[24], idle[24], tensors[24], used[24], quota[24];
    snprintf(id, sizeof(id), "%016" PRIx64, s->session_id);
    ttctl_format_duration(s->age_ms, age, sizeof(age));
    ttctl_format_duration(s->idle_ms, idle, sizeof(idle));
    snprintf(tensors, sizeof(tensors), "%" PRIu64, s->tensors);
    ttctl_format_size(s->used_bytes, used, sizeof(used));
    if (s->quota_bytes) {
      ttctl_format_size(s->quota_bytes, quota, sizeof(quota));
    } else {
      snprintf(quota, sizeof(quota), "-");
    }
    const char *row[] = {id, s->tenant, s->client_name, s->peer, age, idle, tensors, used, quota};
    add_row(&table, row);
    shown++;
  }
  if (!table) {
    fprintf(stderr, "ttctl: out of memory\n");
    return TTCTL_FAILED;
  }
  if (shown) {
    ttctl_table_print(table);
  } else {
    printf("no sessions open\n");
  }
  ttctl_table_free(table);
  return TTCTL_OK;
}

/* Prints one line per tenant with sessions other than own: its sessions and the device
 * memory they hold; returns TTCTL_OK or TTCTL_FAILED. Card time per tenant is /metrics'
 * ttd_tenant_card_seconds_total. */
static int tenants_print(const tt_session_info *sessions, size_t n, uint64_t own) {
  static const char *const headers[] = {"TENANT", "SESSIONS", "MEMORY"};
  static const int right[] = {0, 1, 1};
  ttctl_table *table = ttctl_table_create(3, headers, right);
  for (size_t i = 0; table && i < n; i++) {
    if (sessions[i].session_id == own) continue;
    int seen = 0; /* a tenant's line is made at its first session */
    for (size_t k = 0; k < i && !seen; k++) {
      seen = sessions[k].session_id != own && strcmp(sessions[k].tenant, sessions[i].tenant) == 0;
    }
    if (seen) continue;
    uint64_t count = 0, bytes = 0;
    for (size_t k = i; k < n; k++) {
      if (sessions[k].session_id == own || strcmp(sessions[k].tenant, sessions[i].tenant) != 0) continue;
      count++;
      bytes += sessions[k].used_bytes;
    }
    char c[24], used[24];
    snprintf(c, sizeof(c), "%" PRIu64, count);
    ttctl_format_size(bytes, used, sizeof(used));
    const char *row[] = {sessions[i].tenant, c, used};
    add_row(&table, row);
  }
  return print_table(table);
}

int ttctl_cmd_sessions(const ttctl_options *options, int argc, char **args) {
  if (argc != 0) return ttctl_usage_error("sessions takes no arguments, got '%s'", args[0]);
  tt_client *client = ttctl_connect(options);
  if (!client) return TTCTL_FAILED;
  tt_session_info *sessions = NULL;
  size_t n = 0;
  int rc;
  if (tt_list_sessions(client, &sessions, &n) != TT_OK) {
    rc = ttctl_fail(client);
  } else if (options->json) {
    json_t *list = sessions_json(sessions, n, tt_session_id(client));
    json_t *root = json_object();
    rc = ttctl_print_json(built(root, set(root, "sessions", list)));
  } else {
    rc = sessions_print(sessions, n, tt_session_id(client));
  }
  tt_session_list_free(sessions);
  tt_disconnect(client);
  return rc;
}

/* ---- status ---- */

static json_t *memory_json(const tt_memory_info *m) {
  return json_pack("{s:I, s:I}", "used_bytes", (json_int_t)m->used_bytes, "capacity_bytes",
                   (json_int_t)m->capacity_bytes);
}

static json_t *device_json(const tt_device_info *d) {
  json_t *o = json_pack("{s:s, s:s, s:I}", "name", d->name, "kind", d->kind, "cores", (json_int_t)d->cores);
  return built(o, set(o, "dram", memory_json(&d->dram)) | set(o, "l1", memory_json(&d->l1)));
}

/* sessions (stolen) is left out when NULL. */
static json_t *status_json(const char *target, const char *instance, const tt_device_info *devs, size_t ndev,
                           json_t *sessions) {
  json_t *devices = json_array();
  int failed = devices == NULL;
  for (size_t i = 0; !failed && i < ndev; i++) failed = json_array_append_new(devices, device_json(&devs[i])) != 0;
  json_t *root = json_pack("{s:s, s:s}", "target", target, "instance", instance);
  failed |= set(root, "devices", devices);
  if (sessions) failed |= set(root, "sessions", sessions);
  return built(root, failed);
}

/* "[###.................]  12.5%" and "1.00 MiB / 8.00 MiB" for one memory. */
static void memory_cells(const tt_memory_info *m, char *bar, size_t bar_size, char *sizes, size_t sizes_size) {
  char used[24], capacity[24];
  ttctl_format_bar(m->used_bytes, m->capacity_bytes, bar, bar_size);
  ttctl_format_size(m->used_bytes, used, sizeof(used));
  ttctl_format_size(m->capacity_bytes, capacity, sizeof(capacity));
  snprintf(sizes, sizes_size, "%s / %s", used, capacity);
}

static int devices_print(const tt_device_info *devs, size_t ndev) {
  static const char *const headers[] = {"DEVICE", "KIND", "CORES", "DRAM", "USED / TOTAL", "L1", "USED / TOTAL"};
  static const int right[] = {0, 0, 1, 0, 1, 0, 1};
  ttctl_table *table = ttctl_table_create(7, headers, right);
  for (size_t i = 0; table && i < ndev; i++) {
    char cores[16], dram_bar[48], dram[64], l1_bar[48], l1[64];
    snprintf(cores, sizeof(cores), "%u", devs[i].cores);
    memory_cells(&devs[i].dram, dram_bar, sizeof(dram_bar), dram, sizeof(dram));
    memory_cells(&devs[i].l1, l1_bar, sizeof(l1_bar), l1, sizeof(l1));
    const char *row[] = {devs[i].name, devs[i].kind, cores, dram_bar, dram, l1_bar, l1};
    add_row(&table, row);
  }
  return print_table(table);
}

/* Devices, then tenants (sessions and memory of each), then sessions. A tenant that is not
 * an admin still sees the devices: the rest is left out with a note on stderr, and the
 * command succeeds. */
int ttctl_cmd_status(const ttctl_options *options, int argc, char **args) {
  if (argc != 0) return ttctl_usage_error("status takes no arguments, got '%s'", args[0]);
  tt_client *client = ttctl_connect(options);
  if (!client) return TTCTL_FAILED;
  char target[256];
  ttctl_target_text(options, target, sizeof(target));
  tt_device_info *devs = NULL;
  size_t ndev = 0;
  tt_session_info *sessions = NULL;
  size_t nsess = 0;
  int have_sessions = 0;
  int rc = TTCTL_OK;
  if (tt_list_devices(client, &devs, &ndev) != TT_OK) {
    rc = ttctl_fail(client);
  } else if (tt_list_sessions(client, &sessions, &nsess) == TT_OK) {
    have_sessions = 1;
  } else if (tt_errcode(client) == TT_PERMISSION_DENIED) {
    fprintf(stderr, "ttctl: sessions not shown: %s\n", tt_last_error(client));
  } else {
    rc = ttctl_fail(client);
  }
  uint64_t own = tt_session_id(client);
  if (rc == TTCTL_OK && options->json) {
    json_t *list = have_sessions ? sessions_json(sessions, nsess, own) : NULL;
    if (have_sessions && !list) {
      rc = ttctl_print_json(NULL);
    } else {
      rc = ttctl_print_json(status_json(target, tt_instance_id(client), devs, ndev, list));
    }
  } else if (rc == TTCTL_OK) {
    size_t others = 0;
    for (size_t i = 0; i < nsess; i++) others += sessions[i].session_id != own;
    printf("ttd %s, instance %s, %zu device%s", target, tt_instance_id(client), ndev, ndev == 1 ? "" : "s");
    if (have_sessions) printf(", %zu session%s", others, others == 1 ? "" : "s");
    printf("\n\n");
    rc = devices_print(devs, ndev);
    if (rc == TTCTL_OK && have_sessions && others) {
      printf("\n");
      rc = tenants_print(sessions, nsess, own);
    }
    if (rc == TTCTL_OK && have_sessions) {
      printf("\n");
      rc = sessions_print(sessions, nsess, own);
    }
  }
  tt_session_list_free(sessions);
  tt_device_list_free(devs);
  tt_disconnect(client);
  return rc;
}

/* ---- kill ---- */

/* Exactly 16 hex digits, as the tables show them. */
static int parse_session_id(const char *text, uint64_t *out_id) {
  if (strlen(text) != 16) return -1;
  for (const char *p = text; *p; p++) {
    if (!isxdigit((unsigned char)*p)) return -1;
  }
  errno = 0;
  *out_id = strtoull(text, NULL, 16);
  return errno ? -1 : 0;
}

int ttctl_cmd_kill(const ttctl_options *options, int argc, char **args) {
  if (argc != 1) return ttctl_usage_error("kill needs one SESSION: the 16 hex digits that ttctl sessions shows");
  uint64_t id;
  if (parse_session_id(args[0], &id) != 0) {
    return ttctl_usage_error("'%s' is not a session id: give the 16 hex digits that ttctl sessions shows", args[0]);
  }
  tt_client *client = ttctl_connect(options);
  if (!client) return TTCTL_FAILED;
  uint64_t tensors = 0, bytes = 0;
  int rc = TTCTL_OK;
  if (tt_kill_session(client, id, &tensors, &bytes) != TT_OK) {
    rc = ttctl_fail(client);
  } else if (options->json) {
    char hex[17];
    snprintf(hex, sizeof(hex), "%016" PRIx64, id);
    rc = ttctl_print_json(json_pack("{s:s, s:I, s:I}", "session", hex, "tensors_freed", (json_int_t)tensors,
                                    "bytes_freed", (json_int_t)bytes));
  } else {
    char freed[24];
    ttctl_format_size(bytes, freed, sizeof(freed));
    printf("killed session %016" PRIx64 ": %" PRIu64 " tensor%s, %s freed\n", id, tensors, tensors == 1 ? "" : "s",
           freed);
  }
  tt_disconnect(client);
  return rc;
}

/* ---- ping ---- */

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void format_latency(double us, char *buf, size_t size) {
  if (us < 10000.0) {
    snprintf(buf, size, "%.0f us", us);
  } else {
    snprintf(buf, size, "%.1f ms", us / 1000.0);
  }
}

/* count round trips of ListDevices (the connection's own OpenSession is not counted). */
int ttctl_cmd_ping(const ttctl_options *options, int argc, char **args) {
  if (argc != 0) return ttctl_usage_error("ping takes no arguments, got '%s'", args[0]);
  long count = 5;
  if (options->count) {
    char *end;
    errno = 0;
    count = strtol(options->count, &end, 10);
    if (errno || end == options->count || *end || count < 1 || count > 100000) {
      return ttctl_usage_error("--count must be a number of round trips from 1 to 100000, got '%s'", options->count);
    }
  }
  double *us = calloc((size_t)count, sizeof(*us));
  if (!us) {
    fprintf(stderr, "ttctl: out of memory\n");
    return TTCTL_FAILED;
  }
  tt_client *client = ttctl_connect(options);
  if (!client) {
    free(us);
    return TTCTL_FAILED;
  }
  int rc = TTCTL_OK;
  for (long i = 0; i < count && rc == TTCTL_OK; i++) {
    tt_device_info *devs = NULL;
    size_t n = 0;
    double start = now_us();
    if (tt_list_devices(client, &devs, &n) != TT_OK) rc = ttctl_fail(client);
    us[i] = now_us() - start;
    tt_device_list_free(devs);
  }
  if (rc == TTCTL_OK) {
    qsort(us, (size_t)count, sizeof(*us), compare_double);
    double median = count % 2 ? us[count / 2] : (us[count / 2 - 1] + us[count / 2]) / 2.0;
    char target[256];
    ttctl_target_text(options, target, sizeof(target));
    if (options->json) {
      rc = ttctl_print_json(json_pack("{s:s, s:s, s:I, s:I, s:I, s:I}", "target", target, "instance",
                                      tt_instance_id(client), "count", (json_int_t)count, "min_us",
                                      (json_int_t)llround(us[0]), "median_us", (json_int_t)llround(median),
                                      "max_us", (json_int_t)llround(us[count - 1])));
    } else {
      char lo[24], mid[24], hi[24];
      format_latency(us[0], lo, sizeof(lo));
      format_latency(median, mid, sizeof(mid));
      format_latency(us[count - 1], hi, sizeof(hi));
      printf("ttd %s, instance %s: %ld round trip%s, min %s, median %s, max %s\n", target, tt_instance_id(client),
             count, count == 1 ? "" : "s", lo, mid, hi);
    }
  }
  free(us);
  tt_disconnect(client);
  return rc;
}
