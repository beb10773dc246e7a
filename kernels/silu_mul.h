#include "isa.h"
#define SA_TEMPLATE "tmpl_silu_mul.h"
#include "instances.h"

/* The kernels, for SA_DISPATCHERS (isa.h): X(name, pick, (params), (args)) */
#define SA_SILU_MUL_KERNELS(X, T) \
    X(silu_mul_row, SA_PICK, (const T *g, const T *u, T *out, int64_t n), (g, u, out, n)) \
    X(gelu_tanh_mul_row, SA_PICK, (const T *g, const T *u, T *out, int64_t n), (g, u, out, n))
SA_DISPATCHERS(SA_SILU_MUL_KERNELS)
