"""Numba y = x W (+ b) for W held as GGUF blocks (silkattn.quant.QuantizedMatrix), a few rows of x:
the algorithm of kernels/tmpl_linear_q.h. Per block and row of x, x . w = d (x . q) + c sum(x), with
c = m for Q4_1, -8 d for Q4_0 (w = d (q - 8)), none for Q8_0; the block sums of x are made once per
call. Each row of W is converted once, its q to floats in a per-thread buffer that stays in L1 (d
and c beside them), for all the rows of x; the threads share W's rows, ROWS a task.
"""
import numba
import numpy as np
from numba import prange

from ._simd import (
    CACHE,
    FASTMATH,
    hsum,
    vadd,
    vbcast,
    vfma,
    vload,
    vload_q4,
    vload_q8,
    vmul,
    vsplat,
    vstore,
    vwidth,
)

Q8_0, Q4_0, Q4_1 = 0, 1, 2  # the block types by their code (silkattn.quant.KINDS)
BLOCK_BYTES = (34, 18, 20)
ROWS = 16  # outputs per task


_POW2 = np.array([2.0 ** (e - 25) for e in range(32)])  # a half's exponent field e -> 2^(e - 25)


@numba.njit(inline="always")
def _half(lo, hi):
    """The little-endian float16 of bytes lo, hi as a float, from its bits: sign, 5-bit exponent e
    biased 15, 10-bit fraction f: (1024 + f) 2^(e - 25), or f 2^-24 when e = 0 (exact: every
    float16 is a float32; a table of powers of two, no libm call)."""
    h = np.int64(lo) | np.int64(hi) << 8
    e = (h >> 10) & 31
    f = h & 1023
    if e == 31:
        v = np.inf if f == 0 else np.nan
    elif e == 0:
        v = f * _POW2[1]
    else:
        v = (1024 + f) * _POW2[e]
    return -v if h & 0x8000 else v


@numba.njit(parallel=True, nogil=True, cache=CACHE, fastmath=FASTMATH)
def linear_q_rows(x, blocks, kind, b, has_bias, out, nthreads):
    """out[r, j] = x[r] . W_j (+ b[j]), W_j = dequantize(blocks[j], kind): x (m, k) with k a multiple
    of 32, blocks (n, k / 32 * block bytes) uint8, out (m, n); C-contiguous."""
    m, k = x.shape
    n, ldw = blocks.shape
    W = vwidth(x)
    nb = k // 32
    nbp = (nb + W - 1) // W * W  # the offsets' dot product a register at a time, zeros after nb
    size = BLOCK_BYTES[kind]
    head = 4 if kind == Q4_1 else 2
    xf = x.reshape(-1)
    bf = blocks.reshape(-1)
    of = out.reshape(-1)
    xs = np.zeros(m * nbp, x.dtype)  # xs[r nbp + i]: the sum of block i of x[r]
    if kind != Q8_0:
        for r in range(m):
            for i in range(nb):
                s = vload(xf, r * k + i * 32)
                for v in range(W, 32, W):
                    s = vadd(s, vload(xf, r * k + i * 32 + v))
                xs[r * nbp + i] = hsum(s)
    buf_all = np.zeros((nthreads, k + 2 * nbp), x.dtype)  # a row's q (k), its d and c (nbp each)
    for task in prange((n + ROWS - 1) // ROWS):
        W = vwidth(x)  # here, a constant of the loop's own code (outside, a parameter passed into it)
        buf = buf_all[numba.get_thread_id()]
        for j in range(task * ROWS, min(n, (task + 1) * ROWS)):
            for i in range(nb):  # the row converted once
                p = j * ldw + i * size
                d = _half(bf[p], bf[p + 1])
                buf[k + i] = d
                if kind == Q4_1:
                    buf[k + nbp + i] = _half(bf[p + 2], bf[p + 3])
                elif kind == Q4_0:
                    buf[k + nbp + i] = -8 * d
                for v in range(0, 32, W):
                    if kind == Q8_0:
                        vstore(buf, i * 32 + v, vload_q8(x, bf, p + head + v))
                    else:  # byte t holds q_t in its low nibble, q_(t + 16) in its high one
                        vstore(buf, i * 32 + v, vload_q4(x, bf, p + head + v % 16, 0 if v < 16 else 4))
            for r in range(m):
                base = r * k
                a0 = vsplat(x, 0)
                a1 = a0
                for i in range(0, nb - 1, 2):  # two blocks a step, two chains of FMAs
                    t0 = vmul(vload(xf, base + i * 32), vload(buf, i * 32))
                    t1 = vmul(vload(xf, base + i * 32 + 32), vload(buf, i * 32 + 32))
                    for v in range(W, 32, W):
                        t0 = vfma(vload(xf, base + i * 32 + v), vload(buf, i * 32 + v), t0)
                        t1 = vfma(vload(xf, base + i * 32 + 32 + v), vload(buf, i * 32 + 32 + v), t1)
                    a0 = vfma(vbcast(buf, k + i), t0, a0)
                    a1 = vfma(vbcast(buf, k + i + 1), t1, a1)
                if nb % 2:
                    i = nb - 1
                    t0 = vmul(vload(xf, base + i * 32), vload(buf, i * 32))
                    for v in range(W, 32, W):
                        t0 = vfma(vload(xf, base + i * 32 + v), vload(buf, i * 32 + v), t0)
                    a0 = vfma(vbcast(buf, k + i), t0, a0)
                s = hsum(vadd(a0, a1))
                if kind != Q8_0:
                    c = vsplat(x, 0)
                    for i in range(0, nbp, W):
                        c = vfma(vload(buf, k + nbp + i), vload(xs, r * nbp + i), c)
                    s += hsum(c)
                if has_bias:
                    s += b[j]
                of[r * n + j] = s
