"""The Cython (OpenMP) backend: the reference's API on compiled, multithreaded kernels."""
from . import _api
from ._cy import attention as _attention
from ._cy.feed_forward import bias_relu  # noqa: F401  (the model's fused feed-forward step)
from ._cy.layer_norm import add_layer_norm  # noqa: F401  (the model's fused residual + norm)
from ._cy import layer_norm as _layer_norm
from ._cy import softmax as _softmax

OPENMP = _softmax.OPENMP
ISA = _softmax.ISA_NAME  # the instruction set the kernels run with: "avx2" or "generic"


def softmax(x, *, out=None):
    """softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x), over the last axis."""
    return _api.softmax(_softmax, x, out)


def layer_norm(X, g, b, eps=1e-5, *, out=None):
    """g * (X - mean) / sqrt(var + eps) + b over the last axis (population variance)."""
    return _api.layer_norm(_layer_norm, X, g, b, eps, out)


def attention(Q, K, V, mask=None, *, causal=False, out=None):
    """softmax(where(mask, Q K^T / sqrt(d_k), -1e9)) V over (..., Sq, d_k), (..., Sk, d_k), (..., Sk, d_v).

    causal=True also hides key j from query i when j > i (top-left aligned), without a mask array.
    """
    return _api.attention(_attention, Q, K, V, mask, causal, out)
