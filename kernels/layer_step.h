/* One decoder layer for one token (a decoding step) in one call, on one OpenMP team: a step of N
 * layers is N calls instead of a dozen op calls a layer with their Python bookkeeping. One runner
 * for both kinds of layer silkattn's models have:
 *   the family's pre_norm composition (models/blocks.py): RMSNorm, Q/K/V with optional biases,
 *     optional QK-norms, rotary Q and K, grouped-query attention (optionally over a window's ring),
 *     optional sandwich norms, SwiGLU or GeGLU, the weights as GGUF blocks;
 *   the listing's block (the seed's decoder, the encoder-decoder's decoder): LayerNorm pre- or
 *     post-norm, multi-head attention, optional cross-attention over the encoder's keys, ReLU
 *     feed-forward with biases, float32 (in, out) weights.
 * The stages are the row kernels of the unfused ops (the same arithmetic), each shared out over
 * the threads as those ops share it, with a barrier between stages. */
#include "isa.h"
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "rows16.h"
#include "quant_ext.h"  /* before the ISA copies: one baseline copy (tmpl_linear_q.h's dequantize calls it) */
#define SA_TEMPLATE "tmpl_layer_step.h"
#define SA_VNNI_COPY
#include "instances.h"

#define SA_DENSE (-1)  /* a matrix's kind: float32 (k, n) row-major; else a GGUF block type (SA_Q8_0, ...) */

typedef struct {       /* one product's weights: out = in W (+ b) */
    const void *w;     /* SA_DENSE: (k, n) floats; blocks: W^T as (n, k / 32 * bytes), as linear_q's */
    int kind;
    int64_t k, n;
    const float *b;    /* (n,) or NULL */
} sa_matrix;

typedef struct {       /* a sublayer's norm: RMSNorm if b is NULL, else LayerNorm */
    const float *g, *b;
} sa_norm;

typedef struct {
    float *x;                      /* (d,) the residual stream, updated in place */
    int64_t d, h, h_kv, dh;        /* width, query heads, K/V heads, head width */
    int post_norm;                 /* 0: x += f(norm(x)); 1: x = norm(x + f(x)) */
    float eps;
    sa_norm norm1, norm_cross, norm2;
    sa_matrix qkv[3], o, cross_q, cross_o, up[2], down;  /* cross_q.w NULL: no cross-attention */
    int n_qkv, n_up;               /* qkv's and up's parts (their outputs side by side) */
    int gate;                      /* up is gate | up (2 d_ff): 1 silu(g) u, 2 gelu_tanh(g) u; 0: relu(in up + b) */
    const float *q_norm, *k_norm;  /* (dh,) RMSNorm gains of each Q and K head before rotary, or NULL */
    const float *post1, *post2;    /* (d,) RMSNorm gains of the sublayers' outputs (sandwich), or NULL */
    float scale;                   /* the attention scores' factor */
    void *K, *V;                   /* the layer's cache: K/V head g's row t at element g head_stride + t row_stride */
    int64_t head_stride, row_stride;
    int kv_half;                   /* the cache's elements: float16 bits (uint16), else float32 */
    int64_t row, key0, nkeys;      /* this token's cache row; the rows its query sees, key0 .. key0 + nkeys */
    const float *cos, *sin;        /* (dh / 2,) the rotary row of position pos, or NULL: no rotary */
    const float *Km, *Vm;          /* cross-attention's keys and values: (n_src, d), heads side by side */
    const uint8_t *keep;           /* (n_src,): 0 at padded source tokens, or NULL */
    int64_t n_src;
    float *qkv_out, *a, *hn, *f, *scores;  /* scratch: ((h + 2 h_kv) dh,), (h dh,), (max(d, d_ff),),
                                              (2 d_ff,), (h, ld_scores) */
    int64_t ld_scores;
    int q8;                        /* the blocks' products take x rounded to 8 bits (round_q8) */
    float *xs, *xd;                /* scratch: a product's block sums (and scales), max k / 32 padded to SA_QCH */
    int8_t *xq;                    /* scratch: with q8, the product's x as int8 (max k) */
    float *parts;                  /* scratch: the threads' partial float32 products, num_threads x max n */
} sa_layer;

#define SA_LAYER_ROWS 16  /* outputs of a quantized product per task, as linear_q.pyx's ROWS_PER_TASK */

/* What a block product needs of its input row first, by W's kind: nothing (Q8_0 and the kinds
 * after the row kernels' with float32 activations), the block sums (Q4_0, Q4_1), or with int8
 * activations the row rounded to 8 bits a block of 32 or (the K-quants) of 256 */
enum { SA_X_NONE = 0, SA_X_SUMS = 1, SA_X_Q8 = 2, SA_X_Q8K = 3 };
static inline int sa_layer_xform(const sa_layer *L, int kind) {
    if (L->q8) return SA_KQUANT(kind) ? SA_X_Q8K : SA_X_Q8;
    return kind == SA_Q4_0 || kind == SA_Q4_1 ? SA_X_SUMS : SA_X_NONE;
}

/* in (k) in the form `form` for the block products, on one thread: the block sums into xs (nbp
 * floats, nbp: k / 32 padded to SA_QCH), or with int8 activations in 8 bits into xq (k) with
 * their scales into xd (nbp) and sums into xs (nbp floats, or with Q8_K's blocks of 256 their sums
 * per 16: k / 16 int16). The padding is zeroed: the kernels read whole SA_QCH runs. */
static inline void sa_prepare_x(int isa, int form, const float *in, int64_t k, int8_t *xq, float *xd, float *xs) {
    const int64_t nbp = (k / 32 + SA_QCH - 1) / SA_QCH * SA_QCH;
    if (form <= SA_X_NONE) return;
    for (int64_t i = 0; i < nbp; i++) xd[i] = 0;
    if (form == SA_X_Q8K) {  /* exactly k / 16 int16: the rows step's next row's sums follow */
        int16_t *xb = (int16_t *)xs;
        for (int64_t i = 0; i < k / 16; i++) xb[i] = 0;
        SA_PICK(sa_quantize_q8k_f32, isa)(in, k, 1, xq, xd, xb);
        return;
    }
    for (int64_t i = 0; i < nbp; i++) xs[i] = 0;
    if (form == SA_X_SUMS)
        SA_PICK(sa_linear_q_xsum_f32, isa)(in, k, 1, xs);
    else
        SA_PICK(sa_quantize_q8_f32, isa)(in, k, 1, xq, xd, xs);
}

/* y[j0:j1] = (add +) in W[j0:j1]^T, ReLU'd if relu (NaN stays NaN), W blocks, in prepared */
static inline void sa_layer_rows(int isa, const sa_layer *L, const sa_matrix *W, const float *in,
                                 const float *add, int relu, int64_t j0, int64_t j1, float *y) {
    const int64_t k = W->k, n = W->n, ldw = k / SA_QWEIGHTS(W->kind) * SA_QBYTES(W->kind);
    const int ext = W->kind >= SA_QROW_KINDS;
    const uint8_t *w = (const uint8_t *)W->w;
    if (L->q8 && SA_KQUANT(W->kind))
        SA_PICK_Q8(sa_linear_q8k_rows_f32, isa)(W->kind, L->xq, L->xd, (const int16_t *)L->xs, k, 1, w, ldw, add,
                                                j0, j1, y, n);
    else if (ext && L->q8)
        SA_PICK_Q8(sa_linear_q8x_rows_f32, isa)(W->kind, L->xq, L->xd, L->xs, k, 1, w, ldw, add, j0, j1, y, n);
    else if (ext)
        SA_PICK(sa_linear_qx_rows_f32, isa)(W->kind, in, k, 1, w, ldw, add, j0, j1, y, n);
    else if (L->q8)
        SA_PICK_Q8(sa_linear_q8_rows_f32, isa)(W->kind, L->xq, L->xd, L->xs, k, 1, w, ldw, n, add, j0, j1, y, n);
    else
        SA_PICK(sa_linear_q_rows_f32, isa)(W->kind, in, k, 1, w, ldw, n, L->xs, add, j0, j1, y, n);
    if (relu)
        for (int64_t j = j0; j < j1; j++) y[j] = y[j] < 0 ? 0 : y[j];
}

/* y = (r +) act(in W + b) over the team (act: relu or none); the caller's barrier before; L's
 * scratch: the block sums (and with q8 the int8 x and its scales) or the threads' partial products. */
static inline void sa_layer_product(int isa, const sa_layer *L, const sa_matrix *W, const float *in,
                                    const float *r, int relu, float *y) {
    float *parts = L->parts;
    const int64_t k = W->k, n = W->n;
    if (W->kind == SA_DENSE) {
        /* each thread a contiguous share of W's rows, streamed forward (a block of columns down all
         * the rows would jump a row's length at every step: a page apart, past the prefetchers),
         * into partial sums of its own; then the threads add them up by columns */
#ifdef _OPENMP
        const int T = omp_get_num_threads(), t = omp_get_thread_num();
#else
        const int T = 1, t = 0;
#endif
        float *part = parts + t * n;
        for (int64_t j = 0; j < n; j++) part[j] = 0;
        SA_PICK(sa_linear_rows_f32, isa)(in, k, 1, (const float *)W->w, n, t * k / T, (t + 1) * k / T, part);
#ifdef _OPENMP
#pragma omp barrier
#pragma omp for schedule(static)
#endif
        for (int64_t j0 = 0; j0 < n; j0 += 256)
            SA_PICK(sa_sum_parts_f32, isa)(parts, T, n, W->b, r, relu, j0, j0 + 256 < n ? j0 + 256 : n, y);
        return;
    }
    const int64_t tasks = (n + SA_LAYER_ROWS - 1) / SA_LAYER_ROWS;
#ifdef _OPENMP
#pragma omp single
#endif
    sa_prepare_x(isa, sa_layer_xform(L, W->kind), in, k, L->xq, L->xd, L->xs);
    /* the row kernels add one vector to their outputs: the residual r, or else W's bias (a block
     * product with both is refused when the record is built) */
    const float *add = r ? r : W->b;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t j0 = t * SA_LAYER_ROWS, j1 = j0 + SA_LAYER_ROWS < n ? j0 + SA_LAYER_ROWS : n;
        sa_layer_rows(isa, L, W, in, add, relu, j0, j1, y);
    }
}

static inline void sa_layer_norm(int isa, const sa_norm *N, const float *x, float eps, float *out, int64_t d) {
    if (N->b)
        SA_PICK(sa_layer_norm_row_f32, isa)(x, N->g, N->b, eps, out, d);
    else
        SA_PICK(sa_rms_norm_row_f32, isa)(x, N->g, eps, out, d);
}

/* Parts side by side (at most 3): each one's first task of SA_LAYER_ROWS outputs, and its first
 * output column */
static inline void sa_parts_layout(const sa_matrix *W, int parts, int64_t *first, int64_t *at) {
    first[0] = at[0] = 0;
    for (int p = 0; p < parts; p++) {
        first[p + 1] = first[p] + (W[p].n + SA_LAYER_ROWS - 1) / SA_LAYER_ROWS;
        at[p + 1] = at[p] + W[p].n;
    }
}

/* Task t's part (returned) and its outputs j0 .. j1 of that part */
static inline int sa_part_task(const sa_matrix *W, const int64_t *first, int64_t t, int64_t *j0, int64_t *j1) {
    int p = 0;
    while (t >= first[p + 1]) p++;
    *j0 = (t - first[p]) * SA_LAYER_ROWS;
    *j1 = *j0 + SA_LAYER_ROWS < W[p].n ? *j0 + SA_LAYER_ROWS : W[p].n;
    return p;
}

/* y = in [W_0 | W_1 | ...] (+ b), act relu or none: the parts' outputs side by side. Block parts
 * whose input takes one form (the usual case: one kind of activations, all blocks of 32 or all of
 * 256) share its preparation and one loop of tasks: a step pays one barrier for them, not one a part. */
static inline void sa_layer_parts(int isa, const sa_layer *L, const sa_matrix *W, int parts, const float *in,
                                  int relu, float *y) {
    int form = W[0].kind == SA_DENSE ? -1 : sa_layer_xform(L, W[0].kind);
    for (int p = 1; p < parts; p++)
        if (W[p].kind == SA_DENSE || sa_layer_xform(L, W[p].kind) != form) form = -1;
    if (form < 0 || parts == 1) {
        for (int p = 0; p < parts; p++) {
            sa_layer_product(isa, L, W + p, in, NULL, relu, y);
            y += W[p].n;
        }
        return;
    }
    int64_t first[4], at[4], j0, j1;
    sa_parts_layout(W, parts, first, at);
#ifdef _OPENMP
#pragma omp single
#endif
    sa_prepare_x(isa, form, in, W[0].k, L->xq, L->xd, L->xs);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t t = 0; t < first[parts]; t++) {
        const int p = sa_part_task(W, first, t, &j0, &j1);
        sa_layer_rows(isa, L, W + p, in, W[p].b, relu, j0, j1, y + at[p]);
    }
}

/* x += rms_norm(y) (a sandwich norm's output added to the residual), on one thread */
static inline void sa_layer_add_normed(int isa, const sa_layer *L, const float *g, float *y) {
    SA_PICK(sa_rms_norm_row_f32, isa)(y, g, L->eps, y, L->d);
    for (int64_t j = 0; j < L->d; j++) L->x[j] += y[j];
}

/* The output product of a sublayer: x += in Wo, or with a sandwich norm x += rms_norm(in Wo), the
 * product then into y (scratch of d) */
static inline void sa_layer_out(int isa, const sa_layer *L, const sa_matrix *Wo, const float *in,
                                const float *post, float *y) {
    if (!post) {
        sa_layer_product(isa, L, Wo, in, L->x, 0, L->x);
        return;
    }
    sa_layer_product(isa, L, Wo, in, NULL, 0, y);
#ifdef _OPENMP
#pragma omp single
#endif
    sa_layer_add_normed(isa, L, post, y);
}

/* a head's row (dh) to element `at` of the cache C: as it is, or rounded to float16 (kv_half) */
static inline void sa_kv_put(int isa, const sa_layer *L, void *C, int64_t at, const float *head) {
    if (L->kv_half) {
        SA_PICK(sa_to_half_f32, isa)(head, (uint16_t *)C + at, L->dh);
    } else {
        float *row = (float *)C + at;
        for (int64_t j = 0; j < L->dh; j++) row[j] = head[j];
    }
}

/* sa_decode_heads for G query heads over n rows of a K/V head of the cache from element `first` */
static inline void sa_kv_heads(int isa, const sa_layer *L, const float *q, int64_t G, const void *K, const void *V,
                               int64_t first, int64_t n, float *s, float *out) {
    if (L->kv_half)
        SA_PICK(sa_decode_heads_h_f32, isa)(q, G, (const uint16_t *)K + first, (const uint16_t *)V + first,
                                            L->row_stride, n, L->dh, L->scale, NULL, s, L->ld_scores, out);
    else
        SA_PICK(sa_decode_heads_f32, isa)(q, G, (const float *)K + first, (const float *)V + first, L->row_stride,
                                          n, L->dh, L->scale, NULL, s, L->ld_scores, out);
}

/* This token's Q and K heads normed (QK-norm) and turned (rotary), its K and V heads to the cache */
static inline void sa_layer_heads(int isa, const sa_layer *L) {
    const int64_t h = L->h, hkv = L->h_kv, dh = L->dh;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t u = 0; u < h + 2 * hkv; u++) {  /* Q heads, K heads, V heads */
        float *head = L->qkv_out + u * dh;
        const float *gain = u < h ? L->q_norm : u < h + hkv ? L->k_norm : NULL;
        if (gain) SA_PICK(sa_rms_norm_row_f32, isa)(head, gain, L->eps, head, dh);
        if (u < h + hkv && L->cos) SA_PICK(sa_rope_row_f32, isa)(head, L->cos, L->sin, head, dh / 2);
        if (u >= h) {
            const int64_t g = u < h + hkv ? u - h : u - h - hkv;
            sa_kv_put(isa, L, u < h + hkv ? L->K : L->V, g * L->head_stride + L->row * L->row_stride, head);
        }
    }
}

/* One attention sublayer: in is its input row (norm(x), or x post-norm); qkv_out: the projection's
 * output, Q heads then (self-attention) K and V heads; afterwards x is updated (residual, norm). */
static inline void sa_layer_attention(int isa, const sa_layer *L, const sa_norm *N, const sa_matrix *Wq,
                                      int n_q, const sa_matrix *Wo, const float *post, int cross) {
    const int64_t h = L->h, hkv = L->h_kv, dh = L->dh, d = L->d, group = h / hkv;
    const float *in = L->x;
    if (!L->post_norm) {
#ifdef _OPENMP
#pragma omp single
#endif
        sa_layer_norm(isa, N, L->x, L->eps, L->hn, d);
        in = L->hn;
    }
    sa_layer_parts(isa, L, Wq, n_q, in, 0, L->qkv_out);
    if (!cross) sa_layer_heads(isa, L);
    /* a thread's contiguous run of query heads, cut where the K/V head changes: the run's heads of
     * one group in one call (sa_decode_heads), so that the group's keys and values come in once */
#ifdef _OPENMP
    const int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
#else
    const int64_t T = 1, t = 0;
#endif
    for (int64_t u = t * h / T, u1 = (t + 1) * h / T, end; u < u1; u = end) {
        const int64_t g = u / group;
        end = (g + 1) * group < u1 ? (g + 1) * group : u1;
        if (cross)  /* the memory's keys and values: float32, heads side by side */
            SA_PICK(sa_decode_heads_f32, isa)(L->qkv_out + u * dh, end - u, L->Km + g * dh, L->Vm + g * dh, d,
                                              L->n_src, dh, L->scale, L->keep, L->scores + u * L->ld_scores,
                                              L->ld_scores, L->a + u * dh);
        else
            sa_kv_heads(isa, L, L->qkv_out + u * dh, end - u, L->K, L->V,
                        g * L->head_stride + L->key0 * L->row_stride, L->nkeys, L->scores + u * L->ld_scores,
                        L->a + u * dh);
    }
#ifdef _OPENMP
#pragma omp barrier
#endif
    sa_layer_out(isa, L, Wo, L->a, post, L->hn);  /* hn is free: the projection has read it */
    if (L->post_norm) {
#ifdef _OPENMP
#pragma omp single
#endif
        sa_layer_norm(isa, N, L->x, L->eps, L->x, d);
    }
}

static void sa_layer_run(int isa, const sa_layer *L, int num_threads) {
    (void)num_threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(num_threads)
#endif
    {
        const int64_t d = L->d, dff = L->down.k;
        sa_layer_attention(isa, L, &L->norm1, L->qkv, L->n_qkv, &L->o, L->post1, 0);
        if (L->cross_q.w) sa_layer_attention(isa, L, &L->norm_cross, &L->cross_q, 1, &L->cross_o, NULL, 1);
        const float *in = L->x;
        if (!L->post_norm) {
#ifdef _OPENMP
#pragma omp single
#endif
            sa_layer_norm(isa, &L->norm2, L->x, L->eps, L->hn, d);
            in = L->hn;
        }
        /* the hidden row: act(g) u into hn (up's output, gate | up, in f), or relu(in up + b) in f */
        sa_layer_parts(isa, L, L->up, L->n_up, in, !L->gate, L->f);
        if (L->gate) {
#ifdef _OPENMP
#pragma omp single
#endif
            {
                if (L->gate == 2)
                    SA_PICK(sa_gelu_tanh_mul_row_f32, isa)(L->f, L->f + dff, L->hn, dff);
                else
                    SA_PICK(sa_silu_mul_row_f32, isa)(L->f, L->f + dff, L->hn, dff);
            }
        }
        /* a sandwich norm's product goes to the buffer the down product does not read */
        sa_layer_out(isa, L, &L->down, L->gate ? L->hn : L->f, L->post2, L->gate ? L->f : L->hn);
        if (L->post_norm) {
#ifdef _OPENMP
#pragma omp single
#endif
            sa_layer_norm(isa, &L->norm2, L->x, L->eps, L->x, d);
        }
    }
}

/* ---- A batch's rows through one layer (batched decoding: each row a sequence's token at its own
 * position over its own cache), in one call: the same stages as sa_layer_run, each over the m
 * rows, the products' row kernels taking up to 8 rows of x a pass over W (4 for the float32
 * K-quant and Q5 kernels, as silkattn._api's QX_ROWS). The Llama family's layers: block products,
 * pre-norm, self-attention (no cross-attention, no float32 weights: sa_layer_run takes those). */
typedef struct {
    int64_t m;              /* rows */
    float *x;               /* (m, d): the residual rows, updated in place */
    void *K, *V;            /* the pool of caches, each laid out as L->K's (h_kv head_stride elements, L->kv_half's) */
    const int64_t *at;      /* (m, 4): each row's cache row, first key row seen, keys seen, and the
                               offset (elements) of its cache in K and V (its page's) */
    const float *cos, *sin; /* (m, dh / 2): each row's rotary row, or NULL: no rotary */
    float *qkv, *a, *hn, *f, *y, *scores;  /* scratch: (m, (h + 2 h_kv) dh), (m, h dh), (m, max(d, d_ff)),
                                              (m, 2 d_ff), (m, d), (m h, L->ld_scores) */
    float *xs, *xd;         /* scratch: (m, nbp) of the widest product input (nbp: its k / 32 padded to SA_QCH) */
    int8_t *xq;             /* scratch: (m, the widest k) */
} sa_rows;

/* y[:, j0:j1] (ld ldy) = in W[j0:j1]^T (+ b) for mr <= 8 rows of x (in, xq: their first; xd, xs: the
 * forms' rows of stride nbp, the K-quants' sums of stride k / 16 int16) */
static inline void sa_rows_block(int isa, const sa_layer *L, const sa_matrix *W, const float *in, const int8_t *xq,
                                 const float *xd, const float *xs, int64_t mr, int64_t j0, int64_t j1, float *y,
                                 int64_t ldy) {
    const int64_t k = W->k, n = W->n, ldw = k / SA_QWEIGHTS(W->kind) * SA_QBYTES(W->kind);
    const int ext = W->kind >= SA_QROW_KINDS;
    const uint8_t *w = (const uint8_t *)W->w;
    if (L->q8 && SA_KQUANT(W->kind))
        SA_PICK_Q8(sa_linear_q8k_rows_f32, isa)(W->kind, xq, xd, (const int16_t *)xs, k, mr, w, ldw, W->b, j0, j1,
                                                y, ldy);
    else if (ext && L->q8)
        SA_PICK_Q8(sa_linear_q8x_rows_f32, isa)(W->kind, xq, xd, xs, k, mr, w, ldw, W->b, j0, j1, y, ldy);
    else if (ext)
        SA_PICK(sa_linear_qx_rows_f32, isa)(W->kind, in, k, mr, w, ldw, W->b, j0, j1, y, ldy);
    else if (L->q8)
        SA_PICK_Q8(sa_linear_q8_rows_f32, isa)(W->kind, xq, xd, xs, k, mr, w, ldw, n, W->b, j0, j1, y, ldy);
    else
        SA_PICK(sa_linear_q_rows_f32, isa)(W->kind, in, k, mr, w, ldw, n, xs, W->b, j0, j1, y, ldy);
}

/* Row r of in (ld k) in the form `form` for the rows step's block products (R's xq, xd, xs: the
 * row's at r k, r nbp, and r nbp floats or, Q8_K's sums, r k / 16 int16) */
static inline void sa_rows_prepare_row(int isa, const sa_rows *R, int form, const float *in, int64_t k, int64_t r) {
    const int64_t nbp = (k / 32 + SA_QCH - 1) / SA_QCH * SA_QCH;
    float *xs = form == SA_X_Q8K ? (float *)((int16_t *)R->xs + r * (k / 16)) : R->xs + r * nbp;
    sa_prepare_x(isa, form, in + r * k, k, R->xq + r * k, R->xd + r * nbp, xs);
}

/* The one form the parts' inputs take, or -1 (parts of different forms: each prepares its own) */
static inline int sa_rows_form(const sa_layer *L, const sa_matrix *W, int parts) {
    int form = sa_layer_xform(L, W[0].kind);
    for (int p = 1; p < parts; p++)
        if (sa_layer_xform(L, W[p].kind) != form) form = -1;
    return form;
}

/* y (m rows, ld ldy) = in [W_0 | W_1 | ...] (+ b) for the m rows of in (ld k) over the team, the
 * parts' outputs side by side: parts whose input takes one form share its preparation and one loop
 * of tasks (as sa_layer_parts). prepared: the caller prepared the rows in that form (its loop over
 * the rows, one barrier for both). The caller's barrier before; the loops' after. */
static inline void sa_rows_product(int isa, const sa_layer *L, const sa_rows *R, const sa_matrix *W, int parts,
                                   const float *in, float *y, int64_t ldy, int prepared) {
    const int64_t k = W[0].k, m = R->m, nbp = (k / 32 + SA_QCH - 1) / SA_QCH * SA_QCH;
    const int form = sa_rows_form(L, W, parts);
    if (form < 0) {
        for (int p = 0; p < parts; p++) {
            sa_rows_product(isa, L, R, W + p, 1, in, y, ldy, 0);
            y += W[p].n;
        }
        return;
    }
    if (!prepared && form != SA_X_NONE) {
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t r = 0; r < m; r++) sa_rows_prepare_row(isa, R, form, in, k, r);
    }
    int64_t first[4], at[4], j0, j1;
    sa_parts_layout(W, parts, first, at);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t t = 0; t < first[parts]; t++) {
        const int p = sa_part_task(W, first, t, &j0, &j1);
        const int step = !L->q8 && W[p].kind >= SA_QROW_KINDS ? 4 : 8;
        for (int64_t r0 = 0; r0 < m; r0 += step) {
            const float *xs = form == SA_X_Q8K ? (const float *)((const int16_t *)R->xs + r0 * (k / 16))
                                               : R->xs + r0 * nbp;
            sa_rows_block(isa, L, W + p, in + r0 * k, R->xq + r0 * k, R->xd + r0 * nbp, xs,
                          m - r0 < step ? m - r0 : step, j0, j1, y + at[p] + r0 * ldy, ldy);
        }
    }
}

/* x_r += y_r, or with a sandwich norm (post: its gain, of layer A) x_r += rms_norm(y_r) */
static inline void sa_rows_add(int isa, const sa_layer *A, const float *post, const sa_rows *R, int64_t r) {
    float *y = R->y + r * A->d, *x = R->x + r * A->d;
    if (post) SA_PICK(sa_rms_norm_row_f32, isa)(y, post, A->eps, y, A->d);
    for (int64_t j = 0; j < A->d; j++) x[j] += y[j];
}

/* Row r between two products, in one loop over the rows (one barrier, not one a stage): the
 * residual add of layer A's output (A NULL: none; post: its sandwich norm), then hn_r = norm(x_r)
 * if N, then the input of L's next product (W, parts: hn_r, or with N NULL in) in its form. */
static inline void sa_rows_between(int isa, const sa_layer *L, const sa_rows *R, const sa_layer *A,
                                   const float *post, const sa_norm *N, const sa_matrix *W, int parts,
                                   const float *in, int64_t r) {
    if (A) sa_rows_add(isa, A, post, R, r);
    if (N) sa_layer_norm(isa, N, R->x + r * L->d, L->eps, R->hn + r * L->d, L->d);
    sa_rows_prepare_row(isa, R, sa_rows_form(L, W, parts), N ? R->hn : in, W[0].k, r);
}

/* Row r's K/V head g: the group's query heads and the key head normed (QK-norm) and turned
 * (rotary), the key and value heads to the row's cache, then the query heads over the row's keys
 * (in one call, so that the head's keys and values come from memory once and into the core once:
 * sa_decode_heads). A task reads and writes only its own heads and its row's cache rows. */
static inline void sa_rows_attend(int isa, const sa_layer *L, const sa_rows *R, int64_t nq, int64_t r, int64_t g) {
    const int64_t h = L->h, hkv = L->h_kv, dh = L->dh, half = dh / 2, group = h / hkv;
    const int64_t *at = R->at + 4 * r;
    float *qkv = R->qkv + r * nq;
    for (int64_t i = 0; i < group + 2; i++) {  /* the query heads, then the key head, then the value head */
        const int64_t u = i < group ? g * group + i : i == group ? h + g : h + hkv + g;
        float *head = qkv + u * dh;
        const float *gain = i < group ? L->q_norm : i == group ? L->k_norm : NULL;
        if (gain) SA_PICK(sa_rms_norm_row_f32, isa)(head, gain, L->eps, head, dh);
        if (i <= group && R->cos) SA_PICK(sa_rope_row_f32, isa)(head, R->cos + r * half, R->sin + r * half, head, half);
        if (i >= group)
            sa_kv_put(isa, L, i == group ? R->K : R->V, at[3] + g * L->head_stride + at[0] * L->row_stride, head);
    }
    const int64_t u = g * group;
    sa_kv_heads(isa, L, qkv + u * dh, group, R->K, R->V, at[3] + g * L->head_stride + at[1] * L->row_stride, at[2],
                R->scores + (r * h + u) * L->ld_scores, R->a + r * h * dh + u * dh);
}

/* The rows through one layer, the team's share of each stage (inside a parallel region). The
 * previous layer's last residual add (prev: that layer, or NULL for the first) is this layer's
 * first stage, with the norm and the first product's input; this layer's is left to the next
 * layer, or to the caller after the last. Nine barriers a layer. */
static void sa_layer_rows_body(int isa, const sa_layer *L, const sa_layer *prev, const sa_rows *R) {
    const int64_t m = R->m, hkv = L->h_kv, dff = L->down.k;
    int64_t nq = 0, nu = 0;
    for (int p = 0; p < L->n_qkv; p++) nq += L->qkv[p].n;
    for (int p = 0; p < L->n_up; p++) nu += L->up[p].n;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t r = 0; r < m; r++)
        sa_rows_between(isa, L, R, prev, prev ? prev->post2 : NULL, &L->norm1, L->qkv, L->n_qkv, NULL, r);
    sa_rows_product(isa, L, R, L->qkv, L->n_qkv, R->hn, R->qkv, nq, 1);
    /* a task a row's K/V head. Rows of unequal key counts: a static split left one thread waiting. */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
    for (int64_t rg = 0; rg < m * hkv; rg++) sa_rows_attend(isa, L, R, nq, rg / hkv, rg % hkv);
    sa_rows_product(isa, L, R, &L->o, 1, R->a, R->y, L->d, 0);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t r = 0; r < m; r++) sa_rows_between(isa, L, R, L, L->post1, &L->norm2, L->up, L->n_up, NULL, r);
    sa_rows_product(isa, L, R, L->up, L->n_up, R->hn, R->f, nu, 1);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t r = 0; r < m; r++) {  /* act(gate) up into hn (ld d_ff), then the down product's input */
        if (L->gate == 2)
            SA_PICK(sa_gelu_tanh_mul_row_f32, isa)(R->f + r * nu, R->f + r * nu + dff, R->hn + r * dff, dff);
        else
            SA_PICK(sa_silu_mul_row_f32, isa)(R->f + r * nu, R->f + r * nu + dff, R->hn + r * dff, dff);
        sa_rows_between(isa, L, R, NULL, NULL, NULL, &L->down, 1, R->hn, r);
    }
    sa_rows_product(isa, L, R, &L->down, 1, R->hn, R->y, L->d, 1);
}

/* The rows through n layers in turn in one parallel region (one team for all of them, a barrier
 * between stages, not a new team each): layer l's record Ls[l] over its pools K[l], V[l], its
 * rows' cache positions at[l] (a window's layers see other keys) and rotary rows cos[l], sin[l]
 * (NULL: none); R's other fields (the rows, the scratch, sized for the widest layer) shared. */
static void sa_layers_run_rows(int isa, const sa_layer *Ls, int n, const sa_rows *R, void *const *K,
                               void *const *V, const int64_t *const *at, const float *const *cos,
                               const float *const *sin, int num_threads) {
    (void)num_threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(num_threads)
#endif
    {
        for (int l = 0; l < n; l++) {
            sa_rows Rl = *R;
            Rl.K = K[l], Rl.V = V[l], Rl.at = at[l], Rl.cos = cos[l], Rl.sin = sin[l];
            sa_layer_rows_body(isa, Ls + l, l ? Ls + l - 1 : NULL, &Rl);
        }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t r = 0; r < R->m; r++) sa_rows_add(isa, Ls + n - 1, Ls[n - 1].post2, R, r);  /* the last layer's */
    }
}
