/* Rotary embedding of one row. Template: see instances.h.
 * out[i] = x[i] c[i] - x[i + h] s[i], out[i + h] = x[i + h] c[i] + x[i] s[i] for i < h = d_head / 2,
 * c and s the row of the cos/sin tables at the row's position (silkattn._api computes them exactly as
 * the reference does). This module is compiled with -ffp-contract=off (setup.py): each product is
 * rounded before the sum, as NumPy's are, so the result is the reference's to the last bit instead
 * of one FMA's rounding away (which at a large |x| with cancellation is far from the result). */
#include "tmpl_simd.h"

/* out may be x (in place): each element is read before the store that overwrites it */
static void SA_FN(sa_rope_row)(const SA_T *x, const SA_T *c, const SA_T *s, SA_T *out, int64_t h) {
    const int64_t hv = h - h % SA_VL;
    int64_t i;
    for (i = 0; i < hv; i += SA_VL) {
        const VEC a = LOAD(x + i), b = LOAD(x + h + i), ci = LOAD(c + i), si = LOAD(s + i);
        STORE(out + i, a * ci - b * si);
        STORE(out + h + i, b * ci + a * si);
    }
    for (; i < h; i++) {
        const SA_T a = x[i], b = x[h + i];
        out[i] = a * c[i] - b * s[i];
        out[h + i] = b * c[i] + a * s[i];
    }
}
