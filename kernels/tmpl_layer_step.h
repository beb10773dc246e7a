/* The pieces of a decoder layer's step for one token that the other templates lack: attention of one
 * query row over cached keys (tmpl_decode.h, over a float32 or a float16 cache, and the float16
 * rows' conversions), and the sum of a float32 product's partial results. Template:
 * see instances.h; float only, as linear_q. The step's other stages are those templates' row
 * kernels (rms_norm, layer_norm, silu_mul, linear_q, rope), instantiated here too so that one call
 * runs them all (layer_step.h). */
#include "tmpl_rms_norm.h"
#include "tmpl_layer_norm.h"
#include "tmpl_silu_mul.h"
#include "tmpl_linear_q.h"
#include "tmpl_linear.h"
/* rope without FMA contraction, as its own module is built (tmpl_rope.h says why) */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#include "tmpl_rope.h"
#pragma GCC pop_options
#if SA_TBYTES == 4

/* ---- Float16 rows (a float16 KV cache): widened exactly; rounded to nearest even as F16C's
 * vcvtps2ph with _MM_FROUND_TO_NEAREST_INT and numpy's astype(np.float16) round (the copies
 * without F16C: quant_ext.h's integer conversions, the same bits) */
static inline __attribute__((always_inline)) VEC SA_FN(load_half)(const uint16_t *p) {  /* SA_VL of them */
#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512F__)
    return (VEC)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif SA_X86 && SA_VBYTES >= 32 && defined(__F16C__)
    VEC v;  /* avx2x64: two conversions of 8 */
    for (int i = 0; i < SA_VL; i += 8) {
        const __m256 w = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + i)));
        memcpy((SA_T *)&v + i, &w, sizeof w);
    }
    return v;
#else
    VEC v;  /* GCC's _Float16 vectors convert a lane at a time anyway (GCC 12) */
    for (int i = 0; i < SA_VL; i++) v[i] = sa_f16_bits(p[i]);
    return v;
#endif
}

static inline void SA_FN(widen_half)(const uint16_t *h, SA_T *out, int64_t n) {  /* out[:n] = h[:n] */
    int64_t j = 0;
    for (; j + SA_VL <= n; j += SA_VL) STORE(out + j, SA_FN(load_half)(h + j));
    for (; j < n; j++) out[j] = sa_f16_bits(h[j]);
}

static void SA_FN(sa_to_half)(const SA_T *x, uint16_t *h, int64_t n) {  /* h[:n] = x[:n] rounded */
    int64_t j = 0;
#if SA_X86 && SA_VBYTES == 64 && defined(__AVX512F__)
    for (; j + 16 <= n; j += 16)
        _mm256_storeu_si256((__m256i *)(h + j), _mm512_cvtps_ph(_mm512_loadu_ps(x + j), _MM_FROUND_TO_NEAREST_INT));
#elif SA_X86 && SA_VBYTES >= 32 && defined(__F16C__)
    for (; j + 8 <= n; j += 8)
        _mm_storeu_si128((__m128i *)(h + j), _mm256_cvtps_ph(_mm256_loadu_ps(x + j), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; j < n; j++) h[j] = sa_f16_round(x[j]);
}

/* sa_decode_heads over a float32 cache, and sa_decode_heads_h over a float16 one */
#define SA_KV_HALF 0
#include "tmpl_decode.h"
#undef SA_KV_HALF
#define SA_KV_HALF 1
#include "tmpl_decode.h"
#undef SA_KV_HALF

/* y[j] = (r[j] +) act(b[j] + sum_t parts[t n + j]) for j0 <= j < j1: the T threads' partial products
 * (each x . w over its share of w's rows, sa_linear_rows) added up; act: max(0, .) if relu (NaN stays
 * NaN); r and b may be NULL; r may be y (a residual add in place: each y[j] is read, then written). */
static void SA_FN(sa_sum_parts)(const SA_T *parts, int T, int64_t n, const SA_T *b, const SA_T *r, int relu,
                                int64_t j0, int64_t j1, SA_T *y) {
    int64_t j = j0;
    for (; j + SA_VL <= j1; j += SA_VL) {
        VEC v = b ? LOAD(b + j) : SA_FN(splat)(0);
        for (int t = 0; t < T; t++) v += LOAD(parts + t * n + j);
        if (relu) v = SA_FN(select)(v < SA_FN(splat)(0), SA_FN(splat)(0), v);
        if (r) v += LOAD(r + j);
        STORE(y + j, v);
    }
    for (; j < j1; j++) {
        SA_T v = b ? b[j] : 0;
        for (int t = 0; t < T; t++) v += parts[t * n + j];
        if (relu) v = v < 0 ? 0 : v;
        y[j] = (r ? r[j] : 0) + v;
    }
}

#endif
