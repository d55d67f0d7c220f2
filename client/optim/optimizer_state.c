/* An optimizer's state in a checkpoint of its own: tt_optimizer_save and tt_optimizer_load,
 * torch's optimizer.state_dict() and load_state_dict(), as a safetensors file. The state is
 * where the updates run: in the optimizer on the host path, on the card beside each
 * parameter otherwise, read and written there with OptimizerState calls. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/ops.h"
#include "optim/optim.h"

#define FORMAT "ttd.optimizer" /* the "format" metadata of these files */

/* torch's names of the state buffers, per optimizer kind. */
static const char *const buffer_names[2][TT_OPTIM_BUFFERS] = {
    [TT_OPTIM_SGD] = {"momentum_buffer", NULL},
    [TT_OPTIM_ADAM] = {"exp_avg", "exp_avg_sq"},
};

/* The state of every parameter, on the host: what is saved, or what a file holds. */
typedef struct state_set {
  int n;
  int64_t *steps;
  tt_tensor **buffers; /* n * TT_OPTIM_BUFFERS, by parameter; NULL where there is none */
} state_set;

static tt_status state_set_init(tt_client *c, state_set *s, int n) {
  memset(s, 0, sizeof(*s));
  s->n = n;
  s->steps = calloc((size_t)n + 1, sizeof(*s->steps));
  s->buffers = calloc((size_t)n * TT_OPTIM_BUFFERS + 1, sizeof(*s->buffers));
  return s->steps && s->buffers ? TT_OK : tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "out of host memory");
}

static void state_set_clear(state_set *s) {
  for (int i = 0; s->buffers && i < s->n * TT_OPTIM_BUFFERS; i++) tt_tensor_free(s->buffers[i]);
  free(s->buffers);
  free(s->steps);
}

static tt_tensor **buffer_of(const state_set *s, int param, int k) { return &s->buffers[param * TT_OPTIM_BUFFERS + k]; }

/* The buffers a parameter that took step steps has. */
static int buffers_at(const tt_optimizer *o, int64_t step) { return step > 0 ? tt_optimizer_buffer_count(o) : 0; }

/* A float32 host tensor shaped like parameter i, from data (NULL: zeros). */
static tt_tensor *like_param(const tt_module *m, int i, const void *data) {
  return tt_tensor_from_host(m->client, data, TT_FLOAT32, m->params[i]->shape, m->params[i]->ndim);
}

/* ---- the state where it is, as a state_set, and back ---- */

static tt_status host_snapshot(const tt_optimizer *o, state_set *s) {
  const tt_module *m = o->module;
  for (int i = 0; i < m->n_params; i++) {
    s->steps[i] = o->steps[i];
    for (int k = 0; k < buffers_at(o, o->steps[i]); k++) {
      if (!(*buffer_of(s, i, k) = like_param(m, i, o->state[k][i]))) return tt_errcode(m->client);
    }
  }
  return TT_OK;
}

static tt_status host_restore(tt_optimizer *o, const state_set *s) {
  tt_module *m = o->module;
  float **fresh = calloc((size_t)m->n_params * TT_OPTIM_BUFFERS + 1, sizeof(*fresh));
  tt_status st = fresh ? TT_OK : tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; st == TT_OK && i < m->n_params * TT_OPTIM_BUFFERS; i++) {
    const tt_tensor *b = s->buffers[i];
    if (b && !(fresh[i] = malloc(b->nbytes ? b->nbytes : 1))) {
      st = tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
    } else if (b) {
      memcpy(fresh[i], b->data, b->nbytes);
    }
  }
  for (int i = 0; i < m->n_params; i++) { /* all memory taken: swapped in, or dropped */
    if (st == TT_OK) o->steps[i] = s->steps[i];
    for (int k = 0; k < TT_OPTIM_BUFFERS; k++) {
      float **slot = &fresh[i * TT_OPTIM_BUFFERS + k];
      if (st == TT_OK) {
        free(o->state[k][i]);
        o->state[k][i] = *slot;
      } else if (fresh) {
        free(*slot);
      }
    }
  }
  free(fresh);
  return st;
}

/* Frees the nonzero ones of handles[0..n) (moving them to the front) with one call. */
static void free_handles(tt_client *c, uint64_t *handles, size_t n) {
  size_t kept = 0;
  for (size_t i = 0; i < n; i++) {
    if (handles[i]) handles[kept++] = handles[i];
  }
  tt_rpc_free_quiet(c, handles, kept);
}

static tt_status card_snapshot(const tt_optimizer *o, state_set *s) {
  tt_module *m = o->module;
  TT_RETURN_IF_FAILED(tt_module_flush(m)); /* queued steps first */
  uint64_t *handles = calloc((size_t)m->n_params + 1, sizeof(uint64_t));
  if (!handles) return tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; i < m->n_params; i++) handles[i] = m->params[i]->handle;
  Ttd__V1__OptimizerStateRequest req = TTD__V1__OPTIMIZER_STATE_REQUEST__INIT;
  req.parameters = handles;
  req.n_parameters = (size_t)m->n_params;
  Ttd__V1__OptimizerStateResponse *resp = NULL;
  tt_status st = tt_rpc_unary(m->client, TT_RPC_OPTIMIZER_STATE, &req.base, &ttd__v1__optimizer_state_response__descriptor,
                              (ProtobufCMessage **)&resp);
  free(handles);
  if (st != TT_OK) return st;
  if (resp->n_states != (size_t)m->n_params) {
    st = tt_client_fail(m->client, TT_INTERNAL, "OptimizerState answered %zu states for %d parameters", resp->n_states,
                        m->n_params);
  }
  for (int i = 0; st == TT_OK && i < m->n_params; i++) {
    const Ttd__V1__ParameterState *ps = resp->states[i];
    s->steps[i] = ps->step;
    for (int k = 0; st == TT_OK && k < buffers_at(o, ps->step); k++) {
      uint64_t h = k < (int)ps->n_buffers ? ps->buffers[k] : 0;
      tt_tensor *host = h ? like_param(m, i, NULL) : NULL;
      if (!h) {
        st = tt_client_fail(m->client, TT_FAILED_PRECONDITION,
                            "parameter '%s' took %" PRId64 " steps but has no %s on %s: was it stepped by another "
                            "kind of optimizer?", tt_module_param_name(m, i), ps->step,
                            buffer_names[o->kind][k], m->device_name);
      } else if (!host) {
        st = tt_errcode(m->client);
      } else {
        *buffer_of(s, i, k) = host;
        st = tt_rpc_download(m->client, h, TT_FLOAT32, host->data, host->nbytes, 0);
      }
    }
  }
  uint64_t *copies = calloc(resp->n_states * TT_OPTIM_BUFFERS + 1, sizeof(uint64_t)); /* made for this read */
  size_t n_copies = 0;
  for (size_t i = 0; copies && i < resp->n_states; i++) {
    for (size_t k = 0; k < resp->states[i]->n_buffers && k < TT_OPTIM_BUFFERS; k++) copies[n_copies++] = resp->states[i]->buffers[k];
  }
  if (copies) free_handles(m->client, copies, n_copies); /* (out of memory: they go with the session) */
  free(copies);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return st;
}

/* Uploads t (float32) to the module's device; its handle in *out_handle. */
static tt_status upload(const tt_module *m, const tt_tensor *t, uint64_t *out_handle) {
  char device[24];
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  spec.dtype = TTD__V1__DTYPE__DTYPE_FLOAT32;
  spec.shape = (int64_t *)t->shape;
  spec.n_shape = (size_t)t->ndim;
  spec.location = tt_place_wire(&m->place, device, sizeof(device));
  spec.device = device;
  Ttd__V1__UploadHeader header = TTD__V1__UPLOAD_HEADER__INIT;
  header.target_case = TTD__V1__UPLOAD_HEADER__TARGET_SPEC;
  header.spec = &spec;
  Ttd__V1__UploadResponse *resp = NULL;
  tt_status st = tt_rpc_upload(m->client, &header, t->data, t->nbytes, &resp);
  if (st == TT_OK) *out_handle = resp->tensor->handle;
  if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
  return st;
}

static tt_status card_restore(const tt_optimizer *o, const state_set *s) {
  tt_module *m = o->module;
  TT_RETURN_IF_FAILED(tt_module_flush(m)); /* queued steps apply to the state they were queued on */
  int n = m->n_params;
  uint64_t *uploaded = calloc((size_t)n * TT_OPTIM_BUFFERS + 1, sizeof(uint64_t));
  Ttd__V1__ParameterState *states = calloc((size_t)n + 1, sizeof(*states));
  Ttd__V1__ParameterState **set = calloc((size_t)n + 1, sizeof(*set));
  tt_status st = uploaded && states && set ? TT_OK : tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; st == TT_OK && i < n; i++) {
    ttd__v1__parameter_state__init(&states[i]);
    states[i].parameter = m->params[i]->handle;
    states[i].step = s->steps[i];
    states[i].buffers = &uploaded[i * TT_OPTIM_BUFFERS];
    for (int k = 0; st == TT_OK && k < TT_OPTIM_BUFFERS; k++) {
      const tt_tensor *b = *buffer_of(s, i, k);
      if (b) st = upload(m, b, &uploaded[i * TT_OPTIM_BUFFERS + k]);
      if (b) states[i].n_buffers = (size_t)k + 1;
    }
    set[i] = &states[i];
  }
  if (st == TT_OK) {
    Ttd__V1__OptimizerStateRequest req = TTD__V1__OPTIMIZER_STATE_REQUEST__INIT;
    req.set = set;
    req.n_set = (size_t)n;
    ProtobufCMessage *resp = NULL;
    st = tt_rpc_unary(m->client, TT_RPC_OPTIMIZER_STATE, &req.base, &ttd__v1__optimizer_state_response__descriptor, &resp);
    if (st == TT_OK) protobuf_c_message_free_unpacked(resp, NULL);
  }
  if (uploaded) free_handles(m->client, uploaded, (size_t)n * TT_OPTIM_BUFFERS); /* copied into the state, or unused */
  free(set);
  free(states);
  free(uploaded);
  return st;
}

/* ---- the file ---- */

/* The arguments of o as metadata pairs into meta (at most 16 strings), values in text
 * (%.9g: a float32 reads back exactly); returns the pair count. */
static int args_to_metadata(const tt_optimizer *o, const char **meta, char text[][32]) {
  int n = 0;
#define PUT(key, fmt, value)                        \
  do {                                              \
    meta[2 * n] = key;                              \
    snprintf(text[n], sizeof(text[n]), fmt, value); \
    meta[2 * n + 1] = text[n];                      \
    n++;                                            \
  } while (0)
  PUT("format", "%s", FORMAT);
  PUT("optimizer", "%s", tt_optimizer_kind_name(o));
  if (o->kind == TT_OPTIM_ADAM) {
    const Ttd__V1__AdamOptions *a = &o->adam_options;
    PUT("lr", "%.9g", (double)a->lr);
    PUT("beta1", "%.9g", (double)a->beta1);
    PUT("beta2", "%.9g", (double)a->beta2);
    PUT("eps", "%.9g", (double)a->eps);
    PUT("weight_decay", "%.9g", (double)a->weight_decay);
  } else {
    const Ttd__V1__SgdOptions *a = &o->sgd;
    PUT("lr", "%.9g", (double)a->lr);
    PUT("momentum", "%.9g", (double)a->momentum);
    PUT("dampening", "%.9g", (double)a->dampening);
    PUT("weight_decay", "%.9g", (double)a->weight_decay);
    PUT("nesterov", "%d", a->nesterov ? 1 : 0);
  }
#undef PUT
  return n;
}

/* A float argument of the file's metadata into *out. */
static tt_status meta_float(tt_client *c, const tt_safetensors *f, const char *path, const char *key, float *out) {
  const char *text = tt_safetensors_metadata(f, key);
  char *end = NULL;
  errno = 0;
  float v = text ? strtof(text, &end) : 0.0f;
  if (!text || end == text || *end || errno == ERANGE) {
    return tt_client_fail(c, TT_INVALID_ARGUMENT, "optimizer state '%s' has no valid \"%s\" in its metadata (got %s%s%s)",
                          path, key, text ? "\"" : "", text ? text : "none", text ? "\"" : "");
  }
  *out = v;
  return TT_OK;
}

/* The file's arguments into args (a copy of o's), checked as a constructor checks them. */
static tt_status args_from_metadata(tt_optimizer *args, const tt_safetensors *f, const char *path) {
  tt_client *c = args->module->client;
  const char *format = tt_safetensors_metadata(f, "format"), *kind = tt_safetensors_metadata(f, "optimizer");
  if (!format || strcmp(format, FORMAT) != 0 || !kind) {
    return tt_client_fail(c, TT_INVALID_ARGUMENT,
                          "'%s' holds no optimizer state (its metadata lacks \"format\": \"" FORMAT "\" and "
                          "\"optimizer\"); tt_optimizer_save writes one, and tt_module_load reads a module's checkpoint",
                          path);
  }
  if (strcmp(kind, tt_optimizer_kind_name(args)) != 0) {
    return tt_client_fail(c, TT_INVALID_ARGUMENT,
                          "optimizer state '%s' was saved by %.32s; this optimizer is %s: load it into an optimizer of "
                          "the same kind", path, kind, tt_optimizer_kind_name(args));
  }
  if (args->kind == TT_OPTIM_ADAM) {
    Ttd__V1__AdamOptions *a = &args->adam_options;
    TT_RETURN_IF_FAILED(meta_float(c, f, path, "lr", &a->lr));
    TT_RETURN_IF_FAILED(meta_float(c, f, path, "beta1", &a->beta1));
    TT_RETURN_IF_FAILED(meta_float(c, f, path, "beta2", &a->beta2));
    TT_RETURN_IF_FAILED(meta_float(c, f, path, "eps", &a->eps));
    TT_RETURN_IF_FAILED(meta_float(c, f, path, "weight_decay", &a->weight_decay));
  } else {
    Ttd__V1__SgdOptions *a = &args->sgd;
    float nesterov = 0.0f;
    TT_RETURN_IF_FAILED(meta_float(c, f, path, "lr", &a->lr));
    TT_RETURN_IF_FAILED(meta_float(c, f, path, "momentum", &a->momentum));
    TT_RETURN_IF_FAILED(meta_float(c, f, path, "dampening", &a->dampening));
    TT_RETURN_IF_FAILED(meta_float(c, f, path, "weight_decay", &a->weight_decay));
    TT_RETURN_IF_FAILED(meta_float(c, f, path, "nesterov", &nesterov));
    a->nesterov = nesterov != 0.0f;
  }
  char who[300];
  snprintf(who, sizeof(who), "optimizer state '%s'", path);
  ttd_optimizer_call oc;
  return tt_optimizer_call(args, who, &oc);
}

/* "<parameter>.<what>", malloc'd; NULL (recorded) when out of memory. */
static char *entry_name(const tt_module *m, int i, const char *what) {
  const char *param = tt_module_param_name(m, i);
  size_t len = strlen(param) + 1 + strlen(what) + 1;
  char *name = malloc(len);
  if (name) snprintf(name, len, "%s.%s", param, what);
  else tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  return name;
}

/* The file's tensor "<parameter i>.<what>", checked against dtype and shape: a new host
 * tensor, or NULL with the error recorded. */
static tt_tensor *get_checked(tt_safetensors *f, const char *path, const tt_module *m, int i, const char *what,
                              tt_dtype dtype, const int64_t *shape, int ndim) {
  char *name = entry_name(m, i, what);
  tt_tensor *t = name ? tt_safetensors_get(f, name) : NULL;
  if (!t) {
    if (tt_errcode(m->client) == TT_NOT_FOUND) {
      tt_client_fail(m->client, TT_INVALID_ARGUMENT, "optimizer state '%s' has no '%s' for parameter '%s'", path, name,
                     tt_module_param_name(m, i));
    }
    free(name);
    return NULL;
  }
  if (t->dtype != dtype || t->ndim != ndim || memcmp(t->shape, shape, sizeof(int64_t) * (size_t)ndim) != 0) {
    ttd_kshape want = {.ndim = ndim}, got = {.ndim = t->ndim};
    memcpy(want.d, shape, sizeof(int64_t) * (size_t)ndim);
    memcpy(got.d, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    char b1[128], b2[128];
    tt_client_fail(m->client, TT_INVALID_ARGUMENT, "optimizer state '%s': '%s' must be %s %s for parameter '%s', got %s %s",
                   path, name, ttd_dtype_name((ttd_dtype)dtype), ttd_kshape_format(&want, b1, sizeof(b1)),
                   tt_module_param_name(m, i), ttd_dtype_name((ttd_dtype)t->dtype), ttd_kshape_format(&got, b2, sizeof(b2)));
    tt_tensor_free(t);
    t = NULL;
  }
  free(name);
  return t;
}

/* Every parameter's state from the file into s, checked; args says which buffers there are. */
static tt_status states_from_file(const tt_optimizer *args, tt_safetensors *f, const char *path, state_set *s) {
  const tt_module *m = args->module;
  for (int i = 0; i < m->n_params; i++) {
    static const int64_t scalar[1] = {0}; /* no dims */
    tt_tensor *step = get_checked(f, path, m, i, "step", TT_INT32, scalar, 0);
    if (!step) return tt_errcode(m->client);
    s->steps[i] = *(const int32_t *)step->data;
    tt_tensor_free(step);
    if (s->steps[i] < 0) {
      return tt_client_fail(m->client, TT_INVALID_ARGUMENT, "optimizer state '%s': '%s.step' is %" PRId64 "; it must be >= 0",
                            path, tt_module_param_name(m, i), s->steps[i]);
    }
    for (int k = 0; k < buffers_at(args, s->steps[i]); k++) {
      const tt_tensor *p = m->params[i];
      if (!(*buffer_of(s, i, k) = get_checked(f, path, m, i, buffer_names[args->kind][k], TT_FLOAT32, p->shape, p->ndim))) {
        return tt_errcode(m->client);
      }
    }
  }
  return TT_OK;
}

static tt_status write_file(const tt_optimizer *o, const char *path, const state_set *s) {
  const tt_module *m = o->module;
  int most = m->n_params * (1 + TT_OPTIM_BUFFERS);
  char **names = calloc((size_t)most + 1, sizeof(*names));
  tt_tensor **tensors = calloc((size_t)most + 1, sizeof(*tensors));
  tt_status st = names && tensors ? TT_OK : tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  int n = 0;
  for (int i = 0; st == TT_OK && i < m->n_params; i++) { /* the steps first: new tensors, freed below */
    if (s->steps[i] > INT32_MAX) {
      st = tt_client_fail(m->client, TT_OUT_OF_RANGE, "parameter '%s' took %" PRId64 " steps; a checkpoint holds at most %d",
                          tt_module_param_name(m, i), s->steps[i], INT32_MAX);
      break;
    }
    int32_t step = (int32_t)s->steps[i];
    names[n] = entry_name(m, i, "step");
    tensors[n] = names[n] ? tt_tensor_from_host(m->client, &step, TT_INT32, NULL, 0) : NULL;
    if (!tensors[n++]) st = tt_errcode(m->client);
  }
  int steps_to = n;
  for (int i = 0; st == TT_OK && i < m->n_params; i++) { /* then the buffers, lent by s */
    for (int k = 0; k < TT_OPTIM_BUFFERS; k++) {
      if (!*buffer_of(s, i, k)) continue;
      if (!(names[n] = entry_name(m, i, buffer_names[o->kind][k]))) st = tt_errcode(m->client);
      tensors[n++] = *buffer_of(s, i, k);
    }
  }
  if (st == TT_OK) {
    const char *meta[32];
    char values[16][32];
    int n_meta = args_to_metadata(o, meta, values);
    st = tt_safetensors_save_metadata(m->client, path, (const char *const *)names, tensors, n, meta, n_meta);
  }
  for (int i = 0; tensors && i < steps_to; i++) tt_tensor_free(tensors[i]);
  for (int i = 0; names && i < n; i++) free(names[i]);
  free(tensors);
  free(names);
  return st;
}

tt_status tt_optimizer_save(tt_optimizer *o, const char *path) {
  if (!o) return TT_INVALID_ARGUMENT;
  tt_module *m = o->module;
  state_set s;
  tt_status st = state_set_init(m->client, &s, m->n_params);
  if (st == TT_OK) st = tt_optimizer_on_host(o) ? host_snapshot(o, &s) : card_snapshot(o, &s);
  if (st == TT_OK) st = write_file(o, path, &s);
  state_set_clear(&s);
  return st;
}

tt_status tt_optimizer_load(tt_optimizer *o, const char *path) {
  if (!o) return TT_INVALID_ARGUMENT;
  tt_module *m = o->module;
  tt_safetensors *f = NULL;
  TT_RETURN_IF_FAILED(tt_safetensors_open(m->client, path, &f));
  tt_optimizer args = *o; /* the file's arguments, applied once everything is read */
  state_set s;
  tt_status st = state_set_init(m->client, &s, m->n_params);
  if (st == TT_OK) st = args_from_metadata(&args, f, path);
  if (st == TT_OK) st = states_from_file(&args, f, path, &s);
  tt_safetensors_close(f);
  if (st == TT_OK) st = tt_optimizer_on_host(o) ? host_restore(o, &s) : card_restore(&args, &s);
  state_set_clear(&s);
  if (st == TT_OK) {
    o->sgd = args.sgd;
    o->adam_options = args.adam_options;
    tt_optimizer_note_state(o); /* the state is where the module is now */
  }
  return st;
}
