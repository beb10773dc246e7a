"""Numba rope kernel over rows given as offsets into flat views (silkattn._api._row_layout)."""
from numba import prange

from ._jit import jit
from ._simd import CACHE, vadd, vload, vmul, vstore, vsub, vwidth


# No fastmath: not even 'contract', so that x c - y s rounds each product as NumPy does and the
# result is the reference's to the last bit (one FMA would round it differently, which at a large
# |x| with cancellation is far from the result).
@jit(cache=CACHE, parallel=True)
def rope_rows(x, xo, out, oo, cos, sin, positions):
    """Row r, `x[xo[r]:][:d]` at position p = positions[r % seq]: out[oo[r] + i] = x_i c_i - x_(i+h) s_i
    and out[oo[r] + h + i] = x_(i+h) c_i + x_i s_i, h = d / 2, c and s row p of the cos and sin tables.
    out may be x (in place): each element is read before the store that overwrites it."""
    rows = len(xo)
    seq = len(positions)
    h = cos.shape[1]
    W = vwidth(x)
    hv = h - h % W
    cf = cos.reshape(-1)
    sf = sin.reshape(-1)
    for r in prange(rows):
        xb = xo[r]
        ob = oo[r]
        t = positions[r % seq] * h
        for i in range(0, hv, W):
            a = vload(x, xb + i)
            b = vload(x, xb + h + i)
            c = vload(cf, t + i)
            s = vload(sf, t + i)
            vstore(out, ob + i, vsub(vmul(a, c), vmul(b, s)))
            vstore(out, ob + h + i, vadd(vmul(b, c), vmul(a, s)))
        for i in range(hv, h):
            a = x[xb + i]
            b = x[xb + h + i]
            out[ob + i] = a * cf[t + i] - b * sf[t + i]
            out[ob + h + i] = b * cf[t + i] + a * sf[t + i]
