"""The model-level layers, composed from silkattn.ops: multi-head attention (self, cross, and
against a KV cache), the feed-forward, and the residual sublayer of either norm placement.

Written for speed around the kernels: projections through ops.linear (BLAS GEMMs, or for the few
rows of a decoding step silkattn's matrix-vector kernel), all heads in one attention call on
strided views of the projections (no per-head loop, no transposed copies going in), and the
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
    heads = ops.attention(split_heads(ops.linear(X, Wq), h), split_heads(ops.linear(M, Wk), h),
                          split_heads(ops.linear(M, Wv), h), mask, causal=causal)
    return ops.linear(merge_heads(heads), Wo)


def feed_forward(X, W1, b1, W2, b2):  # X: (..., d)
    """max(0, X W1 + b1) W2 + b2, each position on its own."""
    X = check.feed_forward(X, W1, b1, W2, b2)
    H = ops.linear(X, W1)
    H = ops.bias_relu(H, b1, out=H if np.result_type(H, b1) == H.dtype else None)
    return ops.linear(H, W2, b2)


def swiglu(X, Wg, Wu, Wd):  # X: (..., d); Wg, Wu: (d, d_ff); Wd: (d_ff, d)
    """(silu(X Wg) * (X Wu)) Wd, the gate silu(g) * u in one pass (the Llama family's feed-forward)."""
    return ops.linear(ops.silu_mul(ops.linear(X, Wg), ops.linear(X, Wu)), Wd)


def sublayer(X, f, ln, norm):
    """LayerNorm(X + f(X)) for norm="post" (the residual add fused into the norm), or
    X + f(LayerNorm(X)) for norm="pre"."""
    if norm == "post":
        return ops.add_layer_norm(X, f(X), *ln)[1]
    return X + f(ops.layer_norm(X, *ln))


def fused_qkv(Wq, Wk, Wv):  # -> (d, 3 d)
    """[Wq | Wk | Wv]: one projection call, one stream through the weights, for a decoding step."""
    return np.concatenate([Wq, Wk, Wv], axis=1)


def cached_self_attention(H, Wqkv, Wo, h, cache, start):  # H: (n, d) -> (n, d)
    """Causal self-attention of n new positions start .. start + n - 1 against all positions so far.

    Wqkv: fused_qkv(Wq, Wk, Wv). cache: (K, V), each (capacity, d) and preallocated: the new keys
    and values go to rows start .. start + n - 1 (no growth), and every head reads its columns of
    them as a strided view.
    """
    K, V = cache
    end, d = start + len(H), Wo.shape[0]
    qkv = ops.linear(H, Wqkv)  # (n, 3 d)
    K[start:end], V[start:end] = qkv[:, d:2 * d], qkv[:, 2 * d:]
    heads = ops.attention(split_heads(qkv[:, :d], h), split_heads(K[:end], h), split_heads(V[:end], h),
                          causal=True, q_offset=start)
    return ops.linear(merge_heads(heads), Wo)
