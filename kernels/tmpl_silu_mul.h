/* The gates of a gated feed-forward over one row: out = silu(g) u = g / (1 + exp(-g)) u (SwiGLU) and
 * out = gelu_tanh(g) u = g / (1 + exp(-2 c (g + 0.044715 g^3))) u, c = sqrt(2 / pi) (GeGLU: the tanh
 * form's (1 + tanh y) / 2 is the logistic of 2 y). Template: see instances.h. */
#include "tmpl_simd.h"

/* exp(-g) as the reference's np.exp: expv, which holds up to 88 (float) / 709 (double), and +inf
 * above, where silu(g) is then g / inf = -0 as the reference's (and NaN at g = -inf, as its). */
static inline VEC SA_FN(gate_vec)(VEC g, VEC u, int gelu) {
    const SA_T top = sizeof(SA_T) == 4 ? 88 : 709, c2 = (SA_T)1.5957691216057308; /* 2 sqrt(2 / pi) */
    const VEC v = gelu ? -c2 * (g + (SA_T)0.044715 * g * g * g) : -g, t = SA_FN(splat)(top);
    const IVEC over = v > t;
    const VEC e = SA_FN(select)(over, SA_FN(splat)(INFINITY), SA_FN(expv)(SA_FN(select)(over, t, v)));
    return g / (1 + e) * u;
}

/* out may be g or u (in place): each element is read before its store. The tail that is not a
 * whole vector goes through a padded vector. */
static void SA_FN(sa_gate_row)(const SA_T *g, const SA_T *u, SA_T *out, int64_t n, int gelu) {
    int64_t j = 0;
    for (; j + SA_VL <= n; j += SA_VL) STORE(out + j, SA_FN(gate_vec)(LOAD(g + j), LOAD(u + j), gelu));
    if (j < n) {
        VEC a = SA_FN(splat)(0), b = a;
        for (int64_t i = j; i < n; i++) { a[i - j] = g[i]; b[i - j] = u[i]; }
        a = SA_FN(gate_vec)(a, b, gelu);
        for (int64_t i = j; i < n; i++) out[i] = a[i - j];
    }
}

static void SA_FN(sa_silu_mul_row)(const SA_T *g, const SA_T *u, SA_T *out, int64_t n) {
    SA_FN(sa_gate_row)(g, u, out, n, 0);
}

static void SA_FN(sa_gelu_tanh_mul_row)(const SA_T *g, const SA_T *u, SA_T *out, int64_t n) {
    SA_FN(sa_gate_row)(g, u, out, n, 1);
}
