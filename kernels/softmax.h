#include "isa.h"
#define SA_TEMPLATE "tmpl_softmax.h"
#include "instances.h"

#define SA_DISPATCH(T, name)                                                          \
    static inline void sa_softmax_row_##name(int isa, const T *x, T *out, int64_t n) { \
        SA_PICK(sa_softmax_row_##name, isa)(x, out, n); }
SA_DISPATCH(float, f32)
SA_DISPATCH(double, f64)
#undef SA_DISPATCH
