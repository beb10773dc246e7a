#include "isa.h"
#define SA_TEMPLATE "tmpl_softmax.h"
#include "instances.h"

/* The kernels, for SA_DISPATCHERS (isa.h): X(name, pick, (params), (args)) */
#define SA_SOFTMAX_KERNELS(X, T) \
    X(softmax_row, SA_PICK, (const T *x, T *out, int64_t n), (x, out, n)) \
    X(softmax_back_row, SA_PICK, (const T *dy, const T *y, T *dx, int64_t n), (dy, y, dx, n))
SA_DISPATCHERS(SA_SOFTMAX_KERNELS)
