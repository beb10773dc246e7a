"""Independent float64 loop implementations: a second opinion on the reference.

Written one scalar at a time with Python's math module, without sharing code or
vectorised tricks with silkattn.reference, so that a mistake has to be made twice to pass.
"""
import math

import numpy as np


def softmax_loops(x):
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        m = max(row)
        e = [math.exp(v - m) for v in row]
        total = math.fsum(e)
        out[idx] = [v / total for v in e]
    return out


def attention_loops(Q, K, V, mask=None):
    """Q: (..., Sq, dk), K: (..., Sk, dk), V: (..., Sk, dv); mask: bool broadcastable to (..., Sq, Sk)."""
    Q, K, V = (np.asarray(a, dtype=np.float64) for a in (Q, K, V))
    lead = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    Sq, dk, Sk, dv = Q.shape[-2], Q.shape[-1], K.shape[-2], V.shape[-1]
    Q, K, V = (np.broadcast_to(a, lead + a.shape[-2:]) for a in (Q, K, V))
    M = np.ones(lead + (Sq, Sk), bool) if mask is None else np.broadcast_to(mask, lead + (Sq, Sk))
    out = np.zeros(lead + (Sq, dv))
    for b in np.ndindex(lead):
        for i in range(Sq):
            s = [math.fsum(Q[b][i][t] * K[b][j][t] for t in range(dk)) / math.sqrt(dk)
                 if M[b][i][j] else -1e9 for j in range(Sk)]
            m = max(s)
            w = [math.exp(v - m) for v in s]
            total = math.fsum(w)
            for c in range(dv):
                out[b][i][c] = math.fsum(w[j] * V[b][j][c] for j in range(Sk)) / total
    return out


def layer_norm_loops(X, g, b, eps=1e-5):
    X = np.asarray(X, dtype=np.float64)
    out = np.empty_like(X)
    n = X.shape[-1]
    for idx in np.ndindex(X.shape[:-1]):
        row = X[idx]
        mu = math.fsum(row) / n
        var = math.fsum((v - mu) ** 2 for v in row) / n
        out[idx] = [g[k] * (row[k] - mu) / math.sqrt(var + eps) + b[k] for k in range(n)]
    return out
