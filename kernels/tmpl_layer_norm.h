/* layer_norm of one row: out = g * (x - mean) / sqrt(var + eps) + b. Template: see instances.h.
 * Never a one-pass sum of squares (it cancels in float32): pass 1 finds a rough mean m0; pass 2
 * sums the exactly representable shifts d = x - m0 and their squares, so
 *   mean = m0 + delta, delta = sum(d) / n,   var = sum(d^2) / n - delta^2,
 * with delta tiny; pass 3 writes ((x - m0) - delta) / sqrt(var + eps), never rounding the mean
 * itself to a float32 (at a mean of 1e4 that alone would cost 5e-4). */
#include "tmpl_simd.h"

/* No software prefetch: a row is a plain forward stream, and prefetching the next rows while this one
 * sat in L1 (tuned on Zen 3) was slower than the hardware prefetcher alone on Zen 4.
 * Four independent accumulators per sum: one alone makes each pass a chain of dependent adds
 * (4 cycles each) and left the op compute-bound. */
static void SA_FN(sa_layer_norm_row)(const SA_T *x, const SA_T *g, const SA_T *b, SA_T eps,
                                     SA_T *out, int64_t n) {
    const int64_t nv = n - n % SA_VL, n4 = n - n % (4 * SA_VL);
    const VEC z = SA_FN(splat)(0);
    VEC a0 = z, a1 = z, a2 = z, a3 = z, q0 = z, q1 = z, q2 = z, q3 = z;
    int64_t j;
    for (j = 0; j < n4; j += 4 * SA_VL) {
        a0 += LOAD(x + j); a1 += LOAD(x + j + SA_VL);
        a2 += LOAD(x + j + 2 * SA_VL); a3 += LOAD(x + j + 3 * SA_VL);
    }
    for (; j < nv; j += SA_VL) a0 += LOAD(x + j);
    SA_T s = SA_FN(hsum)((a0 + a1) + (a2 + a3)), s2;
    for (; j < n; j++) s += x[j];
    const SA_T m0 = s / n;
    a0 = a1 = a2 = a3 = z;
    for (j = 0; j < n4; j += 4 * SA_VL) {
        VEC d0 = LOAD(x + j) - m0, d1 = LOAD(x + j + SA_VL) - m0;
        VEC d2 = LOAD(x + j + 2 * SA_VL) - m0, d3 = LOAD(x + j + 3 * SA_VL) - m0;
        a0 += d0; a1 += d1; a2 += d2; a3 += d3;
        q0 += d0 * d0; q1 += d1 * d1; q2 += d2 * d2; q3 += d3 * d3;
    }
    for (; j < nv; j += SA_VL) { VEC d = LOAD(x + j) - m0; a0 += d; q0 += d * d; }
    s = SA_FN(hsum)((a0 + a1) + (a2 + a3)), s2 = SA_FN(hsum)((q0 + q1) + (q2 + q3));
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

/* layer_norm's backward for one row (y = g xh + b, xh = (x - mean) / sigma, sigma = sqrt(var + eps)):
 * dx = (G - mean(G) - xh mean(G xh)) / sigma, G = g dy; dg += dy xh and db += dy (the caller's
 * partial sums of its block of rows). The mean and variance in two passes, as the reference's. */
static void SA_FN(sa_layer_norm_back_row)(const SA_T *dy, const SA_T *x, const SA_T *g, SA_T eps, SA_T *dx,
                                          SA_T *dg, SA_T *db, int64_t n) {
    const int64_t nv = n - n % SA_VL;
    const VEC z = SA_FN(splat)(0);
    VEC a = z, q = z, gs = z, gx = z;
    int64_t j;
    for (j = 0; j < nv; j += SA_VL) a += LOAD(x + j);
    SA_T s = SA_FN(hsum)(a);
    for (; j < n; j++) s += x[j];
    const SA_T mean = s / n;
    for (j = 0; j < nv; j += SA_VL) {
        const VEC d = LOAD(x + j) - mean, G = LOAD(g + j) * LOAD(dy + j);
        q += d * d, gs += G, gx += G * d;
    }
    SA_T s2 = SA_FN(hsum)(q), sg = SA_FN(hsum)(gs), sgx = SA_FN(hsum)(gx);
    for (; j < n; j++) {
        const SA_T d = x[j] - mean, G = g[j] * dy[j];
        s2 += d * d, sg += G, sgx += G * d;
    }
    const SA_T inv = 1 / sqrt(s2 / n + eps), mg = sg / n, mgx = sgx * inv / n;
    for (j = 0; j < nv; j += SA_VL) {
        const VEC xh = (LOAD(x + j) - mean) * inv, d = LOAD(dy + j);
        STORE(dx + j, (LOAD(g + j) * d - mg - xh * mgx) * inv);
        STORE(dg + j, LOAD(dg + j) + d * xh), STORE(db + j, LOAD(db + j) + d);
    }
    for (; j < n; j++) {
        const SA_T xh = (x[j] - mean) * inv;
        dx[j] = (g[j] * dy[j] - mg - xh * mgx) * inv, dg[j] += dy[j] * xh, db[j] += dy[j];
    }
}
