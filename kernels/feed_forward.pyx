"""The feed-forward's elementwise steps, fused: h = max(h + b, 0) or h = gelu(h + b), in place, one
pass over h."""
from cython cimport floating
from cython.parallel cimport prange
from libc.stdint cimport int64_t

include "common.pxi"

cdef extern from "feed_forward.h" nogil:
    void sa_bias_gelu_row_f32(int isa, float *h, const float *b, int64_t n)
    void sa_bias_gelu_row_f64(int isa, double *h, const double *b, int64_t n)


cdef inline void _bias_gelu_row(floating *h, const floating *b, int64_t n) noexcept nogil:
    if floating is float:
        sa_bias_gelu_row_f32(ISA, h, b, n)
    else:
        sa_bias_gelu_row_f64(ISA, h, b, n)


def bias_relu(floating[:, ::1] h, const floating[::1] b, int num_threads):
    """h: (rows, n) C-contiguous, b: (n,). NaN stays NaN, as with np.maximum."""
    cdef Py_ssize_t i, j, n = h.shape[1]
    cdef floating v
    with nogil:
        for i in prange(h.shape[0], num_threads=num_threads, schedule="static"):
            for j in range(n):
                v = h[i, j] + b[j]
                h[i, j] = 0 if v < 0 else v


def bias_gelu(floating[:, ::1] h, const floating[::1] b, int num_threads):
    """h: (rows, n) C-contiguous, b: (n,); the exact (erf) GELU."""
    cdef Py_ssize_t i, n = h.shape[1]
    with nogil:
        for i in prange(h.shape[0], num_threads=num_threads, schedule="static"):
            _bias_gelu_row(&h[i, 0], &b[0], n)
