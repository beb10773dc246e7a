"""The ops over rows given as offsets into a flat view (rope, silu_mul, gelu_tanh_mul, gate_mul):
the row layout, the rotary tables and the calls."""
import math

import numpy as np

from .. import _cache
from .. import _checks as check
from .. import reference as ref
from .._threads import ELEMENTWISE_WORK, threads_for
from .common import as_float_array, check_out

# ---------------------------------------------------------------- rows as offsets (rope, silu_mul)

def _row_layout(a):
    """(a 1-D view over a's memory, the int64 offset of each of a's rows in it, in C order) for an
    array (..., n) whose rows have unit stride and whose strides are non-negative multiples of its
    itemsize: the head views of a projection (heads swapped to the front), or one of its column
    blocks, without a copy. None for any other layout (the caller copies)."""
    item, n = a.itemsize, a.shape[-1]
    bad_stride = any(m > 1 and (s < 0 or s % item) for m, s in zip(a.shape, a.strides))
    if bad_stride or (n > 1 and a.strides[-1] != item):
        return None
    steps = tuple(0 if m == 1 else s // item for m, s in zip(a.shape[:-1], a.strides[:-1]))
    if a.flags.c_contiguous:
        flat = a.reshape(-1)
    else:  # from the first element to the last one's row end (writeable if a is)
        span = n + sum((m - 1) * s for m, s in zip(a.shape[:-1], steps))
        flat = np.lib.stride_tricks.as_strided(a, (span,), (item,))
    return flat, _row_offsets(a.shape[:-1], steps)


def _offsets_of(lead, steps):
    """The rows' offsets (elements) of an array of leading shape `lead` and strides `steps`
    (elements), C order, read-only."""
    offsets = np.zeros((), np.int64)
    for m, s in zip(lead, steps):
        offsets = np.add.outer(offsets, np.arange(m, dtype=np.int64) * s)
    offsets = offsets.reshape(-1)
    offsets.flags.writeable = False
    return offsets


KEEP_OFFSETS = 4096  # rows


def _row_offsets(lead, steps):
    """_offsets_of, kept (silkattn._cache) by layout up to KEEP_OFFSETS rows: a decoding step's views
    come back every step, and making their offsets would cost as much as the kernel; more rows cost
    the kernel far more than their offsets."""
    if math.prod(lead) > KEEP_OFFSETS:
        return _offsets_of(lead, steps)
    return _cache.get(("row offsets", lead, steps), lambda: _offsets_of(lead, steps))


def _rows_call(kernel, inputs, out, *extra):
    """kernel(flat, offsets of each input, flat, offsets of out, *extra) (_row_layout): an input
    the layout cannot express is copied; an out it cannot express (the caller's view, in place)
    gets the result in a temporary, copied back."""
    args = []
    for a in inputs:
        args += _row_layout(a) or _row_layout(np.ascontiguousarray(a))
    layout = _row_layout(out)
    target = out if layout is not None else np.empty(out.shape, out.dtype)
    kernel(*args, *(layout or _row_layout(target)), *extra)
    if target is not out:
        np.copyto(out, target)


def _same_view(a, b):
    """a and b are the same elements in the same layout."""
    return a is b or (a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype
                      and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def check_out_elementwise(out, shape, dtype, inputs):
    """check_out for an elementwise op, whose out may also be one of its inputs itself, in any
    layout (in place, e.g. on a strided view of a projection). Such an out must not overlap the
    other inputs, decided exactly: the two column halves of one array interleave but share nothing."""
    if not (isinstance(out, np.ndarray) and any(_same_view(out, a) for a in inputs)):
        return check_out(out, shape, dtype, inputs)
    if out.dtype != dtype:
        raise ValueError(f"out must have shape {tuple(shape)} and dtype {np.dtype(dtype)}, "
                         f"got {out.shape} and {out.dtype}")
    if not out.flags.writeable:
        raise ValueError("out must be writeable (it is an input, to be overwritten in place)")
    others = [a for a in inputs if not _same_view(out, a)]
    if any(np.may_share_memory(out, a) and np.shares_memory(out, a) for a in others):
        raise ValueError("out must not overlap an input array")
    return out


# ---------------------------------------------------------------- rope

def prepare_rope(X, positions, base, out, freq_factors=None):
    """Checked (X, positions, base, out, freq_factors); out may be X itself."""
    X = as_float_array(X, "X")
    if X.ndim < 2:
        raise ValueError(f"X must have at least 2 dimensions (..., seq, d_head), got shape {X.shape}")
    if X.shape[-1] % 2:
        raise ValueError(f"X's last axis d_head must be even (rope turns the pairs (x_i, x_(i + d_head/2))), "
                         f"got {X.shape[-1]}")
    positions = check.positions(positions, X.shape[-2])
    base = check.positive(base, "base")
    factors = check.freq_factors(freq_factors, X.shape[-1] // 2)
    return X, positions, base, check_out_elementwise(out, X.shape, X.dtype, [X]), factors


ROPE_TABLE_BYTES = 1 << 26  # the largest cos + sin pair kept; positions past it get tables of their own


def _rope_cos_sin(positions, base, half, dtype, factors=None):
    """cos and sin of the reference's angles, positions * base^(-i / half) / factors in float64, in
    the dtype."""
    inv_freq = float(base) ** (-np.arange(half) / half)
    if factors is not None:
        inv_freq = inv_freq / factors
    angle = np.asarray(positions, np.float64)[:, None] * inv_freq
    cos, sin = np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)
    cos.flags.writeable = sin.flags.writeable = False
    return cos, sin


def rope_tables(base, half, dtype, positions, factors=None):
    """(cos, sin, rows): the tables the kernels index and the table row of each position. The
    tables are the reference's own numbers, so the kernels only multiply and add, as it does; kept
    (silkattn._cache) per (base, half, dtype, factors) for positions 0 .. P - 1, P the next power of
    two past the farthest position (at least 256), so a decoding step that asks for one more
    position each time finds its tables kept."""
    top = int(positions.max())
    P = max(256, 1 << top.bit_length())
    dtype = np.dtype(dtype)
    if P * half * 2 * dtype.itemsize > ROPE_TABLE_BYTES:
        rows = np.arange(len(positions), dtype=np.int64)
        return *_rope_cos_sin(positions, base, half, dtype, factors), rows
    key = None if factors is None else factors.tobytes()
    tables = _cache.get(("rope tables", float(base), half, dtype.char, P, key),
                        lambda: _rope_cos_sin(np.arange(P), base, half, dtype, factors))
    return *tables, np.ascontiguousarray(positions, np.int64)


def rope(kernels, X, positions, base=10000.0, freq_factors=None, *, out=None):
    X, positions, base, out, factors = prepare_rope(X, positions, base, out, freq_factors)
    if not X.size:
        return out
    if kernels.rope is None:
        np.copyto(out, ref.rope(X, positions, base, factors))
        return out
    cos, sin, rows = rope_tables(base, X.shape[-1] // 2, X.dtype, positions, factors)
    _rows_call(kernels.rope, [X], out, cos, sin, rows, threads_for(X.size, ELEMENTWISE_WORK))
    return out


# ---------------------------------------------------------------- silu_mul

def silu_mul(kernels, G, U, *, out=None):
    return _gate(kernels.silu_mul, ref.silu, G, U, out)


def gelu_tanh_mul(kernels, G, U, *, out=None):
    return _gate(kernels.gelu_tanh_mul, ref.gelu_tanh, G, U, out)


def gate_mul(kernels, G, U, activation="silu", *, out=None):
    if activation not in ref.GATES:
        raise ValueError(f"activation must be one of {', '.join(map(repr, ref.GATES))}, got {activation!r}")
    return (silu_mul if activation == "silu" else gelu_tanh_mul)(kernels, G, U, out=out)


def _gate(kernel, act, G, U, out):  # out = act(G) U, by `kernel` (None: the reference's)
    G, U = as_float_array(G, "G"), as_float_array(U, "U")
    if G.shape != U.shape:
        raise ValueError(f"U must have the shape of G {G.shape}, got {U.shape}")
    dtype = np.result_type(G, U)
    out = check_out_elementwise(out, G.shape, dtype, [G, U])
    if not G.size:
        return out
    G, U = G.astype(dtype, copy=False), U.astype(dtype, copy=False)
    if kernel is None or G.ndim == 0:
        with np.errstate(over="ignore", invalid="ignore"):  # exp(-G) past the float range: inf, silu(G) -0
            np.copyto(out, act(G) * U)
        return out
    _rows_call(kernel, [G, U], out, G.shape[-1], threads_for(G.size, ELEMENTWISE_WORK))
    return out
