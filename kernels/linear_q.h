#include "isa.h"
#include "quant_blocks.h"

#define SA_TEMPLATE "tmpl_linear_q.h"
#define SA_VNNI_COPY
#include "instances.h"

static inline void sa_linear_q_xsum_f32(int isa, const float *x, int64_t k, int64_t m, float *xs) {
    SA_PICK(sa_linear_q_xsum_f32, isa)(x, k, m, xs);
}
static inline void sa_linear_q_rows_f32(int isa, int kind, const float *x, int64_t k, int64_t m, const uint8_t *w,
                                        int64_t ldw, int64_t n, const float *xs, const float *b, int64_t j0,
                                        int64_t j1, float *y, int64_t ldy) {
    SA_PICK(sa_linear_q_rows_f32, isa)(kind, x, k, m, w, ldw, n, xs, b, j0, j1, y, ldy);
}
static inline void sa_dequantize_rows_f32(int isa, int kind, const uint8_t *w, int64_t ldw, int64_t k, int64_t j0,
                                          int64_t rows, float *out) {
    SA_PICK(sa_dequantize_rows_f32, isa)(kind, w, ldw, k, j0, rows, out);
}
static inline void sa_quantize_q8_f32(int isa, const float *x, int64_t k, int64_t m, int8_t *xq, float *xd,
                                      float *xs) {
    SA_PICK(sa_quantize_q8_f32, isa)(x, k, m, xq, xd, xs);
}
static inline void sa_linear_q8_rows_f32(int isa, int kind, const int8_t *xq, const float *xd, const float *xs,
                                         int64_t k, int64_t m, const uint8_t *w, int64_t ldw, int64_t n,
                                         const float *b, int64_t j0, int64_t j1, float *y, int64_t ldy) {
    SA_PICK_Q8(sa_linear_q8_rows_f32, isa)(kind, xq, xd, xs, k, m, w, ldw, n, b, j0, j1, y, ldy);
}
