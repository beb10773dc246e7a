"""Argument checks, one function per kind of argument: the scalars every op takes (eps, scale,
softcap, base, window, q_offset, positions, thread and token counts, sampling thresholds), used by
silkattn._api for every op on every backend, and the model-level arguments (multi_head,
feed_forward, block, transformer) shared by silkattn.reference and silkattn.models. Each refuses a
bad value with a ValueError or TypeError naming the argument; the array layouts of the kernel ops
are checked in silkattn._api."""
import math
import numbers
import operator

import numpy as np


def real(x, name, rule, holds):
    """x as a float once it is a real number (a TypeError for a str, bool, None, complex or array)
    whose value is finite and satisfies holds(value) (a ValueError otherwise, an int past the float
    range included); `rule` says what is asked, in both messages."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be {rule}, got {type(x).__name__}")
    try:
        value = float(x)
    except OverflowError:  # (repr of such an int may exceed Python's digit limit)
        raise ValueError(f"{name} must be {rule}, got an integer past the float range") from None
    if not (math.isfinite(value) and holds(value)):
        raise ValueError(f"{name} must be {rule}, got {x!r}")
    return value


def positive(x, name):
    """x > 0 and finite, as a float (rms_norm's eps, rope's base, a scale)."""
    return real(x, name, "a positive finite number", lambda v: v > 0)


def nonnegative(x, name):
    """x >= 0 and finite, as a float (layer_norm's eps: 0 is allowed, a constant row is then 0/0)."""
    return real(x, name, ">= 0 and finite", lambda v: v >= 0)


def flag(x, name):
    """x as a bool: True, False (or numpy's bool_), nothing else (a string "no" would be truthy)."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    raise TypeError(f"{name} must be True or False, got {x!r}")


def optional_positive(x, name):
    """None, or positive(x): attention's scale and softcap (None: the default, or no cap)."""
    return None if x is None else real(x, name, "a positive finite number (or None)", lambda v: v > 0)


def freq_factors(f, half):
    """None, or f as a read-only float64 (half,) array of positive finite numbers: rope's
    per-frequency divisors (Llama 3's rope_freqs)."""
    if f is None:
        return None
    if isinstance(f, (str, bytes)) or not hasattr(f, "__len__"):
        raise TypeError(f"freq_factors must be None or an array of {half} positive numbers, "
                        f"got {type(f).__name__}")
    f = np.asarray(f)
    if f.dtype.kind not in "fiu":
        raise TypeError(f"freq_factors must be real numbers, got dtype {f.dtype}")
    if f.shape != (half,):
        raise ValueError(f"freq_factors must have shape ({half},) (d_head / 2), got {f.shape}")
    f = f.astype(np.float64)
    if not (np.isfinite(f).all() and (f > 0).all()):
        raise ValueError("freq_factors must be positive and finite")
    f.flags.writeable = False
    return f


def window(w):
    """w as (left, right) ints >= -1 (-1: that side unbounded; None on a side reads as -1), or None."""
    if w is None:
        return None
    how = f"window must be a pair (left, right) of ints >= -1 or None, got {w!r}"
    if isinstance(w, (str, bytes)) or not hasattr(w, "__len__") or len(w) != 2:
        raise TypeError(how)
    sides = []
    for side in w:
        if side is None:
            side = -1
        if isinstance(side, (bool, np.bool_)):
            raise TypeError(how)
        try:
            side = operator.index(side)
        except TypeError:
            raise TypeError(how) from None
        if side < -1:
            raise ValueError(how)
        sides.append(side)
    return tuple(sides)


def q_offset(offset, positioned):
    """offset as an int >= 0: the position of attention's first query, which places the queries for
    causal, window and alibi_slopes (positioned: one of them is given)."""
    try:
        offset = operator.index(offset)
    except TypeError:
        raise TypeError(f"q_offset must be an int, got {type(offset).__name__}") from None
    if isinstance(offset, bool):
        raise TypeError("q_offset must be an int, got bool")
    if offset < 0:
        raise ValueError(f"q_offset must be >= 0 (the position of the first query), got {offset}")
    if offset and not positioned:
        raise ValueError("q_offset places the queries for the causal rule, window and alibi_slopes: "
                         "pass causal=True (or a window, or alibi_slopes) with it")
    return offset


def positions(p, seq):
    """p as a (seq,) array of non-negative integers: the position of each row of X (rope)."""
    p = np.asarray(p)
    if p.dtype.kind not in "iu" and p.size:  # (an empty list reads as float64)
        raise TypeError(f"positions must be integers, got dtype {p.dtype}")
    if p.shape != (seq,):
        raise ValueError(f"positions must have shape ({seq},), one per row of X (its axis -2), got {p.shape}")
    if p.size and p.min() < 0:
        raise ValueError(f"positions must be >= 0, got {p.min()}")
    return p if p.dtype.kind in "iu" else p.astype(np.int64)


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
    real(temperature, "temperature", "a finite number >= 0 (0: greedy)", lambda v: v >= 0)
    if top_k is not None:
        count(top_k, "top_k")
    if top_p is not None:
        real(top_p, "top_p", "a number in (0, 1] (None: no nucleus cut)", lambda v: 0 < v <= 1)
