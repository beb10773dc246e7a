#include "isa.h"

#include "attention_plan.h"

#ifndef SA_ATTENTION_SCRATCH
#define SA_ATTENTION_SCRATCH
static size_t sa_attn_scratch_bytes(const sa_attn_plan *a, size_t tsize) {
    char *cur = NULL;  /* the same carving as sa_attn_tile, counted from address 0 */
    int64_t ldq = a->bq + SA_COL_PAD;
    sa_carve(&cur, a->dk, ldq, tsize), sa_carve(&cur, a->bk + SA_BR_MAX, ldq, tsize);
    sa_carve(&cur, SA_BR_MAX, a->dk, tsize), sa_carve(&cur, a->bk, a->dv + SA_COL_PAD, tsize);
    sa_carve(&cur, a->bq + SA_BR_MAX, a->dv + SA_COL_PAD, tsize), sa_carve(&cur, 3, ldq, tsize);
    return (size_t)cur;
}

/* The rows path's scratch (elements): per row its scaled query, a block of scores, its
 * accumulator, max and sum (a vector: 16 lanes at most); then one block of V padded to whole
 * vectors; then the queries as the four-row kernel reads them (4 copies per 4 rows: dk a row). */
#define SA_ROWS_MAX 16
static size_t sa_attn_rows_scratch(int64_t dk, int64_t dv) {
    const size_t dvp = (size_t)(dv + SA_COL_PAD);  /* >= d_v rounded up to whole vectors */
    return SA_ROWS_MAX * ((size_t)(dk + SA_COL_PAD) + SA_DEC_BLOCK + SA_COL_PAD + dvp + 1 + 16) + SA_DEC_BLOCK * dvp
           + SA_ROWS_MAX * (size_t)dk;
}
#endif

#define SA_TEMPLATE "tmpl_attention.h"
#include "instances.h"

/* The kernels, for SA_DISPATCHERS (isa.h): X(name, pick, (params), (args)) */
#define SA_ATTENTION_KERNELS(X, T)                                                                  \
    X(attn_tile, SA_PICK, (const sa_attn_plan *a, const sa_task *t, void *scratch), (a, t, scratch))  \
    X(attn_rows_part, SA_PICK, (const sa_attn_plan *a, const sa_chunk *c, T *parts, T *scratch),     \
      (a, c, parts, scratch))                                                                       \
    X(attn_rows_merge, SA_PICK, (const sa_attn_plan *a, const sa_group *g, const T *parts), (a, g, parts))
SA_DISPATCHERS(SA_ATTENTION_KERNELS)
