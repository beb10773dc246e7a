#include "isa.h"

#define SA_TEMPLATE "tmpl_matmul_int8.h"
#define SA_VNNI_COPY
#include "instances.h"

/* The kernels (float32 instantiation only: the template has no float data), X(name, pick, (params),
 * (args)); SA_PICK_Q8 takes the avx512vnni copy (vpdpbusd) where the CPU has AVX-512 VNNI */
#define SA_MATMUL_INT8_KERNELS(X, T)                                                                 \
    X(i8_layout, SA_PICK_Q8, (int64_t *facts), (facts))                                              \
    X(i8_pack_a, SA_PICK_Q8, (const int8_t *A, int64_t lda, int64_t r0, int64_t r1, int64_t k,       \
                              int64_t kp, void *ap),                                                 \
      (A, lda, r0, r1, k, kp, ap))                                                                   \
    X(i8_panel, SA_PICK_Q8, (const void *ap, int64_t i0, int64_t i1, int64_t k, int64_t kp,           \
                             const int8_t *B, int64_t ldb, int64_t j, int cols, int32_t *C, int64_t ldc, \
                             void *scratch, int pack),                                               \
      (ap, i0, i1, k, kp, B, ldb, j, cols, C, ldc, scratch, pack))
SA_DISPATCHERS_F32(SA_MATMUL_INT8_KERNELS)

/* value-returning kernels: written out, SA_DISPATCHER returns void */
static inline int64_t sa_i8_scratch(int isa, int64_t kp) { return SA_PICK_Q8(sa_i8_scratch_f32, isa)(kp); }
static inline int64_t sa_i8_peak(int isa, int64_t iters, int32_t *sink) {
    return SA_PICK_Q8(sa_i8_peak_f32, isa)(iters, sink);
}
/* the copy SA_PICK_Q8 runs: 1 where it is the VNNI one */
static inline int sa_i8_vnni(int isa) {
#ifdef SA_HAS_VNNI_COPY
    return isa == SA_ISA_AVX512 && sa_cpu_has_vnni();
#elif defined(__AVX512VNNI__)
    return isa == SA_ISA_AVX512;
#else
    (void)isa;
    return 0;
#endif
}
