/* A soak client: random operations (soak.h) on its own session, each one timed, until the
 * driver says 'q'. Every result is checked: downloads against what was uploaded (or zeros
 * for an allocation), the program's output against its first, the training loss finite.
 * A failed or wrong operation is an unexpected error: counted, told to the driver (the
 * first few), and the client starts a new session to go on. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scripts/faults-src/ft_proc.h"
#include "scripts/bench/bench_common.h"
#include "scripts/bench/bench_mlp.h"
#include "soak.h"

#define SLOTS 8
#define HELD_MAX ((uint64_t)32 << 20) /* device bytes a client keeps at most */
#define EXEC_ROWS 64
#define EXEC_WIDTH 256
#define REPORTED_ERRORS 5

const char *const soak_op_names[SOAK_OPS] = {"upload", "download", "allocate", "free",
                                             "execute", "train", "list_devices", "churn"};

typedef struct slot {
  tt_tensor *dev;
  tt_tensor *host; /* what it holds; NULL: zeros (allocated) */
} slot;

typedef struct client {
  const soak_client_args *args;
  tt_client *c;
  unsigned long long rng;
  slot slots[SLOTS];
  uint64_t held;
  bench_mlp *mlp;
  tt_module *exec;
  tt_tensor *exec_in, *exec_ref; /* host: the program's input and its first output */
  soak_sample *samples;
  size_t count, capacity;
  double ops, errors, wrong, sessions;
} client;

static uint64_t next(client *k) {
  k->rng = k->rng * 6364136223846793005ull + 1442695040888963407ull;
  return k->rng >> 17;
}

static void drop_slot(client *k, int i) {
  if (k->slots[i].dev) k->held -= tt_tensor_nbytes(k->slots[i].dev);
  tt_tensor_free(k->slots[i].dev);
  tt_tensor_free(k->slots[i].host);
  k->slots[i] = (slot){0};
}

static void drop_session(client *k) {
  for (int i = 0; i < SLOTS; i++) drop_slot(k, i);
  bench_mlp_destroy(k->mlp);
  tt_module_free(k->exec);
  tt_tensor_free(k->exec_in);
  tt_tensor_free(k->exec_ref);
  k->mlp = NULL, k->exec = NULL, k->exec_in = k->exec_ref = NULL;
  tt_disconnect(k->c);
  k->c = NULL;
}

static int open_session(client *k) {
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.client_name = "soak";
  o.disable_shm = !k->args->shm;
  k->sessions++;
  return tt_connect(k->args->target, &o, &k->c) == TT_OK ? 0 : -1;
}

/* A slot to fill: an empty one, or one freed to make room. */
static int free_slot(client *k, uint64_t bytes) {
  int i = (int)(next(k) % SLOTS);
  for (int n = 0; n < SLOTS && k->slots[i].dev; n++) i = (i + 1) % SLOTS;
  if (k->slots[i].dev) drop_slot(k, i);
  for (int j = 0; j < SLOTS && k->held + bytes > HELD_MAX; j++) drop_slot(k, j);
  return i;
}

static int upload(client *k) {
  int64_t n = (int64_t)(256.0 * pow(2048.0, (double)(next(k) % 10000) / 10000.0)); /* 1 KiB .. 8 MiB */
  tt_tensor *host = tt_tensor_from_host(k->c, NULL, TT_FLOAT32, &n, 1);
  if (!host) return -1;
  bench_fill_random(tt_tensor_data(host), (size_t)n, &k->rng);
  int i = free_slot(k, (uint64_t)n * 4);
  tt_tensor *dev = tt_to(host, "tt");
  if (dev && !tt_tensor_handle(dev)) { /* a deferred one (training mode) goes up now: an Upload */
    tt_tensor_free(dev);
    dev = NULL;
  }
  if (!dev) {
    tt_tensor_free(host);
    return -1;
  }
  k->slots[i] = (slot){dev, host};
  k->held += tt_tensor_nbytes(dev);
  return 0;
}

static int allocate(client *k) {
  int64_t n = (int64_t)(256 + next(k) % (1 << 20));
  int i = free_slot(k, (uint64_t)n * 4);
  tt_tensor *dev = tt_tensor_empty(k->c, TT_FLOAT32, &n, 1, "tt");
  if (!dev) return -1;
  k->slots[i] = (slot){dev, NULL};
  k->held += tt_tensor_nbytes(dev);
  return 0;
}

/* A slot that holds a tensor, or -1. */
static int full_slot(client *k) {
  int i = (int)(next(k) % SLOTS);
  for (int n = 0; n < SLOTS && !k->slots[i].dev; n++) i = (i + 1) % SLOTS;
  return k->slots[i].dev ? i : -1;
}

static int download(client *k) {
  int i = full_slot(k);
  if (i < 0) return upload(k);
  tt_tensor *back = tt_to(k->slots[i].dev, "cpu");
  if (!back) return -1;
  size_t bytes = tt_tensor_nbytes(back);
  const unsigned char *got = tt_tensor_data(back);
  int same = k->slots[i].host ? memcmp(got, tt_tensor_data(k->slots[i].host), bytes) == 0 : 1;
  for (size_t b = 0; same && !k->slots[i].host && b < bytes; b++) same = got[b] == 0;
  tt_tensor_free(back);
  if (!same) k->wrong++;
  return same ? 0 : -2;
}

static int free_one(client *k) {
  int i = full_slot(k);
  if (i >= 0) drop_slot(k, i);
  return 0;
}

/* The eval program: relu(x W) for x [64, 256], built at first use. */
static int execute(client *k) {
  if (!k->exec) {
    int64_t xs[2] = {EXEC_ROWS, EXEC_WIDTH};
    tt_graph *g = tt_graph_create(k->c, 3);
    tt_graph_output(g, tt_relu(g, tt_nn_linear(g, tt_graph_input(g, "x", TT_FLOAT32, xs, 2), EXEC_WIDTH, 1)));
    k->exec = tt_compile(k->c, g);
    tt_graph_free(g);
    k->exec_in = tt_tensor_from_host(k->c, NULL, TT_FLOAT32, xs, 2);
    if (!k->exec || !k->exec_in || tt_module_to(k->exec, "tt") != TT_OK) return -1;
    tt_module_train(k->exec, 0);
    bench_fill_random(tt_tensor_data(k->exec_in), EXEC_ROWS * EXEC_WIDTH, &k->rng);
  }
  tt_tensor *x = tt_to(k->exec_in, "tt"), *y = NULL, *out = NULL;
  int rc = x && tt_forward(k->exec, &x, 1, &y) == TT_OK && (out = tt_to(y, "cpu")) ? 0 : -1;
  if (!rc && !k->exec_ref) k->exec_ref = tt_to(out, "cpu"); /* a new reference to the host copy */
  if (!rc && memcmp(tt_tensor_data(out), tt_tensor_data(k->exec_ref), tt_tensor_nbytes(out)) != 0) {
    k->wrong++;
    rc = -2;
  }
  tt_tensor_free(out), tt_tensor_free(y), tt_tensor_free(x);
  return rc;
}

static int train(client *k) {
  if (!k->mlp && !(k->mlp = bench_mlp_create_on(k->c, 64))) return -1;
  float loss = NAN;
  if (bench_mlp_try_step(k->mlp, &loss) != TT_OK) return -1;
  if (!isfinite(loss)) k->wrong++;
  return isfinite(loss) ? 0 : -2;
}

static int devices(client *k) {
  tt_device_info *list = NULL;
  size_t n = 0;
  tt_status st = tt_list_devices(k->c, &list, &n);
  tt_device_list_free(list);
  return st == TT_OK && n > 0 ? 0 : -1;
}

static int churn(client *k) {
  drop_session(k);
  return open_session(k);
}

static int run_op(client *k, soak_op op) {
  switch (op) {
    case SOAK_UPLOAD: return upload(k);
    case SOAK_DOWNLOAD: return download(k);
    case SOAK_ALLOCATE: return allocate(k);
    case SOAK_FREE: return free_one(k);
    case SOAK_EXECUTE: return execute(k);
    case SOAK_TRAIN: return train(k);
    case SOAK_DEVICES: return devices(k);
    default: return churn(k);
  }
}

/* The mix, in percent per operation. */
static soak_op pick(client *k) {
  static const int weight[SOAK_OPS] = {20, 18, 10, 14, 12, 18, 6, 2};
  int r = (int)(next(k) % 100);
  for (int op = 0; op < SOAK_OPS; op++) {
    if (r < weight[op]) return (soak_op)op;
    r -= weight[op];
  }
  return SOAK_DEVICES;
}

static void record(client *k, soak_op op, double seconds) {
  if (k->count == k->capacity) {
    k->capacity = k->capacity ? 2 * k->capacity : 4096;
    k->samples = realloc(k->samples, k->capacity * sizeof(*k->samples));
    if (!k->samples) bench_die("soak client", "out of memory");
  }
  k->samples[k->count++] = (soak_sample){op, (float)seconds};
}

static int write_samples(const client *k) {
  FILE *f = fopen(k->args->latency_path, "wb");
  if (!f) return -1;
  size_t n = fwrite(k->samples, sizeof(*k->samples), k->count, f);
  return fclose(f) == 0 && n == k->count ? 0 : -1;
}

int soak_client_main(const soak_client_args *a) {
  static client k;
  k.args = a;
  k.rng = a->seed * 2654435761ull + 1;
  if (open_session(&k) != 0) {
    ft_report(FT_MSG_EVENT, tt_errcode(k.c), 0, NULL, "tt_connect: %s", tt_last_error(k.c));
    return 1;
  }
  ft_report(FT_MSG_READY, 0, tt_session_id(k.c), NULL, NULL);
  while (ft_command(0) == 0) {
    soak_op op = pick(&k);
    double t0 = bench_now();
    int rc = run_op(&k, op);
    record(&k, op, bench_now() - t0);
    k.ops++;
    if (rc != 0) {
      if (k.errors++ < REPORTED_ERRORS) {
        ft_report(FT_MSG_EVENT, k.c ? tt_errcode(k.c) : 0, 0, NULL, "%s: %s", soak_op_names[op],
                  rc == -2 ? "wrong result" : k.c ? tt_last_error(k.c) : "no client");
      }
      churn(&k); /* go on in a new session */
    }
    if (a->think_ms > 0) ft_sleep((double)(next(&k) % (uint64_t)(a->think_ms * 1000)) * 1e-6);
  }
  drop_session(&k);
  int written = write_samples(&k);
  ft_report(FT_MSG_RESULT, written, 0, (double[6]){k.ops, k.errors, k.wrong, k.sessions}, NULL);
  free(k.samples);
  return written == 0 ? 0 : 1;
}
