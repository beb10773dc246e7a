/* The weights of one row of W stored in the block types without a product kernel of their own
 * (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: silkattn.reference.dequantize gives the layouts), for the GEMM
 * path's panels: scalar code, one copy for every instruction set, its float operations those of
 * the reference in its order, FMA contraction off (where d s and d s q are exact, as for Q4_K's
 * 11-bit d, 6-bit s and 5-bit q, it would not change a bit; the pragma keeps it so for any type). */
#ifndef SA_QUANT_EXT_H
#define SA_QUANT_EXT_H
#include <stdint.h>
#include <string.h>
#include "quant_blocks.h"

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

static __attribute__((unused)) float sa_f16_bits(uint16_t h) {  /* the float16 of bits h, exactly */
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, f = h & 1023;
    uint32_t bits;
    if (e == 31) {
        bits = sign | 0x7f800000u | f << 13;
    } else if (e) {
        bits = sign | (e + 112) << 23 | f << 13;
    } else {
        const float v = (float)f * 0x1p-24f;  /* subnormal or zero: exact */
        memcpy(&bits, &v, 4);
        bits |= sign;
    }
    float r;
    memcpy(&r, &bits, 4);
    return r;
}

static __attribute__((unused)) float sa_f16_at(const uint8_t *p) {  /* the little-endian float16 at p, exactly */
    return sa_f16_bits((uint16_t)(p[0] | p[1] << 8));
}

/* x as float16 bits, rounded to nearest even (F16C's vcvtps2ph with _MM_FROUND_TO_NEAREST_INT,
 * numpy's astype(np.float16)): 65520 and up to inf, below the subnormals' half-step to zero, NaN
 * quiet (its payload's top bits). Integer operations only: no dependence on the FP environment. */
static __attribute__((unused)) uint16_t sa_f16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffff;
    if (a >= 0x7f800000u)
        return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 | (a >> 13 & 0x3ff) : 0));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
    if (a >= 0x38800000u)  /* a normal float16: round at bit 13, ties to the even one, the exponent rebiased */
        return (uint16_t)(sign | (((a + 0xfff + (a >> 13 & 1)) >> 13) - (112u << 10)));
    if (a <= 0x33000000u) return (uint16_t)sign;  /* 2^-25 and below: zero (2^-25 a tie to even 0) */
    const uint32_t s = 126 - (a >> 23), m = (a & 0x7fffff) | 0x800000;  /* a subnormal: m 2^-s units of 2^-24 */
    const uint32_t q = m >> s, rest = m & ((1u << s) - 1), halfway = 1u << (s - 1);
    return (uint16_t)(sign | (q + (rest > halfway || (rest == halfway && (q & 1)))));
}

/* Q5_0 / Q5_1: fp16 d, [fp16 m,] 4 bytes of fifth bits (bit j: weight j's bit 4), 16 of nibbles */
static __attribute__((unused)) void sa_q5_block(int kind, const uint8_t *p, float *o) {
    const int one = kind == SA_Q5_1;
    const float d = sa_f16_at(p), m = one ? sa_f16_at(p + 2) : 0.0f;
    const uint8_t *qh = p + (one ? 4 : 2), *qs = qh + 4;
    const uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    for (int j = 0; j < 16; j++) {
        const int lo = (qs[j] & 15) | ((h >> j) & 1) << 4, hi = (qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4;
        if (one) {
            o[j] = d * (float)lo + m;
            o[j + 16] = d * (float)hi + m;
        } else {
            o[j] = d * (float)(lo - 16);
            o[j + 16] = d * (float)(hi - 16);
        }
    }
}

/* Q4_K / Q5_K: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, [32 of fifth bits,] 128 of
 * nibbles: sub-block b (32 weights) w = (d s_b) q - (dmin m_b) */
static __attribute__((unused)) void sa_q45k_block(int kind, const uint8_t *p, float *o) {
    const float d = sa_f16_at(p), dmin = sa_f16_at(p + 2);
    const uint8_t *s = p + 4, *qh = p + 16, *qs = p + SA_QBYTES(kind) - 128;
    for (int b = 0; b < 8; b++) {
        const int sc = b < 4 ? s[b] & 63 : (s[b + 4] & 15) | (s[b - 4] >> 6) << 4;
        const int mn = b < 4 ? s[b + 4] & 63 : (s[b + 4] >> 4) | (s[b] >> 6) << 4;
        const float ds = d * (float)sc, dm = dmin * (float)mn;
        const uint8_t *q = qs + 32 * (b / 2);
        for (int l = 0; l < 32; l++) {
            int v = b % 2 ? q[l] >> 4 : q[l] & 15;
            if (kind == SA_Q5_K) v |= ((qh[l] >> b) & 1) << 4;
            o[32 * b + l] = ds * (float)v - dm;
        }
    }
}

/* Q6_K: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales, fp16 d: a half of 128 weights
 * takes 64 low bytes (low nibbles: weights 0-63, high: 64-127) and 32 high bytes (bits 2s, 2s + 1:
 * the quarter s); sub-block of 16 b: w = (d s_b) (q - 32) */
static __attribute__((unused)) void sa_q6k_block(const uint8_t *p, float *o) {
    const float d = sa_f16_at(p + 208);
    for (int e0 = 0; e0 < 256; e0 += 16) {  /* a sub-block of 16: one scale, one run of bytes */
        const int h = e0 / 128, s = e0 % 128 / 32, l0 = e0 % 32, shift = 2 * s;
        const uint8_t *low = p + 64 * h + 32 * (s % 2) + l0, *high = p + 128 + 32 * h + l0;
        const float ds = d * (float)(int8_t)p[192 + e0 / 16];
        for (int l = 0; l < 16; l++) {
            const int lo = s < 2 ? low[l] & 15 : low[l] >> 4;
            o[e0 + l] = ds * (float)((lo | ((high[l] >> shift) & 3) << 4) - 32);
        }
    }
}

/* o[0 .. k) = the weights of the row at w, kind one of Q5_0 .. Q6_K, k a multiple of its block */
static __attribute__((unused)) void sa_dequantize_row_ext(int kind, const uint8_t *w, int64_t k, float *o) {
    const int bytes = SA_QBYTES(kind), weights = SA_QWEIGHTS(kind);
    for (int64_t i = 0; i < k / weights; i++, w += bytes, o += weights) {
        if (kind == SA_Q5_0 || kind == SA_Q5_1)
            sa_q5_block(kind, w, o);
        else if (kind == SA_Q6_K)
            sa_q6k_block(w, o);
        else
            sa_q45k_block(kind, w, o);
    }
}

#pragma GCC pop_options
#endif
