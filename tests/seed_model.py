"""A user's NumPy model written against the seed listing (block given its ffn weights), float32-safe.

test_model.py also builds a variant in the listing's float64-upcasting style from this source."""
import numpy as np


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention(Q, K, V, mask=None):
    d_k = Q.shape[-1]
    scores = Q @ np.swapaxes(K, -1, -2) / np.float32(np.sqrt(d_k)).astype(Q.dtype)
    if mask is not None:
        scores = np.where(mask, scores, -1e9)
    return softmax(scores) @ V


def multi_head(X, Wq, Wk, Wv, Wo, h, mask=None):
    seq, d = X.shape
    d_k = d // h
    Q, K, V = X @ Wq, X @ Wk, X @ Wv

    def split(M):
        return M.reshape(seq, h, d_k).transpose(1, 0, 2)

    Q, K, V = split(Q), split(K), split(V)
    legs = [attention(Q[i], K[i], V[i], mask) for i in range(h)]
    return np.concatenate(legs, axis=-1) @ Wo


def layer_norm(X, g, b, eps=1e-5):
    mu = X.mean(-1, keepdims=True)
    var = X.var(-1, keepdims=True)
    return g * (X - mu) / np.sqrt(var + eps) + b


def feed_forward(X, W1, b1, W2, b2):
    return np.maximum(0, X @ W1 + b1) @ W2 + b2


def block(X, p, mask=None):
    X = X + multi_head(layer_norm(X, *p["ln1"]), *p["attn"], p["h"], mask)
    X = X + feed_forward(layer_norm(X, *p["ln2"]), *p["ffn"])
    return X


def transformer(token_ids, P):
    n = len(token_ids)
    X = P["emb"][token_ids] + P["pos"][:n]
    mask = np.tri(n, dtype=bool)
    for layer in P["layers"]:
        X = block(X, layer, mask)
    return X @ P["emb"].T
