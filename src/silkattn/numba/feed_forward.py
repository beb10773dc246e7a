"""Numba kernels of the feed-forward's elementwise steps, in place over the rows of a C-contiguous
(rows, n) array: h = max(h + b, 0) and h = gelu(h + b) = v (1 + erf(v / sqrt 2)) / 2, v = h + b."""
import math

import numpy as np
from numba import prange, types
from numba.extending import overload

from ._jit import jit
from ._simd import CACHE, FASTMATH

SQRT_HALF = 0.70710678118654752440


@jit(inline="always", fastmath=FASTMATH)
def _erf32(x):
    """erf for float32: a rational approximation on x clamped to [-4, 4] (odd numerator of degree 13,
    even denominator of degree 8; the monomial coefficients of Eigen's and XLA's fast float erf),
    within 4.2e-7 of erf; branch-free, so LLVM vectorises the loop around it."""
    x = min(max(x, np.float32(-4)), np.float32(4))
    x2 = x * x
    p = x2 * np.float32(-2.72614225801306e-10) + np.float32(2.77068142495902e-08)
    p = p * x2 + np.float32(-2.10102402082508e-06)
    p = p * x2 + np.float32(-5.69250639462346e-05)
    p = p * x2 + np.float32(-7.34990630326855e-04)
    p = p * x2 + np.float32(-2.95459980854025e-03)
    p = p * x2 + np.float32(-1.60960333262415e-02)
    q = x2 * np.float32(-1.45660718464996e-05) + np.float32(-2.13374055278905e-04)
    q = q * x2 + np.float32(-1.68282697438203e-03)
    q = q * x2 + np.float32(-7.37332916720468e-03)
    q = q * x2 + np.float32(-1.42647390514189e-02)
    return x * p / q


def _erf(x):
    """erf in x's dtype: _erf32 for float32 (math.erf would widen to float64), else math.erf."""
    return _erf32(x) if isinstance(x, np.float32) else math.erf(x)


@overload(_erf, inline="always")
def _erf_typed(x):
    return (lambda x: _erf32(x)) if x == types.float32 else (lambda x: math.erf(x))


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def bias_act_rows(h, b, gelu):
    """h = gelu(h + b) if gelu else max(h + b, 0), in place, in h's dtype."""
    rows, n = h.shape
    if gelu:
        c = np.empty(3, h.dtype)  # the constants in h's dtype
        c[0], c[1], c[2] = SQRT_HALF, 0.5, 1
        for i in prange(rows):
            for j in range(n):
                v = h[i, j] + b[j]
                h[i, j] = v * (c[2] + _erf(v * c[0])) * c[1]
    else:
        for i in prange(rows):
            for j in range(n):
                v = h[i, j] + b[j]
                h[i, j] = v if not v < 0 else 0  # NaN stays NaN, as with np.maximum


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def gelu_backward_rows(dh, z, dz):
    """dz = dh gelu'(z), gelu'(z) = (1 + erf(z / sqrt 2)) / 2 + z e^(-z^2 / 2) / sqrt(2 pi) (dz may be
    dh)."""
    rows, n = z.shape
    c = np.empty(4, z.dtype)  # the constants in z's dtype
    c[0], c[1], c[2], c[3] = SQRT_HALF, 0.5, 1, 0.39894228040143267794
    for i in prange(rows):
        for j in range(n):
            v = z[i, j]
            bump = v * math.exp(max(-v * v * c[1], -80)) * c[3]  # z phi(z)
            dz[i, j] = dh[i, j] * ((c[2] + _erf(v * c[0])) * c[1] + bump)
