#include "isa.h"
#define SA_TEMPLATE "tmpl_linear.h"
#include "instances.h"

/* The kernels, for SA_DISPATCHERS (isa.h): X(name, pick, (params), (args)) */
#define SA_LINEAR_KERNELS(X, T)                                                                     \
    X(linear_rows, SA_PICK, (const T *x, int64_t ldx, int64_t m, const T *w, int64_t n, int64_t i0,  \
                             int64_t i1, T *y),                                                     \
      (x, ldx, m, w, n, i0, i1, y))                                                                 \
    X(linear_dots, SA_PICK, (const T *x, int64_t ldx, int64_t m, const T *w, int64_t k, int64_t j0,  \
                             int64_t j1, T *y, int64_t ldy),                                        \
      (x, ldx, m, w, k, j0, j1, y, ldy))
SA_DISPATCHERS(SA_LINEAR_KERNELS)
