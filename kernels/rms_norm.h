#include "isa.h"
#define SA_TEMPLATE "tmpl_rms_norm.h"
#include "instances.h"

#define SA_DISPATCH(T, name)                                                                  \
    static inline void sa_rms_norm_row_##name(int isa, const T *x, const T *g, T eps, T *out,  \
                                              int64_t n) {                                    \
        SA_PICK(sa_rms_norm_row_##name, isa)(x, g, eps, out, n); }
SA_DISPATCH(float, f32)
SA_DISPATCH(double, f64)
#undef SA_DISPATCH

#define SA_DISPATCH(T, name)                                                                  \
    static inline void sa_add_rms_norm_row_##name(int isa, const T *x, const T *r, const T *g,  \
                                                  T eps, T *s, T *out, int64_t n) {           \
        SA_PICK(sa_add_rms_norm_row_##name, isa)(x, r, g, eps, s, out, n); }
SA_DISPATCH(float, f32)
SA_DISPATCH(double, f64)
#undef SA_DISPATCH
