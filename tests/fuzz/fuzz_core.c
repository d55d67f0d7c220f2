#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS */
#include "fuzz_core.h"

#include <dirent.h>
#include <fcntl.h>
#include <grpc/support/alloc.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "telemetry/log.h"
#include "rpc/method.h"
#include "fuzz_random.h"

static ttd_config config;
static ttd_core *core;

ttd_core *fuzz_core_begin_input(void) {
  fuzz_random_reset();
  if (core) return core;
  ttd_log_threshold = TTD_LOG_ERROR + 1; /* quiet: every bad input would log */
  ttd_config_defaults(&config);
  config.devices = 2;
  config.dram = 1u << 20; /* small cards: no input can make a program run for long */
  config.l1 = 256u << 10;
  config.cores = 1; /* kernels on the calling thread: deterministic, and no hand-over per kernel */
  ttd_status_t status = ttd_core_create(&config, &core);
  if (status) {
    fprintf(stderr, "fuzz: cannot create the daemon core: %s\n", ttd_status_message(status));
    abort();
  }
  fuzz_random_reset(); /* the instance id took a value */
  return core;
}

/* The shared-memory segment every session registers, mapped once: each session takes a
 * reference (a map and unmap per input would cost more than the input). */
static ttd_shm_segment *shm_segment(void) {
  static ttd_shm_segment *segment;
  if (segment) return segment;
  int fd = memfd_create("ttd-fuzz-shm", MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, FUZZ_SHM_BYTES) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    perror("fuzz: cannot make the shared-memory segment");
    abort();
  }
  ttd_status_t status = ttd_shm_segment_map(fd, FUZZ_SHM_BYTES, &segment);
  close(fd);
  if (status) {
    fprintf(stderr, "fuzz: cannot map the shared-memory segment: %s\n", ttd_status_message(status));
    abort();
  }
  return segment;
}

uint64_t fuzz_core_open_session(ttd_core *c, uint64_t quota) {
  ttd_session_params params = {.client_name = "fuzz", .tenant = TTD_LOCAL_TENANT, .peer = "fuzz", .quota = quota};
  ttd_session *session = NULL;
  ttd_shm_segment *segment = ttd_shm_segment_retain(shm_segment());
  memset(segment->addr, 0, FUZZ_SHM_BYTES); /* what an earlier input downloaded there is gone */
  uint64_t segment_id = 0;
  ttd_status_t status = ttd_session_table_open(&c->sessions, &params, ttd_now_ms(), &session);
  if (!status) status = ttd_session_segment_add(session, segment, getuid(), &segment_id);
  if (status) {
    fprintf(stderr, "fuzz: cannot open a session with a segment: %s\n", ttd_status_message(status));
    abort();
  }
  uint64_t id = session->id;
  ttd_session_release(session);
  return id;
}

void fuzz_backend_assert_empty(ttd_backend *backend, const char *when) {
  int devices = backend->vtable->device_count(backend);
  for (int d = 0; d < devices; d++) {
    ttd_device_info info;
    backend->vtable->device_info(backend, d, &info);
    for (int m = 0; m < TTD_MEM_COUNT; m++) {
      if (info.memory[m].used_bytes == 0) continue;
      fprintf(stderr, "fuzz: accounting leak: tt:%d %s still holds %" PRIu64 " bytes %s\n", d,
              ttd_memloc_name(info.memory[m].location), info.memory[m].used_bytes, when);
      abort();
    }
  }
}

void fuzz_core_end_input(ttd_core *c) {
  ttd_session **sessions = NULL;
  size_t n = 0;
  ttd_status_t status = ttd_session_table_snapshot(&c->sessions, &sessions, &n);
  if (status) {
    fprintf(stderr, "fuzz: %s\n", ttd_status_message(status));
    abort();
  }
  for (size_t i = 0; i < n; i++) ttd_session_table_close(&c->sessions, sessions[i], NULL, NULL);
  ttd_session_table_snapshot_free(sessions, n);
  ttd_program_cache_destroy(&c->programs);
  ttd_program_cache_init(&c->programs);
  fuzz_backend_assert_empty(c->backend, "after every session was closed");
}

int fuzz_open_fds(void) {
  DIR *dir = opendir("/proc/self/fd");
  if (!dir) {
    perror("fuzz: cannot list /proc/self/fd");
    abort();
  }
  int n = 0;
  for (struct dirent *e; (e = readdir(dir));) n += e->d_name[0] != '.';
  closedir(dir);
  return n - 1; /* the listing's own */
}

void fuzz_call_begin(fuzz_call *fc, ttd_core *c, const ttd_method *method, uint64_t session_id, fuzz_session_md md) {
  memset(fc, 0, sizeof(*fc));
  ttd_call_init(&fc->call, c, method);
  if (md == FUZZ_MD_NONE) return;
  if (md == FUZZ_MD_BAD_ID) snprintf(fc->session_text, sizeof(fc->session_text), "%s", "not-a-session");
  else snprintf(fc->session_text, sizeof(fc->session_text), "%016" PRIx64, session_id);
  /* The array is freed by ttd_call_deinit (grpc_metadata_array_destroy); the slices are static. */
  grpc_metadata *md_list = gpr_malloc(2 * sizeof(*md_list));
  memset(md_list, 0, 2 * sizeof(*md_list));
  md_list[0].key = grpc_slice_from_static_string("ttd-session");
  md_list[0].value = grpc_slice_from_static_buffer(fc->session_text, strlen(fc->session_text));
  size_t count = 1;
  if (md == FUZZ_MD_OTHER_INSTANCE) {
    md_list[1].key = grpc_slice_from_static_string("ttd-instance");
    md_list[1].value = grpc_slice_from_static_string("00000000deadbeef");
    count = 2;
  }
  fc->call.request_metadata.metadata = md_list;
  fc->call.request_metadata.count = count;
  fc->call.request_metadata.capacity = 2;
}

void fuzz_call_end(fuzz_call *fc) { ttd_call_deinit(&fc->call); }

grpc_byte_buffer *fuzz_byte_buffer(const uint8_t *data, size_t len, size_t slice_bytes) {
  grpc_slice slices[16];
  size_t n = 0, at = 0;
  while (at < len || n == 0) {
    size_t take = len - at;
    if (slice_bytes && take > slice_bytes && n < 15) take = slice_bytes;
    slices[n++] = grpc_slice_from_copied_buffer((const char *)data + at, take);
    at += take;
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(slices, n);
  for (size_t i = 0; i < n; i++) grpc_slice_unref(slices[i]);
  return bb;
}

void fuzz_check_response(const ttd_method *method, const ProtobufCMessage *response) {
  if (!response) {
    fprintf(stderr, "fuzz: %s answered OK without a response message\n", method->path);
    abort();
  }
  size_t len = protobuf_c_message_get_packed_size(response);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) abort();
  if (protobuf_c_message_pack(response, buf) != len) {
    fprintf(stderr, "fuzz: the response of %s packs to another size than it said\n", method->path);
    abort();
  }
  ProtobufCMessage *back = protobuf_c_message_unpack(response->descriptor, NULL, len, buf);
  if (!back) {
    fprintf(stderr, "fuzz: the response of %s (%zu bytes) does not unpack\n", method->path, len);
    abort();
  }
  protobuf_c_message_free_unpacked(back, NULL);
  free(buf);
}

void fuzz_check_status(const char *what, ttd_status_t status) {
  ttd_code code = ttd_status_code(status);
  if (code == GRPC_STATUS_INTERNAL || code == GRPC_STATUS_UNKNOWN || (int)code < 0 || (int)code > 16) {
    fprintf(stderr, "fuzz: %s answered %s (%d) to a client's input: %s\n", what, ttd_code_name(code), (int)code,
            ttd_status_message(status));
    abort();
  }
  if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "fuzz: %s: %s %s\n", what, ttd_code_name(code), ttd_status_message(status));
  ttd_status_free(status);
}

const ttd_method *fuzz_method(const char *path) {
  for (size_t i = 0; i < ttd_method_count; i++) {
    if (strcmp(ttd_methods[i].path, path) == 0) return &ttd_methods[i];
  }
  fprintf(stderr, "fuzz: no method %s in the table\n", path);
  abort();
}
