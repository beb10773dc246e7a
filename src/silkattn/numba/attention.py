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
  1. S = Q K^T by a R-row x 2-register micro-kernel (accumulators in registers, _block_4x2),
  2. the per-score features (_features, each pass only when its feature is on), the running max,
     p = exp(s - m) by a vectorised polynomial exp, the running sum, the rescale of the accumulator,
  3. acc += P V by a R-row x 2-register micro-kernel over d_v (_block_4x2 again).
Rows path (attention_rows): few query rows per K/V unit (decode, a few new tokens, the heads of a
GQA group). The group's visible keys are cut into chunks by the plan; a chunk leaves, per row, a
partial (m, l, acc) over its keys, read straight from K and V, each block of DEC_BLOCK keys once for
all the rows of the group (the block stays in cache); the thread finishing a group's last chunk
merges its partials: m = max m_c, l = sum l_c e^(m_c - m), out = sum acc_c e^(m_c - m) / l.

Both entry points take the plan as three records, filled by the driver (driver.attention): the
arrays (Operands), the plan's tables (Tables) and its scalars (Scalars). They come in as plain
tuples, which Numba types in well under a microsecond (a namedtuple goes through Python's typeof,
about 0.15 us a field), and are named on entry (Operands(*ops), ...): every helper reads them by
field.
"""
import math
from collections import namedtuple

import numba
import numpy as np
from numba import prange

from .._plan import CHUNK, GROUP, ITEM, ROW, ROWS_MAX, TASK, UNIT
from ._jit import jit
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
    vexp_sub,
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
uidx = np.uint64       # an unsigned index type Numba does not wrap around, so LLVM vectorises the copies

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
    return jit(cache=CACHE, fastmath=FASTMATH, **kw)


# q, k, v, mask, bias: the plan's flat operands (read-only), out: the flat result; kp, vp: the tiles
# path's packed K and V (pack_kv); parts: the rows path's partial results; what a path does not use
# is an empty array of the call's dtype; lse: empty, or every output row's log sum exp of its scores
# (row i of an item at item.out / d_v + i), what attention_backward recomputes the weights from.
Operands = namedtuple("Operands", ["q", "k", "v", "mask", "bias", "out", "kp", "vp", "parts", "lse"])
# int64 (n, fields) views of the plan's tables (their columns named above); nslopes: the items'
# -slope in the call's dtype; tile0[u]: unit u's first packed tile, tile_unit[w]: the unit of tile w;
# tasks (tiles path) or groups, rows, chunks (rows path), the other path's empty.
# pages: a paged plan's (K, V) offsets of its pages' first rows (int64 (n, 2); (0, 2) when not paged)
Tables = namedtuple("Tables", ["items", "nslopes", "units", "tile0", "tile_unit", "tasks", "groups", "rows",
                               "chunks", "pages"])
# the operands' row steps, d_k, d_v, d_v padded to the P V micro-kernel's registers (tiles path), the
# scale and softcap in the call's dtype (every score is computed in it), the window, the features,
# and the threads (Numba's current count, passed in: numba.get_num_threads() in jitted code would
# make the function uncachable)
# page_keys: a paged plan's keys a page (0: not paged)
Scalars = namedtuple("Scalars", ["rs_q", "rs_k", "rs_v", "rs_mask", "rs_bias", "dk", "dv", "dvp", "scale",
                                 "cap", "left", "right", "has_mask", "has_bias", "has_alibi", "nthreads",
                                 "page_keys"])


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
def _features(S, s0, n, npad, j0, p, sc, bias, mask, at, nslope, windowed):
    """The scores S[s0 : s0 + n] of keys j0 .. j0 + n - 1 for the query at position p, in place, in
    the reference's order: softcap (sc.cap > 0), + bias (key j0's at bias[at[0]]), + ALiBi (nslope =
    -slope), then hidden keys to MASKED: mask == 0 (key j0's at mask[at[1]]) or, when windowed,
    outside p - left <= j <= p + right. S[s0 + n : s0 + npad] (no key) = -inf, so they weigh 0.
    Each pass runs only when its feature is on. (The arrays come in as arrays, not in a record:
    each field taken from a record is a reference count up and down, too dear per row of a block.)"""
    cap, left, right = sc.cap, sc.left, sc.right
    brow, mrow = at
    if cap > 0:
        _softcap(S, s0, npad, cap)
    if sc.has_bias:
        for j in range(n):
            S[uidx(s0 + j)] += bias[uidx(brow + j)]
    if sc.has_alibi:
        for j in range(n):
            S[uidx(s0 + j)] += nslope * abs(p - j0 - j)
    if sc.has_mask:
        for j in range(n):
            if mask[uidx(mrow + j)] == 0:
                S[uidx(s0 + j)] = MASKED
    if windowed:  # keys before p - left, then keys after p + right
        for j in range(min(n, max(0, p - left - j0))):
            S[uidx(s0 + j)] = MASKED
        for j in range(max(0, min(n, p + right + 1 - j0)), n):
            S[uidx(s0 + j)] = MASKED
    for j in range(n, npad):
        S[uidx(s0 + j)] = -np.inf


@_jit(inline="always")
def _key_base(tb, sc, ku, vu, j):
    """(K, V) offsets from which key j of the unit whose k, v fields are ku, vu sits at + j rs_k
    (+ j rs_v): the unit's own, or in a paged plan those of j's page (its keys are consecutive rows;
    ku names the unit's first page)."""
    if sc.page_keys == 0:
        return ku, vu
    page = j // sc.page_keys
    first = page * sc.page_keys
    return tb.pages[ku + page, 0] - first * sc.rs_k, tb.pages[ku + page, 1] - first * sc.rs_v


@_jit()
def _exact_row(op, tb, sc, ob, qrow, kv, mrow, brow, p, sk, nslope, row):
    """One query row the plain two-pass way over all its sk keys, every feature as in the
    reference and hidden scores = MASKED: for the rare rows whose final max is below EXACT_BELOW
    (e.g. every key hidden, which gives mean(V)), where the skipped and zero-flushed hidden keys
    would have counted. The query at qrow, key j at k + j * rs_k (v likewise) from kv = (k, v), the
    item's fields (_key_base: a paged plan's pages), its mask and bias
    at mrow + j and brow + j; p: its position; out[ob : ob + dv]: the result; row: >= sk scratch."""
    q, k, v, mask, bias, out = op.q, op.k, op.v, op.mask, op.bias, op.out
    rs_k, rs_v, dk, dv = sc.rs_k, sc.rs_v, sc.dk, sc.dv
    scale, cap, left, right = sc.scale, sc.cap, sc.left, sc.right
    has_mask, has_bias, has_alibi = sc.has_mask, sc.has_bias, sc.has_alibi
    zero = scale - scale
    for j in range(sk):
        s = zero
        kb = _key_base(tb, sc, kv[0], kv[1], j)[0] + j * rs_k
        for d in range(dk):
            s += q[qrow + d] * k[kb + d]
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
        vb = _key_base(tb, sc, kv[0], kv[1], j)[1] + j * rs_v
        for d in range(dv):
            out[ob + d] += row[j] * v[vb + d]
    for d in range(dv):
        out[ob + d] = out[ob + d] / total
    if op.lse.size:
        op.lse[ob // dv] = m + math.log(total)


# ---------------------------------------------------------------- tiles path

@_jit(parallel=True)
def pack_kv(ops, tabs, scalars):
    """Each unit's K as key-contiguous tiles (tile w = tile0[u] + t at kp[w * dk * BK], [d, key])
    and V as rows padded to dvp lanes (key t * BK + j of unit u at vp[((tile0[u] + t) * BK + j) *
    dvp]); zero padding past the unit's keys and dv. The records as attention_tiles takes them."""
    op, tb, sc = Operands(*ops), Tables(*tabs), Scalars(*scalars)
    for w in prange(tb.tile_unit.size):
        _pack_tile(w, op, tb, sc)


@_jit()
def pack_kv_serial(ops, tabs, scalars):
    """pack_kv on the calling thread alone (a one-thread call need not pay for a parallel launch)."""
    op, tb, sc = Operands(*ops), Tables(*tabs), Scalars(*scalars)
    for w in range(tb.tile_unit.size):
        _pack_tile(w, op, tb, sc)


@_jit()
def _pack_tile(w, op, tb, sc):
    """Tile w of pack_kv. Indices are unsigned (uidx): for a signed index Numba adds the wrap-around
    of negative ones, a branch that keeps LLVM from vectorising the copies."""
    k, v, kp, vp, units = op.k, op.v, op.kp, op.vp, tb.units
    rs_k, rs_v, dk, dv, dvp = sc.rs_k, sc.rs_v, sc.dk, sc.dv, sc.dvp
    u = tb.tile_unit[w]
    k0 = (w - tb.tile0[u]) * BK
    nk = max(0, min(BK, units[u, UN_SK] - k0))
    kb = w * dk * BK
    j = 0
    while j + 8 <= nk:  # 8 keys at a time, so each d writes 8 adjacent values
        src = units[u, UN_K] + (k0 + j) * rs_k
        for d in range(dk):
            o = kb + d * BK + j
            for jj in range(8):
                kp[uidx(o + jj)] = k[uidx(src + jj * rs_k + d)]
        j += 8
    for jr in range(j, nk):
        src = units[u, UN_K] + (k0 + jr) * rs_k
        for d in range(dk):
            kp[uidx(kb + d * BK + jr)] = k[uidx(src + d)]
    for d in range(dk):
        for jr in range(nk, BK):
            kp[uidx(kb + d * BK + jr)] = 0
    vb = w * BK * dvp
    for jr in range(nk):
        src = units[u, UN_V] + (k0 + jr) * rs_v
        dst = vb + jr * dvp
        for d in range(dv):
            vp[uidx(dst + d)] = v[uidx(src + d)]
        for d in range(dv, dvp):
            vp[uidx(dst + d)] = 0
    for x in range(vb + nk * dvp, vb + BK * dvp):
        vp[uidx(x)] = 0


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
def _block_4x2(A, a0, lda, B, b0, ldb, n, C, c0, ldc, accumulate):
    """The tiles path's micro-kernel: C[c0 + r ldc + (0 .. 2W)] (+)= sum_{p < n} A[a0 + r lda + p]
    B[b0 + p ldb + (0 .. 2W)] for the R = 4 rows r, 8 accumulators in registers (starting from C's
    values if accumulate, else from 0). S = Q K^T: A the scaled query tile, B the packed key tile
    (BK keys a row of d); acc += P V: A the probabilities, B the padded V rows."""
    W = vwidth(C)
    if accumulate:
        c00 = vload(C, c0)
        c01 = vload(C, c0 + W)
        c10 = vload(C, c0 + ldc)
        c11 = vload(C, c0 + ldc + W)
        c20 = vload(C, c0 + 2 * ldc)
        c21 = vload(C, c0 + 2 * ldc + W)
        c30 = vload(C, c0 + 3 * ldc)
        c31 = vload(C, c0 + 3 * ldc + W)
    else:
        c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = vsplat(C, 0)
    for p in range(n):
        ba = vload(B, b0 + p * ldb)
        bc = vload(B, b0 + p * ldb + W)
        x = vbcast(A, a0 + p)
        c00 = vfma(x, ba, c00)
        c01 = vfma(x, bc, c01)
        x = vbcast(A, a0 + lda + p)
        c10 = vfma(x, ba, c10)
        c11 = vfma(x, bc, c11)
        x = vbcast(A, a0 + 2 * lda + p)
        c20 = vfma(x, ba, c20)
        c21 = vfma(x, bc, c21)
        x = vbcast(A, a0 + 3 * lda + p)
        c30 = vfma(x, ba, c30)
        c31 = vfma(x, bc, c31)
    vstore(C, c0, c00)
    vstore(C, c0 + W, c01)
    vstore(C, c0 + ldc, c10)
    vstore(C, c0 + ldc + W, c11)
    vstore(C, c0 + 2 * ldc, c20)
    vstore(C, c0 + 2 * ldc + W, c21)
    vstore(C, c0 + 3 * ldc, c30)
    vstore(C, c0 + 3 * ldc + W, c31)


@_jit(parallel=True)
def attention_tiles(ops, tabs, scalars, work):
    """The plan's tasks (item, q0, rows), taken in order by sc.nthreads threads; the records (the
    module docstring): K and V packed by pack_kv into kp and vp; work: (>= nthreads,
    tile_scratch(...)[-1]) scratch, a row per thread."""
    op, tb, sc = Operands(*ops), Tables(*tabs), Scalars(*scalars)
    counter = np.zeros(1, np.int64)
    tasks = tb.tasks
    ntasks = tasks.shape[0]
    # One parallel iteration per thread, each taking the next task until none is left (a static
    # split of the tasks would load one thread with most of a causal triangle).
    for p in prange(sc.nthreads):
        buf = work[p]
        while True:
            t = _take(counter, 0)
            if t >= ntasks:
                break
            _tile(tasks[t, TA_ITEM], tasks[t, TA_Q0], tasks[t, TA_ROWS], op, tb, sc, buf)


@_jit(inline="always")
def _tile_start(op, sc, Qp, acc, mrun, lrun, qb, q0, nq, nqr):
    """Reset the running max, sum and accumulator of rows 0 .. nq, and pack the task's queries,
    scaled, into Qp (nq, dk); rows nq .. nqr of both are zeros (whole register blocks)."""
    q, rs_q, dk, dvp, scale = op.q, sc.rs_q, sc.dk, sc.dvp, sc.scale
    for r in range(nq):
        mrun[r] = -np.inf
        lrun[r] = 0
    for x in range(nqr * dvp):
        acc[uidx(x)] = 0
    for r in range(nq):
        qr = qb + (q0 + r) * rs_q
        for d in range(dk):
            Qp[uidx(r * dk + d)] = q[uidx(qr + d)] * scale
    for x in range(nq * dk, nqr * dk):
        Qp[uidx(x)] = 0


@_jit(inline="always")
def _tile_hidden(mask, mb, q0, nq, rs_mask, k0, nk):
    """Does the mask hide keys k0 .. k0 + nk from every row q0 .. q0 + nq of the task?"""
    hidden = True
    for r in range(nq):
        mr = mb + (q0 + r) * rs_mask + k0
        for j in range(nk):
            if mask[mr + j] != 0:
                hidden = False
                break
        if not hidden:
            break
    return hidden


@_jit(inline="always")
def _tile_scores(Qp, kp, kb, S, nk, nqr, P0, k0, sc):
    """S = Q_tile K_tile^T for one key tile (packed at kp[kb]): R rows x 2 registers of keys a block.
    A block whose (row, key) pairs are all hidden by the window (the causal diagonal's upper part, a
    window's edge) or past the tile's nk keys is not computed: _features then overwrites its scores
    (MASKED, or -inf past nk) before they are read."""
    W2 = 2 * vwidth(S)
    dk, left, right = sc.dk, sc.left, sc.right
    for jv in range(0, min(nk, BK), W2):
        for r0 in range(0, nqr, R):
            if jv <= P0 + r0 + R - 1 + right - k0 and jv + W2 - 1 >= P0 + r0 - left - k0:
                _block_4x2(Qp, r0 * dk, dk, kp, kb + jv, BK, dk, S, r0 * BK + jv, BK, False)


@_jit(inline="always")
def _tile_pv(S, vp, vb, acc, nk, nqr, P0, k0, sc):
    """acc += P V_tile (V's tile packed at vp[vb]): R rows x 2 registers of d_v a block, each block
    over only the keys its rows can see (the others weigh exactly 0, or the row takes the exact
    path)."""
    W2 = 2 * vwidth(S)
    dvp, left, right = sc.dvp, sc.left, sc.right
    for r0 in range(0, nqr, R):
        jlo = max(0, P0 + r0 - left - k0)
        jhi = min(nk, P0 + r0 + R - 1 + right - k0 + 1)
        if jlo >= jhi:
            continue
        for dc in range(0, dvp, W2):
            _block_4x2(S, r0 * BK + jlo, BK, vp, vb + jlo * dvp + dc, dvp, jhi - jlo, acc, r0 * dvp + dc, dvp,
                       True)


@_jit(inline="always")
def _tile_out(b, q0, nq, op, tb, sc, acc, mrun, lrun, buf):
    """The task's output rows: acc / l, or the exact path for rows whose max is tiny."""
    items, out, dv, dvp = tb.items, op.out, sc.dv, sc.dvp
    pos, qb, mb, bb = items[b, IT_POS], items[b, IT_Q], items[b, IT_MASK], items[b, IT_BIAS]
    o_row = tile_scratch(sc.dk, dvp, 0)[4]
    sk = items[b, IT_SK]
    for r in range(nq):
        i = q0 + r
        ob = items[b, IT_OUT] + i * dv
        if mrun[r] < EXACT_BELOW:
            _exact_row(op, tb, sc, ob, qb + i * sc.rs_q, (items[b, IT_K], items[b, IT_V]),
                       mb + i * sc.rs_mask, bb + i * sc.rs_bias, pos + i, sk, tb.nslopes[b],
                       buf[o_row:o_row + sk])
        else:
            inv = lrun[r]
            for d in range(dv):
                out[uidx(ob + d)] = acc[uidx(r * dvp + d)] / inv
            if op.lse.size:
                op.lse[ob // dv] = mrun[r] + math.log(inv)


@_jit()
def _tile(b, q0, nq, op, tb, sc, buf):
    """Output rows q0 .. q0 + nq - 1 of item b (nq <= BQ); buf: this thread's scratch."""
    o_acc, o_q, o_m, o_l, o_row, _ = tile_scratch(sc.dk, sc.dvp, 0)
    S = buf[:o_acc]              # scores, then probabilities: (BQ, BK)
    acc = buf[o_acc:o_q]         # running P V: (BQ, dvp)
    Qp = buf[o_q:o_m]            # the query tile, scaled: (BQ, dk)
    mrun = buf[o_m:o_l]          # running max
    lrun = buf[o_l:o_row]        # running sum
    W = vwidth(op.out)
    items, mask, bias, kp, vp, tile0 = tb.items, op.mask, op.bias, op.kp, op.vp, tb.tile0
    dk, dvp, left, right = sc.dk, sc.dvp, sc.left, sc.right
    u, sk, pos = items[b, IT_UNIT], items[b, IT_SK], items[b, IT_POS]
    qb, mb, bb = items[b, IT_Q], items[b, IT_MASK], items[b, IT_BIAS]
    nslope = tb.nslopes[b]
    nqr = (nq + R - 1) // R * R  # whole register blocks; rows nq .. nqr: zero queries, results unused
    _tile_start(op, sc, Qp, acc, mrun, lrun, qb, q0, nq, nqr)
    # the keys some row can see: the first row's window start to the last row's window end
    P0 = pos + q0
    P1 = P0 + nq - 1
    j_lo = min(sk, max(0, P0 - left))
    j_hi = max(j_lo, min(sk, P1 + right + 1))
    for t in range(j_lo // BK, (j_hi + BK - 1) // BK):
        k0 = t * BK
        nk = min(BK, sk - k0)
        if sc.has_mask and _tile_hidden(mask, mb, q0, nq, sc.rs_mask, k0, nk):
            continue
        _tile_scores(Qp, kp, (tile0[u] + t) * dk * BK, S, nk, nqr, P0, k0, sc)
        # ---- the features, then the online softmax per row
        windowed = k0 < P1 - left or k0 + nk - 1 > P0 + right  # the window hides some key from some row
        for r in range(nq):
            i = q0 + r
            _features(S, r * BK, nk, BK, k0, pos + i, sc, bias, mask,
                      (bb + i * sc.rs_bias + k0, mb + i * sc.rs_mask + k0), nslope, windowed)
            # the online softmax of row r: p = exp(s - m_new), l and acc rescaled by e^(m - m_new)
            sr = r * BK
            mx = vload(S, sr)
            for jv in range(W, BK, W):
                mx = vmax(mx, vload(S, sr + jv))
            m_new = max(mrun[r], hmax(mx))
            if m_new == -np.inf:  # every score so far -inf (a -inf bias): nothing to add yet
                for jv in range(0, BK, W):
                    vstore(S, sr + jv, vsplat(S, 0))
                continue
            sm = vexp_sub(S, sr, S, sr, BK, m_new)
            if m_new > mrun[r]:
                alpha = math.exp(mrun[r] - m_new)
                lrun[r] = lrun[r] * alpha
                if alpha != 1:
                    va = vsplat(S, alpha)
                    for dc in range(0, dvp, W):
                        vstore(acc, r * dvp + dc, vmul(vload(acc, r * dvp + dc), va))
                mrun[r] = m_new
            lrun[r] += hsum(sm)
        _tile_pv(S, vp, (tile0[u] + t) * BK * dvp, acc, nk, nqr, P0, k0, sc)
    _tile_out(b, q0, nq, op, tb, sc, acc, mrun, lrun, buf)


# ---------------------------------------------------------------- rows path
# A chunk goes through its keys a block of DEC_BLOCK keys at a time, each block used by every row
# of the group while it is in L1: Q K^T four keys at a time for all the rows (two rows at once, so
# each key register is loaded once for both; four dot products a row whose sums come out as one
# vector, vsum4), then the online softmax row by row over the block's scores (a row of scratch
# each), then P V for all the rows together, register-blocked over rows (each V register loaded
# once for RB_PV rows, RB_PV x 4 independent FMA chains).

LDS = _round16(DEC_BLOCK + 16)  # a row of a block's scores (vsum4 stores a whole register at key nb - 4)
# rows per P V register block: 4 rows x 4 registers of accumulators + 4 of V fit AVX-512's 32
# registers; AVX2's 16 take 2 rows
RB_PV = 4 if VBYTES == 64 else 2


@_jit()
def _rows_layout(dk):
    """Offsets in one thread's rows-path scratch of the block's scores (after the group's scaled
    queries, ROWS_MAX rows of _round16(dk)) and of the exact path's row (after ROWS_MAX score rows)."""
    o_s = ROWS_MAX * _round16(dk)
    return o_s, o_s + ROWS_MAX * LDS


@_jit()
def rows_scratch(dk, sk_max):
    """Elements of one thread's rows-path scratch (_rows_layout, then the exact path's row)."""
    return _rows_layout(dk)[1] + _round16(sk_max)


@_jit(parallel=True)
def attention_rows(ops, tabs, scalars, work):
    """The plan's chunks taken in order by sc.nthreads threads; the thread that completes a group's
    last chunk merges the group's partial results (op.parts: (rows x (dv + 2)) values, row r of
    chunk c at (c.part + r) * (dv + 2): m, l, acc[dv]); work: a row of rows_scratch(...) a thread."""
    op, tb, sc = Operands(*ops), Tables(*tabs), Scalars(*scalars)
    chunks, groups = tb.chunks, tb.groups
    counter = np.zeros(1, np.int64)     # the next chunk
    done = np.zeros(groups.shape[0], np.int64)  # each group's chunks done
    nchunks = chunks.shape[0]
    for p in prange(sc.nthreads):
        buf = work[p]
        while True:
            c = _take(counter, 0)
            if c >= nchunks:
                break
            g = chunks[c, CH_GROUP]
            # one row (a decoding step): its own small function, whose loops keep their pointers in
            # registers (in _chunk, the multi-row blocks' register pressure spills them)
            if groups[g, GR_NROWS] == 1:
                _chunk_row(c, op, tb, sc, buf)
            else:
                _chunk(c, op, tb, sc, buf)
            if _take(done, g) == groups[g, GR_NCHUNKS] - 1:
                _merge(g, op, tb, sc, buf)


@_jit()
def _chunk(c, op, tb, sc, buf):
    """The partial results of chunk c: keys j0 .. j1 - 1 of its group's unit, for every row."""
    q, k, v, mask, bias, parts = op.q, op.k, op.v, op.mask, op.bias, op.parts
    items, nslopes, units, rows = tb.items, tb.nslopes, tb.units, tb.rows
    chunks, groups = tb.chunks, tb.groups
    dk, dv, rs_k = sc.dk, sc.dv, sc.rs_k
    g, j0, j1, part0 = chunks[c, CH_GROUP], chunks[c, CH_J0], chunks[c, CH_J1], chunks[c, CH_PART]
    u, row0, nr = groups[g, GR_UNIT], groups[g, GR_ROW0], groups[g, GR_NROWS]
    o_s, _ = _rows_layout(dk)
    dkr = _round16(dk)
    qv = buf[:o_s]                # the rows' queries, scaled: row r at r * dkr
    s = buf[o_s:]                 # the block's scores, then weights: row r at r * LDS
    for r in range(nr):
        b, i = rows[row0 + r, RW_ITEM], rows[row0 + r, RW_I]
        qr = items[b, IT_Q] + i * sc.rs_q
        for d in range(dk):
            qv[r * dkr + d] = q[qr + d] * sc.scale
        pb = (part0 + r) * (dv + 2)
        parts[pb] = -np.inf
        for x in range(pb + 1, pb + dv + 2):
            parts[x] = 0
    # the chunk's keys (in a paged plan, one page's)
    kb0, vb0 = _key_base(tb, sc, units[u, UN_K], units[u, UN_V], j0)
    k0 = j0
    while k0 < j1:
        nb = min(DEC_BLOCK, j1 - k0)
        _rows_qk(qv, dkr, nr, k, kb0 + k0 * rs_k, rs_k, dk, nb, s)
        for r in range(nr):
            b, i = rows[row0 + r, RW_ITEM], rows[row0 + r, RW_I]
            at = (items[b, IT_BIAS] + i * sc.rs_bias + k0, items[b, IT_MASK] + i * sc.rs_mask + k0)
            _row_softmax(s, r * LDS, nb, k0, items[b, IT_POS] + i, parts, (part0 + r) * (dv + 2), sc, bias,
                         mask, at, nslopes[b])
        _rows_pv(s, nr, nb, v, vb0 + k0 * sc.rs_v, sc.rs_v, dv, parts, part0 * (dv + 2) + 2)
        k0 += nb


@_jit()
def _chunk_row(c, op, tb, sc, buf):
    """_chunk for a group of one row, over the keys of its window only."""
    q, k, v, mask, bias, parts = op.q, op.k, op.v, op.mask, op.bias, op.parts
    items, units, rows, chunks, groups = tb.items, tb.units, tb.rows, tb.chunks, tb.groups
    dk, dv, rs_k, rs_v, left, right = sc.dk, sc.dv, sc.rs_k, sc.rs_v, sc.left, sc.right
    g, j0, j1, pb = chunks[c, CH_GROUP], chunks[c, CH_J0], chunks[c, CH_J1], chunks[c, CH_PART] * (dv + 2)
    u, b, i = groups[g, GR_UNIT], rows[groups[g, GR_ROW0], RW_ITEM], rows[groups[g, GR_ROW0], RW_I]
    o_s, _ = _rows_layout(dk)
    W = vwidth(parts)
    dkv = dk - dk % W
    dvv = dv - dv % W
    qv = buf[:o_s]
    s = buf[o_s:]
    qr = items[b, IT_Q] + i * sc.rs_q
    for d in range(dk):
        qv[d] = q[qr + d] * sc.scale
    parts[pb] = -np.inf
    for x in range(pb + 1, pb + dv + 2):
        parts[x] = 0
    p = items[b, IT_POS] + i
    nslope = tb.nslopes[b]
    # the chunk's keys (in a paged plan, one page's)
    kb0, vb0 = _key_base(tb, sc, units[u, UN_K], units[u, UN_V], j0)
    k0 = max(j0, p - left)   # the row's window within the chunk (the other keys would weigh 0)
    kend = min(j1, p + right + 1)
    while k0 < kend:
        nb = min(DEC_BLOCK, kend - k0)
        kb = kb0 + k0 * rs_k
        j = 0
        while j + 4 <= nb:
            _qk_1x4(qv, 0, k, kb + j * rs_k, rs_k, dk, dkv, s, j)
            j += 4
        for jt in range(j, nb):
            c0 = vsplat(s, 0)
            for d in range(0, dkv, W):
                c0 = vfma(vload(qv, d), vload(k, kb + jt * rs_k + d), c0)
            s0 = hsum(c0)
            for d in range(dkv, dk):
                s0 += qv[d] * k[kb + jt * rs_k + d]
            s[jt] = s0
        at = (items[b, IT_BIAS] + i * sc.rs_bias + k0, items[b, IT_MASK] + i * sc.rs_mask + k0)
        _row_softmax(s, 0, nb, k0, p, parts, pb, sc, bias, mask, at, nslope)
        vb = vb0 + k0 * rs_v
        cc = 0
        while cc + 4 * W <= dvv:
            _pv_1x4(s, 0, nb, v, vb + cc, rs_v, parts, pb + 2 + cc)
            cc += 4 * W
        _pv_rest(s, 0, nb, v, vb, rs_v, cc, dv, parts, pb + 2)
        k0 += nb


@_jit(inline="always")
def _rows_qk(qv, dkr, nr, k, kb, rs_k, dk, nb, s):
    """s[r * LDS + j] = qv[r * dkr :] . (key j at k[kb + j * rs_k]) for the nr rows and nb keys:
    four keys at a time for every row (the keys stay in L1), two rows at once where two are left."""
    W = vwidth(s)
    dkv = dk - dk % W
    j = 0
    while j + 4 <= nb:
        r = 0
        while r + 2 <= nr:
            _qk_2x4(qv, r * dkr, dkr, k, kb + j * rs_k, rs_k, dk, dkv, s, r * LDS + j)
            r += 2
        if r < nr:
            _qk_1x4(qv, r * dkr, k, kb + j * rs_k, rs_k, dk, dkv, s, r * LDS + j)
        j += 4
    for jt in range(j, nb):  # the last keys one at a time
        kr = kb + jt * rs_k
        for r in range(nr):
            c0 = vsplat(s, 0)
            for d in range(0, dkv, W):
                c0 = vfma(vload(qv, r * dkr + d), vload(k, kr + d), c0)
            s0 = hsum(c0)
            for d in range(dkv, dk):
                s0 += qv[r * dkr + d] * k[kr + d]
            s[r * LDS + jt] = s0


@_jit(inline="always")
def _load4(a, i, step):
    """The four registers at a[i], a[i + step], a[i + 2 step], a[i + 3 step]."""
    return vload(a, i), vload(a, i + step), vload(a, i + 2 * step), vload(a, i + 3 * step)


@_jit(inline="always")
def _store4(a, i, x):
    W = vwidth(a)
    vstore(a, i, x[0])
    vstore(a, i + W, x[1])
    vstore(a, i + 2 * W, x[2])
    vstore(a, i + 3 * W, x[3])


@_jit(inline="always")
def _fma4(p, v, x):
    """x + p v for four registers x and v, p one register (four independent FMA chains)."""
    return vfma(p, v[0], x[0]), vfma(p, v[1], x[1]), vfma(p, v[2], x[2]), vfma(p, v[3], x[3])


@_jit(inline="always")
def _qk_1x4(qv, q0, k, kb, rs_k, dk, dkv, s, sb):
    """s[sb : sb + 4] = the query at qv[q0] . the 4 keys at k[kb], k[kb + rs_k], ...: four chains of
    FMAs, their sums as one vector (lanes past sb + 3 are written too: the next keys' or slack)."""
    W = vwidth(s)
    zero = vsplat(s, 0)
    a = (zero, zero, zero, zero)
    for d in range(0, dkv, W):
        a = _fma4(vload(qv, q0 + d), _load4(k, kb + d, rs_k), a)
    vstore(s, sb, vsum4(a[0], a[1], a[2], a[3]))
    for d in range(dkv, dk):
        for uu in range(4):
            s[sb + uu] += qv[q0 + d] * k[kb + uu * rs_k + d]


@_jit(inline="always")
def _qk_2x4(qv, q0, dkr, k, kb, rs_k, dk, dkv, s, sb):
    """_qk_1x4 for the two queries at qv[q0] and qv[q0 + dkr] (scores at sb and sb + LDS): each key
    register loaded once for both, eight chains."""
    W = vwidth(s)
    zero = vsplat(s, 0)
    a = b = (zero, zero, zero, zero)
    for d in range(0, dkv, W):
        kv = _load4(k, kb + d, rs_k)
        a = _fma4(vload(qv, q0 + d), kv, a)
        b = _fma4(vload(qv, q0 + dkr + d), kv, b)
    vstore(s, sb, vsum4(a[0], a[1], a[2], a[3]))
    vstore(s, sb + LDS, vsum4(b[0], b[1], b[2], b[3]))
    for d in range(dkv, dk):
        for uu in range(4):
            s[sb + uu] += qv[q0 + d] * k[kb + uu * rs_k + d]
            s[sb + LDS + uu] += qv[q0 + dkr + d] * k[kb + uu * rs_k + d]


@_jit(inline="always")
def _row_softmax(s, sb, nb, k0, p, parts, pb, sc, bias, mask, at, nslope):
    """One row's step of the online softmax over a block: its scores s[sb : sb + nb] (keys k0 ..,
    query at position p) through _features (bias, mask and at as there), then to weights
    exp(s - m) in place (zero to whole registers); its partial result at parts[pb] (m, l, acc)
    updated to the new max."""
    dv, left, right = sc.dv, sc.left, sc.right
    W = vwidth(s)
    npad = (nb + W - 1) // W * W
    if k0 + nb - 1 < p - left or k0 > p + right:  # no key of the block in the row's window
        for j in range(npad):
            s[sb + j] = 0  # weighs nothing in the P V that follows
        return
    windowed = k0 < p - left or k0 + nb - 1 > p + right  # the window's edge is in the block
    _features(s, sb, nb, npad, k0, p, sc, bias, mask, at, nslope, windowed)
    m = parts[pb]
    mv = vsplat(s, m)  # a NaN score is not the max, but its weight, NaN, spreads
    for j in range(0, npad, W):
        mv = vmax(mv, vload(s, sb + j))
    mnew = hmax(mv)
    if mnew == -np.inf:  # every score so far -inf (a -inf bias): nothing to add yet
        for j in range(npad):
            s[sb + j] = 0
        return
    sm = vexp_sub(s, sb, s, sb, npad, mnew)
    alpha = math.exp(m - mnew)
    parts[pb] = mnew
    parts[pb + 1] = parts[pb + 1] * alpha + hsum(sm)
    if alpha != 1:
        for cc in range(pb + 2, pb + 2 + dv):
            parts[cc] *= alpha


@_jit(inline="always")
def _rows_pv(s, nr, nb, v, vb, rs_v, dv, parts, a0):
    """acc_r += sum_j s[r * LDS + j] V[vb + j * rs_v] over the block's nb keys, for the nr rows (acc_r
    at parts[a0 + r * (dv + 2)]): blocks of RB_PV (or fewer) rows x 4 registers of d_v, then
    single registers, then the columns past the last whole register."""
    W = vwidth(parts)
    dvv = dv - dv % W
    lda = dv + 2
    cc = 0
    while cc + 4 * W <= dvv:
        r = 0
        if RB_PV == 4:
            while r + 4 <= nr:
                _pv_4x4(s, r * LDS, nb, v, vb + cc, rs_v, parts, a0 + r * lda + cc, lda)
                r += 4
        while r + 2 <= nr:
            _pv_2x4(s, r * LDS, nb, v, vb + cc, rs_v, parts, a0 + r * lda + cc, lda)
            r += 2
        if r < nr:
            _pv_1x4(s, r * LDS, nb, v, vb + cc, rs_v, parts, a0 + r * lda + cc)
        cc += 4 * W
    for r in range(nr):
        _pv_rest(s, r * LDS, nb, v, vb, rs_v, cc, dv, parts, a0 + r * lda)


@_jit(inline="always")
def _pv_rest(s, sb, nb, v, vb, rs_v, c0, dv, parts, a):
    """Columns c0 .. dv of one row's P V (weights at s[sb], accumulator at parts[a]): a register at
    a time, then the columns past the last whole register one by one."""
    W = vwidth(parts)
    dvv = dv - dv % W
    for c1 in range(c0, dvv, W):
        x0 = vload(parts, a + c1)
        for j in range(nb):
            x0 = vfma(vbcast(s, sb + j), vload(v, vb + j * rs_v + c1), x0)
        vstore(parts, a + c1, x0)
    for ct in range(max(c0, dvv), dv):
        for j in range(nb):
            parts[a + ct] += s[sb + j] * v[vb + j * rs_v + ct]


@_jit(inline="always")
def _pv_1x4(s, sb, nb, v, vb, rs_v, parts, a):
    """parts[a : a + 4W] += sum_j s[sb + j] V[vb + j * rs_v : + 4W]: four chains (one row)."""
    W = vwidth(parts)
    x = _load4(parts, a, W)
    for j in range(nb):
        x = _fma4(vbcast(s, sb + j), _load4(v, vb + j * rs_v, W), x)
    _store4(parts, a, x)


@_jit(inline="always")
def _pv_2x4(s, sb, nb, v, vb, rs_v, parts, a, lda):
    """_pv_1x4 for two rows (weights at sb and sb + LDS, accumulators at a and a + lda): each V
    register loaded once for both, eight chains."""
    W = vwidth(parts)
    x = _load4(parts, a, W)
    y = _load4(parts, a + lda, W)
    for j in range(nb):
        vr = _load4(v, vb + j * rs_v, W)
        x = _fma4(vbcast(s, sb + j), vr, x)
        y = _fma4(vbcast(s, sb + LDS + j), vr, y)
    _store4(parts, a, x)
    _store4(parts, a + lda, y)


@_jit(inline="always")
def _pv_4x4(s, sb, nb, v, vb, rs_v, parts, a, lda):
    """_pv_2x4 for four rows (weights LDS apart, accumulators lda apart): sixteen chains, each V
    register loaded once for the four rows (AVX-512: 16 + 4 + 1 of its 32 registers)."""
    W = vwidth(parts)
    x = _load4(parts, a, W)
    y = _load4(parts, a + lda, W)
    z = _load4(parts, a + 2 * lda, W)
    w = _load4(parts, a + 3 * lda, W)
    for j in range(nb):
        vr = _load4(v, vb + j * rs_v, W)
        x = _fma4(vbcast(s, sb + j), vr, x)
        y = _fma4(vbcast(s, sb + LDS + j), vr, y)
        z = _fma4(vbcast(s, sb + 2 * LDS + j), vr, z)
        w = _fma4(vbcast(s, sb + 3 * LDS + j), vr, w)
    _store4(parts, a, x)
    _store4(parts, a + lda, y)
    _store4(parts, a + 2 * lda, z)
    _store4(parts, a + 3 * lda, w)


@_jit()
def _merge(g, op, tb, sc, buf):
    """Group g's rows from its chunks' partial results (in chunk order, whoever merges); a row whose
    max is below EXACT_BELOW (no visible key, every score near MASKED) takes the exact path."""
    out, parts, items, rows, chunks, groups = op.out, op.parts, tb.items, tb.rows, tb.chunks, tb.groups
    dk, dv, scale = sc.dk, sc.dv, sc.scale
    row0, nr, ch0, nch = groups[g, GR_ROW0], groups[g, GR_NROWS], groups[g, GR_CHUNK0], groups[g, GR_NCHUNKS]
    o_row = _rows_layout(dk)[1]  # the exact path's row
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
            _exact_row(op, tb, sc, ob, items[b, IT_Q] + i * sc.rs_q, (items[b, IT_K], items[b, IT_V]),
                       items[b, IT_MASK] + i * sc.rs_mask, items[b, IT_BIAS] + i * sc.rs_bias,
                       items[b, IT_POS] + i, sk, tb.nslopes[b], buf[o_row:o_row + sk])
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
        if op.lse.size:
            op.lse[ob // dv] = m + math.log(lsum)
