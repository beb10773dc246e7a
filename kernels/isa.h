/* Which kernels this CPU can run: 1 = avx2 + fma, 0 = generic. Included once per module. */
#ifndef SA_ISA_H
#define SA_ISA_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static inline int sa_cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
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
