/* The one-call training step (gru4rec/training/cpu_step.py binds it), compiled with cpu_kernels.c
 * into one library (gru4rec/kernels/build.py). */
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu_kernels.h"

/* ------------------------------------------------------------------------------------------
 * The whole training step of gru4rec/training/step.py (FastStep) in one call, for the
 * configurations it covers (gru4rec/training/cpu_step.py says which): shared embedding (the input
 * rows are Wy's), the tanh GRU cell, the cross-entropy loss (its masked columns through the bias)
 * or BPR-max after an elu-A or linear final activation, distinct score rows, and the optimiser's
 * update. The matrix products are MKL's sgemm_ (the one torch links, handed over as a pointer);
 * everything between them is the kernels of cpu_kernels.c, in FastStep's order. On rsc15's shapes
 * the Python between ~40 operators was a quarter of the step; the Python and the torch operators
 * between this call and the update (By's gradient, the optimiser's bookkeeping) were another
 * 0.2-0.3 ms of DIGINETICA's. The update is the optimiser's own: its rules (rule_t, bound by it,
 * Adam's corrections set before each call) over the dense gradient buffer and the item tables'
 * distinct rows.
 */
typedef void (*sgemm_fn)(const char *, const char *, const int *, const int *, const int *, const float *,
                         const float *, const int *, const float *, const int *, const float *, float *, const int *);

enum { MAX_LAYERS = 8 };
/* the products that gemm() splits itself (below: MKL's threads) */
#define SPLIT_MIN_MACS ((int64_t)1 << 22)

typedef struct {
    sgemm_fn sgemm;
    int64_t B, S, N, d, n_layers, logit_form, mask_in_bias;
    int64_t bpr_max, has_elu;  /* the loss: BPR-max (after elu-A where has_elu), else cross-entropy */
    float bpreg, elu_alpha;
    int64_t n[MAX_LAYERS];
    float *Wx[MAX_LAYERS], *Wrz[MAX_LAYERS], *Wh[MAX_LAYERS], *Bh[MAX_LAYERS];
    float *gWx[MAX_LAYERS], *gWrz[MAX_LAYERS], *gWh[MAX_LAYERS], *gBh[MAX_LAYERS];
    float *hidden[MAX_LAYERS], *mask[MAX_LAYERS];  /* mask: NULL without hidden dropout */
    float *v[MAX_LAYERS], *rz[MAX_LAYERS], *hr[MAX_LAYERS], *c[MAX_LAYERS], *out[MAX_LAYERS];
    float *Wy, *By, *logq_in, *logq_sample, *embed_mask;
    /* the optimiser's update: the rules of the dense buffer (n_dense elements of gradient g_dense;
     * NULL rule: none), of Wy and of By */
    const rule_t *rule_dense, *rule_wy, *rule_by;
    float *g_dense;
    int64_t n_dense;
    /* scratch: C = B + S columns, U = C + B positions */
    int64_t *cols, *rows_all, *uniq, *inverse, *slot;
    uint8_t *mark;
    float *col_valid, *wy, *bias, *x0, *s, *scores, *g_rows, *g_out, *dv, *t, *w, *g_wy, *g_by, *grad;
} step_t;

/* step_t's layout for the loader's check against its ctypes mirror (StepStruct, gru4rec/kernels/cpu.py):
 * the number of fields; *fields = the table, *size = sizeof(step_t). */
#define F(field) G4R_FIELD(step_t, field)
static const g4r_field_t step_fields[] = {
    F(sgemm), F(B), F(S), F(N), F(d), F(n_layers), F(logit_form), F(mask_in_bias), F(bpr_max), F(has_elu),
    F(bpreg), F(elu_alpha), F(n),
    F(Wx), F(Wrz), F(Wh), F(Bh), F(gWx), F(gWrz), F(gWh), F(gBh), F(hidden), F(mask), F(v), F(rz), F(hr), F(c), F(out),
    F(Wy), F(By), F(logq_in), F(logq_sample), F(embed_mask), F(rule_dense), F(rule_wy), F(rule_by), F(g_dense),
    F(n_dense), F(cols), F(rows_all), F(uniq), F(inverse), F(slot), F(mark), F(col_valid), F(wy), F(bias), F(x0),
    F(s), F(scores), F(g_rows), F(g_out), F(dv), F(t), F(w), F(g_wy), F(g_by), F(grad),
};
#undef F

int64_t g4r_layout_step(const g4r_field_t **fields, int64_t *size)
{
    *fields = step_fields;
    *size = (int64_t)sizeof(step_t);
    return G4R_N_FIELDS(step_fields);
}

/* Row-major C (M×N, ldc) = op(A)·op(B) + beta·C with op(A) M×K (A stored K×M when ta) and
 * op(B) K×N (B stored N×K when tb): column-major Cᵀ = op(B)ᵀ·op(A)ᵀ. */
static void sgemm_part(const step_t *st, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
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

/* The product on two threads, each computing half of C with a one-thread sgemm (called inside
 * the parallel region, MKL runs on the calling thread): half its rows where C is taller than wide
 * or A is transposed, else half its columns. (A transposed: the weight gradients, whose C has
 * not been touched since the last update, so is out of the cache. Halves of rows make each
 * thread's part one contiguous block; halves of columns interleave the two in every row, and
 * DIGINETICA's step ran 4 % slower so, step_ab.py, the same bits.) Each element is the same sum
 * over K in the same order as MKL's own two threads give it (the same bits), and on a 2-core
 * host the products of at least SPLIT_MIN_MACS multiply-adds take 3-9 % less time so; smaller
 * ones, and other thread counts, run on MKL's threads. */
static void gemm(const step_t *st, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                 const float *Bm, int64_t ldb, float beta, float *C, int64_t ldc)
{
#ifdef _OPENMP
    if (M * N * K >= SPLIT_MIN_MACS && omp_get_max_threads() == 2 && !omp_in_parallel()) {
        const int rows = ta || M > N;
        const int64_t size = rows ? M : N, half = (size / 2 + 15) / 16 * 16;  /* 16-aligned panels */
#pragma omp parallel num_threads(2)
        {
            const int64_t t = omp_get_thread_num(), o = t ? half : 0, len = t ? size - half : half;
            if (rows)
                sgemm_part(st, ta, tb, len, N, K, ta ? A + o : A + o * lda, lda, Bm, ldb, beta, C + o * ldc, ldc);
            else
                sgemm_part(st, ta, tb, M, len, K, A, lda, tb ? Bm + o * ldb : Bm + o, ldb, beta, C + o, ldc);
        }
        return;
    }
#endif
    sgemm_part(st, ta, tb, M, N, K, A, lda, Bm, ldb, beta, C, ldc);
}

/* dst (rows × width) = the first `width` columns from `col` of src (rows × src_width). */
static void copy_cols(int64_t rows, int64_t width, const float *src, int64_t src_width, int64_t col, float *dst)
{
    for (int64_t b = 0; b < rows; ++b)
        memcpy(dst + b * width, src + b * src_width + col, (size_t)width * sizeof(float));
}

/* Ask for the cache lines of a row of `width` floats at p (a row of a table that does not fit the
 * cache, a few rows before it is copied). */
static inline void prefetch_row(const float *p, int64_t width)
{
    for (int64_t j = 0; j < width; j += 16)
        __builtin_prefetch(p + j);
}

/* dst (n × width) = table's rows[0..n): a step's ~2,000 scattered rows of an item table that does
 * not fit the cache, so the copy waits on memory — split between the threads, each fetching a few
 * rows ahead of its copy. */
static void gather(int64_t n, const int64_t *rows, int64_t width, const float *table, float *dst)
{
    const int64_t ahead = 4;
#pragma omp parallel for schedule(static) if (n * width >= 65536)
    for (int64_t i = 0; i < n; ++i) {
        if (i + ahead < n)
            prefetch_row(table + rows[i + ahead] * width, width);
        memcpy(dst + i * width, table + rows[i] * width, (size_t)width * sizeof(float));
    }
}

/* The step up to the scores: st->scores (B × C) = the columns' raw scores (distinct rows' products
 * spread to the columns, plus the bias: MASK on invalid columns where mask_in_bias); counts =
 * the numbers of distinct items, scored (k) and in all (scored, then input-only). */
static void step_forward(const step_t *st, const int64_t *inputs, const int64_t *targets, const int64_t *samples,
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
    /* scores of the distinct rows, spread to the columns; the rows gathered just before their
     * product, which then finds them in the cache (gathered before the layers: 6 % slower) */
    gather(k, st->uniq, d, st->Wy, st->wy);
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

/* The optimiser's update of the step: the dense buffer, Wy's distinct rows (scored, then
 * input-only) and By's scored rows, whose gradient is the column sums of g_rows. */
static void step_update(const step_t *st, int64_t k, int64_t n_uniq)
{
    g4r_sum_rows(st->B, k, st->g_rows, st->g_by);
    const rule_t *rules[3] = {st->rule_dense, st->rule_wy, st->rule_by};
    const int64_t n_rows[3] = {st->n_dense, n_uniq, k};
    const int64_t *rows[3] = {NULL, st->uniq, st->uniq};
    float *g[3] = {st->g_dense, st->g_wy, st->g_by};
    const int64_t first = st->rule_dense ? 0 : 1;  /* no dense parameters: the item tables only */
    g4r_update_tables(3 - first, rules + first, n_rows + first, rows + first, g + first);
}

/* The whole step, its update included: the loss — the weighted sum of the rows' losses, weights
 * active/B — to loss[0]; counts as step_forward's. */
void g4r_train_step(const step_t *st, const int64_t *inputs, const int64_t *targets, const int64_t *samples,
                    const float *active, const float *keep, float inv_b, float *loss, int64_t *counts)
{
    step_forward(st, inputs, targets, samples, active, keep, counts);
    for (int64_t b = 0; b < st->B; ++b)
        st->w[b] = active[b] * inv_b;
    if (st->bpr_max)  /* the scores activated in place, the gradient to st->grad */
        g4r_bpr_max(st->B, st->B + st->S, st->scores, st->col_valid, st->w, st->bpreg, st->has_elu, st->elu_alpha, st->grad, loss);
    else  /* the masked columns through the bias; scores := dL/dscores */
        g4r_cross_entropy(st->B, st->B + st->S, st->scores, st->w, st->logit_form, loss);
    step_backward(st, st->bpr_max ? st->grad : st->scores, counts[0], counts[1]);
    step_update(st, counts[0], counts[1]);
}
