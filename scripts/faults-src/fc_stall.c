/* The client that stops reading its stream: it uploads a 64 MiB tensor, then starts a
 * Download of it on a second gRPC channel of its own and never reads a message of it, so
 * the daemon's sends stop at HTTP/2 flow control with the stream open. It keeps its session
 * alive (KeepAlive thread) until the driver's 'c', then closes the session with
 * tt_disconnect and sleeps, the stalled stream still open, until SIGKILLed. */
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "faults.h"
#include "ttd/v1/ttd.pb-c.h"

#define FLOATS ((int64_t)16 << 20)

typedef struct raw_download {
  grpc_channel *channel;
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_metadata md[3];
  char session[20], instance[40], authorization[96];
  grpc_byte_buffer *request;
} raw_download;

/* Starts Download(handle) as client c's session and sends the request; reads nothing. */
static int raw_download_start(raw_download *r, tt_client *c, const char *target, uint64_t handle) {
  memset(r, 0, sizeof(*r));
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  r->channel = grpc_channel_create(target, creds, NULL);
  grpc_channel_credentials_release(creds);
  r->cq = grpc_completion_queue_create_for_pluck(NULL);
  r->call = grpc_channel_create_call(r->channel, NULL, GRPC_PROPAGATE_DEFAULTS, r->cq,
                                     grpc_slice_from_static_string("/ttd.v1.Device/Download"), NULL,
                                     gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  snprintf(r->session, sizeof(r->session), "%016" PRIx64, tt_session_id(c));
  snprintf(r->instance, sizeof(r->instance), "%s", tt_instance_id(c));
  snprintf(r->authorization, sizeof(r->authorization), "Bearer %s", getenv("TTD_TOKEN") ? getenv("TTD_TOKEN") : "");
  const char *keys[3] = {"ttd-session", "ttd-instance", "authorization"};
  const char *values[3] = {r->session, r->instance, r->authorization};
  for (int i = 0; i < 3; i++) {
    r->md[i].key = grpc_slice_from_static_string(keys[i]);
    r->md[i].value = grpc_slice_from_static_string(values[i]);
  }
  Ttd__V1__DownloadRequest req = TTD__V1__DOWNLOAD_REQUEST__INIT;
  req.handle = handle;
  uint8_t packed[64];
  size_t len = ttd__v1__download_request__pack(&req, packed);
  grpc_slice slice = grpc_slice_from_copied_buffer((const char *)packed, len);
  r->request = grpc_raw_byte_buffer_create(&slice, 1);
  grpc_slice_unref(slice);
  grpc_op ops[3];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = 3;
  ops[0].data.send_initial_metadata.metadata = r->md;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = r->request;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  static int tag;
  if (grpc_call_start_batch(r->call, ops, 3, &tag, NULL) != GRPC_CALL_OK) return -1;
  grpc_event ev = grpc_completion_queue_pluck(r->cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success ? 0 : -1;
}

int fc_stall_main(const fc_args *a) {
  tt_client *c = fc_connect(a, 1);
  int64_t shape[1] = {FLOATS};
  tt_tensor *host = tt_tensor_from_host(c, NULL, TT_FLOAT32, shape, 1);
  tt_tensor *dev = host ? tt_to(host, "tt") : NULL;
  if (!dev) fc_die(c, "uploading 64 MiB");
  tt_tensor_free(host);
  ft_report(FT_MSG_SESSION, 0, tt_session_id(c), (double[6]){(double)tt_tensor_nbytes(dev)}, NULL);
  raw_download r;
  if (raw_download_start(&r, c, a->target, tt_tensor_handle(dev)) != 0) fc_die(c, "starting the raw Download");
  ft_report(FT_MSG_READY, 0, tt_session_id(c), NULL, NULL);
  for (int cmd; (cmd = ft_command(3600)) != 'c';) {
    if (cmd < 0) return 0;
  }
  tt_tensor_free(dev);  /* a Free: the stream's reference keeps the bytes */
  tt_disconnect(c);     /* CloseSession, with the stream still open and unread */
  ft_report(FT_MSG_EVENT, 0, 0, NULL, "closed");
  for (;;) pause();     /* the stream stays open until SIGKILL */
}
