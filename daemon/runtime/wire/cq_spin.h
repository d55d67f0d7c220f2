/* Waiting on a gRPC completion queue by polling before sleeping. A thread that expects an
 * event soon (ttd's poller after it answered a light call, since light calls come in runs;
 * a client waiting for a light call's answer) polls the queue without blocking, yielding
 * the CPU between polls, for up to a window, and only then sleeps in epoll_wait. A small
 * call whose two sides both sleep pays two wake-ups across vCPUs; when neither sleeps it
 * takes about half the time (docs/performance.md, rpc_small).
 *
 * The window adapts as KVM's halt polling does: after a wait that outlasted the window but
 * ended within the maximum it doubles (from 10 us, up to the maximum); after a wait longer
 * than the maximum it halves, to 0 below 10 us, so a thread whose peer is slow stops
 * spinning until waits are short again. Shared by ttd and libttclient; thread-safe (the
 * window is a relaxed atomic: threads sharing one only race on a hint). */
#ifndef TTD_CQ_SPIN_H
#define TTD_CQ_SPIN_H

#include <grpc/grpc.h>
#include <stdatomic.h>
#include <stdint.h>

/* The window's maximum for a light call: on a guest whose vCPUs halt when idle a round trip
 * with both sides asleep takes 200-250 us, and both sides polling take it to 80 us, so the
 * window must outlast the slow round trip to catch the fast one. */
#define TTD_CQ_SPIN_DEFAULT_US 1000
/* A client's window for the answer of device work: a training step's Execute takes
 * milliseconds, and a thread that sleeps through it leaves its vCPU to halt, so the
 * answer pays a wake-up through the hypervisor (docs/performance.md). */
#define TTD_CQ_SPIN_DEVICE_US 10000
#define TTD_CQ_SPIN_GROW_START_NS 10000

typedef struct ttd_cq_spin {
  int64_t max_ns;            /* 0: never spin */
  atomic_llong window_ns;    /* the current window, 0..max_ns */
  atomic_ullong hits;        /* waits whose event came while spinning */
  atomic_ullong misses;      /* waits that spun, then slept */
  atomic_ullong spin_ns;     /* time spent spinning, hits and misses */
} ttd_cq_spin;

/* Sets a spin of at most max_us microseconds (0: none), the window starting full. */
void ttd_cq_spin_init(ttd_cq_spin *spin, int64_t max_us);

/* The next event of cq (tag NULL: a GRPC_CQ_NEXT queue) or tag's event (a GRPC_CQ_PLUCK
 * queue), by deadline (GRPC_QUEUE_TIMEOUT past it), polling for up to the window first. */
grpc_event ttd_cq_spin_wait(ttd_cq_spin *spin, grpc_completion_queue *cq, void *tag, gpr_timespec deadline);

/* The window after a wait that took waited_ns with window window_ns (the rule above). */
int64_t ttd_cq_spin_next_window(int64_t window_ns, int64_t max_ns, int64_t waited_ns);

#endif
