/* Every Check suite of the project; check_main.c runs them all. One suite per module. */
#ifndef TTD_TESTS_SUITES_H
#define TTD_TESTS_SUITES_H

#include <check.h>

/* unit suites */
Suite *dtype_suite(void);
Suite *status_suite(void);
Suite *absl_deadlock_suite(void);
Suite *cq_spin_suite(void);
Suite *wire_frame_suite(void);
Suite *block_cache_suite(void);
Suite *address_suite(void);
Suite *handle_map_suite(void);
Suite *h2_frames_suite(void);
Suite *config_suite(void);
Suite *sim_backend_suite(void);
Suite *session_suite(void);
Suite *session_table_suite(void);
Suite *device_tensor_suite(void);
Suite *parameter_work_suite(void);
Suite *train_methods_suite(void);
Suite *download_suite(void);
Suite *fd_passing_suite(void);
Suite *tensor_proto_suite(void);
Suite *inline_tensor_suite(void);
Suite *tokens_suite(void);
Suite *scheduler_suite(void);
Suite *work_queue_suite(void);
Suite *place_suite(void);
Suite *program_grad_suite(void);
Suite *run_mode_suite(void);
Suite *thread_pool_suite(void);
Suite *kernels_shape_suite(void);
Suite *kernels_elementwise_suite(void);
Suite *kernels_reduce_suite(void);
Suite *kernels_softmax_suite(void);
Suite *kernels_loss_suite(void);
Suite *kernels_optimizer_suite(void);
Suite *kernels_matmul_suite(void);
Suite *kernels_matmul_bf16_suite(void);
Suite *kernels_conv_suite(void);
Suite *kernels_pool2d_suite(void);
Suite *kernels_layer_norm_suite(void);
Suite *kernels_embedding_suite(void);
Suite *kernels_dropout_suite(void);
Suite *dataset_suite(void);
Suite *progress_suite(void);
Suite *resume_suite(void);
Suite *tensor_wrap_suite(void);
Suite *file_io_suite(void);
Suite *safetensors_header_suite(void);

/* end-to-end suites: a real ttd on a temporary Unix socket */
Suite *e2e_transfer_suite(void);
Suite *e2e_errors_suite(void);
Suite *e2e_sessions_suite(void);
Suite *e2e_interop_suite(void);
Suite *e2e_programs_suite(void);
Suite *e2e_modules_suite(void);
Suite *e2e_queued_work_suite(void);
Suite *e2e_input_grads_suite(void);
Suite *e2e_restart_suite(void);
Suite *e2e_copy_suite(void);
Suite *e2e_parallel_suite(void);
Suite *e2e_concurrent_writes_suite(void);
Suite *e2e_admin_bounds_suite(void);
Suite *e2e_conn_bounds_suite(void);
Suite *e2e_queue_bounds_suite(void);
Suite *e2e_tenant_share_suite(void);
Suite *e2e_optimizers_suite(void);
Suite *e2e_dropout_suite(void);
Suite *e2e_shapes_suite(void);
Suite *e2e_metrics_suite(void);
Suite *e2e_tenants_suite(void);
Suite *e2e_fairness_suite(void);
Suite *e2e_cancel_suite(void);
Suite *e2e_tls_suite(void);
Suite *e2e_shm_suite(void);
Suite *e2e_lane_suite(void);
Suite *e2e_service_suite(void);
Suite *e2e_ttctl_suite(void);
Suite *e2e_round_trips_suite(void);
Suite *e2e_bad_inputs_suite(void);
Suite *safetensors_suite(void);

#endif
