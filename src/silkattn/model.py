"""The top-level API: the reference's functions, running on the current backend.

softmax, attention and layer_norm go to the backend's kernels; multi_head, feed_forward, block
and transformer are the reference's model written for speed around them: projections as BLAS
GEMMs, all heads in one attention call on strided views (no per-head loop, no transposed copies
going in), the feed-forward's bias and ReLU fused into one in-place pass, and the decoder's
causal rule as the kernels' causal flag instead of a mask array.
"""
import numpy as np

from . import _api, _backends
from . import reference as ref

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
              _api._threads_for(H.size, _api.ELEMENTWISE_WORK))
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


def _add_layer_norm(X, R, g, b):
    """(X + R, layer_norm(X + R, g, b)): the residual add and the next norm in one pass where the
    backend has the kernel (X + R is read once, from cache, instead of again from memory)."""
    fused = getattr(_backends.module(), "add_layer_norm", None)
    S = np.result_type(X, R)
    if (fused is None or X.shape != R.shape or not X.ndim or not X.size or S != X.dtype
            or np.result_type(S, g, b) != S):
        S = X + R
        return S, layer_norm(S, g, b)
    X, R = np.ascontiguousarray(X), np.ascontiguousarray(R)
    _, g, b, eps, H = _api.prepare_layer_norm(X, g, b, 1e-5, None)
    S = np.empty_like(X)
    n = X.shape[-1]
    fused(X.reshape(-1, n), R.reshape(-1, n), g, b, eps, S.reshape(-1, n), H.reshape(-1, n), _api._threads_for(X.size, _api.ROW_WORK))
    return S, H


def block(X, p, mask=None, *, causal=False):
    """Pre-norm block: X += multi_head(LN1(X)); X += feed_forward(LN2(X)) (p["ffn"] passed)."""
    A = multi_head(layer_norm(X, *p["ln1"]), *p["attn"], p["h"], mask, causal=causal)
    X, H = _add_layer_norm(X, A, *p["ln2"])
    return X + feed_forward(H, *p["ffn"])


def transformer(token_ids, P):  # token_ids: (seq,) -> logits (seq, vocab)
    """Decoder-only forward pass with the causal rule: embeddings + positions, N blocks, tied output.

    The blocks are unrolled so that every residual add meets the layer norm after it in one pass.
    """
    n = len(token_ids)
    X = P["emb"][token_ids] + P["pos"][:n]
    layers = P["layers"]
    H = layer_norm(X, *layers[0]["ln1"]) if layers else None
    for i, p in enumerate(layers):
        A = multi_head(H, *p["attn"], p["h"], causal=True)
        X, H = _add_layer_norm(X, A, *p["ln2"])
        F = feed_forward(H, *p["ffn"])
        if i + 1 < len(layers):
            X, H = _add_layer_norm(X, F, *layers[i + 1]["ln1"])
        else:
            X = X + F
    return X @ P["emb"].T


OPS = ("softmax", "attention", "multi_head", "layer_norm", "feed_forward", "block", "transformer")
