"""Numba attention kernel: flash-style tiles with an online softmax, never materialising Sq x Sk.

Design (attention_tiles): work items are (query tile of BQ rows, batch item); the caller deals them
out to the threads balanced by cost (silkattn.numba.driver) and each thread runs its share with
its own scratch. For a query tile, every key tile of BK keys (K packed once per call so that keys
are contiguous: kp[unit, tile, d, key]; V padded to whole registers) goes through
  1. S = (Q * scale) K^T by a 4-row x 2-register micro-kernel (accumulators stay in registers),
  2. masking (explicit mask, causal only on the diagonal tile), the running row max, p = exp(s - m)
     with a vectorised polynomial exp, the running sum, and the rescale of the accumulator,
  3. acc += P V by a 4-row x 2-register micro-kernel over d_v.
Causal key tiles wholly above the diagonal and key tiles an explicit mask hides from every row of
the query tile are skipped. Skipped and masked keys then count as exactly 0 instead of
exp(-1e9 - m), which is what the reference gives unless the row's final max m is itself absurdly
small (every key masked, or scores near -1e9): such rows (max < EXACT_BELOW) are recomputed exactly
over all Sk keys by _exact_row, which gives mean(V) for a fully masked row. Every row is computed
the same way whichever thread runs it, so results do not depend on the thread count.

Kernel contract (see silkattn._api): attention(q, k, v, mask, out, offsets, strides, Sq, Sk,
d_k, d_v, causal, q_offset, masked, num_threads); that entry point (packing, schedule, workspace)
is silkattn.numba.driver.
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
    vload,
    vmax,
    vmul,
    vsplat,
    vstore,
    vsum4,
    vwidth,
)

MASKED = -1e9          # the score a masked-out key gets (replaced, as in silkattn.reference)
# A skipped or masked key counts as exactly 0, which is what the reference gives unless the row's
# max is within EXACT_MARGIN of MASKED (exp(-745) already underflows float64): such rows are redone
# exactly. The same margin as the C kernel's SA_EXACT_MARGIN (kernels/attention.h).
EXACT_BELOW = MASKED + 2000.0
# The blocking geometry: tiles of BQ queries x BK keys (the BQ x BK score tile stays in L1), and
# register blocks of R rows x 2 registers (the register width is _simd.LANES) in both micro-kernels.
BQ = 64                # a multiple of R
BK = 64
R = 4
U = np.uint64         # an index type Numba does not wrap around, so LLVM vectorises the copies



def _jit(**kw):
    return numba.njit(nogil=True, cache=CACHE, fastmath=FASTMATH, **kw)


@_jit(parallel=True)
def pack_kv(k, v, koff, voff, ks, vs, usk, dk, dv, dvp, kp, vp):
    """K as key-contiguous tiles kp[u, t, d, j] (keys on the SIMD axis) and V as rows padded to dvp
    lanes vp[u, key, d]; zero padding past the unit's usk[u] keys and dv. One unit per distinct
    (K, V) batch item.
    kp and vp are C-contiguous: tile w = u * nkt + t starts at w * dk * BK in kp."""
    for w in prange(kp.shape[0] * kp.shape[1]):
        _pack_tile(w, k, v, koff, voff, ks, vs, usk, dk, dv, dvp, kp, vp)


@_jit()
def pack_kv_serial(k, v, koff, voff, ks, vs, usk, dk, dv, dvp, kp, vp):
    """pack_kv on the calling thread alone (a one-thread call need not pay for a parallel launch)."""
    for w in range(kp.shape[0] * kp.shape[1]):
        _pack_tile(w, k, v, koff, voff, ks, vs, usk, dk, dv, dvp, kp, vp)


@_jit()
def _pack_tile(w, k, v, koff, voff, ks, vs, usk, dk, dv, dvp, kp, vp):
    """Key tile w = u * nkt + t of pack_kv. Indices are unsigned (U): for a signed index Numba adds
    the wrap-around of negative ones, a branch that keeps LLVM from vectorising the copies."""
    nkt = kp.shape[1]
    kf = kp.reshape(-1)
    vf = vp.reshape(-1)
    u, t = w // nkt, w % nkt
    k0 = t * BK
    nk = max(0, min(BK, usk[u] - k0))
    kb = w * dk * BK
    j = 0
    while j + 8 <= nk:  # 8 keys at a time, so each d writes 8 adjacent values
        src = koff[u] + (k0 + j) * ks
        for d in range(dk):
            o = kb + d * BK + j
            for jj in range(8):
                kf[U(o + jj)] = k[U(src + jj * ks + d)]
        j += 8
    for jr in range(j, nk):
        src = koff[u] + (k0 + jr) * ks
        for d in range(dk):
            kf[U(kb + d * BK + jr)] = k[U(src + d)]
    for d in range(dk):
        for jr in range(nk, BK):
            kf[U(kb + d * BK + jr)] = 0
    vb = (u * nkt * BK + k0) * dvp
    for jr in range(nk):
        src = voff[u] + (k0 + jr) * vs
        dst = vb + jr * dvp
        for d in range(dv):
            vf[U(dst + d)] = v[U(src + d)]
        for d in range(dv, dvp):
            vf[U(dst + d)] = 0
    for x in range(vb + nk * dvp, vb + BK * dvp):
        vf[U(x)] = 0


@_jit()
def _round16(n):
    return (n + 15) // 16 * 16


@_jit()
def scratch_layout(dk, dvp, Sk):
    """Offsets of one thread's scratch (scores, accumulator, query tile, max, sum, exact-path row)
    and its total length, each part starting on a 64-byte line (so threads never share a line)."""
    o_acc = _round16(BQ * BK)
    o_q = o_acc + _round16(BQ * dvp)
    o_m = o_q + _round16(BQ * dk)
    o_l = o_m + _round16(BQ)
    o_row = o_l + _round16(BQ)
    return o_acc, o_q, o_m, o_l, o_row, o_row + _round16(Sk)


@_jit()
def _exact_row(q, k, v, mask, orow, qrow, krow, vrow, ks, vs, mrow, i, Sk, dk, dv, scale, causal, masked,
               row):
    """One query row done the plain two-pass way over all Sk keys, masked scores = -1e9 as in the
    reference: used for the rare rows whose final max is below EXACT_BELOW (e.g. every key masked,
    which gives mean(V)), where the skipped and zero-flushed masked keys would have counted.
    q, k, v, mask: the flat operands, the row's query at qrow, key j at krow + j * ks (v likewise);
    i: the query's position (its index plus the causal offset).
    orow: the row's d_v outputs; row: scratch of >= Sk values."""
    zero = scale - scale
    for j in range(Sk):
        s = zero
        for d in range(dk):
            s += q[qrow + d] * k[krow + j * ks + d]
        s = s * scale
        if (masked and mask[mrow + j] == 0) or (causal and j > i):
            s = MASKED
        row[j] = s
    m = row[0]
    for j in range(1, Sk):
        m = max(m, row[j])
    total = zero
    for j in range(Sk):
        row[j] = math.exp(row[j] - m)
        total += row[j]
    for d in range(dv):
        orow[d] = 0
    for j in range(Sk):
        for d in range(dv):
            orow[d] += row[j] * v[vrow + j * vs + d]
    for d in range(dv):
        orow[d] = orow[d] / total


@_jit(parallel=True)
def attention_tiles(q, k, v, kp, vp, mask, out, qoff, koff, voff, moff, unit, sq, sk, ooff, qs, ks, vs, ms,
                    Sk, dk, dv, causal, q_offset, masked, items, starts, work):
    """Work item w = (query tile w // B, batch item w % B), item b of sq[b] queries and sk[b] keys
    (Sk: the most), its output at ooff[b]; items/starts: the items each thread runs
    (len(starts) - 1 = Numba's current thread count, passed in: numba.get_num_threads() in jitted
    code would make the function uncachable); work: (>= threads, scratch_layout(...)[-1]) per-thread
    scratch, preallocated by the caller (and reused across calls) and indexed by thread id.
    causal: query i sits at position q_offset + i and sees keys j <= q_offset + i."""
    nthreads = starts.size - 1
    B = qoff.shape[0]
    dvp = vp.shape[2]
    nkt = kp.shape[1]
    sc = np.empty(1, out.dtype)
    sc[0] = 1.0 / math.sqrt(dk)  # in the array's dtype; Q is scaled (exact for d_k = 4^i), not the scores
    scale = sc[0]
    o_acc, o_q, o_m, o_l, o_row, _ = scratch_layout(dk, dvp, Sk)  # parts of a thread's row of `work`
    kflat = kp.reshape(-1)
    vflat = vp.reshape(-1)
    W = vwidth(out)
    W2 = 2 * W
    # One parallel iteration per thread (Numba splits a prange into equal contiguous blocks, so a
    # causal triangle would load one thread with most of the work; numba.set_parallel_chunksize
    # did not change that with the omp layer, measured): thread p runs the work items
    # items[starts[p]:starts[p + 1]], a balanced split computed by the caller. Scratch is indexed by
    # numba.get_thread_id(); every output row is computed the same way whichever thread runs it.
    for p in prange(nthreads):
        for wi in range(starts[p], starts[p + 1]):
            w = items[wi]
            tid = numba.get_thread_id()
            S = work[tid, :o_acc]              # scores, then probabilities
            acc = work[tid, o_acc:o_q]         # running P V
            Qp = work[tid, o_q:o_m]            # the query tile, packed and scaled
            mrun = work[tid, o_m:o_l]          # running max
            lrun = work[tid, o_l:o_row]        # running sum
            qt = w // B
            b = w % B
            u = unit[b]
            i0 = qt * BQ
            nq = min(BQ, sq[b] - i0)
            for r in range(BQ):
                mrun[r] = -np.inf
                lrun[r] = 0
            for x in range(BQ * dvp):
                acc[U(x)] = 0
            # the query tile, scaled by 1/sqrt(d_k), packed row-major (rows past the item's: zeros)
            for r in range(nq):
                qb = qoff[b] + (i0 + r) * qs
                for d in range(dk):
                    Qp[U(r * dk + d)] = q[U(qb + d)] * scale
            for x in range(nq * dk, BQ * dk):
                Qp[U(x)] = 0
            kt_end = (sk[b] + BK - 1) // BK
            if causal:
                kt_end = min(kt_end, (i0 + q_offset + nq - 1) // BK + 1)  # tiles past the diagonal: skipped
            for t in range(kt_end):
                k0 = t * BK
                nk = min(BK, sk[b] - k0)
                if masked:  # skip a key tile masked for every query row of this tile
                    anyvis = False
                    for r in range(nq):
                        mb = moff[b] + (i0 + r) * ms + k0
                        for j in range(nk):
                            if mask[mb + j] != 0:
                                anyvis = True
                                break
                        if anyvis:
                            break
                    if not anyvis:
                        continue
                # ---- S = Q_tile K_tile^T: R rows x 2 registers of keys, accumulators in registers
                kb = (u * nkt + t) * dk * BK
                for jv in range(0, BK, W2):
                    for r0 in range(0, BQ, R):
                        q0 = r0 * dk
                        c00 = vsplat(out, 0)
                        c01 = c00
                        c10 = c00
                        c11 = c00
                        c20 = c00
                        c21 = c00
                        c30 = c00
                        c31 = c00
                        for d in range(dk):
                            ka = vload(kflat, kb + d * BK + jv)
                            kc = vload(kflat, kb + d * BK + jv + W)
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
                        sb = r0 * BK + jv
                        vstore(S, sb, c00)
                        vstore(S, sb + W, c01)
                        vstore(S, sb + BK, c10)
                        vstore(S, sb + BK + W, c11)
                        vstore(S, sb + 2 * BK, c20)
                        vstore(S, sb + 2 * BK + W, c21)
                        vstore(S, sb + 3 * BK, c30)
                        vstore(S, sb + 3 * BK + W, c31)
                # ---- scale, mask, online softmax per row
                diag = causal and k0 + nk - 1 > i0 + q_offset
                for r in range(nq):
                    i = i0 + r
                    sr = r * BK
                    if masked:
                        mb = moff[b] + i * ms + k0
                        for j in range(nk):
                            if mask[U(mb + j)] == 0:
                                S[U(sr + j)] = MASKED
                    if diag:
                        for j in range(max(0, i + q_offset - k0 + 1), nk):
                            S[U(sr + j)] = MASKED
                    for j in range(nk, BK):
                        S[U(sr + j)] = -np.inf
                    mx = vload(S, sr)
                    for jv in range(W, BK, W):
                        mx = vmax(mx, vload(S, sr + jv))
                    m_new = max(mrun[r], hmax(mx))
                    vm = vsplat(out, m_new)
                    vneg = vsplat(out, -1.0)
                    sm = vsplat(out, 0)
                    for jv in range(0, BK, W):
                        p = vexp(vfma(vm, vneg, vload(S, sr + jv)))
                        vstore(S, sr + jv, p)
                        sm = vadd(sm, p)
                    if m_new > mrun[r]:
                        alpha = math.exp(mrun[r] - m_new)
                        lrun[r] = lrun[r] * alpha
                        if alpha != 1:
                            va = vsplat(out, alpha)
                            for dc in range(0, dvp, W):
                                vstore(acc, r * dvp + dc, vmul(vload(acc, r * dvp + dc), va))
                        mrun[r] = m_new
                    lrun[r] += hsum(sm)
                # ---- acc += P V_tile: R rows x 2 registers of d_v, accumulators in registers
                vb = (u * nkt * BK + k0) * dvp
                for dc in range(0, dvp, W2):
                    for r0 in range(0, BQ, R):
                        a0 = r0 * dvp + dc
                        c00 = vload(acc, a0)
                        c01 = vload(acc, a0 + W)
                        c10 = vload(acc, a0 + dvp)
                        c11 = vload(acc, a0 + dvp + W)
                        c20 = vload(acc, a0 + 2 * dvp)
                        c21 = vload(acc, a0 + 2 * dvp + W)
                        c30 = vload(acc, a0 + 3 * dvp)
                        c31 = vload(acc, a0 + 3 * dvp + W)
                        pb = r0 * BK
                        for j in range(nk):
                            va = vload(vflat, vb + j * dvp + dc)
                            vc = vload(vflat, vb + j * dvp + dc + W)
                            x = vbcast(S, pb + j)
                            c00 = vfma(x, va, c00)
                            c01 = vfma(x, vc, c01)
                            x = vbcast(S, pb + BK + j)
                            c10 = vfma(x, va, c10)
                            c11 = vfma(x, vc, c11)
                            x = vbcast(S, pb + 2 * BK + j)
                            c20 = vfma(x, va, c20)
                            c21 = vfma(x, vc, c21)
                            x = vbcast(S, pb + 3 * BK + j)
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
            # ---- write the tile's rows: acc / l, or the exact path for rows whose max is tiny
            for r in range(nq):
                i = i0 + r
                ob = ooff[b] + i * dv
                if mrun[r] < EXACT_BELOW:
                    _exact_row(q, k, v, mask, out[ob:ob + dv], qoff[b] + i * qs, koff[b], voff[b], ks, vs,
                               moff[b] + i * ms, i + q_offset,
                               sk[b], dk, dv, scale, causal, masked, work[tid, o_row:o_row + sk[b]])
                else:
                    inv = lrun[r]
                    for d in range(dv):
                        out[U(ob + d)] = acc[U(r * dvp + d)] / inv


# ---- single-query (decode) attention: one query row against a long run of keys ----
# The tile kernel would pad the one query to a whole register block; here the query is a vector in
# scratch, keys stream past it four at a time (four dot products whose sums come out as one vector,
# vsum4), and the online softmax runs over blocks of DEC_BLOCK keys. Every item's keys are cut into
# chunks of DEC_CHUNK (fixed, so the result does not depend on the thread count), the tasks the
# threads share; each leaves a partial (m, l, acc) that the merge combines: m = max m_c,
# l = sum l_c e^(m_c - m), out = sum acc_c e^(m_c - m) / l.
DEC_BLOCK = 64
DEC_CHUNK = 256


@_jit()
def decode_scratch(dk):
    """Elements of one thread's decode scratch: the scaled query, then a block of scores."""
    return _round16(dk) + DEC_BLOCK + 16


@_jit(parallel=True)
def decode_rows(q, k, v, mask, out, qoff, koff, voff, moff, ks, vs, Sk, nk, dk, dv, q_offset, causal, masked,
                nsplit, chunk, parts, work):
    """out[b] = attention of batch item b's one query over its first nk keys (nk < Sk: the causal
    rule hides the rest), the keys split into nsplit chunks of `chunk`. parts: (B * nsplit, dv + 2)
    partial results (m, l, acc); work: (threads, decode_scratch(dk)) scratch by thread id."""
    B = qoff.shape[0]
    sc = np.empty(1, out.dtype)
    sc[0] = 1.0 / math.sqrt(dk)
    scale = sc[0]
    W = vwidth(out)
    dkv = dk - dk % W
    dvv = dv - dv % W
    o_s = _round16(dk)
    for w in prange(B * nsplit):
        tid = numba.get_thread_id()
        qv = work[tid, :o_s]
        s = work[tid, o_s:]
        part = parts[w]
        b = w // nsplit
        j0 = (w % nsplit) * chunk
        j1 = min(nk, j0 + chunk)
        for d in range(dk):
            qv[d] = q[qoff[b] + d] * scale
        for c in range(dv + 2):
            part[c] = 0
        m = -np.inf
        lsum = scale - scale
        k0 = j0
        while k0 < j1:
            nb = min(DEC_BLOCK, j1 - k0)
            j = 0
            while j + 4 <= nb:  # four keys at a time: four chains of FMAs, their sums as one vector
                kb = koff[b] + (k0 + j) * ks
                c0 = vsplat(out, 0)
                c1 = c0
                c2 = c0
                c3 = c0
                for d in range(0, dkv, W):
                    x = vload(qv, d)
                    c0 = vfma(x, vload(k, kb + d), c0)
                    c1 = vfma(x, vload(k, kb + ks + d), c1)
                    c2 = vfma(x, vload(k, kb + 2 * ks + d), c2)
                    c3 = vfma(x, vload(k, kb + 3 * ks + d), c3)
                vstore(s, j, vsum4(c0, c1, c2, c3))  # lanes past j + 3: overwritten next
                for d in range(dkv, dk):
                    for u in range(4):
                        s[j + u] += qv[d] * k[kb + u * ks + d]
                j += 4
            while j < nb:
                kb = koff[b] + (k0 + j) * ks
                c0 = vsplat(out, 0)
                for d in range(0, dkv, W):
                    c0 = vfma(vload(qv, d), vload(k, kb + d), c0)
                s0 = hsum(c0)
                for d in range(dkv, dk):
                    s0 += qv[d] * k[kb + d]
                s[j] = s0
                j += 1
            if masked:
                for j in range(nb):
                    if mask[moff[b] + k0 + j] == 0:
                        s[j] = MASKED
            for j in range(nb, (nb + W - 1) // W * W):
                s[j] = -np.inf  # weighs 0
            mv = vsplat(out, m)  # a NaN score is not the max, but its weight, NaN, spreads
            for j in range(0, nb, W):
                mv = vmax(mv, vload(s, j))
            mnew = hmax(mv)
            vm = vsplat(out, mnew)
            vneg = vsplat(out, -1.0)
            sm = vsplat(out, 0)
            for j in range(0, nb, W):
                p = vexp(vfma(vm, vneg, vload(s, j)))
                vstore(s, j, p)
                sm = vadd(sm, p)
            alpha = math.exp(m - mnew)
            lsum = lsum * alpha + hsum(sm)
            if alpha != 1:
                for c in range(dv):
                    part[2 + c] *= alpha
            m = mnew
            vb = voff[b] + k0 * vs
            c = 0
            while c + 4 * W <= dvv:  # four registers of d_v: four chains
                a0 = vload(part, 2 + c)
                a1 = vload(part, 2 + c + W)
                a2 = vload(part, 2 + c + 2 * W)
                a3 = vload(part, 2 + c + 3 * W)
                for j in range(nb):
                    x = vbcast(s, j)
                    vr = vb + j * vs + c
                    a0 = vfma(x, vload(v, vr), a0)
                    a1 = vfma(x, vload(v, vr + W), a1)
                    a2 = vfma(x, vload(v, vr + 2 * W), a2)
                    a3 = vfma(x, vload(v, vr + 3 * W), a3)
                vstore(part, 2 + c, a0)
                vstore(part, 2 + c + W, a1)
                vstore(part, 2 + c + 2 * W, a2)
                vstore(part, 2 + c + 3 * W, a3)
                c += 4 * W
            while c < dvv:
                a0 = vload(part, 2 + c)
                for j in range(nb):
                    a0 = vfma(vbcast(s, j), vload(v, vb + j * vs + c), a0)
                vstore(part, 2 + c, a0)
                c += W
            for cc in range(dvv, dv):
                for j in range(nb):
                    part[2 + cc] += s[j] * v[vb + j * vs + cc]
            k0 += DEC_BLOCK
        part[0] = m
        part[1] = lsum
    for b in range(B):  # merge each item's partial results
        m = -np.inf
        for c in range(nsplit):
            mc = parts[b * nsplit + c, 0]
            if mc > m or mc != mc:
                m = mc
        ob = b * dv
        if m < EXACT_BELOW:
            _exact_row(q, k, v, mask, out[ob:ob + dv], qoff[b], koff[b], voff[b], ks, vs, moff[b], q_offset,
                       Sk, dk, dv, scale, causal, masked, np.empty(Sk, out.dtype))
            continue
        lsum = scale - scale
        for d in range(dv):
            out[ob + d] = 0
        for c in range(nsplit):
            part = parts[b * nsplit + c]
            wgt = math.exp(part[0] - m)
            lsum += part[1] * wgt
            for d in range(dv):
                out[ob + d] += part[2 + d] * wgt
        for d in range(dv):
            out[ob + d] = out[ob + d] / lsum
