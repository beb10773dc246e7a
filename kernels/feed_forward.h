#include "isa.h"
#define SA_TEMPLATE "tmpl_feed_forward.h"
#include "instances.h"

#define SA_DISPATCH(T, name)                                                                  \
    static inline void sa_bias_gelu_row_##name(int isa, T *h, const T *b, int64_t n) {         \
        (isa ? sa_bias_gelu_row_##name##_avx2 : sa_bias_gelu_row_##name##_generic)(h, b, n); }
SA_DISPATCH(float, f32)
SA_DISPATCH(double, f64)
#undef SA_DISPATCH
