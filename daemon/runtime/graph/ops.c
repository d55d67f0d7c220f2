#include "graph/ops.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ttd_dtype's values are ttd.v1.DType's: the daemon and the client cast one into the other. */
_Static_assert(TTD_DTYPE_INVALID == (int)TTD__V1__DTYPE__DTYPE_UNSPECIFIED &&
                   TTD_DTYPE_FLOAT32 == (int)TTD__V1__DTYPE__DTYPE_FLOAT32 &&
                   TTD_DTYPE_BFLOAT16 == (int)TTD__V1__DTYPE__DTYPE_BFLOAT16 &&
                   TTD_DTYPE_INT32 == (int)TTD__V1__DTYPE__DTYPE_INT32,
               "ttd_dtype must equal ttd.v1.DType value for value");

typedef ttd_status_t (*infer_fn)(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                 ttd_value_type *out);

typedef struct op_def {
  const char *name;
  int min_inputs, max_inputs;
  const char *attrs; /* accepted attribute names, comma-separated */
  infer_fn infer;
} op_def;

const char *ttd_kshape_format(const ttd_kshape *s, char *buf, size_t len) {
  size_t used = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < s->ndim && used < len; i++) {
    used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)s->d[i]);
  }
  if (used < len) snprintf(buf + used, len - used, "]");
  return buf;
}

static ttd_status_t bad(const Ttd__V1__Node *node, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ttd_status_t bad(const Ttd__V1__Node *node, const char *fmt, ...) {
  char why[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof(why), fmt, ap);
  va_end(ap);
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "node '%.128s' (%.32s): %s", node->name, node->op, why);
}

static const Ttd__V1__Attr *find_attr(const Ttd__V1__Node *node, const char *name) {
  for (size_t i = 0; i < node->n_attrs; i++) {
    if (strcmp(node->attrs[i]->name, name) == 0) return node->attrs[i];
  }
  return NULL;
}

static ttd_status_t attr_int(const Ttd__V1__Node *node, const char *name, int64_t def, int64_t *out) {
  const Ttd__V1__Attr *a = find_attr(node, name);
  *out = def;
  if (!a) return TTD_OK;
  if (a->value_case != TTD__V1__ATTR__VALUE_I) return bad(node, "attribute '%s' must be an integer (field i)", name);
  *out = a->i;
  return TTD_OK;
}

static ttd_status_t attr_float(const Ttd__V1__Node *node, const char *name, float def, float *out) {
  const Ttd__V1__Attr *a = find_attr(node, name);
  *out = def;
  if (!a) return TTD_OK;
  if (a->value_case != TTD__V1__ATTR__VALUE_F) return bad(node, "attribute '%s' must be a float (field f)", name);
  *out = a->f;
  return TTD_OK;
}

/* A list of ints; a single int is taken as a list of one. Returns the count in *out_n. */
static ttd_status_t attr_ints(const Ttd__V1__Node *node, const char *name, int64_t *out, int max, int *out_n) {
  const Ttd__V1__Attr *a = find_attr(node, name);
  *out_n = -1; /* absent */
  if (!a) return TTD_OK;
  if (a->value_case == TTD__V1__ATTR__VALUE_I) {
    out[0] = a->i;
    *out_n = 1;
    return TTD_OK;
  }
  if (a->value_case != TTD__V1__ATTR__VALUE_INTS || !a->ints) {
    return bad(node, "attribute '%s' must be a list of integers (field ints)", name);
  }
  if (a->ints->n_values > (size_t)max) return bad(node, "attribute '%s' has more than %d values", name, max);
  for (size_t i = 0; i < a->ints->n_values; i++) out[i] = a->ints->values[i];
  *out_n = (int)a->ints->n_values;
  return TTD_OK;
}

static ttd_status_t need_float(const Ttd__V1__Node *node, const ttd_value_type *v, int index) {
  if (v->dtype != TTD_DTYPE_FLOAT32 && v->dtype != TTD_DTYPE_BFLOAT16) {
    return bad(node, "input %d must be floating point, got %s", index, ttd_dtype_name(v->dtype));
  }
  return TTD_OK;
}

static ttd_status_t need_all_float(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n) {
  for (int i = 0; i < n; i++) TTD_RETURN_IF_ERROR(need_float(node, in[i], i));
  return TTD_OK;
}

/* A negative axis counts from the end. Past +-TTD_MAX_DIMS it is -1, out of range for every
 * caller, rather than wrapped by the cast to int (2^32 is not axis 0). */
static int norm_axis(int64_t axis, int ndim) {
  if (axis < -TTD_MAX_DIMS || axis > TTD_MAX_DIMS) return -1;
  return (int)(axis < 0 ? axis + ndim : axis);
}

static void set_float(ttd_value_type *out, const ttd_kshape *shape) {
  out->dtype = TTD_DTYPE_FLOAT32;
  out->shape = *shape;
}

static ttd_status_t infer_matmul(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                 ttd_value_type *out) {
  TTD_RETURN_IF_ERROR(need_all_float(node, in, n));
  int64_t ta, tb;
  TTD_RETURN_IF_ERROR(attr_int(node, "transpose_a", 0, &ta));
  TTD_RETURN_IF_ERROR(attr_int(node, "transpose_b", 0, &tb));
  a->transpose_a = ta != 0;
  a->transpose_b = tb != 0;
  const ttd_kshape *as = &in[0]->shape, *bs = &in[1]->shape;
  if (as->ndim < 2 || bs->ndim < 2) return bad(node, "both inputs need at least 2 dims, got %d and %d", as->ndim, bs->ndim);
  int64_t m = as->d[as->ndim - (a->transpose_a ? 1 : 2)], k = as->d[as->ndim - (a->transpose_a ? 2 : 1)];
  int64_t k2 = bs->d[bs->ndim - (a->transpose_b ? 1 : 2)], nn = bs->d[bs->ndim - (a->transpose_b ? 2 : 1)];
  char b1[96], b2[96];
  if (k != k2) {
    return bad(node, "inner dims differ: %s x %s (k %lld vs %lld)", ttd_kshape_format(as, b1, sizeof(b1)),
               ttd_kshape_format(bs, b2, sizeof(b2)), (long long)k, (long long)k2);
  }
  const ttd_kshape *batch = as->ndim >= bs->ndim ? as : bs;
  const ttd_kshape *other = batch == as ? bs : as;
  if (other->ndim > 2) {
    if (other->ndim != batch->ndim || memcmp(other->d, batch->d, sizeof(int64_t) * (size_t)(batch->ndim - 2)) != 0) {
      return bad(node, "batch dims of %s and %s differ; one side may be 2-D to broadcast",
                 ttd_kshape_format(as, b1, sizeof(b1)), ttd_kshape_format(bs, b2, sizeof(b2)));
    }
  }
  ttd_kshape o = *batch;
  o.d[o.ndim - 2] = m;
  o.d[o.ndim - 1] = nn;
  set_float(out, &o);
  return TTD_OK;
}

static ttd_status_t infer_linear(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                 ttd_value_type *out) {
  (void)a;
  TTD_RETURN_IF_ERROR(need_all_float(node, in, n));
  const ttd_kshape *xs = &in[0]->shape, *ws = &in[1]->shape;
  char b1[96], b2[96];
  if (xs->ndim < 1 || ws->ndim != 2 || xs->d[xs->ndim - 1] != ws->d[1]) {
    return bad(node, "x %s and weight %s do not fit: weight must be [out, in] with in = x's last dim",
               ttd_kshape_format(xs, b1, sizeof(b1)), ttd_kshape_format(ws, b2, sizeof(b2)));
  }
  if (n == 3 && (in[2]->shape.ndim != 1 || in[2]->shape.d[0] != ws->d[0])) {
    return bad(node, "bias %s must be [%lld]", ttd_kshape_format(&in[2]->shape, b1, sizeof(b1)), (long long)ws->d[0]);
  }
  ttd_kshape o = *xs;
  o.d[o.ndim - 1] = ws->d[0];
  set_float(out, &o);
  return TTD_OK;
}

/* A number attribute given as a float (field f) or an integer (field i); def when absent. */
static ttd_status_t attr_number(const Ttd__V1__Node *node, const char *name, float def, float *out) {
  const Ttd__V1__Attr *a = find_attr(node, name);
  *out = def;
  if (a && a->value_case == TTD__V1__ATTR__VALUE_I) {
    *out = (float)a->i;
    return TTD_OK;
  }
  return attr_float(node, name, def, out);
}

/* Two tensors with numpy broadcasting, or one tensor and the attribute `scalar` (x op
 * scalar; with reverse=1, scalar op x), which keeps the tensor's shape. */
static ttd_status_t infer_binary(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                 ttd_value_type *out) {
  TTD_RETURN_IF_ERROR(need_all_float(node, in, n));
  int has_scalar = find_attr(node, "scalar") != NULL;
  if (n == 1) {
    if (!has_scalar) return bad(node, "takes two inputs, or one input and the attribute 'scalar'");
    int64_t reverse;
    TTD_RETURN_IF_ERROR(attr_number(node, "scalar", 0.0f, &a->scalar));
    TTD_RETURN_IF_ERROR(attr_int(node, "reverse", 0, &reverse));
    if (reverse != 0 && reverse != 1) return bad(node, "attribute 'reverse' must be 0 or 1, got %lld", (long long)reverse);
    a->scalar_operand = true;
    a->reverse = reverse == 1;
    set_float(out, &in[0]->shape);
    return TTD_OK;
  }
  if (has_scalar || find_attr(node, "reverse")) {
    return bad(node, "attributes 'scalar' and 'reverse' go with one input; with two inputs give neither");
  }
  ttd_kshape o;
  char b1[96], b2[96];
  if (ttd_broadcast_shape(&in[0]->shape, &in[1]->shape, &o) != 0) {
    return bad(node, "shapes %s and %s do not broadcast", ttd_kshape_format(&in[0]->shape, b1, sizeof(b1)),
               ttd_kshape_format(&in[1]->shape, b2, sizeof(b2)));
  }
  set_float(out, &o);
  return TTD_OK;
}

static ttd_status_t infer_same(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                               ttd_value_type *out) {
  (void)a;
  TTD_RETURN_IF_ERROR(need_all_float(node, in, n));
  set_float(out, &in[0]->shape);
  return TTD_OK;
}

static ttd_status_t infer_dropout(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                  ttd_value_type *out) {
  TTD_RETURN_IF_ERROR(attr_float(node, "p", 0.5f, &a->p));
  int64_t seed;
  TTD_RETURN_IF_ERROR(attr_int(node, "seed", 0, &seed));
  a->seed = (uint64_t)seed;
  if (!(a->p >= 0.0f && a->p <= 1.0f)) return bad(node, "p must be in [0, 1], got %g", (double)a->p); /* 1: all dropped */
  return infer_same(node, in, n, a, out);
}

static ttd_status_t infer_reduce(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                 ttd_value_type *out) {
  TTD_RETURN_IF_ERROR(need_all_float(node, in, n));
  const ttd_kshape *xs = &in[0]->shape;
  int64_t axes[TTD_MAX_DIMS], keep;
  int count;
  TTD_RETURN_IF_ERROR(attr_ints(node, "axes", axes, TTD_MAX_DIMS, &count));
  TTD_RETURN_IF_ERROR(attr_int(node, "keepdim", 0, &keep));
  a->keepdim = keep != 0;
  a->axes_mask = 0;
  if (count <= 0) {
    a->axes_mask = xs->ndim ? (uint32_t)((1u << xs->ndim) - 1) : 0;
  } else {
    for (int i = 0; i < count; i++) {
      int ax = norm_axis(axes[i], xs->ndim);
      if (ax < 0 || ax >= xs->ndim) return bad(node, "axis %lld is out of range for %d dims", (long long)axes[i], xs->ndim);
      if (a->axes_mask & (1u << ax)) return bad(node, "axis %lld is listed twice", (long long)axes[i]);
      a->axes_mask |= 1u << ax;
    }
  }
  ttd_kshape o = {0};
  for (int i = 0; i < xs->ndim; i++) {
    if (a->axes_mask & (1u << i)) {
      if (a->keepdim) o.d[o.ndim++] = 1;
    } else {
      o.d[o.ndim++] = xs->d[i];
    }
  }
  set_float(out, &o);
  return TTD_OK;
}

static ttd_status_t infer_reshape(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                  ttd_value_type *out) {
  (void)n;
  (void)a;
  int64_t dims[TTD_MAX_DIMS];
  int count;
  TTD_RETURN_IF_ERROR(attr_ints(node, "shape", dims, TTD_MAX_DIMS, &count));
  if (count < 0) return bad(node, "attribute 'shape' is required");
  int64_t known = 1;
  int infer_at = -1;
  for (int i = 0; i < count; i++) {
    if (dims[i] == -1 && infer_at < 0) infer_at = i;
    else if (dims[i] < 0) return bad(node, "shape dim %d is %lld; use sizes >= 0 and at most one -1", i, (long long)dims[i]);
    else if (__builtin_mul_overflow(known, dims[i], &known)) return bad(node, "shape overflows");
  }
  int64_t numel = ttd_kshape_numel(&in[0]->shape);
  if (infer_at >= 0) {
    if (known == 0 || numel % known != 0) return bad(node, "cannot infer the -1 dim: %lld elements into %lld", (long long)numel, (long long)known);
    dims[infer_at] = numel / known;
    known = numel;
  }
  char b1[96];
  if (known != numel) {
    return bad(node, "cannot reshape %s (%lld elements) into %lld elements", ttd_kshape_format(&in[0]->shape, b1, sizeof(b1)),
               (long long)numel, (long long)known);
  }
  out->dtype = in[0]->dtype == TTD_DTYPE_INT32 ? TTD_DTYPE_INT32 : TTD_DTYPE_FLOAT32;
  out->shape.ndim = count;
  memcpy(out->shape.d, dims, sizeof(int64_t) * (size_t)count);
  return TTD_OK;
}

static ttd_status_t infer_flatten(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                  ttd_value_type *out) {
  TTD_RETURN_IF_ERROR(need_all_float(node, in, n));
  int64_t start;
  TTD_RETURN_IF_ERROR(attr_int(node, "start_dim", 1, &start));
  const ttd_kshape *xs = &in[0]->shape;
  int s = norm_axis(start, xs->ndim);
  if (s < 0 || s >= (xs->ndim ? xs->ndim : 1)) return bad(node, "start_dim %lld is out of range for %d dims", (long long)start, xs->ndim);
  a->start_dim = s;
  ttd_kshape o = {0};
  for (int i = 0; i < s; i++) o.d[o.ndim++] = xs->d[i];
  int64_t rest = 1;
  for (int i = s; i < xs->ndim; i++) rest *= xs->d[i];
  o.d[o.ndim++] = rest;
  set_float(out, &o);
  return TTD_OK;
}

static ttd_status_t infer_permute_common(const Ttd__V1__Node *node, const ttd_value_type *const *in, ttd_op_attrs *a,
                                         ttd_value_type *out) {
  const ttd_kshape *xs = &in[0]->shape;
  ttd_kshape o = {.ndim = xs->ndim};
  for (int i = 0; i < xs->ndim; i++) o.d[i] = xs->d[a->perm[i]];
  out->dtype = TTD_DTYPE_FLOAT32;
  out->shape = o;
  (void)node;
  return TTD_OK;
}

static ttd_status_t infer_transpose(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                    ttd_value_type *out) {
  TTD_RETURN_IF_ERROR(need_all_float(node, in, n));
  int64_t d0, d1;
  int nd = in[0]->shape.ndim;
  TTD_RETURN_IF_ERROR(attr_int(node, "dim0", -2, &d0));
  TTD_RETURN_IF_ERROR(attr_int(node, "dim1", -1, &d1));
  int x = norm_axis(d0, nd), y = norm_axis(d1, nd);
  if (x < 0 || x >= nd || y < 0 || y >= nd) return bad(node, "dims %lld and %lld must lie within %d dims", (long long)d0, (long long)d1, nd);
  for (int i = 0; i < nd; i++) a->perm[i] = i;
  a->perm[x] = y;
  a->perm[y] = x;
  return infer_permute_common(node, in, a, out);
}

static ttd_status_t infer_permute(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                  ttd_value_type *out) {
  TTD_RETURN_IF_ERROR(need_all_float(node, in, n));
  int64_t perm[TTD_MAX_DIMS];
  int count;
  int nd = in[0]->shape.ndim;
  TTD_RETURN_IF_ERROR(attr_ints(node, "perm", perm, TTD_MAX_DIMS, &count));
  if (count != nd) return bad(node, "attribute 'perm' must list all %d dims", nd);
  uint32_t seen = 0;
  for (int i = 0; i < nd; i++) {
    int p = norm_axis(perm[i], nd);
    if (p < 0 || p >= nd || (seen & (1u << p))) return bad(node, "'perm' is not a permutation of 0..%d", nd - 1);
    seen |= 1u << p;
    a->perm[i] = p;
  }
  return infer_permute_common(node, in, a, out);
}

static ttd_status_t infer_softmax(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                  ttd_value_type *out) {
  int64_t axis;
  TTD_RETURN_IF_ERROR(attr_int(node, "axis", -1, &axis));
  int nd = in[0]->shape.ndim;
  if (nd < 1 || norm_axis(axis, nd) != nd - 1) return bad(node, "only the last axis is supported (axis -1), got %lld", (long long)axis);
  return infer_same(node, in, n, a, out);
}

static const ttd_kshape scalar_shape = {0};

static ttd_status_t infer_cross_entropy(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                        ttd_value_type *out) {
  (void)n;
  (void)a;
  TTD_RETURN_IF_ERROR(need_float(node, in[0], 0));
  char b1[96], b2[96];
  if (in[1]->dtype != TTD_DTYPE_INT32) return bad(node, "labels must be int32, got %s", ttd_dtype_name(in[1]->dtype));
  if (in[0]->shape.ndim != 2 || in[1]->shape.ndim != 1 || in[1]->shape.d[0] != in[0]->shape.d[0]) {
    return bad(node, "logits must be [n, classes] and labels [n], got %s and %s", ttd_kshape_format(&in[0]->shape, b1, sizeof(b1)),
               ttd_kshape_format(&in[1]->shape, b2, sizeof(b2)));
  }
  set_float(out, &scalar_shape);
  return TTD_OK;
}

static ttd_status_t infer_pair_loss(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                    ttd_value_type *out) {
  (void)a;
  TTD_RETURN_IF_ERROR(need_all_float(node, in, n));
  char b1[96], b2[96];
  if (in[0]->shape.ndim != in[1]->shape.ndim ||
      memcmp(in[0]->shape.d, in[1]->shape.d, sizeof(int64_t) * (size_t)in[0]->shape.ndim) != 0) {
    return bad(node, "input and target shapes differ: %s vs %s", ttd_kshape_format(&in[0]->shape, b1, sizeof(b1)),
               ttd_kshape_format(&in[1]->shape, b2, sizeof(b2)));
  }
  set_float(out, &scalar_shape);
  return TTD_OK;
}

/* Reads a 2-value attribute (one value applies to both). */
static ttd_status_t attr_pair(const Ttd__V1__Node *node, const char *name, int64_t def, int64_t out[2], int required) {
  int64_t v[2];
  int count;
  TTD_RETURN_IF_ERROR(attr_ints(node, name, v, 2, &count));
  if (count < 0 && required) return bad(node, "attribute '%s' is required", name);
  if (count < 0) v[0] = v[1] = def;
  else if (count == 1) v[1] = v[0];
  else if (count != 2) return bad(node, "attribute '%s' needs 1 or 2 values", name);
  for (int i = 0; i < 2; i++) { /* kernels, strides and paddings of images: no sum of them may overflow */
    if (v[i] < 0 || v[i] > INT32_MAX) {
      return bad(node, "attribute '%s' is %lld; it must lie in [0, %d]", name, (long long)v[i], INT32_MAX);
    }
  }
  out[0] = v[0];
  out[1] = v[1];
  return TTD_OK;
}

static ttd_status_t infer_conv2d(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                 ttd_value_type *out) {
  TTD_RETURN_IF_ERROR(need_all_float(node, in, n));
  const ttd_kshape *xs = &in[0]->shape, *ws = &in[1]->shape;
  char b1[96], b2[96];
  if (xs->ndim != 4 || ws->ndim != 4 || xs->d[1] != ws->d[1]) {
    return bad(node, "x must be [n, c, h, w] and weight [out, c, kh, kw], got %s and %s", ttd_kshape_format(xs, b1, sizeof(b1)),
               ttd_kshape_format(ws, b2, sizeof(b2)));
  }
  if (n == 3 && (in[2]->shape.ndim != 1 || in[2]->shape.d[0] != ws->d[0])) {
    return bad(node, "bias must be [%lld]", (long long)ws->d[0]);
  }
  if (ws->d[0] < 1 || ws->d[1] < 1) {
    return bad(node, "weight %s has no channels: it needs at least 1 input and 1 output channel",
               ttd_kshape_format(ws, b2, sizeof(b2)));
  }
  TTD_RETURN_IF_ERROR(attr_pair(node, "stride", 1, a->stride, 0));
  TTD_RETURN_IF_ERROR(attr_pair(node, "padding", 0, a->padding, 0));
  ttd_conv2d_params p = {.n = xs->d[0], .c_in = xs->d[1], .h = xs->d[2], .w = xs->d[3], .c_out = ws->d[0],
                         .kh = ws->d[2], .kw = ws->d[3], .stride_h = a->stride[0], .stride_w = a->stride[1],
                         .pad_h = a->padding[0], .pad_w = a->padding[1]};
  if (ttd_conv2d_params_finish(&p) != 0) {
    return bad(node, "kernel %lldx%lld with stride %lld and padding %lld does not fit input %lldx%lld", (long long)p.kh,
               (long long)p.kw, (long long)p.stride_h, (long long)p.pad_h, (long long)p.h, (long long)p.w);
  }
  ttd_kshape o = {.ndim = 4, .d = {p.n, p.c_out, p.out_h, p.out_w}};
  set_float(out, &o);
  return TTD_OK;
}

static ttd_status_t infer_pool2d(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                 ttd_value_type *out) {
  TTD_RETURN_IF_ERROR(need_all_float(node, in, n));
  const ttd_kshape *xs = &in[0]->shape;
  char b1[96];
  if (xs->ndim != 4) return bad(node, "x must be [n, c, h, w], got %s", ttd_kshape_format(xs, b1, sizeof(b1)));
  TTD_RETURN_IF_ERROR(attr_pair(node, "kernel", 0, a->kernel, 1));
  TTD_RETURN_IF_ERROR(attr_pair(node, "stride", 0, a->stride, 0));
  if (!find_attr(node, "stride")) {
    a->stride[0] = a->kernel[0];
    a->stride[1] = a->kernel[1];
  }
  TTD_RETURN_IF_ERROR(attr_pair(node, "padding", 0, a->padding, 0));
  ttd_pool2d_params p = {.n = xs->d[0], .c = xs->d[1], .h = xs->d[2], .w = xs->d[3], .kh = a->kernel[0], .kw = a->kernel[1],
                         .stride_h = a->stride[0], .stride_w = a->stride[1], .pad_h = a->padding[0], .pad_w = a->padding[1]};
  if (p.kh < 1 || p.kw < 1 || p.pad_h * 2 > p.kh || p.pad_w * 2 > p.kw || ttd_pool2d_params_finish(&p) != 0) {
    return bad(node, "kernel %lldx%lld, stride %lld, padding %lld do not fit input %lldx%lld (padding may be at most half the kernel)",
               (long long)p.kh, (long long)p.kw, (long long)p.stride_h, (long long)p.pad_h, (long long)p.h, (long long)p.w);
  }
  ttd_kshape o = {.ndim = 4, .d = {p.n, p.c, p.out_h, p.out_w}};
  set_float(out, &o);
  return TTD_OK;
}

static ttd_status_t infer_layer_norm(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                     ttd_value_type *out) {
  TTD_RETURN_IF_ERROR(need_all_float(node, in, n));
  TTD_RETURN_IF_ERROR(attr_float(node, "eps", 1e-5f, &a->eps));
  const ttd_kshape *xs = &in[0]->shape;
  if (xs->ndim < 1) return bad(node, "x needs at least 1 dim");
  for (int i = 1; i < n; i++) {
    if (in[i]->shape.ndim != 1 || in[i]->shape.d[0] != xs->d[xs->ndim - 1]) {
      return bad(node, "weight and bias must be [%lld], the last dim of x", (long long)xs->d[xs->ndim - 1]);
    }
  }
  if (n == 2) return bad(node, "give both weight and bias, or neither");
  set_float(out, xs);
  return TTD_OK;
}

static ttd_status_t infer_embedding(const Ttd__V1__Node *node, const ttd_value_type *const *in, int n, ttd_op_attrs *a,
                                    ttd_value_type *out) {
  (void)n;
  (void)a;
  if (in[0]->dtype != TTD_DTYPE_INT32) return bad(node, "indices (input 0) must be int32, got %s", ttd_dtype_name(in[0]->dtype));
  TTD_RETURN_IF_ERROR(need_float(node, in[1], 1));
  if (in[1]->shape.ndim != 2) return bad(node, "the table (input 1) must be [vocab, dim]");
  if (in[0]->shape.ndim >= TTD_MAX_DIMS) return bad(node, "indices have too many dims");
  ttd_kshape o = in[0]->shape;
  o.d[o.ndim++] = in[1]->shape.d[1];
  set_float(out, &o);
  return TTD_OK;
}

static const op_def ops[TTD_OP_COUNT] = {
    [TTD_OP_MATMUL] = {"matmul", 2, 2, "transpose_a,transpose_b", infer_matmul},
    [TTD_OP_LINEAR] = {"linear", 2, 3, "", infer_linear},
    [TTD_OP_ADD] = {"add", 1, 2, "scalar,reverse", infer_binary},
    [TTD_OP_SUB] = {"sub", 1, 2, "scalar,reverse", infer_binary},
    [TTD_OP_MUL] = {"mul", 1, 2, "scalar,reverse", infer_binary},
    [TTD_OP_DIV] = {"div", 1, 2, "scalar,reverse", infer_binary},
    [TTD_OP_RELU] = {"relu", 1, 1, "", infer_same},
    [TTD_OP_GELU] = {"gelu", 1, 1, "", infer_same},
    [TTD_OP_SIGMOID] = {"sigmoid", 1, 1, "", infer_same},
    [TTD_OP_TANH] = {"tanh", 1, 1, "", infer_same},
    [TTD_OP_EXP] = {"exp", 1, 1, "", infer_same},
    [TTD_OP_LOG] = {"log", 1, 1, "", infer_same},
    [TTD_OP_SUM] = {"sum", 1, 1, "axes,keepdim", infer_reduce},
    [TTD_OP_MEAN] = {"mean", 1, 1, "axes,keepdim", infer_reduce},
    [TTD_OP_RESHAPE] = {"reshape", 1, 1, "shape", infer_reshape},
    [TTD_OP_TRANSPOSE] = {"transpose", 1, 1, "dim0,dim1", infer_transpose},
    [TTD_OP_PERMUTE] = {"permute", 1, 1, "perm", infer_permute},
    [TTD_OP_FLATTEN] = {"flatten", 1, 1, "start_dim", infer_flatten},
    [TTD_OP_SOFTMAX] = {"softmax", 1, 1, "axis", infer_softmax},
    [TTD_OP_LOG_SOFTMAX] = {"log_softmax", 1, 1, "axis", infer_softmax},
    [TTD_OP_CROSS_ENTROPY] = {"cross_entropy", 2, 2, "", infer_cross_entropy},
    [TTD_OP_MSE_LOSS] = {"mse_loss", 2, 2, "", infer_pair_loss},
    [TTD_OP_L1_LOSS] = {"l1_loss", 2, 2, "", infer_pair_loss},
    [TTD_OP_CONV2D] = {"conv2d", 2, 3, "stride,padding", infer_conv2d},
    [TTD_OP_MAX_POOL2D] = {"max_pool2d", 1, 1, "kernel,stride,padding", infer_pool2d},
    [TTD_OP_AVG_POOL2D] = {"avg_pool2d", 1, 1, "kernel,stride,padding", infer_pool2d},
    [TTD_OP_LAYER_NORM] = {"layer_norm", 1, 3, "eps", infer_layer_norm},
    [TTD_OP_EMBEDDING] = {"embedding", 2, 2, "", infer_embedding},
    [TTD_OP_DROPOUT] = {"dropout", 1, 1, "p,seed", infer_dropout},
};

int ttd_op_lookup(const char *name) {
  for (int i = 0; i < TTD_OP_COUNT; i++) {
    if (strcmp(ops[i].name, name) == 0) return i;
  }
  return -1;
}

const char *ttd_op_name(ttd_op op) { return (unsigned)op < TTD_OP_COUNT ? ops[op].name : "invalid"; }

static int attr_accepted(const char *list, const char *name) {
  size_t len = strlen(name);
  for (const char *p = list; *p;) {
    const char *comma = strchr(p, ',');
    size_t n = comma ? (size_t)(comma - p) : strlen(p);
    if (n == len && strncmp(p, name, n) == 0) return 1;
    p += n + (comma ? 1 : 0);
  }
  return 0;
}

ttd_status_t ttd_op_infer(ttd_op op, const Ttd__V1__Node *node, const ttd_value_type *const *inputs, int n_inputs,
                          ttd_op_attrs *out_attrs, ttd_value_type *out_type) {
  const op_def *def = &ops[op];
  memset(out_attrs, 0, sizeof(*out_attrs));
  if (n_inputs < def->min_inputs || n_inputs > def->max_inputs) {
    if (def->min_inputs == def->max_inputs) return bad(node, "takes %d inputs, got %d", def->min_inputs, n_inputs);
    return bad(node, "takes %d to %d inputs, got %d", def->min_inputs, def->max_inputs, n_inputs);
  }
  for (size_t i = 0; i < node->n_attrs; i++) {
    if (!attr_accepted(def->attrs, node->attrs[i]->name)) {
      return bad(node, "unknown attribute '%.64s'%s%s", node->attrs[i]->name, def->attrs[0] ? "; it accepts " : "; it takes none",
                 def->attrs);
    }
    for (size_t j = 0; j < i; j++) {
      if (strcmp(node->attrs[i]->name, node->attrs[j]->name) == 0) return bad(node, "attribute '%.64s' is given twice", node->attrs[i]->name);
    }
  }
  return def->infer(node, inputs, n_inputs, out_attrs, out_type);
}

static double numel_of(const ttd_value_type *t) {
  double n = 1;
  for (int d = 0; d < t->shape.ndim; d++) n *= (double)t->shape.d[d];
  return n;
}

double ttd_op_cost(ttd_op op, const ttd_op_attrs *a, const ttd_value_type *const *inputs, int n_inputs,
                   const ttd_value_type *out) {
  double elems = numel_of(out);
  for (int k = 0; k < n_inputs; k++) {
    double in = numel_of(inputs[k]);
    if (in > elems) elems = in;
  }
  double per = 1;
  const ttd_kshape *s0 = n_inputs > 0 ? &inputs[0]->shape : NULL;
  switch (op) {
    case TTD_OP_MATMUL:
      if (s0 && s0->ndim >= 2) per = 2.0 * (double)s0->d[a->transpose_a ? s0->ndim - 2 : s0->ndim - 1];
      break;
    case TTD_OP_LINEAR:
      if (s0 && s0->ndim >= 1) per = 2.0 * (double)s0->d[s0->ndim - 1];
      break;
    case TTD_OP_CONV2D:
      if (n_inputs > 1 && inputs[1]->shape.ndim == 4 && s0 && s0->ndim == 4) {
        const ttd_kshape *w = &inputs[1]->shape;
        per = 2.0 * (double)w->d[1] * (double)w->d[2] * (double)w->d[3];
        ttd_conv2d_params p = {.n = s0->d[0], .c_in = s0->d[1], .h = s0->d[2], .w = s0->d[3], .c_out = w->d[0],
                               .kh = w->d[2], .kw = w->d[3], .stride_h = a->stride[0], .stride_w = a->stride[1],
                               .pad_h = a->padding[0], .pad_w = a->padding[1]};
        if (ttd_conv2d_params_finish(&p) == 0 && ttd_conv2d_direct(&p)) per *= TTD_CONV2D_DIRECT_COST;
      }
      break;
    case TTD_OP_MAX_POOL2D: case TTD_OP_AVG_POOL2D:
      per = (double)a->kernel[0] * (double)a->kernel[1];
      break;
    default:
      break;
  }
  double work = numel_of(out) * per;
  return work > elems ? work : elems;
}
