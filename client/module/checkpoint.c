/* Checkpoints of a module: its parameters saved to and loaded from a safetensors file,
 * by parameter name. */
#include <stdlib.h>
#include <string.h>

#include "module/module.h"

/* On a card, the optimizer state the daemon keeps beside each parameter moves to the
 * parameter's new tensor, as torch's load_state_dict leaves the optimizer's state alone (on
 * "cpu" it lives in the optimizer). A daemon without OptimizerState has none to move. */
static tt_status keep_optimizer_state(tt_module *m, tt_tensor *const *loaded) {
  Ttd__V1__ParameterState *states = calloc((size_t)m->n_params + 1, sizeof(*states));
  Ttd__V1__ParameterState **set = calloc((size_t)m->n_params + 1, sizeof(*set));
  tt_status st = states && set ? TT_OK : tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; st == TT_OK && i < m->n_params; i++) {
    ttd__v1__parameter_state__init(&states[i]);
    states[i].parameter = loaded[i]->handle;
    states[i].from_parameter = m->params[i]->handle;
    set[i] = &states[i];
  }
  if (st == TT_OK) {
    Ttd__V1__OptimizerStateRequest req = TTD__V1__OPTIMIZER_STATE_REQUEST__INIT;
    req.set = set;
    req.n_set = (size_t)m->n_params;
    ProtobufCMessage *resp = NULL;
    char err[512];
    st = tt_rpc_unary_quiet(m->client, TT_RPC_OPTIMIZER_STATE, &req.base, &ttd__v1__optimizer_state_response__descriptor,
                            &resp, err, sizeof(err));
    if (st == TT_OK) protobuf_c_message_free_unpacked(resp, NULL);
    else if (st == TT_UNIMPLEMENTED) st = TT_OK;
    else st = tt_client_fail(m->client, st, "keeping the optimizer state of the loaded parameters: %s", err);
  }
  free(set);
  free(states);
  return st;
}

tt_status tt_module_save(tt_module *m, const char *path) {
  tt_tensor **host = calloc((size_t)m->n_params + 1, sizeof(*host));
  const char **names = calloc((size_t)m->n_params + 1, sizeof(*names));
  tt_status st = host && names ? TT_OK : tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; st == TT_OK && i < m->n_params; i++) {
    names[i] = tt_module_param_name(m, i);
    host[i] = tt_to(m->params[i], "cpu");
    if (!host[i]) st = tt_errcode(m->client);
  }
  if (st == TT_OK) st = tt_safetensors_save(m->client, path, names, host, m->n_params);
  for (int i = 0; host && i < m->n_params; i++) tt_tensor_free(host[i]);
  free(host);
  free(names);
  return st;
}

tt_status tt_module_load(tt_module *m, const char *path) {
  tt_safetensors *file = NULL;
  TT_RETURN_IF_FAILED(tt_safetensors_open(m->client, path, &file));
  tt_tensor **loaded = calloc((size_t)m->n_params + 1, sizeof(*loaded));
  tt_status st = loaded ? TT_OK : tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; st == TT_OK && i < m->n_params; i++) {
    const char *name = tt_module_param_name(m, i);
    tt_tensor *host = tt_safetensors_get(file, name);
    const tt_tensor *want = m->params[i];
    if (!host) {
      st = tt_client_fail(m->client, TT_INVALID_ARGUMENT, "checkpoint %s has no parameter '%s'", path, name);
    } else if (host->dtype != want->dtype || host->ndim != want->ndim ||
               memcmp(host->shape, want->shape, sizeof(int64_t) * (size_t)want->ndim) != 0) {
      st = tt_client_fail(m->client, TT_INVALID_ARGUMENT, "checkpoint %s: parameter '%s' has another dtype or shape than the module's",
                          path, name);
    } else {
      loaded[i] = tt_module_place_param(m, tt_to(host, m->device_name));
      if (!loaded[i]) st = tt_errcode(m->client);
    }
    tt_tensor_free(host);
  }
  tt_safetensors_close(file);
  if (st == TT_OK) st = tt_module_flush(m); /* queued work applies to the parameters it was queued for */
  if (st == TT_OK && !m->place.is_host && m->n_params > 0) st = keep_optimizer_state(m, loaded);
  if (st == TT_OK) {
    tt_module_release_grads(m);
    for (int i = 0; i < m->n_params; i++) {
      tt_tensor_free(m->params[i]);
      m->params[i] = loaded[i];
    }
  } else {
    for (int i = 0; loaded && i < m->n_params; i++) tt_tensor_free(loaded[i]);
  }
  free(loaded);
  return st;
}
