/* A client under load when the daemon is SIGKILLed and restarted: it trains the bench MLP
 * until a call fails, then records that first error, connects again (retrying while the
 * daemon is down), checks that a tensor of the old instance is refused with
 * FAILED_PRECONDITION "daemon restarted", and trains a.n steps in the new session.
 * RESULT: code = the first error's, text = its message, value = {seconds from the error
 * to a new session, old handle refused precisely (1/0), steps after, errors after, new
 * instance differs (1/0)}. */
#include <string.h>

#include "faults.h"
#include "scripts/bench/bench_common.h"
#include "scripts/bench/bench_mlp.h"

#define RECONNECT_S 30.0

int fc_reconnect_main(const fc_args *a) {
  tt_client *old = fc_connect(a, 1);
  int64_t shape[1] = {1 << 18};
  tt_tensor *host = tt_tensor_from_host(old, NULL, TT_FLOAT32, shape, 1);
  tt_tensor *kept = host ? tt_to(host, "tt") : NULL; /* a handle of the old instance */
  bench_mlp *m = kept ? bench_mlp_create_on(old, 64) : NULL;
  if (!m) fc_die(old, "setting up");
  ft_report(FT_MSG_SESSION, 0, tt_session_id(old), NULL, NULL);
  tt_status first = TT_OK;
  char message[200] = "";
  for (int step = 0; first == TT_OK; step++) {
    if (step == 3) ft_report(FT_MSG_READY, 0, tt_session_id(old), NULL, NULL);
    first = bench_mlp_try_step(m, NULL);
  }
  double failed_at = bench_now();
  snprintf(message, sizeof(message), "%s", tt_last_error(old));
  bench_mlp_destroy(m);
  tt_client *fresh = NULL;
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.client_name = a->role;
  tt_status st;
  while ((st = tt_connect(a->target, &o, &fresh)) != TT_OK && bench_now() - failed_at < RECONNECT_S) {
    tt_disconnect(fresh);
    ft_sleep(0.05);
  }
  if (st != TT_OK) fc_die(fresh, "reconnecting");
  double reconnect_s = bench_now() - failed_at;
  int differs = strcmp(tt_instance_id(fresh), tt_instance_id(old)) != 0;
  tt_tensor *back = tt_to(kept, "cpu");
  int refused = !back && tt_errcode(old) == TT_FAILED_PRECONDITION && strstr(tt_last_error(old), "daemon restarted");
  if (!refused) {
    ft_report(FT_MSG_EVENT, tt_errcode(old), 0, NULL, "old handle: %s", back ? "accepted" : tt_last_error(old));
  }
  tt_tensor_free(back);
  double steps = 0, errors = 0;
  m = bench_mlp_create_on(fresh, 64);
  for (int i = 0; m && i < a->n; i++) {
    if (bench_mlp_try_step(m, NULL) == TT_OK) steps++;
    else errors++;
  }
  if (!m || errors) ft_report(FT_MSG_EVENT, tt_errcode(fresh), 0, NULL, "after reconnecting: %s", tt_last_error(fresh));
  ft_report(FT_MSG_RESULT, first, tt_session_id(fresh),
            (double[6]){reconnect_s, refused, steps, errors + !m, differs}, "%s", message);
  bench_mlp_destroy(m);
  tt_disconnect(fresh);
  tt_tensor_free(kept);
  tt_tensor_free(host);
  tt_disconnect(old);
  return 0;
}
