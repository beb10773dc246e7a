#include "isa.h"
#define SA_TEMPLATE "tmpl_feed_forward.h"
#include "instances.h"

/* The kernels, for SA_DISPATCHERS (isa.h): X(name, pick, (params), (args)) */
#define SA_FEED_FORWARD_KERNELS(X, T) \
    X(bias_gelu_row, SA_PICK, (T *h, const T *b, int64_t n), (h, b, n)) \
    X(gelu_back_row, SA_PICK, (const T *dh, const T *z, T *dz, int64_t n), (dh, z, dz, n))
SA_DISPATCHERS(SA_FEED_FORWARD_KERNELS)
