"""The "numpy" backend: silkattn.reference itself, behind the same argument checks as the kernels.

It adds the kernels' keyword extras (causal, out) and rejects what they reject, with the same
errors, so switching backends never changes which inputs are accepted.
"""
import numpy as np

from . import _api
from . import reference as ref

OPENMP = True


def softmax(x, *, out=None):
    x, out = _api.prepare_softmax(x, out)
    np.copyto(out, ref.softmax(x))
    return out


def attention(Q, K, V, mask=None, *, causal=False, out=None):
    Q, K, V, mask, _, out = _api.prepare_attention(Q, K, V, mask, out)
    if causal:
        tri = ref.causal_mask(Q.shape[-2], K.shape[-2])
        mask = tri if mask is None else np.logical_and(mask, tri)
    if out.size:
        np.copyto(out, ref.attention(Q, K, V, mask))
    return out


def layer_norm(X, g, b, eps=1e-5, *, out=None):
    X, g, b, eps, out = _api.prepare_layer_norm(X, g, b, eps, out)
    np.copyto(out, ref.layer_norm(X, g, b, eps))
    return out
