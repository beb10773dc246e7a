"""One decoder layer for one token, in one call (kernels/layer_step.h): a decoding step's norm,
Q/K/V product, rotary, cache append, attention, output product and residual (and the
encoder-decoder's cross-attention), norm, feed-forward and residual, from one record
(silkattn._step.LayerStep, read by field into sa_layer once and kept with the record)."""
from libc.stdint cimport int8_t, int64_t, uint8_t
from libc.stdlib cimport free

cimport numpy as cnp

cnp.import_array()

import dataclasses

import numpy as np

from silkattn._cy import linear_q as _linear_q

include "common.pxi"

cdef extern from "layer_step.h" nogil:
    int SA_QCH
    int SA_DENSE
    ctypedef struct sa_matrix:
        const void *w
        int kind
        int64_t k, n
        const float *b
    ctypedef struct sa_norm:
        const float *g
        const float *b
    ctypedef struct sa_layer:
        float *x
        int64_t d, h, h_kv, dh
        int post_norm
        float eps
        sa_norm norm1, norm_cross, norm2
        sa_matrix qkv[3]
        sa_matrix o, cross_q, cross_o
        sa_matrix up[2]
        sa_matrix down
        int n_qkv, n_up, gate
        const float *q_norm
        const float *k_norm
        const float *post1
        const float *post2
        float scale
        void *K
        void *V
        int64_t head_stride, row_stride
        int kv_half
        int64_t row, key0, nkeys
        const float *cos
        const float *sin
        const float *Km
        const float *Vm
        const uint8_t *keep
        int64_t n_src
        float *qkv_out
        float *a
        float *hn
        float *f
        float *scores
        int64_t ld_scores
        int q8
        float *xs
        float *xd
        int8_t *xq
        float *parts
    void sa_layer_run(int isa, const sa_layer *L, int num_threads)
    ctypedef struct sa_rows:
        int64_t m
        float *x
        void *K
        void *V
        const int64_t *at
        const float *cos
        const float *sin
        float *qkv
        float *a
        float *hn
        float *f
        float *y
        float *scores
        float *xs
        float *xd
        int8_t *xq
    void sa_layers_run_rows(int isa, const sa_layer *Ls, int n, const sa_rows *R, void **K, void **V,
                            const int64_t **at, const float **cos, const float **sin, int num_threads)


cdef inline const void *_data(a):
    """The first element of one of the record's arrays (checked C-contiguous when it was built), or
    NULL for an empty one (no bias, RMSNorm, no rotary)."""
    return NULL if a.size == 0 else cnp.PyArray_DATA(a)


def _pack(blocks, kind):
    from silkattn._threads import get_num_threads
    return _linear_q.pack_rows16(blocks, kind, get_num_threads())


_PACK = _pack if _linear_q.rows16_usable() else None  # QuantizedMatrix.rows16's maker, where it serves
_ROWS16_KINDS = frozenset(_linear_q.ROWS16_CODES.values())


cdef sa_matrix _matrix(P, bint q8):
    """P as sa_matrix: its blocks, or with int8 products those of quant.ROWS16's kinds in groups of 16
    rows where this CPU's copy runs them with VNNI (QuantizedMatrix.rows16, kept with the matrix;
    kernels/rows16.h)"""
    cdef sa_matrix m
    m.w, m.kind, m.k, m.n, m.b = _data(P.w), P.kind, P.k, P.n, <const float *>_data(P.b)
    if q8 and P.kind in _ROWS16_KINDS and P.matrix is not None and _PACK is not None:
        packed = P.matrix.rows16(_PACK)
        if packed is not None:
            m.w, m.kind = _data(packed[0]), packed[1]
    return m


cdef sa_norm _norm(N):
    cdef sa_norm n
    n.g, n.b = <const float *>_data(N.g), <const float *>_data(N.b)
    return n


cdef class _Layer:
    """A LayerStep (silkattn._step) as sa_layer, its fields filled once; the record's fields are kept
    with it (not the record: it lives in the record's `prepared`, and a reference back would be a
    cycle that holds the record, its cache or pool pages included, until the garbage collector
    runs), which keeps the arrays it points into alive. Per call only the row x, the position and
    the rotary row change."""
    cdef sa_layer L
    cdef object fields
    cdef const float *cos0
    cdef const float *sin0
    cdef Py_ssize_t half, kmax, nmax
    cdef Py_ssize_t nq, nu, cache, capacity, rows_floats  # layer_step_rows' sizes: a row's Q | K | V, gate | up, cache

    def __cinit__(self, step):
        cdef sa_layer *L = &self.L
        S = step.scratch
        self.fields = tuple(getattr(step, f.name) for f in dataclasses.fields(step) if f.name != "prepared")
        L.d, L.h, L.h_kv, L.dh = step.d, step.h, step.h_kv, step.dh
        L.post_norm, L.eps, L.gate, L.q8 = step.post_norm, <float>step.eps, step.gate, step.q8
        L.norm1, L.norm2, L.norm_cross = _norm(step.norm1), _norm(step.norm2), _norm(step.norm_cross)
        L.n_qkv, L.n_up = len(step.qkv), len(step.up)
        assert 1 <= L.n_qkv <= 3 and 1 <= L.n_up <= 2  # the record's check: sa_layer's arrays
        for i, P in enumerate(step.qkv):
            L.qkv[i] = _matrix(P, step.q8)
        for i, P in enumerate(step.up):
            L.up[i] = _matrix(P, step.q8)
        L.o, L.down = _matrix(step.o, step.q8), _matrix(step.down, step.q8)
        L.q_norm, L.k_norm = <const float *>_data(step.q_norm.g), <const float *>_data(step.k_norm.g)
        L.post1, L.post2 = <const float *>_data(step.post1.g), <const float *>_data(step.post2.g)
        L.scale = step.scale
        L.cross_q, L.cross_o = _matrix(step.cross_q, step.q8), _matrix(step.cross_o, step.q8)
        if not step.has_cross:
            L.cross_q.w = NULL
        L.K, L.V = <void *>_data(step.K), <void *>_data(step.V)
        L.kv_half = step.K.dtype == np.float16  # else float32 (the record's check)
        L.head_stride, L.row_stride = step.head_stride, step.row_stride
        L.Km, L.Vm = <const float *>_data(step.Km), <const float *>_data(step.Vm)
        L.keep, L.n_src = <const uint8_t *>_data(step.keep), len(step.Km)
        L.qkv_out, L.a, L.hn = <float *>_data(S.qkv), <float *>_data(S.a), <float *>_data(S.hn)
        L.f, L.scores, L.ld_scores = <float *>_data(S.f), <float *>_data(S.scores), S.scores.shape[1]
        self.cos0, self.sin0 = <const float *>_data(step.cos), <const float *>_data(step.sin)
        self.half = step.cos.shape[1]
        # the block products' widest input (their x's sums and int8 copy), the float32 ones' widest
        # output (the threads' partial results)
        self.kmax = max([P.k for P in step.products if P.kind != SA_DENSE] + [1])
        self.nmax = max([P.n for P in step.products if P.kind == SA_DENSE] + [1])
        self.nq, self.nu = sum(P.n for P in step.qkv), sum(P.n for P in step.up)
        self.cache, self.capacity = step.h_kv * step.head_stride, step.capacity
        # a row's float32 scratch in layer_step_rows: Q | K | V, attention, norm (or d_ff), gate | up, y, scores
        self.rows_floats = (self.nq + step.h * step.dh + max(step.d, step.d_ff) + self.nu + step.d
                            + step.h * S.scores.shape[1])


cdef int _run(sa_layer *L, Py_ssize_t kmax, Py_ssize_t nmax, int num_threads) except -1:
    """The scratch for the block sums and the threads' partial products, then the runner (without
    the GIL)."""
    L.xs = <float *>sa_alloc((kmax // 32 + SA_QCH) * sizeof(float))
    L.xd = <float *>sa_alloc((kmax // 32 + SA_QCH) * sizeof(float))
    L.xq = <int8_t *>sa_alloc(kmax)
    L.parts = <float *>sa_alloc(max(1, num_threads) * nmax * sizeof(float))
    if L.xs == NULL or L.xd == NULL or L.xq == NULL or L.parts == NULL:
        free(L.xs)
        free(L.xd)
        free(L.xq)
        free(L.parts)
        raise MemoryError("a layer step could not allocate its scratch")
    with nogil:
        sa_layer_run(ISA, L, num_threads)
    free(L.xs)
    free(L.xd)
    free(L.xq)
    free(L.parts)
    return 0


def layer_step(step, float[::1] x, Py_ssize_t pos, int num_threads):
    """The kernel contract's layer_step (silkattn._api): x (d,) in place through the record `step`
    (silkattn._step.LayerStep, whose shapes were checked when it was built, x and pos at the call:
    all that keeps the C code within its arrays), this token's K and V written at its cache row
    (step.keys)."""
    cdef _Layer p = step.prepared.get("cython")
    if p is None:
        p = step.prepared["cython"] = _Layer(step)
    cdef sa_layer L = p.L
    L.x = &x[0]
    L.row, L.key0, L.nkeys = step.keys(pos)
    L.cos = NULL if p.cos0 == NULL else p.cos0 + pos * p.half
    L.sin = NULL if p.sin0 == NULL else p.sin0 + pos * p.half
    _run(&L, p.kmax, p.nmax, num_threads)


cdef inline bint _array(a, int typenum, int ndim):
    """a is a C-contiguous ndarray of that dtype and number of dimensions."""
    return type(a) is np.ndarray and cnp.PyArray_TYPE(a) == typenum and cnp.PyArray_NDIM(a) == ndim \
        and cnp.PyArray_IS_C_CONTIGUOUS(a)


def layer_step_rows(steps, cnp.ndarray x, ats, Ks, Vs, coss, sins, int num_threads):
    """The kernel contract's layer_step_rows (silkattn._api): the m rows of x (m, d) float32 in place
    through the records `steps` in turn (Llama-family layers of block products, checked by the
    caller), one parallel region for them all: for layer l, row r is a token whose cache is the
    h_kv * head_stride elements of Ks[l] and Vs[l] (flat pools of caches laid out as the record's,
    of its cache's dtype: float32 or float16) from ats[l][r, 3], its K and V written at cache row
    ats[l][r, 0], its query over the ats[l][r, 2] rows from ats[l][r, 1]; coss[l], sins[l] (m,
    dh / 2) each row's rotary row (empty: none). What keeps the C code within its arrays is checked
    here."""
    cdef Py_ssize_t n = len(steps), m, r, l, kmax = 1, floats = 0, nbp, d
    cdef int kv
    cdef _Layer p
    cdef cnp.ndarray a, K, V, c, sn
    cdef const int64_t *ar
    if n == 0 or not (len(ats) == len(Ks) == len(Vs) == len(coss) == len(sins) == n):
        raise ValueError("layer_step_rows: one at, pool pair and rotary pair a record")
    if not _array(x, cnp.NPY_FLOAT32, 2) or not x.flags.writeable:
        raise ValueError("layer_step_rows: x must be a writeable C-contiguous float32 (rows, d) array")
    m, d = x.shape[0], x.shape[1]
    prepared = []
    for l in range(n):
        p = steps[l].prepared.get("cython")
        if p is None:
            p = steps[l].prepared["cython"] = _Layer(steps[l])
        prepared.append(p)
        a, K, V, c, sn = ats[l], Ks[l], Vs[l], coss[l], sins[l]
        kv = cnp.NPY_FLOAT16 if p.L.kv_half else cnp.NPY_FLOAT32  # the pools' elements: the record's cache's
        if d != p.L.d or not _array(a, cnp.NPY_INT64, 2) or a.shape[0] != m or a.shape[1] != 4 \
                or not (_array(K, kv, 1) and _array(V, kv, 1)) \
                or K.shape[0] != V.shape[0] or not (K.flags.writeable and V.flags.writeable) \
                or not (_array(c, cnp.NPY_FLOAT32, 2) and _array(sn, cnp.NPY_FLOAT32, 2)):
            raise ValueError(f"layer_step_rows: x, at, the pools or the rotary rows of layer {l} do not fit its record")
        ar = <const int64_t *>cnp.PyArray_DATA(a)
        for r in range(m):
            if not (0 <= ar[4 * r] < p.capacity and 0 <= ar[4 * r + 1] and 0 < ar[4 * r + 2]
                    and ar[4 * r + 1] + ar[4 * r + 2] <= p.capacity and 0 <= ar[4 * r + 3]
                    and ar[4 * r + 3] + p.cache <= K.shape[0]):
                raise ValueError(f"layer_step_rows: row {r}'s cache rows or pool offset are out of range (layer {l})")
        if c.shape[0] and (c.shape[0] != m or sn.shape[0] != m or c.shape[1] != p.half or sn.shape[1] != p.half):
            raise ValueError("layer_step_rows: cos and sin must be (rows, dh / 2)")
        if p.L.ld_scores != (<_Layer>prepared[0]).L.ld_scores or p.nq != (<_Layer>prepared[0]).nq \
                or p.nu != (<_Layer>prepared[0]).nu or p.L.h != (<_Layer>prepared[0]).L.h \
                or p.L.dh != (<_Layer>prepared[0]).L.dh or p.L.down.k != (<_Layer>prepared[0]).L.down.k:
            raise ValueError("layer_step_rows: the records must have the same sizes")
        kmax, floats = max(kmax, p.kmax), max(floats, p.rows_floats)
    if m == 0:
        return
    p = prepared[0]
    nbp = (kmax // 32 + SA_QCH - 1) // SA_QCH * SA_QCH
    cdef Py_ssize_t nq = p.nq, nu = p.nu, hdh = p.L.h * p.L.dh, wide = max(d, p.L.down.k)
    # the rows' buffers, kept with the records' shared scratch (one model's layers run one at a time)
    S = steps[0].scratch
    work = S.__dict__.get("_rows_work")
    if work is None or len(work) < m * floats:
        work = np.empty(m * floats, np.float32)
        object.__setattr__(S, "_rows_work", work)
    cdef float[::1] w = work
    cdef sa_rows R
    R.m, R.x = m, <float *>cnp.PyArray_DATA(x)
    R.qkv = &w[0]
    R.a = R.qkv + m * nq
    R.hn = R.a + m * hdh
    R.f = R.hn + m * wide
    R.y = R.f + m * nu
    R.scores = R.y + m * d
    cdef sa_layer *Ls = <sa_layer *>sa_alloc(n * sizeof(sa_layer))
    cdef void **Kp = <void **>sa_alloc(n * sizeof(void *))
    cdef void **Vp = <void **>sa_alloc(n * sizeof(void *))
    cdef const int64_t **Ap = <const int64_t **>sa_alloc(n * sizeof(int64_t *))
    cdef const float **Cp = <const float **>sa_alloc(n * sizeof(float *))
    cdef const float **Sp = <const float **>sa_alloc(n * sizeof(float *))
    R.xs = <float *>sa_alloc(m * nbp * sizeof(float))
    R.xd = <float *>sa_alloc(m * nbp * sizeof(float))
    R.xq = <int8_t *>sa_alloc(m * kmax)
    try:
        if not (Ls and Kp and Vp and Ap and Cp and Sp and R.xs and R.xd and R.xq):
            raise MemoryError("a layer step of rows could not allocate its scratch")
        for l in range(n):
            Ls[l] = (<_Layer>prepared[l]).L
            Kp[l], Vp[l] = cnp.PyArray_DATA(Ks[l]), cnp.PyArray_DATA(Vs[l])
            Ap[l] = <const int64_t *>cnp.PyArray_DATA(ats[l])
            c = coss[l]
            Cp[l] = <const float *>cnp.PyArray_DATA(c) if c.shape[0] else NULL
            Sp[l] = <const float *>cnp.PyArray_DATA(sins[l]) if c.shape[0] else NULL
        with nogil:
            sa_layers_run_rows(ISA, Ls, <int>n, &R, Kp, Vp, Ap, Cp, Sp, num_threads)
    finally:
        free(Ls)
        free(Kp)
        free(Vp)
        free(Ap)
        free(Cp)
        free(Sp)
        free(R.xs)
        free(R.xd)
        free(R.xq)
