"""Fuzzing every backend against the reference with hypothesis: random shapes (0 and 1 sizes,
non-tile multiples), strides, dtypes, masks (fully masked rows and tiles) and magnitudes.

Profiles: "ci" (default, ~1 minute) and "long" (HYPOTHESIS_PROFILE=long python -m pytest tests/test_fuzz.py).
"""
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from silkattn import reference as ref
from silkattn._testing import TOL

settings.register_profile("ci", max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
settings.register_profile("long", max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

dtypes = st.sampled_from([np.float32, np.float64])
scales = st.sampled_from([1e-3, 1.0, 30.0, 1e4])


def view(a, how):
    """The same values behind different strides."""
    if how == "transposed":  # last axis not contiguous
        return np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    if how == "reversed":
        return np.ascontiguousarray(a[..., ::-1, :])[..., ::-1, :]
    if how == "strided":
        big = np.repeat(a, 2, axis=-2)
        return big[..., ::2, :]
    return a


@st.composite
def attention_problems(draw):
    dtype = draw(dtypes)
    lead = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    Sq, Sk = draw(st.integers(0, 150)), draw(st.integers(1, 300))
    dk, dv = draw(st.integers(1, 80)), draw(st.integers(1, 72))
    scale = draw(scales)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    Q = (rng.standard_normal(lead + (Sq, dk)) * scale).astype(dtype)
    K = rng.standard_normal(lead[-1:] + (Sk, dk)).astype(dtype)  # K, V broadcast over the first lead dim
    V = rng.standard_normal(lead[-1:] + (Sk, dv)).astype(dtype)
    Q, K, V = (view(a, draw(st.sampled_from(["plain", "transposed", "reversed", "strided"])))
               for a in (Q, K, V))
    kind = draw(st.sampled_from(["none", "causal", "offset", "random", "rows", "tile", "padding", "all"]))
    mask, causal = None, kind in ("causal", "offset")
    q_offset = draw(st.integers(0, Sk + 2)) if kind == "offset" else 0
    if kind in ("random", "rows", "tile", "all"):
        mask = rng.random((Sq, Sk)) < draw(st.sampled_from([0.05, 0.5, 0.95]))
        if kind == "rows":
            mask[:: max(1, Sq // 3)] = False
        if kind == "tile":
            mask[:, Sk // 3: 2 * Sk // 3 + 1] = False
        if kind == "all":
            mask[:] = False
    if kind == "padding":
        mask = np.arange(Sk) < draw(st.integers(0, Sk))  # (Sk,): padding broadcast over queries
    return Q, K, V, mask, causal, q_offset


def attention_bound(Q, K, V, dtype):
    """Absolute error a float kernel may make: score rounding grows with |q||k|, scaled by |V|."""
    Q, K = np.abs(Q.astype(np.float64)), np.abs(K.astype(np.float64))
    dk = Q.shape[-1]
    smax = (Q.max(initial=0) * K.max(initial=0)) * np.sqrt(dk)  # >= |q . k| / sqrt(d_k)
    ds = 4 * (dk + 8) * np.finfo(dtype).eps * smax
    return ds, 2 * ds * np.abs(V).max(initial=0)


@given(problem=attention_problems())
def test_attention_agrees_with_reference(any_backend, problem):
    Q, K, V, mask, causal, q_offset = problem
    dtype = Q.dtype
    full = mask if not causal else ref.causal_mask(Q.shape[-2], K.shape[-2], q_offset)
    out = any_backend.attention(Q, K, V, mask, causal=causal, q_offset=q_offset)
    assert out.dtype == dtype
    expected = ref.attention(*(a.astype(np.float64) for a in (Q, K, V)), full)
    assert out.shape == expected.shape
    ds, extra = attention_bound(Q, K, V, dtype)
    if ds < 0.05:  # resolvable in this dtype: compare values
        np.testing.assert_allclose(out, expected, rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["atol"] + extra)
    else:  # scores beyond the dtype's resolution: every row must still be a convex combination of V
        assert np.isfinite(out).all()
        lo, hi = V.min(axis=-2, keepdims=True), V.max(axis=-2, keepdims=True)
        tol = 1e-5 * (np.abs(V).max(initial=0) + 1)
        assert ((out >= lo - tol) & (out <= hi + tol)).all()


@st.composite
def row_problems(draw):
    dtype = draw(dtypes)
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=2))) + (draw(st.integers(1, 700)),)
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    x = (rng.standard_normal(shape) * draw(scales) + draw(st.sampled_from([0.0, 1e4]))).astype(dtype)
    return view(x[None], draw(st.sampled_from(["plain", "reversed", "strided"])))[0] if x.ndim > 1 else x


@given(x=row_problems())
def test_softmax_agrees_with_reference(any_backend, x):
    out = any_backend.softmax(x)
    np.testing.assert_allclose(out, ref.softmax(x.astype(np.float64)), **TOL[x.dtype])


@given(x=row_problems(), eps=st.sampled_from([0.0, 1e-5, 1e-2]))
def test_layer_norm_agrees_with_reference(any_backend, x, eps):
    rng = np.random.default_rng(x.size)
    g, b = rng.standard_normal(x.shape[-1]).astype(x.dtype), rng.standard_normal(x.shape[-1]).astype(x.dtype)
    X = x.astype(np.float64)
    if eps == 0 and (X.var(-1) < 1e-300).any():
        return  # a constant row with eps = 0 is 0/0 in every implementation
    out = any_backend.layer_norm(x, g, b, eps=eps)
    expected = ref.layer_norm(X, g.astype(np.float64), b.astype(np.float64), eps)
    # float32 input of magnitude m and spread s: the input itself is exact, but a result of
    # relative size m/s carries that much rounding in any float32 implementation's centring
    spread = np.sqrt(X.var(-1, keepdims=True)) + 1e-30
    slack = (np.finfo(x.dtype).eps * 8 * np.abs(X).max(-1, keepdims=True, initial=0) / spread
             * np.abs(g).max(initial=0))
    bound = TOL[x.dtype]["atol"] + TOL[x.dtype]["rtol"] * np.abs(expected) + slack + 1e-300
    np.testing.assert_array_less(np.abs(out - expected), bound)
