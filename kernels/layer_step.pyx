"""One decoder layer for one token, in one call (kernels/layer_step.h): a decoding step's norm,
Q/K/V product, rotary, cache append, attention, output product and residual (and the
encoder-decoder's cross-attention), norm, feed-forward and residual. Two entries fill the one
runner: llama_layer (the weights as GGUF blocks) and block_layer (the listing's block, float32)."""
from libc.stdint cimport int8_t, int64_t, uint8_t
from libc.stdlib cimport free

include "common.pxi"

cdef extern from "layer_step.h" nogil:
    int SA_QCH
    int SA_DENSE
    int SA_QBYTES(int kind)
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
        sa_matrix qkv, o, cross_q, cross_o, up, down
        int swiglu
        float *K
        float *V
        int64_t head_stride, row_stride, pos
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


cdef sa_matrix _blocks(const uint8_t[:, ::1] w, int kind, Py_ssize_t k, Py_ssize_t n) except *:
    if not 0 <= kind <= 2 or k <= 0 or k % 32 or w.shape[0] != n or w.shape[1] != k // 32 * SA_QBYTES(kind):
        raise ValueError(f"llama_layer: blocks ({w.shape[0]}, {w.shape[1]}) of kind {kind} do not stand for "
                         f"a ({k}, {n}) matrix")
    cdef sa_matrix m
    m.w, m.kind, m.k, m.n, m.b = &w[0, 0], kind, k, n, NULL
    return m


cdef sa_matrix _dense(const float[:, ::1] w, const float[::1] b, Py_ssize_t k, Py_ssize_t n, str name) except *:
    if w.shape[0] != k or w.shape[1] != n or (b is not None and b.shape[0] != n):
        raise ValueError(f"block_layer: {name} has shape ({w.shape[0]}, {w.shape[1]}), the layer needs ({k}, {n})"
                         + (f" and a bias of {n}" if b is not None else ""))
    cdef sa_matrix m
    m.w, m.kind, m.k, m.n, m.b = &w[0, 0], SA_DENSE, k, n, (NULL if b is None else &b[0])
    return m


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


def llama_layer(float[::1] x, const float[::1] attn_norm, const float[::1] ffn_norm,
                const uint8_t[:, ::1] wqkv, int kqkv, const uint8_t[:, ::1] wo, int ko,
                const uint8_t[:, ::1] wgu, int kgu, const uint8_t[:, ::1] wd, int kd, bint q8,
                float[:, :, ::1] K, float[:, :, ::1] V, Py_ssize_t pos, const float[::1] cos, const float[::1] sin,
                Py_ssize_t h, double eps, float[::1] qkv, float[::1] a, float[::1] hn, float[::1] gu,
                float[:, ::1] scores, int num_threads):
    """The kernel contract's llama_layer (silkattn._api): x (d,) in place; K, V (h_kv, capacity, d_head)
    with this token's K and V written at row pos; q8: the products take their x rounded to 8 bits a
    block (reference.round_q8, QuantizedMatrix.activations "int8"). The shapes are checked here against each other,
    which is all that keeps the C code within its arrays."""
    cdef Py_ssize_t d = x.shape[0], hkv = K.shape[0], cap = K.shape[1], dh = K.shape[2]
    cdef Py_ssize_t dff = wd.shape[1] // SA_QBYTES(kd) * 32 if 0 <= kd <= 2 else 0
    cdef sa_layer L
    if h <= 0 or hkv <= 0 or h % hkv or dh <= 0 or dh % 2 or d <= 0 or dff <= 0:
        raise ValueError(f"llama_layer: {h} query heads, {hkv} K/V heads of {dh}, d = {d}, d_ff = {dff}")
    L.qkv, L.o = _blocks(wqkv, kqkv, d, (h + 2 * hkv) * dh), _blocks(wo, ko, h * dh, d)
    L.up, L.down = _blocks(wgu, kgu, d, 2 * dff), _blocks(wd, kd, dff, d)
    if V.shape[0] != hkv or V.shape[1] != cap or V.shape[2] != dh or not 0 <= pos < cap:
        raise ValueError(f"llama_layer: K ({hkv}, {cap}, {dh}), V ({V.shape[0]}, {V.shape[1]}, {V.shape[2]}), "
                         f"position {pos}")
    if (attn_norm.shape[0] != d or ffn_norm.shape[0] != d or cos.shape[0] != dh // 2 or sin.shape[0] != dh // 2
            or qkv.shape[0] < (h + 2 * hkv) * dh or a.shape[0] < h * dh or hn.shape[0] < max(d, dff)
            or gu.shape[0] < 2 * dff or scores.shape[0] < h or scores.shape[1] < cap):
        raise ValueError("llama_layer: a norm, the rotary row or a scratch buffer has the wrong size")
    L.x, L.d, L.h, L.h_kv, L.dh, L.post_norm, L.eps, L.swiglu, L.q8 = &x[0], d, h, hkv, dh, 0, <float>eps, 1, q8
    L.norm1.g, L.norm1.b, L.norm2.g, L.norm2.b = &attn_norm[0], NULL, &ffn_norm[0], NULL
    L.cross_q.w = NULL
    L.K, L.V, L.head_stride, L.row_stride, L.pos = &K[0, 0, 0], &V[0, 0, 0], cap * dh, dh, pos
    L.cos, L.sin = &cos[0], &sin[0]
    L.qkv_out, L.a, L.hn, L.f, L.scores, L.ld_scores = &qkv[0], &a[0], &hn[0], &gu[0], &scores[0, 0], scores.shape[1]
    _run(&L, max(d, h * dh, dff), 1, num_threads)  # no float32 products: no partials


def block_layer(float[::1] x, const float[::1] ln1_g, const float[::1] ln1_b, const float[::1] lnc_g,
                const float[::1] lnc_b, const float[::1] ln2_g, const float[::1] ln2_b,
                const float[:, ::1] wqkv, const float[:, ::1] wo, const float[:, ::1] wcq, const float[:, ::1] wco,
                const float[:, ::1] w1, const float[::1] b1, const float[:, ::1] w2, const float[::1] b2,
                float[:, ::1] K, float[:, ::1] V, Py_ssize_t pos, const float[:, ::1] Km, const float[:, ::1] Vm,
                const uint8_t[::1] keep, Py_ssize_t h, bint post_norm, bint has_cross, double eps,
                float[::1] qkv, float[::1] a, float[::1] hn, float[::1] f, float[:, ::1] scores, int num_threads):
    """The kernel contract's block_layer (silkattn._api): x (d,) in place; K, V (capacity, d) the
    layer's cache, this token's K and V written at row pos; Km, Vm (n_src, d) and keep (n_src,) the
    cross-attention's, read if has_cross. The shapes are checked here against each other, which is
    all that keeps the C code within its arrays."""
    cdef Py_ssize_t d = x.shape[0], cap = K.shape[0], dff = w1.shape[1], dh = d // h if h > 0 else 0
    cdef Py_ssize_t nsrc = Km.shape[0] if has_cross else 0
    cdef sa_layer L
    if h <= 0 or d % h or dff <= 0:
        raise ValueError(f"block_layer: {h} heads do not divide d = {d}, or d_ff = {dff}")
    L.qkv, L.o = _dense(wqkv, None, d, 3 * d, "wqkv"), _dense(wo, None, d, d, "wo")
    L.up, L.down = _dense(w1, b1, d, dff, "w1"), _dense(w2, b2, dff, d, "w2")
    L.cross_q.w = NULL
    if has_cross:
        L.cross_q, L.cross_o = _dense(wcq, None, d, d, "wcq"), _dense(wco, None, d, d, "wco")
        if (nsrc <= 0 or Km.shape[1] != d or Vm.shape[0] != nsrc or Vm.shape[1] != d or keep.shape[0] != nsrc
                or lnc_g.shape[0] != d or lnc_b.shape[0] != d):
            raise ValueError(f"block_layer: memory keys ({Km.shape[0]}, {Km.shape[1]}), values ({Vm.shape[0]}, "
                             f"{Vm.shape[1]}), mask ({keep.shape[0]},) or the cross norm do not fit d = {d}")
    if V.shape[0] != cap or K.shape[1] != d or V.shape[1] != d or not 0 <= pos < cap:
        raise ValueError(f"block_layer: K ({cap}, {K.shape[1]}), V ({V.shape[0]}, {V.shape[1]}), position {pos}")
    if (ln1_g.shape[0] != d or ln1_b.shape[0] != d or ln2_g.shape[0] != d or ln2_b.shape[0] != d
            or qkv.shape[0] < 3 * d or a.shape[0] < d or hn.shape[0] < max(d, dff) or f.shape[0] < dff
            or scores.shape[0] < h or scores.shape[1] < max(cap, nsrc)):
        raise ValueError("block_layer: a norm or a scratch buffer has the wrong size")
    L.x, L.d, L.h, L.h_kv, L.dh, L.post_norm, L.eps, L.swiglu, L.q8 = &x[0], d, h, h, dh, post_norm, <float>eps, 0, 0
    L.norm1.g, L.norm1.b, L.norm2.g, L.norm2.b = &ln1_g[0], &ln1_b[0], &ln2_g[0], &ln2_b[0]
    if has_cross:
        L.norm_cross.g, L.norm_cross.b, L.Km, L.Vm, L.keep, L.n_src = &lnc_g[0], &lnc_b[0], &Km[0, 0], &Vm[0, 0], \
            &keep[0], nsrc
    L.K, L.V, L.head_stride, L.row_stride, L.pos = &K[0, 0], &V[0, 0], dh, d, pos
    L.cos, L.sin = NULL, NULL
    L.qkv_out, L.a, L.hn, L.f, L.scores, L.ld_scores = &qkv[0], &a[0], &hn[0], &f[0], &scores[0, 0], scores.shape[1]
    _run(&L, max(d, dff), max(3 * d, dff), num_threads)
