#include "isa.h"
#define SA_TEMPLATE "tmpl_layer_norm.h"
#include "instances.h"

#define SA_DISPATCH(T, name)                                                                  \
    static inline void sa_layer_norm_row_##name(int isa, const T *x, const T *g, const T *b,   \
                                                T eps, T *out, int64_t n, int64_t pf) {       \
        (isa ? sa_layer_norm_row_##name##_avx2 : sa_layer_norm_row_##name##_generic)(x, g, b, eps, out, n, pf); }
SA_DISPATCH(float, f32)
SA_DISPATCH(double, f64)
#undef SA_DISPATCH

#define SA_DISPATCH(T, name)                                                                  \
    static inline void sa_add_row_##name(int isa, const T *x, const T *r, T *s, int64_t n) {    \
        (isa ? sa_add_row_##name##_avx2 : sa_add_row_##name##_generic)(x, r, s, n); }
SA_DISPATCH(float, f32)
SA_DISPATCH(double, f64)
#undef SA_DISPATCH
