/* Instantiates the template file named by SA_TEMPLATE once per (instruction set, dtype):
 * sa_<name>_<f32|f64>_<avx2|generic>. The avx2 copies are compiled with target("avx2,fma") and
 * chosen at run time (sa_cpu_has_avx2), so a portable build still gets them; the generic copies
 * use 16-byte GCC vector extensions, which every target lowers to its own SIMD (or scalars). */
#define SA_CAT_(a, b, c) a##_##b##_##c
#define SA_CAT(a, b, c) SA_CAT_(a, b, c)
#define SA_FN(name) SA_CAT(name, SA_TNAME, SA_ISA)

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define SA_VBYTES 32
#else
#define SA_VBYTES 16  /* off x86 the "avx2" copy is a second generic one, never chosen */
#endif
#define SA_ISA avx2
#include "instances_dtypes.h"
#undef SA_ISA
#undef SA_VBYTES
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC pop_options
#endif

#define SA_ISA generic
#define SA_VBYTES 16
#include "instances_dtypes.h"
#undef SA_ISA
#undef SA_VBYTES
