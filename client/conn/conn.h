/* Layer client/conn: the connection to ttd (channel, session, keep-alive, gRPC calls, the
 * same-host shared-memory pool) and the client's last error; the first layer of libttclient.
 * Calls only the public API's types, the shared runtime (daemon/runtime/) and the protocol. */
#ifndef TT_CLIENT_CONN_H
#define TT_CLIENT_CONN_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/block_cache.h"
#include "base/status.h"
#include "wire/call_lane.h"
#include "wire/cq_spin.h"
#include "wire/shm_protocol.h"
#include "ttclient.h"
#include "ttd/v1/protocol.h"
#include "ttd/v1/ttd.pb-c.h"

_Static_assert(TT_MAX_DIMS == TTD_MAX_DIMS, "ttclient.h and the protocol disagree on the dims of a tensor");

#define TT_CHUNK_BYTES (1u << 20) /* one Upload message's bytes */
#define TT_LOOP_DEVICES 16        /* cards whose training loops a client counts */
#define TT_CQ_CACHE 4             /* pluck queues kept for reuse: one per thread making calls at once */

#define TT_RETURN_IF_FAILED(expr)      \
  do {                                 \
    tt_status tt_status_tmp_ = (expr); \
    if (tt_status_tmp_ != TT_OK) return tt_status_tmp_; \
  } while (0)

/* Methods of ttd.v1.Device this library calls; the order of rpc.c's paths. */
typedef enum tt_rpc_method {
  TT_RPC_OPEN_SESSION,
  TT_RPC_KEEP_ALIVE,
  TT_RPC_CLOSE_SESSION,
  TT_RPC_LIST_DEVICES,
  TT_RPC_ALLOCATE,
  TT_RPC_UPLOAD,
  TT_RPC_DOWNLOAD,
  TT_RPC_MOVE,
  TT_RPC_FREE,
  TT_RPC_COMPILE,
  TT_RPC_EXECUTE,
  TT_RPC_BACKWARD,
  TT_RPC_RELEASE_RUN,
  TT_RPC_ZERO_GRAD,
  TT_RPC_OPTIMIZER_STEP,
  TT_RPC_LIST_SESSIONS,
  TT_RPC_KILL_SESSION,
  TT_RPC_OPTIMIZER_STATE,
  TT_RPC_COUNT
} tt_rpc_method;

/* A shared-memory segment of the same-host fast path (shm_pool.c). */
typedef struct tt_shm_segment {
  uint64_t id; /* the daemon's */
  int fd;      /* the memfd, kept to register the segment again after a resume */
  unsigned char *addr;
  uint64_t size;
  bool in_use;
} tt_shm_segment;

/* Whether inline transfers, deferred uploads and queued parameter work are on: move/inline.c
 * reads TTD_INLINE the first time it is asked. */
typedef enum tt_inline_mode {
  TT_INLINE_UNREAD,
  TT_INLINE_ON,
  TT_INLINE_OFF, /* TTD_INLINE=0 */
} tt_inline_mode;

struct tt_client {
  atomic_int refs;       /* the user's, plus one per live tensor */
  bool closed;           /* tt_disconnect was called: no more calls to the daemon */
  bool grpc_initialized; /* grpc_init was called for this client: tt_disconnect balances it */
  grpc_channel *channel;
  void *registered[TT_RPC_COUNT];
  char target[256];
  char session_hex[17]; /* "" until a session is open */
  uint64_t session_id;
  char instance_id[40];
  char tenant[64];
  uint64_t quota_bytes;
  char authorization[512]; /* "Bearer TOKEN", or "" */
  /* Resuming the session after a graceful restart of ttd (conn/resume.c). */
  unsigned char resume_secret[32];
  size_t resume_secret_len;        /* 0: this ttd saves no state, nothing to resume */
  char client_name[64];
  pthread_mutex_t resume_lock;     /* one thread resumes; the others wait and retry */
  atomic_uint resume_generation;   /* counts resumes: a call retries once the session is back */
  int64_t resume_timeout_ms;       /* how long to wait for ttd to come back */
  bool shm_wanted;                 /* the fast path was not turned off (options, TTD_SHM) */
  uint32_t lease_ms;
  int64_t call_timeout_ms;
  ttd_cq_spin spin;        /* the wait for a light call's answer (disable_spin, TTD_SPIN) */
  ttd_cq_spin device_spin; /* the wait for device work's answer (the same switches) */

  /* The last error of the threads that have none of their own on this client (error.c). */
  pthread_mutex_t error_lock;
  tt_status errcode;
  char errmsg[1024];
  uint64_t error_key; /* this client among all a process makes: whose a thread's last error is */

  ttd_block_cache blocks;   /* large host buffers kept for reuse (without shared memory) */
  int shm_fd;               /* the side socket, or -1: no fast path */
  uint64_t shm_key[2];      /* the session's key on it */
  pthread_mutex_t shm_lock; /* guards the segments */
  tt_shm_segment *segments;
  size_t n_segments, cap_segments;
  /* The session's call lane (call_lane.c): its device calls without gRPC, one at a time. */
  pthread_mutex_t lane_lock;  /* held by the call on the lane; a call that finds it held uses gRPC */
  ttd_lane_header *lane;      /* mapped, or NULL: no lane (none registered, or broken) */
  int lane_ring_fd, lane_answer_fd;
  int lane_watch_fd;          /* the side socket as the lane was registered on it: its hang-up ends a wait */
  uint64_t lane_seq;

  /* Pluck queues of finished calls, reused by the next ones (rpc.c). */
  pthread_mutex_t cq_lock;
  grpc_completion_queue *cq_free[TT_CQ_CACHE];
  int cq_count;

  pthread_t keepalive_thread;
  bool keepalive_running;
  bool stopping;
  pthread_mutex_t keepalive_lock;
  pthread_cond_t keepalive_cond;

  /* Fewer round trips: state of the layers above kept per client (move/inline.c,
   * module/); all zero until first used. */
  tt_inline_mode inline_mode;
  atomic_int training_loops[TT_LOOP_DEVICES]; /* per device: modules in a training loop there */
  atomic_int deferred_modules;                /* modules holding a queued tt_step / tt_zero_grad */
};

/* ---- the client (client.c) ---- */

/* Tensors keep their client (struct) alive after tt_disconnect. */
tt_client *tt_client_retain(tt_client *client);
void tt_client_release(tt_client *client);

/* ---- errors (error.c) ---- */

/* Records an error on the client and returns its code. */
/* Gives a new client its error_key (error.c). */
void tt_client_error_init(tt_client *client);
tt_status tt_client_fail(tt_client *client, tt_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Records a runtime status (not OK) as the client's error, frees it and returns its code. */
tt_status tt_client_fail_status(tt_client *client, ttd_status_t status);

/* ---- calls (rpc.c) ---- */

/* Registers every method of tt_rpc_method on client's channel (client->registered). */
void tt_rpc_register(tt_client *client);

/* One unary call: packs request, sends it with the session metadata, unpacks the
 * response (free it with protobuf_c_message_free_unpacked). Records errors. */
tt_status tt_rpc_unary(tt_client *client, tt_rpc_method method, const ProtobufCMessage *request,
                       const ProtobufCMessageDescriptor *response_type, ProtobufCMessage **out_response);

/* The same, reporting the error into err instead of the client's last error. */
tt_status tt_rpc_unary_quiet(tt_client *client, tt_rpc_method method, const ProtobufCMessage *request,
                             const ProtobufCMessageDescriptor *response_type, ProtobufCMessage **out_response,
                             char *err, size_t err_len);

/* Frees the daemon's tensors handles[0..n) with one quiet Free call: a session already
 * closed has freed them anyway. */
void tt_rpc_free_quiet(tt_client *client, uint64_t *handles, size_t n);

/* Destroys the pluck queues kept for reuse; calls ending later destroy their own. For
 * tt_disconnect, after `closed` is set and before grpc_shutdown. */
void tt_rpc_cq_cache_clear(tt_client *client);

/* Streams bytes (in header's source dtype) into the tensor the header names. */
tt_status tt_rpc_upload(tt_client *client, const Ttd__V1__UploadHeader *header, const void *data, uint64_t bytes,
                        Ttd__V1__UploadResponse **out_response);

/* Streams a device tensor into dst, which holds exactly bytes bytes of target dtype. */
tt_status tt_rpc_download(tt_client *client, uint64_t handle, tt_dtype target, void *dst, uint64_t bytes,
                          uint64_t shm_segment);

/* ---- resuming after a restart (resume.c) ---- */

/* Takes OpenSession's answer: session, instance, lease, quota, keys and the resume secret. */
void tt_session_adopt(tt_client *client, const Ttd__V1__OpenSessionResponse *resp);

/* Whether a call of method that failed with st and message err should wait for ttd to come
 * back and resume the session, then run again: ttd is unreachable, stopping or restarted, and
 * this session can be resumed. */
bool tt_resume_wanted(tt_client *client, tt_rpc_method method, tt_status st, const char *err);

/* Whether OpenSession's failure st, when resuming, is final: ttd answered, and will not
 * resume the session (not: unreachable, stopping, or not answering in time). */
bool tt_resume_refused(tt_status st);

/* Resumes the session for a call of method unless another thread did since generation (read
 * before the failed call): waits up to resume_timeout_ms for ttd (5 s at most to close it), OpenSession with the secret, registers the
 * shared-memory segments again. On failure err says why (and keeps the call's own error). */
tt_status tt_resume(tt_client *client, tt_rpc_method method, unsigned generation, char *err, size_t err_len);

/* ---- process and host (malloc_tuning.c, shm_pool.c) ---- */

/* Raises glibc's malloc thresholds for big buffers, once per process, unless the program
 * keeps its own. */
void tt_malloc_tune(const tt_connect_options *options);

/* The same-host fast path. connect: after OpenSession, when the daemon named a side socket
 * and the target is local (silently none otherwise). alloc: bytes in a registered segment,
 * or NULL (use malloc) below min_bytes or without the fast path. */
void tt_shm_connect(tt_client *client, const char *path, const tt_connect_options *options);
void *tt_shm_alloc(tt_client *client, uint64_t bytes, uint64_t min_bytes, uint64_t *out_segment);
void tt_shm_free(tt_client *client, void *addr);
void tt_shm_destroy(tt_client *client);
/* After a resume: the side socket at path again, and every segment registered under its
 * id. On failure the fast path is off for new tensors. */
void tt_shm_reattach(tt_client *client, const char *path);
/* One request on the side socket (under shm_lock, or before any other thread has the
 * client): 0 when the daemon answered OK (with two descriptors into out_fds, when not NULL,
 * which a reply without them fails). */
int tt_shm_request(tt_client *client, const ttd_shm_request *req, int fd, ttd_shm_reply *reply, int out_fds[2]);

/* ---- the call lane (call_lane.c) ---- */
/* Registers the session's call lane on the side socket (none without one, with TTD_LANE=0,
 * or when the daemon refuses it: calls then go over gRPC), after tt_shm_connect, and a new
 * one after tt_shm_reattach; tt_lane_close before tt_shm_destroy. */
void tt_lane_open(tt_client *client);
void tt_lane_close(tt_client *client);
/* A unary device call on the lane: -1 when the lane cannot take it (none, busy with another
 * thread's call, a request too large), the caller then makes it over gRPC; else its status,
 * *out_response set on TT_OK, err filled otherwise, as tt_rpc_unary does. */
int tt_lane_call(tt_client *client, const char *path, const ProtobufCMessage *request,
                 const ProtobufCMessageDescriptor *response_type, ProtobufCMessage **out_response,
                 int64_t timeout_ms, char *err, size_t err_len);

#endif
