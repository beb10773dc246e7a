#include "isa.h"
#define SA_TEMPLATE "tmpl_silu_mul.h"
#include "instances.h"

#define SA_DISPATCH(T, name)                                                                  \
    static inline void sa_silu_mul_row_##name(int isa, const T *g, const T *u, T *out, int64_t n) { \
        SA_PICK(sa_silu_mul_row_##name, isa)(g, u, out, n); }
SA_DISPATCH(float, f32)
SA_DISPATCH(double, f64)
#undef SA_DISPATCH
