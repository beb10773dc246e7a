/* y = x W^T (+ b) for W held as GGUF blocks (silkattn.quant), a few rows of x: a decoding step's
 * projections read 5 or 8.5 bits a weight instead of 32. Template: see instances.h; float only (the
 * op has no double kernel), so the double instances are empty.
 *
 * Row j of W is k / 32 blocks of 32 weights, each a float16 scale d (and offset c) with 32 small
 * integers q (reference.dequantize). Per block and row of x, x . w = d (x . q) + c sum(x), with
 * c = m for Q4_1, -8 d for Q4_0 (w = d (q - 8)), none for Q8_0: the q are converted to float and
 * multiplied with x, scaled by d, and the offsets come from the block sums of x, made once per call
 * (sa_linear_q_xsum), 16 blocks' worth in one vector product. Each block is loaded and converted
 * once for all the rows of x, J rows of W in flight (J m chains of FMAs hide each other's latency),
 * the accumulators in registers: the row count and the block type are compile-time constants of
 * each of the 24 loops of sa_linear_q_rows' switch. Scales are converted 16 at a time (one gather,
 * F16C) into a buffer the products broadcast them from (a load, not a shuffle), and the next rows
 * are prefetched: with J rows a pass, the hardware prefetcher alone falls behind on a big W.
 * With int8 activations (QuantizedMatrix.activations, reference.round_q8) x is first rounded to
 * 8-bit q a block, and each block's product is an integer one (sa_q8_group, below). */
#include "quant_blocks.h"
#include "tmpl_simd.h"
#if SA_TBYTES == 4

#ifndef SA_QV
#define SA_QV (32 / SA_VL)  /* vectors of a block's 32 weights */
#define SA_QPF 2            /* passes (of J rows of W) the prefetches run ahead */
#define SA_QLOC 1           /* prefetch hint 1: into L2 (prefetcht2), not L1, leaving the L1 its miss buffers */
/* the rows of W in flight per pass for M rows of x: at most 16 accumulators on AVX-512's 32
 * registers, 8 on AVX2's 16 */
#define SA_QJ(M) ((M) <= 2 ? 4 : (M) <= 4 ? (SA_VBYTES == 64 ? 4 : 2) : (SA_VBYTES == 64 ? 2 : 1))
#endif

#if !(SA_X86 && SA_VBYTES > 16)  /* the x86 copies convert with F16C (sa_q_scales) */
/* The float16 of bits h as a float: by its bits (sign, 5-bit exponent biased 15, 10-bit fraction). */
static inline SA_T SA_FN(sa_half)(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, f = h & 1023;
    uint32_t bits;
    if (e == 31) {
        bits = sign | 0x7f800000u | f << 13;  /* inf, NaN */
    } else if (e) {
        bits = sign | (e + 112) << 23 | f << 13;  /* normal: the exponent rebiased to 127 */
    } else {
        const float v = (float)f * 0x1p-24f;  /* subnormal or 0: f 2^-24, exactly */
        memcpy(&bits, &v, 4);
        bits |= sign;
    }
    float r;
    memcpy(&r, &bits, 4);
    return r;
}
#endif

/* 16 lanes with AVX-512: 4-bit q through a table (sa_q4) */
#undef SA_QTABLE
#if SA_X86 && SA_VBYTES / SA_TBYTES == 16 && defined(__AVX512F__)
#define SA_QTABLE 1
#else
#define SA_QTABLE 0
#endif

/* The SA_VL bytes at p (any address: blocks are 18, 20 or 34 bytes, nothing is aligned) as int32
 * lanes, zero-extended (u8) or sign-extended (i8): one vpmovzxbd / vpmovsxbd on x86. */
#if SA_QTABLE
static inline IVEC SA_FN(sa_u8)(const uint8_t *p) { return (IVEC)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline IVEC SA_FN(sa_i8)(const uint8_t *p) { return (IVEC)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }
#elif SA_X86 && SA_VBYTES / SA_TBYTES >= 8  /* AVX2: 8 lanes a half-register of 32 bytes */
#define SA_QWIDEN(name, op)                                                                             \
    static inline IVEC SA_FN(name)(const uint8_t *p) {                                                  \
        union { IVEC v; __m256i h[SA_VL / 8]; } u;                                                      \
        for (int i = 0; i < SA_VL / 8; i++) u.h[i] = op(_mm_loadl_epi64((const __m128i *)(p + 8 * i))); \
        return u.v;                                                                                     \
    }
SA_QWIDEN(sa_u8, _mm256_cvtepu8_epi32)
SA_QWIDEN(sa_i8, _mm256_cvtepi8_epi32)
#undef SA_QWIDEN
#else  /* generic (4 lanes): the bytes of one 32-bit word shifted into place */
typedef uint32_t SA_FN(uivec) __attribute__((vector_size(SA_VBYTES)));
static inline uint32_t SA_FN(sa_word)(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline IVEC SA_FN(sa_u8)(const uint8_t *p) {
    const uint32_t w = SA_FN(sa_word)(p);
    return (IVEC)(((SA_FN(uivec)){w, w, w, w} >> (SA_FN(uivec)){0, 8, 16, 24}) & 255);
}
static inline IVEC SA_FN(sa_i8)(const uint8_t *p) {
    const uint32_t w = SA_FN(sa_word)(p);
    return (IVEC)((SA_FN(uivec)){w, w, w, w} << (SA_FN(uivec)){24, 16, 8, 0}) >> 24;  /* arithmetic shift */
}
#endif

/* The q of a 4-bit block (p: its 16 bytes; byte i holds q_i low, q_(i + 16) high) as SA_QV vectors;
 * with SA_QTABLE, d q (dv: d in every lane). */
static inline __attribute__((always_inline)) void SA_FN(sa_q4)(const uint8_t *p, VEC *q, VEC dv) {
#if SA_QTABLE
    /* the bytes widened once; each nibble picks its d q from a 16-entry table (vpermps reads the
     * low 4 bits of an index): no masking, no conversion, one product for the 32 weights */
    const VEC table = dv * (VEC){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const IVEC i = SA_FN(sa_u8)(p);
    q[0] = __builtin_shuffle(table, i);
    q[1] = __builtin_shuffle(table, i >> 4);
#else
    (void)dv;
#pragma GCC unroll 8
    for (int v = 0; v < SA_QV; v++) {
        const IVEC b = SA_FN(sa_u8)(p + v * SA_VL % 16);
        q[v] = __builtin_convertvector(v * SA_VL < 16 ? b & 15 : b >> 4, VEC);
    }
#endif
}

/* The q of a Q8_0 block (p: its 32 int8) as SA_QV vectors. */
static inline __attribute__((always_inline)) void SA_FN(sa_q8)(const uint8_t *p, VEC *q) {
#pragma GCC unroll 8
    for (int v = 0; v < SA_QV; v++) q[v] = __builtin_convertvector(SA_FN(sa_i8)(p + v * SA_VL), VEC);
}

/* The sum of v's lanes: halves folded onto each other by shuffles (log2 SA_VL adds, in registers). */
static inline SA_T SA_FN(sa_qhsum)(VEC v) {
#if SA_VBYTES / SA_TBYTES == 16
    v += __builtin_shuffle(v, (IVEC){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
#endif
#if SA_VBYTES / SA_TBYTES >= 8
    v += __builtin_shuffle(v, (IVEC){4, 5, 6, 7, 0, 1, 2, 3});
#endif
    v += __builtin_shuffle(v, (IVEC){2, 3, 0, 1});
    return v[0] + v[1];
}

/* x in every lane (a broadcast; splat's 0 + x costs an add, kept for -0) */
static inline VEC SA_FN(sa_qsplat)(SA_T x) { return __builtin_shuffle((VEC){x}, (IVEC){0}); }

/* The scales d (and offsets c, unless Q8_0) of nc <= SA_QCH blocks from p as floats; zeros after. */
static inline __attribute__((always_inline)) void SA_FN(sa_q_scales)(const int kind, const uint8_t *p, int nc,
                                                                     SA_T *d, SA_T *c) {
    const int bytes = SA_QBYTES(kind);
#if SA_X86 && SA_VBYTES > 16 && defined(__AVX512F__)
    /* one gather of the blocks' first 4 bytes (d, then m or q), F16C on the 16 halves of each kind */
    const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(bytes));
    const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), (__mmask16)((1u << nc) - 1), at, p, 1);
    _mm512_store_ps(d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
    if (kind == SA_Q4_1) _mm512_store_ps(c, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16))));
#elif SA_X86 && SA_VBYTES > 16  /* AVX2: 8 at a time */
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i at = _mm256_mullo_epi32(lane, _mm256_set1_epi32(bytes)), low = _mm256_set1_epi32(0xffff);
    for (int h = 0; h < SA_QCH; h += 8) {
        __m256i g = _mm256_setzero_si256();
        if (nc > h)  /* the lanes past nc are not read */
            g = _mm256_mask_i32gather_epi32(g, (const int *)(p + h * bytes), at,
                                            _mm256_cmpgt_epi32(_mm256_set1_epi32(nc - h), lane), 1);
        const __m256i dh = _mm256_and_si256(g, low), ch = _mm256_srli_epi32(g, 16);
        _mm256_store_ps(d + h, _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(dh),
                                                                _mm256_extracti128_si256(dh, 1))));
        if (kind == SA_Q4_1)
            _mm256_store_ps(c + h, _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(ch),
                                                                    _mm256_extracti128_si256(ch, 1))));
    }
#else
    for (int i = 0; i < SA_QCH; i++) {
        d[i] = i < nc ? SA_FN(sa_half)((uint16_t)(p[i * bytes] | p[i * bytes + 1] << 8)) : 0;
        if (kind == SA_Q4_1) c[i] = i < nc ? SA_FN(sa_half)((uint16_t)(p[i * bytes + 2] | p[i * bytes + 3] << 8)) : 0;
    }
#endif
    if (kind == SA_Q4_0)
        for (int i = 0; i < SA_QCH; i += SA_VL) STORE(c + i, LOAD(d + i) * -8);
}

/* y[r, j + u] = x[r] . W[j + u] (+ b[j + u]) for the M rows r of x (ld k) and the J rows u of W
 * from row j (of n; ld ldw bytes); xs: the block sums of x (sa_linear_q_xsum) unless Q8_0. */
static inline __attribute__((always_inline)) void SA_FN(sa_q_group)(const int kind, const int M, const int J,
                                                                    const SA_T *x, int64_t k, const uint8_t *w,
                                                                    int64_t ldw, int64_t n, const SA_T *xs,
                                                                    const SA_T *b, int64_t j, SA_T *y,
                                                                    int64_t ldy) {
    const int bytes = SA_QBYTES(kind), head = kind == SA_Q4_1 ? 4 : 2;
    /* q scaled by d once, before the rows of x, when that saves products (or comes free: the table) */
    const int scaled = (SA_QTABLE && kind != SA_Q8_0) || M >= 3;
    const int64_t nb = k / 32, nbp = (nb + SA_QCH - 1) / SA_QCH * SA_QCH;
    const uint8_t *wj = w + j * ldw;
    /* the hardware prefetcher follows one stream; J rows a pass are J of them: fetch ahead */
    const uint8_t *ahead = j + (SA_QPF + 1) * J <= n ? wj + SA_QPF * J * ldw : NULL;
    SA_T d[4][SA_QCH] __attribute__((aligned(64))), c[4][SA_QCH] __attribute__((aligned(64)));
    VEC acc[SA_QROWS][4];  /* acc[r][u]: x[r] . W[j + u], lane-wise */
#pragma GCC unroll 8
    for (int r = 0; r < M; r++)
#pragma GCC unroll 4
        for (int u = 0; u < J; u++) acc[r][u] = SA_FN(splat)(0);
    for (int64_t i0 = 0; i0 < nb; i0 += SA_QCH) {
        const int nc = nb - i0 < SA_QCH ? (int)(nb - i0) : SA_QCH;
#pragma GCC unroll 4
        for (int u = 0; u < J; u++) SA_FN(sa_q_scales)(kind, wj + u * ldw + i0 * bytes, nc, d[u], c[u]);
        for (int ib = 0; ib < nc; ib++) {
            const int64_t i = i0 + ib;
            const SA_T *xi = x + i * 32;
#pragma GCC unroll 4
            for (int u = 0; u < J; u++) {
                const uint8_t *p = wj + u * ldw + i * bytes;
                if (ahead) __builtin_prefetch(ahead + u * ldw + i * bytes, 0, SA_QLOC);
                const VEC dv = SA_FN(sa_qsplat)(d[u][ib]);
                VEC q[SA_QV];
                if (kind == SA_Q8_0)
                    SA_FN(sa_q8)(p + head, q);
                else
                    SA_FN(sa_q4)(p + head, q, dv);
                if (scaled && !(SA_QTABLE && kind != SA_Q8_0))
#pragma GCC unroll 8
                    for (int v = 0; v < SA_QV; v++) q[v] *= dv;
#pragma GCC unroll 8
                for (int r = 0; r < M; r++) {
                    const SA_T *xr = xi + r * k;
                    if (scaled) {
#pragma GCC unroll 8
                        for (int v = 0; v < SA_QV; v++) acc[r][u] += LOAD(xr + v * SA_VL) * q[v];
                    } else {
                        VEC t = LOAD(xr) * q[0];
#pragma GCC unroll 8
                        for (int v = 1; v < SA_QV; v++) t += LOAD(xr + v * SA_VL) * q[v];
                        acc[r][u] += dv * t;
                    }
                }
            }
        }
        if (kind != SA_Q8_0)  /* the chunk's offsets: sum over its blocks of c sum(x), lane-wise */
#pragma GCC unroll 4
            for (int u = 0; u < J; u++)
#pragma GCC unroll 8
                for (int r = 0; r < M; r++)
#pragma GCC unroll 4
                    for (int g = 0; g < SA_QCH; g += SA_VL)
                        acc[r][u] += LOAD(c[u] + g) * LOAD(xs + r * nbp + i0 + g);
    }
#pragma GCC unroll 4
    for (int u = 0; u < J; u++)
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) y[r * ldy + j + u] = SA_FN(sa_qhsum)(acc[r][u]) + (b ? b[j + u] : 0);
}

/* Rows j0 .. j1 of y = x W^T for M rows of x: groups of SA_QJ(M) rows of W, then one at a time. */
static inline __attribute__((always_inline)) void SA_FN(sa_q_rows)(const int kind, const int M, const SA_T *x,
                                                                   int64_t k, const uint8_t *w, int64_t ldw,
                                                                   int64_t n, const SA_T *xs, const SA_T *b,
                                                                   int64_t j0, int64_t j1, SA_T *y, int64_t ldy) {
    int64_t j = j0;
    for (; j + SA_QJ(M) <= j1; j += SA_QJ(M))
        SA_FN(sa_q_group)(kind, M, SA_QJ(M), x, k, w, ldw, n, xs, b, j, y, ldy);
    for (; j < j1; j++) SA_FN(sa_q_group)(kind, M, 1, x, k, w, ldw, n, xs, b, j, y, ldy);
}

/* y[:m, j0:j1] = x W[j0:j1]^T (+ b): x (m, k), 1 <= m <= SA_QROWS; W: n rows of ldw bytes, blocks of
 * type kind; xs from sa_linear_q_xsum (unused for Q8_0). */
static void SA_FN(sa_linear_q_rows)(int kind, const SA_T *x, int64_t k, int64_t m, const uint8_t *w, int64_t ldw,
                                    int64_t n, const SA_T *xs, const SA_T *b, int64_t j0, int64_t j1, SA_T *y,
                                    int64_t ldy) {
#define SA_QROWS_CALL(K, M) SA_FN(sa_q_rows)(K, M, x, k, w, ldw, n, xs, b, j0, j1, y, ldy)
    SA_QSWITCH(kind, m, SA_QROWS_CALL)
#undef SA_QROWS_CALL
}

/* xs[r nbp + i] = sum of x[r, 32 i : 32 i + 32], the block sums of the m rows of x (k a multiple of
 * 32), rows nbp = k / 32 rounded up to SA_QCH apart; the caller zeroes the padding. */
static void SA_FN(sa_linear_q_xsum)(const SA_T *x, int64_t k, int64_t m, SA_T *xs) {
    const int64_t nb = k / 32, nbp = (nb + SA_QCH - 1) / SA_QCH * SA_QCH;
    for (int64_t r = 0; r < m; r++)
        for (int64_t i = 0; i < nb; i++) {
            const SA_T *xr = x + r * k + i * 32;
            VEC s = LOAD(xr);
#pragma GCC unroll 8
            for (int v = 1; v < SA_QV; v++) s += LOAD(xr + v * SA_VL);
            xs[r * nbp + i] = SA_FN(sa_qhsum)(s);
        }
}

/* ---- int8 activations (QuantizedMatrix.activations == "int8"): x rounded to 8 bits a block of 32
 * (reference.round_q8), then each block's x . w an integer dot product of the q of x and of W, as
 * llama.cpp's vec_dot: per block x . w = d_x d_w (q_x . q_w) + c_w d_x sum(q_x). 32 bytes of q a
 * block, one register: products u8 x s8 summed four at a time into int32 (VNNI's vpdpbusd, or
 * vpmaddubsw then vpmaddwd: 15 x 127 x 2 and 128 x 127 x 2 stay within int16), converted and
 * scaled by d_x d_w into float lanes. Q8_0's signed q_w: |q_w| times q_x with q_w's sign. */

typedef float SA_FN(v8f) __attribute__((vector_size(32)));
typedef float SA_FN(v8fu) __attribute__((vector_size(32), aligned(4)));  /* unaligned */
typedef int32_t SA_FN(v8i) __attribute__((vector_size(32)));

#if SA_X86 && SA_VBYTES > 16
typedef __m256i SA_FN(qbytes);  /* a block's 32 q */
static inline SA_FN(qbytes) SA_FN(sa_q8_w4)(const uint8_t *p) {  /* the u8 q of a 4-bit block, in order */
    const __m128i b = _mm_loadu_si128((const __m128i *)p), low = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), low), _mm_and_si128(b, low));
}
static inline SA_FN(qbytes) SA_FN(sa_q8_load)(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
/* lane l: sum over t < 4 of a[4 l + t] b[4 l + t], a u8, b s8 */
static inline SA_FN(v8i) SA_FN(sa_q8_dot)(__m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return (SA_FN(v8i))_mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#else
    return (SA_FN(v8i))_mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}
static inline SA_FN(v8i) SA_FN(sa_q8_dot_signed)(__m256i w, __m256i x) {  /* w s8 too */
    return SA_FN(sa_q8_dot)(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}
#else  /* generic: the bytes themselves, and the lanes' sums in plain C */
typedef struct { uint8_t b[32]; } SA_FN(qbytes);
static inline SA_FN(qbytes) SA_FN(sa_q8_w4)(const uint8_t *p) {
    SA_FN(qbytes) q;
    for (int t = 0; t < 16; t++) q.b[t] = p[t] & 15, q.b[t + 16] = p[t] >> 4;
    return q;
}
static inline SA_FN(qbytes) SA_FN(sa_q8_load)(const void *p) {
    SA_FN(qbytes) q;
    memcpy(q.b, p, 32);
    return q;
}
static inline SA_FN(v8i) SA_FN(sa_q8_dot)(SA_FN(qbytes) a, SA_FN(qbytes) b) {
    SA_FN(v8i) s;
    for (int l = 0; l < 8; l++) {
        int32_t t = 0;
        for (int i = 4 * l; i < 4 * l + 4; i++) t += (int32_t)a.b[i] * (int8_t)b.b[i];
        s[l] = t;
    }
    return s;
}
static inline SA_FN(v8i) SA_FN(sa_q8_dot_signed)(SA_FN(qbytes) w, SA_FN(qbytes) x) {
    SA_FN(v8i) s;
    for (int l = 0; l < 8; l++) {
        int32_t t = 0;
        for (int i = 4 * l; i < 4 * l + 4; i++) t += (int32_t)(int8_t)w.b[i] * (int8_t)x.b[i];
        s[l] = t;
    }
    return s;
}
#endif

/* xq, xd, xs of the m rows of x (k a multiple of 32): per block of 32 values, with a = max |x|,
 * q = rint(x (127 / a)) as int8 and d = a / 127, the float operations of reference.round_q8 (so the
 * same q); xd[r nbp + i] = d, xs[r nbp + i] = d sum(q), rows nbp = k / 32 rounded up to SA_QCH apart
 * (the caller zeroes the padding). A block of zeros has d = 0; one with a NaN or an infinity
 * d = NaN, which makes every product it enters NaN, as the reference's are. */
static void SA_FN(sa_quantize_q8)(const SA_T *x, int64_t k, int64_t m, int8_t *xq, SA_T *xd, SA_T *xs) {
    const int64_t nb = k / 32, nbp = (nb + SA_QCH - 1) / SA_QCH * SA_QCH;
    for (int64_t r = 0; r < m; r++)
        for (int64_t i = 0; i < nb; i++) {
            const SA_T *b = x + r * k + i * 32;
            int8_t *q = xq + r * k + i * 32;
#if SA_X86 && SA_VBYTES == 64 && SA_TBYTES == 4 && defined(__AVX512F__)
            /* the same operations 16 lanes at a time: max of |x| (exact in any order without NaN;
             * with one, d is NaN whatever a is), x inv rounded by the current mode as rintf */
            const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
            const __m512 v0 = _mm512_abs_ps(b0), v1 = _mm512_abs_ps(b1), top = _mm512_set1_ps(3.40282347e38f);
            const int nan = (_mm512_cmp_ps_mask(v0, top, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(v1, top, _CMP_NLE_UQ)) != 0;
            const SA_T a = _mm512_reduce_max_ps(_mm512_max_ps(v0, v1));
            int32_t sum = 0;
            if (nan || a == 0) {
                memset(q, 0, 32);
            } else {
                const __m512 inv = _mm512_set1_ps(127.0f / a);
                const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(b0, inv));
                const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(b1, inv));
                _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(q0));
                _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(q1));
                sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            }
#else
            SA_T a = 0;
            int nan = 0;
            for (int t = 0; t < 32; t++) {
                const SA_T v = b[t] < 0 ? -b[t] : b[t];
                nan |= !(v <= 3.40282347e38f);  /* NaN or inf */
                a = v > a ? v : a;
            }
            int32_t sum = 0;
            if (nan || a == 0) {
                memset(q, 0, 32);
            } else {
                const SA_T inv = 127.0f / a;
                for (int t = 0; t < 32; t++) {
                    q[t] = (int8_t)rintf(b[t] * inv);  /* |b inv| <= 127 (rounded): no clamp needed */
                    sum += q[t];
                }
            }
#endif
            const SA_T d = nan ? NAN : a / 127.0f;
            xd[r * nbp + i] = d;
            xs[r * nbp + i] = d * (SA_T)sum;
        }
}

/* The float16 at p (a block's d or m) as a float. */
static inline SA_T SA_FN(sa_q8_half)(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if SA_X86 && SA_VBYTES > 16
    return _cvtsh_ss(h);
#else
    return SA_FN(sa_half)(h);
#endif
}

#include "tmpl_q8p.h"

/* y[r, j + u] = round_q8(x[r]) . W[j + u] (+ b[j + u]) for the M rows r of x (xq, xd, xs of
 * sa_quantize_q8; ld k) and the J rows u of W from row j (of n; ld ldw bytes). Each block's scales
 * converted where it is read (one F16C conversion: a gather of many blocks' scales costs more than
 * the integer product saves), the offsets c_w d_x sum(q_x) summed apart in scalars; the
 * accumulators in registers, the next rows prefetched. */
static inline __attribute__((always_inline)) void SA_FN(sa_q8_group)(const int kind, const int M, const int J,
                                                                     const int8_t *xq, const SA_T *xd,
                                                                     const SA_T *xs, int64_t k, const uint8_t *w,
                                                                     int64_t ldw, int64_t n, const SA_T *b,
                                                                     int64_t j, SA_T *y, int64_t ldy) {
    const int bytes = SA_QBYTES(kind), head = kind == SA_Q4_1 ? 4 : 2;
    const int64_t nb = k / 32, nbp = (nb + SA_QCH - 1) / SA_QCH * SA_QCH;
    const uint8_t *wj = w + j * ldw;
    const uint8_t *ahead = j + (SA_QPF + 1) * J <= n ? wj + SA_QPF * J * ldw : NULL;
    SA_FN(v8f) acc[SA_QROWS][4];
    SA_T off[SA_QROWS][4];
#pragma GCC unroll 8
    for (int r = 0; r < M; r++)
#pragma GCC unroll 4
        for (int u = 0; u < J; u++) acc[r][u] = (SA_FN(v8f)){0}, off[r][u] = 0;
    for (int64_t i = 0; i < nb; i++) {
#pragma GCC unroll 4
        for (int u = 0; u < J; u++) {
            const uint8_t *p = wj + u * ldw + i * bytes;
            if (ahead) __builtin_prefetch(ahead + u * ldw + i * bytes, 0, SA_QLOC);
            const SA_T d = SA_FN(sa_q8_half)(p);
            const SA_T c = kind == SA_Q4_1 ? SA_FN(sa_q8_half)(p + 2) : kind == SA_Q4_0 ? -8 * d : 0;
            const SA_FN(qbytes) qw = kind == SA_Q8_0 ? SA_FN(sa_q8_load)(p + head) : SA_FN(sa_q8_w4)(p + head);
#pragma GCC unroll 8
            for (int r = 0; r < M; r++) {
                const SA_FN(qbytes) qx = SA_FN(sa_q8_load)(xq + r * k + i * 32);
                const SA_FN(v8i) s = kind == SA_Q8_0 ? SA_FN(sa_q8_dot_signed)(qw, qx) : SA_FN(sa_q8_dot)(qw, qx);
                acc[r][u] += __builtin_convertvector(s, SA_FN(v8f)) * (d * xd[r * nbp + i]);
                if (kind != SA_Q8_0) off[r][u] += c * xs[r * nbp + i];
            }
        }
    }
#pragma GCC unroll 4
    for (int u = 0; u < J; u++)
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) {
            SA_FN(v8f) v = acc[r][u];
            const SA_T s = ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
            y[r * ldy + j + u] = s + off[r][u] + (b ? b[j + u] : 0);
        }
}

/* Rows j0 .. j1 of y = round_q8(x) W^T for M rows of x: groups of SA_QJ(M) rows of W, then one. */
static inline __attribute__((always_inline)) void SA_FN(sa_q8_rows)(const int kind, const int M, const int8_t *xq,
                                                                    const SA_T *xd, const SA_T *xs, int64_t k,
                                                                    const uint8_t *w, int64_t ldw, int64_t n,
                                                                    const SA_T *b, int64_t j0, int64_t j1, SA_T *y,
                                                                    int64_t ldy) {
    int64_t j = j0;
    for (; j + SA_QJ(M) <= j1; j += SA_QJ(M))
        SA_FN(sa_q8_group)(kind, M, SA_QJ(M), xq, xd, xs, k, w, ldw, n, b, j, y, ldy);
    for (; j < j1; j++) SA_FN(sa_q8_group)(kind, M, 1, xq, xd, xs, k, w, ldw, n, b, j, y, ldy);
}

/* y[:m, j0:j1] = round_q8(x) W[j0:j1]^T (+ b), x given as sa_quantize_q8's xq, xd, xs; as
 * sa_linear_q_rows otherwise. */
static void SA_FN(sa_linear_q8_rows)(int kind, const int8_t *xq, const SA_T *xd, const SA_T *xs, int64_t k, int64_t m,
                                     const uint8_t *w, int64_t ldw, int64_t n, const SA_T *b, int64_t j0, int64_t j1,
                                     SA_T *y, int64_t ldy) {
#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512BW__)
    SA_FN(sa_linear_q8p_rows)(kind, xq, xd, xs, k, m, w, ldw, n, b, j0, j1, y, ldy);
    return;
#endif
#define SA_Q8_ROWS_CALL(K, M) SA_FN(sa_q8_rows)(K, M, xq, xd, xs, k, w, ldw, n, b, j0, j1, y, ldy)
    SA_QSWITCH(kind, m, SA_Q8_ROWS_CALL)
#undef SA_Q8_ROWS_CALL
}

/* ---- the other block types (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), float32 activations: each vector of
 * SA_VL weights decoded in registers from the bytes that hold it (sa_u8 widens them to int32 lanes;
 * nibbles, fifth bits and 6-bit parts shifted and masked lane-wise), scaled, and multiplied with the
 * M rows of x at once, so that W is read once, at its 5.5 to 6.6 bits a weight, whatever the rows. */

/* acc[r] += x[r] (the block's SA_VL lanes from lane e) * (s q + o), q the int32 lanes given */
static inline __attribute__((always_inline)) void SA_FN(sa_qx_fma)(const int M, const SA_T *x, int64_t k, IVEC q,
                                                                   SA_T s, SA_T o, VEC *acc) {
    const VEC w = __builtin_convertvector(q, VEC) * SA_FN(sa_qsplat)(s) + SA_FN(sa_qsplat)(o);
#pragma GCC unroll 8
    for (int r = 0; r < M; r++) acc[r] += LOAD(x + r * k) * w;
}

/* The Q5_0 / Q5_1 block at p against x (its 32 values in each of the M rows): w = d q + m (Q5_1) or
 * d (q - 16), q of five bits: the low four in 16 bytes (byte j: q_j low, q_(j + 16) high), the
 * fifth bit of q_j bit j of a 32-bit word. */
static inline __attribute__((always_inline)) void SA_FN(sa_qx_q5)(const int kind, const int M, const uint8_t *p,
                                                                  const SA_T *x, int64_t k, VEC *acc) {
    const int one = kind == SA_Q5_1;
    const SA_T d = SA_FN(sa_q8_half)(p), m = one ? SA_FN(sa_q8_half)(p + 2) : -16 * d;
    uint32_t h;
    memcpy(&h, p + (one ? 4 : 2), 4);
    const uint8_t *qs = p + (one ? 8 : 6);
    IVEC lane;
    for (int t = 0; t < SA_VL; t++) lane[t] = t;
#pragma GCC unroll 8
    for (int v = 0; v < SA_QV; v++) {
        const int e = v * SA_VL;  /* the first weight of this vector */
        const IVEC b = SA_FN(sa_u8)(qs + e % 16);
        const IVEC fifth = ((IVEC){0} + (int32_t)(h >> e)) >> lane & 1;  /* bits e .. e + SA_VL of h */
        SA_FN(sa_qx_fma)(M, x + e, k, (e < 16 ? b & 15 : b >> 4) | fifth << 4, d, m, acc + v % 2 * M);
    }
}

/* The Q4_K / Q5_K block at p against x (256 values a row): sub-block b of 32, w = (d s_b) q - dmin
 * m_b, the 6-bit s_b and m_b packed in 12 bytes; q's low four bits: sub-blocks 2i and 2i + 1 the low
 * and high nibbles of the same 32 bytes; Q5_K's fifth: bit b of byte l of 32 more. */
static inline __attribute__((always_inline)) void SA_FN(sa_qx_q45k)(const int kind, const int M, const uint8_t *p,
                                                                    const SA_T *x, int64_t k, VEC *acc) {
    const SA_T d = SA_FN(sa_q8_half)(p), dmin = SA_FN(sa_q8_half)(p + 2);
    const uint8_t *s = p + 4, *qh = p + 16, *qs = p + SA_QBYTES(kind) - 128;
#pragma GCC unroll 2
    for (int b = 0; b < 8; b += 2) {
        const int s0 = b < 4 ? s[b] & 63 : (s[b + 4] & 15) | (s[b - 4] >> 6) << 4;
        const int m0 = b < 4 ? s[b + 4] & 63 : (s[b + 4] >> 4) | (s[b] >> 6) << 4;
        const int s1 = b + 1 < 4 ? s[b + 1] & 63 : (s[b + 5] & 15) | (s[b - 3] >> 6) << 4;
        const int m1 = b + 1 < 4 ? s[b + 5] & 63 : (s[b + 5] >> 4) | (s[b + 1] >> 6) << 4;
        const SA_T ds0 = d * (SA_T)s0, dm0 = -(dmin * (SA_T)m0), ds1 = d * (SA_T)s1, dm1 = -(dmin * (SA_T)m1);
        const uint8_t *q = qs + 16 * b;
#pragma GCC unroll 8
        for (int v = 0; v < SA_QV; v++) {
            const int l = v * SA_VL;
            const IVEC bytes = SA_FN(sa_u8)(q + l);
            IVEC lo = bytes & 15, hi = bytes >> 4;
            if (kind == SA_Q5_K) {
                const IVEC fifth = SA_FN(sa_u8)(qh + l);
                lo |= (fifth >> b & 1) << 4;
                hi |= (fifth >> (b + 1) & 1) << 4;
            }
            SA_FN(sa_qx_fma)(M, x + 32 * b + l, k, lo, ds0, dm0, acc);
            SA_FN(sa_qx_fma)(M, x + 32 * b + 32 + l, k, hi, ds1, dm1, acc + M);
        }
    }
}

/* The Q6_K block at p against x (256 values a row): w = (d s_b) (q - 32) for sub-block b of 16, q
 * of six bits: a half of 128 weights takes its low four from 64 bytes (weights l and l + 32: the
 * low nibbles of bytes l and l + 32, weights l + 64 and l + 96 their high ones) and its top two from
 * 32 (byte l: bits 0-1, 2-3, 4-5, 6-7 for l, l + 32, l + 64, l + 96); int8 s_b, fp16 d last. */
static inline __attribute__((always_inline)) void SA_FN(sa_qx_q6k)(const int M, const uint8_t *p, const SA_T *x,
                                                                   int64_t k, VEC *acc) {
    const SA_T d = SA_FN(sa_q8_half)(p + 208);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const uint8_t *low = p + 64 * h, *high = p + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(p + 192 + 8 * h);
        const SA_T *xh = x + 128 * h;
#pragma GCC unroll 8
        for (int l = 0; l < 32; l += SA_VL) {
            const IVEC a = SA_FN(sa_u8)(low + l), c = SA_FN(sa_u8)(low + 32 + l), top = SA_FN(sa_u8)(high + l);
            const int t = l / 16;  /* SA_VL <= 16: one sub-block a vector */
            SA_FN(sa_qx_fma)(M, xh + l, k, (a & 15) | (top & 3) << 4, d * sc[t], -32 * d * sc[t], acc);
            SA_FN(sa_qx_fma)(M, xh + l + 32, k, (c & 15) | (top >> 2 & 3) << 4, d * sc[t + 2], -32 * d * sc[t + 2],
                             acc + M);
            SA_FN(sa_qx_fma)(M, xh + l + 64, k, (a >> 4) | (top >> 4 & 3) << 4, d * sc[t + 4], -32 * d * sc[t + 4],
                             acc);
            SA_FN(sa_qx_fma)(M, xh + l + 96, k, (c >> 4) | (top >> 6 & 3) << 4, d * sc[t + 6], -32 * d * sc[t + 6],
                             acc + M);
        }
    }
}

/* y[r, j] = x[r] . W[j] (+ b[j]) for rows j0 .. j1 of W (kind Q5_0 .. Q6_K; ld ldw bytes) and the M
 * rows of x (ld k), the accumulators lane-wise in registers, two chains a row (one would wait on
 * the FMA's latency at every vector), the next row prefetched. */
static inline __attribute__((always_inline)) void SA_FN(sa_qx_rows)(const int kind, const int M, const SA_T *x,
                                                                    int64_t k, const uint8_t *w, int64_t ldw,
                                                                    const SA_T *b, int64_t j0, int64_t j1, SA_T *y,
                                                                    int64_t ldy) {
    const int bytes = SA_QBYTES(kind), weights = SA_QWEIGHTS(kind);
    const int64_t nb = k / weights;
    for (int64_t j = j0; j < j1; j++) {
        const uint8_t *wj = w + j * ldw;
        VEC acc[2 * SA_QROWS];  /* two chains a row of x: acc[r] and acc[M + r] */
#pragma GCC unroll 16
        for (int r = 0; r < 2 * M; r++) acc[r] = SA_FN(splat)(0);
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *p = wj + i * bytes;
            const SA_T *xi = x + i * weights;
            if (j + 1 < j1) __builtin_prefetch(p + ldw, 0, SA_QLOC);
            if (kind == SA_Q6_K)
                SA_FN(sa_qx_q6k)(M, p, xi, k, acc);
            else if (kind == SA_Q4_K || kind == SA_Q5_K)
                SA_FN(sa_qx_q45k)(kind, M, p, xi, k, acc);
            else
                SA_FN(sa_qx_q5)(kind, M, p, xi, k, acc);
        }
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) y[r * ldy + j] = SA_FN(sa_qhsum)(acc[r] + acc[M + r]) + (b ? b[j] : 0);
    }
}

/* y[:m, j0:j1] = x W[j0:j1]^T (+ b), x (m, k), 1 <= m <= SA_QROWS, W's kind one of Q5_0 .. Q6_K */
static void SA_FN(sa_linear_qx_rows)(int kind, const SA_T *x, int64_t k, int64_t m, const uint8_t *w, int64_t ldw,
                                     const SA_T *b, int64_t j0, int64_t j1, SA_T *y, int64_t ldy) {
#define SA_QX_CALL(K, M) SA_FN(sa_qx_rows)(K, M, x, k, w, ldw, b, j0, j1, y, ldy)
    SA_QX_SWITCH(kind, m, SA_QX_CALL)
#undef SA_QX_CALL
}

/* ---- int8 activations for the other kinds (Q5_0 .. Q6_K): x's rows rounded to 8 bits a block of
 * 32 as for the kinds above (sa_quantize_q8: xq, xd, xs = d sum(q)), and each 32 weights of W built
 * as 32 unsigned bytes q (0 .. 63) with w = s q + o per run of 16 or 32: x . w over the run is
 * xd s (q_x . q) + o xd sum(q_x), the integer product one sa_q8_dot. The per-16 runs (Q6_K's
 * scales) are the dot's lanes 0-3 and 4-7: s and o go in as 8 lanes, and sum(q_x) per lane comes
 * from a second dot with ones. */

#if SA_X86 && SA_VBYTES > 16
/* byte t (of 32): bit t of h, as 16 where set */
static inline SA_FN(qbytes) SA_FN(sa_q8x_fifth)(uint32_t h) {
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h),
                                              _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                               2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(16));
}
/* (v >> shift) & mask, byte-wise */
static inline SA_FN(qbytes) SA_FN(sa_q8x_bits)(SA_FN(qbytes) v, int shift, int mask) {
    return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8((char)mask));
}
static inline SA_FN(qbytes) SA_FN(sa_q8x_or_shl4)(SA_FN(qbytes) a, SA_FN(qbytes) b) {  /* a | b << 4 */
    return _mm256_or_si256(a, _mm256_slli_epi16(b, 4));
}
static inline SA_FN(qbytes) SA_FN(sa_q8x_or)(SA_FN(qbytes) a, SA_FN(qbytes) b) { return _mm256_or_si256(a, b); }
static inline SA_FN(qbytes) SA_FN(sa_q8x_ones)(void) { return _mm256_set1_epi8(1); }
#else
static inline SA_FN(qbytes) SA_FN(sa_q8x_fifth)(uint32_t h) {
    SA_FN(qbytes) q;
    for (int t = 0; t < 32; t++) q.b[t] = (uint8_t)(((h >> t) & 1) << 4);
    return q;
}
static inline SA_FN(qbytes) SA_FN(sa_q8x_bits)(SA_FN(qbytes) v, int shift, int mask) {
    for (int t = 0; t < 32; t++) v.b[t] = (uint8_t)((v.b[t] >> shift) & mask);
    return v;
}
static inline SA_FN(qbytes) SA_FN(sa_q8x_or_shl4)(SA_FN(qbytes) a, SA_FN(qbytes) b) {
    for (int t = 0; t < 32; t++) a.b[t] = (uint8_t)(a.b[t] | b.b[t] << 4);
    return a;
}
static inline SA_FN(qbytes) SA_FN(sa_q8x_or)(SA_FN(qbytes) a, SA_FN(qbytes) b) {
    for (int t = 0; t < 32; t++) a.b[t] |= b.b[t];
    return a;
}
static inline SA_FN(qbytes) SA_FN(sa_q8x_ones)(void) {
    SA_FN(qbytes) q;
    memset(q.b, 1, 32);
    return q;
}
#endif

/* acc[r] += (q_x . q) xd s + o xs for the M rows' block i of x (32 values), s and o one per run of 32 */
static inline __attribute__((always_inline)) void SA_FN(sa_q8x_run)(const int M, SA_FN(qbytes) q, SA_T s, SA_T o,
                                                                    const int8_t *xq, const SA_T *xd,
                                                                    const SA_T *xs, int64_t k, int64_t nbp,
                                                                    int64_t i, SA_FN(v8f) *acc, SA_T *off) {
#pragma GCC unroll 8
    for (int r = 0; r < M; r++) {
        const SA_FN(v8i) dot = SA_FN(sa_q8_dot)(q, SA_FN(sa_q8_load)(xq + r * k + i * 32));
        acc[r] += __builtin_convertvector(dot, SA_FN(v8f)) * (s * xd[r * nbp + i]);
        off[r] += o * xs[r * nbp + i];
    }
}

/* the same with s and o per run of 16 (lanes 0-3 the first 16 values, 4-7 the second) */
static inline __attribute__((always_inline)) void SA_FN(sa_q8x_run16)(const int M, SA_FN(qbytes) q, SA_T s0,
                                                                      SA_T s1, SA_T o0, SA_T o1, const int8_t *xq,
                                                                      const SA_T *xd, int64_t k, int64_t nbp,
                                                                      int64_t i, SA_FN(v8f) *acc) {
    const SA_FN(v8f) s = {s0, s0, s0, s0, s1, s1, s1, s1}, o = {o0, o0, o0, o0, o1, o1, o1, o1};
#pragma GCC unroll 8
    for (int r = 0; r < M; r++) {
        const SA_FN(qbytes) qx = SA_FN(sa_q8_load)(xq + r * k + i * 32);
        const SA_FN(v8i) dot = SA_FN(sa_q8_dot)(q, qx), sum = SA_FN(sa_q8_dot)(SA_FN(sa_q8x_ones)(), qx);
        const SA_T d = xd[r * nbp + i];
        acc[r] += (__builtin_convertvector(dot, SA_FN(v8f)) * s + __builtin_convertvector(sum, SA_FN(v8f)) * o) * d;
    }
}

/* One row of W (kind Q5_0 .. Q6_K, at wj) against the M rows of x: acc, off as sa_q8x_run's */
static inline __attribute__((always_inline)) void SA_FN(sa_q8x_row)(const int kind, const int M, const uint8_t *wj,
                                                                    int64_t ldw_ahead, const int8_t *xq,
                                                                    const SA_T *xd, const SA_T *xs, int64_t k,
                                                                    SA_FN(v8f) *acc, SA_T *off) {
    const int bytes = SA_QBYTES(kind), weights = SA_QWEIGHTS(kind);
    const int64_t nb = k / weights, nbp = (k / 32 + SA_QCH - 1) / SA_QCH * SA_QCH;
    for (int64_t blk = 0; blk < nb; blk++) {
        const uint8_t *p = wj + blk * bytes;
        if (ldw_ahead) __builtin_prefetch(p + ldw_ahead, 0, SA_QLOC);
        const int64_t i = blk * weights / 32;  /* x's first block of 32 here */
        if (kind == SA_Q5_0 || kind == SA_Q5_1) {
            const int one = kind == SA_Q5_1;
            const SA_T d = SA_FN(sa_q8_half)(p), m = one ? SA_FN(sa_q8_half)(p + 2) : -16 * d;
            uint32_t h;
            memcpy(&h, p + (one ? 4 : 2), 4);
            const SA_FN(qbytes) q = SA_FN(sa_q8x_or)(SA_FN(sa_q8_w4)(p + (one ? 8 : 6)), SA_FN(sa_q8x_fifth)(h));
            SA_FN(sa_q8x_run)(M, q, d, m, xq, xd, xs, k, nbp, i, acc, off);
        } else if (kind == SA_Q4_K || kind == SA_Q5_K) {
            const SA_T d = SA_FN(sa_q8_half)(p), dmin = SA_FN(sa_q8_half)(p + 2);
            const uint8_t *s = p + 4, *qs = p + bytes - 128;
            const SA_FN(qbytes) high = SA_FN(sa_q8_load)(p + 16);
            for (int b = 0; b < 8; b += 2) {
                const SA_FN(qbytes) q = SA_FN(sa_q8_load)(qs + 16 * b);
                SA_FN(qbytes) lo = SA_FN(sa_q8x_bits)(q, 0, 15), hi = SA_FN(sa_q8x_bits)(q, 4, 15);
                if (kind == SA_Q5_K) {
                    lo = SA_FN(sa_q8x_or_shl4)(lo, SA_FN(sa_q8x_bits)(high, b, 1));
                    hi = SA_FN(sa_q8x_or_shl4)(hi, SA_FN(sa_q8x_bits)(high, b + 1, 1));
                }
                for (int u = 0; u < 2; u++) {
                    const int c = b + u;
                    const int sc = c < 4 ? s[c] & 63 : (s[c + 4] & 15) | (s[c - 4] >> 6) << 4;
                    const int mn = c < 4 ? s[c + 4] & 63 : (s[c + 4] >> 4) | (s[c] >> 6) << 4;
                    SA_FN(sa_q8x_run)(M, u ? hi : lo, d * (SA_T)sc, -(dmin * (SA_T)mn), xq, xd, xs, k, nbp, i + c,
                                      acc, off);
                }
            }
        } else {  /* Q6_K */
            const SA_T d = SA_FN(sa_q8_half)(p + 208);
            for (int h = 0; h < 2; h++) {
                const SA_FN(qbytes) a = SA_FN(sa_q8_load)(p + 64 * h), c = SA_FN(sa_q8_load)(p + 64 * h + 32);
                const SA_FN(qbytes) top = SA_FN(sa_q8_load)(p + 128 + 32 * h);
                const int8_t *sc = (const int8_t *)(p + 192 + 8 * h);
                const SA_FN(qbytes) q[4] = {
                    SA_FN(sa_q8x_or_shl4)(SA_FN(sa_q8x_bits)(a, 0, 15), SA_FN(sa_q8x_bits)(top, 0, 3)),
                    SA_FN(sa_q8x_or_shl4)(SA_FN(sa_q8x_bits)(c, 0, 15), SA_FN(sa_q8x_bits)(top, 2, 3)),
                    SA_FN(sa_q8x_or_shl4)(SA_FN(sa_q8x_bits)(a, 4, 15), SA_FN(sa_q8x_bits)(top, 4, 3)),
                    SA_FN(sa_q8x_or_shl4)(SA_FN(sa_q8x_bits)(c, 4, 15), SA_FN(sa_q8x_bits)(top, 6, 3))};
                for (int g = 0; g < 4; g++) {
                    const SA_T s0 = d * (SA_T)sc[2 * g], s1 = d * (SA_T)sc[2 * g + 1];
                    SA_FN(sa_q8x_run16)(M, q[g], s0, s1, -32 * s0, -32 * s1, xq, xd, k, nbp, i + 4 * h + g, acc);
                }
            }
        }
    }
}

/* y[:m, j0:j1] = round_q8(x) W[j0:j1]^T (+ b) for W's kind one of Q5_0 .. Q6_K, x given as
 * sa_quantize_q8's xq, xd, xs; the next row prefetched. */
static inline __attribute__((always_inline)) void SA_FN(sa_q8x_rows)(const int kind, const int M, const int8_t *xq,
                                                                     const SA_T *xd, const SA_T *xs, int64_t k,
                                                                     const uint8_t *w, int64_t ldw, const SA_T *b,
                                                                     int64_t j0, int64_t j1, SA_T *y, int64_t ldy) {
    for (int64_t j = j0; j < j1; j++) {
        SA_FN(v8f) acc[SA_QROWS];
        SA_T off[SA_QROWS];
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) acc[r] = (SA_FN(v8f)){0}, off[r] = 0;
        SA_FN(sa_q8x_row)(kind, M, w + j * ldw, j + 1 < j1 ? ldw : 0, xq, xd, xs, k, acc, off);
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) {
            const SA_FN(v8f) v = acc[r];
            const SA_T s = ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
            y[r * ldy + j] = s + off[r] + (b ? b[j] : 0);
        }
    }
}

#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512BW__) && defined(__AVX512VNNI__)
/* y[:M, g:g + 16] (+ b[g:g + 16]) for the group at wg in rows16.h's layout of the blocks of 32
 * (kind: the file's, Q8_0 .. Q5_0), x as sa_quantize_q8's xq, xd, xs: per block and row of x, a =
 * sum_t u x over the block (u: the unsigned q, the 16 rows' lanes: vpdpbusd of a run's bytes, or
 * of its nibbles with Q5_0's fifth bits added under byte masks, against 4 bytes of x broadcast),
 * then for the 16 rows at once y += d d_x a + m xs (Q4_1) or d (d_x a - c xs) with u = q + c (c: 8
 * for Q4_0, 16 for Q5_0, 128 for Q8_0). a is exact (at most 32 x 255 x 128). */
static inline __attribute__((always_inline)) void SA_FN(sa_b16_group)(const int kind, const int M,
                                                                      const uint8_t *wg, const int8_t *xq,
                                                                      const SA_T *xd, const SA_T *xs, int64_t k,
                                                                      const SA_T *b, SA_T *y, int64_t ldy) {
    const int64_t nb = k / 32, nbp = (k / 32 + SA_QCH - 1) / SA_QCH * SA_QCH;
    const int bytes = SA_B16_BYTES(kind), at = SA_B16_RUNS(kind);
    const float c = kind == SA_Q8_0 ? 128 : kind == SA_Q4_0 ? 8 : 16;
    const __m512i m4 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
    /* bit t of a run's byte of qh for byte t of the low nibbles, bit 4 + t for the high ones */
    const __m512i blo = _mm512_set1_epi32(0x08040201), bhi = _mm512_set1_epi32((int)0x80402010u);
    const __m512i spread0 = _mm512_set_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0, 0x0c0c0c0c, 0x08080808,
                                             0x04040404, 0, 0x0c0c0c0c, 0x08080808, 0x04040404, 0, 0x0c0c0c0c,
                                             0x08080808, 0x04040404, 0);
    const int far = sa_cpu_far_ahead();
    __m512 fa[SA_QROWS];
#pragma GCC unroll 8
    for (int r = 0; r < M; r++) fa[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *p = wg + bytes * i;
        /* the group's blocks are one stream (and a thread's next group follows it). Far: each line
         * of the block 16 ahead, 5-9 KB, as the K-quant kernels' two super-blocks; the first two
         * lines of the block 4 ahead left the passes waiting on W's loads on a Xeon with a far L3
         * (SmolLM2's 8-row step, int8, 9.3 ms; every line 4 ahead 7.5-7.9, 8 ahead 6.5, 16 ahead
         * 6.2; one row 3.5, 3.2, 2.9). Near, where that was measured slower (sa_cpu_far_ahead). */
        if (far) {
            for (int c = 0; c < bytes; c += 64) __builtin_prefetch(p + 16 * bytes + c, 0, SA_QLOC);
        } else {
            __builtin_prefetch(p + 4 * bytes, 0, SA_QLOC);
            __builtin_prefetch(p + 4 * bytes + 64, 0, SA_QLOC);
        }
        __m512i a[SA_QROWS];
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) a[r] = _mm512_setzero_si512();
        if (kind == SA_Q8_0) {
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) {
                const __m512i v = _mm512_loadu_si512((const void *)(p + at + 64 * u));
#pragma GCC unroll 8
                for (int r = 0; r < M; r++) {
                    int32_t x0;
                    memcpy(&x0, xq + r * k + 32 * i + 4 * u, 4);
                    a[r] = _mm512_dpbusd_epi32(a[r], v, _mm512_set1_epi32(x0));
                }
            }
        } else {
            const __m512i qh = kind == SA_Q5_0 ? _mm512_loadu_si512((const void *)(p + 32)) : m4;
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                const __m512i v = _mm512_loadu_si512((const void *)(p + at + 64 * u));
                __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (kind == SA_Q5_0) {
                    /* byte u of each row's qh in all 4 of its bytes (vpshufb within 128-bit lanes: 4 rows a lane) */
                    const __m512i spread = _mm512_shuffle_epi8(qh, _mm512_add_epi8(spread0, _mm512_set1_epi8((char)u)));
                    lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(spread, blo), lo, sixteen);
                    hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(spread, bhi), hi, sixteen);
                }
#pragma GCC unroll 8
                for (int r = 0; r < M; r++) {
                    int32_t x0, x1;
                    memcpy(&x0, xq + r * k + 32 * i + 8 * u, 4);
                    memcpy(&x1, xq + r * k + 32 * i + 8 * u + 4, 4);
                    a[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a[r], lo, _mm512_set1_epi32(x0)), hi,
                                               _mm512_set1_epi32(x1));
                }
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        const __m512 mw = kind == SA_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32))) : d;
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) {
            fa[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r]), _mm512_mul_ps(d, _mm512_set1_ps(xd[r * nbp + i])), fa[r]);
            if (kind == SA_Q4_1)
                fa[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs[r * nbp + i]), fa[r]);
            else
                fa[r] = _mm512_fnmadd_ps(d, _mm512_set1_ps(c * xs[r * nbp + i]), fa[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; r++)
        _mm512_storeu_ps(y + r * ldy, b ? _mm512_add_ps(fa[r], _mm512_loadu_ps(b)) : fa[r]);
}
#endif

/* sa_linear_q8x_rows for the blocks of 32 in rows16.h's layout (kind16: SA_Q8_016 .. SA_Q5_016):
 * sa_k16_rows's scheme (whole groups by the VNNI kernel, other rows and copies unpacked to the
 * file's blocks and multiplied as the file's kind) */
static void SA_FN(sa_linear_q8x_rows)(int kind, const int8_t *xq, const SA_T *xd, const SA_T *xs, int64_t k,
                                      int64_t m, const uint8_t *w, int64_t ldw, const SA_T *b, int64_t j0,
                                      int64_t j1, SA_T *y, int64_t ldy);
static void SA_FN(sa_b16_rows)(const int kind16, const int8_t *xq, const SA_T *xd, const SA_T *xs, int64_t k,
                               int64_t m, const uint8_t *w, int64_t ldw, const SA_T *b, int64_t j0, int64_t j1,
                               SA_T *y, int64_t ldy) {
    const int kind = SA_B16_FILE(kind16);
    int64_t g0 = j1, g1 = j1;  /* the whole groups [g0, g1) */
#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512BW__) && defined(__AVX512VNNI__)
    g0 = (j0 + 15) / 16 * 16, g1 = j1 / 16 * 16;
    if (g1 < g0) g0 = g1 = j1;
    for (int64_t g = g0; g < g1; g += 16) {
#define SA_R16_CALL(K, M) SA_FN(sa_b16_group)(K, M, w + g * ldw, xq, xd, xs, k, b ? b + g : NULL, y + g, ldy)
        switch (kind * SA_QROWS + (int)m - 1) {
            SA_QCASES(SA_Q8_0, SA_R16_CALL)
            SA_QCASES(SA_Q4_0, SA_R16_CALL)
            SA_QCASES(SA_Q4_1, SA_R16_CALL)
            SA_QCASES(SA_Q5_0, SA_R16_CALL)
            default: break;
        }
#undef SA_R16_CALL
    }
#endif
    if (j0 == g0 && j1 == g1) return;
    uint8_t *row = (uint8_t *)malloc((size_t)ldw);
    for (int64_t j = j0; j < j1; j++) {
        if (j == g0) j = g1;
        if (j >= j1) break;
        if (row == NULL) {
            for (int64_t r = 0; r < m; r++) y[r * ldy + j] = NAN;
            continue;
        }
        sa_b16_unpack_row(kind, w, ldw, j, row);
        if (kind == SA_Q5_0)
            SA_FN(sa_linear_q8x_rows)(kind, xq, xd, xs, k, m, row, ldw, b ? b + j : NULL, 0, 1, y + j, ldy);
        else
            SA_FN(sa_linear_q8_rows)(kind, xq, xd, xs, k, m, row, ldw, 1, b ? b + j : NULL, 0, 1, y + j, ldy);
    }
    free(row);
}

static void SA_FN(sa_linear_q8x_rows)(int kind, const int8_t *xq, const SA_T *xd, const SA_T *xs, int64_t k,
                                      int64_t m, const uint8_t *w, int64_t ldw, const SA_T *b, int64_t j0,
                                      int64_t j1, SA_T *y, int64_t ldy) {
    if (SA_B16_FILE(kind) >= 0) {
        SA_FN(sa_b16_rows)(kind, xq, xd, xs, k, m, w, ldw, b, j0, j1, y, ldy);
        return;
    }
#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512BW__)
    if (kind == SA_Q5_0 || kind == SA_Q5_1) {
        SA_FN(sa_linear_q8p_rows)(kind, xq, xd, xs, k, m, w, ldw, j1, b, j0, j1, y, ldy);
        return;
    }
#endif
#define SA_Q8X_CALL(K, M) SA_FN(sa_q8x_rows)(K, M, xq, xd, xs, k, w, ldw, b, j0, j1, y, ldy)
    SA_QX_SWITCH(kind, m, SA_Q8X_CALL)
#undef SA_Q8X_CALL
}

/* y[r, j] = x[r] . p[j] for the m rows of x (m, k) and the rows j < rows of a dequantized panel p
 * (rows, k): a few rows of x against a type without a row kernel, where a BLAS GEMM would pack the
 * whole panel for them. */
static void SA_FN(sa_panel_dots)(const SA_T *x, int64_t k, int64_t m, const SA_T *p, int64_t rows, SA_T *y,
                                 int64_t ldy) {
    int64_t j = 0;
    for (; j + SA_VL <= rows; j += SA_VL)
        for (int64_t r = 0; r < m; r++) STORE(y + r * ldy + j, SA_FN(dots)(x + r * k, p + j * k, k, k));
    for (; j < rows; j++)
        for (int64_t r = 0; r < m; r++) y[r * ldy + j] = SA_FN(dot)(x + r * k, p + j * k, k);
}

/* out[r] = the weights of W's row j0 + r (k of them), r < rows: reference.dequantize to the bit. The
 * products d q are exact in float (an fp16 d times an integer of at most 8 bits), so d q + m rounds
 * once, as the reference's does, whether or not the compiler contracts it into an FMA; Q4_0's
 * d q - 8 d is exact too. */
static void SA_FN(sa_dequantize_rows)(int kind, const uint8_t *w, int64_t ldw, int64_t k, int64_t j0,
                                      int64_t rows, SA_T *out) {
    if (kind >= SA_QROW_KINDS) {  /* the types without kernels of their own: scalar, quant_ext.h */
        for (int64_t r = 0; r < rows; r++) sa_dequantize_row_ext(kind, w + (j0 + r) * ldw, k, out + r * k);
        return;
    }
    const int bytes = SA_QBYTES(kind), head = kind == SA_Q4_1 ? 4 : 2;
    const int scaled = SA_QTABLE && kind != SA_Q8_0;  /* sa_q4's table gives d q already */
    const int64_t nb = k / 32;
    SA_T d[SA_QCH] __attribute__((aligned(64))), c[SA_QCH] __attribute__((aligned(64)));
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *wr = w + (j0 + r) * ldw;
        for (int64_t i0 = 0; i0 < nb; i0 += SA_QCH) {
            const int nc = nb - i0 < SA_QCH ? (int)(nb - i0) : SA_QCH;
            SA_FN(sa_q_scales)(kind, wr + i0 * bytes, nc, d, c);
            for (int ib = 0; ib < nc; ib++) {
                const uint8_t *p = wr + (i0 + ib) * bytes;
                SA_T *o = out + r * k + (i0 + ib) * 32;
                const VEC dv = SA_FN(sa_qsplat)(d[ib]);
                VEC q[SA_QV];
                if (kind == SA_Q8_0)
                    SA_FN(sa_q8)(p + head, q);
                else
                    SA_FN(sa_q4)(p + head, q, dv);
#pragma GCC unroll 8
                for (int v = 0; v < SA_QV; v++) {
                    VEC x = scaled ? q[v] : q[v] * dv;
                    if (kind != SA_Q8_0) x += SA_FN(sa_qsplat)(c[ib]);
                    STORE(o + v * SA_VL, x);
                }
            }
        }
    }
}

#include "tmpl_q8k.h"
#include "tmpl_gemm_q8.h"

#endif
