/* The pieces of a decoder layer's step for one token that the other templates lack: attention of one
 * query row over cached keys, and the sum of a float32 product's partial results. Template:
 * see instances.h; float only, as linear_q. The step's other stages are those templates' row
 * kernels (rms_norm, layer_norm, silu_mul, linear_q, rope), instantiated here too so that one call
 * runs them all (layer_step.h). */
#include "tmpl_rms_norm.h"
#include "tmpl_layer_norm.h"
#include "tmpl_silu_mul.h"
#include "tmpl_linear_q.h"
#include "tmpl_linear.h"
/* rope without FMA contraction, as its own module is built (tmpl_rope.h says why) */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#include "tmpl_rope.h"
#pragma GCC pop_options
#if SA_TBYTES == 4

/* out (dh,) = softmax(scale q K^T) V for one query row q (dh,) over n keys: row t of K and V at
 * K + t ldk, V + t ldk; keys with keep[t] == 0 (keep NULL: none) score -1e9, as the reference
 * hides them (a row with every key hidden averages them all). s (n,): scratch for the weights;
 * e^(s - max) is the vector exp of the attention kernels. */
static void SA_FN(sa_decode_head)(const SA_T *q, const SA_T *K, const SA_T *V, int64_t ldk, int64_t n, int64_t dh,
                                  SA_T scale, const uint8_t *keep, SA_T *s, SA_T *out) {
    const int64_t dv = dh - dh % SA_VL, nv = n - n % SA_VL;
    SA_T top = -INFINITY, sum = 0;
    for (int64_t t = 0; t < n; t++) {
        const SA_T *kt = K + t * ldk;
        VEC acc = SA_FN(splat)(0);
        int64_t j = 0;
        for (; j < dv; j += SA_VL) acc += LOAD(q + j) * LOAD(kt + j);
        SA_T dot = SA_FN(hsum)(acc);
        for (; j < dh; j++) dot += q[j] * kt[j];
        s[t] = keep && !keep[t] ? (SA_T)-1e9 : dot * scale;
        top = s[t] > top ? s[t] : top;
    }
    VEC sums = SA_FN(splat)(0);
    int64_t t = 0;
    for (; t < nv; t += SA_VL) {
        const VEC e = SA_FN(expv)(LOAD(s + t) - top);
        STORE(s + t, e);
        sums += e;
    }
    for (; t < n; t++) {
        s[t] = SA_FN(expv)(SA_FN(splat)(s[t] - top))[0];
        sum += s[t];
    }
    sum += SA_FN(hsum)(sums);
    for (int64_t j = 0; j < dh; j++) out[j] = 0;
    for (t = 0; t < n; t++) {
        const SA_T *vt = V + t * ldk;
        const VEC p = SA_FN(splat)(s[t]);
        int64_t j = 0;
        for (; j < dv; j += SA_VL) STORE(out + j, LOAD(out + j) + p * LOAD(vt + j));
        for (; j < dh; j++) out[j] += s[t] * vt[j];
    }
    const SA_T inv = 1 / sum;
    for (int64_t j = 0; j < dh; j++) out[j] *= inv;
}

/* y[j] = (r[j] +) act(b[j] + sum_t parts[t n + j]) for j0 <= j < j1: the T threads' partial products
 * (each x . w over its share of w's rows, sa_linear_rows) added up; act: max(0, .) if relu (NaN stays
 * NaN); r and b may be NULL; r may be y (a residual add in place: each y[j] is read, then written). */
static void SA_FN(sa_sum_parts)(const SA_T *parts, int T, int64_t n, const SA_T *b, const SA_T *r, int relu,
                                int64_t j0, int64_t j1, SA_T *y) {
    int64_t j = j0;
    for (; j + SA_VL <= j1; j += SA_VL) {
        VEC v = b ? LOAD(b + j) : SA_FN(splat)(0);
        for (int t = 0; t < T; t++) v += LOAD(parts + t * n + j);
        if (relu) v = SA_FN(select)(v < SA_FN(splat)(0), SA_FN(splat)(0), v);
        if (r) v += LOAD(r + j);
        STORE(y + j, v);
    }
    for (; j < j1; j++) {
        SA_T v = b ? b[j] : 0;
        for (int t = 0; t < T; t++) v += parts[t * n + j];
        if (relu) v = v < 0 ? 0 : v;
        y[j] = (r ? r[j] : 0) + v;
    }
}

#endif
