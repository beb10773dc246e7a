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


def multi_head(X, Wq, Wk, Wv, Wo, h, memory=None):
    """(X, the keys' and values' source M, d_k) for multi_head: X (..., seq, d), memory None (M = X)
    or (..., src, d) with lead dims that broadcast with X's, each weight (d, d), h heads dividing d."""
    X = sequence(X)
    d = X.shape[-1]
    for name, W in (("Wq", Wq), ("Wk", Wk), ("Wv", Wv), ("Wo", Wo)):
        matrix(W, name, d, d)
    d_k = heads(h, d)
    if memory is None:
        return X, X, d_k
    M = sequence(memory, "memory")
    if M.shape[-1] != d:
        raise ValueError(f"memory must have the model width d={d} on its last axis, got shape {M.shape}")
    try:
        np.broadcast_shapes(X.shape[:-2], M.shape[:-2])
    except ValueError:
        raise ValueError(f"the leading (batch) dims of X {X.shape} and memory {M.shape} "
                         "do not broadcast") from None
    return X, M, d_k


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


LAYER_KEYS = {  # a block's parameters (init_params' and init_seq2seq_params' layouts)
    "block": ("ln1", "attn", "h", "ln2", "ffn"),
    "encoder": ("ln1", "attn", "h", "ln2", "ffn", "norm"),
    "decoder": ("ln1", "attn", "h", "ln_cross", "cross", "ln2", "ffn", "norm"),
}


def layer(p, name="p", kind="block"):
    """p, once it holds the parameters of a block of this kind (and a known norm placement)."""
    if not hasattr(p, "keys"):
        raise TypeError(f"{name} must be a dict of a block's parameters, got {type(p).__name__}")
    keys = LAYER_KEYS[kind]
    missing = [k for k in keys if k not in p]
    if missing:
        article = "an" if kind == "encoder" else "a"
        raise ValueError(f"{name} lacks {', '.join(map(repr, missing))}: {article} {kind} block's parameters "
                         f"are {', '.join(keys)}")
    if "norm" in keys:
        norm(p["norm"], f"{name}['norm']")
    return p


def norm(placement, name="norm"):
    """The residual sublayers' norm placement: "post" (the paper) or "pre" (the listing)."""
    if placement not in ("post", "pre"):
        raise ValueError(f'{name} must be "post" (LayerNorm(x + f(x)), the paper) or "pre" '
                         f'(x + f(LayerNorm(x)), the listing), got {placement!r}')
    return placement


def token_ids(ids, vocab, max_len, name="token_ids", batched=False):
    """ids as an integer array (seq,), or (batch, seq) if batched, of 1 to max_len tokens in [0, vocab)."""
    ids = np.asarray(ids)
    if ids.size == 0:
        raise ValueError(f"{name} is empty: there is no position to predict from")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {ids.dtype}")
    if ids.ndim != 1 and not (batched and ids.ndim == 2):
        raise ValueError(f"{name} must be {'1-D (seq,) or 2-D (batch, seq)' if batched else '1-D (seq,)'}, "
                         f"got shape {ids.shape}")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"{name} must lie in [0, {vocab}) (the vocabulary), got ids from {lo} to {hi}")
    if ids.shape[-1] > max_len:
        raise ValueError(f"{ids.shape[-1]} tokens in {name} exceed the {max_len} positions of the model")
    return ids


def padding_mask(mask, shape, name):
    """A key padding mask (True: a real token) as a bool array of the given shape, or None."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.dtype.kind not in "biu":
        raise TypeError(f"{name} must be boolean (True at real tokens), got dtype {mask.dtype}")
    if mask.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {mask.shape}")
    return mask != 0


def seq2seq(P):
    """P, once it has the keys of init_seq2seq_params' layout."""
    missing = [k for k in ("src_emb", "tgt_emb", "pos", "encoder", "decoder") if k not in P]
    if missing:
        raise ValueError(f"P lacks {', '.join(map(repr, missing))}: an encoder-decoder's parameters are "
                         "src_emb, tgt_emb, pos, encoder, decoder (init_seq2seq_params' layout)")
    return P


def source(src_ids, src_mask, P):
    """(src_ids, src_mask) for encode: ids (seq,) or (batch, seq), a mask of their shape or None."""
    ids = token_ids(src_ids, len(seq2seq(P)["src_emb"]), len(P["pos"]), "src_ids", batched=True)
    return ids, padding_mask(src_mask, ids.shape, "src_mask")


def target(tgt_ids, memory, memory_mask, P):
    """(tgt_ids, memory, memory_mask) for decode: memory (..., src, d) from encode."""
    ids = token_ids(tgt_ids, len(seq2seq(P)["tgt_emb"]), len(P["pos"]), "tgt_ids", batched=True)
    memory = sequence(memory, "memory")
    d = np.shape(P["tgt_emb"])[1]
    if memory.shape[-1] != d:
        raise ValueError(f"memory must have the model width d={d} on its last axis, got shape {memory.shape}")
    return ids, memory, padding_mask(memory_mask, memory.shape[:-1], "memory_mask")


def prompt(prompt_ids, P, max_new_tokens, memory):
    """The prompt as (seq,) token ids, once it and the new tokens fit the model's positions."""
    vocab = len(P["emb"] if memory is None else seq2seq(P)["tgt_emb"])
    ids = token_ids(prompt_ids, vocab, len(P["pos"]), "prompt_ids")
    count(max_new_tokens, "max_new_tokens", minimum=0)
    if len(ids) + max_new_tokens > len(P["pos"]):
        raise ValueError(f"{len(ids)} prompt tokens + max_new_tokens={max_new_tokens} exceed the "
                         f"{len(P['pos'])} positions of the model")
    return ids


def sampling(temperature, top_k, top_p=None):
    """A temperature >= 0 (0: greedy), top_k None or a positive int, top_p None or in (0, 1]."""
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, numbers.Real) \
            or not temperature >= 0 or temperature == float("inf"):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None:
        count(top_k, "top_k")
    if top_p is not None and (isinstance(top_p, (bool, np.bool_)) or not isinstance(top_p, numbers.Real)
                              or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be a number in (0, 1] (None: no nucleus cut), got {top_p!r}")
