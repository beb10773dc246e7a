/* The GGUF block types the linear_q and llama_layer kernels read (silkattn.quant). */
#ifndef SA_QUANT_BLOCKS_H
#define SA_QUANT_BLOCKS_H
#include <stdint.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  /* _cvtsh_ss (F16C) */
#endif

/* The block types by their code in the kernel contract (silkattn.quant.KINDS), and their bytes. */
enum { SA_Q8_0 = 0, SA_Q4_0 = 1, SA_Q4_1 = 2 };
#define SA_QBYTES(kind) ((kind) == SA_Q8_0 ? 34 : (kind) == SA_Q4_0 ? 18 : 20)
#define SA_QROWS 8  /* the most rows of x (silkattn._api.LINEAR_ROWS) */
#define SA_QCH 16   /* blocks a chunk, their scales converted together; x's block sums padded to it */
#endif
