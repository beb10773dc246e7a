"""Bookkeeping shared by the compiled backends: argument checks, dtypes, out allocation.

Each public function takes a backend's kernel module and does everything but the arithmetic,
so the kernels only ever see C-contiguous float32/float64 arrays of consistent shapes.
"""
import numpy as np

from ._threads import get_num_threads

FLOATS = (np.float32, np.float64)


def as_float_array(x, name):
    """x as an ndarray of float32 or float64; a TypeError naming the argument otherwise."""
    x = np.asarray(x)
    if x.dtype not in FLOATS:
        raise TypeError(f"{name} must be a float32 or float64 array, got dtype {x.dtype}")
    return x


def check_out(out, shape, dtype, inputs):
    """A fresh C-contiguous result array, or the caller's `out` once it is shown to fit."""
    if out is None:
        return np.empty(shape, dtype)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"out must have shape {tuple(shape)} and dtype {np.dtype(dtype)}, "
                         f"got {out.shape} and {out.dtype}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writeable C-contiguous array")
    if any(np.may_share_memory(out, x) for x in inputs):
        raise ValueError("out must not overlap an input array")
    return out


def softmax(kernels, x, out=None):
    x = as_float_array(x, "x")
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension (softmax runs over the last axis)")
    if x.shape[-1] == 0:  # as the reference: a max over no values has no answer
        raise ValueError("x has a zero-length last axis: softmax over no values is undefined")
    out = check_out(out, x.shape, x.dtype, [x])
    if x.size:
        n = x.shape[-1]
        kernels.softmax(np.ascontiguousarray(x).reshape(-1, n), out.reshape(-1, n), get_num_threads())
    return out
