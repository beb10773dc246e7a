"""Every op's bookkeeping, shared by all backends: argument checks, dtypes, the attention operands'
layout, out allocation, thread counts, and the NumPy fallback that runs when a backend's Kernels
record (silkattn._backends) has no kernel for the op.

Each op takes the record first, then the public arguments (silkattn.ops documents them), so kernels
only ever see float32/float64 buffers with unit-stride rows, explicit offsets and strides, and a
result array they may write. The kernel contract (the same for every backend):

    softmax(x, out, num_threads)                         x, out: (rows, n) C-contiguous
    layer_norm(x, g, b, eps, out, num_threads)           x, out: (rows, n); g, b: (n,)
    attention(plan, num_threads)                         plan: silkattn._plan.Plan, built here once
        for the call (attention and attention_varlen alike): each operand as a flat view with its
        row stride, the items (batch item x query head, or packed sequence: offsets, query rows,
        keys, position of query 0, K/V unit, ALiBi slope), the scores' scale, softcap and the
        visible window (causal folded in), and the work: "tiles" tasks (item, first query, rows)
        in the order to run, or for a few rows per K/V unit the "rows" groups and the key chunks
        the threads share. Kernels decide no layout and no order: silkattn._plan's docstring is
        the contract, and the kernel's own tile geometry (Kernels.attention_tiles) is the only
        thing the plan asks of it.
    attention_backward(plan, dout, D, lse, fix, items, first, dq, dk, dv, num_threads)
                                                         the forward's plan over copies giving each item
                                                         its own Q rows and each K/V unit its own rows;
                                                         dout (rows x d_v), D, lse by output row; fix: 2
                                                         a row, the kernel's scratch; items sorted by unit
                                                         (unit u's: items[first[u]:first[u + 1]]); dq zeroed
    linear(x, w, b, out, transposed, has_bias, num_threads)
                                                         out = x w (+ b), x: (m, k) with m <= LINEAR_ROWS,
                                                         w: (k, n), or (n, k) if transposed (out = x w^T)
    linear_q(x, blocks, kind, b, out, has_bias, q8, num_threads)
                                                         linear's out = x W (+ b) for W a silkattn.quant.
                                                         QuantizedMatrix: float32 x: (m, k), m <= LINEAR_ROWS
                                                         (q8: any m, taken 8 rows at a time: Q8_ROWS);
                                                         blocks: uint8 (n, k / 32 * block bytes), the GGUF
                                                         blocks of W^T (reference.dequantize), kind their
                                                         code (0 Q8_0, 1 Q4_0, 2 Q4_1: quant.KINDS); out:
                                                         (m, n) float32; b: (n,) float32; q8: x is taken as
                                                         reference.round_q8(x) (W.activations "int8")
    dequantize(blocks, kind, j0, out, num_threads)      out (rows, k) float32 = reference.dequantize of
                                                         blocks[j0 : j0 + rows] (blocks as linear_q's)
    gemm(x, w, out, transposed, sgemm, ilp64, num_threads)
                                                         out = x w for many rows of x (w (k, n), or (n, k)
                                                         if transposed), float32: each thread one call of
                                                         the BLAS's sgemm (address sgemm, silkattn._blas;
                                                         the library held at one thread) on its panel of
                                                         out's columns
    gemm_q(x, blocks, kind, out, sgemm, ilp64, num_threads)
                                                         the same for W as blocks (linear_q's), a panel of
                                                         W's rows dequantized a thread at a time first
    gemm_q8(x, blocks, kind, out, num_threads)           out = round_q8(x, Q8_BLOCK) W for many rows, as
                                                         integer products; returns False (nothing done)
                                                         where the CPU cannot (optional: AVX-512 VNNI)
    matmul_int8(A, B, out, num_threads)                 out (m, n) int32 = A (m, k) B (k, n) for int8 A, B,
                                                         exact: 1 <= k <= INT8_MAX_K; all C-contiguous
    layer_step(step, x, pos, num_threads)                one token through one decoder layer, in place on
                                                         its residual row x (d,) float32 at position pos
                                                         < step.capacity: step is a silkattn._step.LayerStep
                                                         (built and checked by layer_step_record: the
                                                         kernel trusts its fields), this token's K and V
                                                         written at row pos of its cache
    layer_step_rows(steps, X, ats, Ks, Vs, coss, sins, num_threads)
                                                         the m rows of X (m, d) float32 in place through
                                                         the Llama-family records steps in turn, one call
                                                         for all: for layer l, row r over the cache of
                                                         the flat pools Ks[l], Vs[l] from ats[l][r, 3]
                                                         (m, 4 int64: cache row, first key, keys, offset),
                                                         coss[l], sins[l] (m, dh / 2) its rotary rows
                                                         (empty: none); optional
    bias_relu(h, b, num_threads)                         h: (rows, n) C-contiguous, in place; b: (n,)
    bias_gelu(h, b, num_threads)                         the same, h = gelu(h + b)
    add_layer_norm(x, r, g, b, eps, s, out, num_threads) s = x + r, out = layer_norm(s); all (rows, n)
    rms_norm(x, g, eps, out, num_threads)                x, out: (rows, n) C-contiguous; g: (n,)
    add_rms_norm(x, r, g, eps, s, out, num_threads)      s = x + r, out = rms_norm(s); all (rows, n)
    rope(x, xo, out, oo, cos, sin, positions, num_threads)
                                                         rows as offsets (see _row_layout): row r is
                                                         x[xo[r]:][:d] -> out[oo[r]:][:d], out may be x
                                                         (in place); cos, sin: (P, d / 2) tables, row r
                                                         at position positions[r % len(positions)] < P
    silu_mul(g, go, u, uo, out, oo, n, num_threads)      out = silu(g) u over rows of n laid out as
                                                         rope's; out may be g or u (in place)

Attention kernels skip keys (tiles outside every row's window, fully masked tiles) that the
reference weighs exp(-1e9 - max): exactly 0 unless the row's max is near -1e9, and such rows are
recomputed exactly (the margin is named once per backend: kernels/attention.h, silkattn/numba/attention.py).
"""
import dataclasses
import math

import numpy as np
from numpy.lib.array_utils import byte_bounds

from . import _blas, _cache, _threads, quant
from . import _checks as check
from . import _plan as _plan_mod
from . import _step as _step_mod
from . import reference as ref
from ._threads import ATTENTION_WORK, DECODE_WORK, ELEMENTWISE_WORK, LINEAR_WORK, ROW_WORK, threads_for
from .quant import QuantizedMatrix

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def as_float_array(x, name):
    """x as an ndarray of float32 or float64; a TypeError naming the argument otherwise."""
    x = np.asarray(x)
    if x.dtype not in FLOATS:
        raise TypeError(f"{name} must be a float32 or float64 array, got dtype {x.dtype}")
    return x


def check_out(out, shape, dtype, inputs, same_as=None):
    """A fresh C-contiguous result array, or the caller's `out` once it is shown to fit. `out` must
    not overlap an input, except that it may be exactly `same_as` (an elementwise op in place)."""
    if out is None:
        return np.empty(shape, dtype)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"out must have shape {tuple(shape)} and dtype {np.dtype(dtype)}, "
                         f"got {out.shape} and {out.dtype}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writeable C-contiguous array")
    inplace = out is same_as or (same_as is not None and out.strides == same_as.strides
                                 and out.ctypes.data == same_as.ctypes.data)
    if any(np.may_share_memory(out, x) for x in inputs if not (inplace and x is same_as)):
        raise ValueError("out must not overlap an input array")
    return out


def _along_last_axis(a, n, dtype, name):
    """A gain or bias as a contiguous (n,) vector, or a ValueError if it varies along other axes."""
    if type(a) is np.ndarray and a.shape == (n,) and a.dtype == dtype and a.flags.c_contiguous:
        return a  # the everyday case, checked in a few comparisons
    a = as_float_array(a, name)
    if a.ndim and (a.shape[-1] not in (1, n) or any(s != 1 for s in a.shape[:-1])):
        raise ValueError(f"{name} must have shape ({n},) (or broadcast to it along the last axis), "
                         f"got {a.shape}")
    return np.ascontiguousarray(np.broadcast_to(a.reshape(-1)[-1:] if a.size == 1 else a.reshape(-1), (n,)),
                                dtype=dtype)


def _last_axis(X, name, op, why_not_empty):
    """X as a float array with a last axis (op's axis) of at least one value."""
    X = as_float_array(X, name)
    if X.ndim == 0:
        raise ValueError(f"{name} must have at least one dimension ({op} runs over the last axis)")
    if X.shape[-1] == 0:
        raise ValueError(f"{name} has a zero-length last axis: {why_not_empty}")
    return X


def _rows(a):
    """A (rows, n) C-contiguous view (or copy) of a's last axis."""
    return np.ascontiguousarray(a).reshape(-1, a.shape[-1])


# ---------------------------------------------------------------- softmax

def prepare_softmax(x, out):
    """Checked (x, out) for softmax."""
    x = _last_axis(x, "x", "softmax", "softmax over no values is undefined")  # a max over none
    return x, check_out(out, x.shape, x.dtype, [x])


def softmax(kernels, x, *, out=None):
    x, out = prepare_softmax(x, out)
    if not x.size:
        return out
    if kernels.softmax is None:
        np.copyto(out, ref.softmax(x))
    else:
        kernels.softmax(_rows(x), out.reshape(-1, x.shape[-1]), threads_for(x.size, ROW_WORK))
    return out


# ---------------------------------------------------------------- layer_norm

def prepare_layer_norm(X, g, b, eps, out, dtype=None):
    """Checked (X, g, b as (n,) vectors of the result dtype, eps, out)."""
    X = _last_axis(X, "X", "layer_norm", "the mean of no values is undefined")
    n = X.shape[-1]
    eps = check.nonnegative(eps, "eps")
    dtype = np.result_type(X if dtype is None else dtype, as_float_array(g, "g"), as_float_array(b, "b"))
    g, b = _along_last_axis(g, n, dtype, "g"), _along_last_axis(b, n, dtype, "b")
    return X, g, b, eps, check_out(out, X.shape, dtype, [X])


def layer_norm(kernels, X, g, b, eps=1e-5, *, out=None):
    X, g, b, eps, out = prepare_layer_norm(X, g, b, eps, out)
    if not X.size:
        return out
    if kernels.layer_norm is None:  # in the result dtype, as the kernels compute
        np.copyto(out, ref.layer_norm(X.astype(out.dtype, copy=False), g, b, eps))
    else:
        kernels.layer_norm(_rows(X.astype(out.dtype, copy=False)), g, b, eps, out.reshape(-1, X.shape[-1]),
                           threads_for(X.size, ROW_WORK))
    return out


def _residual(X, R):
    """Checked (X, R, the dtype of their sum S = X + R) for the add_*_norm ops."""
    X, R = as_float_array(X, "X"), as_float_array(R, "R")
    if X.shape != R.shape:
        raise ValueError(f"R must have the shape of X {X.shape}, got {R.shape}")
    return X, R, np.result_type(X, R)


def add_layer_norm(kernels, X, R, g, b, eps=1e-5):
    X, R, sdtype = _residual(X, R)
    X, g, b, eps, out = prepare_layer_norm(X, g, b, eps, None, dtype=sdtype)
    if kernels.add_layer_norm is None or out.dtype != sdtype or not X.size:
        S = np.add(X, R, dtype=sdtype)
        return S, layer_norm(kernels, S, g, b, eps)
    S = np.empty(X.shape, sdtype)
    n = X.shape[-1]
    X, R = (_rows(a.astype(sdtype, copy=False)) for a in (X, R))
    kernels.add_layer_norm(X, R, g, b, eps, S.reshape(-1, n), out.reshape(-1, n),
                           threads_for(S.size, ROW_WORK))
    return S, out


# ---------------------------------------------------------------- linear

LINEAR_ROWS = 8  # up to this many rows of X the kernel runs (a matrix-vector product); more: BLAS GEMM
# A QuantizedMatrix times float32 rows: up to FEW_ROWS rows run its few-rows kernels, LINEAR_ROWS a
# call (QX_ROWS for the linear_qx kernels; on the AVX-512 copy a row's sums are the same in any
# call, the others scale q before or after the rows' products by their count). Measured on Zen 4,
# 2 threads (batched decoding's steps): 9 to 24 rows of SmolLM2's Q4_1 matrices took 0.4-0.6x the
# time of the dequantized panels' GEMM in calls of 8; the K-quant kernels (the 1.1B model's Q4_K,
# Q6_K) ran 8 rows as two calls of 4 in 0.65x one call's time, 16 rows in 0.54x the GEMM's.
FEW_ROWS = 32
QX_ROWS = 4
# int8 rows (W.activations "int8"): up to Q8_ROWS rows take the few-row kernels in one call (8 rows
# of x at a time against each task's rows of W, so W is read once), more the integer GEMM. A row's
# sums are then those of the row alone (the AVX-512 copy, numba), so a batch's step of up to
# Q8_ROWS sequences gives each the logits of its own step; the GEMM's differ in the last bits for
# Q8_0, Q4_0 and others. Zen 4, 2 threads: 16 rows in the few-row kernels took 0.94x the GEMM's
# time for SmolLM2's Q8_0 head (49152 x 576), 0.97-1.02x for its Q4_1 matrices, 0.88-0.98x for the
# 1.1B model's Q4_K and Q6_K (bench/make_llama3_1b.py); 24 rows 0.94-1.24x.
Q8_ROWS = 16


def few_rows(kernels, W):  # -> int
    """The most rows of X that linear(X, W) multiplies in W's few-row kernels where past them a GEMM
    sums a row otherwise (in the last bits); 0 where the two sum alike: int8 Q4_1 rows through the
    AVX-512 VNNI copy (its integer GEMM adds Q4_1's offsets as the row kernels do; not Q8_0's or
    Q4_0's; a float32 GEMM is the BLAS's, its own order, which may depend on the call's other rows
    too: OpenBLAS's Haswell kernel)."""
    if isinstance(W, QuantizedMatrix):
        if W.q8 and W.kind == "Q4_1" and kernels.gemm_q8 is not None and kernels.pack_rows16 is not None:
            return 0
        return Q8_ROWS if W.q8 else FEW_ROWS
    return LINEAR_ROWS


def _product_shape(X, W, x_name, w_name):
    """(k, n) of X (..., k) times W (k, n); a ValueError naming the operand that does not fit."""
    if X.ndim == 0:
        raise ValueError(f"{x_name} must have at least one dimension (..., k)")
    k = X.shape[-1]
    if W.ndim != 2 or W.shape[0] != k:
        raise ValueError(f"{w_name} must have shape ({k}, n) ({x_name}'s last axis is {k}), got {W.shape}")
    return k, W.shape[1]


def linear(kernels, X, W, b=None, *, out=None):
    if isinstance(W, QuantizedMatrix):
        return linear_q(kernels, X, W, b, out)
    X, W = as_float_array(X, "X"), as_float_array(W, "W")
    k, n = _product_shape(X, W, "X", "W")
    dtype = np.result_type(X, W) if b is None else np.result_type(X, W, as_float_array(b, "b"))
    if b is not None:
        b = _along_last_axis(b, n, dtype, "b")
    out = check_out(out, X.shape[:-1] + (n,), dtype, [X, W])
    rows = X.size // k if k else 0
    transposed = W.flags.f_contiguous and not W.flags.c_contiguous
    few = 0 < rows <= LINEAR_ROWS and n and (W.flags.c_contiguous or transposed)
    kernel = kernels.linear if few else None
    if kernel is None:
        if _team_gemm(kernels.gemm, dtype, rows, k, n) and (W.flags.c_contiguous or transposed):
            x, w = _rows(X.astype(dtype, copy=False)), (W.T if transposed else W).astype(dtype, copy=False)
            with _blas.threads(1):  # the team's sgemm calls, each on one thread
                kernels.gemm(x, w, out.reshape(-1, n), transposed, *_blas.sgemm(),
                             threads_for(rows * k * n, GEMM_WORK))
        else:
            with _blas.threads():
                np.matmul(X, W, out=out)
        if b is not None:
            out += b
        return out
    w = (W.T if transposed else W).astype(dtype, copy=False)
    kernel(_rows(X.astype(dtype, copy=False)), w, _NO_BIAS[dtype] if b is None else b, out.reshape(-1, n),
           transposed, b is not None, threads_for(k * n, LINEAR_WORK))
    return out


_NO_BIAS = {dtype: np.zeros(1, dtype) for dtype in FLOATS}
GEMM_WORK = 1 << 21  # multiply-adds a thread of a GEMM gets at the least
_INT32 = (1 << 31) - 1


def _team_gemm(kernel, dtype, rows, k, n, few=False):
    """Whether a (rows, k) x (k, n) GEMM runs on silkattn's own team (Kernels.gemm, gemm_q: one sgemm
    call a thread through numpy's OpenBLAS, silkattn._blas) rather than numpy's matmul on the BLAS's
    threads: float32, more rows than the matrix-vector kernel takes, the BLAS's sgemm found (and
    the sizes within its integers)."""
    if kernel is None or dtype != np.float32 or not rows or (rows <= LINEAR_ROWS and not few) or not n:
        return False
    sgemm = _blas.sgemm()
    return sgemm is not None and (sgemm.ilp64 or max(rows, k, n) <= _INT32)


def linear_q(kernels, X, W, b, out):
    """linear with W a QuantizedMatrix, in np.result_type(X, float32) (b's dtype too, as for a float
    W), of X or, for W.activations "int8", of reference.round_q8(X, Q8_BLOCK[W.kind]): a few
    float32 rows run the backend's linear_q kernel on W's blocks (integer products for int8) where
    W's kind has one (quant.ROW_KINDS), or its linear_qx kernel (the other kinds, each block decoded
    in registers; integer products too); more float32 rows take numpy's GEMM on W
    dequantized a panel at a time (the backend's dequantize kernel, never the whole matrix);
    float64, or a backend without those kernels, numpy's matmul with W.dequantize()."""
    X = as_float_array(X, "X")
    if X.ndim == 0:
        raise ValueError("X must have at least one dimension (..., k)")
    k, n = W.shape
    if X.shape[-1] != k:
        raise ValueError(f"W must have shape ({X.shape[-1]}, n) (X's last axis is {X.shape[-1]}), "
                         f"got a {W.kind} QuantizedMatrix of shape {W.shape}")
    dtype = np.result_type(X, np.float32, *(() if b is None else (as_float_array(b, "b"),)))
    if b is not None:
        b = _along_last_axis(b, n, dtype, "b")
    out = check_out(out, X.shape[:-1] + (n,), dtype, [X, W.blocks])
    rows = X.size // k if k else 0
    rowed = W.kind in quant.ROW_KINDS  # else every product is the GEMM path's, a few rows too
    # int8 rows past Q8_ROWS: the integer GEMM
    few = dtype == np.float32 and 0 < rows <= (Q8_ROWS if W.q8 else FEW_ROWS) and n
    if few and (kernels.linear_q if rowed else kernels.linear_qx) is not None:
        blocks, code = (W.blocks, W.code) if rowed and not W.q8 else _row_blocks(kernels, W)
        kernel = kernels.linear_q if code == W.code and rowed else kernels.linear_qx  # a layout: linear_qx
        step = rows if W.q8 else LINEAR_ROWS if rowed else QX_ROWS
        x, y, bias = _rows(X), out.reshape(-1, n), _NO_BIAS[dtype] if b is None else b
        for i in range(0, rows, step):
            kernel(x[i:i + step], blocks, code, bias, y[i:i + step], b is not None, W.q8,
                   threads_for(k * n, LINEAR_WORK))
        return out
    X = X.astype(dtype, copy=False)
    integer = W.q8 and kernels.gemm_q8 is not None and dtype == np.float32 and rows > LINEAR_ROWS and n
    if integer and kernels.gemm_q8(_rows(X), *_row_blocks(kernels, W), out.reshape(-1, n),
                                   threads_for(rows * k * n, GEMM_WORK)):
        if b is not None:
            out += b
        return out
    if W.q8 and X.size:
        X = ref.round_q8(X, ref.Q8_BLOCK[W.kind])  # what the kernels' integer products see
    if _team_gemm(kernels.gemm_q, dtype, rows, k, n, few=not rowed):
        with _blas.threads(1):  # the team's sgemm calls, each on one thread
            kernels.gemm_q(_rows(X), W.blocks, W.code, out.reshape(-1, n), *_blas.sgemm(),
                           threads_for(rows * k * n, GEMM_WORK))
        if b is not None:
            out += b
        return out
    many = rows > LINEAR_ROWS or not rowed
    if kernels.dequantize is not None and dtype == np.float32 and many and rows * n:
        return _linear_q_panels(kernels, X, W, b, out)
    with _blas.threads():
        np.matmul(X, W.dequantize(), out=out)  # in the result's dtype (b's too)
    if b is not None:
        out += b
    return out


def _row_blocks(kernels, W):
    """(blocks, kind code) an int8 product of W reads: W's own, or where the backend has a layout of
    them for its int8 kernels (QuantizedMatrix.rows16: quant.ROWS16's kinds in groups of 16 rows)
    that one, made on the first call and kept with W (the few-row kernels and the integer GEMM read
    it)."""
    if kernels.pack_rows16 is not None:
        packed = W.rows16(lambda blocks, kind: kernels.pack_rows16(blocks, kind,
                                                                     threads_for(blocks.size, LINEAR_WORK)))
        if packed is not None:
            return packed
    return W.blocks, W.code


PANEL_BYTES = 1 << 22  # W's rows dequantized at a time: within L3, and GEMMs big enough to run at full rate


def _linear_q_panels(kernels, X, W, b, out):
    """X W for many rows of X (a prefill) without W in float32, where the backend has no gemm_q:
    its rows (the outputs) dequantized a panel at a time into one buffer, each panel one BLAS GEMM
    (numpy's matmul, on the BLAS's threads) into its columns of out."""
    k, n = W.shape
    X2, out2 = X.reshape(-1, k), out.reshape(-1, n)
    step = min(n, max(16, PANEL_BYTES // (4 * k) // 16 * 16))
    panel = np.empty((step, k), np.float32)
    threads = 1  # between GEMMs on BLAS's own threads, an OpenMP team (spinning after) would contend
    for j0 in range(0, n, step):
        P = panel[:min(step, n - j0)]
        kernels.dequantize(W.blocks, W.code, j0, P, threads)
        with _blas.threads():
            np.matmul(X2, P.T, out=out2[:, j0:j0 + len(P)])
    if b is not None:
        out += b
    return out


# ---------------------------------------------------------------- bias_relu

def _bias_activation(kernel, numpy_fallback, x, b, out):
    """out = f(x + b) for an elementwise f, b along the last axis; out may be x itself."""
    x = as_float_array(x, "x")
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension (b is added along the last axis)")
    dtype = np.result_type(x, as_float_array(b, "b"))
    b = _along_last_axis(b, x.shape[-1], dtype, "b")
    out = check_out(out, x.shape, dtype, [x, b], same_as=x)
    if kernel is None or not x.size:
        np.copyto(out, numpy_fallback(np.add(x, b, dtype=dtype)))
        return out
    if out is not x:
        np.copyto(out, x)
    kernel(out.reshape(-1, x.shape[-1]), b, threads_for(x.size, ELEMENTWISE_WORK))
    return out


def bias_relu(kernels, x, b, *, out=None):
    return _bias_activation(kernels.bias_relu, lambda v: np.maximum(v, 0), x, b, out)  # NaN stays NaN


def bias_gelu(kernels, x, b, *, out=None):
    return _bias_activation(kernels.bias_gelu, ref.gelu, x, b, out)


# ---------------------------------------------------------------- attention

def check_alibi(slopes, Q):
    """alibi_slopes as float64 (Hq,), Hq being Q's head axis (-3)."""
    if slopes is None:
        return None
    s = np.asarray(slopes)
    if s.dtype.kind not in "fiu":
        raise TypeError(f"alibi_slopes must be real numbers, got dtype {s.dtype}")
    if Q.ndim < 3:
        raise ValueError(f"alibi_slopes needs Q's head axis: Q of shape (..., Hq, Sq, d_k), got {Q.shape}")
    if s.shape != (Q.shape[-3],):
        raise ValueError(f"alibi_slopes must have shape ({Q.shape[-3]},), one slope per query head, "
                         f"got {s.shape}")
    s = s.astype(np.float64)
    if not np.isfinite(s).all():
        raise ValueError("alibi_slopes must be finite")
    return s


def _group_heads(Q, K, V):
    """(Q, K, V, g): with fewer K/V heads than Q's (grouped-query attention, axis -3), Q's head
    axis viewed as (Hkv, g) and K, V given a group axis of 1, so that plain broadcasting pairs query
    head h with K/V head h // g without a copy; g = 1 when the heads match or broadcast."""
    if Q.ndim < 3 or K.ndim < 3 or V.ndim < 3:
        return Q, K, V, 1
    Hq, Hk, Hv = Q.shape[-3], K.shape[-3], V.shape[-3]
    if Hk in (1, Hq) and Hv in (1, Hq):
        return Q, K, V, 1
    if Hk != Hv:
        raise ValueError(f"K and V must have as many heads (axis -3) as each other for grouped-query "
                         f"attention, got {Hk} and {Hv}")
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"the leading (batch) dims of Q {Q.shape}, K {K.shape} and V {V.shape} do not "
                         f"broadcast, and Q's {Hq} heads (axis -3) are not a multiple of K and V's {Hk} "
                         "(grouped-query attention: query head h reads K/V head h // (Hq / Hkv))")
    g = Hq // Hk
    return Q.reshape(Q.shape[:-3] + (Hk, g) + Q.shape[-2:]), K[..., None, :, :], V[..., None, :, :], g


def _split_heads(a, name, Hq, g):
    """A mask or bias broadcast to (..., Hq, Sq, Sk), seen as (..., Hq / g, g, Sq, Sk) for grouped heads."""
    if g == 1 or a.ndim < 3:
        return a
    if a.shape[-3] == Hq:
        return a.reshape(a.shape[:-3] + (Hq // g, g) + a.shape[-2:])
    if a.shape[-3] != 1:
        raise ValueError(f"{name} of shape {a.shape} does not broadcast to the query heads "
                         f"(..., {Hq}, Sq, Sk)")
    return a[..., None, :, :]


def _two_dims(a):
    """a with leading axes of 1 up to 2 dimensions (a mask or bias given as a key vector)."""
    return a.reshape((1,) * (2 - a.ndim) + a.shape) if a.ndim < 2 else a


def _broadcast_operand(a, name, lead, Sq, Sk, shape):
    """The leading dims of a mask or bias broadcast with `lead`; a ValueError naming it (and the
    caller's shape) if not."""
    try:
        lead = np.broadcast_shapes(lead, a.shape[:-2])
        np.broadcast_shapes(a.shape[-2:], (Sq, Sk))
    except ValueError:
        raise ValueError(f"{name} of shape {shape} does not broadcast to {lead + (Sq, Sk)}") from None
    return lead


def prepare_attention(Q, K, V, mask, out, bias=None):
    """Checked (Q, K, V in one dtype, mask as bool or None, bias in that dtype or None, lead dims,
    out, g): Q, K, V, mask and bias come back with grouped-query heads split (see _group_heads),
    lead is their common leading shape, out has the caller's (..., Hq, Sq, d_v) shape."""
    Q, K, V = as_float_array(Q, "Q"), as_float_array(K, "K"), as_float_array(V, "V")
    for name, a in (("Q", Q), ("K", K), ("V", V)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., seq, d), got shape {a.shape}")
    (Sq, dk), (Sk, dk2), (Sv, dv) = Q.shape[-2:], K.shape[-2:], V.shape[-2:]
    if dk != dk2:
        raise ValueError(f"Q and K must share d_k (their last axis), got {dk} and {dk2}")
    if Sk != Sv:
        raise ValueError(f"K and V must have the same number of keys, got {Sk} and {Sv}")
    Hq = Q.shape[-3] if Q.ndim >= 3 else 1
    Q, K, V, g = _group_heads(Q, K, V)
    try:
        lead = Q.shape[:-2] if Q.shape[:-2] == K.shape[:-2] == V.shape[:-2] else np.broadcast_shapes(
            Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    except ValueError:
        raise ValueError(f"the leading (batch) dims of Q {Q.shape}, K {K.shape} and V {V.shape} "
                         "do not broadcast") from None
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype.kind not in "biuf":
            raise TypeError(f"mask must be boolean (or 0/1 numbers), got dtype {m.dtype}")
        mask = _split_heads(m if m.dtype == bool else m != 0, "mask", Hq, g)  # 0/1 read as np.where does
        lead = _broadcast_operand(_two_dims(mask), "mask", lead, Sq, Sk, m.shape)
    if Sk == 0 and Sq:
        raise ValueError("K and V have no keys (Sk = 0): a softmax over no keys is undefined")
    if dk == 0:
        raise ValueError("Q and K have d_k = 0: the scale 1/sqrt(d_k) is undefined")
    dtype = np.result_type(Q, K, V)
    if bias is not None:
        bias = np.asarray(bias)
        shape = bias.shape
        if bias.dtype not in FLOATS and bias.dtype.kind not in "iu":
            raise TypeError(f"bias must be a float array (added to the scores), got dtype {bias.dtype}")
        bias = _split_heads(bias.astype(dtype, copy=False), "bias", Hq, g)
        lead = _broadcast_operand(_two_dims(bias), "bias", lead, Sq, Sk, shape)
    Q, K, V = (a.astype(dtype, copy=False) for a in (Q, K, V))
    out_lead = lead[:-2] + (lead[-2] * lead[-1],) if g > 1 else lead  # (..., Hkv, g) -> (..., Hq)
    return Q, K, V, mask, bias, lead, check_out(out, out_lead + (Sq, dv), dtype, [Q, K, V]), g


_NO_MASK = np.ones(1, np.uint8)
_NO_BIAS_ROWS = {dtype: np.zeros(1, dtype) for dtype in FLOATS}


def _flat_rows(a, lead):
    """(1-D view over a's memory, int64 offsets of each batch item in `lead`, row stride).

    Keeps strided views (e.g. one head's columns of a projection) without a copy when the last
    axis has unit stride and no stride is negative; copies otherwise.
    """
    item = a.itemsize
    if a.flags.c_contiguous and a.shape[:-2] == lead:
        S, d = a.shape[-2:]
        return a.reshape(-1), np.arange(math.prod(lead), dtype=np.int64) * (S * d), d if S > 1 else 0
    if a.ndim and (a.strides[-1] != item and a.shape[-1] > 1 or any(s < 0 or s % item for s in a.strides)):
        a = np.ascontiguousarray(a)
    steps = [0 if n == 1 else s // item for n, s in zip(a.shape, a.strides)]
    if a.ndim == 3 and a.shape[:1] == lead:  # heads of a projection or a KV cache: one lead axis
        flat = np.lib.stride_tricks.as_strided(a, (1 + sum((n - 1) * s for n, s in zip(a.shape, steps)),),
                                               (item,), writeable=False)
        return flat, np.arange(lead[0], dtype=np.int64) * steps[0], steps[1]
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, steps))
    if a.flags.c_contiguous:
        flat = a.reshape(-1)
    else:
        flat = np.lib.stride_tricks.as_strided(a, (span,), (item,), writeable=False)
    lead_steps = [0] * (len(lead) - (a.ndim - 2)) + steps[:-2]
    offsets = np.zeros(lead, np.int64)
    for axis, (n, s) in enumerate(zip(lead, lead_steps)):
        offsets = offsets + (np.arange(n, dtype=np.int64) * s).reshape((n,) + (1,) * (len(lead) - axis - 1))
    return flat, np.broadcast_to(offsets, lead).reshape(-1), steps[-2]


def _key_rows(a, Sk, lead):
    """_flat_rows of a mask or bias broadcast to Sk keys (a key-broadcast one copied: kernels read
    keys one by one)."""
    a = _two_dims(a)
    return _flat_rows(np.broadcast_to(a, a.shape[:-1] + (Sk,)), lead)


def _kv_units(K, V, lead):
    """(the K/V unit of each item, the number of units): items whose K and V are the same rows
    (broadcast K/V, the query heads of a group) share a unit."""
    ids = [np.broadcast_to(np.arange(math.prod(a.shape[:-2]), dtype=np.int64).reshape(a.shape[:-2]),
                           lead).ravel() for a in (K, V)]
    key = ids[0] * (ids[1].max(initial=0) + 1) + ids[1]
    if len(key) <= 1:
        return np.zeros(len(key), np.int64), len(key)
    uniq, unit = np.unique(key, return_inverse=True)
    return unit.reshape(-1), len(uniq)


def _layout(Q, K, V, mask, bias, lead, q_offset, slopes):
    """(operand parts: (flat, offsets, row stride) each, ITEMs, number of units) of one attention
    call over checked operands."""
    Sq, (Sk, dv) = Q.shape[-2], V.shape[-2:]
    parts = [_flat_rows(a, lead) for a in (Q, K, V)]
    parts.append(_key_rows(mask.view(np.uint8), Sk, lead) if mask is not None else (_NO_MASK, None, 0))
    parts.append(_key_rows(bias, Sk, lead) if bias is not None else (_NO_BIAS_ROWS[Q.dtype], None, 0))
    B = len(parts[0][1])
    items = np.zeros(B, _plan_mod.ITEM)
    for name, p in zip(("q", "k", "v", "mask", "bias"), parts):
        if p[1] is not None:
            items[name] = p[1]
    items["out"] = np.arange(B, dtype=np.int64) * (Sq * dv)
    items["sq"], items["sk"], items["pos"] = Sq, Sk, q_offset
    items["unit"], nunits = _kv_units(K, V, lead)
    if slopes is not None:  # items run over (..., Hq): head h is item % Hq
        items["slope"] = np.tile(slopes, B // len(slopes))
    return parts, items, nunits


def _finish(kernels, parts, items, nunits, out, dk, dv, scale, softcap, causal, window, has_alibi, pages=None,
            page_keys=0):
    """(plan, threads) from the operands and items: units, window and the work (silkattn._plan);
    pages, page_keys: a paged plan's (the items' k and v name their unit's first page)."""
    units = np.zeros(nunits, _plan_mod.UNIT)
    units["k"][items["unit"]], units["v"][items["unit"]], units["sk"][items["unit"]] = (
        items["k"], items["v"], items["sk"])
    left, right = _plan_mod.window_bounds(window, causal)
    plan = _plan_mod.Plan(
        q=parts[0][0], k=parts[1][0], v=parts[2][0], mask=parts[3][0], bias=parts[4][0], out=out.reshape(-1),
        rs_q=parts[0][2], rs_k=parts[1][2], rs_v=parts[2][2], rs_mask=parts[3][2], rs_bias=parts[4][2],
        dk=dk, dv=dv, sq_max=int(items["sq"].max(initial=0)), sk_max=int(items["sk"].max(initial=0)),
        scale=1 / math.sqrt(dk) if scale is None else scale, softcap=softcap or 0.0, left=left, right=right,
        has_mask=parts[3][1] is not None, has_bias=parts[4][1] is not None, has_alibi=has_alibi,
        items=items, units=units, page_keys=page_keys, pages=pages)
    nthreads = threads_for(plan.work, DECODE_WORK if _plan_mod.takes_rows(plan) else ATTENTION_WORK)
    return _plan_mod.schedule(plan, kernels.attention_tiles, nthreads), nthreads


def _contiguous_call(Q, K, V):
    """True for the everyday call: same-dtype C-contiguous float arrays, equal lead dims, no empty
    axis. Such a call is checked by these few comparisons instead of the general path, whose
    bookkeeping would dominate a small call."""
    return (type(Q) is type(K) is type(V) is np.ndarray
            and Q.dtype == K.dtype == V.dtype and Q.dtype in FLOATS and Q.ndim == K.ndim == V.ndim >= 2
            and Q.shape[:-2] == K.shape[:-2] == V.shape[:-2]
            and Q.shape[-1] == K.shape[-1] and K.shape[-2] == V.shape[-2] and Q.size and K.size and V.size
            and Q.flags.c_contiguous and K.flags.c_contiguous and V.flags.c_contiguous)


def attention(kernels, Q, K, V, mask=None, *, scale=None, softcap=None, bias=None, alibi_slopes=None,
              causal=False, window=None, q_offset=0, out=None, return_lse=False):
    causal, window = bool(causal), check.window(window)
    scale, softcap = check.optional_positive(scale, "scale"), check.optional_positive(softcap, "softcap")
    q_offset = check.q_offset(q_offset, causal or window is not None or alibi_slopes is not None)
    return_lse = check.flag(return_lse, "return_lse")
    if kernels.attention is not None and mask is None and bias is None and alibi_slopes is None \
            and out is None:
        if _contiguous_call(Q, K, V) or _heads_view(Q, K, V):
            return _kept_plan_call(kernels, Q, K, V, scale, softcap, causal, window, q_offset, return_lse)
        heads = _grouped_heads(Q, K, V)  # (..., Hq, S, d) over (..., Hkv, S, d) as (heads, S, d) views
        if heads is not None:
            out = _kept_plan_call(kernels, *heads, scale, softcap, causal, window, q_offset, return_lse)
            if return_lse:
                return out[0].reshape(Q.shape[:-1] + V.shape[-1:]), out[1].reshape(Q.shape[:-1])
            return out.reshape(Q.shape[:-1] + V.shape[-1:])
    keywords = dict(scale=scale, softcap=softcap, causal=causal, window=window, q_offset=q_offset)
    slopes = check_alibi(alibi_slopes, as_float_array(Q, "Q"))
    args = Q, K, V, mask, bias
    Q, K, V, mask, bias, lead, out, g = prepare_attention(Q, K, V, mask, out, bias)
    lse = np.empty(out.shape[:-1], out.dtype) if return_lse else None
    if not out.size:
        return (out, lse) if return_lse else out
    if kernels.attention is None:
        Q, K, V, mask, bias = _unsplit(out.dtype, *args)
        with _blas.threads():
            result = ref.attention(Q, K, V, mask, bias=bias, alibi_slopes=slopes, return_lse=return_lse,
                                   **keywords)
        if not return_lse:
            np.copyto(out, result)
            return out
        np.copyto(out, result[0]), np.copyto(lse, result[1])
        return out, lse
    layout = _layout(Q, K, V, mask, bias, lead, q_offset, slopes)
    plan, nthreads = _finish(kernels, *layout, out, Q.shape[-1], V.shape[-1], scale, softcap, causal, window,
                             slopes is not None)
    plan.lse = None if lse is None else lse.reshape(-1)
    kernels.attention(plan, nthreads)
    return (out, lse) if return_lse else out


def attention_backward(kernels, dout, Q, K, V, out, lse, mask=None, *, scale=None, softcap=None, bias=None,
                       alibi_slopes=None, causal=False, window=None, q_offset=0):
    causal, window = bool(causal), check.window(window)
    scale, softcap = check.optional_positive(scale, "scale"), check.optional_positive(softcap, "softcap")
    q_offset = check.q_offset(q_offset, causal or window is not None or alibi_slopes is not None)
    slopes = check_alibi(alibi_slopes, as_float_array(Q, "Q"))
    args = Q, K, V, mask, bias
    Qg, Kg, Vg, mask, bias, lead, o, g = prepare_attention(Q, K, V, mask, None, bias)
    dtype = o.dtype
    dout, out, lse = (_backward_operand(a, name, shape, dtype) for a, name, shape in (
        (dout, "dout", o.shape), (out, "out", o.shape), (lse, "lse", o.shape[:-1])))
    Q, K, V = (np.asarray(a) for a in args[:3])
    if not o.size or not K.size:
        return tuple(np.zeros(a.shape, dtype) for a in (Q, K, V))
    if kernels.attention_backward is None:
        Qr, Kr, Vr, mr, br = _unsplit(dtype, *args)
        with _blas.threads():
            return ref.attention_backward(dout, Qr, Kr, Vr, out, lse, mr, scale=scale, softcap=softcap,
                                          bias=br, alibi_slopes=slopes, causal=causal, window=window,
                                          q_offset=q_offset)
    # every item its own Q rows and every unit its own K and V rows (contiguous copies over the
    # broadcast shapes): a task, one unit, then alone writes the rows of dQ, dK, dV it reads
    kv_lead = np.broadcast_shapes(Kg.shape[:-2], Vg.shape[:-2])
    Qc = np.ascontiguousarray(np.broadcast_to(Qg, lead + Qg.shape[-2:]))
    Kc = np.ascontiguousarray(np.broadcast_to(Kg, kv_lead + Kg.shape[-2:]))
    Vc = np.ascontiguousarray(np.broadcast_to(Vg, kv_lead + Vg.shape[-2:]))
    layout = _layout(Qc, Kc, Vc, mask, bias, lead, q_offset, slopes)
    plan, nthreads = _finish(kernels, *layout, o, Qc.shape[-1], Vc.shape[-1], scale, softcap, causal, window,
                             slopes is not None)
    units = plan.items["unit"]
    order = np.argsort(units, kind="stable").astype(np.int64)
    first = np.concatenate(([0], np.cumsum(np.bincount(units, minlength=len(plan.units))))).astype(np.int64)
    rows = dout.reshape(-1, dout.shape[-1])
    D = np.einsum("ij,ij->i", rows, out.reshape(rows.shape))  # rowsum(dout * out), O(rows) memory
    dQ, dK, dV = np.zeros_like(Qc), np.empty_like(Kc), np.empty_like(Vc)
    nthreads = max(1, min(nthreads, _threads._num_threads, len(plan.units)))
    fix = np.empty(2 * len(D), dtype)  # the kernel's per-row (base, rel) of the weights
    kernels.attention_backward(plan, rows.reshape(-1), D, lse.reshape(-1), fix, order, first, dQ.reshape(-1),
                               dK.reshape(-1), dV.reshape(-1), nthreads)
    return tuple(_sum_to(d, a_g.shape).reshape(a.shape)
                 for d, a_g, a in ((dQ, Qg, Q), (dK, Kg, K), (dV, Vg, V)))


def _backward_operand(a, name, shape, dtype):
    """dout, out or lse of attention_backward: a float array of the forward's result shape, C-contiguous
    in the call's dtype."""
    a = as_float_array(a, name)
    if a.shape != shape:
        what = "lse" if name == "lse" else "output"
        raise ValueError(f"{name} must have shape {shape} (attention's {what} for these Q, K, V), "
                         f"got {a.shape}")
    return np.ascontiguousarray(a, dtype)


def _sum_to(d, shape):
    """d summed over the axes its operand of `shape` was broadcast along (the gradient of broadcasting)."""
    d = d.sum(tuple(range(d.ndim - len(shape)))) if d.ndim > len(shape) else d
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and d.shape[i] != 1)
    return d.sum(axes, keepdims=True) if axes else d


def _kept_plan_call(kernels, Q, K, V, scale, softcap, causal, window, q_offset, return_lse=False):
    """attention for the everyday calls (_contiguous_call, _heads_view, _grouped_heads), their plan
    kept by shape (and strides) in silkattn._cache and bound to the call's arrays: a repeated call
    costs a look-up. return_lse: (out, lse)."""
    keywords = (scale, softcap, causal, window, q_offset, kernels.attention_tiles, _threads._num_threads)
    out = np.empty(Q.shape[:-1] + V.shape[-1:], Q.dtype)
    lse = np.empty(Q.shape[:-1], Q.dtype) if return_lse else None
    if _contiguous_call(Q, K, V):
        key = ("contiguous plan", Q.shape, Q.dtype.char, K.shape[-2], V.shape[-1], *keywords)
        plan, nthreads = _cache.get(key, lambda: _contiguous_plan(
            kernels, Q.shape[:-2], *Q.shape[-2:], *V.shape[-2:], Q.dtype, scale, softcap, causal, window,
            q_offset))
        bound = plan.bind(Q.reshape(-1), K.reshape(-1), V.reshape(-1), out.reshape(-1))
    else:
        # the general path's plan: its offsets hold for any arrays of this layout
        key = ("view plan", Q.shape, K.shape, V.shape[-1], Q.strides, K.strides, V.strides, Q.dtype.char,
               *keywords)
        plan, nthreads = _cache.get(key, lambda: _view_layout(kernels, Q, K, V, scale, softcap, causal,
                                                              window, q_offset))
        bound = plan.bind(_flat(Q), _flat(K), _flat(V), out.reshape(-1))
    if return_lse:
        bound.lse = lse.reshape(-1)
    kernels.attention(bound, nthreads)
    return (out, lse) if return_lse else out


def _grouped_heads(Q, K, V):
    """(Q, K, V) as (heads, S, d) views for C-contiguous, non-empty grouped-query operands of 4 or
    more dims with equal batch dims, else None. Merged into one axis, the batch and heads keep their
    groups (query head b Hq + h reads K/V head b Hkv + h // g = (b Hq + h) // g), so the call is a
    _heads_view one and keeps its plan instead of laying out its items again (0.2 ms a call)."""
    if not (type(Q) is type(K) is type(V) is np.ndarray and Q.ndim == K.ndim == V.ndim >= 4
            and Q.shape[:-3] == K.shape[:-3] == V.shape[:-3] and Q.size and K.size and V.size
            and Q.flags.c_contiguous and K.flags.c_contiguous and V.flags.c_contiguous):
        return None
    heads = [a.reshape((-1,) + a.shape[-2:]) for a in (Q, K, V)]
    return heads if _heads_view(*heads) else None


def _unsplit(dtype, Q, K, V, mask=None, bias=None):
    """The caller's operands in the result dtype, for the reference (the NumPy fallback)."""
    Q, K, V = (np.asarray(a).astype(dtype, copy=False) for a in (Q, K, V))
    if mask is not None:
        mask = np.asarray(mask)
        mask = mask if mask.dtype == bool else mask != 0
    return Q, K, V, mask, None if bias is None else np.asarray(bias).astype(dtype, copy=False)


def _heads_view(Q, K, V):
    """True for the call of a model's attention on views: (H, S, d) arrays of one float dtype with
    unit-stride rows and non-negative strides (heads cut from a projection, a KV cache's first
    positions), K and V with Q's heads or a whole number of groups of them. A layer's call is
    repeated by every layer of a step, so its plan is kept by shapes and strides."""
    return (type(Q) is type(K) is type(V) is np.ndarray and Q.ndim == K.ndim == V.ndim == 3
            and Q.dtype == K.dtype == V.dtype and Q.dtype in FLOATS
            and K.shape[0] == V.shape[0] > 0 and Q.shape[0] % K.shape[0] == 0
            and Q.shape[2] == K.shape[2] and K.shape[1] == V.shape[1] and Q.size and K.size and V.size
            and Q.strides[2] == K.strides[2] == V.strides[2] == Q.itemsize
            and min(Q.strides + K.strides + V.strides) >= 0)


def _flat(a):
    """A 1-D view from a's first element over every element it reaches (as _flat_rows cuts it)."""
    if a.flags.c_contiguous:
        return a.reshape(-1)
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.strides)) // a.itemsize
    return np.lib.stride_tricks.as_strided(a, (span,), (a.itemsize,), writeable=False)


def _view_layout(kernels, Q, K, V, scale, softcap, causal, window, q_offset):
    """(plan, threads) of a _heads_view call through the general path, to be kept (its arrays are
    replaced by the next call's, Plan.bind)."""
    Q, K, V, mask, bias, lead, out, _ = prepare_attention(Q, K, V, None, None)
    layout = _layout(Q, K, V, mask, bias, lead, q_offset, None)
    plan, nthreads = _finish(kernels, *layout, out, Q.shape[-1], V.shape[-1], scale, softcap, causal, window,
                             False)
    # the layout alone is kept: the first call's arrays (a model's KV cache, a batch's pool) would
    # otherwise stay alive in silkattn._cache for as long as the plan
    plan.q, plan.k, plan.v, plan.out = (_placeholder(a.shape, a.dtype)
                                        for a in (plan.q, plan.k, plan.v, plan.out))
    plan.derived = {}
    return plan, nthreads


def _contiguous_plan(kernels, lead, Sq, dk, Sk, dv, dtype, scale, softcap, causal, window, q_offset):
    """(plan, threads) for C-contiguous (lead, Sq, dk), (lead, Sk, dk), (lead, Sk, dv) operands, kept
    by shape: its arrays are placeholders the caller replaces by the call's (Plan.bind)."""
    Q, K, V, out = (_placeholder(lead + shape, dtype) for shape in ((Sq, dk), (Sk, dk), (Sk, dv), (Sq, dv)))
    layout = _layout(Q, K, V, None, None, lead, q_offset, None)
    plan, nthreads = _finish(kernels, *layout, out, dk, dv, scale, softcap, causal, window, False)
    plan.derived = {}
    return plan, nthreads


def _placeholder(shape, dtype):
    """A C-contiguous array's shape and strides over one element of memory: the layout alone, for a
    cached plan (never read)."""
    dtype = np.dtype(dtype)
    strides = np.cumprod((1,) + shape[:0:-1])[::-1] * dtype.itemsize
    return np.lib.stride_tricks.as_strided(np.empty(1, dtype), shape, tuple(int(s) for s in strides),
                                           writeable=False)


def check_cu_seqlens(cu_seqlens, total, name="cu_seqlens"):
    """cu_seqlens as int64 (n + 1,): 0, then non-decreasing sequence ends, the last one total."""
    cu = np.asarray(cu_seqlens)
    if cu.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers (where each packed sequence starts), got dtype {cu.dtype}")
    cu = cu.astype(np.int64, copy=False)
    if cu.ndim != 1 or cu.size < 2 or cu[0] != 0 or cu[-1] != total or (np.diff(cu) < 0).any():
        raise ValueError(f"{name} must run from 0 to the {total} packed rows without decreasing "
                         f"(sequence i is rows {name}[i] .. {name}[i + 1]), got {cu_seqlens!r}")
    return cu


def attention_varlen(kernels, Q, K, V, cu_seqlens, *, causal=False, cu_seqlens_k=None, scale=None,
                     softcap=None, bias=None, alibi_slopes=None, window=None, out=None):
    causal, window = bool(causal), check.window(window)
    scale, softcap = check.optional_positive(scale, "scale"), check.optional_positive(softcap, "softcap")
    slopes = check_alibi(alibi_slopes, as_float_array(Q, "Q"))
    args = Q, K, V, None, bias
    Q, K, V, _, bias, lead, out, g = prepare_attention(Q, K, V, None, out, bias)
    total, total_k = Q.shape[-2], K.shape[-2]
    cu = check_cu_seqlens(cu_seqlens, total)
    if cu_seqlens_k is None:
        if total_k != total:
            raise ValueError(f"Q and K must hold the same packed rows, got {total} and {total_k} "
                             "(pass cu_seqlens_k for keys packed apart from the queries)")
        cu_k = cu
    else:
        cu_k = check_cu_seqlens(cu_seqlens_k, total_k, "cu_seqlens_k")
        if len(cu_k) != len(cu):
            raise ValueError(f"cu_seqlens_k must hold as many sequences as cu_seqlens ({len(cu) - 1}), "
                             f"got {len(cu_k) - 1}")
        if ((np.diff(cu_k) == 0) & (np.diff(cu) > 0)).any():
            raise ValueError("cu_seqlens_k gives a sequence with queries but no keys: a softmax over no keys "
                             "is undefined")
    if not out.size:
        return out
    if kernels.attention is None:
        Q, K, V, _, bias = _unsplit(out.dtype, *args)
        with _blas.threads():
            np.copyto(out, ref.attention_varlen(Q, K, V, cu, causal, cu_seqlens_k=cu_k, scale=scale,
                                                softcap=softcap, bias=bias, alibi_slopes=slopes,
                                                window=window))
        return out
    parts, base, _ = _layout(Q, K, V, None, bias, lead, 0, slopes)
    # item (b, s): batch item b's rows of sequence s
    nq, nk = np.diff(cu), np.diff(cu_k)
    keep = nq > 0
    sq0, sk0, nq, nk = cu[:-1][keep], cu_k[:-1][keep], nq[keep], nk[keep]
    B, n = len(base), len(nq)
    if not n:
        return out
    items = np.repeat(base, n)
    s = np.tile(np.arange(n), B)
    for name, part, start in (("q", parts[0], sq0), ("k", parts[1], sk0), ("v", parts[2], sk0)):
        items[name] += start[s] * part[2]
    if bias is not None:
        items["bias"] += sq0[s] * parts[4][2] + sk0[s]
    items["out"] = (np.repeat(np.arange(B, dtype=np.int64), n) * total + sq0[s]) * V.shape[-1]
    items["sq"], items["sk"], items["pos"] = nq[s], nk[s], nk[s] - nq[s]
    items["unit"] = items["unit"] * n + s
    _, unit = np.unique(items["unit"], return_inverse=True)
    unit = unit.reshape(-1)
    # each sequence as attention gives it alone (bitwise): the units of few rows (the rows path,
    # _plan.takes_rows) and the others (the tiles path) in a call each where the sequences mix them
    few = (np.bincount(unit, weights=items["sq"]) <= _plan_mod.ROWS_MAX)[unit]
    for pick in (few, ~few) if few.any() and not few.all() else (slice(None),):
        part, (_, u) = items[pick], np.unique(unit[pick], return_inverse=True)
        part["unit"] = u.reshape(-1)
        kernels.attention(*_finish(kernels, parts, part, int(u.max()) + 1, out, Q.shape[-1], V.shape[-1],
                                   scale, softcap, causal, window, slopes is not None))
    return out


def _check_paged(Q, K_pages, V_pages, page_table, seq_lens):
    """(Q, K_pages, V_pages in one float dtype, page_table int64 (B, m), seq_lens int64 (B,)), each
    shape checked against the others and every page a sequence reads within the pool."""
    Q, K, V = as_float_array(Q, "Q"), as_float_array(K_pages, "K_pages"), as_float_array(V_pages, "V_pages")
    if Q.ndim != 4:
        raise ValueError(f"Q must have shape (B, Hq, Sq, d_k), got {Q.shape}")
    for name, a in (("K_pages", K), ("V_pages", V)):
        if a.ndim != 4:
            raise ValueError(f"{name} must have shape (n_pages, Hkv, page_keys, d), got {a.shape}")
    (B, Hq, Sq, dk), (n_pages, Hkv, P, dk2) = Q.shape, K.shape
    if V.shape[:3] != K.shape[:3]:
        raise ValueError(f"V_pages must have K_pages' pages, heads and page size {K.shape[:3]}, "
                         f"got {V.shape[:3]}")
    if dk2 != dk:
        raise ValueError(f"Q and K_pages must share d_k (their last axis), got {dk} and {dk2}")
    if not Hkv or Hq % Hkv:
        raise ValueError(f"Q's {Hq} heads must be a multiple of K_pages' {Hkv} (query head h reads K/V "
                         "head h // (Hq / Hkv))")
    if P > _plan_mod.CHUNK_KEYS and P % _plan_mod.CHUNK_KEYS:
        raise ValueError(f"the page size (K_pages' axis 2) must be at most {_plan_mod.CHUNK_KEYS} keys or a "
                         f"multiple of it, got {P}")
    table, lens = np.asarray(page_table), np.asarray(seq_lens)
    for name, a in (("page_table", table), ("seq_lens", lens)):
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name} must be integers, got dtype {a.dtype}")
    if table.ndim != 2 or len(table) != B:
        raise ValueError(f"page_table must have shape ({B}, max_pages), one row of page ids a sequence, "
                         f"got {table.shape}")
    if lens.shape != (B,):
        raise ValueError(f"seq_lens must have shape ({B},), the keys of each sequence, got {lens.shape}")
    table, lens = table.astype(np.int64, copy=False), lens.astype(np.int64, copy=False)
    if B and (lens.min() < max(Sq, 1) or lens.max() > table.shape[1] * P):
        raise ValueError(f"seq_lens must lie between Sq = {max(Sq, 1)} (the queries are each sequence's "
                         f"last positions) and page_table's {table.shape[1]} pages x {P} keys, got {lens}")
    used = np.arange(table.shape[1]) < -(-lens[:, None] // P)
    if used.any() and (table[used].min() < 0 or table[used].max() >= n_pages):
        raise ValueError(f"page_table names pages outside the pool's {n_pages} (of the pages "
                         "seq_lens reaches)")
    dtype = np.result_type(Q, K, V, np.float32)
    K, V = (np.ascontiguousarray(a, dtype) for a in (K, V))  # the pools are read in place when they are so
    return np.ascontiguousarray(Q, dtype), K, V, table, lens


def attention_paged(kernels, Q, K_pages, V_pages, page_table, seq_lens, *, causal=True, scale=None,
                    softcap=None, alibi_slopes=None, window=None, out=None):
    window = check.window(window)
    scale, softcap = check.optional_positive(scale, "scale"), check.optional_positive(softcap, "softcap")
    slopes = check_alibi(alibi_slopes, as_float_array(Q, "Q"))
    Q, K, V, table, lens = _check_paged(Q, K_pages, V_pages, page_table, seq_lens)
    (B, Hq, Sq, _), dv = Q.shape, V.shape[-1]
    out = check_out(out, (B, Hq, Sq, dv), Q.dtype, [Q, K, V])
    if not out.size:
        return out
    keywords = dict(causal=bool(causal), scale=scale, softcap=softcap, alibi_slopes=slopes, window=window)
    if kernels.attention is None:
        with _blas.threads():
            np.copyto(out, ref.attention_paged(Q, K, V, table, lens, **keywords))
        return out
    # kept by shape and pages: a decoding step's layers share one (their pools differ, not their layout)
    P = K.shape[2]
    used = table[:, :int(-(-lens.max() // P))]
    key = ("paged plan", Q.shape, K.shape, V.shape[-1], Q.dtype.char, lens.tobytes(), used.tobytes(),
           *(keywords[name] for name in ("causal", "scale", "softcap", "window")),
           None if slopes is None else slopes.tobytes(), kernels.attention_tiles, _threads._num_threads)
    plan, nthreads = _cache.get(key, lambda: _paged_plan(kernels, Q, K, V, table, lens, keywords))
    kernels.attention(plan.bind(Q.reshape(-1), K.reshape(-1), V.reshape(-1), out.reshape(-1)), nthreads)
    return out


def _paged_plan(kernels, Q, K, V, table, lens, keywords):
    """(plan, threads) of attention_paged on the rows path: an item a (sequence, query head, piece
    of its queries), a unit the pieces of one K/V head's group that the kernel takes together
    (at most _plan.ROWS_MAX rows), its keys in pages; the table of pages lists each sequence's
    pages for each K/V head (K, V offsets of the page's row 0) once, the units of the pair sharing it."""
    (B, Hq, Sq, dk), (_, Hkv, P, dv) = Q.shape, V.shape
    g = Hq // Hkv
    hc = min(g, _plan_mod.ROWS_MAX)  # heads of a group a unit takes, and queries a piece
    L = max(1, _plan_mod.ROWS_MAX // hc)
    npieces, nhc = -(-Sq // L), -(-g // hc)
    npages = -(-lens // P)  # each sequence's pages
    # the table of pages: sequence b, K/V head h: its pages in order, from row first[b, h]
    first = (np.cumsum(np.repeat(npages, Hkv)) - np.repeat(npages, Hkv)).reshape(B, Hkv)
    pb = np.repeat(np.arange(B), npages * Hkv)
    ph = np.repeat(np.tile(np.arange(Hkv), B), np.repeat(npages, Hkv))
    pi = np.arange(len(pb)) - first[pb, ph]
    row0 = (table[pb, pi] * Hkv + ph) * P  # the page's row 0 in the pool's rows
    pages = np.stack([row0 * dk, row0 * dv], 1).astype(np.int64)
    b, h, piece = (a.reshape(-1) for a in np.meshgrid(np.arange(B), np.arange(Hq), np.arange(npieces),
                                                         indexing="ij"))
    items = np.zeros(len(b), _plan_mod.ITEM)
    row = (b * Hq + h) * Sq + piece * L
    items["q"], items["out"] = row * dk, row * dv
    items["k"] = items["v"] = first[b, h // g]
    items["sq"], items["sk"] = np.minimum(L, Sq - piece * L), lens[b]
    items["pos"] = lens[b] - Sq + piece * L
    items["unit"] = ((b * Hkv + h // g) * npieces + piece) * nhc + (h % g) // hc
    if keywords["alibi_slopes"] is not None:
        items["slope"] = keywords["alibi_slopes"][h]
    # the operands as placeholders of their size (the call's arrays are bound to the kept plan)
    parts = [(_placeholder((a.size,), Q.dtype), None, d) for a, d in ((Q, dk), (K, dk), (V, dv))]
    parts += [(_NO_MASK, None, 0), (_NO_BIAS_ROWS[Q.dtype], None, 0)]
    out = _placeholder((B, Hq, Sq, dv), Q.dtype)  # the call's is bound to the kept plan
    plan, nthreads = _finish(kernels, parts, items, B * Hkv * npieces * nhc, out, dk, dv, keywords["scale"],
                             keywords["softcap"], keywords["causal"], keywords["window"],
                             keywords["alibi_slopes"] is not None, pages, P)
    if plan.path != "rows":
        raise AssertionError("a paged plan takes the rows path")
    plan.derived = {}
    return plan, nthreads


# ---------------------------------------------------------------- rows as offsets (rope, silu_mul)

def _row_layout(a):
    """(a 1-D view over a's memory, the int64 offset of each of a's rows in it, in C order) for an
    array (..., n) whose rows have unit stride and whose strides are non-negative multiples of its
    itemsize: the head views of a projection (heads swapped to the front), or one of its column
    blocks, without a copy. None for any other layout (the caller copies)."""
    item, n = a.itemsize, a.shape[-1]
    bad_stride = any(m > 1 and (s < 0 or s % item) for m, s in zip(a.shape, a.strides))
    if bad_stride or (n > 1 and a.strides[-1] != item):
        return None
    steps = tuple(0 if m == 1 else s // item for m, s in zip(a.shape[:-1], a.strides[:-1]))
    if a.flags.c_contiguous:
        flat = a.reshape(-1)
    else:  # from the first element to the last one's row end (writeable if a is)
        span = n + sum((m - 1) * s for m, s in zip(a.shape[:-1], steps))
        flat = np.lib.stride_tricks.as_strided(a, (span,), (item,))
    return flat, _row_offsets(a.shape[:-1], steps)


def _offsets_of(lead, steps):
    """The rows' offsets (elements) of an array of leading shape `lead` and strides `steps`
    (elements), C order, read-only."""
    offsets = np.zeros((), np.int64)
    for m, s in zip(lead, steps):
        offsets = np.add.outer(offsets, np.arange(m, dtype=np.int64) * s)
    offsets = offsets.reshape(-1)
    offsets.flags.writeable = False
    return offsets


KEEP_OFFSETS = 4096  # rows


def _row_offsets(lead, steps):
    """_offsets_of, kept (silkattn._cache) by layout up to KEEP_OFFSETS rows: a decoding step's views
    come back every step, and making their offsets would cost as much as the kernel; more rows cost
    the kernel far more than their offsets."""
    if math.prod(lead) > KEEP_OFFSETS:
        return _offsets_of(lead, steps)
    return _cache.get(("row offsets", lead, steps), lambda: _offsets_of(lead, steps))


def _rows_call(kernel, inputs, out, *extra):
    """kernel(flat, offsets of each input, flat, offsets of out, *extra) (_row_layout): an input
    the layout cannot express is copied; an out it cannot express (the caller's view, in place)
    gets the result in a temporary, copied back."""
    args = []
    for a in inputs:
        args += _row_layout(a) or _row_layout(np.ascontiguousarray(a))
    layout = _row_layout(out)
    target = out if layout is not None else np.empty(out.shape, out.dtype)
    kernel(*args, *(layout or _row_layout(target)), *extra)
    if target is not out:
        np.copyto(out, target)


def _same_view(a, b):
    """a and b are the same elements in the same layout."""
    return a is b or (a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype
                      and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def check_out_elementwise(out, shape, dtype, inputs):
    """check_out for an elementwise op, whose out may also be one of its inputs itself, in any
    layout (in place, e.g. on a strided view of a projection). Such an out must not overlap the
    other inputs, decided exactly: the two column halves of one array interleave but share nothing."""
    if not (isinstance(out, np.ndarray) and any(_same_view(out, a) for a in inputs)):
        return check_out(out, shape, dtype, inputs)
    if out.dtype != dtype:
        raise ValueError(f"out must have shape {tuple(shape)} and dtype {np.dtype(dtype)}, "
                         f"got {out.shape} and {out.dtype}")
    if not out.flags.writeable:
        raise ValueError("out must be writeable (it is an input, to be overwritten in place)")
    others = [a for a in inputs if not _same_view(out, a)]
    if any(np.may_share_memory(out, a) and np.shares_memory(out, a) for a in others):
        raise ValueError("out must not overlap an input array")
    return out


# ---------------------------------------------------------------- matmul_int8

INT8_MAX_K = (2 ** 31 - 1) // (128 * 128)  # the depth up to which no sum of int8 products leaves int32


def _as_int8(x, name):
    x = np.asarray(x)
    if x.dtype != np.int8:
        raise TypeError(f"{name} must be an int8 array, got dtype {x.dtype}")
    return x


def matmul_int8(kernels, A, B, *, out=None):
    A, B = _as_int8(A, "A"), _as_int8(B, "B")
    k, n = _product_shape(A, B, "A", "B")
    if k > INT8_MAX_K:
        raise ValueError(f"A's last axis (the depth) is {k}: over {INT8_MAX_K}, a sum of int8 products "
                         "can leave int32")
    out = check_out(out, A.shape[:-1] + (n,), np.int32, [A, B])
    rows = A.size // k if k else math.prod(A.shape[:-1])
    if kernels.matmul_int8 is None or not (rows and n and k):
        np.copyto(out, ref.matmul_int8(A, B))
        return out
    kernels.matmul_int8(np.ascontiguousarray(A).reshape(rows, k), np.ascontiguousarray(B),
                        out.reshape(rows, n), threads_for(rows * k * n, GEMM_WORK))
    return out


# ---------------------------------------------------------------- rms_norm

def prepare_rms_norm(X, g, eps, out, dtype=None):
    """Checked (X, g as an (n,) vector of the result dtype, eps, out)."""
    X = _last_axis(X, "X", "rms_norm", "the mean of no values is undefined")
    n = X.shape[-1]
    eps = check.positive(eps, "eps")
    dtype = np.result_type(X if dtype is None else dtype, as_float_array(g, "g"))
    g = _along_last_axis(g, n, dtype, "g")
    return X, g, eps, check_out(out, X.shape, dtype, [X, g])


def rms_norm(kernels, X, g, eps=1e-5, *, out=None):
    X, g, eps, out = prepare_rms_norm(X, g, eps, out)
    if not X.size:
        return out
    X = X.astype(out.dtype, copy=False)  # in the result dtype, as the kernels compute
    if kernels.rms_norm is None:
        np.copyto(out, ref.rms_norm(X, g, eps))
    else:
        kernels.rms_norm(_rows(X), g, eps, out.reshape(-1, X.shape[-1]), threads_for(X.size, ROW_WORK))
    return out


def add_rms_norm(kernels, X, R, g, eps=1e-5):
    X, R, sdtype = _residual(X, R)
    X, g, eps, out = prepare_rms_norm(X, g, eps, None, dtype=sdtype)
    if kernels.add_rms_norm is None or out.dtype != sdtype or not X.size:
        S = np.add(X, R, dtype=sdtype)
        return S, rms_norm(kernels, S, g, eps)
    S = np.empty(X.shape, sdtype)
    n = X.shape[-1]
    X, R = (_rows(a.astype(sdtype, copy=False)) for a in (X, R))
    kernels.add_rms_norm(X, R, g, eps, S.reshape(-1, n), out.reshape(-1, n), threads_for(S.size, ROW_WORK))
    return S, out


# ---------------------------------------------------------------- rope

def prepare_rope(X, positions, base, out, freq_factors=None):
    """Checked (X, positions, base, out, freq_factors); out may be X itself."""
    X = as_float_array(X, "X")
    if X.ndim < 2:
        raise ValueError(f"X must have at least 2 dimensions (..., seq, d_head), got shape {X.shape}")
    if X.shape[-1] % 2:
        raise ValueError(f"X's last axis d_head must be even (rope turns the pairs (x_i, x_(i + d_head/2))), "
                         f"got {X.shape[-1]}")
    positions = check.positions(positions, X.shape[-2])
    base = check.positive(base, "base")
    factors = check.freq_factors(freq_factors, X.shape[-1] // 2)
    return X, positions, base, check_out_elementwise(out, X.shape, X.dtype, [X]), factors


ROPE_TABLE_BYTES = 1 << 26  # the largest cos + sin pair kept; positions past it get tables of their own


def _rope_cos_sin(positions, base, half, dtype, factors=None):
    """cos and sin of the reference's angles, positions * base^(-i / half) / factors in float64, in
    the dtype."""
    inv_freq = float(base) ** (-np.arange(half) / half)
    if factors is not None:
        inv_freq = inv_freq / factors
    angle = np.asarray(positions, np.float64)[:, None] * inv_freq
    cos, sin = np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)
    cos.flags.writeable = sin.flags.writeable = False
    return cos, sin


def rope_tables(base, half, dtype, positions, factors=None):
    """(cos, sin, rows): the tables the kernels index and the table row of each position. The
    tables are the reference's own numbers, so the kernels only multiply and add, as it does; kept
    (silkattn._cache) per (base, half, dtype, factors) for positions 0 .. P - 1, P the next power of
    two past the farthest position (at least 256), so a decoding step that asks for one more
    position each time finds its tables kept."""
    top = int(positions.max())
    P = max(256, 1 << top.bit_length())
    dtype = np.dtype(dtype)
    if P * half * 2 * dtype.itemsize > ROPE_TABLE_BYTES:
        rows = np.arange(len(positions), dtype=np.int64)
        return *_rope_cos_sin(positions, base, half, dtype, factors), rows
    key = None if factors is None else factors.tobytes()
    tables = _cache.get(("rope tables", float(base), half, dtype.char, P, key),
                        lambda: _rope_cos_sin(np.arange(P), base, half, dtype, factors))
    return *tables, np.ascontiguousarray(positions, np.int64)


def rope(kernels, X, positions, base=10000.0, freq_factors=None, *, out=None):
    X, positions, base, out, factors = prepare_rope(X, positions, base, out, freq_factors)
    if not X.size:
        return out
    if kernels.rope is None:
        np.copyto(out, ref.rope(X, positions, base, factors))
        return out
    cos, sin, rows = rope_tables(base, X.shape[-1] // 2, X.dtype, positions, factors)
    _rows_call(kernels.rope, [X], out, cos, sin, rows, threads_for(X.size, ELEMENTWISE_WORK))
    return out


# ---------------------------------------------------------------- silu_mul

def silu_mul(kernels, G, U, *, out=None):
    return _gate(kernels.silu_mul, ref.silu, G, U, out)


def gelu_tanh_mul(kernels, G, U, *, out=None):
    return _gate(kernels.gelu_tanh_mul, ref.gelu_tanh, G, U, out)


def gate_mul(kernels, G, U, activation="silu", *, out=None):
    if activation not in ref.GATES:
        raise ValueError(f"activation must be one of {', '.join(map(repr, ref.GATES))}, got {activation!r}")
    return (silu_mul if activation == "silu" else gelu_tanh_mul)(kernels, G, U, out=out)


def _gate(kernel, act, G, U, out):  # out = act(G) U, by `kernel` (None: the reference's)
    G, U = as_float_array(G, "G"), as_float_array(U, "U")
    if G.shape != U.shape:
        raise ValueError(f"U must have the shape of G {G.shape}, got {U.shape}")
    dtype = np.result_type(G, U)
    out = check_out_elementwise(out, G.shape, dtype, [G, U])
    if not G.size:
        return out
    G, U = G.astype(dtype, copy=False), U.astype(dtype, copy=False)
    if kernel is None or G.ndim == 0:
        with np.errstate(over="ignore", invalid="ignore"):  # exp(-G) past the float range: inf, silu(G) -0
            np.copyto(out, act(G) * U)
        return out
    _rows_call(kernel, [G, U], out, G.shape[-1], threads_for(G.size, ELEMENTWISE_WORK))
    return out


# ---------------------------------------------------------------- layer_step

_F32 = np.dtype(np.float32)


def _read_only(a):
    """a read-only view of a (what a record only reads)."""
    v = a.view()
    v.flags.writeable = False
    return v


_EMPTY = _read_only(np.zeros(0, np.float32))


def _step_array(a, name, shape, dtype=_F32, writeable=False):
    """a as a C-contiguous ndarray of `dtype` and `shape`, or a TypeError or ValueError naming it."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of {np.dtype(dtype)}, got {type(a).__name__}")
    if a.dtype != dtype:
        raise TypeError(f"{name} must be {np.dtype(dtype)} (the fused step's dtype), got {a.dtype}")
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if writeable and not a.flags.writeable:
        raise ValueError(f"{name} must be writeable (the step writes it)")
    return a if writeable else _read_only(a)


def _step_norm(norm, name, d):
    """A Norm from g (RMSNorm) or (g, b) (LayerNorm)."""
    g, b = norm if isinstance(norm, tuple) and len(norm) == 2 else (norm, None)
    return _step_mod.Norm(_step_array(g, f"{name}'s gain", (d,)),
                          _EMPTY if b is None else _step_array(b, f"{name}'s bias", (d,)))


def _step_shape(W, name):
    """(k, n) of a product's matrix (W, or (W, b)): a float32 array or a QuantizedMatrix."""
    W = W[0] if isinstance(W, tuple) and len(W) == 2 else W
    if isinstance(W, list):  # parts side by side
        if not W:
            raise ValueError(f"{name} must be one matrix or a list of its parts side by side, got an "
                             "empty list")
        shapes = [_step_shape(P, f"{name}'s part {i}") for i, P in enumerate(W)]
        if len({k for k, _ in shapes}) > 1:
            raise ValueError(f"{name}'s parts must have one input width, got {shapes}")
        return shapes[0][0], sum(n for _, n in shapes)
    if isinstance(W, QuantizedMatrix):
        return W.shape
    if not isinstance(W, np.ndarray) or W.ndim != 2:
        raise TypeError(f"{name} must be a float32 (in, out) matrix or a QuantizedMatrix (or one with its "
                        f"bias, (W, b)), got {type(W).__name__} {getattr(W, 'shape', '')}")
    return W.shape


def _step_product(W, name, k, n):
    """A Product from a float32 (k, n) array or a QuantizedMatrix standing for one, or (W, b)."""
    W, b = W if isinstance(W, tuple) and len(W) == 2 else (W, None)
    if _step_shape(W, name) != (k, n):
        raise ValueError(f"{name} must stand for a ({k}, {n}) matrix, got {_step_shape(W, name)}")
    if isinstance(W, QuantizedMatrix):
        w, kind, matrix = _read_only(W.blocks), W.code, W
    else:
        w, kind, matrix = _step_array(W, name, (k, n)), _step_mod.DENSE, None
    return _step_mod.Product(w, kind, k, n, _EMPTY if b is None else _step_array(b, f"{name}'s bias", (n,)),
                             matrix)


KV_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))  # a fused step's cache: float32, or float16


def _step_cache(cache, h_kv, dh):
    """(K, V, head_stride, row_stride, capacity) of a layer's cache (K, V): each (h_kv, capacity, dh)
    (Llama's) or (capacity, h_kv dh) (the listing's, heads side by side), both float32 or both
    float16."""
    if not (isinstance(cache, (tuple, list)) and len(cache) == 2):
        raise TypeError(f"cache must be a layer's (K, V), got {type(cache).__name__}")
    K, V = cache
    shape = getattr(K, "shape", None)
    if shape is not None and len(shape) == 3 and shape[0] == h_kv and shape[2] == dh:
        capacity, strides = shape[1], (shape[1] * dh, dh)
    elif shape is not None and len(shape) == 2 and shape[1] == h_kv * dh:
        capacity, strides = shape[0], (dh, h_kv * dh)
    else:
        raise ValueError(f"cache's K must be ({h_kv}, capacity, {dh}) or (capacity, {h_kv * dh}), "
                         f"got {shape}")
    if capacity < 1:
        raise ValueError("cache must hold at least one position")
    dtype = getattr(K, "dtype", None)
    if dtype not in KV_DTYPES:
        raise TypeError(f"cache's K must be float32 or float16, got {dtype}")
    K, V = (_step_array(a, f"cache's {n}", shape, dtype, writeable=True) for a, n in ((K, "K"), (V, "V")))
    if np.shares_memory(K, V):
        raise ValueError("cache's K and V must not overlap")
    return K, V, *strides, capacity


def _step_scratch(scratch_of, sizes):
    """The step's buffers: scratch_of's (a LayerStep of the same sizes, its scores' rows at least as
    long: a model's layers share them, a ring's shorter cache among them), or new ones."""
    if scratch_of is not None:
        if not isinstance(scratch_of, _step_mod.LayerStep):
            raise TypeError(f"scratch_of must be a LayerStep, got {type(scratch_of).__name__}")
        shapes = tuple(a.shape for a in scratch_of.scratch.arrays)
        if shapes[:-1] != sizes[:-1] or shapes[-1][0] != sizes[-1][0] or shapes[-1][1] < sizes[-1][1]:
            raise ValueError("scratch_of's buffers are not this step's sizes: share them between the layers "
                             "of one model, the one with the longest cache made first")
        return scratch_of.scratch
    return _step_mod.Scratch(*(np.empty(size, np.float32) for size in sizes))


def layer_step_record(*, heads, norm1, qkv, o, norm2, up, down, cache, eps, kv_heads=None,
                      activation="relu", post_norm=False, rope_base=None, freq_factors=None, cross=None,
                      scratch_of=None, qk_norm=None, post_norms=None, window=None, positions=None,
                      scale=None):
    """The LayerStep of one decoder layer (silkattn._step: the fields and the arithmetic), checked
    once: each argument's shape against the others, a TypeError or ValueError naming the first that
    does not fit. See silkattn.ops.layer_step_record for the arguments."""
    h = check.count(heads, "heads")
    h_kv = h if kv_heads is None else check.count(kv_heads, "kv_heads")
    if h % h_kv:
        raise ValueError(f"heads={h} must be a multiple of kv_heads={h_kv} (grouped-query attention)")
    if activation not in _step_mod.GATES:
        raise ValueError(f"activation must be one of {', '.join(map(repr, _step_mod.GATES))}, "
                         f"got {activation!r}")
    gate = _step_mod.GATES[activation]
    (hd, d), d_in = _step_shape(o, "o"), _step_shape(qkv, "qkv")[0]
    if hd % h or d_in != d:
        raise ValueError(f"o must be (heads x head width, d) and qkv (d, ...): got o {(hd, d)} for {h} heads "
                         f"and qkv's input {d_in}")
    dh = hd // h
    n_up = _step_shape(up, "up")[1]
    dff = n_up // 2 if gate else n_up
    if gate and n_up % 2:
        raise ValueError(f"up must have an even number of outputs for {activation} (gate | up), got {n_up}")
    q8 = _step_q8((qkv, o, up, down) + ((cross.get("q"), cross.get("o")) if hasattr(cross, "get") else ()))
    qkv, o = _step_parts(qkv, "qkv", d, (h + 2 * h_kv) * dh, 3), _step_product(o, "o", h * dh, d)
    up, down = _step_parts(up, "up", d, n_up, 2), _step_product(down, "down", dff, d)
    norm1, norm2 = _step_norm(norm1, "norm1", d), _step_norm(norm2, "norm2", d)
    q_norm, k_norm = _step_rms_pair(qk_norm, "qk_norm", dh)
    post1, post2 = _step_rms_pair(post_norms, "post_norms", d)
    if post_norm and post1.g.size:
        raise ValueError("post_norms (sandwich norms) go with the pre-norm placement, not post_norm")
    K, V, head_stride, row_stride, capacity = _step_cache(cache, h_kv, dh)
    window = 0 if window is None else check.count(window, "window")
    ring = bool(window) and capacity == window
    positions = capacity if positions is None else check.count(positions, "positions")
    if positions != capacity and not ring:
        raise ValueError(f"positions={positions} differs from the cache's {capacity}: only a ring (a "
                         f"cache of window={window or None} positions) holds fewer rows than positions")
    cos, sin = _step_rope(rope_base, freq_factors, dh, positions)
    memory = _step_cross(cross, h, h_kv, dh, d)
    products = qkv + (o,) + up + (down,) + ((memory[1], memory[2]) if cross is not None else ())
    if any(W.b.size for W in (o, down, memory[2]) if W.kind != _step_mod.DENSE):
        raise ValueError("o, down and cross's o add the residual: as GGUF block products they take no bias "
                         "of their own")
    norms = (norm1, norm2) + ((memory[0],) if cross is not None else ())
    eps = (check.positive if all(not N.b.size for N in norms) else check.nonnegative)(eps, "eps")
    scale = 1 / np.sqrt(dh) if scale is None else check.positive(scale, "scale")
    n_src = len(memory[3])
    sizes = (((h + 2 * h_kv) * dh,), (h * dh,), (max(d, dff),), (max(n_up, d),), (h, max(capacity, n_src)))
    return _step_mod.LayerStep(
        d=d, h=h, h_kv=h_kv, dh=dh, eps=eps, post_norm=bool(post_norm), gate=gate, q8=q8,
        norm1=norm1, qkv=qkv, o=o, norm2=norm2, up=up, down=down, q_norm=q_norm, k_norm=k_norm, post1=post1,
        post2=post2, scale=float(scale), window=window, ring=ring, positions=positions, K=K, V=V,
        head_stride=head_stride, row_stride=row_stride, capacity=capacity, cos=cos, sin=sin,
        has_cross=cross is not None, norm_cross=memory[0], cross_q=memory[1], cross_o=memory[2],
        Km=memory[3], Vm=memory[4], keep=memory[5], scratch=_step_scratch(scratch_of, sizes),
        work=sum(W.k * W.n for W in products))


def _step_rope(rope_base, freq_factors, dh, positions):
    """The rotary tables (positions, dh / 2) of rope_base, or empty ones (no rotary)."""
    if rope_base is None:
        if freq_factors is not None:
            raise ValueError("freq_factors needs rope_base (they divide its frequencies)")
        return _EMPTY.reshape(0, 0), _EMPTY.reshape(0, 0)
    if dh % 2:
        raise ValueError(f"rope_base needs an even head width, got {dh}")
    cos, sin, _ = rope_tables(check.positive(rope_base, "rope_base"), dh // 2, _F32, np.arange(positions),
                              check.freq_factors(freq_factors, dh // 2))
    return cos, sin


def _step_rms_pair(pair, name, n):
    """Two RMSNorm gains of n (a pair of norms: QK-norm, sandwich norms), or empty Norms for None."""
    if pair is None:
        return _NO_NORM, _NO_NORM
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise TypeError(f"{name} must be a pair of RMSNorm gains or None, got {type(pair).__name__}")
    return tuple(_step_mod.Norm(_step_array(g, f"{name}[{i}]", (n,)), _EMPTY) for i, g in enumerate(pair))


def _step_parts(W, name, k, n, most):
    """The Products of a matrix given whole (W or (W, b)) or as a list of parts side by side ([W1,
    W2, ...] or ([W1, W2, ...], b)): parts whose blocks differ in type, each multiplied as it is."""
    W, b = W if isinstance(W, tuple) and len(W) == 2 else (W, None)
    parts = list(W) if isinstance(W, list) else [W]
    if not 1 <= len(parts) <= most:
        raise ValueError(f"{name} must be one matrix or a list of 1 to {most} parts, got {len(parts)}")
    widths = [_step_shape(P, f"{name}'s part {i}")[1] for i, P in enumerate(parts)]
    if sum(widths) != n:
        raise ValueError(f"{name}'s parts must stand for a ({k}, {n}) matrix, got outputs {widths}")
    b = None if b is None else _step_array(b, f"{name}'s bias", (n,))
    edges = np.cumsum([0] + widths)
    out = tuple(_step_product(P if b is None else (P, np.ascontiguousarray(b[lo:hi])), f"{name}'s part {i}",
                              k, hi - lo) for i, (P, lo, hi) in enumerate(zip(parts, edges, edges[1:])))
    if len({P.kind == _step_mod.DENSE for P in out}) > 1:
        raise ValueError(f"{name}'s parts must be all float32 or all GGUF blocks")
    return out


_NO_PRODUCT = _step_mod.Product(_EMPTY.reshape(0, 0), _step_mod.DENSE, 0, 0, _EMPTY)
_NO_NORM = _step_mod.Norm(_EMPTY, _EMPTY)
_NO_CROSS = (_NO_NORM, _NO_PRODUCT, _NO_PRODUCT, _EMPTY.reshape(0, 0),
             _EMPTY.reshape(0, 0), _read_only(np.zeros(0, np.uint8)))


def _step_cross(cross, h, h_kv, dh, d):
    """(norm, q, o, Km, Vm, keep) of the cross-attention: cross = {"norm", "q", "o", "memory": (Km, Vm),
    "keep": (n_src,) or None}, the memory (n_src, d) with heads side by side; or placeholders."""
    if cross is None:
        return _NO_CROSS
    if not hasattr(cross, "keys"):
        raise TypeError(f"cross must be a dict (norm, q, o, memory, keep) or None, "
                        f"got {type(cross).__name__}")
    missing = [k for k in ("norm", "q", "o", "memory") if k not in cross]
    if missing:
        raise ValueError(f"cross lacks {', '.join(missing)}: the cross-attention's norm, q, o and memory "
                         "(K, V)")
    if h_kv != h or h * dh != d:
        raise ValueError(f"cross-attention takes heads of d / heads over the memory: got {h} heads of {dh}, "
                         f"{h_kv} K/V heads and d = {d}")
    Km, Vm = cross["memory"]
    n_src = getattr(Km, "shape", (0,))[0]
    if n_src < 1:
        raise ValueError("cross's memory must hold at least one key")
    Km, Vm = (_step_array(a, f"cross's memory {n}", (n_src, d)) for a, n in ((Km, "K"), (Vm, "V")))
    keep = cross.get("keep")
    keep = np.ones(n_src, np.uint8) if keep is None else np.asarray(keep)
    if keep.shape != (n_src,) or keep.dtype.kind not in "biu":
        raise ValueError(f"cross's keep must be a ({n_src},) boolean mask of the memory's keys, "
                         f"got {keep.dtype} {keep.shape}")
    return (_step_norm(cross["norm"], "cross's norm", d), _step_product(cross["q"], "cross's q", d, d),
            _step_product(cross["o"], "cross's o", d, d), Km, Vm, _read_only((keep != 0).astype(np.uint8)))


def _step_q8(matrices):
    """Whether the block products round their input to 8 bits: the QuantizedMatrices' activations,
    one kind for all of a step's."""
    matrices = [W[0] if isinstance(W, tuple) else W for W in matrices]
    matrices = [P for W in matrices for P in (W if isinstance(W, list) else [W])]
    activations = {W.activations for W in matrices if isinstance(W, QuantizedMatrix)}
    if len(activations) > 1:
        raise ValueError(f"a step's QuantizedMatrices take one kind of activations, "
                         f"got {sorted(activations)}")
    return activations == {"int8"}


def layer_step(kernels, step, x, pos):
    """x (d,) float32 through one layer at position pos, in place (silkattn._step's arithmetic):
    Kernels.layer_step, or where the backend has none the same step as separate ops."""
    if not isinstance(step, _step_mod.LayerStep):
        raise TypeError(f"step must be a LayerStep (silkattn.ops.layer_step_record), "
                        f"got {type(step).__name__}")
    if type(x) is not np.ndarray or x.dtype != _F32 or x.shape != (step.d,) \
            or not x.flags.c_contiguous or not x.flags.writeable:
        raise ValueError(f"x must be a writeable C-contiguous float32 array of shape ({step.d},) (the "
                         f"residual row, updated in place), got {type(x).__name__} {getattr(x, 'dtype', '')} "
                         f"{getattr(x, 'shape', '')}")
    pos = check.count(pos, "pos", minimum=0)
    if pos >= step.positions:
        raise ValueError(f"pos={pos} is past the {step.positions} positions the step was made for"
                         + ("" if step.ring else " (the cache's)"))
    if step.prepared.get("x") is not x:  # the last row seen passed
        written = step.prepared.get("written")
        if written is None:  # the byte ranges of what the step writes (C-contiguous arrays)
            written = step.prepared["written"] = [(_address(a), _address(a) + a.nbytes)
                                                  for a in (step.K, step.V, *step.scratch.arrays)]
        lo = _address(x)
        if any(lo < hi and a < lo + x.nbytes for a, hi in written):
            raise ValueError("x must not overlap the step's cache or scratch")
        step.prepared["x"] = x
    if kernels.layer_step is None:
        _layer_step_ops(kernels, step, x, pos)
    else:
        kernels.layer_step(step, x, pos, threads_for(step.work, LINEAR_WORK))
    return x


def _address(a):
    return a.__array_interface__["data"][0]


def layer_step_rows(kernels, step, X, positions, K_pages, V_pages, pages):
    """X (m, d) through one layer in place, or through the layers of a list of records in turn
    (K_pages and V_pages then lists of their pools, one pair a record), row r at positions[r] over
    page pages[r] of the pools (ops.layer_step_rows): one Kernels.layer_step_rows call for all the
    layers, or each row through the ops over its page."""
    if isinstance(step, _step_mod.LayerStep):
        steps, Ks, Vs = [step], [K_pages], [V_pages]
    elif isinstance(step, (list, tuple)) and isinstance(K_pages, (list, tuple)) \
            and isinstance(V_pages, (list, tuple)):
        steps, Ks, Vs = list(step), list(K_pages), list(V_pages)
        if not steps or len(Ks) != len(steps) or len(Vs) != len(steps):
            raise ValueError(f"K_pages and V_pages must be lists of one pool a record ({len(steps)} "
                             f"records), got {len(Ks)} and {len(Vs)}")
    else:
        raise TypeError(f"step must be a LayerStep (silkattn.ops.layer_step_record) or a list of them "
                        f"(K_pages and V_pages then lists too), got {type(step).__name__}")
    for L in steps:
        if not isinstance(L, _step_mod.LayerStep):
            raise TypeError(f"step must be a LayerStep (silkattn.ops.layer_step_record), got "
                            f"{type(L).__name__}")
    d = steps[0].d
    if type(X) is not np.ndarray or X.dtype != _F32 or X.ndim != 2 or X.shape[1] != d \
            or not X.flags.c_contiguous or not X.flags.writeable:
        raise ValueError(f"X must be a writeable C-contiguous float32 array of shape (rows, {d}), got "
                         f"{type(X).__name__} {getattr(X, 'dtype', '')} {getattr(X, 'shape', '')}")
    positions, pages = _index_rows(positions, "positions", len(X)), _index_rows(pages, "pages", len(X))
    rows, last, x_at = [], None, _address(X)
    for L, K, V in zip(steps, Ks, Vs):
        rows.append(_layer_rows(L, X, x_at, positions, K, V, pages, last))
        last = L, rows[-1]
    if kernels.layer_step_rows is None:
        for L, K, V, (positions_, pages_, *_) in zip(steps, Ks, Vs, rows):
            _layer_step_rows_ops(kernels, L, X, positions_, K, V, pages_)
        return X
    kernels.layer_step_rows(steps, X, [r[2] for r in rows], [K.reshape(-1) for K in Ks],
                            [V.reshape(-1) for V in Vs], [r[3] for r in rows], [r[4] for r in rows],
                            threads_for(max(L.work for L in steps), LINEAR_WORK))
    return X


def _layer_rows(step, X, x_at, positions, K_pages, V_pages, pages, last):  # -> positions, pages, at, cos, sin
    """One record's part of layer_step_rows, checked (x_at: X's address; positions, pages: int64 (m,);
    last: the previous record and its result, whose rows are taken again where its keys and rotary
    tables are the same: each layer of a model's step would give the same ones)."""
    if step.d != X.shape[1] or not step.prepared.get("rows_record"):  # the record's kind: checked once
        if step.post_norm or step.has_cross or not step.gated or step.d != X.shape[1] \
                or any(P.kind == _step_mod.DENSE for P in step.products):
            raise ValueError("step must be a Llama-family layer's record (block products, pre-norm, a "
                             "gated feed-forward, no cross-attention; all of X's width) for layer_step_rows")
        step.prepared["rows_record"] = True
    page_shape = (step.h_kv, step.capacity, step.dh)
    for name, a in (("K_pages", K_pages), ("V_pages", V_pages)):
        if type(a) is not np.ndarray or a.dtype != step.K.dtype or a.ndim != 4 or a.shape[1:] != page_shape \
                or not a.flags.c_contiguous or not a.flags.writeable \
                or (step.head_stride, step.row_stride) != (step.capacity * step.dh, step.dh):
            raise ValueError(f"{name} must be a writeable C-contiguous {step.K.dtype} array (n_pages, "
                             f"{', '.join(map(str, page_shape))}) of caches laid out as the record's, got "
                             f"{getattr(a, 'dtype', '')} {getattr(a, 'shape', type(a).__name__)}")
    if K_pages.shape != V_pages.shape:
        raise ValueError(f"V_pages must have K_pages' shape {K_pages.shape}, got {V_pages.shape}")
    if last is not None and _rows_key(last[0]) == _rows_key(step) and len(K_pages) == last[1][5]:
        same = last[0].cos is step.cos and last[0].sin is step.sin
        positions, pages, at, cos, sin, _ = last[1]
        if not same:
            cos, sin = _rotary_rows(step, positions)
    else:
        positions, pages, at, cos, sin = _rows_of(step, positions, pages, len(X), len(K_pages))
    # X's bytes against the pools' and the scratch's (X, K and V are contiguous: a range each; every
    # step's X is a new array, so this is a step's cost: numpy's may_share_memory took 0.3 ms of it)
    spans = step.prepared.get("rows_scratch")
    if spans is None:
        spans = step.prepared["rows_scratch"] = [byte_bounds(a) for a in step.scratch.arrays]
    k_at, v_at, x_end = _address(K_pages), _address(V_pages), x_at + X.nbytes
    if any(lo < x_end and x_at < hi for lo, hi in (*spans, (k_at, k_at + K_pages.nbytes),
                                                   (v_at, v_at + V_pages.nbytes))):
        raise ValueError("X must not overlap the pools or the step's scratch")
    return positions, pages, at, cos, sin, len(K_pages)


def _rows_key(step):  # what a record's rows (_rows_of's at) depend on besides the positions and pages
    return step.positions, step.ring, step.window, step.capacity, step.h_kv, step.dh


_NO_ROWS = np.zeros((0, 1), np.float32)


def _rows_of(step, positions, pages, m, n_pages):  # -> positions, pages, at (m, 4), cos, sin
    """layer_step_rows' checked rows (int64 (m,) each) and what the kernel reads of them: at[r] = the
    cache row of positions[r], the first row its query sees, the rows seen, and its page's first
    element; cos, sin: its rotary rows. The checks and at are kept by value (silkattn._cache,
    read-only): a batch's steps come back to the same rows."""
    key = ("layer_step_rows", positions.tobytes(), pages.tobytes(), n_pages, *_rows_key(step))
    positions, pages, at = _cache.get(key, lambda: _checked_rows(step, positions, pages, m, n_pages))
    return (positions, pages, at, *_rotary_rows(step, positions))


def _rotary_rows(step, positions):  # -> cos, sin (m, dh / 2): the record's rotary rows of the positions
    rope = step.cos.size != 0
    return tuple(t[positions] if rope else _NO_ROWS for t in (step.cos, step.sin))


def _checked_rows(step, positions, pages, m, n_pages):  # -> positions, pages, at: read-only copies
    if m and (positions.min() < 0 or positions.max() >= step.positions):
        raise ValueError(f"positions must lie in 0 .. {step.positions - 1} (the record's), got {positions}")
    if m and (pages.min() < 0 or pages.max() >= n_pages):
        raise ValueError(f"pages must name pages of the pools' {n_pages}, got {pages}")
    if len(np.unique(pages)) != m:
        raise ValueError(f"pages must be distinct (each row a sequence over a cache of its own), got {pages}")
    page_at = pages * (step.h_kv * step.capacity * step.dh)  # elements to each row's page
    rows = (positions.copy(), pages.copy(), np.concatenate([step.keys_rows(positions), page_at[:, None]], 1))
    for a in rows:  # shared by the calls that hit
        a.flags.writeable = False
    return rows


def _index_rows(a, name, m):  # -> int64 (m,): one integer a row
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {a.dtype}")
    if a.shape != (m,):
        raise ValueError(f"{name} must have shape ({m},), one a row of X, got {a.shape}")
    return a.astype(np.int64, copy=False)


def _record_norm(kernels, L, N, v):  # a record's norm of v (..., d)
    return layer_norm(kernels, v, N.g, N.b, L.eps) if N.b.size else rms_norm(kernels, v, N.g, L.eps)


def _record_product(kernels, L, P, v):  # v (..., k) through a record's product, or its parts side by side
    if isinstance(P, tuple):
        return np.concatenate([_record_product(kernels, L, part, v) for part in P], -1)
    W = P.w if P.kind == _step_mod.DENSE else QuantizedMatrix(quant.KINDS[P.kind], P.w,
                                                              "int8" if L.q8 else "float32")
    return linear(kernels, v, W, P.b if P.b.size else None)


def _layer_step_rows_ops(kernels, L, X, positions, K_pages, V_pages, pages):
    """layer_step_rows as ops (a backend without the fused kernel), X in place: each product one
    call for all the rows, each row's heads and attention over its own page (_step_attention)."""
    own = [dataclasses.replace(L, K=K_pages[p], V=V_pages[p], prepared={}) for p in pages]

    def sublayer(f, N, post):
        F = f(_record_norm(kernels, L, N, X))
        X[:] = X + (rms_norm(kernels, F, post.g, L.eps) if post.g.size else F)

    def attend(v):
        qkv = _record_product(kernels, L, L.qkv, v)
        return np.stack([_step_attention(kernels, R, q, int(p)) for R, q, p in zip(own, qkv, positions)])

    def ffn(v):
        u = _record_product(kernels, L, L.up, v)
        act = "silu" if L.gate == _step_mod.GATE_SILU else "gelu_tanh"
        return _record_product(kernels, L, L.down, gate_mul(kernels, u[:, :L.d_ff], u[:, L.d_ff:], act))
    sublayer(lambda v: _record_product(kernels, L, L.o, attend(v)), L.norm1, L.post1)
    sublayer(ffn, L.norm2, L.post2)


def _layer_step_ops(kernels, L, x, pos):
    """layer_step as the separate ops of `kernels` (a backend without the fused kernel), x in place."""
    def norm(N, v):
        return _record_norm(kernels, L, N, v)

    def product(P, v):
        return _record_product(kernels, L, P, v)

    def sublayer(f, N, post=_NO_NORM):
        if L.post_norm:
            x[:] = norm(N, x + f(x))
        else:
            F = f(norm(N, x))
            x[:] = x + (norm(post, F) if post.g.size else F)

    sublayer(lambda v: product(L.o, _step_attention(kernels, L, product(L.qkv, v), pos)), L.norm1, L.post1)
    if L.has_cross:
        sublayer(lambda v: product(L.cross_o, _step_attention(kernels, L, product(L.cross_q, v), None)),
                 L.norm_cross)

    def ffn(v):
        u = product(L.up, v)
        if not L.gated:
            return product(L.down, np.maximum(u, 0))
        act = "silu" if L.gate == _step_mod.GATE_SILU else "gelu_tanh"
        return product(L.down, gate_mul(kernels, u[:L.d_ff], u[L.d_ff:], act))
    sublayer(ffn, L.norm2, L.post2)


def _step_attention(kernels, L, qkv, pos):
    """The attention of _layer_step_ops: self-attention of the token at pos (QK-norm, rotary, its
    cache row written, the rows it sees read), or (pos None) the cross-attention over the memory."""
    h, h_kv, dh = L.h, L.h_kv, L.dh
    heads = qkv.reshape(-1, dh)
    if pos is None:
        Km, Vm = (a.reshape(-1, h, dh).swapaxes(0, 1) for a in (L.Km, L.Vm))
        a = attention(kernels, heads[:, None], Km, Vm, L.keep.astype(bool), scale=L.scale)
        return a.reshape(-1)
    if L.q_norm.g.size:
        heads[:h] = rms_norm(kernels, heads[:h], L.q_norm.g, L.eps)
        heads[h:h + h_kv] = rms_norm(kernels, heads[h:h + h_kv], L.k_norm.g, L.eps)
    if L.cos.size:  # reference.rope's arithmetic on the tables' row
        c, s, half = L.cos[pos], L.sin[pos], dh // 2
        x1, x2 = heads[:h + h_kv, :half].copy(), heads[:h + h_kv, half:].copy()
        heads[:h + h_kv, :half], heads[:h + h_kv, half:] = x1 * c - x2 * s, x2 * c + x1 * s
    item = L.K.itemsize
    strides = (L.head_stride * item, L.row_stride * item, item)
    K, V = (np.lib.stride_tricks.as_strided(a, (h_kv, L.capacity, dh), strides) for a in (L.K, L.V))
    row, lo, n = L.keys(pos)
    K[:, row], V[:, row] = heads[h:h + h_kv], heads[h + h_kv:]  # a float16 cache: rounded to nearest even
    q = heads[:h].reshape(h_kv, h // h_kv, dh)  # a group's query heads: the rows of its K/V head's attention
    K, V = (a[:, lo:lo + n].astype(np.float32, copy=False) for a in (K, V))  # float16 widened exactly
    return attention(kernels, q, K, V, scale=L.scale).reshape(-1)
