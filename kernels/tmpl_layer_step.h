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
 * e^(s - max) is the vector exp of the attention kernels. The scores SA_VL keys at a time (dots:
 * one transpose for their sums), the weighted sum of V's rows in registers, SA_QV4 vectors of
 * out's columns a pass over the keys. */
#define SA_QV4 4
static void SA_FN(sa_decode_head)(const SA_T *q, const SA_T *K, const SA_T *V, int64_t ldk, int64_t n, int64_t dh,
                                  SA_T scale, const uint8_t *keep, SA_T *s, SA_T *out) {
    const int64_t dv = dh - dh % SA_VL, nv = n - n % SA_VL;
    VEC tops = SA_FN(splat)(-INFINITY);
    int64_t t = 0;
    /* Rows asked for ahead: a lone stream of rows keeps few lines in flight, and the cache of a
     * batch's rows comes from memory. The first keys' rows before the loop, then the next keys' rows
     * and these keys' values, into L2 (locality 2): into L1 (3), the requests waited for L1's few
     * miss buffers: a C copy of this head over SmolLM2's caches (8 rows, from memory) read 8 GB/s on
     * one thread and 12-14 on two; into L2, 10-11 and 19-23 (Zen 4). */
    for (int64_t u = 0; u < SA_VL && u < n; u++)
        for (int64_t c = 0; c < dh; c += 64 / SA_TBYTES) __builtin_prefetch(K + u * ldk + c, 0, 2);
    for (; t < nv; t += SA_VL) {
        for (int u = 0; u < SA_VL; u++)
            for (int64_t c = 0; c < dh; c += 64 / SA_TBYTES) {
                if (t + SA_VL + u < n) __builtin_prefetch(K + (t + SA_VL + u) * ldk + c, 0, 2);
                __builtin_prefetch(V + (t + u) * ldk + c, 0, 2);
            }
        VEC v = SA_FN(dots)(q, K + t * ldk, ldk, dh) * scale;
        if (keep)
            for (int u = 0; u < SA_VL; u++) v[u] = keep[t + u] ? v[u] : (SA_T)-1e9;
        STORE(s + t, v);
        tops = SA_FN(vmax)(tops, v);
    }
    SA_T top = nv ? SA_FN(hmax)(tops) : -INFINITY;
    for (; t < n; t++) {
        s[t] = keep && !keep[t] ? (SA_T)-1e9 : SA_FN(dot)(q, K + t * ldk, dh) * scale;
        top = s[t] > top ? s[t] : top;
    }
    VEC sums = SA_FN(splat)(0);
    SA_T sum = 0;
    for (t = 0; t < nv; t += SA_VL) {
        const VEC e = SA_FN(expv)(LOAD(s + t) - top);
        STORE(s + t, e);
        sums += e;
    }
    for (; t < n; t++) {
        s[t] = SA_FN(expv)(SA_FN(splat)(s[t] - top))[0];
        sum += s[t];
    }
    sum += SA_FN(hsum)(sums);
    const SA_T inv = 1 / sum;
    int64_t j0 = 0;
    for (; j0 + SA_QV4 * SA_VL <= dv; j0 += SA_QV4 * SA_VL) {  /* SA_QV4 vectors of out in registers */
        VEC o[SA_QV4];
#pragma GCC unroll 4
        for (int c = 0; c < SA_QV4; c++) o[c] = SA_FN(splat)(0);
        for (t = 0; t < n; t++) {
            const VEC p = SA_FN(splat)(s[t]);
            const SA_T *vt = V + t * ldk + j0;
#pragma GCC unroll 4
            for (int c = 0; c < SA_QV4; c++) o[c] += p * LOAD(vt + c * SA_VL);
        }
#pragma GCC unroll 4
        for (int c = 0; c < SA_QV4; c++) STORE(out + j0 + c * SA_VL, o[c] * inv);
    }
    for (; j0 < dv; j0 += SA_VL) {  /* the vectors left, one a pass */
        VEC o = SA_FN(splat)(0);
        for (t = 0; t < n; t++) o += SA_FN(splat)(s[t]) * LOAD(V + t * ldk + j0);
        STORE(out + j0, o * inv);
    }
    for (int64_t j = dv; j < dh; j++) {  /* the columns left */
        SA_T o = 0;
        for (t = 0; t < n; t++) o += s[t] * V[t * ldk + j];
        out[j] = o * inv;
    }
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
