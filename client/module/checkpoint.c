/* Checkpoints of a module: its parameters saved to and loaded from a safetensors file,
 * by parameter name. */
#include <stdlib.h>
#include <string.h>

#include "module/module.h"

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
  tt_tensor **host = calloc((size_t)m->n_params + 1, sizeof(*host));
  tt_status st = host ? TT_OK : tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; st == TT_OK && i < m->n_params; i++) { /* every one checked before any is written */
    const char *name = tt_module_param_name(m, i);
    const tt_tensor *want = m->params[i];
    host[i] = tt_safetensors_get(file, name);
    if (!host[i]) {
      st = tt_client_fail(m->client, TT_INVALID_ARGUMENT, "checkpoint %s has no parameter '%s'", path, name);
    } else if (host[i]->dtype != want->dtype || host[i]->ndim != want->ndim ||
               memcmp(host[i]->shape, want->shape, sizeof(int64_t) * (size_t)want->ndim) != 0) {
      st = tt_client_fail(m->client, TT_INVALID_ARGUMENT, "checkpoint %s: parameter '%s' has another dtype or shape than the module's",
                          path, name);
    }
  }
  tt_safetensors_close(file);
  if (st == TT_OK) st = tt_module_flush(m); /* queued work applies to the values it was queued for */
  /* Into the parameters' own tensors, as torch's load_state_dict copies: .grad and the
   * optimizer state kept beside each on a card stay with it. */
  for (int i = 0; st == TT_OK && i < m->n_params; i++) st = tt_copy_(m->params[i], host[i]);
  m->param_version++; /* even if a copy failed: some may have been written */
  for (int i = 0; host && i < m->n_params; i++) tt_tensor_free(host[i]);
  free(host);
  return st;
}
