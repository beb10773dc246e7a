"""Numba layer_norm kernel over the rows of a C-contiguous (rows, n) array; one thread per block of rows."""
import math

import numba
import numpy as np
from numba import prange

from ._jit import jit
from ._simd import CACHE, FASTMATH, hsum, vadd, vfma, vload, vmul, vsplat, vstore, vsub, vwidth


@jit(inline="always", fastmath=FASTMATH)
def layer_norm_row(xf, base, g, b, inv_n, e, buf, of, obase):
    """of[obase:obase + n] = layer_norm of xf[base:base + n], n = len(g) (layer_norm_rows' docstring:
    the shift, the two passes, the tail through buf, whose mask and tails of g and b the caller has
    set); of may be xf at the same base (each x read before it is written)."""
    n = g.shape[0]
    W = vwidth(xf)
    nv = n - n % W
    nt = n - nv
    zero = vsplat(xf, 0)
    x0 = xf[base]
    v0 = vsplat(xf, x0)
    # pass 1: sum of y = x - x0, four partial sums
    s0 = s1 = s2 = s3 = zero
    j = 0
    while j + 4 * W <= nv:
        s0 = vadd(s0, vsub(vload(xf, base + j), v0))
        s1 = vadd(s1, vsub(vload(xf, base + j + W), v0))
        s2 = vadd(s2, vsub(vload(xf, base + j + 2 * W), v0))
        s3 = vadd(s3, vsub(vload(xf, base + j + 3 * W), v0))
        j += 4 * W
    while j < nv:
        s0 = vadd(s0, vsub(vload(xf, base + j), v0))
        j += W
    if nt:
        for k in range(W):
            buf[k] = xf[base + nv + k] if k < nt else x0
        s1 = vadd(s1, vsub(vload(buf, 0), v0))   # padded lanes: x0 - x0 = 0
    delta = hsum(vadd(vadd(s0, s1), vadd(s2, s3))) * inv_n
    vd = vsplat(xf, delta)
    # pass 2: sums of d = y - delta and of d * d (two partial sums of each)
    sd0 = sd1 = sd2 = sd3 = zero
    sq0 = sq1 = sq2 = sq3 = zero
    j = 0
    while j + 4 * W <= nv:
        d = vsub(vsub(vload(xf, base + j), v0), vd)
        sd0 = vadd(sd0, d)
        sq0 = vfma(d, d, sq0)
        d = vsub(vsub(vload(xf, base + j + W), v0), vd)
        sd1 = vadd(sd1, d)
        sq1 = vfma(d, d, sq1)
        d = vsub(vsub(vload(xf, base + j + 2 * W), v0), vd)
        sd2 = vadd(sd2, d)
        sq2 = vfma(d, d, sq2)
        d = vsub(vsub(vload(xf, base + j + 3 * W), v0), vd)
        sd3 = vadd(sd3, d)
        sq3 = vfma(d, d, sq3)
        j += 4 * W
    while j < nv:
        d = vsub(vsub(vload(xf, base + j), v0), vd)
        sd0 = vadd(sd0, d)
        sq0 = vfma(d, d, sq0)
        j += W
    if nt:
        d = vmul(vsub(vsub(vload(buf, 0), v0), vd), vload(buf, W))
        sd1 = vadd(sd1, d)
        sq1 = vfma(d, d, sq1)
    sd0 = vadd(vadd(sd0, sd1), vadd(sd2, sd3))
    sq0 = vadd(vadd(sq0, sq1), vadd(sq2, sq3))
    sd = hsum(sd0)
    sq = hsum(sq0)
    delta = delta + sd * inv_n
    var = max((sq - sd * sd * inv_n) * inv_n, sd - sd)
    rstd = 1 / math.sqrt(var + e)
    vd = vsplat(xf, delta)
    vr = vsplat(xf, rstd)
    # pass 3: g * ((y - delta) * rstd) + b
    for j in range(0, nv, W):
        d = vmul(vsub(vsub(vload(xf, base + j), v0), vd), vr)
        vstore(of, obase + j, vfma(vload(g, j), d, vload(b, j)))
    if nt:
        d = vmul(vsub(vsub(vload(buf, 0), v0), vd), vr)
        vstore(buf, 0, vfma(vload(buf, 2 * W), d, vload(buf, 3 * W)))
        for k in range(nt):
            of[obase + nv + k] = buf[k]


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def layer_norm_rows(x, g, b, eps, out, nthreads):
    """out = g * (x - mean) / sqrt(var + eps) + b per row, population variance, in two passes over
    the row, never a one-pass sum of squares (that loses the variance of rows with a large mean).

    Everything is computed on the row shifted by its first value, y = x - x[0] (exact when the row's
    values are within a factor 2 of each other, e.g. a large mean with a small spread): the mean
    itself, rounded to the dtype, can be off by half an ulp of a large value, which the centred
    output x - mean would inherit, whereas the shift delta = mean(y) is small and precise.
    Pass 1 sums y; pass 2 sums the centred values d = y - delta and their squares, and the sum of d
    corrects delta (the corrected two-pass algorithm). Explicit register-wide code with four
    partial sums per sum (a fixed order: the result does not depend on the thread count); the
    intrinsics carry no fast-math flags, so y - delta is never re-associated into x - (x0 + delta).
    The tail of a row that is not a whole number of registers goes through a per-thread buffer,
    its unused lanes zeroed by a 0/1 lane mask."""
    rows, n = x.shape
    W = vwidth(x)
    nv = n - n % W
    nt = n - nv
    c = np.empty(2, x.dtype)
    c[0] = 1.0 / n
    c[1] = eps
    inv_n = c[0]
    e = c[1]
    buf_all = np.zeros((nthreads, 4 * W), x.dtype)
    xf = x.reshape(-1)
    of = out.reshape(-1)
    # one parallel iteration per thread, each a contiguous block of rows (set-up once per block)
    for p in prange(nthreads):
        buf = buf_all[numba.get_thread_id()]   # [0:W] tail of x, [W:2W] lane mask, [2W:4W] tail g, b
        for j in range(nt):
            buf[W + j] = 1
            buf[2 * W + j] = g[nv + j]
            buf[3 * W + j] = b[nv + j]
        for i in range(p * rows // nthreads, (p + 1) * rows // nthreads):
            layer_norm_row(xf, i * n, g, b, inv_n, e, buf, of, i * n)


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def layer_norm_backward_rows(dy, x, g, eps, dx, parts, block):
    """layer_norm's backward: dx = (G - mean(G) - xh mean(G xh)) / sigma, G = g dy, xh = (x - mean) /
    sigma, sigma = sqrt(var + eps) per row (mean and variance in two passes); parts[k] (zeroed) +=
    dy xh then dy (2 n values) over rows k block .. (k + 1) block (a fixed split: the caller's sum over k
    does not depend on the threads)."""
    rows, n = x.shape
    for k in prange(parts.shape[0]):
        for i in range(k * block, min((k + 1) * block, rows)):
            s = x[i, 0] - x[i, 0]
            for j in range(n):
                s += x[i, j]
            mean = s / n
            s2 = s - s
            sg = s2
            sgx = s2
            for j in range(n):
                d = x[i, j] - mean
                G = g[j] * dy[i, j]
                s2 += d * d
                sg += G
                sgx += G * d
            inv = 1 / math.sqrt(s2 / n + eps)
            mg = sg / n
            mgx = sgx * inv / n
            for j in range(n):
                xh = (x[i, j] - mean) * inv
                dx[i, j] = (g[j] * dy[i, j] - mg - xh * mgx) * inv
                parts[k, j] += dy[i, j] * xh
                parts[k, n + j] += dy[i, j]
