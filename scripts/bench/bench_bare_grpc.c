/* The bare gRPC-C reference: server, client and the pipe protocol to the parent. */
#define _GNU_SOURCE
#include "bench_bare_grpc.h"

#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"

#define CHUNK ((size_t)1 << 20)
#define ECHO_REPLY_BYTES 80

enum { CMD_QUIT, CMD_UPLOAD, CMD_DOWNLOAD, CMD_UNARY };
typedef struct command {
  int op, n;
} command;

struct bench_bare {
  pid_t pid;
  int to_child, from_child;
};

/* ---- the child: server and client in one process ---- */

typedef struct ref_state {
  grpc_server *server;
  grpc_completion_queue *notify_cq, *call_cq; /* server: new calls; the current call's ops */
  grpc_channel *channel;
  grpc_completion_queue *client_cq; /* pluck */
  void *m_echo, *m_upload, *m_download;
  char *server_src, *server_dst, *client_src, *client_dst;
  size_t bytes;
  char sock_dir[64];
} ref_state;

typedef struct pending {
  grpc_call *call;
  grpc_call_details details;
  grpc_metadata_array metadata;
} pending;

static void keep_slice(void *user_data) { (void)user_data; } /* the buffer outlives every call */

static gpr_timespec forever(void) { return gpr_inf_future(GPR_CLOCK_REALTIME); }

/* A 1 MiB window of buf as a message whose slice points at buf: no copy. */
static grpc_byte_buffer *zero_copy_message(char *buf, size_t len) {
  grpc_slice s = grpc_slice_new_with_user_data(buf, len, keep_slice, NULL);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

/* Copies a received message into dst[*off..] (one copy) and advances *off; bytes past cap
 * are counted, not written. */
static void copy_message(grpc_byte_buffer *bb, char *dst, size_t cap, size_t *off) {
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return;
  grpc_slice s;
  while (grpc_byte_buffer_reader_next(&r, &s)) {
    size_t len = GRPC_SLICE_LENGTH(s);
    if (*off + len <= cap) memcpy(dst + *off, GRPC_SLICE_START_PTR(s), len);
    *off += len;
    grpc_slice_unref(s);
  }
  grpc_byte_buffer_reader_destroy(&r);
}

static int server_batch(ref_state *s, grpc_call *call, const grpc_op *ops, size_t n) {
  static char tag;
  if (grpc_call_start_batch(call, ops, n, &tag, NULL) != GRPC_CALL_OK) return 0;
  grpc_event ev = grpc_completion_queue_next(s->call_cq, forever(), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

static void serve(ref_state *s, grpc_call *call, grpc_slice method) {
  const char *m = (const char *)GRPC_SLICE_START_PTR(method);
  size_t mlen = GRPC_SLICE_LENGTH(method);
#define IS(name) (mlen == sizeof(name) - 1 && memcmp(m, name, mlen) == 0)
  int kind = IS("/bench.Ref/Echo") ? CMD_UNARY : IS("/bench.Ref/Upload") ? CMD_UPLOAD : IS("/bench.Ref/Download") ? CMD_DOWNLOAD : -1;
#undef IS
  grpc_byte_buffer *in = NULL, *reply = NULL;
  grpc_op ops[4];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_RECV_MESSAGE;
  ops[1].data.recv_message.recv_message = &in;
  int ok = server_batch(s, call, ops, 2);
  if (kind == CMD_UPLOAD) {
    size_t off = 0;
    while (ok && in) {
      copy_message(in, s->server_dst, s->bytes, &off);
      grpc_byte_buffer_destroy(in);
      in = NULL;
      ok = server_batch(s, call, &ops[1], 1);
    }
  } else if (kind == CMD_DOWNLOAD) {
    for (size_t off = 0; ok && off < s->bytes; off += CHUNK) {
      size_t len = s->bytes - off < CHUNK ? s->bytes - off : CHUNK;
      grpc_byte_buffer *bb = zero_copy_message(s->server_src + off, len);
      grpc_op send = {.op = GRPC_OP_SEND_MESSAGE};
      send.data.send_message.send_message = bb;
      ok = server_batch(s, call, &send, 1);
      grpc_byte_buffer_destroy(bb);
    }
  } else if (kind == CMD_UNARY) {
    static char answer[ECHO_REPLY_BYTES];
    grpc_slice a = grpc_slice_from_copied_buffer(answer, sizeof(answer));
    reply = grpc_raw_byte_buffer_create(&a, 1);
    grpc_slice_unref(a);
  }
  if (in) grpc_byte_buffer_destroy(in);
  int cancelled = 0;
  size_t n = 0;
  memset(ops, 0, sizeof(ops));
  if (reply) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = reply;
  }
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n++].data.send_status_from_server.status = kind < 0 ? GRPC_STATUS_UNIMPLEMENTED : GRPC_STATUS_OK;
  ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[n++].data.recv_close_on_server.cancelled = &cancelled;
  server_batch(s, call, ops, n);
  if (reply) grpc_byte_buffer_destroy(reply);
}

static void request_next(ref_state *s, pending *p) {
  grpc_call_details_init(&p->details);
  grpc_metadata_array_init(&p->metadata);
  p->call = NULL;
  if (grpc_server_request_call(s->server, &p->call, &p->details, &p->metadata, s->call_cq, s->notify_cq, p) !=
      GRPC_CALL_OK)
    bench_die("grpc_server_request_call", "refused");
}

/* One call at a time; the next call is requested before the current one is served, as a
 * real server keeps requests posted. Runs until the process exits. */
static void *server_main(void *arg) {
  ref_state *s = arg;
  pending slot[2];
  request_next(s, &slot[0]);
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(s->notify_cq, forever(), NULL);
    if (ev.type != GRPC_OP_COMPLETE || !ev.success) break;
    pending *p = ev.tag, *other = p == &slot[0] ? &slot[1] : &slot[0];
    request_next(s, other);
    serve(s, p->call, p->details.method);
    grpc_call_unref(p->call);
    grpc_call_details_destroy(&p->details);
    grpc_metadata_array_destroy(&p->metadata);
  }
  return NULL;
}

static int client_batch(ref_state *s, grpc_call *call, const grpc_op *ops, size_t n) {
  static char tag;
  if (grpc_call_start_batch(call, ops, n, &tag, NULL) != GRPC_CALL_OK) return 0;
  grpc_event ev = grpc_completion_queue_pluck(s->client_cq, &tag, forever(), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

static grpc_call *client_call(ref_state *s, void *method) {
  return grpc_channel_create_registered_call(s->channel, NULL, GRPC_PROPAGATE_DEFAULTS, s->client_cq, method, forever(),
                                             NULL);
}

/* Fills ops with the opening of a client call: the initial metadata and request (when
 * request), the half-close (when half_close), and receiving the initial metadata into
 * initial (when initial). Returns how many ops. */
static size_t client_open_ops(grpc_op *ops, grpc_byte_buffer *request, int half_close, grpc_metadata_array *initial) {
  size_t n = 0;
  if (request) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = request;
  }
  if (half_close) ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  if (initial) {
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = initial;
  }
  return n;
}

/* Ends a client call in one batch: the request (when request, with the initial metadata),
 * the half-close (when half_close), the reply (when out_reply), then the status. Returns 1
 * if OK. */
static int client_finish(ref_state *s, grpc_call *call, grpc_byte_buffer *request, int half_close,
                         grpc_byte_buffer **out_reply) {
  grpc_metadata_array initial, trailing;
  grpc_metadata_array_init(&initial);
  grpc_metadata_array_init(&trailing);
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  grpc_op ops[6];
  memset(ops, 0, sizeof(ops));
  size_t n = client_open_ops(ops, request, half_close, out_reply ? &initial : NULL);
  if (out_reply) {
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = out_reply;
  }
  ops[n].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[n].data.recv_status_on_client.trailing_metadata = &trailing;
  ops[n].data.recv_status_on_client.status = &status;
  ops[n++].data.recv_status_on_client.status_details = &details;
  int ok = client_batch(s, call, ops, n) && status == GRPC_STATUS_OK;
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&initial);
  grpc_metadata_array_destroy(&trailing);
  return ok;
}

static double client_unary(ref_state *s) {
  double t0 = bench_now();
  grpc_call *call = client_call(s, s->m_echo);
  grpc_byte_buffer *req = grpc_raw_byte_buffer_create(NULL, 0), *reply = NULL;
  /* the whole unary call in one batch */
  int ok = client_finish(s, call, req, 1, &reply) && reply && grpc_byte_buffer_length(reply) == ECHO_REPLY_BYTES;
  grpc_byte_buffer_destroy(req);
  if (reply) grpc_byte_buffer_destroy(reply);
  grpc_call_unref(call);
  double us = (bench_now() - t0) * 1e6;
  return ok ? us : -1;
}

static double client_upload(ref_state *s) {
  double t0 = bench_now();
  grpc_call *call = client_call(s, s->m_upload);
  int ok = 1;
  for (size_t off = 0; ok && off < s->bytes; off += CHUNK) {
    size_t len = s->bytes - off < CHUNK ? s->bytes - off : CHUNK;
    grpc_byte_buffer *bb = zero_copy_message(s->client_src + off, len);
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    size_t n = 0;
    if (off == 0) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = bb;
    ok = client_batch(s, call, ops, n);
    grpc_byte_buffer_destroy(bb);
  }
  grpc_byte_buffer *reply = NULL;
  ok = ok && client_finish(s, call, NULL, 1, &reply);
  if (reply) grpc_byte_buffer_destroy(reply);
  grpc_call_unref(call);
  double t = bench_now() - t0;
  return ok ? t : -1;
}

static double client_download(ref_state *s) {
  double t0 = bench_now();
  grpc_call *call = client_call(s, s->m_download);
  uint64_t want = s->bytes;
  grpc_slice r = grpc_slice_from_copied_buffer((const char *)&want, sizeof(want));
  grpc_byte_buffer *req = grpc_raw_byte_buffer_create(&r, 1), *in = NULL;
  grpc_slice_unref(r);
  grpc_metadata_array initial;
  grpc_metadata_array_init(&initial);
  grpc_op ops[4];
  memset(ops, 0, sizeof(ops));
  int ok = client_batch(s, call, ops, client_open_ops(ops, req, 1, &initial));
  grpc_byte_buffer_destroy(req);
  size_t off = 0;
  grpc_op recv = {.op = GRPC_OP_RECV_MESSAGE};
  recv.data.recv_message.recv_message = &in;
  while (ok) {
    in = NULL;
    ok = client_batch(s, call, &recv, 1);
    if (!in) break; /* end of stream */
    copy_message(in, s->client_dst, s->bytes, &off);
    grpc_byte_buffer_destroy(in);
  }
  ok = ok && client_finish(s, call, NULL, 0, NULL) && off == s->bytes;
  grpc_metadata_array_destroy(&initial);
  grpc_call_unref(call);
  double t = bench_now() - t0;
  return ok ? t : -1;
}

static char *warm_buffer(size_t n, int fill) {
  char *p = malloc(n);
  if (!p) bench_die("bare gRPC reference", "out of memory");
  memset(p, fill, n);
  return p;
}

static int write_full(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int read_full(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* Creates, binds and starts the reference server of s on transport; fills target with the
 * address a client dials. */
static void server_start(ref_state *s, const char *transport, grpc_channel_args *args, char *target, size_t target_len) {
  s->server = grpc_server_create(args, NULL);
  s->notify_cq = grpc_completion_queue_create_for_next(NULL);
  s->call_cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(s->server, s->notify_cq, NULL);
  char addr[128];
  int tcp = strcmp(transport, "tcp") == 0;
  if (tcp) snprintf(addr, sizeof(addr), "127.0.0.1:0");
  else snprintf(addr, sizeof(addr), "unix:%s/ref.sock", s->sock_dir);
  grpc_server_credentials *sc = grpc_insecure_server_credentials_create();
  int port = grpc_server_add_http2_port(s->server, addr, sc);
  grpc_server_credentials_release(sc);
  if (port == 0) bench_die("binding the reference server", addr);
  if (tcp) snprintf(target, target_len, "127.0.0.1:%d", port);
  else snprintf(target, target_len, "%s", addr);
  grpc_server_start(s->server);
}

/* split: the server in a process of its own (a child of this one, as ttd is a process of
 * its own), for unary calls only; else a thread of this process. */
static void child_main(const char *transport, size_t bytes, int split, int cmd_fd, int res_fd) {
  /* GRPC-NOTES.md: keep 1 MiB receive buffers on the heap and freed memory in the process */
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  ref_state s = {.bytes = bytes};
  s.server_src = warm_buffer(bytes, 0x5a);
  s.server_dst = warm_buffer(bytes, 0);
  s.client_src = warm_buffer(bytes, 0xa5);
  s.client_dst = warm_buffer(bytes, 0);
  grpc_arg arg = {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = -1};
  grpc_channel_args args = {.num_args = 1, .args = &arg};
  char target[128];
  if (strcmp(transport, "tcp") != 0) {
    snprintf(s.sock_dir, sizeof(s.sock_dir), "/tmp/ttd-bench-ref-XXXXXX");
    if (!mkdtemp(s.sock_dir)) bench_die("mkdtemp", strerror(errno));
  }
  pid_t server_pid = -1;
  if (split) {
    if (strcmp(transport, "tcp") == 0) bench_die("bench_bare", "a split reference is unix only");
    int ready[2];
    if (pipe(ready)) bench_die("pipe", strerror(errno));
    server_pid = fork(); /* before grpc_init in either process */
    if (server_pid < 0) bench_die("fork", strerror(errno));
    if (server_pid == 0) {
      close(ready[0]);
      grpc_init();
      server_start(&s, transport, &args, target, sizeof(target));
      char one = 1;
      write_full(ready[1], &one, 1);
      server_main(&s);
      _exit(0);
    }
    close(ready[1]);
    char one = 0;
    if (read_full(ready[0], &one, 1) || one != 1) bench_die("bench_bare", "the reference server did not start");
    close(ready[0]);
    snprintf(target, sizeof(target), "unix:%s/ref.sock", s.sock_dir);
    grpc_init();
  } else {
    grpc_init();
    server_start(&s, transport, &args, target, sizeof(target));
    pthread_t thread;
    if (pthread_create(&thread, NULL, server_main, &s) != 0) bench_die("pthread_create", "failed");
  }

  grpc_channel_credentials *cc = grpc_insecure_credentials_create();
  s.channel = grpc_channel_create(target, cc, &args);
  grpc_channel_credentials_release(cc);
  s.client_cq = grpc_completion_queue_create_for_pluck(NULL);
  s.m_echo = grpc_channel_register_call(s.channel, "/bench.Ref/Echo", NULL, NULL);
  s.m_upload = grpc_channel_register_call(s.channel, "/bench.Ref/Upload", NULL, NULL);
  s.m_download = grpc_channel_register_call(s.channel, "/bench.Ref/Download", NULL, NULL);

  char ready = client_unary(&s) >= 0 ? 1 : 0;
  write_full(res_fd, &ready, 1);
  command c;
  while (ready && read_full(cmd_fd, &c, sizeof(c)) == 0 && c.op != CMD_QUIT) {
    if ((c.op == CMD_UPLOAD || c.op == CMD_DOWNLOAD) && split) {
      double t = -1; /* the bytes could not be checked across processes */
      if (write_full(res_fd, &t, sizeof(t))) break;
    } else if (c.op == CMD_UPLOAD || c.op == CMD_DOWNLOAD) {
      double t = c.op == CMD_UPLOAD ? client_upload(&s) : client_download(&s);
      if (t > 0 && c.op == CMD_UPLOAD && memcmp(s.client_src, s.server_dst, bytes) != 0) t = -1;
      if (t > 0 && c.op == CMD_DOWNLOAD && memcmp(s.server_src, s.client_dst, bytes) != 0) t = -1;
      if (write_full(res_fd, &t, sizeof(t))) break;
    } else if (c.op == CMD_UNARY) {
      /* All n latencies go back in one write after the last call: a write per call would
       * wake this bench's main process once per call, and that third process on the CPU
       * changes where the kernel places client and server (it kept them on one core, which
       * no client of ttd gets). */
      double *us = malloc(sizeof(double) * (size_t)(c.n > 0 ? c.n : 1));
      if (!us) bench_die("bench_bare", "out of memory");
      for (int i = 0; i < c.n; i++) us[i] = client_unary(&s);
      int failed = write_full(res_fd, us, sizeof(double) * (size_t)c.n);
      free(us);
      if (failed) break;
    }
  }
  if (server_pid > 0) {
    kill(server_pid, SIGKILL);
    waitpid(server_pid, NULL, 0);
  }
  if (s.sock_dir[0]) {
    char path[128];
    snprintf(path, sizeof(path), "%s/ref.sock", s.sock_dir);
    unlink(path);
    rmdir(s.sock_dir);
  }
  _exit(0); /* the OS tears down gRPC; an orderly shutdown adds nothing to a bench */
}

/* ---- the parent ---- */

static bench_bare *start(const char *transport, size_t bytes, int split) {
  int cmd[2], res[2];
  if (pipe(cmd) || pipe(res)) bench_die("pipe", strerror(errno));
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) bench_die("fork", strerror(errno));
  if (pid == 0) {
    close(cmd[1]);
    close(res[0]);
    child_main(transport, bytes, split, cmd[0], res[1]);
  }
  close(cmd[0]);
  close(res[1]);
  bench_bare *b = calloc(1, sizeof(*b));
  if (!b) bench_die("bench_bare_start", "out of memory");
  *b = (bench_bare){.pid = pid, .to_child = cmd[1], .from_child = res[0]};
  char ready = 0;
  if (read_full(b->from_child, &ready, 1) || !ready) bench_die("starting the bare gRPC reference", transport);
  return b;
}

bench_bare *bench_bare_start(const char *transport, size_t bytes) { return start(transport, bytes, 0); }
bench_bare *bench_bare_start_split(void) { return start("unix", 4096, 1); }

static double transfer(bench_bare *b, int op) {
  command c = {.op = op, .n = 1};
  double t = -1;
  if (write_full(b->to_child, &c, sizeof(c)) || read_full(b->from_child, &t, sizeof(t)) || t <= 0)
    bench_die("bare gRPC stream", "the call failed or the bytes differ");
  return t;
}

double bench_bare_upload(bench_bare *b) { return transfer(b, CMD_UPLOAD); }
double bench_bare_download(bench_bare *b) { return transfer(b, CMD_DOWNLOAD); }

void bench_bare_unary(bench_bare *b, int n, double *out_us) {
  command c = {.op = CMD_UNARY, .n = n};
  if (write_full(b->to_child, &c, sizeof(c)) || read_full(b->from_child, out_us, sizeof(double) * (size_t)n))
    bench_die("bare gRPC unary", "the reference child stopped");
  for (int i = 0; i < n; i++)
    if (out_us[i] < 0) bench_die("bare gRPC unary", "a call failed");
}

void bench_bare_stop(bench_bare *b) {
  if (!b) return;
  command c = {.op = CMD_QUIT};
  write_full(b->to_child, &c, sizeof(c));
  close(b->to_child);
  close(b->from_child);
  waitpid(b->pid, NULL, 0);
  free(b);
}
