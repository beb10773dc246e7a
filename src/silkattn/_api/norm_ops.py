"""The row-wise ops' bookkeeping and NumPy fallbacks: softmax, layer_norm, add_layer_norm, rms_norm,
add_rms_norm."""

import numpy as np

from .. import _checks as check
from .. import reference as ref
from .._threads import ROW_WORK, threads_for
from .common import _along_last_axis, _last_axis, _rows, as_float_array, check_out

# ---------------------------------------------------------------- softmax

def prepare_softmax(x, out):
    """Checked (x, out) for softmax."""
    x = _last_axis(x, "x", "softmax", "softmax over no values is undefined")  # a max over none
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
    X = _last_axis(X, "X", "layer_norm", "the mean of no values is undefined")
    n = X.shape[-1]
    eps = check.nonnegative(eps, "eps")
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


def _residual(X, R):
    """Checked (X, R, the dtype of their sum S = X + R) for the add_*_norm ops."""
    X, R = as_float_array(X, "X"), as_float_array(R, "R")
    if X.shape != R.shape:
        raise ValueError(f"R must have the shape of X {X.shape}, got {R.shape}")
    return X, R, np.result_type(X, R)


def add_layer_norm(kernels, X, R, g, b, eps=1e-5):
    X, R, sdtype = _residual(X, R)
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


# ---------------------------------------------------------------- rms_norm

def prepare_rms_norm(X, g, eps, out, dtype=None):
    """Checked (X, g as an (n,) vector of the result dtype, eps, out)."""
    X = _last_axis(X, "X", "rms_norm", "the mean of no values is undefined")
    n = X.shape[-1]
    eps = check.positive(eps, "eps")
    dtype = np.result_type(X if dtype is None else dtype, as_float_array(g, "g"))
    g = _along_last_axis(g, n, dtype, "g")
    return X, g, eps, check_out(out, X.shape, dtype, [X, g])


def rms_norm(kernels, X, g, eps=1e-5, *, out=None):
    X, g, eps, out = prepare_rms_norm(X, g, eps, out)
    if not X.size:
        return out
    X = X.astype(out.dtype, copy=False)  # in the result dtype, as the kernels compute
    if kernels.rms_norm is None:
        np.copyto(out, ref.rms_norm(X, g, eps))
    else:
        kernels.rms_norm(_rows(X), g, eps, out.reshape(-1, X.shape[-1]), threads_for(X.size, ROW_WORK))
    return out


def add_rms_norm(kernels, X, R, g, eps=1e-5):
    X, R, sdtype = _residual(X, R)
    X, g, eps, out = prepare_rms_norm(X, g, eps, None, dtype=sdtype)
    if kernels.add_rms_norm is None or out.dtype != sdtype or not X.size:
        S = np.add(X, R, dtype=sdtype)
        return S, rms_norm(kernels, S, g, eps)
    S = np.empty(X.shape, sdtype)
    n = X.shape[-1]
    X, R = (_rows(a.astype(sdtype, copy=False)) for a in (X, R))
    kernels.add_rms_norm(X, R, g, eps, S.reshape(-1, n), out.reshape(-1, n), threads_for(S.size, ROW_WORK))
    return S, out
