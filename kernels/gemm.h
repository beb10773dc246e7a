/* A CBLAS sgemm found at run time (numpy's BLAS: silkattn._blas.sgemm), called through its address
 * by the one team of threads that runs a whole forward pass: each thread one call on its panel of
 * the output's columns, the library's own threads held at one meanwhile (silkattn._blas.threads).
 * C (m, n) = A (m, k) op(B), row-major; op(B) = B (k, n), or B^T with B (n, k) if transb; ilp64:
 * the library's integers are 64-bit (numpy's scipy-openblas64), else 32-bit (sizes checked in
 * Python to fit). */
#ifndef SA_GEMM_H
#define SA_GEMM_H
#include <stdint.h>

typedef void (*sa_sgemm32_fn)(int order, int transa, int transb, int32_t m, int32_t n, int32_t k, float alpha,
                              const float *a, int32_t lda, const float *b, int32_t ldb, float beta, float *c,
                              int32_t ldc);
typedef void (*sa_sgemm64_fn)(int order, int transa, int transb, int64_t m, int64_t n, int64_t k, float alpha,
                              const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                              int64_t ldc);

enum { SA_CBLAS_ROW_MAJOR = 101, SA_CBLAS_NO_TRANS = 111, SA_CBLAS_TRANS = 112 };

static inline void sa_sgemm(size_t fn, int ilp64, int transb, int64_t m, int64_t n, int64_t k, const float *a,
                            int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc) {
    const int tb = transb ? SA_CBLAS_TRANS : SA_CBLAS_NO_TRANS;
    if (ilp64)
        ((sa_sgemm64_fn)fn)(SA_CBLAS_ROW_MAJOR, SA_CBLAS_NO_TRANS, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    else
        ((sa_sgemm32_fn)fn)(SA_CBLAS_ROW_MAJOR, SA_CBLAS_NO_TRANS, tb, (int32_t)m, (int32_t)n, (int32_t)k, 1.0f, a,
                            (int32_t)lda, b, (int32_t)ldb, 0.0f, c, (int32_t)ldc);
}
#endif
