"""Numba y = x W (+ b) for W held as GGUF blocks (silkattn.quant.QuantizedMatrix), a few rows of x:
the algorithm of kernels/tmpl_linear_q.h. Per block and row of x, x . w = d (x . q) + c sum(x), with
c = m for Q4_1, -8 d for Q4_0 (w = d (q - 8)), none for Q8_0; the block sums of x are made once per
call. The threads share W's rows, ROWS a task, each task run by the compiled copy for its block
type (_task_of). A task first converts its rows' float16 scales, a block of ROWS rows a register
(_scales; F16C where the CPU has it), into a per-thread buffer, with the rows' offsets
sum_i c_i xs_i; then it takes J rows of W a pass, each block's q converted in registers (_block:
bytes widened; a 4-bit block's nibbles looked up in a register of d q with 16 lanes, masked and
converted with 8) straight into the products with one or two rows of x, J (or 2 J) accumulators
in registers, the scales broadcast from the buffer. The next task's rows are prefetched.

dequantize_rows: rows of W's blocks to float32 (a prefill's panels of W, multiplied by BLAS), the
reference's arithmetic to the bit; the types without few-row kernels (Q5_0, Q5_1, and the K-quants
Q4_K, Q5_K, Q6_K of 256 weights a block) by scalar code (_dequantize_row_ext), for the GEMM path.
"""
import numba
import numpy as np
from numba import prange

from ._jit import jit
from ._simd import (
    CACHE,
    FASTMATH,
    VBYTES,
    hsum,
    vadd,
    vbcast,
    vfma,
    viota,
    vload,
    vload_halves,
    vload_q4,
    vload_q8,
    vmul,
    vprefetch,
    vsplat,
    vstore,
    vsub,
    vtable_q4,
    vwidth,
)
from .linear import _sgemm, _share

Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K = range(8)  # the block types by code (silkattn.quant.KINDS)
BLOCK_BYTES = (34, 18, 20, 22, 24, 144, 176, 210)  # by the code
BLOCK_WEIGHTS = (32, 32, 32, 32, 32, 256, 256, 256)
ROW_KINDS = 3  # the codes below it have the few-row kernels; the others are dequantized only
ROWS = 16  # outputs per task, a multiple of the register's lanes (8 or 16)
J = 4  # rows of W in flight: J (or 2 J) chains of FMAs hide each other's latency
TABLE = VBYTES == 64  # 16 float32 lanes: 4-bit q looked up in a register (_block)


@jit(inline="always")
def _scales(kind, x, bf, ldw, nb, xs, m, sc, j0, j1):
    """For the rows j0 + u < j1 of W (u < ROWS): sc[i ROWS + u] = d and sc[(nb + i) ROWS + u] = c of
    their block i, and sc[2 nb ROWS + r ROWS + u] = sum_i c xs[r nb + i], their offsets for row r
    of x (unless Q8_0); zeros for u from j1 - j0. A block's scales of ROWS rows at a time (a
    register or two of rows, ldw bytes apart), so a register is never mostly padding, and the
    offsets come out a row of W a lane."""
    W = vwidth(x)
    size = BLOCK_BYTES[kind]
    for i in range(nb):
        for h in range(0, ROWS, W):
            d, c = vload_halves(x, bf, (j0 + h) * ldw + i * size, ldw, j1 - j0 - h)
            vstore(sc, i * ROWS + h, d)
            if kind == Q4_1:
                vstore(sc, (nb + i) * ROWS + h, c)
            elif kind == Q4_0:
                vstore(sc, (nb + i) * ROWS + h, vmul(d, vsplat(x, -8)))
    if kind != Q8_0:
        for r in range(m):
            for h in range(0, ROWS, W):
                o = vsplat(x, 0)
                for i in range(nb):
                    o = vfma(vload(sc, (nb + i) * ROWS + h), vbcast(xs, r * nb + i), o)
                vstore(sc, 2 * nb * ROWS + r * ROWS + h, o)


# A plain function, which LLVM inlines (it is small: the tasks' machine code has no call to it),
# rather than inline="always": Numba copies such a function's IR at each of its call sites (those of
# its own inlined calls included), and nested inline helpers made the kernel's first compilation
# take from 8 to 50 s instead of 5.
@jit(cache=CACHE, fastmath=FASTMATH)
def _block(kind, x, xf, xo, bf, q, d, a):
    """a + d (x[xo : xo + 32] . q), lane-wise, for one block of W (its q at byte q of bf), the q
    converted in registers. Q8_0, or 8 lanes: bytes widened to int32 lanes (sign-extended for Q8_0;
    a 4-bit block's byte t holds q_t in its low nibble, q_(t + 16) in its high one), converted, and
    the registers' products summed before d. A 4-bit block with 16 lanes: its d q looked up in a
    register of d times 0 .. 15, one variable permute a half of the block (no conversion, no
    product with d apart from the table's), as the C kernel's AVX-512 copy."""
    W = vwidth(x)  # a constant here (the loops unroll); prange's body would take it as a parameter
    if kind == Q8_0:
        t = vmul(vload(xf, xo), vload_q8(x, bf, q))
        for v in range(W, 32, W):
            t = vfma(vload(xf, xo + v), vload_q8(x, bf, q + v), t)
        return vfma(d, t, a)
    if TABLE:
        lo, hi = vtable_q4(vmul(d, viota(x)), bf, q)
        return vfma(vload(xf, xo + 16), hi, vfma(vload(xf, xo), lo, a))
    t = vmul(vload(xf, xo), vload_q4(x, bf, q, 0))
    for v in range(W, 32, W):
        t = vfma(vload(xf, xo + v), vload_q4(x, bf, q + v % 16, 0 if v < 16 else 4), t)
    return vfma(d, t, a)


@jit(inline="always")
def _rows4(kind, x, xf, xo, bf, q, p, d, a):
    """_block for J = 4 rows of W, block at byte q of each (rows at bytes p[u] of bf, scales d[u],
    accumulators a[u]), and one row of x (from xo of xf)."""
    return (_block(kind, x, xf, xo, bf, p[0] + q, d[0], a[0]),
            _block(kind, x, xf, xo, bf, p[1] + q, d[1], a[1]),
            _block(kind, x, xf, xo, bf, p[2] + q, d[2], a[2]),
            _block(kind, x, xf, xo, bf, p[3] + q, d[3], a[3]))


@jit(cache=CACHE, fastmath=FASTMATH)
def _scales4(bf, p, ahead, sc, s):
    """The scales of 4 rows' block (sc[s : s + 4], each in a whole register), and bf's bytes
    p[u] + ahead (the same block of the next task's rows) prefetched. A plain function: see _block."""
    vprefetch(bf, p[0] + ahead)
    vprefetch(bf, p[1] + ahead)
    vprefetch(bf, p[2] + ahead)
    vprefetch(bf, p[3] + ahead)
    return vbcast(sc, s), vbcast(sc, s + 1), vbcast(sc, s + 2), vbcast(sc, s + 3)


def _task_of(kind):
    """The task of linear_q_rows for one block type, compiled apart, `kind` a constant of the
    closure: Numba prunes the other types' branches of the helpers (and caches each copy apart).
    Called from prange's body, not inlined there (Numba's inlining and parallel passes over three
    copies in one body: most of a minute to compile)."""
    @jit(cache=CACHE, fastmath=FASTMATH)
    def task(x, xf, xs, bf, sc, b, has_bias, of, dims, j0, j1):
        """of[r, j] = x[r] . W_j (+ b[j]) for the rows j0 <= j < j1 of W and every row r of x (dims:
        x's rows m and k, W's bytes a row ldw, blocks a row nb and rows n): their
        scales converted once (_scales), then J rows of W a pass for the rows of x in pairs (an
        odd m's last one alone), the pair sharing each block's conversion (the same loads and
        conversions, merged by LLVM). Rows of W past j1 - 1 repeat it (their results are not
        written)."""
        m, k, ldw, nb, n = dims
        _scales(kind, x, bf, ldw, nb, xs, m, sc, j0, j1)
        size = BLOCK_BYTES[kind]
        head = 4 if kind == Q4_1 else 2
        off = 2 * nb * ROWS  # the rows' offsets in sc
        for j in range(j0, j1, J):
            u = j - j0
            pp = (j * ldw + head, min(j + 1, j1 - 1) * ldw + head, min(j + 2, j1 - 1) * ldw + head,
                  min(j + 3, j1 - 1) * ldw + head)  # the J rows' first bytes
            # the next task's rows (the thread's next, under prange's static schedule) fetched
            # ahead: with J rows a pass and the scales read across ROWS rows, the hardware
            # prefetcher falls behind (a third to half slower with W streamed from memory)
            ahead = ROWS * ldw if j + ROWS + J <= n else 0
            for r0 in range(0, m, 2):
                r1 = min(r0 + 1, m - 1)
                zero = vsplat(x, 0)
                acc0 = acc1 = (zero, zero, zero, zero)  # the J rows of W times row r0, and r1, of x
                if r1 > r0:  # the block loop twice, for two rows of x and for one
                    for i in range(nb):
                        d = _scales4(bf, pp, i * size + ahead, sc, i * ROWS + u)
                        acc0 = _rows4(kind, x, xf, r0 * k + i * 32, bf, i * size, pp, d, acc0)
                        acc1 = _rows4(kind, x, xf, r1 * k + i * 32, bf, i * size, pp, d, acc1)
                else:
                    for i in range(nb):
                        d = _scales4(bf, pp, i * size + ahead, sc, i * ROWS + u)
                        acc0 = _rows4(kind, x, xf, r0 * k + i * 32, bf, i * size, pp, d, acc0)
                a0, a1, a2, a3 = acc0
                b0, b1, b2, b3 = acc1
                for t in range(J):
                    if j + t < j1:
                        y = hsum(a0 if t == 0 else a1 if t == 1 else a2 if t == 2 else a3)
                        z = hsum(b0 if t == 0 else b1 if t == 1 else b2 if t == 2 else b3)
                        if kind != Q8_0:
                            y += sc[off + r0 * ROWS + u + t]
                            z += sc[off + r1 * ROWS + u + t]
                        if has_bias:
                            y += b[j + t]
                            z += b[j + t]
                        of[r0 * n + j + t] = y
                        if r1 > r0:
                            of[r1 * n + j + t] = z
    return task


_task_q8_0, _task_q4_0, _task_q4_1 = (_task_of(kind) for kind in (Q8_0, Q4_0, Q4_1))


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def linear_q_rows(x, blocks, kind, b, has_bias, out, nthreads):
    """out[r, j] = x[r] . W_j (+ b[j]), W_j = dequantize(blocks[j], kind): x (m, k) with k a multiple
    of 32, blocks (n, k / 32 * block bytes) uint8, out (m, n); C-contiguous. Per block i of W_j, of
    scale d_i (and offset c_i): x[r] . W_j = sum_i d_i (x[r, 32 i:32 i + 32] . q_i) + c_i xs[r, i],
    xs[r, i] the sum of x[r, 32 i:32 i + 32]."""
    m, k = x.shape
    n, ldw = blocks.shape
    W = vwidth(x)
    nb = k // 32
    xf = x.reshape(-1)
    bf = blocks.reshape(-1)
    of = out.reshape(-1)
    # np.empty, not np.zeros: a parallel=True function's np.zeros is a parallel loop of its own
    xs = np.empty(m * nb, x.dtype)  # xs[r nb + i]: the sum of block i of x[r]
    if kind != Q8_0:
        for r in range(m):
            for i in range(nb):
                s = vload(xf, r * k + i * 32)
                for v in range(W, 32, W):
                    s = vadd(s, vload(xf, r * k + i * 32 + v))
                xs[r * nb + i] = hsum(s)
    # a thread's scales: the task's d and c, then the rows' offsets per row of x
    sc_all = np.empty((nthreads, (2 * nb + m) * ROWS), x.dtype)
    for task in prange((n + ROWS - 1) // ROWS):
        sc = sc_all[numba.get_thread_id()]
        j0 = task * ROWS
        j1 = min(n, j0 + ROWS)
        dims = (m, k, ldw, nb, n)
        if kind == Q8_0:
            _task_q8_0(x, xf, xs, bf, sc, b, has_bias, of, dims, j0, j1)
        elif kind == Q4_0:
            _task_q4_0(x, xf, xs, bf, sc, b, has_bias, of, dims, j0, j1)
        else:
            _task_q4_1(x, xf, xs, bf, sc, b, has_bias, of, dims, j0, j1)


# ---- int8 activations (QuantizedMatrix.activations "int8"): x rounded to 8 bits a block
# (reference.round_q8), then the float products above on the rounded rows. The C kernels multiply
# the 8-bit q as integers (vpdpbusd / vpmaddubsw); Numba reaches no such instruction, and its
# scalar integer loops ran 15x slower than the float kernel: the products of the rounded rows in
# float32 are the same products to float32's rounding (the q d_x are exact in float32).

# No fastmath: the rounding must be the reference's float32 operations, and the NaN test must stay.
# Said explicitly: unset, a caller's fastmath would be inherited (layer_step's products call this).
@jit(cache=CACHE, fastmath=False)
def _round_q8(xf, m, k, of, block=32):
    """of = round_q8(x, block) for the m rows of x (flat xf, k a multiple of block): per block, a =
    max |x|, q = rint(x (127 / a)) and d = a / 127 in float32, of = q d (reference.round_q8's
    operations); a block of zeros stays zero, one holding a NaN or an inf becomes NaN."""
    big = np.float32(3.4028235e38)
    for o in range(0, m * k, block):
        a = np.float32(0)
        bad = False
        for t in range(block):
            v = abs(xf[o + t])
            if not v <= big:
                bad = True
            elif v > a:
                a = v
        if bad:
            for t in range(block):
                of[o + t] = np.float32(np.nan)
        elif a == 0:
            for t in range(block):
                of[o + t] = 0
        else:
            inv = np.float32(127) / a
            d = a / np.float32(127)
            for t in range(block):
                of[o + t] = np.rint(xf[o + t] * inv) * d


@jit(cache=CACHE)
def linear_q8_rows(x, blocks, kind, b, has_bias, out, nthreads):
    """out[r, j] = round_q8(x[r]) . W_j (+ b[j]): linear_q_rows on x rounded to 8 bits a block of 32
    (silkattn.reference.round_q8), operands as linear_q_rows's."""
    m, k = x.shape
    rounded = np.empty(m * k, x.dtype)
    _round_q8(x.reshape(-1), m, k, rounded)
    linear_q_rows(rounded.reshape(m, k), blocks, kind, b, has_bias, out, nthreads)


# No fastmath here nor in dequantize_rows: not even 'contract', so that Q4_1's d q + m rounds twice
# as the reference's does (one FMA would round it once: not its bits).
@jit(cache=CACHE)
def _dequantize_row(kind, out, bf, row, nb, of, o, buf):
    """of[o : o + 32 nb] = the weights of the nb blocks from byte row of bf. A register of blocks'
    float16 scales converted at a time (vload_halves, as _scales) into buf, then each block's q
    converted a register at a time (bytes widened, sign-extended for Q8_0; a 4-bit block's byte t
    holds q_t in its low nibble, q_(t + 16) in its high one) and scaled as the reference: d q
    (Q8_0), d (q - 8) (Q4_0; q - 8 is exact), d q + m (Q4_1). A function of its own, not prange's
    body: here the register's lanes are a constant (the loops over a block unroll)."""
    W = vwidth(out)
    size = BLOCK_BYTES[kind]
    head = 4 if kind == Q4_1 else 2
    eight = vsplat(out, 8)
    for i0 in range(0, nb, W):
        d, m = vload_halves(out, bf, row + i0 * size, size, nb - i0)
        vstore(buf, 0, d)
        vstore(buf, W, m)
        for i in range(i0, min(nb, i0 + W)):
            q = row + i * size + head
            vd = vbcast(buf, i - i0)
            at = o + i * 32
            if kind == Q8_0:
                for v in range(0, 32, W):
                    vstore(of, at + v, vmul(vload_q8(out, bf, q + v), vd))
            elif kind == Q4_0:
                for v in range(0, 32, W):
                    w = vsub(vload_q4(out, bf, q + v % 16, 0 if v < 16 else 4), eight)
                    vstore(of, at + v, vmul(vd, w))
            else:
                vm = vbcast(buf, W + i - i0)
                for v in range(0, 32, W):
                    w = vload_q4(out, bf, q + v % 16, 0 if v < 16 else 4)
                    vstore(of, at + v, vadd(vmul(vd, w), vm))


# every float16 as its float32 (exact: a float16 is a float32 with fewer bits), by its bits
F16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@jit(inline="always")
def _f16(bf, at):
    """The little-endian float16 at byte at of bf as a float32 (a lookup: exact)."""
    return F16[np.int64(bf[at]) | np.int64(bf[at + 1]) << 8]


@jit(inline="always")
def _dequantize_row_ext(kind, bf, row, k, of, o):
    """of[o : o + k] = the weights of the row at byte row of bf in Q5_0, Q5_1, Q4_K, Q5_K or Q6_K
    (reference.dequantize's layouts and arithmetic, kernels/quant_ext.h's loops): scalar code."""
    size, weights = BLOCK_BYTES[kind], BLOCK_WEIGHTS[kind]
    for blk in range(k // weights):
        p, at = row + blk * size, o + blk * weights
        if kind == Q5_0 or kind == Q5_1:
            one = kind == Q5_1
            d = _f16(bf, p)
            m = _f16(bf, p + 2) if one else np.float32(0)
            qh = p + (4 if one else 2)
            h = 0
            for t in range(4):
                h |= np.int64(bf[qh + t]) << (8 * t)
            for j in range(16):
                byte = np.int64(bf[qh + 4 + j])
                lo, hi = (byte & 15) | ((h >> j) & 1) << 4, (byte >> 4) | ((h >> (j + 16)) & 1) << 4
                if one:
                    of[at + j] = d * np.float32(lo) + m
                    of[at + j + 16] = d * np.float32(hi) + m
                else:
                    of[at + j] = d * np.float32(lo - 16)
                    of[at + j + 16] = d * np.float32(hi - 16)
        elif kind == Q6_K:
            d = _f16(bf, p + 208)
            for e0 in range(0, 256, 16):  # a sub-block of 16: one scale, one run of bytes
                half, s, l0 = e0 // 128, e0 % 128 // 32, e0 % 32
                low, high = p + 64 * half + 32 * (s % 2) + l0, p + 128 + 32 * half + l0
                sc = np.int64(bf[p + 192 + e0 // 16])
                ds = d * np.float32(sc - 256 if sc > 127 else sc)
                for t in range(16):
                    byte = np.int64(bf[low + t])
                    lo = byte & 15 if s < 2 else byte >> 4
                    hi = (np.int64(bf[high + t]) >> (2 * s)) & 3
                    of[at + e0 + t] = ds * np.float32((lo | hi << 4) - 32)
        else:
            _q45k_block(kind, bf, p, of, at)


@jit(inline="always")
def _q45k_block(kind, bf, p, of, at):
    """Q4_K / Q5_K: sub-block b (32 weights) w = (d s_b) q - (dmin m_b); the 6-bit scales and mins
    unpacked as reference._k_scales, the fifth bits (Q5_K) bit b of byte l."""
    d, dmin = _f16(bf, p), _f16(bf, p + 2)
    s, qh, qs = p + 4, p + 16, p + BLOCK_BYTES[kind] - 128
    for b in range(8):
        if b < 4:
            sc, mn = np.int64(bf[s + b]) & 63, np.int64(bf[s + b + 4]) & 63
        else:
            sc = (np.int64(bf[s + b + 4]) & 15) | (np.int64(bf[s + b - 4]) >> 6) << 4
            mn = (np.int64(bf[s + b + 4]) >> 4) | (np.int64(bf[s + b]) >> 6) << 4
        ds, dm = d * np.float32(sc), dmin * np.float32(mn)
        q = qs + 32 * (b // 2)
        for t in range(32):
            v = np.int64(bf[q + t]) >> 4 if b % 2 else np.int64(bf[q + t]) & 15
            if kind == Q5_K:
                v |= ((np.int64(bf[qh + t]) >> b) & 1) << 4
            of[at + 32 * b + t] = ds * np.float32(v) - dm


@jit(cache=CACHE, parallel=True)
def dequantize_rows(blocks, kind, j0, out, nthreads):
    """out[r] = dequantize(blocks[j0 + r], kind) (silkattn.reference.dequantize, bit for bit): blocks
    (n, k / 32 * block bytes) uint8, out (rows, k) float32, C-contiguous. One block of rows a
    thread, each with its buffer of a register of scales (and one of Q4_1's m)."""
    rows, k = out.shape
    ldw = blocks.shape[1]
    nb = k // 32
    bf = blocks.reshape(-1)
    of = out.reshape(-1)
    buf_all = np.empty((nthreads, 2 * vwidth(out)), out.dtype)
    for p in prange(nthreads):
        buf = buf_all[p]
        for r in range(p * rows // nthreads, (p + 1) * rows // nthreads):
            if kind >= ROW_KINDS:
                _dequantize_row_ext(kind, bf, (j0 + r) * ldw, k, of, r * k)
            else:
                _dequantize_row(kind, out, bf, (j0 + r) * ldw, nb, of, r * k, buf)


GEMM_PANEL_BYTES = 1 << 22  # W's rows the threads dequantize at a time for a GEMM (kernels/linear_q.pyx's)


@jit(cache=CACHE, parallel=True)
def gemm_q(x, blocks, kind, out, sgemm, ilp64, nthreads):
    """out = x W for W = dequantize(blocks, kind)^T and many rows of x (m, k), never W whole in
    float32: each thread its share of W's rows (out's columns), a panel of GEMM_PANEL_BYTES / threads
    at a time dequantized into its own buffer (dequantize_rows's arithmetic) and multiplied by the
    BLAS's sgemm (linear.gemm's) into out's columns: kernels/linear_q.pyx's gemm_q, the same numbers."""
    m, k = x.shape
    n, ldw = blocks.shape
    nb = k // 32
    T, share = _share(n, nthreads)
    panel = max(16, GEMM_PANEL_BYTES // T // (4 * k) // 16 * 16)
    bf = blocks.reshape(-1)
    bufs = np.empty((T, panel * k), out.dtype)
    scales = np.empty((T, 2 * vwidth(out)), out.dtype)
    xa, oa = np.int64(x.ctypes.data), np.int64(out.ctypes.data)
    for t in prange(T):
        buf = bufs[t]
        j = t * share
        end = min(n, j + share)
        while j < end:
            rows = min(panel, end - j)
            for r in range(rows):
                if kind >= ROW_KINDS:
                    _dequantize_row_ext(kind, bf, (j + r) * ldw, k, buf, r * k)
                else:
                    _dequantize_row(kind, out, bf, (j + r) * ldw, nb, buf, r * k, scales[t])
            _sgemm(sgemm, ilp64, True, (m, rows, k, k, k, n), xa, np.int64(buf.ctypes.data), oa + j * 4)
            j += rows


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def linear_qx_rows(x, blocks, kind, b, has_bias, out, nthreads):
    """out = x W (+ b) for W = dequantize(blocks, kind)^T, kind Q5_0 .. Q6_K (codes from ROW_KINDS),
    float32 x (m, k), a few rows: each block of a row of W decoded once into the thread's buffer of
    256 (scalar: _dequantize_row_ext on the one block), then multiplied with every row of x. The
    threads share W's rows, ROWS a task, each with its own buffer."""
    m, k = x.shape
    n, ldw = blocks.shape
    size, weights = BLOCK_BYTES[kind], BLOCK_WEIGHTS[kind]
    bf = blocks.reshape(-1)
    tasks = (n + ROWS - 1) // ROWS
    buf_all = np.empty((nthreads, 256 + 8), np.float32)
    for p in prange(nthreads):
        wb, acc = buf_all[p, :256], buf_all[p, 256:]
        for t in range(p * tasks // nthreads, (p + 1) * tasks // nthreads):
            for j in range(t * ROWS, min(n, (t + 1) * ROWS)):
                acc[:] = 0
                for blk in range(k // weights):
                    _dequantize_row_ext(kind, bf, j * ldw + blk * size, weights, wb, 0)
                    e = blk * weights
                    for r in range(m):
                        s = np.float32(0)
                        for i in range(weights):
                            s += x[r, e + i] * wb[i]
                        acc[r] += s
                for r in range(m):
                    out[r, j] = acc[r] + (b[j] if has_bias else np.float32(0))
