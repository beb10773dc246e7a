#include "isa.h"
#define SA_TEMPLATE "tmpl_layer_norm.h"
#include "instances.h"

#define SA_DISPATCH(T, name)                                                                  \
    static inline void sa_layer_norm_row_##name(int isa, const T *x, const T *g, const T *b,   \
                                                T eps, T *out, int64_t n) {                   \
        SA_PICK(sa_layer_norm_row_##name, isa)(x, g, b, eps, out, n); }
SA_DISPATCH(float, f32)
SA_DISPATCH(double, f64)
#undef SA_DISPATCH

#define SA_DISPATCH(T, name)                                                                  \
    static inline void sa_add_row_##name(int isa, const T *x, const T *r, T *s, int64_t n) {    \
        SA_PICK(sa_add_row_##name, isa)(x, r, s, n); }
SA_DISPATCH(float, f32)
SA_DISPATCH(double, f64)
#undef SA_DISPATCH
