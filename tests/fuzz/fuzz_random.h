/* A deterministic ttd_random_u64 for the fuzz harnesses, linked in place of
 * daemon/random.c: handles, session ids and keys count up from a fixed base that each
 * input resets, so a crashing input replays exactly and the fuzzer can name the handles a
 * sequence of calls creates (small numbers rather than 64 random bits). */
#ifndef TTD_FUZZ_RANDOM_H
#define TTD_FUZZ_RANDOM_H

#include <stdint.h>

/* The first value a harness input draws after fuzz_random_reset is FUZZ_RANDOM_BASE + 1. */
#define FUZZ_RANDOM_BASE 0x10

/* Restarts the sequence; call at the start of each input. */
void fuzz_random_reset(void);

#endif
