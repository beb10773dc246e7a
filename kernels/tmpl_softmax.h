/* softmax of one row: out = exp(x - max x) / sum exp(x - max x). Template: see instances.h. */
#include "tmpl_simd.h"

static void SA_FN(sa_softmax_row)(const SA_T *x, SA_T *out, int64_t n) {
    int64_t j = 0, nv = n - n % SA_VL;
    VEC mv = SA_FN(splat)(-INFINITY);
    for (; j < nv; j += SA_VL) mv = SA_FN(vmax)(LOAD(x + j), mv);
    SA_T m = SA_FN(hmax)(mv);
    for (; j < n; j++) m = x[j] > m ? x[j] : m;
    VEC sv = SA_FN(splat)(0);
    for (j = 0; j < nv; j += SA_VL) {
        VEC e = SA_FN(expv)(LOAD(x + j) - m);
        STORE(out + j, e);
        sv += e;
    }
    SA_T s = SA_FN(hsum)(sv);
    for (; j < n; j++) s += (out[j] = SA_FN(expv)(SA_FN(splat)(x[j] - m))[0]);
    SA_T r = 1 / s;
    for (j = 0; j < nv; j += SA_VL) STORE(out + j, LOAD(out + j) * r);
    for (; j < n; j++) out[j] *= r;
}

/* softmax's backward for one row: dx = y (dy - sum_j dy_j y_j) (y = softmax(x); dx may be dy) */
static void SA_FN(sa_softmax_back_row)(const SA_T *dy, const SA_T *y, SA_T *dx, int64_t n) {
    const int64_t nv = n - n % SA_VL;
    const SA_T c = SA_FN(dot)(dy, y, n);
    int64_t j = 0;
    for (; j < nv; j += SA_VL) STORE(dx + j, LOAD(y + j) * (LOAD(dy + j) - c));
    for (; j < n; j++) dx[j] = y[j] * (dy[j] - c);
}
