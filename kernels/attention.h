#include "isa.h"

#ifndef SA_ATTENTION_ARGS
#define SA_ATTENTION_ARGS
#define SA_MASKED (-1e9)
#define SA_LOG2E 1.4426950408889634

/* A key the kernel skips (a causal tile, a fully masked tile) weighs exp(SA_MASKED - m) in the
 * reference, m being the row's max score: exactly 0 in either dtype once m - SA_MASKED > 745
 * (float64's exp underflows there, float32's much sooner). Rows whose max is closer to SA_MASKED
 * than SA_EXACT_MARGIN (a fully masked row, or absurd scores) are recomputed exactly over all keys.
 * The Numba kernel uses the same margin (silkattn/numba/attention.py). */
#define SA_EXACT_MARGIN 2000.0

/* The blocking geometry, named once. Register blocks are SA_MR rows x SA_NR columns (SA_NR = two
 * vectors, so it depends on the instance: see tmpl_attention.h): S^T = K Q^T runs SA_MR keys x
 * SA_NR queries, O += P V runs SA_MR queries x SA_NR columns of d_v. The 64-byte instances have
 * 32 registers on AVX-512 and run SA_MR_WIDE rows (a multiple of 8 divides SA_BK and SA_BQ, so no
 * block is padded); SA_MR_MAX sizes the scratch for either. Tiles are SA_BQ queries x SA_BK keys by
 * default: the S^T tile (SA_BK x SA_BQ) then stays in L1. SA_COL_PAD: room past a row for the last
 * register block of any instance (2 vectors of 64 bytes of float). */
#define SA_MR 6
#define SA_MR_WIDE 8
#define SA_MR_MAX 8
#define SA_BQ 96
#define SA_BK 64
#define SA_COL_PAD 32
/* The decode (single-query) path: keys per online-softmax step, and per chunk. Every item's keys
 * are cut into chunks of SA_DEC_CHUNK, the tasks the threads share: fixed, so the result does not
 * depend on the thread count. */
#define SA_DEC_BLOCK 64
#define SA_DEC_CHUNK 256

/* One attention call, as the Python bookkeeping laid it out (see silkattn/_api.py). */
typedef struct {
    const void *q, *k, *v;
    const uint8_t *mask;
    void *out;               /* (B, Sq, dv) C order */
    const int64_t *offsets;  /* (B, 4): element offset of batch item b in q, k, v, mask */
    int64_t rs[4];           /* element step between rows of q, k, v, mask */
    int64_t Sq, Sk, dk, dv;
    int64_t q_offset;        /* causal: query i sits at position q_offset + i and sees keys j <= it */
    const int64_t *items;    /* (B, 3): item b's own Sq, Sk and out offset (packed sequences), or NULL:
                              * every item Sq x Sk, its output at b Sq dv */
    int64_t bq, bk;          /* tile sizes: any bq >= 1 is correct (see attention.pyx) */
    int causal, masked;
} sa_attn_args;

static inline int64_t sa_item_sq(const sa_attn_args *a, int64_t b) { return a->items ? a->items[3 * b] : a->Sq; }
static inline int64_t sa_item_sk(const sa_attn_args *a, int64_t b) { return a->items ? a->items[3 * b + 1] : a->Sk; }
static inline int64_t sa_item_out(const sa_attn_args *a, int64_t b) {
    return a->items ? a->items[3 * b + 2] : b * a->Sq * a->dv;
}

/* The next rows x cols block of scratch, 64-byte aligned; sa_attn_scratch_bytes sums the same. */
static void *sa_carve(char **cur, int64_t rows, int64_t cols, size_t tsize) {
    void *p = *cur;
    *cur += ((size_t)rows * (size_t)cols * tsize + 63) / 64 * 64;
    return p;
}

static size_t sa_attn_scratch_bytes(const sa_attn_args *a, size_t tsize) {
    char *cur = NULL;  /* the same carving as sa_attn_tile, counted from address 0 */
    int64_t ldq = a->bq + SA_COL_PAD;
    sa_carve(&cur, a->dk, ldq, tsize), sa_carve(&cur, a->bk + SA_MR_MAX, ldq, tsize);
    sa_carve(&cur, SA_MR_MAX, a->dk, tsize), sa_carve(&cur, a->bk, a->dv + SA_COL_PAD, tsize);
    sa_carve(&cur, a->bq + SA_MR_MAX, a->dv + SA_COL_PAD, tsize), sa_carve(&cur, 3, ldq, tsize);
    return (size_t)cur;
}

static size_t sa_attn_decode_scratch(int64_t dk) { return (size_t)(dk + SA_COL_PAD + SA_DEC_BLOCK + SA_COL_PAD); }
#endif

#define SA_TEMPLATE "tmpl_attention.h"
#include "instances.h"

#define SA_DISPATCH(name)                                                                          \
    static inline void sa_attn_tile_##name(int isa, const sa_attn_args *a, int64_t b, int64_t q0,   \
                                           void *scratch) {                                        \
        SA_PICK(sa_attn_tile_##name, isa)(a, b, q0, scratch); }
SA_DISPATCH(f32)
SA_DISPATCH(f64)
#undef SA_DISPATCH

#define SA_DISPATCH(T, name)                                                                       \
    static inline void sa_attn_decode_part_##name(int isa, const sa_attn_args *a, int64_t b, int64_t j0, \
                                                  int64_t j1, T *part, T *scratch) {             \
        SA_PICK(sa_attn_decode_part_##name, isa)(a, b, j0, j1, part, scratch); } \
    static inline void sa_attn_decode_merge_##name(int isa, const sa_attn_args *a, int64_t b, int64_t nsplit, \
                                                   const T *parts, T *out) {                     \
        SA_PICK(sa_attn_decode_merge_##name, isa)(a, b, nsplit, parts, out); }
SA_DISPATCH(float, f32)
SA_DISPATCH(double, f64)
#undef SA_DISPATCH
