"""Numba kernels of the gated feed-forward's gates over rows given as offsets into flat views
(silkattn._api._row_layout), one thread per block of rows: SwiGLU's out = silu(g) u = g / (1 +
exp(-g)) u and GeGLU's out = gelu_tanh(g) u = g / (1 + exp(-2 c (g + 0.044715 g^3))) u, c =
sqrt(2 / pi) (the tanh form's (1 + tanh y) / 2 is the logistic of 2 y)."""
import numpy as np
from numba import prange

from ._jit import jit
from ._simd import CACHE, FASTMATH, vadd, vdiv, vexp, vload, vmax, vmin, vmul, vsplat, vstore, vsub, vwidth


@jit(inline="always", fastmath=FASTMATH)
def _silu_mul(g, u, one, top, inf):
    """silu(g) u on one register. exp(-g) as the reference's np.exp: vexp up to `top` (88 float, 709
    double; it has no clamp at the top) and +inf above, where silu(g) is g / inf = -0 as the
    reference's (NaN at g = -inf, as its): (v - top) inf is +inf there and -inf (or NaN at v = top)
    elsewhere, which vmax drops."""
    return _logistic_mul(g, vsub(vsplat(g, 0), g), u, one, top, inf)


@jit(inline="always", fastmath=FASTMATH)
def _logistic_mul(g, v, u, one, top, inf):  # g / (1 + exp(v)) u, exp as _silu_mul's
    e = vmax(vexp(vmin(v, top)), vmul(vsub(v, top), inf))
    return vmul(vdiv(g, vadd(one, e)), u)


@jit(inline="always", fastmath=FASTMATH)
def _gelu_tanh_mul(g, u, one, top, inf):
    """gelu_tanh(g) u on one register (exp as _silu_mul's)."""
    c = vsplat(g, -1.5957691216057308)  # -2 sqrt(2 / pi)
    v = vmul(c, vadd(g, vmul(vsplat(g, 0.044715), vmul(g, vmul(g, g)))))
    return _logistic_mul(g, v, u, one, top, inf)


@jit(inline="always", fastmath=FASTMATH)
def _gate(g, u, one, top, inf, gelu):
    return _gelu_tanh_mul(g, u, one, top, inf) if gelu else _silu_mul(g, u, one, top, inf)


@jit(cache=CACHE, parallel=True, fastmath=FASTMATH)
def gate_rows(g, go, u, uo, out, oo, n, gelu, nthreads):
    """Row r: `out[oo[r]:][:n] = act(g[go[r]:][:n]) u[uo[r]:][:n]`, act silu (gelu_tanh if gelu); out may
    be g or u (in place:
    each element is read before its store). The tail of a row that is not a whole number of
    registers goes through a per-thread buffer."""
    rows = len(go)
    W = vwidth(g)
    nv = n - n % W
    nt = n - nv
    top = 88.0 if g.itemsize == 4 else 709.0
    buf_all = np.zeros((nthreads, 2 * W), g.dtype)
    for p in prange(nthreads):  # one block of rows each, its own buffer
        buf = buf_all[p]  # [0:W] g's tail, [W:2W] u's (zeros after them)
        one = vsplat(g, 1)
        vtop = vsplat(g, top)
        inf = vsplat(g, np.inf)
        for r in range(p * rows // nthreads, (p + 1) * rows // nthreads):
            gb = go[r]
            ub = uo[r]
            ob = oo[r]
            for j in range(0, nv, W):
                vstore(out, ob + j, _gate(vload(g, gb + j), vload(u, ub + j), one, vtop, inf, gelu))
            if nt:
                for k in range(nt):
                    buf[k] = g[gb + nv + k]
                    buf[W + k] = u[ub + nv + k]
                vstore(buf, 0, _gate(vload(buf, 0), vload(buf, W), one, vtop, inf, gelu))
                for k in range(nt):
                    out[ob + nv + k] = buf[k]
