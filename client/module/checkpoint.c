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
      loaded[i] = tt_module_place_param(tt_to(host, m->device_name));
      if (!loaded[i]) st = tt_errcode(m->client);
    }
    tt_tensor_free(host);
  }
  tt_safetensors_close(file);
  if (st == TT_OK) st = tt_module_flush(m); /* queued work applies to the parameters it was queued for */
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
