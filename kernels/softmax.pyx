"""Row softmax: out[i, :] = exp(x[i, :] - max x[i, :]) / sum_j exp(x[i, j] - max x[i, :])."""
from cython cimport floating
from cython.parallel cimport prange
from libc.stdint cimport int64_t

include "common.pxi"

cdef extern from "softmax.h" nogil:
    void sa_softmax_row_f32(int isa, const float *x, float *out, int64_t n)
    void sa_softmax_row_f64(int isa, const double *x, double *out, int64_t n)
    void sa_softmax_back_row_f32(int isa, const float *dy, const float *y, float *dx, int64_t n)
    void sa_softmax_back_row_f64(int isa, const double *dy, const double *y, double *dx, int64_t n)


cdef inline void _softmax_row(const floating *x, floating *out, int64_t n) noexcept nogil:
    if floating is float:
        sa_softmax_row_f32(ISA, x, out, n)
    else:
        sa_softmax_row_f64(ISA, x, out, n)


def softmax(const floating[:, ::1] x, floating[:, ::1] out, int num_threads):
    """x, out: (rows, n) C-contiguous, same dtype; each thread takes a block of whole rows."""
    cdef Py_ssize_t i, n = x.shape[1]
    with nogil:
        for i in prange(x.shape[0], num_threads=num_threads, schedule="static"):
            _softmax_row(&x[i, 0], &out[i, 0], n)


cdef inline void _softmax_back_row(const floating *dy, const floating *y, floating *dx, int64_t n) noexcept nogil:
    if floating is float:
        sa_softmax_back_row_f32(ISA, dy, y, dx, n)
    else:
        sa_softmax_back_row_f64(ISA, dy, y, dx, n)


def softmax_backward(const floating[:, ::1] dy, const floating[:, ::1] y, floating[:, ::1] dx, int num_threads):
    """dx = y (dy - rowsum(dy y)) over (rows, n) C-contiguous rows (dx may be dy)."""
    cdef Py_ssize_t i, n = y.shape[1]
    with nogil:
        for i in prange(y.shape[0], num_threads=num_threads, schedule="static"):
            _softmax_back_row(&dy[i, 0], &y[i, 0], &dx[i, 0], n)
