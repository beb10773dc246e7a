/* y = x W for a few rows of x (a decoding step's projections). Template: see instances.h.
 * A matrix-vector product reads every weight once and does two flops with it, so it runs at the
 * speed memory streams W: the kernels walk W in its storage order (no transposed copies) and keep
 * the few rows of y in cache. */
#include "tmpl_simd.h"

/* y[r, :] += sum_{i0 <= i < i1} x[r, i] w[i, :] for the m rows of x; w: (k, n) row-major. Four rows
 * of w per pass over y, so y is loaded and stored once per four rows of w. */
static void SA_FN(sa_linear_rows)(const SA_T *x, int64_t ldx, int64_t m, const SA_T *w, int64_t n, int64_t i0,
                                  int64_t i1, SA_T *y) {
    const int64_t nv = n - n % SA_VL;
    int64_t i = i0;
    for (; i + 4 <= i1; i += 4) {
        const SA_T *w0 = w + i * n, *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n;
        for (int64_t r = 0; r < m; r++) {
            const SA_T *xr = x + r * ldx + i;
            const VEC a0 = SA_FN(splat)(xr[0]), a1 = SA_FN(splat)(xr[1]);
            const VEC a2 = SA_FN(splat)(xr[2]), a3 = SA_FN(splat)(xr[3]);
            SA_T *yr = y + r * n;
            int64_t c = 0;
            for (; c < nv; c += SA_VL)
                STORE(yr + c, LOAD(yr + c) + a0 * LOAD(w0 + c) + a1 * LOAD(w1 + c) + a2 * LOAD(w2 + c)
                              + a3 * LOAD(w3 + c));
            for (; c < n; c++) yr[c] += xr[0] * w0[c] + xr[1] * w1[c] + xr[2] * w2[c] + xr[3] * w3[c];
        }
    }
    for (; i < i1; i++) {
        const SA_T *wi = w + i * n;
        for (int64_t r = 0; r < m; r++) {
            const VEC a = SA_FN(splat)(x[r * ldx + i]);
            SA_T *yr = y + r * n;
            int64_t c = 0;
            for (; c < nv; c += SA_VL) STORE(yr + c, LOAD(yr + c) + a * LOAD(wi + c));
            for (; c < n; c++) yr[c] += x[r * ldx + i] * wi[c];
        }
    }
}

/* y[r, j0:j1] = x[r, :] . w[j, :] for the m rows of x; w: (n, k) row-major (y = x w^T): SA_VL
 * outputs at a time, their dot products summed by one transpose (lane_sums). */
static void SA_FN(sa_linear_dots)(const SA_T *x, int64_t ldx, int64_t m, const SA_T *w, int64_t k, int64_t j0,
                                  int64_t j1, SA_T *y, int64_t ldy) {
    int64_t j = j0;
    for (; j + SA_VL <= j1; j += SA_VL)
        for (int64_t r = 0; r < m; r++) STORE(y + r * ldy + j, SA_FN(dots)(x + r * ldx, w + j * k, k, k));
    for (; j < j1; j++)
        for (int64_t r = 0; r < m; r++) {
            SA_T s = 0;
            for (int64_t d = 0; d < k; d++) s += x[r * ldx + d] * w[j * k + d];
            y[r * ldy + j] = s;
        }
}
