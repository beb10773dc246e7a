"""bias_relu (the feed-forward's fused bias add and ReLU) on every backend against NumPy."""
import numpy as np
import pytest

from conftest import DTYPES, assert_close, f64

SHAPES = [(1,), (5, 7), (3, 64, 2048), (0, 16), (130, 33)]


def expected(x, b):
    x, b = f64(x, b)
    return np.maximum(x + b, 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_bias_relu_matches_numpy(any_backend, threads, rng, shape, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    b = rng.standard_normal(shape[-1]).astype(dtype)
    assert_close(any_backend.bias_relu(x, b), expected(x, b), dtype)
    y = x.copy()
    assert any_backend.bias_relu(y, b, out=y) is y  # in place, as the feed-forward calls it
    assert_close(y, expected(x, b), dtype)


def test_bias_relu_promotes_views_and_nan(any_backend, rng):
    x = rng.standard_normal((6, 10)).astype(np.float32)
    out = any_backend.bias_relu(x, np.ones(10))  # a float64 bias promotes, as x + b does
    assert_close(out, expected(x, np.ones(10)), np.float64)
    assert_close(any_backend.bias_relu(x.T, np.float32(0.5)), expected(x.T, 0.5), np.float32)
    x[2, 3] = np.nan
    assert np.isnan(any_backend.bias_relu(x, np.zeros(10, np.float32))[2, 3])  # as np.maximum
