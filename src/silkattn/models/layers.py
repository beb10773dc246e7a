"""The model-level layers, composed from silkattn.ops: multi-head attention and the feed-forward.

Written for speed around the kernels: projections as BLAS GEMMs, all heads in one attention call
on strided views of the projections (no per-head loop, no transposed copies going in), and the
feed-forward's bias and ReLU as one in-place pass.
"""
import numpy as np

from .. import _checks as check
from .. import ops


def split_heads(M, h):  # (..., seq, h * d_k) -> (..., h, seq, d_k), a strided view
    *lead, seq, d = M.shape
    return M.reshape(*lead, seq, h, d // h).swapaxes(-2, -3)


def merge_heads(A):  # (..., h, seq, d_k) -> (..., seq, h * d_k)
    *lead, h, seq, d_k = A.shape
    return A.swapaxes(-2, -3).reshape(*lead, seq, h * d_k)


def multi_head(X, Wq, Wk, Wv, Wo, h, mask=None, *, causal=False):  # X: (..., seq, d)
    """concat_i attention(X Wq_i, X Wk_i, X Wv_i, mask) Wo over h heads of d_k = d / h."""
    X, _ = check.multi_head(X, Wq, Wk, Wv, Wo, h)
    heads = ops.attention(split_heads(X @ Wq, h), split_heads(X @ Wk, h), split_heads(X @ Wv, h), mask,
                          causal=causal)
    return merge_heads(heads) @ Wo


def feed_forward(X, W1, b1, W2, b2):  # X: (..., d)
    """max(0, X W1 + b1) W2 + b2, each position on its own."""
    X = check.feed_forward(X, W1, b1, W2, b2)
    H = X @ W1
    H = ops.bias_relu(H, b1, out=H if np.result_type(H, b1) == H.dtype else None)
    Y = H @ W2
    if np.result_type(Y, b2) != Y.dtype:  # b2 promotes: follow NumPy
        return Y + b2
    Y += b2
    return Y
