#include "isa.h"
#define SA_TEMPLATE "tmpl_layer_norm.h"
#include "instances.h"

/* The kernels, for SA_DISPATCHERS (isa.h): X(name, pick, (params), (args)) */
#define SA_LAYER_NORM_KERNELS(X, T)                                                                 \
    X(layer_norm_row, SA_PICK, (const T *x, const T *g, const T *b, T eps, T *out, int64_t n),      \
      (x, g, b, eps, out, n))                                                                       \
    X(add_row, SA_PICK, (const T *x, const T *r, T *s, int64_t n), (x, r, s, n))                   \
    X(layer_norm_back_row, SA_PICK, (const T *dy, const T *x, const T *g, T eps, T *dx, T *dg, T *db,  \
      int64_t n), (dy, x, g, eps, dx, dg, db, n))
SA_DISPATCHERS(SA_LAYER_NORM_KERNELS)
