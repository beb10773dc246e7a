/* matmul_int8: C = A B in int32 for A (m, k) and B (k, n) int8, exact (k <= SA_I8_MAX_K keeps every
 * sum in int32). Template (instances.h), compiled once (the float instantiation; no float data).
 *
 * B is packed a panel of NR columns at a time into the thread's scratch, A once for all threads
 * (sa_i8_pack_a), both with their depth padded by zeros to a whole step DK; a micro-tile of MR rows
 * x NR columns keeps its int32 sums in registers over the whole depth. Three micro-kernels:
 *   vnni    (the avx512vnni copy) vpdpbusd multiplies 4 unsigned by 4 signed bytes a lane: A goes
 *           in as a + 128, and the sums start at -128 sum_t b_tc, so each lane ends at sum a b
 *           (DK 4, 32 columns, 6 rows: 12 of the 32 registers hold sums)
 *   maddwd  (avx512 without VNNI: zmm; avx2 and avx2x64: ymm) both sign-extended to int16, vpmaddwd
 *           multiplies pairs and adds them exactly into int32 (DK 2; 32 x 6 or 16 x 4)
 *   generic int32 lanes of GCC vectors, one depth a step (DK 1; 8 x 4)
 * vpmaddubsw (AVX2's u8 x s8 pairs into int16) is not used: it saturates at 32767, a wrong sum for
 * bytes near +-128, where vpmaddwd's pairs cannot overflow. */
#if SA_TBYTES == 4

#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define SA_I8_KIND 2  /* vnni */
#define SA_I8_DK 4
#define SA_I8_NR 32
#define SA_I8_MR 6
#elif SA_X86 && SA_VBYTES == 64 && defined(__AVX512BW__)
#define SA_I8_KIND 1  /* maddwd, zmm */
#define SA_I8_DK 2
#define SA_I8_NR 32
#define SA_I8_MR 6
#define SA_I8_VI __m512i
#define SA_I8_LOAD(p) _mm512_load_si512((const void *)(p))
#define SA_I8_SET1(w) _mm512_set1_epi32(w)
#define SA_I8_MADD(a, b) _mm512_madd_epi16(a, b)
#define SA_I8_ADD(a, b) _mm512_add_epi32(a, b)
#define SA_I8_ZERO() _mm512_setzero_si512()
#elif SA_X86 && (SA_VBYTES == 32 || SA_VBYTES == 64) && defined(__AVX2__)
#define SA_I8_KIND 1  /* maddwd, ymm (avx2x64 too: AVX2 has no 64-byte integer multiply-add) */
#define SA_I8_DK 2
#define SA_I8_NR 16
#define SA_I8_MR 4
#define SA_I8_VI __m256i
#define SA_I8_LOAD(p) _mm256_load_si256((const __m256i *)(p))
#define SA_I8_SET1(w) _mm256_set1_epi32(w)
#define SA_I8_MADD(a, b) _mm256_madd_epi16(a, b)
#define SA_I8_ADD(a, b) _mm256_add_epi32(a, b)
#define SA_I8_ZERO() _mm256_setzero_si256()
#else
#define SA_I8_KIND 0  /* generic */
#define SA_I8_DK 1
#define SA_I8_NR 8
#define SA_I8_MR 4
#endif
#define SA_I8_W (SA_I8_NR / 2)  /* int32 lanes a vector: a tile row is two vectors */

/* A's row element as the kernel reads it: a + 128 (vnni), int16 (maddwd), int32 (generic) */
#if SA_I8_KIND == 2
typedef uint8_t SA_FN(sa_i8a_t);
typedef int8_t SA_FN(sa_i8b_t);
#elif SA_I8_KIND == 1
typedef int16_t SA_FN(sa_i8a_t);
typedef int16_t SA_FN(sa_i8b_t);
#else
typedef int32_t SA_FN(sa_i8a_t);
typedef int32_t SA_FN(sa_i8b_t);
typedef int32_t SA_FN(sa_i8v) __attribute__((vector_size(SA_I8_W * 4)));
#endif

/* The layout's facts for the wrapper: {DK, NR, MR, bytes of an A element} */
static void SA_FN(sa_i8_layout)(int64_t *facts) {
    facts[0] = SA_I8_DK, facts[1] = SA_I8_NR, facts[2] = SA_I8_MR, facts[3] = sizeof(SA_FN(sa_i8a_t));
}

/* rows r0 .. r1 of A (lda) into ap (kp elements a row, kp = k rounded up to DK; the pad zero) */
static void SA_FN(sa_i8_pack_a)(const int8_t *A, int64_t lda, int64_t r0, int64_t r1, int64_t k, int64_t kp,
                                void *ap) {
    SA_FN(sa_i8a_t) *o = (SA_FN(sa_i8a_t) *)ap;
    for (int64_t r = r0; r < r1; r++) {
        const int8_t *a = A + r * lda;
        SA_FN(sa_i8a_t) *row = o + r * kp;
#if SA_I8_KIND == 2
        for (int64_t t = 0; t < k; t++) row[t] = (uint8_t)(a[t] + 128);
#else
        for (int64_t t = 0; t < k; t++) row[t] = a[t];
#endif
        for (int64_t t = k; t < kp; t++) row[t] = 0;
    }
}

/* Bytes of scratch a thread needs for a panel of depth kp (the panel, its column sums, alignment) */
static int64_t SA_FN(sa_i8_scratch)(int64_t kp) {
    return 128 + kp * SA_I8_NR * (int64_t)sizeof(SA_FN(sa_i8b_t)) + SA_I8_NR * 4;
}

/* B's columns j .. j + cols (cols <= NR; the rest zero) as the micro-kernel reads them: element
 * (t, c) of the panel at [(t / DK) NR + c] DK + t % DK; cs[c] = 128 sum_t B[t, j + c] (vnni) */
static void SA_FN(sa_i8_pack_b)(const int8_t *B, int64_t ldb, int64_t k, int64_t kp, int64_t j, int cols,
                                SA_FN(sa_i8b_t) *bp, int32_t *cs) {
#if SA_I8_KIND == 2
    if (cols == SA_I8_NR) {
        /* 4 rows of 32 bytes interleaved into 32 words (b0 b1 b2 b3 of a column): bytes, then int16
         * pairs within 128-bit lanes, the lanes put in column order; the column sums by vpdpbusd
         * of bytes of 1 against the words */
        const __m512i ones = _mm512_set1_epi8(1);
        __m512i s0 = _mm512_setzero_si512(), s1 = s0;
        int64_t t = 0;
        for (; t + 4 <= k; t += 4) {
            const int8_t *b = B + t * ldb + j;
            const __m256i r0 = _mm256_loadu_si256((const __m256i *)b), r1 = _mm256_loadu_si256((const __m256i *)(b + ldb));
            const __m256i r2 = _mm256_loadu_si256((const __m256i *)(b + 2 * ldb));
            const __m256i r3 = _mm256_loadu_si256((const __m256i *)(b + 3 * ldb));
            const __m256i x01l = _mm256_unpacklo_epi8(r0, r1), x01h = _mm256_unpackhi_epi8(r0, r1);
            const __m256i x23l = _mm256_unpacklo_epi8(r2, r3), x23h = _mm256_unpackhi_epi8(r2, r3);
            /* v0: columns 0-3 | 16-19, v1: 4-7 | 20-23, v2: 8-11 | 24-27, v3: 12-15 | 28-31 */
            const __m256i v0 = _mm256_unpacklo_epi16(x01l, x23l), v1 = _mm256_unpackhi_epi16(x01l, x23l);
            const __m256i v2 = _mm256_unpacklo_epi16(x01h, x23h), v3 = _mm256_unpackhi_epi16(x01h, x23h);
            const __m512i w0 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_permute2x128_si256(v0, v1, 0x20)),
                                                  _mm256_permute2x128_si256(v2, v3, 0x20), 1);
            const __m512i w1 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_permute2x128_si256(v0, v1, 0x31)),
                                                  _mm256_permute2x128_si256(v2, v3, 0x31), 1);
            _mm512_store_si512((void *)(bp + t * SA_I8_NR), w0);
            _mm512_store_si512((void *)(bp + t * SA_I8_NR + 64), w1);
            s0 = _mm512_dpbusd_epi32(s0, ones, w0), s1 = _mm512_dpbusd_epi32(s1, ones, w1);
        }
        _mm512_storeu_si512((void *)cs, s0);
        _mm512_storeu_si512((void *)(cs + 16), s1);
        for (; t < kp; t++)  /* the last rows of a depth that is not a multiple of 4, and the pad */
            for (int c = 0; c < SA_I8_NR; c++) {
                const int8_t v = t < k ? B[t * ldb + j + c] : 0;
                bp[(t / 4) * SA_I8_NR * 4 + c * 4 + t % 4] = v;
                cs[c] += v;
            }
        for (int c = 0; c < SA_I8_NR; c++) cs[c] *= 128;
        return;
    }
#endif
    for (int c = 0; c < SA_I8_NR; c++) cs[c] = 0;
    for (int64_t t = 0; t < kp; t++) {
        SA_FN(sa_i8b_t) *o = bp + (t / SA_I8_DK) * SA_I8_NR * SA_I8_DK + t % SA_I8_DK;
        const int8_t *b = B + t * ldb + j;
        int c = 0;
        if (t < k)
            for (; c < cols; c++) {
                o[c * SA_I8_DK] = b[c];
                cs[c] += b[c];
            }
        for (; c < SA_I8_NR; c++) o[c * SA_I8_DK] = 0;
    }
    for (int c = 0; c < SA_I8_NR; c++) cs[c] *= 128;
}

/* C[i .. i + MR, j .. j + cols] (ldc) = MR rows of ap (kp a row) times the panel, over the whole
 * depth: the panel (kp x NR) stays in L2 (slices of 256 kept in L1 measured no faster) */
static inline __attribute__((always_inline)) void SA_FN(sa_i8_tile)(const int MR, const SA_FN(sa_i8a_t) *ap,
                                                                    int64_t kp, const SA_FN(sa_i8b_t) *bp,
                                                                    const int32_t *cs, int32_t *C, int64_t ldc,
                                                                    int cols) {
    int32_t lanes[SA_I8_MR][SA_I8_NR] __attribute__((aligned(64)));
#if SA_I8_KIND == 2
    __m512i acc[SA_I8_MR][2];
    const __m512i c0 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_loadu_si512((const void *)cs));
    const __m512i c1 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_loadu_si512((const void *)(cs + 16)));
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) acc[r][0] = c0, acc[r][1] = c1;
    for (int64_t t = 0; t < kp; t += 4, bp += 4 * SA_I8_NR) {
        const __m512i b0 = _mm512_load_si512((const void *)bp), b1 = _mm512_load_si512((const void *)(bp + 64));
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            int32_t word;
            memcpy(&word, ap + r * kp + t, 4);
            const __m512i av = _mm512_set1_epi32(word);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], av, b0);
            acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], av, b1);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        _mm512_store_si512((void *)lanes[r], acc[r][0]);
        _mm512_store_si512((void *)(lanes[r] + 16), acc[r][1]);
    }
#elif SA_I8_KIND == 1
    (void)cs;
    SA_I8_VI acc[SA_I8_MR][2];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = SA_I8_ZERO();
    for (int64_t t = 0; t < kp; t += 2, bp += 2 * SA_I8_NR) {
        const SA_I8_VI b0 = SA_I8_LOAD(bp), b1 = SA_I8_LOAD(bp + SA_I8_NR);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            int32_t word;  /* two int16 of A's row: depth t and t + 1 */
            memcpy(&word, ap + r * kp + t, 4);
            const SA_I8_VI av = SA_I8_SET1(word);
            acc[r][0] = SA_I8_ADD(acc[r][0], SA_I8_MADD(av, b0));
            acc[r][1] = SA_I8_ADD(acc[r][1], SA_I8_MADD(av, b1));
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        memcpy(lanes[r], &acc[r][0], sizeof(SA_I8_VI));
        memcpy(lanes[r] + SA_I8_W, &acc[r][1], sizeof(SA_I8_VI));
    }
#else
    (void)cs;
    SA_FN(sa_i8v) acc[SA_I8_MR][2];
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = (SA_FN(sa_i8v)){0};
    for (int64_t t = 0; t < kp; t++, bp += SA_I8_NR) {
        SA_FN(sa_i8v) b0, b1;
        memcpy(&b0, bp, sizeof b0);
        memcpy(&b1, bp + SA_I8_W, sizeof b1);
        for (int r = 0; r < MR; r++) {
            const int32_t a = ap[r * kp + t];
            acc[r][0] += a * b0;
            acc[r][1] += a * b1;
        }
    }
    for (int r = 0; r < MR; r++) {
        memcpy(lanes[r], &acc[r][0], sizeof acc[r][0]);
        memcpy(lanes[r] + SA_I8_W, &acc[r][1], sizeof acc[r][1]);
    }
#endif
    for (int r = 0; r < MR; r++) memcpy(C + r * ldc, lanes[r], (size_t)cols * 4);
}

/* C[i0:i1, j:j + cols] (ldc) = rows i0 .. i1 of the packed A (ap, kp a row) times B's columns j ..
 * j + cols (cols <= NR), swept by micro-tiles of MR rows; the panel goes into scratch (sa_i8_scratch(kp)
 * bytes) where pack is set, else scratch holds it from the last call (the same j) */
static void SA_FN(sa_i8_panel)(const void *ap_, int64_t i0, int64_t i1, int64_t k, int64_t kp, const int8_t *B,
                               int64_t ldb, int64_t j, int cols, int32_t *C, int64_t ldc, void *scratch, int pack) {
    const SA_FN(sa_i8a_t) *ap = (const SA_FN(sa_i8a_t) *)ap_;
    SA_FN(sa_i8b_t) *bp = (SA_FN(sa_i8b_t) *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    int32_t *cs = (int32_t *)(bp + kp * SA_I8_NR);
    if (pack) SA_FN(sa_i8_pack_b)(B, ldb, k, kp, j, cols, bp, cs);
    int64_t i = i0;
    for (; i + SA_I8_MR <= i1; i += SA_I8_MR)
        SA_FN(sa_i8_tile)(SA_I8_MR, ap + i * kp, kp, bp, cs, C + i * ldc + j, ldc, cols);
    for (; i < i1; i++) SA_FN(sa_i8_tile)(1, ap + i * kp, kp, bp, cs, C + i * ldc + j, ldc, cols);
}

/* The int8 peak: `iters` steps of 12 independent multiply-add chains of the copy's instruction
 * (vpdpbusd: 64 byte products a register; vpmaddwd + vpaddd: 2 x 16 or 2 x 8 int16 pairs; generic:
 * int32 multiply-adds), no loads. Returns the multiply-adds done; *sink keeps the chains alive. */
static int64_t SA_FN(sa_i8_peak)(int64_t iters, int32_t *sink) {
#if SA_I8_KIND == 2
    __m512i acc[12];
    const __m512i a = _mm512_set1_epi32(0x01020304), b = _mm512_set1_epi32(0x01010101 * (*sink & 3));
    for (int c = 0; c < 12; c++) acc[c] = _mm512_set1_epi32(c);
    for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int c = 0; c < 12; c++) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
    }
    int32_t lanes[16];
    for (int c = 1; c < 12; c++) acc[0] = _mm512_add_epi32(acc[0], acc[c]);
    _mm512_storeu_si512((void *)lanes, acc[0]);
    *sink = lanes[0];
    return iters * 12 * 64;
#elif SA_I8_KIND == 1
    SA_I8_VI acc[12];
    SA_I8_VI a = SA_I8_SET1(0x00030004);
    const SA_I8_VI b = SA_I8_SET1(0x00010001 * (*sink & 3));
    for (int c = 0; c < 12; c++) acc[c] = SA_I8_SET1(c);
    for (int64_t it = 0; it < iters; it++) {
        __asm__ volatile("" : "+x"(a));  /* opaque each step: the products are not hoisted */
#pragma GCC unroll 12
        for (int c = 0; c < 12; c++) acc[c] = SA_I8_ADD(acc[c], SA_I8_MADD(a, b));
    }
    int32_t lanes[SA_I8_W * 2];
    for (int c = 1; c < 12; c++) acc[0] = SA_I8_ADD(acc[0], acc[c]);
    memcpy(lanes, &acc[0], sizeof acc[0]);
    *sink = lanes[0];
    return iters * 12 * SA_I8_W * 2;
#else
    SA_FN(sa_i8v) acc[12];
    const int32_t b = *sink & 3;
    SA_FN(sa_i8v) a = (SA_FN(sa_i8v)){0} + 3;
    for (int c = 0; c < 12; c++) acc[c] = (SA_FN(sa_i8v)){0} + c;
    for (int64_t it = 0; it < iters; it++) {
        __asm__ volatile("" : "+g"(a));  /* opaque each step: the products are not hoisted */
        for (int c = 0; c < 12; c++) acc[c] += a * b;
    }
    for (int c = 1; c < 12; c++) acc[0] += acc[c];
    *sink = acc[0][0];
    return iters * 12 * SA_I8_W;
#endif
}

#undef SA_I8_KIND
#undef SA_I8_DK
#undef SA_I8_NR
#undef SA_I8_MR
#undef SA_I8_W
#undef SA_I8_VI
#undef SA_I8_LOAD
#undef SA_I8_SET1
#undef SA_I8_MADD
#undef SA_I8_ADD
#undef SA_I8_ZERO
#endif
