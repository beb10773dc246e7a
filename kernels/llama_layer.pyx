"""One Llama decoder layer for one token, in one call (kernels/llama_layer.h): a decoding step's
norm, Q/K/V product, rotary, cache append, attention, output product and residual, norm,
gate/up product, SwiGLU, down product and residual, with the weights as GGUF blocks."""
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free

include "common.pxi"

cdef extern from "llama_layer.h" nogil:
    int SA_QCH
    int SA_QBYTES(int kind)
    ctypedef struct sa_llama_layer:
        float *x
        const float *attn_norm
        const float *ffn_norm
        const uint8_t *wqkv
        const uint8_t *wo
        const uint8_t *wgu
        const uint8_t *wd
        int kqkv, ko, kgu, kd
        float *K
        float *V
        const float *cos
        const float *sin
        int64_t d, h, h_kv, dh, dff, capacity, pos
        float eps
        float *qkv
        float *a
        float *hn
        float *gu
        float *scores
        float *xs
    void sa_llama_layer_run(int isa, const sa_llama_layer *L, int num_threads)


cdef int _fits(const uint8_t[:, ::1] w, int kind, Py_ssize_t n, Py_ssize_t k) except -1:
    if not 0 <= kind <= 2 or k <= 0 or k % 32 or w.shape[0] != n or w.shape[1] != k // 32 * SA_QBYTES(kind):
        raise ValueError(f"llama_layer: blocks ({w.shape[0]}, {w.shape[1]}) of kind {kind} do not stand for "
                         f"a ({k}, {n}) matrix")
    return 0


def llama_layer(float[::1] x, const float[::1] attn_norm, const float[::1] ffn_norm,
                const uint8_t[:, ::1] wqkv, int kqkv, const uint8_t[:, ::1] wo, int ko,
                const uint8_t[:, ::1] wgu, int kgu, const uint8_t[:, ::1] wd, int kd,
                float[:, :, ::1] K, float[:, :, ::1] V, Py_ssize_t pos, const float[::1] cos, const float[::1] sin,
                Py_ssize_t h, double eps, float[::1] qkv, float[::1] a, float[::1] hn, float[::1] gu,
                float[:, ::1] scores, int num_threads):
    """The kernel contract's llama_layer (silkattn._api): x (d,) in place; K, V (h_kv, capacity, d_head)
    with this token's K and V written at row pos. The shapes are checked here against each other,
    which is all that keeps the C code within its arrays."""
    cdef Py_ssize_t d = x.shape[0], hkv = K.shape[0], cap = K.shape[1], dh = K.shape[2]
    cdef Py_ssize_t dff = wd.shape[1] // SA_QBYTES(kd) * 32 if 0 <= kd <= 2 else 0
    cdef Py_ssize_t nbp = (max(d, h * dh, dff) // 32 + SA_QCH - 1) // SA_QCH * SA_QCH
    cdef sa_llama_layer L
    if h <= 0 or hkv <= 0 or h % hkv or dh <= 0 or dh % 2 or d <= 0 or dff <= 0:
        raise ValueError(f"llama_layer: {h} query heads, {hkv} K/V heads of {dh}, d = {d}, d_ff = {dff}")
    _fits(wqkv, kqkv, (h + 2 * hkv) * dh, d)
    _fits(wo, ko, d, h * dh)
    _fits(wgu, kgu, 2 * dff, d)
    _fits(wd, kd, d, dff)
    if V.shape[0] != hkv or V.shape[1] != cap or V.shape[2] != dh or not 0 <= pos < cap:
        raise ValueError(f"llama_layer: K ({hkv}, {cap}, {dh}), V ({V.shape[0]}, {V.shape[1]}, {V.shape[2]}), position {pos}")
    if (attn_norm.shape[0] != d or ffn_norm.shape[0] != d or cos.shape[0] != dh // 2 or sin.shape[0] != dh // 2
            or qkv.shape[0] < (h + 2 * hkv) * dh or a.shape[0] < h * dh or hn.shape[0] < max(d, dff)
            or gu.shape[0] < 2 * dff or scores.shape[0] < h or scores.shape[1] < cap):
        raise ValueError("llama_layer: a norm, the rotary row or a scratch buffer has the wrong size")
    L.x, L.attn_norm, L.ffn_norm = &x[0], &attn_norm[0], &ffn_norm[0]
    L.wqkv, L.wo, L.wgu, L.wd = &wqkv[0, 0], &wo[0, 0], &wgu[0, 0], &wd[0, 0]
    L.kqkv, L.ko, L.kgu, L.kd = kqkv, ko, kgu, kd
    L.K, L.V, L.cos, L.sin = &K[0, 0, 0], &V[0, 0, 0], &cos[0], &sin[0]
    L.d, L.h, L.h_kv, L.dh, L.dff, L.capacity, L.pos, L.eps = d, h, hkv, dh, dff, cap, pos, <float>eps
    L.qkv, L.a, L.hn, L.gu, L.scores = &qkv[0], &a[0], &hn[0], &gu[0], &scores[0, 0]
    L.xs = <float *>sa_alloc(nbp * sizeof(float))
    if L.xs == NULL:
        raise MemoryError("llama_layer could not allocate the block sums")
    with nogil:
        sa_llama_layer_run(ISA, &L, num_threads)
    free(L.xs)
