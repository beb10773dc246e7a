"""Fused attention over a plan (silkattn/_plan.py): softmax(hide(softcap(scale Q K^T) + bias + ALiBi)) V,
flash-style tiles, or a few rows per K/V unit with the keys split across threads."""
from cython cimport floating
from cython.parallel cimport parallel, prange
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc

cimport numpy as cnp
import numpy as np

cnp.import_array()

include "common.pxi"

include "attention_plan.pxi"

cdef extern from "attention.h" nogil:
    int SA_BR_OF(int vbytes)
    int SA_BQ, SA_BK
    size_t sa_attn_scratch_bytes(const sa_attn_plan *a, size_t tsize)
    size_t sa_attn_rows_scratch(int64_t dk, int64_t dv)
    void sa_attn_tile_f32(int isa, const sa_attn_plan *a, const sa_task *t, void *scratch)
    void sa_attn_tile_f64(int isa, const sa_attn_plan *a, const sa_task *t, void *scratch)
    void sa_attn_rows_part_f32(int isa, const sa_attn_plan *a, const sa_chunk *c, float *parts, float *scratch)
    void sa_attn_rows_part_f64(int isa, const sa_attn_plan *a, const sa_chunk *c, double *parts, double *scratch)
    void sa_attn_rows_merge_f32(int isa, const sa_attn_plan *a, const sa_group *g, const float *parts)
    void sa_attn_rows_merge_f64(int isa, const sa_attn_plan *a, const sa_group *g, const double *parts)


# The kernels for the dtype of floating (attn_tile's scratch, bytes the kernel carves into arrays
# of its dtype, is typed here only to choose the copy).
cdef inline void _attn_tile(const sa_attn_plan *a, const sa_task *t, floating *scratch) noexcept nogil:
    if floating is float:
        sa_attn_tile_f32(ISA, a, t, scratch)
    else:
        sa_attn_tile_f64(ISA, a, t, scratch)


cdef inline void _attn_rows_part(const sa_attn_plan *a, const sa_chunk *c, floating *parts,
                                 floating *scratch) noexcept nogil:
    if floating is float:
        sa_attn_rows_part_f32(ISA, a, c, parts, scratch)
    else:
        sa_attn_rows_part_f64(ISA, a, c, parts, scratch)


cdef inline void _attn_rows_merge(const sa_attn_plan *a, const sa_group *g,
                                  const floating *parts) noexcept nogil:
    if floating is float:
        sa_attn_rows_merge_f32(ISA, a, g, parts)
    else:
        sa_attn_rows_merge_f64(ISA, a, g, parts)

# The tile geometry (attention.h) the plan cuts tasks for: bq rows by default, at most 144 (few
# tiles are sized so every thread gets the same rows), heights rounded to the register blocks of the
# copy that runs (SA_BR_OF its vector width: the avx512 and avx2x64 copies' 64 bytes, else at most 32).
TILES = {"bq": SA_BQ, "max_bq": 144, "mr": SA_BR_OF(64 if ISA_NAME in ("avx512", "avx2x64") else 32)}


def attention(plan, int num_threads):
    """The kernel contract of silkattn._api: run the plan's tasks (the tiles path, in the plan's
    order, taken dynamically by the threads) or its chunks then the merge (the rows path)."""
    lse = plan.lse if plan.lse is not None else plan.out[:0]
    if plan.out.dtype == np.float32:
        _attention[float](plan, plan.q, plan.k, plan.v, plan.bias, plan.out, lse, num_threads)
    else:
        _attention[double](plan, plan.q, plan.k, plan.v, plan.bias, plan.out, lse, num_threads)


cdef _attention(plan, const floating[::1] q, const floating[::1] k, const floating[::1] v,
                const floating[::1] bias, floating[::1] out, floating[::1] lse, int num_threads):
    cdef const uint8_t[::1] mask = plan.mask
    cdef sa_attn_plan a
    a.q, a.k, a.v, a.bias, a.mask, a.out = &q[0], &k[0], &v[0], &bias[0], &mask[0], &out[0]
    _fill_plan(&a, plan)
    a.bk = SA_BK
    a.lse = &lse[0] if plan.lse is not None else NULL
    if plan.path == "rows":
        _rows(&a, plan, <floating *>NULL, num_threads)
    else:
        _tiles(&a, plan, <floating *>NULL, num_threads)


cdef _tiles(sa_attn_plan *a, plan, floating *dtype, int num_threads):
    a.tasks = <const sa_task *>_data(plan.tasks)
    cdef Py_ssize_t ntasks = len(plan.tasks), w
    cdef size_t nbytes = sa_attn_scratch_bytes(a, sizeof(floating))
    cdef void *scratch
    cdef int failed = 0
    with nogil, parallel(num_threads=num_threads):
        scratch = sa_alloc(nbytes)
        for w in prange(ntasks, schedule="dynamic"):
            if scratch == NULL:
                failed += 1
                continue
            _attn_tile(a, &a.tasks[w], <floating *>scratch)
        free(scratch)
    if failed:
        raise MemoryError(f"attention could not allocate {nbytes} bytes of scratch per thread")


cdef _rows(sa_attn_plan *a, plan, floating *dtype, int num_threads):
    a.groups, a.rows = <const sa_group *>_data(plan.groups), <const sa_row *>_data(plan.rows)
    a.chunks = <const sa_chunk *>_data(plan.chunks)
    cdef Py_ssize_t nchunks = len(plan.chunks), ngroups = len(plan.groups), w
    cdef size_t nparts = max(<Py_ssize_t>plan.parts, 1) * (a.dv + 2)
    cdef floating *parts = <floating *>malloc(nparts * sizeof(floating))
    if parts == NULL:
        raise MemoryError(f"attention could not allocate {nparts} partial results")
    cdef size_t nscratch = sa_attn_rows_scratch(a.dk, a.dv) * sizeof(floating)
    cdef floating *scratch
    cdef int failed = 0
    with nogil:
        with parallel(num_threads=num_threads):
            scratch = <floating *>sa_alloc(nscratch)
            for w in prange(nchunks, schedule="static"):
                if scratch == NULL:
                    failed += 1
                    continue
                _attn_rows_part(a, &a.chunks[w], parts, scratch)
            free(scratch)
        if not failed:
            for w in range(ngroups):
                _attn_rows_merge(a, &a.groups[w], parts)
    free(parts)
    if failed:
        raise MemoryError(f"attention could not allocate {nscratch} bytes of scratch per thread")
