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

#include "cpu_kernels.h"  /* the prototypes cpu_step.c calls, checked against the definitions here */

enum { SGD = 0, ADAGRAD = 1, RMSPROP = 2, ADADELTA = 3, ADAM = 4 };

/* One table's update (rule_t, cpu_kernels.h): the rule's constants and the table's buffers (NULL
 * where the method keeps no such state). Filled once per table by the Python side; bias1/bias2
 * change every step. */
struct rule {
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
};

/* rule_t's layout for the loader's check against its ctypes mirror (_Rule, gru4rec/kernels/cpu.py):
 * the number of fields; *fields = the table, *size = sizeof(rule_t). */
static const g4r_field_t rule_fields[] = {
    G4R_FIELD(rule_t, p), G4R_FIELD(rule_t, acc), G4R_FIELD(rule_t, dacc), G4R_FIELD(rule_t, m),
    G4R_FIELD(rule_t, vel), G4R_FIELD(rule_t, width), G4R_FIELD(rule_t, method), G4R_FIELD(rule_t, lr),
    G4R_FIELD(rule_t, momentum), G4R_FIELD(rule_t, lmbd), G4R_FIELD(rule_t, decay), G4R_FIELD(rule_t, gain),
    G4R_FIELD(rule_t, beta1_gain), G4R_FIELD(rule_t, bias1), G4R_FIELD(rule_t, bias2), G4R_FIELD(rule_t, eps),
};

int64_t g4r_layout_rule(const g4r_field_t **fields, int64_t *size)
{
    *fields = rule_fields;
    *size = (int64_t)sizeof(rule_t);
    return G4R_N_FIELDS(rule_fields);
}

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

/* The marked values among 0..n_values (mark[v] != 0), in ascending order, written to uniq; each
 * one's position there to slot[v]; mark cleared. Returns their number: the sort-free pass that
 * makes rows unique (g4r_unique, g4r_code_grads). */
static int64_t sweep_marks(int64_t n_values, uint8_t *mark, int64_t *slot, int64_t *uniq)
{
    int64_t k = 0;
    for (int64_t v = 0; v < n_values; ++v) {
        if (mark[v]) {
            mark[v] = 0;
            slot[v] = k;
            uniq[k++] = v;
        }
    }
    return k;
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
    int64_t k = sweep_marks(n_items, mark, slot, uniq);
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

/* The composed rows of a training step's items (gru4rec/items/rows.py, ComposedRows.compose_warm):
 * out[k] = id_table[items[k]] (zeros where keep[k] == 0) + Σ_c tables[c][codes[c][items[k]]][0, width)
 * and, where out_bias is not NULL, out_bias[k] = id_bias[items[k]] (unknown_bias where dropped) +
 * Σ_c tables[c][...][width] (columns > width: the tables carry a bias column). Every column c has
 * one code per item (codes[c]: n_items entries; a multi column is the caller's). One pass over
 * the output instead of a gather and a strided add per part; the parts add in the column order,
 * as the PyTorch path adds them, so the two agree bit for bit. keep NULL: every item keeps its id. */
void g4r_compose_rows(int64_t n, const int64_t *items, int64_t width, const float *id_table, const float *id_bias,
                      const uint8_t *keep, float unknown_bias, int64_t n_tables, const float *const *tables,
                      const int64_t *const *codes, int64_t columns, float *out, float *out_bias)
{
#pragma omp parallel for schedule(static) if (n * width > 32768)
    for (int64_t k = 0; k < n; ++k) {
        const int64_t item = items[k];
        const int kept = keep == NULL || keep[k];
        float *o = out + k * width;
        if (kept)
            memcpy(o, id_table + item * width, (size_t)width * sizeof(float));
        else
            memset(o, 0, (size_t)width * sizeof(float));
        float b = 0.0f;
        if (out_bias != NULL)
            b = kept ? id_bias[item] : unknown_bias;
        for (int64_t c = 0; c < n_tables; ++c) {
            const float *t = tables[c] + codes[c][item] * columns;
#pragma omp simd
            for (int64_t j = 0; j < width; ++j)
                o[j] += t[j];
            if (out_bias != NULL && columns > width)
                b += t[width];
        }
        if (out_bias != NULL)
            out_bias[k] = b;
    }
}

/* The gradients of n_tables attribute tables (table c: n_codes[c] rows of `columns` floats) from
 * the composed rows' of a step: item k reads code codes[c][items[k]] of table c, with gradient
 * g_rows[k] (width floats) and, in the bias column (columns > width), g_bias[k] for k < n_bias
 * (0 after: unscored rows). Per table, the distinct codes go to uniq[c] in ascending order (their
 * number to n_uniq[c]) and out[c][i] (columns floats) is the sum of the gradients of the items
 * that read uniq[c][i], added in item order — what g4r_unique and g4r_add_rows give from the
 * [rows | bias] gradient, without building it, and one pass over g_rows for all tables. mark[c]
 * (all zero, left so) and slot[c] are scratch over table c's codes; uniq[c] and out[c] hold
 * min(n, n_codes[c]) rows. */
void g4r_code_grads(int64_t n, const int64_t *items, int64_t n_tables, const int64_t *const *codes, const int64_t *n_codes,
                    uint8_t *const *mark, int64_t *const *slot, int64_t width, const float *g_rows, int64_t n_bias,
                    const float *g_bias, int64_t columns, int64_t *const *uniq, float *const *out, int64_t *n_uniq)
{
    for (int64_t c = 0; c < n_tables; ++c) {
        const int64_t *code = codes[c];
        for (int64_t k = 0; k < n; ++k)
            mark[c][code[items[k]]] = 1;
        const int64_t m = sweep_marks(n_codes[c], mark[c], slot[c], uniq[c]);
        n_uniq[c] = m;
        memset(out[c], 0, (size_t)(m * columns) * sizeof(float));
    }
    for (int64_t k = 0; k < n; ++k) {
        const int64_t item = items[k];
        const float *g = g_rows + k * width;
        const float gb = k < n_bias ? g_bias[k] : 0.0f;
        for (int64_t c = 0; c < n_tables; ++c) {
            float *o = out[c] + slot[c][codes[c][item]] * columns;
#pragma omp simd
            for (int64_t j = 0; j < width; ++j)
                o[j] += g[j];
            if (columns > width)
                o[width] += gb;
        }
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

/* out (n_cols) = the rows of g (n_rows × n_cols) summed: out[j] = sum over b of g[b, j], added
 * in row order (from row 0; columns split between the threads). */
void g4r_sum_rows(int64_t n_rows, int64_t n_cols, const float *g, float *out)
{
    const int64_t block = 1024;
    if (n_rows == 0) {
        memset(out, 0, (size_t)n_cols * sizeof(float));
        return;
    }
#pragma omp parallel for schedule(static) if (n_rows * n_cols > 65536)
    for (int64_t j0 = 0; j0 < n_cols; j0 += block) {
        const int64_t j1 = j0 + block < n_cols ? j0 + block : n_cols;
        memcpy(out + j0, g + j0, (size_t)(j1 - j0) * sizeof(float));
        for (int64_t b = 1; b < n_rows; ++b) {
            const float *gb = g + b * n_cols;
#pragma omp simd
            for (int64_t j = j0; j < j1; ++j)
                out[j] += gb[j];
        }
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

/* ------------------------------------------------------------------------------------------
 * The dropout masks' uniform draws: torch.rand's values and generator stream, faster.
 *
 * torch's CPU generator is MT19937 (Matsumoto & Nishimura, 1998), and torch.rand gives float32
 * (y & 0xFFFFFF)·2⁻²⁴ of its successive 32-bit outputs y, one scalar output at a time (~3 ns
 * each: a DIGINETICA step's 131,072 draws took 0.37 ms). Here the state's twist and the outputs'
 * tempering are vector loops. The state is torch's own, in the layout of Generator.get_state()
 * (its "legacy" record, which set_state() reads back):
 *   int64 initial seed | int32 left | int32 seeded | uint64 next | uint64 state[624] | ...
 * where an output first decrements left, twists the state when left reaches 0 (then left = 624,
 * next = 0), and tempers state[next++]. cpu.py checks these draws and the state they leave
 * against torch.rand once per process before it uses them.
 */
enum { MT_N = 624, MT_M = 397 };

static inline uint32_t mt_mix(uint32_t a, uint32_t b, uint32_t far)
{
    const uint32_t y = (a & 0x80000000u) | (b & 0x7fffffffu);
    return far ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
}

static void mt_twist(uint32_t *mt)
{
    /* mt[i] reads mt[i + 1] before it is rewritten and mt[i ± 227] long after (or before):
     * blocks of 16 see the values a scalar loop sees */
#pragma omp simd safelen(16)
    for (int i = 0; i < MT_N - MT_M; ++i)
        mt[i] = mt_mix(mt[i], mt[i + 1], mt[i + MT_M]);
#pragma omp simd safelen(16)
    for (int i = MT_N - MT_M; i < MT_N - 1; ++i)
        mt[i] = mt_mix(mt[i], mt[i + 1], mt[i + MT_M - MT_N]);
    mt[MT_N - 1] = mt_mix(mt[MT_N - 1], mt[0], mt[MT_M - 1]);
}

/* out[0..n) = the next n draws of torch.rand (float32) from the generator state `legacy`
 * (get_state()'s bytes, advanced in place). */
void g4r_mt19937_uniform(uint8_t *legacy, int64_t n, float *out)
{
    int32_t left;
    uint64_t next, wide[MT_N];
    uint32_t mt[MT_N];
    memcpy(&left, legacy + 8, sizeof left);
    memcpy(&next, legacy + 16, sizeof next);
    memcpy(wide, legacy + 24, sizeof wide);
    for (int i = 0; i < MT_N; ++i)
        mt[i] = (uint32_t)wide[i];
    int64_t i = 0;
    while (i < n) {
        if (left == 1) {  /* the next output's decrement reaches 0: twist first */
            mt_twist(mt);
            left = MT_N + 1;
            next = 0;
        }
        const int64_t m = (n - i < left - 1) ? n - i : left - 1;
        const uint32_t *src = mt + next;
        float *dst = out + i;
#pragma omp simd
        for (int64_t j = 0; j < m; ++j) {
            uint32_t y = src[j];
            y ^= y >> 11;
            y ^= (y << 7) & 0x9d2c5680u;
            y ^= (y << 15) & 0xefc60000u;
            y ^= y >> 18;
            dst[j] = (float)(y & 0xFFFFFFu) * (1.0f / 16777216.0f);
        }
        left -= (int32_t)m;
        next += (uint64_t)m;
        i += m;
    }
    for (int k = 0; k < MT_N; ++k)
        wide[k] = mt[k];
    memcpy(legacy + 8, &left, sizeof left);
    memcpy(legacy + 16, &next, sizeof next);
    memcpy(legacy + 24, wide, sizeof wide);
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

/* exp(x) - 1 for x <= 0, vectorisable: the Taylor polynomial to x^8/8! above -0.5 (where
 * exp(x) - 1 would cancel: relative error < 2e-8 before rounding), exp_f32(x) - 1 below; -1 below
 * -87.3. */
static inline float expm1_neg_f32(float x)
{
    float p = 1.0f / 40320.0f;
    p = p * x + 1.0f / 5040.0f;
    p = p * x + 1.0f / 720.0f;
    p = p * x + 1.0f / 120.0f;
    p = p * x + 1.0f / 24.0f;
    p = p * x + 1.0f / 6.0f;
    p = p * x + 0.5f;
    const float small = x + x * x * p;
    return x > -0.5f ? small : exp_f32(x) - 1.0f;
}

/* elu-A(x) = x above 0, A·(exp(x) - 1) else (torch's ELU to a few float32 ulps). */
static inline float elu_f32(float x, float alpha) { return x > 0.0f ? x : alpha * expm1_neg_f32(x); }

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
 * With has_elu, r holds the raw scores x and is overwritten with elu-A(x) (A = elu_alpha) first,
 * and grad is dL/dx: dL/dr times (r > 0 ? 1 : r + A).
 * The weighted sum of the row losses goes to loss[0]. */
void g4r_bpr_max(int64_t B, int64_t C, float *r, const float *valid, const float *w,
                 float bpreg, int64_t has_elu, float elu_alpha, float *grad, float *loss)
{
    double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (B * C > 32768)
    for (int64_t i = 0; i < B; ++i) {
        float *ri = r + i * C;
        float *gi = grad + i * C;
        if (has_elu) {
#pragma omp simd
            for (int64_t j = 0; j < C; ++j)
                ri[j] = elu_f32(ri[j], elu_alpha);
        }
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
