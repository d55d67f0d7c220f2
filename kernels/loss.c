/* Losses with mean reduction: cross entropy (through a numerically stable log-softmax),
 * mean squared error and mean absolute error, forward and backward. The forward sums go
 * through ttd_ksum_blocks, so the loss is the same for any thread count. */
#include <math.h>
#include <stdatomic.h>

#include "kernel_internal.h"
#include "kernels.h"

/* ---- cross entropy ---- */

typedef struct ce_job {
  const float *logits;
  const int32_t *labels; /* client data: each read once into a local and checked there */
  int64_t c;
  float scale; /* backward: dloss / n */
  float *dlogits;
  atomic_llong bad; /* forward: the first row whose label is out of range, or -1 */
} ce_job;

/* logsumexp(x[0, c)) - x[label], in double. */
TTD_KHOT static double ce_row(const float *restrict x, int64_t c, int32_t label) {
  float m = ttd_kmax_f32(x, c);
  return ((double)m + log(ttd_kexp_sum(x, m, NULL, c))) - (double)x[label];
}

/* Sum of the row losses over rows [begin, end). */
static double ce_rows(void *ctx, int64_t begin, int64_t end) {
  ce_job *job = ctx;
  double total = 0.0;
  for (int64_t r = begin; r < end; r++) {
    int32_t label = job->labels[r];
    if (label < 0 || (int64_t)label >= job->c) { /* changed since the check: refused */
      long long none = -1;
      atomic_compare_exchange_strong(&job->bad, &none, (long long)r);
      continue;
    }
    total += ce_row(job->logits + r * job->c, job->c, label);
  }
  return total;
}

static size_t rows_per_chunk(int64_t c) { return c >= TTD_KGRAIN ? 1 : (size_t)(TTD_KGRAIN / c); }

/* On a bad label *loss is left as it was. */
int ttd_k_cross_entropy(ttd_pool *pool, const float *logits, const int32_t *labels, int64_t n, int64_t c, float *loss,
                        int64_t *out_bad_index) {
  if (out_bad_index) *out_bad_index = -1;
  for (int64_t i = 0; i < n; i++) {
    if (labels[i] < 0 || (int64_t)labels[i] >= c) {
      if (out_bad_index) *out_bad_index = i;
      return -1;
    }
  }
  if (n <= 0) { /* the mean of nothing, as torch */
    *loss = NAN;
    return 0;
  }
  ce_job job = {.logits = logits, .labels = labels, .c = c};
  atomic_init(&job.bad, -1);
  double total = ttd_ksum_blocks(pool, n, (int64_t)rows_per_chunk(c), ce_rows, &job);
  long long bad = atomic_load(&job.bad);
  if (bad >= 0) {
    if (out_bad_index) *out_bad_index = bad;
    return -1;
  }
  *loss = (float)(total / (double)n);
  return 0;
}

/* dx = scale * softmax(x) - scale * onehot(label). */
TTD_KHOT static void ce_backward_row(const float *restrict x, int64_t c, int32_t label, float scale,
                                     float *restrict dx) {
  float m = ttd_kmax_f32(x, c);
  float k = (float)((double)scale / ttd_kexp_sum(x, m, dx, c));
  for (int64_t j = 0; j < c; j++) dx[j] *= k;
  if (label >= 0 && label < c) dx[label] -= scale; /* labels were checked by the forward */
}

static void ce_backward_run(void *ctx, size_t begin, size_t end) {
  ce_job *job = ctx;
  for (size_t r = begin; r < end; r++) {
    int64_t o = (int64_t)r * job->c;
    ce_backward_row(job->logits + o, job->c, job->labels[r], job->scale, job->dlogits + o);
  }
}

void ttd_k_cross_entropy_backward(ttd_pool *pool, const float *logits, const int32_t *labels, int64_t n, int64_t c,
                                  float dloss, float *dlogits) {
  if (n <= 0 || c <= 0) return;
  ce_job job = {
      .logits = logits, .labels = labels, .c = c, .scale = (float)((double)dloss / (double)n), .dlogits = dlogits};
  ttd_pool_parallel_for(pool, (size_t)n, rows_per_chunk(c), ce_backward_run, &job);
}

/* ---- mse and l1 ---- */

/* The loss of a pair of tensors: the mean of (a - b)^2 or of |a - b|. */
typedef enum pair_kind { PAIR_MSE, PAIR_L1 } pair_kind;

typedef struct pair_job {
  const float *a, *b;
  float *da, *db;
  float k;
  pair_kind kind;
} pair_job;

/* Sum of (a - b)^2 or |a - b| over n elements: 16 float lanes per 1024-element block, blocks
 * added in double. */
TTD_KHOT static double diff_sum(const float *restrict a, const float *restrict b, int64_t n, pair_kind kind) {
  double total = 0.0;
  for (int64_t s = 0; s < n; s += 1024) {
    int64_t len = n - s < 1024 ? n - s : 1024;
    const float *pa = a + s, *pb = b + s;
    float lane[16] = {0};
    int64_t i = 0;
    if (kind == PAIR_L1) {
      for (; i + 16 <= len; i += 16)
        for (int j = 0; j < 16; j++) lane[j] += fabsf(pa[i + j] - pb[i + j]);
      for (; i < len; i++) lane[i & 15] += fabsf(pa[i] - pb[i]);
    } else {
      for (; i + 16 <= len; i += 16)
        for (int j = 0; j < 16; j++) {
          float d = pa[i + j] - pb[i + j];
          lane[j] += d * d;
        }
      for (; i < len; i++) {
        float d = pa[i] - pb[i];
        lane[i & 15] += d * d;
      }
    }
    double t = 0.0;
    for (int j = 0; j < 16; j++) t += (double)lane[j];
    total += t;
  }
  return total;
}

static double pair_block(void *ctx, int64_t begin, int64_t end) {
  pair_job *job = ctx;
  return diff_sum(job->a + begin, job->b + begin, end - begin, job->kind);
}

static void pair_loss(ttd_pool *pool, const float *a, const float *b, int64_t n, float *loss, pair_kind kind) {
  if (n <= 0) {
    *loss = NAN;
    return;
  }
  pair_job job = {.a = a, .b = b, .kind = kind};
  *loss = (float)(ttd_ksum_blocks(pool, n, TTD_KGRAIN, pair_block, &job) / (double)n);
}

void ttd_k_mse_loss(ttd_pool *pool, const float *a, const float *b, int64_t n, float *loss) {
  pair_loss(pool, a, b, n, loss, PAIR_MSE);
}

void ttd_k_l1_loss(ttd_pool *pool, const float *a, const float *b, int64_t n, float *loss) {
  pair_loss(pool, a, b, n, loss, PAIR_L1);
}

/* da = k * f(a - b), db = -da, with f the identity (mse, k = 2 dloss / n) or sign (l1,
 * k = dloss / n; sign(0) = 0). Either output may be NULL. */
TTD_KHOT static void pair_grad(const float *restrict a, const float *restrict b, float k, pair_kind kind,
                               float *restrict da, float *restrict db, int64_t n) {
  if (kind == PAIR_L1) {
    for (int64_t i = 0; i < n; i++) {
      float d = a[i] - b[i];
      float g = d > 0.0f ? k : (d < 0.0f ? -k : 0.0f);
      if (da) da[i] = g;
      if (db) db[i] = -g;
    }
  } else if (da && db) {
    for (int64_t i = 0; i < n; i++) {
      float g = k * (a[i] - b[i]);
      da[i] = g;
      db[i] = -g;
    }
  } else if (da) {
    for (int64_t i = 0; i < n; i++) da[i] = k * (a[i] - b[i]);
  } else {
    for (int64_t i = 0; i < n; i++) db[i] = -(k * (a[i] - b[i]));
  }
}

static void pair_grad_run(void *ctx, size_t begin, size_t end) {
  pair_job *job = ctx;
  pair_grad(job->a + begin, job->b + begin, job->k, job->kind, job->da ? job->da + begin : NULL,
            job->db ? job->db + begin : NULL, (int64_t)(end - begin));
}

static void pair_backward(ttd_pool *pool, const float *a, const float *b, int64_t n, float k, float *da, float *db,
                          pair_kind kind) {
  if (n <= 0 || (!da && !db)) return;
  pair_job job = {.a = a, .b = b, .da = da, .db = db, .k = k, .kind = kind};
  ttd_pool_parallel_for(pool, (size_t)n, TTD_KGRAIN, pair_grad_run, &job);
}

void ttd_k_mse_loss_backward(ttd_pool *pool, const float *a, const float *b, int64_t n, float dloss, float *da,
                             float *db) {
  if (n > 0) pair_backward(pool, a, b, n, (float)(2.0 * (double)dloss / (double)n), da, db, PAIR_MSE);
}

void ttd_k_l1_loss_backward(ttd_pool *pool, const float *a, const float *b, int64_t n, float dloss, float *da,
                            float *db) {
  if (n > 0) pair_backward(pool, a, b, n, (float)((double)dloss / (double)n), da, db, PAIR_L1);
}
