/* Certified top-k candidates from an int8 copy of the output item matrix (int8_scores.py loads
 * this; build.py compiles it).
 *
 * Scoring every item for one click reads the whole float32 output matrix Wy (N x L): at the
 * DIGINETICA size that is 88 MB per click, and memory bandwidth, not arithmetic, sets the
 * latency. An int8 copy of Wy is 4x smaller. These kernels use it only to find candidates, with
 * a rigorous upper bound on every item's float32 score; the candidates are then rescored from the
 * float32 matrix, and the caller accepts the answer only when the bound proves that no other
 * item can enter the top k (it scores the row in full float32 otherwise). The answer therefore
 * never differs from the float32 one.
 *
 * Rows of Wy are quantised once (Python side): w_i = c_i q_i + e_i with q_i in [-127, 127] and
 * the residual norm r_i = ||e_i|| (rounded up). Each query row x is quantised here to 7 bits:
 * x = a p + f, p in [-64, 64]. With P_i = p . q_i (exact integer arithmetic) and the triangle and
 * Cauchy-Schwarz inequalities,
 *
 *   | x . w_i - a c_i P_i |  <=  ||a p|| r_i + ||f|| (||c_i q_i|| + r_i)
 *
 * and float32 evaluation of b_i + x . w_i (any summation order, with or without FMA) is within
 * gamma (|b_i| + ||x|| ||w_i||) of the real value, gamma = (L+2) u / (1 - (L+2) u), u = 2^-24.
 * The bound adds both and is widened by 1e-6 of itself for the rounding of its own arithmetic
 * (done in double precision, where that rounding is below 1e-13 relative; rounded up to float32
 * at the end).
 *
 * Layout. The table holds u = q + 128 as unsigned bytes in blocks of 16 items: block k, group g
 * of 4 columns, item j of the block, column 4g + c is byte (k L4 + g) 64 + 4 j + c, L4 = ceil(L/4)
 * (padding: u = 128, and the query is padded with p = 0, so padding adds nothing). One 64-byte
 * load then holds 4 columns of 16 items, and a product with the query's 4 bytes p[4g..4g+3]
 * repeated 16 times adds each item's 4 products into its own 32-bit lane: a block's 16 sums for
 * a query row build up in one register, with no horizontal sums, ready for the bounds, which are
 * computed for the block's 16 items together (block_bounds). Several query rows share each load.
 *
 * The products, by what the compiler targets (g4r_int8_path() says which was built):
 *   avx512-vnni  vpdpbusd: 64 byte products and their sums in one instruction;
 *   avx2         vpmaddubsw + vpmaddwd: every pair sum is at most 2*255*64 < 2^15, so nothing
 *                saturates;
 *   scalar       a plain loop.
 * All three compute the same integers U_i = u . p, and P_i = U_i - 128 sum(p) exactly.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512VNNI__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define U32 (1.0 / 16777216.0) /* unit roundoff of float32, 2^-24 */

/* gamma: a float32 sum of L products plus a bias is within gamma (|b| + ||x|| ||w||) of the real
 * value, in any summation order, with or without FMA. */
static double float32_gamma(int64_t L) { return (double)(L + 2) * U32 / (1.0 - (double)(L + 2) * U32); }
#define QMAX 64.0
#define BLOCK 16 /* items per block of the table */

/* One query row, quantised: p (int8, |p| <= 64, padded to 4 L4 with zeros), and the row's
 * coefficients of the bound: upper_i = (U_i + s) (a c_i) + b_i
 *                                      + (k1 r_i + k2 ||c_i q_i|| + k3 ||w_i|| + G |b_i|) (1 + 1e-6). */
typedef struct {
    double a, s, k1, k2, k3;
} query_t;

static void quantise_query(int64_t L, int64_t L4, double G, const float *x, int8_t *p, query_t *qt)
{
    double amax = 0.0, nx = 0.0;
    for (int64_t j = 0; j < L; j++) {
        double v = x[j];
        nx += v * v;
        if (fabs(v) > amax) amax = fabs(v);
    }
    double a = amax > 0.0 ? amax / QMAX : 1.0;
    double nxh = 0.0, nf = 0.0;
    int64_t psum = 0;
    for (int64_t j = 0; j < L; j++) {
        double v = x[j];
        double r = nearbyint(v / a);
        if (r > QMAX) r = QMAX;
        if (r < -QMAX) r = -QMAX;
        p[j] = (int8_t)r;
        psum += (int64_t)r;
        nxh += (a * r) * (a * r);
        nf += (v - a * r) * (v - a * r);
    }
    for (int64_t j = L; j < 4 * L4; j++) p[j] = 0;
    nxh = sqrt(nxh);
    nf = sqrt(nf);
    /* ||a p|| r + ||f|| (||c q|| + r) + G (|b| + ||x|| ||w||), the terms grouped by item norm */
    qt->a = a;
    qt->s = -128.0 * (double)psum;
    qt->k1 = nxh + nf;
    qt->k2 = nf;
    qt->k3 = G * sqrt(nx);
}

/* dots[t * BLOCK + j] = u_j . p_t for the BLOCK items of one block (ub: L4 * 64 bytes) and nr
 * query rows p_t = p + t * P. Called with a constant nr, so that the loops over t unroll. next,
 * unless NULL, is the block to read after this one: every pass over this block asks for its
 * lines (measured on a Zen 4 at 17 rows: 4.7 -> 4.1 ms; asking in the first pass only gained
 * nothing, in the last pass half of that). */
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define PATH "avx512-vnni"
#define ROWS 8
static inline __attribute__((always_inline)) void
block_dots(const int nr, const uint8_t *restrict ub, const uint8_t *next, const int8_t *restrict p, int64_t P, int64_t L4,
           int32_t *restrict dots)
{
    /* vpdpbusd adds into its accumulator, so each accumulator is a chain of dependent
     * instructions: with fewer than 4 rows, every row gets 2 chains (even and odd groups) to keep
     * enough of them in flight. */
    const int chains = nr < 4 ? 2 : 1;
    __m512i acc[ROWS], acc2[ROWS];
    for (int t = 0; t < nr; t++) acc[t] = acc2[t] = _mm512_setzero_si512();
    int64_t g = 0;
    if (chains == 2)
        for (; g + 2 <= L4; g += 2) {
            if (next) {
                __builtin_prefetch(next + 64 * g);
                __builtin_prefetch(next + 64 * g + 64);
            }
            const __m512i v0 = _mm512_loadu_si512((const void *)(ub + 64 * g));
            const __m512i v1 = _mm512_loadu_si512((const void *)(ub + 64 * g + 64));
            for (int t = 0; t < nr; t++) {
                int32_t p0, p1;
                memcpy(&p0, p + t * P + 4 * g, 4);
                memcpy(&p1, p + t * P + 4 * g + 4, 4);
                acc[t] = _mm512_dpbusd_epi32(acc[t], v0, _mm512_set1_epi32(p0));
                acc2[t] = _mm512_dpbusd_epi32(acc2[t], v1, _mm512_set1_epi32(p1));
            }
        }
    for (; g < L4; g++) {
        if (next) __builtin_prefetch(next + 64 * g);
        const __m512i v = _mm512_loadu_si512((const void *)(ub + 64 * g));
        for (int t = 0; t < nr; t++) {
            int32_t pg;
            memcpy(&pg, p + t * P + 4 * g, 4);
            acc[t] = _mm512_dpbusd_epi32(acc[t], v, _mm512_set1_epi32(pg));
        }
    }
    for (int t = 0; t < nr; t++) _mm512_storeu_si512((void *)(dots + BLOCK * t), _mm512_add_epi32(acc[t], acc2[t]));
}
#elif defined(__AVX2__)
#define PATH "avx2"
#define ROWS 4
static inline __attribute__((always_inline)) void
block_dots(const int nr, const uint8_t *restrict ub, const uint8_t *next, const int8_t *restrict p, int64_t P, int64_t L4,
           int32_t *restrict dots)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i lo[ROWS], hi[ROWS]; /* items 0-7 and 8-15 */
    for (int t = 0; t < nr; t++) lo[t] = hi[t] = _mm256_setzero_si256();
    for (int64_t g = 0; g < L4; g++) {
        if (next) __builtin_prefetch(next + 64 * g);
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(ub + 64 * g));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(ub + 64 * g + 32));
        for (int t = 0; t < nr; t++) {
            int32_t pg;
            memcpy(&pg, p + t * P + 4 * g, 4);
            const __m256i pb = _mm256_set1_epi32(pg);
            lo[t] = _mm256_add_epi32(lo[t], _mm256_madd_epi16(_mm256_maddubs_epi16(v0, pb), ones));
            hi[t] = _mm256_add_epi32(hi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(v1, pb), ones));
        }
    }
    for (int t = 0; t < nr; t++) {
        _mm256_storeu_si256((__m256i *)(dots + BLOCK * t), lo[t]);
        _mm256_storeu_si256((__m256i *)(dots + BLOCK * t + 8), hi[t]);
    }
}
#else
#define PATH "scalar"
#define ROWS 4
static inline __attribute__((always_inline)) void
block_dots(const int nr, const uint8_t *restrict ub, const uint8_t *next, const int8_t *restrict p, int64_t P, int64_t L4,
           int32_t *restrict dots)
{
    for (int64_t g = 0; next && g < L4; g++) __builtin_prefetch(next + 64 * g);
    for (int t = 0; t < nr; t++) {
        int32_t acc[BLOCK] = {0};
        for (int64_t g = 0; g < L4; g++)
            for (int j = 0; j < BLOCK; j++)
                for (int c = 0; c < 4; c++) acc[j] += (int32_t)ub[64 * g + 4 * j + c] * (int32_t)p[t * P + 4 * g + c];
        memcpy(dots + BLOCK * t, acc, sizeof acc);
    }
}
#endif

/* Which product code this build has: "avx512-vnni", "avx2" or "scalar". */
const char *g4r_int8_path(void) { return PATH; }

/* A min-heap of (value, index) holding the m largest values seen. */
typedef struct {
    float *v;
    int64_t *i;
    int64_t n, cap;
} heap_t;

static inline void heap_sift_down(heap_t *h, int64_t k)
{
    for (;;) {
        int64_t l = 2 * k + 1, r = l + 1, s = k;
        if (l < h->n && h->v[l] < h->v[s]) s = l;
        if (r < h->n && h->v[r] < h->v[s]) s = r;
        if (s == k) return;
        float tv = h->v[k]; h->v[k] = h->v[s]; h->v[s] = tv;
        int64_t ti = h->i[k]; h->i[k] = h->i[s]; h->i[s] = ti;
        k = s;
    }
}

static inline void heap_push(heap_t *h, float v, int64_t idx)
{
    if (h->n < h->cap) {
        int64_t k = h->n++;
        h->v[k] = v; h->i[k] = idx;
        while (k > 0) {
            int64_t parent = (k - 1) / 2;
            if (h->v[parent] <= h->v[k]) break;
            float tv = h->v[k]; h->v[k] = h->v[parent]; h->v[parent] = tv;
            int64_t ti = h->i[k]; h->i[k] = h->i[parent]; h->i[parent] = ti;
            k = parent;
        }
    } else if (v > h->v[0]) {
        h->v[0] = v; h->i[0] = idx;
        heap_sift_down(h, 0);
    }
}

static inline double heap_threshold(const heap_t *h) { return h->n < h->cap ? -INFINITY : (double)h->v[0]; }

static inline float round_up_f32(double v)
{
    float f = (float)v;
    if ((double)f < v) f = nextafterf(f, INFINITY);
    return f;
}

/* Push the items of a block whose bounds up[j] (j in mask) are above the heap's smallest (rare once
 * the heap is full). Items >= N are the table's padding. */
static inline void push_above(const double *up, uint32_t mask, int64_t i0, int64_t N, heap_t *h)
{
    double thr = heap_threshold(h);
    for (int j = 0; mask; j++, mask >>= 1) {
        if ((mask & 1) && up[j] > thr && i0 + j < N) {
            heap_push(h, round_up_f32(up[j]), i0 + j);
            thr = heap_threshold(h);
        }
    }
}

/* The upper bounds of one block's items (i0 .. i0 + BLOCK - 1) for one query row, and the heap
 * pushes of those above the heap's smallest. */
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
static inline void block_bounds(const int32_t *restrict dot, int64_t i0, int64_t N, const query_t *qt, double G,
                                const float *restrict c, const float *restrict bias, const float *restrict r,
                                const float *restrict nqh, const float *restrict nw, heap_t *h)
{
    /* 8 items per vector of doubles; the mask of the items above the heap's smallest decides
     * whether anything is pushed at all */
    const __m512d a = _mm512_set1_pd(qt->a), s = _mm512_set1_pd(qt->s), k1 = _mm512_set1_pd(qt->k1),
                  k2 = _mm512_set1_pd(qt->k2), k3 = _mm512_set1_pd(qt->k3), g = _mm512_set1_pd(G),
                  widen = _mm512_set1_pd(1.0 + 1e-6), thr = _mm512_set1_pd(heap_threshold(h));
    double up[BLOCK];
    uint32_t mask = 0;
    for (int half = 0; half < BLOCK / 8; half++) {
        const int64_t i = i0 + 8 * half;
        const __m512d bj = _mm512_cvtps_pd(_mm256_loadu_ps(bias + i));
        __m512d delta = _mm512_mul_pd(g, _mm512_abs_pd(bj));
        delta = _mm512_fmadd_pd(k3, _mm512_cvtps_pd(_mm256_loadu_ps(nw + i)), delta);
        delta = _mm512_fmadd_pd(k2, _mm512_cvtps_pd(_mm256_loadu_ps(nqh + i)), delta);
        delta = _mm512_fmadd_pd(k1, _mm512_cvtps_pd(_mm256_loadu_ps(r + i)), delta);
        const __m512d d = _mm512_add_pd(_mm512_cvtepi32_pd(_mm256_loadu_si256((const __m256i *)(dot + 8 * half))), s);
        const __m512d v = _mm512_fmadd_pd(d, _mm512_mul_pd(a, _mm512_cvtps_pd(_mm256_loadu_ps(c + i))),
                                          _mm512_fmadd_pd(delta, widen, bj));
        _mm512_storeu_pd(up + 8 * half, v);
        mask |= (uint32_t)_mm512_cmp_pd_mask(v, thr, _CMP_GT_OQ) << (8 * half);
    }
    if (mask) push_above(up, mask, i0, N, h);
}
#else
static inline void block_bounds(const int32_t *restrict dot, int64_t i0, int64_t N, const query_t *qt, double G,
                                const float *restrict c, const float *restrict bias, const float *restrict r,
                                const float *restrict nqh, const float *restrict nw, heap_t *h)
{
    double up[BLOCK];
    for (int j = 0; j < BLOCK; j++) {
        const double bj = bias[i0 + j];
        const double delta = qt->k1 * r[i0 + j] + qt->k2 * nqh[i0 + j] + qt->k3 * nw[i0 + j] + G * fabs(bj);
        up[j] = ((double)dot[j] + qt->s) * (qt->a * c[i0 + j]) + bj + delta * (1.0 + 1e-6);
    }
    const double thr = heap_threshold(h);
    uint32_t mask = 0;
    for (int j = 0; j < BLOCK; j++) mask |= (uint32_t)(up[j] > thr) << j;
    if (mask) push_above(up, mask, i0, N, h);
}
#endif

/* For each of the B query rows x (B x L float32): the m items with the largest upper bounds on
 * their float32 score b_i + x . w_i, as cand_idx/cand_upper (B x m, in no particular order).
 * Every item not returned has an upper bound <= min(cand_upper[b, :]). Needs 1 <= m <= N.
 * q: the blocked table (ceil(N/16) * ceil(L/4) * 64 bytes, see the layout above); per item,
 * padded to a multiple of 16 entries: c (scale), bias, r (residual norm), nqh (||c_i q_i||), nw
 * (||w_i||), the norms rounded up. threads: most OpenMP threads to use. Returns 0, or -1 when
 * memory ran out. */
int g4r_int8_candidates(int64_t B, int64_t L, int64_t N, int64_t m, int64_t threads, const float *x,
                        const uint8_t *q, const float *c, const float *bias, const float *r, const float *nqh,
                        const float *nw, int64_t *cand_idx, float *cand_upper)
{
    const double G = float32_gamma(L);
    const int64_t L4 = (L + 3) / 4, P = 4 * L4, NB = (N + BLOCK - 1) / BLOCK;
    int nthreads = 1;
#ifdef _OPENMP
    nthreads = threads < 1 ? 1 : (int)threads;
    if (N < 4096) nthreads = 1; /* a small catalogue is not worth waking threads for */
#else
    (void)threads;
#endif
    int8_t *p = malloc((size_t)(B * P));
    query_t *qt = malloc(sizeof(query_t) * (size_t)B);
    float *hv = malloc(sizeof(float) * (size_t)(nthreads * B * m));
    int64_t *hi = malloc(sizeof(int64_t) * (size_t)(nthreads * B * m));
    int64_t *hn = calloc((size_t)(nthreads * B), sizeof(int64_t));
    if (!p || !qt || !hv || !hi || !hn) {
        free(p); free(qt); free(hv); free(hi); free(hn);
        return -1;
    }
    for (int64_t b = 0; b < B; b++) quantise_query(L, L4, G, x + b * L, p + b * P, qt + b);

#pragma omp parallel num_threads(nthreads)
    {
        int tid = 0, nt = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        const int64_t k0 = NB * tid / nt, k1 = NB * (tid + 1) / nt;
        heap_t *heaps = malloc(sizeof(heap_t) * (size_t)B);
        for (int64_t b = 0; heaps && b < B; b++) {
            int64_t slot = (int64_t)tid * B + b;
            heaps[b] = (heap_t){hv + slot * m, hi + slot * m, 0, m};
        }
        int32_t dots[ROWS * BLOCK];
        const int64_t groups = (B + ROWS - 1) / ROWS; /* rows shared out evenly: 17 = 6 + 6 + 5, not 8 + 8 + 1 */
        for (int64_t k = k0; heaps && k < k1; k++) {
            const uint8_t *ub = q + k * L4 * 64;
            const int64_t i0 = k * BLOCK;
            const uint8_t *next = k + 1 < k1 ? ub + L4 * 64 : NULL;
            for (int64_t gi = 0; gi < groups; gi++) {
                const int64_t b0 = B * gi / groups;
                const int nr = (int)(B * (gi + 1) / groups - b0);
                const int8_t *pb = p + b0 * P;
                switch (nr) { /* constant row counts: the compiler unrolls each */
#if ROWS == 8
                case 8: block_dots(8, ub, next, pb, P, L4, dots); break;
                case 7: block_dots(7, ub, next, pb, P, L4, dots); break;
                case 6: block_dots(6, ub, next, pb, P, L4, dots); break;
                case 5: block_dots(5, ub, next, pb, P, L4, dots); break;
#endif
                case 4: block_dots(4, ub, next, pb, P, L4, dots); break;
                case 3: block_dots(3, ub, next, pb, P, L4, dots); break;
                case 2: block_dots(2, ub, next, pb, P, L4, dots); break;
                default: block_dots(1, ub, next, pb, P, L4, dots); break;
                }
                for (int t = 0; t < nr; t++)
                    block_bounds(dots + BLOCK * t, i0, N, qt + b0 + t, G, c, bias, r, nqh, nw, heaps + b0 + t);
            }
        }
        if (heaps) {
            for (int64_t b = 0; b < B; b++) hn[(int64_t)tid * B + b] = heaps[b].n;
            free(heaps);
        }
    }
    /* Merge the threads' heaps of each row into the first thread's slot, then copy out. */
    for (int64_t b = 0; b < B; b++) {
        heap_t h = {cand_upper + b * m, cand_idx + b * m, 0, m};
        for (int t = 0; t < nthreads; t++) {
            int64_t slot = (int64_t)t * B + b;
            for (int64_t k = 0; k < hn[slot]; k++) heap_push(&h, hv[slot * m + k], hi[slot * m + k]);
        }
        for (int64_t k = h.n; k < m; k++) { /* only when fewer than m items exist */
            cand_upper[b * m + k] = -INFINITY;
            cand_idx[b * m + k] = -1;
        }
    }
    free(p); free(qt); free(hv); free(hi); free(hn);
    return 0;
}

/* The exact float32 score b_i + x . w_i of one item (as any float32 product computes it, up to
 * the order of the sums) and a lower bound on the float32 score recommend()'s product computes:
 * both evaluations are within gamma (|b_i| + ||x|| ||w_i||) of the real value, so the bound
 * subtracts twice that (widened by 1e-6 of itself and rounded down). nx = ||x||. */
static inline void exact_score(int64_t L, double G, const float *restrict xb, double nx, const float *restrict wi, float bi,
                               float nwi, float *score, float *lower)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < L; j++) s += xb[j] * wi[j];
    s += bi;
    double err = 2.0 * G * (fabs((double)bi) + nx * (double)nwi);
    double lo = (double)s - err * (1.0 + 1e-6);
    float f = (float)lo;
    if ((double)f > lo) f = nextafterf(f, -INFINITY);
    *score = s;
    *lower = f;
}

static double row_norm(int64_t L, const float *xb)
{
    double nx = 0.0;
    for (int64_t j = 0; j < L; j++) nx += (double)xb[j] * (double)xb[j];
    return sqrt(nx);
}

/* Exact scores and lower bounds (exact_score) of the candidates cand_idx (B x m, from
 * g4r_int8_candidates); candidates with index -1 get -inf. w is the float32 matrix (N x L). */
void g4r_rescore(int64_t B, int64_t L, int64_t m, const float *x, const float *w, const float *bias, const float *nw,
                 const int64_t *cand_idx, float *score, float *lower)
{
    const double G = float32_gamma(L);
    for (int64_t b = 0; b < B; b++) {
        const float *xb = x + b * L;
        const double nx = row_norm(L, xb);
        for (int64_t k = b * m; k < (b + 1) * m; k++) {
            const int64_t i = cand_idx[k];
            if (i < 0) {
                score[k] = -INFINITY;
                lower[k] = -INFINITY;
            } else {
                exact_score(L, G, xb, nx, w + i * L, bias[i], nw[i], score + k, lower + k);
            }
        }
    }
}

/* The answer's order: score descending, then index ascending. */
static inline int ranks_before(float score, int64_t i, float other_score, int64_t other_i)
{
    return score > other_score || (score == other_score && i < other_i);
}

static int cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The certified top k of each query row, in one call: the m candidates of g4r_int8_candidates,
 * their exact scores and lower bounds (g4r_rescore), the row's excluded items removed (excl:
 * the items of row b are excl[excl_start[b] .. excl_start[b+1]), excl_start[0] = 0, in any order;
 * each row's are sorted in place), and the proof:
 * row b is certified (certified[b] = 1) when at least ks[b] candidates have a lower bound above
 * the smallest candidate upper bound, which bounds every item outside the candidates; then no
 * other item can be in the row's float32 top ks[b]. out_idx / out_score (B x kmax) get the kmax
 * best remaining candidates by exact score, best first (ties: smaller index first; -1 / -inf
 * where fewer remain). A row that is not certified must be scored in full by the caller.
 * Needs ks[b] <= kmax <= m <= N. Returns 0, or -1 when memory ran out. */
int g4r_certified_topk(int64_t B, int64_t L, int64_t N, int64_t m, int64_t threads, const float *x, const uint8_t *q,
                       const float *c, const float *bias, const float *r, const float *nqh, const float *nw,
                       const float *w, const int64_t *ks, int64_t kmax, const int64_t *excl_start, int64_t *excl,
                       int64_t *out_idx, float *out_score, uint8_t *certified)
{
    const double G = float32_gamma(L);
    int64_t *cand_idx = malloc(sizeof(int64_t) * (size_t)(B * m));
    float *cand_upper = malloc(sizeof(float) * (size_t)(B * m));
    if (!cand_idx || !cand_upper ||
        g4r_int8_candidates(B, L, N, m, threads, x, q, c, bias, r, nqh, nw, cand_idx, cand_upper) != 0) {
        free(cand_idx); free(cand_upper);
        return -1;
    }
    for (int64_t b = 0; b < B; b++) {
        const float *xb = x + b * L;
        const double nx = row_norm(L, xb);
        int64_t *ex = excl + excl_start[b];
        const size_t n_ex = (size_t)(excl_start[b + 1] - excl_start[b]);
        if (n_ex > 1) qsort(ex, n_ex, sizeof(int64_t), cmp_i64);
        /* Every item outside the candidates is bounded by the smallest candidate bound. */
        const int64_t *ci = cand_idx + b * m;
        const float *cu = cand_upper + b * m;
        float outside = INFINITY;
        for (int64_t k = 0; k < m; k++) outside = cu[k] < outside ? cu[k] : outside;
        /* The candidates' float32 rows lie anywhere in a matrix far larger than the caches: ask
         * for the start of each now (the hardware prefetcher follows a row once it is read). */
        for (int64_t k = 0; k < m; k++)
            if (ci[k] >= 0) {
                __builtin_prefetch(w + ci[k] * L);
                __builtin_prefetch(w + ci[k] * L + 16);
            }
        int64_t *bi = out_idx + b * kmax;
        float *bs = out_score + b * kmax;
        for (int64_t k = 0; k < kmax; k++) { bi[k] = -1; bs[k] = -INFINITY; }
        int64_t above = 0, held = 0;
        for (int64_t k = 0; k < m; k++) {
            const int64_t i = ci[k];
            if (i < 0 || (n_ex && bsearch(&i, ex, n_ex, sizeof(int64_t), cmp_i64))) continue;
            float score, lower;
            exact_score(L, G, xb, nx, w + i * L, bias[i], nw[i], &score, &lower);
            above += lower > outside;
            /* insert into the row's best kmax, kept sorted: score descending, then index ascending */
            if (held == kmax && !ranks_before(score, i, bs[kmax - 1], bi[kmax - 1])) continue;
            int64_t at = held < kmax ? held++ : kmax - 1;
            while (at > 0 && ranks_before(score, i, bs[at - 1], bi[at - 1])) {
                bs[at] = bs[at - 1];
                bi[at] = bi[at - 1];
                at--;
            }
            bs[at] = score;
            bi[at] = i;
        }
        certified[b] = above >= ks[b];
    }
    free(cand_idx); free(cand_upper);
    return 0;
}
