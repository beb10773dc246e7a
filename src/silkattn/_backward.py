"""The backward ops' checks, bookkeeping and NumPy fallbacks (silkattn.ops: softmax_backward,
layer_norm_backward, rms_norm_backward, linear_backward, feed_forward_backward, embedding_backward,
cross_entropy, cross_entropy_backward; attention_backward is in silkattn._api.attention_ops beside attention).

The row ops run the backend's kernels (Kernels.softmax_backward, layer_norm_backward,
rms_norm_backward), the products numpy's BLAS on silkattn's threads. A gain's or bias's gradient
is a sum over every row: the kernels leave one partial sum per fixed block of ROW_BLOCK rows,
summed here, so the result does not depend on the thread count.
"""
import numpy as np

from . import _api, _blas
from . import _checks as check
from . import reference as ref
from ._api import ROW_WORK, _along_last_axis, _last_axis, _rows, as_float_array, threads_for

ROW_BLOCK = 64  # rows a partial sum of dg (db) covers
LOGIT_ELEMENTS = 1 << 22  # cross-entropy's logits are made this many at a time (16 MiB of float32)


def _gradient(dY, X, name="dY"):
    """dY checked against the forward's input X: a float array of X's shape, in the result dtype."""
    dY = as_float_array(dY, name)
    if dY.shape != X.shape:
        raise ValueError(f"{name} must have the shape of the forward's output {X.shape}, got {dY.shape}")
    return dY


def softmax_backward(kernels, dY, Y):
    Y = _last_axis(Y, "Y", "softmax_backward", "a softmax over no values is undefined")
    dY = _gradient(dY, Y)
    dtype = np.result_type(dY, Y)
    dY, Y = dY.astype(dtype, copy=False), Y.astype(dtype, copy=False)
    if not Y.size or kernels.softmax_backward is None:
        return ref.softmax_backward(dY, Y)
    dX = np.empty(Y.shape, dtype)
    kernels.softmax_backward(_rows(dY), _rows(Y), dX.reshape(-1, Y.shape[-1]), threads_for(Y.size, ROW_WORK))
    return dX


def _norm_operands(dY, X, g, eps, op, eps_check):
    """Checked (dY, X, g as an (n,) vector, eps) of a norm's backward, in their result dtype."""
    X = _last_axis(X, "X", op, "the mean of no values is undefined")
    dY = _gradient(dY, X)
    dtype = np.result_type(X, dY, as_float_array(g, "g"))
    g = _along_last_axis(g, X.shape[-1], dtype, "g")
    return dY.astype(dtype, copy=False), X.astype(dtype, copy=False), g, eps_check(eps, "eps")


def layer_norm_backward(kernels, dY, X, g, eps=1e-5):
    return _norm_backward(kernels.layer_norm_backward, ref.layer_norm_backward, dY, X, g, eps,
                          "layer_norm_backward", check.nonnegative, 2)


def rms_norm_backward(kernels, dY, X, g, eps=1e-5):
    return _norm_backward(kernels.rms_norm_backward, ref.rms_norm_backward, dY, X, g, eps,
                          "rms_norm_backward", check.positive, 1)


def _norm_backward(kernel, reference, dY, X, g, eps, op, eps_check, sums):
    """(dX, and the `sums` gradients summed over the rows: dg (and db)) of a norm: the kernel leaves
    them per block of ROW_BLOCK rows, (blocks, sums x n), added up here."""
    dY, X, g, eps = _norm_operands(dY, X, g, eps, op, eps_check)
    if not X.size or kernel is None:
        return reference(dY, X, g, eps)
    rows = _rows(X)
    parts = np.zeros((-(-len(rows) // ROW_BLOCK), sums * X.shape[-1]), g.dtype)
    dX = np.empty(X.shape, g.dtype)
    kernel(_rows(dY), rows, g, eps, dX.reshape(rows.shape), parts, ROW_BLOCK, threads_for(X.size, ROW_WORK))
    return (dX, *parts.sum(0).reshape(sums, -1))


def _product(dY, X, W):
    """Checked (dY, X, W) of Y = X W: X (..., k), W (k, n), dY (..., n), one float dtype."""
    X, W, dY = as_float_array(X, "X"), as_float_array(W, "W"), as_float_array(dY, "dY")
    if W.ndim != 2:
        raise ValueError(f"W must be a (k, n) matrix, got shape {W.shape}")
    if X.ndim < 1 or X.shape[-1] != W.shape[0]:
        raise ValueError(f"X's last axis must match W's rows {W.shape[0]}, got X {X.shape}")
    if dY.shape != X.shape[:-1] + W.shape[1:]:
        raise ValueError(f"dY must have the output's shape {X.shape[:-1] + W.shape[1:]}, got {dY.shape}")
    dtype = np.result_type(X, W, dY)
    return (a.astype(dtype, copy=False) for a in (dY, X, W))


def linear_backward(kernels, dY, X, W):
    dY, X, W = _product(dY, X, W)
    rows, drows = X.reshape(-1, X.shape[-1]), dY.reshape(-1, dY.shape[-1])
    with _blas.threads():
        return dY @ W.T, rows.T @ drows, drows.sum(0)


def feed_forward_backward(kernels, dY, X, W1, b1, W2, b2, activation="relu"):
    if activation not in ("relu", "gelu"):
        raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
    W1, W2 = as_float_array(W1, "W1"), as_float_array(W2, "W2")
    X = as_float_array(X, "X")
    if W1.ndim != 2 or W2.ndim != 2 or W2.shape[0] != W1.shape[1]:
        raise ValueError(f"W1 (d, d_ff) and W2 (d_ff, d) must chain, got {W1.shape} and {W2.shape}")
    b1 = _vector(b1, "b1", W1.shape[1])
    _vector(b2, "b2", W2.shape[1])
    with _blas.threads():
        Z = X @ W1  # recomputed, not kept by the forward: (..., d_ff)
    Z += b1
    if activation == "relu":
        H = np.maximum(Z, 0)
    else:  # the exact GELU and its slope: the backend's kernels (bias_gelu with a zero bias)
        H = _api.bias_gelu(kernels, Z, np.zeros_like(b1), out=np.empty_like(Z))
    dH, dW2, db2 = linear_backward(kernels, dY, H, W2)
    del H
    if activation == "relu":
        np.multiply(dH, Z > 0, out=dH)
    elif kernels.gelu_backward is None or dH.dtype != Z.dtype:
        dH *= ref.gelu_grad(Z)
    else:
        rows = dH.reshape(-1, dH.shape[-1])
        kernels.gelu_backward(rows, Z.reshape(rows.shape), rows, threads_for(Z.size, ROW_WORK))
    dX, dW1, db1 = linear_backward(kernels, dH, X, W1)
    return dX, dW1, db1, dW2, db2


def _vector(b, name, n):
    b = as_float_array(b, name)
    if b.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {b.shape}")
    return b


def embedding_backward(kernels, dX, ids, vocab):
    vocab = check.count(vocab, "vocab")
    dX = as_float_array(dX, "dX")
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"ids must be integers (token ids), got dtype {ids.dtype}")
    if dX.shape[:-1] != ids.shape or dX.ndim < 1:
        raise ValueError(f"dX must be ids' shape {ids.shape} plus a last axis, got {dX.shape}")
    flat = ids.reshape(-1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= vocab):
        raise ValueError(f"ids must lie in [0, vocab = {vocab}), got values in [{flat.min()}, {flat.max()}]")
    dE = np.zeros((vocab, dX.shape[-1]), dX.dtype)
    if not flat.size:
        return dE
    # rows of one token summed in id order (a stable sort): deterministic, no scatter-add per row
    order = np.argsort(flat, kind="stable")
    tokens, starts = np.unique(flat[order], return_index=True)
    dE[tokens] = np.add.reduceat(dX.reshape(-1, dX.shape[-1])[order], starts, axis=0)
    return dE


def _cross_entropy_operands(H, E, targets):
    H, E = as_float_array(H, "H"), as_float_array(E, "E")
    if E.ndim != 2 or H.ndim < 1 or H.shape[-1] != E.shape[1]:
        raise ValueError(f"H (..., d) and E (vocab, d) must share d, got {H.shape} and {E.shape}")
    t = np.asarray(targets)
    if t.dtype.kind not in "iu":
        raise TypeError(f"targets must be integers (token ids), got dtype {t.dtype}")
    if t.shape != H.shape[:-1]:
        raise ValueError(f"targets must have H's shape without its last axis {H.shape[:-1]}, got {t.shape}")
    t = t.reshape(-1).astype(np.int64)
    if t.size and (t.min() < 0 or t.max() >= len(E)):
        raise ValueError(f"targets must lie in [0, vocab = {len(E)}), got values in [{t.min()}, {t.max()}]")
    if not t.size:
        raise ValueError("H has no rows: the mean cross-entropy of no rows is undefined")
    dtype = np.result_type(H, E)
    return H.astype(dtype, copy=False).reshape(-1, H.shape[-1]), E.astype(dtype, copy=False), t


def cross_entropy_and_grads(kernels, H, E, targets, grads=True):
    """(loss, dH, dE) of the mean next-token cross-entropy with the tied output projection E, the
    logits made LOGIT_ELEMENTS at a time and turned into their gradient in place (softmax, minus one
    at the target, over the rows): never held whole, never twice. grads=False: (loss, None, None)."""
    shape = np.shape(H)
    H, E, t = _cross_entropy_operands(H, E, targets)
    n, V = len(H), len(E)
    step = max(1, LOGIT_ELEMENTS // V)
    loss = 0.0
    dH = np.empty(H.shape, H.dtype) if grads else None
    dE = np.zeros(E.shape, E.dtype) if grads else None
    with _blas.threads():
        for r0 in range(0, n, step):
            Z = H[r0:r0 + step] @ E.T
            idx = np.arange(len(Z))
            top = Z.max(-1)
            target_logit = Z[idx, t[r0:r0 + step]].astype(np.float64)
            Z -= top[:, None]
            np.exp(Z, out=Z)
            total = Z.sum(-1)
            loss += float((top + np.log(total) - target_logit).sum())
            if grads:
                Z /= total[:, None]
                Z[idx, t[r0:r0 + step]] -= 1
                Z *= Z.dtype.type(1 / n)
                dH[r0:r0 + step] = Z @ E
                dE += Z.T @ H[r0:r0 + step]
    return loss / n, None if dH is None else dH.reshape(shape), dE


def cross_entropy(kernels, H, E, targets):
    return cross_entropy_and_grads(kernels, H, E, targets, grads=False)[0]


def cross_entropy_backward(kernels, H, E, targets, dloss=1.0):
    _, dH, dE = cross_entropy_and_grads(kernels, H, E, targets)
    if dloss != 1.0:
        dH *= dH.dtype.type(dloss)
        dE *= dE.dtype.type(dloss)
    return dH, dE
