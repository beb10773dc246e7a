/* One Llama decoder layer for one token in one call (a decoding step's 30 layers are 30 calls
 * instead of some 360 op calls with their Python bookkeeping), on one OpenMP team:
 *   hn = rms_norm(x, attn_norm); qkv = hn Wqkv; rope on the Q and K heads; K, V appended at pos;
 *   a = attention of each query head over its K/V head's pos + 1 keys; x += a Wo;
 *   hn = rms_norm(x, ffn_norm); gu = hn Wgu; hn = silu(g) u; x += hn Wd.
 * The stages are the row kernels of the unfused ops (the same arithmetic), each shared out over the
 * threads as those ops share it, with a barrier between stages. */
#include "isa.h"
#include <math.h>
#define SA_TEMPLATE "tmpl_llama_layer.h"
#include "instances.h"

typedef struct {  /* the layer's operands: float32 unless said, C-contiguous */
    float *x;                              /* (d,) the residual stream, updated in place */
    const float *attn_norm, *ffn_norm;     /* (d,) */
    const uint8_t *wqkv, *wo, *wgu, *wd;   /* GGUF blocks (rows, k / 32 * bytes), W^T as linear_q's */
    int kqkv, ko, kgu, kd;                 /* their block types (SA_Q8_0, ...) */
    float *K, *V;                          /* (h_kv, capacity, dh) the layer's cache */
    const float *cos, *sin;                /* (dh / 2,) the rotary row of position pos */
    int64_t d, h, h_kv, dh, dff, capacity, pos;
    float eps;
    float *qkv, *a, *hn, *gu, *scores;     /* scratch: ((h + 2 h_kv) dh,), (h dh,), (max(d, dff),), (2 dff,), (h, capacity) */
    float *xs;                             /* scratch: block sums of a product's input, max(d, h dh, dff) / 32 padded to SA_QCH */
} sa_llama_layer;

#define SA_LAYER_ROWS 16  /* outputs of a product per task, as linear_q.pyx's ROWS_PER_TASK */

/* y = in W (+ b) over the team: in (k,) of blocks w (n rows) of type kind; the caller's barrier before */
static inline void sa_layer_product(int isa, int kind, const float *in, int64_t k, const uint8_t *w, int64_t n,
                                    float *xs, const float *b, float *y) {
    const int64_t ldw = k / 32 * SA_QBYTES(kind), tasks = (n + SA_LAYER_ROWS - 1) / SA_LAYER_ROWS;
#ifdef _OPENMP
#pragma omp single
#endif
    if (kind != SA_Q8_0) {
        const int64_t nbp = (k / 32 + SA_QCH - 1) / SA_QCH * SA_QCH;
        for (int64_t i = 0; i < nbp; i++) xs[i] = 0;
        SA_PICK(sa_linear_q_xsum_f32, isa)(in, k, 1, xs);
    }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t j0 = t * SA_LAYER_ROWS, j1 = j0 + SA_LAYER_ROWS < n ? j0 + SA_LAYER_ROWS : n;
        SA_PICK(sa_linear_q_rows_f32, isa)(kind, in, k, 1, w, ldw, n, xs, b, j0, j1, y, n);
    }
}

static void sa_llama_layer_run(int isa, const sa_llama_layer *L, int num_threads) {
    const int64_t d = L->d, h = L->h, hkv = L->h_kv, dh = L->dh, dff = L->dff, group = h / hkv, keys = L->pos + 1;
    const float scale = 1 / sqrtf((float)dh);
    (void)num_threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(num_threads)
#endif
    {
#ifdef _OPENMP
#pragma omp single
#endif
        SA_PICK(sa_rms_norm_row_f32, isa)(L->x, L->attn_norm, L->eps, L->hn, d);
        sa_layer_product(isa, L->kqkv, L->hn, d, L->wqkv, (h + 2 * hkv) * dh, L->xs, NULL, L->qkv);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t u = 0; u < h + 2 * hkv; u++) {  /* Q heads, K heads, V heads */
            float *head = L->qkv + u * dh;
            if (u < h + hkv) SA_PICK(sa_rope_row_f32, isa)(head, L->cos, L->sin, head, dh / 2);
            if (u >= h) {
                const int64_t g = u < h + hkv ? u - h : u - h - hkv;
                float *row = (u < h + hkv ? L->K : L->V) + (g * L->capacity + L->pos) * dh;
                for (int64_t j = 0; j < dh; j++) row[j] = head[j];
            }
        }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t u = 0; u < h; u++) {
            const int64_t g = u / group;
            SA_PICK(sa_decode_head_f32, isa)(L->qkv + u * dh, L->K + g * L->capacity * dh, L->V + g * L->capacity * dh,
                                             keys, dh, scale, L->scores + u * L->capacity, L->a + u * dh);
        }
        sa_layer_product(isa, L->ko, L->a, h * dh, L->wo, d, L->xs, L->x, L->x);
#ifdef _OPENMP
#pragma omp single
#endif
        SA_PICK(sa_rms_norm_row_f32, isa)(L->x, L->ffn_norm, L->eps, L->hn, d);
        sa_layer_product(isa, L->kgu, L->hn, d, L->wgu, 2 * dff, L->xs, NULL, L->gu);
#ifdef _OPENMP
#pragma omp single
#endif
        SA_PICK(sa_silu_mul_row_f32, isa)(L->gu, L->gu + dff, L->hn, dff);
        sa_layer_product(isa, L->kd, L->hn, dff, L->wd, d, L->xs, L->x, L->x);
    }
}
