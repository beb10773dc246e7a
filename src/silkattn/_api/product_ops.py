"""The products' bookkeeping and NumPy fallbacks: linear (float or quantized weights, a few rows
or a GEMM on silkattn's team), bias_relu, bias_gelu and matmul_int8."""
import math

import numpy as np

from .. import _blas, quant
from .. import reference as ref
from .._threads import ELEMENTWISE_WORK, LINEAR_WORK, threads_for
from ..quant import QuantizedMatrix
from .common import FLOATS, _along_last_axis, _rows, as_float_array, check_out

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
