/* One instruction set's copies of SA_TEMPLATE: float and double. Included by instances.h. */
#define SA_T float
#define SA_TBYTES 4
#define SA_I int32_t
#define SA_TNAME f32
#include SA_TEMPLATE
#undef SA_SIMD_DONE
#undef SA_T
#undef SA_TBYTES
#undef SA_I
#undef SA_TNAME
#define SA_T double
#define SA_TBYTES 8
#define SA_I int64_t
#define SA_TNAME f64
#include SA_TEMPLATE
#undef SA_SIMD_DONE
#undef SA_T
#undef SA_TBYTES
#undef SA_I
#undef SA_TNAME
