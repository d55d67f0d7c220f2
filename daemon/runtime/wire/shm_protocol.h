/* The side socket of the same-host fast path (SOCK_SEQPACKET, one request and one reply
 * per message). A local client creates memfd segments, maps them, and hands each to the
 * daemon once with TTD_SHM_REGISTER and the fd attached (SCM_RIGHTS); the daemon maps it
 * into the session and replies with the segment's id. Upload and Download then name
 * (segment, offset, length) instead of carrying bytes. With TTD_SHM_LANE and a memfd of
 * TTD_LANE_BYTES attached, the client registers its session's call lane (call_lane.h); the
 * reply then carries the lane's two eventfds (ring, answer; SCM_RIGHTS). Shared by ttd and
 * libttclient. */
#ifndef TTD_SHM_PROTOCOL_H
#define TTD_SHM_PROTOCOL_H

#include <stdint.h>

#define TTD_SHM_MAGIC 0x31535454u /* "TTS1" */
#define TTD_SHM_MAX_SEGMENTS 1024 /* per session */
#define TTD_SHM_MAX_SESSION_BYTES (64ull << 30) /* mapped per session, at most */
#define TTD_SHM_MAX_CONNECTIONS 1024

enum { TTD_SHM_REGISTER = 1, TTD_SHM_RELEASE = 2, TTD_SHM_LANE = 3 };

typedef struct ttd_shm_request {
  uint32_t magic;
  uint32_t op;
  uint64_t session_id;
  uint64_t segment_id; /* RELEASE: which; REGISTER: the id wanted (a resumed session's), 0: any */
  uint64_t size;       /* REGISTER: bytes to map (at most the memfd's size) */
  uint64_t key[2];     /* the session's shm_key from OpenSession: a session id alone is not enough */
} ttd_shm_request;

typedef struct ttd_shm_reply {
  int32_t code;        /* a gRPC status code; 0 = OK */
  uint32_t reserved;
  uint64_t segment_id; /* REGISTER: the new segment's id */
  char message[240];   /* why, when code != 0 */
} ttd_shm_reply;

#endif
