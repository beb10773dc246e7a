/* The attention plan as the C kernels read it (attention.h, attention_backward.h): the constants,
 * the structs mirroring silkattn/_plan.py, and the scratch carving. */
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

/* The blocking geometry, named once. Register blocks are SA_BR rows x SA_NR columns, both set by
 * the copy's vector width (tmpl_attention.h; SA_NR is two vectors): S^T = K Q^T runs SA_BR keys x
 * SA_NR queries, O += P V runs SA_BR queries x SA_NR columns of d_v. SA_BR_OF(vbytes): the rows of
 * the copies of that vector width, as many as fit 2 SA_BR accumulators + 2 operands + 1 broadcast in
 * the register file: 6 in AVX2's 16 registers (and the generic copy's), 8 in AVX-512's 32 for the
 * 64-byte copies (8 divides SA_BK and SA_BQ, so no block is padded; avx2x64 runs those 8-row blocks
 * on AVX2, for the tests). SA_BR_MAX, the most of any copy, sizes the scratch they share. Tiles are
 * SA_BQ queries x SA_BK keys by default: the S^T tile (SA_BK x SA_BQ) then stays in L1. SA_COL_PAD:
 * room past a row for the last register block of any instance (2 vectors of 64 bytes of float). */
#define SA_BR_OF(vbytes) ((vbytes) == 64 ? 8 : 6)
#define SA_BR_MAX SA_BR_OF(64)
#define SA_BQ 96
#define SA_BK 64
#define SA_COL_PAD 32
/* The rows path (a few query rows per K/V unit): keys per online-softmax step. The chunks the
 * threads share are the plan's (silkattn/_plan.py CHUNK_KEYS keys each), fixed, so the result
 * does not depend on the thread count. */
#define SA_DEC_BLOCK 64

/* The attention plan (silkattn/_plan.py), field for field: the structs mirror the numpy dtypes
 * ITEM, UNIT, TASK, GROUP, ROW and CHUNK (every field 8 bytes, so the layouts agree). */
typedef struct {
    int64_t q, k, v, mask, bias, out;  /* element offset of the item's first row in each operand */
    int64_t sq, sk;                    /* its query rows and keys */
    int64_t pos;                       /* the position of its query 0: query i sits at pos + i */
    int64_t unit;                      /* the K/V unit it reads */
    double slope;                      /* ALiBi's slope for its head */
} sa_item;
typedef struct { int64_t k, v, sk; } sa_unit;
typedef struct { int64_t item, q0, rows; } sa_task;
typedef struct { int64_t unit, row0, nrows, chunk0, nchunks; } sa_group;
typedef struct { int64_t item, i; } sa_row;
typedef struct { int64_t group, j0, j1, part; } sa_chunk;

typedef struct {
    const void *q, *k, *v, *bias;
    const uint8_t *mask;
    void *out;
    int64_t rs_q, rs_k, rs_v, rs_mask, rs_bias;  /* element step between rows (0: broadcast rows) */
    int64_t dk, dv, bq, bk;                      /* bq: the most rows of a task */
    double scale, softcap;                       /* softcap 0: none */
    int64_t left, right;                         /* key j visible to position p: p - left <= j <= p + right */
    int has_mask, has_bias, has_alibi;
    int stream;                                  /* rows path: K/V from memory, prefetch a block ahead */
    const sa_item *items;
    const sa_unit *units;
    const sa_task *tasks;                        /* tiles path */
    const sa_group *groups;                      /* rows path */
    const sa_row *rows;
    const sa_chunk *chunks;
    int64_t page_keys;                           /* a paged plan's keys a page (0: not paged) */
    const int64_t *pages;                        /* its pages' (K, V) offsets; a unit's k: its first page */
    void *lse;                                   /* NULL, or each output row's log sum exp of its scores
                                                    (natural units), row r of item it at it->out / dv + r */
} sa_attn_plan;

/* The offsets of key j of unit u's K and V rows (key j at kv[0] + j rs_k and kv[1] + j rs_v from j's
 * page start on: the keys of one page are consecutive rows); ku, kv: the unit's k and v fields */
static inline void sa_key_base(const sa_attn_plan *a, int64_t ku, int64_t vu, int64_t j, int64_t kv[2]) {
    if (!a->page_keys) {
        kv[0] = ku, kv[1] = vu;
        return;
    }
    const int64_t page = j / a->page_keys, first = page * a->page_keys;
    kv[0] = a->pages[2 * (ku + page)] - first * a->rs_k;
    kv[1] = a->pages[2 * (ku + page) + 1] - first * a->rs_v;
}

/* Does the score need the pass between Q K^T and the softmax (natural units: softcap, bias, ALiBi)? */
static inline int sa_transforms(const sa_attn_plan *a) { return a->softcap > 0 || a->has_bias || a->has_alibi; }

/* The next rows x cols block of scratch, 64-byte aligned; sa_attn_scratch_bytes sums the same. */
static void *sa_carve(char **cur, int64_t rows, int64_t cols, size_t tsize) {
    void *p = *cur;
    *cur += ((size_t)rows * (size_t)cols * tsize + 63) / 64 * 64;
    return p;
}

#endif
