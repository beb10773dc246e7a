/* ---- The blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) with int8 activations on AVX-512: two blocks
 * a 512-bit register, x given as sa_quantize_q8's xq, xd, xs (reference.round_q8). Per block,
 * with W's q as unsigned bytes u and w = d (u - c) (c = 8 for Q4_0, 16 for Q5_0; 0 for Q8_0, whose
 * q is signed, and for Q4_1 and Q5_1, whose w = d u + m):
 *     x . w = d d_x (q_x . u)  -  c d xs  (+ m xs),      xs = d_x sum(q_x)
 * q_x . u one vpdpbusd (VNNI) or vpmaddubsw + vpmaddwd (Q8_0: |q| times q_x with q's sign); its 8
 * lanes to float times d d_x, the offset's term in the block's first lane. A pair's bytes come from one masked load (no byte past the pair is read):
 * its scales by one vpermw into 16 halves and one conversion (d for the pair's 16 lanes at once,
 * not a scalar F16C a block), its nibbles by one vpermw, a masked shift and an and, Q5's fifth
 * bits by a masked add of 16 under the 64-bit mask of the two blocks' qh. Only the AVX-512 (BW)
 * copies have these: their sa_linear_q8_rows and sa_linear_q8x_rows (Q5_0, Q5_1) call them. */

#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512BW__)

/* The q of the pair of blocks at p (two = 0: the first alone, the second's lanes zero) as unsigned
 * bytes, 32 a block; z: the pair's bytes (a masked load). */
static inline __attribute__((always_inline)) __m512i SA_FN(sa_q8p_q)(const int kind, const uint8_t *p, __m512i z,
                                                                     int two) {
    const int bytes = SA_QBYTES(kind);
    if (kind == SA_Q8_0) {  /* the two 32-byte runs at 2 and 36, signed */
        const __m256i a = _mm256_loadu_si256((const __m256i *)(p + 2));
        const __m256i b = two ? _mm256_loadu_si256((const __m256i *)(p + 36)) : _mm256_setzero_si256();
        return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    }
    const int o = kind == SA_Q4_0 ? 2 : kind == SA_Q4_1 ? 4 : kind == SA_Q5_0 ? 6 : 8;  /* qs's offset */
    /* words: block 0's 8 words of qs twice, then block 1's twice */
    const int w0 = o / 2, w1 = (bytes + o) / 2;
    const __m512i idx = _mm512_set_epi16(w1 + 7, w1 + 6, w1 + 5, w1 + 4, w1 + 3, w1 + 2, w1 + 1, w1,
                                         w1 + 7, w1 + 6, w1 + 5, w1 + 4, w1 + 3, w1 + 2, w1 + 1, w1,
                                         w0 + 7, w0 + 6, w0 + 5, w0 + 4, w0 + 3, w0 + 2, w0 + 1, w0,
                                         w0 + 7, w0 + 6, w0 + 5, w0 + 4, w0 + 3, w0 + 2, w0 + 1, w0);
    const __m512i y = _mm512_permutexvar_epi16(idx, z);
    /* the high nibbles in 128-bit lanes 1 and 3: weights 16-31 of each block */
    __m512i q = _mm512_and_si512(_mm512_mask_srli_epi16(y, (__mmask32)0xFF00FF00u, y, 4), _mm512_set1_epi8(15));
    if (kind == SA_Q5_0 || kind == SA_Q5_1) {
        const int h = kind == SA_Q5_0 ? 2 : 4;
        uint32_t h0, h1 = 0;
        memcpy(&h0, p + h, 4);
        if (two) memcpy(&h1, p + bytes + h, 4);
        q = _mm512_mask_add_epi8(q, _cvtu64_mask64((uint64_t)h1 << 32 | h0), q, _mm512_set1_epi8(16));
    }
    return q;
}

/* The pair's two float16 at byte offset `at` of each block (d, or Q4_1 / Q5_1's m), 8 lanes each */
static inline __m512 SA_FN(sa_q8p_halves)(const int kind, const uint8_t *p, __m512i z, int at, int two) {
    const int bytes = SA_QBYTES(kind);
    if (kind == SA_Q8_0) {  /* the second d at 34, past a 64-byte load's reach of two blocks: scalars */
        uint16_t a, b = 0;
        memcpy(&a, p, 2);
        if (two) memcpy(&b, p + 34, 2);
        return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_set1_epi16((short)a), _mm_set1_epi16((short)b), 1));
    }
    (void)two;  /* z holds zeros past a lone block */
    const __m512i idx = _mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_set1_epi16((short)(at / 2)),
                                                                       _mm_set1_epi16((short)((bytes + at) / 2)), 1));
    return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(idx, z)));
}

/* the pair's q_x . u, lane-wise, 4 bytes a lane (Q8_0: u is q, signed) */
static inline __m512i SA_FN(sa_q8p_dot)(const int kind, __m512i u, __m512i qx) {
    if (kind == SA_Q8_0)  /* |q| times q_x with q's sign (128 x 127 x 2 stays within int16) */
        qx = _mm512_mask_sub_epi8(qx, _mm512_movepi8_mask(u), _mm512_setzero_si512(), qx), u = _mm512_abs_epi8(u);
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, qx);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, qx), _mm512_set1_epi16(1));
#endif
}

/* J rows of W from j against M rows of x: y[r ldy + j + u] = x_r . W_(j + u) (+ b) */
static inline __attribute__((always_inline)) void SA_FN(sa_q8p_group)(const int kind, const int M, const int J,
                                                                      const int8_t *xq, const SA_T *xd,
                                                                      const SA_T *xs, int64_t k,
                                                                      const uint8_t *w, int64_t ldw, int64_t n,
                                                                      const SA_T *b, int64_t j, SA_T *y,
                                                                      int64_t ldy) {
    const int bytes = SA_QBYTES(kind);
    const int64_t nb = k / 32, nbp = (nb + SA_QCH - 1) / SA_QCH * SA_QCH;
    const float c = kind == SA_Q4_0 ? 8 : kind == SA_Q5_0 ? 16 : 0;
    const int offset = kind == SA_Q4_1 || kind == SA_Q5_1;
    const __mmask64 whole = bytes * 2 >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (2 * bytes)) - 1);
    const __mmask64 half = ((__mmask64)1 << bytes) - 1;
    /* lanes 0 and 8 from the pair's two floats; 0 .. 7 and 8 .. 15 from them */
    const __m512i first = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const uint8_t *ahead = j + (SA_QPF + 1) * J <= n ? w + (j + SA_QPF * J) * ldw : NULL;
    const int64_t last = n * ldw - 64;  /* the last offset in W a 64-byte load may start at */
    __m512 acc[SA_QROWS][4];
#pragma GCC unroll 8
    for (int r = 0; r < M; r++)
#pragma GCC unroll 4
        for (int u = 0; u < J; u++) acc[r][u] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i += 2) {
        const int two = i + 1 < nb;
        __m512i q[4];
        __m512 d[4], mw[4];
#pragma GCC unroll 4
        for (int u = 0; u < J; u++) {
            const uint8_t *p = w + (j + u) * ldw + i * bytes;
            if (ahead) {  /* the pair's bytes (up to 68) span two or three lines */
                __builtin_prefetch(ahead + u * ldw + i * bytes, 0, SA_QLOC);
                __builtin_prefetch(ahead + u * ldw + i * bytes + 63, 0, SA_QLOC);
            }
            /* a plain load where 64 bytes from p stay within W (rows j0 .. n), else the pair's alone:
             * a masked load costs several times a plain one, on Zen 4 at least */
            const __m512i z = kind == SA_Q8_0 ? _mm512_setzero_si512()
                              : two && p - w <= last ? _mm512_loadu_si512((const void *)p)
                                                 : _mm512_maskz_loadu_epi8(two ? whole : half, (const void *)p);
            q[u] = SA_FN(sa_q8p_q)(kind, p, z, two);
            d[u] = SA_FN(sa_q8p_halves)(kind, p, z, 0, two);
            if (offset) mw[u] = SA_FN(sa_q8p_halves)(kind, p, z, 2, two);
        }
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) {
            const int8_t *xr = xq + r * k + i * 32;
            const __m512i qx = two ? _mm512_loadu_si512((const void *)xr)
                                   : _mm512_maskz_loadu_epi8((__mmask64)0xFFFFFFFFu, (const void *)xr);
            const __m512 dx = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_castsi128_ps(
                _mm_loadl_epi64((const __m128i *)(xd + r * nbp + i)))));  /* padding: 0 */
            /* xs of the pair in its blocks' first lanes (times -c for the c kinds) */
            const __m512 sx = _mm512_maskz_permutexvar_ps((__mmask16)0x0101, first, _mm512_castps128_ps512(
                _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(xs + r * nbp + i)))));
            const __m512 sxc = _mm512_mul_ps(sx, _mm512_set1_ps(-c));
#pragma GCC unroll 4
            for (int u = 0; u < J; u++) {
                const __m512i s = SA_FN(sa_q8p_dot)(kind, q[u], qx);
                acc[r][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d[u], dx), acc[r][u]);
                if (offset)
                    acc[r][u] = _mm512_fmadd_ps(mw[u], sx, acc[r][u]);
                else if (c != 0)
                    acc[r][u] = _mm512_fmadd_ps(d[u], sxc, acc[r][u]);
            }
        }
    }
#pragma GCC unroll 4
    for (int u = 0; u < J; u++)
#pragma GCC unroll 8
        for (int r = 0; r < M; r++) y[r * ldy + j + u] = _mm512_reduce_add_ps(acc[r][u]) + (b ? b[j + u] : 0);
}

/* Rows j0 .. j1 of y = round_q8(x) W^T: pairs of W's rows (M <= 4), then one at a time */
static inline __attribute__((always_inline)) void SA_FN(sa_q8p_rows)(const int kind, const int M, const int8_t *xq,
                                                                     const SA_T *xd, const SA_T *xs, int64_t k,
                                                                     const uint8_t *w, int64_t ldw, int64_t n,
                                                                     const SA_T *b, int64_t j0, int64_t j1, SA_T *y,
                                                                     int64_t ldy) {
    const int J = M == 1 ? 4 : M <= 4 ? 2 : 1;
    int64_t j = j0;
    for (; j + J <= j1; j += J) SA_FN(sa_q8p_group)(kind, M, J, xq, xd, xs, k, w, ldw, n, b, j, y, ldy);
    for (; j < j1; j++) SA_FN(sa_q8p_group)(kind, M, 1, xq, xd, xs, k, w, ldw, n, b, j, y, ldy);
}

#define SA_Q8P_SWITCH(kind, m, CALL)                                                               \
    switch ((kind) * SA_QROWS + (int)(m) - 1) {                                                    \
        SA_QCASES(SA_Q8_0, CALL)                                                                   \
        SA_QCASES(SA_Q4_0, CALL)                                                                   \
        SA_QCASES(SA_Q4_1, CALL)                                                                   \
        SA_QCASES(SA_Q5_0, CALL)                                                                   \
        SA_QCASES(SA_Q5_1, CALL)                                                                   \
        default: break;                                                                            \
    }

/* y[:m, j0:j1] = round_q8(x) W[j0:j1]^T (+ b) for W's kind one of Q8_0 .. Q5_1, x given as
 * sa_quantize_q8's xq, xd, xs */
static void SA_FN(sa_linear_q8p_rows)(int kind, const int8_t *xq, const SA_T *xd, const SA_T *xs, int64_t k,
                                      int64_t m, const uint8_t *w, int64_t ldw, int64_t n, const SA_T *b,
                                      int64_t j0, int64_t j1, SA_T *y, int64_t ldy) {
#define SA_Q8P_CALL(K, M) SA_FN(sa_q8p_rows)(K, M, xq, xd, xs, k, w, ldw, n, b, j0, j1, y, ldy)
    SA_Q8P_SWITCH(kind, m, SA_Q8P_CALL)
#undef SA_Q8P_CALL
}
#undef SA_Q8P_SWITCH

#endif
