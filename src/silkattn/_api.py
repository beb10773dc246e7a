"""Every op's bookkeeping, shared by all backends: argument checks, dtypes, the attention operands'
layout, out allocation, thread counts, and the NumPy fallback that runs when a backend's Kernels
record (silkattn._backends) has no kernel for the op.

Each op takes the record first, then the public arguments (silkattn.ops documents them), so kernels
only ever see float32/float64 buffers with unit-stride rows, explicit offsets and strides, and a
result array they may write. The kernel contract (the same for every backend):

    softmax(x, out, num_threads)                         x, out: (rows, n) C-contiguous
    layer_norm(x, g, b, eps, out, num_threads)           x, out: (rows, n); g, b: (n,)
    attention(q, k, v, mask, out, offsets, strides, Sq, Sk, d_k, d_v, causal, q_offset, masked,
              num_threads)
    attention_decode(the same arguments)             for Sq == 1 (chosen by shape, see attention())
        attention (not attention_decode) also takes items: int64 (B, 3), each item's own Sq, Sk and
        output offset (packed sequences of different lengths: attention_varlen); Sq, Sk: the most
        q, k, v: 1-D views over each operand's memory (one dtype); out: 1-D (B * Sq * d_v) C order;
        mask: 1-D uint8 (0 = masked; ignored unless masked); offsets: int64 (B, 4), the element
        offset of batch item b's first row in q, k, v, mask; strides: int64 (4,), the element step
        between rows of q, k, v and mask (0: one mask row broadcast over the queries); causal:
        query i sits at position q_offset + i and sees keys j <= q_offset + i.
    linear(x, w, b, out, transposed, has_bias, num_threads)
                                                         out = x w (+ b), x: (m, k) with m <= LINEAR_ROWS,
                                                         w: (k, n), or (n, k) if transposed (out = x w^T)
    bias_relu(h, b, num_threads)                         h: (rows, n) C-contiguous, in place; b: (n,)
    bias_gelu(h, b, num_threads)                         the same, h = gelu(h + b)
    add_layer_norm(x, r, g, b, eps, s, out, num_threads) s = x + r, out = layer_norm(s); all (rows, n)

Attention kernels skip keys (causal tiles, fully masked tiles) that the reference weighs
exp(-1e9 - max): exactly 0 unless the row's max is near -1e9, and such rows are recomputed exactly
(the margin is named once per backend: kernels/attention.h, silkattn/numba/attention.py).
"""
import math
import operator
from typing import NamedTuple

import numpy as np

from . import reference as ref
from ._threads import ATTENTION_WORK, DECODE_WORK, ELEMENTWISE_WORK, LINEAR_WORK, ROW_WORK, threads_for

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def as_float_array(x, name):
    """x as an ndarray of float32 or float64; a TypeError naming the argument otherwise."""
    x = np.asarray(x)
    if x.dtype not in FLOATS:
        raise TypeError(f"{name} must be a float32 or float64 array, got dtype {x.dtype}")
    return x


def check_out(out, shape, dtype, inputs, same_as=None):
    """A fresh C-contiguous result array, or the caller's `out` once it is shown to fit. `out` must
    not overlap an input, except that it may be exactly `same_as` (an elementwise op in place)."""
    if out is None:
        return np.empty(shape, dtype)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"out must have shape {tuple(shape)} and dtype {np.dtype(dtype)}, "
                         f"got {out.shape} and {out.dtype}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writeable C-contiguous array")
    inplace = out is same_as or (same_as is not None and out.strides == same_as.strides
                                 and out.ctypes.data == same_as.ctypes.data)
    if any(np.may_share_memory(out, x) for x in inputs if not (inplace and x is same_as)):
        raise ValueError("out must not overlap an input array")
    return out


def _along_last_axis(a, n, dtype, name):
    """A gain or bias as a contiguous (n,) vector, or a ValueError if it varies along other axes."""
    if type(a) is np.ndarray and a.shape == (n,) and a.dtype == dtype and a.flags.c_contiguous:
        return a  # the everyday case, checked in a few comparisons
    a = as_float_array(a, name)
    if a.ndim and (a.shape[-1] not in (1, n) or any(s != 1 for s in a.shape[:-1])):
        raise ValueError(f"{name} must have shape ({n},) (or broadcast to it along the last axis), "
                         f"got {a.shape}")
    return np.ascontiguousarray(np.broadcast_to(a.reshape(-1)[-1:] if a.size == 1 else a.reshape(-1), (n,)),
                                dtype=dtype)


def _rows(a):
    """A (rows, n) C-contiguous view (or copy) of a's last axis."""
    return np.ascontiguousarray(a).reshape(-1, a.shape[-1])


# ---------------------------------------------------------------- softmax

def prepare_softmax(x, out):
    """Checked (x, out) for softmax."""
    x = as_float_array(x, "x")
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension (softmax runs over the last axis)")
    if x.shape[-1] == 0:  # as the reference: a max over no values has no answer
        raise ValueError("x has a zero-length last axis: softmax over no values is undefined")
    return x, check_out(out, x.shape, x.dtype, [x])


def softmax(kernels, x, *, out=None):
    x, out = prepare_softmax(x, out)
    if not x.size:
        return out
    if kernels.softmax is None:
        np.copyto(out, ref.softmax(x))
    else:
        kernels.softmax(_rows(x), out.reshape(-1, x.shape[-1]), threads_for(x.size, ROW_WORK))
    return out


# ---------------------------------------------------------------- layer_norm

def prepare_layer_norm(X, g, b, eps, out, dtype=None):
    """Checked (X, g, b as (n,) vectors of the result dtype, eps, out)."""
    X = as_float_array(X, "X")
    if X.ndim == 0:
        raise ValueError("X must have at least one dimension (layer_norm runs over the last axis)")
    n = X.shape[-1]
    if n == 0:
        raise ValueError("X has a zero-length last axis: the mean of no values is undefined")
    eps = float(eps)
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    dtype = np.result_type(X if dtype is None else dtype, as_float_array(g, "g"), as_float_array(b, "b"))
    g, b = _along_last_axis(g, n, dtype, "g"), _along_last_axis(b, n, dtype, "b")
    return X, g, b, eps, check_out(out, X.shape, dtype, [X])


def layer_norm(kernels, X, g, b, eps=1e-5, *, out=None):
    X, g, b, eps, out = prepare_layer_norm(X, g, b, eps, out)
    if not X.size:
        return out
    if kernels.layer_norm is None:  # in the result dtype, as the kernels compute
        np.copyto(out, ref.layer_norm(X.astype(out.dtype, copy=False), g, b, eps))
    else:
        kernels.layer_norm(_rows(X.astype(out.dtype, copy=False)), g, b, eps, out.reshape(-1, X.shape[-1]),
                           threads_for(X.size, ROW_WORK))
    return out


def add_layer_norm(kernels, X, R, g, b, eps=1e-5):
    X, R = as_float_array(X, "X"), as_float_array(R, "R")
    if X.shape != R.shape:
        raise ValueError(f"R must have the shape of X {X.shape}, got {R.shape}")
    sdtype = np.result_type(X, R)
    X, g, b, eps, out = prepare_layer_norm(X, g, b, eps, None, dtype=sdtype)
    if kernels.add_layer_norm is None or out.dtype != sdtype or not X.size:
        S = np.add(X, R, dtype=sdtype)
        return S, layer_norm(kernels, S, g, b, eps)
    S = np.empty(X.shape, sdtype)
    n = X.shape[-1]
    X, R = (_rows(a.astype(sdtype, copy=False)) for a in (X, R))
    kernels.add_layer_norm(X, R, g, b, eps, S.reshape(-1, n), out.reshape(-1, n),
                           threads_for(S.size, ROW_WORK))
    return S, out


# ---------------------------------------------------------------- linear

LINEAR_ROWS = 8  # up to this many rows of X the kernel runs (a matrix-vector product); more: BLAS GEMM


def linear(kernels, X, W, b=None, *, out=None):
    X, W = as_float_array(X, "X"), as_float_array(W, "W")
    if X.ndim == 0:
        raise ValueError("X must have at least one dimension (..., k)")
    k = X.shape[-1]
    if W.ndim != 2 or W.shape[0] != k:
        raise ValueError(f"W must have shape ({k}, n) (X's last axis is {k}), got {W.shape}")
    n = W.shape[1]
    dtype = np.result_type(X, W) if b is None else np.result_type(X, W, as_float_array(b, "b"))
    if b is not None:
        b = _along_last_axis(b, n, dtype, "b")
    out = check_out(out, X.shape[:-1] + (n,), dtype, [X, W])
    rows = X.size // k if k else 0
    transposed = W.flags.f_contiguous and not W.flags.c_contiguous
    few = 0 < rows <= LINEAR_ROWS and n and (W.flags.c_contiguous or transposed)
    kernel = kernels.linear if few else None
    if kernel is None:
        np.matmul(X, W, out=out)
        if b is not None:
            out += b
        return out
    w = (W.T if transposed else W).astype(dtype, copy=False)
    kernel(_rows(X.astype(dtype, copy=False)), w, _NO_BIAS[dtype] if b is None else b, out.reshape(-1, n),
           transposed, b is not None, threads_for(k * n, LINEAR_WORK))
    return out


_NO_BIAS = {dtype: np.zeros(1, dtype) for dtype in FLOATS}


# ---------------------------------------------------------------- bias_relu

def _bias_activation(kernel, numpy_fallback, x, b, out):
    """out = f(x + b) for an elementwise f, b along the last axis; out may be x itself."""
    x = as_float_array(x, "x")
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension (b is added along the last axis)")
    dtype = np.result_type(x, as_float_array(b, "b"))
    b = _along_last_axis(b, x.shape[-1], dtype, "b")
    out = check_out(out, x.shape, dtype, [x, b], same_as=x)
    if kernel is None or not x.size:
        np.copyto(out, numpy_fallback(np.add(x, b, dtype=dtype)))
        return out
    if out is not x:
        np.copyto(out, x)
    kernel(out.reshape(-1, x.shape[-1]), b, threads_for(x.size, ELEMENTWISE_WORK))
    return out


def bias_relu(kernels, x, b, *, out=None):
    return _bias_activation(kernels.bias_relu, lambda v: np.maximum(v, 0), x, b, out)  # NaN stays NaN


def bias_gelu(kernels, x, b, *, out=None):
    return _bias_activation(kernels.bias_gelu, ref.gelu, x, b, out)


# ---------------------------------------------------------------- attention

def prepare_attention(Q, K, V, mask, out):
    """Checked (Q, K, V in one dtype, mask as bool or None, lead dims, out)."""
    Q, K, V = as_float_array(Q, "Q"), as_float_array(K, "K"), as_float_array(V, "V")
    for name, a in (("Q", Q), ("K", K), ("V", V)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., seq, d), got shape {a.shape}")
    (Sq, dk), (Sk, dk2), (Sv, dv) = Q.shape[-2:], K.shape[-2:], V.shape[-2:]
    if dk != dk2:
        raise ValueError(f"Q and K must share d_k (their last axis), got {dk} and {dk2}")
    if Sk != Sv:
        raise ValueError(f"K and V must have the same number of keys, got {Sk} and {Sv}")
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
        try:
            lead = np.broadcast_shapes(lead, m.shape[:-2])
            np.broadcast_shapes(m.shape[-2:], (Sq, Sk))
        except ValueError:
            raise ValueError(f"mask of shape {m.shape} does not broadcast to {lead + (Sq, Sk)}") from None
        mask = m if m.dtype == bool else m != 0  # 0/1 numbers read as np.where reads them
    if Sk == 0 and Sq:
        raise ValueError("K and V have no keys (Sk = 0): a softmax over no keys is undefined")
    if dk == 0:
        raise ValueError("Q and K have d_k = 0: the scale 1/sqrt(d_k) is undefined")
    dtype = np.result_type(Q, K, V)
    Q, K, V = (a.astype(dtype, copy=False) for a in (Q, K, V))
    return Q, K, V, mask, lead, check_out(out, lead + (Sq, dv), dtype, [Q, K, V])


def check_q_offset(q_offset, causal):
    """q_offset as a non-negative int; it places the queries for the causal rule, so it needs causal."""
    try:
        q_offset = operator.index(q_offset)
    except TypeError:
        raise TypeError(f"q_offset must be an int, got {type(q_offset).__name__}") from None
    if q_offset < 0:
        raise ValueError(f"q_offset must be >= 0 (the position of the first query), got {q_offset}")
    if q_offset and not causal:
        raise ValueError("q_offset places the queries for the causal rule: pass causal=True with it")
    return q_offset


class Operands(NamedTuple):
    """One attention call laid out for a kernel (see the contract above); out is the result array."""
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray
    out: np.ndarray
    offsets: np.ndarray
    strides: np.ndarray
    Sq: int
    Sk: int
    dk: int
    dv: int
    masked: bool


_NO_MASK = np.ones(1, np.uint8)
_ZERO_OFFSETS = np.zeros((1, 4), np.int64)


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


def _plain(Q, K, V):
    """True for the everyday call: same-dtype C-contiguous float arrays, equal lead dims, no empty
    axis. Such a call is checked by these few comparisons instead of the general path, whose
    bookkeeping would dominate a small call."""
    return (type(Q) is type(K) is type(V) is np.ndarray
            and Q.dtype == K.dtype == V.dtype and Q.dtype in FLOATS and Q.ndim == K.ndim == V.ndim >= 2
            and Q.shape[:-2] == K.shape[:-2] == V.shape[:-2]
            and Q.shape[-1] == K.shape[-1] and K.shape[-2] == V.shape[-2] and Q.size and K.size and V.size
            and Q.flags.c_contiguous and K.flags.c_contiguous and V.flags.c_contiguous)


def attention_operands(Q, K, V, mask=None, out=None):
    """The kernel's view of one attention call, after the checks: the one place operands are laid out."""
    if mask is None and out is None and _plain(Q, K, V):
        lead, (Sq, dk), (Sk, dv) = Q.shape[:-2], Q.shape[-2:], V.shape[-2:]
        out = np.empty(lead + (Sq, dv), Q.dtype)
        B = out.size // (Sq * dv)
        offsets = _ZERO_OFFSETS if B == 1 else np.arange(B, dtype=np.int64)[:, None] * np.array(
            [Sq * dk, Sk * dk, Sk * dv, 0], np.int64)
        return Operands(Q.reshape(-1), K.reshape(-1), V.reshape(-1), _NO_MASK, out, offsets,
                        np.array([dk, dk, dv, 0], np.int64), Sq, Sk, dk, dv, False)
    Q, K, V, mask, lead, out = prepare_attention(Q, K, V, mask, out)
    (Sq, dk), (Sk, dv), masked = Q.shape[-2:], V.shape[-2:], mask is not None
    parts = [_flat_rows(a, lead) for a in (Q, K, V)]
    if masked:
        m = mask.reshape((1,) * (2 - mask.ndim) + mask.shape) if mask.ndim < 2 else mask
        m = np.broadcast_to(m, m.shape[:-1] + (Sk,)).view(np.uint8)  # the kernels read keys one by one
        parts.append(_flat_rows(m, lead))
    else:
        parts.append((_NO_MASK, np.zeros(len(parts[0][1]), np.int64), 0))
    offsets = np.empty((len(parts[0][1]), 4), np.int64)
    for i, p in enumerate(parts):
        offsets[:, i] = p[1]
    strides = np.array([p[2] for p in parts], np.int64)
    return Operands(*(p[0] for p in parts), out, offsets, strides, Sq, Sk, dk, dv, masked)


def attention(kernels, Q, K, V, mask=None, *, causal=False, q_offset=0, out=None):
    causal = bool(causal)
    q_offset = check_q_offset(q_offset, causal)
    if kernels.attention is None:
        Q, K, V, mask, _, out = prepare_attention(Q, K, V, mask, out)
        if causal:
            tri = ref.causal_mask(Q.shape[-2], K.shape[-2], q_offset)
            mask = tri if mask is None else np.logical_and(mask, tri)
        if out.size:
            np.copyto(out, ref.attention(Q, K, V, mask))
        return out
    a = attention_operands(Q, K, V, mask, out)
    if a.out.size:
        work = len(a.offsets) * a.Sq * a.Sk * (a.dk + a.dv)
        kernel, per_thread = kernels.attention, ATTENTION_WORK
        if a.Sq == 1 and kernels.attention_decode is not None:  # one query row: the decode path
            kernel, per_thread = kernels.attention_decode, DECODE_WORK
        kernel(a.q, a.k, a.v, a.mask, a.out.reshape(-1), a.offsets, a.strides, a.Sq, a.Sk, a.dk, a.dv, causal,
               q_offset, a.masked, threads_for(work, per_thread))
    return a.out


def check_cu_seqlens(cu_seqlens, total):
    """cu_seqlens as int64 (n + 1,): 0, then non-decreasing sequence ends, the last one total."""
    cu = np.asarray(cu_seqlens)
    if cu.dtype.kind not in "iu":
        raise TypeError(f"cu_seqlens must be integers (where each packed sequence starts), "
                        f"got dtype {cu.dtype}")
    cu = cu.astype(np.int64, copy=False)
    if cu.ndim != 1 or cu.size < 2 or cu[0] != 0 or cu[-1] != total or (np.diff(cu) < 0).any():
        raise ValueError(f"cu_seqlens must run from 0 to the {total} packed rows without decreasing "
                         f"(sequence i is rows cu_seqlens[i] .. cu_seqlens[i + 1]), got {cu_seqlens!r}")
    return cu


def attention_varlen(kernels, Q, K, V, cu_seqlens, *, causal=False, out=None):
    Q, K, V, _, lead, out = prepare_attention(Q, K, V, None, out)
    total = Q.shape[-2]
    if K.shape[-2] != total:
        raise ValueError(f"Q and K must hold the same packed rows, got {total} and {K.shape[-2]}")
    cu = check_cu_seqlens(cu_seqlens, total)
    if not out.size:
        return out
    if kernels.attention is None:
        np.copyto(out, ref.attention_varlen(Q, K, V, cu, bool(causal)))
        return out
    a = attention_operands(Q, K, V, None, out)
    lens, starts = np.diff(cu), cu[:-1]
    keep = lens > 0
    lens, starts = lens[keep], starts[keep]
    B, n = len(a.offsets), len(lens)
    # item (b, s): batch item b's rows of sequence s; the longest first, so the threads end together
    offsets = (a.offsets[:, None, :] + starts[None, :, None] * a.strides[None, None, :]).reshape(-1, 4)
    items = np.empty((B * n, 3), np.int64)
    items[:, 0] = items[:, 1] = np.tile(lens, B)
    first_row = np.arange(B, dtype=np.int64)[:, None] * total + starts[None, :]
    items[:, 2] = first_row.reshape(-1) * a.dv
    order = np.argsort(-items[:, 0], kind="stable")
    longest = int(lens.max())
    work = int((lens.astype(np.float64) ** 2).sum()) * B * (a.dk + a.dv)
    kernels.attention(a.q, a.k, a.v, a.mask, a.out.reshape(-1), np.ascontiguousarray(offsets[order]),
                      a.strides, longest, longest, a.dk, a.dv, bool(causal), 0, False,
                      threads_for(work, ATTENTION_WORK), np.ascontiguousarray(items[order]))
    return a.out
