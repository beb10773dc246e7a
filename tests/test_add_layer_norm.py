"""add_layer_norm (a residual add and the layer norm after it, fused) on every backend against the
reference's layer_norm of the sum."""
import numpy as np
import pytest

from silkattn import reference as ref

from conftest import DTYPES, assert_close, f64

SHAPES = [(1, 1), (3, 5), (2, 17, 512), (100, 384), (0, 8)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_add_layer_norm_matches_reference(any_backend, threads, rng, shape, dtype):
    X, R = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    g, b = (rng.standard_normal(shape[-1]).astype(dtype) for _ in range(2))
    S, Y = any_backend.add_layer_norm(X, R, g, b, eps=1e-5)
    assert_close(S, (X.astype(np.float64) + R).astype(dtype), dtype)
    assert_close(Y, ref.layer_norm(*f64(X + R, g, b)), dtype)


def test_add_layer_norm_promotes_and_accepts_views(any_backend, rng):
    X = rng.standard_normal((8, 24)).astype(np.float32)
    R = rng.standard_normal((24, 8)).astype(np.float32).T  # not contiguous
    S, Y = any_backend.add_layer_norm(X, R, np.ones(24), np.zeros(24), eps=1e-3)  # float64 g, b: Y float64
    assert S.dtype == np.float32 and Y.dtype == np.float64
    assert_close(Y, ref.layer_norm(*f64(X + R, np.ones(24), np.zeros(24)), eps=1e-3), np.float64)
