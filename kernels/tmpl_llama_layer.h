/* The pieces of a Llama decoder layer for one token that the other templates lack: attention of one
 * query row over a head's cached keys. Template: see instances.h; float only, as linear_q. The
 * layer's other stages are those templates' row kernels (rms_norm, silu_mul, linear_q, rope),
 * instantiated here too so that one call runs them all (llama_layer.h). */
#include "tmpl_rms_norm.h"
#include "tmpl_silu_mul.h"
#include "tmpl_linear_q.h"
/* rope without FMA contraction, as its own module is built (tmpl_rope.h says why) */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#include "tmpl_rope.h"
#pragma GCC pop_options
#if SA_TBYTES == 4

/* out (dh,) = softmax(scale q K^T) V for one query row q (dh,) over n keys: K, V (n, dh) rows of a
 * cache; s (n,) scratch for the weights. e^(s - max) is the vector exp of the attention kernels. */
static void SA_FN(sa_decode_head)(const SA_T *q, const SA_T *K, const SA_T *V, int64_t n, int64_t dh, SA_T scale,
                                  SA_T *s, SA_T *out) {
    const int64_t dv = dh - dh % SA_VL, nv = n - n % SA_VL;
    SA_T top = -INFINITY, sum = 0;
    for (int64_t t = 0; t < n; t++) {
        const SA_T *kt = K + t * dh;
        VEC acc = SA_FN(splat)(0);
        int64_t j = 0;
        for (; j < dv; j += SA_VL) acc += LOAD(q + j) * LOAD(kt + j);
        SA_T dot = SA_FN(hsum)(acc);
        for (; j < dh; j++) dot += q[j] * kt[j];
        s[t] = dot * scale;
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
        const SA_T *vt = V + t * dh;
        const VEC p = SA_FN(splat)(s[t]);
        int64_t j = 0;
        for (; j < dv; j += SA_VL) STORE(out + j, LOAD(out + j) + p * LOAD(vt + j));
        for (; j < dh; j++) out[j] += s[t] * vt[j];
    }
    const SA_T inv = 1 / sum;
    for (int64_t j = 0; j < dh; j++) out[j] *= inv;
}

#endif
