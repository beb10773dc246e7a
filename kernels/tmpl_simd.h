/* Vector helpers for one (SA_T, SA_VBYTES) instance: included by the op templates.
 * GCC vector extensions: the same source becomes AVX2 (32-byte) or SSE/NEON (16-byte) code. */
/* once per instance, however many templates include it (a fused kernel includes several) */
#ifndef SA_SIMD_DONE
#define SA_SIMD_DONE
#define SA_VL ((int)(SA_VBYTES / sizeof(SA_T)))  /* lanes */
typedef SA_T SA_FN(vec) __attribute__((vector_size(SA_VBYTES)));
typedef SA_T SA_FN(uvec) __attribute__((vector_size(SA_VBYTES), aligned(sizeof(SA_T))));  /* unaligned */
typedef SA_I SA_FN(ivec) __attribute__((vector_size(SA_VBYTES)));
#define VEC SA_FN(vec)
#define IVEC SA_FN(ivec)
#define LOAD(p) (*(const SA_FN(uvec) *)(p))
#ifndef SA_ARGS
#define SA_ARGS(...) __VA_ARGS__  /* a braced list passed through a macro argument */
#endif
#define STORE(p, x) (*(SA_FN(uvec) *)(p) = (x))

/* x in every lane. x - 0 is x for every x, -0 included, so the compiler folds it to one broadcast
 * (from memory where x comes from memory); 0 + x is +0 for x = -0, which kept a scalar add before
 * every broadcast (one in each P V and GEMM step). */
static inline VEC SA_FN(splat)(SA_T x) { return x - (VEC){0}; }
/* select(m, a, b): a where the comparison mask m is set, else b */
static inline VEC SA_FN(select)(IVEC m, VEC a, VEC b) { return (VEC)((m & (IVEC)a) | (~m & (IVEC)b)); }
/* a > b ? a : b per lane (so vmax(a, NaN) is NaN): one max instruction on x86 */
static inline VEC SA_FN(vmax)(VEC a, VEC b) {
#if (defined(__x86_64__) || defined(__i386__)) && SA_VBYTES == 32 && SA_TBYTES == 4
    return __builtin_ia32_maxps256(a, b);
#elif (defined(__x86_64__) || defined(__i386__)) && SA_VBYTES == 32 && SA_TBYTES == 8
    return __builtin_ia32_maxpd256(a, b);
#elif (defined(__x86_64__) || defined(__i386__)) && SA_VBYTES == 16 && SA_TBYTES == 4
    return __builtin_ia32_maxps(a, b);
#elif (defined(__x86_64__) || defined(__i386__)) && SA_VBYTES == 16 && SA_TBYTES == 8
    return __builtin_ia32_maxpd(a, b);
#else
    return SA_FN(select)(a > b, a, b);
#endif
}

/* Sum of the lanes as a halving tree (lane i + lane i + w, w = VL/2, VL/4, ..., 1): log2(VL) dependent
 * adds instead of VL, which matters where a row's sum gates its next pass (layer_norm). */
static inline SA_T SA_FN(hsum)(VEC x) {
    for (int w = SA_VL / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) x[i] += x[i + w];
    return x[0];
}
/* The lane sums of SA_VL vectors at once, r[i] = sum of v[i]'s lanes: log2(SA_VL) levels of a
 * shuffle-and-add transpose (level B adds lanes B apart, taking alternate blocks of B lanes from
 * the two inputs), instead of one horizontal sum per vector. */
static inline VEC SA_FN(pairsum)(VEC a, VEC b, IVEC lo, IVEC hi) {
    return __builtin_shuffle(a, b, lo) + __builtin_shuffle(a, b, hi);
}
static inline VEC SA_FN(lane_sums)(const VEC *v) {
#if SA_X86 && SA_VBYTES == 64 && SA_TBYTES == 4 && defined(__AVX512F__)
    /* the same tree (every level adds the same pairs: the same bits) in immediate shuffles, vshufps
     * within 128-bit blocks for levels 1 and 2, vshuff32x4 across them for 3 and 4: the index-vector
     * form cost a register copy per two-source permute (it overwrites an input) and index reloads */
    __m512 w[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m512 a = (__m512)v[4 * i], b = (__m512)v[4 * i + 1], c = (__m512)v[4 * i + 2], d = (__m512)v[4 * i + 3];
        const __m512 ab = _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xdd));
        const __m512 cd = _mm512_add_ps(_mm512_shuffle_ps(c, d, 0x88), _mm512_shuffle_ps(c, d, 0xdd));
        w[i] = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x88), _mm512_shuffle_ps(ab, cd, 0xdd));
    }
    const __m512 x = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xdd));
    const __m512 y = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x88), _mm512_shuffle_f32x4(w[2], w[3], 0xdd));
    return (VEC)_mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xdd));
#else
#define SA_PS(a, b, lo, hi) SA_FN(pairsum)(a, b, (IVEC)lo, (IVEC)hi)
#if SA_VBYTES / SA_TBYTES == 2
    return SA_PS(v[0], v[1], SA_ARGS({0, 2}), SA_ARGS({1, 3}));
#elif SA_VBYTES / SA_TBYTES == 4
#define L1(a, b) SA_PS(a, b, SA_ARGS({0, 4, 2, 6}), SA_ARGS({1, 5, 3, 7}))
    return SA_PS(L1(v[0], v[1]), L1(v[2], v[3]), SA_ARGS({0, 1, 4, 5}), SA_ARGS({2, 3, 6, 7}));
#undef L1
#elif SA_VBYTES / SA_TBYTES == 8
#define L1(a, b) SA_PS(a, b, SA_ARGS({0, 8, 2, 10, 4, 12, 6, 14}), SA_ARGS({1, 9, 3, 11, 5, 13, 7, 15}))
#define L2(a, b) SA_PS(a, b, SA_ARGS({0, 1, 8, 9, 4, 5, 12, 13}), SA_ARGS({2, 3, 10, 11, 6, 7, 14, 15}))
    VEC x0 = L2(L1(v[0], v[1]), L1(v[2], v[3])), x1 = L2(L1(v[4], v[5]), L1(v[6], v[7]));
    return SA_PS(x0, x1, SA_ARGS({0, 1, 2, 3, 8, 9, 10, 11}), SA_ARGS({4, 5, 6, 7, 12, 13, 14, 15}));
#undef L1
#undef L2
#elif SA_VBYTES / SA_TBYTES == 16
#define L1(a, b) SA_PS(a, b, SA_ARGS({0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}), \
                       SA_ARGS({1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}))
#define L2(a, b) SA_PS(a, b, SA_ARGS({0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}), \
                       SA_ARGS({2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}))
#define L4(a, b) SA_PS(a, b, SA_ARGS({0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}), \
                       SA_ARGS({4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}))
    VEC x0 = L4(L2(L1(v[0], v[1]), L1(v[2], v[3])), L2(L1(v[4], v[5]), L1(v[6], v[7])));
    VEC x1 = L4(L2(L1(v[8], v[9]), L1(v[10], v[11])), L2(L1(v[12], v[13]), L1(v[14], v[15])));
    return SA_PS(x0, x1, SA_ARGS({0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}),
                 SA_ARGS({8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}));
#undef L1
#undef L2
#undef L4
#endif
#undef SA_PS
#endif
}

/* x[0:n] . w[0:n]: whole vectors in one chain of FMAs, then the tail one value at a time (a lone
 * key's score; dots below takes SA_VL keys at once). */
static inline SA_T SA_FN(dot)(const SA_T *x, const SA_T *w, int64_t n) {
    const int64_t nv = n - n % SA_VL;
    VEC c = SA_FN(splat)(0);
    int64_t d = 0;
    for (; d < nv; d += SA_VL) c += LOAD(x + d) * LOAD(w + d);
    SA_T s = SA_FN(hsum)(c);
    for (; d < n; d++) s += x[d] * w[d];
    return s;
}

/* r[u] = x[0:n] . w[u ld : u ld + n] for the SA_VL rows u of w: SA_VL independent chains of FMAs, their
 * sums taken by one transpose (lane_sums) instead of a horizontal sum per row. */
static inline __attribute__((always_inline)) VEC SA_FN(dots_body)(const SA_T *x, const SA_T *w, int64_t ld,
                                                                  int64_t n) {
    const int64_t nv = n - n % SA_VL;
    VEC c[SA_VL];
    /* row by row through one pointer (a loop over d outside would keep SA_VL row pointers live,
     * more than the integer registers) */
#pragma GCC unroll 16
    for (int u = 0; u < SA_VL; u++) {
        const SA_T *wu = w + u * ld;
        VEC cu = SA_FN(splat)(0);
#pragma GCC unroll 16
        for (int64_t d = 0; d < nv; d += SA_VL) cu += LOAD(x + d) * LOAD(wu + d);
        c[u] = cu;
    }
    VEC sums = SA_FN(lane_sums)(c);
    for (int64_t d = nv; d < n; d++)
        for (int u = 0; u < SA_VL; u++) sums[u] += x[d] * w[u * ld + d];
    return sums;
}
/* dots_body, its loop over d unrolled for the common head sizes: a chain of n / SA_VL FMAs a row,
 * the SA_VL chains in one straight run the core overlaps. A loop of runtime length a row left each
 * chain's latency (4 cycles an FMA) exposed: 16 rows x 4 FMAs took 256 cycles where the FMAs need
 * 64. The same operations in the same order: the same bits. */
static inline __attribute__((always_inline)) VEC SA_FN(dots)(const SA_T *x, const SA_T *w, int64_t ld, int64_t n) {
    if (n == 64) return SA_FN(dots_body)(x, w, ld, 64);
    if (n == 128) return SA_FN(dots_body)(x, w, ld, 128);
    if (n == 256 && SA_VBYTES / SA_TBYTES >= 8) return SA_FN(dots_body)(x, w, ld, 256);
    return SA_FN(dots_body)(x, w, ld, n);
}

static inline SA_T SA_FN(hmax)(VEC x) {
    SA_T s = x[0];
    for (int i = 1; i < SA_VL; i++) s = x[i] > s ? x[i] : s;
    return s;
}

/* e^r for |r| <= ln2/2: Taylor series to degree 7 (float) or 13 (double), error < 0.1 ulp. */
static inline VEC SA_FN(exp_poly)(VEC r) {
    VEC p;
    if (sizeof(SA_T) == 4) {
        p = SA_FN(splat)(1.0 / 720) + r * (SA_T)(1.0 / 5040);
    } else {
        p = SA_FN(splat)(1.0 / 479001600) + r * (SA_T)(1.0 / 6227020800.0);
        p = SA_FN(splat)(1.0 / 39916800) + r * p;
        p = SA_FN(splat)(1.0 / 3628800) + r * p;
        p = SA_FN(splat)(1.0 / 362880) + r * p;
        p = SA_FN(splat)(1.0 / 40320) + r * p;
        p = SA_FN(splat)(1.0 / 5040) + r * p;
        p = SA_FN(splat)(1.0 / 720) + r * p;
    }
    p = SA_FN(splat)(1.0 / 120) + r * p;
    p = SA_FN(splat)(1.0 / 24) + r * p;
    p = SA_FN(splat)(1.0 / 6) + r * p;
    p = SA_FN(splat)(0.5) + r * p;
    p = SA_FN(splat)(1.0) + r * p;
    return SA_FN(splat)(1.0) + r * p;
}

#define SA_MAGIC ((SA_T)(sizeof(SA_T) == 4 ? 12582912.0 : 6755399441055744.0))  /* 1.5 * 2^mantissa bits */
#define SA_MIN_EXP (sizeof(SA_T) == 4 ? -127 : -1023)  /* 2^SA_MIN_EXP is built as exactly 0 */

/* p * 2^n, where t = n + SA_MAGIC holds the integer n >= SA_MIN_EXP in its low mantissa bits.
 * n = SA_MIN_EXP gives an all-zero exponent field, i.e. exactly 0: results below the normal
 * range flush to 0, so a masked score weighs exactly nothing. */
static inline VEC SA_FN(scale_pow2)(VEC p, VEC t) {
    const int mant = sizeof(SA_T) == 4 ? 23 : 52, bias = sizeof(SA_T) == 4 ? 127 : 1023;
    IVEC n = (IVEC)t - (IVEC)SA_FN(splat)(SA_MAGIC);
    return p * (VEC)((n + bias) << mant);
}

/* 2^x for x <= 0 (attention's shifted scores), vectorised; NaN stays NaN, -inf gives 0. */
static inline VEC SA_FN(exp2v)(VEC x) {
    x = SA_FN(vmax)(SA_FN(splat)(SA_MIN_EXP), x);
    VEC t = x + SA_MAGIC;  /* rounds x to the nearest integer: no -ffast-math, so not folded away */
    VEC f = x - (t - SA_MAGIC);
    return SA_FN(scale_pow2)(SA_FN(exp_poly)(f * (SA_T)0.6931471805599453), t);
}

/* e^x for x <= 88 (float) / 709 (double), vectorised, with a two-part ln2 (Cody-Waite) so large
 * |x| keeps full accuracy; NaN stays NaN, -inf gives 0. */
static inline VEC SA_FN(expv)(VEC x) {
    x = SA_FN(vmax)(SA_FN(splat)(SA_MIN_EXP * (SA_T)0.6931471805599453), x);
    VEC t = x * (SA_T)1.4426950408889634 + SA_MAGIC;
    VEC n = t - SA_MAGIC;
    const SA_T ln2_hi = sizeof(SA_T) == 4 ? 0.693359375f : 0.6931471803691238;
    const SA_T ln2_lo = sizeof(SA_T) == 4 ? -2.12194440e-4f : 1.9082149292705877e-10;
    VEC r = (x - n * ln2_hi) - n * ln2_lo;
    return SA_FN(scale_pow2)(SA_FN(exp_poly)(r), t);
}
#endif  /* SA_SIMD_DONE */
