"""Rotary embedding over rows given as offsets: the pairs (x_i, x_(i + d/2)) of each row turned by
its position's angles, read from cos/sin tables."""
from cython cimport floating
from cython.parallel cimport prange
from libc.stdint cimport int64_t

include "common.pxi"

cdef extern from "rope.h" nogil:
    void sa_rope_row_f32(int isa, const float *x, const float *c, const float *s, float *out, int64_t h)
    void sa_rope_row_f64(int isa, const double *x, const double *c, const double *s, double *out, int64_t h)


cdef inline void _rope_row(const floating *x, const floating *c, const floating *s, floating *out,
                           int64_t h) noexcept nogil:
    if floating is float:
        sa_rope_row_f32(ISA, x, c, s, out, h)
    else:
        sa_rope_row_f64(ISA, x, c, s, out, h)


def rope(const floating[::1] x, const int64_t[::1] xo, floating[::1] out, const int64_t[::1] oo,
         const floating[:, ::1] cos, const floating[:, ::1] sin, const int64_t[::1] positions, int num_threads):
    """Row r of x (x[xo[r]:][:d], d = 2 * h, h = cos.shape[1]) into out[oo[r]:][:d] (out may be x:
    in place), at position positions[r % seq], seq = len(positions): the row of cos and sin it reads.
    Each thread takes a block of whole rows."""
    cdef Py_ssize_t r, seq = positions.shape[0], h = cos.shape[1]
    cdef int64_t p
    with nogil:
        for r in prange(xo.shape[0], num_threads=num_threads, schedule="static"):
            p = positions[r % seq]
            _rope_row(&x[xo[r]], &cos[p, 0], &sin[p, 0], &out[oo[r]], h)
