"""Numba attention backward over the forward's silkattn._plan.Plan: the C kernel's algorithm
(kernels/tmpl_attention_backward.h), one K/V unit a task taken by the threads from a shared counter.

For each key tile of a unit (BK keys) and each query tile of the unit's items that can see it (BQ
queries), the weights are recomputed from the forward's lse:
  S = Q K^T; s = hide(softcap(scale S) + bias + ALiBi); P = exp(s - lse)
  dP = dO V^T; dS = scale P (dP - D) (1 - tanh^2 under a softcap), 0 where a key is hidden
  dV_tile += P^T dO; dK_tile += dS^T Q; dQ_rows += dS K
every product by the forward's 4-row x 2-register micro-kernel (attention._block_4x2) over padded
row-major tiles (P and dS transposed into scratch for the two products that read them by column).
dK and dV of a key tile are summed in scratch over all the unit's queries and written once; dQ's
rows belong to the unit's items alone. A key tile outside a query tile's window is skipped unless
a row of the query tile has every key hidden (lse near MASKED: its weights are uniform).
"""
import math
from collections import namedtuple

import numpy as np
from numba import prange

from ._simd import vexp_sub, vwidth
from .attention import (
    EXACT_BELOW,
    IT_BIAS,
    IT_MASK,
    IT_OUT,
    IT_POS,
    IT_Q,
    IT_SQ,
    MASKED,
    UN_K,
    UN_SK,
    UN_V,
    _block_4x2,
    _jit,
    _take,
)

BQ = 64
BK = 64

# q, k, v, mask, bias: the plan's flat operands; dout (rows x d_v), D, lse: per output row (row i of
# an item at item.out / d_v + i); dq (zeroed), dk, dv: the gradients in q's, k's and v's layouts
# fix: per row (base, rel), its weights exp((s - base) - rel): (lse, 0), or for a row whose lse is near
# MASKED (every key hidden: -1e9 + ln(keys) is -1e9 in float32) its max score and ln sum exp(s - max)
Operands = namedtuple("Operands", ["q", "k", "v", "mask", "bias", "dout", "D", "lse", "dq", "dk", "dv",
                                   "fix"])
# items, units: int64 (n, fields) views of the plan's tables; nslopes: -slope per item; order: the
# items sorted by unit, unit u's at order[first[u]:first[u + 1]]
Tables = namedtuple("Tables", ["items", "nslopes", "units", "order", "first"])
# row steps, d_k, d_v and their padded widths (whole pairs of registers), scale, cap (0: none), the
# window, the features, the threads
Scalars = namedtuple("Scalars", ["rs_q", "rs_k", "rs_v", "rs_mask", "rs_bias", "dk", "dv", "dkp", "dvp",
                                 "scale", "cap", "left", "right", "has_mask", "has_bias", "has_alibi",
                                 "nthreads"])


@_jit()
def scratch_layout(dkp, dvp):
    """Offsets of one thread's scratch: kt (dk x BK, K^T), vt (dv x BK), kr (BK x dkp, K), dka, dva
    (the tile's dK, dV), qr, dor, dqt (BQ x dkp / dvp: Q, dO, dQ rows), s, ds, t (BQ x BK: P, dS, tanh),
    pt, dst (BK x BQ: P^T, dS^T), lt, dt (BQ: lse, D), hid (BQ x BK marks), and the total."""
    sizes = (dkp * BK, dvp * BK, BK * dkp, BK * dkp, BK * dvp, BQ * dkp, BQ * dvp, BQ * dkp,
             BQ * BK, BQ * BK, BQ * BK, BK * BQ, BK * BQ, BQ, BQ, BQ * BK)
    offsets = np.zeros(len(sizes) + 1, np.int64)
    for i in range(len(sizes)):
        offsets[i + 1] = offsets[i] + (sizes[i] + 15) // 16 * 16
    return offsets


@_jit(parallel=True)
def attention_backward_units(ops, tabs, scalars, work):
    """Every unit of the plan, taken in order by sc.nthreads threads; work: (>= nthreads, total of
    scratch_layout) scratch, a row per thread."""
    op, tb, sc = Operands(*ops), Tables(*tabs), Scalars(*scalars)
    counter = np.zeros(1, np.int64)
    nunits = tb.first.shape[0] - 1
    for p in prange(sc.nthreads):
        buf = work[p]
        while True:
            u = _take(counter, 0)
            if u >= nunits:
                break
            _unit(u, op, tb, sc, buf)


@_jit()
def _gemm(m, n, kk, A, a0, lda, B, b0, ldb, C, c0, add):
    """C[c0 + r n + 0:n] (+)= sum_{p < kk} A[a0 + r lda + p] B[b0 + p ldb + 0:n] for r < m (m a
    multiple of 4, n of two registers): C's rows n apart."""
    W2 = 2 * vwidth(C)
    for r0 in range(0, m, 4):
        for j in range(0, n, W2):
            _block_4x2(A, a0 + r0 * lda, lda, B, b0 + j, ldb, kk, C, c0 + r0 * n + j, n, add)


@_jit()
def _load(src, s0, ld, rows, cols, dst, d0, nrows, ncols):
    """rows x cols of src (rows ld apart) into dst's nrows x ncols block at d0, zero past them."""
    for r in range(nrows):
        d = d0 + r * ncols
        n = cols if r < rows else 0
        if n:
            dst[d:d + n] = src[s0 + r * ld:s0 + r * ld + n]
        dst[d + n:d + ncols] = 0


@_jit()
def _unit(u, op, tb, sc, buf):
    """Unit u's dK and dV rows, and the dQ rows of its items (the module doc)."""
    o = scratch_layout(sc.dkp, sc.dvp)
    dk, dv, dkp, dvp = sc.dk, sc.dv, sc.dkp, sc.dvp
    kb, vb, sk = tb.units[u, UN_K], tb.units[u, UN_V], tb.units[u, UN_SK]
    _rows_fix(u, op, tb, sc)
    for k0 in range(0, sk, BK):
        nk = min(BK, sk - k0)
        for c in range(dk):
            for j in range(BK):
                buf[o[0] + c * BK + j] = op.k[kb + (k0 + j) * sc.rs_k + c] if j < nk else 0
        for c in range(dv):
            for j in range(BK):
                buf[o[1] + c * BK + j] = op.v[vb + (k0 + j) * sc.rs_v + c] if j < nk else 0
        _load(op.k, kb + k0 * sc.rs_k, sc.rs_k, nk, dk, buf, o[2], BK, dkp)
        buf[o[3]:o[5]] = 0  # dK, dV of the tile
        for e in range(tb.first[u], tb.first[u + 1]):
            b = tb.order[e]
            for q0 in range(0, tb.items[b, IT_SQ], BQ):
                _pair(b, q0, k0, nk, op, tb, sc, buf, o)
        for j in range(nk):
            for c in range(dk):
                op.dk[kb + (k0 + j) * sc.rs_k + c] = buf[o[3] + j * dkp + c]
            for c in range(dv):
                op.dv[vb + (k0 + j) * sc.rs_v + c] = buf[o[4] + j * dvp + c]


@_jit()
def _pair(b, q0, k0, nk, op, tb, sc, buf, o):
    """Query tile q0 of item b against the key tile k0 (packed in buf): the tile's dK, dV sums and
    the item's dQ rows."""
    it = tb.items
    nq = min(BQ, it[b, IT_SQ] - q0)
    pb, row0 = it[b, IT_POS] + q0, it[b, IT_OUT] // sc.dv
    hidden_row = False
    for r in range(nq):
        buf[o[14] + r] = op.D[row0 + q0 + r]
        hidden_row |= not (op.lse[row0 + q0 + r] >= EXACT_BELOW)
    seen = k0 + nk - 1 >= pb - sc.left and k0 <= pb + nq - 1 + sc.right
    if not seen and not hidden_row:
        return
    dkp, dvp = sc.dkp, sc.dvp
    _load(op.q, it[b, IT_Q] + q0 * sc.rs_q, sc.rs_q, nq, sc.dk, buf, o[5], BQ, dkp)
    _load(op.dout, (row0 + q0) * sc.dv, sc.dv, nq, sc.dv, buf, o[6], BQ, dvp)
    _gemm(BQ, BK, sc.dk, buf, o[5], dkp, buf, o[0], BK, buf, o[8], False)  # S = Q K^T
    _gemm(BQ, BK, sc.dv, buf, o[6], dvp, buf, o[1], BK, buf, o[9], False)  # dP = dO V^T
    _weights(b, q0, nq, k0, nk, op, tb, sc, buf, o)
    for r in range(BQ):  # P^T, dS^T
        for j in range(BK):
            buf[o[11] + j * BQ + r] = buf[o[8] + r * BK + j]
            buf[o[12] + j * BQ + r] = buf[o[9] + r * BK + j]
    _gemm(BK, dvp, BQ, buf, o[11], BQ, buf, o[6], dvp, buf, o[4], True)  # dV += P^T dO
    _gemm(BK, dkp, BQ, buf, o[12], BQ, buf, o[5], dkp, buf, o[3], True)  # dK += dS^T Q
    _gemm(BQ, dkp, BK, buf, o[9], BK, buf, o[2], dkp, buf, o[7], False)  # dQ = dS K
    qb = it[b, IT_Q] + q0 * sc.rs_q
    for r in range(nq):
        op.dq[qb + r * sc.rs_q:qb + r * sc.rs_q + sc.dk] += buf[o[7] + r * dkp:o[7] + r * dkp + sc.dk]


@_jit()
def _rows_fix(u, op, tb, sc):
    """op.fix of every row of unit u's items (the Operands note): the exact pass over all the keys of
    the rare rows whose lse is below EXACT_BELOW, in float64."""
    it = tb.items
    kb, sk = tb.units[u, UN_K], tb.units[u, UN_SK]
    for e in range(tb.first[u], tb.first[u + 1]):
        b = tb.order[e]
        for i in range(it[b, IT_SQ]):
            row = it[b, IT_OUT] // sc.dv + i
            op.fix[2 * row], op.fix[2 * row + 1] = op.lse[row], 0
            if op.lse[row] >= EXACT_BELOW:
                continue
            p, qb = it[b, IT_POS] + i, it[b, IT_Q] + i * sc.rs_q
            m, total = -np.inf, 0.0
            for rnd in range(2):
                for j in range(sk):
                    s = op.q[qb] - op.q[qb]
                    for c in range(sc.dk):
                        s += op.q[qb + c] * op.k[kb + j * sc.rs_k + c]
                    s = s * sc.scale
                    if sc.cap > 0:
                        s = sc.cap * math.tanh(s / sc.cap)
                    if sc.has_bias:
                        s += op.bias[it[b, IT_BIAS] + i * sc.rs_bias + j]
                    if sc.has_alibi:
                        s += tb.nslopes[b] * abs(p - j)
                    if (sc.has_mask and op.mask[it[b, IT_MASK] + i * sc.rs_mask + j] == 0) \
                            or j < p - sc.left or j > p + sc.right:
                        s = MASKED
                    if rnd == 0:
                        m = max(m, s)
                    else:
                        total += math.exp(s - m)
            op.fix[2 * row], op.fix[2 * row + 1] = m, math.log(total)


@_jit()
def _weights(b, q0, nq, k0, nk, op, tb, sc, buf, o):
    """P (over S at o[8]) and dS (over dP at o[9]) of the tile pair, every feature as the reference."""
    it = tb.items
    pb = it[b, IT_POS] + q0
    scale, cap = sc.scale, sc.cap
    partial = sc.has_mask or nk < BK or k0 < pb + nq - 1 - sc.left or k0 + nk - 1 > pb + sc.right
    for r in range(BQ):
        sr, dr = o[8] + r * BK, o[9] + r * BK
        if r >= nq:
            buf[sr:sr + BK] = 0
            buf[dr:dr + BK] = 0
            continue
        row = it[b, IT_OUT] // sc.dv + q0 + r
        base, rel, d = op.fix[2 * row], op.fix[2 * row + 1], buf[o[14] + r]
        if not (partial or cap > 0 or sc.has_bias or sc.has_alibi):  # the plain tile, vectorised
            for j in range(BK):
                buf[sr + j] *= scale
            vexp_sub(buf, sr, buf, sr, BK, base + rel)
            for j in range(BK):
                buf[dr + j] = buf[sr + j] * (buf[dr + j] - d) * scale
            continue
        mrow = it[b, IT_MASK] + (q0 + r) * sc.rs_mask + k0
        brow = it[b, IT_BIAS] + (q0 + r) * sc.rs_bias + k0
        for j in range(BK):
            s = buf[sr + j] * scale
            th = s - s
            if cap > 0:
                th = math.tanh(s / cap)
                s = cap * th
            hidden = False
            if partial:
                key = k0 + j
                hidden = j >= nk or key < pb + r - sc.left or key > pb + r + sc.right or (
                    sc.has_mask and op.mask[mrow + j] == 0)
            if hidden:
                s = MASKED
            else:
                if sc.has_bias:
                    s += op.bias[brow + j]
                if sc.has_alibi:
                    s += tb.nslopes[b] * abs(pb + r - k0 - j)
            p = math.exp((s - base) - rel)
            g = p * (buf[dr + j] - d) * scale
            if cap > 0:
                g *= 1 - th * th
            buf[sr + j] = p
            buf[dr + j] = 0 if hidden else g
