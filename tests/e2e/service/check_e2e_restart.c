/* Training across a restart of ttd (--state-dir): a training loop whose daemon stops
 * gracefully and starts again mid-run finishes with the same losses and parameters, bit for
 * bit, as one that was never interrupted; a resume needs the session's secret; a crash
 * resumes nothing; torn, foreign and unsafe state is refused; an unresumed session goes with
 * its lease, and its files with it; a resumed session's data file is the one its next save
 * writes over, and goes when the session ends. */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "raw_rpc.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

static ttd_proc proc;
static char state_dir[128];
static const char *args[] = {"--state-dir", state_dir, "--lease", "20", NULL};

static void start(void) {
  char dir[64] = "/tmp/ttd-state-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(state_dir, sizeof(state_dir), "%s/state-dir", dir);
  ttd_proc_start(&proc, args);
}

static void finish(void) {
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
  char cmd[192];
  snprintf(cmd, sizeof(cmd), "rm -rf '%.*s'", (int)(strrchr(state_dir, '/') - state_dir), state_dir);
  ck_assert_int_eq(system(cmd), 0);
}

/* A graceful restart: SIGTERM (ttd saves), then a new ttd on the same socket and state. */
static void restart(void) {
  ck_assert_int_eq(ttd_proc_kill(&proc, SIGTERM), 0);
  ttd_proc_respawn(&proc, args);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

enum { N = 16, IN = 12, H = 32, OUT = 5, STEPS = 12 };

typedef struct training {
  tt_client *client;
  tt_module *module;
  tt_optimizer *opt;
  tt_tensor *x, *target;
} training;

static void training_start(training *t) {
  t->client = harness_connect(&proc, 1);
  tt_graph *g = tt_graph_create(t->client, 7);
  int64_t xs[2] = {N, IN};
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  tt_value h = tt_relu(g, tt_nn_linear(g, x, H, 1));
  ck_assert_int_eq(tt_graph_output(g, tt_nn_linear(g, h, OUT, 1)), 0);
  t->module = tt_compile(t->client, g);
  tt_graph_free(g);
  ck_assert_ptr_nonnull(t->module);
  ck_assert_int_eq(tt_module_to(t->module, "tt"), TT_OK);
  t->opt = tt_adam(t->module, 0.01f, 0.0f, 0);
  ck_assert_ptr_nonnull(t->opt);
  int64_t s[2] = {N, IN}, ts[2] = {N, OUT};
  tt_tensor *xh = tt_tensor_from_host(t->client, NULL, TT_FLOAT32, s, 2);
  t->target = tt_tensor_from_host(t->client, NULL, TT_FLOAT32, ts, 2);
  float *xd = tt_tensor_data(xh), *td = tt_tensor_data(t->target);
  for (int i = 0; i < N * IN; i++) xd[i] = (float)((i * 37) % 23 - 11) / 11.0f;
  for (int i = 0; i < N * OUT; i++) td[i] = (float)((i * 13) % 7 - 3) / 3.0f;
  t->x = tt_to(xh, "tt");
  ck_assert_msg(t->x != NULL, "%s", tt_last_error(t->client));
  tt_tensor_free(xh);
}

/* One step: forward on the card, the loss on the CPU, backward into the card, Adam there.
 * restart_between: the daemon restarts after the forward, while its run waits for the
 * backward. */
static float training_step(training *t, int restart_between) {
  tt_tensor *y = NULL;
  ck_assert_msg(tt_forward(t->module, &t->x, 1, &y) == TT_OK, "%s", tt_last_error(t->client));
  if (restart_between) restart();
  tt_tensor *yh = tt_to(y, "cpu");
  ck_assert_msg(yh != NULL, "%s", tt_last_error(t->client));
  tt_tensor *loss = tt_mse_loss(yh, t->target);
  ck_assert_ptr_nonnull(loss);
  float value = tt_tensor_item(loss);
  ck_assert_msg(tt_backward(loss) == TT_OK, "%s", tt_last_error(t->client));
  ck_assert_msg(tt_step(t->opt) == TT_OK, "%s", tt_last_error(t->client));
  ck_assert_msg(tt_zero_grad(t->opt) == TT_OK, "%s", tt_last_error(t->client));
  tt_tensor_free(loss);
  tt_tensor_free(yh);
  tt_tensor_free(y);
  return value;
}

/* The module's parameters, on the host, in order, into out (at most cap floats). */
static int training_params(training *t, float *out, int cap) {
  int n = 0;
  for (int i = 0; i < tt_module_param_count(t->module); i++) {
    tt_tensor *p = tt_module_param(t->module, tt_module_param_name(t->module, i));
    tt_tensor *h = tt_to(p, "cpu");
    ck_assert_msg(h != NULL, "%s", tt_last_error(t->client));
    int count = (int)(tt_tensor_nbytes(h) / sizeof(float));
    ck_assert_int_le(n + count, cap);
    memcpy(out + n, tt_tensor_data(h), (size_t)count * sizeof(float));
    n += count;
    tt_tensor_free(h);
    tt_tensor_free(p);
  }
  return n;
}

static void training_end(training *t) {
  tt_tensor_free(t->x);
  tt_tensor_free(t->target);
  tt_optimizer_free(t->opt);
  tt_module_free(t->module);
  tt_disconnect(t->client);
}

/* Two restarts: one between steps, one between a forward and its backward (the kept run,
 * Adam's moments and the gradients all come back); losses and parameters as without. */
START_TEST(test_training_across_restarts_is_bit_exact) {
  start();
  enum { CAP = IN * H + H + H * OUT + OUT };
  float want_loss[STEPS], got_loss[STEPS], want_params[CAP], got_params[CAP];
  training t;
  training_start(&t);
  for (int s = 0; s < STEPS; s++) want_loss[s] = training_step(&t, 0);
  int n = training_params(&t, want_params, CAP);
  training_end(&t);

  training_start(&t);
  uint64_t session = tt_session_id(t.client);
  char instance[40];
  snprintf(instance, sizeof(instance), "%s", tt_instance_id(t.client));
  for (int s = 0; s < STEPS; s++) {
    if (s == 4) restart();
    got_loss[s] = training_step(&t, s == 8);
  }
  ck_assert_int_eq(training_params(&t, got_params, CAP), n);
  ck_assert_uint_eq(tt_session_id(t.client), session); /* the same session, resumed */
  ck_assert_str_ne(tt_instance_id(t.client), instance);  /* under a new daemon */
  for (int s = 0; s < STEPS; s++) {
    ck_assert_msg(memcmp(&got_loss[s], &want_loss[s], sizeof(float)) == 0, "step %d: loss %.9g, uninterrupted %.9g", s,
                  got_loss[s], want_loss[s]);
  }
  ck_assert_msg(memcmp(got_params, want_params, (size_t)n * sizeof(float)) == 0, "parameters differ");
  training_end(&t);
  ck_assert_int_eq(harness_log_count(&proc, "event=state-saved"), 2);
  ck_assert_int_eq(harness_log_count(&proc, "event=resumed"), 2);
  finish();
}
END_TEST

/* Files are the daemon user's alone; a resumed session's files are gone at once. */
static int count_files(const char *dir, const char *suffix) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name), sl = strlen(suffix);
    n += len > sl && strcmp(e->d_name + len - sl, suffix) == 0;
  }
  closedir(d);
  return n;
}

/* A saved session answers only to its secret: a wrong one, or none, is NOT_FOUND like an
 * unknown session; another tenant's calls cannot reach it, and its own plain calls are told
 * to resume first. Files are private and leave the state once it is resumed: the data file
 * to DIR/spare/, still private, until the session ends. */
START_TEST(test_resume_needs_the_secret) {
  start();
  tt_client *c = harness_connect(&proc, 0);
  int64_t n = 4;
  tt_tensor *h = tt_tensor_from_host(c, NULL, TT_FLOAT32, &n, 1);
  for (int i = 0; i < 4; i++) ((float *)tt_tensor_data(h))[i] = (float)i + 0.5f;
  tt_tensor *d = tt_to(h, "tt");
  ck_assert_ptr_nonnull(d);
  uint64_t id = tt_session_id(c);
  ck_assert_int_eq(ttd_proc_kill(&proc, SIGTERM), 0);
  char state[160], path[224];
  snprintf(state, sizeof(state), "%s/state", state_dir);
  ck_assert_int_eq(count_files(state, ".session"), 1);
  ck_assert_int_eq(count_files(state, ".safetensors"), 1);
  struct stat st;
  ck_assert_int_eq(stat(state, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0700);
  snprintf(path, sizeof(path), "%s/%016llx.safetensors", state, (unsigned long long)id);
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0600);
  ttd_proc_respawn(&proc, args);

  Ttd__V1__OpenSessionRequest req = TTD__V1__OPEN_SESSION_REQUEST__INIT;
  req.protocol_version = 1;
  req.resume_session = id;
  uint8_t wrong[32] = {1};
  req.resume_secret.data = wrong;
  req.resume_secret.len = sizeof(wrong);
  raw_md none = {0};
  raw_expect(proc.target, "/ttd.v1.Device/OpenSession", &req.base, none, 5 /* NOT_FOUND */, "cannot be resumed");
  req.resume_secret.len = 0;
  raw_expect(proc.target, "/ttd.v1.Device/OpenSession", &req.base, none, 5, "cannot be resumed");
  req.resume_session = id ^ 1;
  raw_expect(proc.target, "/ttd.v1.Device/OpenSession", &req.base, none, 5, "cannot be resumed");
  char hex[17];
  snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)id);
  Ttd__V1__KeepAliveRequest ka = TTD__V1__KEEP_ALIVE_REQUEST__INIT;
  raw_md plain = {.session = hex};
  raw_expect(proc.target, "/ttd.v1.Device/KeepAlive", &ka.base, plain, 9 /* FAILED_PRECONDITION */, "resume");

  tt_tensor *back = tt_to(d, "cpu"); /* the client resumes by itself */
  ck_assert_msg(back != NULL, "%s", tt_last_error(c));
  for (int i = 0; i < 4; i++) ck_assert_float_eq(((float *)tt_tensor_data(back))[i], (float)i + 0.5f);
  ck_assert_int_eq(count_files(state, ".session"), 0);
  ck_assert_int_eq(count_files(state, ".safetensors"), 0);
  char spare[160];
  snprintf(spare, sizeof(spare), "%s/spare", state_dir);
  ck_assert_int_eq(count_files(spare, ".safetensors"), 1);
  snprintf(path, sizeof(path), "%s/%016llx.safetensors", spare, (unsigned long long)id);
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0600);
  ck_assert_int_eq(stat(spare, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0700);
  tt_tensor_free(back);
  tt_tensor_free(d);
  tt_tensor_free(h);
  tt_disconnect(c); /* the session ends, and its spare with it */
  for (int i = 0; i < 250 && count_files(spare, ".safetensors"); i++) sleep_ms(20); /* unlinked in the background */
  ck_assert_int_eq(count_files(spare, ".safetensors"), 0);
  finish();
}
END_TEST

/* n floats of value v + i, uploaded. */
static tt_tensor *upload_ramp(tt_client *c, int64_t n, float v) {
  tt_tensor *h = tt_tensor_from_host(c, NULL, TT_FLOAT32, &n, 1);
  ck_assert_ptr_nonnull(h);
  for (int64_t i = 0; i < n; i++) ((float *)tt_tensor_data(h))[i] = v + (float)i;
  tt_tensor *d = tt_to(h, "tt");
  ck_assert_ptr_nonnull(d);
  tt_tensor_free(h);
  return d;
}

static void expect_ramp(tt_client *c, tt_tensor *d, int64_t n, float v) {
  tt_tensor *back = tt_to(d, "cpu"); /* resumes the session after a restart */
  ck_assert_msg(back != NULL, "%s", tt_last_error(c));
  for (int64_t i = 0; i < n; i++) ck_assert_float_eq(((float *)tt_tensor_data(back))[i], v + (float)i);
  tt_tensor_free(back);
}

static ino_t inode_of(const char *dir, uint64_t id) {
  char path[256];
  snprintf(path, sizeof(path), "%s/%016llx.safetensors", dir, (unsigned long long)id);
  struct stat st;
  ck_assert_msg(stat(path, &st) == 0, "%s is missing", path);
  return st.st_ino;
}

/* Each save of a resumed session writes over the data file of the restart before, cut or
 * grown to the new size, and reads back whole: a descriptor held on the spare sees the same
 * file, still linked, become the state's data file and a spare again (an inode number alone
 * could be reused by a new file). DIR/spare/ goes at the stop, and a stray spare of an
 * earlier run at the start. */
static void expect_same_file(int held, const char *dir, uint64_t id) {
  struct stat st;
  ck_assert_int_eq(fstat(held, &st), 0);
  ck_assert_uint_eq(st.st_nlink, 1);
  ck_assert_uint_eq(st.st_ino, inode_of(dir, id));
}

START_TEST(test_resumed_session_saves_over_its_data_file) {
  start();
  tt_client *c = harness_connect(&proc, 0);
  uint64_t id = tt_session_id(c);
  char state[160], spare[160], path[224];
  snprintf(state, sizeof(state), "%s/state", state_dir);
  snprintf(spare, sizeof(spare), "%s/spare", state_dir);
  tt_tensor *big = upload_ramp(c, 1 << 16, 1.0f);
  restart();
  expect_ramp(c, big, 1 << 16, 1.0f);
  snprintf(path, sizeof(path), "%s/%016llx.safetensors", spare, (unsigned long long)id);
  int held = open(path, O_RDONLY | O_CLOEXEC);
  ck_assert_int_ge(held, 0);
  tt_tensor_free(big);
  tt_tensor *small = upload_ramp(c, 100, 7.0f); /* the state shrinks: the file is cut */
  ck_assert_int_eq(ttd_proc_kill(&proc, SIGTERM), 0);
  expect_same_file(held, state, id);
  ck_assert_int_eq(count_files(spare, ""), -1); /* no spare/ while ttd is down */
  ck_assert_int_eq(mkdir(spare, 0700), 0);
  snprintf(path, sizeof(path), "%s/00000000deadbeef.safetensors", spare);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  ttd_proc_respawn(&proc, args);
  ck_assert_int_eq(count_files(spare, ".safetensors"), 0); /* the stray one is gone */
  expect_ramp(c, small, 100, 7.0f);
  expect_same_file(held, spare, id);
  tt_tensor *grown = upload_ramp(c, 1 << 17, 3.0f); /* and grows: the file is extended */
  restart();
  expect_ramp(c, small, 100, 7.0f);
  expect_ramp(c, grown, 1 << 17, 3.0f);
  expect_same_file(held, spare, id);
  ck_assert_int_eq(harness_log_count(&proc, "event=state-refused"), 0);
  close(held);
  tt_tensor_free(small);
  tt_tensor_free(grown);
  tt_disconnect(c);
  finish();
}
END_TEST

/* After a crash nothing is resumed: the client's call fails as before state existed. */
START_TEST(test_crash_resumes_nothing) {
  start();
  tt_client *c = harness_connect(&proc, 0);
  tt_tensor *d = tt_tensor_empty(c, TT_FLOAT32, (int64_t[]){8}, 1, "tt");
  ck_assert_ptr_nonnull(d);
  ck_assert_int_eq(ttd_proc_kill(&proc, SIGKILL), 128 + SIGKILL);
  ttd_proc_respawn(&proc, args);
  tt_tensor *back = tt_to(d, "cpu");
  ck_assert_ptr_null(back);
  ck_assert_int_eq(tt_errcode(c), TT_FAILED_PRECONDITION);
  ck_assert_msg(strstr(tt_last_error(c), "daemon restarted, tensors are gone"), "%s", tt_last_error(c));
  tt_tensor_free(d);
  tt_disconnect(c);
  finish();
}
END_TEST

/* Truncates, or rewrites, one file of the saved state before the restart. */
typedef enum damage { TRUNCATE_DATA, OTHER_FORMAT, LOOSE_MODE, GRAD_OF_ANOTHER_SHAPE } damage;

/* The message of descriptor's type in the file at path, unpacked. */
static ProtobufCMessage *read_message(const char *path, const ProtobufCMessageDescriptor *descriptor) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  size_t len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(len + 1);
  ck_assert_uint_eq(fread(buf, 1, len, f), len);
  fclose(f);
  ProtobufCMessage *msg = protobuf_c_message_unpack(descriptor, NULL, len, buf);
  ck_assert_ptr_nonnull(msg);
  free(buf);
  return msg;
}

/* Packs msg over the file at path: its size, its crc32 in *out_crc (NULL: not wanted). */
static size_t write_message(const char *path, const ProtobufCMessage *msg, uint32_t *out_crc) {
  size_t len = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = malloc(len + 1);
  protobuf_c_message_pack(msg, buf);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
  fclose(f);
  if (out_crc) *out_crc = (uint32_t)crc32_z(crc32_z(0, NULL, 0), buf, (z_size_t)len);
  free(buf);
  return len;
}

/* The session file's first tensor gets the second (of another shape) as its .grad, with the
 * manifest's size and checksum made to match: a file that reads back whole, whose link a
 * step would follow past the end of the smaller tensor. */
static void link_grad_of_another_shape(void) {
  char path[256], session_path[256];
  snprintf(path, sizeof(path), "%s/state/MANIFEST", state_dir);
  Ttd__V1__SavedState *m = (Ttd__V1__SavedState *)read_message(path, &ttd__v1__saved_state__descriptor);
  ck_assert_uint_eq(m->n_sessions, 1);
  Ttd__V1__SavedFile *meta = m->sessions[0]->meta;
  snprintf(session_path, sizeof(session_path), "%s/state/%s", state_dir, meta->name);
  Ttd__V1__SavedSession *s = (Ttd__V1__SavedSession *)read_message(session_path, &ttd__v1__saved_session__descriptor);
  ck_assert_uint_eq(s->n_tensors, 2);
  s->tensors[0]->grad = 2;
  meta->bytes = write_message(session_path, &s->base, &meta->crc32);
  write_message(path, &m->base, NULL);
  ttd__v1__saved_session__free_unpacked(s, NULL);
  ttd__v1__saved_state__free_unpacked(m, NULL);
}

static void damage_state(damage how, uint64_t id) {
  char path[256];
  if (how == GRAD_OF_ANOTHER_SHAPE) {
    link_grad_of_another_shape();
  } else if (how == TRUNCATE_DATA) {
    snprintf(path, sizeof(path), "%s/state/%016llx.safetensors", state_dir, (unsigned long long)id);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(truncate(path, st.st_size - 3), 0);
  } else if (how == OTHER_FORMAT) {
    snprintf(path, sizeof(path), "%s/state/MANIFEST", state_dir);
    Ttd__V1__SavedState m = TTD__V1__SAVED_STATE__INIT;
    m.format = 2;
    m.daemon_version = "9.0.0";
    write_message(path, &m.base, NULL);
  } else {
    snprintf(path, sizeof(path), "%s/state", state_dir);
    ck_assert_int_eq(chmod(path, 0755), 0);
  }
}

/* Damaged state is refused whole, set aside with a log line that says why; the daemon
 * serves, and the client learns its session is gone. */
START_TEST(test_damaged_state_is_refused) {
  static const char *const why[] = {"torn or truncated", "state format 2", "private to it",
                                    ".grad or optimizer state is not float32 of its shape"};
  start();
  tt_client *c = harness_connect(&proc, 0);
  tt_tensor *d = tt_tensor_empty(c, TT_FLOAT32, (int64_t[]){1024}, 1, "tt");
  ck_assert_ptr_nonnull(d);
  tt_tensor *small = tt_tensor_empty(c, TT_FLOAT32, (int64_t[]){4}, 1, "tt");
  ck_assert_ptr_nonnull(small);
  ck_assert_int_eq(ttd_proc_kill(&proc, SIGTERM), 0);
  damage_state((damage)_i, tt_session_id(c));
  ttd_proc_respawn(&proc, args);
  ck_assert_int_eq(harness_log_count(&proc, "event=state-refused"), 1);
  ck_assert_int_eq(harness_log_count(&proc, why[_i]), 1);
  ck_assert_int_eq(harness_log_count(&proc, "event=state-loaded"), 0);
  char refused[160];
  snprintf(refused, sizeof(refused), "%s", state_dir);
  ck_assert_int_eq(count_files(refused, "state"), 0); /* moved aside: no "state" left */
  ck_assert_ptr_null(tt_to(d, "cpu"));
  ck_assert_int_eq(tt_errcode(c), TT_FAILED_PRECONDITION);
  ck_assert_msg(strstr(tt_last_error(c), "could not resume"), "%s", tt_last_error(c));
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  tt_tensor_free(d);
  tt_tensor_free(small);
  tt_disconnect(c);
  finish();
}
END_TEST

/* A state folder others may enter stops ttd from starting, saying what to fix. */
START_TEST(test_unsafe_state_dir_stops_the_start) {
  start();
  ck_assert_int_eq(ttd_proc_kill(&proc, SIGTERM), 0);
  ck_assert_int_eq(chmod(state_dir, 0755), 0);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(proc.log_path, O_WRONLY | O_APPEND);
    dup2(fd, 2);
    const char *bin = getenv("TTD_BIN") ? getenv("TTD_BIN") : "build/bin/ttd";
    execl(bin, "ttd", "--listen", proc.target, "--admin", "off", "--state-dir", state_dir, (char *)NULL);
    _exit(127);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1);
  ck_assert_int_eq(harness_log_count(&proc, "chmod 700"), 1);
  ck_assert_int_eq(chmod(state_dir, 0700), 0);
  ttd_proc_respawn(&proc, args);
  finish();
}
END_TEST

/* A second ttd on the same state folder is refused at start while the first runs. */
START_TEST(test_one_ttd_per_state_dir) {
  start();
  char other[160], log[200];
  snprintf(other, sizeof(other), "unix:%s/other.sock", proc.dir);
  snprintf(log, sizeof(log), "%s/other.log", proc.dir);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    const char *bin = getenv("TTD_BIN") ? getenv("TTD_BIN") : "build/bin/ttd";
    execl(bin, "ttd", "--listen", other, "--admin", "off", "--state-dir", state_dir, (char *)NULL);
    _exit(127);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1);
  FILE *f = fopen(log, "r");
  char text[4096] = "";
  size_t n = fread(text, 1, sizeof(text) - 1, f);
  text[n] = '\0';
  fclose(f);
  ck_assert_msg(strstr(text, "another ttd uses this state folder"), "%s", text);
  finish();
}
END_TEST

/* A session nobody resumes goes with its lease after the restart: memory and files. */
START_TEST(test_unresumed_session_expires) {
  static const char *short_lease[] = {"--state-dir", state_dir, "--lease", "300ms", NULL};
  start();
  tt_client *c = harness_connect(&proc, 0);
  tt_tensor *d = tt_tensor_empty(c, TT_FLOAT32, (int64_t[]){4096}, 1, "tt");
  ck_assert_ptr_nonnull(d);
  ck_assert_int_eq(ttd_proc_kill(&proc, SIGTERM), 0);
  ttd_proc_respawn(&proc, short_lease);
  ck_assert_int_eq(harness_log_count(&proc, "event=state-loaded dir"), 1);
  char state[160];
  snprintf(state, sizeof(state), "%s/state", state_dir);
  ck_assert_int_eq(count_files(state, ".safetensors"), 1);
  ck_assert_uint_eq(harness_wait_used_bytes(&proc, 0, 0, 0, 5000), 0);
  for (int i = 0; i < 100 && count_files(state, ".safetensors"); i++) sleep_ms(20);
  ck_assert_int_eq(count_files(state, ".safetensors"), 0);
  ck_assert_int_eq(count_files(state, ".session"), 0);
  tt_tensor_free(d);
  tt_disconnect(c);
  finish();
}
END_TEST

Suite *e2e_restart_suite(void) {
  Suite *s = suite_create("e2e_restart");
  TCase *tc = tcase_create("restart");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_training_across_restarts_is_bit_exact);
  tcase_add_test(tc, test_resume_needs_the_secret);
  tcase_add_test(tc, test_resumed_session_saves_over_its_data_file);
  tcase_add_test(tc, test_crash_resumes_nothing);
  tcase_add_loop_test(tc, test_damaged_state_is_refused, TRUNCATE_DATA, GRAD_OF_ANOTHER_SHAPE + 1);
  tcase_add_test(tc, test_unsafe_state_dir_stops_the_start);
  tcase_add_test(tc, test_unresumed_session_expires);
  tcase_add_test(tc, test_one_ttd_per_state_dir);
  suite_add_tcase(s, tc);
  return s;
}
