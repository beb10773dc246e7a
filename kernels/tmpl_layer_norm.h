/* layer_norm of one row: out = g * (x - mean) / sqrt(var + eps) + b. Template: see instances.h.
 * Never a one-pass sum of squares (it cancels in float32): pass 1 finds a rough mean m0; pass 2
 * sums the exactly representable shifts d = x - m0 and their squares, so
 *   mean = m0 + delta, delta = sum(d) / n,   var = sum(d^2) / n - delta^2,
 * with delta tiny; pass 3 writes ((x - m0) - delta) / sqrt(var + eps), never rounding the mean
 * itself to a float32 (at a mean of 1e4 that alone would cost 5e-4). */
#include "tmpl_simd.h"

static void SA_FN(sa_layer_norm_row)(const SA_T *x, const SA_T *g, const SA_T *b, SA_T eps,
                                     SA_T *out, int64_t n) {
    int64_t j, nv = n - n % SA_VL;
    VEC acc = SA_FN(splat)(0), acc2;
    for (j = 0; j < nv; j += SA_VL) acc += LOAD(x + j);
    SA_T s = SA_FN(hsum)(acc), s2;
    for (; j < n; j++) s += x[j];
    const SA_T m0 = s / n;
    acc = acc2 = SA_FN(splat)(0);
    for (j = 0; j < nv; j += SA_VL) { VEC d = LOAD(x + j) - m0; acc += d; acc2 += d * d; }
    s = SA_FN(hsum)(acc), s2 = SA_FN(hsum)(acc2);
    for (; j < n; j++) { SA_T d = x[j] - m0; s += d; s2 += d * d; }
    const SA_T delta = s / n, var = s2 / n - delta * delta;
    const SA_T rstd = 1 / sqrt((var > 0 ? var : 0) + eps);
    for (j = 0; j < nv; j += SA_VL)
        STORE(out + j, ((LOAD(x + j) - m0) - delta) * rstd * LOAD(g + j) + LOAD(b + j));
    for (; j < n; j++) out[j] = ((x[j] - m0) - delta) * rstd * g[j] + b[j];
}

/* s = x + r for one row (the residual add), left in cache for the layer norm that follows */
static void SA_FN(sa_add_row)(const SA_T *x, const SA_T *r, SA_T *s, int64_t n) {
    int64_t j, nv = n - n % SA_VL;
    for (j = 0; j < nv; j += SA_VL) STORE(s + j, LOAD(x + j) + LOAD(r + j));
    for (; j < n; j++) s[j] = x[j] + r[j];
}
