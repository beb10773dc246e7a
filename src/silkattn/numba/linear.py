"""Numba y = x W (+ b) for a few rows of x: the matrix-vector products of a decoding step.

A matrix-vector product reads every weight once and does two flops with it, so it runs at the
speed memory streams W: the kernels walk W in its storage order (no transposed copies) and keep
the few rows of y in cache. linear_rows splits W's rows among the threads, each summing into its
own partial result; linear_dots (y = x W^T) gives the threads blocks of outputs.
"""
from numba import prange

from ._jit import jit
from ._simd import CACHE, FASTMATH, hsum, vfma, vget, vload, vsplat, vstore, vsum4, vwidth

DOT_BLOCK = 64  # outputs per task of linear_dots


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def linear_rows(x, w, partial):
    """partial[t] = x[:, rows_t] w[rows_t, :] for the len(partial) shares rows_t of w's rows; the
    caller adds the shares up. x: (m, k), w: (k, n), partial: (T, m, n), all C-contiguous."""
    m, k = x.shape
    n = w.shape[1]
    T = partial.shape[0]
    W = vwidth(w)
    nv = n - n % W
    xf = x.reshape(-1)
    wf = w.reshape(-1)
    for t in prange(T):
        y = partial[t].reshape(-1)
        for c in range(m * n):
            y[c] = 0
        i = t * k // T
        i1 = (t + 1) * k // T
        while i + 4 <= i1:  # four rows of w per pass over y
            for r in range(m):
                a0 = vsplat(w, xf[r * k + i])
                a1 = vsplat(w, xf[r * k + i + 1])
                a2 = vsplat(w, xf[r * k + i + 2])
                a3 = vsplat(w, xf[r * k + i + 3])
                for c in range(0, nv, W):
                    acc = vfma(a0, vload(wf, i * n + c), vload(y, r * n + c))
                    acc = vfma(a1, vload(wf, (i + 1) * n + c), acc)
                    acc = vfma(a2, vload(wf, (i + 2) * n + c), acc)
                    vstore(y, r * n + c, vfma(a3, vload(wf, (i + 3) * n + c), acc))
                for c in range(nv, n):
                    for u in range(4):
                        y[r * n + c] += xf[r * k + i + u] * wf[(i + u) * n + c]
            i += 4
        while i < i1:
            for r in range(m):
                a0 = vsplat(w, xf[r * k + i])
                for c in range(0, nv, W):
                    vstore(y, r * n + c, vfma(a0, vload(wf, i * n + c), vload(y, r * n + c)))
                for c in range(nv, n):
                    y[r * n + c] += xf[r * k + i] * wf[i * n + c]
            i += 1


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def linear_dots(x, w, out):
    """out[r, j] = x[r, :] . w[j, :] (out = x w^T). x: (m, k), w: (n, k), out: (m, n), C-contiguous.
    Four outputs at a time, their dot products summed as one vector (vsum4)."""
    m, k = x.shape
    n = w.shape[0]
    W = vwidth(w)
    kv = k - k % W
    xf = x.reshape(-1)
    wf = w.reshape(-1)
    of = out.reshape(-1)
    for blk in prange((n + DOT_BLOCK - 1) // DOT_BLOCK):
        j = blk * DOT_BLOCK
        j1 = min(n, j + DOT_BLOCK)
        while j + 4 <= j1:
            for r in range(m):
                c0 = vsplat(w, 0)
                c1 = c0
                c2 = c0
                c3 = c0
                for d in range(0, kv, W):
                    xv = vload(xf, r * k + d)
                    c0 = vfma(xv, vload(wf, j * k + d), c0)
                    c1 = vfma(xv, vload(wf, (j + 1) * k + d), c1)
                    c2 = vfma(xv, vload(wf, (j + 2) * k + d), c2)
                    c3 = vfma(xv, vload(wf, (j + 3) * k + d), c3)
                s = vsum4(c0, c1, c2, c3)
                for u in range(4):
                    acc = vget(s, u)
                    for d in range(kv, k):
                        acc += xf[r * k + d] * wf[(j + u) * k + d]
                    of[r * n + j + u] = acc
            j += 4
        while j < j1:
            for r in range(m):
                c0 = vsplat(w, 0)
                for d in range(0, kv, W):
                    c0 = vfma(vload(xf, r * k + d), vload(wf, j * k + d), c0)
                acc = hsum(c0)
                for d in range(kv, k):
                    acc += xf[r * k + d] * wf[j * k + d]
                of[r * n + j] = acc
            j += 1
