#include "isa.h"
#define SA_TEMPLATE "tmpl_rms_norm.h"
#include "instances.h"

/* The kernels, for SA_DISPATCHERS (isa.h): X(name, pick, (params), (args)) */
#define SA_RMS_NORM_KERNELS(X, T)                                                                   \
    X(rms_norm_row, SA_PICK, (const T *x, const T *g, T eps, T *out, int64_t n), (x, g, eps, out, n)) \
    X(add_rms_norm_row, SA_PICK, (const T *x, const T *r, const T *g, T eps, T *s, T *out, int64_t n), \
      (x, r, g, eps, s, out, n))                                                                    \
    X(rms_norm_back_row, SA_PICK, (const T *dy, const T *x, const T *g, T eps, T *dx, T *dg, int64_t n), \
      (dy, x, g, eps, dx, dg, n))
SA_DISPATCHERS(SA_RMS_NORM_KERNELS)
