#include "wire/address.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int ttd_default_address(char *buf, size_t len) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  int n;
  if (geteuid() == 0) {
    n = snprintf(buf, len, "unix:/run/ttd/ttd.sock");
  } else if (xdg && xdg[0] == '/') {
    n = snprintf(buf, len, "unix:%s/ttd.sock", xdg);
  } else {
    n = snprintf(buf, len, "unix:/tmp/ttd-%u/ttd.sock", (unsigned)geteuid());
  }
  return n < 0 || (size_t)n >= len ? -1 : 0;
}
