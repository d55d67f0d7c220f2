#include "fuzz_random.h"

#include <stdatomic.h>

#include "base/random.h"

static _Atomic uint64_t next_value;

void fuzz_random_reset(void) { atomic_store(&next_value, FUZZ_RANDOM_BASE); }

uint64_t ttd_random_u64(void) { return atomic_fetch_add(&next_value, 1) + 1; }
