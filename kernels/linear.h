#include "isa.h"
#define SA_TEMPLATE "tmpl_linear.h"
#include "instances.h"

#define SA_DISPATCH(T, name)                                                                           \
    static inline void sa_linear_rows_##name(int isa, const T *x, int64_t ldx, int64_t m, const T *w,  \
                                             int64_t n, int64_t i0, int64_t i1, T *y) {                \
        SA_PICK(sa_linear_rows_##name, isa)(x, ldx, m, w, n, i0, i1, y); } \
    static inline void sa_linear_dots_##name(int isa, const T *x, int64_t ldx, int64_t m, const T *w,  \
                                             int64_t k, int64_t j0, int64_t j1, T *y, int64_t ldy) {   \
        SA_PICK(sa_linear_dots_##name, isa)(x, ldx, m, w, k, j0, j1, y, ldy); }
SA_DISPATCH(float, f32)
SA_DISPATCH(double, f64)
#undef SA_DISPATCH
