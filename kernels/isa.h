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

/* The run-time dispatchers of an op's kernels, written from the op header's one list of them (an
 * X-macro). SA_<OP>_KERNELS(X, T) calls X(name, pick, params, args) once per kernel, T standing
 * for the element type:
 *   name    the kernel without its sa_ prefix and dtype: sa_<name>_<f32|f64>_<isa> are its copies
 *   pick    SA_PICK, or SA_PICK_Q8 (instances.h) for the int8 products that have an avx512vnni copy
 *   params  its parameters in parentheses, without the leading int isa
 *   args    those parameters' names in parentheses, as passed on
 * SA_DISPATCHERS(list) writes, for float and for double,
 *   static inline void sa_<name>_f32(int isa, params...) { pick(sa_<name>_f32, isa) args; }
 * and SA_DISPATCHERS_F32(list) the float ones only (the ops compiled for float32 alone). */
#define SA_WITH_ISA(...) (int isa, __VA_ARGS__)
#define SA_DISPATCHER(fn, pick, params, args) static inline void fn SA_WITH_ISA params { pick(fn, isa) args; }
#define SA_DISPATCHER_F32(name, pick, params, args) SA_DISPATCHER(sa_##name##_f32, pick, params, args)
#define SA_DISPATCHER_F64(name, pick, params, args) SA_DISPATCHER(sa_##name##_f64, pick, params, args)
#define SA_DISPATCHERS(list) list(SA_DISPATCHER_F32, float) list(SA_DISPATCHER_F64, double)
#define SA_DISPATCHERS_F32(list) list(SA_DISPATCHER_F32, float)

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

/* AVX-512 VNNI (vpdpbusd), for the int8 products' copy (instances.h: SA_VNNI_COPY); asked once.
 * SILKATTN_VNNI=0 says no, so that the avx512 copy's own int8 code (vpmaddwd, vpmaddubsw) can be
 * tested on a VNNI CPU (tests/test_portable.py). */
static inline int sa_cpu_has_vnni(void) {
#if defined(__x86_64__) || defined(__i386__)
    static int has = -1;  /* threads racing here all store the same answer */
    if (has < 0) {
        const char *off = getenv("SILKATTN_VNNI");
        has = sa_cpu_has_avx512() && __builtin_cpu_supports("avx512vnni") && !(off && strcmp(off, "0") == 0);
    }
    return has;
#else
    return 0;
#endif
}

/* Whether the int8 kernels of the blocks of 32 ask for W far ahead (every line of the block 16
 * ahead) or near (the first two lines of the block 4 ahead): measured per vendor. On a Xeon with
 * a far L3 (2026-12-06) far made SmolLM2's 8-row step 6.2 ms against 9.3 near; on Zen 4 (an
 * earlier session, docs/kernels.md) 16 blocks ahead made batched decoding slower (792 and 784
 * tokens/s against 826 and 877). Asked once. */
static inline int sa_cpu_far_ahead(void) {
#if defined(__x86_64__) || defined(__i386__)
    static int far = -1;  /* threads racing here all store the same answer */
    if (far < 0) far = __builtin_cpu_is("intel") ? 1 : 0;
    return far;
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
