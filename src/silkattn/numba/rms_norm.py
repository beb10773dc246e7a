"""Numba rms_norm kernels over the rows of C-contiguous (rows, n) arrays; one thread per block of rows."""
import math

import numpy as np
from numba import prange

from ._jit import jit
from ._simd import CACHE, FASTMATH, hsum, vadd, vfma, vload, vmul, vsplat, vstore, vwidth


@jit(inline="always", fastmath=FASTMATH)
def _scale_row(xf, base, g, rstd, of, nv, nt, buf, W):
    """of[base:base + n] = xf[base:base + n] * rstd * g; the tail (nt < W) through buf: lanes [0:W]
    hold the row's tail, [W:2W] g's, [2W:3W] take the result (so the zeros after the row's tail stay
    zeros, whatever rstd is)."""
    vr = vsplat(g, rstd)
    for j in range(0, nv, W):
        vstore(of, base + j, vmul(vmul(vload(xf, base + j), vr), vload(g, j)))
    if nt:
        vstore(buf, 2 * W, vmul(vmul(vload(buf, 0), vr), vload(buf, W)))
        for k in range(nt):
            of[base + nv + k] = buf[2 * W + k]


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def rms_norm_rows(x, g, eps, out, nthreads):
    """out = g * x / sqrt(mean(x^2) + eps) per row. A plain sum of squares (nothing cancels: every
    term is positive) in four register-wide partial sums of FMAs, in a fixed order, so the result
    does not depend on the thread count. The tail of a row that is not a whole number of registers
    goes through a per-thread buffer padded with zeros."""
    rows, n = x.shape
    W = vwidth(x)
    nv = n - n % W
    nt = n - nv
    c = np.empty(2, x.dtype)  # n and eps in the dtype: the mean and its sum with eps round as the reference's
    c[0] = n
    c[1] = eps
    buf_all = np.zeros((nthreads, 3 * W), x.dtype)
    xf = x.reshape(-1)
    of = out.reshape(-1)
    for p in prange(nthreads):  # one block of rows each, its own buffer
        buf = buf_all[p]  # [0:W] the row's tail (zeros after it), [W:2W] g's tail, [2W:3W] the result's
        for j in range(nt):
            buf[W + j] = g[nv + j]
        zero = vsplat(x, 0)
        for i in range(p * rows // nthreads, (p + 1) * rows // nthreads):
            base = i * n
            q0 = zero
            q1 = zero
            q2 = zero
            q3 = zero
            j = 0
            while j + 4 * W <= nv:
                v = vload(xf, base + j)
                q0 = vfma(v, v, q0)
                v = vload(xf, base + j + W)
                q1 = vfma(v, v, q1)
                v = vload(xf, base + j + 2 * W)
                q2 = vfma(v, v, q2)
                v = vload(xf, base + j + 3 * W)
                q3 = vfma(v, v, q3)
                j += 4 * W
            while j < nv:
                v = vload(xf, base + j)
                q0 = vfma(v, v, q0)
                j += W
            for k in range(nt):
                buf[k] = xf[base + nv + k]
            v = vload(buf, 0)
            q1 = vfma(v, v, q1)
            ms = hsum(vadd(vadd(q0, q1), vadd(q2, q3))) / c[0]
            _scale_row(xf, base, g, 1 / math.sqrt(ms + c[1]), of, nv, nt, buf, W)


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def add_rms_norm_rows(x, r, g, eps, s, out, nthreads):
    """s = x + r (the residual add) and out = rms_norm(s) per row: the squares summed as s is
    written (two partial sums), so the second pass reads s from L1."""
    rows, n = x.shape
    W = vwidth(x)
    nv = n - n % W
    nt = n - nv
    c = np.empty(2, x.dtype)
    c[0] = n
    c[1] = eps
    buf_all = np.zeros((nthreads, 3 * W), x.dtype)
    xf = x.reshape(-1)
    rf = r.reshape(-1)
    sf = s.reshape(-1)
    of = out.reshape(-1)
    for p in prange(nthreads):
        buf = buf_all[p]  # [0:W] the tail of the row's sum (zeros after it), [W:2W] g's, [2W:3W] the result's
        for j in range(nt):
            buf[W + j] = g[nv + j]
        zero = vsplat(x, 0)
        for i in range(p * rows // nthreads, (p + 1) * rows // nthreads):
            base = i * n
            q0 = zero
            q1 = zero
            j = 0
            while j + 2 * W <= nv:
                v = vadd(vload(xf, base + j), vload(rf, base + j))
                vstore(sf, base + j, v)
                q0 = vfma(v, v, q0)
                v = vadd(vload(xf, base + j + W), vload(rf, base + j + W))
                vstore(sf, base + j + W, v)
                q1 = vfma(v, v, q1)
                j += 2 * W
            while j < nv:
                v = vadd(vload(xf, base + j), vload(rf, base + j))
                vstore(sf, base + j, v)
                q0 = vfma(v, v, q0)
                j += W
            for k in range(nt):
                buf[k] = xf[base + nv + k] + rf[base + nv + k]
                sf[base + nv + k] = buf[k]
            v = vload(buf, 0)
            q1 = vfma(v, v, q1)
            ms = hsum(vadd(q0, q1)) / c[0]
            _scale_row(sf, base, g, 1 / math.sqrt(ms + c[1]), of, nv, nt, buf, W)


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def rms_norm_backward_rows(dy, x, g, eps, dx, dg, block):
    """rms_norm's backward: dx = r (G - x r^2 mean(G x)), G = g dy, r = 1 / sqrt(mean(x^2) + eps) per
    row; dg[k] (zeroed) += dy x r over rows k block .. (k + 1) block (a fixed split: the caller's sum
    over k does not depend on the threads)."""
    rows, n = x.shape
    for k in prange(dg.shape[0]):
        for i in range(k * block, min((k + 1) * block, rows)):
            ss = x[i, 0] - x[i, 0]
            c = ss
            for j in range(n):
                ss += x[i, j] * x[i, j]
                c += g[j] * dy[i, j] * x[i, j]
            r = 1 / math.sqrt(ss / n + eps)
            kk = r * r * r * c / n
            for j in range(n):
                dx[i, j] = r * g[j] * dy[i, j] - x[i, j] * kk
                dg[k, j] += dy[i, j] * x[i, j] * r
