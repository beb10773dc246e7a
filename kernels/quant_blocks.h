/* The GGUF block types the linear_q and layer_step kernels read (silkattn.quant). */
#ifndef SA_QUANT_BLOCKS_H
#define SA_QUANT_BLOCKS_H
#include <stdint.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  /* _cvtsh_ss (F16C) */
#endif

/* The block types by their code in the kernel contract (silkattn.quant.KINDS), their bytes and
 * weights a block. The first SA_QROW_KINDS have the few-row product and fused-step kernels; the
 * others are dequantized (sa_dequantize_row_ext, quant_ext.h) for the GEMM path. */
enum { SA_Q8_0 = 0, SA_Q4_0 = 1, SA_Q4_1 = 2, SA_Q5_0 = 3, SA_Q5_1 = 4, SA_Q4_K = 5, SA_Q5_K = 6, SA_Q6_K = 7,
       SA_NKINDS = 8 };
/* Not files' types: Q4_K's, Q6_K's and the blocks of 32's (Q8_0, Q4_0, Q4_1, Q5_0) rearranged in
 * groups of 16 rows (rows16.h), the AVX-512 VNNI decoding step's layouts; only the int8 row
 * products take them (silkattn._api, linear_q.pyx, layer_step.pyx) */
enum { SA_Q4_K16 = 8, SA_Q5_016 = 9, SA_Q8_016 = 10, SA_Q4_016 = 11, SA_Q4_116 = 12, SA_Q6_K16 = 13 };
/* the file's kind of a blocks-of-32 layout (rows16.h's SA_B16), else -1 */
#define SA_B16_FILE(kind) ((kind) == SA_Q5_016 ? SA_Q5_0 : (kind) == SA_Q8_016 ? SA_Q8_0 \
                           : (kind) == SA_Q4_016 ? SA_Q4_0 : (kind) == SA_Q4_116 ? SA_Q4_1 : -1)
#define SA_QROW_KINDS 3
#define SA_KQUANT(kind) ((kind) == SA_Q4_K || (kind) == SA_Q5_K || (kind) == SA_Q6_K || (kind) == SA_Q4_K16 \
                         || (kind) == SA_Q6_K16)
#define SA_QBYTES(kind) ((kind) == SA_Q8_0 || (kind) == SA_Q8_016 ? 34 : (kind) == SA_Q4_0 || (kind) == SA_Q4_016 ? 18 \
                         : (kind) == SA_Q4_1 || (kind) == SA_Q4_116 ? 20                        \
                         : (kind) == SA_Q5_0 || (kind) == SA_Q5_016 ? 22 : (kind) == SA_Q5_1 ? 24 \
                         : (kind) == SA_Q4_K || (kind) == SA_Q4_K16 ? 144 : (kind) == SA_Q5_K ? 176 : 210)
#define SA_QWEIGHTS(kind) (SA_KQUANT(kind) ? 256 : 32)
#define SA_QROWS 8  /* the most rows of x (silkattn._api.LINEAR_ROWS) */
#define SA_QCH 16   /* blocks a chunk, their scales converted together; x's block sums padded to it */

/* CALL(K, M) with the block type K and the rows of x M as compile-time constants, for the kind and
 * m given at run time (m in 1 .. SA_QROWS; the callers check both): one copy of the loops a case. */
#define SA_QCASE(K, M, CALL) \
    case (K) * SA_QROWS + (M) - 1: CALL(K, M); break;
#define SA_QCASES(K, CALL)                                                                         \
    SA_QCASE(K, 1, CALL) SA_QCASE(K, 2, CALL) SA_QCASE(K, 3, CALL) SA_QCASE(K, 4, CALL)            \
    SA_QCASE(K, 5, CALL) SA_QCASE(K, 6, CALL) SA_QCASE(K, 7, CALL) SA_QCASE(K, 8, CALL)
#define SA_QSWITCH(kind, m, CALL)                                                                  \
    switch ((kind) * SA_QROWS + (int)(m) - 1) {                                                    \
        SA_QCASES(SA_Q8_0, CALL)                                                                   \
        SA_QCASES(SA_Q4_0, CALL)                                                                   \
        SA_QCASES(SA_Q4_1, CALL)                                                                   \
        default: break;                                                                            \
    }
/* the same for the kinds after SA_QROW_KINDS (sa_linear_qx_rows) */
#define SA_QX_SWITCH(kind, m, CALL)                                                                \
    switch ((kind) * SA_QROWS + (int)(m) - 1) {                                                    \
        SA_QCASES(SA_Q5_0, CALL)                                                                   \
        SA_QCASES(SA_Q5_1, CALL)                                                                   \
        SA_QCASES(SA_Q4_K, CALL)                                                                   \
        SA_QCASES(SA_Q5_K, CALL)                                                                   \
        SA_QCASES(SA_Q6_K, CALL)                                                                   \
        default: break;                                                                            \
    }
#endif
