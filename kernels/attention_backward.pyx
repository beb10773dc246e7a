"""attention's backward over the forward's plan (silkattn/_plan.py): dQ, dK, dV from dout, the
forward's lse and D = rowsum(dout * out), flash style (kernels/tmpl_attention_backward.h), one K/V
unit a task, the tasks shared by the threads."""
from cython cimport floating
from cython.parallel cimport parallel, prange
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free

cimport numpy as cnp
import numpy as np

cnp.import_array()

include "common.pxi"

include "attention_plan.pxi"

cdef extern from "attention_backward.h" nogil:
    ctypedef struct sa_attn_back:
        const void *dout
        const void *d
        const void *lse
        void *fix
        void *dq
        void *dk
        void *dv
        const int64_t *items
        const int64_t *first
    size_t sa_attn_back_scratch(int64_t dk, int64_t dv, int64_t dkp, int64_t dvp, size_t tsize)
    void sa_attn_back_unit_f32(int isa, const sa_attn_plan *a, const sa_attn_back *b, int64_t u, void *scratch)
    void sa_attn_back_unit_f64(int isa, const sa_attn_plan *a, const sa_attn_back *b, int64_t u, void *scratch)


cdef inline void _unit(const sa_attn_plan *a, const sa_attn_back *b, int64_t u, floating *scratch) noexcept nogil:
    if floating is float:
        sa_attn_back_unit_f32(ISA, a, b, u, scratch)
    else:
        sa_attn_back_unit_f64(ISA, a, b, u, scratch)


def attention_backward(plan, dout, D, lse, fix, items, first, dq, dk, dv, int num_threads):
    """The kernel contract of silkattn._api: the plan's units as tasks taken by the threads; items
    (int64): the plan's items sorted by unit, unit u's at items[first[u] : first[u + 1]]; fix: room
    for 2 values a row (attention_backward.h); dq (zeros), dk, dv: flat, in the layouts of the plan's
    q, k and v."""
    arrays = (dout, D, lse, items, first, dq, dk, dv, fix)
    if plan.q.dtype == np.float32:
        _backward(plan, arrays, <float *>NULL, num_threads)
    else:
        _backward(plan, arrays, <double *>NULL, num_threads)


cdef _backward(plan, arrays, floating *dtype, int num_threads):
    cdef const floating[::1] q = plan.q, k = plan.k, v = plan.v, bias = plan.bias
    cdef const floating[::1] dout = arrays[0], D = arrays[1], lse = arrays[2]
    cdef const int64_t[::1] items = arrays[3], first = arrays[4]
    cdef floating[::1] dq = arrays[5], dk = arrays[6], dv = arrays[7], fix = arrays[8]
    cdef const uint8_t[::1] mask = plan.mask
    cdef sa_attn_plan a
    cdef sa_attn_back b
    # the gradients cover their operands, dout and lse the output's rows (the units' and items'
    # offsets were cut from the operands by silkattn._api)
    if dq.shape[0] != q.shape[0] or dk.shape[0] != k.shape[0] or dv.shape[0] != v.shape[0] \
            or lse.shape[0] != D.shape[0] or dout.shape[0] != D.shape[0] * plan.dv or fix.shape[0] != 2 * D.shape[0] \
            or first.shape[0] != len(plan.units) + 1 or items.shape[0] != len(plan.items):
        raise ValueError("attention_backward: the gradients, dout, D and lse do not fit the plan")
    _fill_plan(&a, plan)
    a.q, a.k, a.v, a.bias, a.mask, a.out, a.bk = &q[0], &k[0], &v[0], &bias[0], &mask[0], NULL, 0
    b.dout, b.d, b.lse, b.fix, b.dq, b.dk, b.dv = &dout[0], &D[0], &lse[0], &fix[0], &dq[0], &dk[0], &dv[0]
    b.items, b.first = &items[0], &first[0]
    cdef int64_t vl = 16 if floating is float else 8  # the widest copy's register block: 2 vectors of 64 bytes
    cdef int64_t dkp = (a.dk + 2 * vl - 1) // (2 * vl) * 2 * vl, dvp = (a.dv + 2 * vl - 1) // (2 * vl) * 2 * vl
    cdef size_t nbytes = sa_attn_back_scratch(a.dk, a.dv, dkp, dvp, sizeof(floating))
    cdef Py_ssize_t nunits = len(first) - 1, u
    cdef void *scratch
    cdef int failed = 0
    with nogil, parallel(num_threads=num_threads):
        scratch = sa_alloc(nbytes)
        for u in prange(nunits, schedule="dynamic"):
            if scratch == NULL:
                failed += 1
                continue
            _unit(&a, &b, u, <floating *>scratch)
        free(scratch)
    if failed:
        raise MemoryError(f"attention_backward could not allocate {nbytes} bytes of scratch per thread")
