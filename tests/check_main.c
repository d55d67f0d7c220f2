/* The one runner: adds every suite and exits non-zero on any failure.
 * CK_RUN_SUITE=name runs one suite; CK_FORK=no runs in-process for a debugger. */
#include <stdlib.h>

#include "suites.h"

int main(void) {
  SRunner *sr = srunner_create(dtype_suite());
  srunner_add_suite(sr, status_suite());
  srunner_add_suite(sr, absl_deadlock_suite());
  srunner_add_suite(sr, cq_spin_suite());
  srunner_add_suite(sr, wire_frame_suite());
  srunner_add_suite(sr, block_cache_suite());
  srunner_add_suite(sr, address_suite());
  srunner_add_suite(sr, handle_map_suite());
  srunner_add_suite(sr, h2_frames_suite());
  srunner_add_suite(sr, config_suite());
  srunner_add_suite(sr, sim_backend_suite());
  srunner_add_suite(sr, session_suite());
  srunner_add_suite(sr, tensor_proto_suite());
  srunner_add_suite(sr, inline_tensor_suite());
  srunner_add_suite(sr, tokens_suite());
  srunner_add_suite(sr, scheduler_suite());
  srunner_add_suite(sr, work_queue_suite());
  srunner_add_suite(sr, place_suite());
  srunner_add_suite(sr, program_grad_suite());
  srunner_add_suite(sr, run_mode_suite());
  srunner_add_suite(sr, thread_pool_suite());
  srunner_add_suite(sr, kernels_shape_suite());
  srunner_add_suite(sr, kernels_elementwise_suite());
  srunner_add_suite(sr, kernels_reduce_suite());
  srunner_add_suite(sr, kernels_softmax_suite());
  srunner_add_suite(sr, kernels_loss_suite());
  srunner_add_suite(sr, kernels_optimizer_suite());
  srunner_add_suite(sr, kernels_matmul_suite());
  srunner_add_suite(sr, kernels_conv_suite());
  srunner_add_suite(sr, kernels_pool2d_suite());
  srunner_add_suite(sr, kernels_layer_norm_suite());
  srunner_add_suite(sr, kernels_embedding_suite());
  srunner_add_suite(sr, kernels_dropout_suite());
  srunner_add_suite(sr, dataset_suite());
  srunner_add_suite(sr, progress_suite());
  srunner_add_suite(sr, resume_suite());
  srunner_add_suite(sr, tensor_wrap_suite());
  srunner_add_suite(sr, file_io_suite());
  srunner_add_suite(sr, safetensors_header_suite());
  srunner_add_suite(sr, e2e_transfer_suite());
  srunner_add_suite(sr, e2e_errors_suite());
  srunner_add_suite(sr, e2e_sessions_suite());
  srunner_add_suite(sr, e2e_interop_suite());
  srunner_add_suite(sr, e2e_programs_suite());
  srunner_add_suite(sr, e2e_modules_suite());
  srunner_add_suite(sr, e2e_input_grads_suite());
  srunner_add_suite(sr, e2e_restart_suite());
  srunner_add_suite(sr, e2e_copy_suite());
  srunner_add_suite(sr, e2e_parallel_suite());
  srunner_add_suite(sr, e2e_concurrent_writes_suite());
  srunner_add_suite(sr, e2e_admin_bounds_suite());
  srunner_add_suite(sr, e2e_conn_bounds_suite());
  srunner_add_suite(sr, e2e_queue_bounds_suite());
  srunner_add_suite(sr, e2e_tenant_share_suite());
  srunner_add_suite(sr, e2e_optimizers_suite());
  srunner_add_suite(sr, e2e_dropout_suite());
  srunner_add_suite(sr, e2e_shapes_suite());
  srunner_add_suite(sr, e2e_metrics_suite());
  srunner_add_suite(sr, e2e_tenants_suite());
  srunner_add_suite(sr, e2e_fairness_suite());
  srunner_add_suite(sr, e2e_cancel_suite());
  srunner_add_suite(sr, e2e_tls_suite());
  srunner_add_suite(sr, e2e_shm_suite());
  srunner_add_suite(sr, e2e_service_suite());
  srunner_add_suite(sr, e2e_ttctl_suite());
  srunner_add_suite(sr, e2e_round_trips_suite());
  srunner_add_suite(sr, e2e_bad_inputs_suite());
  srunner_add_suite(sr, safetensors_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
