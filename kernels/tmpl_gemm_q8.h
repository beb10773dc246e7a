/* ---- The integer GEMM: y = round_q8(x) W^T for many rows of x (a prefill) and W as GGUF blocks of
 * any kind, with AVX-512 VNNI: four multiply-adds of bytes a lane per vpdpbusd where a float FMA
 * does one. Only the avx512vnni copy has it (sa_gemm_q8_usable); the others keep the dequantized
 * panels and sgemm (linear_q.pyx's gemm_q).
 *
 * x: each row rounded to 8 bits a block (reference.round_q8: 32 values, or 256 for the K-quants), q
 * moved up by 128 as unsigned bytes a (vpdpbusd multiplies u8 by s8), d_x kept per group of 32 (a
 * block of 256 repeats its scale over its 8 groups) with xs = d_x sum(q) (sum(q) for block 256)
 * (sa_gq8_pack_a).
 * W: a panel of 32 of its rows (y's columns) at a time unpacked to signed bytes v and a float scale
 * s per group of G weights (32; Q6_K's 16), w = s v (+ m, a float offset per group of 32: Q4_1,
 * Q5_1's m, the K-quants' -dmin m_b), laid out for the micro-kernel: 4 bytes of depth of 16 columns
 * a 64-byte vector (sa_gq8_pack_b). Per group g, row i and column j:
 *     y_ij += d_x s_jg (a_i . v_j - 128 sum(v_j)) + m_jg xs_ig
 * the integer dot over the group in int32 lanes (G / 4 vpdpbusd a row and 16 columns), 128 sum(v)
 * kept with the panel, one conversion and FMA a group. Micro-tile: MR rows x 32 columns; the A rows
 * and the panel stay in L1/L2 while the tile sweeps the depth. The K-quants' tile (sa_gq8_ktile)
 * takes d_x out of the groups, since x's scale holds over a super-block. */

#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SA_GQ8_NR 32  /* columns a panel */
#ifndef SA_GQ8_MR
#define SA_GQ8_MR 6   /* rows of x a micro-tile: 4 MR accumulators of 32 registers */
#endif

/* a (m, k) u8 = q + 128, d and xs (m, k / 32) of round_q8(x, block): xs = d sum q over each 32,
 * or sum q alone for block 256 (sa_gq8_ktile applies d once a super-block). The float copy 16 values a
 * step: the same max, products and rounding (cvtps2dq rounds to nearest even, as rintf), so the
 * same bytes, NaN blocks' too (q of NaN: the integer indefinite 0x80000000, byte 128). */
static void SA_FN(sa_gq8_pack_a)(const SA_T *x, int64_t m, int64_t k, int block, uint8_t *a, SA_T *d,
                                 SA_T *xs) {
    const int64_t ng = k / 32;
#if SA_TBYTES == 4
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512 top = _mm512_set1_ps(3.40282347e38f);
    const __m512i c128 = _mm512_set1_epi32(128);
    for (int64_t r = 0; r < m; r++)
        for (int64_t b0 = 0; b0 < k; b0 += block) {
            const float *v = x + r * k + b0;
            __m512 amax = _mm512_setzero_ps();
            __mmask16 nan = 0;
            for (int t = 0; t < block; t += 16) {
                const __m512 u = _mm512_and_ps(_mm512_loadu_ps(v + t), abs_mask);
                nan |= _mm512_cmp_ps_mask(u, top, _CMP_NLE_UQ);  /* !(u <= top): NaN or inf */
                amax = _mm512_max_ps(u, amax);                    /* a NaN u leaves amax */
            }
            const float am = _mm512_reduce_max_ps(amax);
            const float inv = nan || am == 0 ? 0 : 127.0f / am, dx = nan ? NAN : am / 127.0f;
            const __m512 iv = _mm512_set1_ps(inv);
            for (int g = 0; g < block / 32; g++) {
                const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + 32 * g), iv));
                const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + 32 * g + 16), iv));
                uint8_t *o = a + r * k + b0 + 32 * g;
                _mm_storeu_si128((__m128i *)o, _mm512_cvtepi32_epi8(_mm512_add_epi32(q0, c128)));
                _mm_storeu_si128((__m128i *)(o + 16), _mm512_cvtepi32_epi8(_mm512_add_epi32(q1, c128)));
                const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
                d[r * ng + b0 / 32 + g] = dx;
                xs[r * ng + b0 / 32 + g] = block == 256 ? (SA_T)sum : dx * (SA_T)sum;
            }
        }
#else
    for (int64_t r = 0; r < m; r++)
        for (int64_t b0 = 0; b0 < k; b0 += block) {
            const SA_T *v = x + r * k + b0;
            SA_T amax = 0;
            int nan = 0;
            for (int t = 0; t < block; t++) {
                const SA_T u = v[t] < 0 ? -v[t] : v[t];
                nan |= !(u <= 3.40282347e38f);
                amax = u > amax ? u : amax;
            }
            const SA_T inv = nan || amax == 0 ? 0 : 127.0f / amax, dx = nan ? NAN : amax / 127.0f;
            for (int g = 0; g < block / 32; g++) {
                int32_t sum = 0;
                for (int t = 0; t < 32; t++) {
                    const int q = (int)rintf(v[32 * g + t] * inv);
                    a[r * k + b0 + 32 * g + t] = (uint8_t)(q + 128);
                    sum += q;
                }
                d[r * ng + b0 / 32 + g] = dx;
                xs[r * ng + b0 / 32 + g] = block == 256 ? (SA_T)sum : dx * (SA_T)sum;
            }
        }
#endif
}

/* The signed bytes v of W's row (k weights at p, kind), its scales s per group of G and offsets m
 * per group of 32 (zeros where the kind has none) */
static void SA_FN(sa_gq8_unpack)(int kind, const uint8_t *p, int64_t k, int8_t *v, SA_T *s, SA_T *m) {
    const int bytes = SA_QBYTES(kind);
    if (kind < SA_Q4_K) {
        for (int64_t i = 0; i < k / 32; i++, p += bytes) {
            int8_t *o = v + 32 * i;
            const SA_T dw = SA_FN(sa_q8_half)(p);
            s[i] = dw;
            m[i] = kind == SA_Q4_1 || kind == SA_Q5_1 ? SA_FN(sa_q8_half)(p + 2) : 0;
            if (kind == SA_Q8_0) {
                memcpy(o, p + 2, 32);
                continue;
            }
            const int five = kind == SA_Q5_0 || kind == SA_Q5_1;
            const uint8_t *qs = p + (kind == SA_Q4_0 ? 2 : kind == SA_Q4_1 ? 4 : kind == SA_Q5_0 ? 6 : 8);
            uint32_t h = 0;
            if (five) memcpy(&h, p + (kind == SA_Q5_0 ? 2 : 4), 4);
            const int c = kind == SA_Q4_0 ? 8 : kind == SA_Q5_0 ? 16 : 0;
            for (int t = 0; t < 16; t++) {
                o[t] = (int8_t)(((qs[t] & 15) | (five ? ((h >> t) & 1) << 4 : 0)) - c);
                o[t + 16] = (int8_t)(((qs[t] >> 4) | (five ? ((h >> (t + 16)) & 1) << 4 : 0)) - c);
            }
        }
        return;
    }
    for (int64_t i = 0; i < k / 256; i++, p += bytes) {
        int8_t *o = v + 256 * i;
        if (kind == SA_Q6_K) {
            const SA_T dw = SA_FN(sa_q8_half)(p + 208);
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
                int8_t *oh = o + 128 * h;
                for (int t = 0; t < 32; t++) {
                    oh[t] = (int8_t)(((ql[t] & 15) | ((qh[t] & 3) << 4)) - 32);
                    oh[t + 32] = (int8_t)(((ql[t + 32] & 15) | (((qh[t] >> 2) & 3) << 4)) - 32);
                    oh[t + 64] = (int8_t)(((ql[t] >> 4) | (((qh[t] >> 4) & 3) << 4)) - 32);
                    oh[t + 96] = (int8_t)(((ql[t + 32] >> 4) | (((qh[t] >> 6) & 3) << 4)) - 32);
                }
            }
            for (int g = 0; g < 16; g++) s[16 * i + g] = dw * (SA_T)(int8_t)p[192 + g];
            for (int g = 0; g < 8; g++) m[8 * i + g] = 0;
            continue;
        }
        const SA_T dw = SA_FN(sa_q8_half)(p), dmin = SA_FN(sa_q8_half)(p + 2);
        int sc[8], mn[8];
        SA_FN(sa_k_scales)(p + 4, sc, mn);
        const uint8_t *qs = p + bytes - 128, *qh = p + 16;
        for (int c = 0; c < 4; c++)
            for (int t = 0; t < 32; t++) {
                int lo = qs[32 * c + t] & 15, hi = qs[32 * c + t] >> 4;
                if (kind == SA_Q5_K) lo |= ((qh[t] >> (2 * c)) & 1) << 4, hi |= ((qh[t] >> (2 * c + 1)) & 1) << 4;
                o[64 * c + t] = (int8_t)lo, o[64 * c + 32 + t] = (int8_t)hi;
            }
        for (int g = 0; g < 8; g++) s[8 * i + g] = dw * (SA_T)sc[g], m[8 * i + g] = -dmin * (SA_T)mn[g];
    }
}

/* 16 columns' words of the panel from rows16.h's layouts (rows j0 .. j0 + 15 of W, a group of 16):
 * their runs already hold 4 + 4 consecutive weights of 16 rows a 64-byte vector, so that run c's
 * low nibbles are the panel's word 2c of those 16 columns and its high nibbles word 2c + 1, with no
 * transposition (Q8_0's 8 runs: word c each, back to signed); Q5_0's fifth bits join as bit 4 of
 * each byte (four bits of qh spread to bytes by a multiplication: bit b of x times 2^4 + 2^11 +
 * 2^18 + 2^25 lands at bit 8 b + 4 alone). The scales and offsets go to bs, bm (stride 32) a row
 * at a time. */
static void SA_FN(sa_gq8_pack16)(int kind, const uint8_t *w, int64_t ldw, int64_t k, int64_t j0, int8_t *bv,
                                 SA_T *bs, SA_T *bm) {
    const uint8_t *o = w + j0 / 16 * 16 * ldw;
    int32_t *words = (int32_t *)bv;
    const __m512i low = _mm512_set1_epi8(15);
    const int fk = SA_B16_FILE(kind);
    if (fk >= 0) {  /* the blocks of 32: v = u - c (c: 8 for Q4_0, 16 for Q5_0, 128 for Q8_0) */
        const int bytes = SA_B16_BYTES(fk), at = SA_B16_RUNS(fk);
        const __m512i c = _mm512_set1_epi8((char)(fk == SA_Q4_0 ? 8 : fk == SA_Q5_0 ? 16 : 0));
        const __m512i fifth = _mm512_set1_epi32(0x10101010);
        for (int64_t i = 0; i < k / 32; i++, o += bytes) {
            if (fk == SA_Q8_0) {
                for (int u = 0; u < 8; u++)
                    _mm512_store_si512((void *)(words + (8 * i + u) * SA_GQ8_NR),
                                       _mm512_xor_si512(_mm512_loadu_si512((const void *)(o + at + 64 * u)),
                                                        _mm512_set1_epi8((char)0x80)));
            } else {
                const __m512i h = fk == SA_Q5_0 ? _mm512_loadu_si512((const void *)(o + 32)) : low;
                for (int u = 0; u < 4; u++) {
                    const __m512i q = _mm512_loadu_si512((const void *)(o + at + 64 * u));
                    __m512i lo = _mm512_and_si512(q, low), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
                    if (fk == SA_Q5_0) {
                        lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_mullo_epi32(_mm512_and_si512(
                            _mm512_srli_epi32(h, 8 * u), _mm512_set1_epi32(15)), _mm512_set1_epi32(0x02040810)), fifth));
                        hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_mullo_epi32(_mm512_and_si512(
                            _mm512_srli_epi32(h, 8 * u + 4), _mm512_set1_epi32(15)), _mm512_set1_epi32(0x02040810)), fifth));
                    }
                    const int64_t t = 8 * i + 2 * u;
                    _mm512_store_si512((void *)(words + t * SA_GQ8_NR), _mm512_sub_epi8(lo, c));
                    _mm512_store_si512((void *)(words + (t + 1) * SA_GQ8_NR), _mm512_sub_epi8(hi, c));
                }
            }
            _mm512_store_ps(bs + i * SA_GQ8_NR, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o)));
            _mm512_store_ps(bm + i * SA_GQ8_NR, fk == SA_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + 32)))
                                                               : _mm512_setzero_ps());
        }
        return;
    }
    if (kind == SA_Q6_K16) {  /* v = q - 32 */
        const __m512i c32 = _mm512_set1_epi8(32);
        for (int64_t i = 0; i < k / 256; i++, o += SA_Q6K16_SUPER) {
            for (int c = 0; c < 32; c++) {
                __m512i lo, hi;
                SA_FN(sa_q6k16_bytes)(o, c, _mm512_loadu_si512((const void *)(o + SA_Q6K16_HIGH(c / 2))), &lo, &hi);
                const int64_t t = 64 * i + 2 * c;
                _mm512_store_si512((void *)(words + t * SA_GQ8_NR), _mm512_sub_epi8(lo, c32));
                _mm512_store_si512((void *)(words + (t + 1) * SA_GQ8_NR), _mm512_sub_epi8(hi, c32));
            }
            /* the 16 rows' scales of sub-block s (pair s / 2's words): dw sc, as a row at a time */
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
            for (int s = 0; s < 16; s++) {
                const __m512i pair = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(o + 32 + 32 * (s / 2))));
                const __m512i sc = s & 1 ? _mm512_srai_epi32(pair, 16) : _mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16);
                _mm512_store_ps(bs + (16 * i + s) * SA_GQ8_NR, _mm512_mul_ps(dw, _mm512_cvtepi32_ps(sc)));
            }
            for (int g = 0; g < 8; g++) _mm512_store_ps(bm + (8 * i + g) * SA_GQ8_NR, _mm512_setzero_ps());
        }
        return;
    }
    for (int64_t i = 0; i < k / 256; i++, o += SA_Q4K16_SUPER) {
        for (int c = 0; c < 32; c++) {
            const __m512i q = _mm512_loadu_si512((const void *)(o + 256 + 64 * c));
            const int64_t t = 64 * i + 2 * c;
            _mm512_store_si512((void *)(words + t * SA_GQ8_NR), _mm512_and_si512(q, low));
            _mm512_store_si512((void *)(words + (t + 1) * SA_GQ8_NR), _mm512_and_si512(_mm512_srli_epi16(q, 4), low));
        }
        /* the 16 rows' scales and mins of sub-block b, 16 lanes at once (the layout keeps a byte of
         * each row side by side): the same products as a row at a time, dw sc and -dmin mn */
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
        const __m512 dmin = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + 32))));
        const __m512i four = _mm512_set1_epi32(15), two = _mm512_set1_epi32(3);
        for (int b = 0; b < 8; b++) {
#define SA_SIX(at) _mm512_or_si512(                                                                                   \
        _mm512_and_si512(_mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(o + (at) + 16 * (b / 2)))), \
                                           4 * (b & 1)), four),                                                        \
        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(                                                          \
            _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(o + (at) + 64 + 16 * (b / 4)))), 2 * (b % 4)), two), 4))
            _mm512_store_ps(bs + (8 * i + b) * SA_GQ8_NR, _mm512_mul_ps(dw, _mm512_cvtepi32_ps(SA_SIX(64))));
            _mm512_store_ps(bm + (8 * i + b) * SA_GQ8_NR, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(SA_SIX(160))));
#undef SA_SIX
        }
    }
}

/* words[t 32 + c] = rows[c][t] (32-bit words) for 16 rows of n words each (stride ld words), 16 x
 * 16 blocks transposed in registers (the last block's rows masked to what is left of n) */
static void SA_FN(sa_gq8_transpose16)(const int32_t *rows, int64_t ld, int64_t n, int32_t *words) {
    for (int64_t t0 = 0; t0 < n; t0 += 16) {
        const int left = n - t0 < 16 ? (int)(n - t0) : 16;
        const __mmask16 mk = (__mmask16)((1u << left) - 1);
        __m512i r[16], u[16];
        for (int i = 0; i < 16; i++) r[i] = _mm512_maskz_loadu_epi32(mk, rows + i * ld + t0);
        for (int i = 0; i < 16; i += 2)
            u[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]), u[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
        for (int i = 0; i < 16; i += 4) {
            r[i] = _mm512_unpacklo_epi64(u[i], u[i + 2]), r[i + 1] = _mm512_unpackhi_epi64(u[i], u[i + 2]);
            r[i + 2] = _mm512_unpacklo_epi64(u[i + 1], u[i + 3]), r[i + 3] = _mm512_unpackhi_epi64(u[i + 1], u[i + 3]);
        }
        /* r[4 q + e] holds words 4 l + e (l: the 128-bit lane) of rows 4 q .. 4 q + 3 */
        for (int e = 0; e < 4; e++) {
            u[e] = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x88), u[4 + e] = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xdd);
            u[8 + e] = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x88);
            u[12 + e] = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xdd);
        }
        for (int e = 0; e < 8; e++) {
            r[e] = _mm512_shuffle_i32x4(u[e], u[8 + e], 0x88), r[8 + e] = _mm512_shuffle_i32x4(u[e], u[8 + e], 0xdd);
        }
        /* r[v] is now word t0 + v of the 16 rows */
        for (int v = 0; v < left; v++) _mm512_store_si512((void *)(words + (t0 + v) * SA_GQ8_NR), r[v]);
    }
}

/* The panel of W's rows j .. j + cols (cols <= 32; the rest zero) for sa_gq8_tile: bv[(t 32 + c) 4
 * + u] = v_c[4 t + u]; bs[g 32 + c] = s_cg; bc[g 32 + c] = 128 sum of v_c over group g; bm[g32 32 +
 * c] = m_c. rows: scratch of 16 k bytes (16 rows unpacked, then transposed into the panel's words),
 * rs of k / 16 + k / 32 floats (a row's scales and offsets) */
static void SA_FN(sa_gq8_pack_b)(int kind, const uint8_t *w, int64_t ldw, int64_t k, int64_t j, int cols, int G,
                                 int8_t *bv, SA_T *bs, int32_t *bc, SA_T *bm, int8_t *rows, SA_T *rs) {
    const int64_t ng = k / G, n32 = k / 32;
    SA_T *rm = rs + k / 16;
    int32_t *words = (int32_t *)bv;
    for (int h = 0; h < 2; h++) {
        const int c0 = 16 * h;
        if (c0 >= cols) {  /* an empty half: zeros (its sums come out zero below) */
            for (int64_t t = 0; t < k / 4; t++) _mm512_store_si512((void *)(words + t * SA_GQ8_NR + c0), _mm512_setzero_si512());
            for (int64_t g = 0; g < ng; g++) _mm512_store_ps(bs + g * SA_GQ8_NR + c0, _mm512_setzero_ps());
            for (int64_t g = 0; g < n32; g++) _mm512_store_ps(bm + g * SA_GQ8_NR + c0, _mm512_setzero_ps());
            continue;
        }
        if (kind == SA_Q4_K16 || kind == SA_Q6_K16 || SA_B16_FILE(kind) >= 0) {  /* cols is then 16 or 32 */
            SA_FN(sa_gq8_pack16)(kind, w, ldw, k, j + c0, (int8_t *)(words + c0), bs + c0, bm + c0);
            continue;
        }
        for (int c = c0; c < c0 + 16; c++) {
            int8_t *row = rows + (c - c0) * k;
            if (c < cols) {
                SA_FN(sa_gq8_unpack)(kind, w + (j + c) * ldw, k, row, rs, rm);
            } else {
                memset(row, 0, k);
                for (int64_t g = 0; g < k / 16; g++) rs[g] = 0;
                for (int64_t g = 0; g < n32; g++) rm[g] = 0;
            }
            for (int64_t g = 0; g < ng; g++) bs[g * SA_GQ8_NR + c] = rs[g];
            for (int64_t g = 0; g < n32; g++) bm[g * SA_GQ8_NR + c] = rm[g];
        }
        SA_FN(sa_gq8_transpose16)((const int32_t *)rows, k / 4, k / 4, words + c0);
    }
    /* 128 sum(v) over each group: vpdpbusd of 1-bytes with the panel's words sums each word's 4 bytes */
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t g = 0; g < ng; g++)
        for (int h = 0; h < 2; h++) {
            __m512i sum = _mm512_setzero_si512();
            for (int t = 0; t < G / 4; t++)
                sum = _mm512_dpbusd_epi32(sum, ones, _mm512_load_si512((const void *)(words + (g * G / 4 + t) * SA_GQ8_NR + 16 * h)));
            _mm512_store_si512((void *)(bc + g * SA_GQ8_NR + 16 * h), _mm512_slli_epi32(sum, 7));
        }
}

/* Group g's integer sums of MR rows of a (k bytes a row) with the panel's 32 columns, two vectors a
 * row: sum over the group of a_i v_j, started at -128 sum(v_j) since a = q + 128 */
static inline __attribute__((always_inline)) void SA_FN(sa_gq8_group)(const int MR, const int G, const uint8_t *a,
                                                                      int64_t k, int64_t g, const int8_t *bv,
                                                                      const int32_t *bc, __m512i ai[][2]) {
    const __m512i c0 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_load_si512((const void *)(bc + g * SA_GQ8_NR)));
    const __m512i c1 = _mm512_sub_epi32(_mm512_setzero_si512(),
                                        _mm512_load_si512((const void *)(bc + g * SA_GQ8_NR + 16)));
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) ai[r][0] = c0, ai[r][1] = c1;
    const int8_t *b = bv + g * G * SA_GQ8_NR;
#pragma GCC unroll 8
    for (int t = 0; t < G / 4; t++) {
        const __m512i b0 = _mm512_load_si512((const void *)(b + t * 4 * SA_GQ8_NR));
        const __m512i b1 = _mm512_load_si512((const void *)(b + t * 4 * SA_GQ8_NR + 64));
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            int32_t word;
            memcpy(&word, a + r * k + g * G + 4 * t, 4);
            const __m512i av = _mm512_set1_epi32(word);
            ai[r][0] = _mm512_dpbusd_epi32(ai[r][0], av, b0);
            ai[r][1] = _mm512_dpbusd_epi32(ai[r][1], av, b1);
        }
    }
}

/* y[i0 .. i0 + MR, j .. j + cols] = the micro-tile over the whole depth (MR rows of a, the panel). The
 * panel is not cut into slices of depth that stay in L1: on Zen 4 the hardware prefetcher keeps the
 * L2 ones fed, and slices of 256-1024 bytes of depth ran 2-10% slower (the sums' trips to y) */
static inline __attribute__((always_inline)) void SA_FN(sa_gq8_tile)(const int MR, const int G, const int offsets,
                                                                     const uint8_t *a, const SA_T *ad,
                                                                     const SA_T *axs, int64_t k, const int8_t *bv,
                                                                     const SA_T *bs, const int32_t *bc,
                                                                     const SA_T *bm, SA_T *y, int64_t ldy, int cols) {
    const int64_t ng = k / G, n32 = k / 32;
    __m512 acc[SA_GQ8_MR][2];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m512i ai[SA_GQ8_MR][2];
        SA_FN(sa_gq8_group)(MR, G, a, k, g, bv, bc, ai);
        const __m512 s0 = _mm512_load_ps(bs + g * SA_GQ8_NR), s1 = _mm512_load_ps(bs + g * SA_GQ8_NR + 16);
        const int64_t g32 = g * G / 32;  /* the group of 32 of x's scale */
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            const __m512 dx = _mm512_set1_ps(ad[r * n32 + g32]);
            acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[r][0]), _mm512_mul_ps(s0, dx), acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[r][1]), _mm512_mul_ps(s1, dx), acc[r][1]);
        }
        if (offsets) {  /* G == 32 */
            const __m512 m0 = _mm512_load_ps(bm + g32 * SA_GQ8_NR), m1 = _mm512_load_ps(bm + g32 * SA_GQ8_NR + 16);
#pragma GCC unroll 8
            for (int r = 0; r < MR; r++) {
                const __m512 xs = _mm512_set1_ps(axs[r * n32 + g32]);
                acc[r][0] = _mm512_fmadd_ps(m0, xs, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(m1, xs, acc[r][1]);
            }
        }
    }
    const __mmask16 k0 = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    const __mmask16 k1 = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        _mm512_mask_storeu_ps(y + r * ldy, k0, acc[r][0]);
        _mm512_mask_storeu_ps(y + r * ldy + 16, k1, acc[r][1]);
    }
}

/* The K-quants' micro-tile. x is rounded per 256 for them (Q8_K), so d_x is one factor over a
 * super-block's 8 groups (Q6_K's 16): within it the groups' integer sums are converted and scaled by
 * W's s alone, which no row changes, the offsets' m multiply x's plain group sums (pack_a keeps sum q
 * for block 256, not d_x sum q), and d_x multiplies the super-block's sum once:
 *     y_ij += d_x,b sum_{g in b} (s_jg (a_i . v_j - 128 sum v_j) + m_jg sum_g q_i)
 * two float operations a group and row-vector (three with offsets) where sa_gq8_tile takes three
 * (four), on the vector pipes vpdpbusd needs. Three sets of accumulators: MR 4 rows. */
#define SA_GQ8_KMR 4
static inline __attribute__((always_inline)) void SA_FN(sa_gq8_ktile)(const int MR, const int G, const int offsets,
                                                                      const uint8_t *a, const SA_T *ad,
                                                                      const SA_T *axs, int64_t k, const int8_t *bv,
                                                                      const SA_T *bs, const int32_t *bc,
                                                                      const SA_T *bm, SA_T *y, int64_t ldy, int cols) {
    const int64_t n32 = k / 32, per = 256 / G;  /* groups a super-block */
    __m512 acc[SA_GQ8_KMR][2];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < k / 256; sb++) {
        __m512 part[SA_GQ8_KMR][2];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) part[r][0] = part[r][1] = _mm512_setzero_ps();
        for (int64_t g = sb * per; g < (sb + 1) * per; g++) {
            __m512i ai[SA_GQ8_KMR][2];
            SA_FN(sa_gq8_group)(MR, G, a, k, g, bv, bc, ai);
            const __m512 s0 = _mm512_load_ps(bs + g * SA_GQ8_NR), s1 = _mm512_load_ps(bs + g * SA_GQ8_NR + 16);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                part[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[r][0]), s0, part[r][0]);
                part[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[r][1]), s1, part[r][1]);
            }
            if (offsets) {  /* G == 32 */
                const __m512 m0 = _mm512_load_ps(bm + g * SA_GQ8_NR), m1 = _mm512_load_ps(bm + g * SA_GQ8_NR + 16);
#pragma GCC unroll 4
                for (int r = 0; r < MR; r++) {
                    const __m512 xs = _mm512_set1_ps(axs[r * n32 + g]);
                    part[r][0] = _mm512_fmadd_ps(m0, xs, part[r][0]);
                    part[r][1] = _mm512_fmadd_ps(m1, xs, part[r][1]);
                }
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            const __m512 dx = _mm512_set1_ps(ad[r * n32 + 8 * sb]);
            acc[r][0] = _mm512_fmadd_ps(part[r][0], dx, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(part[r][1], dx, acc[r][1]);
        }
    }
    const __mmask16 k0 = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    const __mmask16 k1 = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) {
        _mm512_mask_storeu_ps(y + r * ldy, k0, acc[r][0]);
        _mm512_mask_storeu_ps(y + r * ldy + 16, k1, acc[r][1]);
    }
}

#define SA_GQ8_TILE(MR, G, OFF) \
    SA_FN(sa_gq8_tile)(MR, G, OFF, a + i * k, ad + i * n32, axs + i * n32, k, bv, bs, bc, bm, y + i * ldy + j, ldy, cols)
#define SA_GQ8_KTILE(MR, G, OFF) \
    SA_FN(sa_gq8_ktile)(MR, G, OFF, a + i * k, ad + i * n32, axs + i * n32, k, bv, bs, bc, bm, y + i * ldy + j, ldy, cols)

/* Bytes of scratch sa_gq8_cols needs for depth k: the panel (k 32 bytes, aligned), its scales, sums
 * and offsets, and 16 rows being unpacked */
static inline int64_t SA_FN(sa_gq8_scratch)(int64_t k) {
    return 64 + k * SA_GQ8_NR + (k / 16) * SA_GQ8_NR * 4 * 2 + (k / 32) * SA_GQ8_NR * 4 + 16 * k
           + (k / 16 + k / 32) * 4 + 256;
}

/* y[:, j0:j1] (y (m, ldy)) = the m packed rows of x (sa_gq8_pack_a) times W's rows j0 .. j1, a panel
 * of 32 at a time, each swept by micro-tiles of MR rows */
static void SA_FN(sa_gq8_cols)(int kind, const uint8_t *a, const SA_T *ad, const SA_T *axs, int64_t m, int64_t k,
                               const uint8_t *w, int64_t ldw, int64_t j0, int64_t j1, SA_T *y, int64_t ldy,
                               void *scratch) {
    const int G = kind == SA_Q6_K || kind == SA_Q6_K16 ? 16 : 32;
    const int offsets = kind == SA_Q4_1 || kind == SA_Q5_1 || kind == SA_Q4_K || kind == SA_Q5_K || kind == SA_Q4_K16
                        || kind == SA_Q4_116;
    const int kquant = SA_KQUANT(kind);  /* x per 256 */
    const int64_t n32 = k / 32, ng = k / G;
    int8_t *bv = (int8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    SA_T *bs = (SA_T *)(bv + k * SA_GQ8_NR);
    int32_t *bc = (int32_t *)(bs + ng * SA_GQ8_NR);
    SA_T *bm = (SA_T *)(bc + ng * SA_GQ8_NR);
    int8_t *rows = (int8_t *)(bm + n32 * SA_GQ8_NR);
    SA_T *rs = (SA_T *)(((uintptr_t)(rows + 16 * k) + 63) & ~(uintptr_t)63);
    for (int64_t j = j0; j < j1; j += SA_GQ8_NR) {
        const int cols = j1 - j < SA_GQ8_NR ? (int)(j1 - j) : SA_GQ8_NR;
        SA_FN(sa_gq8_pack_b)(kind, w, ldw, k, j, cols, G, bv, bs, bc, bm, rows, rs);
        int64_t i = 0;
        if (kquant) {
            for (; i + SA_GQ8_KMR <= m; i += SA_GQ8_KMR) {
                if (G == 16)
                    SA_GQ8_KTILE(SA_GQ8_KMR, 16, 0);
                else if (offsets)
                    SA_GQ8_KTILE(SA_GQ8_KMR, 32, 1);
                else
                    SA_GQ8_KTILE(SA_GQ8_KMR, 32, 0);
            }
            for (; i < m; i++) {
                if (G == 16)
                    SA_GQ8_KTILE(1, 16, 0);
                else if (offsets)
                    SA_GQ8_KTILE(1, 32, 1);
                else
                    SA_GQ8_KTILE(1, 32, 0);
            }
            continue;
        }
        for (; i + SA_GQ8_MR <= m; i += SA_GQ8_MR) {
            if (G == 16)
                SA_GQ8_TILE(SA_GQ8_MR, 16, 0);
            else if (offsets)
                SA_GQ8_TILE(SA_GQ8_MR, 32, 1);
            else
                SA_GQ8_TILE(SA_GQ8_MR, 32, 0);
        }
        for (; i < m; i++) {
            if (G == 16)
                SA_GQ8_TILE(1, 16, 0);
            else if (offsets)
                SA_GQ8_TILE(1, 32, 1);
            else
                SA_GQ8_TILE(1, 32, 0);
        }
    }
}
#undef SA_GQ8_TILE
#undef SA_GQ8_KTILE
#endif
