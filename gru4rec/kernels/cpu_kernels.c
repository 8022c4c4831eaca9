/* Fused CPU kernels of the training step (build.py beside it compiles this file, cpu.py loads it).
 *
 * Eager PyTorch runs the optimiser's rules as a chain of whole-tensor operations: at the rows of
 * an item table that is a gather of each state table, five or six passes over the gathered rows
 * and a scatter back of each — about a dozen passes over memory and as many operator calls per
 * table and step. Here each row is read and written once. The arithmetic is the same as
 * gru4rec/training/optim.py (the PyTorch path, which the tests hold these kernels to); only rounding may
 * differ (the compiler may fuse a multiply and an add).
 *
 * float32 tables, int64 indices, C-contiguous buffers: the Python wrappers check all of this.
 * Sums over a row are vectorised (`omp simd reduction`), so they add in a different order from
 * PyTorch's: results agree to float32 round-off, not bit for bit.
 * OpenMP threads come from the runtime PyTorch already loaded (same libgomp), so
 * torch.set_num_threads governs them too.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { SGD = 0, ADAGRAD = 1, RMSPROP = 2, ADADELTA = 3, ADAM = 4 };

/* One table's update: the rule's constants and the table's buffers (NULL where the method keeps
 * no such state). Filled once per table by the Python side; bias1/bias2 change every step. */
typedef struct {
    float *p, *acc, *dacc, *m, *vel;
    int64_t width;    /* elements per row */
    int64_t method;
    float lr, momentum, lmbd;
    float decay;      /* rmsprop/adadelta: rho; adam: beta2 */
    float gain;       /* 1 - decay, rounded from double as PyTorch rounds it */
    float beta1_gain; /* adam: 1 - beta1, likewise */
    float bias1;      /* adam: 1 - beta1^t */
    float bias2;      /* adam: 1 - beta2^t */
    float eps;
} rule_t;

/* One span of `len` elements: gradient g (overwritten), parameter p and the state that exists
 * for the method (NULL otherwise). Mirrors Optimizer._direction and Optimizer._delta. Always
 * inlined with a constant `method`, so that each method gets its own vectorised loop. */
static inline __attribute__((always_inline)) void
update_span(const int method, const rule_t *r, int64_t len, float *restrict g, float *restrict p,
            float *restrict acc, float *restrict dacc, float *restrict m, float *restrict vel)
{
    const float decay = r->decay, one_minus_decay = r->gain;
    const float one_minus_beta1 = r->beta1_gain, eps = r->eps;
    const float lr = r->lr, momentum = r->momentum, lmbd = r->lmbd;
    const float bias1 = r->bias1, bias2 = r->bias2;
    for (int64_t j = 0; j < len; ++j) {
        float gj = g[j], step;  /* step = the direction ĝ */
        if (method == ADAGRAD) {
            float a = acc[j] + gj * gj;
            acc[j] = a;
            step = gj * (1.0f / sqrtf(a + eps));
        } else if (method == RMSPROP) {
            float a = acc[j] * decay + one_minus_decay * gj * gj;
            acc[j] = a;
            step = gj * (1.0f / sqrtf(a + eps));
        } else if (method == ADADELTA) {
            float a = acc[j] * decay + one_minus_decay * gj * gj;
            acc[j] = a;
            step = gj * sqrtf(dacc[j] + eps) * (1.0f / sqrtf(a + eps));
            dacc[j] = dacc[j] * decay + one_minus_decay * step * step;
        } else if (method == ADAM) {
            float a = acc[j] * decay + one_minus_decay * gj * gj;
            acc[j] = a;
            float mj = m[j] + one_minus_beta1 * (gj - m[j]);
            m[j] = mj;
            step = (mj / bias1) / (sqrtf(a / bias2) + eps);
        } else {
            step = gj;
        }
        step += lmbd * p[j];  /* lmbd = 0: adds 0 */
        if (momentum > 0.0f) {
            float v = vel[j] * momentum - lr * step;
            vel[j] = v;
            p[j] += v;
        } else {
            p[j] += -lr * step;
        }
    }
}

static inline float *at(float *base, int64_t offset) { return base ? base + offset : NULL; }

/* Rows [k0, k1) of the update (rows NULL: spans [k0, k1) of `chunk` elements of the whole
 * table), with a constant method: inlined once per method, each its own vectorised loop. */
static inline __attribute__((always_inline)) void
update_range(const int method, const rule_t *r, int64_t k0, int64_t k1, int64_t n_rows,
             const int64_t *rows, float *g, int64_t chunk)
{
    const int64_t width = r->width;
    for (int64_t k = k0; k < k1; ++k) {
        int64_t o, len, go;
        if (rows == NULL) {
            o = go = k * chunk;
            len = (n_rows * width - o < chunk) ? n_rows * width - o : chunk;
        } else {
            o = rows[k] * width, go = k * width, len = width;
        }
        update_span(method, r, len, g + go, r->p + o, at(r->acc, o), at(r->dacc, o), at(r->m, o), at(r->vel, o));
    }
}

static void update_part(const rule_t *r, int64_t k0, int64_t k1, int64_t n_rows, const int64_t *rows,
                        float *g, int64_t chunk)
{
    switch (r->method) {
    case ADAGRAD: update_range(ADAGRAD, r, k0, k1, n_rows, rows, g, chunk); break;
    case RMSPROP: update_range(RMSPROP, r, k0, k1, n_rows, rows, g, chunk); break;
    case ADADELTA: update_range(ADADELTA, r, k0, k1, n_rows, rows, g, chunk); break;
    case ADAM: update_range(ADAM, r, k0, k1, n_rows, rows, g, chunk); break;
    default: update_range(SGD, r, k0, k1, n_rows, rows, g, chunk);
    }
}

/* The updates of several tables in one parallel region (a step's dense buffer and its item
 * tables' rows): table t's row rows[t][k] from gradient row k of g[t] (k < n_rows[t]; rows unique),
 * or — rows[t] NULL — the whole table (n_rows[t] × width elements, contiguous). Each table is split
 * evenly between the threads, which go on to their share of the next table without waiting (the
 * tables are distinct memory): one fork and join per step instead of one per table. */
void g4r_update_tables(int64_t n_tables, const rule_t *const *rules, const int64_t *n_rows, const int64_t *const *rows,
                       float *const *g)
{
    const int64_t chunk = 4096;
    int64_t total = 0;
    for (int64_t t = 0; t < n_tables; ++t)
        total += n_rows[t] * rules[t]->width;
#pragma omp parallel if (total > 16384)
    {
        int64_t n_threads = 1, thread = 0;
#ifdef _OPENMP
        n_threads = omp_get_num_threads(), thread = omp_get_thread_num();
#endif
        for (int64_t t = 0; t < n_tables; ++t) {
            const int64_t n = n_rows[t] * rules[t]->width;
            const int64_t n_parts = rows[t] == NULL ? (n + chunk - 1) / chunk : n_rows[t];
            update_part(rules[t], n_parts * thread / n_threads, n_parts * (thread + 1) / n_threads, n_rows[t], rows[t], g[t], chunk);
        }
    }
}

/* Update rows[k] of one table from gradient row k (k < n_rows; rows unique), or — with rows
 * NULL — the whole table (n_rows × width elements, contiguous): g4r_update_tables of one table. */
void g4r_update(const rule_t *r, int64_t n_rows, const int64_t *rows, float *g)
{
    g4r_update_tables(1, &r, &n_rows, &rows, &g);
}

/* The distinct values of rows[0..n) (written to uniq; their number is returned) and, for each
 * position, the index of its value among them (inverse). Those of the first n_first positions
 * come first, in ascending order (their number goes to n_uniq_first); the values found only in
 * the remaining positions follow in order of first appearance. mark (uint8) and slot (int64)
 * are tables over the n_items ids; mark must be all zero and is left so. */
int64_t g4r_unique(int64_t n, const int64_t *rows, int64_t n_first, int64_t n_items, uint8_t *mark,
                   int64_t *slot, int64_t *uniq, int64_t *inverse, int64_t *n_uniq_first)
{
    for (int64_t i = 0; i < n_first; ++i)
        mark[rows[i]] = 1;
    int64_t k = 0;
    for (int64_t v = 0; v < n_items; ++v) {
        if (mark[v]) {
            mark[v] = 0;
            slot[v] = k;
            uniq[k++] = v;
        }
    }
    *n_uniq_first = k;
    /* the rest: a value is new if its slot does not point back to it from the first group */
    for (int64_t i = n_first; i < n; ++i) {
        const int64_t v = rows[i];
        const int64_t s = slot[v];
        if (!(s >= 0 && s < k && uniq[s] == v)) {
            slot[v] = k;
            uniq[k++] = v;
        }
    }
    for (int64_t i = 0; i < n; ++i)
        inverse[i] = slot[rows[i]];
    return k;
}

/* Inverse-CDF draws: out[i] = the first j with cdf[j] > u[i] (n_items ids; cdf non-decreasing),
 * exactly torch.searchsorted(cdf, u, right=True) — n_items where no entry exceeds u. A binary
 * search takes log2(n_items) dependent, mispredicted steps per draw (10M draws: 230-460 ms);
 * a guide table (Chen & Asau) starts each search near its answer: guide[k] (n_guide entries) is
 * the answer for k / n_guide, and a draw starts at guide[floor(u * n_guide)] and walks — most
 * draws take no step at all where n_guide is several times the number of items. The walk goes both ways, so a rounding of
 * u * n_guide or of k / n_guide can only cost a step, never change the answer. */
void g4r_inverse_cdf(int64_t n, const double *u, int64_t n_items, const double *cdf, int64_t n_guide,
                     const int64_t *guide, int64_t *out)
{
#pragma omp parallel for schedule(static) if (n >= 16384)
    for (int64_t i = 0; i < n; ++i) {
        const double x = u[i];
        const double kx = x * (double)n_guide;
        const int64_t k = kx >= 0.0 ? (kx < (double)(n_guide - 1) ? (int64_t)kx : n_guide - 1) : 0;  /* NaN: 0 */
        int64_t j = guide[k];
        while (j > 0 && cdf[j - 1] > x)
            --j;
        while (j < n_items && cdf[j] <= x)
            ++j;
        out[i] = j;
    }
}

/* Rows added into a table: table[rows[i]] += src[i] (n × width; repeated rows add up, in order). */
void g4r_add_rows(int64_t n, const int64_t *rows, int64_t width, const float *src, float *table)
{
    for (int64_t i = 0; i < n; ++i) {
        float *t = table + rows[i] * width;
        const float *s = src + i * width;
#pragma omp simd
        for (int64_t j = 0; j < width; ++j)
            t[j] += s[j];
    }
}

/* out (n_rows × n_out) = the columns of g (n_rows × n_cols) summed by group:
 * out[b, group[j]] = sum over j of g[b, j]. */
void g4r_sum_columns(int64_t n_rows, int64_t n_cols, int64_t n_out, const float *g,
                     const int64_t *group, float *out)
{
#pragma omp parallel for schedule(static) if (n_rows * n_cols > 32768)
    for (int64_t b = 0; b < n_rows; ++b) {
        float *o = out + b * n_out;
        const float *gb = g + b * n_cols;
        memset(o, 0, (size_t)n_out * sizeof(float));
        for (int64_t j = 0; j < n_cols; ++j)
            o[group[j]] += gb[j];
    }
}

/* The bias of the C score columns (cols = [B targets, S samples]):
 * out[c] = by[cols[c]] - logq[cols[c]] + (1 - valid[c])·MASK, where logq is logq_in for the
 * first n_in columns and logq_sample for the others (both NULL: no logQ correction) and the
 * MASK term applies only where valid is not NULL (the cross-entropy losses mask columns there). */
#define MASK (-1e30f)
void g4r_column_bias(int64_t C, int64_t n_in, const int64_t *cols, const float *by, const float *logq_in,
                     const float *logq_sample, const float *valid, float *out)
{
    for (int64_t c = 0; c < C; ++c) {
        const int64_t v = cols[c];
        float b = by[v];
        if (logq_in)
            b = b - (c < n_in ? logq_in[v] : logq_sample[v]);
        if (valid)
            b = b + (1.0f - valid[c]) * MASK;
        out[c] = b;
    }
}

/* out (n_rows × n_cols) = the columns of s (n_rows × n_src) picked by group, plus bias:
 * out[b, j] = s[b, group[j]] + bias[j] (the scores of the C columns from those of their distinct
 * items: the reverse of g4r_sum_columns). */
void g4r_gather_columns(int64_t n_rows, int64_t n_src, int64_t n_cols, const float *s,
                        const int64_t *group, const float *bias, float *out)
{
#pragma omp parallel for schedule(static) if (n_rows * n_cols > 32768)
    for (int64_t b = 0; b < n_rows; ++b) {
        float *o = out + b * n_cols;
        const float *sb = s + b * n_src;
        for (int64_t j = 0; j < n_cols; ++j)
            o[j] = sb[group[j]] + bias[j];
    }
}

/* The step's dropout masks from its uniform draws u (n, in place): keep_first (= 1/(1 - p), as
 * float32) where u >= p_first, else 0, before position split; with p_rest and keep_rest from
 * there on. One pass where PyTorch takes a comparison and a product per part. */
void g4r_dropout_masks(int64_t n, int64_t split, float *u, float p_first, float keep_first, float p_rest, float keep_rest)
{
#pragma omp simd
    for (int64_t i = 0; i < split; ++i)
        u[i] = u[i] >= p_first ? keep_first : 0.0f;
#pragma omp simd
    for (int64_t i = split; i < n; ++i)
        u[i] = u[i] >= p_rest ? keep_rest : 0.0f;
}

/* ------------------------------------------------------------------------------------------
 * Losses: the value and dL/dscores in two or three passes over each row of the score matrix
 * (PyTorch's loss code makes one pass per operation, ~10-30 of them). Rows are independent and
 * split between the threads; each row's positive is its own column (column i of row i).
 */

/* exp(x) for float32, vectorisable (no library call): Cody-Waite range reduction and the
 * Cephes minimax polynomial, within 2 ulp of expf; 0 below -87.3 (where expf underflows). */
static inline float exp_f32(float x)
{
    const float lo = -87.33654f, hi = 88.37626f;
    float c = x < lo ? lo : (x > hi ? hi : x);
    float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest (1.5·2^23) */
    float r = c - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < lo ? 0.0f : p * scale;
}

/* Cross-entropy over the C columns of each of the B rows of x (scores with the bias, masked
 * columns already at MASK), written over x as dL/dx: with p = softmax(x_i·), the row's loss is
 * -log(p_ii + 1e-24) (logit_form: -log p_ii) and dL/dx_ik = w_i·a_i·(p_ik - [k = i]),
 * a_i = p_ii / (p_ii + 1e-24) (logit_form: 1). w_i weighs row i (active / batch size).
 * The weighted sum of the row losses goes to loss[0]. */
void g4r_cross_entropy(int64_t B, int64_t C, float *x, const float *w, int64_t logit_form, float *loss)
{
    double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (B * C > 32768)
    for (int64_t i = 0; i < B; ++i) {
        float *xi = x + i * C;
        float m = xi[0];
#pragma omp simd reduction(max : m)
        for (int64_t j = 1; j < C; ++j)
            m = xi[j] > m ? xi[j] : m;
        const float x_pos = xi[i];
        float z = 0.0f;
#pragma omp simd reduction(+ : z)
        for (int64_t j = 0; j < C; ++j) {
            float e = exp_f32(xi[j] - m);
            xi[j] = e;
            z += e;
        }
        const float p_pos = xi[i] / z;
        float nll, a;
        if (logit_form) {
            nll = -(x_pos - m - logf(z));
            a = 1.0f;
        } else {
            nll = -logf(p_pos + 1e-24f);
            a = p_pos / (p_pos + 1e-24f);
        }
        const float coef = a * w[i], scale = coef / z;
        for (int64_t j = 0; j < C; ++j)
            xi[j] *= scale;
        xi[i] -= coef;
        total += (double)nll * w[i];
    }
    loss[0] = (float)total;
}

/* BPR-max (with its score regularisation bpreg) of the activated scores r (B × C), dL/dr·w_i
 * written to grad. Row i: softmax s over its negatives (columns j != i with valid_j = 1),
 * σ_j = σ(r_ii - r_ij), S = Σ s_j·σ_j, R = Σ s_j·r_ij²;
 * loss_i = -log(S + 1e-24) + bpreg·R;
 * dL/dr_ik = s_k·(S - σ_k²)/(S + 1e-24) + bpreg·s_k·(r_ik·(r_ik + 2) - R)   (k != i),
 * dL/dr_ii = (Σ s_j·σ_j² - S)/(S + 1e-24).
 * With has_elu, r = elu-A(x) (A = elu_alpha) and grad is dL/dx: dL/dr times (r > 0 ? 1 : r + A).
 * The weighted sum of the row losses goes to loss[0]. */
void g4r_bpr_max(int64_t B, int64_t C, const float *r, const float *valid, const float *w,
                 float bpreg, int64_t has_elu, float elu_alpha, float *grad, float *loss)
{
    double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (B * C > 32768)
    for (int64_t i = 0; i < B; ++i) {
        const float *ri = r + i * C;
        float *gi = grad + i * C;
        const float pos = ri[i];
        float m = MASK;
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < C; ++j) {
            float l = ri[j] + (1.0f - valid[j]) * MASK;
            m = (j != i && l > m) ? l : m;
        }
        /* e_j = exp(logit_j - m) (0 at the positive); σ_j is recomputed in the last pass */
        float z = 0.0f, s_sig = 0.0f, s_sig2 = 0.0f, s_r2 = 0.0f;
#pragma omp simd reduction(+ : z, s_sig, s_sig2, s_r2)
        for (int64_t j = 0; j < C; ++j) {
            float l = ri[j] + (1.0f - valid[j]) * MASK;
            float e = j == i ? 0.0f : exp_f32(l - m);
            float sig = 1.0f / (1.0f + exp_f32(ri[j] - pos));
            gi[j] = e;
            z += e;
            s_sig += e * sig;
            s_sig2 += e * sig * sig;
            s_r2 += e * ri[j] * ri[j];
        }
        const float inv_z = 1.0f / z;
        const float S = s_sig * inv_z, R = s_r2 * inv_z, inv = 1.0f / (S + 1e-24f), wi = w[i];
        for (int64_t j = 0; j < C; ++j) {
            float sig = 1.0f / (1.0f + exp_f32(ri[j] - pos));
            float s = gi[j] * inv_z;
            float d = s * (S - sig * sig) * inv;
            if (bpreg > 0.0f)
                d += bpreg * s * (ri[j] * (ri[j] + 2.0f) - R);
            gi[j] = d * wi;
        }
        gi[i] = (s_sig2 * inv_z - S) * inv * wi;
        if (has_elu) {
#pragma omp simd
            for (int64_t j = 0; j < C; ++j)
                gi[j] *= ri[j] > 0.0f ? 1.0f : ri[j] + elu_alpha;
        }
        float loss = -logf(S + 1e-24f) + (bpreg > 0.0f ? bpreg * R : 0.0f);
        total += (double)loss * wi;
    }
    loss[0] = (float)total;
}

/* ------------------------------------------------------------------------------------------
 * The GRU cell's elementwise work (tanh candidate activation), between its matrix products:
 * PyTorch spends an operator call and a pass over memory on each of the ~20 operations of a
 * layer's forward and backward pass; here they are four passes. Layouts as in gru4rec/training/cell.py: the
 * layer's pre-activations v = [candidate | reset | update] (B × 3n), rz = [r | z] (B × 2n).
 */

/* sigmoid and tanh for float32, vectorisable. tanh: Cephes' odd polynomial below 0.625 (where
 * 1 - 2/(e^2x + 1) would lose relative accuracy), that form above. */
static inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

static inline float tanh_f32(float x)
{
    const float a = fabsf(x), s = x * x;
    float small = ((((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s
                    + 1.33314422036e-1f) * s - 3.33332819422e-1f) * s * x + x;
    float large = 1.0f - 2.0f / (exp_f32(2.0f * a) + 1.0f);
    large = x < 0.0f ? -large : large;
    return a < 0.625f ? small : large;
}

/* torch.lerp(a, b, w): a + w(b - a) for |w| < 0.5, b - (b - a)(1 - w) otherwise */
static inline float lerp_f32(float a, float b, float w)
{
    const float diff = b - a;
    return fabsf(w) < 0.5f ? a + w * diff : b - diff * (1.0f - w);
}

/* Gates: a (B × 2n, the reset and update pre-activations) becomes rz = sigmoid(a) in place;
 * hr = h·r (B × n). */
void g4r_gru_gates(int64_t B, int64_t n, float *a, const float *h, float *hr)
{
#pragma omp parallel for schedule(static) if (B * n > 32768)
    for (int64_t b = 0; b < B; ++b) {
        float *ab = a + b * 2 * n;
        const float *hb = h + b * n;
        float *hrb = hr + b * n;
#pragma omp simd
        for (int64_t j = 0; j < 2 * n; ++j)
            ab[j] = sigmoid_f32(ab[j]);
#pragma omp simd
        for (int64_t j = 0; j < n; ++j)
            hrb[j] = hb[j] * ab[j];
    }
}

/* Output: u (B × n, the candidate pre-activation) becomes c = tanh(u) in place; the layer's
 * output out = lerp(h, c, z), times the dropout mask where mask is not NULL. */
void g4r_gru_output(int64_t B, int64_t n, float *u, const float *h, const float *rz,
                    const float *mask, float *out)
{
#pragma omp parallel for schedule(static) if (B * n > 32768)
    for (int64_t b = 0; b < B; ++b) {
        float *ub = u + b * n, *ob = out + b * n;
        const float *hb = h + b * n, *zb = rz + b * 2 * n + n;
        const float *mb = mask ? mask + b * n : NULL;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
            float c = tanh_f32(ub[j]);
            ub[j] = c;
            ob[j] = lerp_f32(hb[j], c, zb[j]);
        }
        if (mb) {
#pragma omp simd
            for (int64_t j = 0; j < n; ++j)
                ob[j] *= mb[j];
        }
    }
}

/* Backward from d = dL/d(output) (B × n; times the dropout mask where mask is not NULL): the
 * candidate and update parts of dv = dL/dv (B × 3n):
 * dv[:, :n] = d·z·(1 - c²), dv[:, 2n:] = d·(c - h)·z(1 - z). dv[:, n:2n] is left to
 * g4r_gru_backward_reset, which needs the product of the first part with Wh. */
void g4r_gru_backward_out(int64_t B, int64_t n, const float *d, const float *mask, const float *rz,
                          const float *c, const float *h, float *dv)
{
#pragma omp parallel for schedule(static) if (B * n > 32768)
    for (int64_t b = 0; b < B; ++b) {
        const float *db = d + b * n, *zb = rz + b * 2 * n + n, *cb = c + b * n, *hb = h + b * n;
        const float *mb = mask ? mask + b * n : NULL;
        float *vb = dv + b * 3 * n;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
            float dj = mb ? db[j] * mb[j] : db[j];
            float z = zb[j], cj = cb[j];
            vb[j] = dj * z * (1.0f - cj * cj);
            vb[2 * n + j] = dj * (cj - hb[j]) * (z * (1.0f - z));
        }
    }
}

/* The reset part of dv from t = dv[:, :n]·Whᵀ (B × n): dv[:, n:2n] = t·h·r(1 - r); then the
 * bias gradient g_bias = the column sums of dv (3n). */
void g4r_gru_backward_reset(int64_t B, int64_t n, const float *t, const float *h, const float *rz,
                            float *dv, float *g_bias)
{
#pragma omp parallel for schedule(static) if (B * n > 32768)
    for (int64_t b = 0; b < B; ++b) {
        const float *tb = t + b * n, *hb = h + b * n, *rb = rz + b * 2 * n;
        float *vb = dv + b * 3 * n + n;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j)
            vb[j] = tb[j] * hb[j] * (rb[j] * (1.0f - rb[j]));
    }
    const int64_t width = 3 * n;
#pragma omp parallel for schedule(static) if (B * n > 32768)
    for (int64_t j0 = 0; j0 < width; j0 += 64) {
        const int64_t j1 = j0 + 64 < width ? j0 + 64 : width;
        float acc[64] = {0};
        for (int64_t b = 0; b < B; ++b) {
            const float *vb = dv + b * width;
#pragma omp simd
            for (int64_t j = j0; j < j1; ++j)
                acc[j - j0] += vb[j];
        }
        memcpy(g_bias + j0, acc, (size_t)(j1 - j0) * sizeof(float));
    }
}

/* ------------------------------------------------------------------------------------------
 * The whole training step of gru4rec/training/step.py (FastStep) in one call, for the
 * configurations it covers (gru4rec/training/cpu_step.py says which): shared embedding (the input
 * rows are Wy's), the tanh GRU cell, the cross-entropy loss (its masked columns through the bias),
 * distinct score rows. The matrix products are MKL's sgemm_ (the one torch links, handed over as a
 * pointer); everything between them is the kernels above, in FastStep's order. On rsc15's shapes
 * the Python between ~40 operators was a quarter of the step. The optimiser's update stays with
 * the optimiser: this call leaves the dense gradients in their buffers and the item tables'
 * distinct rows and gradient rows in uniq/g_wy, and dL/d(scores of the distinct rows) in g_rows.
 */
typedef void (*sgemm_fn)(const char *, const char *, const int *, const int *, const int *, const float *,
                         const float *, const int *, const float *, const int *, const float *, float *, const int *);

enum { MAX_LAYERS = 8 };

typedef struct {
    sgemm_fn sgemm;
    int64_t B, S, N, d, n_layers, logit_form, mask_in_bias;
    int64_t n[MAX_LAYERS];
    float *Wx[MAX_LAYERS], *Wrz[MAX_LAYERS], *Wh[MAX_LAYERS], *Bh[MAX_LAYERS];
    float *gWx[MAX_LAYERS], *gWrz[MAX_LAYERS], *gWh[MAX_LAYERS], *gBh[MAX_LAYERS];
    float *hidden[MAX_LAYERS], *mask[MAX_LAYERS];  /* mask: NULL without hidden dropout */
    float *v[MAX_LAYERS], *rz[MAX_LAYERS], *hr[MAX_LAYERS], *c[MAX_LAYERS], *out[MAX_LAYERS];
    float *Wy, *By, *logq_in, *logq_sample, *embed_mask;
    /* scratch: C = B + S columns, U = C + B positions */
    int64_t *cols, *rows_all, *uniq, *inverse, *slot;
    uint8_t *mark;
    float *col_valid, *wy, *bias, *x0, *s, *scores, *g_rows, *g_out, *dv, *t, *w, *g_wy, *grad;
} step_t;

/* Row-major C (M×N, ldc) = op(A)·op(B) + beta·C with op(A) M×K (A stored K×M when ta) and
 * op(B) K×N (B stored N×K when tb): column-major Cᵀ = op(B)ᵀ·op(A)ᵀ. */
static void gemm(const step_t *st, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                 const float *Bm, int64_t ldb, float beta, float *C, int64_t ldc)
{
    const char ca = ta ? 'T' : 'N', cb = tb ? 'T' : 'N';
    /* The sizes are 64-bit and their addresses passed as int *: a 32-bit-int BLAS (LP64, MKL's
     * sgemm_) reads their low halves and a 64-bit one (ILP64) all of them, the same numbers on a
     * little-endian machine (cpu_step.py uses this call only there). */
    const int64_t m = N, n = M, k = K, la = lda, lb = ldb, lc = ldc;
    const float one = 1.0f;
    st->sgemm(&cb, &ca, (const int *)&m, (const int *)&n, (const int *)&k, &one, Bm, (const int *)&lb, A,
              (const int *)&la, &beta, C, (const int *)&lc);
}

/* dst (rows × width) = the first `width` columns from `col` of src (rows × src_width). */
static void copy_cols(int64_t rows, int64_t width, const float *src, int64_t src_width, int64_t col, float *dst)
{
    for (int64_t b = 0; b < rows; ++b)
        memcpy(dst + b * width, src + b * src_width + col, (size_t)width * sizeof(float));
}

static void gather(int64_t n, const int64_t *rows, int64_t width, const float *table, float *dst)
{
    for (int64_t i = 0; i < n; ++i)
        memcpy(dst + i * width, table + rows[i] * width, (size_t)width * sizeof(float));
}

/* The step up to the scores: st->scores (B × C) = the columns' raw scores (distinct rows' products
 * spread to the columns, plus the bias: MASK on invalid columns where mask_in_bias); counts =
 * the numbers of distinct items, scored (k) and in all (scored, then input-only). */
void g4r_step_forward(const step_t *st, const int64_t *inputs, const int64_t *targets, const int64_t *samples,
                      const float *active, const float *keep, int64_t *counts)
{
    const int64_t B = st->B, S = st->S, C = B + S, d = st->d, L = st->n_layers;
    /* the slots that start a new session forget their state */
    for (int64_t i = 0; i < L; ++i)
        for (int64_t b = 0; b < B; ++b) {
            float *h = st->hidden[i] + b * st->n[i];
            const float k = keep[b];
            for (int64_t j = 0; j < st->n[i]; ++j)
                h[j] *= k;
        }
    /* columns [targets | samples], their validity, and the distinct items of the columns and inputs */
    memcpy(st->cols, targets, (size_t)B * sizeof(int64_t));
    memcpy(st->cols + B, samples, (size_t)S * sizeof(int64_t));
    memcpy(st->rows_all, st->cols, (size_t)C * sizeof(int64_t));
    memcpy(st->rows_all + C, inputs, (size_t)B * sizeof(int64_t));
    for (int64_t b = 0; b < B; ++b)
        st->col_valid[b] = active[b];
    for (int64_t j = B; j < C; ++j)
        st->col_valid[j] = 1.0f;
    int64_t k = 0;
    const int64_t n_uniq = g4r_unique(C + B, st->rows_all, C, st->N, st->mark, st->slot, st->uniq, st->inverse, &k);
    gather(k, st->uniq, d, st->Wy, st->wy);
    g4r_column_bias(C, B, st->cols, st->By, st->logq_in, st->logq_sample, st->mask_in_bias ? st->col_valid : NULL, st->bias);
    /* the layers */
    gather(B, inputs, d, st->Wy, st->x0);
    if (st->embed_mask)
        for (int64_t i = 0; i < B * d; ++i)
            st->x0[i] *= st->embed_mask[i];
    const float *x = st->x0;
    int64_t width = d;
    for (int64_t i = 0; i < L; ++i) {
        const int64_t n = st->n[i];
        for (int64_t b = 0; b < B; ++b)
            memcpy(st->v[i] + b * 3 * n, st->Bh[i], (size_t)(3 * n) * sizeof(float));
        gemm(st, 0, 0, B, 3 * n, width, x, width, st->Wx[i], 3 * n, 1.0f, st->v[i], 3 * n);
        copy_cols(B, 2 * n, st->v[i], 3 * n, n, st->rz[i]);
        gemm(st, 0, 0, B, 2 * n, n, st->hidden[i], n, st->Wrz[i], 2 * n, 1.0f, st->rz[i], 2 * n);
        g4r_gru_gates(B, n, st->rz[i], st->hidden[i], st->hr[i]);
        copy_cols(B, n, st->v[i], 3 * n, 0, st->c[i]);
        gemm(st, 0, 0, B, n, n, st->hr[i], n, st->Wh[i], n, 1.0f, st->c[i], n);
        g4r_gru_output(B, n, st->c[i], st->hidden[i], st->rz[i], st->mask[i], st->out[i]);
        x = st->out[i];
        width = n;
    }
    /* scores of the distinct rows, spread to the columns */
    gemm(st, 0, 1, B, k, d, x, d, st->wy, d, 0.0f, st->s, k);
    g4r_gather_columns(B, k, C, st->s, st->inverse, st->bias, st->scores);
    counts[0] = k;
    counts[1] = n_uniq;
}

/* The step from g = dL/d(scores) (B × C) on: the backward pass one step deep (the states before
 * the step are still in hidden), the new states, and the item tables' gradient rows — Wy's scored
 * rows, then its input-only rows (zero), plus the input rows' gradient; By's (the column sums of
 * g_rows) are torch's sum, the caller's. */
static void step_backward(const step_t *st, const float *g, int64_t k, int64_t n_uniq)
{
    const int64_t B = st->B, S = st->S, C = B + S, d = st->d, L = st->n_layers;
    const float *x = st->out[L - 1];
    g4r_sum_columns(B, C, k, g, st->inverse, st->g_rows);
    gemm(st, 0, 0, B, d, k, st->g_rows, k, st->wy, d, 0.0f, st->g_out, d);
    for (int64_t i = L - 1; i >= 0; --i) {
        const int64_t n = st->n[i], in = i ? st->n[i - 1] : d;
        const float *xin = i ? st->out[i - 1] : st->x0;
        g4r_gru_backward_out(B, n, st->g_out, st->mask[i], st->rz[i], st->c[i], st->hidden[i], st->dv);
        gemm(st, 1, 0, n, n, B, st->hr[i], n, st->dv, 3 * n, 0.0f, st->gWh[i], n);
        gemm(st, 0, 1, B, n, n, st->dv, 3 * n, st->Wh[i], n, 0.0f, st->t, n);
        g4r_gru_backward_reset(B, n, st->t, st->hidden[i], st->rz[i], st->dv, st->gBh[i]);
        gemm(st, 1, 0, n, 2 * n, B, st->hidden[i], n, st->dv + n, 3 * n, 0.0f, st->gWrz[i], 2 * n);
        gemm(st, 1, 0, in, 3 * n, B, xin, in, st->dv, 3 * n, 0.0f, st->gWx[i], 3 * n);
        gemm(st, 0, 1, B, in, 3 * n, st->dv, 3 * n, st->Wx[i], 3 * n, 0.0f, st->g_out, in);
    }
    for (int64_t i = 0; i < L; ++i)
        memcpy(st->hidden[i], st->out[i], (size_t)(B * st->n[i]) * sizeof(float));
    if (st->embed_mask)
        for (int64_t i = 0; i < B * d; ++i)
            st->g_out[i] *= st->embed_mask[i];
    gemm(st, 1, 0, k, d, B, st->g_rows, k, x, d, 0.0f, st->g_wy, d);
    memset(st->g_wy + k * d, 0, (size_t)((n_uniq - k) * d) * sizeof(float));
    g4r_add_rows(B, st->inverse + C, d, st->g_out, st->g_wy);
}

/* The whole step with the cross-entropy loss (its masked columns through the bias): the loss —
 * the weighted sum of the rows' cross-entropies, weights active/B — to loss[0]; counts as
 * g4r_step_forward's. */
void g4r_train_step(const step_t *st, const int64_t *inputs, const int64_t *targets, const int64_t *samples,
                    const float *active, const float *keep, float inv_b, float *loss, int64_t *counts)
{
    g4r_step_forward(st, inputs, targets, samples, active, keep, counts);
    for (int64_t b = 0; b < st->B; ++b)
        st->w[b] = active[b] * inv_b;
    g4r_cross_entropy(st->B, st->B + st->S, st->scores, st->w, st->logit_form, loss);  /* scores := dL/dscores */
    step_backward(st, st->scores, counts[0], counts[1]);
}

/* The rest of a BPR-max step after g4r_step_forward, once the caller has applied the final
 * activation to st->scores in place (torch's, for FastStep's bits): the loss to loss[0] and its
 * gradient (through elu-A where has_elu) into st->grad, then the backward pass. */
void g4r_step_bpr_max(const step_t *st, const float *active, float inv_b, float bpreg, int64_t has_elu, float elu_alpha,
                      const int64_t *counts, float *loss)
{
    for (int64_t b = 0; b < st->B; ++b)
        st->w[b] = active[b] * inv_b;
    g4r_bpr_max(st->B, st->B + st->S, st->scores, st->col_valid, st->w, bpreg, has_elu, elu_alpha, st->grad, loss);
    step_backward(st, st->grad, counts[0], counts[1]);
}
