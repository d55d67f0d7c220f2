/* The bare gRPC-C reference the transfer and RPC benches compare ttd with: the best this
 * gRPC can do without any of ttd's layers. A child process holds a tiny gRPC server with
 * three generic (unregistered-path, raw-bytes) methods and a client channel to it:
 *   /bench.Ref/Echo      unary: an 80-byte reply, about a ListDevices answer
 *   /bench.Ref/Upload    client stream: 1 MiB messages, each copied once into a warm buffer
 *   /bench.Ref/Download  server stream: 1 MiB zero-copy slices over a buffer
 *                        (grpc_slice_new_with_user_data), each copied once on arrival
 * with malloc's trim and mmap thresholds raised, as GRPC-NOTES.md advises. It runs in a
 * child so that those malloc settings never help the libttclient side measured in the
 * parent; the parent commands it through pipes, one repetition at a time, so ours and the
 * reference can be interleaved. The parent must not have called grpc_init() before
 * bench_bare_start (fork and gRPC's threads do not mix). Not thread-safe. */
#ifndef TTD_BENCH_BARE_GRPC_H
#define TTD_BENCH_BARE_GRPC_H

#include <stddef.h>

typedef struct bench_bare bench_bare;

/* Forks the reference: server and client over transport "unix" (a temporary socket) or
 * "tcp" (127.0.0.1, a free port); streams move `bytes` bytes. Exits via bench_die on error. */
bench_bare *bench_bare_start(const char *transport, size_t bytes);

/* The same over "unix" with the server in a process of its own, as ttd is, for unary calls
 * only (a transfer there answers -1: its bytes cannot be checked across processes). */
bench_bare *bench_bare_start_split(void);

/* Seconds for one whole upload (or download) call of `bytes`. */
double bench_bare_upload(bench_bare *b);
double bench_bare_download(bench_bare *b);

/* Makes n unary calls in a row and writes each one's latency in microseconds to out_us. */
void bench_bare_unary(bench_bare *b, int n, double *out_us);

/* Stops the child and frees b. Accepts NULL. */
void bench_bare_stop(bench_bare *b);

#endif
