"""linear (X W + b) on every backend against NumPy in float64: the few-row kernel (a decoding
step's matrix-vector products, W row-major or a transposed view) and the BLAS path beyond it."""
import numpy as np
import pytest

from conftest import DTYPES, assert_close, f64

SHAPES = [  # (lead of X, k, n)
    ((1,), 1, 1), ((1,), 512, 512), ((1,), 64, 2048), ((1,), 2048, 64), ((3,), 513, 7), ((8,), 130, 1000),
    ((2, 4), 96, 33), ((9,), 64, 64), ((40,), 200, 100), ((), 256, 300),
]


def weights(rng, k, n, dtype, order):
    W = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)
    return np.asfortranarray(W) if order == "F" else W  # F: a transposed view, as E.T for the logits


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("lead, k, n", SHAPES)
def test_linear_matches_numpy(any_backend, threads, rng, lead, k, n, bias, order, dtype):
    X = rng.standard_normal(lead + (k,)).astype(dtype)
    W = weights(rng, k, n, dtype, order)
    b = rng.standard_normal(n).astype(dtype) if bias else None
    X64, W64 = f64(X, W)
    expected = X64 @ W64 + (b if bias else 0)
    assert_close(any_backend.linear(X, W, b), expected, dtype)


def test_linear_out_views_promotion_and_errors(any_backend, rng):
    X = rng.standard_normal((2, 64)).astype(np.float32)
    W = weights(rng, 64, 48, np.float32, "C")
    cache = np.zeros((10, 48), np.float32)
    assert any_backend.linear(X, W, out=cache[3:5]) is not None  # straight into rows of a cache
    assert_close(cache[3:5], f64(X)[0] @ f64(W)[0], np.float32)
    assert not cache[:3].any() and not cache[5:].any()
    assert_close(any_backend.linear(X, W.astype(np.float64)), f64(X)[0] @ f64(W)[0], np.float64)
    assert_close(any_backend.linear(X[:, ::2], W[::2]), f64(X[:, ::2])[0] @ f64(W[::2])[0], np.float32)
    with pytest.raises(ValueError, match=r"W must have shape \(64, n\)"):
        any_backend.linear(X, W.T)
    with pytest.raises(ValueError, match=r"b must have shape \(48,\)"):
        any_backend.linear(X, W, np.ones(47, np.float32))
    with pytest.raises(TypeError, match="X must be a float32 or float64"):
        any_backend.linear(X.astype(int), W)
    with pytest.raises(ValueError, match="out must not overlap"):
        any_backend.linear(X, np.eye(64, dtype=np.float32), out=X)
