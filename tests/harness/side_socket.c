#include "side_socket.h"

#include <check.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "raw_rpc.h"
#include "ttd/v1/ttd.pb-c.h"
#include "wire/fd_passing.h"

int harness_side_socket(const ttd_proc *proc) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  char path[sizeof(proc->target) + 8];
  snprintf(path, sizeof(path), "%.90s.shm", proc->target + 5);
  ck_assert_uint_lt(strlen(path), sizeof(sa.sun_path));
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  return fd;
}

ttd_shm_reply harness_side_request(int sock, ttd_shm_request req, int fd, int out_fds[2]) {
  ck_assert_int_eq(ttd_send_fds(sock, &req, sizeof(req), &fd, fd >= 0 ? 1 : 0), sizeof(req));
  ttd_shm_reply reply;
  int got[2], count = 0;
  bool truncated;
  ck_assert_int_eq(ttd_recv_fds(sock, &reply, sizeof(reply), 0, got, 2, &count, &truncated), sizeof(reply));
  for (int i = 0; i < 2; i++) {
    int v = i < count ? got[i] : -1;
    if (out_fds) out_fds[i] = v;
    else if (v >= 0) close(v);
  }
  return reply;
}

void harness_open_session_with_key_as(const ttd_proc *proc, const char *authorization, char session[17],
                                      uint64_t key[2]) {
  Ttd__V1__OpenSessionRequest req = TTD__V1__OPEN_SESSION_REQUEST__INIT;
  req.protocol_version = 1;
  uint8_t buf[64];
  raw_result r;
  raw_call(proc->target, "/ttd.v1.Device/OpenSession", (raw_md){.authorization = authorization}, buf,
           ttd__v1__open_session_request__pack(&req, buf), &r);
  ck_assert_int_eq(r.code, 0);
  Ttd__V1__OpenSessionResponse *resp = ttd__v1__open_session_response__unpack(NULL, r.body_len, r.body);
  snprintf(session, 17, "%016llx", (unsigned long long)resp->session_id);
  key[0] = resp->shm_key_hi;
  key[1] = resp->shm_key_lo;
  ck_assert(key[0] || key[1]);
  ttd__v1__open_session_response__free_unpacked(resp, NULL);
  raw_result_free(&r);
}

void harness_open_session_with_key(const ttd_proc *proc, char session[17], uint64_t key[2]) {
  harness_open_session_with_key_as(proc, NULL, session, key);
}
