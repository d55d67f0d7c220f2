/* Modules on "cpu": forward and backward in process, on the process's own simulated card,
 * which runs the kernels a card of the daemon runs, in the mode a card would (eval, or the
 * module's dropout step); its capacity is host memory. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "module/module.h"

static ttd_backend *local_card;
static pthread_once_t local_card_once = PTHREAD_ONCE_INIT;
static char local_card_error[512]; /* why local_card is NULL */

static void local_card_create(void) {
  ttd_backend_options options = {.devices = 1, .dram_bytes = UINT64_MAX / 2, .l1_bytes = UINT64_MAX / 2, .cores = 0};
  ttd_status_t s = ttd_backend_create("sim", &options, &local_card);
  snprintf(local_card_error, sizeof(local_card_error), "cannot start the in-process card for modules on \"cpu\": %s",
           s ? ttd_status_message(s) : "the sim backend made none");
  ttd_status_free(s);
}

/* The in-process card, started at the first use; NULL with the reason recorded in c. */
static ttd_backend *card(tt_client *c) {
  pthread_once(&local_card_once, local_card_create);
  if (!local_card) tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "%s", local_card_error);
  return local_card;
}

/* A local card tensor holding a copy of a host tensor; NULL with the reason recorded. */
static ttd_tensor *to_local(tt_client *c, const tt_tensor *t) {
  ttd_tensor_spec spec = {.dtype = (ttd_dtype)t->dtype, .ndim = t->ndim, .location = TTD_MEM_DRAM};
  memcpy(spec.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  ttd_tensor *out = NULL;
  ttd_status_t s = ttd_tensor_spec_finish(&spec);
  if (!s) s = ttd_tensor_create(local_card, NULL, &spec, &out);
  if (!s) s = local_card->vtable->buffer_write(local_card, out->buffer, 0, t->data, t->nbytes);
  if (s) {
    ttd_tensor_release(out);
    tt_client_fail_status(c, s);
    return NULL;
  }
  return out;
}

tt_status tt_module_forward_local(tt_module *m, const tt_module_program *p, tt_tensor *const *inputs, int n_inputs,
                                  tt_tensor **outputs) {
  if (!card(m->client)) return tt_errcode(m->client);
  int n = n_inputs + m->n_params;
  ttd_tensor **local = calloc((size_t)n + 1, sizeof(*local));
  tt_status st = local ? TT_OK : tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; i < n && st == TT_OK; i++) {
    local[i] = to_local(m->client, i < n_inputs ? inputs[i] : m->params[i - n_inputs]);
    if (!local[i]) st = tt_errcode(m->client);
  }
  ttd_run *run = NULL;
  if (st == TT_OK) {
    ttd_run_mode mode = tt_module_next_mode(m);
    ttd_status_t s = ttd_run_forward_mode(local_card, NULL, p->local, local, n_inputs, local + n_inputs, m->n_params,
                                          &mode, &run);
    if (s) st = tt_client_fail_status(m->client, s);
  }
  for (int o = 0; st == TT_OK && o < p->local->n_outputs; o++) {
    const ttd_tensor *t = run->values[p->local->outputs[o]];
    outputs[o] = tt_tensor_from_host(m->client, NULL, (tt_dtype)t->spec.dtype, t->spec.shape, t->spec.ndim);
    if (!outputs[o]) st = TT_RESOURCE_EXHAUSTED;
    else local_card->vtable->buffer_read(local_card, t->buffer, 0, outputs[o]->data, t->spec.nbytes);
  }
  tt_run_ref *ref = st == TT_OK && m->training ? tt_run_ref_create(m, p->local, p->local->n_outputs, 0, run) : NULL;
  if (ref) {
    run = NULL; /* the outputs keep it for backward */
    st = tt_run_ref_watch_inputs(ref, inputs, n_inputs);
    for (int o = 0; o < p->local->n_outputs; o++) {
      outputs[o]->run = &tt_run_ref_retain(ref)->tie;
      outputs[o]->output_index = o;
    }
    tt_run_ref_release(ref);
  }
  ttd_run_free(run);
  for (int i = 0; local && i < n; i++) ttd_tensor_release(local[i]);
  free(local);
  return st;
}

/* Adds the card tensor grad (numel floats) into the host gradient acc. */
static tt_status accumulate(tt_client *c, const ttd_tensor *grad, float *acc) {
  float *g = malloc(grad->spec.nbytes + 4);
  if (!g) return tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "out of host memory");
  local_card->vtable->buffer_read(local_card, grad->buffer, 0, g, grad->spec.nbytes);
  for (uint64_t k = 0; k < grad->spec.numel; k++) acc[k] += g[k];
  free(g);
  return TT_OK;
}

tt_status tt_module_backward_local(tt_module *m, tt_run_ref *ref) {
  ttd_run *run = ref->local_run;
  const ttd_program *p = run->program;
  ttd_tensor **out_grads = calloc((size_t)p->n_outputs + 1, sizeof(*out_grads));
  ttd_tensor **param_grads = calloc((size_t)p->n_params + 1, sizeof(*param_grads));
  ttd_tensor **input_grads = calloc((size_t)p->n_inputs + 1, sizeof(*input_grads));
  tt_status st = out_grads && param_grads && input_grads ? TT_OK
                                                         : tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int o = 0; st == TT_OK && o < p->n_outputs; o++) {
    if (!ref->output_grads[o]) continue;
    const ttd_tensor *out = run->values[p->outputs[o]];
    ttd_tensor_spec spec = out->spec;
    ttd_status_t s = ttd_tensor_create(local_card, NULL, &spec, &out_grads[o]);
    if (!s) s = local_card->vtable->buffer_write(local_card, out_grads[o]->buffer, 0, ref->output_grads[o], spec.nbytes);
    if (s) st = tt_client_fail_status(m->client, s);
  }
  if (st == TT_OK) {
    ttd_status_t s = ttd_run_backward(run, local_card, out_grads, param_grads, ref->grad_inputs ? input_grads : NULL);
    if (s) st = tt_client_fail_status(m->client, s);
  }
  for (int i = 0; st == TT_OK && i < ref->n_inputs; i++) { /* into the watched inputs' host .grad */
    if (!ref->grad_inputs[i] || !input_grads[i]) continue;
    tt_tensor *g = tt_tensor_from_host(m->client, NULL, TT_FLOAT32, ref->grad_inputs[i]->shape, ref->grad_inputs[i]->ndim);
    if (!g) {
      st = TT_RESOURCE_EXHAUSTED;
      break;
    }
    local_card->vtable->buffer_read(local_card, input_grads[i]->buffer, 0, g->data, g->nbytes);
    st = tt_input_grad_add(ref->grad_inputs[i], g);
  }
  for (int i = 0; st == TT_OK && i < p->n_params; i++) { /* accumulate into the module's host .grad */
    if (!param_grads[i]) continue;
    if (!m->host_grads[i]) {
      m->host_grads[i] = tt_tensor_from_host(m->client, NULL, TT_FLOAT32, m->params[i]->shape, m->params[i]->ndim);
      if (!m->host_grads[i]) {
        st = TT_RESOURCE_EXHAUSTED;
        break;
      }
    }
    st = accumulate(m->client, param_grads[i], m->host_grads[i]->data);
  }
  for (int i = 0; i < p->n_params; i++) { /* the run's copies start the next backward at none */
    ttd_tensor *param = run->operands[p->n_inputs + i];
    ttd_tensor_release(param->grad);
    param->grad = NULL;
  }
  for (int o = 0; out_grads && o < p->n_outputs; o++) ttd_tensor_release(out_grads[o]);
  for (int i = 0; param_grads && i < p->n_params; i++) ttd_tensor_release(param_grads[i]);
  for (int i = 0; input_grads && i < p->n_inputs; i++) ttd_tensor_release(input_grads[i]);
  free(out_grads);
  free(param_grads);
  free(input_grads);
  for (int o = 0; o < ref->n_outputs; o++) {
    free(ref->output_grads[o]);
    ref->output_grads[o] = NULL;
  }
  if (!ref->keep) tt_run_ref_free_local(ref); /* as torch frees the graph after backward */
  return st;
}
