"""C = A B in int32 for int8 A (m, k) and B (k, n), exact: the integer GEMM (tmpl_matmul_int8.h), and
the machine's int8 multiply-add peak measured with the instruction it runs."""
import time

from cython.parallel cimport parallel, prange
from libc.stdint cimport int8_t, int32_t, int64_t
from libc.stdlib cimport free

include "common.pxi"

cdef extern from "matmul_int8.h" nogil:
    void sa_i8_layout_f32(int isa, int64_t *facts)
    void sa_i8_pack_a_f32(int isa, const int8_t *A, int64_t lda, int64_t r0, int64_t r1, int64_t k, int64_t kp,
                          void *ap)
    void sa_i8_panel_f32(int isa, const void *ap, int64_t i0, int64_t i1, int64_t k, int64_t kp, const int8_t *B,
                         int64_t ldb, int64_t j, int cols, int32_t *C, int64_t ldc, void *scratch, int pack)
    int64_t sa_i8_scratch(int isa, int64_t kp)
    int64_t sa_i8_peak(int isa, int64_t iters, int32_t *sink)
    bint sa_i8_vnni(int isa)

cdef int64_t _facts[4]
sa_i8_layout_f32(ISA, _facts)
cdef Py_ssize_t DK = _facts[0], NR = _facts[1], MR = _facts[2], A_BYTES = _facts[3]
# the instruction the products run on, by copy
INSTRUCTION = ("vpdpbusd" if sa_i8_vnni(ISA) else "vpmaddwd" if ISA in (1, 2, 3) else "int32 vector multiply")
# the largest depth whose sums stay in int32 for every pair of int8 values: 128 x 128 x k < 2^31
MAX_K = (2 ** 31 - 1) // (128 * 128)
# rows of A a task takes: a multiple of both micro-tile heights (6 and 4), small enough that a few
# hundred rows still split between two threads, large enough that a panel is packed once per ~100 rows
cdef Py_ssize_t ROWS = 96


def matmul_int8(const int8_t[:, ::1] A, const int8_t[:, ::1] B, int32_t[:, ::1] out, int num_threads):
    """out = A B exactly for A (m, k), B (k, n) int8, k <= MAX_K. A is repacked once for the threads
    (a + 128 bytes for vpdpbusd, int16 for vpmaddwd, rows padded to the depth step); the tasks are
    (ROWS rows of A, NR columns of B) in column-major order, cut into num_threads runs: a run packs
    each panel of B it meets once into its own scratch."""
    cdef Py_ssize_t m = A.shape[0], k = A.shape[1], n = B.shape[1], kp = (k + DK - 1) // DK * DK
    cdef Py_ssize_t row_tasks = (m + ROWS - 1) // ROWS, panels = (n + NR - 1) // NR, t, r, chunk
    cdef Py_ssize_t last, panel, i0, j, s, tasks
    cdef void *ap = NULL
    cdef void *scratch
    cdef int failed = 0
    if B.shape[0] != k or out.shape[0] != m or out.shape[1] != n:
        raise ValueError(f"matmul_int8: A ({m}, {k}), B ({B.shape[0]}, {n}) and out ({out.shape[0]}, "
                         f"{out.shape[1]}) do not fit")
    if not 0 < k <= MAX_K:
        raise ValueError(f"matmul_int8: depth {k} outside 1 .. {MAX_K}")
    if m == 0 or n == 0:
        return
    ap = sa_alloc(m * kp * A_BYTES)
    if ap == NULL:
        raise MemoryError(f"matmul_int8 could not allocate A's {m} x {kp} x {A_BYTES} bytes")
    chunk = (m + 4 * num_threads - 1) // (4 * num_threads)
    tasks = panels * row_tasks
    with nogil, parallel(num_threads=num_threads):
        for r in prange(0, m, chunk, schedule="static"):
            sa_i8_pack_a_f32(ISA, &A[0, 0], k, r, min(m, r + chunk), k, kp, ap)
    with nogil:
        for s in prange(num_threads, num_threads=num_threads, schedule="static", chunksize=1):
            scratch = sa_alloc(sa_i8_scratch(ISA, kp))  # a slot's own panel
            if scratch == NULL:
                failed += 1
                continue
            last = -1
            for t in range(s * tasks // num_threads, (s + 1) * tasks // num_threads):
                panel = t // row_tasks
                i0 = t % row_tasks * ROWS
                j = panel * NR
                sa_i8_panel_f32(ISA, ap, i0, min(m, i0 + ROWS), k, kp, &B[0, 0], n, j, min(NR, n - j),
                                &out[0, 0], n, scratch, panel != last)
                last = panel
            free(scratch)
    free(ap)
    if failed:
        raise MemoryError(f"matmul_int8 could not allocate {sa_i8_scratch(ISA, kp)} bytes of panel per thread")


def int8_peak(int num_threads, double seconds=0.2):
    """Multiply-adds of int8 (or their int16 pairs') a second on num_threads threads, each running
    independent chains of INSTRUCTION with no loads (sa_i8_peak): the rate the GEMM's micro-kernel
    cannot exceed. A warm-up, then the best of 5 runs of about `seconds` each."""
    cdef int64_t iters = 1 << 16, macs = 0
    cdef int32_t sink = 0
    cdef int t
    best = 0.0
    for run in range(6):
        start = time.perf_counter()
        with nogil, parallel(num_threads=num_threads):
            for t in prange(num_threads, schedule="static"):
                macs += sa_i8_peak(ISA, iters, &sink)
        took = time.perf_counter() - start
        if run == 0:  # warm-up, and the iterations for `seconds`
            iters = max(1 << 12, int(iters * seconds / max(took, 1e-6)))
        else:
            best = max(best, macs / took)
        macs = 0
    return best
