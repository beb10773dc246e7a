/* Instantiates the template file named by SA_TEMPLATE once per (instruction set, dtype):
 * sa_<name>_<f32|f64>_<isa>, chosen at run time (SA_PICK, silkattn's ISA), so a portable build
 * still gets the wide copies:
 *   avx512   64-byte vectors, target("avx512f,avx512dq,avx512vl,avx512bw,fma,f16c"): 16 floats a register
 *   avx2     32-byte vectors, target("avx2,fma,f16c") (F16C: fp16 to float, for GGUF blocks' scales)
 *   avx2x64  the avx512 copy's 64-byte vectors compiled for AVX2 (each operation split in two): the
 *            same 16-lane code paths on any AVX2 CPU, so the tests exercise them everywhere
 *   generic  16-byte GCC vector extensions, which every target lowers to its own SIMD (or scalars)
 *   avx512vnni  the avx512 copy with VNNI, in linear_q and layer_step only (below)
 * Off x86 the x86 copies are generic ones at 16 bytes, never chosen. */
#define SA_CAT_(a, b, c) a##_##b##_##c
#define SA_CAT(a, b, c) SA_CAT_(a, b, c)
#define SA_FN(name) SA_CAT(name, SA_TNAME, SA_ISA)

#if defined(__x86_64__) || defined(__i386__)
#define SA_X86 1
/* Before any target pragma: the intrinsics then each carry their own target. Included first inside
 * the avx512 region, they would be defined for AVX-512 and refuse to inline into the avx2 copy
 * (which -march=native hides on an AVX-512 machine, and a portable build does not). */
#include <immintrin.h>
#else
#define SA_X86 0
#endif

#if SA_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma,f16c")
#define SA_VBYTES 64
#else
#define SA_VBYTES 16
#endif
#define SA_ISA avx512
#include "instances_dtypes.h"
#undef SA_ISA
#undef SA_VBYTES
#if SA_X86
#pragma GCC pop_options
#endif

/* avx512vnni: the avx512 copy with VNNI's vpdpbusd for the int8 products, in the modules that have
 * them (their header defines SA_VNNI_COPY), chosen by SA_PICK_Q8 on CPUs with AVX-512 VNNI. A build
 * that targets VNNI already (-march=native on such a CPU) has it in the avx512 copy. */
#if SA_X86 && defined(SA_VNNI_COPY) && !defined(__AVX512VNNI__)
#define SA_HAS_VNNI_COPY 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,avx512vnni,avx2,fma,f16c")
#define SA_VBYTES 64
#define SA_ISA avx512vnni
#include "instances_dtypes.h"
#undef SA_ISA
#undef SA_VBYTES
#pragma GCC pop_options
#define SA_PICK_Q8(fn, isa) ((isa) == SA_ISA_AVX512 && sa_cpu_has_vnni() ? fn##_avx512vnni : SA_PICK(fn, isa))
#else
#define SA_PICK_Q8(fn, isa) SA_PICK(fn, isa)
#endif

#if SA_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#define SA_VBYTES (SA_X86 ? 32 : 16)
#define SA_ISA avx2
#include "instances_dtypes.h"
#undef SA_ISA
#undef SA_VBYTES
#define SA_VBYTES (SA_X86 ? 64 : 16)
#define SA_ISA avx2x64
#include "instances_dtypes.h"
#undef SA_ISA
#undef SA_VBYTES
#if SA_X86
#pragma GCC pop_options
#endif

/* On x86 the generic copy runs only on CPUs without AVX2 (and in tests/test_portable.py): an -O3
 * build (setup.py defines SA_GENERIC_O2) compiles it at -O2. At -O3, GCC took 167 of linear_q's
 * 485 s on it alone (its int8 code on SSE2's 16-byte vectors), the two largest modules 8 minutes
 * each; -O2 halved both (2026-12-07, gcc 12). Off x86 it is the only copy, at the build's level. */
#if SA_X86 && defined(SA_GENERIC_O2)
#pragma GCC push_options
#pragma GCC optimize("O2")
#endif
#define SA_ISA generic
#define SA_VBYTES 16
#include "instances_dtypes.h"
#undef SA_ISA
#undef SA_VBYTES
#if SA_X86 && defined(SA_GENERIC_O2)
#pragma GCC pop_options
#endif
