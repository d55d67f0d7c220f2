/* scripts/soak: many client processes doing a mixed load against one ttd for a while.
 * The driver (soak_main.c) starts a ttd (scripts/faults-src/ft_daemon.h), N clients
 * (soak_client.c, this program run with --child) and samples the daemon's RSS and the
 * card's memory in use every second; at the end it gathers each client's call latencies
 * (soak_latency.c) and errors. */
#ifndef TTD_SOAK_H
#define TTD_SOAK_H

#include <stdint.h>

/* What a client does, one operation at a time (each one or a few calls). */
typedef enum soak_op {
  SOAK_UPLOAD,   /* tt_to of a host tensor of 1 KiB..8 MiB to "tt" */
  SOAK_DOWNLOAD, /* tt_to of one of its device tensors to "cpu", bytes checked */
  SOAK_ALLOCATE, /* tt_tensor_empty on "tt" */
  SOAK_FREE,     /* tt_tensor_free of a device tensor (a Free) */
  SOAK_EXECUTE,  /* an eval forward of a small program on the card, output checked */
  SOAK_TRAIN,    /* one step of the bench MLP: Execute and Backward */
  SOAK_DEVICES,  /* tt_list_devices: the smallest call */
  SOAK_CHURN,    /* tt_disconnect and tt_connect again: a new session */
  SOAK_OPS
} soak_op;

extern const char *const soak_op_names[SOAK_OPS];

/* One timed operation, as a client writes it to its latency file. */
typedef struct soak_sample {
  int32_t op;      /* soak_op */
  float seconds;
} soak_sample;

/* A client's figures (RESULT record values). */
enum { SOAK_R_OPS, SOAK_R_ERRORS, SOAK_R_WRONG, SOAK_R_SESSIONS };

typedef struct soak_client_args {
  const char *target;
  const char *latency_path; /* where the samples go at the end */
  uint64_t seed;
  int shm;                  /* 0: transfers by gRPC streams, 1: by shared memory */
  int think_ms;             /* a random pause of 0..think_ms between operations */
} soak_client_args;

/* A client: operations until the driver's 'q', then RESULT and its latency file. */
int soak_client_main(const soak_client_args *a);

/* Percentiles of the samples in the latency files DIR/lat-0 .. DIR/lat-(n-1): per
 * operation (index SOAK_OPS: all together). */
typedef struct soak_latency {
  long count[SOAK_OPS + 1];
  double p50[SOAK_OPS + 1], p99[SOAK_OPS + 1], max[SOAK_OPS + 1]; /* seconds */
} soak_latency;

/* Reads the files; 0, or -1 if one is missing. */
int soak_latency_read(const char *dir, int n, soak_latency *out);

#endif
