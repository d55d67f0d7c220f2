/* The simulated card: host memory stands in for each card's DRAM and L1, with fixed
 * capacities and exact byte accounting; backing memory is taken at allocation, not up
 * front. Defaults model a Wormhole n150: 12 GiB DRAM, 108 MiB L1 (72 cores x 1.5 MiB). */
#ifndef TTD_SIM_BACKEND_H
#define TTD_SIM_BACKEND_H

#include "backends/backend.h"

#define TTD_SIM_DEFAULT_DRAM_BYTES (12ull << 30)
#define TTD_SIM_DEFAULT_L1_BYTES (108ull << 20)
#define TTD_SIM_CORES_PER_CARD 72u

ttd_status_t ttd_sim_backend_create(const ttd_backend_options *options, ttd_backend **out_backend);

#endif
