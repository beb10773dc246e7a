#include "attention_plan.h"

#ifndef SA_ATTENTION_BACKWARD_ARGS
#define SA_ATTENTION_BACKWARD_ARGS
/* attention's backward over the forward's plan (the scores' features, the window, the mask, the
 * items and units): what the backward adds. Rows follow the forward's output layout (row i of an
 * item at item.out / d_v + i); the gradients follow the operands' (dQ at item.q + i rs_q, dK and
 * dV at unit.k + j rs_k and unit.v + j rs_v: the caller gives each item its own Q rows and each
 * unit its own K and V rows, so a task, one unit, is the only writer of everything it writes). */
typedef struct {
    const void *dout;        /* dL/d out, rows x d_v */
    const void *d;           /* D = rowsum(dout * out) per row */
    const void *lse;         /* the forward's log sum exp per row */
    void *fix;               /* per row (base, rel): its weights are exp((s - base) - rel); (lse, 0) but
                                for rows whose lse is near SA_MASKED (every key hidden), where the
                                task works out the row's max score and log sum exp(s - max) exactly */
    void *dq, *dk, *dv;      /* the gradients, zero on entry for dQ (accumulated over key tiles) */
    const int64_t *items;    /* the items sorted by unit: unit u's are items[first[u] .. first[u + 1]) */
    const int64_t *first;
} sa_attn_back;

/* Tiles of SA_BWD_Q queries x SA_BWD_K keys: the five products of a tile pair (S = Q K^T, dP =
 * dO V^T, dV += P^T dO, dK += dS^T Q, dQ += dS K) each run over 64 x 64 blocks held in L1/L2. */
#define SA_BWD_Q 64
#define SA_BWD_K 64

/* The scratch one thread carves (elements): K^T and V^T of the key tile (d x SA_BWD_K), K's rows
 * and the dK, dV accumulators (SA_BWD_K x d padded), the query tile's Q, dO and dQ rows (SA_BWD_Q x
 * d padded), the tile's P, dS (and tanh under a softcap) (SA_BWD_Q x SA_BWD_K), a hidden-pair mark
 * per score, and per query its lse and D. dkp, dvp: d_k, d_v rounded up to whole register blocks. */
static size_t sa_attn_back_scratch(int64_t dk, int64_t dv, int64_t dkp, int64_t dvp, size_t tsize) {
    const size_t q = SA_BWD_Q, k = SA_BWD_K;
    return (size_t)(dk + dv) * k * tsize + k * (size_t)(2 * dkp + dvp) * tsize + q * (size_t)(2 * dkp + dvp) * tsize
           + 3 * q * k * tsize + q * k + 3 * q * tsize + 16 * 64;
}
#endif

#define SA_TEMPLATE "tmpl_attention_backward.h"
#include "instances.h"

#define SA_ATTENTION_BACKWARD_KERNELS(X, T)                                                         \
    X(attn_back_unit, SA_PICK, (const sa_attn_plan *a, const sa_attn_back *b, int64_t u, void *scratch), \
      (a, b, u, scratch))
SA_DISPATCHERS(SA_ATTENTION_BACKWARD_KERNELS)
