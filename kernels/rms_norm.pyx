"""RMS norm over rows: out[i] = g * x[i] / sqrt(mean(x[i]^2) + eps)."""
from cython cimport floating
from cython.parallel cimport prange
from libc.stdint cimport int64_t

include "common.pxi"

cdef extern from "rms_norm.h" nogil:
    void sa_rms_norm_row_f32(int isa, const float *x, const float *g, float eps, float *out, int64_t n)
    void sa_rms_norm_row_f64(int isa, const double *x, const double *g, double eps, double *out, int64_t n)
    void sa_add_rms_norm_row_f32(int isa, const float *x, const float *r, const float *g, float eps, float *s,
                                 float *out, int64_t n)
    void sa_add_rms_norm_row_f64(int isa, const double *x, const double *r, const double *g, double eps,
                                 double *s, double *out, int64_t n)
    void sa_rms_norm_back_row_f32(int isa, const float *dy, const float *x, const float *g, float eps, float *dx,
                                  float *dg, int64_t n)
    void sa_rms_norm_back_row_f64(int isa, const double *dy, const double *x, const double *g, double eps,
                                  double *dx, double *dg, int64_t n)


cdef inline void _rms_norm_row(const floating *x, const floating *g, floating eps, floating *out,
                               int64_t n) noexcept nogil:
    if floating is float:
        sa_rms_norm_row_f32(ISA, x, g, eps, out, n)
    else:
        sa_rms_norm_row_f64(ISA, x, g, eps, out, n)


cdef inline void _add_rms_norm_row(const floating *x, const floating *r, const floating *g, floating eps,
                                   floating *s, floating *out, int64_t n) noexcept nogil:
    if floating is float:
        sa_add_rms_norm_row_f32(ISA, x, r, g, eps, s, out, n)
    else:
        sa_add_rms_norm_row_f64(ISA, x, r, g, eps, s, out, n)


def rms_norm(const floating[:, ::1] x, const floating[::1] g, double eps, floating[:, ::1] out,
             int num_threads):
    """x, out: (rows, n) C-contiguous; g: (n,); each thread takes a block of whole rows."""
    cdef Py_ssize_t i, n = x.shape[1]
    cdef floating e = <floating>eps
    with nogil:
        for i in prange(x.shape[0], num_threads=num_threads, schedule="static"):
            _rms_norm_row(&x[i, 0], &g[0], e, &out[i, 0], n)


def add_rms_norm(const floating[:, ::1] x, const floating[:, ::1] r, const floating[::1] g, double eps,
                 floating[:, ::1] s, floating[:, ::1] out, int num_threads):
    """s = x + r (the residual add) and out = rms_norm(s) in one pass over the rows."""
    cdef Py_ssize_t i, n = x.shape[1]
    cdef floating e = <floating>eps
    with nogil:
        for i in prange(x.shape[0], num_threads=num_threads, schedule="static"):
            _add_rms_norm_row(&x[i, 0], &r[i, 0], &g[0], e, &s[i, 0], &out[i, 0], n)


cdef inline void _rms_norm_back_row(const floating *dy, const floating *x, const floating *g, floating eps,
                                    floating *dx, floating *dg, int64_t n) noexcept nogil:
    if floating is float:
        sa_rms_norm_back_row_f32(ISA, dy, x, g, eps, dx, dg, n)
    else:
        sa_rms_norm_back_row_f64(ISA, dy, x, g, eps, dx, dg, n)


def rms_norm_backward(const floating[:, ::1] dy, const floating[:, ::1] x, const floating[::1] g, double eps,
                      floating[:, ::1] dx, floating[:, ::1] dg, int block, int num_threads):
    """dx of every row; dg[k] (zeroed): the sum of dy x r over rows k block .. (k + 1) block, a fixed
    split, so the caller's sum over k does not depend on the threads."""
    cdef Py_ssize_t k, i, n = x.shape[1], rows = x.shape[0]
    cdef floating e = <floating>eps
    if dg.shape[0] * block < rows or dg.shape[1] != n:
        raise ValueError("rms_norm_backward: dg must hold a row for every block of rows")
    with nogil:
        for k in prange(dg.shape[0], num_threads=num_threads, schedule="static"):
            for i in range(k * block, min((k + 1) * block, rows)):
                _rms_norm_back_row(&dy[i, 0], &x[i, 0], &g[0], e, &dx[i, 0], &dg[k, 0], n)
