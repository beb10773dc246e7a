"""rope (rotary positions) on every backend against the reference, to the last bit: the kernels
read cos/sin tables computed as the reference computes its own and round each product as NumPy
does; in place on the strided head views of a projection, without a copy."""
import dataclasses

import numpy as np
import pytest

from silkattn import _api
from silkattn import reference as ref

from conftest import DTYPES, assert_close, f64

SHAPES = [(1, 2), (1, 64), (5, 6), (3, 34), (2, 7, 64), (4, 9, 128), (2, 3, 5, 16), (3, 576), (2, 1536),
          (0, 8), (3, 0)]


def check(actual, X, positions, base=10000.0):
    """actual is the reference's answer in X's dtype, bit for bit (and so within the tolerance of
    the float64 answer, up to the dtype's cos/sin, which the reference rounds too)."""
    assert actual.dtype == X.dtype and actual.shape == X.shape
    np.testing.assert_array_equal(actual, ref.rope(X, positions, base))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rope_matches_reference(any_backend, threads, rng, shape, dtype):
    X = (rng.standard_normal(shape) * 3).astype(dtype)
    positions = rng.integers(0, 2048, shape[-2])
    check(any_backend.rope(X, positions), X, positions)
    assert_close(any_backend.rope(X, positions), ref.rope(*f64(X), positions), dtype)
    out = np.empty_like(X)
    assert any_backend.rope(X, positions, 500000.0, out=out) is out
    check(out, X, positions, 500000.0)
    Y = X.copy()
    assert any_backend.rope(Y, positions, out=Y) is Y  # in place
    check(Y, X, positions)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1e-30, 1e-3, 1e4, 1e30])
def test_rope_big_and_tiny_magnitudes(any_backend, rng, scale, dtype):
    """At a large |x| a pair's two products nearly cancel: one FMA's rounding would be far off."""
    X = (rng.standard_normal((3, 40, 64)) * scale).astype(dtype)
    positions = np.arange(40) * 97
    check(any_backend.rope(X, positions), X, positions)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_in_place_on_the_head_views_of_a_projection(any_backend, threads, rng, dtype):
    """As the model calls it: q and k as (heads, seq, d_head) views of the fused QKV output."""
    seq = 11
    qkv = rng.standard_normal((seq, 960)).astype(dtype)
    before = qkv.copy()
    q = qkv[:, :576].reshape(seq, 9, 64).swapaxes(0, 1)
    k = qkv[:, 576:768].reshape(seq, 3, 64).swapaxes(0, 1)
    positions = np.arange(seq) + 40  # after a cache of 40 tokens
    expected_q, expected_k = ref.rope(q, positions), ref.rope(k, positions)
    assert any_backend.rope(q, positions, out=q) is q
    assert any_backend.rope(k, positions, out=k) is k
    np.testing.assert_array_equal(q, expected_q)
    np.testing.assert_array_equal(k, expected_k)
    np.testing.assert_array_equal(qkv[:, 768:], before[:, 768:])  # v untouched
    one = before[-1:].copy()  # a decoding step: one row, at position 50
    q1 = one[:, :576].reshape(1, 9, 64).swapaxes(0, 1)
    expected = ref.rope(q1, [50])
    any_backend.rope(q1, [50], out=q1)
    np.testing.assert_array_equal(q1, expected)


def test_rope_head_views_reach_the_kernel_uncopied(backend, rng):
    seen = []

    def spy(x, xo, out, oo, *rest):
        seen.append((x, out))
        backend.KERNELS.rope(x, xo, out, oo, *rest)

    kernels = dataclasses.replace(backend.KERNELS, rope=spy)
    qkv = rng.standard_normal((6, 960)).astype(np.float32)
    q = qkv[:, :576].reshape(6, 9, 64).swapaxes(0, 1)
    expected = ref.rope(q, np.arange(6))
    assert _api.rope(kernels, q, np.arange(6), out=q) is q
    x, out = seen[-1]
    assert np.shares_memory(x, qkv) and np.shares_memory(out, qkv)
    np.testing.assert_array_equal(q, expected)
    fresh = _api.rope(kernels, q, np.arange(6))  # out of place: read from the view, written to a new array
    x, out = seen[-1]
    assert np.shares_memory(x, qkv) and np.shares_memory(out, fresh) and not np.shares_memory(out, qkv)
    np.testing.assert_array_equal(fresh, ref.rope(q, np.arange(6)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_views_the_kernel_layout_cannot_take(any_backend, rng, dtype):
    """A last axis of stride 2, reversed rows, heads swapped: computed through a copy, in place too."""
    A = rng.standard_normal((4, 8, 12)).astype(dtype)
    positions = np.arange(8) * 3
    for view in (lambda a: a[:, :, ::2], lambda a: a[:, ::-1], lambda a: a.swapaxes(0, 1)[:, :4],
                 lambda a: a[::-1, :, 2:10]):
        X = view(A)
        check(any_backend.rope(X, positions[:X.shape[-2]]), X, positions[:X.shape[-2]])
        B = A.copy()
        Xb = view(B)
        expected = ref.rope(Xb, positions[:X.shape[-2]])
        assert any_backend.rope(Xb, positions[:X.shape[-2]], out=Xb) is Xb
        np.testing.assert_array_equal(Xb, expected)
        mask = np.ones(A.shape, bool)
        view(mask)[...] = False
        np.testing.assert_array_equal(B[mask], A[mask])  # the rest of the array untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_tables_grow_and_far_positions(any_backend, rng, dtype):
    """Positions past the kept tables grow them; positions past ROPE_TABLE_BYTES get their own rows;
    any integer dtype, lists, an int base."""
    X = rng.standard_normal((2, 3, 32)).astype(dtype)
    for positions in ([0, 1, 2], [7, 300, 3], np.array([5000, 2, 70000], np.uint32), [2**40, 9, 2**40 + 1],
                      np.array([2**63 + 5, 0, 1], np.uint64), np.array([1, 2, 3], np.int8)):
        check(any_backend.rope(X, positions), X, positions)
        check(any_backend.rope(X, positions, base=10000), X, positions, 10000.0)
    decode = X[:, -1:]
    for p in range(250, 260):  # one more position each step, across a table's end
        check(any_backend.rope(decode, [p]), decode, [p])


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_rope_nan_and_inf_propagate_like_the_reference(any_backend):
    X = np.ones((2, 3, 8))
    X[0, 1, 2], X[1, 2, 5], X[1, 0, 0] = np.nan, np.inf, -np.inf
    for dtype in DTYPES:
        check(any_backend.rope(X.astype(dtype), [0, 1, 2]), X.astype(dtype), [0, 1, 2])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_freq_factors_match_the_reference(any_backend, threads, rng, dtype):
    """Llama 3's per-frequency divisors: the reference's answer to the bit, tables of their own
    beside those without factors (the same base and width), and not the same answer as no factors."""
    X = (rng.standard_normal((3, 20, 16)) * 3).astype(dtype)
    positions, factors = rng.integers(0, 4096, 20), np.array([1, 1, 1.5, 2, 4, 8, 8, 32.0])
    np.testing.assert_array_equal(any_backend.rope(X, positions, 500000.0, factors),
                                  ref.rope(X, positions, 500000.0, factors))
    np.testing.assert_array_equal(any_backend.rope(X, positions, 500000.0), ref.rope(X, positions, 500000.0))
    assert not np.array_equal(ref.rope(X, positions, 500000.0, factors), ref.rope(X, positions, 500000.0))
    ones = any_backend.rope(X, positions, 500000.0, np.ones(8, np.float32))
    np.testing.assert_array_equal(ones, ref.rope(X, positions, 500000.0))


@pytest.mark.parametrize("factors, error, match", [
    (np.ones(7), ValueError, r"freq_factors must have shape \(8,\)"),
    (np.ones((1, 8)), ValueError, r"freq_factors must have shape \(8,\)"),
    (np.r_[np.ones(7), 0.0], ValueError, "freq_factors must be positive and finite"),
    (np.r_[np.ones(7), np.nan], ValueError, "freq_factors must be positive and finite"),
    (np.r_[np.ones(7), -np.inf], ValueError, "freq_factors must be positive and finite"),
    ("11111111", TypeError, "freq_factors must be None or an array"),
    (2.0, TypeError, "freq_factors must be None or an array"),
    (np.ones(8, complex), TypeError, "freq_factors must be real numbers"),
])
def test_rope_bad_freq_factors(any_backend, factors, error, match):
    with pytest.raises(error, match=match):
        any_backend.rope(np.ones((2, 3, 16), np.float32), [0, 1, 2], 10000.0, factors)
