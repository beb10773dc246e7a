/* Vector helpers for one (SA_T, SA_VBYTES) instance: included by the op templates.
 * GCC vector extensions: the same source becomes AVX2 (32-byte) or SSE/NEON (16-byte) code. */
#define SA_VL ((int)(SA_VBYTES / sizeof(SA_T)))  /* lanes */
typedef SA_T SA_FN(vec) __attribute__((vector_size(SA_VBYTES)));
typedef SA_T SA_FN(uvec) __attribute__((vector_size(SA_VBYTES), aligned(sizeof(SA_T))));  /* unaligned */
typedef SA_I SA_FN(ivec) __attribute__((vector_size(SA_VBYTES)));
#define VEC SA_FN(vec)
#define IVEC SA_FN(ivec)
#define LOAD(p) (*(const SA_FN(uvec) *)(p))
#define STORE(p, x) (*(SA_FN(uvec) *)(p) = (x))

static inline VEC SA_FN(splat)(SA_T x) { return (VEC){0} + x; }
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

static inline SA_T SA_FN(hsum)(VEC x) {
    SA_T s = 0;
    for (int i = 0; i < SA_VL; i++) s += x[i];
    return s;
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
