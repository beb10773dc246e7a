"""The gates of a gated feed-forward over rows given as offsets: out = silu(g) u = g u / (1 + exp(-g))
(SwiGLU) and out = gelu_tanh(g) u (GeGLU, GELU's tanh form)."""
from cython cimport floating
from cython.parallel cimport prange
from libc.stdint cimport int64_t

include "common.pxi"

cdef extern from "silu_mul.h" nogil:
    void sa_silu_mul_row_f32(int isa, const float *g, const float *u, float *out, int64_t n)
    void sa_silu_mul_row_f64(int isa, const double *g, const double *u, double *out, int64_t n)
    void sa_gelu_tanh_mul_row_f32(int isa, const float *g, const float *u, float *out, int64_t n)
    void sa_gelu_tanh_mul_row_f64(int isa, const double *g, const double *u, double *out, int64_t n)


cdef inline void _gate_row(const floating *g, const floating *u, floating *out, int64_t n,
                           bint gelu) noexcept nogil:
    if floating is float:
        if gelu:
            sa_gelu_tanh_mul_row_f32(ISA, g, u, out, n)
        else:
            sa_silu_mul_row_f32(ISA, g, u, out, n)
    else:
        if gelu:
            sa_gelu_tanh_mul_row_f64(ISA, g, u, out, n)
        else:
            sa_silu_mul_row_f64(ISA, g, u, out, n)


def silu_mul(const floating[::1] g, const int64_t[::1] go, const floating[::1] u, const int64_t[::1] uo,
             floating[::1] out, const int64_t[::1] oo, Py_ssize_t n, int num_threads):
    """Row r: out[oo[r]:][:n] = silu(g[go[r]:][:n]) u[uo[r]:][:n] (out may be g or u: in place). Each
    thread takes a block of whole rows."""
    cdef Py_ssize_t r
    with nogil:
        for r in prange(go.shape[0], num_threads=num_threads, schedule="static"):
            _gate_row(&g[go[r]], &u[uo[r]], &out[oo[r]], n, False)


def gelu_tanh_mul(const floating[::1] g, const int64_t[::1] go, const floating[::1] u, const int64_t[::1] uo,
                  floating[::1] out, const int64_t[::1] oo, Py_ssize_t n, int num_threads):
    """Row r: out[oo[r]:][:n] = gelu_tanh(g[go[r]:][:n]) u[uo[r]:][:n], as silu_mul."""
    cdef Py_ssize_t r
    with nogil:
        for r in prange(go.shape[0], num_threads=num_threads, schedule="static"):
            _gate_row(&g[go[r]], &u[uo[r]], &out[oo[r]], n, True)
