/* The one runner: every suite, or the one named on the command line (`check_ttd NAME`;
 * `check_ttd --list` names them, one a line, and scripts/run-suites runs each in a process of
 * its own). Exits non-zero on any failure. CK_RUN_SUITE=name also selects a suite, and
 * CK_FORK=no runs in-process for a debugger. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"

static const struct {
  const char *name;
  Suite *(*make)(void);
} suites[] = {
    {"dtype", dtype_suite},
    {"status", status_suite},
    {"absl_deadlock", absl_deadlock_suite},
    {"cq_spin", cq_spin_suite},
    {"wire_frame", wire_frame_suite},
    {"block_cache", block_cache_suite},
    {"address", address_suite},
    {"handle_map", handle_map_suite},
    {"h2_frames", h2_frames_suite},
    {"config", config_suite},
    {"sim_backend", sim_backend_suite},
    {"session", session_suite},
    {"session_table", session_table_suite},
    {"device_tensor", device_tensor_suite},
    {"parameter_work", parameter_work_suite},
    {"train_methods", train_methods_suite},
    {"download", download_suite},
    {"fd_passing", fd_passing_suite},
    {"tensor_proto", tensor_proto_suite},
    {"inline_tensor", inline_tensor_suite},
    {"tokens", tokens_suite},
    {"scheduler", scheduler_suite},
    {"work_queue", work_queue_suite},
    {"place", place_suite},
    {"program_grad", program_grad_suite},
    {"run_mode", run_mode_suite},
    {"thread_pool", thread_pool_suite},
    {"kernels_shape", kernels_shape_suite},
    {"kernels_elementwise", kernels_elementwise_suite},
    {"kernels_reduce", kernels_reduce_suite},
    {"kernels_softmax", kernels_softmax_suite},
    {"kernels_loss", kernels_loss_suite},
    {"kernels_optimizer", kernels_optimizer_suite},
    {"kernels_matmul", kernels_matmul_suite},
    {"kernels_matmul_bf16", kernels_matmul_bf16_suite},
    {"kernels_conv", kernels_conv_suite},
    {"kernels_pool2d", kernels_pool2d_suite},
    {"kernels_layer_norm", kernels_layer_norm_suite},
    {"kernels_embedding", kernels_embedding_suite},
    {"kernels_dropout", kernels_dropout_suite},
    {"dataset", dataset_suite},
    {"progress", progress_suite},
    {"resume", resume_suite},
    {"tensor_wrap", tensor_wrap_suite},
    {"file_io", file_io_suite},
    {"safetensors_header", safetensors_header_suite},
    {"e2e_transfer", e2e_transfer_suite},
    {"e2e_errors", e2e_errors_suite},
    {"e2e_sessions", e2e_sessions_suite},
    {"e2e_interop", e2e_interop_suite},
    {"e2e_programs", e2e_programs_suite},
    {"e2e_modules", e2e_modules_suite},
    {"e2e_queued_work", e2e_queued_work_suite},
    {"e2e_input_grads", e2e_input_grads_suite},
    {"e2e_restart", e2e_restart_suite},
    {"e2e_copy", e2e_copy_suite},
    {"e2e_parallel", e2e_parallel_suite},
    {"e2e_concurrent_writes", e2e_concurrent_writes_suite},
    {"e2e_admin_bounds", e2e_admin_bounds_suite},
    {"e2e_conn_bounds", e2e_conn_bounds_suite},
    {"e2e_queue_bounds", e2e_queue_bounds_suite},
    {"e2e_tenant_share", e2e_tenant_share_suite},
    {"e2e_optimizers", e2e_optimizers_suite},
    {"e2e_dropout", e2e_dropout_suite},
    {"e2e_shapes", e2e_shapes_suite},
    {"e2e_metrics", e2e_metrics_suite},
    {"e2e_tenants", e2e_tenants_suite},
    {"e2e_fairness", e2e_fairness_suite},
    {"e2e_cancel", e2e_cancel_suite},
    {"e2e_tls", e2e_tls_suite},
    {"e2e_shm", e2e_shm_suite},
    {"e2e_lane", e2e_lane_suite},
    {"e2e_service", e2e_service_suite},
    {"e2e_ttctl", e2e_ttctl_suite},
    {"e2e_round_trips", e2e_round_trips_suite},
    {"e2e_bad_inputs", e2e_bad_inputs_suite},
    {"safetensors", safetensors_suite},
};

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  size_t count = sizeof(suites) / sizeof(suites[0]);
  if (only && strcmp(only, "--list") == 0) {
    for (size_t i = 0; i < count; i++) puts(suites[i].name);
    return EXIT_SUCCESS;
  }
  SRunner *sr = NULL;
  for (size_t i = 0; i < count; i++) {
    if (only && strcmp(only, suites[i].name) != 0) continue;
    if (sr) srunner_add_suite(sr, suites[i].make());
    else sr = srunner_create(suites[i].make());
  }
  if (!sr) {
    fprintf(stderr, "check_ttd: no suite named '%s' (check_ttd --list names them)\n", only);
    return 2;
  }
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
