"""Numba softmax kernel over the rows of a C-contiguous (rows, n) array; one thread per block of rows."""
import numba
import numpy as np
from numba import prange

from ._jit import jit
from ._simd import (
    CACHE,
    FASTMATH,
    hmax,
    hsum,
    vadd,
    vexp_sub,
    vload,
    vmax,
    vmul,
    vsplat,
    vstore,
    vwidth,
)


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def softmax_rows(x, out, nthreads):
    """out[i] = exp(x[i] - max x[i]) / sum exp(x[i] - max x[i]): max, exp + sum, scale, each a
    register-wide pass (the row is L1/L2-resident after the first); the tail of a row that is not a
    whole number of registers goes through a small per-thread buffer padded with -inf."""
    rows, n = x.shape
    W = vwidth(x)
    nv = n - n % W
    tail_all = np.empty((nthreads, W), x.dtype)
    xf = x.reshape(-1)
    of = out.reshape(-1)
    for i in prange(rows):
        tail = tail_all[numba.get_thread_id()]
        base = i * n
        for j in range(W):
            tail[j] = xf[base + nv + j] if j < n - nv else -np.inf
        mx = vload(tail, 0)
        for j in range(0, nv, W):
            mx = vmax(mx, vload(xf, base + j))
        m = hmax(mx)
        sm = vexp_sub(xf, base, of, base, nv, m)
        sm = vadd(sm, vexp_sub(tail, 0, tail, 0, W, m))  # padded lanes: exp(-inf) = 0
        total = hsum(sm)
        inv = vsplat(x, 1.0 / total)
        for j in range(0, nv, W):
            vstore(of, base + j, vmul(vload(of, base + j), inv))
        for j in range(n - nv):
            of[base + nv + j] = tail[j] / total


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def softmax_backward_rows(dy, y, dx, nthreads):
    """dx = y (dy - sum_j dy_j y_j) per row (dx may be dy); one block of rows a thread."""
    rows, n = y.shape
    for p in prange(nthreads):
        for i in range(p * rows // nthreads, (p + 1) * rows // nthreads):
            c = y[i, 0] - y[i, 0]
            for j in range(n):
                c += dy[i, j] * y[i, j]
            for j in range(n):
                dx[i, j] = y[i, j] * (dy[i, j] - c)
