/* bench_train: one training step of the 784-512-10 MLP through ttd (bench_mlp.h) against the
 * same step in PyTorch on the CPU in process (scripts/bench/torch_step.py), and the number of
 * gRPC calls a step makes.
 *   bench_train --target ADDR --admin HOST:PORT --python /usr/bin/python3 --torch-step PATH [--daemon-pid PID]
 * records mlp_train_step_b64 and mlp_train_step_b256 (ms per step: the median over
 * repetitions of a repetition's mean; PyTorch's is the faster of 1 and 2 threads, and its
 * repetitions alternate with ours through `torch_step.py --serve`) and round_trips_per_step (calls per step, counted by
 * the daemon: the sum of ttd_rpc_duration_seconds_count over methods on the admin endpoint's
 * /metrics, before and after a run of steps, from a client without background KeepAlive;
 * the reference is the goal, 2); and mlp_train_step_b256_bf16 and mlp_bf16_loss_dev_20
 * (bf16_step). */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "bench_mlp.h"

#define WARMUP_STEPS 10
/* Untimed steps at the start of every repetition, ours and PyTorch's alike: after the pause
 * between repetitions the kernel's scheduler takes tens of ms to spread a multi-threaded
 * process over the cores again (the first steps after a 20 ms pause ran 1.2-1.7 ms here,
 * against 0.6 ms in steady state), and a training loop runs in steady state. */
#define REP_WARMUP_STEPS 10
#define COUNTED_STEPS 50
#define MAX_METHODS 64

typedef struct counts {
  int n;
  char method[MAX_METHODS][48];
  double count[MAX_METHODS];
} counts;

/* GET /metrics from host:port into a new string (NULL on error). */
static char *http_get_metrics(const char *admin) {
  char host[64];
  const char *colon = strrchr(admin, ':');
  if (!colon || (size_t)(colon - admin) >= sizeof(host)) return NULL;
  memcpy(host, admin, (size_t)(colon - admin));
  host[colon - admin] = 0;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return NULL;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return NULL;
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    close(fd);
    return NULL;
  }
  const char req[] = "GET /metrics HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  if (write(fd, req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1)) {
    close(fd);
    return NULL;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  for (ssize_t r; buf && (r = read(fd, buf + len, cap - len - 1)) > 0;) {
    len += (size_t)r;
    if (len + 1 == cap) {
      char *bigger = realloc(buf, cap *= 2);
      if (!bigger) free(buf);
      buf = bigger;
    }
  }
  close(fd);
  if (buf) buf[len] = 0;
  return buf;
}

/* The per-method call counts the daemon reports. */
static void scrape(const char *admin, counts *out) {
  memset(out, 0, sizeof(*out));
  char *text = http_get_metrics(admin);
  if (!text) bench_die("reading /metrics", admin);
  static const char key[] = "ttd_rpc_duration_seconds_count{method=\"";
  for (char *line = strstr(text, key); line && out->n < MAX_METHODS; line = strstr(line + 1, key)) {
    char *name = line + sizeof(key) - 1, *end = strchr(name, '"');
    if (!end || end - name >= 48) continue;
    memcpy(out->method[out->n], name, (size_t)(end - name));
    out->count[out->n++] = strtod(strchr(end, ' ') ? strchr(end, ' ') : end, NULL);
  }
  free(text);
  if (out->n == 0) bench_die("reading /metrics", "no ttd_rpc_duration_seconds_count lines");
}

static double calls_per_step(const char *target, const char *admin) {
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.client_name = "bench_round_trips";
  o.disable_keepalive = 1; /* only the step's own calls */
  bench_mlp *m = bench_mlp_create(target, &o, 64);
  for (int i = 0; i < WARMUP_STEPS; i++) bench_mlp_step(m);
  counts before, after;
  scrape(admin, &before);
  for (int i = 0; i < COUNTED_STEPS; i++) bench_mlp_step(m);
  scrape(admin, &after);
  bench_mlp_destroy(m);
  double total = 0;
  char detail[512] = "";
  for (int i = 0; i < after.n; i++) {
    double b = 0;
    for (int k = 0; k < before.n; k++)
      if (!strcmp(before.method[k], after.method[i])) b = before.count[k];
    double d = after.count[i] - b;
    if (d <= 0) continue;
    total += d;
    size_t len = strlen(detail);
    snprintf(detail + len, sizeof(detail) - len, " %s %.2f", after.method[i], d / COUNTED_STEPS);
  }
  bench_log("calls per step:%s", detail);
  return total / COUNTED_STEPS;
}

/* torch_step.py --serve as a child: a line "BATCH THREADS STEPS" in, ms per step out. */
typedef struct torch_ref {
  pid_t pid;
  FILE *in, *out;
} torch_ref;

static void torch_start(torch_ref *t, const char *python, const char *script) {
  int to[2], from[2];
  if (pipe(to) || pipe(from)) bench_die("pipe", strerror(errno));
  fflush(NULL);
  t->pid = fork();
  if (t->pid < 0) bench_die("fork", strerror(errno));
  if (t->pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[0]), close(to[1]), close(from[0]), close(from[1]);
    execl(python, python, script, "--serve", (char *)NULL);
    fprintf(stderr, "bench_train: cannot run %s: %s\n", python, strerror(errno));
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  t->in = fdopen(to[1], "w");
  t->out = fdopen(from[0], "r");
  if (!t->in || !t->out) bench_die("fdopen", strerror(errno));
}

static double torch_rep(torch_ref *t, int batch, int threads, int steps) {
  double ms = 0;
  if (fprintf(t->in, "%d %d %d %d\n", batch, threads, steps, REP_WARMUP_STEPS) < 0 || fflush(t->in) != 0 || fscanf(t->out, "%lf", &ms) != 1 ||
      !(ms > 0))
    bench_die("torch_step.py", "no time came back (is python3-torch installed? see above)");
  return ms;
}

static void torch_stop(torch_ref *t) {
  fclose(t->in);
  fclose(t->out);
  waitpid(t->pid, NULL, 0);
}

/* Each side's repetition starts once the other side's threads are idle (bench_wait_idle),
 * and the wait is kept in waited_ms for the log. PyTorch's OpenBLAS workers yield in a loop
 * for about 0.12 s after its last sgemm: they took most of a core from our repetitions that
 * followed (our batch-64 step measured 1.2-1.5 ms after PyTorch's turn, 0.7-0.86 ms with
 * OPENBLAS_THREAD_TIMEOUT=4, 0.7 ms alone). pid 0 (no --daemon-pid): nothing to wait for. */
static void wait_idle(int pid, double *waited_ms, int *waits) {
  if (pid <= 0) return;
  double ms = bench_wait_idle(pid, 2000);
  if (ms >= 0) waited_ms[(*waits)++] = ms;
}

/* ms per step of m over `steps` steps after the untimed ones. */
static double timed_steps(bench_mlp *m, int steps) {
  for (int i = 0; i < REP_WARMUP_STEPS; i++) bench_mlp_step(m);
  double t0 = bench_now();
  for (int i = 0; i < steps; i++) bench_mlp_step(m);
  return (bench_now() - t0) * 1e3 / steps;
}

/* Ours and PyTorch (1 and 2 threads) in turn, `reps` repetitions of `steps` steps each. */
static void train_step(const char *target, torch_ref *torch, int daemon_pid, int batch, int steps, int reps) {
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.client_name = "bench_train";
  bench_mlp *m = bench_mlp_create(target, &o, batch);
  for (int i = 0; i < WARMUP_STEPS; i++) bench_mlp_step(m);
  double *ms = calloc((size_t)reps, sizeof(double)), *t1 = calloc((size_t)reps, sizeof(double));
  double *t2 = calloc((size_t)reps, sizeof(double));
  double *torch_wait = calloc((size_t)reps, sizeof(double)), *ttd_wait = calloc((size_t)reps, sizeof(double));
  int torch_waits = 0, ttd_waits = 0;
  for (int r = 0; r < reps; r++) {
    wait_idle(torch->pid, torch_wait, &torch_waits);
    ms[r] = timed_steps(m, steps);
    wait_idle(daemon_pid, ttd_wait, &ttd_waits);
    t1[r] = torch_rep(torch, batch, 1, steps);
    t2[r] = torch_rep(torch, batch, 2, steps);
  }
  bench_mlp_destroy(m);
  if (torch_waits) bench_log("batch %d: waited a median %.0f ms for PyTorch's threads to go idle", batch,
                             bench_median(torch_wait, torch_waits));
  if (ttd_waits) bench_log("batch %d: waited a median %.0f ms for ttd's threads to go idle", batch,
                           bench_median(ttd_wait, ttd_waits));
  free(torch_wait), free(ttd_wait);
  double ref1 = bench_median(t1, reps), ref2 = bench_median(t2, reps);
  bench_log("PyTorch at batch %d: %.3f ms/step on 1 thread, %.3f on 2", batch, ref1, ref2);
  char name[64];
  snprintf(name, sizeof(name), "mlp_train_step_b%d", batch);
  bench_record(name, bench_median(ms, reps), ref1 < ref2 ? ref1 : ref2, "ms", "lower");
  free(ms), free(t1), free(t2);
}

#define BF16_CURVE_STEPS 20

/* mlp_train_step_b256_bf16: the batch-256 step with bfloat16 parameters against the same
 * step with float32 ones, both made by bench_mlp_create_dtype (equal starting values),
 * repetitions alternating; mlp_bf16_loss_dev_20: the largest difference between the losses
 * of their first 20 steps, in % of the float32 loss (reference: 1 %). */
static void bf16_step(const char *target, int daemon_pid, int steps, int reps) {
  tt_client *c = NULL;
  if (tt_connect(target, NULL, &c) != TT_OK) bench_die("tt_connect", tt_last_error(c));
  bench_mlp *f32 = bench_mlp_create_dtype(c, 256, TT_FLOAT32), *bf16 = bench_mlp_create_dtype(c, 256, TT_BFLOAT16);
  if (!f32 || !bf16) bench_die("bfloat16 model", tt_last_error(c));
  double dev = 0;
  for (int i = 0; i < BF16_CURVE_STEPS; i++) {
    float lf = 0, lh = 0;
    if (bench_mlp_try_step(f32, &lf) != TT_OK || bench_mlp_try_step(bf16, &lh) != TT_OK) {
      bench_die("bfloat16 loss curve", tt_last_error(c));
    }
    double d = 100.0 * fabs((double)lh - (double)lf) / fabs((double)lf);
    if (!(d <= dev)) dev = d; /* NaN sticks */
  }
  double *ms = calloc((size_t)reps, sizeof(double)), *ref = calloc((size_t)reps, sizeof(double));
  for (int r = 0; r < reps; r++) {
    if (daemon_pid > 0) bench_wait_idle(daemon_pid, 2000);
    ref[r] = timed_steps(f32, steps);
    if (daemon_pid > 0) bench_wait_idle(daemon_pid, 2000);
    ms[r] = timed_steps(bf16, steps);
  }
  bench_log("batch 256, bfloat16 parameters: %.3f ms/step, float32 %.3f; first %d losses within %.3f %%",
            bench_median(ms, reps), bench_median(ref, reps), BF16_CURVE_STEPS, dev);
  bench_record("mlp_train_step_b256_bf16", bench_median(ms, reps), bench_median(ref, reps), "ms", "lower");
  bench_record("mlp_bf16_loss_dev_20", dev, 1.0, "%", "lower");
  free(ms), free(ref);
  bench_mlp_destroy(f32);
  bench_mlp_destroy(bf16);
  tt_disconnect(c);
}

int main(int argc, char **argv) {
  const char *target = NULL, *admin = NULL, *python = "/usr/bin/python3", *script = "scripts/bench/torch_step.py";
  int daemon_pid = 0;
  int bad = argc % 2 == 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--target")) target = argv[i + 1];
    else if (!strcmp(argv[i], "--admin")) admin = argv[i + 1];
    else if (!strcmp(argv[i], "--python")) python = argv[i + 1];
    else if (!strcmp(argv[i], "--torch-step")) script = argv[i + 1];
    else if (!strcmp(argv[i], "--daemon-pid")) daemon_pid = atoi(argv[i + 1]);
    else bad = 1;
  }
  if (bad || !target || !admin) {
    fprintf(stderr, "usage: bench_train --target ADDR --admin HOST:PORT [--python PY] [--torch-step PATH] [--daemon-pid PID]\n");
    return 2;
  }
  int reps = bench_reps(15); /* the steps move most between runs here: more repetitions */
  torch_ref torch;
  torch_start(&torch, python, script); /* before libttclient starts gRPC threads */
  train_step(target, &torch, daemon_pid, 64, 50, reps);
  train_step(target, &torch, daemon_pid, 256, 20, reps);
  torch_stop(&torch);
  bench_record("round_trips_per_step", calls_per_step(target, admin), 2, "calls", "lower");
  bf16_step(target, daemon_pid, 20, reps);
  return 0;
}
