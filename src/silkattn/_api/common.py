"""What every op's bookkeeping shares: float arrays, result arrays, a gain along the last axis,
rows as a C-contiguous (rows, n) view."""

import numpy as np

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


def _last_axis(X, name, op, why_not_empty):
    """X as a float array with a last axis (op's axis) of at least one value."""
    X = as_float_array(X, name)
    if X.ndim == 0:
        raise ValueError(f"{name} must have at least one dimension ({op} runs over the last axis)")
    if X.shape[-1] == 0:
        raise ValueError(f"{name} has a zero-length last axis: {why_not_empty}")
    return X


def _rows(a):
    """A (rows, n) C-contiguous view (or copy) of a's last axis."""
    return np.ascontiguousarray(a).reshape(-1, a.shape[-1])
