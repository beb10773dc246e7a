"""y = x W (+ b) for a few rows of x: the matrix-vector products of a decoding step; and x W for
many rows through the BLAS's sgemm, a panel of columns a thread of one team (gemm)."""
from cython cimport floating
from cython.parallel cimport prange
from libc.stdint cimport int64_t
from libc.stdlib cimport free
from libc.string cimport memset

include "common.pxi"

cdef extern from "linear.h" nogil:
    void sa_linear_rows_f32(int isa, const float *x, int64_t ldx, int64_t m, const float *w, int64_t n,
                            int64_t i0, int64_t i1, float *y)
    void sa_linear_rows_f64(int isa, const double *x, int64_t ldx, int64_t m, const double *w, int64_t n,
                            int64_t i0, int64_t i1, double *y)
    void sa_linear_dots_f32(int isa, const float *x, int64_t ldx, int64_t m, const float *w, int64_t k,
                            int64_t j0, int64_t j1, float *y, int64_t ldy)
    void sa_linear_dots_f64(int isa, const double *x, int64_t ldx, int64_t m, const double *w, int64_t k,
                            int64_t j0, int64_t j1, double *y, int64_t ldy)


cdef inline void _linear_rows(const floating *x, int64_t ldx, int64_t m, const floating *w, int64_t n,
                              int64_t i0, int64_t i1, floating *y) noexcept nogil:
    if floating is float:
        sa_linear_rows_f32(ISA, x, ldx, m, w, n, i0, i1, y)
    else:
        sa_linear_rows_f64(ISA, x, ldx, m, w, n, i0, i1, y)


cdef inline void _linear_dots(const floating *x, int64_t ldx, int64_t m, const floating *w, int64_t k,
                              int64_t j0, int64_t j1, floating *y, int64_t ldy) noexcept nogil:
    if floating is float:
        sa_linear_dots_f32(ISA, x, ldx, m, w, k, j0, j1, y, ldy)
    else:
        sa_linear_dots_f64(ISA, x, ldx, m, w, k, j0, j1, y, ldy)

# Outputs per task of the transposed product (a multiple of every instance's lane count).
cdef Py_ssize_t DOT_BLOCK = 64


def linear(const floating[:, ::1] x, const floating[:, ::1] w, const floating[::1] b, floating[:, ::1] out,
           bint transposed, bint has_bias, int num_threads):
    """out = x w (w: (k, n)) or x w^T (transposed; w: (n, k)), plus b if has_bias; x: (m, k).
    w's rows are split among the threads (each sums into its own partial result, added up after),
    or, transposed, its rows are the outputs, which the threads share."""
    cdef Py_ssize_t m = x.shape[0], k = x.shape[1], n = out.shape[1], j, t, r, T = num_threads
    cdef Py_ssize_t nblocks = (n + DOT_BLOCK - 1) // DOT_BLOCK, i0, i1
    cdef floating *partial = NULL
    cdef floating *y
    if transposed:
        with nogil:
            for j in prange(nblocks, num_threads=num_threads, schedule="static"):
                _linear_dots(&x[0, 0], k, m, &w[0, 0], k, j * DOT_BLOCK, min(n, (j + 1) * DOT_BLOCK),
                             &out[0, 0], n)
    else:
        T = max(1, min(T, k // 64))  # a thread's share of w: at least 64 rows
        if T > 1:
            partial = <floating *>sa_alloc(T * m * n * sizeof(floating))
            if partial == NULL:
                raise MemoryError(f"linear could not allocate {T} partial results")
        with nogil:
            if T == 1:
                memset(&out[0, 0], 0, m * n * sizeof(floating))
                _linear_rows(&x[0, 0], k, m, &w[0, 0], n, 0, k, &out[0, 0])
            else:
                for t in prange(T, num_threads=T, schedule="static"):  # one share of w's rows each
                    i0, i1 = t * k // T, (t + 1) * k // T
                    y = partial + t * m * n
                    memset(y, 0, m * n * sizeof(floating))
                    _linear_rows(&x[0, 0], k, m, &w[0, 0], n, i0, i1, y)
                for r in range(m):
                    for j in range(n):
                        out[r, j] = partial[r * n + j]
                for t in range(1, T):
                    for r in range(m):
                        for j in range(n):
                            out[r, j] += partial[(t * m + r) * n + j]
        free(partial)
    if has_bias:
        with nogil:
            for r in range(m):
                for j in range(n):
                    out[r, j] += b[j]


cdef extern from "gemm.h" nogil:
    void sa_sgemm(size_t fn, int ilp64, int transb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float *c, int64_t ldc)

# The fewest columns a thread's panel of a GEMM gets; panels start on 16 columns (64 bytes).
GEMM_PANEL = 64


def gemm(const float[:, ::1] x, const float[:, ::1] w, float[:, ::1] out, bint transposed, size_t sgemm,
         bint ilp64, int num_threads):
    """out = x w (w: (k, n)) or x w^T (transposed; w: (n, k)) for many rows of x (m, k): one team of
    threads, each one call of the BLAS's sgemm (the CBLAS function at address sgemm, 64-bit integers
    if ilp64; its own threads held at one by the caller, silkattn._blas) on its panel of out's
    columns. A panel's columns come out as the whole product's would: the BLAS splits the work over
    rows and columns, never over k."""
    cdef Py_ssize_t m = x.shape[0], k = x.shape[1], n = out.shape[1], t, j0, j1
    if out.shape[0] != m or (w.shape[0], w.shape[1]) != ((n, k) if transposed else (k, n)):
        raise ValueError(f"gemm: x ({m}, {k}), w ({w.shape[0]}, {w.shape[1]}), out ({out.shape[0]}, {n}) "
                         f"do not fit{' (transposed)' if transposed else ''}")
    cdef Py_ssize_t T = max(1, min(num_threads, n // GEMM_PANEL))
    cdef Py_ssize_t share = ((n + T - 1) // T + 15) // 16 * 16
    if m == 0 or n == 0:
        return
    with nogil:
        for t in prange(T, num_threads=T, schedule="static"):
            j0 = t * share
            j1 = min(n, j0 + share)
            if j0 < j1:
                if transposed:
                    sa_sgemm(sgemm, ilp64, 1, m, j1 - j0, k, &x[0, 0], k, &w[j0, 0], k, &out[0, j0], n)
                else:
                    sa_sgemm(sgemm, ilp64, 0, m, j1 - j0, k, &x[0, 0], k, &w[0, j0], n, &out[0, j0], n)
