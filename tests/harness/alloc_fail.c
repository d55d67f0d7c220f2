/* harness_fail_callocs: check_ttd's calloc wrapper (alloc_fail.h). */
#include "alloc_fail.h"

#include <errno.h>
#include <stddef.h>

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);

static _Thread_local int failing; /* calls left to fail on this thread */

void harness_fail_callocs(int n) { failing = n; }

void *__wrap_calloc(size_t n, size_t size) {
  if (failing > 0) {
    failing--;
    errno = ENOMEM;
    return NULL;
  }
  return __real_calloc(n, size);
}
