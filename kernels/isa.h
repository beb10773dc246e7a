/* Which kernel copy runs (see instances.h). Included once per module. */
#ifndef SA_ISA_H
#define SA_ISA_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

enum { SA_ISA_GENERIC = 0, SA_ISA_AVX2 = 1, SA_ISA_AVX512 = 2, SA_ISA_AVX2X64 = 3 };

/* The copy of fn for instruction set isa: every op's dispatch (the op headers) goes through this. */
#define SA_PICK(fn, isa)                                                                   \
    ((isa) == SA_ISA_AVX512 ? fn##_avx512 : (isa) == SA_ISA_AVX2X64 ? fn##_avx2x64         \
     : (isa) == SA_ISA_AVX2 ? fn##_avx2 : fn##_generic)

/* AVX2 with FMA and F16C (every AVX2 CPU has them; the copies are compiled for all three). */
static inline int sa_cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

/* AVX-512 with what the kernels use: F, plus DQ, VL and BW. */
static inline int sa_cpu_has_avx512(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return sa_cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")
           && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
#else
    return 0;
#endif
}

/* AVX-512 VNNI (vpdpbusd), for the int8 products' copy (instances.h: SA_VNNI_COPY); asked once. */
static inline int sa_cpu_has_vnni(void) {
#if defined(__x86_64__) || defined(__i386__)
    static int has = -1;  /* threads racing here all store the same answer */
    if (has < 0) has = sa_cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
    return has;
#else
    return 0;
#endif
}

/* Per-thread scratch: 64-byte aligned so vector loads never split cache lines needlessly. */
static inline void *sa_alloc(size_t bytes) {
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) ? NULL : p;
}
#endif
