/* tt_demo: lists the daemon's devices and moves a tensor host -> tt:0 DRAM -> L1 (or
 * tt:1) -> host, checking the bytes and printing each step. Exit 0 when all matched. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ttclient.h"

static int fail(tt_client *c, const char *what) {
  fprintf(stderr, "tt_demo: %s failed: %s: %s\n", what, tt_status_name(tt_errcode(c)), tt_last_error(c));
  return 1;
}

int main(int argc, char **argv) {
  tt_client *c = NULL;
  if (tt_connect(argc > 1 ? argv[1] : NULL, NULL, &c) != TT_OK) {
    int rc = fail(c, "connect");
    tt_disconnect(c);
    return rc;
  }
  printf("connected: session %016" PRIx64 ", daemon instance %s\n", tt_session_id(c), tt_instance_id(c));

  tt_device_info *devs = NULL;
  size_t ndev = 0;
  if (tt_list_devices(c, &devs, &ndev) != TT_OK) return fail(c, "list devices");
  for (size_t i = 0; i < ndev; i++) {
    printf("  %s  %-18s %3u cores  dram %6.2f/%6.2f GiB  l1 %6.2f/%6.2f MiB\n", devs[i].name, devs[i].kind, devs[i].cores,
           devs[i].dram.used_bytes / 1073741824.0, devs[i].dram.capacity_bytes / 1073741824.0,
           devs[i].l1.used_bytes / 1048576.0, devs[i].l1.capacity_bytes / 1048576.0);
  }

  enum { ROWS = 256, COLS = 1024 };
  float *data = malloc(sizeof(float) * ROWS * COLS);
  for (int i = 0; i < ROWS * COLS; i++) data[i] = (float)i * 0.25f - 1000.0f;
  int64_t shape[2] = {ROWS, COLS};
  tt_tensor *host = tt_tensor_from_host(c, data, TT_FLOAT32, shape, 2);
  tt_tensor *dram = tt_to(host, "tt");
  if (!dram) return fail(c, "upload");
  printf("cpu -> %s: %" PRIu64 " bytes, handle %016" PRIx64 "\n", tt_tensor_device(dram), tt_tensor_nbytes(dram),
         tt_tensor_handle(dram));
  const char *second = ndev > 1 ? "tt:1" : "tt:0/l1";
  tt_tensor *moved = tt_to(dram, second);
  if (!moved) return fail(c, "move");
  printf("%s -> %s on the daemon, no host trip\n", tt_tensor_device(dram), tt_tensor_device(moved));
  tt_tensor *bf16 = tt_to_dtype(host, "tt", TT_BFLOAT16);
  if (!bf16) return fail(c, "bfloat16 upload");
  printf("cpu float32 -> %s bfloat16: %" PRIu64 " bytes on the card\n", tt_tensor_device(bf16), tt_tensor_nbytes(bf16));
  tt_tensor *back = tt_to(moved, "cpu");
  if (!back) return fail(c, "download");
  int same = memcmp(tt_tensor_data(back), data, sizeof(float) * ROWS * COLS) == 0;
  printf("%s -> cpu: %s\n", tt_tensor_device(moved), same ? "bytes identical" : "BYTES DIFFER");

  tt_tensor_free(back);
  tt_tensor_free(bf16);
  tt_tensor_free(moved);
  tt_tensor_free(dram);
  tt_tensor_free(host);
  tt_device_list_free(devs);
  if (tt_list_devices(c, &devs, &ndev) == TT_OK) {
    printf("after free: tt:0 dram in use %" PRIu64 " bytes\n", devs[0].dram.used_bytes);
    tt_device_list_free(devs);
  }
  free(data);
  tt_disconnect(c);
  return same ? 0 : 1;
}
