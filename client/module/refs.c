/* How long a module lives: the user's reference and one per pending run, and what goes with
 * the last (parameters, their .grad on the daemon, the program); also the training-loop count
 * the module holds on its card while it trains there. */
#include <stdlib.h>

#include "module/module.h"

void tt_module_loop_enter(tt_module *m) {
  if (m->loop_device >= 0 || !m->training || m->place.is_host || m->place.device >= TT_LOOP_DEVICES) return;
  m->loop_device = m->place.device;
  atomic_fetch_add(&m->client->training_loops[m->loop_device], 1);
}

void tt_module_loop_leave(tt_module *m) {
  if (m->loop_device < 0) return;
  atomic_fetch_sub(&m->client->training_loops[m->loop_device], 1);
  m->loop_device = -1;
}

void tt_module_release_grads(tt_module *m) {
  uint64_t handles[256];
  size_t n = 0;
  for (int i = 0; i < m->n_params && n < 256; i++) {
    if (m->grad_handles[i]) handles[n++] = m->grad_handles[i];
    m->grad_handles[i] = 0;
  }
  tt_rpc_free_quiet(m->client, handles, n);
}

void tt_module_unref(tt_module *m) {
  if (!m || atomic_fetch_sub(&m->refs, 1) != 1) return;
  tt_module_unlist(m); /* queued work dies with the parameters */
  tt_module_loop_leave(m);
  if (m->grad_handles) tt_module_release_grads(m);
  for (int i = 0; m->params && i < m->n_params; i++) tt_tensor_free(m->params[i]);
  free(m->params);
  free(m->grad_handles);
  for (int i = 0; m->host_grads && i < m->n_params; i++) tt_tensor_free(m->host_grads[i]);
  free(m->host_grads);
  tt_module_programs_clear(m);
  ttd_program_release(m->local);
  if (m->graph) ttd__v1__graph__free_unpacked(m->graph, NULL);
  free(m);
}
