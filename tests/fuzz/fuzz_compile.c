/* Fuzz harness: the graph compiler (daemon/program.c, daemon/ops.c) on the graph of a
 * CompileRequest and, when it compiles into a small enough program, the executor on it
 * (daemon/program_run.c and the simulated card's kernels), forward and backward: shapes
 * the compiler infers are the shapes the kernels then index with.
 *
 * Input: u8 flags (bit 0 runs the program forward, bit 1 also backward; bits 2-3 pick the
 * int32 data: zeros, small counts, or any value, negative included), then the bytes of a
 * CompileRequest. Inputs and parameters live in tt:0 DRAM of the in-process core's card,
 * charged to a quota of their own that must be back at zero afterwards, as must the card. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/program_run.h"
#include "fuzz_core.h"
#include "fuzz_input.h"
#include "fuzz_proto_mutate.h"

/* Bounds on what runs: bytes of every value together, and multiply-adds (estimated). */
#define MAX_RUN_BYTES (512u << 10)
#define MAX_RUN_WORK (1ull << 22)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Elements of shape, saturating at UINT64_MAX. */
static uint64_t numel(const ttd_kshape *s) {
  uint64_t n = 1;
  for (int i = 0; i < s->ndim; i++) {
    if (s->d[i] < 0 || __builtin_mul_overflow(n, (uint64_t)s->d[i], &n)) return UINT64_MAX;
  }
  return n;
}

static uint64_t add_sat(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }
static uint64_t mul_sat(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

/* Whether the program is small enough to run in a fuzz iteration. */
static bool small_enough(const ttd_program *p) {
  uint64_t bytes = 0, work = 0;
  for (int i = 0; i < p->n_values; i++) bytes = add_sat(bytes, mul_sat(numel(&p->values[i].type.shape), 4));
  for (int i = 0; i < p->n_nodes; i++) {
    const ttd_program_node *node = &p->nodes[i];
    uint64_t out = numel(&p->values[node->value].type.shape), per = 1;
    const ttd_kshape *a = &p->values[node->inputs[0]].type.shape;
    const ttd_kshape *b = node->n_inputs > 1 ? &p->values[node->inputs[1]].type.shape : NULL;
    if (node->op == TTD_OP_MATMUL && a->ndim >= 2) per = (uint64_t)a->d[a->ndim - (node->attrs.transpose_a ? 2 : 1)];
    else if (node->op == TTD_OP_LINEAR && a->ndim >= 1) per = (uint64_t)a->d[a->ndim - 1];
    else if (node->op == TTD_OP_CONV2D && b && b->ndim == 4) per = mul_sat(mul_sat((uint64_t)b->d[1], (uint64_t)b->d[2]), (uint64_t)b->d[3]);
    else if (node->op == TTD_OP_MAX_POOL2D || node->op == TTD_OP_AVG_POOL2D) per = mul_sat((uint64_t)node->attrs.kernel[0], (uint64_t)node->attrs.kernel[1]);
    else per = 1 + (numel(a) / (out ? out : 1)); /* reductions read more than they write */
    work = add_sat(work, mul_sat(out, per ? per : 1));
  }
  return bytes <= MAX_RUN_BYTES && work <= MAX_RUN_WORK;
}

static uint32_t next_random(uint32_t *state) {
  *state = *state * 1664525u + 1013904223u;
  return *state >> 8;
}

/* A tensor of value v in tt:0 DRAM, charged to quota, filled by the int mode of flags. */
static ttd_status_t make_operand(ttd_backend *backend, ttd_quota *quota, const ttd_value_type *v, uint8_t flags,
                                 uint32_t *rng, ttd_tensor **out) {
  ttd_tensor_spec spec = {.dtype = v->dtype, .ndim = v->shape.ndim, .location = TTD_MEM_DRAM};
  memcpy(spec.shape, v->shape.d, sizeof(int64_t) * (size_t)spec.ndim);
  TTD_RETURN_IF_ERROR(ttd_tensor_spec_finish(&spec));
  TTD_RETURN_IF_ERROR(ttd_tensor_create(backend, quota, &spec, out));
  unsigned char *bytes = malloc(spec.nbytes ? spec.nbytes : 1);
  if (!bytes) abort();
  for (uint64_t i = 0; i < spec.numel; i++) {
    uint32_t r = next_random(rng);
    float f = (float)r / 16777216.0f * 4.0f - 2.0f;
    if (spec.dtype == TTD_DTYPE_INT32) {
      int mode = (flags >> 2) & 3;
      int32_t x = mode == 0 ? 0 : mode == 1 ? (int32_t)(i % 5) : (int32_t)(r ^ (r << 9));
      memcpy(bytes + 4 * i, &x, 4);
    } else if (spec.dtype == TTD_DTYPE_BFLOAT16) {
      uint16_t h = ttd_bf16_from_f32(f);
      memcpy(bytes + 2 * i, &h, 2);
    } else {
      memcpy(bytes + 4 * i, &f, 4);
    }
  }
  ttd_status_t status = backend->vtable->buffer_write(backend, (*out)->buffer, 0, bytes, spec.nbytes);
  free(bytes);
  return status;
}

/* Float32 ones shaped like output o of the run, or NULL for an int32 output. */
static ttd_status_t make_output_grad(ttd_backend *backend, ttd_quota *quota, const ttd_program_value *o,
                                     ttd_tensor **out) {
  *out = NULL;
  if (o->type.dtype == TTD_DTYPE_INT32) return TTD_OK;
  ttd_value_type t = {.dtype = TTD_DTYPE_FLOAT32, .shape = o->type.shape};
  uint32_t unused = 1;
  TTD_RETURN_IF_ERROR(make_operand(backend, quota, &t, 0, &unused, out));
  float one = 1.0f;
  for (uint64_t i = 0; i < (*out)->spec.numel; i++) {
    TTD_RETURN_IF_ERROR(backend->vtable->buffer_write(backend, (*out)->buffer, 4 * i, &one, 4));
  }
  return TTD_OK;
}

static ttd_status_t backward(ttd_backend *backend, ttd_quota *quota, ttd_run *run) {
  const ttd_program *p = run->program;
  ttd_tensor **grads = calloc((size_t)(p->n_outputs + p->n_params + p->n_inputs) + 1, sizeof(*grads));
  if (!grads) abort();
  ttd_tensor **out_grads = grads, **param_grads = grads + p->n_outputs, **input_grads = param_grads + p->n_params;
  ttd_status_t status = TTD_OK;
  for (int i = 0; i < p->n_outputs && !status; i++) {
    status = make_output_grad(backend, quota, &p->values[p->outputs[i]], &out_grads[i]);
  }
  if (!status) status = ttd_run_backward(run, backend, out_grads, param_grads, input_grads);
  for (int i = 0; i < p->n_outputs + p->n_params + p->n_inputs; i++) ttd_tensor_release(grads[i]);
  free(grads);
  return status;
}

/* Runs p forward (and backward with flags bit 1) on operands made for it. */
static ttd_status_t run(ttd_backend *backend, ttd_program *p, uint8_t flags) {
  ttd_quota *quota = ttd_quota_create(0);
  ttd_tensor **operands = calloc((size_t)(p->n_inputs + p->n_params) + 1, sizeof(*operands));
  if (!quota || !operands) abort();
  uint32_t rng = flags;
  ttd_status_t status = TTD_OK;
  for (int i = 0; i < p->n_inputs + p->n_params && !status; i++) {
    status = make_operand(backend, quota, &p->values[i].type, flags, &rng, &operands[i]);
  }
  ttd_run *r = NULL;
  if (!status) status = ttd_run_forward(backend, quota, p, operands, p->n_inputs, operands + p->n_inputs, p->n_params, &r);
  if (!status && (flags & 2)) status = backward(backend, quota, r);
  ttd_run_free(r);
  for (int i = 0; i < p->n_inputs + p->n_params; i++) ttd_tensor_release(operands[i]);
  free(operands);
  if (atomic_load(&quota->used) != 0) {
    fprintf(stderr, "fuzz: accounting leak: the run's quota still holds %llu bytes\n",
            (unsigned long long)atomic_load(&quota->used));
    abort();
  }
  ttd_quota_release(quota);
  return status;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ttd_core *core = fuzz_core_begin_input();
  fuzz_input in = {data, size};
  uint8_t flags = fuzz_u8(&in);
  Ttd__V1__CompileRequest *req = ttd__v1__compile_request__unpack(NULL, in.left, in.data);
  if (!req) return 0;
  ttd_program *program = NULL;
  ttd_status_t status = ttd_program_compile(req->graph, &program);
  if (!status && (flags & 1) && small_enough(program)) status = run(core->backend, program, flags);
  fuzz_check_status("the graph compiler and executor", status);
  ttd_program_release(program);
  ttd__v1__compile_request__free_unpacked(req, NULL);
  fuzz_backend_assert_empty(core->backend, "after the program ran");
  return 0;
}

/* libFuzzer's mutations, and one time in three a field of the graph set to an edge value or
 * a name (fuzz_proto_mutate.h): dims and attributes past 2^31 and 2^62, other ops. */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
  static const char *words[TTD_OP_COUNT + 32];
  if (!words[0]) {
    static const char *const more[] = {"x", "y", "w", "b", "a", "t", "m", "loss", "axes", "keepdim", "shape",
                                       "perm", "dim0", "dim1", "start_dim", "axis", "kernel", "stride", "padding",
                                       "transpose_a", "transpose_b", "eps", "p", "seed", NULL};
    int n = 0;
    for (int op = 0; op < TTD_OP_COUNT; op++) words[n++] = ttd_op_name((ttd_op)op);
    for (int i = 0; more[i]; i++) words[n++] = more[i];
  }
  if (size > 1 && seed % 3 == 0) {
    uint8_t *out = malloc(max_size);
    size_t n = out ? fuzz_proto_mutate(&ttd__v1__compile_request__descriptor, data + 1, size - 1, out, max_size - 1,
                                       seed, words)
                   : 0;
    if (n) memcpy(data + 1, out, n);
    free(out);
    if (n) return n + 1;
  }
  return LLVMFuzzerMutate(data, size, max_size);
}
