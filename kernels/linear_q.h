#include "isa.h"
#include "quant_blocks.h"
#include "quant_ext.h"
#include "rows16.h"

#define SA_TEMPLATE "tmpl_linear_q.h"
#define SA_VNNI_COPY
#include "instances.h"

/* The kernels, float32 only (SA_DISPATCHERS_F32, isa.h): X(name, pick, (params), (args)); the int8
 * products take SA_PICK_Q8, which prefers the avx512vnni copy where the CPU has VNNI */
#define SA_LINEAR_Q_KERNELS(X, T)                                                                   \
    X(linear_q_xsum, SA_PICK, (const T *x, int64_t k, int64_t m, T *xs), (x, k, m, xs))             \
    X(linear_q_rows, SA_PICK, (int kind, const T *x, int64_t k, int64_t m, const uint8_t *w,        \
                               int64_t ldw, int64_t n, const T *xs, const T *b, int64_t j0,         \
                               int64_t j1, T *y, int64_t ldy),                                      \
      (kind, x, k, m, w, ldw, n, xs, b, j0, j1, y, ldy))                                            \
    X(linear_qx_rows, SA_PICK, (int kind, const T *x, int64_t k, int64_t m, const uint8_t *w,       \
                                int64_t ldw, const T *b, int64_t j0, int64_t j1, T *y, int64_t ldy), \
      (kind, x, k, m, w, ldw, b, j0, j1, y, ldy))                                                   \
    X(linear_q8x_rows, SA_PICK_Q8, (int kind, const int8_t *xq, const T *xd, const T *xs, int64_t k,   \
                                    int64_t m, const uint8_t *w, int64_t ldw, const T *b, int64_t j0,  \
                                    int64_t j1, T *y, int64_t ldy),                                    \
      (kind, xq, xd, xs, k, m, w, ldw, b, j0, j1, y, ldy))                                          \
    X(dequantize_rows, SA_PICK, (int kind, const uint8_t *w, int64_t ldw, int64_t k, int64_t j0,    \
                                 int64_t rows, T *out),                                             \
      (kind, w, ldw, k, j0, rows, out))                                                             \
    X(panel_dots, SA_PICK, (const T *x, int64_t k, int64_t m, const T *p, int64_t rows, T *y,        \
                            int64_t ldy),                                                           \
      (x, k, m, p, rows, y, ldy))                                                                   \
    X(quantize_q8, SA_PICK, (const T *x, int64_t k, int64_t m, int8_t *xq, T *xd, T *xs),           \
      (x, k, m, xq, xd, xs))                                                                        \
    X(quantize_q8k, SA_PICK, (const T *x, int64_t k, int64_t m, int8_t *xq, T *xd, int16_t *xb),    \
      (x, k, m, xq, xd, xb))                                                                        \
    X(linear_q8k_rows, SA_PICK_Q8, (int kind, const int8_t *xq, const T *xd, const int16_t *xb,       \
                                    int64_t k, int64_t m, const uint8_t *w, int64_t ldw, const T *b,   \
                                    int64_t j0, int64_t j1, T *y, int64_t ldy),                        \
      (kind, xq, xd, xb, k, m, w, ldw, b, j0, j1, y, ldy))                                          \
    X(linear_q8_rows, SA_PICK_Q8, (int kind, const int8_t *xq, const T *xd, const T *xs, int64_t k, \
                                   int64_t m, const uint8_t *w, int64_t ldw, int64_t n, const T *b, \
                                   int64_t j0, int64_t j1, T *y, int64_t ldy),                      \
      (kind, xq, xd, xs, k, m, w, ldw, n, b, j0, j1, y, ldy))
SA_DISPATCHERS_F32(SA_LINEAR_Q_KERNELS)

/* The integer GEMM (tmpl_gemm_q8.h): only a copy with AVX-512 VNNI has it, the avx512vnni copy of a
 * portable build or the avx512 copy of a build for a VNNI CPU. sa_gemm_q8_usable says whether this
 * CPU runs it with the copy chosen (isa); the wrappers are called only where it does. */
#if SA_X86 && defined(SA_HAS_VNNI_COPY)
#define SA_GQ8(fn) fn##_f32_avx512vnni
#define SA_GQ8_BUILT 1
#elif SA_X86 && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define SA_GQ8(fn) fn##_f32_avx512
#define SA_GQ8_BUILT 1
#else
#define SA_GQ8_BUILT 0
#endif
static inline int sa_gemm_q8_usable(int isa) {
#if SA_GQ8_BUILT
    return isa == SA_ISA_AVX512 && sa_cpu_has_vnni();
#else
    (void)isa;
    return 0;
#endif
}
static inline void sa_gq8_pack_a_f32(const float *x, int64_t m, int64_t k, int block, uint8_t *a, float *d,
                                     float *xs) {
#if SA_GQ8_BUILT
    SA_GQ8(sa_gq8_pack_a)(x, m, k, block, a, d, xs);
#else
    (void)x, (void)m, (void)k, (void)block, (void)a, (void)d, (void)xs;
#endif
}
static inline int64_t sa_gq8_scratch_f32(int64_t k) {
#if SA_GQ8_BUILT
    return SA_GQ8(sa_gq8_scratch)(k);
#else
    (void)k;
    return 0;
#endif
}
static inline void sa_gq8_cols_f32(int kind, const uint8_t *a, const float *d, const float *xs, int64_t m,
                                   int64_t k, const uint8_t *w, int64_t ldw, int64_t j0, int64_t j1, float *y,
                                   int64_t ldy, void *scratch) {
#if SA_GQ8_BUILT
    SA_GQ8(sa_gq8_cols)(kind, a, d, xs, m, k, w, ldw, j0, j1, y, ldy, scratch);
#else
    (void)kind, (void)a, (void)d, (void)xs, (void)m, (void)k, (void)w, (void)ldw, (void)j0, (void)j1, (void)y;
    (void)ldy, (void)scratch;
#endif
}
