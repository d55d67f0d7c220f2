/* The hogs: one tenant exhausting device memory while the bystander trains.
 *   hog-quota  64 MiB DRAM tensors until its quota refuses one (RESOURCE_EXHAUSTED naming
 *              the quota); keeps them.
 *   hog-l1     8 MiB L1 tensors until the card's L1 is full (RESOURCE_EXHAUSTED naming l1);
 *              keeps them; then one DRAM tensor larger than the card (naming dram).
 * Each refusal is an EVENT: code, message, value[0] = bytes held when refused. Then READY,
 * and it holds everything until SIGKILLed. */
#include <string.h>
#include <unistd.h>

#include "faults.h"

#define MAX_TENSORS 4096

/* Allocates tensors of floats elements on device until one is refused; reports the refusal. */
static void fill(tt_client *c, const char *device, int64_t floats, tt_tensor **held, int *count) {
  uint64_t bytes = 0;
  while (*count < MAX_TENSORS) {
    tt_tensor *t = tt_tensor_empty(c, TT_FLOAT32, &floats, 1, device);
    if (!t) break;
    held[(*count)++] = t;
    bytes += tt_tensor_nbytes(t);
  }
  ft_report(FT_MSG_EVENT, tt_errcode(c), tt_session_id(c), (double[6]){(double)bytes}, "%s", tt_last_error(c));
}

int fc_hog_main(const fc_args *a) {
  static tt_tensor *held[MAX_TENSORS];
  int count = 0;
  tt_client *c = fc_connect(a, 1);
  ft_report(FT_MSG_SESSION, 0, tt_session_id(c), NULL, NULL);
  if (!strcmp(a->role, "hog-quota")) {
    fill(c, "tt", (int64_t)16 << 20, held, &count);
  } else {
    fill(c, "tt:0/l1", (int64_t)2 << 20, held, &count);
    tt_device_info *devices = NULL;
    size_t n = 0;
    if (tt_list_devices(c, &devices, &n) != TT_OK || n == 0) fc_die(c, "tt_list_devices");
    int64_t too_many = (int64_t)(devices[0].dram.capacity_bytes / 4 + 1);
    tt_device_list_free(devices);
    tt_tensor *t = tt_tensor_empty(c, TT_FLOAT32, &too_many, 1, "tt");
    ft_report(FT_MSG_EVENT, t ? TT_OK : tt_errcode(c), tt_session_id(c), NULL, "%s", t ? "" : tt_last_error(c));
    tt_tensor_free(t);
  }
  ft_report(FT_MSG_READY, 0, tt_session_id(c), NULL, NULL);
  for (;;) pause();
}
