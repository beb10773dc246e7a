"""Layer norm over rows: out[i] = g * (x[i] - mean x[i]) / sqrt(var x[i] + eps) + b."""
from cython cimport floating
from cython.parallel cimport prange
from libc.stdint cimport int64_t

include "common.pxi"

cdef extern from "layer_norm.h" nogil:
    void sa_layer_norm_row_f32(int isa, const float *x, const float *g, const float *b, float eps, float *out, int64_t n)
    void sa_layer_norm_row_f64(int isa, const double *x, const double *g, const double *b, double eps, double *out, int64_t n)
    void sa_add_row_f32(int isa, const float *x, const float *r, float *s, int64_t n)
    void sa_add_row_f64(int isa, const double *x, const double *r, double *s, int64_t n)
    void sa_layer_norm_back_row_f32(int isa, const float *dy, const float *x, const float *g, float eps,
                                    float *dx, float *dg, float *db, int64_t n)
    void sa_layer_norm_back_row_f64(int isa, const double *dy, const double *x, const double *g, double eps,
                                    double *dx, double *dg, double *db, int64_t n)


cdef inline void _layer_norm_row(const floating *x, const floating *g, const floating *b, floating eps,
                                 floating *out, int64_t n) noexcept nogil:
    if floating is float:
        sa_layer_norm_row_f32(ISA, x, g, b, eps, out, n)
    else:
        sa_layer_norm_row_f64(ISA, x, g, b, eps, out, n)


cdef inline void _add_row(const floating *x, const floating *r, floating *s, int64_t n) noexcept nogil:
    if floating is float:
        sa_add_row_f32(ISA, x, r, s, n)
    else:
        sa_add_row_f64(ISA, x, r, s, n)


def layer_norm(const floating[:, ::1] x, const floating[::1] g, const floating[::1] b, double eps,
               floating[:, ::1] out, int num_threads):
    """x, out: (rows, n) C-contiguous; g, b: (n,); each thread takes a block of whole rows."""
    cdef Py_ssize_t i, n = x.shape[1]
    cdef floating e = <floating>eps
    with nogil:
        for i in prange(x.shape[0], num_threads=num_threads, schedule="static"):
            _layer_norm_row(&x[i, 0], &g[0], &b[0], e, &out[i, 0], n)


def add_layer_norm(const floating[:, ::1] x, const floating[:, ::1] r, const floating[::1] g,
                   const floating[::1] b, double eps, floating[:, ::1] s, floating[:, ::1] out, int num_threads):
    """s = x + r (the residual add) and out = layer_norm(s) in one pass over the rows."""
    cdef Py_ssize_t i, n = x.shape[1]
    cdef floating e = <floating>eps
    with nogil:
        for i in prange(x.shape[0], num_threads=num_threads, schedule="static"):
            _add_row(&x[i, 0], &r[i, 0], &s[i, 0], n)
            _layer_norm_row(&s[i, 0], &g[0], &b[0], e, &out[i, 0], n)


cdef inline void _layer_norm_back_row(const floating *dy, const floating *x, const floating *g, floating eps,
                                      floating *dx, floating *dg, floating *db, int64_t n) noexcept nogil:
    if floating is float:
        sa_layer_norm_back_row_f32(ISA, dy, x, g, eps, dx, dg, db, n)
    else:
        sa_layer_norm_back_row_f64(ISA, dy, x, g, eps, dx, dg, db, n)


def layer_norm_backward(const floating[:, ::1] dy, const floating[:, ::1] x, const floating[::1] g, double eps,
                        floating[:, ::1] dx, floating[:, ::1] parts, int block, int num_threads):
    """dx of every row; parts[k] (zeroed) = dg then db (2 n values) summed over rows k block .. (k + 1)
    block, a fixed split, so the caller's sum over k does not depend on the threads."""
    cdef Py_ssize_t k, i, n = x.shape[1], rows = x.shape[0]
    cdef floating e = <floating>eps
    if parts.shape[0] * block < rows or parts.shape[1] != 2 * n:
        raise ValueError("layer_norm_backward: parts must hold (dg, db) for every block of rows")
    with nogil:
        for k in prange(parts.shape[0], num_threads=num_threads, schedule="static"):
            for i in range(k * block, min((k + 1) * block, rows)):
                _layer_norm_back_row(&dy[i, 0], &x[i, 0], &g[0], e, &dx[i, 0], &parts[k, 0], &parts[k, n], n)
