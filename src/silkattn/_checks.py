"""Argument checks of the model-level functions (multi_head, feed_forward, block, transformer),
shared by silkattn.reference and silkattn.models: both refuse the same inputs with the same
ValueError or TypeError, naming the argument. (The kernel ops' checks are in silkattn._api.)"""
import numbers

import numpy as np


def count(n, name, minimum=1):
    """n as an int >= minimum (a head or layer count): TypeError if not an integer, ValueError if smaller."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(n).__name__}")
    if n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}")
    return int(n)


def heads(h, d):
    """d_k = d // h, once h is a number of heads that divides the model width d."""
    h = count(h, "h")
    if d % h:
        raise ValueError(f"h={h} does not divide the model width d={d}")
    return d // h


def matrix(W, name, rows, cols):
    """W as an array of shape (rows, cols); cols=None accepts any number of columns."""
    W = np.asarray(W)
    if W.ndim != 2 or W.shape[0] != rows or (cols is not None and W.shape[1] != cols):
        raise ValueError(f"{name} must have shape ({rows}, {'n' if cols is None else cols}), got {W.shape}")
    return W


def vector(b, name, n):
    """b as an array that adds along a last axis of n: shape (n,), (1,) or ()."""
    b = np.asarray(b)
    if b.shape not in ((n,), (1,), ()):
        raise ValueError(f"{name} must have shape ({n},), got {b.shape}")
    return b


def sequence(X, name="X"):
    """X as an array of at least 2 dimensions (..., seq, d)."""
    X = np.asarray(X)
    if X.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dimensions (..., seq, d), got shape {X.shape}")
    return X


def multi_head(X, Wq, Wk, Wv, Wo, h):
    """(X, d_k) for multi_head: X (..., seq, d), each weight (d, d), h heads dividing d."""
    X = sequence(X)
    d = X.shape[-1]
    for name, W in (("Wq", Wq), ("Wk", Wk), ("Wv", Wv), ("Wo", Wo)):
        matrix(W, name, d, d)
    return X, heads(h, d)


def feed_forward(X, W1, b1, W2, b2):
    """X as an array (..., d), once W1 is (d, d_ff), b1 (d_ff,), W2 (d_ff, d) and b2 (d,)."""
    X = np.asarray(X)
    if X.ndim < 1:
        raise ValueError("X must have at least one dimension (..., d)")
    d = X.shape[-1]
    d_ff = matrix(W1, "W1", d, None).shape[1]
    vector(b1, "b1", d_ff)
    matrix(W2, "W2", d_ff, d)
    vector(b2, "b2", d)
    return X


LAYER_KEYS = ("ln1", "attn", "h", "ln2", "ffn")


def layer(p, name="p"):
    """p, once it holds a pre-norm block's parameters in init_params' layout."""
    if not hasattr(p, "keys"):
        raise TypeError(f"{name} must be a dict of a block's parameters, got {type(p).__name__}")
    missing = [k for k in LAYER_KEYS if k not in p]
    if missing:
        raise ValueError(f"{name} lacks {', '.join(map(repr, missing))}: a block's parameters are "
                         f"{', '.join(LAYER_KEYS)} (init_params' layout)")
    return p


def token_ids(ids, vocab, max_len, name="token_ids"):
    """ids as a 1-D integer array of 1 to max_len tokens, each in [0, vocab)."""
    ids = np.asarray(ids)
    if ids.size == 0:
        raise ValueError(f"{name} is empty: there is no position to predict from")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {ids.dtype}")
    if ids.ndim != 1:
        raise ValueError(f"{name} must be 1-D (seq,), got shape {ids.shape}")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"{name} must lie in [0, {vocab}) (the vocabulary), got ids from {lo} to {hi}")
    if len(ids) > max_len:
        raise ValueError(f"{len(ids)} tokens in {name} exceed the {max_len} positions of the model")
    return ids
