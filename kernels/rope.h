#include "isa.h"
#define SA_TEMPLATE "tmpl_rope.h"
#include "instances.h"

#define SA_DISPATCH(T, name)                                                                  \
    static inline void sa_rope_row_##name(int isa, const T *x, const T *c, const T *s, T *out,  \
                                          int64_t h) {                                        \
        SA_PICK(sa_rope_row_##name, isa)(x, c, s, out, h); }
SA_DISPATCH(float, f32)
SA_DISPATCH(double, f64)
#undef SA_DISPATCH
