"""Numba attention kernels: one silkattn._plan.Plan run on its "tiles" or "rows" path, never
materialising Sq x Sk (the entry point, silkattn.numba.driver.attention, packs K/V and keeps the
per-thread workspace).

Every score follows silkattn.reference, in its order and in the arrays' dtype: s = (scale Q) . k;
s = cap * tanh(s / cap) (softcap); s += bias; s += -slope * |p - j| (ALiBi); keys hidden by the mask
or the window (j < p - left or j > p + right, p the query's position) get MASKED; then an online
softmax and P V. A key that is skipped (a key tile no row of a task can see, a tile the mask hides
from every row, the part of a rows-path block outside a row's window) counts as exactly 0, which is
what the reference gives it, exp(MASKED - max), unless the row's max is itself near MASKED (every
key hidden, or scores near -1e9): rows whose max ends below EXACT_BELOW are recomputed over all
their keys by _exact_row (a fully hidden row gets mean(V)).

Work is dealt dynamically: the threads take the plan's tasks (or chunks) in the plan's order from
a shared counter (an atomic fetch-add); every output row is computed the same way whichever thread
runs it, so results do not depend on the thread count.

Tiles path (attention_tiles): a task is (item, first query q0, rows <= BQ). Its queries, scaled,
are packed row-major; K is packed once per K/V unit as key-contiguous tiles kp[tile, d, key] (keys
on the SIMD axis) and V as rows padded to whole registers, so each key tile of BK keys goes through
  1. S = Q K^T by a R-row x 2-register micro-kernel (accumulators in registers, _qk_block),
  2. the per-score features (_features, each pass only when its feature is on), the running max,
     p = exp(s - m) by a vectorised polynomial exp, the running sum, the rescale of the accumulator,
  3. acc += P V by a R-row x 2-register micro-kernel over d_v (_pv_block).
Rows path (attention_rows): few query rows per K/V unit (decode, a few new tokens, the heads of a
GQA group). The group's visible keys are cut into chunks by the plan; a chunk leaves, per row, a
partial (m, l, acc) over its keys, read straight from K and V, each block of DEC_BLOCK keys once for
all the rows of the group (the block stays in cache); the thread finishing a group's last chunk
merges its partials: m = max m_c, l = sum l_c e^(m_c - m), out = sum acc_c e^(m_c - m) / l.
"""
import math

import numba
import numpy as np
from numba import prange

from .._plan import CHUNK, GROUP, ITEM, ROW, ROWS_MAX, TASK, UNIT
from ._simd import (
    CACHE,
    FASTMATH,
    VBYTES,
    hmax,
    hsum,
    vadd,
    vbcast,
    vdiv,
    vexp,
    vfma,
    vload,
    vmax,
    vmin,
    vmul,
    vsplat,
    vstore,
    vsub,
    vsum4,
    vwidth,
)

MASKED = -1e9          # the score a hidden key gets (replaced, as in silkattn.reference)
# A skipped or hidden key counts as exactly 0, which is what the reference gives unless the row's
# max is within EXACT_MARGIN of MASKED (exp(-745) already underflows float64): such rows are redone
# exactly. The same margin as the C kernel's SA_EXACT_MARGIN (kernels/attention.h).
EXACT_BELOW = MASKED + 2000.0
# The blocking geometry: tiles of BQ queries x BK keys (the BQ x BK score tile stays in L1), and
# register blocks of R rows x 2 registers (the register width is _simd.LANES) in both micro-kernels.
BQ = 64                # a multiple of R; the plan's tasks have at most BQ rows (driver: TileGeometry)
BK = 64
R = 4
DEC_BLOCK = 64         # rows path: keys per block of the online softmax
U = np.uint64          # an index type Numba does not wrap around, so LLVM vectorises the copies

# The plan's tables are passed as int64 (n, fields) views (driver._tables: every field is 8 bytes);
# their columns, by name (the ITEM slope column is read from its own float64 array).
_col = {dt: {name: i for i, name in enumerate(dt.names)} for dt in (ITEM, UNIT, TASK, GROUP, ROW, CHUNK)}
IT_Q, IT_K, IT_V, IT_MASK, IT_BIAS, IT_OUT, IT_SQ, IT_SK, IT_POS, IT_UNIT = (
    _col[ITEM][n] for n in ("q", "k", "v", "mask", "bias", "out", "sq", "sk", "pos", "unit"))
UN_K, UN_V, UN_SK = (_col[UNIT][n] for n in ("k", "v", "sk"))
TA_ITEM, TA_Q0, TA_ROWS = (_col[TASK][n] for n in ("item", "q0", "rows"))
GR_UNIT, GR_ROW0, GR_NROWS, GR_CHUNK0, GR_NCHUNKS = (
    _col[GROUP][n] for n in ("unit", "row0", "nrows", "chunk0", "nchunks"))
RW_ITEM, RW_I = (_col[ROW][n] for n in ("item", "i"))
CH_GROUP, CH_J0, CH_J1, CH_PART = (_col[CHUNK][n] for n in ("group", "j0", "j1", "part"))


def _jit(**kw):
    return numba.njit(nogil=True, cache=CACHE, fastmath=FASTMATH, **kw)


if numba.config.DISABLE_JIT:
    def _take(counter, i):
        """counter[i]++, returning the old value (plain Python: the loops run serially here)."""
        old = counter[i]
        counter[i] += 1
        return old
else:
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def _take(typingctx, counter, i):
        """counter[i]++ as one atomic fetch-add, returning the old value: the next task for the
        calling thread. acq_rel, so a thread that sees a count also sees the partial results the
        threads that counted before it wrote (the rows path's merge)."""
        if not (isinstance(counter, types.Array) and counter.dtype == types.int64 and counter.ndim == 1
                and isinstance(i, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            a = context.make_array(sig.args[0])(context, builder, args[0])
            idx = context.cast(builder, args[1], sig.args[1], types.intp)
            one = ir.Constant(ir.IntType(64), 1)
            return builder.atomic_rmw("add", builder.gep(a.data, [idx]), one, "acq_rel")
        return types.int64(counter, i), codegen


@_jit()
def _round16(n):
    return (n + 15) // 16 * 16


# ---------------------------------------------------------------- the per-score features

@_jit(inline="always")
def _softcap(S, s0, n, cap):
    """S[s0 : s0 + n] = cap * tanh(S / cap) in place, n a whole number of registers."""
    W = vwidth(S)
    vcap = vsplat(S, cap)
    one = vsplat(S, 1.0)
    if W * 4 == VBYTES:
        # float32: Eigen's rational tanh (x P(x^2) / Q(x^2) on x clamped to +-7.9053, where tanh
        # rounds to +-1), ~4e-7 relative error everywhere, zero included
        inv = vsplat(S, 1.0 / cap)
        hi = vsplat(S, 7.90531110763549805)
        lo = vsplat(S, -7.90531110763549805)
        for j in range(0, n, W):
            x = vmax(vmin(vmul(vload(S, s0 + j), inv), hi), lo)
            x2 = vmul(x, x)
            p = vfma(x2, vsplat(S, -2.76076847742355e-16), vsplat(S, 2.00018790482477e-13))
            p = vfma(x2, p, vsplat(S, -8.60467152213735e-11))
            p = vfma(x2, p, vsplat(S, 5.12229709037114e-08))
            p = vfma(x2, p, vsplat(S, 1.48572235717979e-05))
            p = vfma(x2, p, vsplat(S, 6.37261928875436e-04))
            p = vfma(x2, p, vsplat(S, 4.89352455891786e-03))
            qd = vfma(x2, vsplat(S, 1.19825839466702e-06), vsplat(S, 1.18534705686654e-04))
            qd = vfma(x2, qd, vsplat(S, 2.26843463243900e-03))
            qd = vfma(x2, qd, vsplat(S, 4.89352518554385e-03))
            vstore(S, s0 + j, vmul(vcap, vdiv(vmul(x, p), qd)))
    else:
        # float64: tanh(u) = (1 - t) / (1 + t), t = e^(-2u) with -2u <= 40 (tanh(-20) is -1 in
        # float64; vexp is exact enough there); the absolute error, a few ulp of 1, times cap is
        # far inside the float64 tolerance
        m2 = vsplat(S, -2.0 / cap)
        top = vsplat(S, 40.0)
        for j in range(0, n, W):
            t = vexp(vmin(vmul(vload(S, s0 + j), m2), top))
            vstore(S, s0 + j, vmul(vcap, vdiv(vsub(one, t), vadd(one, t))))


@_jit(inline="always")
def _features(S, s0, n, npad, j0, p, cap, bias, brow, has_bias, nslope, has_alibi, mask, mrow, has_mask,
              left, right, windowed):
    """The scores S[s0 : s0 + n] of keys j0 .. j0 + n - 1 for the query at position p, in place, in
    the reference's order: softcap (cap > 0), + bias (key j0's at brow), + ALiBi (nslope = -slope),
    then hidden keys to MASKED: mask == 0 (key j0's at mrow) or, when windowed, outside
    p - left <= j <= p + right. S[s0 + n : s0 + npad] (no key) = -inf, so they weigh 0.
    Each pass runs only when its feature is on."""
    if cap > 0:
        _softcap(S, s0, npad, cap)
    if has_bias:
        for j in range(n):
            S[U(s0 + j)] += bias[U(brow + j)]
    if has_alibi:
        for j in range(n):
            S[U(s0 + j)] += nslope * abs(p - j0 - j)
    if has_mask:
        for j in range(n):
            if mask[U(mrow + j)] == 0:
                S[U(s0 + j)] = MASKED
    if windowed:  # keys before p - left, then keys after p + right
        for j in range(min(n, max(0, p - left - j0))):
            S[U(s0 + j)] = MASKED
        for j in range(max(0, min(n, p + right + 1 - j0)), n):
            S[U(s0 + j)] = MASKED
    for j in range(n, npad):
        S[U(s0 + j)] = -np.inf


@_jit()
def _exact_row(q, k, v, mask, bias, out, ob, qrow, krow, vrow, mrow, brow, rs_k, rs_v, p, sk, dk, dv, scale,
               cap, left, right, has_mask, has_bias, has_alibi, nslope, row):
    """One query row the plain two-pass way over all its sk keys, every feature as in the
    reference and hidden scores = MASKED: for the rare rows whose final max is below EXACT_BELOW
    (e.g. every key hidden, which gives mean(V)), where the skipped and zero-flushed hidden keys
    would have counted. The query at qrow, key j at krow + j * rs_k (v likewise), its mask and bias
    at mrow + j and brow + j; p: its position; out[ob : ob + dv]: the result; row: >= sk scratch."""
    zero = scale - scale
    for j in range(sk):
        s = zero
        for d in range(dk):
            s += q[qrow + d] * k[krow + j * rs_k + d]
        s = s * scale
        if cap > 0:
            s = cap * math.tanh(s / cap)
        if has_bias:
            s += bias[brow + j]
        if has_alibi:
            s += nslope * abs(p - j)
        if (has_mask and mask[mrow + j] == 0) or j < p - left or j > p + right:
            s = MASKED
        row[j] = s
    m = row[0]
    for j in range(1, sk):
        m = max(m, row[j])
    total = zero
    for j in range(sk):
        row[j] = math.exp(row[j] - m)
        total += row[j]
    for d in range(dv):
        out[ob + d] = 0
    for j in range(sk):
        for d in range(dv):
            out[ob + d] += row[j] * v[vrow + j * rs_v + d]
    for d in range(dv):
        out[ob + d] = out[ob + d] / total


# ---------------------------------------------------------------- tiles path

@_jit(parallel=True)
def pack_kv(k, v, units, tile0, tile_unit, rs_k, rs_v, dk, dv, dvp, kp, vp):
    """Each unit's K as key-contiguous tiles (tile w = tile0[u] + t at kp[w * dk * BK], [d, key])
    and V as rows padded to dvp lanes (key t * BK + j of unit u at vp[((tile0[u] + t) * BK + j) *
    dvp]); zero padding past the unit's keys and dv. tile_unit[w]: the unit of tile w."""
    for w in prange(tile_unit.size):
        _pack_tile(w, k, v, units, tile0, tile_unit, rs_k, rs_v, dk, dv, dvp, kp, vp)


@_jit()
def pack_kv_serial(k, v, units, tile0, tile_unit, rs_k, rs_v, dk, dv, dvp, kp, vp):
    """pack_kv on the calling thread alone (a one-thread call need not pay for a parallel launch)."""
    for w in range(tile_unit.size):
        _pack_tile(w, k, v, units, tile0, tile_unit, rs_k, rs_v, dk, dv, dvp, kp, vp)


@_jit()
def _pack_tile(w, k, v, units, tile0, tile_unit, rs_k, rs_v, dk, dv, dvp, kp, vp):
    """Tile w of pack_kv. Indices are unsigned (U): for a signed index Numba adds the wrap-around
    of negative ones, a branch that keeps LLVM from vectorising the copies."""
    u = tile_unit[w]
    k0 = (w - tile0[u]) * BK
    nk = max(0, min(BK, units[u, UN_SK] - k0))
    kb = w * dk * BK
    j = 0
    while j + 8 <= nk:  # 8 keys at a time, so each d writes 8 adjacent values
        src = units[u, UN_K] + (k0 + j) * rs_k
        for d in range(dk):
            o = kb + d * BK + j
            for jj in range(8):
                kp[U(o + jj)] = k[U(src + jj * rs_k + d)]
        j += 8
    for jr in range(j, nk):
        src = units[u, UN_K] + (k0 + jr) * rs_k
        for d in range(dk):
            kp[U(kb + d * BK + jr)] = k[U(src + d)]
    for d in range(dk):
        for jr in range(nk, BK):
            kp[U(kb + d * BK + jr)] = 0
    vb = w * BK * dvp
    for jr in range(nk):
        src = units[u, UN_V] + (k0 + jr) * rs_v
        dst = vb + jr * dvp
        for d in range(dv):
            vp[U(dst + d)] = v[U(src + d)]
        for d in range(dv, dvp):
            vp[U(dst + d)] = 0
    for x in range(vb + nk * dvp, vb + BK * dvp):
        vp[U(x)] = 0


@_jit()
def tile_scratch(dk, dvp, sk_max):
    """Offsets of one thread's tiles-path scratch (scores, accumulator, query tile, max, sum,
    exact-path row) and its total length, each part starting on a 64-byte line."""
    o_acc = _round16(BQ * BK)
    o_q = o_acc + _round16(BQ * dvp)
    o_m = o_q + _round16(BQ * dk)
    o_l = o_m + _round16(BQ)
    o_row = o_l + _round16(BQ)
    return o_acc, o_q, o_m, o_l, o_row, o_row + _round16(sk_max)


@_jit(inline="always")
def _qk_block(Qp, q0, dk, kp, kb, S, sb):
    """One register block of scores: S[sb + r * BK + (0 .. 2W)] = Qp[q0 + r * dk + :] . (keys
    0 .. 2W of the packed tile at kp[kb + d * BK]) for the R = 4 rows r; 8 accumulators in registers."""
    W = vwidth(S)
    c00 = vsplat(S, 0)
    c01 = c00
    c10 = c00
    c11 = c00
    c20 = c00
    c21 = c00
    c30 = c00
    c31 = c00
    for d in range(dk):
        ka = vload(kp, kb + d * BK)
        kc = vload(kp, kb + d * BK + W)
        x = vbcast(Qp, q0 + d)
        c00 = vfma(x, ka, c00)
        c01 = vfma(x, kc, c01)
        x = vbcast(Qp, q0 + dk + d)
        c10 = vfma(x, ka, c10)
        c11 = vfma(x, kc, c11)
        x = vbcast(Qp, q0 + 2 * dk + d)
        c20 = vfma(x, ka, c20)
        c21 = vfma(x, kc, c21)
        x = vbcast(Qp, q0 + 3 * dk + d)
        c30 = vfma(x, ka, c30)
        c31 = vfma(x, kc, c31)
    vstore(S, sb, c00)
    vstore(S, sb + W, c01)
    vstore(S, sb + BK, c10)
    vstore(S, sb + BK + W, c11)
    vstore(S, sb + 2 * BK, c20)
    vstore(S, sb + 2 * BK + W, c21)
    vstore(S, sb + 3 * BK, c30)
    vstore(S, sb + 3 * BK + W, c31)


@_jit(inline="always")
def _pv_block(P, pb, nk, vp, vb, dvp, acc, a0):
    """One register block of the accumulator: acc[a0 + r * dvp + (0 .. 2W)] += sum_j P[pb + r * BK
    + j] * V[vb + j * dvp + (0 .. 2W)] over the nk keys, for the R = 4 rows r."""
    W = vwidth(acc)
    c00 = vload(acc, a0)
    c01 = vload(acc, a0 + W)
    c10 = vload(acc, a0 + dvp)
    c11 = vload(acc, a0 + dvp + W)
    c20 = vload(acc, a0 + 2 * dvp)
    c21 = vload(acc, a0 + 2 * dvp + W)
    c30 = vload(acc, a0 + 3 * dvp)
    c31 = vload(acc, a0 + 3 * dvp + W)
    for j in range(nk):
        va = vload(vp, vb + j * dvp)
        vc = vload(vp, vb + j * dvp + W)
        x = vbcast(P, pb + j)
        c00 = vfma(x, va, c00)
        c01 = vfma(x, vc, c01)
        x = vbcast(P, pb + BK + j)
        c10 = vfma(x, va, c10)
        c11 = vfma(x, vc, c11)
        x = vbcast(P, pb + 2 * BK + j)
        c20 = vfma(x, va, c20)
        c21 = vfma(x, vc, c21)
        x = vbcast(P, pb + 3 * BK + j)
        c30 = vfma(x, va, c30)
        c31 = vfma(x, vc, c31)
    vstore(acc, a0, c00)
    vstore(acc, a0 + W, c01)
    vstore(acc, a0 + dvp, c10)
    vstore(acc, a0 + dvp + W, c11)
    vstore(acc, a0 + 2 * dvp, c20)
    vstore(acc, a0 + 2 * dvp + W, c21)
    vstore(acc, a0 + 3 * dvp, c30)
    vstore(acc, a0 + 3 * dvp + W, c31)


@_jit(parallel=True)
def attention_tiles(q, k, v, mask, bias, out, kp, vp, items, nslopes, units, tile0, tasks, rs_q, rs_k, rs_v,
                    rs_mask, rs_bias, dk, dv, dvp, scale, softcap, left, right, has_mask, has_bias, has_alibi,
                    nthreads, work):
    """The plan's tasks (item, q0, rows), taken in order by nthreads threads (Numba's current count,
    passed in: numba.get_num_threads() in jitted code would make the function uncachable); kp, vp:
    K and V packed by pack_kv (tile0: each unit's first tile); work: (>= nthreads,
    tile_scratch(...)[-1]) scratch, a row per thread."""
    sc = np.empty(2, out.dtype)  # the constants in the arrays' dtype
    sc[0] = scale
    sc[1] = softcap
    scale_, cap = sc[0], sc[1]
    counter = np.zeros(1, np.int64)
    ntasks = tasks.shape[0]
    # One parallel iteration per thread, each taking the next task until none is left (a static
    # split of the tasks would load one thread with most of a causal triangle).
    for p in prange(nthreads):
        buf = work[p]
        while True:
            t = _take(counter, 0)
            if t >= ntasks:
                break
            _tile(tasks[t, TA_ITEM], tasks[t, TA_Q0], tasks[t, TA_ROWS], q, k, v, mask, bias, out, kp, vp,
                  items, nslopes, units, tile0, rs_q, rs_k, rs_v, rs_mask, rs_bias, dk, dv, dvp, scale_, cap,
                  left, right, has_mask, has_bias, has_alibi, buf)


@_jit()
def _tile(b, q0, nq, q, k, v, mask, bias, out, kp, vp, items, nslopes, units, tile0, rs_q, rs_k, rs_v,
          rs_mask, rs_bias, dk, dv, dvp, scale, cap, left, right, has_mask, has_bias, has_alibi, buf):
    """Output rows q0 .. q0 + nq - 1 of item b (nq <= BQ); buf: this thread's scratch."""
    o_acc, o_q, o_m, o_l, o_row, _ = tile_scratch(dk, dvp, 0)
    S = buf[:o_acc]              # scores, then probabilities: (BQ, BK)
    acc = buf[o_acc:o_q]         # running P V: (BQ, dvp)
    Qp = buf[o_q:o_m]            # the query tile, scaled: (BQ, dk)
    mrun = buf[o_m:o_l]          # running max
    lrun = buf[o_l:o_row]        # running sum
    W = vwidth(out)
    W2 = 2 * W
    u, sk, pos = items[b, IT_UNIT], items[b, IT_SK], items[b, IT_POS]
    qb, mb, bb = items[b, IT_Q], items[b, IT_MASK], items[b, IT_BIAS]
    nslope = nslopes[b]
    nqr = (nq + R - 1) // R * R  # whole register blocks; rows nq .. nqr: zero queries, results unused
    for r in range(nq):
        mrun[r] = -np.inf
        lrun[r] = 0
    for x in range(nqr * dvp):
        acc[U(x)] = 0
    for r in range(nq):
        qr = qb + (q0 + r) * rs_q
        for d in range(dk):
            Qp[U(r * dk + d)] = q[U(qr + d)] * scale
    for x in range(nq * dk, nqr * dk):
        Qp[U(x)] = 0
    # the keys some row can see: the first row's window start to the last row's window end
    P0 = pos + q0
    P1 = P0 + nq - 1
    j_lo = min(sk, max(0, P0 - left))
    j_hi = max(j_lo, min(sk, P1 + right + 1))
    for t in range(j_lo // BK, (j_hi + BK - 1) // BK):
        k0 = t * BK
        nk = min(BK, sk - k0)
        if has_mask:  # skip a key tile the mask hides from every row of the task
            anyvis = False
            for r in range(nq):
                mr = mb + (q0 + r) * rs_mask + k0
                for j in range(nk):
                    if mask[mr + j] != 0:
                        anyvis = True
                        break
                if anyvis:
                    break
            if not anyvis:
                continue
        # ---- S = Q_tile K_tile^T: R rows x 2 registers of keys a block
        kb = (tile0[u] + t) * dk * BK
        for jv in range(0, BK, W2):
            for r0 in range(0, nqr, R):
                _qk_block(Qp, r0 * dk, dk, kp, kb + jv, S, r0 * BK + jv)
        # ---- the features, then the online softmax per row
        windowed = k0 < P1 - left or k0 + nk - 1 > P0 + right  # the window hides some key from some row
        for r in range(nq):
            i = q0 + r
            sr = r * BK
            _features(S, sr, nk, BK, k0, pos + i, cap, bias, bb + i * rs_bias + k0, has_bias, nslope,
                      has_alibi, mask, mb + i * rs_mask + k0, has_mask, left, right, windowed)
            mx = vload(S, sr)
            for jv in range(W, BK, W):
                mx = vmax(mx, vload(S, sr + jv))
            m_new = max(mrun[r], hmax(mx))
            if m_new == -np.inf:  # every score so far -inf (a -inf bias): nothing to add yet
                for jv in range(0, BK, W):
                    vstore(S, sr + jv, vsplat(S, 0))
                continue
            vm = vsplat(out, m_new)
            vneg = vsplat(out, -1.0)
            sm = vsplat(out, 0)
            for jv in range(0, BK, W):
                pr = vexp(vfma(vm, vneg, vload(S, sr + jv)))
                vstore(S, sr + jv, pr)
                sm = vadd(sm, pr)
            if m_new > mrun[r]:
                alpha = math.exp(mrun[r] - m_new)
                lrun[r] = lrun[r] * alpha
                if alpha != 1:
                    va = vsplat(out, alpha)
                    for dc in range(0, dvp, W):
                        vstore(acc, r * dvp + dc, vmul(vload(acc, r * dvp + dc), va))
                mrun[r] = m_new
            lrun[r] += hsum(sm)
        # ---- acc += P V_tile: R rows x 2 registers of d_v a block
        vb = (tile0[u] + t) * BK * dvp
        for dc in range(0, dvp, W2):
            for r0 in range(0, nqr, R):
                _pv_block(S, r0 * BK, nk, vp, vb + dc, dvp, acc, r0 * dvp + dc)
    # ---- the rows: acc / l, or the exact path for rows whose max is tiny
    for r in range(nq):
        i = q0 + r
        ob = items[b, IT_OUT] + i * dv
        if mrun[r] < EXACT_BELOW:
            _exact_row(q, k, v, mask, bias, out, ob, qb + i * rs_q, items[b, IT_K], items[b, IT_V],
                       mb + i * rs_mask, bb + i * rs_bias, rs_k, rs_v, pos + i, sk, dk, dv, scale, cap, left,
                       right, has_mask, has_bias, has_alibi, nslope, buf[o_row:o_row + sk])
        else:
            inv = lrun[r]
            for d in range(dv):
                out[U(ob + d)] = acc[U(r * dvp + d)] / inv


# ---------------------------------------------------------------- rows path
# One row's scores are a vector in scratch: keys stream past the query four at a time (four dot
# products whose sums come out as one vector, vsum4), the online softmax runs over blocks of
# DEC_BLOCK keys, and P V goes four registers of d_v at a time into the row's partial result.

@_jit()
def rows_scratch(dk, sk_max):
    """Elements of one thread's rows-path scratch: the group's scaled queries (ROWS_MAX rows of
    dk), a block of scores (with a register of slack), the exact path's row."""
    return ROWS_MAX * _round16(dk) + _round16(DEC_BLOCK + 16) + _round16(sk_max)


@_jit(parallel=True)
def attention_rows(q, k, v, mask, bias, out, items, nslopes, units, groups, rows, chunks, parts, rs_q, rs_k,
                   rs_v, rs_mask, rs_bias, dk, dv, scale, softcap, left, right, has_mask, has_bias, has_alibi,
                   nthreads, work):
    """The plan's chunks taken in order by nthreads threads; the thread that completes a group's
    last chunk merges the group's partial results (parts: (rows x (dv + 2)) values, row r of
    chunk c at (c.part + r) * (dv + 2): m, l, acc[dv]); work: a row of rows_scratch(...) a thread."""
    sc = np.empty(2, out.dtype)
    sc[0] = scale
    sc[1] = softcap
    scale_, cap = sc[0], sc[1]
    counter = np.zeros(1, np.int64)     # the next chunk
    done = np.zeros(groups.shape[0], np.int64)  # each group's chunks done
    nchunks = chunks.shape[0]
    for p in prange(nthreads):
        buf = work[p]
        while True:
            c = _take(counter, 0)
            if c >= nchunks:
                break
            _chunk(c, q, k, v, mask, bias, items, nslopes, units, groups, rows, chunks, parts, rs_q, rs_k,
                   rs_v, rs_mask, rs_bias, dk, dv, scale_, cap, left, right, has_mask, has_bias, has_alibi,
                   buf)
            g = chunks[c, CH_GROUP]
            if _take(done, g) == groups[g, GR_NCHUNKS] - 1:
                _merge(g, q, k, v, mask, bias, out, items, nslopes, units, groups, rows, chunks, parts, rs_q,
                       rs_k, rs_v, rs_mask, rs_bias, dk, dv, scale_, cap, left, right, has_mask, has_bias,
                       has_alibi, buf)


@_jit()
def _chunk(c, q, k, v, mask, bias, items, nslopes, units, groups, rows, chunks, parts, rs_q, rs_k, rs_v,
           rs_mask, rs_bias, dk, dv, scale, cap, left, right, has_mask, has_bias, has_alibi, buf):
    """The partial results of chunk c: keys j0 .. j1 - 1 of its group's unit, for every row."""
    g, j0, j1, part0 = chunks[c, CH_GROUP], chunks[c, CH_J0], chunks[c, CH_J1], chunks[c, CH_PART]
    u, row0, nr = groups[g, GR_UNIT], groups[g, GR_ROW0], groups[g, GR_NROWS]
    kb0, vb0 = units[u, UN_K], units[u, UN_V]
    W = vwidth(parts)
    dkv = dk - dk % W
    dvv = dv - dv % W
    dkr = _round16(dk)
    qv = buf[:ROWS_MAX * dkr]             # the rows' queries, scaled: row r at r * dkr
    s = buf[ROWS_MAX * dkr:]              # one block of scores
    for r in range(nr):
        b, i = rows[row0 + r, RW_ITEM], rows[row0 + r, RW_I]
        qr = items[b, IT_Q] + i * rs_q
        for d in range(dk):
            qv[r * dkr + d] = q[qr + d] * scale
        pb = (part0 + r) * (dv + 2)
        parts[pb] = -np.inf
        for x in range(pb + 1, pb + dv + 2):
            parts[x] = 0
    k0 = j0
    while k0 < j1:
        kend = min(j1, k0 + DEC_BLOCK)
        for r in range(nr):  # the block's keys stay in cache for the group's next rows
            b, i = rows[row0 + r, RW_ITEM], rows[row0 + r, RW_I]
            p = items[b, IT_POS] + i
            # the keys of the block this row sees by the window (the others would weigh 0)
            lo = max(k0, p - left)
            nb = min(kend, p + right + 1) - lo
            if nb <= 0:
                continue
            q0 = r * dkr
            j = 0
            while j + 4 <= nb:  # four keys at a time: four chains of FMAs, their sums as one vector
                kb = kb0 + (lo + j) * rs_k
                c0 = vsplat(s, 0)
                c1 = c0
                c2 = c0
                c3 = c0
                for d in range(0, dkv, W):
                    x = vload(qv, q0 + d)
                    c0 = vfma(x, vload(k, kb + d), c0)
                    c1 = vfma(x, vload(k, kb + rs_k + d), c1)
                    c2 = vfma(x, vload(k, kb + 2 * rs_k + d), c2)
                    c3 = vfma(x, vload(k, kb + 3 * rs_k + d), c3)
                vstore(s, j, vsum4(c0, c1, c2, c3))  # lanes past j + 3: overwritten next
                for d in range(dkv, dk):
                    for uu in range(4):
                        s[j + uu] += qv[q0 + d] * k[kb + uu * rs_k + d]
                j += 4
            while j < nb:
                kb = kb0 + (lo + j) * rs_k
                c0 = vsplat(s, 0)
                for d in range(0, dkv, W):
                    c0 = vfma(vload(qv, q0 + d), vload(k, kb + d), c0)
                s0 = hsum(c0)
                for d in range(dkv, dk):
                    s0 += qv[q0 + d] * k[kb + d]
                s[j] = s0
                j += 1
            npad = (nb + W - 1) // W * W
            _features(s, 0, nb, npad, lo, p, cap, bias, items[b, IT_BIAS] + i * rs_bias + lo, has_bias,
                      nslopes[b], has_alibi, mask, items[b, IT_MASK] + i * rs_mask + lo, has_mask, left,
                      right, False)
            pb = (part0 + r) * (dv + 2)
            m = parts[pb]
            mv = vsplat(s, m)  # a NaN score is not the max, but its weight, NaN, spreads
            for jj in range(0, npad, W):
                mv = vmax(mv, vload(s, jj))
            mnew = hmax(mv)
            if mnew == -np.inf:  # every score so far -inf (a -inf bias): nothing to add yet
                continue
            vm = vsplat(s, mnew)
            vneg = vsplat(s, -1.0)
            sm = vsplat(s, 0)
            for jj in range(0, npad, W):
                pr = vexp(vfma(vm, vneg, vload(s, jj)))
                vstore(s, jj, pr)
                sm = vadd(sm, pr)
            alpha = math.exp(m - mnew)
            parts[pb] = mnew
            parts[pb + 1] = parts[pb + 1] * alpha + hsum(sm)
            a = pb + 2  # the row's accumulator
            if alpha != 1:
                for cc in range(dv):
                    parts[a + cc] *= alpha
            vb = vb0 + lo * rs_v
            cc = 0
            while cc + 4 * W <= dvv:  # four registers of d_v: four chains
                a0 = vload(parts, a + cc)
                a1 = vload(parts, a + cc + W)
                a2 = vload(parts, a + cc + 2 * W)
                a3 = vload(parts, a + cc + 3 * W)
                for jj in range(nb):
                    x = vbcast(s, jj)
                    vr = vb + jj * rs_v + cc
                    a0 = vfma(x, vload(v, vr), a0)
                    a1 = vfma(x, vload(v, vr + W), a1)
                    a2 = vfma(x, vload(v, vr + 2 * W), a2)
                    a3 = vfma(x, vload(v, vr + 3 * W), a3)
                vstore(parts, a + cc, a0)
                vstore(parts, a + cc + W, a1)
                vstore(parts, a + cc + 2 * W, a2)
                vstore(parts, a + cc + 3 * W, a3)
                cc += 4 * W
            while cc < dvv:
                a0 = vload(parts, a + cc)
                for jj in range(nb):
                    a0 = vfma(vbcast(s, jj), vload(v, vb + jj * rs_v + cc), a0)
                vstore(parts, a + cc, a0)
                cc += W
            for ct in range(dvv, dv):
                for jj in range(nb):
                    parts[a + ct] += s[jj] * v[vb + jj * rs_v + ct]
        k0 = kend


@_jit()
def _merge(g, q, k, v, mask, bias, out, items, nslopes, units, groups, rows, chunks, parts, rs_q, rs_k, rs_v,
           rs_mask, rs_bias, dk, dv, scale, cap, left, right, has_mask, has_bias, has_alibi, buf):
    """Group g's rows from its chunks' partial results (in chunk order, whoever merges); a row whose
    max is below EXACT_BELOW (no visible key, every score near MASKED) takes the exact path."""
    row0, nr, ch0, nch = groups[g, GR_ROW0], groups[g, GR_NROWS], groups[g, GR_CHUNK0], groups[g, GR_NCHUNKS]
    o_row = ROWS_MAX * _round16(dk) + _round16(DEC_BLOCK + 16)  # the exact path's row (rows_scratch)
    for r in range(nr):
        b, i = rows[row0 + r, RW_ITEM], rows[row0 + r, RW_I]
        ob = items[b, IT_OUT] + i * dv
        m = -np.inf
        for c in range(ch0, ch0 + nch):
            mc = parts[(chunks[c, CH_PART] + r) * (dv + 2)]
            if mc > m or mc != mc:
                m = mc
        if m < EXACT_BELOW:
            sk = items[b, IT_SK]
            _exact_row(q, k, v, mask, bias, out, ob, items[b, IT_Q] + i * rs_q, items[b, IT_K],
                       items[b, IT_V], items[b, IT_MASK] + i * rs_mask, items[b, IT_BIAS] + i * rs_bias, rs_k,
                       rs_v, items[b, IT_POS] + i, sk, dk, dv, scale, cap, left, right, has_mask, has_bias,
                       has_alibi, nslopes[b], buf[o_row:o_row + sk])
            continue
        lsum = scale - scale
        for d in range(dv):
            out[ob + d] = 0
        for c in range(ch0, ch0 + nch):
            pb = (chunks[c, CH_PART] + r) * (dv + 2)
            wgt = math.exp(parts[pb] - m)
            lsum += parts[pb + 1] * wgt
            for d in range(dv):
                out[ob + d] += parts[pb + 2 + d] * wgt
        for d in range(dv):
            out[ob + d] = out[ob + d] / lsum
