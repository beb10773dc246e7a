/* out_i (dh,) = softmax(scale q_i K^T) V for the G query rows q_i (q + i dh) of one K/V head over its
 * n keys: row t of K and V at K + t ldk, V + t ldk; keys with keep[t] == 0 (keep NULL: none) score
 * -1e9, as the reference hides them (a row with every key hidden averages them all). s (G, lds):
 * scratch for the weights; e^(s - max) is the vector exp of the attention kernels. The scores SA_VL
 * keys at a time (dots: one transpose for their sums), the weighted sum of V's rows in registers,
 * SA_QV4 vectors of out's columns a pass over the keys. A group's query heads (GQA) share each pass:
 * a block of keys or a row of values comes in once for all of them, where a call a head read the
 * head's K and V G times (the later reads from L2: K and V outgrow L1 past ~90 keys). Each head's
 * operations are a lone head's, in the same order: the same bits for any G.
 *
 * Included twice by tmpl_layer_step.h: SA_KV_HALF 0, K and V float32 (sa_decode_heads); 1, K and V
 * float16 bits (sa_decode_heads_h: a float16 KV cache), each row widened to float32 exactly as it
 * is read (a block of SA_VL keys into kb for the scores; a vector of a value row at a time), then
 * the float32 operations of the first copy: the result is the first copy's over the widened rows. */
#if SA_KV_HALF
#define SA_KV uint16_t
#define SA_KVN(name) name##_h
#define SA_KV_LOAD(p) SA_FN(load_half)(p)
#define SA_KV_AT(p) sa_f16_bits(*(p))
#else
#define SA_KV SA_T
#define SA_KVN(name) name
#define SA_KV_LOAD(p) LOAD(p)
#define SA_KV_AT(p) (*(p))
#endif
#define SA_KV_LINE (64 / (int)sizeof(SA_KV))  /* elements a cache line */

#define SA_QV4 4
#if SA_VBYTES == 64  /* heads a pass: SA_QG x SA_QV4 accumulators and SA_QV4 vectors of V's row */
#define SA_QG 4
#else
#define SA_QG 2
#endif

/* the scores pass for hc <= SA_QG heads (hc a constant where inlined): s_i = scale q_i K^T (hidden
 * keys -1e9), then s_i = e^(s_i - max s_i) and inv[i] = 1 / sum s_i */
static inline __attribute__((always_inline)) void SA_FN(SA_KVN(decode_weights))(const SA_T *q, int hc,
        const SA_KV *K, const SA_KV *V, int64_t ldk, int64_t n, int64_t dh, SA_T scale, const uint8_t *keep,
        SA_T *s, int64_t lds, SA_T *inv) {
    const int64_t nv = n - n % SA_VL;
    VEC tops[SA_QG];
#if SA_KV_HALF
    SA_T kb[SA_VL * dh];  /* a block of keys widened (dh <= 256: 16 KB at most) */
#endif
    for (int i = 0; i < hc; i++) tops[i] = SA_FN(splat)(-INFINITY);
    /* Rows asked for ahead: a lone stream of rows keeps few lines in flight, and the cache of a
     * batch's rows comes from memory. The first keys' rows before the loop, then the next keys' rows
     * and these keys' values, into L2 (locality 2): into L1 (3), the requests waited for L1's few
     * miss buffers: a C copy of this head over SmolLM2's caches (8 rows, from memory) read 8 GB/s on
     * one thread and 12-14 on two; into L2, 10-11 and 19-23 (Zen 4). */
    for (int64_t u = 0; u < SA_VL && u < n; u++)
        for (int64_t c = 0; c < dh; c += SA_KV_LINE) __builtin_prefetch(K + u * ldk + c, 0, 2);
    for (int64_t t = 0; t < nv; t += SA_VL) {
        for (int u = 0; u < SA_VL; u++)
            for (int64_t c = 0; c < dh; c += SA_KV_LINE) {
                if (t + SA_VL + u < n) __builtin_prefetch(K + (t + SA_VL + u) * ldk + c, 0, 2);
                __builtin_prefetch(V + (t + u) * ldk + c, 0, 2);
            }
#if SA_KV_HALF
        for (int u = 0; u < SA_VL; u++) SA_FN(widen_half)(K + (t + u) * ldk, kb + u * dh, dh);
        const SA_T *kt = kb;
        const int64_t ldt = dh;
#else
        const SA_T *kt = K + t * ldk;
        const int64_t ldt = ldk;
#endif
        for (int i = 0; i < hc; i++) {
            VEC v = SA_FN(dots)(q + i * dh, kt, ldt, dh) * scale;
            if (keep)
                for (int u = 0; u < SA_VL; u++) v[u] = keep[t + u] ? v[u] : (SA_T)-1e9;
            STORE(s + i * lds + t, v);
            tops[i] = SA_FN(vmax)(tops[i], v);
        }
    }
    for (int i = 0; i < hc; i++) {
        SA_T top = nv ? SA_FN(hmax)(tops[i]) : -INFINITY, *si = s + i * lds, sum = 0;
        int64_t t = nv;
        for (; t < n; t++) {
#if SA_KV_HALF
            SA_FN(widen_half)(K + t * ldk, kb, dh);
            const SA_T *kt = kb;
#else
            const SA_T *kt = K + t * ldk;
#endif
            si[t] = keep && !keep[t] ? (SA_T)-1e9 : SA_FN(dot)(q + i * dh, kt, dh) * scale;
            top = si[t] > top ? si[t] : top;
        }
        VEC sums = SA_FN(splat)(0);
        for (t = 0; t < nv; t += SA_VL) {
            const VEC e = SA_FN(expv)(LOAD(si + t) - top);
            STORE(si + t, e);
            sums += e;
        }
        for (; t < n; t++) {
            si[t] = SA_FN(expv)(SA_FN(splat)(si[t] - top))[0];
            sum += si[t];
        }
        sum += SA_FN(hsum)(sums);
        inv[i] = 1 / sum;
    }
}

/* out_i = inv[i] s_i V for hc <= SA_QG heads (hc a constant where inlined): each row of V read once for
 * them all, SA_QV4 vectors of the columns a pass over the keys */
static inline __attribute__((always_inline)) void SA_FN(SA_KVN(decode_values))(int hc, const SA_KV *V,
        int64_t ldk, int64_t n, int64_t dh, const SA_T *s, int64_t lds, const SA_T *inv, SA_T *out) {
    const int64_t dv = dh - dh % SA_VL;
    int64_t j0 = 0;
    for (; j0 + SA_QV4 * SA_VL <= dv; j0 += SA_QV4 * SA_VL) {
        VEC o[SA_QG][SA_QV4];
#pragma GCC unroll 4
        for (int i = 0; i < hc; i++)
#pragma GCC unroll 4
            for (int c = 0; c < SA_QV4; c++) o[i][c] = SA_FN(splat)(0);
        for (int64_t t = 0; t < n; t++) {
            const SA_KV *vt = V + t * ldk + j0;
            VEC v[SA_QV4];
#pragma GCC unroll 4
            for (int c = 0; c < SA_QV4; c++) v[c] = SA_KV_LOAD(vt + c * SA_VL);
#pragma GCC unroll 4
            for (int i = 0; i < hc; i++) {
                const VEC p = SA_FN(splat)(s[i * lds + t]);
#pragma GCC unroll 4
                for (int c = 0; c < SA_QV4; c++) o[i][c] += p * v[c];
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < hc; i++)
#pragma GCC unroll 4
            for (int c = 0; c < SA_QV4; c++) STORE(out + i * dh + j0 + c * SA_VL, o[i][c] * inv[i]);
    }
    for (int i = 0; i < hc; i++) {
        const SA_T *si = s + i * lds;
        SA_T *oi = out + i * dh;
        for (int64_t j = j0; j < dv; j += SA_VL) {  /* the vectors left, one a pass */
            VEC o = SA_FN(splat)(0);
            for (int64_t t = 0; t < n; t++) o += SA_FN(splat)(si[t]) * SA_KV_LOAD(V + t * ldk + j);
            STORE(oi + j, o * inv[i]);
        }
        for (int64_t j = dv; j < dh; j++) {  /* the columns left */
            SA_T o = 0;
            for (int64_t t = 0; t < n; t++) o += si[t] * SA_KV_AT(V + t * ldk + j);
            oi[j] = o * inv[i];
        }
    }
}

/* hc heads (a constant where inlined) through both passes */
static inline __attribute__((always_inline)) void SA_FN(SA_KVN(decode_chunk))(const SA_T *q, int hc,
        const SA_KV *K, const SA_KV *V, int64_t ldk, int64_t n, int64_t dh, SA_T scale, const uint8_t *keep,
        SA_T *s, int64_t lds, SA_T *out) {
    SA_T inv[SA_QG];
    SA_FN(SA_KVN(decode_weights))(q, hc, K, V, ldk, n, dh, scale, keep, s, lds, inv);
    SA_FN(SA_KVN(decode_values))(hc, V, ldk, n, dh, s, lds, inv, out);
}

static void SA_FN(SA_KVN(sa_decode_heads))(const SA_T *q, int64_t G, const SA_KV *K, const SA_KV *V,
                                           int64_t ldk, int64_t n, int64_t dh, SA_T scale, const uint8_t *keep,
                                           SA_T *s, int64_t lds, SA_T *out) {
    for (int64_t i = 0; i < G; i += SA_QG) {  /* SA_QG heads a chunk, the chunk's count a constant */
        const SA_T *qi = q + i * dh;
        SA_T *si = s + i * lds, *oi = out + i * dh;
        switch (G - i < SA_QG ? (int)(G - i) : SA_QG) {
        case 1: SA_FN(SA_KVN(decode_chunk))(qi, 1, K, V, ldk, n, dh, scale, keep, si, lds, oi); break;
#if SA_QG == 4
        case 3: SA_FN(SA_KVN(decode_chunk))(qi, 3, K, V, ldk, n, dh, scale, keep, si, lds, oi); break;
        case 4: SA_FN(SA_KVN(decode_chunk))(qi, 4, K, V, ldk, n, dh, scale, keep, si, lds, oi); break;
#endif
        default: SA_FN(SA_KVN(decode_chunk))(qi, 2, K, V, ldk, n, dh, scale, keep, si, lds, oi); break;
        }
    }
}
#undef SA_QG
#undef SA_QV4
#undef SA_KV
#undef SA_KVN
#undef SA_KV_LOAD
#undef SA_KV_AT
#undef SA_KV_LINE
