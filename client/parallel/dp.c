/* tt_dp: a module's gradients averaged over the ranks of an MPI communicator, and its
 * parameters broadcast from one rank: the data-parallel step of ttparallel.h.
 *
 * Layout: the gradients of consecutive parameters share a bucket, a slice of one host buffer
 * of all the parameters' float32 bytes. A .grad comes down (tt_to) and is copied into its
 * bucket; the reduced values go back through a host staging tensor of the parameter's (made
 * by libttclient, so that a large one moves through the same-host shared memory) into the
 * same .grad handle with tt_copy_. A helper thread downloads the buckets in
 * order while this thread starts each bucket's MPI_Iallreduce as it lands and drives the
 * ones in flight with MPI_Test: Open MPI progresses a non-blocking collective only inside
 * MPI calls, so a thread of its own for the downloads is what lets them overlap. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ttparallel.h"

#define DEFAULT_BUCKET_BYTES ((size_t)25 << 20)
#define DEFAULT_TIMEOUT_MS 300000

struct tt_dp {
  tt_module *module;
  tt_client *client;
  MPI_Comm comm;
  int rank, size;
  size_t bucket_bytes;
  int64_t timeout_ms;
  int n_params;
  char **names;
  uint64_t *offset, *bytes; /* each parameter's slice of host, in bytes */
  tt_tensor **stage;        /* host staging tensors, made at the first use */
  int n_buckets;
  int *bucket_first;        /* parameters [bucket_first[b], bucket_first[b + 1]) */
  float *host;
  tt_dp_stats stats;
  char err[768];
};

/* ---- errors ---- */

static tt_status dp_fail(tt_dp *dp, tt_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static tt_status dp_fail(tt_dp *dp, tt_status code, const char *fmt, ...) {
  int n = snprintf(dp->err, sizeof(dp->err), "rank %d of %d: ", dp->rank, dp->size);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dp->err + n, sizeof(dp->err) - (size_t)n, fmt, ap);
  va_end(ap);
  return code;
}

/* The ranks a collective waits for besides this one, in words: "rank 1" of two, "one of ranks
 * 0, 2, 3" of more (the first eight). A collective does not tell which one is missing. */
static void other_ranks(const tt_dp *dp, char *buf, size_t size) {
  int n = snprintf(buf, size, dp->size == 2 ? "rank" : "one of ranks");
  for (int r = 0, listed = 0; r < dp->size && n > 0 && (size_t)n < size; r++) {
    if (r == dp->rank) continue;
    n += listed == 8 ? snprintf(buf + n, size - (size_t)n, ", ...")
                     : snprintf(buf + n, size - (size_t)n, "%s %d", listed ? "," : "", r);
    if (listed++ == 8) break;
  }
}

static tt_status dp_mpi_fail(tt_dp *dp, int rc, const char *what, int bucket) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0, klass = 0;
  MPI_Error_string(rc, text, &len);
  MPI_Error_class(rc, &klass);
  return dp_fail(dp, TT_INTERNAL, "%s of bucket %d failed: %s (MPI error class %d); a peer rank may have died", what,
                 bucket, text, klass);
}

static tt_status dp_tt_fail(tt_dp *dp, const char *what, const char *name) {
  tt_status code = tt_errcode(dp->client);
  return dp_fail(dp, code == TT_OK ? TT_INTERNAL : code, "%s %s: %s: %s", what, name, tt_status_name(code),
                 tt_last_error(dp->client));
}

/* ---- waiting with a bound ---- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Yields a little between polls: on a host with as many ranks as cores, a rank that spins
 * takes the core its ttd or a peer needs. */
static void dp_pause(int polls) {
  if (polls < 64) {
    sched_yield();
  } else {
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
  }
}

/* Waits for req until the context's timeout. */
static tt_status dp_wait(tt_dp *dp, MPI_Request *req, const char *what, int bucket) {
  int64_t deadline = now_ms() + dp->timeout_ms;
  for (int polls = 0;; polls++) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return dp_mpi_fail(dp, rc, what, bucket);
    if (done) return TT_OK;
    if (now_ms() > deadline) {
      char others[96];
      other_ranks(dp, others, sizeof(others));
      return dp_fail(dp, TT_DEADLINE_EXCEEDED,
                     "%s of bucket %d did not complete within %lld ms: %s stopped or died (if it died, mpirun names "
                     "it)",
                     what, bucket, (long long)dp->timeout_ms, others);
    }
    dp_pause(polls);
  }
}

/* ---- the context ---- */

void tt_dp_options_init(tt_dp_options *options) {
  memset(options, 0, sizeof(*options));
  options->bucket_bytes = DEFAULT_BUCKET_BYTES;
  const char *env = getenv("TT_DP_TIMEOUT_MS");
  options->timeout_ms = env && atoll(env) > 0 ? atoll(env) : DEFAULT_TIMEOUT_MS;
}

tt_status tt_dp_create(tt_module *module, MPI_Comm comm, const tt_dp_options *options, tt_dp **out_dp) {
  tt_dp *dp = calloc(1, sizeof(*dp));
  *out_dp = dp;
  if (!dp) return TT_RESOURCE_EXHAUSTED;
  dp->comm = MPI_COMM_NULL;
  dp->rank = -1;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(comm, &dp->rank), MPI_Comm_size(comm, &dp->size); /* for messages */
  if (!module || !initialized)
    return dp_fail(dp, TT_INVALID_ARGUMENT, "tt_dp_create: %s", module ? "MPI_Init has not been called" : "module is NULL");
  tt_dp_options defaults;
  tt_dp_options_init(&defaults);
  dp->bucket_bytes = options && options->bucket_bytes ? options->bucket_bytes : defaults.bucket_bytes;
  dp->timeout_ms = options && options->timeout_ms > 0 ? options->timeout_ms : defaults.timeout_ms;
  int rc = MPI_Comm_dup(comm, &dp->comm);
  if (rc != MPI_SUCCESS) return dp_mpi_fail(dp, rc, "MPI_Comm_dup", -1);
  MPI_Comm_set_errhandler(dp->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(dp->comm, &dp->rank);
  MPI_Comm_size(dp->comm, &dp->size);
  dp->module = module;
  int n = tt_module_param_count(module);
  dp->n_params = n;
  dp->names = calloc((size_t)n + 1, sizeof(char *));
  dp->offset = calloc((size_t)n + 1, sizeof(uint64_t));
  dp->bytes = calloc((size_t)n + 1, sizeof(uint64_t));
  dp->stage = calloc((size_t)n + 1, sizeof(tt_tensor *));
  dp->bucket_first = calloc((size_t)n + 2, sizeof(int));
  if (!dp->names || !dp->offset || !dp->bytes || !dp->stage || !dp->bucket_first)
    return dp_fail(dp, TT_RESOURCE_EXHAUSTED, "tt_dp_create: out of memory");
  uint64_t total = 0, in_bucket = 0;
  for (int i = 0; i < n; i++) {
    const char *name = tt_module_param_name(module, i);
    tt_tensor *p = name ? tt_module_param(module, name) : NULL;
    if (!dp->client && p) dp->client = tt_tensor_client(p);
    if (!p) return dp_fail(dp, TT_INTERNAL, "tt_dp_create: parameter %d of the module cannot be read", i);
    dp->names[i] = strdup(name);
    dp->bytes[i] = tt_tensor_numel(p) * sizeof(float); /* .grad is float32, whatever the parameter's dtype */
    tt_tensor_free(p);
    if (!dp->names[i]) return dp_fail(dp, TT_RESOURCE_EXHAUSTED, "tt_dp_create: out of memory");
    if (in_bucket > 0 && in_bucket + dp->bytes[i] > dp->bucket_bytes) {
      dp->bucket_first[++dp->n_buckets] = i;
      in_bucket = 0;
    }
    dp->offset[i] = total;
    total += dp->bytes[i];
    in_bucket += dp->bytes[i];
  }
  if (n > 0) dp->bucket_first[++dp->n_buckets] = n;
  dp->stats.param_bytes = total;
  dp->host = malloc(total ? total : 1);
  if (!dp->host) return dp_fail(dp, TT_RESOURCE_EXHAUSTED, "tt_dp_create: out of memory for %llu bytes",
                                (unsigned long long)total);
  return TT_OK;
}

void tt_dp_free(tt_dp *dp) {
  if (!dp) return;
  for (int i = 0; dp->names && i < dp->n_params; i++) free(dp->names[i]);
  for (int i = 0; dp->stage && i < dp->n_params; i++) tt_tensor_free(dp->stage[i]);
  if (dp->comm != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&dp->comm);
  }
  free(dp->names), free(dp->offset), free(dp->bytes), free(dp->stage), free(dp->bucket_first), free(dp->host);
  free(dp);
}

void tt_dp_get_stats(const tt_dp *dp, tt_dp_stats *out_stats) {
  memset(out_stats, 0, sizeof(*out_stats));
  if (dp) *out_stats = dp->stats;
}

int tt_dp_rank(const tt_dp *dp) { return dp ? dp->rank : -1; }
int tt_dp_size(const tt_dp *dp) { return dp ? dp->size : -1; }
const char *tt_dp_last_error(const tt_dp *dp) { return dp ? dp->err : "out of memory"; }

/* ---- moving one parameter's bytes between its .grad or value and its slice of host ---- */

static tt_status dp_stage(tt_dp *dp, int i, tt_tensor *like) {
  if (dp->stage[i]) return TT_OK;
  dp->stage[i] = tt_tensor_from_host(dp->client, NULL, TT_FLOAT32, tt_tensor_shape(like), tt_tensor_ndim(like));
  return dp->stage[i] ? TT_OK : dp_tt_fail(dp, "making the host buffer of", dp->names[i]);
}

/* src's values (a .grad or a parameter, anywhere) into parameter i's slice of host: a
 * download (tt_copy_ into a host tensor would download and copy once more). */
static tt_status dp_down(tt_dp *dp, int i, tt_tensor *src, const char *what) {
  tt_tensor *h = tt_to(src, "cpu");
  if (!h) return dp_tt_fail(dp, what, dp->names[i]);
  memcpy((char *)dp->host + dp->offset[i], tt_tensor_data(h), dp->bytes[i]);
  tt_tensor_free(h);
  return TT_OK;
}

/* Parameter i's slice of host, times scale, into dst (the same .grad or parameter handle). */
static tt_status dp_up(tt_dp *dp, int i, tt_tensor *dst, float scale, const char *what) {
  tt_status st = dp_stage(dp, i, dst);
  if (st != TT_OK) return st;
  float *to = tt_tensor_data(dp->stage[i]);
  const float *from = (const float *)((char *)dp->host + dp->offset[i]);
  size_t n = dp->bytes[i] / sizeof(float);
  if (scale == 1.0f) memcpy(to, from, dp->bytes[i]);
  else
    for (size_t k = 0; k < n; k++) to[k] = from[k] * scale;
  if (tt_copy_(dst, dp->stage[i]) != TT_OK) return dp_tt_fail(dp, what, dp->names[i]);
  return TT_OK;
}

/* ---- broadcast ---- */

tt_status tt_dp_broadcast_params(tt_dp *dp, int root) {
  if (!dp) return TT_INVALID_ARGUMENT;
  if (!dp->module) return dp_fail(dp, TT_INVALID_ARGUMENT, "tt_dp_broadcast_params: the context was not made");
  if (root < 0 || root >= dp->size)
    return dp_fail(dp, TT_INVALID_ARGUMENT, "tt_dp_broadcast_params: root %d is not a rank of the %d", root, dp->size);
  tt_tensor **params = calloc((size_t)dp->n_params + 1, sizeof(tt_tensor *));
  if (!params) return dp_fail(dp, TT_RESOURCE_EXHAUSTED, "tt_dp_broadcast_params: out of memory");
  tt_status st = TT_OK;
  for (int i = 0; i < dp->n_params && st == TT_OK; i++)
    if (!(params[i] = tt_module_param(dp->module, dp->names[i])))
      st = dp_tt_fail(dp, "reading the parameter", dp->names[i]);
  for (int b = 0; b < dp->n_buckets && st == TT_OK; b++) {
    int first = dp->bucket_first[b], end = dp->bucket_first[b + 1];
    for (int i = first; i < end && st == TT_OK && dp->rank == root; i++)
      st = dp_down(dp, i, params[i], "downloading the parameter");
    if (st != TT_OK) break;
    uint64_t bytes = dp->offset[end - 1] + dp->bytes[end - 1] - dp->offset[first];
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Ibcast((char *)dp->host + dp->offset[first], (int)(bytes / sizeof(float)), MPI_FLOAT, root, dp->comm,
                        &req);
    st = rc != MPI_SUCCESS ? dp_mpi_fail(dp, rc, "MPI_Ibcast", b) : dp_wait(dp, &req, "MPI_Ibcast", b);
    for (int i = first; i < end && st == TT_OK && dp->rank != root; i++)
      st = dp_up(dp, i, params[i], 1.0f, "writing the parameter");
    if (st == TT_OK) dp->stats.broadcast_bytes += bytes;
  }
  for (int i = 0; i < dp->n_params; i++) tt_tensor_free(params[i]);
  free(params);
  return st;
}

/* ---- all-reduce ---- */

/* The helper thread's side: downloads bucket after bucket, publishing each as it lands. */
typedef struct downloader {
  tt_dp *dp;
  tt_tensor **grads;
  pthread_mutex_t lock;
  pthread_cond_t landed;
  int done;          /* buckets downloaded */
  tt_status status;  /* the first failure; its text in dp->err */
} downloader;

static void *download_main(void *arg) {
  downloader *d = arg;
  tt_dp *dp = d->dp;
  for (int b = 0; b < dp->n_buckets; b++) {
    tt_status st = TT_OK;
    for (int i = dp->bucket_first[b]; i < dp->bucket_first[b + 1] && st == TT_OK; i++)
      st = dp_down(dp, i, d->grads[i], "downloading the .grad of");
    pthread_mutex_lock(&d->lock);
    if (st == TT_OK) d->done = b + 1;
    else d->status = st;
    pthread_cond_signal(&d->landed);
    pthread_mutex_unlock(&d->lock);
    if (st != TT_OK) break;
  }
  return NULL;
}

/* Drives the requests in flight until bucket b has landed (or the download failed). */
static tt_status await_bucket(tt_dp *dp, downloader *d, int b, MPI_Request *reqs) {
  int64_t deadline = now_ms() + dp->timeout_ms;
  for (;;) {
    pthread_mutex_lock(&d->lock);
    if (d->done <= b && d->status == TT_OK) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 200 * 1000;
      if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
      pthread_cond_timedwait(&d->landed, &d->lock, &ts);
    }
    int landed = d->done > b;
    tt_status st = d->status;
    pthread_mutex_unlock(&d->lock);
    if (landed) return TT_OK;
    if (st != TT_OK) return st;
    for (int k = 0; k < b; k++) {
      int flag = 0, rc = MPI_Test(&reqs[k], &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return dp_mpi_fail(dp, rc, "MPI_Iallreduce", k);
    }
    if (now_ms() > deadline) return dp_fail(dp, TT_DEADLINE_EXCEEDED, "downloading bucket %d took over %lld ms", b,
                                            (long long)dp->timeout_ms);
  }
}

tt_status tt_dp_allreduce_grads(tt_dp *dp) {
  if (!dp) return TT_INVALID_ARGUMENT;
  if (!dp->module) return dp_fail(dp, TT_INVALID_ARGUMENT, "tt_dp_allreduce_grads: the context was not made");
  int n = dp->n_params, nb = dp->n_buckets;
  tt_tensor **grads = calloc((size_t)n + 1, sizeof(tt_tensor *));
  MPI_Request *reqs = malloc(sizeof(MPI_Request) * ((size_t)nb + 1));
  if (!grads || !reqs) {
    free(grads), free(reqs);
    return dp_fail(dp, TT_RESOURCE_EXHAUSTED, "tt_dp_allreduce_grads: out of memory");
  }
  for (int b = 0; b < nb; b++) reqs[b] = MPI_REQUEST_NULL;
  tt_status st = TT_OK;
  /* On this thread: reading a .grad sends the module's queued Backward first, and the
   * module is one thread's at a time. The helper thread then only moves these tensors. */
  for (int i = 0; i < n && st == TT_OK; i++) {
    if (!(grads[i] = tt_param_grad(dp->module, dp->names[i]))) st = dp_tt_fail(dp, "reading the .grad of", dp->names[i]);
    else st = dp_stage(dp, i, grads[i]);
  }
  int started = 0;
  if (st == TT_OK && nb > 0) {
    downloader d = {.dp = dp, .grads = grads, .status = TT_OK};
    pthread_mutex_init(&d.lock, NULL);
    pthread_cond_init(&d.landed, NULL);
    pthread_t thread;
    int err = pthread_create(&thread, NULL, download_main, &d);
    if (err) {
      st = dp_fail(dp, TT_RESOURCE_EXHAUSTED, "tt_dp_allreduce_grads: no thread for the downloads: %s", strerror(err));
    } else {
      for (int b = 0; b < nb && st == TT_OK; b++) {
        st = await_bucket(dp, &d, b, reqs);
        if (st != TT_OK) break;
        int first = dp->bucket_first[b], end = dp->bucket_first[b + 1];
        uint64_t bytes = dp->offset[end - 1] + dp->bytes[end - 1] - dp->offset[first];
        int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)dp->host + dp->offset[first], (int)(bytes / sizeof(float)),
                                MPI_FLOAT, MPI_SUM, dp->comm, &reqs[b]);
        if (rc != MPI_SUCCESS) st = dp_mpi_fail(dp, rc, "MPI_Iallreduce", b);
        else started++, dp->stats.allreduce_bytes += bytes, dp->stats.buckets++;
      }
      pthread_join(thread, NULL);
    }
    pthread_cond_destroy(&d.landed);
    pthread_mutex_destroy(&d.lock);
  }
  /* Each bucket back into the same .grad handles as its reduction completes. */
  float scale = 1.0f / (float)dp->size;
  for (int b = 0; b < started && st == TT_OK; b++) {
    st = dp_wait(dp, &reqs[b], "MPI_Iallreduce", b);
    for (int i = dp->bucket_first[b]; i < dp->bucket_first[b + 1] && st == TT_OK; i++)
      st = dp_up(dp, i, grads[i], scale, "writing back the .grad of");
  }
  if (st == TT_OK) dp->stats.allreduce_calls++;
  for (int i = 0; i < n; i++) tt_tensor_free(grads[i]);
  free(grads);
  free(reqs);
  return st;
}

/* ---- placement: which ttd and which card a rank takes ---- */

int tt_dp_local_rank(MPI_Comm comm, int *out_local_size) {
  if (out_local_size) *out_local_size = -1;
  MPI_Comm local;
  int rank = -1, size = -1;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local) != MPI_SUCCESS) return -1;
  MPI_Comm_rank(local, &rank);
  MPI_Comm_size(local, &size);
  MPI_Comm_free(&local);
  if (out_local_size) *out_local_size = size;
  return rank;
}

tt_status tt_dp_pick_device(tt_client *client, MPI_Comm comm, char *out_device, size_t len) {
  if (out_device && len) out_device[0] = '\0';
  int local = tt_dp_local_rank(comm, NULL);
  if (local < 0) return TT_INTERNAL;
  tt_device_info *devices = NULL;
  size_t count = 0;
  tt_status st = tt_list_devices(client, &devices, &count);
  if (st != TT_OK) return st;
  tt_device_list_free(devices);
  int n = snprintf(out_device, len, "tt:%d", count ? local % (int)count : 0);
  return n > 0 && (size_t)n < len ? TT_OK : TT_INVALID_ARGUMENT;
}

tt_status tt_dp_pick_target(const char *targets, MPI_Comm comm, char *out_target, size_t len) {
  if (!out_target || !len) return TT_INVALID_ARGUMENT;
  out_target[0] = '\0';
  int local = tt_dp_local_rank(comm, NULL);
  if (local < 0) return TT_INTERNAL;
  if (!targets || !*targets) return TT_OK;
  int count = 1;
  for (const char *p = targets; *p; p++) count += *p == ',';
  const char *start = targets;
  for (int k = local % count; k > 0; k--) start = strchr(start, ',') + 1;
  const char *end = strchr(start, ',');
  size_t n = end ? (size_t)(end - start) : strlen(start);
  if (n >= len) return TT_INVALID_ARGUMENT;
  memcpy(out_target, start, n);
  out_target[n] = '\0';
  return TT_OK;
}
