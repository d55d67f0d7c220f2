/* The queued parameter work of modules on a card: tt_step and tt_zero_grad are queued on the
 * module and ride on its next Execute or Backward (ParameterWork before), and tt_backward may
 * leave its Backward waiting there for that Execute. One lock guards what is queued on every
 * module and the list of modules holding some, where a flush before a parameter or a .grad is
 * read finds them. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "module/module.h"

static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static tt_module *queue_list; /* of every client */

static void unlist_locked(tt_module *m) {
  if (!m->listed) return;
  for (tt_module **at = &queue_list; *at; at = &(*at)->next_listed) {
    if (*at == m) {
      *at = m->next_listed;
      break;
    }
  }
  m->listed = false;
  m->next_listed = NULL;
  atomic_fetch_sub(&m->client->deferred_modules, 1);
}

static void list_locked(tt_module *m) {
  if (m->listed) return;
  m->listed = true;
  m->next_listed = queue_list;
  queue_list = m;
  atomic_fetch_add(&m->client->deferred_modules, 1);
}

/* Lists m while it still has something queued: work, or a Backward waiting. Lock held. */
static void relist_locked(tt_module *m) {
  if (m->queued.step || m->queued.zero || m->waiting_backward) list_locked(m);
  else unlist_locked(m);
}

void tt_module_unlist(tt_module *m) {
  pthread_mutex_lock(&queue_lock);
  unlist_locked(m);
  pthread_mutex_unlock(&queue_lock);
}

tt_module *tt_module_find_queued(tt_client *c, uint64_t key) {
  tt_module *found = NULL;
  pthread_mutex_lock(&queue_lock);
  for (tt_module *m = queue_list; m && !found; m = m->next_listed) {
    int refs = atomic_load(&m->refs); /* one whose last reference is going is skipped */
    while (m->client == c && m->key == key && refs > 0 && !atomic_compare_exchange_weak(&m->refs, &refs, refs + 1)) {
    }
    if (m->client == c && m->key == key && refs > 0) found = m;
  }
  pthread_mutex_unlock(&queue_lock);
  return found;
}

int tt_module_list_queued(tt_client *c, tt_module **out_modules, int max) {
  int n = 0;
  pthread_mutex_lock(&queue_lock);
  for (tt_module *m = queue_list; m && n < max; m = m->next_listed) {
    /* A module whose last reference is going (refs 0, about to unlist itself) is skipped. */
    int refs = atomic_load(&m->refs);
    while (m->client == c && refs > 0 && !atomic_compare_exchange_weak(&m->refs, &refs, refs + 1)) {
    }
    if (m->client == c && refs > 0) out_modules[n++] = m;
  }
  pthread_mutex_unlock(&queue_lock);
  return n;
}

void tt_module_step_options(Ttd__V1__OptimizerStepRequest *req, tt_optim_kind optim, Ttd__V1__SgdOptions *sgd,
                            Ttd__V1__AdamOptions *adam) {
  if (optim == TT_OPTIM_ADAM) {
    req->optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_ADAM;
    req->adam = adam;
  } else {
    req->optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_SGD;
    req->sgd = sgd;
  }
}

void tt_param_work_clear(tt_param_work *w) {
  free(w->handles);
  memset(w, 0, sizeof(*w));
}

tt_status tt_param_work_build(tt_module *m, tt_queued_work d, tt_param_work *w, Ttd__V1__ParameterWork **out_work) {
  memset(w, 0, sizeof(*w));
  *out_work = NULL;
  if (!d.step && !d.zero) return TT_OK;
  w->handles = calloc((size_t)m->n_params + 1, sizeof(uint64_t));
  if (!w->handles) return tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; i < m->n_params; i++) w->handles[i] = m->params[i]->handle;
  ttd__v1__parameter_work__init(&w->work);
  if (d.step) {
    ttd__v1__optimizer_step_request__init(&w->step);
    w->step.parameters = w->handles;
    w->step.n_parameters = (size_t)m->n_params;
    w->adam = d.adam;
    w->sgd = d.sgd;
    tt_module_step_options(&w->step, d.optim, &w->sgd, &w->adam);
    w->work.step = &w->step;
  }
  if (d.zero) {
    ttd__v1__zero_grad_request__init(&w->zero);
    w->zero.parameters = w->handles;
    w->zero.n_parameters = (size_t)m->n_params;
    w->work.zero_grad = &w->zero;
  }
  *out_work = &w->work;
  return TT_OK;
}

tt_status tt_module_take_work(tt_module *m, tt_param_work *w, Ttd__V1__ParameterWork **out_work) {
  pthread_mutex_lock(&queue_lock);
  tt_queued_work d = m->queued;
  memset(&m->queued, 0, sizeof(m->queued));
  relist_locked(m);
  pthread_mutex_unlock(&queue_lock);
  return tt_param_work_build(m, d, w, out_work);
}

void tt_module_drop_work(tt_module *m) {
  pthread_mutex_lock(&queue_lock);
  memset(&m->queued, 0, sizeof(m->queued));
  relist_locked(m);
  pthread_mutex_unlock(&queue_lock);
}

bool tt_module_try_queue_work(tt_module *m, tt_param_op op, tt_optim_kind optim, const Ttd__V1__SgdOptions *sgd,
                              const Ttd__V1__AdamOptions *adam) {
  pthread_mutex_lock(&queue_lock);
  tt_queued_work *d = &m->queued;
  bool fits = op == TT_PARAM_ZERO_GRAD || (!d->step && !d->zero);
  if (fits) {
    if (op == TT_PARAM_STEP) {
      d->step = true;
      d->optim = optim;
      d->sgd = *sgd;
      d->adam = *adam;
    } else {
      d->zero = true;
    }
    list_locked(m);
  }
  pthread_mutex_unlock(&queue_lock);
  return fits;
}

bool tt_module_try_park_backward(tt_module *m, tt_run_ref *ref) {
  pthread_mutex_lock(&queue_lock);
  bool free_slot = !m->waiting_backward;
  if (free_slot) {
    m->waiting_backward = tt_run_ref_retain(ref);
    ref->backward_waiting = true;
    m->backward_before = m->queued; /* queued before the backward: runs before it */
    memset(&m->queued, 0, sizeof(m->queued));
    list_locked(m);
  }
  pthread_mutex_unlock(&queue_lock);
  return free_slot;
}

tt_run_ref *tt_module_take_waiting_backward(tt_module *m, tt_queued_work *before) {
  pthread_mutex_lock(&queue_lock);
  tt_run_ref *ref = m->waiting_backward;
  *before = m->backward_before;
  m->waiting_backward = NULL;
  memset(&m->backward_before, 0, sizeof(m->backward_before));
  relist_locked(m);
  pthread_mutex_unlock(&queue_lock);
  return ref;
}
