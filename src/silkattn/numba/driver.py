"""The Numba backend's kernel-contract entry points (see silkattn._api): each sets Numba's thread
count from the call's and runs the compiled kernels in softmax.py, layer_norm.py, attention.py and
the other op modules.
Attention's entry point reads the call's plan (silkattn._plan), packs K and V, and keeps the
per-thread workspace between calls."""
import functools
import math
import threading
from typing import NamedTuple

import numba
import numpy as np

from . import attention as _attention
from . import block_layer as _block_layer
from . import feed_forward as _feed_forward
from . import layer_norm as _layer_norm
from . import linear as _linear
from . import linear_q as _linear_q
from . import llama_layer as _llama_layer
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
    _silu_mul.silu_mul_rows(_read_only(g), go, _read_only(u), uo, out, oo, int(n), nthreads)


def attention(plan, num_threads):
    """The kernel contract's attention: one silkattn._plan.Plan, on its "tiles" path (K/V packed
    once per unit, then the tasks) or its "rows" path (chunks of keys, merged per group)."""
    nthreads = _use_threads(num_threads)
    t = _tables(plan)
    q, k, v, mask, bias = (_read_only(a) for a in (plan.q, plan.k, plan.v, plan.mask, plan.bias))
    dtype = plan.out.dtype
    dk, dv = plan.dk, plan.dv
    # the scalars as Python types: one compiled signature per dtype and operand layout
    scalars = (int(plan.rs_q), int(plan.rs_k), int(plan.rs_v), int(plan.rs_mask), int(plan.rs_bias), dk, dv)
    features = (float(plan.scale), float(plan.softcap), int(plan.left), int(plan.right), bool(plan.has_mask),
                bool(plan.has_bias), bool(plan.has_alibi), nthreads)
    if plan.path == "rows":
        parts = _workspace("parts", (plan.parts * (dv + 2),), dtype)
        work = _workspace("rows", (nthreads, _rows_scratch(dk, plan.sk_max)), dtype)
        _attention.attention_rows(q, k, v, mask, bias, plan.out, t.items, t.nslopes,
                                  t.units, t.groups, t.rows, t.chunks, parts, *scalars, *features, work)
        return
    if plan.bq > _attention.BQ:
        raise ValueError(f"the plan's tiles have {plan.bq} rows, more than the kernel's {_attention.BQ}")
    lanes2 = 2 * VBYTES // dtype.itemsize  # the P V micro-kernel works on two registers of d_v
    dvp = -(-dv // lanes2) * lanes2
    kp = _workspace("kp", (t.ntiles * dk * _attention.BK,), dtype)
    vp = _workspace("vp", (t.ntiles * _attention.BK * dvp,), dtype)
    # with threads, the parallel pack also wakes them for the tiles that follow
    pack = _attention.pack_kv if nthreads > 1 else _attention.pack_kv_serial
    pack(k, v, t.units, t.tile0, t.tile_unit, int(plan.rs_k), int(plan.rs_v), dk, dv, dvp, kp, vp)
    work = _workspace("work", (nthreads, _tile_scratch(dk, dvp, plan.sk_max)), dtype)
    _attention.attention_tiles(q, k, v, mask, bias, plan.out, kp, vp, t.items,
                               t.nslopes, t.units, t.tile0, t.tasks, *scalars, dvp, *features, work)


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
    """A plan's tables as the kernels take them: int64 (n, fields) views (columns named in
    attention.py), the items' ALiBi slopes negated and in the call's dtype (the reference's
    -slope), and the tiles path's packed K/V tiles (tile0[u]: unit u's first tile; tile_unit[w]:
    the unit of tile w; ntiles)."""
    items: np.ndarray
    nslopes: np.ndarray
    units: np.ndarray
    tasks: np.ndarray
    groups: np.ndarray
    rows: np.ndarray
    chunks: np.ndarray
    tile0: np.ndarray
    tile_unit: np.ndarray
    ntiles: int


_tables_seen = {}  # ids of a plan's arrays -> (the arrays, kept so the ids stay theirs; their _Tables)
_tables_lock = threading.Lock()
_EMPTY = np.zeros((0, 1), np.int64)


def _tables(plan):
    """The _Tables of a plan, cached by its arrays' identity: a plan cached by shape (the plain call,
    silkattn._api._contiguous_plan) brings the same arrays back, so repeated calls cost a look-up."""
    arrays = (plan.items, plan.units, plan.tasks, plan.groups, plan.rows, plan.chunks)
    key = (*map(id, arrays), plan.out.dtype.char)
    hit = _tables_seen.get(key)
    if hit is not None:
        return hit[1]
    units = _int_table(plan.units)
    ntiles_u = -(-units[:, _attention.UN_SK] // _attention.BK)
    tile0 = np.ascontiguousarray(np.cumsum(ntiles_u) - ntiles_u, np.int64)
    nslopes = np.ascontiguousarray(-plan.items["slope"], plan.out.dtype)
    work = (_EMPTY if a is None else _int_table(a) for a in arrays[2:])  # tasks, groups, rows, chunks
    tables = _Tables(_int_table(plan.items), nslopes, units, *work, tile0,
                     np.repeat(np.arange(len(units), dtype=np.int64), ntiles_u), int(ntiles_u.sum()))
    with _tables_lock:
        if len(_tables_seen) >= 64:  # the oldest entry out
            del _tables_seen[next(iter(_tables_seen))]
        _tables_seen[key] = (arrays, tables)
    return tables


def _int_table(records):
    """A structured array of 8-byte fields as an int64 (n, fields) array (a view when contiguous)."""
    records = np.ascontiguousarray(records)
    return records.view(np.int64).reshape(len(records), records.dtype.itemsize // 8)


@functools.lru_cache(maxsize=64)
def _tile_scratch(dk, dvp, sk_max):
    return _attention.tile_scratch(dk, dvp, sk_max)[-1]


@functools.lru_cache(maxsize=64)
def _rows_scratch(dk, sk_max):
    return _attention.rows_scratch(dk, sk_max)


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
    memory map as the plain array it is): one compiled signature."""
    nthreads = _use_threads(num_threads)
    rows = _linear_q.linear_q8_rows if q8 else _linear_q.linear_q_rows
    rows(_read_only(x), _read_only(np.asarray(blocks)), int(kind), _read_only(b), bool(has_bias), out,
         nthreads)


def dequantize(blocks, kind, j0, out, num_threads):
    """The kernel contract's dequantize: out = reference.dequantize(blocks[j0 : j0 + len(out)]), the
    blocks read-only (a memory map as the plain array it is): one compiled signature. Its operands
    are checked here (as kernels/linear_q.pyx checks them): all that keeps the kernel within them."""
    blocks, kind, j0 = np.asarray(blocks), int(kind), int(j0)
    _check_arrays("dequantize", ((blocks, _U8, 2),), ((out, _F32, 2),))
    rows, k = out.shape
    n, ldw = blocks.shape
    if not 0 <= kind < len(_BYTES) or k <= 0 or k % 32 or ldw != k // 32 * _BYTES[kind]:
        raise ValueError(f"dequantize: kind {kind}, blocks ({n}, {ldw}) and out rows of {k} do not fit")
    if not 0 <= j0 <= n - rows:
        raise ValueError(f"dequantize: rows {j0} .. {j0 + rows} of {n} out of range")
    nthreads = _use_threads(num_threads)
    _linear_q.dequantize_rows(_read_only(blocks), kind, j0, out, nthreads)


def llama_layer(x, attn_norm, ffn_norm, wqkv, kqkv, wo, ko, wgu, kgu, wd, kd, q8, K, V, pos, cos, sin, h,
                eps, qkv, a, hn, gu, scores, num_threads):
    """The kernel contract's llama_layer (see llama_layer.py): one call of the compiled layer, its
    operands' shapes checked against each other first (as kernels/llama_layer.pyx checks them: all
    that keeps the kernel within its arrays). What it only reads goes in read-only, and x, a and hn
    also as read-only views of themselves (what linear_q_rows reads as its x or bias), so the layer
    calls linear_q_rows at the signature driver.linear_q compiles: one compiled signature, and
    linear_q_rows's compiled code shared."""
    wqkv, wo, wgu, wd = np.asarray(wqkv), np.asarray(wo), np.asarray(wgu), np.asarray(wd)
    kqkv, ko, kgu, kd, pos, h = int(kqkv), int(ko), int(kgu), int(kd), int(pos), int(h)
    _check_arrays("llama_layer", ((wqkv, _U8, 2), (wo, _U8, 2), (wgu, _U8, 2), (wd, _U8, 2),
                                  (attn_norm, _F32, 1), (ffn_norm, _F32, 1), (cos, _F32, 1), (sin, _F32, 1)),
                  ((x, _F32, 1), (K, _F32, 3), (V, _F32, 3), (qkv, _F32, 1), (a, _F32, 1), (hn, _F32, 1),
                   (gu, _F32, 1), (scores, _F32, 2)))
    d = x.shape[0]
    hkv, cap, dh = K.shape
    dff = wd.shape[1] // _BYTES[kd] * 32 if 0 <= kd <= 2 else 0
    if h <= 0 or hkv <= 0 or h % hkv or dh <= 0 or dh % 2 or d <= 0 or dff <= 0:
        raise ValueError(f"llama_layer: {h} query heads, {hkv} K/V heads of {dh}, d = {d}, d_ff = {dff}")
    _fits(wqkv, kqkv, (h + 2 * hkv) * dh, d)
    _fits(wo, ko, d, h * dh)
    _fits(wgu, kgu, 2 * dff, d)
    _fits(wd, kd, d, dff)
    if V.shape != K.shape or not 0 <= pos < cap:
        raise ValueError(f"llama_layer: K {K.shape}, V {V.shape}, position {pos}")
    if (attn_norm.shape[0] != d or ffn_norm.shape[0] != d or cos.shape[0] != dh // 2
            or sin.shape[0] != dh // 2 or qkv.shape[0] < (h + 2 * hkv) * dh or a.shape[0] < h * dh
            or hn.shape[0] < max(d, dff) or gu.shape[0] < 2 * dff or scores.shape[0] < h
            or scores.shape[1] < cap):
        raise ValueError("llama_layer: a norm, the rotary row or a scratch buffer has the wrong size")
    nthreads = _use_threads(num_threads)
    ro = _read_only
    _llama_layer.llama_layer(x, ro(x), ro(attn_norm), ro(ffn_norm), ro(wqkv), kqkv, ro(wo), ko, ro(wgu),
                             kgu, ro(wd), kd, bool(q8), K, V, pos, ro(cos), ro(sin), h, float(eps), qkv, a,
                             ro(a), hn, ro(hn), gu, scores, nthreads)



def block_layer(x, ln1_g, ln1_b, lnc_g, lnc_b, ln2_g, ln2_b, wqkv, wo, wcq, wco, w1, b1, w2, b2, K, V, pos,
                Km, Vm, keep, h, post_norm, has_cross, eps, qkv, a, hn, f, scores, num_threads):
    """The kernel contract's block_layer (see block_layer.py): one call of the compiled block, its
    operands' shapes checked against each other first (as kernels/layer_step.pyx checks them: all
    that keeps the kernel within its arrays; without has_cross, wcq, wco, Km, Vm, keep and the
    lnc norm are only checked for their type, never read). What it only reads goes in read-only,
    and K and V also as read-only views of themselves (what the attention reads): one compiled
    signature."""
    read = [np.asarray(v) for v in (ln1_g, ln1_b, lnc_g, lnc_b, ln2_g, ln2_b, wqkv, wo, wcq, wco, w1, b1, w2,
                                     b2, Km, Vm, keep)]
    ln1_g, ln1_b, lnc_g, lnc_b, ln2_g, ln2_b, wqkv, wo, wcq, wco, w1, b1, w2, b2, Km, Vm, keep = read
    pos, h, post_norm, has_cross = int(pos), int(h), bool(post_norm), bool(has_cross)
    ndims = (1,) * 6 + (2,) * 5 + (1, 2, 1, 2, 2)  # the norms; wqkv, wo, wcq, wco, w1; b1, w2, b2, Km, Vm
    _check_arrays("block_layer", tuple((v, _F32, n) for v, n in zip(read[:16], ndims)) + ((keep, _U8, 1),),
                  ((x, _F32, 1), (K, _F32, 2), (V, _F32, 2), (qkv, _F32, 1), (a, _F32, 1), (hn, _F32, 1),
                   (f, _F32, 1), (scores, _F32, 2)))
    d, cap, dff = x.shape[0], K.shape[0], w1.shape[1]
    nsrc = Km.shape[0] if has_cross else 0
    if h <= 0 or d <= 0 or d % h or dff <= 0:
        raise ValueError(f"block_layer: {h} heads do not divide d = {d}, or d_ff = {dff}")
    dense = [(wqkv, None, d, 3 * d, "wqkv"), (wo, None, d, d, "wo"), (w1, b1, d, dff, "w1"),
             (w2, b2, dff, d, "w2")]
    if has_cross:
        dense += [(wcq, None, d, d, "wcq"), (wco, None, d, d, "wco")]
    for w, b, k, n, name in dense:
        if w.shape != (k, n) or (b is not None and b.shape != (n,)):
            raise ValueError(f"block_layer: {name} has shape {w.shape}, the layer needs ({k}, {n})"
                             + (f" and a bias of {n}" if b is not None else ""))
    if has_cross and (nsrc <= 0 or Km.shape != (nsrc, d) or Vm.shape != (nsrc, d) or keep.shape != (nsrc,)
                      or lnc_g.shape != (d,) or lnc_b.shape != (d,)):
        raise ValueError(f"block_layer: memory keys {Km.shape}, values {Vm.shape}, mask {keep.shape} or the "
                         f"cross norm do not fit d = {d}")
    if K.shape != (cap, d) or V.shape != (cap, d) or not 0 <= pos < cap:
        raise ValueError(f"block_layer: K {K.shape}, V {V.shape}, position {pos}")
    if (any(g.shape != (d,) for g in (ln1_g, ln1_b, ln2_g, ln2_b)) or qkv.shape[0] < 3 * d or a.shape[0] < d
            or hn.shape[0] < max(d, dff) or f.shape[0] < dff or scores.shape[0] < h
            or scores.shape[1] < max(cap, nsrc)):
        raise ValueError("block_layer: a norm or a scratch buffer has the wrong size")
    nthreads = _use_threads(num_threads)
    ro = _read_only
    _block_layer.block_layer(x, *map(ro, read[:14]), K, V, ro(K), ro(V), pos, ro(Km), ro(Vm), ro(keep), h,
                             post_norm, has_cross, float(eps), qkv, a, hn, f, scores, nthreads)


_F32, _U8 = np.dtype(np.float32), np.dtype(np.uint8)
_BYTES = _linear_q.BLOCK_BYTES


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


def _fits(w, kind, n, k):
    """ValueError unless blocks w of kind stand for a (k, n) matrix."""
    if not 0 <= kind <= 2 or k <= 0 or k % 32 or w.shape[0] != n or w.shape[1] != k // 32 * _BYTES[kind]:
        raise ValueError(f"llama_layer: blocks {w.shape} of kind {kind} do not stand for a ({k}, {n}) matrix")


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
