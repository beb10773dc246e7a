"""Numba layer_step: one token through one decoder layer in one compiled call (the kernel contract's
layer_step, silkattn._api; kernels/layer_step.h is its C twin), so that a decoding step costs one
Python call a layer instead of a dozen ops' bookkeeping. The record is silkattn._step.LayerStep
(its docstring gives the arithmetic), handed over by driver.layer_step as nested plain tuples in the
field order of Step below and named on entry (_named): every helper reads it by field.

One kernel for every kind of layer silkattn's models have, its stages the unfused ops' arithmetic:
the norms rms_norm_rows's (_rms_norm) and layer_norm_rows's for one row (_layer_norm, the same
operations in the same order); the rotary rope_rows's (no FMA contraction); the gate silu_mul's;
the products, by their weights' type (_product, chosen when Numba types the record): GGUF blocks
through linear_q_rows (linear_q.py) for one row, the residual add as its bias (each x[j] is read
just before it is overwritten, so x may be both), the rows given read-only (driver.layer_step adds
read-only views of x and the scratch) so that the layer calls linear_q_rows at the signature
driver.linear_q compiles, sharing its compiled code; float32 (k, n) matrices through _dense, each
thread streaming a contiguous share of W's rows forward into a partial result of its own
(linear.py's linear_rows), then the threads adding the partials up by columns, the bias, ReLU and
residual add applied as each output is stored (kernels/layer_step.h's sa_layer_product; a block of
columns down all k rows would jump a row's length, a page apart, at every step: past the hardware
prefetchers). The attention is this file's own (_attend: parallel over the query heads, any head
and row strides of the cache, an optional keep mask).
"""
import math
from collections import namedtuple

import numpy as np
from numba import prange, types
from numba.extending import overload

from ._jit import jit
from ._simd import (
    CACHE,
    FASTMATH,
    hmax,
    hsum,
    vadd,
    vbcast,
    vexp,
    vfma,
    vget,
    vload,
    vmax,
    vmul,
    vsplat,
    vstore,
    vsub,
    vsum4,
    vwidth,
)
from .layer_norm import layer_norm_row
from .linear import linear_rows
from .linear_q import Q4_K, ROW_KINDS, _round_q8, linear_q8_rows, linear_q_rows, linear_qx_rows
from .silu_mul import _gate as _gate_register

# The record (silkattn._step.LayerStep), as the kernel reads it. A norm: g, and b (empty: RMSNorm).
# A product: w (float32 (k, n), or the blocks (n, bytes) of `kind`), b (empty: none), its sizes;
# qkv and up: a tuple of 1 to 3 (2) such products, their outputs side by side, left as plain tuples
# (a part is named where it is multiplied), as is cross_q (a part of one).
# The cache: kv, its K and V flat (head g's row t at g head_stride + t row_stride) as (K, V, Kr, Vr,
# Kh, Vh, Khr, Vhr): a float32 cache's K and V, writable and read-only (the attention reads the
# latter, as it reads the memory: one compiled _attend), or a float16 cache's uint16 bits (Kh, ...);
# the other dtype's four empty, so that both kinds of cache have one type (one compiled step). wide:
# (Kw, Vw, Kwr, Vwr), float32 room for a float16 cache's rows widened (empty for float32). The memory
# (cross-attention): its keys, values and keep mask. The scratch: the step's buffers, read-only
# views of those the products read. parts_n: the widest dense product's n (its partial results).
Norm = namedtuple("Norm", ["g", "b"])
Product = namedtuple("Product", ["w", "b", "kind", "k", "n"])
Cache = namedtuple("Cache", ["kv", "wide", "head_stride", "row_stride"])
Memory = namedtuple("Memory", ["K", "V", "keep", "n"])
Scratch = namedtuple("Scratch", ["qkv", "a", "ar", "hn", "hnr", "f", "fr", "scores"])
Step = namedtuple("Step", ["d", "h", "h_kv", "dh", "eps", "post_norm", "gate", "q8", "has_cross",
                           "norm1", "qkv", "o", "norm2", "up", "down", "norm_cross", "cross_q", "cross_o",
                           "cache", "memory", "cos", "sin", "scratch", "parts_n", "q_norm", "k_norm",
                           "post1", "post2", "scale"])


@jit(inline="always")
def _named(t):
    """The record from its plain nested tuples."""
    return Step(*t[:9], Norm(*t[9]), t[10], Product(*t[11]), Norm(*t[12]), t[13],
                Product(*t[14]), Norm(*t[15]), t[16], Product(*t[17]), Cache(*t[18]),
                Memory(*t[19]), t[20], t[21], Scratch(*t[22]), t[23], Norm(*t[24]), Norm(*t[25]),
                Norm(*t[26]), Norm(*t[27]), t[28])


@jit(cache=CACHE, fastmath=FASTMATH)
def _rms_norm(x, g, eps, out):
    """out[:d] = g x / sqrt(mean(x^2) + eps), d = len(x): rms_norm_rows's arithmetic (four partial
    sums of squares, the mean and its sum with eps in float32), the tail of x that is not a whole
    register (none when d is a multiple of 32: the products' k) summed last, one at a time."""
    d = x.shape[0]
    W = vwidth(x)
    nv = d - d % W
    q0 = vsplat(x, 0)
    q1, q2, q3 = q0, q0, q0
    j = 0
    while j + 4 * W <= nv:
        v = vload(x, j)
        q0 = vfma(v, v, q0)
        v = vload(x, j + W)
        q1 = vfma(v, v, q1)
        v = vload(x, j + 2 * W)
        q2 = vfma(v, v, q2)
        v = vload(x, j + 3 * W)
        q3 = vfma(v, v, q3)
        j += 4 * W
    while j < nv:
        v = vload(x, j)
        q0 = vfma(v, v, q0)
        j += W
    s = hsum(vadd(vadd(q0, q1), vadd(q2, q3)))
    for j in range(nv, d):
        s += x[j] * x[j]
    ms = s / np.float32(d)
    rstd = 1 / math.sqrt(ms + np.float32(eps))
    vr = vsplat(x, rstd)
    for j in range(0, nv, W):
        vstore(out, j, vmul(vmul(vload(x, j), vr), vload(g, j)))
    r = np.float32(rstd)
    for j in range(nv, d):
        out[j] = x[j] * r * g[j]


# No fastmath: not even 'contract' (as rope_rows): x c - y s rounds each product as NumPy does. Said
# explicitly: a function that leaves fastmath unset inherits its caller's (Numba's flags), and
# _heads' 'contract' made x c - y s one FMA here, the step's Q and K a bit off the ops' rope.
@jit(cache=CACHE, fastmath=False)
def _rope(qkv, heads, dh, cos, sin):
    """The rotary embedding in place on the first `heads` heads (dh long) of qkv: (x_i, x_(i+h)) ->
    (x_i c_i - x_(i+h) s_i, x_(i+h) c_i + x_i s_i) for i < h = dh / 2."""
    half = dh // 2
    W = vwidth(qkv)
    hv = half - half % W
    for j in range(heads):
        xb = j * dh
        for i in range(0, hv, W):
            a = vload(qkv, xb + i)
            b = vload(qkv, xb + half + i)
            c = vload(cos, i)
            s = vload(sin, i)
            vstore(qkv, xb + i, vsub(vmul(a, c), vmul(b, s)))
            vstore(qkv, xb + half + i, vadd(vmul(b, c), vmul(a, s)))
        for i in range(hv, half):
            a = qkv[xb + i]
            b = qkv[xb + half + i]
            qkv[xb + i] = a * cos[i] - b * sin[i]
            qkv[xb + half + i] = b * cos[i] + a * sin[i]


@jit(inline="always", fastmath=FASTMATH)
def _head_scores(qkv, qo, kf, ko, ld, dh, n, scale, sf, so):
    """sf[so + t] = q . K_t scale for t < n: four keys at a time, two registers of d_head a step in
    eight partial sums, the four keys' summed at once (vsum4); the part of d_head that is not a
    whole register one value at a time."""
    W = vwidth(qkv)
    dv = dh - dh % W
    d2 = dv - dv % (2 * W)  # the registers of d_head taken in pairs
    zero = vsplat(qkv, 0)
    t = 0
    while t + 4 <= n:
        k0 = ko + t * ld
        k1 = k0 + ld
        k2 = k1 + ld
        k3 = k2 + ld
        s0, s1, s2, s3 = zero, zero, zero, zero
        u0, u1, u2, u3 = zero, zero, zero, zero
        for c in range(0, d2, 2 * W):
            q = vload(qkv, qo + c)
            p = vload(qkv, qo + c + W)
            s0 = vfma(q, vload(kf, k0 + c), s0)
            u0 = vfma(p, vload(kf, k0 + c + W), u0)
            s1 = vfma(q, vload(kf, k1 + c), s1)
            u1 = vfma(p, vload(kf, k1 + c + W), u1)
            s2 = vfma(q, vload(kf, k2 + c), s2)
            u2 = vfma(p, vload(kf, k2 + c + W), u2)
            s3 = vfma(q, vload(kf, k3 + c), s3)
            u3 = vfma(p, vload(kf, k3 + c + W), u3)
        if d2 < dv:
            q = vload(qkv, qo + d2)
            s0 = vfma(q, vload(kf, k0 + d2), s0)
            s1 = vfma(q, vload(kf, k1 + d2), s1)
            s2 = vfma(q, vload(kf, k2 + d2), s2)
            s3 = vfma(q, vload(kf, k3 + d2), s3)
        s = vsum4(vadd(s0, u0), vadd(s1, u1), vadd(s2, u2), vadd(s3, u3))
        for u in range(4):
            y = vget(s, u)
            for c in range(dv, dh):
                y += qkv[qo + c] * kf[k0 + u * ld + c]
            sf[so + t + u] = y * scale
        t += 4
    while t < n:
        k0 = ko + t * ld
        s0 = zero
        for c in range(0, dv, W):
            s0 = vfma(vload(qkv, qo + c), vload(kf, k0 + c), s0)
        y = hsum(s0)
        for c in range(dv, dh):
            y += qkv[qo + c] * kf[k0 + c]
        sf[so + t] = y * scale
        t += 1


@jit(inline="always", fastmath=FASTMATH)
def _head_exp(sf, so, n, buf):
    """sf[so + t] = exp(s_t - max_t s_t) for t < n; returns 1 / sum_t of them. A register at a time
    (vexp); the last, partial register through buf, its padding -inf, so exp 0."""
    W = vwidth(sf)
    nv = n - n % W
    for u in range(W):  # the scores' last partial register, padded with -inf
        buf[u] = sf[so + nv + u] if nv + u < n else -np.inf
    m = vload(buf, 0)
    for t in range(0, nv, W):
        m = vmax(m, vload(sf, so + t))
    vm = vsplat(sf, hmax(m))
    total = vexp(vsub(vload(buf, 0), vm))
    vstore(buf, 0, total)
    for u in range(n - nv):
        sf[so + nv + u] = buf[u]
    for t in range(0, nv, W):
        e = vexp(vsub(vload(sf, so + t), vm))
        vstore(sf, so + t, e)
        total = vadd(total, e)
    return 1 / hsum(total)


@jit(inline="always", fastmath=FASTMATH)
def _head_pv(sf, so, vf, ko, ld, dh, n, inv, a, ao):
    """a[ao : ao + dh] = inv sum_t sf[so + t] V_t: two registers of d_head at a time over four keys
    a step (eight partial sums); the part of d_head that is not a whole register one value a time."""
    W = vwidth(sf)
    dv = dh - dh % W
    zero = vsplat(sf, 0)
    vinv = vsplat(sf, inv)
    for c in range(0, dv, 2 * W):
        two = c + W < dv  # a pair of registers of d_head, else the last one alone
        a0, a1, a2, a3 = zero, zero, zero, zero
        b0, b1, b2, b3 = zero, zero, zero, zero
        t = 0
        if two:
            while t + 4 <= n:
                v0 = ko + t * ld + c
                p0, p1 = vbcast(sf, so + t), vbcast(sf, so + t + 1)
                p2, p3 = vbcast(sf, so + t + 2), vbcast(sf, so + t + 3)
                a0 = vfma(p0, vload(vf, v0), a0)
                b0 = vfma(p0, vload(vf, v0 + W), b0)
                a1 = vfma(p1, vload(vf, v0 + ld), a1)
                b1 = vfma(p1, vload(vf, v0 + ld + W), b1)
                a2 = vfma(p2, vload(vf, v0 + 2 * ld), a2)
                b2 = vfma(p2, vload(vf, v0 + 2 * ld + W), b2)
                a3 = vfma(p3, vload(vf, v0 + 3 * ld), a3)
                b3 = vfma(p3, vload(vf, v0 + 3 * ld + W), b3)
                t += 4
            while t < n:
                p0 = vbcast(sf, so + t)
                a0 = vfma(p0, vload(vf, ko + t * ld + c), a0)
                b0 = vfma(p0, vload(vf, ko + t * ld + c + W), b0)
                t += 1
            vstore(a, ao + c + W, vmul(vadd(vadd(b0, b1), vadd(b2, b3)), vinv))
        else:
            while t + 4 <= n:
                v0 = ko + t * ld + c
                a0 = vfma(vbcast(sf, so + t), vload(vf, v0), a0)
                a1 = vfma(vbcast(sf, so + t + 1), vload(vf, v0 + ld), a1)
                a2 = vfma(vbcast(sf, so + t + 2), vload(vf, v0 + 2 * ld), a2)
                a3 = vfma(vbcast(sf, so + t + 3), vload(vf, v0 + 3 * ld), a3)
                t += 4
            while t < n:
                a0 = vfma(vbcast(sf, so + t), vload(vf, ko + t * ld + c), a0)
                t += 1
        vstore(a, ao + c, vmul(vadd(vadd(a0, a1), vadd(a2, a3)), vinv))
    r = vget(vinv, 0)
    for c in range(dv, dh):
        y = np.float32(0)
        for t in range(n):
            y += sf[so + t] * vf[ko + t * ld + c]
        a[ao + c] = y * r


@jit(cache=CACHE, fastmath=FASTMATH)
def _gate(gu, dff, out, gelu):
    """out[:dff] = act(gu[:dff]) gu[dff:], act silu or (gelu) the tanh GELU: gate_rows's arithmetic
    (silu_mul.py) a register at a time, the tail that is not a whole register (none when dff is a
    multiple of 32: W_d's k) one value at a time (math.exp)."""
    W = vwidth(gu)
    nv = dff - dff % W
    one = vsplat(gu, 1)
    top = vsplat(gu, 88.0)
    inf = vsplat(gu, np.inf)
    for j in range(0, nv, W):
        vstore(out, j, _gate_register(vload(gu, j), vload(gu, dff + j), one, top, inf, gelu))
    for j in range(nv, dff):
        g = gu[j]
        v = -1.5957691216057308 * (g + 0.044715 * g * g * g) if gelu else -g
        out[j] = g / (1 + math.exp(min(v, 88.0))) * gu[dff + j]


@jit(cache=CACHE, fastmath=FASTMATH)
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
    layer_norm_row(x, 0, g, b, inv_n, e, buf, out, 0)


@jit(cache=CACHE, fastmath=FASTMATH)
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


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
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


@jit(cache=CACHE, fastmath=FASTMATH)
def _head(qkv, kf, vf, keep, sf, a, buf, at, geom, masked, scale):
    """One query head (qkv[qo : qo + dh]) over the n rows of its K/V head (kf and vf from element ko,
    rows ld apart), at = (qo, ko, so, ao), geom = (ld, dh, n): sf[so + t] = exp(s_t - max) for
    t < n, s_t = q . K_t scale, or exactly -1e9 where masked and keep[t] == 0 (the reference's
    hidden key: a row with every key hidden averages them all); a[ao : ao + dh] = sum_t sf[so + t]
    V_t / sum_t sf[so + t]; buf: a register of scratch. A function of its own, not prange's body:
    the register's lanes are a constant here."""
    qo, ko, so, ao = at
    ld, dh, n = geom
    _head_scores(qkv, qo, kf, ko, ld, dh, n, scale, sf, so)
    if masked:
        for t in range(n):
            if keep[t] == 0:
                sf[so + t] = -1e9
    inv = _head_exp(sf, so, n, buf)
    _head_pv(sf, so, vf, ko, ld, dh, n, inv, a, ao)


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def _attend(qkv, kv, geom, keep, masked, scores, a, scale, nthreads):
    """a[j dh : (j + 1) dh] = softmax_t(q_j . K_g[t] scale) V_g over t < n for each query head j
    (q_j = qkv[j dh : (j + 1) dh]) and its K/V head g = j // group, with kv = (kf, vf) and geom =
    (head_stride, ld, dh, n, h, group): K_g[t] = kf[g head_stride + t ld:][:dh], V_g[t] likewise in
    vf (a Llama cache (h_kv, capacity, dh): head_stride capacity dh, ld dh; the listing's (capacity,
    d), heads side by side: head_stride dh, ld d). keep, masked: _head's. scores (h, >= n): a head's
    row of exp. One block of heads a thread, each with its buffer."""
    kf, vf = kv
    head_stride, ld, dh, n, h, group = geom
    ls = scores.shape[1]
    sf = scores.reshape(-1)
    buf_all = np.empty((nthreads, vwidth(qkv)), qkv.dtype)
    for p in prange(nthreads):
        buf = buf_all[p]
        for j in range(p * h // nthreads, (p + 1) * h // nthreads):
            at = (j * dh, (j // group) * head_stride, j * ls, j * dh)  # q, K/V head, scores, a
            _head(qkv, kf, vf, keep, sf, a, buf, at, (ld, dh, n), masked, scale)


def _blocks(q8, x, w, kind, b, has_bias, out, nthreads):  # linear_q_rows, or with q8 linear_q8_rows
    if q8:
        linear_q8_rows(x, w, kind, b, has_bias, out, nthreads)
    else:
        linear_q_rows(x, w, kind, b, has_bias, out, nthreads)


_blocks = jit(cache=CACHE, fastmath=FASTMATH)(_blocks)


def _product(M, xin, xr, rr, residual, relu, y, parts, q8, nthreads):
    """y[:n] = (y +) act(xin[:k] W (+ b)) for the product M (act ReLU if relu; residual: the residual
    row y added): blocks through _blocks, their input xr (a read-only view of xin) and the residual
    as the bias, read through rr (a read-only view of y); float32 through _dense. Plain Python
    (NUMBA_DISABLE_JIT); compiled, the overload below picks the branch by M's weights' type. The
    flags come in as values, never literals: linear_q_rows and _dense keep one signature."""
    if M.w.dtype == np.uint8:
        _product_blocks(M, xr, rr, residual, y, q8, nthreads)
        if relu:
            _relu(y, M.n)
    else:
        _dense(xin, M.w, M.b, M.b.size > 0, relu, residual, y, parts, nthreads)


@overload(_product, inline="always")
def _product_typed(M, xin, xr, rr, residual, relu, y, parts, q8, nthreads):
    if M.types[0].dtype == types.uint8:
        def blocks(M, xin, xr, rr, residual, relu, y, parts, q8, nthreads):
            _product_blocks(M, xr, rr, residual, y, q8, nthreads)
            if relu:
                _relu(y, M.n)
        return blocks

    def dense(M, xin, xr, rr, residual, relu, y, parts, q8, nthreads):
        _dense(xin, M.w, M.b, M.b.size > 0, relu, residual, y, parts, nthreads)
    return dense


@jit(cache=CACHE)
def _relu(y, n):  # y[:n] = max(y, 0), NaN staying NaN
    for j in range(n):
        if y[j] < 0:
            y[j] = 0


@jit(inline="always")
def _product_blocks(M, xr, rr, residual, y, q8, nthreads):
    """The block product of _product: the row xr[:k] (read-only) times M, plus the residual (rr) if
    residual, else M's bias if it has one. The kinds after the row kernels' (Q5_0 .. Q6_K) through
    linear_qx_rows, with q8 on the row rounded first (driver.linear_qx's arithmetic)."""
    if residual:
        _blocks_any(M, xr, rr, residual, y, q8, nthreads)
    else:
        _blocks_any(M, xr, M.b, M.b.size > 0, y, q8, nthreads)


@jit(cache=CACHE, fastmath=FASTMATH)
def _blocks_any(M, xr, b, has_b, y, q8, nthreads):  # _product_blocks with its bias b chosen
    k, n = M.k, M.n
    if M.kind < ROW_KINDS:
        _blocks(q8, xr[:k].reshape(1, k), M.w, M.kind, b, has_b, y[:n].reshape(1, n), nthreads)
    elif q8:
        rounded = np.empty(k, xr.dtype)
        _round_q8(xr, 1, k, rounded, 256 if M.kind >= Q4_K else 32)
        linear_qx_rows(rounded.reshape(1, k), M.w, M.kind, b, has_b, y[:n].reshape(1, n), nthreads)
    else:
        linear_qx_rows(xr[:k].reshape(1, k), M.w, M.kind, b, has_b, y[:n].reshape(1, n), nthreads)


@jit(inline="always")
def _parts(Ps, xin, xr, relu, y, parts, q8, nthreads):
    """y = act(xin [W_0 | W_1 | ...] (+ b)) for the parts Ps (plain product tuples of one weights'
    type), their outputs side by side in y; no residual."""
    no = relu and not relu
    off = 0
    for i in range(len(Ps)):
        M = Product(*Ps[i])
        _product(M, xin, xr, xr, no, relu, y[off:], parts, q8, nthreads)
        off += M.n


@jit(inline="always")
def _norm(N, x, eps, out, buf):
    """out = the norm N of the row x (LayerNorm, or RMSNorm where N.b is empty); out may be x."""
    if N.b.size == 0:
        _rms_norm(x, N.g, eps, out)
    else:
        _layer_norm(x, N.g, N.b, eps, out, buf)


@jit(inline="always")
def _add_normed(L, post, y, x):
    """x += rms_norm(y) (a sandwich norm's output added to the residual), y[:d] normed in place."""
    d = L.d
    _rms_norm(y[:d], post.g, L.eps, y)
    for j in range(d):
        x[j] += y[j]


@jit(inline="always")
def _out(L, Wo, xin, xr, x, rx, post, y, yes, no, parts, nthreads):
    """A sublayer's output product: x += xin Wo, or with a sandwich norm (post.g not empty) x +=
    rms_norm(xin Wo), the product then into y (scratch of d, not xin); rx: x's read-only view."""
    if post.g.size:
        _product(Wo, xin, xr, rx, no, no, y, parts, L.q8, nthreads)
        _add_normed(L, post, y, x)
    else:
        _product(Wo, xin, xr, rx, yes, no, x, parts, L.q8, nthreads)


@jit(cache=CACHE, fastmath=FASTMATH)
def _heads_at(L, qkv, kv, at, cos, sin, i):
    """A token's Q and K heads in qkv normed (QK-norm: an RMSNorm a head) and turned (rotary: row i
    of the tables cos, sin; none where they are empty), its K and V heads written to the cache row
    whose head 0 starts at element `at` of kv's K and V (a float16 cache's: rounded to its bits).
    Both steps' (layer_step's, layer_step_rows')."""
    h, h_kv, dh = L.h, L.h_kv, L.dh
    K, V, _, _, Kh, Vh, _, _ = kv
    if L.q_norm.g.size:
        for u in range(h + h_kv):
            head = qkv[u * dh:(u + 1) * dh]
            _rms_norm(head, L.q_norm.g if u < h else L.k_norm.g, L.eps, head)
    if cos.size:
        _rope(qkv, h + h_kv, dh, cos[i], sin[i])
    for g in range(h_kv):
        kb, vb = (h + g) * dh, (h + h_kv + g) * dh
        o = at + g * L.cache.head_stride
        if Kh.size:
            _round_half(qkv, kb, Kh, o, dh)
            _round_half(qkv, vb, Vh, o, dh)
        else:
            for j in range(dh):
                K[o + j] = qkv[kb + j]
                V[o + j] = qkv[vb + j]


# ---- A float16 cache (half the bytes), as its uint16 bits (Numba has no float16 on the CPU): each
# row rounded to nearest even as it is written (numpy's astype(float16), F16C's vcvtps2ph:
# kernels/quant_ext.h's sa_f16_round, the same integer operations) and widened exactly into float32
# rows before the attention reads them (_cache_rows).

@jit(cache=CACHE)
def _round_half(x, xo, C, at, n):
    """C[at : at + n] = the float16 bits of x[xo : xo + n] (float32), rounded to nearest even."""
    u = x.view(np.uint32)
    for j in range(n):
        b = np.int64(u[xo + j])
        sign, a = (b >> 16) & 0x8000, b & 0x7FFFFFFF
        if a >= 0x7F800000:  # inf, or NaN (quiet, its payload's top bits)
            r = 0x7C00 | ((0x200 | ((a >> 13) & 0x3FF)) if a > 0x7F800000 else 0)
        elif a >= 0x477FF000:  # 65520 and up: inf
            r = 0x7C00
        elif a >= 0x38800000:  # normal: round at bit 13, ties to even, the exponent rebiased
            r = ((a + 0xFFF + ((a >> 13) & 1)) >> 13) - (112 << 10)
        elif a <= 0x33000000:  # 2^-25 and below: zero
            r = 0
        else:  # subnormal: m 2^-s units of 2^-24
            s, m = 126 - (a >> 23), (a & 0x7FFFFF) | 0x800000
            q, rest, half = m >> s, m & ((1 << s) - 1), 1 << (s - 1)
            r = q + (1 if rest > half or (rest == half and q & 1) else 0)
        C[at + j] = sign | r


@jit(cache=CACHE)
def _widen_half(C, at, out, oo, n):
    """out[oo : oo + n] = the float16 bits C[at : at + n] as float32, exactly."""
    w = out.view(np.uint32)
    for j in range(n):
        b = np.int64(C[at + j])
        e, f = (b >> 10) & 31, b & 1023
        if e == 31:
            w[oo + j] = ((b & 0x8000) << 16) | 0x7F800000 | (f << 13)
        elif e:
            w[oo + j] = ((b & 0x8000) << 16) | ((e + 112) << 23) | (f << 13)
        else:  # zero or subnormal: f 2^-24, exact
            v = np.float32(f) * np.float32(2.0 ** -24)
            out[oo + j] = -v if b & 0x8000 else v


@jit(cache=CACHE)
def _cache_rows(kv, wide, first, geom):  # -> (kf, vf), geom: what _attend reads of the cache's rows
    """The n rows of each K/V head from element `first` of kv's K and V (geom: _attend's): a
    float32 cache's own, read-only; a float16 one's widened into wide's room, heads n dh apart."""
    _, _, Kr, Vr, _, _, Khr, Vhr = kv
    Kw, Vw, Kwr, Vwr = wide
    head_stride, ld, dh, n, h, group = geom
    if not Khr.size:
        return (Kr[first:], Vr[first:]), geom
    for g in range(h // group):
        for t in range(n):
            _widen_half(Khr, first + g * head_stride + t * ld, Kw, (g * n + t) * dh, dh)
            _widen_half(Vhr, first + g * head_stride + t * ld, Vw, (g * n + t) * dh, dh)
    return (Kwr[0:], Vwr[0:]), (n * dh, dh, dh, n, h, group)


@jit(cache=CACHE, fastmath=FASTMATH)
def _attention_sublayer(L, N, Wq, Wo, x, xr, pos, keys, cross, buf, parts, nthreads):
    """The self-attention sublayer of record L (cross: the cross-attention's), its norm N and
    products Wq (plain part tuples), Wo, on the row x (xr its read-only view), this token at
    position pos, keys = (its cache row, the first row it sees, the rows it sees). The order of
    kernels/layer_step.h's sa_layer_attention: norm (pre-norm), Q|K|V (Q alone for cross), QK-norm
    and rotary on the Q and K heads, this token's K and V to the cache, each head's attention,
    output product (its sandwich norm) and residual, norm (post-norm)."""
    yes, no = pos >= 0, pos < 0  # True and False, not as literals: the products' one signature
    S = L.scratch
    h, h_kv, dh = L.h, L.h_kv, L.dh
    scale = np.float32(L.scale)
    if not L.post_norm:
        _norm(N, x, L.eps, S.hn, buf)
        _parts(Wq, S.hn, S.hnr, no, S.qkv, parts, L.q8, nthreads)
    else:
        _parts(Wq, x, xr, no, S.qkv, parts, L.q8, nthreads)
    if cross:
        M = L.memory
        _attend(S.qkv, (M.K, M.V), (dh, L.d, dh, M.n, h, 1), M.keep, yes, S.scores, S.a, scale, nthreads)
        _out(L, Wo, S.a, S.ar, x, xr, Norm(S.ar[:0], S.ar[:0]), S.hn, yes, no, parts, nthreads)
    else:
        C = L.cache
        row, key0, nkeys = keys
        _heads_at(L, S.qkv, C.kv, row * C.row_stride, L.cos, L.sin, pos)
        geom = (C.head_stride, C.row_stride, dh, nkeys, h, h // h_kv)
        kv, geom = _cache_rows(C.kv, C.wide, key0 * C.row_stride, geom)
        _attend(S.qkv, kv, geom, L.memory.keep, no, S.scores, S.a, scale, nthreads)
        _out(L, Wo, S.a, S.ar, x, xr, L.post1, S.hn, yes, no, parts, nthreads)
    if L.post_norm:
        _norm(N, x, L.eps, x, buf)


@jit(cache=CACHE, fastmath=FASTMATH)
def _feed_forward(L, x, xr, yes, no, buf, parts, nthreads):
    """The feed-forward sublayer of record L on the row x: norm (pre-norm); up's product (relu: with
    its bias and ReLU into f; gated: gate | up into f, then act(gate) up into hn); down's product
    with its bias and the residual (a sandwich norm's product into the buffer down does not read);
    norm (post-norm)."""
    S = L.scratch
    gated = L.gate != 0
    relu = no if gated else yes
    if not L.post_norm:
        _norm(L.norm2, x, L.eps, S.hn, buf)
        _parts(L.up, S.hn, S.hnr, relu, S.f, parts, L.q8, nthreads)
    else:
        _parts(L.up, x, xr, relu, S.f, parts, L.q8, nthreads)
    if gated:
        _gate(S.f, L.down.k, S.hn, L.gate == 2)
        _out(L, L.down, S.hn, S.hnr, x, xr, L.post2, S.f, yes, no, parts, nthreads)
    else:
        _out(L, L.down, S.f, S.fr, x, xr, L.post2, S.hn, yes, no, parts, nthreads)
    if L.post_norm:
        _norm(L.norm2, x, L.eps, x, buf)


@jit(cache=CACHE, fastmath=FASTMATH)
def layer_step(t, x, xr, pos, keys, nthreads):
    """One token at position pos through one layer, in place on x (d,): the record t (Step's fields,
    as plain nested tuples; silkattn._step.LayerStep), xr a read-only view of x, keys the record's
    keys(pos). The record is trusted: silkattn._api checked it when it was built, x and pos at the
    call."""
    L = _named(t)
    yes, no = pos >= 0, pos < 0  # True and False, not as literals: the products' one signature
    buf = np.empty(4 * vwidth(x), x.dtype)
    parts = np.empty(nthreads * L.parts_n, x.dtype)  # the dense products' partial results
    _attention_sublayer(L, L.norm1, L.qkv, L.o, x, xr, pos, keys, no, buf, parts, nthreads)
    if L.has_cross:
        _attention_sublayer(L, L.norm_cross, (L.cross_q,), L.cross_o, x, xr, pos, keys, yes, buf, parts,
                            nthreads)
    _feed_forward(L, x, xr, yes, no, buf, parts, nthreads)


# ---- A batch's rows through one layer (ops.layer_step_rows; kernels/layer_step.h's
# sa_layer_run_rows): the stages of layer_step above, each for every row, the block products one
# call for all the rows (W read once for them; a row's sums are the same in any call). Each row's
# heads, attention and gate go through the one-row step's own functions on the record's scratch
# (its row copied in, the result out: the same compiled code at the same signatures), so that each
# row's results are layer_step's to the bit. A Llama-family record (silkattn._api checks it):
# pre-norm, gated, no cross-attention, block products.

@jit(cache=CACHE, fastmath=FASTMATH)
def _rows_blocks(M, xr, b, has_b, y, q8, nthreads):
    """y (m, n) = xr (m, k) M (+ b): _blocks_any's kernels for the m rows at once, the kinds after the
    row kernels' (linear_qx_rows: 8 rows a call at most) 8 rows a call."""
    m, k = xr.shape
    if M.kind < ROW_KINDS:
        _blocks(q8, xr, M.w, M.kind, b, has_b, y, nthreads)
        return
    rounded = np.empty(m * k, xr.dtype)
    if q8:
        _round_q8(xr.reshape(-1), m, k, rounded, 256 if M.kind >= Q4_K else 32)
    for r0 in range(0, m, 8):
        r1 = min(m, r0 + 8)
        out = np.empty((r1 - r0, M.n), y.dtype)
        if q8:
            linear_qx_rows(rounded[r0 * k:r1 * k].reshape(r1 - r0, k), M.w, M.kind, b, has_b, out, nthreads)
        else:
            linear_qx_rows(xr[r0:r1], M.w, M.kind, b, has_b, out, nthreads)
        y[r0:r1] = out


@jit(cache=CACHE, fastmath=FASTMATH)
def _rows_parts(Ps, xr, y, q8, nthreads):
    """y (m, sum of the parts' n) = xr [W_0 | W_1 | ...] (+ b), each part into a buffer of its own
    (the kernels write whole rows), then beside the others."""
    m = xr.shape[0]
    off = 0
    for i in range(len(Ps)):
        M = Product(*Ps[i])
        out = np.empty((m, M.n), y.dtype)
        _rows_blocks(M, xr, M.b, M.b.size > 0, out, q8, nthreads)
        y[:, off:off + M.n] = out
        off += M.n


@jit(cache=CACHE, fastmath=FASTMATH)
def _rows_residual(L, post, y, X):
    """X += y, or with a sandwich norm X += rms_norm(y), each row (layer_step's _out after its
    product: there the residual is the product's bias, the same sum)."""
    for r in range(X.shape[0]):
        if post.g.size:
            _add_normed(L, post, y[r], X[r])
        else:
            for j in range(L.d):
                X[r, j] += y[r, j]


@jit(cache=CACHE, fastmath=FASTMATH)
def _rows_norm(L, N, X, out):
    """out[r] = the norm N of X[r] (out: (m, d)), through the record's scratch (layer_step's call)."""
    S = L.scratch
    buf = np.empty(4 * vwidth(S.hn), S.hn.dtype)
    for r in range(X.shape[0]):
        _norm(N, X[r], L.eps, S.hn, buf)
        out[r] = S.hn[:L.d]


@jit(cache=CACHE, fastmath=FASTMATH)
def layer_step_rows(t, X, at, pools, cos, sin, work, nthreads):
    """The m rows of X (m, d) in place through the layer of record t (layer_step's), row r a token
    whose cache is in the pools (as Cache's kv: K, V flat, their read-only views, and a float16
    pool's bits, the other dtype's empty) from element at[r, 3], its
    K and V written at cache row at[r, 0], its query over the at[r, 2] rows from at[r, 1]; cos, sin
    (m, dh / 2) the rows' rotary rows (empty: none); work: the rows' buffers (driver.layer_step_rows:
    the products' inputs with read-only views, as the one-row step's scratch). Trusted:
    silkattn._api checked the record, the rows and the pools' range."""
    L = _named(t)
    S, C = L.scratch, L.cache
    Hn, HnR, A, AR, G, GR, QKV, F, Y = work
    h, h_kv, dh, dff = L.h, L.h_kv, L.dh, L.down.k
    nq = QKV.shape[1]
    no = nthreads < 0
    scale = np.float32(L.scale)
    _rows_norm(L, L.norm1, X, Hn)
    _rows_parts(L.qkv, HnR, QKV, L.q8, nthreads)
    for r in range(X.shape[0]):
        row, key0, nkeys, base = at[r, 0], at[r, 1], at[r, 2], at[r, 3]
        S.qkv[:nq] = QKV[r]
        _heads_at(L, S.qkv, pools, base + row * C.row_stride, cos, sin, r)
        geom = (C.head_stride, C.row_stride, dh, nkeys, h, h // h_kv)
        kv, geom = _cache_rows(pools, C.wide, base + key0 * C.row_stride, geom)
        _attend(S.qkv, kv, geom, L.memory.keep, no, S.scores, S.a, scale, nthreads)
        A[r] = S.a[:h * dh]
    _rows_blocks(L.o, AR, L.o.b, no, Y, L.q8, nthreads)
    _rows_residual(L, L.post1, Y, X)
    _rows_norm(L, L.norm2, X, Hn)
    _rows_parts(L.up, HnR, F, L.q8, nthreads)
    for r in range(X.shape[0]):
        S.f[:2 * dff] = F[r]
        _gate(S.f, dff, S.hn, L.gate == 2)
        G[r] = S.hn[:dff]
    _rows_blocks(L.down, GR, L.down.b, no, Y, L.q8, nthreads)
    _rows_residual(L, L.post2, Y, X)
