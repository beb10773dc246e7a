"""The kernels API: silkattn's ops on the current backend (set_backend, use_backend, SILKATTN_BACKEND).

Each op takes the reference's arguments and returns what the reference returns (float32 stays
float32), plus keyword-only extras: out= (a result array to fill), causal= and q_offset= for
attention. Bad input raises a ValueError or TypeError naming the argument, the same on every
backend. Models (silkattn.models) are written with these ops only; silkattn._api does the checks
and holds each op's NumPy fallback, and the backend's Kernels record does the arithmetic.
"""
import functools

from . import _api, _backends


def softmax(x, *, out=None):
    """softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x), over the last axis."""
    return _api.softmax(_backends.kernels(), x, out=out)


def layer_norm(X, g, b, eps=1e-5, *, out=None):
    """g * (X - mean) / sqrt(var + eps) + b over the last axis (population variance)."""
    return _api.layer_norm(_backends.kernels(), X, g, b, eps, out=out)


def attention(Q, K, V, mask=None, *, causal=False, q_offset=0, out=None):
    """softmax(where(mask, Q K^T / sqrt(d_k), -1e9)) V over (..., Sq, d_k), (..., Sk, d_k), (..., Sk, d_v).

    causal=True also hides key j from query i when j > q_offset + i, without a mask array: query i
    sits at position q_offset + i (0 by default: the reference's causal_mask(Sq, Sk); with a KV cache
    of Sk keys, q_offset = Sk - Sq puts the new queries last).
    """
    return _api.attention(_backends.kernels(), Q, K, V, mask, causal=causal, q_offset=q_offset, out=out)


def attention_varlen(Q, K, V, cu_seqlens, *, causal=False, out=None):
    """attention over sequences packed end to end: Q, K, V (..., total, d) hold n sequences, rows
    cu_seqlens[i] .. cu_seqlens[i + 1] (cu_seqlens: 0, ..., total); each attends to its own rows
    only, so no padding is ever computed (causal: within each sequence)."""
    return _api.attention_varlen(_backends.kernels(), Q, K, V, cu_seqlens, causal=causal, out=out)


def linear(X, W, b=None, *, out=None):
    """X W + b (b optional) over X's last axis: numpy's matmul, except that a few rows of X (a
    decoding step) run silkattn's matrix-vector kernel, which streams W once on silkattn's threads."""
    return _api.linear(_backends.kernels(), X, W, b, out=out)


def bias_relu(x, b, *, out=None):
    """max(x + b, 0), b broadcast along the last axis; out may be x itself (in place)."""
    return _api.bias_relu(_backends.kernels(), x, b, out=out)


def bias_gelu(x, b, *, out=None):
    """gelu(x + b) = v (1 + erf(v / sqrt 2)) / 2 with v = x + b (the exact GELU); out may be x."""
    return _api.bias_gelu(_backends.kernels(), x, b, out=out)


def add_layer_norm(X, R, g, b, eps=1e-5):
    """(S, layer_norm(S, g, b, eps)) with S = X + R: a residual add and the norm after it, one pass."""
    return _api.add_layer_norm(_backends.kernels(), X, R, g, b, eps)


OPS = ("softmax", "layer_norm", "attention", "attention_varlen", "linear", "bias_relu", "bias_gelu",
       "add_layer_norm")


def bind(kernels):
    """{op name: the op run on `kernels` alone}: a backend module's own API (silkattn.numba.attention)."""
    def bound(name):
        public, impl = globals()[name], getattr(_api, name)

        @functools.wraps(public)
        def call(*args, **kwargs):
            return impl(kernels, *args, **kwargs)
        return call
    return {name: bound(name) for name in OPS}
