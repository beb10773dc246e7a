/* The SwiGLU gate over one row: out = silu(g) u = g / (1 + exp(-g)) * u. Template: see instances.h. */
#include "tmpl_simd.h"

/* exp(-g) as the reference's np.exp: expv, which holds up to 88 (float) / 709 (double), and +inf
 * above, where silu(g) is then g / inf = -0 as the reference's (and NaN at g = -inf, as its). */
static inline VEC SA_FN(silu_mul_vec)(VEC g, VEC u) {
    const SA_T top = sizeof(SA_T) == 4 ? 88 : 709;
    const VEC v = -g, t = SA_FN(splat)(top);
    const IVEC over = v > t;
    const VEC e = SA_FN(select)(over, SA_FN(splat)(INFINITY), SA_FN(expv)(SA_FN(select)(over, t, v)));
    return g / (1 + e) * u;
}

/* out may be g or u (in place): each element is read before its store. The tail that is not a
 * whole vector goes through a padded vector. */
static void SA_FN(sa_silu_mul_row)(const SA_T *g, const SA_T *u, SA_T *out, int64_t n) {
    int64_t j = 0;
    for (; j + SA_VL <= n; j += SA_VL) STORE(out + j, SA_FN(silu_mul_vec)(LOAD(g + j), LOAD(u + j)));
    if (j < n) {
        VEC a = SA_FN(splat)(0), b = a;
        for (int64_t i = j; i < n; i++) { a[i - j] = g[i]; b[i - j] = u[i]; }
        a = SA_FN(silu_mul_vec)(a, b);
        for (int64_t i = j; i < n; i++) out[i] = a[i - j];
    }
}
