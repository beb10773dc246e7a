"""Attention's bookkeeping: attention, attention_backward, attention_varlen and attention_paged
checked, laid out as a plan (silkattn._plan) once a call shape, and handed to the kernel."""
import math

import numpy as np

from .. import _blas, _cache, _threads
from .. import _checks as check
from .. import _plan as _plan_mod
from .. import reference as ref
from .._threads import ATTENTION_WORK, DECODE_WORK, threads_for
from .common import FLOATS, as_float_array, check_out

# ---------------------------------------------------------------- attention

def check_alibi(slopes, Q):
    """alibi_slopes as float64 (Hq,), Hq being Q's head axis (-3)."""
    if slopes is None:
        return None
    s = np.asarray(slopes)
    if s.dtype.kind not in "fiu":
        raise TypeError(f"alibi_slopes must be real numbers, got dtype {s.dtype}")
    if Q.ndim < 3:
        raise ValueError(f"alibi_slopes needs Q's head axis: Q of shape (..., Hq, Sq, d_k), got {Q.shape}")
    if s.shape != (Q.shape[-3],):
        raise ValueError(f"alibi_slopes must have shape ({Q.shape[-3]},), one slope per query head, "
                         f"got {s.shape}")
    s = s.astype(np.float64)
    if not np.isfinite(s).all():
        raise ValueError("alibi_slopes must be finite")
    return s


def _group_heads(Q, K, V):
    """(Q, K, V, g): with fewer K/V heads than Q's (grouped-query attention, axis -3), Q's head
    axis viewed as (Hkv, g) and K, V given a group axis of 1, so that plain broadcasting pairs query
    head h with K/V head h // g without a copy; g = 1 when the heads match or broadcast."""
    if Q.ndim < 3 or K.ndim < 3 or V.ndim < 3:
        return Q, K, V, 1
    Hq, Hk, Hv = Q.shape[-3], K.shape[-3], V.shape[-3]
    if Hk in (1, Hq) and Hv in (1, Hq):
        return Q, K, V, 1
    if Hk != Hv:
        raise ValueError(f"K and V must have as many heads (axis -3) as each other for grouped-query "
                         f"attention, got {Hk} and {Hv}")
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"the leading (batch) dims of Q {Q.shape}, K {K.shape} and V {V.shape} do not "
                         f"broadcast, and Q's {Hq} heads (axis -3) are not a multiple of K and V's {Hk} "
                         "(grouped-query attention: query head h reads K/V head h // (Hq / Hkv))")
    g = Hq // Hk
    return Q.reshape(Q.shape[:-3] + (Hk, g) + Q.shape[-2:]), K[..., None, :, :], V[..., None, :, :], g


def _split_heads(a, name, Hq, g):
    """A mask or bias broadcast to (..., Hq, Sq, Sk), seen as (..., Hq / g, g, Sq, Sk) for grouped heads."""
    if g == 1 or a.ndim < 3:
        return a
    if a.shape[-3] == Hq:
        return a.reshape(a.shape[:-3] + (Hq // g, g) + a.shape[-2:])
    if a.shape[-3] != 1:
        raise ValueError(f"{name} of shape {a.shape} does not broadcast to the query heads "
                         f"(..., {Hq}, Sq, Sk)")
    return a[..., None, :, :]


def _two_dims(a):
    """a with leading axes of 1 up to 2 dimensions (a mask or bias given as a key vector)."""
    return a.reshape((1,) * (2 - a.ndim) + a.shape) if a.ndim < 2 else a


def _broadcast_operand(a, name, lead, Sq, Sk, shape):
    """The leading dims of a mask or bias broadcast with `lead`; a ValueError naming it (and the
    caller's shape) if not."""
    try:
        lead = np.broadcast_shapes(lead, a.shape[:-2])
        np.broadcast_shapes(a.shape[-2:], (Sq, Sk))
    except ValueError:
        raise ValueError(f"{name} of shape {shape} does not broadcast to {lead + (Sq, Sk)}") from None
    return lead


def prepare_attention(Q, K, V, mask, out, bias=None):
    """Checked (Q, K, V in one dtype, mask as bool or None, bias in that dtype or None, lead dims,
    out, g): Q, K, V, mask and bias come back with grouped-query heads split (see _group_heads),
    lead is their common leading shape, out has the caller's (..., Hq, Sq, d_v) shape."""
    Q, K, V = as_float_array(Q, "Q"), as_float_array(K, "K"), as_float_array(V, "V")
    for name, a in (("Q", Q), ("K", K), ("V", V)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., seq, d), got shape {a.shape}")
    (Sq, dk), (Sk, dk2), (Sv, dv) = Q.shape[-2:], K.shape[-2:], V.shape[-2:]
    if dk != dk2:
        raise ValueError(f"Q and K must share d_k (their last axis), got {dk} and {dk2}")
    if Sk != Sv:
        raise ValueError(f"K and V must have the same number of keys, got {Sk} and {Sv}")
    Hq = Q.shape[-3] if Q.ndim >= 3 else 1
    Q, K, V, g = _group_heads(Q, K, V)
    try:
        lead = Q.shape[:-2] if Q.shape[:-2] == K.shape[:-2] == V.shape[:-2] else np.broadcast_shapes(
            Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    except ValueError:
        raise ValueError(f"the leading (batch) dims of Q {Q.shape}, K {K.shape} and V {V.shape} "
                         "do not broadcast") from None
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype.kind not in "biuf":
            raise TypeError(f"mask must be boolean (or 0/1 numbers), got dtype {m.dtype}")
        mask = _split_heads(m if m.dtype == bool else m != 0, "mask", Hq, g)  # 0/1 read as np.where does
        lead = _broadcast_operand(_two_dims(mask), "mask", lead, Sq, Sk, m.shape)
    if Sk == 0 and Sq:
        raise ValueError("K and V have no keys (Sk = 0): a softmax over no keys is undefined")
    if dk == 0:
        raise ValueError("Q and K have d_k = 0: the scale 1/sqrt(d_k) is undefined")
    dtype = np.result_type(Q, K, V)
    if bias is not None:
        bias = np.asarray(bias)
        shape = bias.shape
        if bias.dtype not in FLOATS and bias.dtype.kind not in "iu":
            raise TypeError(f"bias must be a float array (added to the scores), got dtype {bias.dtype}")
        bias = _split_heads(bias.astype(dtype, copy=False), "bias", Hq, g)
        lead = _broadcast_operand(_two_dims(bias), "bias", lead, Sq, Sk, shape)
    Q, K, V = (a.astype(dtype, copy=False) for a in (Q, K, V))
    out_lead = lead[:-2] + (lead[-2] * lead[-1],) if g > 1 else lead  # (..., Hkv, g) -> (..., Hq)
    return Q, K, V, mask, bias, lead, check_out(out, out_lead + (Sq, dv), dtype, [Q, K, V]), g


_NO_MASK = np.ones(1, np.uint8)
_NO_BIAS_ROWS = {dtype: np.zeros(1, dtype) for dtype in FLOATS}


def _flat_rows(a, lead):
    """(1-D view over a's memory, int64 offsets of each batch item in `lead`, row stride).

    Keeps strided views (e.g. one head's columns of a projection) without a copy when the last
    axis has unit stride and no stride is negative; copies otherwise.
    """
    item = a.itemsize
    if a.flags.c_contiguous and a.shape[:-2] == lead:
        S, d = a.shape[-2:]
        return a.reshape(-1), np.arange(math.prod(lead), dtype=np.int64) * (S * d), d if S > 1 else 0
    if a.ndim and (a.strides[-1] != item and a.shape[-1] > 1 or any(s < 0 or s % item for s in a.strides)):
        a = np.ascontiguousarray(a)
    steps = [0 if n == 1 else s // item for n, s in zip(a.shape, a.strides)]
    if a.ndim == 3 and a.shape[:1] == lead:  # heads of a projection or a KV cache: one lead axis
        flat = np.lib.stride_tricks.as_strided(a, (1 + sum((n - 1) * s for n, s in zip(a.shape, steps)),),
                                               (item,), writeable=False)
        return flat, np.arange(lead[0], dtype=np.int64) * steps[0], steps[1]
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, steps))
    if a.flags.c_contiguous:
        flat = a.reshape(-1)
    else:
        flat = np.lib.stride_tricks.as_strided(a, (span,), (item,), writeable=False)
    lead_steps = [0] * (len(lead) - (a.ndim - 2)) + steps[:-2]
    offsets = np.zeros(lead, np.int64)
    for axis, (n, s) in enumerate(zip(lead, lead_steps)):
        offsets = offsets + (np.arange(n, dtype=np.int64) * s).reshape((n,) + (1,) * (len(lead) - axis - 1))
    return flat, np.broadcast_to(offsets, lead).reshape(-1), steps[-2]


def _key_rows(a, Sk, lead):
    """_flat_rows of a mask or bias broadcast to Sk keys (a key-broadcast one copied: kernels read
    keys one by one)."""
    a = _two_dims(a)
    return _flat_rows(np.broadcast_to(a, a.shape[:-1] + (Sk,)), lead)


def _kv_units(K, V, lead):
    """(the K/V unit of each item, the number of units): items whose K and V are the same rows
    (broadcast K/V, the query heads of a group) share a unit."""
    ids = [np.broadcast_to(np.arange(math.prod(a.shape[:-2]), dtype=np.int64).reshape(a.shape[:-2]),
                           lead).ravel() for a in (K, V)]
    key = ids[0] * (ids[1].max(initial=0) + 1) + ids[1]
    if len(key) <= 1:
        return np.zeros(len(key), np.int64), len(key)
    uniq, unit = np.unique(key, return_inverse=True)
    return unit.reshape(-1), len(uniq)


def _layout(Q, K, V, mask, bias, lead, q_offset, slopes):
    """(operand parts: (flat, offsets, row stride) each, ITEMs, number of units) of one attention
    call over checked operands."""
    Sq, (Sk, dv) = Q.shape[-2], V.shape[-2:]
    parts = [_flat_rows(a, lead) for a in (Q, K, V)]
    parts.append(_key_rows(mask.view(np.uint8), Sk, lead) if mask is not None else (_NO_MASK, None, 0))
    parts.append(_key_rows(bias, Sk, lead) if bias is not None else (_NO_BIAS_ROWS[Q.dtype], None, 0))
    B = len(parts[0][1])
    items = np.zeros(B, _plan_mod.ITEM)
    for name, p in zip(("q", "k", "v", "mask", "bias"), parts):
        if p[1] is not None:
            items[name] = p[1]
    items["out"] = np.arange(B, dtype=np.int64) * (Sq * dv)
    items["sq"], items["sk"], items["pos"] = Sq, Sk, q_offset
    items["unit"], nunits = _kv_units(K, V, lead)
    if slopes is not None:  # items run over (..., Hq): head h is item % Hq
        items["slope"] = np.tile(slopes, B // len(slopes))
    return parts, items, nunits


def _finish(kernels, parts, items, nunits, out, dk, dv, scale, softcap, causal, window, has_alibi, pages=None,
            page_keys=0):
    """(plan, threads) from the operands and items: units, window and the work (silkattn._plan);
    pages, page_keys: a paged plan's (the items' k and v name their unit's first page)."""
    units = np.zeros(nunits, _plan_mod.UNIT)
    units["k"][items["unit"]], units["v"][items["unit"]], units["sk"][items["unit"]] = (
        items["k"], items["v"], items["sk"])
    left, right = _plan_mod.window_bounds(window, causal)
    plan = _plan_mod.Plan(
        q=parts[0][0], k=parts[1][0], v=parts[2][0], mask=parts[3][0], bias=parts[4][0], out=out.reshape(-1),
        rs_q=parts[0][2], rs_k=parts[1][2], rs_v=parts[2][2], rs_mask=parts[3][2], rs_bias=parts[4][2],
        dk=dk, dv=dv, sq_max=int(items["sq"].max(initial=0)), sk_max=int(items["sk"].max(initial=0)),
        scale=1 / math.sqrt(dk) if scale is None else scale, softcap=softcap or 0.0, left=left, right=right,
        has_mask=parts[3][1] is not None, has_bias=parts[4][1] is not None, has_alibi=has_alibi,
        items=items, units=units, page_keys=page_keys, pages=pages)
    nthreads = threads_for(plan.work, DECODE_WORK if _plan_mod.takes_rows(plan) else ATTENTION_WORK)
    return _plan_mod.schedule(plan, kernels.attention_tiles, nthreads), nthreads


def _contiguous_call(Q, K, V):
    """True for the everyday call: same-dtype C-contiguous float arrays, equal lead dims, no empty
    axis. Such a call is checked by these few comparisons instead of the general path, whose
    bookkeeping would dominate a small call."""
    return (type(Q) is type(K) is type(V) is np.ndarray
            and Q.dtype == K.dtype == V.dtype and Q.dtype in FLOATS and Q.ndim == K.ndim == V.ndim >= 2
            and Q.shape[:-2] == K.shape[:-2] == V.shape[:-2]
            and Q.shape[-1] == K.shape[-1] and K.shape[-2] == V.shape[-2] and Q.size and K.size and V.size
            and Q.flags.c_contiguous and K.flags.c_contiguous and V.flags.c_contiguous)


def attention(kernels, Q, K, V, mask=None, *, scale=None, softcap=None, bias=None, alibi_slopes=None,
              causal=False, window=None, q_offset=0, out=None, return_lse=False):
    causal, window = bool(causal), check.window(window)
    scale, softcap = check.optional_positive(scale, "scale"), check.optional_positive(softcap, "softcap")
    q_offset = check.q_offset(q_offset, causal or window is not None or alibi_slopes is not None)
    return_lse = check.flag(return_lse, "return_lse")
    if kernels.attention is not None and mask is None and bias is None and alibi_slopes is None \
            and out is None:
        if _contiguous_call(Q, K, V) or _heads_view(Q, K, V):
            return _kept_plan_call(kernels, Q, K, V, scale, softcap, causal, window, q_offset, return_lse)
        heads = _grouped_heads(Q, K, V)  # (..., Hq, S, d) over (..., Hkv, S, d) as (heads, S, d) views
        if heads is not None:
            out = _kept_plan_call(kernels, *heads, scale, softcap, causal, window, q_offset, return_lse)
            if return_lse:
                return out[0].reshape(Q.shape[:-1] + V.shape[-1:]), out[1].reshape(Q.shape[:-1])
            return out.reshape(Q.shape[:-1] + V.shape[-1:])
    keywords = dict(scale=scale, softcap=softcap, causal=causal, window=window, q_offset=q_offset)
    slopes = check_alibi(alibi_slopes, as_float_array(Q, "Q"))
    args = Q, K, V, mask, bias
    Q, K, V, mask, bias, lead, out, g = prepare_attention(Q, K, V, mask, out, bias)
    lse = np.empty(out.shape[:-1], out.dtype) if return_lse else None
    if not out.size:
        return (out, lse) if return_lse else out
    if kernels.attention is None:
        Q, K, V, mask, bias = _unsplit(out.dtype, *args)
        with _blas.threads():
            result = ref.attention(Q, K, V, mask, bias=bias, alibi_slopes=slopes, return_lse=return_lse,
                                   **keywords)
        if not return_lse:
            np.copyto(out, result)
            return out
        np.copyto(out, result[0]), np.copyto(lse, result[1])
        return out, lse
    layout = _layout(Q, K, V, mask, bias, lead, q_offset, slopes)
    plan, nthreads = _finish(kernels, *layout, out, Q.shape[-1], V.shape[-1], scale, softcap, causal, window,
                             slopes is not None)
    plan.lse = None if lse is None else lse.reshape(-1)
    kernels.attention(plan, nthreads)
    return (out, lse) if return_lse else out


def attention_backward(kernels, dout, Q, K, V, out, lse, mask=None, *, scale=None, softcap=None, bias=None,
                       alibi_slopes=None, causal=False, window=None, q_offset=0):
    causal, window = bool(causal), check.window(window)
    scale, softcap = check.optional_positive(scale, "scale"), check.optional_positive(softcap, "softcap")
    q_offset = check.q_offset(q_offset, causal or window is not None or alibi_slopes is not None)
    slopes = check_alibi(alibi_slopes, as_float_array(Q, "Q"))
    args = Q, K, V, mask, bias
    Qg, Kg, Vg, mask, bias, lead, o, g = prepare_attention(Q, K, V, mask, None, bias)
    dtype = o.dtype
    dout, out, lse = (_backward_operand(a, name, shape, dtype) for a, name, shape in (
        (dout, "dout", o.shape), (out, "out", o.shape), (lse, "lse", o.shape[:-1])))
    Q, K, V = (np.asarray(a) for a in args[:3])
    if not o.size or not K.size:
        return tuple(np.zeros(a.shape, dtype) for a in (Q, K, V))
    if kernels.attention_backward is None:
        Qr, Kr, Vr, mr, br = _unsplit(dtype, *args)
        with _blas.threads():
            return ref.attention_backward(dout, Qr, Kr, Vr, out, lse, mr, scale=scale, softcap=softcap,
                                          bias=br, alibi_slopes=slopes, causal=causal, window=window,
                                          q_offset=q_offset)
    # every item its own Q rows and every unit its own K and V rows (contiguous copies over the
    # broadcast shapes): a task, one unit, then alone writes the rows of dQ, dK, dV it reads
    kv_lead = np.broadcast_shapes(Kg.shape[:-2], Vg.shape[:-2])
    Qc = np.ascontiguousarray(np.broadcast_to(Qg, lead + Qg.shape[-2:]))
    Kc = np.ascontiguousarray(np.broadcast_to(Kg, kv_lead + Kg.shape[-2:]))
    Vc = np.ascontiguousarray(np.broadcast_to(Vg, kv_lead + Vg.shape[-2:]))
    layout = _layout(Qc, Kc, Vc, mask, bias, lead, q_offset, slopes)
    plan, nthreads = _finish(kernels, *layout, o, Qc.shape[-1], Vc.shape[-1], scale, softcap, causal, window,
                             slopes is not None)
    units = plan.items["unit"]
    order = np.argsort(units, kind="stable").astype(np.int64)
    first = np.concatenate(([0], np.cumsum(np.bincount(units, minlength=len(plan.units))))).astype(np.int64)
    rows = dout.reshape(-1, dout.shape[-1])
    D = np.einsum("ij,ij->i", rows, out.reshape(rows.shape))  # rowsum(dout * out), O(rows) memory
    dQ, dK, dV = np.zeros_like(Qc), np.empty_like(Kc), np.empty_like(Vc)
    nthreads = max(1, min(nthreads, _threads._num_threads, len(plan.units)))
    fix = np.empty(2 * len(D), dtype)  # the kernel's per-row (base, rel) of the weights
    kernels.attention_backward(plan, rows.reshape(-1), D, lse.reshape(-1), fix, order, first, dQ.reshape(-1),
                               dK.reshape(-1), dV.reshape(-1), nthreads)
    return tuple(_sum_to(d, a_g.shape).reshape(a.shape)
                 for d, a_g, a in ((dQ, Qg, Q), (dK, Kg, K), (dV, Vg, V)))


def _backward_operand(a, name, shape, dtype):
    """dout, out or lse of attention_backward: a float array of the forward's result shape, C-contiguous
    in the call's dtype."""
    a = as_float_array(a, name)
    if a.shape != shape:
        what = "lse" if name == "lse" else "output"
        raise ValueError(f"{name} must have shape {shape} (attention's {what} for these Q, K, V), "
                         f"got {a.shape}")
    return np.ascontiguousarray(a, dtype)


def _sum_to(d, shape):
    """d summed over the axes its operand of `shape` was broadcast along (the gradient of broadcasting)."""
    d = d.sum(tuple(range(d.ndim - len(shape)))) if d.ndim > len(shape) else d
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and d.shape[i] != 1)
    return d.sum(axes, keepdims=True) if axes else d


def _kept_plan_call(kernels, Q, K, V, scale, softcap, causal, window, q_offset, return_lse=False):
    """attention for the everyday calls (_contiguous_call, _heads_view, _grouped_heads), their plan
    kept by shape (and strides) in silkattn._cache and bound to the call's arrays: a repeated call
    costs a look-up. return_lse: (out, lse)."""
    keywords = (scale, softcap, causal, window, q_offset, kernels.attention_tiles, _threads._num_threads)
    out = np.empty(Q.shape[:-1] + V.shape[-1:], Q.dtype)
    lse = np.empty(Q.shape[:-1], Q.dtype) if return_lse else None
    if _contiguous_call(Q, K, V):
        key = ("contiguous plan", Q.shape, Q.dtype.char, K.shape[-2], V.shape[-1], *keywords)
        plan, nthreads = _cache.get(key, lambda: _contiguous_plan(
            kernels, Q.shape[:-2], *Q.shape[-2:], *V.shape[-2:], Q.dtype, scale, softcap, causal, window,
            q_offset))
        bound = plan.bind(Q.reshape(-1), K.reshape(-1), V.reshape(-1), out.reshape(-1))
    else:
        # the general path's plan: its offsets hold for any arrays of this layout
        key = ("view plan", Q.shape, K.shape, V.shape[-1], Q.strides, K.strides, V.strides, Q.dtype.char,
               *keywords)
        plan, nthreads = _cache.get(key, lambda: _view_layout(kernels, Q, K, V, scale, softcap, causal,
                                                              window, q_offset))
        bound = plan.bind(_flat(Q), _flat(K), _flat(V), out.reshape(-1))
    if return_lse:
        bound.lse = lse.reshape(-1)
    kernels.attention(bound, nthreads)
    return (out, lse) if return_lse else out


def _grouped_heads(Q, K, V):
    """(Q, K, V) as (heads, S, d) views for C-contiguous, non-empty grouped-query operands of 4 or
    more dims with equal batch dims, else None. Merged into one axis, the batch and heads keep their
    groups (query head b Hq + h reads K/V head b Hkv + h // g = (b Hq + h) // g), so the call is a
    _heads_view one and keeps its plan instead of laying out its items again (0.2 ms a call)."""
    if not (type(Q) is type(K) is type(V) is np.ndarray and Q.ndim == K.ndim == V.ndim >= 4
            and Q.shape[:-3] == K.shape[:-3] == V.shape[:-3] and Q.size and K.size and V.size
            and Q.flags.c_contiguous and K.flags.c_contiguous and V.flags.c_contiguous):
        return None
    heads = [a.reshape((-1,) + a.shape[-2:]) for a in (Q, K, V)]
    return heads if _heads_view(*heads) else None


def _unsplit(dtype, Q, K, V, mask=None, bias=None):
    """The caller's operands in the result dtype, for the reference (the NumPy fallback)."""
    Q, K, V = (np.asarray(a).astype(dtype, copy=False) for a in (Q, K, V))
    if mask is not None:
        mask = np.asarray(mask)
        mask = mask if mask.dtype == bool else mask != 0
    return Q, K, V, mask, None if bias is None else np.asarray(bias).astype(dtype, copy=False)


def _heads_view(Q, K, V):
    """True for the call of a model's attention on views: (H, S, d) arrays of one float dtype with
    unit-stride rows and non-negative strides (heads cut from a projection, a KV cache's first
    positions), K and V with Q's heads or a whole number of groups of them. A layer's call is
    repeated by every layer of a step, so its plan is kept by shapes and strides."""
    return (type(Q) is type(K) is type(V) is np.ndarray and Q.ndim == K.ndim == V.ndim == 3
            and Q.dtype == K.dtype == V.dtype and Q.dtype in FLOATS
            and K.shape[0] == V.shape[0] > 0 and Q.shape[0] % K.shape[0] == 0
            and Q.shape[2] == K.shape[2] and K.shape[1] == V.shape[1] and Q.size and K.size and V.size
            and Q.strides[2] == K.strides[2] == V.strides[2] == Q.itemsize
            and min(Q.strides + K.strides + V.strides) >= 0)


def _flat(a):
    """A 1-D view from a's first element over every element it reaches (as _flat_rows cuts it)."""
    if a.flags.c_contiguous:
        return a.reshape(-1)
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.strides)) // a.itemsize
    return np.lib.stride_tricks.as_strided(a, (span,), (a.itemsize,), writeable=False)


def _view_layout(kernels, Q, K, V, scale, softcap, causal, window, q_offset):
    """(plan, threads) of a _heads_view call through the general path, to be kept (its arrays are
    replaced by the next call's, Plan.bind)."""
    Q, K, V, mask, bias, lead, out, _ = prepare_attention(Q, K, V, None, None)
    layout = _layout(Q, K, V, mask, bias, lead, q_offset, None)
    plan, nthreads = _finish(kernels, *layout, out, Q.shape[-1], V.shape[-1], scale, softcap, causal, window,
                             False)
    # the layout alone is kept: the first call's arrays (a model's KV cache, a batch's pool) would
    # otherwise stay alive in silkattn._cache for as long as the plan
    plan.q, plan.k, plan.v, plan.out = (_placeholder(a.shape, a.dtype)
                                        for a in (plan.q, plan.k, plan.v, plan.out))
    plan.derived = {}
    return plan, nthreads


def _contiguous_plan(kernels, lead, Sq, dk, Sk, dv, dtype, scale, softcap, causal, window, q_offset):
    """(plan, threads) for C-contiguous (lead, Sq, dk), (lead, Sk, dk), (lead, Sk, dv) operands, kept
    by shape: its arrays are placeholders the caller replaces by the call's (Plan.bind)."""
    Q, K, V, out = (_placeholder(lead + shape, dtype) for shape in ((Sq, dk), (Sk, dk), (Sk, dv), (Sq, dv)))
    layout = _layout(Q, K, V, None, None, lead, q_offset, None)
    plan, nthreads = _finish(kernels, *layout, out, dk, dv, scale, softcap, causal, window, False)
    plan.derived = {}
    return plan, nthreads


def _placeholder(shape, dtype):
    """A C-contiguous array's shape and strides over one element of memory: the layout alone, for a
    cached plan (never read)."""
    dtype = np.dtype(dtype)
    strides = np.cumprod((1,) + shape[:0:-1])[::-1] * dtype.itemsize
    return np.lib.stride_tricks.as_strided(np.empty(1, dtype), shape, tuple(int(s) for s in strides),
                                           writeable=False)


def check_cu_seqlens(cu_seqlens, total, name="cu_seqlens"):
    """cu_seqlens as int64 (n + 1,): 0, then non-decreasing sequence ends, the last one total."""
    cu = np.asarray(cu_seqlens)
    if cu.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers (where each packed sequence starts), got dtype {cu.dtype}")
    cu = cu.astype(np.int64, copy=False)
    if cu.ndim != 1 or cu.size < 2 or cu[0] != 0 or cu[-1] != total or (np.diff(cu) < 0).any():
        raise ValueError(f"{name} must run from 0 to the {total} packed rows without decreasing "
                         f"(sequence i is rows {name}[i] .. {name}[i + 1]), got {cu_seqlens!r}")
    return cu


def attention_varlen(kernels, Q, K, V, cu_seqlens, *, causal=False, cu_seqlens_k=None, scale=None,
                     softcap=None, bias=None, alibi_slopes=None, window=None, out=None):
    causal, window = bool(causal), check.window(window)
    scale, softcap = check.optional_positive(scale, "scale"), check.optional_positive(softcap, "softcap")
    slopes = check_alibi(alibi_slopes, as_float_array(Q, "Q"))
    args = Q, K, V, None, bias
    Q, K, V, _, bias, lead, out, g = prepare_attention(Q, K, V, None, out, bias)
    total, total_k = Q.shape[-2], K.shape[-2]
    cu = check_cu_seqlens(cu_seqlens, total)
    if cu_seqlens_k is None:
        if total_k != total:
            raise ValueError(f"Q and K must hold the same packed rows, got {total} and {total_k} "
                             "(pass cu_seqlens_k for keys packed apart from the queries)")
        cu_k = cu
    else:
        cu_k = check_cu_seqlens(cu_seqlens_k, total_k, "cu_seqlens_k")
        if len(cu_k) != len(cu):
            raise ValueError(f"cu_seqlens_k must hold as many sequences as cu_seqlens ({len(cu) - 1}), "
                             f"got {len(cu_k) - 1}")
        if ((np.diff(cu_k) == 0) & (np.diff(cu) > 0)).any():
            raise ValueError("cu_seqlens_k gives a sequence with queries but no keys: a softmax over no keys "
                             "is undefined")
    if not out.size:
        return out
    if kernels.attention is None:
        Q, K, V, _, bias = _unsplit(out.dtype, *args)
        with _blas.threads():
            np.copyto(out, ref.attention_varlen(Q, K, V, cu, causal, cu_seqlens_k=cu_k, scale=scale,
                                                softcap=softcap, bias=bias, alibi_slopes=slopes,
                                                window=window))
        return out
    parts, base, _ = _layout(Q, K, V, None, bias, lead, 0, slopes)
    # item (b, s): batch item b's rows of sequence s
    nq, nk = np.diff(cu), np.diff(cu_k)
    keep = nq > 0
    sq0, sk0, nq, nk = cu[:-1][keep], cu_k[:-1][keep], nq[keep], nk[keep]
    B, n = len(base), len(nq)
    if not n:
        return out
    items = np.repeat(base, n)
    s = np.tile(np.arange(n), B)
    for name, part, start in (("q", parts[0], sq0), ("k", parts[1], sk0), ("v", parts[2], sk0)):
        items[name] += start[s] * part[2]
    if bias is not None:
        items["bias"] += sq0[s] * parts[4][2] + sk0[s]
    items["out"] = (np.repeat(np.arange(B, dtype=np.int64), n) * total + sq0[s]) * V.shape[-1]
    items["sq"], items["sk"], items["pos"] = nq[s], nk[s], nk[s] - nq[s]
    items["unit"] = items["unit"] * n + s
    _, unit = np.unique(items["unit"], return_inverse=True)
    unit = unit.reshape(-1)
    # each sequence as attention gives it alone (bitwise): the units of few rows (the rows path,
    # _plan.takes_rows) and the others (the tiles path) in a call each where the sequences mix them
    few = (np.bincount(unit, weights=items["sq"]) <= _plan_mod.ROWS_MAX)[unit]
    for pick in (few, ~few) if few.any() and not few.all() else (slice(None),):
        part, (_, u) = items[pick], np.unique(unit[pick], return_inverse=True)
        part["unit"] = u.reshape(-1)
        kernels.attention(*_finish(kernels, parts, part, int(u.max()) + 1, out, Q.shape[-1], V.shape[-1],
                                   scale, softcap, causal, window, slopes is not None))
    return out


def _check_paged(Q, K_pages, V_pages, page_table, seq_lens):
    """(Q, K_pages, V_pages in one float dtype, page_table int64 (B, m), seq_lens int64 (B,)), each
    shape checked against the others and every page a sequence reads within the pool."""
    Q, K, V = as_float_array(Q, "Q"), as_float_array(K_pages, "K_pages"), as_float_array(V_pages, "V_pages")
    if Q.ndim != 4:
        raise ValueError(f"Q must have shape (B, Hq, Sq, d_k), got {Q.shape}")
    for name, a in (("K_pages", K), ("V_pages", V)):
        if a.ndim != 4:
            raise ValueError(f"{name} must have shape (n_pages, Hkv, page_keys, d), got {a.shape}")
    (B, Hq, Sq, dk), (n_pages, Hkv, P, dk2) = Q.shape, K.shape
    if V.shape[:3] != K.shape[:3]:
        raise ValueError(f"V_pages must have K_pages' pages, heads and page size {K.shape[:3]}, "
                         f"got {V.shape[:3]}")
    if dk2 != dk:
        raise ValueError(f"Q and K_pages must share d_k (their last axis), got {dk} and {dk2}")
    if not Hkv or Hq % Hkv:
        raise ValueError(f"Q's {Hq} heads must be a multiple of K_pages' {Hkv} (query head h reads K/V "
                         "head h // (Hq / Hkv))")
    if P > _plan_mod.CHUNK_KEYS and P % _plan_mod.CHUNK_KEYS:
        raise ValueError(f"the page size (K_pages' axis 2) must be at most {_plan_mod.CHUNK_KEYS} keys or a "
                         f"multiple of it, got {P}")
    table, lens = np.asarray(page_table), np.asarray(seq_lens)
    for name, a in (("page_table", table), ("seq_lens", lens)):
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name} must be integers, got dtype {a.dtype}")
    if table.ndim != 2 or len(table) != B:
        raise ValueError(f"page_table must have shape ({B}, max_pages), one row of page ids a sequence, "
                         f"got {table.shape}")
    if lens.shape != (B,):
        raise ValueError(f"seq_lens must have shape ({B},), the keys of each sequence, got {lens.shape}")
    table, lens = table.astype(np.int64, copy=False), lens.astype(np.int64, copy=False)
    if B and (lens.min() < max(Sq, 1) or lens.max() > table.shape[1] * P):
        raise ValueError(f"seq_lens must lie between Sq = {max(Sq, 1)} (the queries are each sequence's "
                         f"last positions) and page_table's {table.shape[1]} pages x {P} keys, got {lens}")
    used = np.arange(table.shape[1]) < -(-lens[:, None] // P)
    if used.any() and (table[used].min() < 0 or table[used].max() >= n_pages):
        raise ValueError(f"page_table names pages outside the pool's {n_pages} (of the pages "
                         "seq_lens reaches)")
    dtype = np.result_type(Q, K, V, np.float32)
    K, V = (np.ascontiguousarray(a, dtype) for a in (K, V))  # the pools are read in place when they are so
    return np.ascontiguousarray(Q, dtype), K, V, table, lens


def attention_paged(kernels, Q, K_pages, V_pages, page_table, seq_lens, *, causal=True, scale=None,
                    softcap=None, alibi_slopes=None, window=None, out=None):
    window = check.window(window)
    scale, softcap = check.optional_positive(scale, "scale"), check.optional_positive(softcap, "softcap")
    slopes = check_alibi(alibi_slopes, as_float_array(Q, "Q"))
    Q, K, V, table, lens = _check_paged(Q, K_pages, V_pages, page_table, seq_lens)
    (B, Hq, Sq, _), dv = Q.shape, V.shape[-1]
    out = check_out(out, (B, Hq, Sq, dv), Q.dtype, [Q, K, V])
    if not out.size:
        return out
    keywords = dict(causal=bool(causal), scale=scale, softcap=softcap, alibi_slopes=slopes, window=window)
    if kernels.attention is None:
        with _blas.threads():
            np.copyto(out, ref.attention_paged(Q, K, V, table, lens, **keywords))
        return out
    # kept by shape and pages: a decoding step's layers share one (their pools differ, not their layout)
    P = K.shape[2]
    used = table[:, :int(-(-lens.max() // P))]
    key = ("paged plan", Q.shape, K.shape, V.shape[-1], Q.dtype.char, lens.tobytes(), used.tobytes(),
           *(keywords[name] for name in ("causal", "scale", "softcap", "window")),
           None if slopes is None else slopes.tobytes(), kernels.attention_tiles, _threads._num_threads)
    plan, nthreads = _cache.get(key, lambda: _paged_plan(kernels, Q, K, V, table, lens, keywords))
    kernels.attention(plan.bind(Q.reshape(-1), K.reshape(-1), V.reshape(-1), out.reshape(-1)), nthreads)
    return out


def _paged_plan(kernels, Q, K, V, table, lens, keywords):
    """(plan, threads) of attention_paged on the rows path: an item a (sequence, query head, piece
    of its queries), a unit the pieces of one K/V head's group that the kernel takes together
    (at most _plan.ROWS_MAX rows), its keys in pages; the table of pages lists each sequence's
    pages for each K/V head (K, V offsets of the page's row 0) once, the units of the pair sharing it."""
    (B, Hq, Sq, dk), (_, Hkv, P, dv) = Q.shape, V.shape
    g = Hq // Hkv
    hc = min(g, _plan_mod.ROWS_MAX)  # heads of a group a unit takes, and queries a piece
    L = max(1, _plan_mod.ROWS_MAX // hc)
    npieces, nhc = -(-Sq // L), -(-g // hc)
    npages = -(-lens // P)  # each sequence's pages
    # the table of pages: sequence b, K/V head h: its pages in order, from row first[b, h]
    first = (np.cumsum(np.repeat(npages, Hkv)) - np.repeat(npages, Hkv)).reshape(B, Hkv)
    pb = np.repeat(np.arange(B), npages * Hkv)
    ph = np.repeat(np.tile(np.arange(Hkv), B), np.repeat(npages, Hkv))
    pi = np.arange(len(pb)) - first[pb, ph]
    row0 = (table[pb, pi] * Hkv + ph) * P  # the page's row 0 in the pool's rows
    pages = np.stack([row0 * dk, row0 * dv], 1).astype(np.int64)
    b, h, piece = (a.reshape(-1) for a in np.meshgrid(np.arange(B), np.arange(Hq), np.arange(npieces),
                                                         indexing="ij"))
    items = np.zeros(len(b), _plan_mod.ITEM)
    row = (b * Hq + h) * Sq + piece * L
    items["q"], items["out"] = row * dk, row * dv
    items["k"] = items["v"] = first[b, h // g]
    items["sq"], items["sk"] = np.minimum(L, Sq - piece * L), lens[b]
    items["pos"] = lens[b] - Sq + piece * L
    items["unit"] = ((b * Hkv + h // g) * npieces + piece) * nhc + (h % g) // hc
    if keywords["alibi_slopes"] is not None:
        items["slope"] = keywords["alibi_slopes"][h]
    # the operands as placeholders of their size (the call's arrays are bound to the kept plan)
    parts = [(_placeholder((a.size,), Q.dtype), None, d) for a, d in ((Q, dk), (K, dk), (V, dv))]
    parts += [(_NO_MASK, None, 0), (_NO_BIAS_ROWS[Q.dtype], None, 0)]
    out = _placeholder((B, Hq, Sq, dv), Q.dtype)  # the call's is bound to the kept plan
    plan, nthreads = _finish(kernels, parts, items, B * Hkv * npieces * nhc, out, dk, dv, keywords["scale"],
                             keywords["softcap"], keywords["causal"], keywords["window"],
                             keywords["alibi_slopes"] is not None, pages, P)
    if plan.path != "rows":
        raise AssertionError("a paged plan takes the rows path")
    plan.derived = {}
    return plan, nthreads
