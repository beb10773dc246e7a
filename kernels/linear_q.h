#include "isa.h"
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  /* _cvtsh_ss (F16C) */
#endif

/* The block types by their code in the kernel contract (silkattn.quant.KINDS), and their bytes. */
enum { SA_Q8_0 = 0, SA_Q4_0 = 1, SA_Q4_1 = 2 };
#define SA_QBYTES(kind) ((kind) == SA_Q8_0 ? 34 : (kind) == SA_Q4_0 ? 18 : 20)
#define SA_QROWS 8  /* the most rows of x (silkattn._api.LINEAR_ROWS) */
#define SA_QCH 16   /* blocks a chunk, their scales converted together; x's block sums padded to it */

#define SA_TEMPLATE "tmpl_linear_q.h"
#include "instances.h"

static inline void sa_linear_q_xsum_f32(int isa, const float *x, int64_t k, int64_t m, float *xs) {
    SA_PICK(sa_linear_q_xsum_f32, isa)(x, k, m, xs);
}
static inline void sa_linear_q_rows_f32(int isa, int kind, const float *x, int64_t k, int64_t m, const uint8_t *w,
                                        int64_t ldw, int64_t n, const float *xs, const float *b, int64_t j0,
                                        int64_t j1, float *y, int64_t ldy) {
    SA_PICK(sa_linear_q_rows_f32, isa)(kind, x, k, m, w, ldw, n, xs, b, j0, j1, y, ldy);
}
