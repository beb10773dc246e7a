#include "isa.h"
#define SA_TEMPLATE "tmpl_rope.h"
#include "instances.h"

/* The kernels, for SA_DISPATCHERS (isa.h): X(name, pick, (params), (args)) */
#define SA_ROPE_KERNELS(X, T) \
    X(rope_row, SA_PICK, (const T *x, const T *c, const T *s, T *out, int64_t h), (x, c, s, out, h))
SA_DISPATCHERS(SA_ROPE_KERNELS)
