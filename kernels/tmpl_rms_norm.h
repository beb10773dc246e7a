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

/* rms_norm's backward for one row (y = g x r, r = 1 / sqrt(mean(x^2) + eps)): dx = r (G - x r^2
 * mean(G x)), G = g dy; dg += dy x r (the caller's partial sum of its block of rows) */
static void SA_FN(sa_rms_norm_back_row)(const SA_T *dy, const SA_T *x, const SA_T *g, SA_T eps, SA_T *dx,
                                        SA_T *dg, int64_t n) {
    const SA_T r = 1 / sqrt(SA_FN(sa_sum_squares)(x, n) / n + eps);
    const int64_t nv = n - n % SA_VL;
    VEC cv = SA_FN(splat)(0);
    int64_t j = 0;
    for (; j < nv; j += SA_VL) cv += LOAD(g + j) * LOAD(dy + j) * LOAD(x + j);
    SA_T c = SA_FN(hsum)(cv);
    for (; j < n; j++) c += g[j] * dy[j] * x[j];
    const SA_T k = r * r * r * c / n;
    for (j = 0; j < nv; j += SA_VL) {
        const VEC xv = LOAD(x + j), d = LOAD(dy + j);
        STORE(dx + j, r * LOAD(g + j) * d - xv * k);
        STORE(dg + j, LOAD(dg + j) + d * xv * r);
    }
    for (; j < n; j++) dx[j] = r * g[j] * dy[j] - x[j] * k, dg[j] += dy[j] * x[j] * r;
}
