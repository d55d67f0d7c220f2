/* bench_transfer: a 64 MiB float32 tensor to the card and back with tt_to, in GB/s.
 *   bench_transfer --target unix:/path --prefix local --reference memcpy
 *   bench_transfer --target 127.0.0.1:PORT --insecure --prefix tcp --reference grpc-tcp
 * records <prefix>_upload_64MiB and <prefix>_download_64MiB. The reference is either a
 * single-thread memcpy of the same 64 MiB into a warm buffer, or the bare gRPC-C zero-copy
 * stream of 1 MiB chunks (bench_bare_grpc.h) over the same transport. Ours and the
 * reference alternate, repetition by repetition; results are medians. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_bare_grpc.h"
#include "bench_common.h"
#include "ttclient.h"

#define BYTES ((size_t)64 << 20)

/* Seconds for one single-thread memcpy of BYTES into the warm buffer dst. */
static double copy_seconds(char *dst, const char *src) {
  double t0 = bench_now();
  memcpy(dst, src, BYTES);
  return bench_now() - t0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: bench_transfer --target ADDR [--insecure] --prefix NAME --reference memcpy|grpc-unix|grpc-tcp\n");
  exit(2);
}

int main(int argc, char **argv) {
  const char *target = NULL, *prefix = NULL, *reference = NULL;
  int insecure = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--insecure")) insecure = 1;
    else if (i + 1 >= argc) usage();
    else if (!strcmp(argv[i], "--target")) target = argv[++i];
    else if (!strcmp(argv[i], "--prefix")) prefix = argv[++i];
    else if (!strcmp(argv[i], "--reference")) reference = argv[++i];
    else usage();
  }
  if (!target || !prefix || !reference) usage();
  int use_memcpy = !strcmp(reference, "memcpy");
  if (!use_memcpy && strcmp(reference, "grpc-unix") && strcmp(reference, "grpc-tcp")) usage();
  int reps = bench_reps(9);

  /* the reference first: its child must be forked before libttclient starts gRPC */
  bench_bare *bare = use_memcpy ? NULL : bench_bare_start(reference + 5, BYTES);
  char *src = malloc(BYTES), *dst = malloc(BYTES);
  if (!src || !dst) bench_die("allocating 64 MiB buffers", "out of memory");
  unsigned long long rng = 42;
  bench_fill_random((float *)src, BYTES / sizeof(float), &rng);
  memset(dst, 0, BYTES); /* warm: every page mapped */

  tt_connect_options o;
  tt_connect_options_init(&o);
  o.client_name = "bench_transfer";
  o.insecure = insecure;
  tt_client *c = NULL;
  if (tt_connect(target, &o, &c) != TT_OK) bench_die("tt_connect", tt_last_error(c));
  int64_t shape[2] = {4096, 4096};
  tt_tensor *host = tt_tensor_from_host(c, src, TT_FLOAT32, shape, 2);
  if (!host) bench_die("tt_tensor_from_host", tt_last_error(c));

  /* one untimed round of each, then the timed repetitions: ours and the reference in turn */
  double *up = calloc((size_t)reps, sizeof(double)), *down = calloc((size_t)reps, sizeof(double));
  double *ref_up = calloc((size_t)reps, sizeof(double)), *ref_down = calloc((size_t)reps, sizeof(double));
  for (int r = -1; r < reps; r++) {
    double t0 = bench_now();
    tt_tensor *dev = tt_to(host, "tt");
    double t_up = bench_now() - t0;
    if (!dev) bench_die("tt_to(host, \"tt\")", tt_last_error(c));
    double tr_up = use_memcpy ? copy_seconds(dst, src) : bench_bare_upload(bare);

    t0 = bench_now();
    tt_tensor *back = tt_to(dev, "cpu");
    double t_down = bench_now() - t0;
    if (!back) bench_die("tt_to(device, \"cpu\")", tt_last_error(c));
    double tr_down = use_memcpy ? copy_seconds(dst, src) : bench_bare_download(bare);
    if (memcmp(tt_tensor_data(back), src, BYTES) != 0) bench_die("the round trip", "the bytes came back different");
    tt_tensor_free(back);
    tt_tensor_free(dev);
    if (r < 0) continue;
    up[r] = BYTES / t_up * 1e-9;
    down[r] = BYTES / t_down * 1e-9;
    ref_up[r] = BYTES / tr_up * 1e-9;
    ref_down[r] = BYTES / tr_down * 1e-9;
  }
  char name[64];
  snprintf(name, sizeof(name), "%s_upload_64MiB", prefix);
  bench_record(name, bench_median(up, reps), bench_median(ref_up, reps), "GB/s", "higher");
  snprintf(name, sizeof(name), "%s_download_64MiB", prefix);
  bench_record(name, bench_median(down, reps), bench_median(ref_down, reps), "GB/s", "higher");

  tt_tensor_free(host);
  tt_disconnect(c);
  bench_bare_stop(bare);
  free(up), free(down), free(ref_up), free(ref_down), free(src), free(dst);
  return 0;
}
