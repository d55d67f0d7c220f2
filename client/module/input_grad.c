/* Gradients of a forward's inputs, torch's requires_grad: a tensor marked with
 * tt_tensor_set_requires_grad and given to a training forward is watched by that run; the
 * run's Backward then asks for input gradients too (BackwardRequest.input_grads, or the
 * in-process run's), and each is accumulated into the tensor's .grad where the tensor is. */
#include <stdlib.h>
#include <string.h>

#include "module/module.h"

tt_status tt_tensor_set_requires_grad(tt_tensor *t, int requires_grad) {
  if (!t) return TT_INVALID_ARGUMENT;
  if (requires_grad && t->dtype != TT_FLOAT32 && t->dtype != TT_BFLOAT16) {
    return tt_client_fail(t->client, TT_INVALID_ARGUMENT,
                          "only float32 and bfloat16 tensors can require gradients, not %s (torch's rule for "
                          "integer tensors)",
                          t->dtype == TT_INT32 ? "int32" : "this dtype");
  }
  t->requires_grad = requires_grad != 0;
  return TT_OK;
}

int tt_tensor_requires_grad(const tt_tensor *t) { return t && t->requires_grad; }

tt_tensor *tt_tensor_grad(tt_tensor *t) {
  if (!t) return NULL;
  if (!t->acc_grad) {
    tt_client_fail(t->client, TT_FAILED_PRECONDITION,
                   t->requires_grad ? "the tensor has no gradient yet: a backward through a training forward it fed "
                                      "fills it"
                                    : "the tensor does not require grad: call tt_tensor_set_requires_grad(t, 1) before "
                                      "the forward it feeds");
    return NULL;
  }
  return tt_tensor_retain(t->acc_grad);
}

void tt_tensor_clear_grad(tt_tensor *t) {
  if (!t) return;
  tt_tensor_free(t->acc_grad);
  t->acc_grad = NULL;
}

tt_status tt_run_ref_watch_inputs(tt_run_ref *ref, tt_tensor *const *inputs, int n_inputs) {
  bool any = false;
  for (int i = 0; i < n_inputs; i++) any = any || inputs[i]->requires_grad;
  if (!any) return TT_OK;
  ref->grad_inputs = calloc((size_t)n_inputs, sizeof(*ref->grad_inputs));
  if (!ref->grad_inputs) return tt_client_fail(ref->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  ref->n_inputs = n_inputs;
  for (int i = 0; i < n_inputs; i++) {
    if (inputs[i]->requires_grad) ref->grad_inputs[i] = tt_tensor_retain(inputs[i]);
  }
  return TT_OK;
}

void tt_run_ref_unwatch_inputs(tt_run_ref *ref) {
  for (int i = 0; ref->grad_inputs && i < ref->n_inputs; i++) tt_tensor_free(ref->grad_inputs[i]);
  free(ref->grad_inputs);
  ref->grad_inputs = NULL;
  ref->n_inputs = 0;
}

/* acc + g elementwise as a new host tensor (both float32 of one shape, anywhere). */
static tt_tensor *sum_on_host(tt_tensor *acc, tt_tensor *g) {
  tt_tensor *a = tt_to(acc, "cpu"), *b = tt_to(g, "cpu");
  if (a && b) {
    float *x = a->data;
    const float *y = b->data;
    for (uint64_t k = 0; k < a->numel; k++) x[k] += y[k];
  }
  tt_tensor_free(b);
  if (!b) {
    tt_tensor_free(a);
    return NULL;
  }
  return a;
}

tt_status tt_input_grad_add(tt_tensor *target, tt_tensor *g) {
  if (!target->acc_grad) {
    target->acc_grad = g;
    return TT_OK;
  }
  /* torch accumulates .grad: a second gradient adds on the host (a tensor fed to several
   * runs), and the sum goes where the tensor is. */
  tt_tensor *sum = sum_on_host(target->acc_grad, g);
  tt_tensor_free(g);
  if (!sum) return tt_errcode(target->client);
  tt_tensor *placed = target->place.is_host ? sum : tt_to(sum, target->device_name);
  if (placed != sum) tt_tensor_free(sum);
  if (!placed) return tt_errcode(target->client);
  tt_tensor_free(target->acc_grad);
  target->acc_grad = placed;
  return TT_OK;
}

/* A device tensor owning the daemon's input gradient handle, shaped and placed as target;
 * NULL (recorded, the handle freed) on failure. */
static tt_tensor *device_grad(tt_tensor *target, uint64_t handle) {
  tt_tensor *t = tt_tensor_alloc(target->client);
  if (!t || tt_tensor_describe(target->client, t, TT_FLOAT32, target->shape, target->ndim) != TT_OK) {
    tt_tensor_free(t);
    tt_rpc_free_quiet(target->client, &handle, 1);
    return NULL;
  }
  t->place = target->place;
  strcpy(t->device_name, target->device_name);
  t->handle = handle;
  return t;
}

tt_status tt_run_ref_take_input_grads(tt_run_ref *ref, const Ttd__V1__BackwardResponse *resp) {
  tt_status st = TT_OK;
  for (size_t i = 0; i < resp->n_input_grads; i++) {
    uint64_t handle = resp->input_grads[i]->handle;
    if (!handle) continue;
    tt_tensor *target = (int)i < ref->n_inputs ? ref->grad_inputs[i] : NULL;
    if (!target) { /* not asked for: the daemon's tensor goes at once */
      tt_rpc_free_quiet(ref->client, &handle, 1);
      continue;
    }
    tt_tensor *g = device_grad(target, handle);
    tt_status one = g ? tt_input_grad_add(target, g) : tt_errcode(ref->client);
    if (st == TT_OK) st = one;
  }
  return st;
}
