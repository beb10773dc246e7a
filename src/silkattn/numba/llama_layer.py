"""Numba llama_layer: one token through one Llama decoder layer in one compiled call (the kernel
contract's llama_layer, silkattn._api), so that a decoding step costs one Python call a layer
instead of a dozen ops' bookkeeping. The arithmetic is the unfused decoding step of
silkattn.models.llama (Llama._run for one row), in place on the residual x:

    hn = rms_norm(x) attn_norm;  qkv = hn W_qkv;  rotary on the Q and K heads of qkv;
    K[:, pos], V[:, pos] = the K and V heads;  a = attention of each Q head over its K/V head's
    rows 0 .. pos;  x += a W_o;  hn = rms_norm(x) ffn_norm;  gu = hn W_gu;
    hn = silu(gu[:d_ff]) gu[d_ff:];  x += hn W_d

The products are linear_q_rows (linear_q.py) for one row, the residual add as its bias (the bias
is added to each output as it is written, so x may be both: each x[j] is read just before it is
overwritten). The products' operands are passed read-only (driver.llama_layer adds read-only views
of x, a and hn), so linear_q_rows runs at the signature that driver.linear_q compiles, and a first
compilation here reuses its compiled code instead of compiling it (three block types) again.
The norms are rms_norm_rows's arithmetic, the rotary rope_rows's (no FMA contraction), the gate
silu_mul's; the attention (parallel over the query heads) is this file's own, block_layer.py's too
(_attend: any head and row strides, an optional keep mask).

Numba's on-disk cache only tracks the file a function is defined in: after editing linear_q.py,
silu_mul.py or _simd.py, delete src/silkattn/numba/__pycache__/*.nb[ic] or llama_layer may load
stale machine code.
"""
import math

import numba
import numpy as np
from numba import prange

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
from .linear_q import BLOCK_BYTES, linear_q8_rows, linear_q_rows
from .silu_mul import _silu_mul


@numba.njit(nogil=True, cache=CACHE, fastmath=FASTMATH)
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


# No fastmath: not even 'contract' (as rope_rows): x c - y s rounds each product as NumPy does. LLVM
# may inline it into llama_layer: the flags are the instructions' own, so none is contracted there.
@numba.njit(nogil=True, cache=CACHE)
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


@numba.njit(inline="always", fastmath=FASTMATH)
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


@numba.njit(inline="always", fastmath=FASTMATH)
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


@numba.njit(inline="always", fastmath=FASTMATH)
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


@numba.njit(nogil=True, cache=CACHE, fastmath=FASTMATH)
def _head(qkv, qo, kf, vf, ko, ld, dh, n, keep, masked, sf, so, a, ao, scale, buf):
    """One query head (qkv[qo : qo + dh]) over the n rows of its K/V head (kf and vf from element ko,
    rows ld apart): sf[so + t] = exp(s_t - max) for t < n, s_t = q . K_t scale, or exactly -1e9 where
    masked and keep[t] == 0 (the reference's hidden key: a row with every key hidden averages them
    all); a[ao : ao + dh] = sum_t sf[so + t] V_t / sum_t sf[so + t]; buf: a register of scratch. A
    function of its own, not prange's body: the register's lanes are a constant here."""
    _head_scores(qkv, qo, kf, ko, ld, dh, n, scale, sf, so)
    if masked:
        for t in range(n):
            if keep[t] == 0:
                sf[so + t] = -1e9
    inv = _head_exp(sf, so, n, buf)
    _head_pv(sf, so, vf, ko, ld, dh, n, inv, a, ao)


@numba.njit(parallel=True, nogil=True, cache=CACHE, fastmath=FASTMATH)
def _attend(qkv, kf, vf, head_stride, ld, dh, n, h, group, keep, masked, scores, a, nthreads):
    """a[j dh : (j + 1) dh] = softmax_t(q_j . K_g[t] / sqrt(dh)) V_g over t < n for each query head j
    (q_j = qkv[j dh : (j + 1) dh]) and its K/V head g = j // group: K_g[t] = kf[g head_stride + t ld:]
    [:dh], V_g[t] likewise in vf (a Llama cache (h_kv, capacity, dh): head_stride capacity dh, ld dh;
    the listing's (capacity, d), heads side by side: head_stride dh, ld d). keep, masked: _head's.
    scores (h, >= n): a head's row of exp. One block of heads a thread, each with its buffer."""
    ls = scores.shape[1]
    scale = np.float32(1 / math.sqrt(dh))
    sf = scores.reshape(-1)
    buf_all = np.empty((nthreads, vwidth(qkv)), qkv.dtype)
    for p in prange(nthreads):
        buf = buf_all[p]
        for j in range(p * h // nthreads, (p + 1) * h // nthreads):
            _head(qkv, j * dh, kf, vf, (j // group) * head_stride, ld, dh, n, keep, masked, sf, j * ls, a,
                  j * dh, scale, buf)


@numba.njit(nogil=True, cache=CACHE, fastmath=FASTMATH)
def _gate(gu, dff, out):
    """out[:dff] = silu(gu[:dff]) gu[dff:] (silu_mul's arithmetic), the tail that is not a whole
    register (none when dff is a multiple of 32: W_d's k) one value at a time (math.exp)."""
    W = vwidth(gu)
    nv = dff - dff % W
    one = vsplat(gu, 1)
    top = vsplat(gu, 88.0)
    inf = vsplat(gu, np.inf)
    for j in range(0, nv, W):
        vstore(out, j, _silu_mul(vload(gu, j), vload(gu, dff + j), one, top, inf))
    for j in range(nv, dff):
        g = gu[j]
        out[j] = g / (1 + math.exp(-g)) * gu[dff + j]


@numba.njit(nogil=True, cache=CACHE, fastmath=FASTMATH)
def _product(q8, x, w, kind, b, has_bias, out, nthreads):  # linear_q_rows, or with q8 linear_q8_rows
    if q8:
        linear_q8_rows(x, w, kind, b, has_bias, out, nthreads)
    else:
        linear_q_rows(x, w, kind, b, has_bias, out, nthreads)


@numba.njit(nogil=True, cache=CACHE, fastmath=FASTMATH)
def llama_layer(x, xr, attn_norm, ffn_norm, wqkv, kqkv, wo, ko, wgu, kgu, wd, kd, q8, K, V, pos, cos, sin, h,
                eps, qkv, a, ar, hn, hnr, gu, scores, nthreads):
    """One token through one Llama layer, in place on x (d,): the module docstring's steps. xr, ar and
    hnr: read-only views of x, a and hn (the products' operands, see the module docstring); the
    other operands as the kernel contract's (silkattn._api): the blocks w* of kinds k* (n, bytes) as
    linear_q_rows's (q8: every product takes its x rounded to 8 bits, linear_q8_rows), K and V
    (h_kv, capacity, d_head), cos and sin (d_head / 2,) position pos's
    rotary row, the scratch qkv, a, hn, gu and scores (at least their sizes; d_ff is W_d's k). The
    shapes are not checked here: driver.llama_layer checks them."""
    d = x.shape[0]
    h_kv, cap, dh = K.shape
    dff = wd.shape[1] // BLOCK_BYTES[kd] * 32  # W_d's k
    nqkv = (h + 2 * h_kv) * dh
    bias, none = pos >= 0, pos < 0  # True and False, not as literals: linear_q_rows's one signature
    _rms_norm(x, attn_norm, eps, hn)
    _product(q8, hnr[:d].reshape(1, d), wqkv, kqkv, xr, none, qkv[:nqkv].reshape(1, nqkv), nthreads)
    _rope(qkv, h + h_kv, dh, cos, sin)
    for g in range(h_kv):
        for i in range(dh):
            K[g, pos, i] = qkv[(h + g) * dh + i]
            V[g, pos, i] = qkv[(h + h_kv + g) * dh + i]
    _attend(qkv, K.reshape(-1), V.reshape(-1), cap * dh, dh, dh, pos + 1, h, h // h_kv, np.empty(0, np.uint8),
            none, scores, a, nthreads)
    _product(q8, ar[:h * dh].reshape(1, h * dh), wo, ko, xr, bias, x.reshape(1, d), nthreads)
    _rms_norm(x, ffn_norm, eps, hn)
    _product(q8, hnr[:d].reshape(1, d), wgu, kgu, xr, none, gu[:2 * dff].reshape(1, 2 * dff), nthreads)
    _gate(gu, dff, hn)
    _product(q8, hnr[:dff].reshape(1, dff), wd, kd, xr, bias, x.reshape(1, d), nthreads)
