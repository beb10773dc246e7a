/* ---- K-quants (Q4_K, Q5_K, Q6_K) with int8 activations, x as llama.cpp's Q8_K: each row of x
 * rounded to 8 bits a block of 256 (reference.round_q8 with block 256: one float scale d_x a
 * block) with the sums of its q per 16 (xb). A block of W is 256 weights w = d s_b q - dmin m_b
 * (Q4_K, Q5_K: sub-blocks b of 32, 6-bit s_b, m_b) or w = d s_b (q - 32) (Q6_K: sub-blocks of
 * 16, int8 s_b), so its product with x's block is
 *     d d_x sum_b s_b (q_x . q)_b  -  dmin d_x sum_b m_b sum(q_x)_b      (Q4_K, Q5_K)
 *     d d_x (sum_b s_b (q_x . q)_b  -  32 sum_b s_b sum(q_x)_b)          (Q6_K)
 * with every sum inside the parentheses an integer one: per 64 weights (one 512-bit register,
 * two sub-blocks of 32 or four of 16) the u8 q times the s8 q_x summed in pairs into int16
 * (vpmaddubsw: 63 x 127 x 2 stays within int16), then times the sub-blocks' scales as int16 and
 * summed in pairs into the int32 accumulator (vpdpwssd with AVX-512 VNNI, else vpmaddwd and an
 * add). One conversion to float and one FMA per block of 256, against one per 32 weights had x a
 * scale per 32: the arithmetic per byte of W is what holds a decoding step below the read rate.
 * The mins' and Q6_K's offsets come from xb, a handful of integer products a block. Template: the
 * x86 copies' 64-byte vectors are split in two on AVX2; the generic copy sums in plain C. */

typedef uint8_t SA_FN(k64u) __attribute__((vector_size(64)));   /* 64 weights' q, unsigned */
typedef int8_t SA_FN(k64s) __attribute__((vector_size(64)));    /* 64 of x's q */
typedef uint8_t SA_FN(k32u) __attribute__((vector_size(32)));
typedef int16_t SA_FN(k32h) __attribute__((vector_size(64)));   /* 32 int16: the scales of pairs */
typedef int32_t SA_FN(k16i) __attribute__((vector_size(64)));
typedef float SA_FN(k16f) __attribute__((vector_size(64)));
#define SA_R8(a) a, a, a, a, a, a, a, a
/* The row kernels' software prefetch: 512 bytes ahead in the stream of W's blocks (the next row's
 * block, ldw ahead, as before, halved the Q6_K product over rows of 8192 weights, 6.7 KB a row:
 * 11-12 GB/s against 22-25 at 512, Zen 4; rows of 2048 unchanged, 18-20 GB/s) */
#define SA_Q8K_AHEAD 512

static inline SA_FN(k32u) SA_FN(sa_k_load32)(const uint8_t *p) {
    SA_FN(k32u) v;
    memcpy(&v, p, 32);
    return v;
}
static inline SA_FN(k64s) SA_FN(sa_k_load64)(const int8_t *p) {
    SA_FN(k64s) v;
    memcpy(&v, p, 64);
    return v;
}
/* a's 32 bytes then b's */
static inline SA_FN(k64u) SA_FN(sa_k_join)(SA_FN(k32u) a, SA_FN(k32u) b) {
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                   21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41,
                                   42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62,
                                   63);
}

/* acc + lane l: sum over t < 4 of q[4 l + t] x[4 l + t] s[(4 l + t) / 2] */
static inline SA_FN(k16i) SA_FN(sa_k_dot)(SA_FN(k16i) acc, SA_FN(k64u) q, SA_FN(k64s) x, SA_FN(k32h) s) {
#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512BW__)
    const __m512i p = _mm512_maddubs_epi16((__m512i)q, (__m512i)x);
#if defined(__AVX512VNNI__)
    return (SA_FN(k16i))_mm512_dpwssd_epi32((__m512i)acc, p, (__m512i)s);
#else
    return acc + (SA_FN(k16i))_mm512_madd_epi16(p, (__m512i)s);
#endif
#elif SA_X86 && SA_VBYTES > 16
    __m256i qh[2], xh[2], sh[2], ah[2];
    memcpy(qh, &q, 64), memcpy(xh, &x, 64), memcpy(sh, &s, 64), memcpy(ah, &acc, 64);
    for (int u = 0; u < 2; u++)
        ah[u] = _mm256_add_epi32(ah[u], _mm256_madd_epi16(_mm256_maddubs_epi16(qh[u], xh[u]), sh[u]));
    memcpy(&acc, ah, 64);
    return acc;
#else
    for (int l = 0; l < 16; l++) {
        int32_t t = 0;
        for (int i = 4 * l; i < 4 * l + 4; i++) t += (int32_t)q[i] * x[i] * s[i / 2];
        acc[l] += t;
    }
    return acc;
#endif
}

static inline SA_T SA_FN(sa_k_hsum)(SA_FN(k16f) v) {
#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512BW__)
    return _mm512_reduce_add_ps((__m512)v);
#else
    SA_T s = 0;
    for (int l = 0; l < 8; l++) s += v[l] + v[l + 8];
    return s;
#endif
}

/* xq, xd, xb of the m rows of x (k a multiple of 256): per block of 256 values, a = max |x|, q =
 * rint(x (127 / a)) as int8 and d = a / 127 (reference.round_q8's float operations, block 256);
 * xd[r nbp + i] = d (rows nbp apart, as sa_quantize_q8's), xb[r k / 16 + t] = the sum of q over
 * values 16 t .. 16 t + 15 of row r. A block of zeros has d = 0; one with a NaN or an infinity
 * d = NaN (every product it enters is then NaN, as the reference's). */
static void SA_FN(sa_quantize_q8k)(const SA_T *x, int64_t k, int64_t m, int8_t *xq, SA_T *xd, int16_t *xb) {
    const int64_t nb = k / 256, nbp = (k / 32 + SA_QCH - 1) / SA_QCH * SA_QCH;
    for (int64_t r = 0; r < m; r++)
        for (int64_t i = 0; i < nb; i++) {
            const SA_T *b = x + r * k + i * 256;
            int8_t *q = xq + r * k + i * 256;
            SA_T a = 0;
            int nan = 0;
            for (int t = 0; t < 256; t++) {
                const SA_T v = b[t] < 0 ? -b[t] : b[t];
                nan |= !(v <= 3.40282347e38f);
                a = v > a ? v : a;
            }
            if (nan || a == 0) {
                memset(q, 0, 256);
            } else {
                const SA_T inv = 127.0f / a;
                for (int t = 0; t < 256; t++) q[t] = (int8_t)rintf(b[t] * inv);
            }
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int t = 0; t < 16; t++) s += q[16 * g + t];
                xb[r * (k / 16) + i * 16 + g] = (int16_t)s;
            }
            xd[r * nbp + i] = nan ? NAN : a / 127.0f;
        }
}

/* Q4_K / Q5_K's scales s_b and mins m_b (6 bits each, 12 bytes at p) */
static inline void SA_FN(sa_k_scales)(const uint8_t *s, int *sc, int *mn) {
    for (int c = 0; c < 8; c++) {
        sc[c] = c < 4 ? s[c] & 63 : (s[c + 4] & 15) | (s[c - 4] >> 6) << 4;
        mn[c] = c < 4 ? s[c + 4] & 63 : (s[c + 4] >> 4) | (s[c] >> 6) << 4;
    }
}

#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512BW__)
/* The AVX-512 copies' row: sa_q8k_row's arithmetic in intrinsics. The q of 64 weights: a 256-bit
 * load and its nibbles joined (Q4_K, Q5_K: a pair of sub-blocks; Q6_K: with the 2 high bits, a
 * quarter of a half); the scales as int16 lanes by one vpshufb (Q4_K, Q5_K: a pair's two scales
 * from the 8 repeated in every 128-bit lane) or vpermw (Q6_K: four per-16 scales); the offsets'
 * integer sums by vpmaddwd of x's per-16 sums against the mins (each twice) or Q6_K's scales. */
static inline __m512i SA_FN(sa_k_acc)(__m512i acc, __m512i q, const int8_t *x, __m512i s) {
    const __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512((const void *)x));
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(acc, p, s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, s));
#endif
}

static inline __attribute__((always_inline)) void SA_FN(sa_q8k_row)(const int kind, const int M, const uint8_t *wj,
                                                                    int64_t ahead, const int8_t *xq, const SA_T *xd,
                                                                    const int16_t *xb, int64_t k,
                                                                    SA_FN(k16f) *fa, SA_T *off) {
    const int bytes = SA_QBYTES(kind);
    const int64_t nb = k / 256, nbp = (k / 32 + SA_QCH - 1) / SA_QCH * SA_QCH, nx = k / 16;
    const __m512i m4 = _mm512_set1_epi8(15), m2 = _mm512_set1_epi8(3), m30 = _mm512_set1_epi8(0x30);
    const __m512i one = _mm512_set1_epi8(1);
    __m256 moff[SA_QROWS];  /* the offsets' terms lane-wise, summed at the end */
#pragma GCC unroll 8
    for (int r = 0; r < M; r++) moff[r] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        const uint8_t *p = wj + blk * bytes;
        if (ahead) {
            __builtin_prefetch(p + ahead, 0, SA_QLOC);
            __builtin_prefetch(p + ahead + 64, 0, SA_QLOC);
            __builtin_prefetch(p + ahead + 128, 0, SA_QLOC);
            __builtin_prefetch(p + ahead + bytes - 1, 0, SA_QLOC);
        }
        const int8_t *x0 = xq + blk * 256;
        __m512i acc[SA_QROWS][2];
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
        if (kind == SA_Q6_K) {
            const SA_T d = SA_FN(sa_q8_half)(p + 208);
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 192)));
            const __m512i scz = _mm512_castsi256_si512(sc16);
            for (int h = 0; h < 2; h++) {
                const __m512i ac = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(
                    (const __m256i *)(p + 64 * h))), _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32)), 1);
                const __m256i top = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
                const __m512i t = _mm512_inserti64x4(_mm512_castsi256_si512(top), _mm256_srli_epi16(top, 2), 1);
                /* (ac & 15) | (t & 3) << 4, and (ac >> 4 & 15) | (t & 0x30) */
                const __m512i q0 = _mm512_or_si512(_mm512_and_si512(ac, m4),
                                                   _mm512_slli_epi16(_mm512_and_si512(t, m2), 4));
                const __m512i q1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ac, 4), m4),
                                                   _mm512_and_si512(t, m30));
                const __m512i i0 = _mm512_set_epi16(SA_R8(8 * h + 3), SA_R8(8 * h + 2), SA_R8(8 * h + 1),
                                                    SA_R8(8 * h));
                const __m512i i1 = _mm512_add_epi16(i0, _mm512_set1_epi16(4));
                const __m512i s0 = _mm512_permutexvar_epi16(i0, scz), s1 = _mm512_permutexvar_epi16(i1, scz);
#pragma GCC unroll 8
                for (int r = 0; r < M; r++) {
                    acc[r][0] = SA_FN(sa_k_acc)(acc[r][0], q0, x0 + r * k + 128 * h, s0);
                    acc[r][1] = SA_FN(sa_k_acc)(acc[r][1], q1, x0 + r * k + 128 * h + 64, s1);
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < M; r++) {
                const __m256i bs = _mm256_loadu_si256((const __m256i *)(xb + r * nx + blk * 16));
                const __m512i corr = _mm512_zextsi256_si512(_mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
                const __m512i v = _mm512_sub_epi32(_mm512_add_epi32(acc[r][0], acc[r][1]), corr);
                fa[r] += (SA_FN(k16f))_mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(d * xd[r * nbp + blk]));
            }
        } else {
            const SA_T d = SA_FN(sa_q8_half)(p), dmin = SA_FN(sa_q8_half)(p + 2);
            uint32_t u[3];
            memcpy(u, p + 4, 12);
            const uint32_t sc_lo = u[0] & 0x3f3f3f3f, mn_lo = u[1] & 0x3f3f3f3f;
            const uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | ((u[0] >> 6) & 0x03030303) << 4;
            const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0f) | ((u[1] >> 6) & 0x03030303) << 4;
            /* the 8 scales as int16 in every 128-bit lane; pair c's lanes by one byte shuffle */
            const __m512i scz = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(
                _mm_cvtsi64_si128((long long)((uint64_t)sc_hi << 32 | sc_lo))));
            const __m128i mn8 = _mm_cvtsi64_si128((long long)((uint64_t)mn_hi << 32 | mn_lo));
            const __m256i mn2 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));  /* each min twice */
            const uint8_t *qs = p + bytes - 128;
            __m512i high = _mm512_setzero_si512();
            if (kind == SA_Q5_K) {
                const __m256i h = _mm256_loadu_si256((const __m256i *)(p + 16));
                high = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
            }
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
                __m512i q = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4),
                                                                1), m4);
                if (kind == SA_Q5_K) {  /* bit 2c (low half) or 2c + 1 (high half) of qh, as 16 */
                    const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)),
                                                          _mm256_set1_epi16((short)(2 * c + 1)), 1);
                    q = _mm512_or_si512(q, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(high, sh), one), 4));
                }
                /* words 2c (low half) and 2c + 1 (high half) of each lane's 8 scales */
                const __m512i pick = _mm512_inserti64x4(_mm512_set1_epi16((short)((4 * c + 1) << 8 | 4 * c)),
                                                        _mm256_set1_epi16((short)((4 * c + 3) << 8 | (4 * c + 2))), 1);
                const __m512i s = _mm512_shuffle_epi8(scz, pick);
#pragma GCC unroll 8
                for (int r = 0; r < M; r++) acc[r][c & 1] = SA_FN(sa_k_acc)(acc[r][c & 1], q, x0 + r * k + 64 * c, s);
            }
#pragma GCC unroll 8
            for (int r = 0; r < M; r++) {
                const SA_T dx = xd[r * nbp + blk];
                const __m256i bs = _mm256_loadu_si256((const __m256i *)(xb + r * nx + blk * 16));
                fa[r] += (SA_FN(k16f))_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc[r][0], acc[r][1])),
                                                    _mm512_set1_ps(d * dx));
                moff[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mn2)), _mm256_set1_ps(dmin * dx),
                                          moff[r]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; r++) {
        const __m128i h = (__m128i)_mm_add_ps(_mm256_castps256_ps128(moff[r]), _mm256_extractf128_ps(moff[r], 1));
        __m128 v = (__m128)h;
        v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        off[r] += _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
    }
}
#else
/* One row of W (kind Q4_K .. Q6_K, at wj, k / 256 blocks) against M rows of x: fa[r] (the blocks'
 * d d_x sum, lane-wise) and off[r] (the mins' term) accumulated */
static inline __attribute__((always_inline)) void SA_FN(sa_q8k_row)(const int kind, const int M, const uint8_t *wj,
                                                                    int64_t ahead, const int8_t *xq, const SA_T *xd,
                                                                    const int16_t *xb, int64_t k,
                                                                    SA_FN(k16f) *fa, SA_T *off) {
    const int bytes = SA_QBYTES(kind);
    const int64_t nb = k / 256, nbp = (k / 32 + SA_QCH - 1) / SA_QCH * SA_QCH, nx = k / 16;
    for (int64_t blk = 0; blk < nb; blk++) {
        const uint8_t *p = wj + blk * bytes;
        if (ahead) {
            __builtin_prefetch(p + ahead, 0, SA_QLOC);
            __builtin_prefetch(p + ahead + 64, 0, SA_QLOC);
            __builtin_prefetch(p + ahead + 128, 0, SA_QLOC);
            __builtin_prefetch(p + ahead + bytes - 1, 0, SA_QLOC);
        }
        const int8_t *x0 = xq + blk * 256;
        SA_FN(k16i) acc[SA_QROWS][2];
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) acc[r][0] = acc[r][1] = (SA_FN(k16i)){0};
        if (kind == SA_Q6_K) {
            const SA_T d = SA_FN(sa_q8_half)(p + 208);
            const int8_t *sc = (const int8_t *)(p + 192);
            const SA_FN(k32u) low = (SA_FN(k32u)){0} + 15, two = (SA_FN(k32u)){0} + 3;
            for (int h = 0; h < 2; h++) {
                const SA_FN(k32u) a = SA_FN(sa_k_load32)(p + 64 * h), c = SA_FN(sa_k_load32)(p + 64 * h + 32);
                const SA_FN(k32u) top = SA_FN(sa_k_load32)(p + 128 + 32 * h);
                const SA_FN(k64u) q0 = SA_FN(sa_k_join)((a & low) | (top & two) << 4,
                                                        (c & low) | ((top >> 2) & two) << 4);
                const SA_FN(k64u) q1 = SA_FN(sa_k_join)((a >> 4) | ((top >> 4) & two) << 4,
                                                        (c >> 4) | (top >> 6) << 4);
                const int8_t *s = sc + 8 * h;
                const SA_FN(k32h) s0 = {SA_R8(s[0]), SA_R8(s[1]), SA_R8(s[2]), SA_R8(s[3])};
                const SA_FN(k32h) s1 = {SA_R8(s[4]), SA_R8(s[5]), SA_R8(s[6]), SA_R8(s[7])};
#pragma GCC unroll 8
                for (int r = 0; r < M; r++) {
                    const int8_t *xr = x0 + r * k + 128 * h;
                    acc[r][0] = SA_FN(sa_k_dot)(acc[r][0], q0, SA_FN(sa_k_load64)(xr), s0);
                    acc[r][1] = SA_FN(sa_k_dot)(acc[r][1], q1, SA_FN(sa_k_load64)(xr + 64), s1);
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < M; r++) {
                const int16_t *b = xb + r * nx + blk * 16;
                int32_t corr = 0;
                for (int g = 0; g < 16; g++) corr += (int32_t)sc[g] * b[g];
                SA_FN(k16i) v = acc[r][0] + acc[r][1];
                v[0] -= 32 * corr;
                fa[r] += __builtin_convertvector(v, SA_FN(k16f)) * (d * xd[r * nbp + blk]);
            }
        } else {
            const SA_T d = SA_FN(sa_q8_half)(p), dmin = SA_FN(sa_q8_half)(p + 2);
            int sc[8], mn[8];
            SA_FN(sa_k_scales)(p + 4, sc, mn);
            const uint8_t *qs = p + bytes - 128;
            const SA_FN(k32u) low = (SA_FN(k32u)){0} + 15, one = (SA_FN(k32u)){0} + 1;
            SA_FN(k32u) high = {0};
            if (kind == SA_Q5_K) high = SA_FN(sa_k_load32)(p + 16);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const SA_FN(k32u) v = SA_FN(sa_k_load32)(qs + 32 * c);
                SA_FN(k32u) lo = v & low, hi = v >> 4;
                if (kind == SA_Q5_K) {
                    lo |= ((high >> (2 * c)) & one) << 4;
                    hi |= ((high >> (2 * c + 1)) & one) << 4;
                }
                const SA_FN(k64u) q = SA_FN(sa_k_join)(lo, hi);
                const int16_t s0 = (int16_t)sc[2 * c], s1 = (int16_t)sc[2 * c + 1];
                const SA_FN(k32h) s = {SA_R8(s0), SA_R8(s0), SA_R8(s1), SA_R8(s1)};
#pragma GCC unroll 8
                for (int r = 0; r < M; r++)
                    acc[r][c & 1] = SA_FN(sa_k_dot)(acc[r][c & 1], q, SA_FN(sa_k_load64)(x0 + r * k + 64 * c), s);
            }
#pragma GCC unroll 8
            for (int r = 0; r < M; r++) {
                const int16_t *b = xb + r * nx + blk * 16;
                int32_t msum = 0;
                for (int c = 0; c < 8; c++) msum += mn[c] * ((int32_t)b[2 * c] + b[2 * c + 1]);
                const SA_T dx = xd[r * nbp + blk];
                fa[r] += __builtin_convertvector(acc[r][0] + acc[r][1], SA_FN(k16f)) * (d * dx);
                off[r] += dmin * dx * (SA_T)msum;
            }
        }
    }
}

#endif

/* y[:m, j0:j1] = round_q8(x, 256) W[j0:j1]^T (+ b) for W's kind Q4_K, Q5_K or Q6_K, x given as
 * sa_quantize_q8k's xq, xd, xb; W prefetched SA_Q8K_AHEAD bytes ahead. */
static inline __attribute__((always_inline)) void SA_FN(sa_q8k_rows)(const int kind, const int M, const int8_t *xq,
                                                                     const SA_T *xd, const int16_t *xb, int64_t k,
                                                                     const uint8_t *w, int64_t ldw, const SA_T *b,
                                                                     int64_t j0, int64_t j1, SA_T *y, int64_t ldy) {
    for (int64_t j = j0; j < j1; j++) {
        SA_FN(k16f) fa[SA_QROWS];
        SA_T off[SA_QROWS];
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) fa[r] = (SA_FN(k16f)){0}, off[r] = 0;
        SA_FN(sa_q8k_row)(kind, M, w + j * ldw, SA_Q8K_AHEAD, xq, xd, xb, k, fa, off);
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) y[r * ldy + j] = SA_FN(sa_k_hsum)(fa[r]) - off[r] + (b ? b[j] : 0);
    }
}

#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512BW__) && defined(__AVX512VNNI__)
/* a[r] += one run's 16 rows of 4 + 4 weights (lo, hi: bytes of the rows' lanes) against x's 8 bytes
 * at xq + r k + at, each 4 broadcast, for the M rows of x */
static inline __attribute__((always_inline)) void SA_FN(sa_k16_run)(const int M, __m512i *a, __m512i lo, __m512i hi,
                                                                    const int8_t *xq, int64_t k, int64_t at) {
#pragma GCC unroll 8
    for (int r = 0; r < M; r++) {
        int32_t x0, x1;
        memcpy(&x0, xq + r * k + at, 4);
        memcpy(&x1, xq + r * k + at + 4, 4);
        a[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a[r], lo, _mm512_set1_epi32(x0)), hi, _mm512_set1_epi32(x1));
    }
}

/* Q6_K16's low run c of the super-block at p as the 16 rows' 6-bit values (q, 0 .. 63): *lo the
 * first 4 weights of each row's 8, *hi the others; hv: high run c / 2. The high bits go to bits
 * 4, 5 from bits 0, 1 (low nibbles) and 2, 3 (high) of hv for an even c, 4, 5 and 6, 7 for odd. */
static inline __attribute__((always_inline)) void SA_FN(sa_q6k16_bytes)(const uint8_t *p, int c, __m512i hv,
                                                                        __m512i *lo, __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    const __m512i hl = c & 1 ? hv : _mm512_slli_epi16(hv, 4);
    const __m512i hh = c & 1 ? _mm512_srli_epi16(hv, 2) : _mm512_slli_epi16(hv, 2);
    const __m512i v = _mm512_loadu_si512((const void *)(p + SA_Q6K16_LOW(c)));
    *lo = _mm512_or_si512(_mm512_and_si512(v, m4), _mm512_and_si512(hl, m30));
    *hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), _mm512_and_si512(hh, m30));
}

/* y[:M, g:g + 16] (+ b[g:g + 16]) for the 16 rows of the group at wg (rows16.h's layout), x as
 * sa_q8k_rows's: per sub-block b and row of x, a[r] = sum_t q x (16 rows' lanes: vpdpbusd of a
 * run's nibbles against 4 bytes of x broadcast), then s_b a[r] and m_b sum(q_x)_b as int32 lanes
 * (exact: 63 x 60960 x 8 < 2^31); a super-block adds d d_x and dmin d_x times them, as floats. */
static inline __attribute__((always_inline)) void SA_FN(sa_q4k16_group)(const int M, const uint8_t *wg,
                                                                        const int8_t *xq, const SA_T *xd,
                                                                        const int16_t *xb, int64_t k,
                                                                        const SA_T *b, SA_T *y, int64_t ldy) {
    const int64_t nb = k / 256, nbp = (k / 32 + SA_QCH - 1) / SA_QCH * SA_QCH, nx = k / 16;
    const __m512i m4 = _mm512_set1_epi8(15), m3 = _mm512_set1_epi8(3);
    /* the high bits' shift of sub-block 2 p (128-bit lane p: 0, 4, 0, 4) and of 2 p + 1 (2, 6, 2, 6) */
    const __m512i ce = _mm512_set_epi16(SA_R8(4), SA_R8(0), SA_R8(4), SA_R8(0));
    const __m512i co = _mm512_add_epi16(ce, _mm512_set1_epi16(2));
    __m512 fa[SA_QROWS];
#pragma GCC unroll 8
    for (int r = 0; r < M; r++) fa[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *p = wg + SA_Q4K16_SUPER * i;
        __builtin_prefetch(p + 2 * SA_Q4K16_SUPER, 0, SA_QLOC);
        __builtin_prefetch(p + 2 * SA_Q4K16_SUPER + 64, 0, SA_QLOC);
        /* the rest of its scales and mins (its runs' lines: with the sub-blocks), for one row of x
         * too: a decoding step streams W from memory, where the hardware's prefetch alone left the
         * 1.1B model's step 5% slower on 2 threads (bench/gguf_decode.py, Xeon; one thread and
         * from cache: within 2-4%) */
        __builtin_prefetch(p + 2 * SA_Q4K16_SUPER + 128, 0, SA_QLOC);
        __builtin_prefetch(p + 2 * SA_Q4K16_SUPER + 192, 0, SA_QLOC);
        /* the 16 rows' 6-bit scales and mins: lane p of se / so the sub-block 2 p / 2 p + 1 */
        const __m512i sl = _mm512_loadu_si512((const void *)(p + 64)), ml = _mm512_loadu_si512((const void *)(p + 160));
        const __m512i sh0 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 128)));
        const __m512i mh0 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 224)));
        const __m512i sh = _mm512_shuffle_i64x2(sh0, sh0, 0x50), mh = _mm512_shuffle_i64x2(mh0, mh0, 0x50);
#define SA_K16_SIX(lo, hi, c) _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hi, c), m3), 4))
        const __m512i se = SA_K16_SIX(_mm512_and_si512(sl, m4), sh, ce);
        const __m512i so = SA_K16_SIX(_mm512_and_si512(_mm512_srli_epi16(sl, 4), m4), sh, co);
        const __m512i me = SA_K16_SIX(_mm512_and_si512(ml, m4), mh, ce);
        const __m512i mo = SA_K16_SIX(_mm512_and_si512(_mm512_srli_epi16(ml, 4), m4), mh, co);
#undef SA_K16_SIX
        /* m_b sum(q_x)_b summed over the super-block's 8 sub-blocks as 4 vpdpwssd a row: lane l of mp[c]
         * holds row l's mins of sub-blocks 2c and 2c + 1 as two int16, each row's x the sums of those
         * two sub-blocks (|sum| <= 32 x 127 fits int16). The same integers as a product a sub-block. */
        __m512i mp[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m128i e8, o8;
            switch (c) {  /* the lane as a constant (vextracti32x4's immediate) */
                case 0: e8 = _mm512_castsi512_si128(me), o8 = _mm512_castsi512_si128(mo); break;
                case 1: e8 = _mm512_extracti32x4_epi32(me, 1), o8 = _mm512_extracti32x4_epi32(mo, 1); break;
                case 2: e8 = _mm512_extracti32x4_epi32(me, 2), o8 = _mm512_extracti32x4_epi32(mo, 2); break;
                default: e8 = _mm512_extracti32x4_epi32(me, 3), o8 = _mm512_extracti32x4_epi32(mo, 3); break;
            }
            mp[c] = _mm512_or_si512(_mm512_cvtepu8_epi32(e8), _mm512_slli_epi32(_mm512_cvtepu8_epi32(o8), 16));
        }
        __m512i isum[SA_QROWS], msum[SA_QROWS];
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) {
            /* the 8 sums of 32 (from xb's 16 sums of 16) as int16 pairs: words 0, 1 and 4, 5 of pk */
            const __m256i s32x = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(xb + r * nx + 16 * i)),
                                                   _mm256_set1_epi16(1));
            const __m256i pk = _mm256_packs_epi32(s32x, s32x);
            __m512i acc = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mp[0],
                                              _mm512_set1_epi32(_mm256_extract_epi32(pk, 0)));
            acc = _mm512_dpwssd_epi32(acc, mp[1], _mm512_set1_epi32(_mm256_extract_epi32(pk, 1)));
            acc = _mm512_dpwssd_epi32(acc, mp[2], _mm512_set1_epi32(_mm256_extract_epi32(pk, 4)));
            msum[r] = _mm512_dpwssd_epi32(acc, mp[3], _mm512_set1_epi32(_mm256_extract_epi32(pk, 5)));
            isum[r] = _mm512_setzero_si512();
        }
#pragma GCC unroll 8
        for (int sb = 0; sb < 8; sb++) {
            const __m512i s6 = sb & 1 ? so : se;
            __m128i s8;
            switch (sb / 2) {  /* the lane as a constant (vextracti32x4's immediate) */
                case 0: s8 = _mm512_castsi512_si128(s6); break;
                case 1: s8 = _mm512_extracti32x4_epi32(s6, 1); break;
                case 2: s8 = _mm512_extracti32x4_epi32(s6, 2); break;
                default: s8 = _mm512_extracti32x4_epi32(s6, 3); break;
            }
            const __m512i s32 = _mm512_cvtepu8_epi32(s8);
            /* the runs two super-blocks ahead, as the stream goes (the hardware's prefetch alone
             * left the 8-row products waiting on their loads; three ahead: a slower step) */
#pragma GCC unroll 4
            for (int l = 0; l < 4; l++)
                __builtin_prefetch(p + 2 * SA_Q4K16_SUPER + 256 + 256 * sb + 64 * l, 0, SA_QLOC);
            __m512i a[SA_QROWS];
#pragma GCC unroll 8
            for (int r = 0; r < M; r++) a[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int c = 4 * sb; c < 4 * sb + 4; c++) {
                const __m512i v = _mm512_loadu_si512((const void *)(p + 256 + 64 * c));
                SA_FN(sa_k16_run)(M, a, _mm512_and_si512(v, m4), _mm512_and_si512(_mm512_srli_epi16(v, 4), m4), xq, k,
                                  256 * i + 8 * c);
            }
#pragma GCC unroll 8
            for (int r = 0; r < M; r++) isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(a[r], s32));
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) {
            const __m512 dx = _mm512_set1_ps(xd[r * nbp + i]);
            fa[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(d, dx), fa[r]);
            fa[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[r]), _mm512_mul_ps(dmin, dx), fa[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; r++)
        _mm512_storeu_ps(y + r * ldy, b ? _mm512_add_ps(fa[r], _mm512_loadu_ps(b)) : fa[r]);
}
/* y[:M, g:g + 16] (+ b[g:g + 16]) for the 16 rows of the Q6_K group at wg (rows16.h's SA_Q6_K16
 * layout), x as sa_q8k_rows's: per sub-block s of 16 weights and row of x, a[r] = sum_t q x (q the
 * 6 bits, 0 .. 63: vpdpbusd of 16 rows' lanes as Q4_K's), isum[r] += sc_s a[r]; the q - 32 of the
 * weights as 32 sum_s sc_s sum(q_x)_s from x's sums of 16 (8 vpdpwssd a row against the scales'
 * pairs); all int32 and exact (16 x 63 x 128 x 128 x 16 < 2^31), a super-block adds d d_x times
 * it, as floats. */
static inline __attribute__((always_inline)) void SA_FN(sa_q6k16_group)(const int M, const uint8_t *wg,
                                                                        const int8_t *xq, const SA_T *xd,
                                                                        const int16_t *xb, int64_t k,
                                                                        const SA_T *b, SA_T *y, int64_t ldy) {
    const int64_t nb = k / 256, nbp = (k / 32 + SA_QCH - 1) / SA_QCH * SA_QCH, nx = k / 16;
    __m512 fa[SA_QROWS];
#pragma GCC unroll 8
    for (int r = 0; r < M; r++) fa[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *p = wg + SA_Q6K16_SUPER * i;
#pragma GCC unroll 5
        for (int l = 0; l < 5; l++) __builtin_prefetch(p + 2 * SA_Q6K16_SUPER + 64 * l, 0, SA_QLOC);  /* d, scales */
        /* lane l of sp[c]: row l's scales of sub-blocks 2 c and 2 c + 1, two int16 */
        __m512i sp[8], isum[SA_QROWS];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) sp[c] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p + 32 + 32 * c)));
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) {
            __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {  /* x's sums of sub-blocks 2 c and 2 c + 1, side by side in xb */
                int32_t pair;
                memcpy(&pair, xb + r * nx + 16 * i + 2 * c, 4);
                acc = _mm512_dpwssd_epi32(acc, sp[c], _mm512_set1_epi32(pair));
            }
            isum[r] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(acc, 5));
        }
#pragma GCC unroll 16
        for (int s = 0; s < 16; s++) {
            const __m512i s32 = s & 1 ? _mm512_srai_epi32(sp[s / 2], 16)
                                      : _mm512_srai_epi32(_mm512_slli_epi32(sp[s / 2], 16), 16);
            /* the super-block two ahead, as the stream goes (the one after next is its prefetchers') */
            __builtin_prefetch(p + 2 * SA_Q6K16_SUPER + 288 + 192 * s, 0, SA_QLOC);
            __builtin_prefetch(p + 2 * SA_Q6K16_SUPER + 288 + 192 * s + 64, 0, SA_QLOC);
            __builtin_prefetch(p + 2 * SA_Q6K16_SUPER + 288 + 192 * s + 128, 0, SA_QLOC);
            const __m512i hv = _mm512_loadu_si512((const void *)(p + SA_Q6K16_HIGH(s)));
            __m512i a[SA_QROWS];
#pragma GCC unroll 8
            for (int r = 0; r < M; r++) a[r] = _mm512_setzero_si512();
#pragma GCC unroll 2
            for (int c = 2 * s; c < 2 * s + 2; c++) {
                __m512i lo, hi;
                SA_FN(sa_q6k16_bytes)(p, c, hv, &lo, &hi);
                SA_FN(sa_k16_run)(M, a, lo, hi, xq, k, 256 * i + 8 * c);
            }
#pragma GCC unroll 8
            for (int r = 0; r < M; r++) isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(a[r], s32));
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#pragma GCC unroll 8
        for (int r = 0; r < M; r++)
            fa[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(d, _mm512_set1_ps(xd[r * nbp + i])), fa[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; r++)
        _mm512_storeu_ps(y + r * ldy, b ? _mm512_add_ps(fa[r], _mm512_loadu_ps(b)) : fa[r]);
}
#define SA_K16_CASE(M, CALL) case M: CALL(M); break;
#endif

/* sa_linear_q8k_rows for W in rows16.h's layouts (kind SA_Q4_K16 or SA_Q6_K16): the whole groups
 * in [j0, j1) by sa_q4k16_group or sa_q6k16_group (AVX-512 VNNI copies), other rows and copies
 * unpacked to the file's blocks and multiplied as Q4_K or Q6_K (the same sums; silkattn._api makes
 * the layouts only where the VNNI copy runs). NaN rows if the row's buffer cannot be had. */
static void SA_FN(sa_linear_q8k_rows)(int kind, const int8_t *xq, const SA_T *xd, const int16_t *xb, int64_t k,
                                      int64_t m, const uint8_t *w, int64_t ldw, const SA_T *b, int64_t j0,
                                      int64_t j1, SA_T *y, int64_t ldy);
static void SA_FN(sa_k16_rows)(int kind, const int8_t *xq, const SA_T *xd, const int16_t *xb, int64_t k,
                               int64_t m, const uint8_t *w, int64_t ldw, const SA_T *b, int64_t j0, int64_t j1,
                               SA_T *y, int64_t ldy) {
    int64_t g0 = j1, g1 = j1;  /* the whole groups [g0, g1) */
#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512BW__) && defined(__AVX512VNNI__)
    g0 = (j0 + 15) / 16 * 16, g1 = j1 / 16 * 16;
    if (g1 < g0) g0 = g1 = j1;
    for (int64_t g = g0; g < g1; g += 16) {
#define SA_K16_CALL(M) SA_FN(sa_q4k16_group)(M, w + g * ldw, xq, xd, xb, k, b ? b + g : NULL, y + g, ldy)
#define SA_K616_CALL(M) SA_FN(sa_q6k16_group)(M, w + g * ldw, xq, xd, xb, k, b ? b + g : NULL, y + g, ldy)
        if (kind == SA_Q6_K16) {
            switch ((int)m) {
                SA_K16_CASE(1, SA_K616_CALL) SA_K16_CASE(2, SA_K616_CALL) SA_K16_CASE(3, SA_K616_CALL)
                SA_K16_CASE(4, SA_K616_CALL) SA_K16_CASE(5, SA_K616_CALL) SA_K16_CASE(6, SA_K616_CALL)
                SA_K16_CASE(7, SA_K616_CALL) SA_K16_CASE(8, SA_K616_CALL)
                default: break;
            }
            continue;
        }
        switch ((int)m) {
            SA_K16_CASE(1, SA_K16_CALL) SA_K16_CASE(2, SA_K16_CALL) SA_K16_CASE(3, SA_K16_CALL)
            SA_K16_CASE(4, SA_K16_CALL) SA_K16_CASE(5, SA_K16_CALL) SA_K16_CASE(6, SA_K16_CALL)
            SA_K16_CASE(7, SA_K16_CALL) SA_K16_CASE(8, SA_K16_CALL)
            default: break;
        }
#undef SA_K616_CALL
#undef SA_K16_CALL
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
        if (kind == SA_Q6_K16)
            sa_q6k16_unpack_row(w, ldw, j, row);
        else
            sa_q4k16_unpack_row(w, ldw, j, row);
        SA_FN(sa_linear_q8k_rows)(kind == SA_Q6_K16 ? SA_Q6_K : SA_Q4_K, xq, xd, xb, k, m, row, ldw,
                                  b ? b + j : NULL, 0, 1, y + j, ldy);
    }
    free(row);
}

#define SA_Q8K_SWITCH(kind, m, CALL)                                                               \
    switch ((kind) * SA_QROWS + (int)(m) - 1) {                                                    \
        SA_QCASES(SA_Q4_K, CALL)                                                                   \
        SA_QCASES(SA_Q5_K, CALL)                                                                   \
        SA_QCASES(SA_Q6_K, CALL)                                                                   \
        default: break;                                                                            \
    }

static void SA_FN(sa_linear_q8k_rows)(int kind, const int8_t *xq, const SA_T *xd, const int16_t *xb, int64_t k,
                                      int64_t m, const uint8_t *w, int64_t ldw, const SA_T *b, int64_t j0,
                                      int64_t j1, SA_T *y, int64_t ldy) {
    if (kind == SA_Q4_K16 || kind == SA_Q6_K16) {
        SA_FN(sa_k16_rows)(kind, xq, xd, xb, k, m, w, ldw, b, j0, j1, y, ldy);
        return;
    }
#define SA_Q8K_CALL(K, M) SA_FN(sa_q8k_rows)(K, M, xq, xd, xb, k, w, ldw, b, j0, j1, y, ldy)
    SA_Q8K_SWITCH(kind, m, SA_Q8K_CALL)
#undef SA_Q8K_CALL
}
#undef SA_Q8K_SWITCH
#undef SA_R8
#undef SA_Q8K_AHEAD
#ifdef SA_K16_CASE
#undef SA_K16_CASE
#endif
