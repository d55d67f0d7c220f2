/* bench_rpc: latency of a tiny ttd RPC (tt_list_devices: one ListDevices round trip, an
 * empty request and a ~80-byte answer) against a bare gRPC-C unary call of about the same
 * size on the bench's own server (bench_bare_grpc.h), both over a Unix socket. The
 * reference's server is a process of its own, as ttd is: a call between two threads of one
 * process skips the switch between address spaces that every call to a daemon pays (that
 * in-process figure is printed too, for comparison).
 *   bench_rpc --target unix:/path
 * records rpc_small_p50 and rpc_small_p99 in microseconds: the median over repetitions of
 * each repetition's percentile, ours and the references alternating. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_bare_grpc.h"
#include "bench_common.h"
#include "ttclient.h"

#define CALLS 2000
#define WARMUP 200

int main(int argc, char **argv) {
  if (argc != 3 || strcmp(argv[1], "--target")) {
    fprintf(stderr, "usage: bench_rpc --target unix:/path\n");
    return 2;
  }
  int reps = bench_reps(9);
  bench_bare *bare = bench_bare_start_split(); /* before libttclient starts gRPC */
  bench_bare *threads = bench_bare_start("unix", 1 << 20);
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.client_name = "bench_rpc";
  tt_client *c = NULL;
  if (tt_connect(argv[2], &o, &c) != TT_OK) bench_die("tt_connect", tt_last_error(c));

  double *lat = malloc(sizeof(double) * CALLS), *ref = malloc(sizeof(double) * CALLS);
  double *p50 = calloc((size_t)reps, sizeof(double)), *p99 = calloc((size_t)reps, sizeof(double));
  double *ref50 = calloc((size_t)reps, sizeof(double)), *ref99 = calloc((size_t)reps, sizeof(double));
  double *in50 = calloc((size_t)reps, sizeof(double)), *in99 = calloc((size_t)reps, sizeof(double));
  for (int r = -1; r < reps; r++) {
    int n = r < 0 ? WARMUP : CALLS;
    for (int i = 0; i < n; i++) {
      tt_device_info *devices = NULL;
      size_t count = 0;
      double t0 = bench_now();
      tt_status st = tt_list_devices(c, &devices, &count);
      lat[i] = (bench_now() - t0) * 1e6;
      if (st != TT_OK) bench_die("tt_list_devices", tt_last_error(c));
      tt_device_list_free(devices);
    }
    bench_bare_unary(bare, n, ref);
    if (r >= 0) {
      p50[r] = bench_percentile(lat, CALLS, 50);
      p99[r] = bench_percentile(lat, CALLS, 99);
      ref50[r] = bench_percentile(ref, CALLS, 50);
      ref99[r] = bench_percentile(ref, CALLS, 99);
    }
    bench_bare_unary(threads, n, ref);
    if (r >= 0) {
      in50[r] = bench_percentile(ref, CALLS, 50);
      in99[r] = bench_percentile(ref, CALLS, 99);
    }
  }
  bench_log("bare gRPC with client and server in one process: p50 %.1f us, p99 %.1f us", bench_median(in50, reps),
            bench_median(in99, reps));
  bench_record("rpc_small_p50", bench_median(p50, reps), bench_median(ref50, reps), "us", "lower");
  bench_record("rpc_small_p99", bench_median(p99, reps), bench_median(ref99, reps), "us", "lower");
  tt_disconnect(c);
  bench_bare_stop(bare);
  bench_bare_stop(threads);
  free(lat), free(ref), free(p50), free(p99), free(ref50), free(ref99), free(in50), free(in99);
  return 0;
}
