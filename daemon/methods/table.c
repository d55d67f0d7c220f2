/* The method table of ttd.v1.Device. */
#include "methods/methods.h"
#include "ttd/v1/ttd.pb-c.h"

#define UNARY(name, req, session, fn) \
  {.path = "/ttd.v1.Device/" name, .kind = TTD_METHOD_UNARY, .request = &req, .needs_session = session, .unary = fn}
/* Copies tensor bytes, compiles or frees tensors: run on the server's work queue. */
#define HEAVY(name, req, fn) \
  {.path = "/ttd.v1.Device/" name, .kind = TTD_METHOD_UNARY, .request = &req, .needs_session = true, .unary = fn, \
   .heavy = true}
/* Device work: queued per device, sessions served round-robin (scheduler.h). */
#define DEVICE_WORK(name, req, fn, device)                                                                  \
  {.path = "/ttd.v1.Device/" name, .kind = TTD_METHOD_UNARY, .request = &req, .needs_session = true, .unary = fn, \
   .device_of = device}

const ttd_method ttd_methods[] = {
    UNARY("OpenSession", ttd__v1__open_session_request__descriptor, false, ttd_method_open_session),
    UNARY("KeepAlive", ttd__v1__keep_alive_request__descriptor, true, ttd_method_keep_alive),
    /* On the polling thread: the cancellations of its streams then take effect at once (from
     * another thread, gRPC sometimes released a stalled Download's bytes only ~2 s later). */
    UNARY("CloseSession", ttd__v1__close_session_request__descriptor, true, ttd_method_close_session),
    UNARY("ListDevices", ttd__v1__list_devices_request__descriptor, false, ttd_method_list_devices),
    HEAVY("Allocate", ttd__v1__allocate_request__descriptor, ttd_method_allocate),
    {.path = "/ttd.v1.Device/Upload",
     .kind = TTD_METHOD_CLIENT_STREAM,
     .request = &ttd__v1__upload_request__descriptor,
     .needs_session = true,
     .heavy = true,
     .stream_message = ttd_upload_message,
     .stream_end = ttd_upload_end,
     .stream_abort = ttd_upload_abort},
    {.path = "/ttd.v1.Device/Download",
     .kind = TTD_METHOD_SERVER_STREAM,
     .request = &ttd__v1__download_request__descriptor,
     .needs_session = true,
     .heavy = true,
     .stream_begin = ttd_download_begin,
     .stream_next = ttd_download_next,
     .stream_done = ttd_download_done,
     .stream_cancel = ttd_download_cancel},
    HEAVY("Move", ttd__v1__move_request__descriptor, ttd_method_move),
    HEAVY("Free", ttd__v1__free_request__descriptor, ttd_method_free),
    HEAVY("Compile", ttd__v1__compile_request__descriptor, ttd_method_compile),
    DEVICE_WORK("Execute", ttd__v1__execute_request__descriptor, ttd_method_execute, ttd_device_of_execute),
    DEVICE_WORK("Backward", ttd__v1__backward_request__descriptor, ttd_method_backward, ttd_device_of_backward),
    UNARY("ReleaseRun", ttd__v1__release_run_request__descriptor, true, ttd_method_release_run),
    DEVICE_WORK("ZeroGrad", ttd__v1__zero_grad_request__descriptor, ttd_method_zero_grad, ttd_device_of_parameters),
    DEVICE_WORK("OptimizerStep", ttd__v1__optimizer_step_request__descriptor, ttd_method_optimizer_step,
                ttd_device_of_parameters),
    {.path = "/ttd.v1.Device/ListSessions", .kind = TTD_METHOD_UNARY, .request = &ttd__v1__list_sessions_request__descriptor,
     .needs_admin = true, .unary = ttd_method_list_sessions},
    {.path = "/ttd.v1.Device/KillSession", .kind = TTD_METHOD_UNARY, .request = &ttd__v1__kill_session_request__descriptor,
     .needs_admin = true, .unary = ttd_method_kill_session},
    DEVICE_WORK("OptimizerState", ttd__v1__optimizer_state_request__descriptor, ttd_method_optimizer_state,
                ttd_device_of_optimizer_state),
};

const size_t ttd_method_count = sizeof(ttd_methods) / sizeof(ttd_methods[0]);
