/* Out of memory on demand, for the paths that handle it: check_ttd is linked with
 * -Wl,--wrap=calloc, so the project's own calloc calls (not those inside shared libraries)
 * come here first. */
#ifndef TTD_TESTS_ALLOC_FAIL_H
#define TTD_TESTS_ALLOC_FAIL_H

/* The calling thread's next n calloc calls from the project's code return NULL (errno
 * ENOMEM), as out of memory would; other threads' are untouched. */
void harness_fail_callocs(int n);

#endif
