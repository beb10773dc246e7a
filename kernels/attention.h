#include "isa.h"

#ifndef SA_ATTENTION_ARGS
#define SA_ATTENTION_ARGS
#define SA_MASKED (-1e9)
#define SA_LOG2E 1.4426950408889634

/* One attention call, as the Python bookkeeping laid it out (see silkattn/_api.py). */
typedef struct {
    const void *q, *k, *v;
    const uint8_t *mask;
    void *out;               /* (B, Sq, dv) C order */
    const int64_t *offsets;  /* (B, 4): element offset of batch item b in q, k, v, mask */
    int64_t rs[4];           /* element step between rows of q, k, v, mask */
    int64_t Sq, Sk, dk, dv;
    int64_t bq, bk;          /* tile sizes: bq a multiple of 6 */
    int causal, masked;
} sa_attn_args;

/* The next rows x cols block of scratch, 64-byte aligned; sa_attn_scratch_bytes sums the same. */
static void *sa_carve(char **cur, int64_t rows, int64_t cols, size_t tsize) {
    void *p = *cur;
    *cur += ((size_t)rows * (size_t)cols * tsize + 63) / 64 * 64;
    return p;
}

static size_t sa_attn_scratch_bytes(const sa_attn_args *a, size_t tsize) {
    char *cur = NULL;  /* the same carving as sa_attn_tile, counted from address 0 */
    int64_t ldq = a->bq + 16;
    sa_carve(&cur, a->dk, ldq, tsize), sa_carve(&cur, a->bk + 6, ldq, tsize);
    sa_carve(&cur, 6, a->dk, tsize), sa_carve(&cur, a->bk, a->dv + 16, tsize);
    sa_carve(&cur, a->bq + 6, a->dv + 16, tsize), sa_carve(&cur, 3, ldq, tsize);
    return (size_t)cur;
}
#endif

#define SA_TEMPLATE "tmpl_attention.h"
#include "instances.h"

#define SA_DISPATCH(name)                                                                          \
    static inline void sa_attn_tile_##name(int isa, const sa_attn_args *a, int64_t b, int64_t q0,   \
                                           void *scratch) {                                        \
        (isa ? sa_attn_tile_##name##_avx2 : sa_attn_tile_##name##_generic)(a, b, q0, scratch); }
SA_DISPATCH(f32)
SA_DISPATCH(f64)
#undef SA_DISPATCH
