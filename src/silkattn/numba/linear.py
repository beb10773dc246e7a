"""Numba y = x W (+ b) for a few rows of x: the matrix-vector products of a decoding step.

A matrix-vector product reads every weight once and does two flops with it, so it runs at the
speed memory streams W: the kernels walk W in its storage order (no transposed copies) and keep
the few rows of y in cache. linear_rows splits W's rows among the threads, each summing into its
own partial result; linear_dots (y = x W^T) gives the threads blocks of outputs. For many rows,
gemm runs numpy's OpenBLAS sgemm on silkattn's own team, a panel of columns a thread.
"""
import ctypes

import numba
import numpy as np
from numba import prange

from ._jit import jit
from ._simd import CACHE, FASTMATH, hsum, vfma, vget, vload, vsplat, vstore, vsum4, vwidth

DOT_BLOCK = 64  # outputs per task of linear_dots


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def linear_rows(x, w, partial):
    """partial[t] = x[:, rows_t] w[rows_t, :] for the len(partial) shares rows_t of w's rows; the
    caller adds the shares up. x: (m, k), w: (k, n), partial: (T, m, n), all C-contiguous."""
    m, k = x.shape
    n = w.shape[1]
    T = partial.shape[0]
    W = vwidth(w)
    nv = n - n % W
    xf = x.reshape(-1)
    wf = w.reshape(-1)
    for t in prange(T):
        y = partial[t].reshape(-1)
        for c in range(m * n):
            y[c] = 0
        i = t * k // T
        i1 = (t + 1) * k // T
        while i + 4 <= i1:  # four rows of w per pass over y
            for r in range(m):
                a0 = vsplat(w, xf[r * k + i])
                a1 = vsplat(w, xf[r * k + i + 1])
                a2 = vsplat(w, xf[r * k + i + 2])
                a3 = vsplat(w, xf[r * k + i + 3])
                for c in range(0, nv, W):
                    acc = vfma(a0, vload(wf, i * n + c), vload(y, r * n + c))
                    acc = vfma(a1, vload(wf, (i + 1) * n + c), acc)
                    acc = vfma(a2, vload(wf, (i + 2) * n + c), acc)
                    vstore(y, r * n + c, vfma(a3, vload(wf, (i + 3) * n + c), acc))
                for c in range(nv, n):
                    for u in range(4):
                        y[r * n + c] += xf[r * k + i + u] * wf[(i + u) * n + c]
            i += 4
        while i < i1:
            for r in range(m):
                a0 = vsplat(w, xf[r * k + i])
                for c in range(0, nv, W):
                    vstore(y, r * n + c, vfma(a0, vload(wf, i * n + c), vload(y, r * n + c)))
                for c in range(nv, n):
                    y[r * n + c] += xf[r * k + i] * wf[i * n + c]
            i += 1


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def linear_dots(x, w, out):
    """out[r, j] = x[r, :] . w[j, :] (out = x w^T). x: (m, k), w: (n, k), out: (m, n), C-contiguous.
    Four outputs at a time, their dot products summed as one vector (vsum4)."""
    m, k = x.shape
    n = w.shape[0]
    W = vwidth(w)
    kv = k - k % W
    xf = x.reshape(-1)
    wf = w.reshape(-1)
    of = out.reshape(-1)
    for blk in prange((n + DOT_BLOCK - 1) // DOT_BLOCK):
        j = blk * DOT_BLOCK
        j1 = min(n, j + DOT_BLOCK)
        while j + 4 <= j1:
            for r in range(m):
                c0 = vsplat(w, 0)
                c1 = c0
                c2 = c0
                c3 = c0
                for d in range(0, kv, W):
                    xv = vload(xf, r * k + d)
                    c0 = vfma(xv, vload(wf, j * k + d), c0)
                    c1 = vfma(xv, vload(wf, (j + 1) * k + d), c1)
                    c2 = vfma(xv, vload(wf, (j + 2) * k + d), c2)
                    c3 = vfma(xv, vload(wf, (j + 3) * k + d), c3)
                s = vsum4(c0, c1, c2, c3)
                for u in range(4):
                    acc = vget(s, u)
                    for d in range(kv, k):
                        acc += xf[r * k + d] * wf[(j + u) * k + d]
                    of[r * n + j + u] = acc
            j += 4
        while j < j1:
            for r in range(m):
                c0 = vsplat(w, 0)
                for d in range(0, kv, W):
                    c0 = vfma(vload(xf, r * k + d), vload(wf, j * k + d), c0)
                acc = hsum(c0)
                for d in range(kv, k):
                    acc += xf[r * k + d] * wf[j * k + d]
                of[r * n + j] = acc
            j += 1


# ---- many rows: x W on silkattn's own team, one call of numpy's OpenBLAS sgemm a panel of out's
# columns a thread (the library held at one thread: silkattn._blas), as kernels/gemm.h does in C.

if numba.config.DISABLE_JIT:
    def _sgemm(fn, ilp64, transb, dims, a, b, c):
        """The CBLAS sgemm at address fn: C (m, n) = A (m, k) op(B), row-major, the pointers a, b, c
        as ints, dims = (m, n, k, lda, ldb, ldc); op(B) = B^T if transb; 64-bit integers if ilp64."""
        i = ctypes.c_int64 if ilp64 else ctypes.c_int32
        p, f, e = ctypes.c_void_p, ctypes.c_float, ctypes.c_int
        call = ctypes.CFUNCTYPE(None, e, e, e, i, i, i, f, p, i, p, i, f, p, i)(fn)
        m, n, k, lda, ldb, ldc = dims
        call(101, 111, 112 if transb else 111, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc)
else:
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def _sgemm(typingctx, fn, ilp64, transb, dims, a, b, c):
        """The CBLAS sgemm at address fn (see the pure-Python version above), called through the
        address passed in (so the compiled code holds none and can be cached)."""
        if not (isinstance(dims, types.UniTuple) and len(dims) == 6):
            return None

        def codegen(context, builder, sig, args):
            fn, ilp64, transb, dims, a, b, c = args
            i32, f32 = ir.IntType(32), ir.FloatType()
            ptr = f32.as_pointer()
            sizes = [builder.extract_value(dims, u) for u in range(6)]

            def call(width):
                it = ir.IntType(width)
                fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, it, it, it, f32, ptr, it, ptr, it, f32,
                                                       ptr, it])
                m, n, k, lda, ldb, ldc = (builder.trunc(v, it) if width == 32 else v for v in sizes)
                tb = builder.select(transb, i32(112), i32(111))
                builder.call(builder.inttoptr(fn, fnty.as_pointer()),
                             [i32(101), i32(111), tb, m, n, k, f32(1.0), builder.inttoptr(a, ptr), lda,
                              builder.inttoptr(b, ptr), ldb, f32(0.0), builder.inttoptr(c, ptr), ldc])
            with builder.if_else(ilp64) as (wide, narrow):
                with wide:
                    call(64)
                with narrow:
                    call(32)
            return context.get_dummy_value()
        return types.void(types.int64, types.boolean, types.boolean, dims, types.int64, types.int64,
                          types.int64), codegen


GEMM_PANEL = 64  # the fewest columns a thread's panel of a GEMM gets; panels start on 16 columns


@jit(cache=CACHE)
def _share(n, nthreads):
    """(panels, columns a panel) of a GEMM of n columns on nthreads threads."""
    T = max(1, min(nthreads, n // GEMM_PANEL))
    return T, ((n + T - 1) // T + 15) // 16 * 16


@jit(cache=CACHE, parallel=True)
def gemm(x, w, out, transposed, sgemm, ilp64, nthreads):
    """out = x w (w: (k, n)) or x w^T (transposed; w: (n, k)), float32, C-contiguous, for many rows
    of x (m, k): each of the threads one call of the BLAS's sgemm (at address sgemm) on its panel
    of out's columns (kernels/linear.pyx's gemm: the same panels, so the same numbers as it at the same
thread count; against numpy's whole matmul, within the tolerance table: docs/kernels.md)."""
    m, k = x.shape
    n = out.shape[1]
    T, share = _share(n, nthreads)
    xa, wa, oa = np.int64(x.ctypes.data), np.int64(w.ctypes.data), np.int64(out.ctypes.data)
    for t in prange(T):
        j0 = t * share
        j1 = min(n, j0 + share)
        if j0 < j1:
            if transposed:
                _sgemm(sgemm, ilp64, transposed, (m, j1 - j0, k, k, k, n), xa, wa + j0 * k * 4, oa + j0 * 4)
            else:
                _sgemm(sgemm, ilp64, transposed, (m, j1 - j0, k, k, n, n), xa, wa + j0 * 4, oa + j0 * 4)
