"""The model-level layers, composed from silkattn.ops: multi-head attention (self, cross, and
against a KV cache), the feed-forward, and the residual sublayer of either norm placement.

Written for speed around the kernels: projections as BLAS GEMMs, all heads in one attention call
on strided views of the projections (no per-head loop, no transposed copies going in), and the
feed-forward's bias and ReLU as one in-place pass.
"""
import numpy as np

from .. import _checks as check
from .. import ops


def split_heads(M, h):  # (..., seq, h * d_k) -> (..., h, seq, d_k), a strided view
    return M.reshape(*M.shape[:-1], h, M.shape[-1] // h).swapaxes(-2, -3)


def merge_heads(A):  # (..., h, seq, d_k) -> (..., seq, h * d_k)
    A = A.swapaxes(-2, -3)
    return A.reshape(*A.shape[:-2], -1)


def multi_head(X, Wq, Wk, Wv, Wo, h, mask=None, memory=None, *, causal=False):  # X: (..., seq, d)
    """concat_i attention(X Wq_i, M Wk_i, M Wv_i, mask) Wo over h heads of d_k = d / h, with M = X
    (self-attention) or M = memory (cross-attention)."""
    X, M, _ = check.multi_head(X, Wq, Wk, Wv, Wo, h, memory)
    heads = ops.attention(split_heads(X @ Wq, h), split_heads(M @ Wk, h), split_heads(M @ Wv, h), mask,
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


def sublayer(X, f, ln, norm):
    """LayerNorm(X + f(X)) for norm="post" (the residual add fused into the norm), or
    X + f(LayerNorm(X)) for norm="pre"."""
    if norm == "post":
        return ops.add_layer_norm(X, f(X), *ln)[1]
    return X + f(ops.layer_norm(X, *ln))


def cached_self_attention(H, Wq, Wk, Wv, Wo, h, cache, start):  # H: (n, d) -> (n, d)
    """Causal self-attention of n new positions start .. start + n - 1 against all positions so far.

    cache: (K, V), each (capacity, d) and preallocated: the new keys and values are projected
    straight into rows start .. start + n - 1 (no copy, no growth), and every head reads its
    columns of them as a strided view.
    """
    K, V = cache
    end = start + len(H)
    np.matmul(H, Wk, out=K[start:end])
    np.matmul(H, Wv, out=V[start:end])
    heads = ops.attention(split_heads(H @ Wq, h), split_heads(K[:end], h), split_heads(V[:end], h),
                          causal=True, q_offset=start)
    return merge_heads(heads) @ Wo
