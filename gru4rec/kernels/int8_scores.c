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
 * the residual norm r_i = ||e_i|| (rounded up); the table holds q_i + 128 as unsigned bytes. Each
 * query row x is quantised here to 7 bits: x = a p + f, p in [-64, 64]. With P_i = p . q_i (exact
 * integer arithmetic) and the triangle and Cauchy-Schwarz inequalities,
 *
 *   | x . w_i - a c_i P_i |  <=  ||a p|| r_i + ||f|| (||c_i q_i|| + r_i)
 *
 * and float32 evaluation of b_i + x . w_i (any summation order, with or without FMA) is within
 * gamma (|b_i| + ||x|| ||w_i||) of the real value, gamma = (L+2) u / (1 - (L+2) u), u = 2^-24.
 * The bound adds both and is widened by 1e-6 of itself for the rounding of its own arithmetic
 * (done in double precision, where that rounding is below 1e-13 relative; rounded up to float32
 * at the end).
 *
 * The products use AVX2's maddubs on the unsigned item bytes u = q + 128 (at most 255) and the
 * signed query bytes p (|p| <= 64): every pair sum is at most 2*255*64 < 2^15, so nothing
 * saturates, and P_i = u . p - 128 sum(p) is exact. Without AVX2 a plain loop computes the same
 * integers. Four query rows share each load of an item row.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define U32 (1.0 / 16777216.0) /* unit roundoff of float32, 2^-24 */

/* One query row, quantised: p (int8, |p| <= 64), and what the bound needs. */
typedef struct {
    double a, nx, nxh, nf; /* scale, ||x||, ||a p||, ||x - a p|| */
    int32_t psum;          /* sum of p: removes the +128 of the item bytes */
} query_t;

#define QMAX 64.0

static void quantise_query(int64_t L, const float *x, int8_t *p, query_t *qt)
{
    double amax = 0.0, nx = 0.0;
    for (int64_t j = 0; j < L; j++) {
        double v = x[j];
        nx += v * v;
        if (fabs(v) > amax) amax = fabs(v);
    }
    double a = amax > 0.0 ? amax / QMAX : 1.0;
    double nxh = 0.0, nf = 0.0;
    int32_t psum = 0;
    for (int64_t j = 0; j < L; j++) {
        double v = x[j];
        double r = nearbyint(v / a);
        if (r > QMAX) r = QMAX;
        if (r < -QMAX) r = -QMAX;
        p[j] = (int8_t)r;
        psum += (int32_t)r;
        nxh += (a * r) * (a * r);
        nf += (v - a * r) * (v - a * r);
    }
    qt->a = a;
    qt->nx = sqrt(nx);
    qt->nxh = sqrt(nxh);
    qt->nf = sqrt(nf);
    qt->psum = psum;
}

/* n <= 4 dot products u . p_t at once (t < n), loading the item row u once: exact integer sums.
 * Called with a constant n, so that the loops over t unroll. */
static inline __attribute__((always_inline)) void
dotn_u8(const int n, const uint8_t *restrict u, const int8_t *const p[4], int64_t L, int32_t out[4])
{
    int64_t j = 0;
    int32_t total[4] = {0, 0, 0, 0};
#ifdef __AVX2__
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (; j + 32 <= L; j += 32) {
        __m256i uj = _mm256_loadu_si256((const __m256i *)(u + j));
        for (int t = 0; t < n; t++) {
            __m256i pr = _mm256_maddubs_epi16(uj, _mm256_loadu_si256((const __m256i *)(p[t] + j)));
            acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(pr, ones));
        }
    }
    /* The four horizontal sums together: lanes [t0, t1, t2, t3]. */
    __m256i s01 = _mm256_hadd_epi32(acc[0], acc[1]), s23 = _mm256_hadd_epi32(acc[2], acc[3]);
    __m256i s = _mm256_hadd_epi32(s01, s23);
    __m128i sums = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    _mm_storeu_si128((__m128i *)total, sums);
#endif
    for (; j < L; j++)
        for (int t = 0; t < n; t++) total[t] += (int32_t)u[j] * (int32_t)p[t][j];
    for (int t = 0; t < n; t++) out[t] = total[t];
}

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

static inline float round_up_f32(double v)
{
    float f = (float)v;
    if ((double)f < v) f = nextafterf(f, INFINITY);
    return f;
}

/* For each of the B query rows x (B x L float32): the m items with the largest upper bounds on
 * their float32 score b_i + x . w_i, as cand_idx/cand_upper (B x m, in no particular order).
 * Every item not returned has an upper bound <= min(cand_upper[b, :]). Needs 1 <= m <= N.
 * Item tables: q (N x L, q_i + 128 as uint8), c (scale), bias, r (residual norm), nqh (||c_i q_i||), nw
 * (||w_i||), all rounded up where they are norms. Returns 0, or -1 when memory ran out. */
int g4r_int8_candidates(int64_t B, int64_t L, int64_t N, int64_t m, const float *x, const uint8_t *q,
                        const float *c, const float *bias, const float *r, const float *nqh, const float *nw,
                        int64_t *cand_idx, float *cand_upper)
{
    const double G = (double)(L + 2) * U32 / (1.0 - (double)(L + 2) * U32);
    int8_t *p = malloc((size_t)(B * L));
    query_t *qt = malloc(sizeof(query_t) * (size_t)B);
    int nthreads = 1;
#ifdef _OPENMP
    nthreads = omp_get_max_threads();
    if (N < 4096) nthreads = 1; /* a small catalogue is not worth waking threads for */
#endif
    float *hv = malloc(sizeof(float) * (size_t)(nthreads * B * m));
    int64_t *hi = malloc(sizeof(int64_t) * (size_t)(nthreads * B * m));
    int64_t *hn = calloc((size_t)(nthreads * B), sizeof(int64_t));
    if (!p || !qt || !hv || !hi || !hn) {
        free(p); free(qt); free(hv); free(hi); free(hn);
        return -1;
    }
    for (int64_t b = 0; b < B; b++) quantise_query(L, x + b * L, p + b * L, qt + b);

#pragma omp parallel num_threads(nthreads)
    {
        int tid = 0, nt = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        int64_t i0 = N * tid / nt, i1 = N * (tid + 1) / nt;
        heap_t *heaps = malloc(sizeof(heap_t) * (size_t)B);
        for (int64_t b = 0; heaps && b < B; b++) {
            int64_t slot = (int64_t)tid * B + b;
            heaps[b] = (heap_t){hv + slot * m, hi + slot * m, 0, m};
        }
        for (int64_t i = i0; heaps && i < i1; i++) {
            const uint8_t *qi = q + i * L;
            const double ci = c[i], bi = bias[i], ri = r[i], nqhi = nqh[i], nwi = nw[i];
            for (int64_t b0 = 0; b0 < B; b0 += 4) {
                const int n = B - b0 < 4 ? (int)(B - b0) : 4;
                const int8_t *pt[4];
                for (int t = 0; t < n; t++) pt[t] = p + (b0 + t) * L;
                int32_t dots[4];
                switch (n) {
                case 4: dotn_u8(4, qi, pt, L, dots); break;
                case 3: dotn_u8(3, qi, pt, L, dots); break;
                case 2: dotn_u8(2, qi, pt, L, dots); break;
                default: dotn_u8(1, qi, pt, L, dots); break;
                }
                for (int t = 0; t < n; t++) {
                    const query_t *qb = qt + b0 + t;
                    heap_t *h = heaps + b0 + t;
                    double approx = (double)(dots[t] - 128 * qb->psum) * (qb->a * ci);
                    double delta = qb->nxh * ri + qb->nf * (nqhi + ri) + G * (fabs(bi) + qb->nx * nwi);
                    double upper = approx + bi + delta * (1.0 + 1e-6);
                    if (h->n < h->cap || upper > (double)h->v[0]) heap_push(h, round_up_f32(upper), i);
                }
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

/* Exact scores of the candidates, b_i + x . w_i in float32 (as any float32 product computes
 * them, up to the order of the sums), and lower bounds on the float32 score recommend()'s product
 * computes: both evaluations are within gamma (|b_i| + ||x|| ||w_i||) of the real value, so the
 * bound subtracts twice that (widened by 1e-6 of itself and rounded down). Candidates with index
 * -1 get -inf. w is the float32 matrix (N x L). */
void g4r_rescore(int64_t B, int64_t L, int64_t m, const float *x, const float *w, const float *bias, const float *nw,
                 const int64_t *cand_idx, float *score, float *lower)
{
    const double G = (double)(L + 2) * U32 / (1.0 - (double)(L + 2) * U32);
    for (int64_t b = 0; b < B; b++) {
        const float *xb = x + b * L;
        double nx = 0.0;
        for (int64_t j = 0; j < L; j++) nx += (double)xb[j] * (double)xb[j];
        nx = sqrt(nx);
        for (int64_t k = b * m; k < (b + 1) * m; k++) {
            int64_t i = cand_idx[k];
            if (i < 0) {
                score[k] = -INFINITY;
                lower[k] = -INFINITY;
                continue;
            }
            const float *wi = w + i * L;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t j = 0; j < L; j++) s += xb[j] * wi[j];
            s += bias[i];
            double err = 2.0 * G * (fabs((double)bias[i]) + nx * (double)nw[i]);
            double lo = (double)s - err * (1.0 + 1e-6);
            float f = (float)lo;
            if ((double)f > lo) f = nextafterf(f, -INFINITY);
            score[k] = s;
            lower[k] = f;
        }
    }
}
