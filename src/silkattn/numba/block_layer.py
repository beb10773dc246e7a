"""Numba block_layer: one token through one of the listing's decoder blocks in one compiled call (the
kernel contract's block_layer, silkattn._api; kernels/layer_step.h is its C twin), so that a decoding
step of the seed's decoder or of the encoder-decoder's costs one Python call a block instead of a
dozen ops' bookkeeping. Float32, in place on the residual x (d,), each sublayer
x += f(layer_norm(x)), or x = layer_norm(x + f(x)) post-norm:

    self-attention: qkv = . W_qkv (Q | K | V);  K[pos], V[pos] = its K and V;  a = each head's
        attention over rows 0 .. pos of the cache (heads side by side: head u is columns u dh ..
        (u + 1) dh);  f = a W_o
    cross-attention (has_cross): q = . W_cq;  a = each head's attention over the encoder's keys Km
        and values Vm, a key with keep[t] == 0 scoring exactly -1e9 (as the reference hides it);
        f = a W_co;  its own norm (lnc)
    feed-forward: f = relu(. W_1 + b_1) W_2 + b_2

The products are _dense: x (k,) times a float32 (k, n) row-major W read in place, parallel over
blocks of columns (eight registers of columns down all k rows, as kernels' sa_dense_cols), the
bias, ReLU and residual add applied as each output is stored (each x[j] read just before it is
overwritten, so x may be the residual and the output). The norms are layer_norm_rows's arithmetic
for one row (its shift by x[0], corrected two-pass variance), the attention llama_layer.py's
_attend with the cache's head and row strides and the keep mask.

Numba's on-disk cache only tracks the file a function is defined in: after editing llama_layer.py
or _simd.py, delete src/silkattn/numba/__pycache__/*.nb[ic] or block_layer may load stale machine
code.
"""
import math

import numba
import numpy as np
from numba import prange

from ._simd import CACHE, FASTMATH, hsum, vadd, vfma, vload, vmax, vmul, vsplat, vstore, vsub, vwidth
from .llama_layer import _attend


@numba.njit(nogil=True, cache=CACHE, fastmath=FASTMATH)
def _layer_norm(x, g, b, eps, out, buf):
    """out[:d] = g (x - mean) / sqrt(var + eps) + b, d = len(x), population variance: layer_norm_rows
    (layer_norm.py) for one row, the same operations in the same order (so the same bits). out may
    be x. buf: 4 registers of scratch ([0:W] x's tail, [W:2W] its lane mask, [2W:4W] g's and b's)."""
    n = x.shape[0]
    W = vwidth(x)
    nv = n - n % W
    nt = n - nv
    inv_n = np.float32(1.0 / n)
    e = np.float32(eps)
    for j in range(4 * W):
        buf[j] = 0
    for j in range(nt):
        buf[W + j] = 1
        buf[2 * W + j] = g[nv + j]
        buf[3 * W + j] = b[nv + j]
    zero = vsplat(x, 0)
    x0 = x[0]
    v0 = vsplat(x, x0)
    # pass 1: sum of y = x - x0, four partial sums
    s0, s1, s2, s3 = zero, zero, zero, zero
    j = 0
    while j + 4 * W <= nv:
        s0 = vadd(s0, vsub(vload(x, j), v0))
        s1 = vadd(s1, vsub(vload(x, j + W), v0))
        s2 = vadd(s2, vsub(vload(x, j + 2 * W), v0))
        s3 = vadd(s3, vsub(vload(x, j + 3 * W), v0))
        j += 4 * W
    while j < nv:
        s0 = vadd(s0, vsub(vload(x, j), v0))
        j += W
    if nt:
        for k in range(W):
            buf[k] = x[nv + k] if k < nt else x0
        s1 = vadd(s1, vsub(vload(buf, 0), v0))  # padded lanes: x0 - x0 = 0
    delta = hsum(vadd(vadd(s0, s1), vadd(s2, s3))) * inv_n
    vd = vsplat(x, delta)
    # pass 2: sums of d = y - delta and of d * d
    sd0, sd1, sd2, sd3 = zero, zero, zero, zero
    sq0, sq1, sq2, sq3 = zero, zero, zero, zero
    j = 0
    while j + 4 * W <= nv:
        d = vsub(vsub(vload(x, j), v0), vd)
        sd0 = vadd(sd0, d)
        sq0 = vfma(d, d, sq0)
        d = vsub(vsub(vload(x, j + W), v0), vd)
        sd1 = vadd(sd1, d)
        sq1 = vfma(d, d, sq1)
        d = vsub(vsub(vload(x, j + 2 * W), v0), vd)
        sd2 = vadd(sd2, d)
        sq2 = vfma(d, d, sq2)
        d = vsub(vsub(vload(x, j + 3 * W), v0), vd)
        sd3 = vadd(sd3, d)
        sq3 = vfma(d, d, sq3)
        j += 4 * W
    while j < nv:
        d = vsub(vsub(vload(x, j), v0), vd)
        sd0 = vadd(sd0, d)
        sq0 = vfma(d, d, sq0)
        j += W
    if nt:
        d = vmul(vsub(vsub(vload(buf, 0), v0), vd), vload(buf, W))
        sd1 = vadd(sd1, d)
        sq1 = vfma(d, d, sq1)
    sd = hsum(vadd(vadd(sd0, sd1), vadd(sd2, sd3)))
    sq = hsum(vadd(vadd(sq0, sq1), vadd(sq2, sq3)))
    delta = delta + sd * inv_n
    var = max((sq - sd * sd * inv_n) * inv_n, sd - sd)
    rstd = 1 / math.sqrt(var + e)
    vd = vsplat(x, delta)
    vr = vsplat(x, rstd)
    # pass 3: g ((y - delta) rstd) + b, each x[j] read before out[j] is written
    for j in range(0, nv, W):
        d = vmul(vsub(vsub(vload(x, j), v0), vd), vr)
        vstore(out, j, vfma(vload(g, j), d, vload(b, j)))
    if nt:
        d = vmul(vsub(vsub(vload(buf, 0), v0), vd), vr)
        vstore(buf, 0, vfma(vload(buf, 2 * W), d, vload(buf, 3 * W)))
        for k in range(nt):
            out[nv + k] = buf[k]


@numba.njit(nogil=True, cache=CACHE, fastmath=FASTMATH)
def _store(y, j, v, b, has_b, relu, residual, zero):
    """y[j : j + W] = (y[j : j + W] +) act(v (+ b[j : j + W])), act ReLU or none (NaN stays NaN)."""
    if has_b:
        v = vadd(v, vload(b, j))
    if relu:
        v = vmax(v, zero)
    if residual:
        v = vadd(v, vload(y, j))
    vstore(y, j, v)


@numba.njit(nogil=True, cache=CACHE, fastmath=FASTMATH)
def _cols(xin, k, wf, n, b, has_b, relu, residual, j0, j1, y):
    """y[j] = (y[j] +) act(xin[:k] . W[:, j] (+ b[j])) for j0 <= j < j1, W (k, n) row-major as wf
    (flat): eight registers of columns at a time down all k rows (eight accumulators: enough FMAs
    in flight to hide their latency), then single registers, then single columns."""
    W = vwidth(wf)
    zero = vsplat(wf, 0)
    j = j0
    while j + 8 * W <= j1:
        a0, a1, a2, a3, a4, a5, a6, a7 = zero, zero, zero, zero, zero, zero, zero, zero
        for i in range(k):
            xi = vsplat(wf, xin[i])
            o = i * n + j
            a0 = vfma(xi, vload(wf, o), a0)
            a1 = vfma(xi, vload(wf, o + W), a1)
            a2 = vfma(xi, vload(wf, o + 2 * W), a2)
            a3 = vfma(xi, vload(wf, o + 3 * W), a3)
            a4 = vfma(xi, vload(wf, o + 4 * W), a4)
            a5 = vfma(xi, vload(wf, o + 5 * W), a5)
            a6 = vfma(xi, vload(wf, o + 6 * W), a6)
            a7 = vfma(xi, vload(wf, o + 7 * W), a7)
        _store(y, j, a0, b, has_b, relu, residual, zero)
        _store(y, j + W, a1, b, has_b, relu, residual, zero)
        _store(y, j + 2 * W, a2, b, has_b, relu, residual, zero)
        _store(y, j + 3 * W, a3, b, has_b, relu, residual, zero)
        _store(y, j + 4 * W, a4, b, has_b, relu, residual, zero)
        _store(y, j + 5 * W, a5, b, has_b, relu, residual, zero)
        _store(y, j + 6 * W, a6, b, has_b, relu, residual, zero)
        _store(y, j + 7 * W, a7, b, has_b, relu, residual, zero)
        j += 8 * W
    while j + W <= j1:
        a0 = zero
        for i in range(k):
            a0 = vfma(vsplat(wf, xin[i]), vload(wf, i * n + j), a0)
        _store(y, j, a0, b, has_b, relu, residual, zero)
        j += W
    while j < j1:
        acc = np.float32(0)
        for i in range(k):
            acc += xin[i] * wf[i * n + j]
        if has_b:
            acc += b[j]
        if relu and acc < 0:
            acc = np.float32(0)
        y[j] = y[j] + acc if residual else acc
        j += 1


@numba.njit(parallel=True, nogil=True, cache=CACHE, fastmath=FASTMATH)
def _dense(xin, w, b, has_b, relu, residual, y, nthreads):
    """y[:n] = (y[:n] +) act(xin[:k] w (+ b)), w (k, n) row-major, act ReLU if relu: _cols over
    blocks of eight registers of columns, one contiguous run of blocks a thread. y may not be xin;
    b is not read unless has_b."""
    k, n = w.shape
    wf = w.reshape(-1)
    cols = 8 * vwidth(wf)
    tasks = (n + cols - 1) // cols
    for p in prange(nthreads):
        t0 = p * tasks // nthreads
        t1 = (p + 1) * tasks // nthreads
        if t0 < t1:
            _cols(xin, k, wf, n, b, has_b, relu, residual, t0 * cols, min(n, t1 * cols), y)


@numba.njit(nogil=True, cache=CACHE, fastmath=FASTMATH)
def block_layer(x, ln1_g, ln1_b, lnc_g, lnc_b, ln2_g, ln2_b, wqkv, wo, wcq, wco, w1, b1, w2, b2, K, V, Kr, Vr,
                pos, Km, Vm, keep, h, post_norm, has_cross, eps, qkv, a, hn, f, scores, nthreads):
    """One token through one of the listing's blocks, in place on x (d,): the module docstring's steps.
    Kr, Vr: read-only views of K and V (what the attention reads, as it reads Km and Vm: one compiled
    _attend); the other operands as the kernel contract's (silkattn._api), the scratch at least
    their sizes. The shapes are not checked here: driver.block_layer checks them."""
    d = x.shape[0]
    dh = d // h
    yes, no = pos >= 0, pos < 0  # True and False, not as literals: one signature of _dense
    buf = np.empty(4 * vwidth(x), x.dtype)
    src = x if post_norm else hn  # each sublayer's input row
    # self-attention
    if not post_norm:
        _layer_norm(x, ln1_g, ln1_b, eps, hn, buf)
    _dense(src, wqkv, b1, no, no, no, qkv, nthreads)
    for j in range(d):
        K[pos, j] = qkv[d + j]
        V[pos, j] = qkv[2 * d + j]
    _attend(qkv, Kr.reshape(-1), Vr.reshape(-1), dh, d, dh, pos + 1, h, 1, keep, no, scores, a, nthreads)
    _dense(a, wo, b1, no, no, yes, x, nthreads)
    if post_norm:
        _layer_norm(x, ln1_g, ln1_b, eps, x, buf)
    # cross-attention over the encoder's keys and values
    if has_cross:
        if not post_norm:
            _layer_norm(x, lnc_g, lnc_b, eps, hn, buf)
        _dense(src, wcq, b1, no, no, no, qkv, nthreads)
        _attend(qkv, Km.reshape(-1), Vm.reshape(-1), dh, d, dh, Km.shape[0], h, 1, keep, yes, scores, a,
                nthreads)
        _dense(a, wco, b1, no, no, yes, x, nthreads)
        if post_norm:
            _layer_norm(x, lnc_g, lnc_b, eps, x, buf)
    # feed-forward
    if not post_norm:
        _layer_norm(x, ln2_g, ln2_b, eps, hn, buf)
    _dense(src, w1, b1, yes, yes, no, f, nthreads)
    _dense(f, w2, b2, yes, no, yes, x, nthreads)
    if post_norm:
        _layer_norm(x, ln2_g, ln2_b, eps, x, buf)
