/* The monotonic clock that leases, deadlines and logs of ttd count in. */
#ifndef TTD_CLOCK_H
#define TTD_CLOCK_H

#include <stdint.h>

/* Milliseconds of CLOCK_MONOTONIC. */
int64_t ttd_now_ms(void);
/* Nanoseconds of CLOCK_MONOTONIC. */
int64_t ttd_now_ns(void);

#endif
