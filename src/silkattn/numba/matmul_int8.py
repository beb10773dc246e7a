"""The Numba integer GEMM: C = A B in int32 for int8 A (m, k) and B (k, n), exact (k <= 131071,
_api.INT8_MAX_K).

LLVM makes int32 multiply-adds of sign-extended bytes of these loops (vpmovsxbd, vpmulld), not the
byte dot-product instructions (vpdpbusd, vpmaddwd) the Cython copy runs, so this is several times
slower than it (36 against 127 G multiply-adds a second, 256 x 576 -> 1536 on two Zen 4 cores): the
twin is for checking and for machines without the C kernels. An @intrinsic in _simd.py calling
LLVM's llvm.x86.avx512.vpdpbusd.512, gated on the CPU's features, could reach the instruction; not
done yet. Each thread owns blocks of ROWS rows and its own row of sums."""
import numpy as np
from numba import prange

from ._jit import jit
from ._simd import CACHE

ROWS = 4  # rows of A that share each load of a row of B


@jit(cache=CACHE, parallel=True)
def _matmul_int8(A, B, out, nthreads):
    m, k = A.shape
    n = B.shape[1]
    blocks = (m + ROWS - 1) // ROWS
    for p in prange(nthreads):
        acc = np.empty((ROWS, n), np.int32)  # the thread's own sums
        for blk in range(p * blocks // nthreads, (p + 1) * blocks // nthreads):
            i0 = blk * ROWS
            rows = min(ROWS, m - i0)
            acc[:] = 0
            for t in range(k):
                b = B[t]
                for r in range(rows):
                    a = np.int32(A[i0 + r, t])
                    row = acc[r]
                    for j in range(n):
                        row[j] += a * np.int32(b[j])
            for r in range(rows):
                out[i0 + r, :] = acc[r]


def matmul_int8(A, B, out, nthreads):
    """out = A B (see the module); the operands as the kernel contract gives them (checked by the
    driver)."""
    _matmul_int8(A, B, out, nthreads)
