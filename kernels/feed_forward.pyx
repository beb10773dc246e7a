"""The feed-forward's elementwise steps, fused: h = max(h + b, 0) or h = gelu(h + b), in place, one
pass over h."""
from cython cimport floating
from cython.parallel cimport prange
from libc.stdint cimport int64_t

include "common.pxi"

cdef extern from "feed_forward.h" nogil:
    void sa_bias_gelu_row_f32(int isa, float *h, const float *b, int64_t n)
    void sa_bias_gelu_row_f64(int isa, double *h, const double *b, int64_t n)
    void sa_gelu_back_row_f32(int isa, const float *dh, const float *z, float *dz, int64_t n)
    void sa_gelu_back_row_f64(int isa, const double *dh, const double *z, double *dz, int64_t n)


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


cdef inline void _gelu_back_row(const floating *dh, const floating *z, floating *dz, int64_t n) noexcept nogil:
    if floating is float:
        sa_gelu_back_row_f32(ISA, dh, z, dz, n)
    else:
        sa_gelu_back_row_f64(ISA, dh, z, dz, n)


def gelu_backward(const floating[:, ::1] dh, const floating[:, ::1] z, floating[:, ::1] dz, int num_threads):
    """dz = dh gelu'(z) (the exact GELU's slope) over (rows, n) C-contiguous rows (dz may be dh)."""
    cdef Py_ssize_t i, n = z.shape[1]
    if dh.shape[0] != z.shape[0] or dz.shape[0] != z.shape[0] or dh.shape[1] != n or dz.shape[1] != n:
        raise ValueError("gelu_backward: dh, z and dz must have one shape")
    with nogil:
        for i in prange(z.shape[0], num_threads=num_threads, schedule="static"):
            _gelu_back_row(&dh[i, 0], &z[i, 0], &dz[i, 0], n)
