"""bias_gelu (the exact, erf GELU fused with its bias add) on every backend against the reference."""
import numpy as np
import pytest

from silkattn import reference as ref

from conftest import DTYPES, assert_close, f64

SHAPES = [(1,), (5, 7), (3, 64, 1536), (0, 16), (130, 33)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_bias_gelu_matches_reference(any_backend, threads, rng, shape, dtype):
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    b = rng.standard_normal(shape[-1]).astype(dtype)
    expected = ref.gelu(np.add(*f64(x, b)))
    assert_close(any_backend.bias_gelu(x, b), expected, dtype)
    y = x.copy()
    assert any_backend.bias_gelu(y, b, out=y) is y
    assert_close(y, expected, dtype)


def test_bias_gelu_tails_extremes_and_nan(any_backend):
    x = np.array([[-40.0, -4.5, -1e-3, 0.0, 1e-3, 4.5, 40.0, np.nan, np.inf]], np.float32)
    out = any_backend.bias_gelu(x, np.zeros(9, np.float32))
    assert_close(out[:, :7], ref.gelu(x[:, :7].astype(np.float64)), np.float32)
    assert np.isnan(out[0, 7]) and out[0, 8] == np.inf
