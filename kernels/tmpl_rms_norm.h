/* rms_norm of one row: out = g * x / sqrt(mean(x^2) + eps). Template: see instances.h.
 * A plain sum of squares is exact enough here (no mean is subtracted, so nothing cancels): every
 * term is positive and the four accumulators of SA_VL lanes each keep the rounding of a long row
 * to a few ulp, as the reference's pairwise float32 mean does. */
#include "tmpl_simd.h"

/* sum of x^2 over a row of n: four independent accumulators (one alone is a chain of dependent
 * FMAs, 4 cycles each) */
static inline SA_T SA_FN(sa_sum_squares)(const SA_T *x, int64_t n) {
    const int64_t nv = n - n % SA_VL, n4 = n - n % (4 * SA_VL);
    const VEC z = SA_FN(splat)(0);
    VEC q0 = z, q1 = z, q2 = z, q3 = z;
    int64_t j;
    for (j = 0; j < n4; j += 4 * SA_VL) {
        VEC a0 = LOAD(x + j), a1 = LOAD(x + j + SA_VL), a2 = LOAD(x + j + 2 * SA_VL), a3 = LOAD(x + j + 3 * SA_VL);
        q0 += a0 * a0; q1 += a1 * a1; q2 += a2 * a2; q3 += a3 * a3;
    }
    for (; j < nv; j += SA_VL) { VEC a = LOAD(x + j); q0 += a * a; }
    SA_T s = SA_FN(hsum)((q0 + q1) + (q2 + q3));
    for (; j < n; j++) s += x[j] * x[j];
    return s;
}

/* out = x * rstd * g, rstd = 1 / sqrt(ss / n + eps): the row's scale from its sum of squares ss */
static inline void SA_FN(sa_rms_scale)(const SA_T *x, const SA_T *g, SA_T ss, SA_T eps, SA_T *out, int64_t n) {
    const SA_T rstd = 1 / sqrt(ss / n + eps);
    const int64_t nv = n - n % SA_VL;
    int64_t j;
    for (j = 0; j < nv; j += SA_VL) STORE(out + j, LOAD(x + j) * rstd * LOAD(g + j));
    for (; j < n; j++) out[j] = x[j] * rstd * g[j];
}

static void SA_FN(sa_rms_norm_row)(const SA_T *x, const SA_T *g, SA_T eps, SA_T *out, int64_t n) {
    SA_FN(sa_rms_scale)(x, g, SA_FN(sa_sum_squares)(x, n), eps, out, n);
}

/* s = x + r (the residual add) and out = rms_norm(s): the squares summed as s is written, so the
 * second pass reads s from L1 */
static void SA_FN(sa_add_rms_norm_row)(const SA_T *x, const SA_T *r, const SA_T *g, SA_T eps, SA_T *s,
                                       SA_T *out, int64_t n) {
    const int64_t nv = n - n % SA_VL, n2 = n - n % (2 * SA_VL);
    const VEC z = SA_FN(splat)(0);
    VEC q0 = z, q1 = z;
    int64_t j;
    for (j = 0; j < n2; j += 2 * SA_VL) {
        VEC a0 = LOAD(x + j) + LOAD(r + j), a1 = LOAD(x + j + SA_VL) + LOAD(r + j + SA_VL);
        STORE(s + j, a0); STORE(s + j + SA_VL, a1);
        q0 += a0 * a0; q1 += a1 * a1;
    }
    for (; j < nv; j += SA_VL) { VEC a = LOAD(x + j) + LOAD(r + j); STORE(s + j, a); q0 += a * a; }
    SA_T ss = SA_FN(hsum)(q0 + q1);
    for (; j < n; j++) { s[j] = x[j] + r[j]; ss += s[j] * s[j]; }
    SA_FN(sa_rms_scale)(s, g, ss, eps, out, n);
}
