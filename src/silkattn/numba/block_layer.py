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

The products are _dense: x (k,) times a float32 (k, n) row-major W read in place, each thread
streaming a contiguous share of W's rows forward into a partial result of its own (linear.py's
linear_rows for one row: four rows of W a pass over the partial row), then the threads adding the
partials up by columns, the bias, ReLU and residual add applied as each output is stored (each
x[j] read just before it is overwritten, so x may be the residual and the output): the order of
kernels/layer_step.h's sa_layer_product. (A block of columns down all k rows would jump a row's
length, a page apart, at every step: past the hardware prefetchers.) The norms are
layer_norm_rows's arithmetic for one row (its shift by x[0], corrected two-pass variance), the
attention llama_layer.py's _attend with the cache's head and row strides and the keep mask.

Numba's on-disk cache only tracks the file a function is defined in: after editing llama_layer.py,
linear.py or _simd.py, delete src/silkattn/numba/__pycache__/*.nb[ic] or block_layer may load stale
machine code.
"""

import numba
import numpy as np
from numba import prange

from ._simd import CACHE, FASTMATH, vadd, vload, vmax, vsplat, vstore, vwidth
from .layer_norm import layer_norm_row
from .linear import linear_rows
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
    layer_norm_row(x, 0, g, b, inv_n, e, buf, out, 0, W, nv, nt, vsplat(x, 0))


@numba.njit(nogil=True, cache=CACHE, fastmath=FASTMATH)
def _sum_parts(parts, T, n, b, has_b, relu, residual, j0, j1, y):
    """y[j] = (y[j] +) act((b[j] +) sum_t parts[t n + j]) for j0 <= j < j1: the T threads' partial
    products added up (kernels' sa_sum_parts: the bias first, then the shares in thread order), act
    ReLU or none (NaN stays NaN); each y[j] read just before it is written, so y may be the residual."""
    W = vwidth(parts)
    zero = vsplat(parts, 0)
    j = j0
    while j + W <= j1:
        v = vload(b, j) if has_b else zero
        for t in range(T):
            v = vadd(v, vload(parts, t * n + j))
        if relu:
            v = vmax(v, zero)
        if residual:
            v = vadd(v, vload(y, j))
        vstore(y, j, v)
        j += W
    while j < j1:
        acc = b[j] if has_b else np.float32(0)
        for t in range(T):
            acc += parts[t * n + j]
        if relu and acc < 0:
            acc = np.float32(0)
        y[j] = y[j] + acc if residual else acc
        j += 1


@numba.njit(parallel=True, nogil=True, cache=CACHE, fastmath=FASTMATH)
def _dense(xin, w, b, has_b, relu, residual, y, parts, nthreads):
    """y[:n] = (y[:n] +) act(xin[:k] w (+ b)), w (k, n) row-major, act ReLU if relu: linear_rows
    (linear.py) for one row gives each of T threads a contiguous share of w's rows, streamed forward
    into a partial result of its own (parts[t n : (t + 1) n]), then _sum_parts adds them up, one
    contiguous run of registers of columns a thread. parts: at least nthreads n floats. y may not
    be xin; b is not read unless has_b."""
    k, n = w.shape
    T = max(1, min(nthreads, k // 64))  # a thread's share of w: at least 64 rows (as driver.linear)
    linear_rows(xin[:k].reshape((1, k)), w, parts[:T * n].reshape((T, 1, n)))
    W = vwidth(w)
    regs = (n + W - 1) // W
    for p in prange(nthreads):
        j0 = p * regs // nthreads * W
        j1 = min(n, (p + 1) * regs // nthreads * W)
        if j0 < j1:
            _sum_parts(parts, T, n, b, has_b, relu, residual, j0, j1, y)


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
    parts = np.empty(nthreads * max(3 * d, w1.shape[1]), x.dtype)  # the products' partial results
    src = x if post_norm else hn  # each sublayer's input row
    # self-attention
    if not post_norm:
        _layer_norm(x, ln1_g, ln1_b, eps, hn, buf)
    _dense(src, wqkv, b1, no, no, no, qkv, parts, nthreads)
    for j in range(d):
        K[pos, j] = qkv[d + j]
        V[pos, j] = qkv[2 * d + j]
    _attend(qkv, Kr.reshape(-1), Vr.reshape(-1), dh, d, dh, pos + 1, h, 1, keep, no, scores, a, nthreads)
    _dense(a, wo, b1, no, no, yes, x, parts, nthreads)
    if post_norm:
        _layer_norm(x, ln1_g, ln1_b, eps, x, buf)
    # cross-attention over the encoder's keys and values
    if has_cross:
        if not post_norm:
            _layer_norm(x, lnc_g, lnc_b, eps, hn, buf)
        _dense(src, wcq, b1, no, no, no, qkv, parts, nthreads)
        _attend(qkv, Km.reshape(-1), Vm.reshape(-1), dh, d, dh, Km.shape[0], h, 1, keep, yes, scores, a,
                nthreads)
        _dense(a, wco, b1, no, no, yes, x, parts, nthreads)
        if post_norm:
            _layer_norm(x, lnc_g, lnc_b, eps, x, buf)
    # feed-forward
    if not post_norm:
        _layer_norm(x, ln2_g, ln2_b, eps, hn, buf)
    _dense(src, w1, b1, yes, yes, no, f, parts, nthreads)
    _dense(f, w2, b2, yes, no, yes, x, parts, nthreads)
    if post_norm:
        _layer_norm(x, ln2_g, ln2_b, eps, x, buf)
