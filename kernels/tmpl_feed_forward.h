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

/* dz = dh gelu'(z), gelu'(z) = Phi(z) + z phi(z) = (1 + erf(z / sqrt 2)) / 2 + z e^(-z^2 / 2) / sqrt(2 pi),
 * for one row of n (dz may be dh); the tail through a padded vector, as above. */
static inline VEC SA_FN(gelu_slope)(VEC z) {
    const SA_T r = (SA_T)0.70710678118654752440, c = (SA_T)0.39894228040143267794;
    VEC e = -(z * z) * (SA_T)0.5;
    e = SA_FN(select)(e < SA_FN(splat)(-80), SA_FN(splat)(-80), e);  /* e^-80 z is 0 in float32, tiny in double */
    return (1 + SA_FN(erfv)(z * r)) * (SA_T)0.5 + z * SA_FN(expv)(e) * c;
}

static void SA_FN(sa_gelu_back_row)(const SA_T *dh, const SA_T *z, SA_T *dz, int64_t n) {
    int64_t j = 0;
    for (; j + SA_VL <= n; j += SA_VL) STORE(dz + j, LOAD(dh + j) * SA_FN(gelu_slope)(LOAD(z + j)));
    if (j < n) {
        VEC v = SA_FN(splat)(0);
        for (int64_t i = j; i < n; i++) v[i - j] = z[i];
        v = SA_FN(gelu_slope)(v);
        for (int64_t i = j; i < n; i++) dz[i] = dh[i] * v[i - j];
    }
}
