"""Fused scaled-dot-product attention: softmax(where(mask, Q K^T / sqrt(d_k), -1e9)) V, flash-style."""
from cython cimport floating
from cython.parallel cimport parallel, prange
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc

include "common.pxi"

cdef extern from "attention.h" nogil:
    ctypedef struct sa_attn_args:
        const void *q
        const void *k
        const void *v
        const uint8_t *mask
        void *out
        const int64_t *offsets
        int64_t rs[4]
        int64_t Sq, Sk, dk, dv, q_offset, bq, bk
        const int64_t *items
        int causal, masked
    int SA_MR, SA_BQ, SA_BK, SA_DEC_BLOCK, SA_DEC_CHUNK
    size_t sa_attn_scratch_bytes(const sa_attn_args *a, size_t tsize)
    size_t sa_attn_decode_scratch(int64_t dk)
    void sa_attn_tile_f32(int isa, const sa_attn_args *a, int64_t b, int64_t q0, void *scratch)
    void sa_attn_tile_f64(int isa, const sa_attn_args *a, int64_t b, int64_t q0, void *scratch)
    void sa_attn_decode_part_f32(int isa, const sa_attn_args *a, int64_t b, int64_t j0, int64_t j1, float *part,
                                 float *scratch)
    void sa_attn_decode_part_f64(int isa, const sa_attn_args *a, int64_t b, int64_t j0, int64_t j1, double *part,
                                 double *scratch)
    void sa_attn_decode_merge_f32(int isa, const sa_attn_args *a, int64_t b, int64_t nsplit, const float *parts,
                                  float *out)
    void sa_attn_decode_merge_f64(int isa, const sa_attn_args *a, int64_t b, int64_t nsplit, const double *parts,
                                  double *out)

# The tile geometry (named in attention.h); a tile of few queries is at most MAX_BQ rows.
TILES = {"bq": SA_BQ, "bk": SA_BK, "mr": SA_MR}
cdef Py_ssize_t MAX_BQ = 144


def attention(const floating[::1] q, const floating[::1] k, const floating[::1] v, const uint8_t[::1] mask,
              floating[::1] out, const int64_t[:, ::1] offsets, const int64_t[::1] strides,
              Py_ssize_t Sq, Py_ssize_t Sk, Py_ssize_t dk, Py_ssize_t dv, bint causal, Py_ssize_t q_offset,
              bint masked, int num_threads, const int64_t[:, ::1] items=None):
    """The kernel contract of silkattn._api; one task per (batch item, query tile). items (B, 3):
    each item's own Sq, Sk and output offset (packed sequences of different lengths), or None."""
    cdef sa_attn_args a
    cdef int i
    a.q, a.k, a.v, a.mask, a.out = &q[0], &k[0], &v[0], &mask[0], &out[0]
    a.offsets = &offsets[0, 0]
    for i in range(4):
        a.rs[i] = strides[i]
    a.Sq, a.Sk, a.dk, a.dv, a.q_offset, a.causal, a.masked = Sq, Sk, dk, dv, q_offset, causal, masked
    a.items = NULL if items is None else &items[0, 0]
    # Few tiles: pick their count as a multiple of the threads, so each thread gets the same rows
    # (at most MAX_BQ a tile); many tiles: SA_BQ rows each, dynamic scheduling evens them out.
    # Tile heights are rounded to 16 queries (whole register blocks) and to SA_MR (AVX2 blocks).
    # (Positive operands only: cdivision makes // truncate like C.)
    cdef Py_ssize_t B = offsets.shape[0], w, b, t, per_item, ntasks
    a.bq, a.bk = SA_BQ, SA_BK
    if items is None and B * ((Sq + a.bq - 1) // a.bq) < 8 * num_threads:
        per_item = (Sq + MAX_BQ - 1) // MAX_BQ
        while (B * per_item) % num_threads and per_item < Sq:
            per_item += 1
        a.bq = ((Sq + per_item - 1) // per_item + 15) // 16 * 16
    a.bq = min(a.bq, (Sq + SA_MR - 1) // SA_MR * SA_MR)  # Sq: the longest item's
    cdef Py_ssize_t ntiles = (Sq + a.bq - 1) // a.bq
    # tasks of packed items, in the given item order: (item, first query) pairs
    cdef int64_t *task = NULL
    if items is None:
        ntasks = B * ntiles
    else:
        ntasks = 0
        for b in range(B):
            ntasks += (items[b, 0] + a.bq - 1) // a.bq
        task = <int64_t *>malloc(2 * max(ntasks, 1) * sizeof(int64_t))
        if task == NULL:
            raise MemoryError(f"attention could not allocate {ntasks} tasks")
        w = 0
        for b in range(B):
            for t in range((items[b, 0] + a.bq - 1) // a.bq):
                task[2 * w], task[2 * w + 1] = b, t * a.bq
                w += 1
    cdef size_t nbytes = sa_attn_scratch_bytes(&a, sizeof(floating))
    cdef void *scratch
    cdef int failed = 0
    cdef int64_t q0
    with nogil, parallel(num_threads=num_threads):
        scratch = sa_alloc(nbytes)
        for w in prange(ntasks, schedule="dynamic"):
            if scratch == NULL:
                failed += 1
                continue
            if task != NULL:
                b, q0 = task[2 * w], task[2 * w + 1]
            else:
                b, t = w % B, w // B
                if causal:  # the tiles with the most keys first, so the threads finish together
                    t = ntiles - 1 - t
                q0 = t * a.bq
            if floating is float:
                sa_attn_tile_f32(ISA, &a, b, q0, scratch)
            else:
                sa_attn_tile_f64(ISA, &a, b, q0, scratch)
        free(scratch)
    free(task)
    if failed:
        raise MemoryError(f"attention could not allocate {nbytes} bytes of scratch per thread")


def attention_decode(const floating[::1] q, const floating[::1] k, const floating[::1] v,
                     const uint8_t[::1] mask, floating[::1] out, const int64_t[:, ::1] offsets,
                     const int64_t[::1] strides, Py_ssize_t Sq, Py_ssize_t Sk, Py_ssize_t dk, Py_ssize_t dv,
                     bint causal, Py_ssize_t q_offset, bint masked, int num_threads):
    """The kernel contract of silkattn._api for one query row (Sq == 1): each batch item's keys cut
    into chunks of SA_DEC_CHUNK, the chunks shared by the threads, their partial results merged."""
    if Sq != 1:
        raise ValueError("attention_decode takes one query row (Sq == 1)")
    cdef sa_attn_args a
    cdef int i
    a.q, a.k, a.v, a.mask, a.out = &q[0], &k[0], &v[0], &mask[0], &out[0]
    a.offsets = &offsets[0, 0]
    for i in range(4):
        a.rs[i] = strides[i]
    a.Sq, a.Sk, a.dk, a.dv, a.q_offset, a.causal, a.masked = Sq, Sk, dk, dv, q_offset, causal, masked
    a.items = NULL
    a.bq, a.bk = 1, SA_DEC_BLOCK
    # keys past the query's position are never read: they weigh exactly 0 (see attention.h)
    cdef Py_ssize_t B = offsets.shape[0], nk = min(Sk, q_offset + 1) if causal else Sk
    cdef Py_ssize_t chunk = SA_DEC_CHUNK, nsplit = (nk + chunk - 1) // chunk, w, b, j0, j1
    cdef Py_ssize_t stride = dv + 2
    cdef floating *parts = <floating *>malloc(B * nsplit * stride * sizeof(floating))
    if parts == NULL:
        raise MemoryError(f"attention could not allocate {B * nsplit} partial results")
    cdef size_t nscratch = sa_attn_decode_scratch(dk) * sizeof(floating)
    cdef floating *scratch
    cdef int failed = 0
    with nogil:
        with parallel(num_threads=num_threads):
            scratch = <floating *>sa_alloc(nscratch)
            for w in prange(B * nsplit, schedule="static"):
                if scratch == NULL:
                    failed += 1
                    continue
                b, j0 = w // nsplit, (w % nsplit) * chunk
                j1 = min(nk, j0 + chunk)
                if floating is float:
                    sa_attn_decode_part_f32(ISA, &a, b, j0, j1, parts + w * stride, scratch)
                else:
                    sa_attn_decode_part_f64(ISA, &a, b, j0, j1, parts + w * stride, scratch)
            free(scratch)
        if not failed:
            for b in range(B):
                if floating is float:
                    sa_attn_decode_merge_f32(ISA, &a, b, nsplit, parts + b * nsplit * stride, &out[b * dv])
                else:
                    sa_attn_decode_merge_f64(ISA, &a, b, nsplit, parts + b * nsplit * stride, &out[b * dv])
    free(parts)
    if failed:
        raise MemoryError(f"attention could not allocate {nscratch} bytes of scratch per thread")
