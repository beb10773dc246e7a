/* Blocks in groups of 16 rows: the decoding step's layouts of a Q4_K matrix (kind SA_Q4_K16), of a
 * Q6_K matrix (SA_Q6_K16, after Q4_K's) and of the blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0: SA_Q8_016
 * .. SA_Q5_016, at the end), made once from the file's blocks (sa_q4k16_pack, sa_q6k16_pack,
 * sa_b16_pack) for the AVX-512 VNNI few-row products, and read back (the *_unpack_row) by every
 * other copy. Q4_K: a row of the file
 * takes ldw = k / 256 * 144 bytes; rows 16 g .. 16 g + 15 take the same 16 ldw bytes here, as
 * k / 256 super-blocks of 2304 bytes, each the 16 rows' blocks i (r: the row in the group, b: the sub-block of 32, 0 .. 7):
 *     0     d, 16 float16          32    dmin, 16 float16
 *     64    scales' low 4 bits: byte 16 (b / 2) + r, b odd in the high nibble
 *     128   scales' high 2 bits: byte 16 (b / 4) + r, bits 2 (b % 4) and up
 *     160   mins' low 4 bits, 224 mins' high 2 bits (as the scales')
 *     256   q: 32 runs of 64 bytes, run c byte 4 r + t = q[8 c + t] | q[8 c + 4 + t] << 4
 * so that one 64-byte load holds 4 + 4 consecutive weights of all 16 rows: one vpdpbusd each
 * nibble against x's 4 bytes broadcast, the 16 sums landing in the rows' own lanes (no horizontal
 * sums), and a 512-bit shift and mask decode the 16 rows' scales of a sub-block at once. The same
 * bytes as the file's, their bits rearranged. */
#ifndef SA_ROWS16_H
#define SA_ROWS16_H
#include <stdint.h>
#include <string.h>
#include "quant_blocks.h"

#define SA_Q4K16_GROUP 16
#define SA_Q4K16_SUPER 2304  /* 16 rows x 144 bytes */

/* the 8 6-bit scales and mins of the file's 12 bytes at s (reference._k_quant's unpacking) */
static inline void sa_q4k16_scales(const uint8_t *s, int *sc, int *mn) {
    for (int c = 0; c < 8; c++) {
        sc[c] = c < 4 ? s[c] & 63 : (s[c + 4] & 15) | (s[c - 4] >> 6) << 4;
        mn[c] = c < 4 ? s[c + 4] & 63 : (s[c + 4] >> 4) | (s[c] >> 6) << 4;
    }
}

/* out (n, ldw bytes, n a multiple of 16) = the layout above of w's rows (the file's) */
static void __attribute__((unused)) sa_q4k16_pack(const uint8_t *w, int64_t ldw, int64_t n, uint8_t *out) {
    const int64_t nb = ldw / 144;
    for (int64_t g = 0; g < n / 16; g++)
        for (int64_t i = 0; i < nb; i++) {
            uint8_t *o = out + 16 * g * ldw + SA_Q4K16_SUPER * i;
            memset(o, 0, 256);
            for (int r = 0; r < 16; r++) {
                const uint8_t *p = w + (16 * g + r) * ldw + 144 * i, *qs = p + 16;
                int sc[8], mn[8];
                memcpy(o + 2 * r, p, 2);
                memcpy(o + 32 + 2 * r, p + 2, 2);
                sa_q4k16_scales(p + 4, sc, mn);
                for (int b = 0; b < 8; b++) {
                    o[64 + 16 * (b / 2) + r] |= (uint8_t)((sc[b] & 15) << 4 * (b & 1));
                    o[128 + 16 * (b / 4) + r] |= (uint8_t)((sc[b] >> 4) << 2 * (b % 4));
                    o[160 + 16 * (b / 2) + r] |= (uint8_t)((mn[b] & 15) << 4 * (b & 1));
                    o[224 + 16 * (b / 4) + r] |= (uint8_t)((mn[b] >> 4) << 2 * (b % 4));
                }
                /* the file's weight 64 c + l is byte 32 c + l's low nibble, 64 c + 32 + l its high */
                for (int c = 0; c < 32; c++)
                    for (int t = 0; t < 4; t++) {
                        const int j = 8 * c + t, u = j + 4;
                        const int lo = qs[32 * (j / 64) + j % 32] >> 4 * (j % 64 / 32) & 15;
                        const int hi = qs[32 * (u / 64) + u % 32] >> 4 * (u % 64 / 32) & 15;
                        o[256 + 64 * c + 4 * r + t] = (uint8_t)(lo | hi << 4);
                    }
            }
        }
}

/* row j's file blocks (ldw bytes at row) from the layout at w (the inverse of sa_q4k16_pack) */
static void __attribute__((unused)) sa_q4k16_unpack_row(const uint8_t *w, int64_t ldw, int64_t j, uint8_t *row) {
    const int64_t nb = ldw / 144, g = j / 16;
    const int r = (int)(j % 16);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *o = w + 16 * g * ldw + SA_Q4K16_SUPER * i;
        uint8_t *p = row + 144 * i, *qs = p + 16;
        int sc[8], mn[8];
        memcpy(p, o + 2 * r, 2);
        memcpy(p + 2, o + 32 + 2 * r, 2);
        for (int b = 0; b < 8; b++) {
            sc[b] = (o[64 + 16 * (b / 2) + r] >> 4 * (b & 1) & 15) | (o[128 + 16 * (b / 4) + r] >> 2 * (b % 4) & 3) << 4;
            mn[b] = (o[160 + 16 * (b / 2) + r] >> 4 * (b & 1) & 15) | (o[224 + 16 * (b / 4) + r] >> 2 * (b % 4) & 3) << 4;
        }
        for (int c = 0; c < 4; c++) {  /* the file's 12 bytes: 6 bits of 0..3 whole, 4..7 split */
            p[4 + c] = (uint8_t)(sc[c] | (sc[c + 4] >> 4) << 6);
            p[8 + c] = (uint8_t)(mn[c] | (mn[c + 4] >> 4) << 6);
            p[12 + c] = (uint8_t)((sc[c + 4] & 15) | (mn[c + 4] & 15) << 4);
        }
        memset(qs, 0, 128);
        for (int c = 0; c < 32; c++)
            for (int t = 0; t < 4; t++) {
                const int v = o[256 + 64 * c + 4 * r + t];
                for (int h = 0; h < 2; h++) {
                    const int u = 8 * c + 4 * h + t;
                    qs[32 * (u / 64) + u % 32] |= (uint8_t)((v >> 4 * h & 15) << 4 * (u % 64 / 32));
                }
            }
    }
}

/* Q6_K (kind SA_Q6_K16): rows 16 g .. 16 g + 15 take the same 16 ldw bytes (ldw = k / 256 * 210),
 * as k / 256 super-blocks of 3360 bytes, each the 16 rows' blocks i (r: the row in the group; q:
 * a weight's 6 bits, 0 .. 63, the weight (q - 32) d sc):
 *     0     d, 16 float16
 *     32    the 16 scales (int8) in pairs: 32 bytes a pair c, byte 2 r + e the scale of sub-block 2 c
 *           + e of row r, so that one vpmovsxbw gives 16 lanes of two int16 (vpdpwssd's pairs)
 *     288   16 sub-blocks of 16 weights, 192 bytes each, s the sub-block: 2 runs of q's low 4 bits,
 *           then a run of their high 2 bits, 64 bytes a run. Low run c (at 288 + 192 (c / 2) + 64
 *           (c % 2)): byte 4 r + t = q[8 c + t] | q[8 c + 4 + t] << 4; high run s (at 288 + 192 s
 *           + 128): byte 4 r + t = the high bits of q[16 s + t], q[16 s + 4 + t], q[16 s + 8 + t],
 *           q[16 s + 12 + t] from bit 0 up, 2 each
 * so that a sub-block is one vpdpbusd a nibble of 16 rows against x's 4 bytes broadcast, as Q4_K's,
 * and the kernel reads the super-block front to back (one stream for the prefetchers). The same
 * bytes as the file's, rearranged. */
#define SA_Q6K16_SUPER 3360  /* 16 rows x 210 bytes */
#define SA_Q6K16_LOW(c) (288 + 192 * ((c) / 2) + 64 * ((c) % 2))
#define SA_Q6K16_HIGH(s) (288 + 192 * (s) + 128)

/* weight u (0 .. 255) of the file's Q6_K block at p: its 6 bits (reference.dequantize's order) */
static inline int sa_q6k_bits(const uint8_t *p, int u) {
    const int h = u / 128, t = u % 32, part = u % 128 / 32;
    const int low = p[64 * h + t + 32 * (part & 1)] >> 4 * (part / 2) & 15;
    return low | (p[128 + 32 * h + t] >> 2 * part & 3) << 4;
}

/* out (n, ldw bytes, n a multiple of 16) = the layout above of w's rows (the file's) */
static void __attribute__((unused)) sa_q6k16_pack(const uint8_t *w, int64_t ldw, int64_t n, uint8_t *out) {
    const int64_t nb = ldw / 210;
    for (int64_t g = 0; g < n / 16; g++)
        for (int64_t i = 0; i < nb; i++) {
            uint8_t *o = out + 16 * g * ldw + SA_Q6K16_SUPER * i;
            for (int sb = 0; sb < 16; sb++) memset(o + SA_Q6K16_HIGH(sb), 0, 64);
            for (int r = 0; r < 16; r++) {
                const uint8_t *p = w + (16 * g + r) * ldw + 210 * i;
                memcpy(o + 2 * r, p + 208, 2);
                for (int s = 0; s < 16; s++) o[32 + 32 * (s / 2) + 2 * r + (s & 1)] = p[192 + s];
                for (int c = 0; c < 32; c++)
                    for (int t = 0; t < 4; t++) {
                        const int lo = sa_q6k_bits(p, 8 * c + t), hi = sa_q6k_bits(p, 8 * c + 4 + t);
                        o[SA_Q6K16_LOW(c) + 4 * r + t] = (uint8_t)((lo & 15) | (hi & 15) << 4);
                        o[SA_Q6K16_HIGH(c / 2) + 4 * r + t] |= (uint8_t)(((lo >> 4) | (hi >> 4) << 2) << 4 * (c & 1));
                    }
            }
        }
}

/* row j's file blocks (ldw bytes at row) from the layout at w (the inverse of sa_q6k16_pack) */
static void __attribute__((unused)) sa_q6k16_unpack_row(const uint8_t *w, int64_t ldw, int64_t j, uint8_t *row) {
    const int64_t nb = ldw / 210, g = j / 16;
    const int r = (int)(j % 16);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *o = w + 16 * g * ldw + SA_Q6K16_SUPER * i;
        uint8_t *p = row + 210 * i;
        memcpy(p + 208, o + 2 * r, 2);
        for (int s = 0; s < 16; s++) p[192 + s] = o[32 + 32 * (s / 2) + 2 * r + (s & 1)];
        memset(p, 0, 192);
        for (int u = 0; u < 256; u++) {
            const int c = u / 8, t = u % 4, half = u % 8 / 4;
            const int low = o[SA_Q6K16_LOW(c) + 4 * r + t] >> 4 * half & 15;
            const int q = low | (o[SA_Q6K16_HIGH(c / 2) + 4 * r + t] >> (4 * (c & 1) + 2 * half) & 3) << 4;
            const int h = u / 128, tt = u % 32, part = u % 128 / 32;
            p[64 * h + tt + 32 * (part & 1)] |= (uint8_t)((q & 15) << 4 * (part / 2));
            p[128 + 32 * h + tt] |= (uint8_t)((q >> 4) << 2 * part);
        }
    }
}

/* The blocks of 32 weights (Q8_0, Q4_0, Q4_1, Q5_0; kind: the file's): a group's block i takes 16
 * blocks' bytes (SA_B16_BYTES), the 16 rows' fields side by side,
 *     0     d, 16 float16
 *     32    Q4_1: m, 16 float16;  Q5_0: qh, 16 x 4 bytes (the file's, row r at 4 r)
 *     then  the q (SA_B16_RUNS): 4-bit kinds, 4 runs of 64 bytes, run c byte 4 r + t = q[8 c + t] |
 *           q[8 c + 4 + t] << 4 (the low 4 bits of Q5_0's q); Q8_0, 8 runs, run c byte 4 r + t =
 *           q[4 c + t] + 128 as unsigned (vpdpbusd's u8; x . w = d (d_x (u . q_x) - 128 xs))
 * so that one 64-byte load holds 4 consecutive weights (or 4 + 4) of all 16 rows: vpdpbusd against
 * x's 4 bytes broadcast leaves the 16 rows' sums in their own lanes. For Q5_0 one vpshufb spreads
 * byte c of each row's qh over its 4 bytes, two bit tests give the fifth bits of run c's nibbles as
 * byte masks. */
#define SA_B16_BYTES(kind) (16 * ((kind) == SA_Q8_0 ? 34 : (kind) == SA_Q4_0 ? 18 : (kind) == SA_Q4_1 ? 20 : 22))
#define SA_B16_RUNS(kind) ((kind) == SA_Q8_0 || (kind) == SA_Q4_0 ? 32 : (kind) == SA_Q4_1 ? 64 : 96)
#define SA_Q5016_BLOCK 352  /* 16 rows x 22 bytes */

/* the byte of run c, offset t, of a block's q (its bytes at qs: the file's) */
static inline uint8_t sa_b16_byte(int kind, const uint8_t *qs, int c, int t) {
    if (kind == SA_Q8_0) return (uint8_t)(qs[4 * c + t] ^ 0x80);
    const int j = 8 * c + t, u = j + 4;
    const int lo = qs[j % 16] >> 4 * (j / 16) & 15, hi = qs[u % 16] >> 4 * (u / 16) & 15;
    return (uint8_t)(lo | hi << 4);
}

/* the file's offsets in a block: its second field (m or qh) and its q */
static inline int sa_b16_qs(int kind) {
    return kind == SA_Q8_0 || kind == SA_Q4_0 ? 2 : kind == SA_Q4_1 ? 4 : 6;
}

static void __attribute__((unused)) sa_b16_pack(int kind, const uint8_t *w, int64_t ldw, int64_t n, uint8_t *out) {
    const int bytes = SA_B16_BYTES(kind) / 16, runs = kind == SA_Q8_0 ? 8 : 4, at = SA_B16_RUNS(kind);
    const int64_t nb = ldw / bytes;
    for (int64_t g = 0; g < n / 16; g++)
        for (int64_t i = 0; i < nb; i++) {
            uint8_t *o = out + 16 * g * ldw + SA_B16_BYTES(kind) * i;
            for (int r = 0; r < 16; r++) {
                const uint8_t *p = w + (16 * g + r) * ldw + bytes * i, *qs = p + sa_b16_qs(kind);
                memcpy(o + 2 * r, p, 2);
                if (kind == SA_Q4_1) memcpy(o + 32 + 2 * r, p + 2, 2);
                if (kind == SA_Q5_0) memcpy(o + 32 + 4 * r, p + 2, 4);
                for (int c = 0; c < runs; c++)
                    for (int t = 0; t < 4; t++) o[at + 64 * c + 4 * r + t] = sa_b16_byte(kind, qs, c, t);
            }
        }
}

/* row j's file blocks (ldw bytes at row) from the layout at w (the inverse of sa_b16_pack) */
static void __attribute__((unused)) sa_b16_unpack_row(int kind, const uint8_t *w, int64_t ldw, int64_t j,
                                                      uint8_t *row) {
    const int bytes = SA_B16_BYTES(kind) / 16, runs = kind == SA_Q8_0 ? 8 : 4, at = SA_B16_RUNS(kind);
    const int64_t nb = ldw / bytes, g = j / 16;
    const int r = (int)(j % 16);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *o = w + 16 * g * ldw + SA_B16_BYTES(kind) * i;
        uint8_t *p = row + bytes * i, *qs = p + sa_b16_qs(kind);
        memcpy(p, o + 2 * r, 2);
        if (kind == SA_Q4_1) memcpy(p + 2, o + 32 + 2 * r, 2);
        if (kind == SA_Q5_0) memcpy(p + 2, o + 32 + 4 * r, 4);
        if (kind != SA_Q8_0) memset(qs, 0, 16);
        for (int c = 0; c < runs; c++)
            for (int t = 0; t < 4; t++) {
                const int v = o[at + 64 * c + 4 * r + t];
                if (kind == SA_Q8_0) {
                    qs[4 * c + t] = (uint8_t)(v ^ 0x80);
                    continue;
                }
                for (int h = 0; h < 2; h++) {
                    const int u = 8 * c + 4 * h + t;
                    qs[u % 16] |= (uint8_t)((v >> 4 * h & 15) << 4 * (u / 16));
                }
            }
    }
}
#endif
