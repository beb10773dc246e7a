/* The feed-forward's elementwise steps. Template: see instances.h. */
#include "tmpl_simd.h"

/* erf on every lane. float: a rational approximation (odd numerator of degree 13, even denominator
 * of degree 8, on x clamped to [-4, 4], where erf is within half an ulp of +-1; the monomial
 * coefficients are those of Eigen's and XLA's fast float erf; measured here within 4.2e-7 of
 * erf); double: libm's erf lane by lane. NaN stays NaN. */
static inline VEC SA_FN(erfv)(VEC x) {
#if SA_TBYTES == 4
    const VEC hi = SA_FN(splat)(4), lo = SA_FN(splat)(-4);
    x = SA_FN(select)(x > hi, hi, x);
    x = SA_FN(select)(x < lo, lo, x);
    const VEC x2 = x * x;
    VEC p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
    p = p * x2 - 2.10102402082508e-06f;
    p = p * x2 - 5.69250639462346e-05f;
    p = p * x2 - 7.34990630326855e-04f;
    p = p * x2 - 2.95459980854025e-03f;
    p = p * x2 - 1.60960333262415e-02f;
    VEC q = x2 * -1.45660718464996e-05f - 2.13374055278905e-04f;
    q = q * x2 - 1.68282697438203e-03f;
    q = q * x2 - 7.37332916720468e-03f;
    q = q * x2 - 1.42647390514189e-02f;
    return x * p / q;
#else
    for (int i = 0; i < SA_VL; i++) x[i] = erf(x[i]);
    return x;
#endif
}

/* h = gelu(h + b) = v (1 + erf(v / sqrt 2)) / 2 with v = h + b, for one row of n, in place. The
 * tail that is not a whole vector goes through a padded vector. */
static void SA_FN(sa_bias_gelu_row)(SA_T *h, const SA_T *b, int64_t n) {
    const SA_T r = (SA_T)0.70710678118654752440;
    int64_t j = 0;
    for (; j + SA_VL <= n; j += SA_VL) {
        const VEC v = LOAD(h + j) + LOAD(b + j);
        STORE(h + j, v * (1 + SA_FN(erfv)(v * r)) * (SA_T)0.5);
    }
    if (j < n) {
        VEC v = SA_FN(splat)(0);
        for (int64_t i = j; i < n; i++) v[i - j] = h[i] + b[i];
        v = v * (1 + SA_FN(erfv)(v * r)) * (SA_T)0.5;
        for (int64_t i = j; i < n; i++) h[i] = v[i - j];
    }
}
