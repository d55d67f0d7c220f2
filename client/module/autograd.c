/* Host tensors with autograd: losses computed on the CPU are recorded, and tt_backward walks
 * them in reverse. On reaching a tensor downloaded from a device output (tt_to(.., "cpu") of
 * a training forward) it sends the gradient back to the card and calls the module's
 * Backward, as a torch register_hook on that tensor would. A device output used twice, or
 * outputs of several runs, accumulate before anything is sent. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/ops.h"
#include "kernels.h"
#include "module/module.h"

typedef enum node_kind { NODE_L1, NODE_MSE, NODE_CROSS_ENTROPY, NODE_ADD, NODE_MUL, NODE_SUM, NODE_MEAN } node_kind;

/* The op that made a host tensor (its grad_fn), with its inputs. */
typedef struct autograd_node {
  tt_tensor_tie tie; /* the tensor's hold on it; first */
  node_kind kind;
  tt_tensor *inputs[2]; /* one reference each */
} autograd_node;

static void node_release(tt_tensor_tie *tie) {
  autograd_node *node = (autograd_node *)tie;
  tt_tensor_free(node->inputs[0]);
  tt_tensor_free(node->inputs[1]);
  free(node);
}

static const autograd_node *node_of(const tt_tensor *t) { return (const autograd_node *)t->grad_fn; }

static tt_status track(tt_tensor *out, node_kind kind, tt_tensor *a, tt_tensor *b) {
  autograd_node *n = calloc(1, sizeof(*n));
  if (!n) return tt_client_fail(out->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  n->tie.release = node_release;
  n->kind = kind;
  n->inputs[0] = tt_tensor_retain(a);
  n->inputs[1] = tt_tensor_retain(b);
  out->grad_fn = &n->tie;
  return TT_OK;
}

static int same_shape(const tt_tensor *a, const tt_tensor *b) {
  return a->ndim == b->ndim && memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

static tt_tensor *pair_loss(tt_tensor *input, tt_tensor *target, node_kind kind, const char *what) {
  if (!input || !target) return NULL;
  tt_client *c = input->client;
  char b1[96], b2[96];
  if (!input->place.is_host || !target->place.is_host) {
    tt_client_fail(c, TT_INVALID_ARGUMENT, "%s runs on the CPU: give it host tensors (tt_to(.., \"cpu\"))", what);
    return NULL;
  }
  if (input->dtype != TT_FLOAT32 || target->dtype != TT_FLOAT32 || !same_shape(input, target)) {
    ttd_kshape as = {.ndim = input->ndim}, bs = {.ndim = target->ndim};
    memcpy(as.d, input->shape, sizeof(int64_t) * (size_t)input->ndim);
    memcpy(bs.d, target->shape, sizeof(int64_t) * (size_t)target->ndim);
    tt_client_fail(c, TT_INVALID_ARGUMENT, "%s needs float32 input and target of one shape, got %s and %s", what,
                   ttd_kshape_format(&as, b1, sizeof(b1)), ttd_kshape_format(&bs, b2, sizeof(b2)));
    return NULL;
  }
  tt_tensor *loss = tt_tensor_from_host(c, NULL, TT_FLOAT32, NULL, 0);
  if (!loss) return NULL;
  if (kind == NODE_L1) ttd_k_l1_loss(NULL, input->data, target->data, (int64_t)input->numel, loss->data);
  else ttd_k_mse_loss(NULL, input->data, target->data, (int64_t)input->numel, loss->data);
  if (track(loss, kind, input, target) != TT_OK) {
    tt_tensor_free(loss);
    return NULL;
  }
  return loss;
}

tt_tensor *tt_l1_loss(tt_tensor *input, tt_tensor *target) { return pair_loss(input, target, NODE_L1, "l1_loss"); }
tt_tensor *tt_mse_loss(tt_tensor *input, tt_tensor *target) { return pair_loss(input, target, NODE_MSE, "mse_loss"); }

tt_tensor *tt_cross_entropy(tt_tensor *logits, tt_tensor *labels) {
  if (!logits || !labels) return NULL;
  tt_client *c = logits->client;
  if (!logits->place.is_host || !labels->place.is_host || logits->dtype != TT_FLOAT32 || labels->dtype != TT_INT32 ||
      logits->ndim != 2 || labels->ndim != 1 || labels->shape[0] != logits->shape[0]) {
    tt_client_fail(c, TT_INVALID_ARGUMENT,
                   "cross_entropy needs host float32 logits [n, classes] and int32 labels [n] on the CPU");
    return NULL;
  }
  tt_tensor *loss = tt_tensor_from_host(c, NULL, TT_FLOAT32, NULL, 0);
  if (!loss) return NULL;
  int64_t bad = 0;
  if (ttd_k_cross_entropy(NULL, logits->data, labels->data, logits->shape[0], logits->shape[1], loss->data, &bad) != 0) {
    tt_client_fail(c, TT_INVALID_ARGUMENT, "label %d at position %lld is outside [0, %lld)", ((int32_t *)labels->data)[bad],
                   (long long)bad, (long long)logits->shape[1]);
    tt_tensor_free(loss);
    return NULL;
  }
  if (track(loss, NODE_CROSS_ENTROPY, logits, labels) != TT_OK) {
    tt_tensor_free(loss);
    return NULL;
  }
  return loss;
}

static ttd_kshape kshape_of(const tt_tensor *t) {
  ttd_kshape k = {.ndim = t->ndim};
  memcpy(k.d, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  return k;
}

/* add and mul with numpy broadcasting, on host float32 tensors. */
static tt_tensor *binary(tt_tensor *a, tt_tensor *b, node_kind kind) {
  if (!a || !b) return NULL;
  tt_client *c = a->client;
  const char *what = kind == NODE_ADD ? "add" : "mul";
  if (!a->place.is_host || !b->place.is_host || a->dtype != TT_FLOAT32 || b->dtype != TT_FLOAT32) {
    tt_client_fail(c, TT_INVALID_ARGUMENT, "%s runs on the CPU on float32 host tensors", what);
    return NULL;
  }
  ttd_kshape as = kshape_of(a), bs = kshape_of(b), os;
  char b1[96], b2[96];
  if (ttd_broadcast_shape(&as, &bs, &os) != 0) {
    tt_client_fail(c, TT_INVALID_ARGUMENT, "%s: shapes %s and %s do not broadcast", what, ttd_kshape_format(&as, b1, sizeof(b1)),
                   ttd_kshape_format(&bs, b2, sizeof(b2)));
    return NULL;
  }
  tt_tensor *out = tt_tensor_from_host(c, NULL, TT_FLOAT32, os.d, os.ndim);
  if (!out) return NULL;
  ttd_k_binary(NULL, kind == NODE_ADD ? TTD_BIN_ADD : TTD_BIN_MUL, a->data, &as, b->data, &bs, out->data, &os);
  if (track(out, kind, a, b) != TT_OK) {
    tt_tensor_free(out);
    return NULL;
  }
  return out;
}

tt_tensor *tt_add(tt_tensor *a, tt_tensor *b) { return binary(a, b, NODE_ADD); }
tt_tensor *tt_mul(tt_tensor *a, tt_tensor *b) { return binary(a, b, NODE_MUL); }

/* sum and mean of all elements, into a scalar. */
static tt_tensor *reduce_all(tt_tensor *a, node_kind kind) {
  if (!a) return NULL;
  if (!a->place.is_host || a->dtype != TT_FLOAT32) {
    tt_client_fail(a->client, TT_INVALID_ARGUMENT, "%s runs on the CPU on a float32 host tensor", kind == NODE_SUM ? "sum" : "mean");
    return NULL;
  }
  tt_tensor *out = tt_tensor_from_host(a->client, NULL, TT_FLOAT32, NULL, 0);
  if (!out) return NULL;
  ttd_kshape as = kshape_of(a);
  ttd_k_reduce(NULL, kind == NODE_SUM ? TTD_RED_SUM : TTD_RED_MEAN, a->data, &as, (1u << a->ndim) - 1, out->data);
  if (track(out, kind, a, NULL) != TT_OK) {
    tt_tensor_free(out);
    return NULL;
  }
  return out;
}

tt_tensor *tt_sum(tt_tensor *a) { return reduce_all(a, NODE_SUM); }
tt_tensor *tt_mean(tt_tensor *a) { return reduce_all(a, NODE_MEAN); }

float tt_tensor_item(const tt_tensor *t) {
  if (!t || !t->place.is_host || t->numel == 0) return NAN;
  if (t->dtype == TT_INT32) return (float)((int32_t *)t->data)[0];
  if (t->dtype == TT_BFLOAT16) return ttd_f32_from_bf16(((uint16_t *)t->data)[0]);
  return ((float *)t->data)[0];
}

/* Adds n floats of g into t's gradient, creating it. */
static int add_grad(tt_tensor *t, const float *g, uint64_t n) {
  if (!t->grad) {
    t->grad = calloc(n ? n : 1, sizeof(float));
    if (!t->grad) return -1;
  }
  for (uint64_t i = 0; i < n; i++) t->grad[i] += g[i];
  return 0;
}

/* Whether t's gradient goes anywhere: to an op's inputs, a module run, or a downloaded output's run. */
static bool needs_grad(const tt_tensor *t) { return t && (t->grad_fn || t->run || t->from_output); }

/* Gradients of add, mul, sum and mean for the inputs that need them. */
static tt_status elementwise_backward(tt_client *c, const autograd_node *node, const tt_tensor *t) {
  tt_tensor *a = node->inputs[0], *b = node->inputs[1];
  float *ga = needs_grad(a) ? malloc(sizeof(float) * (a->numel ? a->numel : 1)) : NULL;
  float *gb = needs_grad(b) ? malloc(sizeof(float) * (b->numel ? b->numel : 1)) : NULL;
  if ((needs_grad(a) && !ga) || (needs_grad(b) && !gb)) {
    free(ga);
    free(gb);
    return tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "out of host memory");
  }
  ttd_kshape as = kshape_of(a), os = kshape_of(t);
  if (node->kind == NODE_SUM || node->kind == NODE_MEAN) {
    if (ga) ttd_k_reduce_backward(NULL, node->kind == NODE_SUM ? TTD_RED_SUM : TTD_RED_MEAN, t->grad, &as,
                                  (1u << a->ndim) - 1, ga);
  } else {
    ttd_kshape bs = kshape_of(b);
    ttd_k_binary_backward(NULL, node->kind == NODE_ADD ? TTD_BIN_ADD : TTD_BIN_MUL, a->data, &as, b->data, &bs, t->grad,
                          &os, ga, gb);
  }
  int rc = (ga && add_grad(a, ga, a->numel) != 0) || (gb && add_grad(b, gb, b->numel) != 0);
  free(ga);
  free(gb);
  return rc ? tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "out of host memory") : TT_OK;
}

/* Tensors reachable from loss through grad_fn, in post-order (inputs before users). */
static int collect(tt_tensor *t, tt_tensor ***list, int *n, int *cap) {
  for (int i = 0; i < *n; i++) {
    if ((*list)[i] == t) return 0;
  }
  const autograd_node *node = node_of(t);
  for (int k = 0; node && k < 2; k++) {
    if (node->inputs[k] && collect(node->inputs[k], list, n, cap) != 0) return -1;
  }
  if (*n == *cap) {
    int cap2 = *cap ? *cap * 2 : 16;
    tt_tensor **grown = realloc(*list, sizeof(**list) * (size_t)cap2);
    if (!grown) return -1;
    *list = grown;
    *cap = cap2;
  }
  (*list)[(*n)++] = t;
  return 0;
}

/* Sends a touched run's accumulated output gradients to the card and runs Backward now,
 * with the module's queued parameter work riding along. */
static tt_status flush_run(tt_run_ref *ref) {
  tt_client *c = ref->client;
  if (ref->local_run) return tt_module_backward_local(ref->module, ref);
  TT_RETURN_IF_FAILED(tt_module_flush_backward(ref->module)); /* one left waiting goes first */
  tt_backward_call bc;
  memset(&bc, 0, sizeof(bc));
  tt_status st = tt_backward_call_begin(ref, &bc);
  if (st == TT_OK && tt_inline_enabled(c)) st = tt_module_take_work(ref->module, &bc.before, &bc.req.before);
  return tt_backward_call_send(ref, &bc, st);
}

/* Drops the output gradients a backward summed into ref and did not send. */
static void forget_output_grads(tt_run_ref *ref) {
  for (int i = 0; i < ref->n_outputs; i++) {
    free(ref->output_grads[i]);
    ref->output_grads[i] = NULL;
  }
}

/* Adds t's gradient into the run of output (a module output: device, or host on "cpu"),
 * remembering the run for the flush. A run kept by an earlier backward (retain_graph) whose
 * Backward still waits sends that one first. */
static tt_status accumulate_output(tt_client *c, const tt_tensor *output, const tt_tensor *t, tt_run_ref **runs,
                                   int *n_runs) {
  tt_run_ref *ref = tt_tensor_run(output);
  if (ref->backward_waiting && ref->keep) TT_RETURN_IF_FAILED(tt_module_flush_backward(ref->module));
  if ((!ref->run && !ref->local_run) || ref->backward_waiting) {
    return tt_client_fail(c, TT_FAILED_PRECONDITION,
                          "this backward reaches a module run that was already backpropagated or released (as torch "
                          "frees a graph after backward); run forward again, or keep the run for another backward "
                          "with retain_graph");
  }
  if (ref->param_version != ref->module->param_version) {
    return tt_client_fail(c, TT_FAILED_PRECONDITION,
                          "this backward reaches a module run whose parameters were changed after its forward (a "
                          "tt_step or tt_module_load since), as torch refuses (\"modified by an inplace operation\"); "
                          "run the forward again after the step");
  }
  float **acc = &ref->output_grads[output->output_index];
  if (!*acc) *acc = calloc(t->numel ? t->numel : 1, sizeof(float));
  if (!*acc) return tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (uint64_t k = 0; k < t->numel; k++) (*acc)[k] += t->grad[k];
  for (int r = 0; r < *n_runs; r++) {
    if (runs[r] == ref) return TT_OK;
  }
  if (*n_runs == 16) return tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "a loss may reach at most 16 module runs");
  runs[(*n_runs)++] = ref;
  return TT_OK;
}

/* Checks tensors[i] and grads[i] (NULL: 1 for a scalar), and seeds each tensor's gradient. */
static tt_status seed(tt_client *c, tt_tensor *const *tensors, tt_tensor *const *grads, int n) {
  for (int i = 0; i < n; i++) {
    const tt_tensor *t = tensors[i], *g = grads ? grads[i] : NULL;
    char b1[96], b2[96];
    if (!t) return tt_client_fail(c, TT_INVALID_ARGUMENT, "tensor %d is NULL", i);
    if (!needs_grad(t) || t->dtype != TT_FLOAT32) {
      return tt_client_fail(c, TT_INVALID_ARGUMENT,
                            "tensor %d does not lead back to a training forward: give float32 outputs of a module "
                            "in training mode, their downloads, or what tracked ops (tt_l1_loss, tt_mse_loss, "
                            "tt_cross_entropy, tt_add, tt_mul, tt_sum, tt_mean) made of them",
                            i);
    }
    if (!g && t->numel != 1) {
      ttd_kshape ts = kshape_of(t);
      return tt_client_fail(c, TT_INVALID_ARGUMENT, "tensor %d has shape %s: give its gradient (only a one-element "
                            "tensor's gradient may be left implicit, as torch's)", i, ttd_kshape_format(&ts, b1, sizeof(b1)));
    }
    if (g && (!g->place.is_host || g->dtype != TT_FLOAT32 || !same_shape(g, t))) {
      ttd_kshape ts = kshape_of(t), gs = kshape_of(g);
      return tt_client_fail(c, TT_INVALID_ARGUMENT, "the gradient of tensor %d must be a float32 host tensor of its "
                            "shape %s, got %s %s on %s", i, ttd_kshape_format(&ts, b1, sizeof(b1)),
                            g->dtype == TT_FLOAT32 ? "float32" : "non-float32", ttd_kshape_format(&gs, b2, sizeof(b2)),
                            g->device_name);
    }
  }
  float one = 1.0f;
  for (int i = 0; i < n; i++) {
    if (add_grad(tensors[i], grads && grads[i] ? (const float *)grads[i]->data : &one, tensors[i]->numel) != 0) {
      return tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "out of host memory");
    }
  }
  return TT_OK;
}

tt_status tt_backward(tt_tensor *loss) {
  if (!loss) return TT_INVALID_ARGUMENT;
  if (!needs_grad(loss) || !loss->place.is_host || loss->numel != 1 || loss->dtype != TT_FLOAT32) {
    return tt_client_fail(loss->client, TT_INVALID_ARGUMENT,
                          "backward needs a float32 scalar loss computed by tracked ops (tt_l1_loss, tt_mse_loss, "
                          "tt_cross_entropy) from outputs of a module in training mode");
  }
  return tt_backward_grads(&loss, NULL, 1, 0);
}

tt_status tt_backward_grads(tt_tensor *const *tensors, tt_tensor *const *grads, int n, int retain_graph) {
  if (!tensors || n <= 0 || !tensors[0]) return TT_INVALID_ARGUMENT; /* no client to tell why */
  tt_client *c = tensors[0]->client;
  if (n > 64) return tt_client_fail(c, TT_INVALID_ARGUMENT, "backward from %d tensors at once; at most 64", n);
  tt_tensor **list = NULL;
  int count = 0, cap = 0;
  tt_run_ref *runs[16];
  int n_runs = 0;
  tt_status st = seed(c, tensors, grads, n);
  for (int i = 0; st == TT_OK && i < n; i++) {
    if (collect(tensors[i], &list, &count, &cap) != 0) st = tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "out of host memory");
  }
  for (int i = count - 1; st == TT_OK && i >= 0; i--) {
    tt_tensor *t = list[i];
    const autograd_node *node = node_of(t);
    if (!t->grad) continue;
    /* A module output (on a card, or a host one on "cpu"), or the download of a device
     * output: to its run. */
    tt_tensor *output = t->run ? t : t->from_output;
    if (output) {
      st = accumulate_output(c, output, t, runs, &n_runs);
      continue;
    }
    if (!node) continue;
    tt_tensor *a = node->inputs[0], *b = node->inputs[1];
    if (node->kind == NODE_ADD || node->kind == NODE_MUL || node->kind == NODE_SUM || node->kind == NODE_MEAN) {
      st = elementwise_backward(c, node, t);
      continue;
    }
    if (!needs_grad(a)) continue; /* nothing upstream needs this gradient */
    float *ga = malloc(sizeof(float) * (a->numel ? a->numel : 1));
    if (!ga) {
      st = tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "out of host memory");
      break;
    }
    float g = t->grad[0];
    if (node->kind == NODE_L1) ttd_k_l1_loss_backward(NULL, a->data, b->data, (int64_t)a->numel, g, ga, NULL);
    else if (node->kind == NODE_MSE) ttd_k_mse_loss_backward(NULL, a->data, b->data, (int64_t)a->numel, g, ga, NULL);
    else ttd_k_cross_entropy_backward(NULL, a->data, b->data, a->shape[0], a->shape[1], g, ga);
    if (add_grad(a, ga, a->numel) != 0) st = tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "out of host memory");
    free(ga);
  }
  if (st != TT_OK) { /* a backward that failed before any run's Backward: it added nothing */
    for (int r = 0; r < n_runs; r++) forget_output_grads(runs[r]);
    n_runs = 0;
  }
  for (int r = 0; r < n_runs; r++) runs[r]->keep = retain_graph != 0;
  /* One run on a card: its Backward rides on the module's next Execute (one round trip a
   * step). Else later runs first: a run's output may feed a later run only through the host. */
  if (st == TT_OK && n_runs == 1 && tt_backward_can_wait(runs[0])) {
    st = tt_module_defer_backward(runs[0]->module, runs[0]);
  } else {
    for (int r = n_runs - 1; st == TT_OK && r >= 0; r--) st = flush_run(runs[r]);
  }
  for (int i = 0; i < n; i++) { /* seeded, maybe not collected */
    if (!tensors[i]) continue;
    free(tensors[i]->grad);
    tensors[i]->grad = NULL;
  }
  for (int i = 0; i < count; i++) {
    free(list[i]->grad);
    list[i]->grad = NULL;
  }
  free(list);
  return st;
}
