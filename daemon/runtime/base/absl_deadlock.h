/* Abseil's debug deadlock detection, which Debian 12's build (under gRPC 1.51) leaves on:
 * every absl::Mutex lock inside gRPC then records a lock-order graph, about 8k instructions
 * of a small call on each side. ttd and libttclient turn it off before grpc_init. */
#ifndef TTD_ABSL_DEADLOCK_H
#define TTD_ABSL_DEADLOCK_H

/* Sets absl::SetMutexDeadlockDetectionMode(kIgnore), the mode of release builds of Abseil,
 * unless TTD_ABSL_DEADLOCK_DETECTION=1. Returns 1 if it did, 0 if kept on by that variable
 * or where this Abseil does not export the switch (then nothing changes). */
int ttd_absl_deadlock_detection_off(void);

#endif
