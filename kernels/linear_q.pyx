"""y = x W (+ b) for W held as GGUF blocks (silkattn.quant.QuantizedMatrix), a few rows of x: a
decoding step's projections, reading the file's 5 or 8.5 bits a weight."""
from cython.parallel cimport parallel, prange
from libc.stdint cimport int8_t, int16_t, int64_t, uint8_t
from libc.stdlib cimport free
from libc.string cimport memset

import numpy as np

include "common.pxi"

cdef extern from "linear_q.h" nogil:
    int SA_Q8_0
    int SA_Q4_K
    int SA_Q5_0
    int SA_Q4_K16
    int SA_Q5_016
    int SA_Q8_016
    int SA_Q4_016
    int SA_Q4_116
    int SA_Q6_K
    int SA_Q6_K16
    bint SA_KQUANT(int kind)
    void sa_q4k16_pack(const uint8_t *w, int64_t ldw, int64_t n, uint8_t *out)
    void sa_q4k16_unpack_row(const uint8_t *w, int64_t ldw, int64_t j, uint8_t *row)
    void sa_q6k16_pack(const uint8_t *w, int64_t ldw, int64_t n, uint8_t *out)
    void sa_q6k16_unpack_row(const uint8_t *w, int64_t ldw, int64_t j, uint8_t *row)
    void sa_b16_pack(int kind, const uint8_t *w, int64_t ldw, int64_t n, uint8_t *out)
    void sa_b16_unpack_row(int kind, const uint8_t *w, int64_t ldw, int64_t j, uint8_t *row)
    int SA_QBYTES(int kind)
    int SA_QWEIGHTS(int kind)
    int SA_QROW_KINDS
    int SA_QROWS
    int SA_QCH
    void sa_linear_q_xsum_f32(int isa, const float *x, int64_t k, int64_t m, float *xs)
    void sa_linear_q_rows_f32(int isa, int kind, const float *x, int64_t k, int64_t m, const uint8_t *w,
                              int64_t ldw, int64_t n, const float *xs, const float *b, int64_t j0, int64_t j1,
                              float *y, int64_t ldy)
    void sa_quantize_q8_f32(int isa, const float *x, int64_t k, int64_t m, int8_t *xq, float *xd, float *xs)
    void sa_quantize_q8k_f32(int isa, const float *x, int64_t k, int64_t m, int8_t *xq, float *xd, int16_t *xb)
    void sa_linear_q8k_rows_f32(int isa, int kind, const int8_t *xq, const float *xd, const int16_t *xb, int64_t k,
                                int64_t m, const uint8_t *w, int64_t ldw, const float *b, int64_t j0, int64_t j1,
                                float *y, int64_t ldy)
    void sa_linear_q8_rows_f32(int isa, int kind, const int8_t *xq, const float *xd, const float *xs, int64_t k,
                               int64_t m, const uint8_t *w, int64_t ldw, int64_t n, const float *b, int64_t j0,
                               int64_t j1, float *y, int64_t ldy)
    void sa_linear_qx_rows_f32(int isa, int kind, const float *x, int64_t k, int64_t m, const uint8_t *w,
                               int64_t ldw, const float *b, int64_t j0, int64_t j1, float *y, int64_t ldy)
    void sa_linear_q8x_rows_f32(int isa, int kind, const int8_t *xq, const float *xd, const float *xs, int64_t k,
                                int64_t m, const uint8_t *w, int64_t ldw, const float *b, int64_t j0, int64_t j1,
                                float *y, int64_t ldy)
    void sa_dequantize_rows_f32(int isa, int kind, const uint8_t *w, int64_t ldw, int64_t k, int64_t j0,
                                int64_t rows, float *out)
    void sa_panel_dots_f32(int isa, const float *x, int64_t k, int64_t m, const float *p, int64_t rows, float *y,
                           int64_t ldy)
    int sa_gemm_q8_usable(int isa)
    void sa_gq8_pack_a_f32(const float *x, int64_t m, int64_t k, int block, uint8_t *a, float *d, float *xs)
    int64_t sa_gq8_scratch_f32(int64_t k)
    void sa_gq8_cols_f32(int kind, const uint8_t *a, const float *d, const float *xs, int64_t m, int64_t k,
                         const uint8_t *w, int64_t ldw, int64_t j0, int64_t j1, float *y, int64_t ldy, void *scratch)

KINDS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")  # by their code (silkattn.quant.KINDS)
ROW_KINDS = KINDS[:SA_QROW_KINDS]  # those linear_q (and layer_step) multiply; dequantize and gemm_q take all


cdef bint _fits(int kind, Py_ssize_t k, Py_ssize_t ldw):
    """kind is a known type and blocks' rows of ldw bytes hold k of its weights"""
    return 0 <= kind < len(KINDS) and k > 0 and k % SA_QWEIGHTS(kind) == 0 \
        and ldw == k // SA_QWEIGHTS(kind) * SA_QBYTES(kind)
# Rows of W a dequantize task converts (a prefill's panels are a few dozen to a few hundred rows).
cdef Py_ssize_t DEQUANTIZE_ROWS = 8
# Outputs per task: a multiple of the rows of W a pass converts together (4), small enough that two
# threads share a 192-row projection evenly.
cdef Py_ssize_t ROWS_PER_TASK = 16
assert SA_QROWS == 8  # the rows of x a row kernel takes: the q8 loops' literal step (prange needs one)


def linear_q(const float[:, ::1] x, const uint8_t[:, ::1] blocks, int kind, const float[::1] b,
             float[:, ::1] out, bint has_bias, bint q8, int num_threads):
    """out = x W (+ b) for W = dequantize(blocks, KINDS[kind])^T: x (m, k), 1 <= m <= 8 (with q8 any
    m >= 1: a task's rows of W against 8 rows of x at a time, so that W is read once and each row's
    sums are those of a call of its 8); blocks (n, k / 32 * block bytes); out (m, n); b (n,) if
    has_bias. With q8, x is reference.round_q8(x) and the products are integer ones. The threads
    share W's rows (the outputs), ROWS_PER_TASK a task; what x's blocks need first (their sums, or
    with q8 their 8-bit q, scales and sums) is made once."""
    cdef Py_ssize_t m = x.shape[0], k = x.shape[1], n = blocks.shape[0], ldw = blocks.shape[1], t, r
    cdef Py_ssize_t ntasks = (n + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    cdef Py_ssize_t nbp = (k // 32 + SA_QCH - 1) // SA_QCH * SA_QCH  # a row's block sums, padded
    cdef Py_ssize_t nxs = m * nbp
    cdef float *xs = NULL
    cdef float *xd = NULL
    cdef int8_t *xq = NULL
    cdef const float *bias = NULL
    # what keeps the C kernel within its arrays (the caller, silkattn._api, has checked them)
    if not 0 <= kind < len(ROW_KINDS) or not 1 <= m <= (m if q8 else SA_QROWS) or k <= 0 or k % 32 or n <= 0:
        raise ValueError(f"linear_q: kind {kind}, x of shape ({m}, {k}) or {n} rows of W out of range")
    if ldw != k // 32 * SA_QBYTES(kind) or out.shape[0] != m or out.shape[1] != n:
        raise ValueError(f"linear_q: blocks ({n}, {ldw}) and out ({out.shape[0]}, {out.shape[1]}) do not fit "
                         f"x ({m}, {k}) of {KINDS[kind]}")
    if has_bias:
        if b.shape[0] != n:
            raise ValueError(f"linear_q: b must have {n} elements, got {b.shape[0]}")
        bias = &b[0]
    if kind != SA_Q8_0 or q8:
        xs = <float *>sa_alloc(nxs * sizeof(float))
        if q8:
            xd = <float *>sa_alloc(nxs * sizeof(float))
            xq = <int8_t *>sa_alloc(m * k)
        if xs == NULL or (q8 and (xd == NULL or xq == NULL)):
            free(xs)
            free(xd)
            free(xq)
            raise MemoryError("linear_q could not allocate x's block sums")
    with nogil:
        if xs != NULL:
            memset(xs, 0, nxs * sizeof(float))
        if q8:
            memset(xd, 0, nxs * sizeof(float))
            sa_quantize_q8_f32(ISA, &x[0, 0], k, m, xq, xd, xs)
            for t in prange(ntasks, num_threads=num_threads, schedule="static"):
                for r in range(0, m, 8):  # 8 = SA_QROWS; the task's rows of W stay in L1 for each 8 rows of x
                    sa_linear_q8_rows_f32(ISA, kind, xq + r * k, xd + r * nbp, xs + r * nbp, k, min(8, m - r),
                                          &blocks[0, 0], ldw, n, bias, t * ROWS_PER_TASK,
                                          min(n, (t + 1) * ROWS_PER_TASK), &out[0, 0] + r * n, n)
        else:
            if xs != NULL:
                sa_linear_q_xsum_f32(ISA, &x[0, 0], k, m, xs)
            for t in prange(ntasks, num_threads=num_threads, schedule="static"):
                sa_linear_q_rows_f32(ISA, kind, &x[0, 0], k, m, &blocks[0, 0], ldw, n, xs, bias, t * ROWS_PER_TASK,
                                     min(n, (t + 1) * ROWS_PER_TASK), &out[0, 0], n)
    free(xs)
    free(xd)
    free(xq)


def linear_qx(const float[:, ::1] x, const uint8_t[:, ::1] blocks, int kind, const float[::1] b,
              float[:, ::1] out, bint has_bias, bint q8, int num_threads):
    """out = x W (+ b) for W = dequantize(blocks, KINDS[kind])^T, kind one of the types after
    ROW_KINDS (Q5_0 .. Q6_K), float32 x (m, k), 1 <= m <= 8 (with q8 any m >= 1, 8 rows at a time
    against a task's rows of W, as linear_q): each block decoded once in registers for all the rows
    of x. With q8, x is reference.round_q8(x, Q8_BLOCK) and the products integer ones: Q5_0 and
    Q5_1's 32 weights a run as unsigned bytes against x's blocks of 32; the K-quants' against x's
    blocks of 256 (llama.cpp's Q8_K: tmpl_q8k.h), their q sums per 16 in xs's bytes. The threads
    share W's rows, ROWS_PER_TASK a task."""
    cdef Py_ssize_t m = x.shape[0], k = x.shape[1], n = blocks.shape[0], ldw = blocks.shape[1], t, r
    cdef Py_ssize_t ntasks = (n + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    cdef Py_ssize_t nbp = (k // 32 + SA_QCH - 1) // SA_QCH * SA_QCH
    cdef Py_ssize_t nxs = m * nbp
    cdef const float *bias = NULL
    cdef float *xs = NULL
    cdef float *xd = NULL
    cdef int8_t *xq = NULL
    # what keeps the C kernel within its arrays (the caller, silkattn._api, has checked them); the
    # layouts of pack_rows16 only with q8, their rows whole groups
    rows16 = kind in ROWS16_CODES and q8 and n % 16 == 0 and _fits(ROWS16_CODES[kind], k, ldw)
    if not (rows16 or len(ROW_KINDS) <= kind < len(KINDS) and _fits(kind, k, ldw)) or not 1 <= m <= (m if q8 else SA_QROWS) \
            or n <= 0:
        raise ValueError(f"linear_qx: kind {kind}, x of shape ({m}, {k}) or {n} rows of W out of range")
    if out.shape[0] != m or out.shape[1] != n:
        raise ValueError(f"linear_qx: out ({out.shape[0]}, {out.shape[1]}) does not fit x ({m}, {k}) and "
                         f"{n} rows of W")
    if has_bias:
        if b.shape[0] != n:
            raise ValueError(f"linear_qx: b must have {n} elements, got {b.shape[0]}")
        bias = &b[0]
    if q8:
        xs = <float *>sa_alloc(nxs * sizeof(float))
        xd = <float *>sa_alloc(nxs * sizeof(float))
        xq = <int8_t *>sa_alloc(m * k)
        if xs == NULL or xd == NULL or xq == NULL:
            free(xs)
            free(xd)
            free(xq)
            raise MemoryError("linear_qx could not allocate x's 8-bit blocks")
    with nogil:
        if q8:
            memset(xs, 0, nxs * sizeof(float))
            memset(xd, 0, nxs * sizeof(float))
            if SA_KQUANT(kind):  # xs holds the m k / 16 int16 sums (m nxs floats >= m k / 8 bytes)
                sa_quantize_q8k_f32(ISA, &x[0, 0], k, m, xq, xd, <int16_t *>xs)
                for t in prange(ntasks, num_threads=num_threads, schedule="static"):
                    for r in range(0, m, 8):  # xs: each row's k / 16 int16 sums
                        sa_linear_q8k_rows_f32(ISA, kind, xq + r * k, xd + r * nbp, <const int16_t *>xs + r * (k // 16),
                                               k, min(8, m - r), &blocks[0, 0], ldw, bias, t * ROWS_PER_TASK,
                                               min(n, (t + 1) * ROWS_PER_TASK), &out[0, 0] + r * n, n)
            else:
                sa_quantize_q8_f32(ISA, &x[0, 0], k, m, xq, xd, xs)
                for t in prange(ntasks, num_threads=num_threads, schedule="static"):
                    for r in range(0, m, 8):
                        sa_linear_q8x_rows_f32(ISA, kind, xq + r * k, xd + r * nbp, xs + r * nbp, k, min(8, m - r),
                                               &blocks[0, 0], ldw, bias, t * ROWS_PER_TASK,
                                               min(n, (t + 1) * ROWS_PER_TASK), &out[0, 0] + r * n, n)
        else:
            for t in prange(ntasks, num_threads=num_threads, schedule="static"):
                sa_linear_qx_rows_f32(ISA, kind, &x[0, 0], k, m, &blocks[0, 0], ldw, bias, t * ROWS_PER_TASK,
                                      min(n, (t + 1) * ROWS_PER_TASK), &out[0, 0], n)
    free(xs)
    free(xd)
    free(xq)


# the layouts of pack_rows16, their file kinds (silkattn.quant.ROWS16)
ROWS16_CODES = {SA_Q4_K16: SA_Q4_K, SA_Q5_016: SA_Q5_0, SA_Q8_016: SA_Q8_0, SA_Q4_016: KINDS.index("Q4_0"),
                SA_Q4_116: KINDS.index("Q4_1"), SA_Q6_K16: SA_Q6_K}
_ROWS16_OF = {kind: code for code, kind in ROWS16_CODES.items()}


def rows16_usable():
    """True where linear_qx runs the layouts of pack_rows16 with their VNNI kernels: the copy chosen
    for this CPU has AVX-512 VNNI (elsewhere a layout would be unpacked a row at a time)."""
    return bool(sa_gemm_q8_usable(ISA))


def _rows16_check(name, Py_ssize_t n, Py_ssize_t ldw, int kind):
    if kind not in _ROWS16_OF:
        raise ValueError(f"{name}: kind {kind} has no layout in groups of 16 rows (Q8_0, Q4_0, Q4_1, Q5_0, "
                         f"Q4_K and Q6_K have)")
    if n % 16 or n == 0 or ldw == 0 or ldw % SA_QBYTES(kind):
        raise ValueError(f"{name}: blocks must be (n, whole {KINDS[kind]} blocks) with n a positive multiple of "
                         f"16, got ({n}, {ldw})")


def pack_rows16(const uint8_t[:, ::1] blocks, int kind, int num_threads=1):
    """Q8_0, Q4_0, Q4_1, Q5_0, Q4_K or Q6_K blocks (n, row bytes), n a multiple of 16, in groups of 16 rows
    (kernels/rows16.h): a new array of the same shape, the same bits rearranged, for linear_qx's
    kinds ROWS16_CODES (int8 products: the 16 rows' sums in one register's lanes, no horizontal
    sums). Returns the array and its kind code."""
    cdef Py_ssize_t n = blocks.shape[0], ldw = blocks.shape[1], g
    _rows16_check("pack_rows16", n, ldw, kind)
    out = np.empty((n, ldw), np.uint8)
    cdef uint8_t[:, ::1] o = out
    cdef bint k = kind == SA_Q4_K, k6 = kind == SA_Q6_K
    with nogil:
        for g in prange(n // 16, num_threads=num_threads, schedule="static"):
            if k:
                sa_q4k16_pack(&blocks[16 * g, 0], ldw, 16, &o[16 * g, 0])
            elif k6:
                sa_q6k16_pack(&blocks[16 * g, 0], ldw, 16, &o[16 * g, 0])
            else:
                sa_b16_pack(kind, &blocks[16 * g, 0], ldw, 16, &o[16 * g, 0])
    return out, _ROWS16_OF[kind]


def unpack_rows16(const uint8_t[:, ::1] packed, int kind):
    """The file's blocks (kind: the file's) of pack_rows16's output (its inverse)."""
    cdef Py_ssize_t n = packed.shape[0], ldw = packed.shape[1], j
    _rows16_check("unpack_rows16", n, ldw, kind)
    out = np.empty((n, ldw), np.uint8)
    cdef uint8_t[:, ::1] o = out
    cdef bint k = kind == SA_Q4_K, k6 = kind == SA_Q6_K
    with nogil:
        for j in range(n):
            if k:
                sa_q4k16_unpack_row(&packed[0, 0], ldw, j, &o[j, 0])
            elif k6:
                sa_q6k16_unpack_row(&packed[0, 0], ldw, j, &o[j, 0])
            else:
                sa_b16_unpack_row(kind, &packed[0, 0], ldw, j, &o[j, 0])
    return out


def dequantize(const uint8_t[:, ::1] blocks, int kind, Py_ssize_t j0, float[:, ::1] out, int num_threads):
    """out[r] = reference.dequantize of row j0 + r of blocks (n, k / block weights * block bytes), out
    (rows, k), any of KINDS:
    a panel of W's float32 rows for a prefill's GEMM. The threads share the rows."""
    cdef Py_ssize_t rows = out.shape[0], k = out.shape[1], n = blocks.shape[0], ldw = blocks.shape[1], t
    if not _fits(kind, k, ldw):
        raise ValueError(f"dequantize: kind {kind}, blocks ({n}, {ldw}) and out rows of {k} do not fit")
    if not 0 <= j0 <= n - rows:
        raise ValueError(f"dequantize: rows {j0} .. {j0 + rows} of {n} out of range")
    with nogil:
        for t in prange((rows + DEQUANTIZE_ROWS - 1) // DEQUANTIZE_ROWS, num_threads=num_threads,
                        schedule="static"):
            sa_dequantize_rows_f32(ISA, kind, &blocks[0, 0], ldw, k, j0 + t * DEQUANTIZE_ROWS,
                                   min(DEQUANTIZE_ROWS, rows - t * DEQUANTIZE_ROWS), &out[t * DEQUANTIZE_ROWS, 0])


cdef extern from "gemm.h" nogil:
    void sa_sgemm(size_t fn, int ilp64, int transb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float *c, int64_t ldc)

# Bytes of W's rows the threads dequantize at a time for a GEMM, shared among them: each thread's
# panel within L3 beside x, and a GEMM long enough to run at full rate (its packing of x is paid
# once a panel: smaller panels made a 64-row product 1.6x slower).
GEMM_PANEL_BYTES = 1 << 22
FEW_PANEL_BYTES = 1 << 17  # a thread's panel for a few rows of x: within L2 beside x


def gemm_q(const float[:, ::1] x, const uint8_t[:, ::1] blocks, int kind, float[:, ::1] out, size_t sgemm,
           bint ilp64, int num_threads):
    """out = x W for W = dequantize(blocks, KINDS[kind])^T and many rows of x (a prefill), never W
    whole in float32: one team of threads, each its share of W's rows (out's columns), a panel of
    GEMM_PANEL_BYTES / threads at a time dequantized into its own buffer and multiplied by the
    BLAS's sgemm (as gemm in linear.pyx: the function at address sgemm, its own threads held at one)
    into out's columns. The same numbers as numpy's matmul of x and the dequantized W."""
    cdef Py_ssize_t m = x.shape[0], k = x.shape[1], n = blocks.shape[0], ldw = blocks.shape[1], t, j, end, rows
    if not _fits(kind, k, ldw) or out.shape[0] != m or out.shape[1] != n:
        raise ValueError(f"gemm_q: kind {kind}, blocks ({n}, {ldw}), x ({m}, {k}) and out ({out.shape[0]}, "
                         f"{out.shape[1]}) do not fit")
    cdef Py_ssize_t T = max(1, min(num_threads, n // 64))
    cdef Py_ssize_t share = ((n + T - 1) // T + 15) // 16 * 16
    # a few rows of x (a decoding step with a type that has no row kernel) take dot products with a
    # panel kept within L2 (FEW_PANEL_BYTES): a BLAS GEMM would pack the whole panel for them
    cdef bint few = m <= SA_QROWS
    cdef Py_ssize_t panel = max(16, (FEW_PANEL_BYTES if few else GEMM_PANEL_BYTES // T) // (4 * k) // 16 * 16)
    cdef float *buf
    cdef int failed = 0
    if m == 0 or n == 0:
        return
    with nogil, parallel(num_threads=T):
        buf = <float *>sa_alloc(panel * k * sizeof(float))
        for t in prange(T, schedule="static"):
            if buf == NULL:
                failed += 1
                continue
            j = t * share
            end = min(n, j + share)
            while j < end:
                rows = min(panel, end - j)
                sa_dequantize_rows_f32(ISA, kind, &blocks[0, 0], ldw, k, j, rows, buf)
                if few:
                    sa_panel_dots_f32(ISA, &x[0, 0], k, m, buf, rows, &out[0, j], n)
                else:
                    sa_sgemm(sgemm, ilp64, 1, m, rows, k, &x[0, 0], k, buf, k, &out[0, j], n)
                j = j + rows
        free(buf)
    if failed:
        raise MemoryError(f"gemm_q could not allocate {panel * k * 4} bytes of panel per thread")


cdef Py_ssize_t GQ8_PANEL = 32  # W's rows (out's columns) a task of gemm_q8: a panel of tmpl_gemm_q8.h


def gemm_q8(const float[:, ::1] x, const uint8_t[:, ::1] blocks, int kind, float[:, ::1] out, int num_threads):
    """out = round_q8(x, block) W^T for W = dequantize(blocks, KINDS[kind]), block 32 (256 for the
    K-quants: reference.Q8_BLOCK), many rows of x, as integer products (tmpl_gemm_q8.h): x's rows
    rounded to bytes once (the threads share the rows), then each thread a panel of 32 of W's rows
    at a time, unpacked to bytes and multiplied with all of x's. Returns False, having done nothing,
    where the CPU or the copy chosen has no AVX-512 VNNI (the caller takes gemm_q's float path)."""
    cdef Py_ssize_t m = x.shape[0], k = x.shape[1], n = blocks.shape[0], ldw = blocks.shape[1], t, r
    cdef Py_ssize_t n32 = k // 32, tasks = (n + GQ8_PANEL - 1) // GQ8_PANEL
    cdef int block = 256 if SA_KQUANT(kind) else 32
    cdef uint8_t *a = NULL
    cdef float *ad = NULL
    cdef float *axs = NULL
    cdef void *scratch
    cdef int failed = 0
    # the file's kinds, or the layouts of pack_rows16 (a prefill reading the decoding steps' copy)
    rows16 = kind in ROWS16_CODES and n % 16 == 0 and _fits(ROWS16_CODES[kind], k, ldw)
    if not (rows16 or _fits(kind, k, ldw)) or out.shape[0] != m or out.shape[1] != n:
        raise ValueError(f"gemm_q8: kind {kind}, blocks ({n}, {ldw}), x ({m}, {k}) and out ({out.shape[0]}, "
                         f"{out.shape[1]}) do not fit")
    if not sa_gemm_q8_usable(ISA):
        return False
    if m == 0 or n == 0:
        return True
    a = <uint8_t *>sa_alloc(m * k)
    ad = <float *>sa_alloc(m * n32 * sizeof(float))
    axs = <float *>sa_alloc(m * n32 * sizeof(float))
    if a == NULL or ad == NULL or axs == NULL:
        free(a)
        free(ad)
        free(axs)
        raise MemoryError(f"gemm_q8 could not allocate x's {m} x {k} bytes")
    with nogil, parallel(num_threads=num_threads):
        for r in prange(m, schedule="static"):
            sa_gq8_pack_a_f32(&x[r, 0], 1, k, block, a + r * k, ad + r * n32, axs + r * n32)
        scratch = sa_alloc(sa_gq8_scratch_f32(k))
        for t in prange(tasks, schedule="static"):
            if scratch == NULL:
                failed += 1
                continue
            sa_gq8_cols_f32(kind, a, ad, axs, m, k, &blocks[0, 0], ldw, t * GQ8_PANEL, min(n, (t + 1) * GQ8_PANEL),
                            &out[0, 0], n, scratch)
        free(scratch)
    free(a)
    free(ad)
    free(axs)
    if failed:
        raise MemoryError(f"gemm_q8 could not allocate {sa_gq8_scratch_f32(k)} bytes of panel per thread")
    return True
