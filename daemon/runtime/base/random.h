/* Unguessable 64-bit values from the kernel's CSPRNG, for session ids, handles and the
 * daemon instance id. Thread-safe. Never returns 0. */
#ifndef TTD_RANDOM_H
#define TTD_RANDOM_H

#include <stdint.h>

uint64_t ttd_random_u64(void);

#endif
