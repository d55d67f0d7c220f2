#include "base/random.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/random.h>

uint64_t ttd_random_u64(void) {
  uint64_t v = 0;
  do {
    ssize_t n = getrandom(&v, sizeof(v), 0);
    if (n != (ssize_t)sizeof(v) && errno != EINTR) abort(); /* no entropy source: cannot be safe */
  } while (v == 0);
  return v;
}
