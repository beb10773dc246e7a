#include "isa.h"
#define SA_TEMPLATE "tmpl_feed_forward.h"
#include "instances.h"

#define SA_DISPATCH(T, name)                                                                  \
    static inline void sa_bias_gelu_row_##name(int isa, T *h, const T *b, int64_t n) {         \
        SA_PICK(sa_bias_gelu_row_##name, isa)(h, b, n); }
SA_DISPATCH(float, f32)
SA_DISPATCH(double, f64)
#undef SA_DISPATCH
