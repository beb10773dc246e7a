"""attention(..., return_lse=True) and attention_backward on every backend against the reference
(itself checked by finite differences, tests/test_reference_backward.py): every keyword a gradient
flows through (masks with fully hidden rows, causal with q_offset, grouped-query and multi-query
heads, broadcast batch dims, windows, scale, softcap, bias, ALiBi), both paths of the forward's plan,
head sizes off the register width, float32 and float64 (silkattn._testing.TOL_GRAD), 1 and 2
threads; the gradients independent of the thread count; nothing of size Sq x Sk allocated; bad
input refused naming the argument."""
import os
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from silkattn import reference as ref
from silkattn._testing import TOL_GRAD, assert_close

from conftest import DTYPES, f64

ALIBI = 2.0 ** (-8.0 * np.arange(1, 5) / 4)

# name: (Q shape, K shape, V's d_v, keywords; "mask"/"bias": the shape of a random one)
CASES = {
    "plain": ((2, 3, 70, 32), (2, 3, 90, 32), 32, {}),
    "causal": ((1, 2, 130, 16), (1, 2, 130, 16), 16, dict(causal=True)),
    "causal after a cache": ((2, 4, 65, 24), (2, 2, 130, 24), 40, dict(causal=True, q_offset=65)),
    "gqa window softcap": ((1, 4, 50, 20), (1, 1, 200, 20), 13,
                           dict(window=(37, 5), softcap=3.0, q_offset=100)),
    "alibi scale": ((1, 4, 40, 8), (1, 4, 40, 8), 8, dict(alibi_slopes=ALIBI, causal=True, scale=0.3)),
    "bias and mask": ((2, 2, 40, 8), (2, 2, 60, 8), 8, dict(bias=(2, 2, 40, 60), mask=(40, 60))),
    "broadcast batch": ((3, 2, 33, 16), (1, 2, 70, 16), 16, dict(mask=(3, 1, 33, 70))),
    "broadcast queries": ((1, 2, 33, 16), (3, 2, 70, 16), 8, dict(causal=True, q_offset=37)),
    "decode row": ((2, 4, 1, 64), (2, 2, 300, 64), 64, dict(causal=True, q_offset=299)),
    "no lead dims": ((20, 8), (30, 8), 8, dict(window=(4, None))),
}


def operands(rng, case, dtype):
    qshape, kshape, dv, keywords = CASES[case]
    Q = rng.standard_normal(qshape).astype(dtype)
    K = rng.standard_normal(kshape).astype(dtype)
    V = rng.standard_normal(kshape[:-1] + (dv,)).astype(dtype)
    keywords = dict(keywords)
    if "mask" in keywords:
        mask = rng.random(keywords["mask"]) > 0.3
        mask[..., :3, :] = False  # rows that see no key: uniform weights (out = mean V)
        keywords["mask"] = mask
    if "bias" in keywords:
        keywords["bias"] = rng.standard_normal(keywords["bias"]).astype(dtype)
    return Q, K, V, keywords


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_return_lse(any_backend, rng, case, dtype, threads):
    Q, K, V, kw = operands(rng, case, dtype)
    out, lse = any_backend.attention(Q, K, V, return_lse=True, **kw)
    np.testing.assert_array_equal(out, any_backend.attention(Q, K, V, **kw))  # the same forward
    r_out, r_lse = ref.attention(*f64(Q, K, V), return_lse=True, **kw)
    assert_close(out, r_out.astype(dtype), dtype)
    assert_close(lse, r_lse.astype(dtype), dtype)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward(any_backend, rng, case, dtype, threads):
    Q, K, V, kw = operands(rng, case, dtype)
    out, lse = any_backend.attention(Q, K, V, return_lse=True, **kw)
    dout = rng.standard_normal(out.shape).astype(dtype)
    grads = any_backend.attention_backward(dout, Q, K, V, out, lse, **kw)
    Q64, K64, V64, dout64 = f64(Q, K, V, dout)
    kw64 = dict(kw, bias=None if "bias" not in kw else kw["bias"].astype(np.float64))
    r_out, r_lse = ref.attention(Q64, K64, V64, return_lse=True, **kw64)
    expected = ref.attention_backward(dout64, Q64, K64, V64, r_out, r_lse, **kw64)
    for name, g, e, x in zip("QKV", grads, expected, (Q, K, V)):
        assert g.shape == x.shape, name
        assert_close(g, e.astype(dtype), dtype, table=TOL_GRAD)


def test_gradients_do_not_depend_on_threads(backend, rng):
    import silkattn
    Q, K, V, kw = operands(rng, "causal after a cache", np.float32)
    out, lse = backend.attention(Q, K, V, return_lse=True, **kw)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    results = []
    for n in (1, 2):
        previous = silkattn.set_num_threads(n)
        try:
            results.append(backend.attention_backward(dout, Q, K, V, out, lse, **kw))
        finally:
            silkattn.set_num_threads(previous)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_backward_keeps_nothing_of_size_sq_by_sk(backend, rng):
    S, d = 2048, 32
    Q, K, V, dout = (rng.standard_normal((1, 1, S, d)).astype(np.float32) for _ in range(4))
    out, lse = backend.attention(Q, K, V, causal=True, return_lse=True)
    backend.attention_backward(dout, Q, K, V, out, lse, causal=True)  # compiled, workspaces made
    tracemalloc.start()
    try:
        backend.attention_backward(dout, Q, K, V, out, lse, causal=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < S * S * 4 // 8, peak  # an S x S float32 array would be 16 MiB; O(S d) is ~1 MiB


def test_bad_input(any_backend, rng):
    Q, K, V, kw = operands(rng, "plain", np.float32)
    out, lse = any_backend.attention(Q, K, V, return_lse=True)
    with pytest.raises(ValueError, match="dout"):
        any_backend.attention_backward(out[..., :-1], Q, K, V, out, lse)
    with pytest.raises(ValueError, match="out"):
        any_backend.attention_backward(out, Q, K, V, out[:1], lse)
    with pytest.raises(ValueError, match="lse"):
        any_backend.attention_backward(out, Q, K, V, out, lse[..., None])
    with pytest.raises(TypeError, match="dout"):
        any_backend.attention_backward(out.astype(int), Q, K, V, out, lse)
    with pytest.raises(TypeError, match="Q"):
        any_backend.attention_backward(out, Q.astype(int), K, V, out, lse)
    with pytest.raises(ValueError, match="d_k"):
        any_backend.attention_backward(out, Q, K[..., :-1], V, out, lse)
    with pytest.raises(TypeError, match="return_lse"):
        any_backend.attention(Q, K, V, return_lse="yes")
    with pytest.raises(ValueError, match="softcap"):
        any_backend.attention_backward(out, Q, K, V, out, lse, softcap=-1.0)


EXAMPLES = 200 if os.environ.get("HYPOTHESIS_PROFILE") == "long" else 20


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_geometries(backend, data):
    """Every keyword combination at random shapes (tile edges, GQA, q_offset past or before the
    keys, windows, a mask with fully hidden rows, bias, ALiBi, softcap), against the reference."""
    draw = data.draw
    Hkv = draw(st.integers(1, 3))
    Hq = Hkv * draw(st.integers(1, 3))
    Sq, Sk = draw(st.integers(1, 140)), draw(st.integers(1, 140))
    dk, dv = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    causal = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kw = dict(causal=causal, q_offset=draw(st.integers(0, 150)) if causal else 0)
    if draw(st.booleans()):
        kw["window"] = (draw(st.integers(0, 60)), draw(st.sampled_from([None, 0, 5])))
        kw["q_offset"] = draw(st.integers(0, 150))
    if draw(st.booleans()):
        kw["softcap"] = draw(st.floats(0.5, 30))
    if draw(st.booleans()):
        kw["alibi_slopes"] = rng.random(Hq)
        kw["q_offset"] = kw["q_offset"] or draw(st.integers(0, 150))
    if draw(st.booleans()):
        kw["bias"] = rng.standard_normal((Hq, Sq, Sk)).astype(dtype)
    if draw(st.booleans()):
        kw["mask"] = rng.random((Sq, Sk)) > draw(st.floats(0, 0.9))
    Q = rng.standard_normal((2, Hq, Sq, dk)).astype(dtype)
    K = rng.standard_normal((2, Hkv, Sk, dk)).astype(dtype)
    V = rng.standard_normal((2, Hkv, Sk, dv)).astype(dtype)
    out, lse = backend.attention(Q, K, V, return_lse=True, **kw)
    dout = rng.standard_normal(out.shape).astype(dtype)
    got = backend.attention_backward(dout, Q, K, V, out, lse, **kw)
    kw64 = dict(kw, **({"bias": kw["bias"].astype(np.float64)} if "bias" in kw else {}))
    Q64, K64, V64, dout64 = f64(Q, K, V, dout)
    r_out, r_lse = ref.attention(Q64, K64, V64, return_lse=True, **kw64)
    assert_close(lse, r_lse.astype(dtype), dtype)
    for g, e in zip(got, ref.attention_backward(dout64, Q64, K64, V64, r_out, r_lse, **kw64)):
        assert_close(g, e.astype(dtype), dtype, table=TOL_GRAD)
