"""The top-level API: the reference's functions, running on the current backend.

softmax, attention and layer_norm go to the backend's kernels; multi_head, feed_forward, block
and transformer are the reference's model written for speed around them: projections as BLAS
GEMMs, all heads in one attention call on strided views (no per-head loop, no transposed copies
going in), the feed-forward's bias and ReLU fused into one in-place pass, and the decoder's
causal rule as the kernels' causal flag instead of a mask array.
"""
import numpy as np

from . import _backends
from . import reference as ref
from ._threads import get_num_threads

positional_encoding, causal_mask, init_params = ref.positional_encoding, ref.causal_mask, ref.init_params


def softmax(x, *, out=None):
    """softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x), over the last axis."""
    return _backends.module().softmax(x, out=out)


def attention(Q, K, V, mask=None, *, causal=False, out=None):
    """softmax(where(mask, Q K^T / sqrt(d_k), -1e9)) V; causal=True also hides keys j > i."""
    return _backends.module().attention(Q, K, V, mask, causal=causal, out=out)


def layer_norm(X, g, b, eps=1e-5, *, out=None):
    """g * (X - mean) / sqrt(var + eps) + b over the last axis (population variance)."""
    return _backends.module().layer_norm(X, g, b, eps, out=out)


def multi_head(X, Wq, Wk, Wv, Wo, h, mask=None, *, causal=False):  # X: (..., seq, d)
    """concat_i attention(X Wq_i, X Wk_i, X Wv_i, mask) Wo over h heads of d_k = d / h."""
    X = np.asarray(X)
    *lead, seq, d = X.shape
    if d % h:
        raise ValueError(f"h={h} does not divide the model width d={d}")

    def split(M):  # (..., seq, d) -> (..., h, seq, d_k) as a strided view
        return M.reshape(*lead, seq, h, d // h).swapaxes(-2, -3)

    heads = attention(split(X @ Wq), split(X @ Wk), split(X @ Wv), mask, causal=causal)  # (..., h, seq, d_k)
    return heads.swapaxes(-2, -3).reshape(*lead, seq, d) @ Wo


def _bias_relu(H, b):
    """H = max(H + b, 0) in place (H fresh from a GEMM), fused where the backend has a kernel."""
    b = np.asarray(b)
    if np.result_type(H, b) != H.dtype:  # b would promote H: follow NumPy
        return np.maximum(H + b, 0)
    fused = getattr(_backends.module(), "bias_relu", None)
    if fused is not None and H.ndim and H.size and H.flags.c_contiguous and b.shape in ((H.shape[-1],), (1,), ()):
        fused(H.reshape(-1, H.shape[-1]), np.ascontiguousarray(np.broadcast_to(b, H.shape[-1:]), H.dtype),
              get_num_threads())
        return H
    np.add(H, b, out=H)
    return np.maximum(H, 0, out=H)


def feed_forward(X, W1, b1, W2, b2):  # X: (..., d)
    """max(0, X W1 + b1) W2 + b2, each position on its own."""
    Y = _bias_relu(np.asarray(X) @ W1, b1) @ W2
    if np.result_type(Y, b2) != Y.dtype:
        return Y + b2
    Y += b2
    return Y


def block(X, p, mask=None, *, causal=False):
    """Pre-norm block: X += multi_head(LN1(X)); X += feed_forward(LN2(X)) (p["ffn"] passed)."""
    X = X + multi_head(layer_norm(X, *p["ln1"]), *p["attn"], p["h"], mask, causal=causal)
    return X + feed_forward(layer_norm(X, *p["ln2"]), *p["ffn"])


def transformer(token_ids, P):  # token_ids: (seq,) -> logits (seq, vocab)
    """Decoder-only forward pass with the causal rule: embeddings + positions, N blocks, tied output."""
    n = len(token_ids)
    X = P["emb"][token_ids] + P["pos"][:n]
    for layer in P["layers"]:
        X = block(X, layer, causal=True)
    return X @ P["emb"].T


OPS = ("softmax", "attention", "multi_head", "layer_norm", "feed_forward", "block", "transformer")
