/* The kernels' generic copy (kernels/instances.h: GCC/Clang vector extensions, what a non-x86 build
 * runs) checked against plain double-precision loops, without Python: built for aarch64 with a cross
 * compiler and run under qemu-user by tests/test_cross.py. One op a build (each op's header
 * instantiates the shared vector helpers), chosen by -DCHECK_<OP>; exit status 0 when it matches. */
#include <stdio.h>

enum { R = 5, N = 77, K = 37 };  /* rows, row length (not a multiple of any vector), linear's k */

/* Each op: its header, its name, and OP(T, S), which runs the generic copy on x (r, g, b, w as it
 * needs) into out and writes the double-precision answer into want. */
#if defined(CHECK_SOFTMAX)
#include "softmax.h"
#define NAME "softmax"
#define OP(T, S)                                                                              \
    for (int i = 0; i < R; i++) {                                                             \
        const T *xi = x + i * N;                                                              \
        double mx = -INFINITY, z = 0;                                                         \
        for (int j = 0; j < N; j++) mx = xi[j] > mx ? xi[j] : mx;                       \
        for (int j = 0; j < N; j++) z += exp(xi[j] - mx);                                     \
        for (int j = 0; j < N; j++) want[i * N + j] = exp(xi[j] - mx) / z;                    \
        sa_softmax_row_##S(SA_ISA_GENERIC, xi, out + i * N, N);                               \
    }
#elif defined(CHECK_LAYER_NORM)
#include "layer_norm.h"
#define NAME "layer_norm"
#define OP(T, S)                                                                              \
    for (int i = 0; i < R; i++) {                                                             \
        const T *xi = x + i * N;                                                              \
        double mu = 0, var = 0;                                                               \
        for (int j = 0; j < N; j++) mu += xi[j] / (double)N;                                  \
        for (int j = 0; j < N; j++) var += (xi[j] - mu) * (xi[j] - mu) / N;                   \
        for (int j = 0; j < N; j++) want[i * N + j] = g[j] * (xi[j] - mu) / sqrt(var + 1e-5) + b[j]; \
        sa_layer_norm_row_##S(SA_ISA_GENERIC, xi, g, b, (T)1e-5, out + i * N, N);             \
    }
#elif defined(CHECK_RMS_NORM)
#include "rms_norm.h"
#define NAME "add_rms_norm"
#define OP(T, S)                                                                              \
    for (int i = 0; i < R; i++) {                                                             \
        const T *xi = x + i * N, *ri = r + i * N;                                             \
        double ms = 0;                                                                        \
        for (int j = 0; j < N; j++) ms += ((double)xi[j] + ri[j]) * ((double)xi[j] + ri[j]) / N; \
        for (int j = 0; j < N; j++) want[i * N + j] = g[j] * ((double)xi[j] + ri[j]) / sqrt(ms + 1e-6); \
        sa_add_rms_norm_row_##S(SA_ISA_GENERIC, xi, ri, g, (T)1e-6, sum + i * N, out + i * N, N); \
    }
#elif defined(CHECK_SILU_MUL)
#include "silu_mul.h"
#define NAME "silu_mul"
#define OP(T, S)                                                                              \
    for (int i = 0; i < R * N; i++) want[i] = x[i] / (1 + exp(-(double)x[i])) * r[i];        \
    for (int i = 0; i < R; i++) sa_silu_mul_row_##S(SA_ISA_GENERIC, x + i * N, r + i * N, out + i * N, N);
#elif defined(CHECK_LINEAR)
#include "linear.h"
#define NAME "linear"
#define ATOL_SCALE K  /* sums of K products */
#define OP(T, S) /* out = x[:, :K] w, w (K, N) */                                             \
    for (int i = 0; i < R; i++)                                                               \
        for (int j = 0; j < N; j++) {                                                         \
            want[i * N + j] = 0, out[i * N + j] = 0;                                          \
            for (int k = 0; k < K; k++) want[i * N + j] += (double)x[i * N + k] * w[k * N + j]; \
        }                                                                                     \
    sa_linear_rows_##S(SA_ISA_GENERIC, x, N, R, w, N, 0, K, out);
#else
#error "build with one of -DCHECK_SOFTMAX, _LAYER_NORM, _RMS_NORM, _SILU_MUL, _LINEAR"
#endif

#ifndef ATOL_SCALE
#define ATOL_SCALE 1
#endif

static double rnd(unsigned *s) { *s = *s * 1664525u + 1013904223u; return (double)(*s >> 8) / (1 << 24) * 4 - 2; }

/* One dtype: inputs in [-2, 2), then the worst |out - want| / (atol + rtol |want|), which must be <= 1
 * (rtol, atol: silkattn._testing.TOL's, atol scaled by ATOL_SCALE). */
#define CHECK(T, S, rtol, atol)                                                               \
    static int check_##S(void) {                                                             \
        static T x[R * N], r[R * N], g[N], b[N], w[K * N], out[R * N], sum[R * N];            \
        static double want[R * N];                                                            \
        unsigned s = 7;                                                                       \
        double worst = 0;                                                                     \
        for (int i = 0; i < R * N; i++) x[i] = (T)rnd(&s), r[i] = (T)rnd(&s);                  \
        for (int j = 0; j < N; j++) g[j] = (T)rnd(&s), b[j] = (T)rnd(&s);                      \
        for (int i = 0; i < K * N; i++) w[i] = (T)rnd(&s);                                    \
        OP(T, S)                                                                              \
        (void)sum, (void)b, (void)g, (void)w, (void)r;                                        \
        for (int i = 0; i < R * N; i++) {                                                     \
            const double e = fabs(out[i] - want[i]) / (atol * ATOL_SCALE + rtol * fabs(want[i]));      \
            worst = e > worst || e != e ? e : worst;                                          \
        }                                                                                     \
        printf("%-12s %s  worst error / tolerance %.3g  %s\n", NAME, #S, worst, worst <= 1 ? "ok" : "FAIL"); \
        return worst <= 1;                                                                    \
    }
CHECK(float, f32, 1e-4, 1e-5)
CHECK(double, f64, 1e-10, 1e-11)

int main(void) {
    const int f32 = check_f32(), f64 = check_f64();
    return !(f32 && f64);
}
