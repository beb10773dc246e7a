"""A user's NumPy Llama, written with the reference's function names (rms_norm, rope, swiglu,
attention with grouped K/V heads): silkattn.patch(this module) runs it on the kernels."""
import numpy as np


def rms_norm(X, g, eps=1e-5):
    return g * X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True) + X.dtype.type(eps))


def rope(X, positions, base=10000.0):
    half = X.shape[-1] // 2
    theta = np.outer(positions, base ** (-np.arange(half) / half))
    c, s = np.cos(theta).astype(X.dtype), np.sin(theta).astype(X.dtype)
    return np.concatenate([X[..., :half] * c - X[..., half:] * s, X[..., half:] * c + X[..., :half] * s], -1)


def swiglu(X, Wg, Wu, Wd):
    G = X @ Wg
    return (G / (1 + np.exp(-G)) * (X @ Wu)) @ Wd


def attention(Q, K, V, mask=None, *, causal=False, q_offset=0, **unused):
    K, V = (np.repeat(A, Q.shape[-3] // A.shape[-3], axis=-3) for A in (K, V))
    S = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.dtype.type(Q.shape[-1]))
    if causal:
        S = np.where(np.tri(S.shape[-2], S.shape[-1], q_offset, bool), S, -1e9)
    E = np.exp(S - S.max(-1, keepdims=True))
    return E / E.sum(-1, keepdims=True) @ V


def llama(ids, P):
    X, pos = P["emb"][ids], np.arange(len(ids))
    for p in P["layers"]:
        Wq, Wk, Wv, Wo = p["attn"]
        H = rms_norm(X, p["attn_norm"], P["eps"])
        q, k, v = (np.swapaxes((H @ W).reshape(len(ids), n, -1), 0, 1)
                   for W, n in ((Wq, p["h"]), (Wk, p["h_kv"]), (Wv, p["h_kv"])))
        A = attention(rope(q, pos, P["rope_base"]), rope(k, pos, P["rope_base"]), v, causal=True)
        X = X + np.swapaxes(A, 0, 1).reshape(X.shape) @ Wo
        X = X + swiglu(rms_norm(X, p["ffn_norm"], P["eps"]), *p["ffn"])
    return rms_norm(X, P["norm"], P["eps"]) @ P["out"]
