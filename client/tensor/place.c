/* Device strings: "cpu", "tt", "tt:N", "tt:N/dram", "tt:N/l1", "tt/l1". */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/tensor.h"

int tt_place_parse(const char *text, tt_place *out_place) {
  memset(out_place, 0, sizeof(*out_place));
  if (!text) return -1;
  if (strcmp(text, "cpu") == 0) {
    out_place->is_host = true;
    return 0;
  }
  if (strncmp(text, "tt", 2) != 0) return -1;
  const char *p = text + 2;
  if (*p == ':') {
    p++;
    if (!isdigit((unsigned char)*p)) return -1;
    errno = 0;
    char *end;
    long v = strtol(p, &end, 10);
    if (errno || v > 1023) return -1;
    out_place->device = (int)v;
    p = end;
  }
  if (*p == '\0') return 0;
  if (strcmp(p, "/dram") == 0) return 0;
  if (strcmp(p, "/l1") == 0) {
    out_place->l1 = true;
    return 0;
  }
  return -1;
}

void tt_place_format(const tt_place *place, char *buf, size_t len) {
  if (place->is_host) snprintf(buf, len, "cpu");
  else snprintf(buf, len, "tt:%d%s", place->device, place->l1 ? "/l1" : "");
}

Ttd__V1__MemoryLocation tt_place_wire(const tt_place *place, char *device, size_t len) {
  snprintf(device, len, "tt:%d", place->device);
  return place->l1 ? TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_L1 : TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_DRAM;
}
