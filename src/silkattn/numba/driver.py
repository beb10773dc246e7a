"""The Numba backend's kernel-contract entry points (see silkattn._api): each sets Numba's thread
count from the call's and runs the compiled kernels in softmax.py, layer_norm.py, attention.py and
the other op modules.
Attention's entry point reads the call's plan (silkattn._plan), packs K and V, and keeps the
per-thread workspace between calls."""
import math
import threading
from typing import NamedTuple

import numba
import numpy as np

from .._step import DENSE
from . import attention as _attention
from . import attention_backward as _attention_backward
from . import feed_forward as _feed_forward
from . import layer_norm as _layer_norm
from . import layer_step as _layer_step
from . import linear as _linear
from . import linear_q as _linear_q
from . import matmul_int8 as _matmul_int8
from . import rms_norm as _rms_norm
from . import rope as _rope
from . import silu_mul as _silu_mul
from . import softmax as _softmax
from ._simd import VBYTES


def _use_threads(num_threads):
    """Numba's thread count for the next kernel: the call's, capped at the threads Numba started."""
    n = max(1, min(int(num_threads), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n)
    return n


def softmax(x, out, num_threads):
    _softmax.softmax_rows(x, out, _use_threads(num_threads))


def layer_norm(x, g, b, eps, out, num_threads):
    _layer_norm.layer_norm_rows(x, g, b, eps, out, _use_threads(num_threads))


def rms_norm(x, g, eps, out, num_threads):
    _rms_norm.rms_norm_rows(x, g, eps, out, _use_threads(num_threads))


def gelu_backward(dh, z, dz, num_threads):
    _use_threads(num_threads)
    _feed_forward.gelu_backward_rows(dh, z, dz)


def softmax_backward(dy, y, dx, num_threads):
    _softmax.softmax_backward_rows(dy, y, dx, _use_threads(num_threads))


def layer_norm_backward(dy, x, g, eps, dx, parts, block, num_threads):
    _use_threads(num_threads)
    _layer_norm.layer_norm_backward_rows(dy, x, g, x.dtype.type(eps), dx, parts, block)


def rms_norm_backward(dy, x, g, eps, dx, dg, block, num_threads):
    _use_threads(num_threads)
    _rms_norm.rms_norm_backward_rows(dy, x, g, x.dtype.type(eps), dx, dg, block)


def add_rms_norm(x, r, g, eps, s, out, num_threads):
    _rms_norm.add_rms_norm_rows(x, r, g, eps, s, out, _use_threads(num_threads))


def rope(x, xo, out, oo, cos, sin, positions, num_threads):
    """The kernel contract's rope (rows as offsets; out may be x). The operands it only reads go
    in read-only, x too when out is x: one compiled signature per dtype."""
    _use_threads(num_threads)
    _rope.rope_rows(_read_only(x), xo, out, oo, _read_only(cos), _read_only(sin), _read_only(positions))


def silu_mul(g, go, u, uo, out, oo, n, num_threads):
    """The kernel contract's silu_mul (rows as offsets; out may be g or u), its inputs read-only."""
    nthreads = _use_threads(num_threads)
    _silu_mul.gate_rows(_read_only(g), go, _read_only(u), uo, out, oo, int(n), False, nthreads)


def gelu_tanh_mul(g, go, u, uo, out, oo, n, num_threads):
    """The kernel contract's gelu_tanh_mul, as silu_mul."""
    nthreads = _use_threads(num_threads)
    _silu_mul.gate_rows(_read_only(g), go, _read_only(u), uo, out, oo, int(n), True, nthreads)


def attention(plan, num_threads):
    """The kernel contract's attention: one silkattn._plan.Plan, on its "tiles" path (K/V packed
    once per unit, then the tasks) or its "rows" path (chunks of keys, merged per group), the plan
    handed over as attention.py's three records (plain tuples in its field order)."""
    nthreads = _use_threads(num_threads)
    t = plan.derived.get("numba") if plan.derived is not None else None
    if t is None:
        t = _tables(plan)
        if plan.derived is not None:
            plan.derived["numba"] = t
    dtype = plan.out.dtype
    q, k, v, mask, bias = (_read_only(a) for a in (plan.q, plan.k, plan.v, plan.mask, plan.bias))
    # the scalars as Python types (scale and softcap rounded to the call's dtype): one compiled
    # signature per dtype and operand layout
    scalars = (int(plan.rs_q), int(plan.rs_k), int(plan.rs_v), int(plan.rs_mask), int(plan.rs_bias), plan.dk,
               plan.dv, t.dvp, dtype.type(plan.scale), dtype.type(plan.softcap), int(plan.left),
               int(plan.right), bool(plan.has_mask), bool(plan.has_bias), bool(plan.has_alibi), nthreads,
               int(plan.page_keys))
    none = _NONE[dtype.char]
    lse = none if plan.lse is None else plan.lse
    if plan.path == "rows":
        parts = _workspace("parts", (plan.parts * (plan.dv + 2),), dtype)
        work = _workspace("rows", (nthreads, t.scratch), dtype)
        ops = (q, k, v, mask, bias, plan.out, none, none, parts, lse)
        _attention.attention_rows(ops, t.tables, scalars, work)
        return
    if plan.bq > _attention.BQ:
        raise ValueError(f"the plan's tiles have {plan.bq} rows, more than the kernel's {_attention.BQ}")
    kp = _workspace("kp", (t.ntiles * plan.dk * _attention.BK,), dtype)
    vp = _workspace("vp", (t.ntiles * _attention.BK * t.dvp,), dtype)
    ops = (q, k, v, mask, bias, plan.out, kp, vp, none, lse)
    # with threads, the parallel pack also wakes them for the tiles that follow
    (_attention.pack_kv if nthreads > 1 else _attention.pack_kv_serial)(ops, t.tables, scalars)
    work = _workspace("work", (nthreads, t.scratch), dtype)
    _attention.attention_tiles(ops, t.tables, scalars, work)


def attention_backward(plan, dout, D, lse, fix, items, first, dq, dk, dv, num_threads):
    """The kernel contract's attention_backward (silkattn._api): the plan's K/V units as tasks,
    attention_backward.py's three records filled here."""
    nthreads = _use_threads(num_threads)
    dtype = plan.q.dtype
    lanes2 = 2 * VBYTES // dtype.itemsize  # the micro-kernel's two registers
    dkp, dvp = -(-plan.dk // lanes2) * lanes2, -(-plan.dv // lanes2) * lanes2
    reads = (plan.q, plan.k, plan.v, plan.mask, plan.bias, dout, D, lse)
    ops = tuple(_read_only(a) for a in reads) + (dq, dk, dv, fix)
    nslopes = np.ascontiguousarray(-plan.items["slope"], dtype)
    tables = (_int_table(plan.items), nslopes, _int_table(plan.units), items, first)
    scalars = (int(plan.rs_q), int(plan.rs_k), int(plan.rs_v), int(plan.rs_mask), int(plan.rs_bias), plan.dk,
               plan.dv, dkp, dvp, dtype.type(plan.scale), dtype.type(plan.softcap), int(plan.left),
               int(plan.right), bool(plan.has_mask), bool(plan.has_bias), bool(plan.has_alibi), nthreads)
    work = _workspace("backward", (nthreads, int(_attention_backward.scratch_layout(dkp, dvp)[-1])), dtype)
    _attention_backward.attention_backward_units(ops, tables, scalars, work)


_NONE = {c: np.zeros(0, c) for c in "fd"}  # an operand the path does not use


def _read_only(a):
    """a as a read-only view: the kernels only read their operands, and one writability for all of
    them keeps Numba at one compiled signature per dtype (each mix of writable and read-only arrays
    would be compiled anew)."""
    if not a.flags.writeable:
        return a
    a = a.view()
    a.flags.writeable = False
    return a


class _Tables(NamedTuple):
    """What attention.py takes of a plan besides its arrays, made once for a kept plan (kept with it,
    in Plan.derived): its Tables
    record (a plain tuple in attention.Tables' field order: int64 (n, fields) views of the plan's
    tables, the items' ALiBi slopes negated in the call's dtype (the reference's -slope), each
    unit's first packed K/V tile and each tile's unit), the packed tiles' count, d_v padded to the
    P V micro-kernel's registers, and the elements of one thread's scratch on the plan's path."""
    tables: tuple
    ntiles: int
    dvp: int
    scratch: int


_EMPTY = np.zeros((0, 1), np.int64)
_NO_PAGES = np.zeros((0, 2), np.int64)


def _tables(plan):
    units = _int_table(plan.units)
    ntiles_u = -(-units[:, _attention.UN_SK] // _attention.BK)
    tile0 = np.ascontiguousarray(np.cumsum(ntiles_u) - ntiles_u, np.int64)
    tile_unit = np.repeat(np.arange(len(units), dtype=np.int64), ntiles_u)
    nslopes = np.ascontiguousarray(-plan.items["slope"], plan.out.dtype)
    work = tuple(_EMPTY if a is None else _int_table(a)
                 for a in (plan.tasks, plan.groups, plan.rows, plan.chunks))
    lanes2 = 2 * VBYTES // plan.out.dtype.itemsize  # the P V micro-kernel works on two registers of d_v
    dvp = -(-plan.dv // lanes2) * lanes2
    if plan.path == "rows":
        scratch = _attention.rows_scratch(plan.dk, plan.sk_max)
    else:
        scratch = _attention.tile_scratch(plan.dk, dvp, plan.sk_max)[-1]
    pages = _NO_PAGES if plan.pages is None else np.ascontiguousarray(plan.pages, np.int64)
    tables = (_int_table(plan.items), nslopes, units, tile0, tile_unit) + work + (pages,)
    return _Tables(tables, int(ntiles_u.sum()), dvp, scratch)


def _int_table(records):
    """A structured array of 8-byte fields as an int64 (n, fields) array (a view when contiguous)."""
    records = np.ascontiguousarray(records)
    return records.view(np.int64).reshape(len(records), records.dtype.itemsize // 8)


def bias_relu(h, b, num_threads):
    _use_threads(num_threads)
    _feed_forward.bias_act_rows(h, b, False)


def bias_gelu(h, b, num_threads):
    _use_threads(num_threads)
    _feed_forward.bias_act_rows(h, b, True)


def linear(x, w, b, out, transposed, has_bias, num_threads):
    """The kernel contract's x W (+ b) for a few rows of x (see linear.py)."""
    nthreads = _use_threads(num_threads)
    if transposed:
        _linear.linear_dots(x, w, out)
    else:
        T = max(1, min(nthreads, w.shape[0] // 64))  # a thread's share of w: at least 64 rows
        partial = _workspace("linear", (T,) + out.shape, out.dtype)
        _linear.linear_rows(x, w, partial)
        np.sum(partial, axis=0, out=out)
    if has_bias:
        out += b


def linear_q(x, blocks, kind, b, out, has_bias, q8, num_threads):
    """The kernel contract's linear_q (see linear_q.py; q8: linear_q8_rows); its inputs read-only (a
    memory map as the plain array it is): one compiled signature. Only the kinds with row kernels."""
    if not 0 <= int(kind) < _linear_q.ROW_KINDS:
        raise ValueError(f"linear_q: kind {kind} has no few-row kernel (silkattn.quant.ROW_KINDS)")
    nthreads = _use_threads(num_threads)
    rows = _linear_q.linear_q8_rows if q8 else _linear_q.linear_q_rows
    rows(_read_only(x), _read_only(np.asarray(blocks)), int(kind), _read_only(b), bool(has_bias), out,
         nthreads)



def linear_qx(x, blocks, kind, b, out, has_bias, q8, num_threads):
    """The kernel contract's linear_qx (see linear_q.linear_qx_rows): the kinds after ROW_KINDS,
    float32 x of 1 to 8 rows (q8: any number, 8 a call); its inputs read-only (one compiled
    signature). q8: x's rows rounded to 8 bits a block first (reference.round_q8, the K-quants'
    blocks of 256), then the same float products (Numba reaches no integer dot-product instruction)."""
    if not _linear_q.ROW_KINDS <= int(kind) < len(_linear_q.BLOCK_BYTES):
        raise ValueError(f"linear_qx: kind {kind} is not one of the kinds after the row kernels'")
    m, k = x.shape
    n, ldw = blocks.shape
    weights = _linear_q.BLOCK_WEIGHTS[int(kind)]
    fits = ldw == k // weights * _linear_q.BLOCK_BYTES[int(kind)]
    if not 1 <= m <= (m if q8 else 8) or k % weights or not fits or out.shape != (m, n) \
            or (has_bias and b.shape[0] != n):
        raise ValueError(f"linear_qx: x {x.shape}, blocks {blocks.shape}, out {out.shape} do not fit "
                         f"kind {kind}")
    if q8:
        from .. import reference
        x = np.ascontiguousarray(reference.round_q8(x, _linear_q.BLOCK_WEIGHTS[int(kind)]), np.float32)
    blocks = _read_only(np.asarray(blocks))
    for r in range(0, m, 8):  # the kernel's rows a call (q8: any m, as the C kernel takes them)
        _linear_q.linear_qx_rows(_read_only(x[r:r + 8]), blocks, int(kind), _read_only(b), bool(has_bias),
                                 out[r:r + 8], _use_threads(num_threads))


def gemm(x, w, out, transposed, sgemm, ilp64, num_threads):
    """The kernel contract's gemm (see linear.py): x w (or x w^T) for many rows, a BLAS sgemm call a
    thread of the team. The operands are checked here (as kernels/linear.pyx checks them): all that
    keeps the BLAS within them."""
    _check_arrays("gemm", ((x, _F32, 2), (w, _F32, 2)), ((out, _F32, 2),))
    (m, k), n = x.shape, out.shape[1]
    if out.shape[0] != m or w.shape != ((n, k) if transposed else (k, n)):
        raise ValueError(f"gemm: x {x.shape}, w {w.shape}, out {out.shape} do not fit"
                         + (" (transposed)" if transposed else ""))
    if m and n:
        _linear.gemm(_read_only(x), _read_only(w), out, bool(transposed), int(sgemm), bool(ilp64),
                     _use_threads(num_threads))


def gemm_q(x, blocks, kind, out, sgemm, ilp64, num_threads):
    """The kernel contract's gemm_q (see linear_q.py): x W for W as blocks and many rows, each thread
    dequantizing and multiplying its own panels; its operands checked here (as linear_q.pyx does)."""
    blocks, kind = np.asarray(blocks), int(kind)
    _check_arrays("gemm_q", ((x, _F32, 2), (blocks, _U8, 2)), ((out, _F32, 2),))
    (m, k), (n, ldw) = x.shape, blocks.shape
    if not _fits(kind, k, ldw) or out.shape != (m, n):
        raise ValueError(f"gemm_q: kind {kind}, blocks {blocks.shape}, x {x.shape} and out {out.shape} "
                         "do not fit")
    if m and n:
        _linear_q.gemm_q(_read_only(x), _read_only(blocks), kind, out, int(sgemm), bool(ilp64),
                         _use_threads(num_threads))


def dequantize(blocks, kind, j0, out, num_threads):
    """The kernel contract's dequantize: out = reference.dequantize(blocks[j0 : j0 + len(out)]), the
    blocks read-only (a memory map as the plain array it is): one compiled signature. Its operands
    are checked here (as kernels/linear_q.pyx checks them): all that keeps the kernel within them."""
    blocks, kind, j0 = np.asarray(blocks), int(kind), int(j0)
    _check_arrays("dequantize", ((blocks, _U8, 2),), ((out, _F32, 2),))
    rows, k = out.shape
    n, ldw = blocks.shape
    if not _fits(kind, k, ldw):
        raise ValueError(f"dequantize: kind {kind}, blocks ({n}, {ldw}) and out rows of {k} do not fit")
    if not 0 <= j0 <= n - rows:
        raise ValueError(f"dequantize: rows {j0} .. {j0 + rows} of {n} out of range")
    nthreads = _use_threads(num_threads)
    _linear_q.dequantize_rows(_read_only(blocks), kind, j0, out, nthreads)


def layer_step(step, x, pos, num_threads):
    """The kernel contract's layer_step (see layer_step.py): x (d,) in place through the record step
    (silkattn._step.LayerStep, checked when it was built), handed over as layer_step.py's Step in
    plain nested tuples, made once and kept with the record. What the kernel only reads goes in
    read-only (x's read-only view too, what the block products read as their residual)."""
    t = step.prepared.get("numba")
    if t is None:
        t = step.prepared["numba"] = _step_record(step)
    nthreads = _use_threads(num_threads)
    _layer_step.layer_step(t, x, _read_only(x), int(pos), tuple(int(v) for v in step.keys(pos)), nthreads)


def layer_step_rows(steps, X, ats, Ks, Vs, coss, sins, num_threads):
    """The kernel contract's layer_step_rows (see layer_step.py): the rows of X (m, d) in place
    through the records steps in turn, row r over the cache of layer l's pools `Ks[l]`, `Vs[l]`
    (flat) at element `ats[l][r, 3]` (silkattn._api checked the records, the rows and the pools); a
    kernel call a layer, the rows' buffers made once, the products' inputs with read-only views
    (the one-row step's signatures)."""
    m = len(X)
    if m == 0:
        return
    step = steps[0]
    nq, nu, dff = sum(P.n for P in step.qkv), sum(P.n for P in step.up), step.down.k
    Hn, A, G = (np.empty((m, n), np.float32) for n in (step.d, step.h * step.dh, dff))
    work = (Hn, _read_only(Hn), A, _read_only(A), G, _read_only(G), *(np.empty((m, n), np.float32)
                                                                       for n in (nq, nu, step.d)))
    nthreads = _use_threads(num_threads)
    for step, at, K, V, cos, sin in zip(steps, ats, Ks, Vs, coss, sins):
        t = step.prepared.get("numba")
        if t is None:
            t = step.prepared["numba"] = _step_record(step)
        pools = _kv_views(K, V)
        rotary = _read_only(cos), _read_only(sin)
        _layer_step.layer_step_rows(t, X, _read_only(at), pools, *rotary, work, nthreads)


def _step_record(s):
    """layer_step.Step's fields of a LayerStep, as plain nested tuples (Numba types them fast)."""
    ro = _read_only

    def norm(N):
        return ro(N.g), ro(N.b)

    def product(P):
        return ro(P.w), ro(P.b), int(P.kind), int(P.k), int(P.n)

    S = s.scratch
    half = s.K.dtype == np.float16  # room for its rows widened: the most a step reads
    Kw, Vw = (np.empty(s.h_kv * s.capacity * s.dh if half else 0, np.float32) for _ in range(2))
    parts_n = max([P.n for P in s.products if P.kind == DENSE] + [0])
    return (s.d, s.h, s.h_kv, s.dh, float(s.eps), s.post_norm, int(s.gate), s.q8, s.has_cross,
            norm(s.norm1), tuple(map(product, s.qkv)), product(s.o), norm(s.norm2), tuple(map(product, s.up)),
            product(s.down), norm(s.norm_cross), product(s.cross_q), product(s.cross_o),
            (_kv_views(s.K.reshape(-1), s.V.reshape(-1)), (Kw, Vw, ro(Kw), ro(Vw)), s.head_stride,
             s.row_stride),
            (ro(s.Km.reshape(-1)), ro(s.Vm.reshape(-1)), ro(s.keep), len(s.Km)), ro(s.cos), ro(s.sin),
            (S.qkv, S.a, ro(S.a), S.hn, ro(S.hn), S.f, ro(S.f), S.scores), parts_n, norm(s.q_norm),
            norm(s.k_norm), norm(s.post1), norm(s.post2), float(s.scale))


def _kv_views(K, V):  # -> layer_step.Cache's kv of the flat K and V: float32 or float16 (its bits)
    if K.dtype == np.float16:
        Kh, Vh = K.view(np.uint16), V.view(np.uint16)
        return (_NO_F32, _NO_F32, _read_only(_NO_F32), _read_only(_NO_F32), Kh, Vh, _read_only(Kh),
                _read_only(Vh))
    return K, V, _read_only(K), _read_only(V), _NO_U16, _NO_U16, _read_only(_NO_U16), _read_only(_NO_U16)


_NO_F32, _NO_U16 = np.empty(0, np.float32), np.empty(0, np.uint16)


_F32, _U8 = np.dtype(np.float32), np.dtype(np.uint8)
_BYTES = _linear_q.BLOCK_BYTES


def _fits(kind, k, ldw):
    """kind is a known type and blocks' rows of ldw bytes hold k of its weights (linear_q.pyx's)."""
    if not 0 <= kind < len(_BYTES):
        return False
    weights = _linear_q.BLOCK_WEIGHTS[kind]
    return k > 0 and k % weights == 0 and ldw == k // weights * _BYTES[kind]


def matmul_int8(A, B, out, num_threads):
    """The kernel contract's matmul_int8: out (m, n) int32 = A (m, k) B (k, n), int8, exactly."""
    if not all(type(v) is np.ndarray and v.ndim == 2 and v.flags.c_contiguous for v in (A, B, out)) \
            or A.dtype != np.int8 or B.dtype != np.int8 or out.dtype != np.int32 or not out.flags.writeable:
        raise ValueError("matmul_int8: A, B must be C-contiguous 2-D int8 arrays, out a writable int32 one")
    (m, k), n = A.shape, B.shape[1]
    if B.shape[0] != k or out.shape != (m, n):
        raise ValueError(f"matmul_int8: A {A.shape}, B {B.shape}, out {out.shape} do not fit")
    if m and n:
        _matmul_int8.matmul_int8(_read_only(A), _read_only(B), out, _use_threads(num_threads))


def _check_arrays(op, read, written):
    """ValueError unless each operand (array, dtype, ndim) is a C-contiguous ndarray of that dtype and
    number of dimensions, and those in `written` are writable: one compiled signature, and no
    reshape of a strided view inside the kernel."""
    for v, dtype, ndim in read + written:
        if type(v) is not np.ndarray or v.dtype != dtype or v.ndim != ndim or not v.flags.c_contiguous:
            raise ValueError(f"{op}: the operands must be C-contiguous ndarrays (the blocks and masks uint8, "
                             f"the others float32), {ndim}-D here; got {type(v).__name__} "
                             f"{getattr(v, 'dtype', '')} {getattr(v, 'shape', '')}")
    for v, _, _ in written:
        if not v.flags.writeable:
            raise ValueError(f"{op}: an operand it writes is read-only")


_local = threading.local()
_KEEP = 1 << 25  # workspace bytes kept between calls, per Python thread and buffer


def _workspace(name, shape, dtype):
    """An uninitialised array for one call, reused from the previous call of this Python thread
    when big enough: a fresh np.empty of more than a few hundred KiB is an mmap whose page faults
    cost as much as a small attention call. Per Python thread, since the kernels release the GIL;
    buffers over _KEEP bytes are not kept."""
    size = math.prod(shape)
    store = _local.__dict__
    buf = store.get((name, dtype))
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 1), dtype)
        if buf.nbytes <= _KEEP:
            store[(name, dtype)] = buf
    return buf[:size].reshape(shape)
